//! The measurement: each litmus test in each ordering mode.

use std::time::{Duration, Instant};

use softiommu::access::OrderMode;

use super::harness::{run as run_one, LitmusTest};

use crate::error::LabResult;
use crate::report::Report;

use super::args::*;
use super::out::*;
use super::render::*;
use super::*;

/// Runs the lab.
pub fn run(args: &LitmusArgs) -> LabResult<Report> {
    let r = measure(args)?;
    Ok(report(&r))
}

pub(super) fn measure(args: &LitmusArgs) -> LabResult<LitmusReport> {
    let runs = if args.quick {
        QUICK_RUNS
    } else {
        args.runs.get()
    };
    let secs = if args.quick {
        QUICK_MAX_SECONDS.min(args.max_seconds.get())
    } else {
        args.max_seconds.get()
    };
    let budget = Some(Duration::from_secs(secs));
    let mut rows = Vec::new();
    let mut drain_barrier = "fence";
    for test in LitmusTest::ALL {
        for mode in OrderMode::ALL {
            let t0 = Instant::now();
            let r = run_one(test, mode, runs, budget)?;
            let secs = t0.elapsed().as_secs_f64();
            drain_barrier = r.drain_barrier;
            let (f1, f2) = test.forbidden();
            rows.push(LitmusRow {
                test: test.name(),
                mode: mode.name(),
                runs: r.runs,
                cut_short: r.cut_short,
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

pub(super) fn verdict(mode: &str, forbidden: u64) -> &'static str {
    match (mode, forbidden) {
        ("relaxed", 0) => "none seen",
        ("relaxed", _) => "reordered",
        (_, 0) => "ok",
        _ => "VIOLATION",
    }
}
