//! The typed result of `lab iopf`, its JSON contract.

use serde::Serialize;

use crate::report::Spread;

/// One (msg_len, times, premap_pages) row, the seed's columns.
#[derive(Debug, Clone, Serialize)]
pub struct IopfRow {
    /// Message length, bytes.
    pub msg_len: u64,
    /// Sends over the same buffer.
    pub times: u64,
    /// Pages mapped per fault.
    pub premap_pages: u64,
    /// Pinned and pre-mapped: kB/s (10^3 bytes) of message processed.
    pub kbps_without: f64,
    /// Mapped on demand: kB/s.
    pub kbps_with: f64,
    /// Page requests the device raised (in the fastest run with IOPF).
    pub faults: u64,
    /// `kbps_with / kbps_without`.
    pub ratio: f64,
}

/// One row's figures on CPU time (kept beside the rows, which hold
/// exactly the seed's columns): kB of message per CPU-second of the
/// fault path's work, the device thread's CPU clock with the page
/// requests served inline on it (a lower bound: no cross-core transfer,
/// doorbell or wake-up).
#[derive(Debug, Clone, Serialize)]
pub struct IopfCpu {
    /// Message length, bytes.
    pub msg_len: u64,
    /// Sends over the same buffer.
    pub times: u64,
    /// Pages mapped per fault.
    pub premap_pages: u64,
    /// Pinned: kB (10^3 bytes) per CPU-second of the device thread's work
    /// (median over the repeats).
    pub kbps_per_cpu_s_without: f64,
    /// With IOPF: kB per CPU-second of the device thread's work, which
    /// served its own page requests inline (median over the timed runs).
    pub kbps_per_cpu_s_with: f64,
    /// With / without per CPU-second: the median over the repeats of each
    /// repeat's paired ratio.
    pub ratio: f64,
    /// `ratio` over the repeats (lowest, median, highest); `null` with
    /// one repeat.
    pub ratio_spread: Option<Spread>,
}

/// Raise-to-answer latency percentiles, microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FaultLatency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// 2 MiB blocks promoted in one row's configuration (kept beside the rows,
/// which hold exactly the seed's columns).
#[derive(Debug, Clone, Serialize)]
pub struct IopfPromotions {
    /// Message length, bytes.
    pub msg_len: u64,
    /// Sends over the same buffer.
    pub times: u64,
    /// Pages mapped per fault.
    pub premap_pages: u64,
    /// Blocks whose 4 KiB leaves were collapsed into a 2 MiB leaf, in the
    /// fastest run with IOPF (0 with `--promote off`, and for blocks a
    /// window mapped whole with a 2 MiB leaf at once).
    pub promotions: u64,
}

/// The JSON object `lab iopf --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct IopfReport {
    /// Always "iopf".
    pub lab: &'static str,
    /// One row per (msg_len, times, premap_pages).
    pub rows: Vec<IopfRow>,
    /// Whether the faulting domains promoted (`--promote`).
    pub promote: bool,
    /// Per row, in the same order: the 2 MiB blocks promoted.
    pub promotions: Vec<IopfPromotions>,
    /// Per row, in the same order: the figures on CPU time.
    pub cpu: Vec<IopfCpu>,
    /// Every page request of every run with IOPF, from its raise (the
    /// unit's stamp) to its group response being carried out, as the
    /// handler measures it.
    pub fault_latency_us: FaultLatency,
    /// The handler's own part of that: from taking the request off the
    /// queue to its answer carried out (the rest is the wait for a handler
    /// thread to look, or to get a CPU).
    pub fault_service_us: FaultLatency,
    /// Page requests that found the queue full, over every run.
    pub overflows: u64,
}
