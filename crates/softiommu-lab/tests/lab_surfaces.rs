//! The lab's user-facing surfaces under hostile conditions, through the
//! binary: a scenario that fails mid-suite, an output path that is a FIFO
//! or a device, arguments and paths that are not UTF-8, standard output
//! that cannot be written, and a scenario named twice. Each ends in the
//! documented exit code and at most one line, never a panic or a hang,
//! and nothing measured is lost.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softiommu"));
    c.env("RUST_BACKTRACE", "1");
    c
}

fn softiommu(args: &[&OsStr]) -> Output {
    bin().args(args).output().expect("the binary runs")
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softiommu-surf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Exactly one stderr line, `softiommu: ` and containing `want`; `code`.
fn one_line(out: &Output, code: i32, want: &str) {
    let lines = stderr_lines(out);
    assert_eq!(out.status.code(), Some(code), "{lines:?}");
    assert_eq!(lines.len(), 1, "not one line: {lines:?}");
    assert!(
        lines[0].starts_with("softiommu: ") && lines[0].contains(want),
        "{:?} lacks {want:?}",
        lines[0]
    );
}

fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().unwrap();
    assert!(st.success());
}

/// A quick run of the IOVA allocator bench alone into `db`, the report
/// to `report`.
fn quick_run(db: &Path, report: &Path) -> Output {
    softiommu(&[
        os("run"),
        os("--quick"),
        os("--json"),
        os("--scenarios"),
        os("iova-alloc"),
        os("--db"),
        db.as_os_str(),
        os("--report"),
        report.as_os_str(),
    ])
}

/// A guest kit whose kernel QEMU refuses makes `real-guest` fail: the
/// failure is that scenario's result, the scenarios before and after it
/// run and are stored, the JSON is printed whole, the HTML report is
/// written, the run is marked failed with the reason, and the exit is 1
/// (not 2, bad input) with one line naming the failed scenario. Before,
/// the suite stopped there: no JSON, no report, `dma-map` never ran, and
/// exit 2.
#[test]
fn a_failing_scenario_is_its_result_and_the_suite_goes_on() {
    let d = dir("fail");
    let kit = d.join("kit");
    std::fs::create_dir_all(&kit).unwrap();
    std::fs::write(kit.join("vmlinuz"), "x").unwrap();
    std::fs::write(kit.join("initramfs.cpio.gz"), "x").unwrap();
    let (db, report) = (d.join("f.db"), d.join("f.html"));
    let out = bin()
        .env("SOFTIOMMU_GUEST_KIT", &kit)
        .args([
            os("run"),
            os("--quick"),
            os("--json"),
            os("--scenarios"),
            os("iova-alloc,real-guest,dma-map"),
            os("--db"),
            db.as_os_str(),
            os("--report"),
            report.as_os_str(),
        ])
        .output()
        .unwrap();
    let lines = stderr_lines(&out);
    assert_eq!(out.status.code(), Some(1), "{lines:?}");
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("softiommu: run 1: scenario real-guest failed: guest:")
            && last.contains("the other 2 scenario(s) are stored in")
            && last.contains("the report written to"),
        "{last}"
    );
    assert!(!lines.iter().any(|l| l.contains("panicked")), "{lines:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["run_id"], 1);
    assert_eq!(v["failed"], serde_json::json!(["real-guest"]));
    assert_eq!(v["report"], report.to_str().unwrap());
    assert_eq!(v["report_error"], Value::Null);
    assert_eq!(v["stored"], true);
    let sc = v["scenarios"].as_array().unwrap();
    let names: Vec<&str> = sc.iter().map(|x| x["scenario"].as_str().unwrap()).collect();
    assert_eq!(names, ["iova-alloc", "real-guest", "dma-map"]);
    assert_eq!(
        sc.iter()
            .map(|x| x["stored"].as_bool().unwrap())
            .collect::<Vec<_>>(),
        [true, false, true]
    );
    assert!(
        sc[1]["error"].as_str().unwrap().starts_with("guest:"),
        "{}",
        sc[1]
    );
    assert_eq!(sc[1]["result"], Value::Null);
    assert_eq!(sc[0]["error"], Value::Null);
    assert_eq!(sc[2]["result"]["bench"], "dma");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("softiommu lab report — run 1"));
    let h = softiommu(&[os("history"), os("--json"), os("--db"), db.as_os_str()]);
    let h: Value = serde_json::from_slice(&h.stdout).unwrap();
    let r = &h["runs"][0];
    assert_eq!(
        (&r["status"], &r["scenarios"]),
        (&Value::from("failed"), &Value::from(2))
    );
    assert!(
        r["failure"]
            .as_str()
            .unwrap()
            .starts_with("scenario real-guest failed: guest:"),
        "{r}"
    );
    std::fs::remove_dir_all(d).unwrap();
}

/// `report --out FIFO` and `run --report FIFO` hung for ever (opening a
/// FIFO to write waits for a reader); `--report /dev/full` ran the suite
/// and printed the report's path as if written. Each is refused at once,
/// one line, exit 2, nothing created.
#[test]
fn an_output_that_is_a_fifo_or_a_device_is_refused_at_once() {
    let d = dir("fifo");
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let db = d.join("b.db");
    for (args, flag) in [
        (
            vec![
                os("report"),
                os("--db"),
                db.as_os_str(),
                os("--out"),
                fifo.as_os_str(),
            ],
            "--out",
        ),
        (
            vec![
                os("run"),
                os("--quick"),
                os("--scenarios"),
                os("dma-map"),
                os("--db"),
                db.as_os_str(),
                os("--report"),
                fifo.as_os_str(),
            ],
            "--report",
        ),
    ] {
        let t0 = Instant::now();
        let out = softiommu(&args);
        assert!(t0.elapsed() < Duration::from_secs(10));
        one_line(
            &out,
            2,
            &format!(
                "refusing to write {} ({flag}): it is a FIFO, not a regular file",
                fifo.display()
            ),
        );
        assert!(out.stdout.is_empty());
    }
    let out = softiommu(&[
        os("run"),
        os("--quick"),
        os("--scenarios"),
        os("dma-map"),
        os("--db"),
        db.as_os_str(),
        os("--report"),
        os("/dev/full"),
    ]);
    one_line(
        &out,
        2,
        "refusing to write /dev/full (--report): it is a device",
    );
    assert!(!db.exists(), "nothing is created before the refusal");
    std::fs::remove_dir_all(d).unwrap();
}

/// A report path that is not UTF-8 (a legal Linux name) panicked `run`
/// after the database was created; a `--db` path that is not UTF-8
/// panicked `history` and `compare` while building their JSON. The run
/// completes, the report is written, and the JSON shows the path lossily.
#[test]
fn paths_that_are_not_utf8_never_panic() {
    let d = dir("utf8");
    let report = d.join(OsStr::from_bytes(b"\xff.html"));
    let db = d.join(OsStr::from_bytes(b"\xfe.db"));
    let out = quick_run(&db, &report);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.exists());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["report"].as_str().unwrap().ends_with("\u{fffd}.html"),
        "{v}"
    );
    for args in [
        vec![os("history"), os("--json"), os("--db"), db.as_os_str()],
        vec![os("history"), os("--db"), db.as_os_str()],
        vec![
            os("compare"),
            os("1"),
            os("1"),
            os("--json"),
            os("--db"),
            db.as_os_str(),
        ],
    ] {
        let out = softiommu(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stderr.is_empty(), "{args:?}");
    }
    let out = softiommu(&[os("history"), os("--json"), os("--db"), db.as_os_str()]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["db"].as_str().unwrap().ends_with("\u{fffd}.db"), "{v}");
    std::fs::remove_dir_all(d).unwrap();
}

/// Standard output that cannot be written panicked with exit 101 (and a
/// backtrace under `RUST_BACKTRACE`): a full device is one line, exit 1;
/// a pipe closed by its reader (`| head -1`) ends quietly, exit 1.
#[test]
fn standard_output_that_cannot_be_written_is_one_line_or_quiet() {
    let d = dir("stdout");
    let (db, report) = (d.join("s.db"), d.join("s.html"));
    assert!(quick_run(&db, &report).status.success());
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = bin()
        .args([os("history"), os("--json"), os("--db"), db.as_os_str()])
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    one_line(
        &out,
        1,
        "cannot write to standard output: No space left on device",
    );
    // The reader closed before the child starts, so its first write meets
    // a closed pipe whatever the timing (closing it after the spawn raced
    // a child that had written everything into the pipe's buffer first).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = bin()
        .args([os("history"), os("--db"), db.as_os_str()])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(d).unwrap();
}

/// `dma-map` and `dma-map.toml` name one scenario: it ran, and was
/// stored, twice in one run. Refused before any work as a repeat.
#[test]
fn a_scenario_named_twice_with_and_without_toml_is_a_repeat() {
    let d = dir("dup");
    let db = d.join("dup.db");
    let out = softiommu(&[
        os("run"),
        os("--quick"),
        os("--scenarios"),
        os("dma-map,dma-map.toml"),
        os("--db"),
        db.as_os_str(),
        os("--report"),
        d.join("dup.html").as_os_str(),
    ]);
    one_line(
        &out,
        2,
        "--scenarios names dma-map.toml more than once; a list takes each value once",
    );
    assert!(!db.exists());
    std::fs::remove_dir_all(d).unwrap();
}

/// `git_rev` was the revision of the checkout the run was started in: a
/// run from an unrelated repository stored that repository's HEAD. It is
/// the revision the binary was built from.
#[test]
fn git_rev_is_the_binarys_revision_not_the_current_directorys() {
    let d = dir("gitrev");
    let repo = d.join("other");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .current_dir(&repo)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "unrelated"]);
    let other = git(&["rev-parse", "--short=12", "HEAD"]);
    let (db, report) = (d.join("r.db"), d.join("r.html"));
    let out = bin()
        .current_dir(&repo)
        .args([
            os("run"),
            os("--quick"),
            os("--json"),
            os("--scenarios"),
            os("iova-alloc"),
            os("--db"),
            db.as_os_str(),
            os("--report"),
            report.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let h = softiommu(&[os("history"), os("--json"), os("--db"), db.as_os_str()]);
    let h: Value = serde_json::from_slice(&h.stdout).unwrap();
    let rev = h["runs"][0]["git_rev"].as_str().unwrap().to_string();
    assert!(!rev.starts_with(&other), "{rev} is the current directory's");
    if let Some(built) = option_env!("SOFTIOMMU_GIT_REV") {
        assert_eq!(rev, built);
    }
    std::fs::remove_dir_all(d).unwrap();
}

/// `lab NAME` with a directory called NAME where it is run (`mkdir
/// iova-alloc`) refused with `cannot read scenario iova-alloc: Is a
/// directory`: the built-in scenario runs.
#[test]
fn a_directory_does_not_hide_a_built_in_scenario() {
    let d = dir("shadow");
    std::fs::create_dir_all(d.join("iova-alloc")).unwrap();
    let out = bin()
        .current_dir(&d)
        .args(["lab", "iova-alloc", "--quick", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["bench"], "iova");
    let out = bin()
        .current_dir(&d)
        .args(["lab", "not-a-scenario-dir"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    std::fs::create_dir_all(d.join("other")).unwrap();
    let out = bin()
        .current_dir(&d)
        .args(["lab", "other"])
        .output()
        .unwrap();
    one_line(&out, 2, "cannot read scenario other");
    std::fs::remove_dir_all(d).unwrap();
}
