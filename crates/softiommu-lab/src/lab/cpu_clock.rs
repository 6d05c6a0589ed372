//! CPU time as the kernel accounts it, per thread and per process
//! (`clock_gettime` with `CLOCK_THREAD_CPUTIME_ID` / `CLOCK_PROCESS_CPUTIME_ID`).

use std::time::Duration;

fn read(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; both clock ids exist on Linux.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// CPU time the calling thread has used.
pub fn thread() -> Duration {
    read(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time every thread of the process has used.
pub fn process() -> Duration {
    read(libc::CLOCK_PROCESS_CPUTIME_ID)
}
