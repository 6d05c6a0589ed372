//! The guest runs' share of a shared machine. A TCG guest on our
//! back-end costs the host more CPU per I/O than on QEMU's own virtio-blk
//! (every page the guest maps is a miss round trip through QEMU's main
//! loop: ~25-30 µs of its CPU and ~10 µs of ours). With a core to spare
//! that work overlaps the guest's vCPU; on a machine whose cores other
//! work keeps busy, the run's share of CPU is split between the vCPU and
//! those round trips, and our read time grows with the machine's load
//! while the anchor's barely does. So the lab raises the scheduling
//! weight of the runs — ours and the anchor alike — above the machine's
//! other work where it may, and says whether it did.
//!
//! Linux schedules a session's processes as one group (autogroup) when
//! `kernel.sched_autogroup_enabled` is 1: then a nice value only orders
//! threads within the group, and the group's own nice
//! (`/proc/self/autogroup`, written by a privileged process) is what
//! weighs it against the machine's other sessions. Without autogroups the
//! calling thread's nice is lowered, which the QEMU processes and back-end
//! threads started after inherit. Either is put back when the guard drops.

/// The nice value the runs are raised to (a weight about 9.3 times a
/// nice-0 group's, Linux's `sched_prio_to_weight`: 9548 against 1024).
pub(super) const RAISED_NICE: i32 = -10;

const AUTOGROUP: &str = "/proc/self/autogroup";

/// How the runs' priority was raised, and how to put it back.
#[derive(Debug)]
pub(super) struct Priority {
    /// What was raised: `"autogroup"` or `"thread"`; `None` if nothing.
    pub(super) how: Option<&'static str>,
    /// The nice value before (put back on drop).
    old: i32,
    /// Why it was not raised.
    pub(super) why: Option<String>,
}

/// The nice value in an autogroup file's text (`/autogroup-N nice V`).
pub(super) fn autogroup_nice(text: &str) -> Option<i32> {
    let mut it = text.split_whitespace();
    it.next()?;
    (it.next()? == "nice").then_some(())?;
    it.next()?.parse().ok()
}

fn autogroups_on() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|s| s.trim() == "1")
}

use softiommu_vhost::sched::thread_nice;

fn set_thread_nice(n: i32) -> std::io::Result<()> {
    softiommu_vhost::sched::set_thread_nice(0, n)
}

impl Priority {
    /// Raises the runs to `nice` (autogroup, else thread), or records why not.
    pub(super) fn raise(nice: i32) -> Self {
        if autogroups_on() {
            let old = std::fs::read_to_string(AUTOGROUP)
                .ok()
                .and_then(|t| autogroup_nice(&t));
            let Some(old) = old else {
                return Self::not("no readable /proc/self/autogroup".into());
            };
            if old <= nice {
                return Self::not(format!("autogroup nice already {old}"));
            }
            return match std::fs::write(AUTOGROUP, nice.to_string()) {
                Ok(()) => Self {
                    how: Some("autogroup"),
                    old,
                    why: None,
                },
                Err(e) => Self::not(format!("autogroup nice {nice}: {e}")),
            };
        }
        let old = thread_nice();
        if old <= nice {
            return Self::not(format!("nice already {old}"));
        }
        match set_thread_nice(nice) {
            Ok(()) => Self {
                how: Some("thread"),
                old,
                why: None,
            },
            Err(e) => Self::not(format!("nice {nice}: {e}")),
        }
    }

    fn not(why: String) -> Self {
        Self {
            how: None,
            old: 0,
            why: Some(why),
        }
    }
}

impl Drop for Priority {
    fn drop(&mut self) {
        match self.how {
            Some("autogroup") => {
                let _ = std::fs::write(AUTOGROUP, self.old.to_string());
            }
            Some(_) => {
                let _ = set_thread_nice(self.old);
            }
            None => {}
        }
    }
}
