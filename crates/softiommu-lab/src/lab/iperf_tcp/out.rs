//! The typed result of `lab iperf-tcp`, its JSON contract.

use serde::Serialize;

use crate::args::Placement;
use crate::lab::policy_physics::Spread;

/// One walk × policy: the contract's fields first.
#[derive(Debug, Clone, Serialize)]
pub struct IperfTcpRow {
    /// "coherent" or "non-coherent".
    pub walk: &'static str,
    /// Policy name.
    pub policy: String,
    /// Throughput, Mbit/s (10^6 bits).
    pub mbit_s: f64,
    /// Driver+stack CPU seconds (both hosts) per GB (10^9 bytes), the
    /// DMA domains' flush timers included, the drivers' waits for their
    /// devices not (`wait_cpu_s_per_gb`): what the work costs a driver
    /// saturated on CPU.
    pub cpu_s_per_gb: f64,
    /// Page-table lines flushed per GB (both hosts).
    pub lines_flushed_per_gb: f64,
    /// Share of the driver side's CPU spent flushing, 0..=1 (estimated:
    /// see [`FLUSH_SHARE_METHOD`]).
    pub flush_cpu_share: f64,
    /// Whether every byte arrived unchanged (the lab fails otherwise).
    pub checksum_ok: bool,
    /// Device threads' CPU seconds per GB (apart).
    pub device_cpu_s_per_gb: f64,
    /// The measured per-line flush cost behind `flush_cpu_share`, ns (0
    /// for a coherent walk: nothing flushed, nothing measured).
    pub flush_ns_per_line: f64,
    /// This row's throughput over the coherent row's of the same policy.
    pub vs_coherent: Option<f64>,
    /// Measured beside the estimate: the share of this row's driver CPU
    /// per GB above the coherent row's of the same policy (every effect
    /// of a non-coherent walk, flushes and fences and what they displace;
    /// the difference of two runs, so noisy: a negative share means the
    /// difference is within the noise).
    pub cpu_above_coherent_share: Option<f64>,
    /// The flush timers' share of `cpu_s_per_gb` (CPU seconds per GB).
    pub flush_timer_cpu_s_per_gb: f64,
    /// CPU seconds per GB the driver threads spent in their waits for
    /// the device (going idle and waking: interrupts re-armed, the park,
    /// the wake-up, the status acknowledged), apart and *not* in
    /// `cpu_s_per_gb`: a driver saturated on CPU never goes idle. It grows
    /// with how often the stream runs dry, which a co-runner changes.
    pub wait_cpu_s_per_gb: f64,
    /// The modelled IOMMU's work that ran on the drivers' and timers'
    /// threads (the units' invalidation-queue passes, run inline), CPU
    /// seconds per GB: apart like the device threads' and *not* in
    /// `cpu_s_per_gb` (the modelled wait latency those passes spun stays
    /// in it).
    pub unit_inline_cpu_s_per_gb: f64,
    /// `cpu_s_per_gb` over the rounds.
    pub cpu_s_per_gb_spread: Spread,
    /// `mbit_s` over the rounds.
    pub mbit_s_spread: Spread,
    /// The coherent row's CPU per GB ÷ this row's (same policy), the
    /// median over the rounds of each round's paired ratio (the two rows
    /// run one after the other in a round, so a change of the machine's
    /// speed between rounds falls on both and cancels): the throughput
    /// ratio a driver saturated on CPU reaches, the figure compared with
    /// seed 003's.
    pub saturated_vs_coherent: Option<f64>,
    /// Its spread over the rounds' paired ratios (lowest, median,
    /// highest).
    pub saturated_vs_coherent_spread: Option<Spread>,
    /// The median's distribution-free confidence interval over the
    /// rounds' paired ratios (`[low, high]`, at least 93.75 %; with the
    /// default nine rounds the 2nd to the 8th, with five or eight the
    /// lowest to the highest), the interval seed 003's verdict is judged
    /// on; null with fewer than five paired rounds (a round that moved
    /// nothing pairs with nothing).
    pub saturated_vs_coherent_interval: Option<[f64; 2]>,
    /// The same median of paired ratios with the drivers' waits counted
    /// in (`cpu_s_per_gb + wait_cpu_s_per_gb`, round by round): how the
    /// figure read before the waits were counted apart, shown for the
    /// reader and judged by nothing.
    pub saturated_vs_coherent_with_waits: Option<f64>,
    /// `cpu_s_per_gb` of each round, in the order the rounds ran (for
    /// the paired ratios; not in the contract).
    #[serde(skip)]
    pub cpu_s_per_gb_rounds: Vec<f64>,
    /// `wait_cpu_s_per_gb` of each round, in the same order.
    #[serde(skip)]
    pub wait_cpu_s_per_gb_rounds: Vec<f64>,
    /// Whether the row's figures stand (false: a non-coherent walk cost
    /// less than the coherent one in every round).
    pub valid: bool,
    /// Why not (null when valid).
    pub why: Option<String>,
}

/// The seed's figures, for the reader.
#[derive(Debug, Clone, Serialize)]
pub struct Seed003 {
    /// be2net, walk coherent (no flushing).
    pub coherent_mbit_s: f64,
    /// be2net, walk not coherent (every page-table update flushed).
    pub non_coherent_mbit_s: f64,
    /// Their ratio.
    pub ratio: f64,
    /// `clflush_cache_range`'s share of CPU in the profile, 0..=1.
    pub clflush_share: f64,
}

/// The JSON object of `lab iperf-tcp --json`.
#[derive(Debug, Clone, Serialize)]
pub struct IperfTcpReport {
    /// Always "iperf-tcp".
    pub lab: &'static str,
    /// Always "smoltcp".
    pub stack: &'static str,
    /// Measured seconds per row (all rounds).
    pub seconds: f64,
    /// Rounds.
    pub rounds: usize,
    /// Runs of every row in each round, interleaved; a round keeps each
    /// row's median run by CPU per GB.
    pub runs_per_round: usize,
    /// Where the threads ran.
    pub placement: Placement,
    /// How `flush_cpu_share` is obtained.
    pub flush_share_method: &'static str,
    /// What is modelled, nanoseconds.
    pub modelled: Vec<(String, u64)>,
    /// One row per walk and policy.
    pub rows: Vec<IperfTcpRow>,
    /// Seed 003's figures.
    pub seed: Seed003,
}
