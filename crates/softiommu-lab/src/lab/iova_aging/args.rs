//! The options of `lab iova-aging`.

use serde::{Deserialize, Serialize};

use crate::args::{IovaPolicyName, Percent, Ranged, Seconds};

/// Options of `lab iova-aging` (and of a `[lab-iova-aging]` scenario
/// table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgingArgs {
    /// A short run (under a minute for all policies) with the same shape.
    #[arg(long)]
    pub quick: bool,
    /// Seconds per policy (0.01..=86400; default 8 with --quick, else 60).
    #[arg(long)]
    pub seconds: Option<Seconds>,
    /// Windows in the time line (8..=1000; default 32 with --quick, else
    /// 60). The aging figure discards a warm-up of 1 s (a quarter of the
    /// run if that is shorter) and needs four windows after it.
    #[arg(long)]
    pub windows: Option<Ranged<8, 1000>>,
    /// Jobs (threads), as fio's `numjobs` (1..=256).
    #[arg(long, default_value = "12")]
    pub jobs: Ranged<1, 256>,
    /// Interrupt CPUs: logical CPUs that free what the jobs complete (at
    /// least one per OS thread; 1..=256).
    #[arg(long, default_value = "4")]
    pub irq_cpus: Ranged<1, 256>,
    /// OS threads hosting the logical CPUs (1..=256; default 1: the
    /// figure is the allocator's aging, and on two cores the threads'
    /// throughput moves in phases of seconds with how much the shared
    /// lines bounce between them).
    #[arg(long)]
    pub threads: Option<Ranged<1, 256>>,
    /// I/Os in flight per job (1..=4096).
    #[arg(long, default_value = "32")]
    pub iodepth: Ranged<1, 4096>,
    /// Percent of I/Os that are slow, held `--slow-hold` I/Os of their job
    /// instead of `--iodepth`: a storage device's latency tail (0..=100).
    #[arg(long, default_value = "0.5")]
    pub slow_pct: Percent,
    /// How many of its job's I/Os a slow I/O stays in flight for
    /// (1..=1000000000). With the default 0.5 % this pins ~20,000 IOVAs
    /// per job, and the first slow I/Os complete ~1-2 s into a run: the
    /// Linux 2020 and 2023 trees' cliff comes after the warm-up floor,
    /// where the figure sees it.
    #[arg(long, default_value = "4000000")]
    pub slow_hold: Ranged<1, 1_000_000_000>,
    /// Allocate in the low N MiB of IOVA space first and above it only
    /// when it is full, as Linux's DMA layer does for a PCI device with
    /// N = 4096 (1..=4096; default: no low window, every allocation at
    /// the domain's limit, as the allocator is called by a driver that
    /// asks for its whole mask).
    #[arg(long)]
    pub low_window_mib: Option<Ranged<1, 4096>>,
    /// Policies to run (default: all, baselines first).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<IovaPolicyName>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for AgingArgs {
    fn default() -> Self {
        Self {
            quick: false,
            seconds: None,
            windows: None,
            jobs: Ranged::new(12),
            irq_cpus: Ranged::new(4),
            threads: None,
            iodepth: Ranged::new(32),
            slow_pct: Percent::new(0.5),
            slow_hold: Ranged::new(4_000_000),
            low_window_mib: None,
            policies: Vec::new(),
            json: false,
        }
    }
}
