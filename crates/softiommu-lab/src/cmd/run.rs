//! `softiommu run`: the headline suite. Every built-in scenario (each
//! seed's experiment that exists), progress on stderr, every result stored
//! as it finishes, the HTML report written, then a seed summary and each
//! seed-shaped table on stdout (or one JSON object with `--json`).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::DbArgs;
use crate::error::{LabError, LabResult};
use crate::host::{git_revision, Host};
use crate::progress::Progress;
use crate::render::{render_report, render_table};
use crate::report::{Column, Report, Table, Unit};
use crate::scenario::{builtin, Scenario, BUILTIN};
use crate::seeds::{summarise, SeedLine};
use crate::store::{RunStatus, Store};

/// Options of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Every scenario in its short form (the suite in under a minute).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object (run id, database, report, seed summary,
    /// scenarios) and nothing else on stdout.
    #[arg(long)]
    pub json: bool,
    /// Only these built-in scenarios (default: all).
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Where the HTML report goes.
    #[arg(long, default_value = "results/report.html")]
    pub report: PathBuf,
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

/// The scenarios to run.
fn selected(a: &RunArgs) -> LabResult<Vec<Scenario>> {
    let names: Vec<String> = if a.scenarios.is_empty() {
        BUILTIN.iter().map(|(f, _)| f.to_string()).collect()
    } else {
        a.scenarios.clone()
    };
    names
        .iter()
        .map(|n| {
            let s = builtin(n)?;
            Ok(if a.quick { s.quick()? } else { s })
        })
        .collect()
}

/// Runs the suite.
pub fn run(a: &RunArgs) -> LabResult<()> {
    let scenarios = selected(a)?;
    // Open (or create) the database first: a bad --db fails in a moment,
    // not after minutes of work.
    let mut store = Store::create(&a.db.db)?;
    let host = Host::detect();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let run_id = store.begin_run(&command, a.quick, &host, &git_revision())?;
    crate::interrupt::install();
    let mut progress = Progress::new(scenarios.len());
    let mut reports = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        progress.start(i + 1, &s.name, &s.about);
        let t0 = Instant::now();
        match run_one(s, &progress) {
            None => {
                progress.abandon("interrupted");
                store.finish_run(run_id, RunStatus::Partial)?;
                return Err(LabError::Interrupted {
                    run_id,
                    kept: reports.len(),
                    db: a.db.db.clone(),
                });
            }
            Some(Err(e)) => {
                progress.abandon("failed");
                store.finish_run(run_id, RunStatus::Failed)?;
                return Err(e);
            }
            Some(Ok(r)) => {
                let secs = t0.elapsed().as_secs_f64();
                store.add_scenario(run_id, i, &r, secs)?;
                progress.done(secs);
                reports.push((r, secs));
            }
        }
    }
    store.finish_run(run_id, RunStatus::Complete)?;
    let only: Vec<Report> = reports.iter().map(|(r, _)| r.clone()).collect();
    let seeds = summarise(&only);
    crate::html::write(&store, run_id, &a.report)?;
    if a.json {
        let scen: Vec<_> = reports
            .iter()
            .map(|(r, secs)| {
                json!({
                    "scenario": r.scenario,
                    "kind": r.kind,
                    "seed": r.seed,
                    "seconds": secs,
                    "result": r.contract,
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "run_id": run_id,
                "db": a.db.db,
                "report": a.report,
                "quick": a.quick,
                "seeds": seeds,
                "scenarios": scen,
            })
        );
    } else {
        println!(
            "softiommu run {run_id}{} on {}: {} scenarios stored in {}, report {}\n",
            if a.quick { " (quick)" } else { "" },
            host.line(),
            reports.len(),
            a.db.db.display(),
            a.report.display()
        );
        print!("{}", render_table(&seed_table(&seeds)));
        println!();
        for (r, _) in &reports {
            println!("{}", render_report(r, &host));
        }
    }
    Ok(())
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
            s.ours.into(),
            s.unit.into(),
            s.verdict.clone().into(),
        ]);
    }
    t
}
