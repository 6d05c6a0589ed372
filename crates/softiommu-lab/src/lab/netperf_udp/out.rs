use serde::Serialize;
use softiommu::dma::DmaPolicy;
use softiommu_virtio::workload::UdpStreamResult;

use crate::args::Placement;
use crate::lab::policy_physics::Spread;

/// One policy × ordering: the fields every netperf row has carried first.
#[derive(Debug, Clone, Serialize)]
pub struct NetperfRow {
    /// Policy name.
    pub policy: String,
    /// Ordering mode of the devices' DMA.
    pub ordering: String,
    /// Payload bytes per datagram.
    pub msg_size: usize,
    /// Datagrams sent per second.
    pub tx_pps: f64,
    /// Datagrams received per second.
    pub rx_pps: f64,
    /// The best round's received rate: at full speed, the policy's
    /// maximum (a round a co-runner held back does not set it).
    pub rx_pps_max: f64,
    /// The received rate averaged over the rounds: what a paced row's
    /// equal load is judged on. A round's window is short (0.1 s with
    /// `--quick`), so a receiver a co-runner held off its CPU at one of
    /// its edges reads ~10 % high or low in that round, while a policy
    /// that cannot keep the rate reads low in every round.
    pub rx_pps_mean: f64,
    /// Datagrams lost. Paced rows: every datagram of the run sent and
    /// never delivered (the receiver drains what is in flight at the
    /// end). Full-speed rows: sent less received in the window (a few
    /// may be in flight at its edges).
    pub drops: u64,
    /// Driver+stack CPU µs per datagram: the sender's per datagram sent
    /// plus the receiver's per datagram received (without the flush
    /// timers; `service_demand_us_per_pkt` is the whole figure; without
    /// the units' inline passes, `unit_inline_cpu_us_per_pkt`; paced,
    /// without the idling they busy-poll between batches).
    pub driver_cpu_us_per_pkt: f64,
    /// Device threads' CPU µs per datagram (the hardware's, apart).
    pub device_cpu_us_per_pkt: f64,
    /// Service demand over pass-through's with the same ordering: the
    /// median of the rounds' paired ratios (each round's figure over
    /// pass-through's in the same round; the policies of a round run one
    /// after the other, so a change of the machine's speed between rounds
    /// falls on both). `null` when pass-through was not run.
    pub service_demand_vs_passthrough: Option<f64>,
    /// Its spread: the lowest, median and highest of the rounds' paired
    /// ratios.
    pub vs_passthrough_spread: Option<Spread>,
    /// The confidence interval for that median the seed summary judges
    /// by, `[low, high]`: distribution-free, at no less than 93.75 %
    /// (`seeds::verdict::median_interval`: with five rounds the lowest
    /// and highest, with nine the second lowest and second highest, with
    /// the default fifteen the 4th to the 12th). `null` with fewer than
    /// five paired rounds.
    pub vs_passthrough_interval: Option<[f64; 2]>,
    /// Service demand as netperf defines it: the CPU of every software
    /// thread the traffic makes work (both driver+stack threads, both
    /// flush timer threads) per datagram delivered, µs; the median round.
    pub service_demand_us_per_pkt: f64,
    /// Its spread over the rounds.
    pub service_demand_spread: Spread,
    /// Service demand in each round, in the order the rounds ran (the
    /// pairs behind `vs_passthrough_spread`).
    pub service_demand_rounds: Vec<f64>,
    /// The flush timer threads' part of `service_demand_us_per_pkt`.
    pub flush_cpu_us_per_pkt: f64,
    /// The modelled IOMMU's work that ran on the drivers' and timers'
    /// threads (the units' invalidation-queue passes, run inline: carrying
    /// out descriptors, draining the translations in flight), µs per
    /// datagram delivered; *not* in `service_demand_us_per_pkt`, as the
    /// device threads' CPU is not. The modelled wait latency those passes
    /// spun stays in service demand (a driver spins for it).
    pub unit_inline_cpu_us_per_pkt: f64,
    /// The rate every policy was offered, datagrams per second (the same
    /// in every paced row; `null` at full speed).
    pub offered_pps: Option<f64>,
    /// Whether the row's figures are physically possible and taken at the
    /// common rate without drops.
    pub valid: bool,
    /// Why not, when `valid` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The sender's part of `driver_cpu_us_per_pkt`.
    pub tx_driver_cpu_us_per_pkt: f64,
    /// The receiver's part.
    pub rx_driver_cpu_us_per_pkt: f64,
    /// Frames the wire dropped (B behind).
    pub wire_drops: u64,
    /// Ethernet frames per datagram (more than 1 when fragmented).
    pub frames_per_packet: f64,
    /// Deferred only: the longest an unmapped buffer stayed reachable in
    /// any round's window (the worse host), milliseconds: from its unmap to
    /// the earlier of its flush's completion and its expiry deadline
    /// (three quarters of the flush timeout after the unmap; past it every
    /// translator drops the domain's cached translations itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_window_ms_max: Option<f64>,
    /// Deferred only: the longest from an unmap to its flush's completion
    /// in any round's window (the worse host), milliseconds, whatever the
    /// deadline did (the end of the window for a translation a device
    /// thread held inside an open section).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_completion_ms_max: Option<f64>,
    /// Both flush timer threads' wake-ups per second (the row's round).
    pub timer_wakeups_per_s: f64,
    /// Deferred only: flushes in every round's window, both hosts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flushes: Option<u64>,
}

/// The JSON object of `lab netperf-udp --json`.
#[derive(Debug, Clone, Serialize)]
pub struct NetperfReport {
    /// Always "netperf-udp".
    pub lab: &'static str,
    /// Always "smoltcp": the stack the datagrams went through.
    pub stack: &'static str,
    /// Payload bytes.
    pub msg_size: usize,
    /// Measured seconds per row (all rounds).
    pub seconds: f64,
    /// Rounds (median shown).
    pub rounds: usize,
    /// Where the threads ran.
    pub placement: Placement,
    /// What is modelled, nanoseconds.
    pub modelled: Vec<(String, u64)>,
    /// The rate every policy was offered in the paced pass, datagrams per
    /// second.
    pub offered_pps: f64,
    /// It, as a percentage of the slowest policy's maximum.
    pub pace_percent: u64,
    /// The paced pass's batch period, milliseconds (one batch sent, one
    /// poll of the receiver's queues per period).
    pub pace_period_ms: f64,
    /// One row per policy and ordering, all paced to `offered_pps`.
    pub rows: Vec<NetperfRow>,
    /// The full-speed pass: each policy's maximum rate.
    pub full_speed: Vec<NetperfRow>,
}

pub(super) fn row(r: &UdpStreamResult) -> NetperfRow {
    let deferred = r.policy == DmaPolicy::Deferred;
    NetperfRow {
        policy: r.policy.name().to_string(),
        ordering: r.ordering.name().to_string(),
        msg_size: r.msg_size,
        tx_pps: r.tx_pps,
        rx_pps: r.rx_pps,
        rx_pps_max: r.rx_pps,
        rx_pps_mean: r.rx_pps,
        drops: r.drops,
        driver_cpu_us_per_pkt: r.driver_cpu_us_per_pkt,
        device_cpu_us_per_pkt: r.device_cpu_us_per_pkt,
        service_demand_vs_passthrough: None,
        vs_passthrough_spread: None,
        vs_passthrough_interval: None,
        service_demand_us_per_pkt: r.service_demand_us_per_pkt,
        service_demand_spread: Spread::of(&[r.service_demand_us_per_pkt]),
        service_demand_rounds: vec![r.service_demand_us_per_pkt],
        flush_cpu_us_per_pkt: r.flush_cpu_us_per_pkt,
        unit_inline_cpu_us_per_pkt: r.unit_inline_cpu_us_per_pkt,
        offered_pps: r.offered_pps,
        valid: true,
        why: None,
        tx_driver_cpu_us_per_pkt: r.tx_driver_cpu_us_per_pkt,
        rx_driver_cpu_us_per_pkt: r.rx_driver_cpu_us_per_pkt,
        wire_drops: r.wire_drops,
        frames_per_packet: r.frames_per_packet,
        stale_window_ms_max: deferred.then_some(r.stale_window_ms_max),
        stale_completion_ms_max: deferred.then_some(r.stale_completion_ms_max),
        timer_wakeups_per_s: r.timer_wakeups_per_s,
        flushes: deferred.then_some(r.flushes),
    }
}
