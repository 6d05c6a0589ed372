use serde::Serialize;

use crate::metrics::aging::{AgingSummary, VsFresh};

/// One window of a time line (fio's status line).
#[derive(Debug, Clone, Serialize)]
pub struct FioWindowOut {
    /// Seconds since the run started, at the window's end.
    pub t_s: f64,
    /// Requests completed per second (wall clock) in the window.
    pub iops: f64,
    /// CPU seconds the driver side worked in the window (requests × the
    /// job threads' sampled CPU per request, flush timer, the allocator's
    /// background work; not the device threads).
    pub driver_cpu_s: f64,
    /// The job threads' CPU µs per request sampled in the window.
    pub work_cpu_us_per_req: f64,
    /// Its submitting part: CPU µs per request submitted (chains and
    /// `map_sg`, slow requests among them).
    pub submit_cpu_us_per_req: f64,
    /// Its reaping part: CPU µs per request reaped (`unmap_sg`, the flush
    /// queue's frees into the caches, the status).
    pub reap_cpu_us_per_req: f64,
    /// The flush timer's CPU seconds in the window.
    pub timer_cpu_s: f64,
    /// Requests completed per driver CPU-second in the window, as the
    /// aging figure takes it (windows below the CPU floor carry their
    /// merged group's rate).
    pub iops_per_cpu_s: f64,
    /// Requests the fresh control arm completed in timed calls in the
    /// window.
    pub fresh_ops: u64,
    /// The fresh arm's CPU seconds for them (its sampled CPU per request
    /// × `fresh_ops`, on the same job threads).
    pub fresh_cpu_s: f64,
    /// The fresh arm's requests per CPU-second in the window (windows
    /// below its CPU floor carry their merged group's rate).
    pub fresh_iops_per_cpu_s: f64,
    /// `iops_per_cpu_s / fresh_iops_per_cpu_s`: what the headline figure
    /// takes (null where the paired figure is absent).
    pub vs_fresh: f64,
    /// Gigabytes (10^9) moved per second.
    pub gbps: f64,
    /// Requests the device failed in the window.
    pub errors: u64,
    /// Allocations the IOVA tree served in the window (the caches
    /// missed).
    pub tree_allocs: u64,
    /// Frees into the IOVA tree in the window.
    pub tree_frees: u64,
    /// Magazines whose IOVAs went back to the tree in the window.
    pub magazines_freed: u64,
    /// Nodes in the IOVA tree at the window's end.
    pub tree_nodes: u64,
    /// IOVAs in caches and depots at the window's end.
    pub cached_iovas: u64,
    /// Page-table pages linked at the window's end.
    pub table_pages: u64,
    /// Page-table pages allocated in the window.
    pub tables_allocated: u64,
}

/// One IOVA policy's aging run.
#[derive(Debug, Clone, Serialize)]
pub struct AgingPolicy {
    /// The IOVA policy.
    pub policy: String,
    /// The aging figure: retained and stability per driver CPU-second,
    /// and on wall-clock IOPS beside them.
    #[serde(flatten)]
    pub aging: AgingSummary,
    /// The headline: the aging figure against a fresh control arm (a
    /// second device and DMA domain of the same policies driven by the
    /// same job threads, replaced every 400 requests per job):
    /// `retained_vs_fresh`, `stability_vs_fresh`, … (null where the fresh
    /// arm ran in too few windows for a figure), and the fresh arm's own
    /// `retained_fresh` (the machine's drift over the run, most of what
    /// `retained` alone reads on this paced path).
    #[serde(flatten)]
    pub vs_fresh: VsFresh,
    /// Fresh hosts the control arm built over the run.
    pub fresh_lives: u64,
    /// Mean IOPS over the run.
    pub iops: f64,
    /// Mean GB/s over the run.
    pub gbps: f64,
    /// Driver-side CPU µs per request over the run: the job threads'
    /// clocks (polls and waits included) and the flush timer's.
    pub driver_cpu_us_per_req: f64,
    /// The flush timer's share of `driver_cpu_us_per_req`, µs per request.
    pub flush_timer_cpu_us_per_req: f64,
    /// The job threads' CPU µs per request measured on samples of their
    /// submitting and reaping calls (what the aging figure divides by,
    /// with the timer and background work).
    pub work_cpu_us_per_req: f64,
    /// Requests the device failed (back-end errors).
    pub io_errors: u64,
    /// Reads checked against the null pattern, and how many differed.
    pub verified: u64,
    /// Reads whose data differed from the pattern (must be 0).
    pub verify_failures: u64,
    /// Whether the figures measure the policy: false when the device
    /// failed requests or returned wrong data.
    pub valid: bool,
    /// Why not (null when valid).
    pub why: Option<String>,
    /// Most nodes ever in the allocator's tree.
    pub peak_tree_nodes: u64,
    /// IOVAs in caches and depots at the end.
    pub cached_iovas: u64,
    /// Linear-search steps of the Linux trees over the run.
    pub scan_steps: u64,
    /// Allocations the tree served (the caches missed).
    pub tree_allocs: u64,
    /// Frees into the tree.
    pub tree_frees: u64,
    /// Magazines whose IOVAs went back to the tree (the depot was full).
    pub magazines_freed: u64,
    /// The time line.
    pub windows: Vec<FioWindowOut>,
}

/// One DMA policy's cost row.
#[derive(Debug, Clone, Serialize)]
pub struct DmaCost {
    /// The DMA policy.
    pub policy: String,
    /// Requests per second.
    pub iops: f64,
    /// Gigabytes (10^9) per second.
    pub gbps: f64,
    /// Driver-side CPU µs per request (the job threads' CPU clocks and
    /// the flush timer's).
    pub driver_cpu_us_per_req: f64,
    /// The flush timer's share of `driver_cpu_us_per_req`, µs per request.
    pub flush_timer_cpu_us_per_req: f64,
    /// Device threads' CPU µs per request (they stand for hardware).
    pub device_cpu_us_per_req: f64,
    /// Driver CPU per request ÷ pass-through's (null without a
    /// pass-through row).
    pub cpu_ratio_to_passthrough: Option<f64>,
    /// Requests the device failed.
    pub io_errors: u64,
    /// Null-pattern reads that differed (must be 0).
    pub verify_failures: u64,
    /// Whether the figures measure the policy: false when the device
    /// failed requests or returned wrong data.
    pub valid: bool,
    /// Why not (null when valid).
    pub why: Option<String>,
}

/// The JSON object of `lab fio-aging --json`.
#[derive(Debug, Clone, Serialize)]
pub struct FioAgingReport {
    /// Always "fio-aging".
    pub lab: &'static str,
    /// Always "virtio-blk".
    pub device: &'static str,
    /// The back-end.
    pub backend: &'static str,
    /// Jobs.
    pub jobs: usize,
    /// Requests in flight per job.
    pub iodepth: usize,
    /// The pattern.
    pub rw: &'static str,
    /// The aging part's block sizes.
    pub bs: String,
    /// Interrupt CPUs of the aging part.
    pub irq_cpus: usize,
    /// Percent of the aging part's requests sent to the slow tail, as
    /// `--slow-pct` gave it (null: the default rate, `slow_per_s`).
    pub slow_pct: Option<f64>,
    /// Slow requests per second per job (null with `--slow-pct`).
    pub slow_per_s: Option<f64>,
    /// Slow requests in flight per job at most.
    pub slow_depth: usize,
    /// Seconds a slow request is held.
    pub slow_hold_s: f64,
    /// Sizes of the slow requests: "small" (4 KiB) or "mix".
    pub slow_sizes: &'static str,
    /// MiB of the low window the controller's IOVAs go to first.
    pub low_window_mib: u64,
    /// Whether they go there first (false with `--forcedac`).
    pub low_window_first: bool,
    /// Seconds of each aging run.
    pub seconds: f64,
    /// The aging part's pace, fast requests per second per job (null:
    /// unpaced, as fast as the device completes).
    pub rate_iops: Option<f64>,
    /// Seconds per window.
    pub window_s: f64,
    /// The CPU the aging part's device threads, the aged device's and
    /// every fresh one's alike, are pinned to, so that both arms' devices
    /// run where the other's runs (null: the kernel would not say which
    /// CPUs the lab may use, and nothing is pinned).
    pub device_cpu: Option<usize>,
    /// One entry per IOVA policy.
    pub policies: Vec<AgingPolicy>,
    /// One entry per DMA policy of the cost part.
    pub dma: Vec<DmaCost>,
    /// Whether every figure stands (false: some run had I/O errors or
    /// wrong data; the command then exits 1).
    pub valid: bool,
    /// Why not, naming each affected run (null when valid).
    pub why: Option<String>,
}
