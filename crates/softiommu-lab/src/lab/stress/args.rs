//! The options of `lab stress`.

use serde::{Deserialize, Serialize};

use crate::args::{DmaPolicyName, Ranged, Seconds};

/// Options of `lab stress` (and of a `[lab-stress]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StressArgs {
    /// Seconds per phase (one phase per policy, and the switching phase)
    /// (0.01..=86400).
    #[arg(long, default_value = "10")]
    pub seconds: Seconds,
    /// The short run: 5 seconds per phase (overrides --seconds).
    #[arg(long)]
    pub quick: bool,
    /// Slots (pages, each holding at most one mapping) per CPU thread
    /// (1..=256).
    #[arg(long, default_value = "64")]
    pub slots: Ranged<1, 256>,
    /// The deferred policy's flush timeout, milliseconds (1..=1000): the
    /// bound a permitted stale access's age is held to.
    #[arg(long, default_value = "10")]
    pub flush_timeout_ms: Ranged<1, 1000>,
    /// Policies to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<DmaPolicyName>,
    /// Whether to run the switching phase (0 or 1).
    #[arg(long, default_value = "1")]
    pub switching: Ranged<0, 1>,
    /// Whether to run the device phases (0 or 1): a virtio-blk device
    /// whose domain's policy is switched under it, every read checked, and
    /// a device faulting pages of an IOPF domain in while a CPU thread
    /// reclaims them, every read checked against the page's tag.
    #[arg(long, default_value = "1")]
    pub devices: Ranged<0, 1>,
    /// Seed of the workload's random choices (0..=4294967295).
    #[arg(long, default_value = "15")]
    pub seed: Ranged<0, 4_294_967_295>,
    /// Nice value of the lab's CPU and device threads (0..=19): they run
    /// below the library's flush timer, as a load runs below the kernel
    /// timer that fires Linux's flush queue. 0: every thread equal.
    #[arg(long, default_value = "10")]
    pub load_nice: Ranged<0, 19>,
    /// Whether to run the bound phase (0 or 1): just-unmapped IOVAs of a
    /// deferred domain probed at ages around the promised bound (flush
    /// timeout + 1 ms); any success at or past it is a violation.
    #[arg(long, default_value = "1")]
    pub bound: Ranged<0, 1>,
    /// Busy processes (`sh -c 'while :; do :; done'`, nice 0) run beside
    /// the bound phase (0..=8), killed when it ends.
    #[arg(long, default_value = "2")]
    pub hogs: Ranged<0, 8>,
    /// Test only: the CPU threads record one unmap in 16 as done before
    /// calling `unmap`, and call it 64 operations later, as a library
    /// whose unmap returned before revoking would. The checker must
    /// report violations.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub inject_late_unmap: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for StressArgs {
    fn default() -> Self {
        Self {
            seconds: Seconds::new(10.0),
            quick: false,
            slots: Ranged::new(64),
            flush_timeout_ms: Ranged::new(10),
            policies: Vec::new(),
            switching: Ranged::new(1),
            devices: Ranged::new(1),
            seed: Ranged::new(15),
            load_nice: Ranged::new(10),
            bound: Ranged::new(1),
            hogs: Ranged::new(2),
            inject_late_unmap: false,
            json: false,
        }
    }
}
