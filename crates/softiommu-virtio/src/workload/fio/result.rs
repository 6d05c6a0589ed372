//! What a fio run returns: the time line window by window (fio's status
//! line), per-job totals, and the costs per request.

use softiommu::iova::IovaStats;

use crate::workload::aging::WorkWindow;

/// One reporting window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FioWindow {
    /// The window's end, seconds from the run's start.
    pub t_s: f64,
    /// I/Os completed per second in the window.
    pub iops: f64,
    /// Gigabytes (10^9 bytes) moved per second in the window.
    pub gbps: f64,
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
    pub write_iops: f64,
    /// I/Os completed with an error status in the window.
    pub errors: u64,
    /// I/Os completed in the window.
    pub ops: u64,
    /// CPU seconds the driver side worked in the window: with
    /// `FioConfig::sample_work`, the window's requests × the CPU per
    /// request sampled in the window ([`work_cpu_us_per_req`](Self::work_cpu_us_per_req)),
    /// plus the DMA domain's flush timer and the allocator's background
    /// work (the device threads, which stand for hardware, are not in it).
    pub driver_cpu_s: f64,
    /// The job threads' CPU µs per request sampled in the window: per
    /// request submitted (chains, `map_sg`) plus per request reaped
    /// (`unmap_sg`, the flush queue's frees, the status); 0 without
    /// `FioConfig::sample_work` or without samples.
    pub work_cpu_us_per_req: f64,
    /// The submitting part of [`work_cpu_us_per_req`](Self::work_cpu_us_per_req):
    /// CPU µs per request submitted (chains, `map_sg`; slow requests
    /// among them).
    pub submit_cpu_us_per_req: f64,
    /// The reaping part: CPU µs per request reaped (`unmap_sg`, the flush
    /// queue's frees, the status).
    pub reap_cpu_us_per_req: f64,
    /// The flush timer's CPU seconds in the window.
    pub timer_cpu_s: f64,
    /// With [`FioConfig::fresh_arm`](super::FioConfig::fresh_arm):
    /// requests the fresh control arm reaped in timed calls in the window
    /// (0 without one).
    pub fresh_ops: u64,
    /// The fresh arm's CPU seconds for them: `fresh_ops` × its CPU per
    /// request sampled in the window (submitted plus reaped), measured on
    /// the same job threads as the aged requests' (0 without one).
    pub fresh_cpu_s: f64,
    /// The allocator's work in the window, to tell a growing working set
    /// (more tree work per request as the run ages) from a clock that
    /// counts something else: allocations the tree served (the caches
    /// missed).
    pub tree_allocs: u64,
    /// Frees into the tree in the window.
    pub tree_frees: u64,
    /// Magazines whose IOVAs went back to the tree in the window.
    pub magazines_freed: u64,
    /// Nodes in the allocator's tree at the window's end.
    pub tree_nodes: u64,
    /// IOVAs in the per-CPU caches and depots at the window's end.
    pub cached_iovas: u64,
    /// Page-table pages linked into the domain's table at the window's
    /// end (the table's working set).
    pub table_pages: u64,
    /// Page-table pages allocated in the window.
    pub tables_allocated: u64,
}

/// One job's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FioJobResult {
    /// Its queue.
    pub queue: u16,
    /// I/Os completed.
    pub ops: u64,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// I/Os completed with an error status (back-end I/O errors among
    /// them); the job went on.
    pub io_errors: u64,
    /// Reads checked against the `null` pattern.
    pub verified: u64,
    /// Checked reads whose data was wrong.
    pub verify_failures: u64,
    /// I/Os sent to the slow region.
    pub slow_ops: u64,
}

/// A fio run's outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FioResult {
    /// The back-end's kind.
    pub backend: &'static str,
    /// Jobs.
    pub jobs: Vec<FioJobResult>,
    /// OS threads that hosted them.
    pub threads: usize,
    /// Interrupt CPUs (0: each job completed its own I/Os).
    pub irq_cpus: usize,
    /// Device threads.
    pub device_workers: usize,
    /// The time line.
    pub windows: Vec<FioWindow>,
    /// Window length in seconds.
    pub window_s: f64,
    /// Measured seconds.
    pub runtime_s: f64,
    /// I/Os completed over the run.
    pub ops: u64,
    /// Their rate.
    pub iops: f64,
    /// Gigabytes per second over the run.
    pub gbps: f64,
    /// I/Os completed with an error status.
    pub io_errors: u64,
    /// Reads checked against the pattern, and those that failed.
    pub verified: u64,
    /// Checked reads whose data was wrong.
    pub verify_failures: u64,
    /// CPU microseconds of the driver side per I/O, from thread CPU
    /// clocks over the run: the job threads (submission, `map_sg`,
    /// completion, `unmap_sg`, and their polls and waits) and the DMA
    /// domain's flush timer (its frees on their behalf).
    pub driver_cpu_us_per_req: f64,
    /// The flush timer's share of that, µs per I/O.
    pub flush_timer_cpu_us_per_req: f64,
    /// The driver's CPU µs per request measured on samples of its own
    /// calls over the run (with `FioConfig::sample_work`; else 0).
    pub work_cpu_us_per_req: f64,
    /// CPU microseconds of the device threads per I/O (they stand for the
    /// hardware).
    pub device_cpu_us_per_req: f64,
    /// Slow I/Os still held by the device when the run ended (abandoned
    /// by the reset).
    pub abandoned: u64,
    /// Fresh hosts the control arm built over the run, over all threads
    /// (0 without [`FioConfig::fresh_arm`](super::FioConfig::fresh_arm)).
    pub fresh_lives: u64,
    /// The IOVA allocator's counters at the end.
    pub iova: IovaStats,
}

impl FioResult {
    /// The time line's IOPS, window by window (the aging figure's input).
    pub fn iops_series(&self) -> Vec<f64> {
        self.windows.iter().map(|w| w.iops).collect()
    }

    /// The time line as work and driver CPU time, window by window (the
    /// CPU-time aging figure's input, [`crate::workload::aging::cpu_rates`]).
    pub fn work_windows(&self) -> Vec<WorkWindow> {
        self.windows
            .iter()
            .map(|w| WorkWindow {
                ops: w.ops as f64,
                cpu_s: w.driver_cpu_s,
            })
            .collect()
    }

    /// The fresh control arm's time line as work and CPU time, window by
    /// window (all zero without one): the paired aging figure's second
    /// input, beside [`work_windows`](Self::work_windows).
    pub fn fresh_work_windows(&self) -> Vec<WorkWindow> {
        self.windows
            .iter()
            .map(|w| WorkWindow {
                ops: w.fresh_ops as f64,
                cpu_s: w.fresh_cpu_s,
            })
            .collect()
    }
}
