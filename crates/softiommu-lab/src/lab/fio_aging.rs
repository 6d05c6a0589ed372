//! `softiommu lab fio-aging`: seed `004`'s run on the storage path.
//!
//! Twelve fio-like jobs (`softiommu_virtio::workload::fio`) drive a
//! virtio-blk device through the IOMMU: each request is one `map_sg` over
//! its segments, the device reads its header, moves its data and writes
//! its status through the unit, and the completion is one `unmap_sg`.
//! Two parts:
//!
//! 1. **Cost per DMA policy** (pass-through, strict, deferred): the seed's
//!    twelve jobs of 4 KiB random reads; IOPS, GB/s and the driver side's
//!    CPU per request (thread CPU clocks of the job threads: submission,
//!    `map_sg`, completion, `unmap_sg`; and of the DMA domain's flush
//!    timer, whose share stands beside), the device threads' apart (they
//!    stand for hardware).
//! 2. **Aging per IOVA allocator design** (ours and the Linux 2016 / 2020 /
//!    2023 baselines) in deferred mode, with the two conditions that age
//!    the caches in the seed: completions on fewer interrupt CPUs than jobs
//!    (IOVAs allocated on one CPU, freed on another) and a slow tail (a
//!    share of requests held by the device for seconds, each pinning its
//!    IOVA while many others come and go). The time line is fio's status
//!    line; the figure is `workload::aging`'s (warm-up discarded, medians
//!    of the first and last quarter, 5th percentile over median), taken
//!    on the driver side's requests per CPU-second (`retained`,
//!    `stability`) and, beside it, on wall-clock IOPS (`retained_wall`,
//!    `stability_wall`).
//!
//! # Which CPU ages
//!
//! The allocator runs on the driver side: the job threads' submissions
//! (`map_sg`) and completions (on the interrupt CPUs: `unmap_sg` and the
//! flush queue's frees into the caches, where the Linux trees walk), the
//! DMA domain's flush timer (frees of queues that aged out), and the
//! allocator's background work the conductor runs every 100 ms. The
//! figure's CPU time per window is the window's requests × the job
//! threads' CPU per request, measured on their own calls (every
//! submitting or reaping call timed on the thread's CPU clock,
//! `softiommu_virtio::workload::fio`'s `sample` module), plus the flush
//! timer's CPU clock and the background work's (timed on the conductor's
//! own clock). What the job threads spend between those calls — polls of
//! queues that had nothing, arming interrupts, sleeping and waking,
//! doorbells that wake a device thread — is left out: how much of it
//! comes per request follows the device threads' pace, which a co-runner
//! sets, not the allocator's state. The device threads stand for
//! hardware and are not counted.
//!
//! Everything is real work of this process; the unit's hardware latencies
//! are the zero model (nothing is modelled in this lab's figures).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use softiommu::dma::DmaPolicy;
use softiommu::iova::IovaPolicy;
use softiommu_virtio::blk::{BackendConfig, BlkHostConfig};
use softiommu_virtio::workload::fio::{
    run_fio, BlockSizes, FioConfig, FioResult, RwMode, SlowTail, MAX_SLOTS, MAX_SLOW_DEPTH,
    MAX_SLOW_PER_S, MIN_WINDOW,
};

use crate::args::{
    dma_policies, iova_policies, DmaPolicyName, IovaPolicyName, Percent, Ranged, Seconds,
};
use crate::error::{LabError, LabResult};
use crate::metrics::aging::{aging_columns, AgingSummary};
use crate::report::{contract, Axis, Column, Param, Plot, PlotKind, Report, Series, Table, Unit};

/// The deferred-flush timeout of the aging part, the longest the domain
/// takes (`softiommu::dma::MAX_TIMEOUT`, 60 s): each interrupt CPU's
/// flush queue is flushed when it holds 256 entries (Linux's
/// `IOVA_FQ_SIZE`), inside the completion that filled it, at any request
/// rate the lab sees (an interrupt CPU completing 1,000 requests a second
/// fills its queue in a quarter of a second). With Linux's 10 ms a queue
/// is flushed by the timer when its oldest entry ages out, with fewer
/// entries the slower the requests come, so the flush's fixed cost per
/// request follows the device's pace; measured, the driver's CPU per
/// request moved 0.7-2.7 µs with it (9 k-33 k IOPS) while the allocator's
/// state did not change. With 2 s the timer still flushed every second,
/// 2-10 ms of CPU in one window of four, beside 7 ms of request work.
pub const AGING_FLUSH_TIMEOUT: Duration = softiommu::dma::MAX_TIMEOUT;

/// The seed's block-size mix for the aging part: mostly 4 KiB with larger
/// transfers, so IOVAs of several orders come and go.
pub const DEFAULT_AGING_BS: &str = "4k:60,16k:20,64k:15,128k:5";

/// A block size or a mix, checked while the command line is parsed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BsArg {
    /// As written.
    pub text: String,
    /// Parsed.
    pub sizes: BlockSizes,
}

impl BsArg {
    /// Parses a known-good literal (defaults).
    fn parse(s: &str) -> Self {
        s.parse().unwrap_or_else(|_| Self {
            text: "4k".into(),
            sizes: BlockSizes::one(4096),
        })
    }
}

impl std::str::FromStr for BsArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let sizes = BlockSizes::parse(s).map_err(|e| e.to_string())?;
        Ok(Self {
            text: s.to_string(),
            sizes,
        })
    }
}

impl TryFrom<String> for BsArg {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<BsArg> for String {
    fn from(b: BsArg) -> String {
        b.text
    }
}

/// The back-end the device serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendName {
    /// Completes at once; reads return a pattern derived from the sector
    /// (verified on a sample), writes are dropped: Linux's `null_blk`.
    #[default]
    Null,
    /// A RAM disk.
    Memory,
    /// A regular file (`--file`), `pread`/`pwrite`, optional `--direct`.
    File,
}

/// The sizes of the slow tail's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlowSizes {
    /// One 4 KiB block each, in a page of its own (data checked).
    #[default]
    Small,
    /// Drawn from the block-size mix, in slots sharing one set of pages
    /// per queue: every size pinned, as a device's latency tail hits
    /// requests of every size (their data is not checked).
    Mix,
}

/// The read/write pattern (fio's `rw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RwName {
    /// Random reads (the seed's jobs).
    #[default]
    Randread,
    /// Random writes.
    Randwrite,
    /// Random reads and writes, half each.
    Randrw,
}

impl RwName {
    fn mode(self) -> RwMode {
        match self {
            RwName::Randread => RwMode::RandRead,
            RwName::Randwrite => RwMode::RandWrite,
            RwName::Randrw => RwMode::RandRw { read_pct: 50 },
        }
    }
}

impl BackendName {
    fn name(self) -> &'static str {
        match self {
            BackendName::Null => "null",
            BackendName::Memory => "memory",
            BackendName::File => "file",
        }
    }
}

/// Options of `lab fio-aging` (and of a `[lab-fio-aging]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FioAgingArgs {
    /// A short run with the same shape (about 30 s in all).
    #[arg(long)]
    pub quick: bool,
    /// Seconds of the aging run per IOVA policy (0.08..=86400: eight
    /// windows of at least 10 ms; default 6 with --quick, else 60).
    #[arg(long)]
    pub seconds: Option<Seconds>,
    /// Windows in each aging time line (8..=10000, at most one per 10 ms;
    /// default 24 with --quick, else 120).
    #[arg(long)]
    pub windows: Option<Ranged<8, 10_000>>,
    /// Seconds per DMA policy of the cost part (0.1..=86400; default 1.5
    /// with --quick, else 10).
    #[arg(long)]
    pub dma_seconds: Option<Seconds>,
    /// Jobs, one request queue each, as fio's `numjobs` (1..=64).
    #[arg(long, default_value = "12")]
    pub jobs: Ranged<1, 64>,
    /// Requests in flight per job (1..=1024).
    #[arg(long, default_value = "32")]
    pub iodepth: Ranged<1, 1024>,
    /// Pattern.
    #[arg(long, value_enum, default_value = "randread")]
    pub rw: RwName,
    /// Block size of the aging part, or a mix summing to 100 (`4k:60,16k:40`;
    /// multiples of 512 up to 16 MiB).
    #[arg(long, default_value = DEFAULT_AGING_BS)]
    pub bs: BsArg,
    /// Block size of the cost part (the seed's log: 4 KiB).
    #[arg(long, default_value = "4k")]
    pub dma_bs: BsArg,
    /// Interrupt CPUs completing the jobs' requests in the aging part
    /// (1..=64; fewer than jobs moves IOVAs between CPUs, as in the seed).
    #[arg(long, default_value = "4")]
    pub irq_cpus: Ranged<1, 64>,
    /// Percent of requests sent to the device's slow region in the aging
    /// part (0..=100; 0: no slow tail). Default: not a percentage but a
    /// rate, each job sending 1.5 low windows' worth of slow requests
    /// (at the mix's mean size) over the hold, so that the tail pins the
    /// same IOVA space by the same time into a run on a machine of any
    /// speed.
    #[arg(long)]
    pub slow_pct: Option<Percent>,
    /// Slow requests in flight per job at most (1..=10000; with
    /// --iodepth at most 10,922, what a 32,768-entry virtqueue holds;
    /// default 10000, or what --iodepth leaves of 10,922).
    #[arg(long)]
    pub slow_depth: Option<Ranged<1, 10_000>>,
    /// Sizes of the slow requests.
    #[arg(long, value_enum, default_value = "mix")]
    pub slow_sizes: SlowSizes,
    /// Seconds the device holds a slow request (0.01..=86400; default: the
    /// aging run's length, so slow IOVAs stay pinned while others cycle).
    #[arg(long)]
    pub slow_hold: Option<Seconds>,
    /// MiB of IOVA space below which the controller's IOVAs go first, as
    /// Linux gives a PCI device the 32-bit range (1..=4096; default 1024, a
    /// quarter of Linux's 4 GiB, so that twelve jobs' slow tail and caches
    /// fill it in seconds rather than hours).
    #[arg(long)]
    pub low_window_mib: Option<Ranged<1, 4096>>,
    /// Give the controller IOVAs anywhere in its mask from the start
    /// (Linux's `iommu.forcedac=1`), not the low window first.
    #[arg(long)]
    pub forcedac: bool,
    /// The device's back-end.
    #[arg(long, value_enum, default_value = "null")]
    pub backend: BackendName,
    /// The file of the `file` back-end (it must exist and hold the disk).
    #[arg(long, required_if_eq("backend", "file"))]
    pub file: Option<PathBuf>,
    /// Open the file with `O_DIRECT`.
    #[arg(long)]
    pub direct: bool,
    /// Disk size in MiB (1..=65536; default 4096 for `null` and `memory`;
    /// for `file` the bytes used, the file must be at least this long;
    /// default: the whole file).
    #[arg(long)]
    pub disk_mib: Option<Ranged<1, 65_536>>,
    /// IOVA policies of the aging part (default: all, baselines first).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<IovaPolicyName>,
    /// DMA policies of the cost part (default: passthrough, strict,
    /// deferred).
    #[arg(long, value_delimiter = ',')]
    pub dma_policies: Vec<DmaPolicyName>,
    /// Skip the cost part (the aging part only).
    #[arg(long)]
    pub no_dma: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for FioAgingArgs {
    fn default() -> Self {
        Self {
            quick: false,
            seconds: None,
            windows: None,
            dma_seconds: None,
            jobs: Ranged::new(12),
            iodepth: Ranged::new(32),
            rw: RwName::Randread,
            bs: BsArg::parse(DEFAULT_AGING_BS),
            dma_bs: BsArg::parse("4k"),
            irq_cpus: Ranged::new(4),
            slow_pct: None,
            slow_depth: None,
            slow_sizes: SlowSizes::Mix,
            slow_hold: None,
            low_window_mib: None,
            forcedac: false,
            backend: BackendName::Null,
            file: None,
            direct: false,
            disk_mib: None,
            policies: Vec::new(),
            dma_policies: Vec::new(),
            no_dma: false,
            json: false,
        }
    }
}

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
    /// The flush timer's CPU seconds in the window.
    pub timer_cpu_s: f64,
    /// Requests completed per driver CPU-second in the window, as the
    /// aging figure takes it (windows below the CPU floor carry their
    /// merged group's rate).
    pub iops_per_cpu_s: f64,
    /// Gigabytes (10^9) moved per second.
    pub gbps: f64,
    /// Requests the device failed in the window.
    pub errors: u64,
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
    /// Seconds per window.
    pub window_s: f64,
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

/// Why a run's figures do not measure its policy: requests the device
/// failed, or reads whose data was wrong. `None` when there were none.
fn failed_work(io_errors: u64, verify_failures: u64) -> Option<String> {
    let mut why = Vec::new();
    if io_errors > 0 {
        why.push(format!(
            "{io_errors} I/O error(s): the back-end failed requests (a file that shrank or failed under the run), so throughput and aging are not the policy's"
        ));
    }
    if verify_failures > 0 {
        why.push(format!("{verify_failures} read(s) returned wrong data"));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

fn fio_err(run: String) -> impl FnOnce(softiommu_virtio::workload::fio::FioError) -> LabError {
    move |source| LabError::Fio { run, source }
}

fn backend(args: &FioAgingArgs) -> LabResult<BackendConfig> {
    let mib = args.disk_mib.map(Ranged::get);
    let capacity = mib.unwrap_or(4096) << 20;
    Ok(match args.backend {
        BackendName::Null => BackendConfig::Null { capacity },
        BackendName::Memory => BackendConfig::Memory { capacity },
        BackendName::File => BackendConfig::File {
            path: args.file.clone().ok_or(LabError::Setup(
                "--backend file needs --file PATH (an existing file)",
            ))?,
            direct: args.direct,
            size: mib.map(|m| m << 20),
        },
    })
}

/// The low window in MiB: `--low-window-mib`, or a quarter of Linux's.
fn low_window_mib(args: &FioAgingArgs) -> u64 {
    args.low_window_mib.map_or(1024, Ranged::get)
}

/// The slow tail's depth: `--slow-depth`, or as deep as the ring allows.
fn slow_depth(args: &FioAgingArgs) -> usize {
    args.slow_depth.map_or(
        MAX_SLOW_DEPTH.min(MAX_SLOTS.saturating_sub(args.iodepth.us()).max(1)),
        Ranged::us,
    )
}

/// How many low windows of IOVA space the default slow tail pins by the
/// end of its hold: more than one, so that with the caches and the fast
/// I/Os it fills the window well before the run ends.
const SLOW_FILL: f64 = 1.5;

/// The slow tail: `--slow-pct` percent of the requests, or by default a
/// rate per job that pins [`SLOW_FILL`] low windows by the end of the
/// hold, `SLOW_FILL × window ÷ (hold × mean slow size × jobs)` requests a
/// second each. A rate, not a percentage, so the window fills at the same
/// time into a run on a machine of any speed: measured, a fixed 4 % filled
/// it ~2 s into the quick run at 290 k IOPS and barely by its end at
/// 155 k (2016's `retained` 0.07 and 0.38).
fn slow_tail(
    args: &FioAgingArgs,
    jobs: usize,
    slow_hold: f64,
    bs: &BlockSizes,
) -> Option<SlowTail> {
    let mixed = matches!(args.slow_sizes, SlowSizes::Mix);
    let depth = slow_depth(args);
    let (pct, per_s) = match args.slow_pct {
        Some(p) if p.get() <= 0.0 => return None,
        Some(p) => (p.get(), None),
        None => {
            let size = if mixed { bs.mean_bytes() } else { 4096.0 };
            let bytes = SLOW_FILL * (low_window_mib(args) << 20) as f64;
            let rate = bytes / (slow_hold * size.max(1.0) * jobs.max(1) as f64);
            // No faster than the depth can hold over the hold: with small
            // slow requests or few jobs the tail pins less than the target
            // (the window may not fill), and the report says what is sent.
            let most = depth as f64 / slow_hold;
            (0.0, Some(rate.min(most).min(MAX_SLOW_PER_S)))
        }
    };
    Some(SlowTail {
        pct,
        per_s,
        depth,
        hold: Duration::from_secs_f64(slow_hold),
        mixed,
    })
}

fn host(args: &FioAgingArgs, policy: DmaPolicy, iova: IovaPolicy) -> LabResult<BlkHostConfig> {
    let mut h = BlkHostConfig {
        policy,
        iova_policy: iova,
        low_window_bytes: low_window_mib(args) << 20,
        low_window_first: !args.forcedac,
        ..BlkHostConfig::default()
    };
    h.device.backend = backend(args)?;
    if matches!(args.backend, BackendName::File) && args.direct {
        h.device.blk.blk_size = 4096;
    }
    Ok(h)
}

fn windows_out(r: &FioResult, rates: &[f64]) -> Vec<FioWindowOut> {
    r.windows
        .iter()
        .zip(rates)
        .map(|(w, &rate)| FioWindowOut {
            t_s: w.t_s,
            iops: w.iops,
            driver_cpu_s: w.driver_cpu_s,
            work_cpu_us_per_req: w.work_cpu_us_per_req,
            timer_cpu_s: w.timer_cpu_s,
            iops_per_cpu_s: rate,
            gbps: w.gbps,
            errors: w.errors,
        })
        .collect()
}

/// The DMA policies of the cost part.
fn cost_policies(args: &FioAgingArgs) -> Vec<DmaPolicy> {
    if args.no_dma {
        Vec::new()
    } else if args.dma_policies.is_empty() {
        vec![
            DmaPolicy::Passthrough,
            DmaPolicy::Strict,
            DmaPolicy::Deferred,
        ]
    } else {
        dma_policies(&args.dma_policies)
    }
}

/// Runs the lab; `progress` hears of each run as it finishes.
pub fn run(args: &FioAgingArgs, mut progress: impl FnMut(&str)) -> LabResult<Report> {
    let rw = args.rw.mode();
    let bs = args.bs.sizes.clone();
    let dma_bs = args.dma_bs.sizes.clone();
    if matches!(args.backend, BackendName::File) && args.file.is_none() {
        return Err(LabError::Setup(
            "--backend file needs --file PATH (an existing file)",
        ));
    }
    let seconds = args
        .seconds
        .map_or(if args.quick { 6.0 } else { 60.0 }, Seconds::get);
    // Windows of at least the fio engine's 10 ms, and at least 8 of them.
    let n_windows = args
        .windows
        .map_or(if args.quick { 24 } else { 120 }, Ranged::us)
        .min((seconds / MIN_WINDOW.as_secs_f64()) as usize);
    if n_windows < 8 {
        return Err(LabError::Setup(
            "--seconds must be at least 0.08 (8 windows of at least 10 ms)",
        ));
    }
    let window = Duration::from_secs_f64(seconds / n_windows as f64);
    let dma_seconds = args
        .dma_seconds
        .map_or(if args.quick { 1.5 } else { 10.0 }, Seconds::get);
    let slow_hold = args.slow_hold.map_or(seconds, Seconds::get);
    let jobs = args.jobs.us();
    let dma = cost_policies(args);

    // The aging part's configuration, checked before anything runs.
    let tail = slow_tail(args, jobs, slow_hold, &bs);
    let aging_cfg = FioConfig {
        jobs,
        iodepth: args.iodepth.us(),
        rw,
        bs,
        runtime: Duration::from_secs_f64(seconds),
        window,
        irq_cpus: Some(args.irq_cpus.us()),
        slow: tail,
        sample_work: true,
        flush_timeout: Some(AGING_FLUSH_TIMEOUT),
        ..FioConfig::default()
    };
    aging_cfg
        .check()
        .map_err(fio_err("fio-aging".to_string()))?;

    // Part 1: the cost of each DMA policy on the seed's 4 KiB random reads.
    let cost_cfg = FioConfig {
        jobs,
        iodepth: args.iodepth.us(),
        rw,
        bs: dma_bs,
        runtime: Duration::from_secs_f64(dma_seconds),
        window: Duration::from_secs_f64(dma_seconds / 4.0)
            .clamp(MIN_WINDOW, Duration::from_secs_f64(dma_seconds)),
        ..FioConfig::default()
    };
    let mut costs: Vec<DmaCost> = Vec::new();
    for p in dma {
        let run = format!("fio-aging {}", p.name());
        let r = run_fio(&host(args, p, IovaPolicy::Softiommu)?, &cost_cfg).map_err(fio_err(run))?;
        progress(&format!(
            "{}: {:.0} IOPS, {:.2} µs/req",
            p.name(),
            r.iops,
            r.driver_cpu_us_per_req
        ));
        costs.push(DmaCost {
            policy: p.name().to_string(),
            iops: r.iops,
            gbps: r.gbps,
            driver_cpu_us_per_req: r.driver_cpu_us_per_req,
            flush_timer_cpu_us_per_req: r.flush_timer_cpu_us_per_req,
            device_cpu_us_per_req: r.device_cpu_us_per_req,
            cpu_ratio_to_passthrough: None,
            io_errors: r.io_errors,
            verify_failures: r.verify_failures,
            valid: failed_work(r.io_errors, r.verify_failures).is_none(),
            why: failed_work(r.io_errors, r.verify_failures),
        });
    }
    let pt = costs
        .iter()
        .find(|c| c.policy == DmaPolicy::Passthrough.name())
        .map(|c| c.driver_cpu_us_per_req);
    for c in &mut costs {
        c.cpu_ratio_to_passthrough = pt.filter(|&b| b > 0.0).map(|b| c.driver_cpu_us_per_req / b);
    }

    // Part 2: aging per IOVA policy, deferred.
    let mut out = Vec::new();
    for ip in iova_policies(&args.policies) {
        let run = format!("fio-aging {}", ip.name());
        let r = run_fio(&host(args, DmaPolicy::Deferred, ip)?, &aging_cfg)
            .map_err(fio_err(run.clone()))?;
        let why = failed_work(r.io_errors, r.verify_failures);
        let work = r.work_windows();
        let (aging, rates) =
            match AgingSummary::of(&run, &r.iops_series(), &work, r.window_s, r.runtime_s) {
                Ok(a) => a,
                // Failed requests can leave no throughput to age: the
                // figure is absent (null), and the run is marked invalid
                // below.
                Err(_) if why.is_some() => (AgingSummary::absent(), vec![f64::NAN; work.len()]),
                Err(e) => return Err(e),
            };
        match &why {
            None => progress(&format!(
                "{} retained {:.2} per CPU-s, {:.2} wall",
                ip.name(),
                aging.retained,
                aging.retained_wall
            )),
            Some(w) => progress(&format!("{} INVALID: {w}", ip.name())),
        }
        out.push(AgingPolicy {
            policy: ip.name().to_string(),
            aging,
            iops: r.iops,
            gbps: r.gbps,
            driver_cpu_us_per_req: r.driver_cpu_us_per_req,
            flush_timer_cpu_us_per_req: r.flush_timer_cpu_us_per_req,
            work_cpu_us_per_req: r.work_cpu_us_per_req,
            io_errors: r.io_errors,
            verified: r.verified,
            verify_failures: r.verify_failures,
            valid: why.is_none(),
            why,
            peak_tree_nodes: r.iova.peak_tree_nodes,
            cached_iovas: r.iova.cached_iovas,
            scan_steps: r.iova.scan_steps,
            tree_allocs: r.iova.tree_allocs,
            tree_frees: r.iova.tree_frees,
            magazines_freed: r.iova.magazines_freed,
            windows: windows_out(&r, &rates),
        });
    }
    let why: Vec<String> = costs
        .iter()
        .filter_map(|c| c.why.as_ref().map(|w| format!("{} (cost): {w}", c.policy)))
        .chain(
            out.iter()
                .filter_map(|p| p.why.as_ref().map(|w| format!("{} (aging): {w}", p.policy))),
        )
        .collect();
    let rep = FioAgingReport {
        lab: "fio-aging",
        device: "virtio-blk",
        backend: args.backend.name(),
        jobs,
        iodepth: args.iodepth.us(),
        rw: rw.name(),
        bs: args.bs.text.clone(),
        irq_cpus: args.irq_cpus.us(),
        slow_pct: args.slow_pct.map(Percent::get),
        slow_per_s: tail.and_then(|t| t.per_s),
        slow_depth: slow_depth(args),
        slow_hold_s: slow_hold,
        slow_sizes: match args.slow_sizes {
            SlowSizes::Small => "small",
            SlowSizes::Mix => "mix",
        },
        low_window_mib: low_window_mib(args),
        low_window_first: !args.forcedac,
        seconds,
        window_s: window.as_secs_f64(),
        policies: out,
        dma: costs,
        valid: why.is_empty(),
        why: (!why.is_empty()).then(|| why.join("; ")),
    };
    Ok(report(&rep, args))
}

/// The typed report: the cost table, the aging summary, the time line and
/// its plot.
fn report(rep: &FioAgingReport, args: &FioAgingArgs) -> Report {
    let mut cost = Table::new(
        "dma",
        format!(
            "{} jobs of {} {} at depth {}, {} back-end: cost per DMA policy",
            rep.jobs, args.dma_bs.text, rep.rw, rep.iodepth, rep.backend
        ),
        vec![
            Column::label("policy"),
            Column::metric("iops", "IOPS", Unit::Kiops, 1),
            Column::metric("gbps", "throughput", Unit::GbPerS, 3),
            Column::metric("driver_cpu_us_per_req", "driver CPU", Unit::UsPerReq, 2),
            Column::metric(
                "flush_timer_cpu_us_per_req",
                "of it flush timer",
                Unit::UsPerReq,
                2,
            ),
            Column::metric("device_cpu_us_per_req", "device CPU", Unit::UsPerReq, 2),
            Column::metric(
                "cpu_ratio_to_passthrough",
                "vs pass-through",
                Unit::Ratio,
                2,
            ),
            Column::metric("io_errors", "I/O errors", Unit::Count, 0),
        ],
    );
    for c in &rep.dma {
        cost.row(vec![
            c.policy.clone().into(),
            (c.iops / 1e3).into(),
            c.gbps.into(),
            c.driver_cpu_us_per_req.into(),
            c.flush_timer_cpu_us_per_req.into(),
            c.device_cpu_us_per_req.into(),
            c.cpu_ratio_to_passthrough.unwrap_or(f64::NAN).into(),
            c.io_errors.into(),
        ]);
    }
    let mut t = Table::new(
        "summary",
        format!(
            "aging, deferred: {} jobs, {} interrupt CPUs, bs {}, slow tail {} held {:.1} s, {:.0} s per policy; retained and stability per driver CPU-second, wall beside",
            rep.jobs,
            rep.irq_cpus,
            rep.bs,
            match (rep.slow_pct, rep.slow_per_s) {
                (Some(p), _) => format!("{p}%"),
                (None, Some(r)) => format!("{r:.0}/s per job"),
                (None, None) => "none".to_string(),
            },
            rep.slow_hold_s,
            rep.seconds
        ),
        [Column::label("policy")]
            .into_iter()
            .chain(aging_columns(Unit::Kiops, 1))
        .chain([
            Column::metric("driver_cpu_us_per_req", "driver CPU", Unit::UsPerReq, 2),
            Column::metric(
                "flush_timer_cpu_us_per_req",
                "of it flush timer",
                Unit::UsPerReq,
                2,
            ),
            Column::metric("work_cpu_us_per_req", "sampled work", Unit::UsPerReq, 2),
            Column::metric("peak_tree_nodes", "peak tree nodes", Unit::Count, 0),
            Column::metric("cached_iovas", "cached", Unit::Count, 0),
            Column::metric("scan_steps", "scan steps", Unit::Count, 0),
            Column::metric("io_errors", "I/O errors", Unit::Count, 0),
        ])
        .collect(),
    );
    let mut tl = Table::new(
        "timeline",
        "the time line, window by window (fio's status line)",
        vec![
            Column::label("policy"),
            Column::metric("t_s", "t", Unit::S, 2),
            Column::metric("iops", "IOPS (wall)", Unit::Kiops, 1),
            Column::metric("driver_cpu_s", "driver CPU", Unit::S, 3),
            Column::metric(
                "work_cpu_us_per_req",
                "per req (sampled)",
                Unit::UsPerReq,
                2,
            ),
            Column::metric("iops_per_cpu_s", "per CPU-s", Unit::Kiops, 1),
            Column::metric("gbps", "throughput", Unit::GbPerS, 3),
            Column::metric("errors", "errors", Unit::Count, 0),
        ],
    );
    let mut lines = Vec::new();
    let mut cpu_lines = Vec::new();
    for r in &rep.policies {
        t.row(
            [r.policy.clone().into()]
                .into_iter()
                .chain(r.aging.cells(1e3))
                .chain([
                    r.driver_cpu_us_per_req.into(),
                    r.flush_timer_cpu_us_per_req.into(),
                    r.work_cpu_us_per_req.into(),
                    r.peak_tree_nodes.into(),
                    r.cached_iovas.into(),
                    r.scan_steps.into(),
                    r.io_errors.into(),
                ])
                .collect(),
        );
        for w in &r.windows {
            tl.row(vec![
                r.policy.clone().into(),
                w.t_s.into(),
                (w.iops / 1e3).into(),
                w.driver_cpu_s.into(),
                w.work_cpu_us_per_req.into(),
                (w.iops_per_cpu_s / 1e3).into(),
                w.gbps.into(),
                w.errors.into(),
            ]);
        }
        lines.push(Series::new(
            r.policy.clone(),
            r.windows.iter().map(|w| (w.t_s, w.iops / 1e3)).collect(),
        ));
        cpu_lines.push(Series::new(
            r.policy.clone(),
            r.windows
                .iter()
                .map(|w| (w.t_s, w.iops_per_cpu_s / 1e3))
                .collect(),
        ));
    }
    let mut out = Report::new(
        "lab fio-aging",
        "seed 004's twelve fio jobs on virtio-blk through the IOMMU: cost per DMA policy, aging per IOVA policy",
        contract(rep),
    )
    .seed("004");
    out.params = vec![
        Param::new("jobs", rep.jobs, Unit::Threads),
        Param::new("iodepth", rep.iodepth, Unit::Count),
        Param::new("irq_cpus", rep.irq_cpus, Unit::Threads),
        Param::new("seconds", rep.seconds, Unit::S),
        Param::new("window_s", rep.window_s, Unit::S),
        match (rep.slow_pct, rep.slow_per_s) {
            (Some(p), _) => Param::new("slow_pct", p, Unit::Percent),
            (None, Some(r)) => Param::new("slow_per_s", format!("{r:.0}"), Unit::Count),
            (None, None) => Param::text("slow_tail", "none"),
        },
        Param::new("slow_depth", rep.slow_depth, Unit::Count),
        Param::new("slow_hold_s", rep.slow_hold_s, Unit::S),
        Param::new("low_window_mib", rep.low_window_mib, Unit::Count),
    ];
    out.notes.push(
        "Aging is accelerated by sizing, not by a model: completions on fewer interrupt CPUs \
         than jobs; a slow tail whose requests pin their IOVAs for the whole run while the \
         rest cycle; and a low window (the range Linux gives a PCI device first, 4 GiB there) \
         shrunk so that what is pinned and cached fills it in seconds, not the hours a \
         many-CPU box takes. Warm-up (until throughput stops rising, at least 1 s) is \
         discarded; retained = median of the last quarter of windows ÷ median of the first \
         quarter."
            .into(),
    );
    out.notes.push(
        "retained and stability are taken on requests per CPU-second of the driver side: each \
         window's requests × the job threads' CPU per request, measured on every submitting or \
         reaping call (thread CPU clock; polls, waits and doorbells between the calls \
         left out, as their number per request follows the device's pace), plus the flush \
         timer's CPU clock and the allocator's background work; the device threads stand for \
         hardware and are not counted. So a co-runner taking a core is not aging; a window with under a quarter of the run's median CPU \
         time is merged with its neighbours. The wall-clock figures stand beside them \
         (retained_wall, stability_wall)."
            .into(),
    );
    out.notes.push(format!(
        "low window {} MiB, {}",
        rep.low_window_mib,
        if rep.low_window_first {
            "IOVAs there first (Linux's default for PCI devices)"
        } else {
            "not preferred (--forcedac)"
        }
    ));
    if let Some(why) = &rep.why {
        out.notes.insert(0, format!("INVALID figures: {why}"));
    }
    if !rep.dma.is_empty() {
        out.tables.push(cost);
    }
    out.tables.push(t);
    tl.detail = true;
    out.tables.push(tl);
    out.plots.push(Plot {
        name: "iops".into(),
        title: "wall-clock IOPS over time per IOVA policy (a cliff is the seed's bug)".into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("IOPS", Unit::Kiops),
        categories: Vec::new(),
        series: lines,
        modelled: false,
    });
    out.plots.push(Plot {
        name: "iops_per_cpu_s".into(),
        title:
            "requests per driver CPU-second over time per IOVA policy (the aging figure's input)"
                .into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("k requests per CPU-second", Unit::Kiops),
        categories: Vec::new(),
        series: cpu_lines,
        modelled: false,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_with_failed_or_wrong_io_is_invalid_and_says_why() {
        assert_eq!(failed_work(0, 0), None);
        let why = failed_work(976_096, 0).unwrap();
        assert!(why.starts_with("976096 I/O error(s): "), "{why}");
        let why = failed_work(1, 2).unwrap();
        assert!(why.ends_with("; 2 read(s) returned wrong data"), "{why}");
        let a = AgingSummary::absent();
        assert!(a.retained.is_nan() && !a.settled);
        assert_eq!(
            serde_json::to_value(a).unwrap()["retained"],
            serde_json::Value::Null
        );
    }
}
