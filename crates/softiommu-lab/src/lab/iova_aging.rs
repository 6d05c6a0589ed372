//! `softiommu lab iova-aging`: seed `004`'s experiment.
//!
//! Twelve jobs (threads) do storage-like I/O in deferred mode: each I/O
//! allocates an IOVA of a mixed size, keeps it while `--iodepth` later I/Os
//! are issued, then completes. Completions are handled on the "interrupt
//! CPUs" (`--irq-cpus`, as a controller with fewer vectors than CPUs does):
//! the completing job puts the IOVA in its flush queue (an array of 256, as
//! Linux's), and frees the whole batch into its own per-CPU cache when the
//! queue is full or its oldest entry is 10 ms old. So IOVAs are allocated on
//! every CPU but freed on a few: the caches and the depot fill, and the
//! policies differ in what happens next.
//!
//! The output is a throughput time line per policy, in windows, like the
//! seed's fio lines, and a summary. Every figure is measured; the jobs do no
//! I/O beyond the allocator's work, so throughput is the allocator's.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use serde::Serialize;
use softiommu::iova::{IovaCpuCache, IovaDomain, IovaPolicy};

use crate::table::Table;
use crate::workload::DMA_MIX;

/// Flush-queue high-water mark: Linux's `IOVA_FQ_SIZE` is 256 (seed `000`
/// used 250).
const FQ_SIZE: usize = 256;
/// Flush-queue timeout: Linux's `IOVA_FQ_TIMEOUT`, 10 ms (seed `000`).
const FQ_TIMEOUT: Duration = Duration::from_millis(10);

/// Options of `lab iova-aging`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgingArgs {
    /// A short run (under a minute for all policies) with the same shape.
    #[arg(long)]
    pub quick: bool,
    /// Seconds per policy (default 8 with --quick, else 60).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Windows in the time line.
    #[arg(long, default_value_t = 16)]
    pub windows: usize,
    /// Jobs (threads), as fio's `numjobs`.
    #[arg(long, default_value_t = 12)]
    pub jobs: usize,
    /// Jobs that also handle completions (interrupt CPUs).
    #[arg(long, default_value_t = 4)]
    pub irq_cpus: usize,
    /// I/Os in flight per job.
    #[arg(long, default_value_t = 32)]
    pub iodepth: usize,
    /// Policies to run (default: all, baselines first).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// One policy's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    /// Policy name.
    pub policy: String,
    /// Throughput of the first window, million I/Os per second.
    pub first_window_mops: f64,
    /// Throughput of the last window.
    pub last_window_mops: f64,
    /// `last_window_mops / first_window_mops`.
    pub retained: f64,
    /// Most nodes ever in the range allocator's tree.
    pub peak_tree_nodes: u64,
    /// Most IOVAs ever sampled in caches and depots.
    pub peak_cached_iovas: u64,
    /// Every window's throughput, in order.
    pub windows_mops: Vec<f64>,
    /// Linear-search steps over the run (Linux baselines).
    pub scan_steps: u64,
    /// Magazines given back to the tree.
    pub magazines_freed: u64,
    /// Full cache flushes.
    pub cache_flushes: u64,
    /// Allocations that failed (should be zero).
    pub failed_allocs: u64,
}

/// The JSON object of `lab iova-aging --json`.
#[derive(Debug, Clone, Serialize)]
pub struct AgingReport {
    /// Always "iova-aging".
    pub lab: &'static str,
    /// Jobs.
    pub jobs: usize,
    /// Interrupt CPUs.
    pub irq_cpus: usize,
    /// Seconds per policy.
    pub seconds: f64,
    /// One entry per policy.
    pub policies: Vec<PolicyResult>,
}

struct Shared {
    domain: Arc<IovaDomain>,
    stop: AtomicBool,
    ops: Vec<CachePadded<AtomicU64>>,
    failed: AtomicU64,
    inbound: Vec<ArrayQueue<(u64, u64)>>,
    irq_cpus: usize,
    iodepth: usize,
}

/// A job's flush queue: a fixed array filled then freed as one batch.
struct FlushQueue {
    entries: Vec<(u64, u64)>,
    oldest: Option<Instant>,
}

impl FlushQueue {
    fn push(&mut self, e: (u64, u64), cache: &mut IovaCpuCache) {
        if self.entries.is_empty() {
            self.oldest = Some(Instant::now());
        }
        self.entries.push(e);
        if self.entries.len() >= FQ_SIZE {
            self.flush(cache);
        }
    }

    fn flush(&mut self, cache: &mut IovaCpuCache) {
        for (pfn, pages) in self.entries.drain(..) {
            cache
                .free(pfn, pages)
                .expect("freeing an IOVA this lab allocated");
        }
        self.oldest = None;
    }
}

fn job(me: usize, sh: &Shared) {
    let mut cache = sh.domain.cpu_cache();
    let limit = sh.domain.end_pfn();
    let sizes = DMA_MIX.sequence(0xa9e + me as u64, 1 << 16);
    let mut inflight: VecDeque<(u64, u64)> = VecDeque::with_capacity(sh.iodepth);
    let mut fq = FlushQueue {
        entries: Vec::with_capacity(FQ_SIZE),
        oldest: None,
    };
    let completer = me < sh.irq_cpus;
    let target = me % sh.irq_cpus;
    let mut ops = 0u64;
    while !sh.stop.load(Relaxed) {
        for _ in 0..64 {
            if inflight.len() >= sh.iodepth {
                let done = inflight.pop_front().expect("non-empty");
                if completer {
                    fq.push(done, &mut cache);
                } else {
                    let mut item = done;
                    while let Err(back) = sh.inbound[target].push(item) {
                        item = back;
                        std::thread::yield_now();
                        if sh.stop.load(Relaxed) {
                            break;
                        }
                    }
                }
            }
            let pages = sizes[ops as usize & 0xffff];
            match cache.alloc(pages, limit) {
                Ok(pfn) => inflight.push_back((pfn, pages)),
                Err(_) => {
                    sh.failed.fetch_add(1, Relaxed);
                }
            }
            ops += 1;
        }
        if completer {
            while let Some(e) = sh.inbound[me].pop() {
                fq.push(e, &mut cache);
            }
            if fq.oldest.is_some_and(|t| t.elapsed() >= FQ_TIMEOUT) {
                fq.flush(&mut cache);
            }
        }
        sh.ops[me].store(ops, Relaxed);
    }
    for e in inflight.drain(..).chain(fq.entries.drain(..)) {
        cache.free(e.0, e.1).expect("freeing at the end");
    }
}

fn run_policy(policy: IovaPolicy, args: &AgingArgs, seconds: f64) -> PolicyResult {
    let jobs = args.jobs.max(1);
    let sh = Arc::new(Shared {
        domain: IovaDomain::new(1, (1 << 36) - 1, policy).expect("valid domain"),
        stop: AtomicBool::new(false),
        ops: (0..jobs)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
        failed: AtomicU64::new(0),
        inbound: (0..jobs).map(|_| ArrayQueue::new(8192)).collect(),
        irq_cpus: args.irq_cpus.clamp(1, jobs),
        iodepth: args.iodepth.max(1),
    });
    let threads: Vec<_> = (0..jobs)
        .map(|me| {
            let sh = sh.clone();
            std::thread::spawn(move || job(me, &sh))
        })
        .collect();
    let windows = args.windows.max(2);
    let window = Duration::from_secs_f64(seconds / windows as f64);
    let total = |sh: &Shared| sh.ops.iter().map(|c| c.load(Relaxed)).sum::<u64>();
    let mut mops = Vec::with_capacity(windows);
    let mut peak_cached = 0u64;
    let mut last = total(&sh);
    let mut t0 = Instant::now();
    for _ in 0..windows {
        let end = t0 + window;
        while Instant::now() < end {
            // The background work of the caches (Linux runs it from a
            // workqueue every 100 ms), and a sample of what they hold.
            std::thread::sleep(
                Duration::from_millis(20).min(end.saturating_duration_since(Instant::now())),
            );
            sh.domain.maintain();
            peak_cached = peak_cached.max(sh.domain.stats().cached_iovas);
        }
        let now_ops = total(&sh);
        let now = Instant::now();
        mops.push((now_ops - last) as f64 / now.duration_since(t0).as_secs_f64() / 1e6);
        last = now_ops;
        t0 = now;
    }
    sh.stop.store(true, Relaxed);
    for t in threads {
        t.join().expect("job thread");
    }
    let mut cache = sh.domain.cpu_cache();
    for q in &sh.inbound {
        while let Some((pfn, pages)) = q.pop() {
            cache.free(pfn, pages).expect("freeing leftovers");
        }
    }
    drop(cache);
    let s = sh.domain.stats();
    let first = mops[0];
    let lastw = *mops.last().expect("windows >= 2");
    PolicyResult {
        policy: policy.name().to_string(),
        first_window_mops: first,
        last_window_mops: lastw,
        retained: if first > 0.0 { lastw / first } else { 0.0 },
        peak_tree_nodes: s.peak_tree_nodes,
        peak_cached_iovas: peak_cached,
        windows_mops: mops,
        scan_steps: s.scan_steps,
        magazines_freed: s.magazines_freed,
        cache_flushes: s.cache_flushes,
        failed_allocs: sh.failed.load(Relaxed),
    }
}

/// Parses `--policies`; empty means all.
pub fn parse_policies(names: &[String]) -> Result<Vec<IovaPolicy>, String> {
    if names.is_empty() {
        return Ok(IovaPolicy::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| IovaPolicy::from_name(n).ok_or_else(|| format!("unknown policy {n:?}")))
        .collect()
}

/// Runs the lab; `progress` receives each policy's result as it finishes.
pub fn run(
    args: &AgingArgs,
    mut progress: impl FnMut(&PolicyResult),
) -> Result<AgingReport, String> {
    let policies = parse_policies(&args.policies)?;
    let seconds = args
        .seconds
        .unwrap_or(if args.quick { 8.0 } else { 60.0 })
        .max(0.2);
    let mut out = Vec::new();
    for p in policies {
        let r = run_policy(p, args, seconds);
        progress(&r);
        out.push(r);
    }
    Ok(AgingReport {
        lab: "iova-aging",
        jobs: args.jobs,
        irq_cpus: args.irq_cpus,
        seconds,
        policies: out,
    })
}

/// The time line of one policy, fio style.
pub fn render_timeline(r: &PolicyResult, jobs: usize) -> String {
    let mut s = String::new();
    for (i, m) in r.windows_mops.iter().enumerate() {
        s.push_str(&format!(
            "{:<10} Jobs: {jobs} window {:>2}: [{:>6.3} M IOVA ops/s]\n",
            r.policy,
            i + 1,
            m
        ));
    }
    s
}

/// The summary table.
pub fn render_summary(rep: &AgingReport) -> String {
    let mut t = Table::new(&[
        "policy",
        "first Mops/s",
        "last Mops/s",
        "retained",
        "peak tree nodes",
        "peak cached",
        "scan steps",
        "mags freed",
        "flushes",
    ]);
    for r in &rep.policies {
        t.row(vec![
            r.policy.clone(),
            format!("{:.3}", r.first_window_mops),
            format!("{:.3}", r.last_window_mops),
            format!("{:.2}", r.retained),
            r.peak_tree_nodes.to_string(),
            r.peak_cached_iovas.to_string(),
            r.scan_steps.to_string(),
            r.magazines_freed.to_string(),
            r.cache_flushes.to_string(),
        ]);
    }
    format!(
        "lab iova-aging: {} jobs, {} interrupt CPUs, {:.0} s per policy; all figures measured\n{}",
        rep.jobs,
        rep.irq_cpus,
        rep.seconds,
        t.render()
    )
}
