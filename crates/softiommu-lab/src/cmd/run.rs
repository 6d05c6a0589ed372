//! `softiommu run`: the headline suite. Every built-in scenario (each
//! seed's experiment that exists), progress on stderr, every result stored
//! as it finishes, the HTML report written, then a seed summary and each
//! seed-shaped table on stdout (or one JSON object with `--json`).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::DbArgs;
use crate::args::Seconds;
use crate::error::{LabError, LabResult};
use crate::host::{git_revision, Host};
use crate::progress::Progress;
use crate::render::{render_report, render_table};
use crate::report::{Cell, Column, Report, Table, Unit};
use crate::scenario::{suite_builtin, Scenario, BUILTIN};
use crate::seeds::{summarise, SeedLine};
use crate::store::{RunStatus, Store, StoreError};

/// Options of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Every scenario in its short form (the suite in about five
    /// minutes on 2 cores, about six with the real guest).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object (run id, database, report, seed summary,
    /// scenarios) and nothing else on stdout.
    #[arg(long)]
    pub json: bool,
    /// Only these built-in scenarios, by name (default: all); a scenario
    /// file is run with `softiommu lab FILE`.
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Where the HTML report goes (never the database itself).
    #[arg(long, default_value = "results/report.html")]
    pub report: PathBuf,
    /// How long each write of results waits for another process holding
    /// the database, seconds (0.01..=86400; opening waits 2 s). A
    /// scenario not stored in time is kept and tried again after the
    /// next one; what is never stored is still printed, and the run
    /// exits 1 saying which.
    #[arg(long, default_value = "60")]
    pub db_wait: Seconds,
    /// How long the end of a run keeps retrying, seconds (0.01..=86400):
    /// storing what is left and recording how the run ended (with the
    /// reason when it failed). Past it the row still says running, and
    /// the next `run` marks it failed as abandoned.
    #[arg(long, default_value = "60")]
    pub db_final_wait: Seconds,
    /// The results database.
    #[command(flatten)]
    pub db: DbArgs,
}

/// How often the main thread looks for Ctrl-C while a scenario runs.
const POLL: Duration = Duration::from_millis(50);

enum Event {
    Step(String),
    Done(Box<LabResult<Report>>),
}

/// Runs one scenario on a thread of its own, so that Ctrl-C is seen at
/// once; `None` when interrupted (the scenario's threads end with the
/// process).
fn run_one(s: &Scenario, progress: &Progress) -> Option<LabResult<Report>> {
    let (tx, rx) = mpsc::channel();
    let s = s.clone();
    std::thread::spawn(move || {
        let step = tx.clone();
        let r = s.run(&mut |m| {
            let _ = step.send(Event::Step(m.to_string()));
        });
        let _ = tx.send(Event::Done(Box::new(r)));
    });
    loop {
        if crate::interrupt::interrupted() {
            return None;
        }
        match rx.recv_timeout(POLL) {
            Ok(Event::Step(m)) => progress.step(&m),
            Ok(Event::Done(r)) => return Some(*r),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Some(Err(LabError::ThreadPanicked { what: "scenario" }))
            }
        }
    }
}

/// The scenarios to run. A name is compared without its `.toml`, so
/// `dma-map,dma-map.toml` names one scenario twice and is refused.
fn selected(a: &RunArgs) -> LabResult<Vec<Scenario>> {
    let names: Vec<String> = if a.scenarios.is_empty() {
        BUILTIN.iter().map(|(f, _)| f.to_string()).collect()
    } else {
        a.scenarios.clone()
    };
    let key = |n: &str| n.strip_suffix(".toml").unwrap_or(n).to_string();
    // An empty name (`--scenarios ,` or `a,,b`) is no scenario: refused as
    // the lookup refuses an unknown one, before it could read as a repeat.
    if let Some(n) = names.iter().find(|n| n.trim().is_empty()) {
        suite_builtin(n)?;
    }
    for (i, n) in names.iter().enumerate() {
        if names[..i].iter().any(|m| key(m) == key(n)) {
            return Err(crate::error::LabError::ListRepeats {
                option: "--scenarios".into(),
                value: n.clone(),
            });
        }
    }
    names
        .iter()
        .map(|n| {
            let s = suite_builtin(n)?;
            Ok(if a.quick { s.quick()? } else { s })
        })
        .collect()
}

/// A scenario that ran: where it ran in the suite, its report (or the
/// error it failed with), seconds.
struct Done {
    ord: usize,
    name: String,
    report: Result<Report, String>,
    secs: f64,
    stored: bool,
    /// Why the database refused this scenario's rows (not a lock: the
    /// same rows would be refused again), when it did.
    store_error: Option<String>,
}

impl Done {
    /// Whether its rows are still to be written.
    fn pending(&self) -> bool {
        self.report.is_ok() && !self.stored && self.store_error.is_none()
    }
}

/// Stores the finished scenarios not stored yet, in order. A scenario
/// the database refuses for its own rows is marked so and the rest go
/// on; a database held past the write wait stops the lot (each would
/// wait as long), and that `Locked` is returned.
fn store_pending(store: &mut Store, run_id: i64, done: &mut [Done]) -> Option<StoreError> {
    for d in done.iter_mut().filter(|d| d.pending()) {
        let Ok(report) = &d.report else { continue };
        match store.add_scenario(run_id, d.ord, report, d.secs) {
            Ok(()) => d.stored = true,
            Err(e @ StoreError::Locked { .. }) => return Some(e),
            Err(e) => d.store_error = Some(e.to_string()),
        }
    }
    None
}

/// What the database did to a write, in words for the user: held past
/// the wait (SQLite's "locked" means only that here: the write was not
/// made), or its own error.
fn store_why(a: &RunArgs, err: &StoreError) -> String {
    match err {
        StoreError::Locked { .. } => format!(
            "results database {} was held by another process for more than {} s at a time",
            a.db.db.display(),
            a.db_wait.get()
        ),
        e => format!("results database refused a write: {e}"),
    }
}

/// What became of the run's row, in words.
fn row_words(marked: bool) -> &'static str {
    if marked {
        "the run is marked failed, with the reason (see `softiommu history`)"
    } else {
        "its row could not be marked failed either and still says running (the next `softiommu run` on this database marks it failed as abandoned)"
    }
}

/// What the end of a run could not store, as one error.
fn not_stored(a: &RunArgs, run_id: i64, done: &[Done], err: &StoreError, marked: bool) -> LabError {
    let names: Vec<&str> = done
        .iter()
        .filter(|d| d.report.is_ok() && !d.stored)
        .map(|d| d.name.as_str())
        .collect();
    LabError::NotStored {
        why: store_why(a, err),
        lost: if names.is_empty() {
            format!("run {run_id}'s scenarios were all stored, its status was not")
        } else {
            format!(
                "run {run_id}'s scenario(s) {} were not stored (their figures are printed above, the HTML report was not written)",
                names.join(", ")
            )
        },
        row: row_words(marked),
    }
}

/// The scenarios that failed, and those the database refused, each with
/// why; empty when there are none.
fn failures(done: &[Done]) -> Vec<String> {
    done.iter()
        .filter_map(|d| match (&d.report, &d.store_error) {
            (Err(e), _) => Some(format!("scenario {} failed: {e}", d.name)),
            (Ok(_), Some(e)) => Some(format!("scenario {} was not stored: {e}", d.name)),
            (Ok(_), None) => None,
        })
        .collect()
}

/// Runs the suite.
pub fn run(a: &RunArgs) -> LabResult<()> {
    run_with(a, &mut |s, progress| run_one(s, progress))
}

/// Runs the suite, each scenario through `run_scenario` (`None`:
/// interrupted). A scenario that fails is that scenario's result: the
/// rest run, what finished is stored and printed, the report written, and
/// the run ends failed naming it.
fn run_with(
    a: &RunArgs,
    run_scenario: &mut dyn FnMut(&Scenario, &Progress) -> Option<LabResult<Report>>,
) -> LabResult<()> {
    let scenarios = selected(a)?;
    super::out_path::refuse_database_as_output(&a.report, "--report", &a.db.db)?;
    // A FIFO or a device as the report is refused before the database
    // is opened or created.
    super::out_path::refuse_non_regular(&a.report, "--report")?;
    // Open (or create) the database first: a bad --db fails in a moment,
    // not after minutes of work.
    let mut store = Store::create(&a.db.db)?;
    // And the report's path: a bad --report fails now, not after the suite.
    super::out_path::check_writable(&a.report, "--report")?;
    let host = Host::detect();
    let command = std::env::args_os()
        .map(|x| x.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let run_id = store.begin_run(&command, a.quick, &host, &git_revision())?;
    // From here on a write waits longer for another process (a reader
    // such as `history` holds the file while it reads): what was measured
    // is not given up lightly.
    store.set_write_wait(Duration::from_secs_f64(a.db_wait.get()))?;
    let final_wait = Duration::from_secs_f64(a.db_final_wait.get());
    crate::interrupt::install();
    let mut progress = Progress::new(scenarios.len());
    let mut done: Vec<Done> = Vec::new();
    let mut store_err: Option<StoreError> = None;
    for (i, s) in scenarios.iter().enumerate() {
        progress.start(i + 1, &s.name, &s.about);
        let t0 = Instant::now();
        let r = match run_scenario(s, &progress) {
            None => {
                progress.abandon("interrupted");
                let unstored = store_pending(&mut store, run_id, &mut done);
                let row = match (
                    unstored,
                    store.finish_run_why(run_id, RunStatus::Partial, Some("interrupted"), final_wait),
                ) {
                    (None, Ok(())) => "marked partial",
                    (Some(_), Ok(())) => "marked partial (the database was held by another process: the other finished scenarios were not stored)",
                    (_, Err(_)) => "not marked partial: the database was held by another process, its row still says running",
                };
                return Err(LabError::Interrupted {
                    run_id,
                    kept: done.iter().filter(|d| d.stored).count(),
                    db: a.db.db.clone(),
                    row,
                });
            }
            Some(r) => r,
        };
        let secs = t0.elapsed().as_secs_f64();
        match &r {
            Err(e) => progress.abandon(&format!("FAILED: {e}")),
            Ok(rep) => match skipped_why(rep) {
                Some(why) => progress.skipped(why),
                None => progress.done(secs),
            },
        }
        done.push(Done {
            ord: i,
            name: s.name.clone(),
            report: r.map_err(|e| e.to_string()),
            secs,
            stored: false,
            store_error: None,
        });
        store_err = store_pending(&mut store, run_id, &mut done);
    }
    // The end of the run: what is left to store, and how it ended, are
    // retried within the final bound (what was measured is not given up
    // for a reader that holds the file a little longer).
    let t_final = Instant::now();
    if store_err.is_some() {
        store.set_write_wait(final_wait)?;
        store_err = store_pending(&mut store, run_id, &mut done);
    }
    let mut problems = failures(&done);
    if let Some(e) = &store_err {
        problems.push(store_why(a, e));
    }
    let (status, why) = if problems.is_empty() {
        (RunStatus::Complete, None)
    } else {
        (RunStatus::Failed, Some(problems.join("; ")))
    };
    let left = final_wait.saturating_sub(t_final.elapsed());
    let marked = match store.finish_run_why(run_id, status, why.as_deref(), left) {
        Ok(()) => true,
        Err(e) => {
            store_err.get_or_insert(e);
            false
        }
    };
    let only: Vec<Report> = done
        .iter()
        .filter_map(|d| d.report.as_ref().ok().cloned())
        .collect();
    let seeds = summarise(&only);
    // The HTML report shows what is stored: written unless the database
    // was held (then what it holds is not the run).
    let html: Option<LabResult<()>> = match &store_err {
        None => Some(crate::html::write(&store, run_id, &a.report, "--report")),
        Some(_) => None,
    };
    let html_error: Option<String> = match &html {
        Some(Ok(())) => None,
        Some(Err(e)) => Some(e.to_string()),
        None => Some("the database was held by another process".to_string()),
    };
    let stored = store_err.is_none() && done.iter().all(|d| d.report.is_err() || d.stored);
    let failed: Vec<&str> = done
        .iter()
        .filter(|d| d.report.is_err())
        .map(|d| d.name.as_str())
        .collect();
    if a.json {
        let scen: Vec<_> = done
            .iter()
            .map(|d| match &d.report {
                Ok(r) => json!({
                    "scenario": r.scenario,
                    "kind": r.kind,
                    "seed": r.seed,
                    "seconds": d.secs,
                    "result": r.contract,
                    "skipped": skipped_why(r),
                    "stored": d.stored,
                    "error": null,
                    "store_error": d.store_error,
                }),
                Err(e) => {
                    let s = &scenarios[d.ord];
                    json!({
                        "scenario": s.name,
                        "kind": s.lab_table().replacen('-', " ", 1),
                        "seed": s.seed,
                        "seconds": d.secs,
                        "result": null,
                        "skipped": null,
                        "stored": false,
                        "error": e,
                        "store_error": null,
                    })
                }
            })
            .collect();
        crate::out::println(
            &json!({
                "run_id": run_id,
                "db": a.db.db.display().to_string(),
                "report": html_error.is_none().then(|| a.report.display().to_string()),
                "report_error": html_error,
                "quick": a.quick,
                "session": crate::session::describe(),
                "seeds": seeds,
                "scenarios": scen,
                "failed": failed,
                "stored": stored,
                "store_error": store_err.as_ref().map(|e| store_why(a, e)),
            })
            .to_string(),
        )?;
    } else {
        let mut text = format!(
            "softiommu run {run_id}{} on {} (measured in {}): {} scenarios {} {}, report {}\n\n",
            if a.quick { " (quick)" } else { "" },
            host.line(),
            crate::session::describe().unwrap_or("the caller's session"),
            done.len(),
            if stored {
                "stored in"
            } else {
                "run, NOT all stored in"
            },
            a.db.db.display(),
            match &html_error {
                None => a.report.display().to_string(),
                Some(e) => format!("not written ({e})"),
            }
        );
        text.push_str(&render_table(&seed_table(&seeds)));
        text.push('\n');
        for d in &done {
            match &d.report {
                Ok(r) => text.push_str(&render_report(r, &host)),
                Err(e) => text.push_str(&format!("scenario {}: FAILED: {e}\n", d.name)),
            }
            text.push('\n');
        }
        crate::out::print(&text)?;
    }
    // A scenario failed or was refused: that error names it (and the
    // database held, if it was); held alone, `NotStored` below.
    if !failures(&done).is_empty() {
        let kept = done.iter().filter(|d| d.stored).count();
        let mut rest = format!(
            "the other {kept} scenario(s) are stored in {}",
            a.db.db.display()
        );
        match (&store_err, &html_error) {
            (Some(e), _) => {
                rest = not_stored(a, run_id, &done, e, marked).to_string();
            }
            (None, None) => {
                rest.push_str(&format!(", the report written to {}", a.report.display()))
            }
            (None, Some(e)) => rest.push_str(&format!(", the report not written: {e}")),
        }
        if store_err.is_none() {
            rest.push_str(&format!("; {}", row_words(marked)));
        }
        return Err(LabError::RunFailed {
            run_id,
            failed: failures(&done).join("; "),
            rest,
        });
    }
    if let Some(e) = &store_err {
        return Err(not_stored(a, run_id, &done, e, marked));
    }
    if let Some(Err(e)) = html {
        return Err(e);
    }
    let bad: Vec<String> = only
        .iter()
        .filter_map(|r| crate::validity::invalid(r).map(|why| format!("{}: {why}", r.scenario)))
        .collect();
    if !bad.is_empty() {
        return Err(LabError::InvalidFigures {
            what: format!("run {run_id}"),
            why: bad.join("; "),
        });
    }
    Ok(())
}

/// Why a finished scenario did not measure anything here (`lab guest`
/// without its kit), from its contract's `skipped`.
pub fn skipped_why(r: &Report) -> Option<&str> {
    r.contract.get("skipped").and_then(|v| v.as_str())
}

/// The seed summary as a table.
pub fn seed_table(seeds: &[SeedLine]) -> Table {
    let mut t = Table::new(
        "seeds",
        "seed summary: their figure, ours, verdict",
        vec![
            Column::label("seed"),
            Column::text("claim"),
            Column::metric("theirs", "theirs", Unit::Count, 2),
            Column::metric("ours", "ours", Unit::Count, 2),
            Column::text("unit"),
            Column::text("verdict"),
        ],
    );
    for s in seeds {
        t.row(vec![
            s.seed.into(),
            s.claim.clone().into(),
            s.theirs.into(),
            s.ours
                .map_or(Cell::Missing, |v| Cell::figure(v, s.ours_spread)),
            s.unit.into(),
            s.verdict.clone().into(),
        ]);
    }
    t
}
