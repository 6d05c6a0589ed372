//! The typed result of `lab iova-aging`, its JSON contract.

use serde::Serialize;

use crate::metrics::aging::{AgingSummary, VsFresh};

/// One policy's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    /// Policy name.
    pub policy: String,
    /// The aging figure, as `lab fio-aging` reports it.
    #[serde(flatten)]
    pub aging: AgingSummary,
    /// The headline: the aging figure against a fresh control arm of the
    /// same policy run in interleaved slices on the same thread
    /// (`retained_vs_fresh`, `stability_vs_fresh`, …).
    #[serde(flatten)]
    pub vs_fresh: VsFresh,
    /// Fresh domains the control arm built over the run (each lived
    /// 250,000 operations or 20 ms of its CPU time, whichever came
    /// first).
    pub fresh_lives: u64,
    /// Throughput of the first window, million I/Os per second (wall
    /// clock; cold).
    pub first_window_mops: f64,
    /// Throughput of the last window.
    pub last_window_mops: f64,
    /// Most nodes ever in the range allocator's tree.
    pub peak_tree_nodes: u64,
    /// Most IOVAs ever sampled in caches and depots.
    pub peak_cached_iovas: u64,
    /// The time line, window by window.
    pub windows: Vec<Window>,
    /// Linear-search steps over the run (Linux baselines).
    pub scan_steps: u64,
    /// Magazines given back to the tree.
    pub magazines_freed: u64,
    /// Full cache flushes.
    pub cache_flushes: u64,
    /// Allocations that failed (should be zero).
    pub failed_allocs: u64,
}

/// The JSON object of `lab iova-aging --json`.
#[derive(Debug, Clone, Serialize)]
pub struct AgingReport {
    /// Always "iova-aging".
    pub lab: &'static str,
    /// Jobs.
    pub jobs: usize,
    /// Interrupt CPUs.
    pub irq_cpus: usize,
    /// Seconds per policy.
    pub seconds: f64,
    /// MiB of the low window allocated in first (null: none).
    pub low_window_mib: Option<u64>,
    /// One entry per policy.
    pub policies: Vec<PolicyResult>,
}

/// One window of the time line.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// Seconds since the run started, at the window's end.
    pub t_s: f64,
    /// I/Os per second (wall clock) in this window.
    pub iops: f64,
    /// Million I/Os per second (wall clock) in this window.
    pub mops: f64,
    /// CPU seconds the workers spent in the aged arm's slices (with its
    /// background work) in this window.
    pub cpu_s: f64,
    /// Million I/Os per CPU-second of the aged arm in this window, as the
    /// aging figure takes it (windows below the CPU floor carry their
    /// merged group's rate).
    pub mops_per_cpu_s: f64,
    /// CPU seconds of the fresh control arm's counted slices.
    pub fresh_cpu_s: f64,
    /// The fresh arm's million I/Os per CPU-second in this window.
    pub fresh_mops_per_cpu_s: f64,
    /// The aged arm's million I/Os per CPU-second in the slices paired
    /// with a fresh one (each right after it).
    pub paired_mops_per_cpu_s: f64,
    /// `paired_mops_per_cpu_s / fresh_mops_per_cpu_s`: what the paired
    /// figure takes.
    pub vs_fresh: f64,
    /// Tree nodes at the end of the window.
    pub tree_nodes: u64,
    /// IOVAs in caches and depots at the end of the window.
    pub cached_iovas: u64,
    /// Linear-search steps per I/O in this window (Linux baselines).
    pub scan_steps_per_op: f64,
}
