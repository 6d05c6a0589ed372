//! Quick figures from the storage path: seed `004`'s twelve jobs of 4 KiB
//! random reads on the `null` back-end per DMA policy, then the aging
//! figure per IOVA allocator design with the slow tail and interrupt CPUs.
//!
//! `cargo run --release -p softiommu-virtio --example fio_quick -- [seconds] [aging [policies]]`

use std::time::Duration;

use softiommu::dma::DmaPolicy;
use softiommu::iova::IovaPolicy;
use softiommu_virtio::blk::BlkHostConfig;
use softiommu_virtio::workload::aging::{aging_figure, AgingParams};
use softiommu_virtio::workload::fio::{run_fio, BlockSizes, FioConfig, SlowTail};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4.0);
    let base = FioConfig {
        jobs: 12,
        iodepth: 32,
        runtime: Duration::from_secs_f64(secs),
        window: Duration::from_millis(500),
        ..FioConfig::default()
    };
    let only_aging = std::env::args().nth(2).as_deref() == Some("aging");
    println!("policy       IOPS      GB/s  driver µs/req  device µs/req  verified");
    let policies = if only_aging {
        &[][..]
    } else {
        &[
            DmaPolicy::Passthrough,
            DmaPolicy::Strict,
            DmaPolicy::Deferred,
        ][..]
    };
    for &p in policies {
        let h = BlkHostConfig {
            policy: p,
            ..BlkHostConfig::default()
        };
        let r = run_fio(&h, &base)?;
        println!(
            "{:<10} {:>8.0} {:>9.3} {:>14.2} {:>14.2} {:>6}/{}",
            p.name(),
            r.iops,
            r.gbps,
            r.driver_cpu_us_per_req,
            r.device_cpu_us_per_req,
            r.verified - r.verify_failures,
            r.verified
        );
    }
    // Sizing knobs for experiments (environment): FIO_BS, FIO_IODEPTH,
    // FIO_SLOW_DEPTH, FIO_SLOW_PCT, FIO_IRQ_CPUS, FIO_MEM_MIB.
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let aging = FioConfig {
        bs: BlockSizes::parse(&env("FIO_BS", "4k:60,16k:20,64k:15,128k:5"))?,
        iodepth: env("FIO_IODEPTH", "32").parse()?,
        irq_cpus: Some(env("FIO_IRQ_CPUS", "4").parse()?),
        slow: Some(SlowTail {
            pct: env("FIO_SLOW_PCT", "2").parse()?,
            per_s: None,
            depth: env("FIO_SLOW_DEPTH", "256").parse()?,
            hold: Duration::from_secs_f64(secs),
            mixed: false,
        }),
        window: Duration::from_millis(250),
        ..base
    };
    let mem_bytes = env("FIO_MEM_MIB", "1024").parse::<u64>()? << 20;
    println!("\niova policy  warmup_s retained stability iops_first iops_last tree_nodes cached scan_steps");
    let ips: Vec<IovaPolicy> = match std::env::args().nth(3) {
        Some(list) => list.split(',').filter_map(IovaPolicy::from_name).collect(),
        None => IovaPolicy::ALL.to_vec(),
    };
    for ip in ips {
        let h = BlkHostConfig {
            policy: DmaPolicy::Deferred,
            iova_policy: ip,
            mem_bytes,
            ..BlkHostConfig::default()
        };
        let r = run_fio(&h, &aging)?;
        let f = aging_figure(&r.iops_series(), r.window_s, &AgingParams::default())?;
        println!(
            "{:<12} {:>8.2} {:>8.2} {:>9.2} {:>10.0} {:>9.0} {:>10} {:>6} {:>10}",
            ip.name(),
            f.warmup_s,
            f.retained,
            f.stability,
            f.first,
            f.last,
            r.iova.peak_tree_nodes,
            r.iova.cached_iovas,
            r.iova.scan_steps
        );
        if std::env::var("FIO_SERIES").is_ok() {
            let k: Vec<String> = r
                .windows
                .iter()
                .map(|w| format!("{:.0}", w.iops / 1e3))
                .collect();
            println!("  kIOPS per window: {}", k.join(" "));
        }
    }
    Ok(())
}
