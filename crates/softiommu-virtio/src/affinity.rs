//! Where threads run: the CPUs this process may use, and pinning the
//! calling thread to one of them (`sched_setaffinity(2)`). The workload
//! engines pin their driver and device threads with it when asked
//! ([`Cpus`](crate::workload::Cpus)); a device model is hardware of its
//! own, and where it runs decides what its driver's CPU time means.

/// CPUs this process may run on, in order (empty if the kernel will not
/// say).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a plain bit set the kernel fills; its size is passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu`; false if the kernel refused.
pub fn pin_current(cpu: usize) -> bool {
    // SAFETY: as above; `cpu` is checked against the set's size.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_can_be_pinned_to_a_cpu_it_may_use() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "the kernel names at least one CPU");
        let c = *cpus.last().unwrap();
        let ok = std::thread::spawn(move || pin_current(c)).join().unwrap();
        assert!(ok);
        assert!(!pin_current(usize::MAX));
    }
}
