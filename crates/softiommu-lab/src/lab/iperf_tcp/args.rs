//! The options of `lab iperf-tcp`.

use serde::{Deserialize, Serialize};

use crate::args::{DmaPolicyName, Latency, Placement, Ranged, Seconds, Walk};

/// Options of `lab iperf-tcp` (and of a `[lab-iperf-tcp]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IperfTcpArgs {
    /// Measured seconds per row, split over the rounds and their three
    /// runs each (0.01..=86400; default 8 with --quick, else 15). Each run
    /// adds an unmeasured warm-up (connection, slow start) of 40 % of its
    /// share (0.2..=0.5 s).
    #[arg(long)]
    pub seconds: Option<Seconds>,
    /// Rounds: every row runs three times per round, interleaved, the
    /// round keeping each row's median run by CPU per GB, and each row's
    /// median round (by Mbit/s) is reported; the non-coherent walk's
    /// ratio to the coherent one is paired round by round, with the
    /// median's interval over the rounds (1..=100; default 9, `--quick`
    /// too: the interval is then the 2nd to the 8th round, at 96 %).
    #[arg(long)]
    pub rounds: Option<Ranged<1, 100>>,
    /// Short runs, same shape.
    #[arg(long)]
    pub quick: bool,
    /// Page walks to run (coherent, non-coherent; default both).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub walks: Vec<Walk>,
    /// Policies to run (default: strict, deferred).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<DmaPolicyName>,
    /// The MTU, bytes (576..=9000; the seed: 1500).
    #[arg(long, default_value = "1500")]
    pub mtu: Ranged<576, 9000>,
    /// Bytes per application write (1..=1048576; iperf: 65536).
    #[arg(long, default_value = "65536")]
    pub write_size: Ranged<1, 1_048_576>,
    /// Where the threads run (as `lab netperf-udp`).
    #[arg(long, value_enum, default_value_t = Placement::Split)]
    pub placement: Placement,
    /// Latency model.
    #[arg(long, value_enum, default_value_t = Latency::Vtd2015)]
    pub latency: Latency,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for IperfTcpArgs {
    fn default() -> Self {
        Self {
            seconds: None,
            rounds: None,
            quick: false,
            walks: Vec::new(),
            policies: Vec::new(),
            mtu: Ranged::new(1500),
            write_size: Ranged::new(65536),
            placement: Placement::Split,
            latency: Latency::Vtd2015,
            json: false,
        }
    }
}
