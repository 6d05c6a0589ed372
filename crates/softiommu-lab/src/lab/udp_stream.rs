//! `softiommu lab netperf-udp`: seed `000`'s UDP_STREAM on the real path —
//! smoltcp on host A sends `--msg-size`-byte datagrams through its
//! virtio-net driver (each frame mapped `ToDevice`, unmapped at
//! completion), A's device thread fetches them through A's IOMMU unit,
//! the wire carries them, B's device writes them through B's unit into
//! receive buffers mapped `FromDevice`, and B's smoltcp delivers them.
//!
//! Per policy and ordering mode: datagrams per second each way, drops,
//! the driver side's CPU per datagram (thread CPU clocks of the two
//! driver+stack threads: the seed's service demand), the device threads'
//! apart (they stand for hardware), and the ratio to pass-through. Rounds
//! are interleaved and each row is its median round. The engine is
//! `softiommu_virtio::workload::udp_stream`.

use std::time::Duration;

use serde::Serialize;
use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu_virtio::workload::{udp_stream, UdpStreamConfig, UdpStreamResult};

use crate::table::Table;

/// Options of `lab netperf-udp`.
#[derive(Debug, Clone, clap::Args)]
pub struct NetperfUdpArgs {
    /// UDP payload bytes per datagram (the seed: 32 and 16384; past the
    /// MTU, IPv4 fragments it).
    #[arg(long, default_value_t = 32)]
    pub msg_size: usize,
    /// Device ordering modes to run (seed 001): ordered, relaxed, full.
    #[arg(long, value_delimiter = ',', default_value = "ordered")]
    pub ordering: Vec<String>,
    /// Measured seconds per row and round (default 0.4 with --quick, else 2).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Interleaved rounds; each row is its median round (default 3).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Short runs, same shape.
    #[arg(long)]
    pub quick: bool,
    /// The MTU.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u16,
    /// The wire's line rate in Mbit/s (0: unlimited).
    #[arg(long, default_value_t = 0)]
    pub line_rate_mbit: u64,
    /// Policies and latency model.
    #[command(flatten)]
    pub run: crate::dma_rig::DmaRunArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One policy × ordering.
#[derive(Debug, Clone, Serialize)]
pub struct NetperfUdpRow {
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
    /// Datagrams lost in the window.
    pub drops: u64,
    /// Driver+stack CPU µs per datagram, sender's and receiver's summed.
    pub driver_cpu_us_per_pkt: f64,
    /// Device threads' CPU µs per datagram (the hardware's, apart).
    pub device_cpu_us_per_pkt: f64,
    /// `driver_cpu_us_per_pkt` over pass-through's with the same ordering
    /// (absent when pass-through was not run).
    pub service_demand_vs_passthrough: Option<f64>,
    /// The sender's part of `driver_cpu_us_per_pkt`.
    pub tx_driver_cpu_us_per_pkt: f64,
    /// The receiver's part.
    pub rx_driver_cpu_us_per_pkt: f64,
    /// Frames the wire dropped (B behind).
    pub wire_drops: u64,
    /// Ethernet frames per datagram.
    pub frames_per_packet: f64,
}

/// The JSON object of `lab netperf-udp --json`.
#[derive(Debug, Clone, Serialize)]
pub struct NetperfUdpReport {
    /// Always "netperf-udp".
    pub lab: &'static str,
    /// Always "smoltcp": the stack the datagrams went through.
    pub stack: &'static str,
    /// Payload bytes.
    pub msg_size: usize,
    /// Measured seconds per row and round.
    pub seconds: f64,
    /// Rounds (median shown).
    pub rounds: usize,
    /// What is modelled, nanoseconds.
    pub modelled: Vec<(String, u64)>,
    /// One row per policy and ordering.
    pub rows: Vec<NetperfUdpRow>,
}

fn row(r: &UdpStreamResult) -> NetperfUdpRow {
    NetperfUdpRow {
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
    }
}

/// Runs the lab.
pub fn run(args: &NetperfUdpArgs) -> Result<NetperfUdpReport, String> {
    let latency = args.run.model()?;
    let policies = args.run.policies()?;
    let orderings = args
        .ordering
        .iter()
        .map(|o| {
            OrderMode::from_name(o)
                .ok_or_else(|| format!("unknown ordering {o:?} (ordered, relaxed, full)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let seconds = args
        .seconds
        .unwrap_or(if args.quick { 0.4 } else { 2.0 })
        .max(0.05);
    let rounds = args.rounds.unwrap_or(3).max(1);
    let cells: Vec<(DmaPolicy, OrderMode)> = orderings
        .iter()
        .flat_map(|&o| policies.iter().map(move |&p| (p, o)))
        .collect();
    let mut runs: Vec<Vec<NetperfUdpRow>> = vec![Vec::new(); cells.len()];
    for _ in 0..rounds {
        for (i, &(policy, ordering)) in cells.iter().enumerate() {
            let r = udp_stream(&UdpStreamConfig {
                policy,
                ordering,
                msg_size: args.msg_size,
                duration: Duration::from_secs_f64(seconds),
                warmup: Duration::from_secs_f64((seconds * 0.4).clamp(0.1, 0.5)),
                latency,
                mtu: args.mtu,
                line_rate_bps: args.line_rate_mbit.saturating_mul(1_000_000),
                ..UdpStreamConfig::default()
            })
            .map_err(|e| format!("netperf-udp {policy} {ordering}: {e}"))?;
            runs[i].push(row(&r));
        }
    }
    let mut rows: Vec<NetperfUdpRow> = runs
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.driver_cpu_us_per_pkt.total_cmp(&b.driver_cpu_us_per_pkt));
            v.swap_remove(v.len() / 2)
        })
        .collect();
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
    Ok(NetperfUdpReport {
        lab: "netperf-udp",
        stack: "smoltcp",
        msg_size: args.msg_size,
        seconds,
        rounds,
        modelled: crate::dma_rig::modelled(latency),
        rows,
    })
}

/// Renders the report, seed-style.
pub fn render(r: &NetperfUdpReport) -> String {
    let mut t = Table::new(&[
        "policy",
        "ordering",
        "tx pps",
        "rx pps",
        "drops",
        "driver us/pkt",
        "vs passthrough",
        "device us/pkt",
    ]);
    for x in &r.rows {
        t.row(vec![
            x.policy.clone(),
            x.ordering.clone(),
            format!("{:.0}", x.tx_pps),
            format!("{:.0}", x.rx_pps),
            x.drops.to_string(),
            format!("{:.3}", x.driver_cpu_us_per_pkt),
            x.service_demand_vs_passthrough
                .map_or("-".into(), |v| format!("{v:.2}x")),
            format!("{:.3}", x.device_cpu_us_per_pkt),
        ]);
    }
    format!(
        "lab netperf-udp: UDP_STREAM through smoltcp, virtio-net and two IOMMUs, {} byte datagrams, {:.1} s per row, median of {} interleaved rounds; driver = both hosts' driver+stack threads (thread CPU clocks), device = device threads (hardware, apart); modelled: {}; all else measured\n{}",
        r.msg_size,
        r.seconds,
        r.rounds,
        crate::dma_rig::modelled_text(&r.modelled),
        t.render()
    )
}
