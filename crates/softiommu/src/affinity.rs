//! Where threads run: the CPUs the calling thread may use, pinning it
//! to one of them (`sched_setaffinity(2)`), and its timers' precision
//! ([`precise_timers`]). The library's flush timer
//! pins itself with it when asked (`DmaDomain::pin_timer`: a thread
//! pinned from outside through its `pthread_t` could have exited, and an
//! exited thread's id is no longer its own); the device crate's workload
//! engines pin their driver and device threads with it, as a device
//! model is hardware of its own and where it runs decides what its
//! driver's CPU time means. One copy here, as with [`cpu_clock`](crate::cpu_clock).
//! Pinning is Linux's: elsewhere no CPU is allowed and no pin is taken.

/// No CPU requested: the value an unset pin request holds.
pub(crate) const NO_CPU: usize = usize::MAX;

/// The calling thread's affinity mask; `None` if the kernel will not say.
#[cfg(target_os = "linux")]
fn mask() -> Option<libc::cpu_set_t> {
    // SAFETY: `set` is a plain bit set the kernel fills, its size passed;
    // pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then_some(set)
    }
}

/// CPUs the calling thread may run on, in order (empty if the kernel will
/// not say).
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Vec<usize> {
    let Some(set) = mask() else {
        return Vec::new();
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below the set's size.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// CPUs the calling thread may run on (none, where pinning is not
/// supported).
#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// Whether the calling thread may run on `cpu` (its affinity mask holds
/// it); false past the set's range or if the kernel will not say.
#[cfg(target_os = "linux")]
pub fn allowed(cpu: usize) -> bool {
    // SAFETY: `cpu` is checked against the set's size first.
    cpu < libc::CPU_SETSIZE as usize
        && mask().is_some_and(|set| unsafe { libc::CPU_ISSET(cpu, &set) })
}

/// Whether the calling thread may run on `cpu` (never, where pinning is
/// not supported).
#[cfg(not(target_os = "linux"))]
pub fn allowed(_cpu: usize) -> bool {
    false
}

/// Pins the calling thread to `cpu`; false past the set's range or if the
/// kernel refused.
#[cfg(target_os = "linux")]
pub fn pin_current(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: `set` is a plain bit set, zeroed and then given one CPU
    // checked against its size above; pid 0 is the calling thread, and the
    // size passed is the set's.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Pins the calling thread (never, where pinning is not supported).
#[cfg(not(target_os = "linux"))]
pub fn pin_current(_cpu: usize) -> bool {
    false
}

/// Sets the calling thread's timer slack to 1 ns
/// (`prctl(PR_SET_TIMERSLACK)`), so its timed sleeps and waits end when
/// asked rather than up to 50 µs later (Linux's default slack); returns
/// whether the kernel took it. For a thread that waits microseconds: a
/// paced device, a driver waiting for an interrupt.
#[cfg(target_os = "linux")]
pub fn precise_timers() -> bool {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches
    // only the calling thread's scheduling attributes.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) == 0 }
}

/// [`precise_timers`] where there is no such setting: nothing done.
#[cfg(not(target_os = "linux"))]
pub fn precise_timers() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pins_itself_to_a_cpu_it_may_use_and_no_other() {
        let cpus = allowed_cpus();
        let c = *cpus.last().expect("the kernel names at least one CPU");
        assert!(cpus.iter().all(|&c| allowed(c)));
        let (ok, on, mask) = std::thread::spawn(move || {
            let ok = pin_current(c);
            // SAFETY: `sched_getcpu` has no preconditions.
            (ok, unsafe { libc::sched_getcpu() }, allowed_cpus())
        })
        .join()
        .unwrap();
        assert!(ok);
        assert_eq!(on, c as i32);
        assert_eq!(mask, vec![c]);
        // The spawning thread's own mask is untouched.
        assert_eq!(allowed_cpus(), cpus);
        assert!(!pin_current(usize::MAX));
        assert!(!allowed(usize::MAX));
    }
}
