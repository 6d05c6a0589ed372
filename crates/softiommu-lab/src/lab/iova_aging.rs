//! `softiommu lab iova-aging`: seed `004`'s experiment.
//!
//! Twelve jobs do storage-like I/O in deferred mode: each I/O allocates an
//! IOVA of a mixed size, keeps it while `--iodepth` later I/Os are issued,
//! then completes. Completions are handled by interrupt CPUs (`--irq-cpus`,
//! as a controller with fewer vectors than CPUs has): each puts the IOVA in
//! its flush queue (an array of 256, as Linux's) and frees the whole batch
//! into its own per-CPU cache when the queue is full or its oldest entry is
//! 10 ms old. So IOVAs are allocated on some CPUs and freed on others: the
//! caches and the depot fill, and the policies differ in what happens next.
//!
//! The jobs and interrupt CPUs are *logical* CPUs, each with its own
//! per-CPU cache, run in slices of 32 I/Os on `--threads` OS threads (one
//! by default), each thread hosting a share of the jobs and of the
//! interrupt CPUs that serve them. Sixteen OS threads on two cores would
//! spend their time in the scheduler; this way the time goes to the
//! allocator. One thread by default because the figure is about aging,
//! and two threads' throughput moves in phases the allocator does not
//! make: measured on the 2-vCPU machine this was built on, two threads
//! ran 62-82 M ops/s in phases of seconds (how much the shared lines
//! bounce between the cores), and two runs of one build disagreed by up
//! to 0.19 on `retained`; one thread ran flat at 42-43 M ops/s (three
//! runs: 1.011, 0.988, 0.992). `--threads 2` shares the allocator (tree,
//! depots, state map) between cores for real.
//!
//! # Aging on CPU time
//!
//! `retained` and `stability` are taken on I/Os per CPU-second of the
//! worker threads (each one's CPU clock, `pthread_getcpuclockid`, read by
//! the conductor at every window's end and summed, plus the CPU the
//! conductor spends in the allocator's background work, timed on its own
//! clock around each call): the allocator's work, so a co-runner taking
//! the core for part of a window lowers the I/Os and the CPU time alike.
//! A Linux tree's cliff is CPU work (walks of a grown tree), so it still
//! shows. The wall-clock figures stand beside them (`retained_wall`,
//! `stability_wall`); see `softiommu_virtio::workload::aging` for the
//! CPU floor below which a window is merged with its neighbours.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use serde::{Deserialize, Serialize};
use softiommu::iova::{IovaCpuCache, IovaDomain, IovaPolicy};

use crate::args::{iova_policies, IovaPolicyName, Percent, Ranged, Seconds};
use crate::error::{join, LabResult};
use crate::metrics::aging::{aging_columns, AgingSummary, WorkWindow};
use crate::metrics::cpu_clock::{self, ThreadClock};
use crate::metrics::pinning;
use crate::report::{contract, Axis, Column, Param, Plot, PlotKind, Report, Series, Table, Unit};
use crate::workload::DMA_MIX;

/// Flush-queue high-water mark: Linux's `IOVA_FQ_SIZE` is 256 (seed `000`
/// used 250).
const FQ_SIZE: usize = 256;
/// Flush-queue timeout: Linux's `IOVA_FQ_TIMEOUT`, 10 ms (seed `000`).
const FQ_TIMEOUT: Duration = Duration::from_millis(10);

/// Options of `lab iova-aging` (and of a `[lab-iova-aging]` scenario
/// table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgingArgs {
    /// A short run (under a minute for all policies) with the same shape.
    #[arg(long)]
    pub quick: bool,
    /// Seconds per policy (0.01..=86400; default 8 with --quick, else 60).
    #[arg(long)]
    pub seconds: Option<Seconds>,
    /// Windows in the time line (8..=1000; default 32 with --quick, else
    /// 60). The aging figure discards a warm-up of at least 1 s and needs
    /// four windows after it.
    #[arg(long)]
    pub windows: Option<Ranged<8, 1000>>,
    /// Jobs (threads), as fio's `numjobs` (1..=256).
    #[arg(long, default_value = "12")]
    pub jobs: Ranged<1, 256>,
    /// Interrupt CPUs: logical CPUs that free what the jobs complete (at
    /// least one per OS thread; 1..=256).
    #[arg(long, default_value = "4")]
    pub irq_cpus: Ranged<1, 256>,
    /// OS threads hosting the logical CPUs (1..=256; default 1: the
    /// figure is the allocator's aging, and on two cores the threads'
    /// throughput moves in phases of seconds with how much the shared
    /// lines bounce between them).
    #[arg(long)]
    pub threads: Option<Ranged<1, 256>>,
    /// I/Os in flight per job (1..=4096).
    #[arg(long, default_value = "32")]
    pub iodepth: Ranged<1, 4096>,
    /// Percent of I/Os that are slow, held `--slow-hold` I/Os of their job
    /// instead of `--iodepth`: a storage device's latency tail (0..=100).
    #[arg(long, default_value = "0.5")]
    pub slow_pct: Percent,
    /// How many of its job's I/Os a slow I/O stays in flight for
    /// (1..=1000000000). With the default 0.5 % this pins ~20,000 IOVAs
    /// per job, and the first slow I/Os complete ~1-2 s into a run: the
    /// Linux 2020 and 2023 trees' cliff comes after the warm-up floor,
    /// where the figure sees it.
    #[arg(long, default_value = "4000000")]
    pub slow_hold: Ranged<1, 1_000_000_000>,
    /// Allocate in the low N MiB of IOVA space first and above it only
    /// when it is full, as Linux's DMA layer does for a PCI device with
    /// N = 4096 (1..=4096; default: no low window, every allocation at
    /// the domain's limit, as the allocator is called by a driver that
    /// asks for its whole mask).
    #[arg(long)]
    pub low_window_mib: Option<Ranged<1, 4096>>,
    /// Policies to run (default: all, baselines first).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<IovaPolicyName>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for AgingArgs {
    fn default() -> Self {
        Self {
            quick: false,
            seconds: None,
            windows: None,
            jobs: Ranged::new(12),
            irq_cpus: Ranged::new(4),
            threads: None,
            iodepth: Ranged::new(32),
            slow_pct: Percent::new(0.5),
            slow_hold: Ranged::new(4_000_000),
            low_window_mib: None,
            policies: Vec::new(),
            json: false,
        }
    }
}

/// One policy's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    /// Policy name.
    pub policy: String,
    /// The aging figure, as `lab fio-aging` reports it.
    #[serde(flatten)]
    pub aging: AgingSummary,
    /// Throughput of the first window, million I/Os per second (wall
    /// clock; cold).
    pub first_window_mops: f64,
    /// Throughput of the last window.
    pub last_window_mops: f64,
    /// Most nodes ever in the range allocator's tree.
    pub peak_tree_nodes: u64,
    /// Most IOVAs ever sampled in caches and depots.
    pub peak_cached_iovas: u64,
    /// The time line, window by window.
    pub windows: Vec<Window>,
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
    /// MiB of the low window allocated in first (null: none).
    pub low_window_mib: Option<u64>,
    /// One entry per policy.
    pub policies: Vec<PolicyResult>,
}

struct Shared {
    domain: Arc<IovaDomain>,
    stop: AtomicBool,
    ops: Vec<CachePadded<AtomicU64>>,
    failed: AtomicU64,
    iodepth: usize,
    slow_ppm: u64,
    slow_hold: u64,
    /// The last frame of the first try (the low window's, or the domain's
    /// without `--low-window-mib`).
    first_limit: u64,
}

/// An interrupt CPU's flush queue: a fixed array filled then freed as one batch.
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
        cache
            .free_all(&self.entries)
            .expect("freeing IOVAs this lab allocated");
        self.entries.clear();
        self.oldest = None;
    }
}

/// A logical job CPU.
struct Job {
    cache: IovaCpuCache,
    sizes: Vec<u64>,
    inflight: VecDeque<(u64, u64)>,
    /// Slow I/Os: (the op count at which it completes, pfn, pages).
    slow: VecDeque<(u64, u64, u64)>,
    rng: crate::workload::Rng,
    irq: usize,
    ops: u64,
}

/// A logical interrupt CPU.
struct Irq {
    cache: IovaCpuCache,
    inbound: VecDeque<(u64, u64)>,
    fq: FlushQueue,
}

/// I/Os a logical CPU runs before the next one gets the thread.
const SLICE: usize = 32;

/// One OS thread hosting `jobs` (global ids) and the interrupt CPUs that
/// serve them.
fn worker(sh: &Shared, job_ids: Vec<usize>, n_irq: usize) {
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

/// One window of the time line.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// Seconds since the run started, at the window's end.
    pub t_s: f64,
    /// I/Os per second (wall clock) in this window.
    pub iops: f64,
    /// Million I/Os per second (wall clock) in this window.
    pub mops: f64,
    /// CPU seconds the workers (and the allocator's background work) used
    /// in this window.
    pub cpu_s: f64,
    /// Million I/Os per CPU-second in this window, as the aging figure
    /// takes it (windows below the CPU floor carry their merged group's
    /// rate).
    pub mops_per_cpu_s: f64,
    /// Tree nodes at the end of the window.
    pub tree_nodes: u64,
    /// IOVAs in caches and depots at the end of the window.
    pub cached_iovas: u64,
    /// Linear-search steps per I/O in this window (Linux baselines).
    pub scan_steps_per_op: f64,
}

/// The low window in MiB: `--low-window-mib`, or Linux's 4 GiB.
fn low_window_mib(args: &AgingArgs) -> u64 {
    args.low_window_mib.map_or(4096, Ranged::get)
}

fn run_policy(policy: IovaPolicy, args: &AgingArgs, seconds: f64) -> LabResult<PolicyResult> {
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

/// The typed report: the summary, the time line (fio style) and its plot.
fn report(rep: &AgingReport, args: &AgingArgs) -> Report {
    let mut t = Table::new(
        "summary",
        format!(
            "{} jobs, {} interrupt CPUs, {:.0} s per policy: warm-up discarded, medians of the first and last quarter; retained and stability per worker CPU-second, wall beside",
            rep.jobs, rep.irq_cpus, rep.seconds
        ),
        [Column::label("policy")]
            .into_iter()
            .chain(aging_columns(Unit::MopsPerS, 3))
            .chain([
            Column::metric("peak_tree_nodes", "peak tree nodes", Unit::Count, 0),
            Column::metric("peak_cached_iovas", "peak cached", Unit::Count, 0),
            Column::metric("scan_steps", "scan steps", Unit::Count, 0),
            Column::metric("magazines_freed", "mags freed", Unit::Count, 0),
            Column::metric("cache_flushes", "flushes", Unit::Count, 0),
            ])
            .collect(),
    );
    let mut tl = Table::new(
        "timeline",
        "the time line, window by window (fio's status line)",
        vec![
            Column::label("policy"),
            Column::label("window"),
            Column::metric("mops", "throughput (wall)", Unit::MopsPerS, 3),
            Column::metric("cpu_s", "worker CPU", Unit::S, 3),
            Column::metric("mops_per_cpu_s", "per CPU-s", Unit::MopsPerS, 3),
            Column::metric("tree_nodes", "tree nodes", Unit::Count, 0),
            Column::metric("cached_iovas", "cached", Unit::Count, 0),
            Column::metric("scan_steps_per_op", "scan", Unit::StepsPerOp, 1),
        ],
    );
    let window_s = rep.seconds / rep.policies.first().map_or(1, |p| p.windows.len()) as f64;
    let mut lines = Vec::new();
    let mut cpu_lines = Vec::new();
    for r in &rep.policies {
        t.row(
            [r.policy.clone().into()]
                .into_iter()
                .chain(r.aging.cells(1e6))
                .chain([
                    r.peak_tree_nodes.into(),
                    r.peak_cached_iovas.into(),
                    r.scan_steps.into(),
                    r.magazines_freed.into(),
                    r.cache_flushes.into(),
                ])
                .collect(),
        );
        for (i, w) in r.windows.iter().enumerate() {
            tl.row(vec![
                r.policy.clone().into(),
                (i + 1).to_string().into(),
                w.mops.into(),
                w.cpu_s.into(),
                w.mops_per_cpu_s.into(),
                w.tree_nodes.into(),
                w.cached_iovas.into(),
                w.scan_steps_per_op.into(),
            ]);
        }
        lines.push(Series::new(
            r.policy.clone(),
            r.windows
                .iter()
                .enumerate()
                .map(|(i, w)| ((i + 1) as f64 * window_s, w.mops))
                .collect(),
        ));
        cpu_lines.push(Series::new(
            r.policy.clone(),
            r.windows
                .iter()
                .enumerate()
                .map(|(i, w)| ((i + 1) as f64 * window_s, w.mops_per_cpu_s))
                .collect(),
        ));
    }
    let mut out = Report::new(
        "lab iova-aging",
        "IOVA cache growth over a long storage run, per allocator policy (seed 004)",
        contract(rep),
    )
    .seed("004");
    out.params = vec![
        Param::new("jobs", rep.jobs, Unit::Threads),
        Param::new("irq_cpus", rep.irq_cpus, Unit::Threads),
        Param::new("seconds", rep.seconds, Unit::S),
        Param::new("iodepth", args.iodepth, Unit::Count),
        Param::new("slow_pct", args.slow_pct, Unit::Percent),
        Param::new("slow_hold", args.slow_hold, Unit::Count),
    ];
    out.tables.push(t);
    tl.detail = true;
    out.tables.push(tl);
    out.plots.push(Plot {
        name: "throughput".into(),
        title: "wall-clock throughput over time per IOVA policy (a cliff is the seed's bug)".into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("throughput", Unit::MopsPerS),
        categories: Vec::new(),
        series: lines,
        modelled: false,
    });
    out.plots.push(Plot {
        name: "throughput_per_cpu_s".into(),
        title: "I/Os per worker CPU-second over time per IOVA policy (the aging figure's input)"
            .into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("M I/Os per CPU-second", Unit::MopsPerS),
        categories: Vec::new(),
        series: cpu_lines,
        modelled: false,
    });
    out.notes.push(
        "retained and stability are taken on I/Os per CPU-second of the worker threads (their \
         thread CPU clocks summed per window, with the allocator's background work), so a \
         co-runner taking the core is not aging; a window with under a quarter of the run's \
         median CPU time is merged with its neighbours. The wall-clock figures stand beside \
         them (retained_wall, stability_wall)."
            .into(),
    );
    out
}
