//! The suite, the results database and the report, end to end through
//! the binary: `run --quick --json` stores one row per scenario and writes
//! the report; `history` and `compare` read them back; and each bad input
//! (unwritable directory, corrupt, locked or newer database, unknown run,
//! Ctrl-C) is one line, a non-zero exit, and nothing stored lost.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rusqlite::Connection;
use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_softiommu"))
}

fn softiommu(args: &[&str]) -> Output {
    bin().args(args).output().expect("the binary runs")
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softiommu-db-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// One stderr line starting `softiommu: ` and containing `want`; `code`.
fn one_line(out: &Output, code: i32, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(
        lines[0].starts_with("softiommu: ") && lines[0].contains(want),
        "{:?} lacks {want:?}",
        lines[0]
    );
}

/// A quick run of two short scenarios (seed 003's on the real stack, a
/// few seconds; a bench).
fn quick_run(db: &Path, report: &Path) -> Value {
    let out = softiommu(&[
        "run",
        "--quick",
        "--json",
        "--scenarios",
        "tcp-64k,dma-map",
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
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

fn scenario_rows(db: &Path, run: i64) -> i64 {
    let c = Connection::open(db).unwrap();
    c.query_row(
        "SELECT count(*) FROM scenarios WHERE run_id = ?1",
        [run],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn run_stores_every_scenario_writes_the_report_and_history_and_compare_read_them() {
    let d = dir("run");
    let (db, report) = (d.join("r/softiommu.db"), d.join("r/report.html"));
    let v = quick_run(&db, &report);
    assert_eq!(v["run_id"], 1);
    assert_eq!(v["db"], s(&db));
    assert_eq!(v["report"], s(&report));
    let seeds: Vec<&str> = v["seeds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["seed"].as_str().unwrap())
        .collect();
    assert_eq!(seeds, ["000", "001", "002", "003", "004"]);
    let s003 = &v["seeds"][3];
    assert!(
        s003["theirs"].as_f64().unwrap() > 0.5 && s003["ours"].as_f64().unwrap() > 0.0,
        "{s003}"
    );
    let names: Vec<&str> = v["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["tcp-64k", "dma-map"]);
    assert_eq!(
        v["scenarios"][1]["result"]["bench"], "dma",
        "each scenario carries its contract object"
    );
    assert_eq!(scenario_rows(&db, 1), 2);
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("<svg") && html.contains("softiommu lab report — run 1"));

    assert_eq!(quick_run(&db, &report)["run_id"], 2);
    let out = softiommu(&["history", "--json", "--db", s(&db)]);
    assert!(out.status.success());
    let h: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = h["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs
        .iter()
        .all(|r| r["status"] == "complete" && r["scenarios"] == 2 && r["quick"] == true));

    let out = softiommu(&["compare", "1", "2", "--json", "--db", s(&db)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = c["rows"].as_array().unwrap();
    assert!(rows.len() > 10, "{c}");
    for r in rows {
        // A figure may be zero or negative in B (no drops; a difference
        // of two runs within the noise): the ratio is then too.
        assert!(r["ratio"].is_null() || r["ratio"].as_f64().unwrap().is_finite());
        assert!(["", "better", "worse", "changed", "within the spread"]
            .contains(&r["flag"].as_str().unwrap()));
        assert!(["spread", "noise"].contains(&r["basis"].as_str().unwrap()));
    }
    let text = softiommu(&["compare", "1", "2", "--db", s(&db)]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("B/A (×)"));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn an_unwritable_results_directory_is_one_line() {
    let d = dir("unwritable");
    let file = d.join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let out = softiommu(&[
        "run",
        "--quick",
        "--scenarios",
        "dma-map",
        "--db",
        s(&file.join("r.db")),
    ]);
    one_line(&out, 2, "cannot create the results directory");
    assert!(out.stdout.is_empty());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_corrupt_database_is_refused_and_left_unchanged() {
    let d = dir("corrupt");
    let db = d.join("r.db");
    let junk = b"SQLite? no: a grocery list. eggs, flour, milk.\n".repeat(100);
    std::fs::write(&db, &junk).unwrap();
    for args in [
        vec!["history", "--db", s(&db)],
        vec!["run", "--quick", "--scenarios", "dma-map", "--db", s(&db)],
        vec!["report", "--db", s(&db)],
    ] {
        one_line(
            &softiommu(&args),
            2,
            "is not a softiommu results database or is corrupt",
        );
    }
    assert_eq!(std::fs::read(&db).unwrap(), junk);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_database_from_a_newer_schema_is_refused_and_never_altered() {
    let d = dir("newer");
    let db = d.join("r.db");
    let c = Connection::open(&db).unwrap();
    c.execute_batch(
        "CREATE TABLE future (x); INSERT INTO future VALUES (1); PRAGMA user_version = 7;",
    )
    .unwrap();
    drop(c);
    let before = std::fs::read(&db).unwrap();
    for args in [
        vec!["run", "--quick", "--scenarios", "dma-map", "--db", s(&db)],
        vec!["history", "--db", s(&db)],
    ] {
        one_line(
            &softiommu(&args),
            2,
            "has schema version 7, newer than this softiommu's 3; refusing to touch it",
        );
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_locked_database_is_one_line_and_loses_nothing() {
    let d = dir("locked");
    let (db, report) = (d.join("r.db"), d.join("report.html"));
    quick_run(&db, &report);
    let holder = Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    one_line(
        &softiommu(&["history", "--db", s(&db)]),
        2,
        "is locked by another process",
    );
    one_line(
        &softiommu(&["run", "--quick", "--scenarios", "dma-map", "--db", s(&db)]),
        2,
        "is locked by another process",
    );
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    assert_eq!(scenario_rows(&db, 1), 2, "the stored run is intact");
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn unknown_runs_and_missing_databases_are_one_line() {
    let d = dir("unknown");
    let (db, report) = (d.join("r.db"), d.join("report.html"));
    one_line(
        &softiommu(&["history", "--db", s(&db)]),
        2,
        "no results database at",
    );
    assert!(!db.exists(), "readers create nothing");
    quick_run(&db, &report);
    one_line(
        &softiommu(&["compare", "1", "99", "--db", s(&db)]),
        2,
        "no run 99 in",
    );
    one_line(
        &softiommu(&["report", "42", "--db", s(&db)]),
        2,
        "no run 42 in",
    );
    one_line(
        &softiommu(&["report", "42", "--db", s(&db)]),
        2,
        "(runs 1..=1)",
    );
    one_line(
        &softiommu(&["run", "--scenarios", "nope", "--db", s(&db)]),
        2,
        "no built-in scenario",
    );
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn ctrl_c_keeps_the_finished_scenarios_and_marks_the_run_partial() {
    let d = dir("sigint");
    let db = d.join("r.db");
    let mut child = bin()
        .args([
            "run",
            "--quick",
            "--scenarios",
            "pgtable-flush,udp-32,aging",
            "--db",
            s(&db),
        ])
        .args(["--report", s(&d.join("report.html"))])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    // Wait (on the child's own words, not a clock) for the first scenario
    // to finish, then press Ctrl-C during the second.
    loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "the run ended early");
        if line.contains("[2/3] udp-32 ...") {
            break;
        }
    }
    // SAFETY: kill(2) with a pid we own and a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(
        rest.contains("softiommu: interrupted: run 1 kept 1 finished scenario(s) in")
            && rest.contains("marked partial"),
        "{rest}"
    );
    let c = Connection::open(&db).unwrap();
    let st: String = c
        .query_row("SELECT status FROM runs WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    assert_eq!(st, "partial");
    assert_eq!(scenario_rows(&db, 1), 1);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(out.is_empty(), "no tables printed for an interrupted run");
    std::fs::remove_dir_all(d).unwrap();
}

/// `report` without a run id on a database with no stored results names
/// that, not a run 0 nobody asked for.
#[test]
fn report_without_a_run_on_a_database_without_results_says_so_in_one_line() {
    let d = dir("noresults");
    let (db, out) = (d.join("r.db"), d.join("report.html"));
    // A version-1 database (the oldest readers take, read as it is) with
    // its tables and no rows: what a `run` that stored nothing leaves.
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL,
            finished_at TEXT, status TEXT NOT NULL, command TEXT NOT NULL, quick INTEGER NOT NULL,
            git_rev TEXT NOT NULL, hostname TEXT NOT NULL, cpu_model TEXT NOT NULL,
            cores INTEGER NOT NULL, kernel TEXT NOT NULL);
         CREATE TABLE scenarios (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL,
            ord INTEGER NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, seed TEXT,
            seconds REAL NOT NULL, report TEXT NOT NULL);
         CREATE TABLE params (scenario_id INTEGER NOT NULL, name TEXT NOT NULL,
            value TEXT NOT NULL, unit TEXT);
         CREATE TABLE metrics (scenario_id INTEGER NOT NULL, tbl TEXT NOT NULL, row TEXT NOT NULL,
            name TEXT NOT NULL, unit TEXT NOT NULL, value REAL NOT NULL, modelled INTEGER NOT NULL);
         PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(c);
    let got = softiommu(&["report", "--db", s(&db), "--out", s(&out)]);
    one_line(&got, 2, "no run with results in");
    one_line(&got, 2, "(no runs yet); `softiommu run` stores one");
    assert!(
        !String::from_utf8_lossy(&got.stderr).contains("run 0"),
        "names a run 0"
    );
    assert!(got.stdout.is_empty() && !out.exists());
    std::fs::remove_dir_all(d).unwrap();
}

/// A `--report` path that cannot be written is refused before the suite
/// runs (it was found only after every scenario had run), in one line,
/// with no run begun.
#[test]
fn an_unwritable_report_path_is_refused_before_any_scenario_runs() {
    let d = dir("badreport");
    let db = d.join("r.db");
    for (report, want) in [
        (
            "/proc/softiommu-report.html",
            "cannot write /proc/softiommu-report.html: No such file or directory".to_string(),
        ),
        (
            s(&d),
            format!("cannot write {}: Is a directory (os error 21)", s(&d)),
        ),
    ] {
        let started = std::time::Instant::now();
        let out = softiommu(&[
            "run",
            "--quick",
            "--scenarios",
            "iova-alloc",
            "--db",
            s(&db),
            "--report",
            report,
        ]);
        one_line(&out, 2, &want);
        assert!(out.stdout.is_empty());
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    let history = softiommu(&["history", "--json", "--db", s(&db)]);
    let v: Value = serde_json::from_slice(&history.stdout).unwrap();
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(0), "{v}");
    std::fs::remove_dir_all(d).unwrap();
}
