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
//! weighs it against the machine's other sessions. Without autogroups, or
//! in no autogroup of its own (its autogroup file is then empty), the
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

/// What [`Priority::raise`] will do, decided from what it read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Write the autogroup's nice; `old` is put back on drop.
    Autogroup { old: i32 },
    /// Lower the calling thread's nice; `old` is put back on drop.
    Thread { old: i32 },
    /// Nothing to raise, and why.
    Not(String),
}

/// Decides how to raise the runs to `nice`. With autogroups on and the
/// group's nice readable, the group is raised (a thread's nice would only
/// order it within its group). A process in no autogroup of its own (its
/// session's leader never called `setsid`, as under some containers'
/// init) is in the root task group: Linux prints nothing in its autogroup
/// file, and there the thread's nice weighs the run against the machine's
/// other work directly, so it is lowered instead, as when autogroups are
/// off, and the JSON says `"thread"`. An unreadable file is treated alike.
pub(super) fn plan(
    nice: i32,
    autogroups_on: bool,
    autogroup_text: Option<&str>,
    current_thread_nice: i32,
) -> Plan {
    if autogroups_on {
        if let Some(old) = autogroup_text.and_then(autogroup_nice) {
            return if old <= nice {
                Plan::Not(format!("autogroup nice already {old}"))
            } else {
                Plan::Autogroup { old }
            };
        }
    }
    if current_thread_nice <= nice {
        return Plan::Not(format!("nice already {current_thread_nice}"));
    }
    Plan::Thread {
        old: current_thread_nice,
    }
}

impl Priority {
    /// Raises the runs to `nice` (autogroup, else thread), or records why not.
    pub(super) fn raise(nice: i32) -> Self {
        let on = autogroups_on();
        let text = if on {
            std::fs::read_to_string(AUTOGROUP).ok()
        } else {
            None
        };
        match plan(nice, on, text.as_deref(), thread_nice()) {
            Plan::Autogroup { old } => match std::fs::write(AUTOGROUP, nice.to_string()) {
                Ok(()) => Self {
                    how: Some("autogroup"),
                    old,
                    why: None,
                },
                Err(e) => Self::not(format!("autogroup nice {nice}: {e}")),
            },
            Plan::Thread { old } => match set_thread_nice(nice) {
                Ok(()) => Self {
                    how: Some("thread"),
                    old,
                    why: None,
                },
                Err(e) => Self::not(format!("nice {nice}: {e}")),
            },
            Plan::Not(why) => Self::not(why),
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
