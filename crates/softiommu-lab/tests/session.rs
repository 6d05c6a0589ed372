//! A measuring command runs in a session of its own (a new autogroup),
//! says so on its host line, and a signal to the process started reaches
//! the child doing the work: a terminating one, and Ctrl-Z and `fg`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn autogroups_on() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|s| s.trim() == "1")
}

/// The host line of `bench pgtable`'s tables, run with `env`.
fn host_line(env: Option<&str>) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softiommu"));
    c.args(["bench", "pgtable"]);
    match env {
        Some(v) => c.env("SOFTIOMMU_SESSION", v),
        None => c.env_remove("SOFTIOMMU_SESSION"),
    };
    let out = c.output().expect("the binary runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find(|l| l.starts_with("host: "))
        .expect("a host line")
        .to_string()
}

#[test]
fn the_host_line_says_where_the_command_measured() {
    let own = host_line(None);
    if autogroups_on() {
        assert!(
            own.ends_with("; measured in its own session (autogroup)"),
            "{own}"
        );
    } else {
        assert!(own.contains("autogroups off"), "{own}");
    }
    let caller = host_line(Some("caller"));
    assert!(
        caller.ends_with("; measured in the caller's session (SOFTIOMMU_SESSION=caller)"),
        "{caller}"
    );
}

/// `(parent pid, session id)` of process `pid`, from `/proc/PID/stat`.
fn ppid_and_sid(pid: u32) -> Option<(u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name in parentheses: state, ppid,
    // pgrp, session.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(3)?.parse().ok()?))
}

/// Whether process `pid` catches `sig` (its `SigCgt` mask).
fn catches(pid: u32, sig: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("SigCgt:"))?;
            u64::from_str_radix(l["SigCgt:".len()..].trim(), 16).ok()
        })
        .is_some_and(|m| m & 1 << (sig - 1) != 0)
}

/// Kills the process on drop (a failed assertion leaves no lab running).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn children_of(parent: u32) -> Vec<(u32, u32)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (pp, sid) = ppid_and_sid(pid)?;
            (pp == parent).then_some((pid, sid))
        })
        .collect()
}

/// Polls `f` every 10 ms until it gives a value, failing with `what`
/// (and the detail `f`'s last call left in it) after `secs` seconds.
fn wait_for<T>(secs: u64, what: impl Fn() -> String, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(secs), "{}", what());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A long lab run started as a user would, and its child: returned once
/// the child leads a session of its own (a new autogroup) and the command
/// catches `sig`.
fn started_with_child(sig: i32) -> (KillOnDrop, u32, u32) {
    use std::os::unix::process::CommandExt;
    let parent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_softiommu"))
            .args(["lab", "netperf-udp", "--seconds", "60", "--json"])
            // A process group of its own, whose parent (this test) is in
            // another group of the same session: not orphaned, so the
            // kernel lets a stop signal stop it, as in a terminal's job
            // (a test runner's own group may be orphaned).
            .process_group(0)
            .env_remove("SOFTIOMMU_SESSION")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = parent.0.id();
    let what = || format!("no child in a session of its own, or signal {sig} not caught");
    let child = wait_for(30, what, || {
        let &(c, sid) = children_of(pid).first()?;
        (sid == c && catches(pid, sig)).then_some(c)
    });
    (parent, pid, child)
}

/// Waits until the command `parent` has ended; its status.
fn ended(parent: &mut KillOnDrop) -> std::process::ExitStatus {
    wait_for(
        20,
        || "the command did not end".into(),
        || parent.0.try_wait().unwrap(),
    )
}

/// Waits, up to `secs` seconds, until process `pid` (the child) is gone.
fn gone(pid: u32, secs: u64) {
    wait_for(
        secs,
        || "the child outlived the command".into(),
        || ppid_and_sid(pid).is_none().then_some(()),
    );
}

#[test]
fn a_terminate_signal_to_the_command_ends_the_child_in_its_own_session() {
    if !autogroups_on() {
        eprintln!("skipped: autogroups are off here, so no child is started");
        return;
    }
    let (mut parent, pid, child) = started_with_child(libc::SIGTERM);
    // SAFETY: kill(2) on our own child process.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let status = ended(&mut parent);
    // The child was ended by the forwarded SIGTERM, and the command dies
    // of it too, as it would have without a child.
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    gone(child, 10);
}

/// The state letter of process `pid` (`R`, `S`, `T` for stopped, …), from
/// `/proc/PID/stat`.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// Waits, within a bound, until `pid`'s state satisfies `want`.
fn wait_state(pid: u32, what: &str, want: impl Fn(char) -> bool) {
    let says = || format!("process {pid} not {what} (state {:?})", state(pid));
    wait_for(20, says, || state(pid).is_some_and(&want).then_some(()));
}

#[test]
fn ctrl_z_stops_the_child_in_its_own_session_and_fg_resumes_it() {
    if !autogroups_on() {
        eprintln!("skipped: autogroups are off here, so no child is started");
        return;
    }
    let (mut parent, pid, child) = started_with_child(libc::SIGTSTP);
    // What the terminal sends on Ctrl-Z, to the command's group (here the
    // command alone: the child is in a session of its own, which the
    // terminal does not reach).
    // SAFETY: kill(2) on our own child process.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTSTP) }, 0);
    wait_state(child, "stopped", |s| s == 'T');
    wait_state(pid, "stopped", |s| s == 'T');
    // What `fg` sends: both run again.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    wait_state(pid, "running", |s| s != 'T');
    wait_state(child, "running", |s| s != 'T');
    // And a second Ctrl-Z stops them again (the handler is armed anew).
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTSTP) }, 0);
    wait_state(child, "stopped again", |s| s == 'T');
    wait_state(pid, "stopped again", |s| s == 'T');
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    wait_state(child, "running again", |s| s != 'T');
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    ended(&mut parent);
}

/// Where the command's own process group is orphaned (its leader's parent
/// in another session: a service, a CI runner started with `setsid`), the
/// kernel discards a stop signal to it, so Ctrl-Z cannot stop the command;
/// then the child must not be left stopped either, with the command
/// waiting on it forever.
#[test]
fn a_stop_the_kernel_discards_leaves_neither_process_stopped() {
    if !autogroups_on() {
        eprintln!("skipped: autogroups are off here, so no child is started");
        return;
    }
    // `setsid sh -c '… & wait'`: the shell leads a new session, the
    // command runs in the shell's group, whose only outside parent (this
    // test) is in another session: an orphaned group.
    let bin = env!("CARGO_BIN_EXE_softiommu");
    let mut sh = KillOnDrop(
        Command::new("setsid")
            .args([
                "sh",
                "-c",
                &format!("'{bin}' lab netperf-udp --seconds 60 --json >/dev/null 2>&1 & wait"),
            ])
            .env_remove("SOFTIOMMU_SESSION")
            .spawn()
            .unwrap(),
    );
    let what = || "no command with a child in a session of its own".to_string();
    let (pid, child) = wait_for(30, what, || {
        children_of(sh.0.id()).into_iter().find_map(|(cmd, _)| {
            let (c, sid) = *children_of(cmd).first()?;
            (sid == c && catches(cmd, libc::SIGTSTP)).then_some((cmd, c))
        })
    });
    // SAFETY: kill(2) on a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTSTP) }, 0);
    std::thread::sleep(Duration::from_millis(300));
    assert_ne!(
        state(pid),
        Some('T'),
        "the command stopped in an orphaned group"
    );
    assert_ne!(state(child), Some('T'), "the child was left stopped");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    gone(child, 20);
    let _ = sh.0.wait();
}
