//! The measurement's own scheduling group.
//!
//! Linux's autogroup scheduler (`kernel.sched_autogroup_enabled` = 1)
//! shares the CPU between sessions first and between a session's threads
//! second. A lab started from a script shares the script's session with
//! whatever else the script started: two busy loops started beside it are
//! then, for the scheduler, three more threads of the lab's own group,
//! and they preempt its drivers and devices thread by thread. Measured on
//! a 2-vCPU VM (`lab netperf-udp --quick`, two `while :; do :; done`
//! loops started by the same script): in the script's session the common
//! paced rate fell from 23-31 kpps quiet to 13-14 kpps and deferred ÷
//! pass-through rose from 1.30-1.39 quiet to 1.51-1.62; in a session of
//! its own the rate stayed at 28-31 kpps and the ratio read 1.31-1.42.
//!
//! So a measuring command (`run`, `lab`, `bench`) runs in a session of its
//! own: when it is not a session leader already, it starts itself again
//! as a child that calls `setsid(2)` (a new session is a new autogroup,
//! weighed against the caller's session as two terminals are), forwards
//! the signals a terminal or a supervisor sends (SIGINT, SIGTERM, SIGHUP,
//! SIGQUIT) to it, and exits as it does. The child dies with the parent
//! (`PR_SET_PDEATHSIG`). Co-runners still get their share of the CPU:
//! this separates the groups, it raises no priority. The outcome is on
//! the host line of every table and in `run`'s JSON (`"session"`, from
//! [`describe`]). `SOFTIOMMU_SESSION=caller` keeps the caller's session.

use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

/// The environment variable: `own` is set for the child (it is in its
/// session already); `caller` asks to stay in the caller's session.
pub(crate) const ENV: &str = "SOFTIOMMU_SESSION";

/// Where the measurement runs, as words for the host line.
static WHERE: OnceLock<String> = OnceLock::new();

/// The child's process id, for the forwarding handler (0: none yet).
static CHILD: AtomicI32 = AtomicI32::new(0);

/// The signals forwarded to the child.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// How the scheduling group was decided, for the host line.
pub(crate) fn describe() -> String {
    WHERE
        .get()
        .cloned()
        .unwrap_or_else(|| "the caller's session".into())
}

/// What [`enter_own`] does, decided from what it read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Run here: the reason, for the host line.
    Here(String),
    /// Start a child in a session of its own.
    Child,
}

/// Decides from the environment variable's value, whether autogroups are
/// on, and whether this process leads its session.
pub(crate) fn plan(env: Option<&str>, autogroups_on: bool, session_leader: bool) -> Plan {
    match env {
        Some("own") => Plan::Here("its own session (autogroup)".into()),
        Some("caller") => Plan::Here(format!("the caller's session ({ENV}=caller)")),
        _ if !autogroups_on => Plan::Here(
            "the caller's session (autogroups off: sessions are not weighed apart)".into(),
        ),
        _ if session_leader => Plan::Here("its own session (autogroup)".into()),
        _ => Plan::Child,
    }
}

fn autogroups_on() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|s| s.trim() == "1")
}

extern "C" fn forward(sig: libc::c_int) {
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe; the pid is our child's,
        // not reaped until `wait` returns below.
        unsafe {
            libc::kill(child, sig);
        }
    }
}

/// Moves the measurement into a session of its own. Returns `None` to
/// go on in this process (the child, or where no child is needed or one
/// cannot be started: the host line says which), or the exit code of the
/// child, which did the work.
pub(crate) fn enter_own() -> Option<ExitCode> {
    let env = std::env::var(ENV).ok();
    // SAFETY: getsid(0) and getpid() only read this process's ids.
    let leader = unsafe { libc::getsid(0) == libc::getpid() };
    match plan(env.as_deref(), autogroups_on(), leader) {
        Plan::Here(why) => {
            let _ = WHERE.set(why);
            None
        }
        Plan::Child => match spawn() {
            Ok(code) => Some(code),
            Err(e) => {
                let _ = WHERE.set(format!(
                    "the caller's session (a child in its own could not be started: {e})"
                ));
                None
            }
        },
    }
}

/// Starts this program again with the same arguments in a new session,
/// forwards signals to it and returns its exit code.
fn spawn() -> std::io::Result<ExitCode> {
    let exe = std::env::current_exe()?;
    // SAFETY: getpid() only reads this process's id.
    let parent = unsafe { libc::getpid() };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).env(ENV, "own");
    // SAFETY: between fork and exec the closure calls only async-signal-
    // safe functions (setsid, prctl, getppid) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the prctl: no signal would come.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    let handler: extern "C" fn(libc::c_int) = forward;
    for sig in FORWARDED {
        // SAFETY: the handler only loads an atomic and calls kill(2),
        // both async-signal-safe.
        unsafe {
            libc::signal(sig, handler as libc::sighandler_t);
        }
    }
    let status = child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c.clamp(0, 255) as u8),
        // Killed by a signal: the shell's convention, 128 + its number.
        (None, Some(s)) => ExitCode::from((128 + s).clamp(0, 255) as u8),
        (None, None) => ExitCode::from(1),
    })
}

#[cfg(test)]
mod tests {
    use super::{plan, Plan};

    #[test]
    fn the_child_a_leader_an_opt_out_and_autogroups_off_run_here() {
        assert!(
            matches!(plan(Some("own"), true, false), Plan::Here(w) if w.contains("own session"))
        );
        assert!(matches!(plan(None, true, true), Plan::Here(w) if w.contains("own session")));
        assert!(
            matches!(plan(Some("caller"), true, false), Plan::Here(w) if w.contains("=caller"))
        );
        assert!(matches!(plan(None, false, false), Plan::Here(w) if w.contains("autogroups off")));
    }

    #[test]
    fn a_process_in_a_shared_session_with_autogroups_on_starts_a_child() {
        assert_eq!(plan(None, true, false), Plan::Child);
        assert_eq!(plan(Some("anything"), true, false), Plan::Child);
    }
}
