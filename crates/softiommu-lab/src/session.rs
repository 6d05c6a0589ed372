//! The measurement's own scheduling group.
//!
//! Linux's autogroup scheduler (`kernel.sched_autogroup_enabled` = 1)
//! shares the CPU between sessions first and between a session's threads
//! second. A lab started from a script shares the script's session with
//! whatever else the script started: two busy loops started beside it are
//! then, for the scheduler, two more threads of the lab's own group, and
//! they preempt its drivers and devices thread by thread. Measured on a
//! 2-vCPU VM (`lab netperf-udp --quick`, two `while :; do :; done` loops
//! started by the same script): in the script's session the common paced
//! rate fell from 23-31 kpps quiet to 13-14 kpps and deferred ÷
//! pass-through read 1.51-1.62 (quiet 1.30-1.39); in a session of its own
//! the rate stayed at 25-31 kpps and the ratio read 1.16-1.42.
//!
//! So a measuring command (`run`, `lab`, `bench`) runs in a session of its
//! own: when it is not a session leader already, it starts itself again
//! (its own binary, the same arguments) as a child that calls
//! `setsid(2)` — a new session is a new autogroup, weighed against the
//! caller's session as two terminals are — and waits for it:
//!
//! - the signals a terminal or a supervisor sends (SIGINT, SIGTERM,
//!   SIGHUP, SIGQUIT) are forwarded to the child's process group (the
//!   child, and what it started, QEMU among them), which keeps the
//!   dispositions it inherited from the caller (a signal the caller
//!   ignored, as `nohup` or a background job does, stays ignored there
//!   unless the child handles it itself, as `run` does SIGINT: as without
//!   the child); they are blocked from before the child exists until the
//!   handlers are in place, so none is lost or kills the parent alone;
//! - the child dies with the parent (`PR_SET_PDEATHSIG` with SIGKILL, set
//!   again by the child itself, which checks that its parent is still the
//!   one that started it: SIGKILL also ends a child stopped by Ctrl-Z, or
//!   one whose caller ignored SIGTERM);
//! - the parent exits as the child did: with its code, or, killed by a
//!   signal, by the same signal (so a shell loop stops on Ctrl-C);
//! - once the child is started the work is the child's: a failure to wait
//!   for it is exit 1, never a second run in the parent.
//!
//! Co-runners still get their share of the CPU: this separates the
//! groups, it raises no priority. Where autogroups cannot apply (the
//! sysctl off or unreadable, or the process in a cpu cgroup other than
//! the root, where the kernel does not use them) nothing is started. The
//! outcome is on the host line of every table and in `run`'s JSON
//! (`"session"`, from [`describe`]). `SOFTIOMMU_SESSION=caller` keeps the
//! caller's session.
//!
//! Ctrl-Z (SIGTSTP from the terminal) stops both: the child's group is in
//! another session, an orphaned process group where the kernel discards
//! SIGTSTP, so the parent stops it with SIGSTOP and then stops itself as
//! SIGTSTP would; once the parent runs again (`fg`, `bg`) it resumes the
//! child's group. Where the parent's own group is orphaned (a service, a
//! CI runner) the kernel discards its stop too, and the child is resumed
//! at once. A caller that ignored SIGTSTP keeps it ignored.

use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

/// The environment variable: `own` is set for the child (it is in its
/// session already); `caller` asks to stay in the caller's session.
pub(crate) const ENV: &str = "SOFTIOMMU_SESSION";

/// The child's parent's process id, set for the child.
const PARENT_ENV: &str = "SOFTIOMMU_SESSION_PARENT";

/// Where the measurement runs, as words for the host line.
static WHERE: OnceLock<String> = OnceLock::new();

/// The child's process group (its pid) for the forwarding handler; 0:
/// none (not started, or reaped).
static CHILD: AtomicI32 = AtomicI32::new(0);

/// The signals forwarded to the child.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Where this process measures, for the host line: `None` in a command
/// that measures nothing (`history`, `compare`, `report`), which never
/// decides it.
pub(crate) fn describe() -> Option<&'static str> {
    WHERE.get().map(String::as_str)
}

/// Whether Linux's autogroups apply to this process, as far as it can
/// tell.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Autogroups {
    /// They apply.
    Apply,
    /// They do not, and why.
    Inert(String),
}

/// Decides from the sysctl's text, `/proc/self/cgroup`'s, and, for a
/// cgroup v2 path, whether the cpu controller is on there
/// (`v2_cpu(path)`: its `cpu.weight` exists).
pub(crate) fn autogroups(
    sysctl: Option<&str>,
    cgroup: Option<&str>,
    v2_cpu: &dyn Fn(&str) -> bool,
) -> Autogroups {
    match sysctl.map(str::trim) {
        Some("1") => {}
        Some(_) => return Autogroups::Inert("autogroups off".into()),
        None => return Autogroups::Inert("kernel.sched_autogroup_enabled unreadable".into()),
    }
    // The kernel uses a task's autogroup only while the task is in the
    // root cpu cgroup: a v1 `cpu` hierarchy line whose path is not `/`
    // puts it elsewhere, as does a v2 path (when no v1 `cpu` line exists)
    // where the cpu controller is on.
    let lines: Vec<(&str, &str)> = cgroup
        .unwrap_or("")
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            f.next()?;
            Some((f.next()?, f.next()?))
        })
        .collect();
    let inert = |path: &str| {
        Autogroups::Inert(format!(
            "in cpu cgroup {path}, where autogroups do not apply"
        ))
    };
    if let Some((_, path)) = lines.iter().find(|(c, _)| c.split(',').any(|c| c == "cpu")) {
        return if *path != "/" {
            inert(path)
        } else {
            Autogroups::Apply
        };
    }
    match lines.iter().find(|(c, _)| c.is_empty()) {
        Some((_, path)) if *path != "/" && v2_cpu(path) => inert(path),
        _ => Autogroups::Apply,
    }
}

/// What [`enter_own`] does, decided from what it read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Run here: the reason, for the host line.
    Here(String),
    /// Start a child in a session of its own.
    Child,
}

/// Decides from the environment variable's value, whether autogroups
/// apply, and whether this process leads its session.
pub(crate) fn plan(env: Option<&str>, autogroups: &Autogroups, session_leader: bool) -> Plan {
    match (env, autogroups) {
        (Some("caller"), _) => Plan::Here(format!("the caller's session ({ENV}=caller)")),
        (_, Autogroups::Inert(why)) => Plan::Here(format!("the caller's session ({why})")),
        _ if session_leader => Plan::Here("its own session (autogroup)".into()),
        // `own` set but not a session leader: inherited, or set by hand.
        _ => Plan::Child,
    }
}

extern "C" fn forward(sig: libc::c_int) {
    // SAFETY: __errno_location() is this thread's errno; kill(2) is
    // async-signal-safe. The group is the child's, reaped only after the
    // handlers are blocked and `CHILD` cleared.
    unsafe {
        let errno = *libc::__errno_location();
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 {
            libc::kill(-child, sig);
        }
        *libc::__errno_location() = errno;
    }
}

/// SIGTSTP in the parent: stops the child's group, then this process as
/// SIGTSTP's default action would, and, once it runs again (continued by
/// `fg` or `bg`), resumes the child's group and arms itself again. The
/// stop is raised with SIGTSTP unblocked and at its default, so it takes
/// effect inside the handler — or is discarded, as the kernel does in an
/// orphaned process group (a parent started by a service or a CI
/// runner): either way the handler goes on to resume the child, and the
/// two are never left one stopped and one running.
extern "C" fn stop(_: libc::c_int) {
    // SAFETY: __errno_location() is this thread's errno; kill(2),
    // signal(2), sigemptyset/sigaddset (`set_of`), pthread_sigmask and
    // raise(3) are async-signal-safe. The group is the child's, as in
    // `forward`.
    unsafe {
        let errno = *libc::__errno_location();
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 {
            libc::kill(-child, libc::SIGSTOP);
        }
        libc::signal(libc::SIGTSTP, libc::SIG_DFL);
        let one = set_of(&[libc::SIGTSTP]);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        libc::raise(libc::SIGTSTP);
        // Running again (or never stopped): SIGTSTP is blocked again
        // when the handler returns.
        let handler: extern "C" fn(libc::c_int) = stop;
        libc::signal(libc::SIGTSTP, handler as libc::sighandler_t);
        if child > 0 {
            libc::kill(-child, libc::SIGCONT);
        }
        *libc::__errno_location() = errno;
    }
}

/// `sigs` as a signal set (async-signal-safe: `stop` builds one).
fn set_of(sigs: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// The signals the parent handles as a set: the forwarded ones and
/// SIGTSTP.
fn handled_set() -> libc::sigset_t {
    let [a, b, c, d] = FORWARDED;
    set_of(&[a, b, c, d, libc::SIGTSTP])
}

/// Whether `sig`'s disposition in this process is the default one.
fn default_disposition(sig: libc::c_int) -> bool {
    // SAFETY: sigaction with a null new action only reads the current
    // one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
    }
}

/// Moves the measurement into a session of its own. Returns `None` to
/// go on in this process (the child, or where no child is needed or one
/// cannot be started: the host line says which), or the exit code of the
/// child, which did the work.
pub(crate) fn enter_own() -> Option<ExitCode> {
    let env = std::env::var(ENV).ok();
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let v2_cpu = |path: &str| {
        std::path::Path::new("/sys/fs/cgroup")
            .join(path.trim_start_matches('/'))
            .join("cpu.weight")
            .exists()
    };
    let ag = autogroups(
        read("/proc/sys/kernel/sched_autogroup_enabled").as_deref(),
        read("/proc/self/cgroup").as_deref(),
        &v2_cpu,
    );
    // SAFETY: getsid(0) and getpid() only read this process's ids.
    let leader = unsafe { libc::getsid(0) == libc::getpid() };
    if env.as_deref() == Some("own") && leader {
        die_with_parent();
    }
    match plan(env.as_deref(), &ag, leader) {
        Plan::Here(why) => {
            let _ = WHERE.set(why);
            None
        }
        Plan::Child => spawn_and_wait(),
    }
}

/// In the child: dies with the parent that started it (the death signal
/// set before exec is cleared by an exec of a binary with file
/// capabilities, so it is set again here), or now if that parent is gone.
fn die_with_parent() {
    let parent: Option<libc::pid_t> = std::env::var(PARENT_ENV).ok().and_then(|p| p.parse().ok());
    // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid() touch only this
    // process's own state.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        if parent.is_some_and(|p| libc::getppid() != p) {
            libc::_exit(128 + libc::SIGKILL);
        }
    }
}

/// Starts this program again in a new session, forwards signals to it,
/// and returns its outcome as this process's exit code (a death by a
/// signal is raised here and does not return). A child that cannot be
/// started leaves the work to this process (`None`); one that was started
/// is never run twice.
fn spawn_and_wait() -> Option<ExitCode> {
    let set = handled_set();
    let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: blocks the forwarded signals in this (the main) thread,
    // keeping the old mask to put back; no other thread exists yet.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask);
        // A caller that ignored SIGCHLD would have the child reaped by the
        // kernel, and the wait below fail.
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
    }
    // SAFETY: getpid() only reads this process's id.
    let parent = unsafe { libc::getpid() };
    let mut args = std::env::args_os();
    // This program by its path (so `ps` and `pgrep` name the child as
    // they name the parent), or, if that file is gone (rebuilt meanwhile),
    // through /proc/self/exe, which still names this very binary.
    let exe = std::env::current_exe()
        .ok()
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "/proc/self/exe".into());
    let mut cmd = std::process::Command::new(exe);
    if let Some(a0) = args.next() {
        cmd.arg0(a0);
    }
    cmd.args(args)
        .env(ENV, "own")
        .env(PARENT_ENV, parent.to_string());
    // SAFETY: between fork and exec the closure calls only async-signal-
    // safe functions (setsid, prctl, getppid, pthread_sigmask) and
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the prctl: no signal would come.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // SAFETY: puts back the mask blocked above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut()) };
            let _ = WHERE.set(format!(
                "the caller's session (a child in its own could not be started: {e})"
            ));
            return None;
        }
    };
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    let handler: extern "C" fn(libc::c_int) = forward;
    for sig in FORWARDED {
        // SAFETY: the handler only loads an atomic and calls kill(2),
        // both async-signal-safe, and keeps errno. Installed after the
        // fork: the child inherited the caller's dispositions, so a
        // signal the caller ignored (`nohup`, a background job's SIGINT)
        // is forwarded and stays ignored there unless the child handles
        // it itself, as `run` does SIGINT — as without the child.
        unsafe {
            libc::signal(sig, handler as libc::sighandler_t);
        }
    }
    // Ctrl-Z, unless the caller ignored SIGTSTP (then it stays ignored).
    if default_disposition(libc::SIGTSTP) {
        let stop_h: extern "C" fn(libc::c_int) = stop;
        // SAFETY: the handler calls only async-signal-safe functions and
        // keeps errno.
        unsafe {
            libc::signal(libc::SIGTSTP, stop_h as libc::sighandler_t);
        }
    }
    // SAFETY: unblocks the handled signals: pending ones are delivered
    // to the handlers now, with `CHILD` set.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut()) };
    let status = child.wait();
    // SAFETY: no forwarding once the child is reaped: its pid may be
    // reused.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    CHILD.store(0, Ordering::SeqCst);
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            eprintln!("softiommu: waiting for the measuring child failed: {e}");
            return Some(ExitCode::from(1));
        }
    };
    use std::os::unix::process::ExitStatusExt;
    Some(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c.clamp(0, 255) as u8),
        (None, Some(s)) => {
            // Killed by a signal: die of it too (no core for SIGQUIT), so
            // a shell sees what it would have without the child.
            // SAFETY: setrlimit, signal, sigprocmask and raise act on this
            // process only.
            unsafe {
                let zero = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &zero);
                libc::signal(s, libc::SIG_DFL);
                let one = set_of(&[s]);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
                libc::raise(s);
            }
            ExitCode::from((128 + s).clamp(0, 255) as u8)
        }
        (None, None) => ExitCode::from(1),
    })
}

#[cfg(test)]
mod tests {
    use super::{autogroups, plan, Autogroups, Plan};

    #[test]
    fn a_leader_an_opt_out_and_inert_autogroups_run_here() {
        let on = Autogroups::Apply;
        assert!(matches!(plan(Some("own"), &on, true), Plan::Here(w) if w.contains("own session")));
        assert!(matches!(plan(None, &on, true), Plan::Here(w) if w.contains("own session")));
        assert!(matches!(plan(Some("caller"), &on, false), Plan::Here(w) if w.contains("=caller")));
        let off = Autogroups::Inert("autogroups off".into());
        assert!(matches!(plan(None, &off, false), Plan::Here(w) if w.contains("autogroups off")));
    }

    #[test]
    fn a_process_in_a_shared_session_where_autogroups_apply_starts_a_child() {
        let on = Autogroups::Apply;
        assert_eq!(plan(None, &on, false), Plan::Child);
        assert_eq!(plan(Some("anything"), &on, false), Plan::Child);
        // `own` inherited by a process that leads no session.
        assert_eq!(plan(Some("own"), &on, false), Plan::Child);
    }

    #[test]
    fn autogroups_apply_only_with_the_sysctl_on_in_the_root_cpu_cgroup() {
        let yes = |_: &str| true;
        let no = |_: &str| false;
        let v1_root = "4:memory:/x\n2:cpuacct:/\n1:cpu:/\n0::/";
        assert_eq!(
            autogroups(Some("1\n"), Some(v1_root), &yes),
            Autogroups::Apply
        );
        assert_eq!(
            autogroups(Some("1"), Some("0::/\n"), &yes),
            Autogroups::Apply
        );
        assert_eq!(autogroups(Some("1"), None, &yes), Autogroups::Apply);
        assert!(
            matches!(autogroups(Some("0"), Some(v1_root), &yes), Autogroups::Inert(w) if w == "autogroups off")
        );
        assert!(
            matches!(autogroups(None, Some(v1_root), &yes), Autogroups::Inert(w) if w.contains("unreadable"))
        );
        let v1_cpu = "3:cpu,cpuacct:/docker/abc\n0::/";
        assert!(
            matches!(autogroups(Some("1"), Some(v1_cpu), &no), Autogroups::Inert(w) if w.contains("/docker/abc"))
        );
        let v2 = "0::/user.slice/session-3.scope\n";
        assert!(
            matches!(autogroups(Some("1"), Some(v2), &yes), Autogroups::Inert(w) if w.contains("session-3"))
        );
        // A v2 path without the cpu controller: the root task group.
        assert_eq!(autogroups(Some("1"), Some(v2), &no), Autogroups::Apply);
    }
}
