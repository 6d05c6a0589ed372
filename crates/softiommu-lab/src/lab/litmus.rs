//! `softiommu lab litmus`: the ordering the accessors promise, tested on
//! this CPU. A device thread (typed accesses through a `DmaAccessor`, at
//! IOVAs) and a guest CPU thread (atomics at the physical addresses, with a
//! driver's barriers) run message passing both ways and store buffering
//! in lock step, millions of times per access mode, and the outcomes the
//! guest must never see are counted (see `softiommu::access::litmus`).
//!
//! On x86, `relaxed` store buffering is expected to show forbidden
//! outcomes (a store waits in the store buffer while the next load runs)
//! and `ordered` none: that is the one fence the ordered mode pays for.
//! Every figure is measured.

use std::time::Instant;

use super::litmus_harness::{run as run_one, LitmusTest};
use serde::Serialize;
use softiommu::access::OrderMode;

use crate::table::Table;

/// Options of `lab litmus`.
#[derive(Debug, Clone, clap::Args)]
pub struct LitmusArgs {
    /// Iterations per test and mode (rounded up to whole batches of 4,096).
    #[arg(long, default_value_t = 4_000_000)]
    pub runs: u64,
    /// A short run (1,000,000 iterations per test and mode; seconds).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One (test, mode) row.
#[derive(Debug, Clone, Serialize)]
pub struct LitmusRow {
    /// "MP", "MP-rev" or "SB".
    pub test: &'static str,
    /// "relaxed", "ordered" or "full".
    pub mode: &'static str,
    /// Iterations run.
    pub runs: u64,
    /// Iterations with the forbidden outcome.
    pub forbidden: u64,
    /// The forbidden outcome, as `r1,r2`.
    pub forbidden_outcome: String,
    /// Counts of the outcomes `(r1, r2)` = (0,0), (0,1), (1,0), (1,1).
    pub outcomes: [u64; 4],
    /// Wall-clock nanoseconds per iteration (both threads, lock step).
    pub ns_per_run: f64,
}

/// The JSON object `lab litmus --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct LitmusReport {
    /// Always "litmus".
    pub lab: &'static str,
    /// The CPU architecture.
    pub arch: &'static str,
    /// The unit's drain barrier: with "fence", every translation issues a
    /// full fence, so even `relaxed` cannot show store buffering.
    pub drain_barrier: &'static str,
    /// Whether this was the quick form.
    pub quick: bool,
    /// Whether `ordered` and `full` showed no forbidden outcome.
    pub ok: bool,
    /// Which figures are measured: all of them.
    pub measured: &'static str,
    /// One row per (test, mode).
    pub rows: Vec<LitmusRow>,
}

/// Iterations per test and mode in the quick form.
const QUICK_RUNS: u64 = 1_000_000;

/// Runs the lab.
pub fn run(args: &LitmusArgs) -> Result<LitmusReport, String> {
    let runs = if args.quick {
        QUICK_RUNS
    } else {
        args.runs.max(1)
    };
    let mut rows = Vec::new();
    let mut drain_barrier = "fence";
    for test in LitmusTest::ALL {
        for mode in OrderMode::ALL {
            let t0 = Instant::now();
            let r = run_one(test, mode, runs).map_err(|e| e.to_string())?;
            let secs = t0.elapsed().as_secs_f64();
            drain_barrier = r.drain_barrier;
            let (f1, f2) = test.forbidden();
            rows.push(LitmusRow {
                test: test.name(),
                mode: mode.name(),
                runs: r.runs,
                forbidden: r.forbidden,
                forbidden_outcome: format!("{f1},{f2}"),
                outcomes: r.outcomes,
                ns_per_run: secs * 1e9 / r.runs.max(1) as f64,
            });
        }
    }
    let ok = rows
        .iter()
        .filter(|r| r.mode != OrderMode::Relaxed.name())
        .all(|r| r.forbidden == 0);
    Ok(LitmusReport {
        lab: "litmus",
        arch: std::env::consts::ARCH,
        drain_barrier,
        quick: args.quick,
        ok,
        measured: "all",
        rows,
    })
}

/// Renders the report for the terminal.
pub fn render(r: &LitmusReport) -> String {
    let mut t = Table::new(&[
        "test",
        "mode",
        "runs",
        "forbidden",
        "(0,0)",
        "(0,1)",
        "(1,0)",
        "(1,1)",
        "ns/run",
        "verdict",
    ]);
    for x in &r.rows {
        let verdict = match (x.mode, x.forbidden) {
            ("relaxed", 0) => "none seen",
            ("relaxed", _) => "reordered",
            (_, 0) => "ok",
            _ => "VIOLATION",
        };
        t.row(vec![
            x.test.to_string(),
            x.mode.to_string(),
            x.runs.to_string(),
            format!("{} ({})", x.forbidden, x.forbidden_outcome),
            x.outcomes[0].to_string(),
            x.outcomes[1].to_string(),
            x.outcomes[2].to_string(),
            x.outcomes[3].to_string(),
            format!("{:.0}", x.ns_per_run),
            verdict.to_string(),
        ]);
    }
    format!(
        "lab litmus: device thread (accessors, at IOVAs) vs guest CPU thread, {} ({} drain barrier){}; all figures measured\n{}{}\n",
        r.arch,
        r.drain_barrier,
        if r.quick { ", quick" } else { "" },
        t.render(),
        if r.ok {
            "ordered and full: no forbidden outcome"
        } else {
            "ordered or full showed a forbidden outcome"
        }
    )
}
