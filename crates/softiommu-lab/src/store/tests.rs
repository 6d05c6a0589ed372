//! The run row's life: its failure reason, the final bound on recording
//! how a run ended, abandoned rows marked by the next writer, old schemas
//! read as they are, and paths that are not regular files.

use std::path::PathBuf;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::schema::V1;
use super::write::abandoned_reason;
use super::{RunStatus, Store, StoreError};
use crate::host::Host;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softiommu-store-t-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d.join("r.db")
}

fn begin(store: &Store) -> i64 {
    store
        .begin_run("softiommu run", true, &Host::detect(), "rev")
        .unwrap()
}

#[test]
fn a_failed_run_keeps_its_reason_and_history_reads_it() {
    let p = tmp("reason");
    let store = Store::create(&p).unwrap();
    let id = begin(&store);
    store
        .finish_run_why(id, RunStatus::Failed, Some("held"), Duration::from_secs(1))
        .unwrap();
    drop(store);
    let r = Store::open(&p).unwrap().run(id).unwrap();
    assert_eq!(
        (r.status.as_str(), r.failure.as_deref()),
        ("failed", Some("held"))
    );
}

#[test]
fn recording_the_end_outlasts_a_reader_within_the_final_bound() {
    let p = tmp("final");
    let mut store = Store::create(&p).unwrap();
    let id = begin(&store);
    store.set_write_wait(Duration::from_millis(100)).unwrap();
    // A reader holds SQLite's SHARED lock for 1.5 s: far past the write
    // wait, inside the final bound.
    let (tx, rx) = channel();
    let q = p.clone();
    let reader = std::thread::spawn(move || {
        let c = Connection::open(&q).unwrap();
        c.execute_batch("BEGIN").unwrap();
        let _: i64 = c
            .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
            .unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        // Taken before the lock goes: the writer cannot have committed
        // before this instant.
        let released = Instant::now();
        c.execute_batch("COMMIT").unwrap();
        released
    });
    rx.recv().unwrap();
    store
        .finish_run_why(id, RunStatus::Complete, None, Duration::from_secs(20))
        .unwrap();
    let done = Instant::now();
    let released = reader.join().unwrap();
    // The write waited for the reader (its 1.5 s are far past the 100 ms
    // write wait). Compared with the instant the reader let go, not with
    // a clock started after its signal: this thread may run late.
    assert!(done >= released, "committed under the reader's lock");
    assert_eq!(store.run(id).unwrap().status, "complete");
    // Past the bound: Locked, and the row still says running.
    let id2 = begin(&store);
    let holder = Connection::open(&p).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let e = store
        .finish_run_why(
            id2,
            RunStatus::Failed,
            Some("x"),
            Duration::from_millis(300),
        )
        .unwrap_err();
    assert!(matches!(e, StoreError::Locked { .. }), "{e}");
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(store.run(id2).unwrap().status, "running");
}

#[test]
fn the_next_writer_marks_a_running_row_whose_process_is_gone_failed() {
    let p = tmp("abandoned");
    let store = Store::create(&p).unwrap();
    let dead_id = begin(&store);
    let live_id = begin(&store);
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = i64::from(dead.id());
    dead.wait().unwrap();
    let mut live = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let live_pid = i64::from(live.id());
    let c = Connection::open(&p).unwrap();
    c.execute(
        "UPDATE runs SET pid = ?1 WHERE id = ?2",
        [dead_pid, dead_id],
    )
    .unwrap();
    c.execute(
        "UPDATE runs SET pid = ?1 WHERE id = ?2",
        [live_pid, live_id],
    )
    .unwrap();
    drop(c);
    let next = begin(&store);
    live.kill().unwrap();
    live.wait().unwrap();
    let r = store.run(dead_id).unwrap();
    assert_eq!(
        (r.status.as_str(), r.failure.as_deref()),
        ("failed", Some(abandoned_reason(dead_pid).as_str()))
    );
    assert_eq!(
        abandoned_reason(dead_pid),
        format!("abandoned: process {dead_pid} ended without finishing")
    );
    assert!(r.finished_at.is_some());
    let l = store.run(live_id).unwrap();
    assert_eq!((l.status.as_str(), l.failure), ("running", None));
    assert_eq!(store.run(next).unwrap().status, "running");
}

#[test]
fn readers_read_a_version_1_database_as_it_is_and_run_migrates_it() {
    let p = tmp("v1");
    let c = Connection::open(&p).unwrap();
    c.execute_batch(V1).unwrap();
    c.execute_batch(
        "INSERT INTO runs (started_at, status, command, quick, git_rev, hostname, cpu_model, cores, kernel)
         VALUES ('2026-01-01T00:00:00Z', 'complete', 'softiommu run', 1, 'r', 'h', 'c', 2, 'k');
         PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(c);
    let before = std::fs::read(&p).unwrap();
    let runs = Store::open(&p).unwrap().runs().unwrap();
    assert_eq!(
        (runs.len(), runs[0].status.as_str(), runs[0].failure.clone()),
        (1, "complete", None)
    );
    assert_eq!(
        std::fs::read(&p).unwrap(),
        before,
        "a reader never migrates"
    );
    drop(Store::create(&p).unwrap());
    let c = Connection::open(&p).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let failure: Option<String> = c
        .query_row("SELECT failure FROM runs WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    assert_eq!((v, failure), (super::schema::LATEST, None));
}

#[test]
fn a_version_2_database_is_read_as_it_is_and_spreads_are_stored_from_version_3() {
    use crate::report::{Cell, Column, Report, Spread, Table, Unit};
    let p = tmp("v2");
    let c = Connection::open(&p).unwrap();
    c.execute_batch(V1).unwrap();
    c.execute_batch(super::schema::V2).unwrap();
    c.execute_batch(
        "INSERT INTO runs (started_at, status, command, quick, git_rev, hostname, cpu_model, cores, kernel)
         VALUES ('2026-01-01T00:00:00Z', 'complete', 'softiommu run', 1, 'r', 'h', 'c', 2, 'k');
         INSERT INTO scenarios (run_id, ord, name, kind, seed, seconds, report)
         VALUES (1, 0, 'sc', 'bench x', NULL, 1.0, '{}');
         INSERT INTO metrics (scenario_id, tbl, row, name, unit, value, modelled)
         VALUES (1, 'results', 'a', 'ns', 'ns', 10.0, 0);
         PRAGMA user_version = 2;",
    )
    .unwrap();
    drop(c);
    let before = std::fs::read(&p).unwrap();
    let old = Store::open(&p)
        .unwrap()
        .metric_spread_history("sc", "results", "a", "ns")
        .unwrap();
    assert_eq!(old, vec![(1, 10.0, None)]);
    assert_eq!(
        std::fs::read(&p).unwrap(),
        before,
        "a reader never migrates"
    );
    // A writer migrates it to version 3; a figure of rounds keeps its spread.
    let mut store = Store::create(&p).unwrap();
    let id = begin(&store);
    let mut t = Table::new(
        "results",
        "x",
        vec![
            Column::label("row"),
            Column::metric("ns", "ns", Unit::Ns, 1),
        ],
    );
    let spread = Spread::of(&[9.0, 11.0, 12.0]);
    t.row(vec!["a".into(), Cell::median(spread)]);
    let mut r = Report::new("bench x", "x", serde_json::json!({}));
    r.scenario = "sc".into();
    r.tables.push(t);
    store.add_scenario(id, 0, &r, 1.0).unwrap();
    drop(store);
    let c = Connection::open(&p).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 3);
    drop(c);
    let h = Store::open(&p)
        .unwrap()
        .metric_spread_history("sc", "results", "a", "ns")
        .unwrap();
    assert_eq!(h, vec![(1, 10.0, None), (id, 11.0, Some(spread))]);
}

/// Runs `f` on a thread; `None` if it has not returned within 5 s.
fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(5)).ok()
}

#[test]
fn a_fifo_or_a_directory_is_refused_unopened() {
    let p = tmp("fifo");
    let st = std::process::Command::new("mkfifo")
        .arg(&p)
        .status()
        .unwrap();
    assert!(st.success());
    for writer in [false, true] {
        let q = p.clone();
        let e = within_5s(move || {
            if writer {
                Store::create(&q).map(|_| ())
            } else {
                Store::open(&q).map(|_| ())
            }
        })
        .expect("opening a FIFO does not hang")
        .unwrap_err();
        assert!(
            matches!(e, StoreError::NotAFile { kind: "a FIFO", .. }),
            "{e}"
        );
    }
    let d = tmp("dir");
    std::fs::create_dir_all(&d).unwrap();
    for e in [Store::open(&d).unwrap_err(), Store::create(&d).unwrap_err()] {
        assert!(
            matches!(
                e,
                StoreError::NotAFile {
                    kind: "a directory",
                    ..
                }
            ),
            "{e}"
        );
    }
    assert!(d.is_dir());
}

#[test]
fn the_newest_run_with_results_of_a_database_without_any_is_a_typed_error() {
    let p = tmp("noresults");
    let store = Store::create(&p).unwrap();
    let e = store.latest_run().unwrap_err();
    assert!(
        matches!(&e, StoreError::NoRunWithResults { known, .. } if known == "no runs yet"),
        "{e}"
    );
    let id = begin(&store);
    store
        .finish_run_why(id, RunStatus::Failed, Some("held"), Duration::from_secs(1))
        .unwrap();
    let e = store.latest_run().unwrap_err();
    assert!(
        matches!(&e, StoreError::NoRunWithResults { known, .. } if *known == format!("runs {id}..={id}")),
        "{e}"
    );
    assert!(!e.to_string().contains("run 0"), "{e}");
}

/// The lab's deliberate "absent" figures (NaN) are stored as absent: the
/// scenario is stored (it was refused by `metrics.value NOT NULL`), the
/// NaN figure has no metric row while its neighbours do, and the stored
/// report reads back (a NaN plot point or spread made it unreadable).
#[test]
fn a_scenario_with_absent_figures_is_stored_and_reads_back() {
    use crate::report::{Axis, Cell, Column, Plot, PlotKind, Report, Series, Spread, Table, Unit};
    let p = tmp("nan");
    let mut store = Store::create(&p).unwrap();
    let id = begin(&store);
    let mut r = Report::new("lab fio-aging", "absent figures", serde_json::json!({}));
    r.scenario = "storage-aging".into();
    let mut t = Table::new(
        "aging",
        "aging",
        vec![
            Column::label("policy"),
            Column::metric("ratio", "vs pass-through", Unit::Ratio, 2),
            Column::metric("retained", "retained", Unit::Ratio, 2),
        ],
    );
    t.row(vec![
        "softiommu".into(),
        Cell::Num(f64::NAN),
        Cell::figure(0.9, Some(Spread::of(&[0.8, 0.9, 1.0]))),
    ]);
    t.row(vec![
        "strict".into(),
        Cell::median(Spread {
            min: f64::NAN,
            median: f64::NAN,
            max: f64::NAN,
        }),
        Cell::Num(0.5),
    ]);
    r.tables.push(t);
    r.plots.push(Plot {
        name: "timeline".into(),
        title: "t".into(),
        kind: PlotKind::Lines,
        x: Axis::new("s", Unit::Count),
        y: Axis::new("r", Unit::Ratio),
        categories: Vec::new(),
        series: vec![Series::new(
            "a",
            vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, 3.0)],
        )],
        modelled: false,
    });
    store.add_scenario(id, 0, &r, 1.0).unwrap();
    let rows: Vec<(String, String)> = Connection::open(&p)
        .unwrap()
        .prepare("SELECT row, name FROM metrics ORDER BY row, name")
        .unwrap()
        .query_map([], |x| Ok((x.get(0)?, x.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        rows,
        [
            ("softiommu".to_string(), "retained".to_string()),
            ("strict".to_string(), "retained".to_string())
        ]
    );
    drop(store);
    let back = Store::open(&p).unwrap().scenarios(id).unwrap();
    assert_eq!(back.len(), 1);
    let t = &back[0].report.tables[0];
    assert_eq!(t.rows[0][1], Cell::Missing);
    assert_eq!(t.rows[1][1], Cell::Missing);
    assert_eq!(t.get("softiommu", "retained"), Some(0.9));
    assert_eq!(
        back[0].report.plots[0].series[0].points,
        [(0.0, 1.0), (2.0, 3.0)]
    );
}
