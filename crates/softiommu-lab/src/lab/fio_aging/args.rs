use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use softiommu::dma::DmaPolicy;
use softiommu::iova::IovaPolicy;
use softiommu_virtio::blk::{BackendConfig, BlkHostConfig};
use softiommu_virtio::workload::fio::{
    BlockSizes, RwMode, SlowTail, MAX_SLOTS, MAX_SLOW_DEPTH, MAX_SLOW_PER_S,
};

use crate::args::{dma_policies, DmaPolicyName, IovaPolicyName, Percent, Ranged, Seconds};
use crate::error::{LabError, LabResult};

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
    pub(super) fn parse(s: &str) -> Self {
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
    pub(super) fn mode(self) -> RwMode {
        match self {
            RwName::Randread => RwMode::RandRead,
            RwName::Randwrite => RwMode::RandWrite,
            RwName::Randrw => RwMode::RandRw { read_pct: 50 },
        }
    }
}

impl BackendName {
    pub(super) fn name(self) -> &'static str {
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
    /// Seconds of the aging run per IOVA policy (0.2..=86400: eight
    /// windows of at least 10 ms past the jobs' start-up; default 6 with
    /// --quick, else 60).
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
    /// Block size of the cost part, or a mix as `--bs` takes (the seed's
    /// log: 4 KiB).
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
    /// Linux gives a PCI device the 32-bit range (1..=4096; default 128,
    /// a thirty-second of Linux's 4 GiB, so that twelve jobs' slow tail
    /// and caches fill it in seconds rather than hours at the aging
    /// part's pace, `--rate-iops`).
    #[arg(long)]
    pub low_window_mib: Option<Ranged<1, 4096>>,
    /// Fast requests per second per job in the aging part (0..=1000000;
    /// 0: as fast as the device completes; default 400, about 5 k IOPS
    /// for twelve jobs, which this lab's 2-core machine keeps with two
    /// busy loops alongside): the aging figure compares the driver's CPU
    /// per request at one pace, as the CPU per request follows the pace.
    #[arg(long)]
    pub rate_iops: Option<Ranged<0, 1_000_000>>,
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
            rate_iops: None,
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

pub(super) fn backend(args: &FioAgingArgs) -> LabResult<BackendConfig> {
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

/// The low window in MiB: `--low-window-mib`, or [`DEFAULT_LOW_WINDOW_MIB`].
pub(super) fn low_window_mib(args: &FioAgingArgs) -> u64 {
    args.low_window_mib
        .map_or(DEFAULT_LOW_WINDOW_MIB, Ranged::get)
}

/// The slow tail's depth: `--slow-depth`, or as deep as the ring allows.
pub(super) fn slow_depth(args: &FioAgingArgs) -> usize {
    args.slow_depth.map_or(
        MAX_SLOW_DEPTH.min(MAX_SLOTS.saturating_sub(args.iodepth.us()).max(1)),
        Ranged::us,
    )
}

/// How many low windows of IOVA space the default slow tail pins by the
/// end of its hold: more than one, so that with the caches and the fast
/// I/Os it fills the window well before the run ends.
pub(super) const SLOW_FILL: f64 = 1.5;

/// The slow tail: `--slow-pct` percent of the requests, or by default a
/// rate per job that pins [`SLOW_FILL`] low windows by the end of the
/// hold, `SLOW_FILL × window ÷ (hold × mean slow size × jobs)` requests a
/// second each. A rate, not a percentage, so the window fills at the same
/// time into a run on a machine of any speed: measured, a fixed 4 % filled
/// it ~2 s into the quick run at 290 k IOPS and barely by its end at
/// 155 k (2016's `retained` 0.07 and 0.38).
pub(super) fn slow_tail(
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

pub(super) fn host(
    args: &FioAgingArgs,
    policy: DmaPolicy,
    iova: IovaPolicy,
) -> LabResult<BlkHostConfig> {
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

/// The DMA policies of the cost part.
pub(super) fn cost_policies(args: &FioAgingArgs) -> Vec<DmaPolicy> {
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

/// The low window when `--low-window-mib` is not given, MiB: at the
/// default pace ([`DEFAULT_RATE_IOPS`]) the slow tail may send at most a
/// third of that (the fio engine's rule), so it fills 128 MiB in seconds
/// where 1 GiB would take the whole run.
pub(super) const DEFAULT_LOW_WINDOW_MIB: u64 = 128;

/// The aging part's pace when `--rate-iops` is not given: fast requests
/// per second per job.
pub(super) const DEFAULT_RATE_IOPS: u64 = 400;

/// The aging part's pace: `--rate-iops`, or [`DEFAULT_RATE_IOPS`]; `None`
/// (unpaced) for 0.
pub(super) fn rate_iops(args: &FioAgingArgs) -> Option<f64> {
    let r = args.rate_iops.map_or(DEFAULT_RATE_IOPS, Ranged::get);
    (r > 0).then_some(r as f64)
}
