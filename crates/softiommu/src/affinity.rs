//! Pinning a thread the library spawned to one CPU
//! (`pthread_setaffinity_np(3)`).

use std::os::unix::thread::JoinHandleExt;
use std::thread::JoinHandle;

/// Pins the thread behind `handle` (live, not joined: the caller holds
/// the handle) to `cpu`; false if `cpu` is past the set's range or the
/// kernel refused it.
pub(crate) fn pin_thread<T>(handle: &JoinHandle<T>, cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: `set` is a plain bit set, zeroed and then given one CPU
    // checked against its size above; the pthread_t comes from a handle
    // the caller holds, so the thread has not been joined and its id is
    // still valid; the size passed is the set's.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::pthread_setaffinity_np(
            handle.as_pthread_t() as libc::pthread_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU the calling thread runs on now.
    fn current_cpu() -> i32 {
        // SAFETY: `sched_getcpu` has no preconditions.
        unsafe { libc::sched_getcpu() }
    }

    #[test]
    fn a_spawned_thread_moves_to_the_cpu_it_is_pinned_to() {
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            go_rx.recv().unwrap();
            current_cpu()
        });
        assert!(pin_thread(&h, 0));
        assert!(!pin_thread(&h, usize::MAX));
        go_tx.send(()).unwrap();
        assert_eq!(h.join().unwrap(), 0);
    }
}
