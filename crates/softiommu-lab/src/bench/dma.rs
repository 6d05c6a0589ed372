//! `softiommu bench dma`: the equivalent of Linux's `dma_map_benchmark`
//! (`tools/testing/selftests/dma/dma_map_benchmark.c`): threads map and
//! unmap a buffer of `--granule` pages in a loop, each call timed, with an
//! optional simulated transfer between map and unmap; every policy side by
//! side in one run.
//!
//! Real work: IOVA allocation, page-table writes, invalidation descriptors
//! through the unit's queue, the drain of translations. Modelled: the time
//! the hardware takes to complete an invalidation wait, per
//! `--latency` (default `vtd-2015`: 2,100 cycles at 3 GHz, 700 ns, from the
//! rIOMMU paper, ASPLOS 2015); the report lists the figures.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;
use softiommu::dma::{DmaDirection, DmaPolicy};
use softiommu::hw::{LatencyModel, SourceId};

use crate::dma_rig::DmaRig;
use crate::table::Table;

/// Options of `bench dma`.
#[derive(Debug, Clone, clap::Args)]
pub struct DmaBenchArgs {
    /// Threads mapping at once.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seconds per policy (ignored with --iters).
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Run exactly this many map+unmap pairs per thread (for instruction
    /// counts with callgrind).
    #[arg(long)]
    pub iters: Option<u64>,
    /// Pages per buffer.
    #[arg(long, default_value_t = 1)]
    pub granule: u64,
    /// Direction: to-device, from-device or bidirectional.
    #[arg(long, default_value = "bidirectional")]
    pub dir: String,
    /// Simulated transfer time between map and unmap, nanoseconds (a spin).
    #[arg(long, default_value_t = 0)]
    pub dma_trans_ns: u64,
    /// Policies and latency model.
    #[command(flatten)]
    pub run: crate::dma_rig::DmaRunArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One policy's result.
#[derive(Debug, Clone, Serialize)]
pub struct DmaResult {
    /// Policy name.
    pub policy: String,
    /// Mean nanoseconds per map.
    pub map_ns: f64,
    /// Mean nanoseconds per unmap (flushes included, amortised).
    pub unmap_ns: f64,
    /// Map+unmap pairs done, all threads.
    pub pairs: u64,
    /// Deferred only: flushes and the longest stale window.
    pub flushes: u64,
    /// The longest time an unmapped buffer stayed reachable, ms.
    pub stale_window_ms_max: f64,
}

/// The JSON object `bench dma --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct DmaBenchReport {
    /// Always "dma".
    pub bench: &'static str,
    /// Threads.
    pub threads: usize,
    /// Pages per buffer.
    pub granule: u64,
    /// The latency model's figures, nanoseconds: what is modelled.
    pub modelled: Vec<(String, u64)>,
    /// One entry per policy.
    pub results: Vec<DmaResult>,
}

fn direction(s: &str) -> Result<DmaDirection, String> {
    match s {
        "to-device" => Ok(DmaDirection::ToDevice),
        "from-device" => Ok(DmaDirection::FromDevice),
        "bidirectional" => Ok(DmaDirection::Bidirectional),
        _ => Err(format!("unknown direction {s:?}")),
    }
}

fn spin(ns: u64) {
    if ns == 0 {
        return;
    }
    let t = Instant::now();
    while t.elapsed().as_nanos() < ns as u128 {
        std::hint::spin_loop();
    }
}

fn run_policy(
    policy: DmaPolicy,
    args: &DmaBenchArgs,
    dir: DmaDirection,
    model: LatencyModel,
) -> Result<DmaResult, String> {
    let threads = args.threads.max(1);
    let granule = args.granule.max(1);
    let rig = DmaRig::new(policy, model, SourceId(0x0300), 1 << 30, 8 << 20)?;
    let (mem, domain, dev) = (rig.mem.clone(), rig.domain.clone(), rig.dev.clone());
    let go = Arc::new(Barrier::new(threads));
    let budget = Duration::from_secs_f64(args.seconds.max(0.01));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (domain, dev, go, mem) = (domain.clone(), dev.clone(), go.clone(), mem.clone());
            let (iters, trans) = (args.iters, args.dma_trans_ns);
            std::thread::spawn(move || -> Result<(u64, u128, u128), String> {
                let order = granule.next_power_of_two().ilog2();
                let buf = mem.alloc_zeroed_frames(order).map_err(|e| e.to_string())?;
                let len = granule * 4096;
                let mut cpu = domain.cpu();
                go.wait();
                let start = Instant::now();
                let (mut n, mut map_ns, mut unmap_ns) = (0u64, 0u128, 0u128);
                loop {
                    let t0 = Instant::now();
                    let a = cpu.map(&dev, buf, len, dir).map_err(|e| e.to_string())?;
                    let t1 = Instant::now();
                    spin(trans);
                    let t2 = Instant::now();
                    cpu.unmap(&dev, a, len, dir).map_err(|e| e.to_string())?;
                    let t3 = Instant::now();
                    map_ns += (t1 - t0).as_nanos();
                    unmap_ns += (t3 - t2).as_nanos();
                    n += 1;
                    match iters {
                        Some(k) if n >= k => break,
                        None if n % 64 == 0 && start.elapsed() >= budget => break,
                        _ => {}
                    }
                }
                drop(cpu);
                Ok((n, map_ns, unmap_ns))
            })
        })
        .collect();
    let mut tot = (0u64, 0u128, 0u128);
    for h in handles {
        let (n, m, u) = h
            .join()
            .map_err(|_| "bench thread panicked".to_string())??;
        tot = (tot.0 + n, tot.1 + m, tot.2 + u);
    }
    let s = domain.stats();
    Ok(DmaResult {
        policy: policy.name().to_string(),
        map_ns: tot.1 as f64 / tot.0.max(1) as f64,
        unmap_ns: tot.2 as f64 / tot.0.max(1) as f64,
        pairs: tot.0,
        flushes: s.flushes,
        stale_window_ms_max: domain.stale_window().max.as_secs_f64() * 1e3,
    })
}

/// Runs the bench.
pub fn run(args: &DmaBenchArgs) -> Result<DmaBenchReport, String> {
    let dir = direction(&args.dir)?;
    let model = args.run.model()?;
    let policies = args.run.policies()?;
    let results = policies
        .into_iter()
        .map(|p| run_policy(p, args, dir, model))
        .collect::<Result<_, _>>()?;
    Ok(DmaBenchReport {
        bench: "dma",
        threads: args.threads.max(1),
        granule: args.granule.max(1),
        modelled: crate::dma_rig::modelled(model),
        results,
    })
}

/// Renders the report.
pub fn render(r: &DmaBenchReport) -> String {
    let mut t = Table::new(&[
        "policy",
        "map ns",
        "unmap ns",
        "pairs",
        "flushes",
        "stale max ms",
    ]);
    for x in &r.results {
        t.row(vec![
            x.policy.clone(),
            format!("{:.0}", x.map_ns),
            format!("{:.0}", x.unmap_ns),
            x.pairs.to_string(),
            x.flushes.to_string(),
            format!("{:.2}", x.stale_window_ms_max),
        ]);
    }
    format!(
        "bench dma: {} thread(s), {} page(s) per buffer; modelled: {}; all else measured\n{}",
        r.threads,
        r.granule,
        crate::dma_rig::modelled_text(&r.modelled),
        t.render()
    )
}
