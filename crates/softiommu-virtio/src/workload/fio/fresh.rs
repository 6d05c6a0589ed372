//! The fresh control arm of an aging run ([`FioConfig::fresh_arm`]).
//!
//! A paced job thread's CPU per request follows the machine's speed: each
//! request's work starts on caches the rest of the machine has had, so
//! the aged device's work per CPU-second also measures what the other
//! load did between the run's first and last quarter. Beside its aged
//! jobs each job thread therefore drives a *fresh* device: a second
//! [`BlkHost`] (device, unit and DMA domain of the same DMA and IOVA
//! policy, the same low window) with one queue per job of the thread,
//! the same block-size mix and pattern at 1 / [`FRESH_PACE_SHARE`] of the
//! pace and depth, no slow tail, completed on interrupt CPUs of its own as
//! the aged jobs are. Its requests are submitted and reaped in the same
//! loop as the aged ones, on the same thread, between the same sleeps, so
//! both arms' calls run on the same core under the same load within
//! microseconds of each other. Every [`FRESH_LIFE_REQS`] requests per job
//! the thread resets and drops the fresh host and builds a new one
//! (outside any timed call), so it never ages; the first
//! [`FRESH_WARMUP_REQS`] per job of each life are not timed (a new domain's caches fill from its tree and
//! its page table is built: a cold start, not the machine's speed). The
//! counted calls are timed into a [`SampledWork`] of their own, as the
//! aged arm's are (`sample.rs`).
//!
//! [`FioConfig::fresh_arm`]: super::FioConfig::fresh_arm

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use softiommu::dma::{DmaCpu, DmaPolicy};

use super::config::{FioConfig, FioError};
use super::engine::{Counters, Job, Plan};
use super::sample::{account_passes, Call, SampledWork, Sampler};
use crate::blk::{BackendConfig, BlkDriver, BlkDriverConfig, BlkHost, BlkHostConfig};

/// The fresh arm's pace and depth are the aged jobs' divided by this:
/// one, the same pace, so that both arms' requests come as often between
/// the same sleeps (the CPU per request follows the pace) and each
/// window holds as many flushes of the fresh arm's flush queues (one per
/// 256 frees, each costing as much as many requests) as of the aged
/// arm's. Measured at half the pace: the fresh arm's rate moved
/// 270-510 k requests per CPU-second window to window, the ratio
/// 0.55-1.04; at the same pace 260-410 k and 0.64-0.94.
pub(crate) const FRESH_PACE_SHARE: usize = 1;

/// Requests per fresh job a thread's fresh device serves before it is
/// replaced: 1 s at the lab's default pace (400 a second per job), far
/// younger than the aged device at the end of any run, and
/// with no slow tail pinning its IOVAs.
pub(crate) const FRESH_LIFE_REQS: u64 = 400;

/// Requests per fresh job at the start of each life whose calls are not
/// timed.
pub(crate) const FRESH_WARMUP_REQS: u64 = 40;

/// The fresh host's bounce pool unless its DMA policy bounces.
pub(crate) const FRESH_BOUNCE_BYTES: u64 = 1 << 20;

/// Where a fresh device is in its life: requests submitted to it so far,
/// over its `jobs` jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Life {
    pub(crate) submitted: u64,
    pub(crate) jobs: u64,
}

impl Life {
    /// A new life of a device with `jobs` jobs.
    pub(crate) fn new(jobs: usize) -> Self {
        Self {
            submitted: 0,
            jobs: jobs.max(1) as u64,
        }
    }

    /// Whether its calls are timed (past the warm-up).
    pub(crate) fn counted(self) -> bool {
        self.submitted >= FRESH_WARMUP_REQS * self.jobs
    }

    /// Whether it is due to be replaced.
    pub(crate) fn over(self) -> bool {
        self.submitted >= FRESH_LIFE_REQS * self.jobs
    }
}

/// How every thread builds its fresh devices.
#[derive(Debug, Clone)]
pub(crate) struct FreshSpec {
    /// The fresh host: the aged one's configuration sized for
    /// [`cfg`](Self::cfg), without a slow region.
    pub(crate) host: BlkHostConfig,
    /// The fresh jobs' load: the aged run's, at its pace and depth divided
    /// by [`FRESH_PACE_SHARE`], without the slow tail.
    pub(crate) cfg: FioConfig,
    /// Fresh hosts built so far, over all threads (a shared counter,
    /// touched once per life).
    pub(crate) lives: Arc<AtomicU64>,
}

impl FreshSpec {
    /// The fresh arm of a run of `cfg` on `host` (as given to
    /// `run_fio`).
    pub(crate) fn of(host: &BlkHostConfig, cfg: &FioConfig) -> Self {
        let cfg = FioConfig {
            iodepth: cfg.iodepth.div_ceil(FRESH_PACE_SHARE).max(1),
            rate_iops: cfg.rate_iops.map(|r| r / FRESH_PACE_SHARE as f64),
            slow: None,
            ..cfg.clone()
        };
        // Only the memory its load needs, and no bounce pool beyond
        // 1 MiB unless its policy bounces: the pool is zeroed as the host
        // is built (64 MiB took 0.3 s in a debug build, on the job
        // thread, once per life; with 1 MiB the whole host took 13 ms).
        let bounce_bytes = if host.policy == DmaPolicy::Bounce {
            host.bounce_bytes
        } else {
            host.bounce_bytes.min(FRESH_BOUNCE_BYTES)
        };
        let mut host = super::engine::sized_for(
            &BlkHostConfig {
                mem_bytes: 0,
                bounce_bytes,
                ..host.clone()
            },
            &cfg,
        );
        host.device.slow = None;
        // A file stays the aged run's alone: the control arm measures the
        // driver side's DMA path per request, which no back-end's I/O
        // enters (the device threads do it), and a second opener of the
        // run's file would compete for its disk and fail with it when the
        // file goes bad (a shrunk file must fail the aged run's requests,
        // counted, not the control arm's rebuild). A constant difference
        // of the arms cancels in the paired figure (a ratio of ratios).
        if matches!(host.device.backend, BackendConfig::File { .. }) {
            host.device.backend = BackendConfig::default();
        }
        Self {
            host,
            cfg,
            lives: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// One life: a fresh host, its driver and the thread's fresh jobs on it.
struct Live {
    jobs: Vec<Job>,
    irqs: Vec<DmaCpu>,
    plan: Plan,
    drv: BlkDriver,
    /// Dropped last (its device stops when it goes).
    _host: BlkHost,
}

impl Live {
    fn new(spec: &FreshSpec, jobs: usize, n_irq: usize, seed: u64) -> Result<Self, FioError> {
        let cfg = &spec.cfg;
        let host = BlkHost::new(&spec.host)?;
        // As the aged arm's.
        account_passes(&host);
        if let Some(t) = cfg.flush_timeout {
            host.domain
                .set_timeout(t)
                .map_err(|e| FioError::Host(e.into()))?;
        }
        let queue_size = (3 * cfg.slots()).next_power_of_two().clamp(4, 32768) as u16;
        let mut drv = host.driver(BlkDriverConfig {
            queues: jobs as u16,
            queue_size,
            depth: cfg.iodepth as u16,
            small_slots: 0,
            shared_small: false,
            max_request_bytes: cfg.bs.max().next_multiple_of(4096),
        })?;
        let queues = drv.take_queues();
        if queues.len() < jobs {
            drv.reset();
            return Err(FioError::NotEnoughQueues {
                jobs,
                queues: queues.len() as u16,
            });
        }
        let irqs: Vec<DmaCpu> = (0..n_irq).map(|_| host.domain.cpu()).collect();
        let counters = Arc::new(CachePadded::new(Counters::default()));
        let jobs: Vec<Job> = queues
            .into_iter()
            .take(jobs)
            .enumerate()
            .map(|(i, q)| {
                q.bind_interrupt();
                let irq = (n_irq > 0).then(|| i % n_irq);
                Job::new(q, counters.clone(), seed, i, &cfg.bs, irq)
            })
            .collect();
        let plan = Plan {
            iodepth: cfg.iodepth,
            rw: cfg.rw,
            fast_end: drv.geometry().capacity_bytes(),
            slow: None,
            slow_per_s: None,
            fast_per_s: cfg.rate_iops,
            // The pace's clock starts with the life: no backlog to burst.
            start: Instant::now(),
            slow_mixed: false,
            verify_every: cfg.verify_every,
            verify: host.device.backend().kind() == "null",
            sample_work: true,
            stop: std::sync::atomic::AtomicBool::new(false),
        };
        Ok(Self {
            jobs,
            irqs,
            plan,
            drv,
            _host: host,
        })
    }
}

impl Drop for Live {
    /// Resets the device (abandoning what is in flight) and gives every
    /// queue's memory back before the host goes.
    fn drop(&mut self) {
        self.drv.reset();
        for j in &mut self.jobs {
            // A queue that cannot be released only leaks its pages into
            // a host that is dropped next.
            let _ = j.q.release();
        }
    }
}

/// One job thread's fresh arm.
pub(crate) struct FreshArm {
    spec: Arc<FreshSpec>,
    jobs: usize,
    n_irq: usize,
    seed: u64,
    live: Option<Live>,
    life: Life,
    sampler: Sampler,
}

impl FreshArm {
    /// The fresh arm of a thread hosting `jobs` jobs and `n_irq`
    /// interrupt CPUs, timing into `work`; its first host is built on the
    /// first [`step`](Self::step), on the thread.
    pub(crate) fn new(
        spec: Arc<FreshSpec>,
        jobs: usize,
        n_irq: usize,
        seed: u64,
        work: Arc<CachePadded<SampledWork>>,
    ) -> Self {
        Self {
            spec,
            jobs,
            n_irq,
            seed,
            live: None,
            life: Life::new(jobs),
            sampler: Sampler::new(work),
        }
    }

    /// Replaces the fresh host by a new one (the old one reset and
    /// dropped first), outside any timed call.
    fn renew(&mut self) -> Result<(), FioError> {
        self.live = None;
        let n = self.spec.lives.fetch_add(1, Ordering::Relaxed);
        let seed = self.seed ^ n.wrapping_mul(0x9e37_79b9);
        self.live = Some(Live::new(&self.spec, self.jobs, self.n_irq, seed)?);
        self.life = Life::new(self.jobs);
        Ok(())
    }

    /// One pass over the fresh jobs, as the thread makes over its aged
    /// ones: each reaps and submits what its pace has earned, timed past
    /// the life's warm-up. Returns the requests handled.
    pub(crate) fn step(&mut self) -> Result<usize, FioError> {
        if self.live.is_none() || self.life.over() {
            self.renew()?;
        }
        let counted = self.life.counted();
        let Some(Live {
            jobs, irqs, plan, ..
        }) = self.live.as_mut()
        else {
            return Ok(0);
        };
        let mut progress = 0;
        for j in jobs.iter_mut() {
            progress += if counted && j.q.has_completions() {
                self.sampler.run(Call::Reap, || j.reap(irqs, plan))?
            } else {
                j.reap(irqs, plan)?
            };
            let n = j.submit(plan, counted.then_some(&mut self.sampler))?;
            self.life.submitted += n as u64;
            progress += n;
        }
        Ok(progress)
    }

    /// Asks for the fresh queues' interrupts; whether one has completions
    /// already (as `BlkQueue::arm_interrupt`).
    pub(crate) fn arm(&mut self) -> bool {
        let mut waiting = false;
        for j in self.live.iter_mut().flat_map(|l| l.jobs.iter_mut()) {
            waiting |= j.q.arm_interrupt();
        }
        waiting
    }

    /// Stops asking for them.
    pub(crate) fn disarm(&mut self) {
        for j in self.live.iter_mut().flat_map(|l| l.jobs.iter_mut()) {
            j.q.disarm_interrupt();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_life_is_timed_past_its_warm_up_and_replaced_at_its_end() {
        // Six jobs on the thread: the bounds are per job.
        let at = |submitted| Life {
            submitted,
            ..Life::new(6)
        };
        assert!(!at(0).counted() && !at(0).over());
        assert!(!at(6 * FRESH_WARMUP_REQS - 1).counted());
        assert!(at(6 * FRESH_WARMUP_REQS).counted() && !at(6 * FRESH_WARMUP_REQS).over());
        assert!(!at(6 * FRESH_LIFE_REQS - 1).over());
        assert!(at(6 * FRESH_LIFE_REQS).over());
        assert_eq!(Life::new(0).jobs, 1);
        const { assert!(FRESH_WARMUP_REQS < FRESH_LIFE_REQS / 4) };
    }

    #[test]
    fn the_fresh_load_is_the_aged_one_at_a_share_of_its_pace_without_the_slow_tail() {
        let aged = FioConfig {
            jobs: 12,
            iodepth: 32,
            rate_iops: Some(400.0),
            slow: Some(super::super::SlowTail {
                pct: 0.0,
                per_s: Some(100.0),
                depth: 1000,
                hold: std::time::Duration::from_secs(6),
                mixed: true,
            }),
            ..FioConfig::default()
        };
        let mut host = BlkHostConfig::default();
        host.device.cpu = Some(1);
        let s = FreshSpec::of(&host, &aged);
        // Its device threads run where the aged device's do.
        assert_eq!(s.host.device.cpu, Some(1));
        assert_eq!(s.cfg.iodepth, 32 / FRESH_PACE_SHARE);
        assert_eq!(s.cfg.rate_iops, Some(400.0 / FRESH_PACE_SHARE as f64));
        assert_eq!(s.cfg.slow, None);
        assert_eq!(s.cfg.bs, aged.bs);
        assert_eq!(s.host.device.slow, None);
        assert!(s.host.device.blk.num_queues >= 12);
        // Its memory is what its load needs, its bounce pool small.
        assert!(s.host.mem_bytes < BlkHostConfig::default().mem_bytes);
        assert_eq!(s.host.bounce_bytes, FRESH_BOUNCE_BYTES);
    }
}
