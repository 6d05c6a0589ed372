//! The lab keeps its data: a scenario file is read with bounds, no
//! output is ever written over the results database, a reader holding
//! the database delays a run's writes (with a bound) instead of losing
//! what it measured, read-only commands never change a file they are
//! pointed at, figures from a run with I/O errors are marked invalid,
//! and `run` says it takes names when given a file. Each row runs the
//! binary and checks the exit status, the line said and the bytes left.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use serde_json::Value;

/// These tests follow the process by its pid (its open files, the pid
/// the database records), so it measures in the caller's session: no
/// child in a session of its own stands between the pid and the work.
fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softiommu"));
    c.env("SOFTIOMMU_SESSION", "caller");
    c
}

fn softiommu(args: &[&str]) -> Output {
    bin().args(args).output().expect("the binary runs")
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softiommu-data-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Exit `code`, nothing on stdout, one stderr line `softiommu: …` with
/// `want` in it; returns the line.
fn one_line(out: &Output, code: i32, want: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(
        lines[0].starts_with("softiommu: ") && lines[0].contains(want),
        "{:?} lacks {want:?}",
        lines[0]
    );
    lines[0].to_string()
}

/// Waits for `child` at most `limit`; kills it past that and fails.
fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A stored quick run of the shortest scenario (about a second).
fn stored_run(db: &Path, report: &Path) {
    let out = softiommu(&[
        "run",
        "--quick",
        "--json",
        "--scenarios",
        "pgtable-flush",
        "--db",
        s(db),
        "--report",
        s(report),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_scenario_file_that_never_ends_is_refused_at_a_mebibyte_within_seconds() {
    let child = bin()
        .args(["lab", "/dev/zero"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(child, Duration::from_secs(5), "lab /dev/zero");
    one_line(
        &out,
        2,
        "scenario /dev/zero is larger than 1048576 bytes (1 MiB, the most a scenario file may hold)",
    );

    let d = dir("big");
    let big = d.join("big.toml");
    let mut text = b"about = \"x\"\n[lab-litmus]\nruns = 4\n".to_vec();
    text.resize((1 << 20) + 1, b'\n');
    std::fs::write(&big, &text).unwrap();
    one_line(
        &softiommu(&["lab", s(&big)]),
        2,
        "is larger than 1048576 bytes",
    );
    // Exactly the cap is read.
    text.truncate(1 << 20);
    std::fs::write(&big, &text).unwrap();
    let out = softiommu(&["lab", s(&big), "--set", "runs=1", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A FIFO nobody writes to reads as empty at once.
    let fifo = d.join("fifo.toml");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let child = bin()
        .args(["lab", s(&fifo)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(child, Duration::from_secs(5), "lab FIFO");
    one_line(&out, 2, "no bench or lab table");
    // One whose writer never finishes is given up after 2 s.
    let writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let child = bin()
        .args(["lab", s(&fifo)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(
        child,
        Duration::from_secs(5),
        "lab FIFO with a silent writer",
    );
    one_line(
        &out,
        2,
        &format!(
            "scenario {}: its writer sent no end of file within 2s; nothing was run",
            s(&fifo)
        ),
    );
    drop(writer);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn no_output_path_may_name_the_results_database() {
    let d = dir("outpath");
    let (db, report) = (d.join("r.db"), d.join("report.html"));
    stored_run(&db, &report);
    let before = std::fs::read(&db).unwrap();
    std::os::unix::fs::symlink(&db, d.join("link.html")).unwrap();
    std::fs::create_dir_all(d.join("sub")).unwrap();
    let via_dotdot = d.join("sub/../r.db");
    let link = d.join("link.html");
    for out in [&db, &via_dotdot, &link] {
        one_line(
            &softiommu(&["report", "--db", s(&db), "--out", s(out)]),
            2,
            &format!(
                "refusing to write {} (--out): it is the results database {}",
                s(out),
                s(&db)
            ),
        );
        one_line(
            &softiommu(&[
                "run",
                "--quick",
                "--scenarios",
                "pgtable-flush",
                "--db",
                s(&db),
                "--report",
                s(out),
            ]),
            2,
            "(--report): it is the results database",
        );
        assert_eq!(std::fs::read(&db).unwrap(), before, "{out:?}");
    }
    // A relative path from the database's directory.
    let out = bin()
        .current_dir(&d)
        .args(["report", "--db", s(&db), "--out", "./r.db"])
        .output()
        .unwrap();
    one_line(&out, 2, "it is the results database");
    assert_eq!(std::fs::read(&db).unwrap(), before);
    std::fs::remove_dir_all(d).unwrap();
}

/// The runs table's status of run 1 and its stored scenarios.
fn run_state(db: &Path) -> (String, i64) {
    let c = Connection::open(db).unwrap();
    let st = c
        .query_row("SELECT status FROM runs WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    let n = c
        .query_row("SELECT count(*) FROM scenarios WHERE run_id = 1", [], |r| {
            r.get(0)
        })
        .unwrap();
    (st, n)
}

/// Starts `run --json` on `scenarios` with `extra` options, and returns
/// it with its stderr lines (read on a thread of their own, so that no
/// pipe fills), once its run row exists.
fn start_run(db: &Path, d: &Path, scenarios: &str, extra: &[&str]) -> (Child, Receiver<String>) {
    let mut child = bin()
        .args([
            "run",
            "--quick",
            "--json",
            "--scenarios",
            scenarios,
            "--db",
            s(db),
        ])
        .args(["--report", s(&d.join("report.html"))])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in err.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // The first scenario's start line comes after the run row is written.
    let first = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(first.contains("[1/"), "{first}");
    (child, rx)
}

/// Every stderr line `err` has left, up to the child's end of stderr
/// (its reader thread then drops the sender). The child has exited, but
/// its reader thread may not have read its last lines yet: a sleep is no
/// proof that it has, the end of the channel is.
fn rest_of(err: Receiver<String>) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        match err.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => lines.push(l),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return lines,
            Err(e) => panic!("stderr not closed 60 s after the exit: {e}; {lines:?}"),
        }
    }
}

/// A reader's lock: a read transaction holding SQLite's SHARED lock,
/// which keeps any writer from committing.
fn hold_as_reader(db: &Path) -> Connection {
    let c = Connection::open(db).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.execute_batch("BEGIN").unwrap();
    let _: i64 = c
        .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    c
}

/// Waits until the run's writer is blocked in a write: its rollback
/// journal exists while it waits for the readers to go.
fn wait_for_blocked_write(db: &Path) {
    let journal = PathBuf::from(format!("{}-journal", s(db)));
    let t0 = Instant::now();
    while !journal.exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no write began");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_reader_holding_the_database_for_seconds_delays_a_run_but_loses_nothing() {
    let d = dir("reader");
    let db = d.join("r.db");
    let (child, _err) = start_run(&db, &d, "pgtable-flush", &[]);
    let reader = hold_as_reader(&db);
    wait_for_blocked_write(&db);
    // Longer than the 2 s a write used to wait.
    std::thread::sleep(Duration::from_secs(3));
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let out = wait_within(child, Duration::from_secs(120), "run");
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stored"], true);
    assert_eq!(v["scenarios"][0]["stored"], true);
    assert_eq!(run_state(&db), ("complete".to_string(), 1));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_scenario_not_stored_in_time_is_kept_and_stored_with_the_next() {
    let d = dir("retry");
    let db = d.join("r.db");
    let (child, err) = start_run(&db, &d, "pgtable-flush,dma-map", &["--db-wait", "0.5"]);
    let reader = hold_as_reader(&db);
    wait_for_blocked_write(&db);
    // The first store gave up after 0.5 s: the second scenario starts.
    loop {
        let line = err
            .recv_timeout(Duration::from_secs(60))
            .expect("the run went on to its second scenario");
        if line.contains("[2/2] dma-map ...") {
            break;
        }
    }
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let out = wait_within(child, Duration::from_secs(120), "run");
    let rest: Vec<String> = err.try_iter().collect();
    assert_eq!(out.status.code(), Some(0), "{rest:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stored"], true);
    assert_eq!(run_state(&db), ("complete".to_string(), 2));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_database_held_past_the_bound_prints_the_figures_and_says_what_was_not_stored() {
    let d = dir("held");
    let db = d.join("r.db");
    let (child, err) = start_run(
        &db,
        &d,
        "pgtable-flush",
        &["--db-wait", "0.5", "--db-final-wait", "1"],
    );
    let pid = child.id();
    let holder = Connection::open(&db).unwrap();
    holder.busy_timeout(Duration::from_secs(10)).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let child_out = wait_within(child, Duration::from_secs(120), "run");
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    let lines = rest_of(err);
    assert_eq!(child_out.status.code(), Some(1), "{lines:?}");
    let last = lines.last().unwrap();
    assert!(
        last.starts_with(&format!("softiommu: results database {} was held by another process for more than 0.5 s at a time: ", s(&db)))
            && last.contains("run 1's scenario(s) pgtable-flush were not stored (their figures are printed above, the HTML report was not written); its row could not be marked failed either and still says running (the next `softiommu run` on this database marks it failed as abandoned)"),
        "{last}"
    );
    let v: Value = serde_json::from_slice(&child_out.stdout).expect("the JSON is still printed");
    assert_eq!(v["stored"], false);
    assert_eq!(v["scenarios"][0]["stored"], false);
    assert_eq!(v["scenarios"][0]["result"]["bench"], "pgtable");
    assert!(
        v["store_error"]
            .as_str()
            .unwrap()
            .ends_with("was held by another process for more than 0.5 s at a time"),
        "{v}"
    );
    assert!(
        !d.join("report.html").exists(),
        "no report of what is not stored"
    );
    // The row could not be changed while the lock was held, and says so.
    assert_eq!(run_state(&db), ("running".to_string(), 0));
    // The next writer sees that the process is gone and marks the row
    // failed with the reason; `history` shows it.
    stored_run(&db, &d.join("next.html"));
    let reason = format!("abandoned: process {pid} ended without finishing");
    let h = softiommu(&["history", "--json", "--db", s(&db)]);
    assert!(h.status.success());
    let v: Value = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(v["runs"][0]["status"], "failed");
    assert_eq!(v["runs"][0]["failure"], reason.as_str());
    assert_eq!(v["runs"][1]["status"], "complete");
    assert_eq!(v["runs"][1]["failure"], Value::Null);
    let t = softiommu(&["history", "--db", s(&db)]);
    assert!(String::from_utf8_lossy(&t.stdout).contains(&reason));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_reader_holding_past_the_write_wait_is_outlasted_by_the_final_bound() {
    // A reader holds the database from before the scenario's store until
    // well after the 0.5 s write wait: the store gives up once, then the
    // end of the run retries within its final bound, stores the scenario
    // and marks the run complete.
    let d = dir("outlast");
    let db = d.join("r.db");
    let (child, err) = start_run(
        &db,
        &d,
        "pgtable-flush",
        &["--db-wait", "0.5", "--db-final-wait", "60"],
    );
    let reader = hold_as_reader(&db);
    wait_for_blocked_write(&db);
    std::thread::sleep(Duration::from_secs(4));
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let out = wait_within(child, Duration::from_secs(120), "run");
    let rest: Vec<String> = err.try_iter().collect();
    assert_eq!(out.status.code(), Some(0), "{rest:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stored"], true);
    assert_eq!(run_state(&db), ("complete".to_string(), 1));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_fifo_or_a_directory_as_the_database_is_one_line_for_every_command() {
    let d = dir("fifo");
    let fifo = d.join("f");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let sub = d.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let out_html = d.join("o.html");
    for (f, kind) in [(&fifo, "a FIFO"), (&sub, "a directory")] {
        for args in [
            vec!["history", "--db", s(f)],
            vec!["history", "--json", "--db", s(f)],
            vec!["report", "--db", s(f), "--out", s(&out_html)],
            vec!["compare", "1", "2", "--db", s(f)],
            vec![
                "run",
                "--quick",
                "--scenarios",
                "pgtable-flush",
                "--db",
                s(f),
            ],
        ] {
            let child = bin()
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let out = wait_within(child, Duration::from_secs(10), &format!("{args:?}"));
            one_line(
                &out,
                2,
                &format!(
                    "{} is {kind}, not a results database file; it was left as it is",
                    s(f)
                ),
            );
        }
    }
    assert!(!out_html.exists());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn read_only_commands_refuse_a_foreign_or_empty_file_and_never_change_it() {
    let d = dir("foreign");
    let foreign = d.join("foreign.db");
    let c = Connection::open(&foreign).unwrap();
    c.execute_batch(
        "CREATE TABLE recipes (name TEXT, eggs INTEGER); INSERT INTO recipes VALUES ('cake', 3);",
    )
    .unwrap();
    drop(c);
    let empty = d.join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let out_html = d.join("o.html");
    for (f, why) in [
        (&foreign, "(an SQLite database with 1 table(s) of another program's and no softiommu schema version); it was left as it is"),
        (&empty, "(an empty file: no softiommu schema)"),
    ] {
        let before = std::fs::read(f).unwrap();
        for args in [
            vec!["history", "--db", s(f)],
            vec!["history", "--json", "--db", s(f)],
            vec!["report", "--db", s(f), "--out", s(&out_html)],
            vec!["compare", "1", "2", "--db", s(f)],
        ] {
            let line = one_line(
                &softiommu(&args),
                2,
                &format!("{} is not a softiommu results database {why}", s(f)),
            );
            assert!(!line.contains("CREATE"), "{line}");
            assert_eq!(std::fs::read(f).unwrap(), before, "{args:?}");
        }
        assert!(!out_html.exists());
    }
    // A writer refuses another program's database too.
    let before = std::fs::read(&foreign).unwrap();
    one_line(
        &softiommu(&[
            "run",
            "--quick",
            "--scenarios",
            "pgtable-flush",
            "--db",
            s(&foreign),
        ]),
        2,
        "is not a softiommu results database",
    );
    assert_eq!(std::fs::read(&foreign).unwrap(), before);
    let missing = d.join("missing.db");
    one_line(
        &softiommu(&["history", "--db", s(&missing)]),
        2,
        "no results database at",
    );
    assert!(!missing.exists());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn fio_aging_with_a_back_end_file_that_shrinks_marks_its_figures_invalid_and_exits_1() {
    let d = dir("shrink");
    let disk = d.join("disk.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let child = bin()
        .args([
            "lab",
            "fio-aging",
            "--backend",
            "file",
            "--file",
            s(&disk),
            "--no-dma",
            "--policies",
            "softiommu",
            "--jobs",
            "2",
            "--seconds",
            "1",
            "--windows",
            "8",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Shrink the file once the device has it open.
    let fds = PathBuf::from(format!("/proc/{}/fd", child.id()));
    let t0 = Instant::now();
    'open: loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the file was never opened"
        );
        for e in std::fs::read_dir(&fds).into_iter().flatten().flatten() {
            if std::fs::read_link(e.path()).ok().as_deref() == Some(disk.as_path()) {
                break 'open;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The file is open, but its size is checked just after: shrinking it
    // now could fail the open instead of the I/O. Wait until the device
    // has read from it (the process's read-syscall byte count grows by
    // 256 KiB, 64 of the 4 KiB reads).
    let rchar = || -> Option<u64> {
        let io = std::fs::read_to_string(format!("/proc/{}/io", child.id())).ok()?;
        io.lines()
            .find_map(|l| l.strip_prefix("rchar:"))
            .and_then(|v| v.trim().parse().ok())
    };
    let base = rchar().expect("/proc/PID/io is readable");
    while rchar().is_some_and(|r| r < base + (256 << 10)) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the device never read the file"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&disk)
        .unwrap()
        .set_len(0)
        .unwrap();
    let out = wait_within(child, Duration::from_secs(120), "fio-aging");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("the report is printed");
    assert_eq!(v["valid"], false, "{v}");
    let p = &v["policies"][0];
    assert!(p["io_errors"].as_u64().unwrap() > 0, "{p}");
    assert_eq!(p["valid"], false);
    assert!(p["why"].as_str().unwrap().contains("I/O error(s)"), "{p}");
    assert!(
        v["why"]
            .as_str()
            .unwrap()
            .starts_with("softiommu (aging): "),
        "{v}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with(
            "softiommu: lab fio-aging: the figures above are invalid: softiommu (aging): "
        ),
        "{err}"
    );
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn run_given_a_scenario_file_says_it_takes_names_and_lab_runs_files() {
    let d = dir("runfile");
    std::fs::write(d.join("file.toml"), "[lab-litmus]\nruns = 4\n").unwrap();
    let out = bin()
        .current_dir(&d)
        .args(["run", "--scenarios", "./file.toml", "--db", "r.db"])
        .output()
        .unwrap();
    one_line(
        &out,
        2,
        "run --scenarios takes built-in scenario names, and \"./file.toml\" is a file; run a scenario file with `softiommu lab ./file.toml` (built-in: udp-32, udp-16k,",
    );
    assert!(!d.join("r.db").exists(), "nothing was created");
    one_line(
        &softiommu(&["run", "--scenarios", "nope", "--db", s(&d.join("r.db"))]),
        2,
        "run --scenarios takes built-in scenario names: no built-in scenario \"nope\" (built-in: udp-32,",
    );
    std::fs::remove_dir_all(d).unwrap();
}
