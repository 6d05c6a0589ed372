//! The typed result of `lab litmus`, its JSON contract.

use serde::Serialize;

/// One (test, mode) row.
#[derive(Debug, Clone, Serialize)]
pub struct LitmusRow {
    /// "MP", "MP-rev" or "SB".
    pub test: &'static str,
    /// "relaxed", "ordered" or "full".
    pub mode: &'static str,
    /// Iterations run.
    pub runs: u64,
    /// Whether the time budget (`--max-seconds`) stopped the row before
    /// the iterations asked for.
    pub cut_short: bool,
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
