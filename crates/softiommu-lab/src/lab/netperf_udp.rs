//! `softiommu lab netperf-udp`: seed `000`'s UDP_STREAM on the real path —
//! smoltcp on host A sends `--msg-size`-byte datagrams through its
//! virtio-net driver (each frame mapped `ToDevice`, unmapped at
//! completion), A's device thread fetches them through A's IOMMU unit,
//! the wire carries them, B's device writes them through B's unit into
//! receive buffers mapped `FromDevice`, and B's smoltcp delivers them.
//! Nothing is hand-built: the engine is
//! `softiommu_virtio::workload::udp_stream`.
//!
//! Two passes. First every policy at full speed (the `full_speed` table:
//! each policy's maximum delivered rate). Then every policy paced to one
//! common rate, `--pace-percent` of the slowest policy's maximum, so all
//! deliver the same throughput with no drops, in batches polled
//! NAPI-style so that wake-ups do not dominate (the `results` table).
//! Service demand is netperf's: the CPU of every software thread the
//! traffic makes work — both driver+stack threads and both domains'
//! flush timer threads, thread CPU clocks — per datagram delivered; the
//! device threads stand for hardware and are reported apart. Per row: its
//! spread over the rounds, the ratio to pass-through, and the physics
//! checks (deferred must not cost less than pass-through, nor strict
//! less than deferred, beyond the spread; a row that does is marked
//! invalid with why). Rows run once per round, rounds interleaved, and
//! each row is its median round. Threads are pinned by `--placement`
//! (split by default: drivers and devices on CPUs of their own). The time
//! the hardware takes to complete an invalidation and a walk level's
//! memory latency are modelled (`--latency`); everything else is
//! measured.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu_virtio::affinity::allowed_cpus;
use softiommu_virtio::workload::{pace_period, udp_stream, UdpStreamConfig, UdpStreamResult};

use crate::args::{
    dma_policies, DmaPolicyName, Latency, OrderModeName, Placement, Ranged, Seconds,
};
use crate::dma_rig::{modelled, modelled_figures};
use crate::error::{LabError, LabResult};
use crate::lab::policy_physics::{self, PolicyCost, Spread};
use crate::report::{
    contract, Axis, Cell, Column, Param, Plot, PlotKind, Report, Series, Table, Unit,
};

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
    /// default 1.2 with --quick, else 6). Each round adds an unmeasured
    /// warm-up of 40 % of its share (0.1..=0.5 s).
    #[arg(long)]
    pub seconds: Option<Seconds>,
    /// Rounds: every row runs once per round, rounds interleaved, and each
    /// row's median round (by service demand) is reported with the spread
    /// of all (1..=100; default 5, so one round a co-runner disturbed
    /// moves neither the median nor the verdict). Both passes (full
    /// speed, paced) run this many rounds.
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
    /// Datagrams lost. Paced rows: every datagram of the run sent and
    /// never delivered (the receiver drains what is in flight at the
    /// end). Full-speed rows: sent less received in the window (a few
    /// may be in flight at its edges).
    pub drops: u64,
    /// Driver+stack CPU µs per datagram: the sender's per datagram sent
    /// plus the receiver's per datagram received (without the flush
    /// timers; `service_demand_us_per_pkt` is the whole figure).
    pub driver_cpu_us_per_pkt: f64,
    /// Device threads' CPU µs per datagram (the hardware's, apart).
    pub device_cpu_us_per_pkt: f64,
    /// `service_demand_us_per_pkt` over pass-through's with the same
    /// ordering, median rounds (`null` when pass-through was not run).
    pub service_demand_vs_passthrough: Option<f64>,
    /// Its spread: the lowest round over pass-through's highest, the
    /// medians, the highest over pass-through's lowest.
    pub vs_passthrough_spread: Option<Spread>,
    /// Service demand as netperf defines it: the CPU of every software
    /// thread the traffic makes work (both driver+stack threads, both
    /// flush timer threads) per datagram delivered, µs; the median round.
    pub service_demand_us_per_pkt: f64,
    /// Its spread over the rounds.
    pub service_demand_spread: Spread,
    /// The flush timer threads' part of `service_demand_us_per_pkt`.
    pub flush_cpu_us_per_pkt: f64,
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
    /// any round's window (the worse host), milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_window_ms_max: Option<f64>,
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

fn row(r: &UdpStreamResult) -> NetperfRow {
    let deferred = r.policy == DmaPolicy::Deferred;
    NetperfRow {
        policy: r.policy.name().to_string(),
        ordering: r.ordering.name().to_string(),
        msg_size: r.msg_size,
        tx_pps: r.tx_pps,
        rx_pps: r.rx_pps,
        rx_pps_max: r.rx_pps,
        drops: r.drops,
        driver_cpu_us_per_pkt: r.driver_cpu_us_per_pkt,
        device_cpu_us_per_pkt: r.device_cpu_us_per_pkt,
        service_demand_vs_passthrough: None,
        vs_passthrough_spread: None,
        service_demand_us_per_pkt: r.service_demand_us_per_pkt,
        service_demand_spread: Spread::of(&[r.service_demand_us_per_pkt]),
        flush_cpu_us_per_pkt: r.flush_cpu_us_per_pkt,
        offered_pps: r.offered_pps,
        valid: true,
        why: None,
        tx_driver_cpu_us_per_pkt: r.tx_driver_cpu_us_per_pkt,
        rx_driver_cpu_us_per_pkt: r.rx_driver_cpu_us_per_pkt,
        wire_drops: r.wire_drops,
        frames_per_packet: r.frames_per_packet,
        stale_window_ms_max: deferred.then_some(r.stale_window_ms_max),
        flushes: deferred.then_some(r.flushes),
    }
}

/// The orderings of the option; none named means `ordered`.
fn orderings(named: &[OrderModeName]) -> Vec<OrderMode> {
    if named.is_empty() {
        vec![OrderMode::Ordered]
    } else {
        named.iter().map(|o| o.0).collect()
    }
}

/// Runs the lab.
pub fn run(args: &NetperfArgs) -> LabResult<Report> {
    let latency = args.latency.model();
    let policies = dma_policies(&args.policies);
    let orderings = orderings(&args.ordering);
    let seconds = args
        .seconds
        .map_or(if args.quick { 1.2 } else { 6.0 }, Seconds::get);
    let rounds = args.rounds.map_or(5, Ranged::us);
    let per_round = seconds / rounds as f64;
    let cpus = args.placement.pair_cpus(&allowed_cpus());
    let cells: Vec<(DmaPolicy, OrderMode)> = orderings
        .iter()
        .flat_map(|&o| policies.iter().map(move |&p| (p, o)))
        .collect();
    let pass = |offered: Option<f64>| -> LabResult<Vec<NetperfRow>> {
        let mut runs: Vec<Vec<NetperfRow>> = vec![Vec::new(); cells.len()];
        for _ in 0..rounds {
            for (i, &(policy, ordering)) in cells.iter().enumerate() {
                let r = udp_stream(&UdpStreamConfig {
                    policy,
                    ordering,
                    msg_size: args.msg_size.us(),
                    duration: Duration::from_secs_f64(per_round),
                    warmup: Duration::from_secs_f64((per_round * 0.4).clamp(0.1, 0.5)),
                    latency,
                    mtu: args.mtu.get() as u16,
                    line_rate_bps: args.line_rate_mbit.get().saturating_mul(1_000_000),
                    cpus,
                    flush_high_water: args.flush_high_water.map(Ranged::us),
                    flush_timeout: args
                        .flush_timeout_ms
                        .map(|ms| Duration::from_millis(ms.get())),
                    offered_pps: offered,
                    ..UdpStreamConfig::default()
                })
                .map_err(|source| LabError::Workload {
                    run: format!("netperf-udp {policy} {ordering}"),
                    source,
                })?;
                runs[i].push(row(&r));
            }
        }
        let mut rows: Vec<NetperfRow> = runs.into_iter().map(median_round).collect();
        compare(&mut rows);
        Ok(rows)
    };
    let full_speed = pass(None)?;
    let pace_percent = args.pace_percent.map_or(40, |p| p.get());
    let offered = common_rate(&full_speed, pace_percent);
    let mut rows = pass(Some(offered))?;
    mark_unequal(&mut rows, offered);
    let r = NetperfReport {
        lab: "netperf-udp",
        stack: "smoltcp",
        msg_size: args.msg_size.us(),
        seconds,
        rounds,
        placement: args.placement,
        modelled: modelled(latency),
        offered_pps: offered,
        pace_percent,
        pace_period_ms: pace_period(offered).as_secs_f64() * 1e3,
        rows,
        full_speed,
    };
    Ok(report(&r, args, &args.placement.describe(&cpus)))
}

/// The paced pass's rate: `percent` of the slowest policy's maximum
/// delivered rate at full speed, its best round (at least 1 datagram per
/// second).
pub fn common_rate(full_speed: &[NetperfRow], percent: u64) -> f64 {
    let slowest = full_speed
        .iter()
        .map(|r| r.rx_pps_max)
        .fold(f64::INFINITY, f64::min);
    if slowest.is_finite() {
        (slowest * percent as f64 / 100.0).max(1.0).round()
    } else {
        1.0
    }
}

/// Fills each row's ratio to pass-through (same ordering) and marks the
/// rows whose service demand contradicts what the policy must cost.
pub fn compare(rows: &mut [NetperfRow]) {
    let base: Vec<(String, f64, Spread)> = rows
        .iter()
        .filter(|r| r.policy == "passthrough")
        .map(|r| {
            (
                r.ordering.clone(),
                r.service_demand_us_per_pkt,
                r.service_demand_spread,
            )
        })
        .collect();
    for r in rows.iter_mut() {
        let b = base.iter().find(|(o, _, _)| *o == r.ordering);
        r.service_demand_vs_passthrough = b
            .filter(|(_, b, _)| *b > 0.0)
            .map(|(_, b, _)| r.service_demand_us_per_pkt / b);
        r.vs_passthrough_spread = b.and_then(|(_, _, s)| r.service_demand_spread.ratio(s));
    }
    let costs: Vec<PolicyCost<'_>> = rows
        .iter()
        .map(|r| PolicyCost {
            policy: &r.policy,
            group: &r.ordering,
            cost: r.service_demand_spread,
        })
        .collect();
    let why = policy_physics::check(&costs, "service demand");
    for (r, w) in rows.iter_mut().zip(why) {
        if let Some(w) = w {
            r.valid = false;
            r.why = Some(w);
        }
    }
}

/// How far a paced row's delivered rate may fall below the offered one
/// and still count as equal load (a stalled thread loses the tokens past
/// its bucket).
pub const EQUAL_LOAD_TOLERANCE: f64 = 0.10;

/// Marks the paced rows that lost datagrams or delivered less than the
/// common rate: they are not compared at equal throughput.
fn mark_unequal(rows: &mut [NetperfRow], offered: f64) {
    for r in rows.iter_mut().filter(|r| r.valid) {
        if r.drops > 0 {
            r.valid = false;
            r.why = Some(format!(
                "measurement invalid: {} datagrams lost at the common rate, so this policy did not deliver the throughput the others did",
                r.drops
            ));
        } else if r.rx_pps < offered * (1.0 - EQUAL_LOAD_TOLERANCE) {
            r.valid = false;
            r.why = Some(format!(
                "measurement invalid: delivered {:.1} kpps of the {:.1} offered to every policy (the machine did not give this row's threads the CPU), so it is not at equal load",
                r.rx_pps / 1e3,
                offered / 1e3
            ));
        }
    }
}

/// A row's median round by service demand, with the spread of every
/// round; the stale window is the worst of every round, and the flushes
/// and drops their sums (a bound and counts, not typical values).
fn median_round(mut runs: Vec<NetperfRow>) -> NetperfRow {
    let stale = runs
        .iter()
        .filter_map(|r| r.stale_window_ms_max)
        .reduce(f64::max);
    let flushes = runs.iter().filter_map(|r| r.flushes).reduce(|a, b| a + b);
    let drops = runs.iter().map(|r| r.drops).sum();
    let rx_max = runs.iter().map(|r| r.rx_pps).fold(0.0, f64::max);
    let spread = Spread::of(
        &runs
            .iter()
            .map(|r| r.service_demand_us_per_pkt)
            .collect::<Vec<_>>(),
    );
    runs.sort_by(|a, b| {
        a.service_demand_us_per_pkt
            .total_cmp(&b.service_demand_us_per_pkt)
    });
    let mut row = runs.swap_remove((runs.len() - 1) / 2);
    row.stale_window_ms_max = stale;
    row.flushes = flushes;
    row.service_demand_spread = spread;
    row.rx_pps_max = rx_max;
    if row.offered_pps.is_some() {
        row.drops = drops;
    }
    row
}

/// The closing note: deferred over pass-through and strict over deferred
/// (ordered DMA, the paced pass), each with the spread of its rounds.
fn closing_note(rows: &[NetperfRow]) -> Option<String> {
    let find = |p: &str| {
        rows.iter()
            .find(|x| x.policy == p && x.ordering == "ordered")
            .map(|x| x.service_demand_spread)
    };
    let ratio = |a: &str, b: &str| -> Option<String> {
        let s = find(a)?.ratio(&find(b)?)?;
        Some(format!(
            "{a}/{b} {:.2}× (rounds {:.2}× to {:.2}×)",
            s.median, s.min, s.max
        ))
    };
    let parts: Vec<String> = [
        ratio("deferred", "passthrough"),
        ratio("strict", "deferred"),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "At the common rate, service demand (ordered DMA): {}.",
            parts.join(", ")
        )
    })
}

/// The typed report, seed-style: per policy and ordering, at the common
/// rate, datagrams each way, drops, service demand with its spread beside
/// pass-through's, the flush timer's share, the device's CPU apart, the
/// deferred policy's stale window, and whether the row stands; then the
/// full-speed table.
fn report(r: &NetperfReport, args: &NetperfArgs, pinning: &str) -> Report {
    let modelled = modelled_figures(&r.modelled);
    let m = !modelled.is_empty();
    let mut t = Table::new(
        "results",
        format!(
            "UDP_STREAM through smoltcp, virtio-net and two IOMMUs, {} byte datagrams, every policy offered {:.1} kpps ({} % of the slowest policy's maximum) in batches every {:.2} ms, {:.1} s per row in {} interleaved rounds (median round shown, [lowest–highest round] beside it); service demand = CPU of both hosts' driver+stack threads and both flush timers per datagram delivered",
            r.msg_size,
            r.offered_pps / 1e3,
            r.pace_percent,
            r.pace_period_ms,
            r.seconds,
            r.rounds
        ),
        vec![
            Column::label("policy"),
            Column::label("ordering"),
            Column::metric("tx_kpps", "sent", Unit::Kpps, 1).modelled_if(m),
            Column::metric("rx_kpps", "received", Unit::Kpps, 1).modelled_if(m),
            Column::metric("drops", "drops", Unit::Count, 0),
            Column::metric("service_demand_us_per_pkt", "service demand", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric("vs_passthrough", "vs passthrough", Unit::Ratio, 2).modelled_if(m),
            Column::metric("flush_us_per_pkt", "flush timer", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("tx_us_per_pkt", "sender", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("rx_us_per_pkt", "receiver", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("device_us_per_pkt", "device (apart)", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric("stale_window_ms_max", "stale max", Unit::Ms, 2).modelled_if(m),
            Column::metric("flushes", "flushes", Unit::Count, 0),
            Column::text("valid"),
        ],
    );
    let rounds = |s: Spread| (r.rounds > 1).then_some(s);
    // Pass-through over itself is 1 exactly: no spread in the table.
    let vs_cell = |x: &NetperfRow| {
        let spread = x
            .vs_passthrough_spread
            .filter(|_| x.policy != "passthrough")
            .and_then(rounds);
        x.service_demand_vs_passthrough
            .map_or(Cell::Missing, |v| Cell::figure(v, spread))
    };
    for x in &r.rows {
        t.row(vec![
            x.policy.clone().into(),
            x.ordering.clone().into(),
            (x.tx_pps / 1e3).into(),
            (x.rx_pps / 1e3).into(),
            x.drops.into(),
            Cell::figure(x.service_demand_us_per_pkt, rounds(x.service_demand_spread)),
            vs_cell(x),
            x.flush_cpu_us_per_pkt.into(),
            x.tx_driver_cpu_us_per_pkt.into(),
            x.rx_driver_cpu_us_per_pkt.into(),
            x.device_cpu_us_per_pkt.into(),
            x.stale_window_ms_max.into(),
            x.flushes.map(|f| f as f64).into(),
            if x.valid { "yes" } else { "NO" }.into(),
        ]);
    }
    let mut full = Table::new(
        "full_speed",
        format!(
            "the same at full speed, each policy's maximum ({} interleaved rounds, median shown): the slowest policy's best round sets the common rate above; a policy that floods its receiver pays for the overload, so its service demand here is not the IOMMU's cost",
            r.rounds
        ),
        vec![
            Column::label("policy"),
            Column::label("ordering"),
            Column::metric("tx_kpps", "sent", Unit::Kpps, 1).modelled_if(m),
            Column::metric("rx_kpps", "received", Unit::Kpps, 1).modelled_if(m),
            Column::metric("rx_kpps_max", "best round", Unit::Kpps, 1).modelled_if(m),
            Column::metric("drops", "drops", Unit::Count, 0),
            Column::metric("service_demand_us_per_pkt", "service demand", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric("vs_passthrough", "vs passthrough", Unit::Ratio, 2).modelled_if(m),
            Column::metric("flush_us_per_pkt", "flush timer", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("device_us_per_pkt", "device (apart)", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric("flushes", "flushes", Unit::Count, 0),
            Column::text("valid"),
        ],
    );
    for x in &r.full_speed {
        full.row(vec![
            x.policy.clone().into(),
            x.ordering.clone().into(),
            (x.tx_pps / 1e3).into(),
            (x.rx_pps / 1e3).into(),
            (x.rx_pps_max / 1e3).into(),
            x.drops.into(),
            Cell::figure(x.service_demand_us_per_pkt, rounds(x.service_demand_spread)),
            vs_cell(x),
            x.flush_cpu_us_per_pkt.into(),
            x.device_cpu_us_per_pkt.into(),
            x.flushes.map(|f| f as f64).into(),
            if x.valid { "yes" } else { "NO" }.into(),
        ]);
    }
    let mut rep = Report::new(
        "lab netperf-udp",
        "UDP stream through smoltcp, virtio-net and two IOMMUs per DMA policy: datagrams, drops and service demand (seed 000)",
        contract(r),
    )
    .seed("000");
    rep.params = vec![
        Param::text("stack", r.stack),
        Param::new("msg_size", r.msg_size, Unit::Bytes),
        Param::text(
            "ordering",
            orderings(&args.ordering)
                .iter()
                .map(|o| o.name())
                .collect::<Vec<_>>()
                .join(","),
        ),
        Param::new("seconds", format!("{:.2}", r.seconds), Unit::S),
        Param::new("rounds", r.rounds, Unit::Count),
        Param::new("offered", format!("{:.1}", r.offered_pps / 1e3), Unit::Kpps),
        Param::new("pace_period", format!("{:.2}", r.pace_period_ms), Unit::Ms),
        Param::text("placement", pinning),
        Param::new("mtu", args.mtu, Unit::Bytes),
        Param::text(
            "line_rate",
            if args.line_rate_mbit.get() == 0 {
                "unlimited".to_string()
            } else {
                format!("{} Mbit/s", args.line_rate_mbit)
            },
        ),
        Param::text("latency", args.latency.name()),
    ];
    if let Some(hw) = args.flush_high_water {
        rep.params
            .push(Param::new("flush_high_water", hw, Unit::Entries));
    }
    if let Some(ms) = args.flush_timeout_ms {
        rep.params
            .push(Param::new("flush_timeout_ms", ms, Unit::Ms));
    }
    rep.modelled = modelled;
    rep.notes.push(
        "Service demand as netperf defines it, from thread CPU clocks: the CPU of every software thread the traffic makes work (both hosts' driver+stack threads and both DMA domains' flush timer threads; the timers' share is the flush timer column) per datagram delivered. The device threads stand for NIC hardware and are reported apart. Every policy is compared at one offered rate below each one's maximum, with no drops: the sender offers a batch per period and the receiver polls its queues once per period, NAPI-style with interrupts off, so a wake-up is paid per batch, not per datagram. Drops = datagrams of the run sent and never delivered (the receiver drains what is in flight at the end)."
            .into(),
    );
    for x in r.rows.iter().filter(|x| !x.valid) {
        if let Some(why) = &x.why {
            t.mark_invalid(format!("{}/{}", x.policy, x.ordering), why.clone());
        }
    }
    for x in r.full_speed.iter().filter(|x| !x.valid) {
        if let Some(why) = &x.why {
            full.mark_invalid(
                format!("{}/{}", x.policy, x.ordering),
                format!("{why} (at full speed the policies deliver different rates and one that outruns its receiver pays for the overload; the paced table compares them)"),
            );
        }
    }
    if let Some(n) = closing_note(&r.rows) {
        rep.notes.push(n);
    }
    rep.tables.push(t);
    rep.tables.push(full);
    if r.rows.len() < 2 {
        return rep;
    }
    let mut categories: Vec<String> = Vec::new();
    for x in &r.rows {
        if !categories.contains(&x.policy) {
            categories.push(x.policy.clone());
        }
    }
    let mut series: Vec<Series> = Vec::new();
    for o in orderings(&args.ordering) {
        let points = r
            .rows
            .iter()
            .filter(|x| x.ordering == o.name())
            .filter_map(|x| {
                let i = categories.iter().position(|c| *c == x.policy)?;
                Some((i as f64, x.service_demand_spread))
            })
            .collect();
        series.push(Series::with_spreads(o.name(), points));
    }
    rep.plots.push(Plot {
        name: "service_demand".into(),
        title: format!(
            "service demand per policy at {:.1} kpps each, {} byte datagrams through smoltcp (driver+stack and flush timer CPU µs per datagram delivered, median round, whiskers from the lowest to the highest round; lower is better)",
            r.offered_pps / 1e3,
            r.msg_size
        ),
        kind: PlotKind::Bars,
        x: Axis::new("policy", Unit::Count),
        y: Axis::new("service demand", Unit::UsPerPkt),
        categories,
        series,
        modelled: m,
    });
    rep
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeds::summarise;

    /// A paced row of `policy` whose rounds' service demand was `rounds`.
    fn paced(policy: &str, rounds: &[f64]) -> NetperfRow {
        let spread = Spread::of(rounds);
        NetperfRow {
            policy: policy.into(),
            ordering: "ordered".into(),
            msg_size: 32,
            tx_pps: 90_000.0,
            rx_pps: 90_000.0,
            rx_pps_max: 90_000.0,
            drops: 0,
            driver_cpu_us_per_pkt: spread.median,
            device_cpu_us_per_pkt: 3.0,
            service_demand_vs_passthrough: None,
            vs_passthrough_spread: None,
            service_demand_us_per_pkt: spread.median,
            service_demand_spread: spread,
            flush_cpu_us_per_pkt: 0.0,
            offered_pps: Some(90_000.0),
            valid: true,
            why: None,
            tx_driver_cpu_us_per_pkt: spread.median / 2.0,
            rx_driver_cpu_us_per_pkt: spread.median / 2.0,
            wire_drops: 0,
            frames_per_packet: 1.0,
            stale_window_ms_max: None,
            flushes: None,
        }
    }

    /// The report of `rows` as `run` makes it, under seed 000's scenario.
    fn seed_report(mut rows: Vec<NetperfRow>) -> Report {
        compare(&mut rows);
        let r = NetperfReport {
            lab: "netperf-udp",
            stack: "smoltcp",
            msg_size: 32,
            seconds: 1.2,
            rounds: 3,
            placement: Placement::Split,
            modelled: Vec::new(),
            offered_pps: 90_000.0,
            pace_percent: 50,
            pace_period_ms: 2.13,
            full_speed: rows.clone(),
            rows,
        };
        let mut rep = report(&r, &NetperfArgs::default(), "split");
        rep.scenario = "udp-32".into();
        rep
    }

    #[test]
    fn deferred_below_passthrough_is_invalid_and_gets_no_verdict() {
        let rep = seed_report(vec![
            paced("passthrough", &[2.4, 2.5, 2.6]),
            paced("strict", &[7.0, 7.2, 7.4]),
            paced("deferred", &[2.0, 2.1, 2.2]),
        ]);
        let rows = rep.contract["rows"].as_array().unwrap();
        assert_eq!(rows[2]["valid"], false);
        assert!(
            rows[2]["why"]
                .as_str()
                .is_some_and(|w| w.starts_with("measurement invalid: deferred's service demand")),
            "{}",
            rows[2]
        );
        assert_eq!(
            (&rows[0]["valid"], &rows[1]["valid"]),
            (&true.into(), &true.into())
        );
        assert!(rows[0].get("why").is_none());
        let results = rep.table("results").unwrap();
        assert!(results
            .invalid_why("deferred/ordered")
            .is_some_and(|w| w.starts_with("measurement invalid: deferred's service demand")));
        let shown = crate::render::render_table(results);
        assert!(
            shown.contains("MEASUREMENT INVALID deferred/ordered: measurement invalid: deferred's"),
            "{shown}"
        );
        let seed = summarise(&[rep]).remove(0);
        assert_eq!(seed.seed, "000");
        assert!(
            seed.verdict
                .starts_with("no verdict: deferred: measurement invalid"),
            "{}",
            seed.verdict
        );
    }

    #[test]
    fn strict_below_deferred_is_invalid_and_gets_no_verdict() {
        let rep = seed_report(vec![
            paced("passthrough", &[2.0, 2.1, 2.2]),
            paced("strict", &[2.3, 2.4, 2.5]),
            paced("deferred", &[3.0, 3.1, 3.2]),
        ]);
        let rows = rep.contract["rows"].as_array().unwrap();
        assert_eq!(rows[1]["valid"], false);
        assert!(
            rows[1]["why"]
                .as_str()
                .is_some_and(|w| w.starts_with("measurement invalid: strict's service demand")),
            "{}",
            rows[1]
        );
        assert_eq!(rows[2]["valid"], true);
        let seed = summarise(&[rep]).remove(0);
        assert!(
            seed.verdict
                .starts_with("no verdict: strict: measurement invalid"),
            "{}",
            seed.verdict
        );
    }

    #[test]
    fn rows_that_obey_physics_stand_and_get_a_verdict_with_their_spread() {
        let rep = seed_report(vec![
            paced("passthrough", &[2.4, 2.5, 2.6]),
            paced("strict", &[7.0, 7.2, 7.4]),
            paced("deferred", &[2.7, 2.8, 2.9]),
        ]);
        let rows = rep.contract["rows"].as_array().unwrap();
        assert!(rows.iter().all(|r| r["valid"] == true), "{rows:?}");
        let vs = &rows[2]["vs_passthrough_spread"];
        assert!(
            (vs["min"].as_f64().unwrap() - 2.7 / 2.6).abs() < 1e-9,
            "{vs}"
        );
        assert!(
            (vs["max"].as_f64().unwrap() - 2.9 / 2.4).abs() < 1e-9,
            "{vs}"
        );
        let seed = summarise(&[rep]).remove(0);
        assert_eq!(
            seed.verdict,
            "deferred costs less over no-IOMMU than the seed's batching, beyond the spread"
        );
        assert!((seed.ours.unwrap() - 2.8 / 2.5).abs() < 1e-9);
    }

    #[test]
    fn a_paced_row_with_drops_is_not_at_the_common_rate() {
        // `run` marks it after `compare`; the rule is checked here on the
        // pieces it uses.
        let mut rows = vec![paced("passthrough", &[2.0]), paced("deferred", &[2.5])];
        rows[1].drops = 3;
        compare(&mut rows);
        mark_unequal(&mut rows, 90_000.0);
        assert_eq!(rows[0].why, None);
        assert!(
            matches!(&rows[1].why, Some(w) if w.starts_with("measurement invalid: 3 datagrams lost")),
            "{:?}",
            rows[1].why
        );
    }

    #[test]
    fn a_paced_row_below_the_offered_rate_is_not_at_equal_load() {
        let mut rows = vec![paced("passthrough", &[2.0]), paced("strict", &[7.0])];
        rows[1].rx_pps = 70_000.0;
        compare(&mut rows);
        mark_unequal(&mut rows, 90_000.0);
        assert_eq!(rows[0].why, None);
        assert!(
            matches!(&rows[1].why, Some(w) if w.starts_with("measurement invalid: delivered 70.0 kpps of the 90.0 offered")),
            "{:?}",
            rows[1].why
        );
    }

    #[test]
    fn the_common_rate_is_a_share_of_the_slowest_maximum() {
        let mut a = paced("passthrough", &[2.0]);
        a.rx_pps_max = 200_000.0;
        let mut b = paced("strict", &[7.0]);
        b.rx_pps_max = 100_000.0;
        assert_eq!(common_rate(&[a, b], 75), 75_000.0);
        assert_eq!(common_rate(&[], 75), 1.0);
    }
}
