//! The measurement: the jobs, their interrupt CPUs and flush queues, one run per IOVA policy.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use softiommu::iova::{IovaCpuCache, IovaDomain, IovaPolicy};

use crate::args::{iova_policies, Ranged, Seconds};
use crate::error::{join, LabResult};
use crate::metrics::aging::{AgingSummary, WorkWindow};
use crate::metrics::cpu_clock::{self, ThreadClock};
use crate::metrics::pinning;
use crate::report::Report;
use crate::workload::DMA_MIX;

use super::args::*;
use super::out::*;
use super::render::*;
use super::*;

pub(super) struct Shared {
    pub(super) domain: Arc<IovaDomain>,
    pub(super) stop: AtomicBool,
    pub(super) ops: Vec<CachePadded<AtomicU64>>,
    pub(super) failed: AtomicU64,
    pub(super) iodepth: usize,
    pub(super) slow_ppm: u64,
    pub(super) slow_hold: u64,
    /// The last frame of the first try (the low window's, or the domain's
    /// without `--low-window-mib`).
    pub(super) first_limit: u64,
}

/// An interrupt CPU's flush queue: a fixed array filled then freed as one batch.
pub(super) struct FlushQueue {
    pub(super) entries: Vec<(u64, u64)>,
    pub(super) oldest: Option<Instant>,
}

impl FlushQueue {
    pub(super) fn push(&mut self, e: (u64, u64), cache: &mut IovaCpuCache) {
        if self.entries.is_empty() {
            self.oldest = Some(Instant::now());
        }
        self.entries.push(e);
        if self.entries.len() >= FQ_SIZE {
            self.flush(cache);
        }
    }

    pub(super) fn flush(&mut self, cache: &mut IovaCpuCache) {
        cache
            .free_all(&self.entries)
            .expect("freeing IOVAs this lab allocated");
        self.entries.clear();
        self.oldest = None;
    }
}

/// A logical job CPU.
pub(super) struct Job {
    pub(super) cache: IovaCpuCache,
    pub(super) sizes: Vec<u64>,
    pub(super) inflight: VecDeque<(u64, u64)>,
    /// Slow I/Os: (the op count at which it completes, pfn, pages).
    pub(super) slow: VecDeque<(u64, u64, u64)>,
    pub(super) rng: crate::workload::Rng,
    pub(super) irq: usize,
    pub(super) ops: u64,
}

/// A logical interrupt CPU.
pub(super) struct Irq {
    pub(super) cache: IovaCpuCache,
    pub(super) inbound: VecDeque<(u64, u64)>,
    pub(super) fq: FlushQueue,
}

/// I/Os a logical CPU runs before the next one gets the thread.
pub(super) const SLICE: usize = 32;

/// One OS thread hosting `jobs` (global ids) and the interrupt CPUs that
/// serve them.
pub(super) fn worker(sh: &Shared, job_ids: Vec<usize>, n_irq: usize) {
    let limit = sh.domain.end_pfn();
    let mut irqs: Vec<Irq> = (0..n_irq.max(1))
        .map(|_| Irq {
            cache: sh.domain.cpu_cache(),
            inbound: VecDeque::new(),
            fq: FlushQueue {
                entries: Vec::with_capacity(FQ_SIZE),
                oldest: None,
            },
        })
        .collect();
    let mut jobs: Vec<(usize, Job)> = job_ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let job = Job {
                cache: sh.domain.cpu_cache(),
                sizes: DMA_MIX.sequence(0xa9e + id as u64, 1 << 16),
                inflight: VecDeque::with_capacity(sh.iodepth),
                slow: VecDeque::new(),
                rng: crate::workload::Rng::new(0x51 + id as u64),
                irq: i % irqs.len(),
                ops: 0,
            };
            (id, job)
        })
        .collect();
    let mut rounds = 0u64;
    while !sh.stop.load(Relaxed) {
        for (id, job) in &mut jobs {
            for _ in 0..SLICE {
                if job.inflight.len() >= sh.iodepth {
                    let done = job.inflight.pop_front().expect("non-empty");
                    irqs[job.irq].inbound.push_back(done);
                }
                while job.slow.front().is_some_and(|s| s.0 <= job.ops) {
                    let (_, pfn, pages) = job.slow.pop_front().expect("non-empty");
                    irqs[job.irq].inbound.push_back((pfn, pages));
                }
                let pages = job.sizes[job.ops as usize & 0xffff];
                // Without a low window (`first_limit == limit`) this is
                // one try at the whole mask, giving the caches back if the
                // tree is full (Linux's second try).
                let got = job.cache.alloc_low_first(pages, sh.first_limit, limit);
                match got {
                    Ok(pfn) if job.rng.below(1_000_000) < sh.slow_ppm => {
                        job.slow.push_back((job.ops + sh.slow_hold, pfn, pages));
                    }
                    Ok(pfn) => job.inflight.push_back((pfn, pages)),
                    Err(_) => {
                        sh.failed.fetch_add(1, Relaxed);
                    }
                }
                job.ops += 1;
            }
            sh.ops[*id].store(job.ops, Relaxed);
        }
        rounds += 1;
        let check_time = rounds.is_multiple_of(16);
        for irq in &mut irqs {
            while let Some(e) = irq.inbound.pop_front() {
                irq.fq.push(e, &mut irq.cache);
            }
            if check_time && irq.fq.oldest.is_some_and(|t| t.elapsed() >= FQ_TIMEOUT) {
                irq.fq.flush(&mut irq.cache);
            }
        }
    }
    for (_, job) in &mut jobs {
        for (_, pfn, pages) in std::mem::take(&mut job.slow) {
            job.cache.free(pfn, pages).expect("freeing at the end");
        }
        for (pfn, pages) in job.inflight.drain(..) {
            job.cache.free(pfn, pages).expect("freeing at the end");
        }
    }
    for irq in &mut irqs {
        for e in std::mem::take(&mut irq.inbound) {
            irq.fq.push(e, &mut irq.cache);
        }
        irq.fq.flush(&mut irq.cache);
    }
}

/// The low window in MiB: `--low-window-mib`, or Linux's 4 GiB.
pub(super) fn low_window_mib(args: &AgingArgs) -> u64 {
    args.low_window_mib.map_or(4096, Ranged::get)
}

pub(super) fn run_policy(
    policy: IovaPolicy,
    args: &AgingArgs,
    seconds: f64,
) -> LabResult<PolicyResult> {
    let jobs = args.jobs.us();
    let window_end = low_window_mib(args) << (20 - 12);
    let domain = IovaDomain::with_low_window(1, (1 << 36) - 1, window_end, policy)?;
    let first_limit = if args.low_window_mib.is_some() {
        window_end - 1
    } else {
        domain.end_pfn()
    };
    let sh = Arc::new(Shared {
        domain,
        first_limit,
        stop: AtomicBool::new(false),
        ops: (0..jobs)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
        failed: AtomicU64::new(0),
        iodepth: args.iodepth.us(),
        slow_ppm: (args.slow_pct.get() * 1e4) as u64,
        slow_hold: args.slow_hold.get(),
    });
    let threads = args.threads.map_or(1, Ranged::us);
    let threads = threads.clamp(1, jobs);
    let irq_cpus = args.irq_cpus.us().max(threads);
    // Each OS thread on a CPU of its own (round robin over the allowed
    // ones): unpinned, the scheduler sometimes stacks both threads on one
    // core for seconds, where the shared allocator lines stop bouncing
    // between caches and throughput triples (measured on 2 cores: windows
    // of ~26 and ~75 M ops/s in one run, `retained` 0.43 to 2.57 over four
    // runs), which is the scheduler's figure, not the allocator's.
    let cpus = pinning::allowed_cpus();
    let workers: Vec<std::thread::JoinHandle<()>> = (0..threads)
        .map(|w| {
            let sh = sh.clone();
            let ids: Vec<usize> = (w..jobs).step_by(threads).collect();
            let n_irq = (w..irq_cpus).step_by(threads).count();
            let cpu = (!cpus.is_empty()).then(|| cpus[w % cpus.len()]);
            std::thread::spawn(move || {
                if let Some(c) = cpu {
                    pinning::pin_current(c);
                }
                worker(&sh, ids, n_irq)
            })
        })
        .collect();
    // The workers' CPU clocks, read (and summed) at each window's end.
    let clocks: Vec<ThreadClock> = workers.iter().filter_map(ThreadClock::of).collect();
    let mut clock_last = vec![Duration::ZERO; clocks.len()];
    let mut maintain_cpu = Duration::ZERO;
    let mut worker_cpu = |maintain: Duration| {
        for (c, last) in clocks.iter().zip(&mut clock_last) {
            if let Some(d) = c.read() {
                *last = d;
            }
        }
        clock_last.iter().sum::<Duration>() + maintain
    };
    let windows = args
        .windows
        .map_or(if args.quick { 32 } else { 60 }, Ranged::us);
    let window = Duration::from_secs_f64(seconds / windows as f64);
    let total = |sh: &Shared| sh.ops.iter().map(|c| c.load(Relaxed)).sum::<u64>();
    let mut timeline = Vec::with_capacity(windows);
    let mut peak_cached = 0u64;
    let mut last = total(&sh);
    let mut last_cpu = worker_cpu(maintain_cpu);
    let mut work = Vec::with_capacity(windows);
    let mut last_steps = 0u64;
    let mut t0 = Instant::now();
    let start = t0;
    for _ in 0..windows {
        let end = t0 + window;
        let mut s = sh.domain.stats();
        while Instant::now() < end {
            // The background work of the caches (Linux runs it from a
            // workqueue every 100 ms), and a sample of what they hold.
            std::thread::sleep(
                Duration::from_millis(20).min(end.saturating_duration_since(Instant::now())),
            );
            let c0 = cpu_clock::thread();
            sh.domain.maintain();
            maintain_cpu += cpu_clock::thread().saturating_sub(c0);
            s = sh.domain.stats();
            peak_cached = peak_cached.max(s.cached_iovas);
        }
        let now_ops = total(&sh);
        let cpu = worker_cpu(maintain_cpu);
        let now = Instant::now();
        let done = now_ops - last;
        let cpu_s = cpu.saturating_sub(last_cpu).as_secs_f64();
        work.push(WorkWindow {
            ops: done as f64,
            cpu_s,
        });
        let rate = done as f64 / now.duration_since(t0).as_secs_f64().max(1e-9);
        timeline.push(Window {
            t_s: now.duration_since(start).as_secs_f64(),
            iops: rate,
            mops: rate / 1e6,
            cpu_s,
            mops_per_cpu_s: 0.0,
            tree_nodes: s.tree_nodes,
            cached_iovas: s.cached_iovas,
            scan_steps_per_op: (s.scan_steps - last_steps) as f64 / done.max(1) as f64,
        });
        last = now_ops;
        last_cpu = cpu;
        last_steps = s.scan_steps;
        t0 = now;
    }
    sh.stop.store(true, Relaxed);
    for t in workers {
        join(t, "aging worker")?;
    }
    let s = sh.domain.stats();
    let first = timeline.first().map_or(0.0, |w| w.mops);
    let lastw = timeline.last().map_or(0.0, |w| w.mops);
    let series: Vec<f64> = timeline.iter().map(|w| w.iops).collect();
    let run = format!("iova-aging {}", policy.name());
    let (aging, rates) = AgingSummary::of(&run, &series, &work, window.as_secs_f64(), seconds)?;
    for (w, r) in timeline.iter_mut().zip(rates) {
        w.mops_per_cpu_s = r / 1e6;
    }
    Ok(PolicyResult {
        policy: policy.name().to_string(),
        aging,
        first_window_mops: first,
        last_window_mops: lastw,
        peak_tree_nodes: s.peak_tree_nodes,
        peak_cached_iovas: peak_cached,
        windows: timeline,
        scan_steps: s.scan_steps,
        magazines_freed: s.magazines_freed,
        cache_flushes: s.cache_flushes,
        failed_allocs: sh.failed.load(Relaxed),
    })
}

/// Runs the lab; `progress` hears of each policy as it finishes.
pub fn run(args: &AgingArgs, mut progress: impl FnMut(&str)) -> LabResult<Report> {
    let seconds = args
        .seconds
        .map_or(if args.quick { 8.0 } else { 60.0 }, Seconds::get);
    let mut out = Vec::new();
    for p in iova_policies(&args.policies) {
        let r = run_policy(p, args, seconds)?;
        progress(&format!(
            "{} retained {:.2} per CPU-s, {:.2} wall",
            r.policy, r.aging.retained, r.aging.retained_wall
        ));
        out.push(r);
    }
    let r = AgingReport {
        lab: "iova-aging",
        jobs: args.jobs.us(),
        irq_cpus: args.irq_cpus.us(),
        seconds,
        low_window_mib: args.low_window_mib.map(Ranged::get),
        policies: out,
    };
    Ok(report(&r, args))
}
