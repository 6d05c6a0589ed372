//! `softiommu lab netperf-udp`: seed `000`'s UDP_STREAM on the real path —
//! smoltcp on host A sends `--msg-size`-byte datagrams through its
//! virtio-net driver (each frame mapped `ToDevice`, unmapped at
//! completion), A's device thread fetches them through A's IOMMU unit,
//! the wire carries them, B's device writes them through B's unit into
//! receive buffers mapped `FromDevice`, and B's smoltcp delivers them.
//! Nothing is hand-built: the engine is
//! `softiommu_virtio::workload::udp_stream`.
//!
//! Per policy and ordering mode: datagrams per second each way, drops,
//! the driver side's CPU per datagram (thread CPU clocks of the two
//! driver+stack threads: the seed's service demand), the device threads'
//! apart (they stand for hardware), the ratio to pass-through, and for
//! deferred the stale window and the flushes. Rows run once per round,
//! rounds interleaved, and each row is its median round. Threads are
//! pinned by `--placement` (split by default: drivers and devices on CPUs
//! of their own). The time the hardware takes to complete an
//! invalidation and a walk level's memory latency are modelled
//! (`--latency`); everything else is measured.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu_virtio::affinity::allowed_cpus;
use softiommu_virtio::workload::{udp_stream, UdpStreamConfig, UdpStreamResult};

use crate::args::{
    dma_policies, DmaPolicyName, Latency, OrderModeName, Placement, Ranged, Seconds,
};
use crate::dma_rig::{modelled, modelled_figures};
use crate::error::{LabError, LabResult};
use crate::report::{contract, Axis, Column, Param, Plot, PlotKind, Report, Series, Table, Unit};

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
    /// row's median round (by driver CPU per datagram) is reported
    /// (1..=100; default 2 with --quick, else 3).
    #[arg(long)]
    pub rounds: Option<Ranged<1, 100>>,
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

/// One policy × ordering: issue 11's fields first.
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
    /// Datagrams lost in the window (sent less received; a few may be in
    /// flight at its edges).
    pub drops: u64,
    /// Driver+stack CPU µs per datagram: the sender's per datagram sent
    /// plus the receiver's per datagram received (the seed's service
    /// demand).
    pub driver_cpu_us_per_pkt: f64,
    /// Device threads' CPU µs per datagram (the hardware's, apart).
    pub device_cpu_us_per_pkt: f64,
    /// `driver_cpu_us_per_pkt` over pass-through's with the same ordering
    /// (`null` when pass-through was not run).
    pub service_demand_vs_passthrough: Option<f64>,
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
    /// One row per policy and ordering.
    pub rows: Vec<NetperfRow>,
}

fn row(r: &UdpStreamResult) -> NetperfRow {
    let deferred = r.policy == DmaPolicy::Deferred;
    NetperfRow {
        policy: r.policy.name().to_string(),
        ordering: r.ordering.name().to_string(),
        msg_size: r.msg_size,
        tx_pps: r.tx_pps,
        rx_pps: r.rx_pps,
        drops: r.drops,
        driver_cpu_us_per_pkt: r.driver_cpu_us_per_pkt,
        device_cpu_us_per_pkt: r.device_cpu_us_per_pkt,
        service_demand_vs_passthrough: None,
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
    let rounds = args
        .rounds
        .map_or(if args.quick { 2 } else { 3 }, Ranged::us);
    let per_round = seconds / rounds as f64;
    let cpus = args.placement.pair_cpus(&allowed_cpus());
    let cells: Vec<(DmaPolicy, OrderMode)> = orderings
        .iter()
        .flat_map(|&o| policies.iter().map(move |&p| (p, o)))
        .collect();
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
    let base: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.policy == "passthrough")
        .map(|r| (r.ordering.clone(), r.driver_cpu_us_per_pkt))
        .collect();
    for r in &mut rows {
        r.service_demand_vs_passthrough = base
            .iter()
            .find(|(o, _)| *o == r.ordering)
            .filter(|(_, b)| *b > 0.0)
            .map(|(_, b)| r.driver_cpu_us_per_pkt / b);
    }
    let r = NetperfReport {
        lab: "netperf-udp",
        stack: "smoltcp",
        msg_size: args.msg_size.us(),
        seconds,
        rounds,
        placement: args.placement,
        modelled: modelled(latency),
        rows,
    };
    Ok(report(&r, args, &args.placement.describe(&cpus)))
}

/// A row's median round by driver CPU per datagram; the stale window is
/// the worst of every round and the flushes their sum (a bound and a
/// count, not typical values).
fn median_round(mut runs: Vec<NetperfRow>) -> NetperfRow {
    let stale = runs
        .iter()
        .filter_map(|r| r.stale_window_ms_max)
        .reduce(f64::max);
    let flushes = runs.iter().filter_map(|r| r.flushes).reduce(|a, b| a + b);
    runs.sort_by(|a, b| a.driver_cpu_us_per_pkt.total_cmp(&b.driver_cpu_us_per_pkt));
    let mut row = runs.swap_remove(runs.len() / 2);
    row.stale_window_ms_max = stale;
    row.flushes = flushes;
    row
}

/// The typed report, seed-style: per policy and ordering, datagrams each
/// way, drops, service demand beside pass-through's, the device's CPU
/// apart, the deferred policy's stale window.
fn report(r: &NetperfReport, args: &NetperfArgs, pinning: &str) -> Report {
    let modelled = modelled_figures(&r.modelled);
    let m = !modelled.is_empty();
    let mut t = Table::new(
        "results",
        format!(
            "UDP_STREAM through smoltcp, virtio-net and two IOMMUs, {} byte datagrams, {:.1} s per row in {} interleaved rounds (median round shown); service demand = both hosts' driver+stack threads' CPU per datagram",
            r.msg_size, r.seconds, r.rounds
        ),
        vec![
            Column::label("policy"),
            Column::label("ordering"),
            Column::metric("tx_kpps", "sent", Unit::Kpps, 1).modelled_if(m),
            Column::metric("rx_kpps", "received", Unit::Kpps, 1).modelled_if(m),
            Column::metric("drops", "drops", Unit::Count, 0),
            Column::metric("driver_us_per_pkt", "service demand", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric("vs_passthrough", "vs passthrough", Unit::Ratio, 2).modelled_if(m),
            Column::metric("tx_us_per_pkt", "sender", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("rx_us_per_pkt", "receiver", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("device_us_per_pkt", "device (apart)", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric("stale_window_ms_max", "stale max", Unit::Ms, 2).modelled_if(m),
            Column::metric("flushes", "flushes", Unit::Count, 0),
        ],
    );
    for x in &r.rows {
        t.row(vec![
            x.policy.clone().into(),
            x.ordering.clone().into(),
            (x.tx_pps / 1e3).into(),
            (x.rx_pps / 1e3).into(),
            x.drops.into(),
            x.driver_cpu_us_per_pkt.into(),
            x.service_demand_vs_passthrough.into(),
            x.tx_driver_cpu_us_per_pkt.into(),
            x.rx_driver_cpu_us_per_pkt.into(),
            x.device_cpu_us_per_pkt.into(),
            x.stale_window_ms_max.into(),
            x.flushes.map(|f| f as f64).into(),
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
        "CPU per datagram from thread CPU clocks: the sender's driver+stack thread per datagram sent plus the receiver's per datagram received (service demand); the device threads stand for NIC hardware and are reported apart. Drops = sent less received in the window."
            .into(),
    );
    rep.tables.push(t);
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
                Some((i as f64, x.driver_cpu_us_per_pkt))
            })
            .collect();
        series.push(Series::new(o.name(), points));
    }
    rep.plots.push(Plot {
        name: "service_demand".into(),
        title: format!(
            "service demand per policy, {} byte datagrams through smoltcp (driver+stack CPU µs per datagram; lower is better)",
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
