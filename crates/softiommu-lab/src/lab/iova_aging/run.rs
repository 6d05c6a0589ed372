//! The measurement: the jobs, their interrupt CPUs and flush queues, one run per IOVA policy.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use softiommu::iova::{IovaCpuCache, IovaDomain, IovaPolicy};

use crate::args::{iova_policies, Ranged, Seconds};
use crate::error::{join, LabResult};
use crate::metrics::aging::{AgingSummary, VsFresh, WorkWindow};
use crate::metrics::cpu_clock;
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
    /// Each OS thread's two arms: operations and CPU time, published at
    /// the end of each slice.
    pub(super) arms: Vec<CachePadded<ArmCounters>>,
    pub(super) failed: AtomicU64,
    pub(super) iodepth: usize,
    pub(super) slow_ppm: u64,
    pub(super) slow_hold: u64,
    /// The last frame of the first try (the low window's, or the domain's
    /// without `--low-window-mib`).
    pub(super) first_limit: u64,
    /// Builds a fresh domain of the run's policy (the control arm's).
    pub(super) fresh_domain: Box<dyn Fn() -> Arc<IovaDomain> + Send + Sync>,
}

/// One OS thread's two arms as the conductor reads them: operations and
/// nanoseconds of the thread's CPU clock spent in each arm's slices, the
/// fresh arm's counting only past its warm-up.
#[derive(Debug, Default)]
pub(super) struct ArmCounters {
    pub(super) aged_ops: AtomicU64,
    pub(super) aged_cpu_ns: AtomicU64,
    /// The aged slices paired with a fresh one (each right after it).
    pub(super) paired_ops: AtomicU64,
    pub(super) paired_cpu_ns: AtomicU64,
    pub(super) fresh_ops: AtomicU64,
    pub(super) fresh_cpu_ns: AtomicU64,
    /// Fresh domains built so far.
    pub(super) fresh_lives: AtomicU64,
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

/// Rounds (every job of the thread runs [`SLICE`] I/Os, then its
/// interrupt CPUs) in one slice of either arm: with twelve jobs on one
/// thread, ~3,000 I/Os, ~0.1-0.2 ms at the speeds measured here. Far
/// shorter than a scheduler tick (4 ms), so both arms see the same
/// co-runner, and long enough that the two clock reads per slice (system
/// calls of ~0.5 µs) are under 1 % of it.
pub(super) const ARM_ROUNDS: usize = 8;

/// A slice also ends when this much wall time has passed since it began
/// (looked at every [`CLOCK_EVERY`] steps of one job's [`SLICE`] I/Os): a
/// slow policy (the 2016 tree, ~0.5 M I/Os per CPU-second in a release
/// build, ~0.8 ms a round; a debug build is a hundred times slower) then
/// still alternates often, so each window holds many slices of both arms.
pub(super) const MAX_SLICE: Duration = Duration::from_micros(500);

/// Steps between looks at the clock in a slice (one job's [`SLICE`],
/// ~1 µs for ours; a look is a vDSO read of ~25 ns, paid alike by both
/// arms, so it moves neither arm's rate against the other's).
pub(super) const CLOCK_EVERY: usize = 1;

/// Aged slices per fresh slice: the aged allocator keeps four fifths of
/// the thread and ages at nearly the pace it would alone (its slow I/Os
/// are held for a count of its own I/Os, so an even share would put the
/// Linux trees' cliffs twice as late in the run). Only the aged slice
/// right after each fresh one is paired with it: both are then measured
/// the same way, one slice of the same length just after the other arm
/// had the caches (measured: a fresh slice a quarter as long as the aged
/// one, right after it, read 15-45 % slower than the aged arm and did
/// not follow the machine's speed as the aged arm did).
pub(super) const AGED_PER_FRESH: usize = 4;

/// A fresh arm's warm-up, not counted (its caches fill from the tree
/// first: a cold start, not the machine's speed): this many I/Os, or
/// [`FRESH_WARMUP_CPU`] of its CPU time, whichever comes first.
pub(super) const FRESH_WARMUP_OPS: u64 = 50_000;
/// See [`FRESH_WARMUP_OPS`].
pub(super) const FRESH_WARMUP_CPU: Duration = Duration::from_millis(4);

/// A fresh arm is replaced by a new one after this many I/Os, or
/// [`FRESH_LIFE_CPU`] of its CPU time, whichever comes first: several
/// lives fall in each window, and its age stays far below the aged arm's
/// (its slow I/Os, held 4,000,000 I/Os of their job, never complete).
/// Ours and the 2020 / 2023 trees (12-20 M I/Os per CPU-second here)
/// reach the count first, so their fresh arm's age does not depend on the
/// machine's speed; the 2016 tree (~0.5 M) reaches the CPU bound first.
pub(super) const FRESH_LIFE_OPS: u64 = 250_000;
/// See [`FRESH_LIFE_OPS`].
pub(super) const FRESH_LIFE_CPU: Duration = Duration::from_millis(20);

/// How often each arm's allocator background work runs on the thread
/// that hosts it (Linux runs its depot trim from a workqueue).
pub(super) const MAINTAIN_EVERY: Duration = Duration::from_millis(20);

/// One allocator and the logical CPUs that use it: the aged arm (the
/// run's domain) or a fresh one.
pub(super) struct Arm {
    pub(super) domain: Arc<IovaDomain>,
    pub(super) irqs: Vec<Irq>,
    pub(super) jobs: Vec<(usize, Job)>,
    pub(super) rounds: u64,
    /// The job whose step is next.
    pub(super) next: usize,
    pub(super) ops: u64,
    pub(super) last_maintain: Instant,
}

impl Arm {
    /// An arm on `domain` hosting `job_ids` (global ids: their seeds) and
    /// `n_irq` interrupt CPUs.
    pub(super) fn new(
        domain: Arc<IovaDomain>,
        job_ids: &[usize],
        n_irq: usize,
        iodepth: usize,
    ) -> Self {
        let irqs: Vec<Irq> = (0..n_irq.max(1))
            .map(|_| Irq {
                cache: domain.cpu_cache(),
                inbound: VecDeque::new(),
                fq: FlushQueue {
                    entries: Vec::with_capacity(FQ_SIZE),
                    oldest: None,
                },
            })
            .collect();
        let jobs = job_ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let job = Job {
                    cache: domain.cpu_cache(),
                    sizes: DMA_MIX.sequence(0xa9e + id as u64, 1 << 16),
                    inflight: VecDeque::with_capacity(iodepth),
                    slow: VecDeque::new(),
                    rng: crate::workload::Rng::new(0x51 + id as u64),
                    irq: i % irqs.len(),
                    ops: 0,
                };
                (id, job)
            })
            .collect();
        Self {
            domain,
            irqs,
            jobs,
            rounds: 0,
            next: 0,
            ops: 0,
            last_maintain: Instant::now(),
        }
    }

    /// One step of a round: the next job runs [`SLICE`] I/Os; after the
    /// last job, the interrupt CPUs take their completions (the round
    /// ends). With `publish`, the job's count goes to `sh.ops` (the aged
    /// arm's, for the wall-clock figure).
    pub(super) fn step(&mut self, sh: &Shared, publish: bool) {
        let limit = self.domain.end_pfn();
        let irqs = &mut self.irqs;
        let (id, job) = &mut self.jobs[self.next];
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
        self.ops += SLICE as u64;
        if publish {
            sh.ops[*id].store(job.ops, Relaxed);
        }
        self.next += 1;
        if self.next < self.jobs.len() {
            return;
        }
        self.next = 0;
        self.rounds += 1;
        let check_time = self.rounds.is_multiple_of(16);
        for irq in irqs.iter_mut() {
            while let Some(e) = irq.inbound.pop_front() {
                irq.fq.push(e, &mut irq.cache);
            }
            if check_time && irq.fq.oldest.is_some_and(|t| t.elapsed() >= FQ_TIMEOUT) {
                irq.fq.flush(&mut irq.cache);
            }
        }
    }

    /// One slice: [`ARM_ROUNDS`] rounds' worth of steps, or fewer when
    /// [`MAX_SLICE`] has passed (looked at every [`CLOCK_EVERY`] steps),
    /// at least one step.
    pub(super) fn slice(&mut self, sh: &Shared, publish: bool) {
        let until = Instant::now() + MAX_SLICE;
        for i in 1..=ARM_ROUNDS * self.jobs.len() {
            self.step(sh, publish);
            if i.is_multiple_of(CLOCK_EVERY) && Instant::now() >= until {
                break;
            }
        }
    }

    /// The allocator's background work when [`MAINTAIN_EVERY`] has passed.
    pub(super) fn maintain_if_due(&mut self) {
        if self.last_maintain.elapsed() >= MAINTAIN_EVERY {
            self.domain.maintain();
            self.last_maintain = Instant::now();
        }
    }

    /// Frees everything still held (the aged arm at the end; the domain
    /// checks each free).
    pub(super) fn drain(&mut self) {
        for (_, job) in &mut self.jobs {
            for (_, pfn, pages) in std::mem::take(&mut job.slow) {
                job.cache.free(pfn, pages).expect("freeing at the end");
            }
            for (pfn, pages) in job.inflight.drain(..) {
                job.cache.free(pfn, pages).expect("freeing at the end");
            }
        }
        for irq in &mut self.irqs {
            for e in std::mem::take(&mut irq.inbound) {
                irq.fq.push(e, &mut irq.cache);
            }
            irq.fq.flush(&mut irq.cache);
        }
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One OS thread (number `w`) hosting `jobs` (global ids) and the
/// interrupt CPUs that serve them, twice: on the run's aged domain and on
/// a fresh one of the same policy, in slices of [`ARM_ROUNDS`] rounds
/// (or [`MAX_SLICE`]),
/// one fresh slice per [`AGED_PER_FRESH`] aged ones, each slice timed on
/// the thread's CPU clock; the aged slice right after a fresh one is also
/// counted as its pair. The fresh arm counts past its warm-up
/// ([`FRESH_WARMUP_OPS`]) and is replaced, outside both arms' timing, at
/// the end of its life ([`FRESH_LIFE_OPS`]). Thread 0 runs the aged
/// domain's background work, inside an aged slice; each thread its
/// fresh domain's, inside a fresh slice.
pub(super) fn worker(sh: &Shared, w: usize, job_ids: Vec<usize>, n_irq: usize) {
    let c = &sh.arms[w];
    let mut aged = Arm::new(sh.domain.clone(), &job_ids, n_irq, sh.iodepth);
    let mut fresh = Arm::new((sh.fresh_domain)(), &job_ids, n_irq, sh.iodepth);
    c.fresh_lives.store(1, Relaxed);
    let (mut aged_ns, mut fresh_ns, mut fresh_ops) = (0u64, 0u64, 0u64);
    let (mut paired_ns, mut paired_ops) = (0u64, 0u64);
    // The fresh arm's CPU time in its present life, warm-up included.
    let mut life = Duration::ZERO;
    // Whether the next aged slice pairs with the fresh slice just run.
    let mut pair_next = false;
    let mut k = 0usize;
    let mut t = cpu_clock::thread();
    while !sh.stop.load(Relaxed) {
        let ops0 = aged.ops;
        aged.slice(sh, true);
        if w == 0 {
            aged.maintain_if_due();
        }
        let t1 = cpu_clock::thread();
        let spent = ns(t1.saturating_sub(t));
        aged_ns += spent;
        c.aged_ops.store(aged.ops, Relaxed);
        c.aged_cpu_ns.store(aged_ns, Relaxed);
        if std::mem::take(&mut pair_next) {
            paired_ns += spent;
            paired_ops += aged.ops - ops0;
            c.paired_ops.store(paired_ops, Relaxed);
            c.paired_cpu_ns.store(paired_ns, Relaxed);
        }
        t = t1;
        k += 1;
        if !k.is_multiple_of(AGED_PER_FRESH) {
            continue;
        }
        let counted = fresh.ops >= FRESH_WARMUP_OPS || life >= FRESH_WARMUP_CPU;
        let ops0 = fresh.ops;
        fresh.slice(sh, false);
        fresh.maintain_if_due();
        let t2 = cpu_clock::thread();
        let spent = t2.saturating_sub(t1);
        life += spent;
        if counted {
            fresh_ns += ns(spent);
            fresh_ops += fresh.ops - ops0;
            c.fresh_ops.store(fresh_ops, Relaxed);
            c.fresh_cpu_ns.store(fresh_ns, Relaxed);
            pair_next = true;
        }
        t = t2;
        if fresh.ops >= FRESH_LIFE_OPS || life >= FRESH_LIFE_CPU {
            // Renewed outside both arms' timing: the old one's caches
            // and domain are dropped, a new domain built.
            fresh = Arm::new((sh.fresh_domain)(), &job_ids, n_irq, sh.iodepth);
            life = Duration::ZERO;
            c.fresh_lives.fetch_add(1, Relaxed);
            t = cpu_clock::thread();
        }
    }
    aged.drain();
}

/// The low window in MiB: `--low-window-mib`, or Linux's 4 GiB.
pub(super) fn low_window_mib(args: &AgingArgs) -> u64 {
    args.low_window_mib.map_or(4096, Ranged::get)
}

/// How often the conductor looks at the workers' CPU time within a
/// window.
const POLL: Duration = Duration::from_millis(10);

/// A window ends at the latest after this many times its length in wall
/// time, however little CPU its workers got.
const WALL_CAP: u32 = 4;

/// The worker CPU time, in ns, of a window of `window` per thread.
pub(super) fn window_cpu_ns(window: Duration, threads: usize) -> u64 {
    u64::try_from(window.as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_mul(threads as u64)
}

/// Whether the arms' CPU time (aged, index 1, and fresh, index 3, of the
/// counters) went `budget` ns past `from`.
pub(super) fn window_done(from: &[u64; 6], now: &[u64; 6], budget: u64) -> bool {
    let cpu = |a: &[u64; 6]| a[1].saturating_add(a[3]);
    cpu(now).saturating_sub(cpu(from)) >= budget
}

pub(super) fn run_policy(
    policy: IovaPolicy,
    args: &AgingArgs,
    seconds: f64,
) -> LabResult<PolicyResult> {
    let jobs = args.jobs.us();
    let window_end = low_window_mib(args) << (20 - 12);
    let new_domain = move || IovaDomain::with_low_window(1, (1 << 36) - 1, window_end, policy);
    let domain = new_domain()?;
    // Checked once here: a fresh domain is built the same way.
    let fresh_domain: Box<dyn Fn() -> Arc<IovaDomain> + Send + Sync> =
        Box::new(move || new_domain().expect("built once already with these arguments"));
    let first_limit = if args.low_window_mib.is_some() {
        window_end - 1
    } else {
        domain.end_pfn()
    };
    let threads = args.threads.map_or(1, Ranged::us);
    let threads = threads.clamp(1, jobs);
    let sh = Arc::new(Shared {
        domain,
        first_limit,
        stop: AtomicBool::new(false),
        ops: (0..jobs)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
        arms: (0..threads)
            .map(|_| CachePadded::new(ArmCounters::default()))
            .collect(),
        failed: AtomicU64::new(0),
        iodepth: args.iodepth.us(),
        slow_ppm: (args.slow_pct.get() * 1e4) as u64,
        slow_hold: args.slow_hold.get(),
        fresh_domain,
    });
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
                worker(&sh, w, ids, n_irq)
            })
        })
        .collect();
    // Each arm's operations and CPU time, summed over the threads.
    let arms = |sh: &Shared| {
        let l = |f: fn(&ArmCounters) -> &AtomicU64| {
            sh.arms.iter().map(|a| f(a).load(Relaxed)).sum::<u64>()
        };
        [
            l(|a| &a.aged_ops),
            l(|a| &a.aged_cpu_ns),
            l(|a| &a.fresh_ops),
            l(|a| &a.fresh_cpu_ns),
            l(|a| &a.paired_ops),
            l(|a| &a.paired_cpu_ns),
        ]
    };
    let windows = args
        .windows
        .map_or(if args.quick { 32 } else { 60 }, Ranged::us);
    let window = Duration::from_secs_f64(seconds / windows as f64);
    let total = |sh: &Shared| sh.ops.iter().map(|c| c.load(Relaxed)).sum::<u64>();
    let mut timeline = Vec::with_capacity(windows);
    let mut peak_cached = 0u64;
    let mut last = total(&sh);
    let mut last_arms = arms(&sh);
    let mut work = Vec::with_capacity(windows);
    let mut fresh_work = Vec::with_capacity(windows);
    let mut paired_work = Vec::with_capacity(windows);
    let mut last_steps = 0u64;
    let mut t0 = Instant::now();
    let start = t0;
    // A window is CPU time of the worker threads (both arms' slices,
    // summed over the threads), not wall time: a co-runner that takes a
    // core stretches the window and leaves its work the same, so the
    // slow I/Os come back at the same point of the run and the Linux
    // trees' cliffs (tree walks: CPU work) show on a busy machine as on
    // a quiet one. A window whose workers got almost no CPU ends after
    // `WALL_CAP` times its length in wall time (the run is bounded).
    let budget = window_cpu_ns(window, threads);
    for _ in 0..windows {
        let cap = t0 + window * WALL_CAP;
        let from = last_arms;
        let s = loop {
            // A sample of what the caches hold (the background work runs
            // on the workers, inside the aged arm's timed slices).
            std::thread::sleep(POLL.min(cap.saturating_duration_since(Instant::now())));
            let s = sh.domain.stats();
            peak_cached = peak_cached.max(s.cached_iovas);
            if window_done(&from, &arms(&sh), budget) || Instant::now() >= cap {
                break s;
            }
        };
        let now_ops = total(&sh);
        let a = arms(&sh);
        let now = Instant::now();
        let done = now_ops - last;
        let d = |i: usize| a[i].saturating_sub(last_arms[i]) as f64;
        let (cpu_s, fresh_cpu_s) = (d(1) / 1e9, d(3) / 1e9);
        work.push(WorkWindow { ops: d(0), cpu_s });
        fresh_work.push(WorkWindow {
            ops: d(2),
            cpu_s: fresh_cpu_s,
        });
        paired_work.push(WorkWindow {
            ops: d(4),
            cpu_s: d(5) / 1e9,
        });
        let rate = done as f64 / now.duration_since(t0).as_secs_f64().max(1e-9);
        timeline.push(Window {
            t_s: now.duration_since(start).as_secs_f64(),
            iops: rate,
            mops: rate / 1e6,
            cpu_s,
            mops_per_cpu_s: 0.0,
            fresh_cpu_s,
            fresh_mops_per_cpu_s: 0.0,
            paired_mops_per_cpu_s: 0.0,
            vs_fresh: 0.0,
            tree_nodes: s.tree_nodes,
            cached_iovas: s.cached_iovas,
            scan_steps_per_op: (s.scan_steps - last_steps) as f64 / done.max(1) as f64,
        });
        last = now_ops;
        last_arms = a;
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
    // A policy so slow that its fresh arm ran in too few windows (a debug
    // build of the 2016 tree on a loaded machine) has no paired figure:
    // null, with the aged arm's own figures beside.
    let (vs_fresh, paired) =
        VsFresh::of_or_absent(&paired_work, &fresh_work, window.as_secs_f64(), seconds);
    for (i, w) in timeline.iter_mut().enumerate() {
        w.mops_per_cpu_s = rates[i] / 1e6;
        w.fresh_mops_per_cpu_s = paired.fresh[i] / 1e6;
        w.paired_mops_per_cpu_s = paired.aged[i] / 1e6;
        w.vs_fresh = paired.ratio[i];
    }
    Ok(PolicyResult {
        policy: policy.name().to_string(),
        aging,
        vs_fresh,
        fresh_lives: sh.arms.iter().map(|a| a.fresh_lives.load(Relaxed)).sum(),
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
            "{} retained {:.2} vs a fresh arm, {:.2} per CPU-s alone (the fresh arm alone {:.2}: the machine), {:.2} wall",
            r.policy,
            r.vs_fresh.retained_vs_fresh,
            r.aging.retained,
            r.vs_fresh.retained_fresh,
            r.aging.retained_wall
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
