use serde::{Deserialize, Serialize};
use softiommu::access::OrderMode;

use crate::args::{DmaPolicyName, Latency, OrderModeName, Placement, Ranged, Seconds};

/// Options of `lab netperf-udp` (and of a `[lab-netperf-udp]` scenario
/// table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetperfArgs {
    /// UDP payload bytes per datagram (1..=32000; the seed: 32 and 16384;
    /// past the MTU, IPv4 fragments it).
    #[arg(long, default_value = "32")]
    pub msg_size: Ranged<1, 32_000>,
    /// Device ordering modes to run, seed 001's question on the real path
    /// (ordered, relaxed, full; default ordered).
    #[arg(long, value_delimiter = ',')]
    pub ordering: Vec<OrderModeName>,
    /// Measured seconds per row, split over the rounds (0.01..=86400;
    /// default 1.5 with --quick, else 6). Each round adds an unmeasured
    /// warm-up of 40 % of its share (0.1..=0.5 s).
    #[arg(long)]
    pub seconds: Option<Seconds>,
    /// Rounds: every row runs once per round, rounds interleaved, and each
    /// row's median round (by service demand) is reported with the spread
    /// of all (1..=100; default 15: the rows a ratio pairs are measured
    /// close together, and the median's 96 % interval is the 4th to the
    /// 12th round, so three rounds a co-runner disturbed at either end
    /// move neither the median nor the verdict). Both passes (full speed,
    /// paced) run this many rounds.
    #[arg(long)]
    pub rounds: Option<Ranged<1, 100>>,
    /// The paced pass's common rate, percent of the slowest policy's
    /// maximum delivered rate in the full-speed pass (10..=95; default 40:
    /// headroom for a machine shared with other work).
    #[arg(long)]
    pub pace_percent: Option<Ranged<10, 95>>,
    /// Short runs, same shape.
    #[arg(long)]
    pub quick: bool,
    /// Where the threads run: `split` pins the driver threads and the
    /// device threads to CPUs of their own (on 2 CPUs: both drivers on
    /// one, both devices on the other), `shared` each host's driver and
    /// device to one CPU, `os` leaves it to the scheduler.
    #[arg(long, value_enum, default_value_t = Placement::Split)]
    pub placement: Placement,
    /// The MTU, bytes (576..=9000).
    #[arg(long, default_value = "1500")]
    pub mtu: Ranged<576, 9000>,
    /// The wire's line rate, Mbit/s (0..=1000000; 0: unlimited).
    #[arg(long, default_value = "0")]
    pub line_rate_mbit: Ranged<0, 1_000_000>,
    /// Deferred policy: flush-queue high-water mark on both hosts, entries
    /// (1..=65536; default the library's, 256).
    #[arg(long)]
    pub flush_high_water: Option<Ranged<1, 65536>>,
    /// Deferred policy: flush timeout on both hosts, milliseconds
    /// (1..=10000; default the library's, 10).
    #[arg(long)]
    pub flush_timeout_ms: Option<Ranged<1, 10_000>>,
    /// Latency model.
    #[arg(long, value_enum, default_value_t = Latency::Vtd2015)]
    pub latency: Latency,
    /// Policies to run (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<DmaPolicyName>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for NetperfArgs {
    fn default() -> Self {
        Self {
            msg_size: Ranged::new(32),
            ordering: Vec::new(),
            seconds: None,
            rounds: None,
            pace_percent: None,
            quick: false,
            placement: Placement::Split,
            mtu: Ranged::new(1500),
            line_rate_mbit: Ranged::new(0),
            flush_high_water: None,
            flush_timeout_ms: None,
            latency: Latency::Vtd2015,
            policies: Vec::new(),
            json: false,
        }
    }
}

/// The orderings of the option; none named means `ordered`.
pub(super) fn orderings(named: &[OrderModeName]) -> Vec<OrderMode> {
    if named.is_empty() {
        vec![OrderMode::Ordered]
    } else {
        named.iter().map(|o| o.0).collect()
    }
}
