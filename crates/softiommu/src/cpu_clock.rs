//! CPU time as the kernel accounts it: the calling thread's
//! (`CLOCK_THREAD_CPUTIME_ID`), another live thread's
//! (`pthread_getcpuclockid`), so a device thread's time can be read apart
//! from its driver's while both run, and the whole process's
//! (`CLOCK_PROCESS_CPUTIME_ID`). One copy for the workspace: the flush timer's,
//! the accessor's and the page request handler's timing, the device
//! crates' and the lab's clocks are all read through here. A clock the kernel refuses reads as `None` from
//! [`ThreadClock::read`], and as zero from [`thread`] and [`process`].

use std::os::unix::thread::JoinHandleExt;
use std::thread::JoinHandle;
use std::time::Duration;

fn read(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the call's duration.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then(|| {
        Duration::new(
            ts.tv_sec.max(0) as u64,
            ts.tv_nsec.clamp(0, 999_999_999) as u32,
        )
    })
}

/// CPU time the calling thread has used (zero if the kernel will not say).
pub fn thread() -> Duration {
    read(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or_default()
}

/// CPU time every thread of the process has used (zero if the kernel
/// will not say).
pub fn process() -> Duration {
    read(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or_default()
}

/// The CPU clock of one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    /// The calling thread's clock.
    pub fn current() -> Self {
        ThreadClock(libc::CLOCK_THREAD_CPUTIME_ID)
    }

    /// The clock of the thread behind `handle`, while it has not been
    /// joined. `None` if the kernel will not give it.
    pub fn of<T>(handle: &JoinHandle<T>) -> Option<Self> {
        let mut id: libc::clockid_t = 0;
        // SAFETY: the pthread_t comes from a live, unjoined `JoinHandle`
        // (borrowed for the call), and `id` is a valid out-pointer.
        let rc = unsafe {
            libc::pthread_getcpuclockid(handle.as_pthread_t() as libc::pthread_t, &mut id)
        };
        (rc == 0).then_some(ThreadClock(id))
    }

    /// CPU time used so far; `None` once the thread has exited.
    pub fn read(&self) -> Option<Duration> {
        read(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_threads_cpu_time_is_read_apart_from_ours() {
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            // Burn some CPU, then wait to be told to finish.
            let mut x = 0u64;
            for i in 0..5_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
            let _ = go_rx.recv_timeout(Duration::from_secs(10));
        });
        let clock = ThreadClock::of(&h).expect("a live thread has a clock");
        // Wait (bounded) until it has used some CPU.
        let t0 = std::time::Instant::now();
        let mut used = Duration::ZERO;
        while t0.elapsed() < Duration::from_secs(10) {
            used = clock.read().unwrap_or_default();
            if used > Duration::ZERO {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(used > Duration::ZERO);
        go_tx.send(()).unwrap();
        h.join().unwrap();
        assert!(ThreadClock::current().read().is_some());
        // The process has used at least what this thread has.
        let me = thread();
        assert!(process() >= me && me > Duration::ZERO);
    }
}
