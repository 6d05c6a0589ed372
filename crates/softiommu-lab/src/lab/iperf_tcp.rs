//! `softiommu lab iperf-tcp`: seed `003` on the real path — one smoltcp
//! TCP stream from host A to host B with 64 KiB writes at MTU 1500, for
//! {coherent, non-coherent page walk} × {strict, deferred}: throughput,
//! driver-side CPU seconds per GB, page-table cache lines flushed per GB,
//! and the share of the driver side's CPU spent flushing, beside the
//! seed's figures (7,908 → 4,380 Mbit/s with the IOMMU on; 5.86 % of CPU
//! in `clflush_cache_range`).
//!
//! The flush share is an estimate: lines flushed × a per-line cost
//! measured on this CPU at the end of each run (dirty lines flushed in
//! batches of the run's size, less the same loop without flushing). The
//! received bytes are hashed and compared with the sent ones; a mismatch
//! fails the lab. The engine is `softiommu_virtio::workload::tcp_stream`.

use std::time::Duration;

use serde::Serialize;
use softiommu::dma::DmaPolicy;
use softiommu_virtio::workload::{tcp_stream, TcpStreamConfig, TcpStreamResult};

use crate::table::Table;

/// Options of `lab iperf-tcp`.
#[derive(Debug, Clone, clap::Args)]
pub struct IperfTcpArgs {
    /// Measured seconds per row and round (default 0.5 with --quick, else 3).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Interleaved rounds; each row is its median round by Mbit/s
    /// (default 1 with --quick, else 3).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Short runs, same shape.
    #[arg(long)]
    pub quick: bool,
    /// Page walks to run: coherent, non-coherent.
    #[arg(long, value_delimiter = ',', default_value = "coherent,non-coherent")]
    pub walks: Vec<String>,
    /// Policies to run.
    #[arg(long, value_delimiter = ',', default_value = "strict,deferred")]
    pub policies: Vec<String>,
    /// The MTU.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u16,
    /// Bytes per application write.
    #[arg(long, default_value_t = 65536)]
    pub write_size: usize,
    /// Latency model: vtd-2015 or zero.
    #[arg(long, default_value = "vtd-2015")]
    pub latency: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One walk × policy.
#[derive(Debug, Clone, Serialize)]
pub struct IperfTcpRow {
    /// "coherent" or "non-coherent".
    pub walk: &'static str,
    /// Policy name.
    pub policy: String,
    /// Throughput.
    pub mbit_s: f64,
    /// Driver+stack CPU seconds (both hosts) per GB.
    pub cpu_s_per_gb: f64,
    /// Page-table lines flushed per GB (both hosts).
    pub lines_flushed_per_gb: f64,
    /// Estimated share of the driver side's CPU spent flushing.
    pub flush_cpu_share: f64,
    /// Whether every byte arrived unchanged.
    pub checksum_ok: bool,
    /// Device threads' CPU seconds per GB (apart).
    pub device_cpu_s_per_gb: f64,
    /// The measured per-line flush cost behind `flush_cpu_share`, ns.
    pub flush_ns_per_line: f64,
    /// This row's throughput over the coherent row's of the same policy.
    pub vs_coherent: Option<f64>,
}

/// The seed's figures, for the reader.
#[derive(Debug, Clone, Serialize)]
pub struct Seed003 {
    /// be2net, IOMMU off.
    pub iommu_off_mbit_s: f64,
    /// be2net, IOMMU on (non-coherent walk).
    pub iommu_on_mbit_s: f64,
    /// Their ratio.
    pub ratio: f64,
    /// `clflush_cache_range`'s share of CPU in the profile.
    pub clflush_share: f64,
}

/// The JSON object of `lab iperf-tcp --json`.
#[derive(Debug, Clone, Serialize)]
pub struct IperfTcpReport {
    /// Always "iperf-tcp".
    pub lab: &'static str,
    /// Measured seconds per row and round.
    pub seconds: f64,
    /// Rounds.
    pub rounds: usize,
    /// What is modelled, nanoseconds.
    pub modelled: Vec<(String, u64)>,
    /// One row per walk and policy.
    pub rows: Vec<IperfTcpRow>,
    /// Seed 003's figures.
    pub seed: Seed003,
}

fn walk_name(coherent: bool) -> &'static str {
    if coherent {
        "coherent"
    } else {
        "non-coherent"
    }
}

fn row(r: &TcpStreamResult) -> IperfTcpRow {
    IperfTcpRow {
        walk: walk_name(r.coherent),
        policy: r.policy.name().to_string(),
        mbit_s: r.mbit_s,
        cpu_s_per_gb: r.cpu_s_per_gb,
        lines_flushed_per_gb: r.lines_flushed_per_gb,
        flush_cpu_share: r.flush_cpu_share,
        checksum_ok: r.checksum_ok,
        device_cpu_s_per_gb: r.device_cpu_s_per_gb,
        flush_ns_per_line: r.flush_ns_per_line,
        vs_coherent: None,
    }
}

/// Runs the lab.
pub fn run(args: &IperfTcpArgs) -> Result<IperfTcpReport, String> {
    let latency = crate::dma_rig::DmaRunArgs {
        latency: args.latency.clone(),
        policies: Vec::new(),
    }
    .model()?;
    let walks = args
        .walks
        .iter()
        .map(|w| match w.as_str() {
            "coherent" => Ok(true),
            "non-coherent" => Ok(false),
            _ => Err(format!("unknown walk {w:?} (coherent, non-coherent)")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let policies = args
        .policies
        .iter()
        .map(|p| DmaPolicy::from_name(p).ok_or_else(|| format!("unknown policy {p:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let seconds = args
        .seconds
        .unwrap_or(if args.quick { 0.5 } else { 3.0 })
        .max(0.05);
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 }).max(1);
    let cells: Vec<(bool, DmaPolicy)> = walks
        .iter()
        .flat_map(|&w| policies.iter().map(move |&p| (w, p)))
        .collect();
    let mut runs: Vec<Vec<IperfTcpRow>> = vec![Vec::new(); cells.len()];
    for _ in 0..rounds {
        for (i, &(coherent, policy)) in cells.iter().enumerate() {
            let r = tcp_stream(&TcpStreamConfig {
                policy,
                coherent,
                latency,
                mtu: args.mtu,
                write_size: args.write_size,
                duration: Duration::from_secs_f64(seconds),
                warmup: Duration::from_secs_f64((seconds * 0.4).clamp(0.2, 0.5)),
                ..TcpStreamConfig::default()
            })
            .map_err(|e| format!("iperf-tcp {} {policy}: {e}", walk_name(coherent)))?;
            if !r.checksum_ok {
                return Err(format!(
                    "iperf-tcp {} {policy}: received data does not match what was sent ({} of {} bytes)",
                    walk_name(coherent),
                    r.total_received,
                    r.total_sent
                ));
            }
            runs[i].push(row(&r));
        }
    }
    let mut rows: Vec<IperfTcpRow> = runs
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.mbit_s.total_cmp(&b.mbit_s));
            v.swap_remove(v.len() / 2)
        })
        .collect();
    let coherent: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.walk == "coherent")
        .map(|r| (r.policy.clone(), r.mbit_s))
        .collect();
    for r in &mut rows {
        r.vs_coherent = coherent
            .iter()
            .find(|(p, _)| *p == r.policy)
            .filter(|(_, m)| *m > 0.0)
            .map(|(_, m)| r.mbit_s / m);
    }
    Ok(IperfTcpReport {
        lab: "iperf-tcp",
        seconds,
        rounds,
        modelled: crate::dma_rig::modelled(latency),
        rows,
        seed: Seed003 {
            iommu_off_mbit_s: 7908.0,
            iommu_on_mbit_s: 4380.0,
            ratio: 4380.0 / 7908.0,
            clflush_share: 0.0586,
        },
    })
}

/// Renders the report, seed-style.
pub fn render(r: &IperfTcpReport) -> String {
    let mut t = Table::new(&[
        "walk",
        "policy",
        "Mbit/s",
        "vs coherent",
        "CPU s/GB",
        "lines flushed/GB",
        "flush share",
        "device CPU s/GB",
        "checksum",
    ]);
    for x in &r.rows {
        t.row(vec![
            x.walk.to_string(),
            x.policy.clone(),
            format!("{:.0}", x.mbit_s),
            x.vs_coherent.map_or("-".into(), |v| format!("{v:.2}x")),
            format!("{:.2}", x.cpu_s_per_gb),
            format!("{:.0}", x.lines_flushed_per_gb),
            format!("{:.2} %", x.flush_cpu_share * 100.0),
            format!("{:.2}", x.device_cpu_s_per_gb),
            if x.checksum_ok { "ok" } else { "MISMATCH" }.to_string(),
        ]);
    }
    format!(
        "lab iperf-tcp: one smoltcp TCP stream, 64 KiB writes, through virtio-net and two IOMMUs, {:.1} s per row, median of {} rounds; seed 003: {:.0} -> {:.0} Mbit/s ({:.2}x), clflush {:.2} % of CPU; flush share = lines x measured per-line cost; modelled: {}; all else measured\n{}",
        r.seconds,
        r.rounds,
        r.seed.iommu_off_mbit_s,
        r.seed.iommu_on_mbit_s,
        r.seed.ratio,
        r.seed.clflush_share * 100.0,
        crate::dma_rig::modelled_text(&r.modelled),
        t.render()
    )
}
