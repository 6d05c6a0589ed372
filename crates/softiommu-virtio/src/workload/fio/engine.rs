//! The fio-like engine: jobs on their queues, hosted by a few OS threads,
//! completions on the jobs' own DMA handles or on interrupt CPUs, a
//! conductor that samples the counters once per window.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use softiommu::dma::{DmaCpu, DmaDomain};

use super::config::{FioConfig, FioError, RwMode};
use super::fresh::{FreshArm, FreshSpec};
use super::result::{FioJobResult, FioResult, FioWindow};
use super::sample::{account_passes, Call, SampledWork, Sampler, WorkTotals};
use crate::blk::{
    BlkDriverConfig, BlkHost, BlkHostConfig, BlkOp, BlkQueue, SlowRegion, MAX_DRIVER_REQUEST,
};
use crate::cpu_clock;
use crate::spec::blk::SECTOR_SIZE;

/// How often the conductor runs the allocator's background work: Linux's
/// IOVA depot trim runs from delayed work about every 100 ms
/// (`IOVA_DEPOT_DELAY`, drivers/iommu/iova.c, 2023).
const MAINTAIN_EVERY: Duration = Duration::from_millis(100);

/// A job's counters: written by its hosting thread (plain stores), read
/// by the conductor.
#[derive(Debug, Default)]
pub(super) struct Counters {
    ops: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    verified: AtomicU64,
    verify_failures: AtomicU64,
    slow: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// A small fast PRNG (xorshift64*): the draw must not be what is measured.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Block sizes pre-drawn per job.
const SIZES: usize = 4096;
/// The size of every slow I/O.
const SLOW_BS: u64 = 4096;

/// One job: its queue and its stream.
pub(super) struct Job {
    pub(super) q: BlkQueue,
    c: Arc<CachePadded<Counters>>,
    rng: Rng,
    sizes: Vec<u64>,
    k: usize,
    /// Index of its interrupt CPU on the thread (`None`: its own handle).
    irq: Option<usize>,
    fast: usize,
    slow: usize,
    slow_slot: Vec<bool>,
    reads: u32,
    /// Slow I/Os sent so far (against a rate-based budget).
    slow_sent: u64,
    /// Slow I/Os the rate earned but could not send, written off.
    slow_forgiven: u64,
    /// Fast I/Os sent so far (a rate-based tail's share is bounded by it).
    fast_sent: u64,
    /// Fast I/Os a paced job's rate earned but could not send (beyond
    /// its depth), written off.
    fast_forgiven: u64,
}

/// A rate-based slow tail sends at most one slow request per this many
/// fast ones (25 % of requests): a machine too slow for the rate gets a
/// thinner tail, never a starved fast path (measured: an unoptimised
/// build at ~2,000 slow requests a second per job completed no fast
/// request at all after the first second).
const FAST_PER_SLOW: u64 = 3;

/// What every job thread reads.
pub(super) struct Plan {
    pub(super) iodepth: usize,
    pub(super) rw: RwMode,
    pub(super) fast_end: u64,
    pub(super) slow: Option<(u64, u64, u64, usize)>,
    /// Slow I/Os per second per job, instead of the percentage.
    pub(super) slow_per_s: Option<f64>,
    /// Fast I/Os per second per job at most (`FioConfig::rate_iops`).
    pub(super) fast_per_s: Option<f64>,
    /// When the jobs started (the rate's clock).
    pub(super) start: Instant,
    /// Slow I/Os are of the mix, in shared pages (their data unchecked).
    pub(super) slow_mixed: bool,
    pub(super) verify_every: u32,
    pub(super) verify: bool,
    pub(super) sample_work: bool,
    pub(super) stop: AtomicBool,
}

impl Job {
    /// Job `i` of a run seeded `seed`, on queue `q`, drawing sizes from
    /// `bs`, completing on interrupt CPU `irq` of its thread (`None`: its
    /// own handle).
    pub(super) fn new(
        q: BlkQueue,
        c: Arc<CachePadded<Counters>>,
        seed: u64,
        i: usize,
        bs: &super::config::BlockSizes,
        irq: Option<usize>,
    ) -> Self {
        let mut rng = Rng::new(seed ^ (i as u64).wrapping_mul(0x1000_0000_01b3));
        let sizes = (0..SIZES).map(|_| bs.pick(rng.below(100) as u32)).collect();
        Self {
            slow_slot: vec![false; usize::from(q.depth())],
            q,
            c,
            rng,
            sizes,
            k: 0,
            irq,
            fast: 0,
            slow: 0,
            reads: 0,
            slow_sent: 0,
            slow_forgiven: 0,
            fast_sent: 0,
            fast_forgiven: 0,
        }
    }

    /// Takes completions; returns how many.
    pub(super) fn reap(&mut self, irqs: &mut [DmaCpu], p: &Plan) -> Result<usize, FioError> {
        let irq = self.irq.and_then(|i| irqs.get_mut(i));
        let c = &self.c;
        let (fast, slow, slot_slow, reads) = (
            &mut self.fast,
            &mut self.slow,
            &mut self.slow_slot,
            &mut self.reads,
        );
        let n = self.q.reap(irq, |done, data| {
            let was_slow = slot_slow
                .get_mut(usize::from(done.slot))
                .is_some_and(std::mem::take);
            if was_slow {
                *slow = slow.saturating_sub(1);
            } else {
                *fast = fast.saturating_sub(1);
            }
            if !done.is_ok() {
                bump(&c.errors, 1);
                return;
            }
            bump(&c.ops, 1);
            bump(&c.bytes, done.len);
            match done.op {
                BlkOp::Read => {
                    bump(&c.reads, 1);
                    *reads = reads.wrapping_add(1);
                    // A slow read in shared pages may hold another's data.
                    let checkable = !(was_slow && p.slow_mixed);
                    if checkable && p.verify && p.verify_every > 0 && *reads % p.verify_every == 0 {
                        bump(&c.verified, 1);
                        let bad = data
                            .pattern_mismatch(done.sector * SECTOR_SIZE)
                            .map_or(true, |m| m.is_some());
                        if bad {
                            bump(&c.verify_failures, 1);
                        }
                    }
                }
                BlkOp::Write => bump(&c.writes, 1),
                BlkOp::Flush | BlkOp::GetId => {}
            }
        })?;
        Ok(n)
    }

    /// Whether [`fill`](Self::fill) may find room for a request.
    fn has_room(&self, p: &Plan) -> bool {
        self.fast < p.iodepth || p.slow.is_some_and(|(_, _, _, depth)| self.slow < depth)
    }

    /// Fills the queue up to its depth (and slow budget), then rings the
    /// doorbell; returns how many were submitted. With a sampler, the
    /// filling (not the doorbell) is one of its calls.
    pub(super) fn submit(
        &mut self,
        p: &Plan,
        sampler: Option<&mut Sampler>,
    ) -> Result<usize, FioError> {
        let n = match sampler {
            Some(s) if self.has_room(p) => s.run(Call::Submit, || self.fill(p))?,
            _ => self.fill(p)?,
        };
        self.q.commit();
        Ok(n)
    }

    /// Builds and posts requests up to the depth (and slow budget);
    /// returns how many.
    fn fill(&mut self, p: &Plan) -> Result<usize, FioError> {
        let mut n = 0;
        // A rate-based tail: what the clock has earned and not been sent
        // (one clock read per call, not per I/O). What could not be sent
        // (the depth or the share was spent) is written off past one
        // depth's worth, so it never comes as a burst; `slow_sent` stays
        // the true count the share is checked against.
        let mut earned = p.slow_per_s.map(|r| {
            let due = (p.start.elapsed().as_secs_f64() * r) as u64;
            let cap = p.slow.map_or(0, |(_, _, _, depth)| depth as u64);
            let backlog = due.saturating_sub(self.slow_sent + self.slow_forgiven);
            self.slow_forgiven += backlog.saturating_sub(cap);
            backlog.min(cap)
        });
        // A paced job: the fast I/Os the clock has earned, at most a
        // depth's worth (what was earned and not sent beyond that is
        // written off, so a stall never comes back as a burst).
        let mut fast_earned = p.fast_per_s.map(|r| {
            let due = (p.start.elapsed().as_secs_f64() * r) as u64;
            let backlog = due.saturating_sub(self.fast_sent + self.fast_forgiven);
            self.fast_forgiven += backlog.saturating_sub(p.iodepth as u64);
            backlog.min(p.iodepth as u64)
        });
        loop {
            let slow_pick = p.slow.is_some_and(|(_, _, ppm, depth)| {
                self.slow < depth
                    && match earned {
                        Some(e) => e > 0 && self.slow_sent * FAST_PER_SLOW <= self.fast_sent,
                        None => self.rng.below(1_000_000) < ppm,
                    }
            });
            if !slow_pick && (self.fast >= p.iodepth || fast_earned == Some(0)) {
                break;
            }
            // A slow I/O is one 4 KiB block in a one-page slot, or a block
            // of the mix in a slot sharing the queue's slow pages.
            let mixed = p.slow_mixed;
            let size = if slow_pick && !mixed {
                SLOW_BS
            } else {
                self.sizes[self.k]
            };
            let (lo, hi) = match (slow_pick, p.slow) {
                (true, Some((lo, hi, _, _))) => (lo, hi),
                _ => (0, p.fast_end),
            };
            let blocks = (hi - lo) / size;
            let offset = lo + self.rng.below(blocks.max(1)) * size;
            let op = match p.rw {
                RwMode::RandRead => BlkOp::Read,
                RwMode::RandWrite => BlkOp::Write,
                RwMode::RandRw { read_pct } => {
                    if self.rng.below(100) < u64::from(read_pct) {
                        BlkOp::Read
                    } else {
                        BlkOp::Write
                    }
                }
            };
            let sector = offset / SECTOR_SIZE;
            let slot = if slow_pick {
                self.q.submit_small(op, sector, size, None)?
            } else {
                self.q.submit(op, sector, size, None)?
            };
            let Some(slot) = slot else {
                break;
            };
            if !slow_pick || mixed {
                self.k = (self.k + 1) % SIZES;
            }
            if slow_pick {
                self.slow += 1;
                self.slow_sent += 1;
                if let Some(e) = earned.as_mut() {
                    *e -= 1;
                }
                bump(&self.c.slow, 1);
                if let Some(s) = self.slow_slot.get_mut(usize::from(slot)) {
                    *s = true;
                }
            } else {
                self.fast += 1;
                self.fast_sent += 1;
                if let Some(e) = fast_earned.as_mut() {
                    *e -= 1;
                }
            }
            n += 1;
        }
        Ok(n)
    }
}

/// One OS thread: its jobs and interrupt CPUs, until the stop flag, then a
/// drain of the fast I/Os. Returns the jobs' queues and the thread's CPU
/// time over the measured run. With `p.sample_work`, one submitting or
/// reaping call in [`SAMPLE_EVERY`](super::sample::SAMPLE_EVERY) (every one) is timed
/// into `work` (see [`super::sample`]).
fn host_thread(
    mut jobs: Vec<Job>,
    irq_cpus: usize,
    domain: Arc<DmaDomain>,
    p: Arc<Plan>,
    work: Arc<CachePadded<SampledWork>>,
    mut fresh: Option<FreshArm>,
) -> Result<(Vec<BlkQueue>, Duration), FioError> {
    let mut irqs: Vec<DmaCpu> = (0..irq_cpus).map(|_| domain.cpu()).collect();
    for j in &jobs {
        j.q.bind_interrupt();
    }
    let mut sampler = p.sample_work.then(|| Sampler::new(work));
    let cpu0 = cpu_clock::thread();
    let mut cpu_end = None;
    let drain_until = |t: Instant| t + Duration::from_secs(2);
    let mut deadline = None;
    loop {
        let stopping = p.stop.load(Ordering::Acquire);
        if stopping && cpu_end.is_none() {
            cpu_end = Some(cpu_clock::thread());
            deadline = Some(drain_until(Instant::now()));
        }
        let mut progress = 0;
        for j in &mut jobs {
            progress += match sampler.as_mut() {
                Some(s) if !stopping && j.q.has_completions() => {
                    s.run(Call::Reap, || j.reap(&mut irqs, &p))?
                }
                _ => j.reap(&mut irqs, &p)?,
            };
            if !stopping {
                progress += j.submit(&p, sampler.as_mut())?;
            }
        }
        if let Some(f) = fresh.as_mut().filter(|_| !stopping) {
            progress += f.step()?;
        }
        if stopping
            && (jobs.iter().all(|j| j.fast == 0) || deadline.is_some_and(|d| Instant::now() > d))
        {
            break;
        }
        if progress == 0 {
            // Idle: ask for interrupts, look once more, sleep.
            // Every queue is armed (no short circuit) before the look.
            let mut waiting = false;
            for j in &mut jobs {
                waiting |= j.q.arm_interrupt();
            }
            if let Some(f) = fresh.as_mut() {
                waiting |= f.arm();
            }
            if !waiting {
                std::thread::park_timeout(Duration::from_millis(2));
            }
            for j in &mut jobs {
                j.q.disarm_interrupt();
            }
            if let Some(f) = fresh.as_mut() {
                f.disarm();
            }
            if let Some(j) = jobs.first() {
                j.q.check_device()?;
            }
        }
    }
    let cpu = cpu_end
        .unwrap_or_else(cpu_clock::thread)
        .saturating_sub(cpu0);
    // The fresh device is reset and dropped on the thread that drove it.
    drop(fresh);
    Ok((jobs.into_iter().map(|j| j.q).collect(), cpu))
}

/// `host` with its device sized for `cfg`: a queue per job, rings for the
/// jobs' slots, segments for the largest block (never fewer than `host`
/// asks for).
pub fn sized_for(host: &BlkHostConfig, cfg: &FioConfig) -> BlkHostConfig {
    let mut h = host.clone();
    // Memory for every slot's pages (full-size fast slots, one-page slow
    // ones) and the rings, with room to spare.
    let fast = (cfg.jobs * cfg.iodepth) as u64 * cfg.bs.max().next_multiple_of(4096);
    let slow = match cfg.slow {
        Some(s) if s.mixed => cfg.jobs as u64 * cfg.bs.max().next_multiple_of(4096),
        Some(s) => (cfg.jobs * s.depth) as u64 * 4096,
        None => 0,
    };
    h.mem_bytes = h.mem_bytes.max((fast + slow) * 5 / 4 + (256 << 20));
    let b = &mut h.device.blk;
    b.num_queues = b.num_queues.max(cfg.jobs as u16);
    let size = (3 * cfg.slots()).next_power_of_two().clamp(4, 32768) as u16;
    b.queue_max = b.queue_max.max(size);
    b.seg_max = b
        .seg_max
        .max((cfg.bs.max().div_ceil(4096)) as u32)
        .min(4096);
    // As many segments of `size_max` as the device announces must fit its
    // buffer (`BlkConfig::check`): more segments, shorter ones.
    let fits = crate::blk::MAX_REQUEST_BYTES / u64::from(b.seg_max);
    b.size_max = b.size_max.min(u32::try_from(fits).unwrap_or(u32::MAX));
    h
}

/// Builds a host from `host` (its queues raised to the jobs, its slow
/// region set from `cfg.slow` over the upper half of the disk) and runs
/// `cfg` on it.
pub fn run_fio(host: &BlkHostConfig, cfg: &FioConfig) -> Result<FioResult, FioError> {
    cfg.check()?;
    let mut h = sized_for(host, cfg);
    let fresh = cfg.fresh_arm.then(|| FreshSpec::of(host, cfg));
    if let Some(s) = cfg.slow {
        let cap = crate::blk::BackendConfig::open(&h.device.backend)
            .map_err(|e| FioError::Host(crate::blk::BlkDeviceError::from(e).into()))?
            .capacity();
        h.device.slow = Some(SlowRegion {
            from_sector: cap / 2 / SECTOR_SIZE,
            hold: s.hold,
            bytes_per_sec: 0,
        });
    }
    let host = BlkHost::new(&h)?;
    run(&host, cfg, fresh)
}

/// Runs `cfg` on `host`'s device: probes a driver with one queue per job,
/// runs, resets the device and gives every queue's memory back. A fresh
/// arm ([`FioConfig::fresh_arm`]) needs a host it can build again: it
/// runs under [`run_fio`] only, not here.
pub fn fio(host: &BlkHost, cfg: &FioConfig) -> Result<FioResult, FioError> {
    run(host, cfg, None)
}

fn run(host: &BlkHost, cfg: &FioConfig, fresh: Option<FreshSpec>) -> Result<FioResult, FioError> {
    cfg.check()?;
    if cfg.sample_work {
        account_passes(host);
    }
    let slots = cfg.slots();
    let queue_size = (3 * slots).next_power_of_two().clamp(4, 32768) as u16;
    let max_req = cfg.bs.max().next_multiple_of(4096);
    if max_req > MAX_DRIVER_REQUEST {
        return Err(FioError::BlockSize {
            bytes: cfg.bs.max(),
            max: MAX_DRIVER_REQUEST,
        });
    }
    let mut drv = host.driver(BlkDriverConfig {
        queues: cfg.jobs as u16,
        queue_size,
        depth: cfg.iodepth as u16,
        small_slots: cfg.slow.map_or(0, |s| s.depth as u16),
        shared_small: cfg.slow.is_some_and(|s| s.mixed),
        max_request_bytes: max_req,
    })?;
    let g = drv.geometry();
    let fail = |drv: &crate::blk::BlkDriver, e: FioError| {
        drv.reset();
        Err(e)
    };
    if usize::from(drv.queue_count()) < cfg.jobs {
        let queues = drv.queue_count();
        return fail(
            &drv,
            FioError::NotEnoughQueues {
                jobs: cfg.jobs,
                queues,
            },
        );
    }
    for &(bytes, _) in cfg.bs.entries() {
        if !bytes.is_multiple_of(u64::from(g.blk_size)) {
            return fail(
                &drv,
                FioError::DeviceBlockSize {
                    bytes,
                    blk_size: g.blk_size,
                    max: max_req,
                },
            );
        }
    }
    let cap = g.capacity_bytes();
    let slow_region = host.device.slow_region();
    let fast_end = match (cfg.slow, slow_region) {
        (Some(_), Some(r)) => r.from_sector.saturating_mul(SECTOR_SIZE).min(cap),
        _ => cap,
    };
    // Room for a few of the largest blocks in each region.
    let needed = 4 * cfg.bs.max() * if cfg.slow.is_some() { 2 } else { 1 };
    if fast_end < 4 * cfg.bs.max() || cap < needed {
        return fail(
            &drv,
            FioError::DiskTooSmall {
                capacity: cap,
                needed,
            },
        );
    }
    if cfg.slow.is_some() && slow_region.is_none() {
        return fail(
            &drv,
            FioError::OutOfRange {
                field: "slow (the device has no slow region)",
                value: 1.0,
                min: 0.0,
                max: 0.0,
            },
        );
    }
    if let Some(t) = cfg.flush_timeout {
        // In range (`check`); a refusal is the domain's own.
        if let Err(e) = host.domain.set_timeout(t) {
            return fail(&drv, FioError::Host(e.into()));
        }
    }
    let plan = Arc::new(Plan {
        iodepth: cfg.iodepth,
        rw: cfg.rw,
        fast_end,
        slow: cfg
            .slow
            .map(|s| (fast_end, cap, (s.pct * 1e4).round() as u64, s.depth)),
        slow_per_s: cfg.slow.and_then(|s| s.per_s),
        fast_per_s: cfg.rate_iops,
        start: Instant::now(),
        slow_mixed: cfg.slow.is_some_and(|s| s.mixed),
        verify_every: cfg.verify_every,
        verify: host.device.backend().kind() == "null",
        sample_work: cfg.sample_work,
        stop: AtomicBool::new(false),
    });
    let threads = cfg
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .clamp(1, cfg.jobs);
    let irq_total = cfg.irq_cpus.map_or(0, |n| n.max(threads));
    let counters: Vec<Arc<CachePadded<Counters>>> = (0..cfg.jobs)
        .map(|_| Arc::new(CachePadded::new(Counters::default())))
        .collect();
    let mut per_thread: Vec<Vec<Job>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, q) in drv.take_queues().into_iter().enumerate().take(cfg.jobs) {
        let t = i % threads;
        let local = per_thread[t].len();
        let n_irq = (t..irq_total).step_by(threads).count();
        let irq = (n_irq > 0).then(|| local % n_irq);
        per_thread[t].push(Job::new(q, counters[i].clone(), cfg.seed, i, &cfg.bs, irq));
    }
    let dev_cpu0 = host.device.cpu_time();
    // The DMA domain's flush timer frees on the job threads' behalf: its
    // CPU is the driver side's (a timer the kernel gives no clock for
    // counts zero).
    let timer_cpu = || host.domain.timer_cpu_time().unwrap_or_default();
    let timer0 = timer_cpu();
    let mut maintain_cpu = Duration::ZERO;
    let work: Vec<Arc<CachePadded<SampledWork>>> = (0..threads)
        .map(|_| Arc::new(CachePadded::new(SampledWork::default())))
        .collect();
    let fresh = fresh.map(Arc::new);
    let fresh_work: Vec<Arc<CachePadded<SampledWork>>> = (0..threads)
        .map(|_| Arc::new(CachePadded::new(SampledWork::default())))
        .collect();
    let handles: Vec<_> = per_thread
        .into_iter()
        .enumerate()
        .map(|(t, jobs)| {
            let (domain, p) = (host.domain.clone(), plan.clone());
            let n_irq = (t..irq_total).step_by(threads).count();
            let work = work[t].clone();
            let fresh = fresh.clone().map(|spec| {
                let seed = cfg.seed ^ 0xf8e5 ^ (t as u64) << 32;
                FreshArm::new(spec, jobs.len(), n_irq, seed, fresh_work[t].clone())
            });
            std::thread::Builder::new()
                .name(format!("fio t{t}"))
                .spawn(move || host_thread(jobs, n_irq, domain, p, work, fresh))
        })
        .collect();
    // The conductor: one sample per window, and the allocator's
    // background work between samples.
    let total = |c: &[Arc<CachePadded<Counters>>]| {
        let s = |f: fn(&Counters) -> &AtomicU64| {
            c.iter().map(|x| f(x).load(Ordering::Relaxed)).sum::<u64>()
        };
        (
            s(|x| &x.ops),
            s(|x| &x.bytes),
            s(|x| &x.reads),
            s(|x| &x.writes),
            s(|x| &x.errors),
        )
    };
    let n_windows = (cfg.runtime.as_secs_f64() / cfg.window.as_secs_f64()).ceil() as usize;
    let mut windows = Vec::with_capacity(n_windows);
    let t0 = Instant::now();
    let mut last = total(&counters);
    // The driver side's work, window by window (with `sample_work`): the
    // requests completed × the sampled CPU per request (submission with
    // `map_sg`, completion with `unmap_sg` and the flush queue's frees),
    // the flush timer's CPU and the allocator's background work the
    // conductor runs (timed on its own clock around each call). The
    // device threads stand for hardware and are not in it.
    let mut last_work = WorkTotals::read(&work);
    let mut last_fresh = WorkTotals::read(&fresh_work);
    let mut last_timer = timer0;
    let mut last_maintain_cpu = maintain_cpu;
    let mut last_t = t0;
    let mut last_maintain = t0;
    let mut last_iova = host.domain.iova_stats();
    let mut last_tables = host.domain.table_stats();
    let spawn_failed = handles.iter().any(|h| h.is_err());
    for w in 0..n_windows {
        if spawn_failed {
            break;
        }
        let end = t0 + cfg.window * (w as u32 + 1);
        while let Some(d) = end.checked_duration_since(Instant::now()) {
            if handles
                .iter()
                .any(|h| h.as_ref().is_ok_and(|h| h.is_finished()))
            {
                break;
            }
            std::thread::sleep(d.min(Duration::from_millis(20)));
            // The allocator's background work (depot and idle trim), as
            // Linux's workqueue runs it about every 100 ms.
            if last_maintain.elapsed() >= MAINTAIN_EVERY {
                let c0 = cpu_clock::thread();
                host.domain.maintain_iova();
                maintain_cpu += cpu_clock::thread().saturating_sub(c0);
                last_maintain = Instant::now();
            }
        }
        let now = Instant::now();
        let cur = total(&counters);
        let cur_work = WorkTotals::read(&work);
        let cur_fresh = WorkTotals::read(&fresh_work);
        let fresh_ops = cur_fresh.reaped.saturating_sub(last_fresh.reaped);
        let cur_timer = timer_cpu();
        let ops = cur.0 - last.0;
        let timer_s = cur_timer.saturating_sub(last_timer).as_secs_f64();
        let maintain_s = maintain_cpu.saturating_sub(last_maintain_cpu).as_secs_f64();
        let per_req_s = cur_work.per_request_s(&last_work);
        let (submit_s, reap_s) = cur_work.per_request_parts_s(&last_work);
        let dt = now.duration_since(last_t).as_secs_f64().max(1e-9);
        let iova = host.domain.iova_stats();
        let tables = host.domain.table_stats();
        windows.push(FioWindow {
            t_s: now.duration_since(t0).as_secs_f64(),
            ops,
            driver_cpu_s: ops as f64 * per_req_s + timer_s + maintain_s,
            work_cpu_us_per_req: per_req_s * 1e6,
            submit_cpu_us_per_req: submit_s * 1e6,
            reap_cpu_us_per_req: reap_s * 1e6,
            timer_cpu_s: timer_s,
            fresh_ops,
            fresh_cpu_s: fresh_ops as f64 * cur_fresh.per_request_s(&last_fresh),
            iops: ops as f64 / dt,
            gbps: (cur.1 - last.1) as f64 / dt / 1e9,
            read_iops: (cur.2 - last.2) as f64 / dt,
            write_iops: (cur.3 - last.3) as f64 / dt,
            errors: cur.4 - last.4,
            tree_allocs: iova.tree_allocs.saturating_sub(last_iova.tree_allocs),
            tree_frees: iova.tree_frees.saturating_sub(last_iova.tree_frees),
            magazines_freed: iova
                .magazines_freed
                .saturating_sub(last_iova.magazines_freed),
            tree_nodes: iova.tree_nodes,
            cached_iovas: iova.cached_iovas,
            table_pages: tables.table_pages,
            tables_allocated: tables
                .tables_allocated
                .saturating_sub(last_tables.tables_allocated),
        });
        last_iova = iova;
        last_tables = tables;
        last = cur;
        last_work = cur_work;
        last_fresh = cur_fresh;
        last_timer = cur_timer;
        last_maintain_cpu = maintain_cpu;
        last_t = now;
    }
    let runtime_s = t0.elapsed().as_secs_f64();
    let ops_at_stop = total(&counters);
    plan.stop.store(true, Ordering::Release);
    let dev_cpu = host.device.cpu_time().saturating_sub(dev_cpu0);
    let run_timer_cpu = timer_cpu().saturating_sub(timer0);
    let run_work = WorkTotals::read(&work);
    let mut queues = Vec::new();
    let mut driver_cpu = Duration::ZERO;
    let mut first_err = None;
    for h in handles {
        match h {
            Ok(h) => match h.join() {
                Ok(Ok((qs, cpu))) => {
                    queues.extend(qs);
                    driver_cpu += cpu;
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(FioError::Panicked);
                }
            },
            Err(_) => {
                first_err.get_or_insert(FioError::Panicked);
            }
        }
    }
    let abandoned = queues.iter().map(|q| u64::from(q.in_flight())).sum();
    drv.reset();
    for q in &mut queues {
        if let Err(e) = q.release() {
            first_err.get_or_insert(e.into());
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let jobs: Vec<FioJobResult> = counters
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
            FioJobResult {
                queue: i as u16,
                ops: l(&c.ops),
                reads: l(&c.reads),
                writes: l(&c.writes),
                bytes: l(&c.bytes),
                io_errors: l(&c.errors),
                verified: l(&c.verified),
                verify_failures: l(&c.verify_failures),
                slow_ops: l(&c.slow),
            }
        })
        .collect();
    let ops = ops_at_stop.0;
    let per = |d: Duration| {
        if ops == 0 {
            0.0
        } else {
            d.as_secs_f64() * 1e6 / ops as f64
        }
    };
    Ok(FioResult {
        backend: host.device.backend().kind(),
        threads,
        irq_cpus: irq_total,
        device_workers: host.device.workers(),
        window_s: cfg.window.as_secs_f64(),
        runtime_s,
        ops,
        iops: ops as f64 / runtime_s.max(1e-9),
        gbps: ops_at_stop.1 as f64 / runtime_s.max(1e-9) / 1e9,
        io_errors: jobs.iter().map(|j| j.io_errors).sum(),
        verified: jobs.iter().map(|j| j.verified).sum(),
        verify_failures: jobs.iter().map(|j| j.verify_failures).sum(),
        driver_cpu_us_per_req: per(driver_cpu + run_timer_cpu),
        flush_timer_cpu_us_per_req: per(run_timer_cpu),
        work_cpu_us_per_req: run_work.per_request_s(&WorkTotals::default()) * 1e6,
        device_cpu_us_per_req: per(dev_cpu),
        abandoned,
        fresh_lives: fresh.map_or(0, |f| f.lives.load(Ordering::Relaxed)),
        iova: host.domain.iova_stats(),
        jobs,
        windows,
    })
}
