//! What the host's scheduler did to a thread, from Linux's
//! `/proc/<pid>/task/<tid>/schedstat` (three numbers: nanoseconds on a CPU,
//! nanoseconds runnable but waiting for one, time slices run), and the
//! host's load average: where a guest run's time went when the machine is
//! shared. Figures are `None` or zero where the files are missing
//! (another kernel, `CONFIG_SCHEDSTATS` off).

use std::path::Path;

/// One thread's (or a group of threads') scheduler figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sched {
    /// Nanoseconds on a CPU.
    pub run_ns: u64,
    /// Nanoseconds runnable but waiting for a CPU (the run queue).
    pub wait_ns: u64,
    /// Time slices run (each start on a CPU after a wait or a sleep).
    pub slices: u64,
}

impl Sched {
    /// Parses a `schedstat` file's three numbers.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.split_whitespace().map(|v| v.parse::<u64>().ok());
        Some(Self {
            run_ns: it.next()??,
            wait_ns: it.next()??,
            slices: it.next()??,
        })
    }

    /// The calling thread's figures.
    pub fn this_thread() -> Self {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| Self::parse(&s))
            .unwrap_or_default()
    }

    /// What happened between `earlier` and `self` (saturating).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            run_ns: self.run_ns.saturating_sub(earlier.run_ns),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
            slices: self.slices.saturating_sub(earlier.slices),
        }
    }

    fn add(&mut self, o: &Self) {
        self.run_ns = self.run_ns.saturating_add(o.run_ns);
        self.wait_ns = self.wait_ns.saturating_add(o.wait_ns);
        self.slices = self.slices.saturating_add(o.slices);
    }
}

/// The threads of process `pid`, summed by thread name (`comm`), sorted
/// by name: QEMU names its main thread after the binary, its TCG vCPU
/// `CPU 0/TCG` and its block thread pool `worker`.
pub fn process_threads(pid: u32) -> Vec<(String, Sched)> {
    let mut by_name: Vec<(String, Sched)> = Vec::new();
    let dir = Path::new("/proc").join(pid.to_string()).join("task");
    let Ok(tasks) = std::fs::read_dir(dir) else {
        return by_name;
    };
    for t in tasks.flatten() {
        let p = t.path();
        let name = std::fs::read_to_string(p.join("comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let Some(s) = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| Sched::parse(&s))
        else {
            continue;
        };
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some((_, acc)) => acc.add(&s),
            None => by_name.push((name, s)),
        }
    }
    by_name.sort_by(|a, b| a.0.cmp(&b.0));
    by_name
}

/// How much lower than the run's other threads the nice value of the
/// threads a miss round trip waits on is set (QEMU's main loop, for
/// both devices alike, and our back-end's message thread): Linux's
/// scheduler (EEVDF) lets a woken thread of greater weight run before a
/// busy one's slice ends, and a TCG vCPU thread is always busy.
pub const IO_THREAD_NICE_DELTA: i32 = -5;

/// The calling thread's nice value.
pub fn thread_nice() -> i32 {
    // SAFETY: getpriority has no memory effects; errno is cleared first
    // because -1 is also a valid nice value.
    unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    }
}

/// Sets the nice value of thread `tid` (0: the caller); raising one
/// (a lower value) needs `CAP_SYS_NICE`.
pub fn set_thread_nice(tid: u32, nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority on one thread has no memory effects.
    match unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Sets the nice value of the threads of process `pid` whose name starts
/// with `prefix` (QEMU's vCPU threads: `CPU `); returns how many were set.
pub fn set_threads_nice(pid: u32, prefix: &str, nice: i32) -> usize {
    let dir = Path::new("/proc").join(pid.to_string()).join("task");
    let Ok(tasks) = std::fs::read_dir(dir) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| set_thread_nice(tid, nice).is_ok())
        .count()
}

/// The host's one-minute load average.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_parses_three_numbers_and_refuses_fewer() {
        assert_eq!(
            Sched::parse("10 20 3\n"),
            Some(Sched {
                run_ns: 10,
                wait_ns: 20,
                slices: 3
            })
        );
        assert_eq!(Sched::parse("10 20"), None);
        assert_eq!(Sched::parse("10 x 3"), None);
        let a = Sched::parse("10 20 3").unwrap();
        let b = Sched::parse("15 25 4").unwrap();
        assert_eq!(b.since(&a), Sched::parse("5 5 1").unwrap());
        assert_eq!(a.since(&b), Sched::default());
    }

    #[test]
    fn a_thread_may_always_lower_its_own_priority() {
        let h = std::thread::spawn(|| {
            let n = thread_nice();
            let lower = (n + 1).min(19);
            set_thread_nice(0, lower).unwrap();
            thread_nice()
        });
        let me = thread_nice();
        assert_eq!(h.join().unwrap(), (me + 1).min(19));
        // Only that thread changed.
        assert_eq!(thread_nice(), me);
    }

    #[test]
    fn this_process_has_threads_with_figures() {
        let me = process_threads(std::process::id());
        assert!(!me.is_empty());
        assert!(load_average().is_some());
    }
}
