//! A DMA domain: one IOVA space and one page table, shared by the devices
//! attached to it, spanning the IOMMU units those devices sit behind.

#![deny(clippy::indexing_slicing)]

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::bounce::{BouncePool, BouncePools, BounceSlot};
use super::error::DmaError;
use super::flush_queue::{Batch, TimerArm};
use super::gate::Gate;
use super::inflight::InFlight;
use super::passthrough::PtRecord;
use super::policy::{DmaDirection, DmaPolicy, Tunables};
use super::slot::CpuSlot;
use super::stale::{StaleReport, StaleWindow};
use super::stats::{CpuStats, DmaStats};
use super::timer::{self, TimerWork};
use super::units::UnitList;
use crate::cpu_clock::ThreadClock;
use crate::hw::{ContextEntry, HwError, SourceId, System, Unit, UnitId};
use crate::iova::{IovaCpuCache, IovaDomain, IovaPolicy, IovaStats};
use crate::mem::{FrameOwner, PhysAddr, PhysMemory, PAGE_SHIFT, PAGE_SIZE};
use crate::pgtable::{IoPageTable, Translation, VtdConfig, VtdPageTable};
use crate::sync::barrier::Barrier;
use crate::sync::lock_std as lock;

/// The largest flush queue (entries per CPU) and high-water mark a domain
/// accepts: 65,536 entries, 256 times Linux's `IOVA_FQ_SIZE`.
pub const MAX_FQ_SIZE: usize = 1 << 16;
/// The shortest deferred-flush timeout a domain accepts: below it the
/// timer thread would do little but wake.
pub const MIN_TIMEOUT: Duration = Duration::from_micros(100);
/// The longest deferred-flush timeout a domain accepts: the stale window
/// is bounded by it, and a minute is already far past any use.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest bounce pool a domain makes per DMA-mask class.
pub const MAX_BOUNCE_BYTES: u64 = 1 << 30;

/// How to build a [`DmaDomain`].
#[derive(Debug, Clone)]
pub struct DmaDomainConfig {
    /// The VT-d domain id the devices' contexts and invalidations use.
    pub did: u16,
    /// The policy to start with.
    pub policy: DmaPolicy,
    /// The IOVA allocator design.
    pub iova_policy: IovaPolicy,
    /// Whether the units' walkers are cache-coherent (VT-d `ECAP.C`); when
    /// not, every page-table line written is flushed (seed `003`).
    pub coherent: bool,
    /// Bytes of each bounce pool (one per DMA-mask class, made as devices
    /// attach; 0: no bounce buffering possible). At most
    /// [`MAX_BOUNCE_BYTES`].
    pub bounce_bytes: u64,
    /// Bytes of IOVA space from 0 that make the low window: 4 GiB, as in
    /// Linux, unless a lab shrinks it so that caches fill it in seconds.
    /// A multiple of the page size, from [`MIN_LOW_WINDOW_BYTES`] to the
    /// whole IOVA space.
    pub low_window_bytes: u64,
    /// Devices whose mask reaches past the low window get IOVAs inside it
    /// while it has room, and above it only when it has none, without
    /// giving the caches back for the first try (Linux's
    /// `iommu_dma_alloc_iova` does this for PCI devices unless booted with
    /// `iommu.forcedac=1`).
    pub low_window_first: bool,
}

/// The smallest low window: 1 MiB (256 pages).
pub const MIN_LOW_WINDOW_BYTES: u64 = 1 << 20;

impl Default for DmaDomainConfig {
    fn default() -> Self {
        Self {
            did: 1,
            policy: DmaPolicy::Strict,
            iova_policy: IovaPolicy::Softiommu,
            coherent: true,
            bounce_bytes: 1 << 20,
            low_window_bytes: 1 << 32,
            low_window_first: false,
        }
    }
}

/// A live bounce mapping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BounceRecord {
    pub(crate) slot: BounceSlot,
    pub(crate) pool: usize,
    pub(crate) buf: PhysAddr,
    pub(crate) len: u64,
    pub(crate) dir: DmaDirection,
    /// The device the slot was mapped for (an unmap or sync through
    /// another device of the domain is refused).
    pub(crate) sid: SourceId,
    /// Whether it is a scatter list's entry (`map_sg`) rather than a
    /// single mapping: an unmap of the other kind does not take it
    /// (DMA-API debug's "frees DMA memory with wrong function").
    pub(crate) sg: bool,
}

/// A live coherent allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CoherentRecord {
    pub(crate) dma: u64,
    pub(crate) order: u32,
    /// The exact length asked for (a free must give the same, as
    /// DMA-API debug checks, not merely one of the same page order).
    pub(crate) len: u64,
    pub(crate) sid: SourceId,
}

/// Flushes that failed, kept for a retry: their IOVAs and table pages are
/// never freed before an invalidation that covers them has completed.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    batches: Mutex<Vec<Batch>>,
    /// Held by whoever retries, from the take to the end of the flushes:
    /// a retry that returns has seen every earlier one end.
    retry: Mutex<()>,
    /// How many batches wait (read without the lock by the timer).
    count: AtomicUsize,
    /// Flushes that failed, ever.
    pub(crate) failures: AtomicU64,
    /// The last failure.
    pub(crate) last: Mutex<Option<DmaError>>,
}

/// A DMA domain. Share it as `Arc<DmaDomain>`; attach devices with
/// [`attach`](Self::attach); map and unmap through a per-CPU handle from
/// [`cpu`](Self::cpu).
#[derive(Debug)]
pub struct DmaDomain {
    pub(crate) id: u64,
    pub(crate) did: u16,
    pub(crate) system: Arc<System>,
    pub(crate) mem: Arc<PhysMemory>,
    /// Dropped by hand in `drop`, and only once no device can walk it.
    pub(crate) table: ManuallyDrop<VtdPageTable>,
    pub(crate) iova: Arc<IovaDomain>,
    /// Units with attached devices; bit `i` of a flush's unit mask is entry `i`.
    pub(crate) units: UnitList,
    pub(crate) devices: Mutex<Vec<SourceId>>,
    /// Every device ever attached, in order, at most
    /// [`OWNER_SLOTS`](super::owner::OWNER_SLOTS) of them: a device's
    /// position is the owner index its translated mappings record in
    /// their tag (append-only, so an index never changes meaning).
    pub(crate) owners: Mutex<Vec<SourceId>>,
    pub(crate) tunables: Tunables,
    pub(crate) cpus: Mutex<Vec<Arc<CpuSlot>>>,
    /// The CPU slots a round works on, copied from `cpus` under its lock
    /// into this buffer, which keeps its capacity: a round allocates
    /// nothing (only the first after a CPU handle is added may grow it).
    round_slots: Mutex<Vec<Arc<CpuSlot>>>,
    pub(crate) arm: Arc<TimerArm>,
    /// What maps and unmaps pass and a policy switch closes.
    pub(crate) gate: Gate,
    /// The gate's fence pair, also ordering an attach against unmaps (see
    /// `units`).
    pub(crate) barrier: Barrier,
    pub(crate) shutdown: AtomicBool,
    timer: Mutex<Option<JoinHandle<()>>>,
    /// The timer thread's CPU clock, set once it is spawned.
    timer_clock: OnceLock<ThreadClock>,
    /// A CPU the timer is asked to pin itself to (`NO_CPU`: none).
    timer_pin: AtomicUsize,
    /// The CPU the timer pinned itself to (`NO_CPU`: not pinned).
    timer_pinned: AtomicUsize,
    /// The timer thread's units' inline passes' CPU, nanoseconds (its
    /// `hw::thread_inline_pass_cpu`, published after each round).
    timer_pass_ns: AtomicU64,
    /// The own flushes (`CpuStats::own_flushes`) of the CPU handles that
    /// went away, kept in the timer's sum.
    retired_own_flushes: AtomicU64,
    pub(super) timer_cache: Mutex<Option<IovaCpuCache>>,
    pub(crate) stale: StaleWindow,
    pub(crate) bounce_bytes: u64,
    /// Devices try the low window first (`DmaDomainConfig::low_window_first`).
    pub(crate) low_window_first: bool,
    pub(crate) bounce: BouncePools,
    pub(crate) bounce_live: AtomicU64,
    pub(crate) bounce_map: Mutex<HashMap<u64, BounceRecord>>,
    /// The attached devices attached as untrusted: while one is, the
    /// domain never goes to pass-through.
    pub(crate) untrusted: Mutex<Vec<SourceId>>,
    pub(crate) coherent: Mutex<HashMap<PhysAddr, CoherentRecord>>,
    /// Pass-through mappings of CPU handles that were dropped.
    pub(crate) pt_retired: PtRecord,
    pub(crate) pending: Pending,
    /// Flushes issued and not yet complete.
    pub(crate) in_flight: InFlight,
    /// Flushes completed by the timer's round, `flush_all` or a retry, for
    /// whichever CPU issued them.
    pub(crate) completed_stats: CpuStats,
    pub(crate) switch: Mutex<()>,
    retired: Mutex<DmaStats>,
}

impl DmaDomain {
    /// A domain over `system`'s memory: a 48-bit IOVA space (IOVA 0 and the
    /// x86 MSI window are never handed out), a VT-d table, and a flush
    /// timer thread that sleeps while no unmap is pending.
    pub fn new(system: Arc<System>, config: DmaDomainConfig) -> Result<Arc<Self>, DmaError> {
        if config.bounce_bytes > MAX_BOUNCE_BYTES {
            return Err(DmaError::InvalidConfig {
                name: "bounce_bytes",
                value: config.bounce_bytes,
                max: MAX_BOUNCE_BYTES,
            });
        }
        let mem = system.memory().clone();
        let vtd = if config.coherent {
            VtdConfig::coherent()
        } else {
            VtdConfig::non_coherent()
        };
        let table = VtdPageTable::new(mem.clone(), vtd)?;
        let space = 1u64 << table.iova_bits();
        if config.low_window_bytes < MIN_LOW_WINDOW_BYTES
            || config.low_window_bytes > space
            || !config.low_window_bytes.is_multiple_of(PAGE_SIZE)
        {
            return Err(DmaError::InvalidConfig {
                name: "low_window_bytes",
                value: config.low_window_bytes,
                max: space,
            });
        }
        let iova = IovaDomain::with_low_window(
            1,
            (space >> PAGE_SHIFT) - 1,
            config.low_window_bytes >> PAGE_SHIFT,
            config.iova_policy,
        )?;
        let (msi_lo, msi_hi) = crate::iova::MSI_WINDOW_PFNS;
        iova.reserve(msi_lo, msi_hi)?;
        // One fence pair for the gate and the timer's arm (see `gate`).
        let barrier = Barrier::default_for_process();
        let d = Arc::new(Self {
            id: System::next_owner_id(),
            did: config.did,
            system,
            mem,
            table: ManuallyDrop::new(table),
            iova,
            units: UnitList::default(),
            devices: Mutex::new(Vec::new()),
            owners: Mutex::new(Vec::new()),
            tunables: Tunables::new(config.policy),
            cpus: Mutex::new(Vec::new()),
            round_slots: Mutex::new(Vec::new()),
            arm: Arc::new(TimerArm::new(barrier)),
            gate: Gate::new(barrier),
            barrier,
            shutdown: AtomicBool::new(false),
            timer: Mutex::new(None),
            timer_clock: OnceLock::new(),
            timer_pin: AtomicUsize::new(crate::affinity::NO_CPU),
            timer_pinned: AtomicUsize::new(crate::affinity::NO_CPU),
            timer_pass_ns: AtomicU64::new(0),
            retired_own_flushes: AtomicU64::new(0),
            timer_cache: Mutex::new(None),
            stale: StaleWindow::default(),
            bounce_bytes: config.bounce_bytes,
            low_window_first: config.low_window_first,
            bounce: BouncePools::default(),
            bounce_live: AtomicU64::new(0),
            bounce_map: Mutex::new(HashMap::new()),
            untrusted: Mutex::new(Vec::new()),
            coherent: Mutex::new(HashMap::new()),
            pt_retired: PtRecord::default(),
            pending: Pending::default(),
            in_flight: InFlight::default(),
            completed_stats: CpuStats::default(),
            switch: Mutex::new(()),
            retired: Mutex::new(DmaStats::default()),
        });
        *lock(&d.timer_cache) = Some(d.iova.cpu_cache_unbiased());
        let weak = Arc::downgrade(&d);
        let handle = std::thread::Builder::new()
            .name(format!("dma-fq-timer-{}", config.did))
            .spawn(move || timer::run(weak))
            .map_err(|_| DmaError::TimerSpawn)?;
        if let Some(clock) = ThreadClock::of(&handle) {
            let _ = d.timer_clock.set(clock);
        }
        *lock(&d.timer) = Some(handle);
        Ok(d)
    }

    /// CPU time the domain's flush timer thread has used since the domain
    /// was made, as the kernel accounts it (the thread's CPU clock). The
    /// timer flushes and frees on the mapping threads' behalf, so a cost
    /// per unit of work that counts the threads which map must count this
    /// too (Linux runs the same work in a timer softirq, inside the CPU
    /// utilisation netperf divides by). `None` if the kernel will not say.
    pub fn timer_cpu_time(&self) -> Option<Duration> {
        self.timer_clock.get().and_then(ThreadClock::read)
    }

    /// Asks the domain's flush timer thread to pin itself to `cpu`
    /// (`sched_setaffinity`), which it does at once (the request wakes it)
    /// or, if it is mid-round, when the round ends. Linux's flush-queue
    /// timer fires on the CPU that armed it, the one that unmapped; a
    /// caller whose mapping threads are pinned can keep the timer beside
    /// them, so that its rounds run on a CPU that is already awake rather
    /// than waking another. Whether the request was taken: false for a
    /// CPU the calling thread may not use (or past the set's range), and
    /// once the domain is shutting down. [`timer_cpu`](Self::timer_cpu)
    /// says when the timer has moved.
    pub fn pin_timer(&self, cpu: usize) -> bool {
        if self.shutdown.load(Relaxed) || !crate::affinity::allowed(cpu) {
            return false;
        }
        self.timer_pin.store(cpu, Relaxed);
        // Wakes the timer from a nap or its sleep; a round that found the
        // arm off goes back to sleep after taking the request.
        self.arm.kick();
        true
    }

    /// The CPU the flush timer pinned itself to ([`pin_timer`](Self::pin_timer)),
    /// once it has; `None` before.
    pub fn timer_cpu(&self) -> Option<usize> {
        let c = self.timer_pinned.load(Relaxed);
        (c != crate::affinity::NO_CPU).then_some(c)
    }

    /// The part of [`timer_cpu_time`](Self::timer_cpu_time) the timer spent
    /// running units' invalidation-queue passes inline (with the units'
    /// [`Unit::set_pass_accounting`](crate::hw::Unit::set_pass_accounting)
    /// on): the IOMMU hardware's work, not the flushing software's (see
    /// `hw::pass_cpu`). Published at the end of each timer round, so it
    /// may trail the clock by one round's passes.
    pub fn timer_inline_pass_cpu(&self) -> Duration {
        Duration::from_nanos(self.timer_pass_ns.load(Relaxed))
    }

    /// How many times the domain's flush timer thread has woken (from a
    /// nap between rounds, or from its sleep while nothing was queued),
    /// ever: a figure of the timer's CPU that does not depend on the
    /// kernel's clocks.
    pub fn timer_wakeups(&self) -> u64 {
        self.arm.wakeups()
    }

    /// The domain id.
    pub fn did(&self) -> u16 {
        self.did
    }

    /// What the domain's page table maps at `iova` now, as a walker would
    /// find it (the physical address, leaf size and rights), or `None`.
    pub fn iova_to_phys(&self, iova: u64) -> Result<Option<Translation>, DmaError> {
        Ok(self.table.iova_to_phys(iova)?)
    }

    /// Counts of the domain's IOVA allocator.
    pub fn iova_stats(&self) -> IovaStats {
        self.iova.stats()
    }

    /// Runs the IOVA allocator's background work (the `linux-2023` depot
    /// trim, the idle trim: [`IovaDomain::maintain`]). Linux runs it from
    /// a workqueue; call it every ~100 ms where the domain's users may go
    /// quiet (the allocator's slow paths also run it). Takes the depot
    /// locks, so keep it off the map path.
    pub fn maintain_iova(&self) {
        self.iova.maintain();
    }

    /// Counts of the domain's page table: lines written and flushed (for
    /// walkers that are not coherent), tables allocated.
    pub fn table_stats(&self) -> crate::pgtable::TableStats {
        self.table.stats()
    }

    /// The system the domain lives in.
    pub fn system(&self) -> &Arc<System> {
        &self.system
    }

    /// The run-time tunables.
    pub fn tunables(&self) -> &Tunables {
        &self.tunables
    }

    /// The policy in force.
    #[inline]
    pub fn policy(&self) -> DmaPolicy {
        self.tunables.policy()
    }

    /// Sets the deferred policy's high-water mark, in entries
    /// (1..=[`MAX_FQ_SIZE`]; clamped to each queue's size). Takes effect
    /// at the next unmap.
    pub fn set_high_water(&self, entries: usize) -> Result<(), DmaError> {
        check_range("high_water", entries as u64, 1, MAX_FQ_SIZE as u64)?;
        self.tunables.high_water.store(entries, Relaxed);
        Ok(())
    }

    /// Sets the deferred policy's timeout ([`MIN_TIMEOUT`]..=[`MAX_TIMEOUT`]):
    /// the bound on how long an unmapped buffer stays reachable. Each
    /// deferred unmap arms an expiry deadline three quarters of it later,
    /// past which the devices' translators drop the domain's cached
    /// translations themselves; queued entries are flushed at half of it
    /// by their owner's next unmaps, and by the timer thread, which fires
    /// once per timeout while anything is queued (as Linux's; up to every
    /// fourth timeout while the owners flush on their own). The stale
    /// window (`stale_window`) ends at the earlier of the flush's
    /// completion and the deadline. Takes effect at the timer's next
    /// round; a shorter timeout wakes it now.
    pub fn set_timeout(&self, timeout: Duration) -> Result<(), DmaError> {
        if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&timeout) {
            return Err(DmaError::InvalidTunable {
                name: "timeout_ns",
                value: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
                min: MIN_TIMEOUT.as_nanos() as u64,
                max: MAX_TIMEOUT.as_nanos() as u64,
            });
        }
        self.tunables
            .timeout_ns
            .store(timeout.as_nanos() as u64, Relaxed);
        self.arm.kick();
        Ok(())
    }

    /// Sets the size of the flush queues made from now on, in entries
    /// (1..=[`MAX_FQ_SIZE`]; per-CPU handles made before keep theirs).
    pub fn set_queue_size(&self, entries: usize) -> Result<(), DmaError> {
        check_range("queue_size", entries as u64, 1, MAX_FQ_SIZE as u64)?;
        self.tunables.fq_size.store(entries, Relaxed);
        Ok(())
    }

    /// A bit for every unit the domain's devices sit behind: what an unmap
    /// must invalidate, since every device of a domain can reach its
    /// mappings.
    pub(crate) fn unit_mask(&self) -> u64 {
        self.units.mask()
    }

    /// The unit mask, read after entries were cleared (see `units`).
    #[inline]
    pub(crate) fn unit_mask_after_clear(&self) -> u64 {
        self.units.mask_after_clear(self.barrier)
    }

    pub(crate) fn context_for(&self, policy: DmaPolicy) -> ContextEntry {
        if policy.is_translated() {
            ContextEntry::Translated {
                did: self.did,
                root: self.table.root(),
            }
        } else {
            ContextEntry::PassThrough
        }
    }

    pub(crate) fn retire(&self, slot: &Arc<CpuSlot>) {
        let mut cpus = lock(&self.cpus);
        cpus.retain(|s| !Arc::ptr_eq(s, slot));
        slot.passthrough.move_into(&self.pt_retired);
        let mut r = lock(&self.retired);
        *r += slot.stats.snapshot();
        // Kept in the timer's sum, so that the sum does not fall when a
        // handle goes away (a change reads as the owners flushing).
        self.retired_own_flushes
            .fetch_add(slot.stats.own_flushes(), Relaxed);
    }

    /// Fails with `QiError::GuardHeld` if the calling thread holds a
    /// translation section of one of the domain's units: an invalidation
    /// it waited for would wait for itself. Checked before anything is
    /// changed.
    pub(crate) fn check_callers(&self) -> Result<(), DmaError> {
        for unit in self.units_in(self.unit_mask()) {
            unit.check_caller()?;
        }
        Ok(())
    }

    /// Invalidates the units in `units` (a bit per unit of this domain) for
    /// `[iova, iova + len)` (or the whole domain if `len` is 0) and waits on
    /// each; returns the number of invalidation requests. If a unit's queue
    /// cannot carry them (stopped on another submitter's bad descriptor,
    /// shut down), the revocation is done without it (`Unit::revoke`): an
    /// `Ok` always means no device can still use what was invalidated.
    pub(crate) fn invalidate(&self, units: u64, iova: u64, len: u64) -> Result<u64, DmaError> {
        self.check_callers()?;
        let mut n = 0;
        let mut bypass = false;
        for unit in self.units_in(units) {
            let queued = if len == 0 {
                unit.invalidate_domain(self.did)
            } else {
                unit.invalidate_range(self.did, iova, len)
            };
            bypass |= queued.is_err();
            n += 1;
        }
        for unit in self.units_in(units) {
            if bypass || unit.wait().is_err() {
                unit.revoke(self.did, iova, len)?;
            }
        }
        Ok(n)
    }

    /// Flushes a batch taken from a flush queue and waits for it: issues
    /// it (one domain invalidation and one wait per unit the domain spans; see
    /// `inflight`), then completes every flush issued so far, freeing the
    /// IOVAs and table pages into `cache` (recorded in `stats`: the
    /// counters of whoever flushed, the owner or the timer). If an
    /// invalidation cannot be done, its batch is kept for a retry (nothing
    /// in it is freed) and the error returned.
    pub(crate) fn flush_batch(
        &self,
        batch: Batch,
        cache: &mut IovaCpuCache,
        stats: &CpuStats,
    ) -> Result<(), DmaError> {
        self.issue_flush(batch)?;
        self.complete_flushes(cache, stats, true)
    }

    /// The end of a flush whose `invalidations` completed at `done_at`:
    /// records the stale window (from the oldest entry's unmap to the
    /// completion, not to this call, which may come a poll later, or to
    /// the entry's expiry deadline if that came first; see `stale`) and
    /// the flush, frees the IOVAs into `cache` and the table pages.
    pub(crate) fn free_flushed(
        &self,
        batch: Batch,
        invalidations: u64,
        done_at: Instant,
        cache: &mut IovaCpuCache,
        stats: &CpuStats,
    ) -> Result<(), DmaError> {
        if let Some(t) = batch.oldest {
            // Reachable until the completion or the oldest entry's expiry
            // deadline (armed by its unmap no later than the period after
            // it), whichever came first.
            self.stale.record(
                done_at.saturating_duration_since(t),
                self.expiry_period(),
                batch.entries.len() as u64,
            );
        }
        let mut result = cache
            .free_retired_all(&batch.entries, |e| (e.pfn, e.pages))
            .map_err(DmaError::from);
        for &t in &batch.tables {
            if let Err(err) = self.mem.free_owned(t, 0, FrameOwner::Iommu) {
                result = result.and(Err(err.into()));
            }
        }
        stats.flush(batch.entries.len() as u64, invalidations);
        if let Err(e) = &result {
            self.note_failure(e);
        }
        result
    }

    pub(crate) fn keep_pending(&self, batch: Batch, e: &DmaError) {
        let mut b = lock(&self.pending.batches);
        b.push(batch);
        self.pending.count.store(b.len(), Relaxed);
        drop(b);
        self.note_failure(e);
        // The timer retries.
        self.arm.kick();
    }

    fn note_failure(&self, e: &DmaError) {
        self.pending.failures.fetch_add(1, Relaxed);
        *lock(&self.pending.last) = Some(e.clone());
    }

    /// Retries the batches whose flush failed; stops at the first that
    /// fails again (it is kept, with the rest). When it returns `Ok`, every
    /// batch kept before the call has been invalidated, by this call or by
    /// a retry it waited for.
    pub(crate) fn retry_pending(
        &self,
        cache: &mut IovaCpuCache,
        stats: &CpuStats,
    ) -> Result<(), DmaError> {
        let _retry = lock(&self.pending.retry);
        if self.pending.count.load(Relaxed) == 0 {
            return Ok(());
        }
        let taken = {
            let mut b = lock(&self.pending.batches);
            self.pending.count.store(0, Relaxed);
            std::mem::take(&mut *b)
        };
        let mut rest = taken.into_iter();
        for batch in rest.by_ref() {
            if let Err(e) = self.flush_batch(batch, cache, stats) {
                let mut b = lock(&self.pending.batches);
                b.extend(rest);
                self.pending.count.store(b.len(), Relaxed);
                return Err(e);
            }
        }
        Ok(())
    }

    /// A round as the timer's, with queues flushed only once their oldest
    /// entry has waited `age` at `now` and no wait for the drains: retries
    /// failed flushes, then flushes those queues; returns the oldest entry
    /// still queued, if any (`now` while a flush is in flight or failed).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn flush_expired(&self, now: Instant, age: Duration) -> Option<Instant> {
        self.flush_round(now, age).0
    }

    /// The timer's round: retries failed flushes, then flushes every queue
    /// whose oldest entry has waited `age` at `now` (the timer passes 0:
    /// every queue with anything), then polls the flushes in flight once
    /// (it never waits for a drain). Returns the oldest entry still queued, if any
    /// (`now` while a flush is in flight or failed), and what the round
    /// found.
    pub(crate) fn flush_round(
        &self,
        now: Instant,
        age: Duration,
    ) -> (Option<Instant>, timer::Round) {
        // The slots, into the round's own buffer (no allocation); the
        // `cpus` lock is not held while flushing (a new handle would wait).
        let mut cpus = lock(&self.round_slots);
        cpus.clone_from(&lock(&self.cpus));
        let mut worked = self.pending.count.load(Relaxed) > 0 || self.in_flight.len() > 0;
        let own_flushes = cpus
            .iter()
            .map(|s| s.stats.own_flushes())
            .sum::<u64>()
            .wrapping_add(self.retired_own_flushes.load(Relaxed));
        // A queue past its age has its domain's cached translations dropped
        // at once, lock-free: the flush below may wait for a queue's taker
        // or the unit's processing lock, held by a thread the host's
        // scheduler has descheduled, and the stale window must not wait
        // with it.
        let overdue = |t: Instant| now.saturating_duration_since(t) >= age;
        if self.pending.count.load(Relaxed) > 0
            || cpus.iter().any(|s| s.fq.oldest().is_some_and(overdue))
        {
            self.drop_cached();
        }
        let mut cache_guard = lock(&self.timer_cache);
        let mut oldest: Option<Instant> = None;
        if let Some(cache) = cache_guard.as_mut() {
            if self.retry_pending(cache, &self.completed_stats).is_err() {
                oldest = Some(now);
            }
        }
        for slot in cpus.iter() {
            // A queue whose taker is held is being flushed by its owner (or
            // by `flush_all`); never wait for it here: a holder the host
            // has descheduled would hold the timer too, and with it every
            // other queue's flush. Its batch still counts in `oldest`, so
            // the next round drops it from the IOTLB if it ages.
            // Only a queue past its age is taken: holding the taker of a
            // younger one would make its owner's flush at the high-water
            // mark (which never waits for a taker) skip a flush nobody
            // then does.
            if slot.fq.oldest().is_some_and(overdue) {
                worked = true;
                if let Some(mut taker) = slot.fq.try_taker() {
                    if let Some(batch) = taker.take_if_older(now, age) {
                        // A failed issue keeps its batch for the next round.
                        let _ = self.issue_flush(batch);
                    }
                }
            }
            if let Some(t) = slot.fq.oldest() {
                oldest = Some(oldest.map_or(t, |o| o.min(t)));
            }
        }
        // The flushes issued, by this round or by the owners, whose waits
        // have completed are freed: one poll, never a wait. A flight whose
        // drain is still open (a device thread inside a translation section
        // that began before the invalidation) is polled again by the
        // owners' next unmaps and by the next round, which the `in_flight`
        // check below keeps armed. Waiting here for the drain would wait
        // for the device threads, which stand for the hardware: on a shared
        // machine the host takes them off their CPUs, and the timer's CPU
        // spent spinning for them (200 µs a round at most, 14-28 µs on
        // average at load 12) was the machine's load, not the flushing
        // software's work. A batch that cannot be revoked is
        // kept for the next round.
        if let Some(cache) = cache_guard.as_mut() {
            let _ = self.complete_flushes(cache, &self.completed_stats, false);
        }
        let open = self.pending.count.load(Relaxed) > 0 || self.in_flight.len() > 0;
        if open {
            oldest = Some(oldest.map_or(now, |o| o.min(now)));
        }
        worked |= oldest.is_some();
        // Drops the slots' references now, keeping the buffer's capacity.
        cpus.clear();
        (
            oldest,
            timer::Round {
                worked,
                open,
                own_flushes,
            },
        )
    }

    /// The units of `mask` (bits of the domain's unit list).
    fn units_in(&self, mask: u64) -> impl Iterator<Item = &Unit> + '_ {
        self.units
            .in_mask(mask)
            .filter_map(|id| self.system.unit(id))
    }

    /// How far past an unmap its expiry deadline falls: three quarters of
    /// the flush timeout. An owner that keeps unmapping flushes its queue
    /// at half (`Tunables::flush_after`), before it; the timer fires once
    /// per timeout or less often (`Tunables::timer_period`, up to four
    /// while the owners flush on their own), so an entry it flushes may
    /// have passed it: the deadline, not the timer, ends the stale window
    /// inside the timeout.
    pub(crate) fn expiry_period(&self) -> Duration {
        self.tunables.timeout() * 3 / 4
    }

    /// A deferred unmap was queued (after the push and its light fence,
    /// `TimerArm::on_push`): in each unit of `units`, makes sure an expiry
    /// deadline no later than [`expiry_period`](Self::expiry_period) from
    /// now is armed before the unmap returns (one load per unit when one
    /// is). A translator that finds it due drops the domain's cached
    /// translations itself (`Iotlb::expire`), so the stale window's bound
    /// holds while the flush timer and the owner are off their CPUs.
    #[inline(always)]
    pub(crate) fn cover_unmap(&self, units: u64) {
        // The period is worked out only where a deadline must be armed:
        // an unmap that finds one armed pays a load, no clock arithmetic.
        for unit in self.units_in(units) {
            unit.cover_unmap(self.did, || self.expiry_period());
        }
    }

    /// The expiry deadline words of this domain in the units of `units`
    /// (see [`cover_unmap`](Self::cover_unmap)), in bit order.
    pub(crate) fn deadline_words(&self, units: u64) -> Vec<&crate::sync::AtomicU64> {
        self.units_in(units)
            .map(|u| u.deadline_word(self.did))
            .collect()
    }

    /// Arms the expiry deadline in every unit where none no later is
    /// armed (the timer's rounds with work; never moves one later).
    pub(crate) fn arm_expiry(&self, units: u64) {
        let period = self.expiry_period();
        for unit in self.units_in(units) {
            unit.arm_expiry(self.did, period);
        }
    }

    /// The timer found nothing queued: marks every unit's deadline as
    /// being cleared (still in force); puts the marks into `marks`
    /// (cleared first; a buffer the timer keeps across rounds, so an idle
    /// round allocates nothing), for
    /// [`finish_clear_expiry`](Self::finish_clear_expiry) after the
    /// timer's barrier and rescan.
    pub(crate) fn begin_clear_expiry(&self, marks: &mut Vec<(UnitId, u64)>) {
        marks.clear();
        marks.extend(self.units.in_mask(self.unit_mask()).filter_map(|id| {
            let marked = self.system.unit(id)?.begin_clear_expiry(self.did)?;
            Some((id, marked))
        }));
    }

    /// Clears the marked deadlines if `idle` (the rescan after the barrier
    /// found nothing queued) and no unmap removed the mark meanwhile;
    /// otherwise leaves them armed.
    pub(crate) fn finish_clear_expiry(&self, marks: &[(UnitId, u64)], idle: bool) {
        for &(id, marked) in marks {
            if let Some(unit) = self.system.unit(id) {
                unit.finish_clear_expiry(self.did, marked, idle);
            }
        }
    }

    /// Drops every cached translation of this domain in every unit it
    /// spans, now and lock-free (see `Unit::drop_cached`): what a queue past
    /// its age gets while its flush waits for a lock.
    pub(crate) fn drop_cached(&self) {
        for unit in self.units_in(self.unit_mask()) {
            unit.drop_cached(self.did);
        }
    }

    /// Whether any queue holds an entry (or a batch a taker took and has
    /// not issued yet), or an issued or failed flush waits.
    pub(crate) fn any_queued(&self) -> bool {
        self.pending.count.load(Relaxed) > 0
            || self.in_flight.len() > 0
            || lock(&self.cpus).iter().any(|s| s.fq.oldest().is_some())
    }

    /// Flushes every queue now (the timer's cache frees the IOVAs), and
    /// every batch whose flush failed before.
    pub fn flush_all(&self) -> Result<(), DmaError> {
        // First: a thread in a section could wait for a taker that waits
        // for its section.
        self.check_callers()?;
        let cpus = lock(&self.cpus).clone();
        let mut cache_guard = lock(&self.timer_cache);
        let Some(cache) = cache_guard.as_mut() else {
            return Ok(());
        };
        self.retry_pending(cache, &self.completed_stats)?;
        for slot in &cpus {
            let mut taker = slot.fq.taker();
            if let Some(batch) = taker.take_all() {
                self.issue_flush(batch)?;
            }
        }
        // Every queue's batch, and every flush the owners issued, in one
        // wait.
        self.complete_flushes(cache, &self.completed_stats, true)
    }

    /// Switches the policy at run time. Between strict, deferred and bounce
    /// any time: live mappings stay valid (leaving deferred flushes every
    /// queue first). To or from pass-through only with no mapping live,
    /// else [`DmaError::PolicySwitchBusy`]; to pass-through never while an
    /// untrusted device is attached ([`DmaError::UntrustedPassthrough`]); the devices' contexts change and
    /// the domain's IOTLB entries are invalidated. A refused switch
    /// changes nothing: the section check, the queues of the devices'
    /// units (a stopped one: `Hw(Queue(Stopped))`) are checked before any
    /// context is written, and a context a unit refuses midway sends the
    /// devices already switched back to the old policy's context.
    pub fn set_policy(&self, policy: DmaPolicy) -> Result<(), DmaError> {
        let _switch = lock(&self.switch);
        // Stop the world: close the gate, then wait for every CPU's running
        // map or unmap (the list is read after closing; see `gate`).
        let closed = self.gate.close();
        for slot in lock(&self.cpus).clone().iter() {
            closed.wait_for(&slot.active);
        }
        let old = self.policy();
        if old == policy {
            return Ok(());
        }
        if policy == DmaPolicy::Passthrough {
            if let Some(sid) = lock(&self.untrusted).first() {
                return Err(DmaError::UntrustedPassthrough {
                    sid: sid.to_string(),
                });
            }
        }
        let switch_contexts = old.is_translated() != policy.is_translated();
        if switch_contexts {
            let live = self.stats().live();
            if live > 0 {
                return Err(DmaError::PolicySwitchBusy { live });
            }
            self.check_callers()?;
            // Every device's unit must be able to carry its context change:
            // checked before any context is written.
            for &sid in lock(&self.devices).iter() {
                let (_, unit) = self
                    .system
                    .unit_of(sid)
                    .ok_or(HwError::DeviceNotAssigned { sid })?;
                unit.check_queue().map_err(HwError::Queue)?;
            }
        }
        if old == DmaPolicy::Deferred {
            self.flush_all()?;
        }
        if switch_contexts {
            self.switch_contexts(self.context_for(old), self.context_for(policy))?;
            self.invalidate(self.unit_mask(), 0, 0)?;
        }
        self.tunables.policy.store(policy.to_u8(), Relaxed);
        drop(closed);
        Ok(())
    }

    /// Gives every device of the domain context `new` (their old one:
    /// `old`), all or none: a queue that stops meanwhile is gone around
    /// (the change is drained directly), and if a unit refuses the entry
    /// the devices already switched get `old` back. A device whose old
    /// context cannot be restored either (its domain id taken meanwhile
    /// by another root) is blocked: never left on the new context.
    fn switch_contexts(&self, old: ContextEntry, new: ContextEntry) -> Result<(), DmaError> {
        let devices = lock(&self.devices).clone();
        let set = |sid: SourceId, ctx: ContextEntry| -> Result<(), HwError> {
            let (_, unit) = self
                .system
                .unit_of(sid)
                .ok_or(HwError::DeviceNotAssigned { sid })?;
            unit.replace_context_around_queue(sid, Some(ctx))
        };
        for (i, &sid) in devices.iter().enumerate() {
            if let Err(e) = set(sid, new) {
                for &done in devices.iter().take(i) {
                    if set(done, old).is_err() {
                        let _ = set(done, ContextEntry::Blocked);
                    }
                }
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Every CPU's counters summed (handles dropped included).
    pub fn stats(&self) -> DmaStats {
        let mut s = *lock(&self.retired);
        s += self.completed_stats.snapshot();
        for slot in lock(&self.cpus).iter() {
            s += slot.stats.snapshot();
        }
        s.flush_failures = self.pending.failures.load(Relaxed);
        s.pending_batches = self.pending.count.load(Relaxed) as u64;
        s
    }

    /// The last flush failure, if any flush failed (the batch was kept and
    /// retried; see [`DmaStats::flush_failures`]).
    pub fn last_flush_error(&self) -> Option<DmaError> {
        lock(&self.pending.last).clone()
    }

    /// The stale window of the deferred policy so far.
    pub fn stale_window(&self) -> StaleReport {
        self.stale.report()
    }

    /// Starts a new stale-window measurement.
    pub fn reset_stale_window(&self) {
        self.stale.reset();
    }
}

impl TimerWork for DmaDomain {
    fn shutting_down(&self) -> bool {
        self.shutdown.load(Relaxed)
    }

    fn arm(&self) -> &Arc<TimerArm> {
        &self.arm
    }

    fn timer_period(&self) -> Duration {
        self.tunables.timer_period()
    }

    fn round(&self, now: Instant) -> timer::Round {
        let (_, round) = self.flush_round(now, Duration::ZERO);
        // Once per round, read by the labs (`timer_inline_pass_cpu`).
        let ns = crate::hw::thread_inline_pass_cpu().as_nanos();
        self.timer_pass_ns
            .store(u64::try_from(ns).unwrap_or(u64::MAX), Relaxed);
        round
    }

    fn retry_due(&self) -> bool {
        self.pending.count.load(Relaxed) > 0
    }

    fn take_pin(&self) -> Option<usize> {
        let c = self.timer_pin.swap(crate::affinity::NO_CPU, Relaxed);
        (c != crate::affinity::NO_CPU).then_some(c)
    }

    fn pinned(&self, cpu: usize) {
        self.timer_pinned.store(cpu, Relaxed);
    }

    fn any_queued(&self) -> bool {
        DmaDomain::any_queued(self)
    }

    fn arm_expiry(&self) {
        DmaDomain::arm_expiry(self, self.unit_mask());
    }

    fn begin_clear_expiry(&self, marks: &mut Vec<(UnitId, u64)>) {
        DmaDomain::begin_clear_expiry(self, marks)
    }

    fn finish_clear_expiry(&self, marks: &[(UnitId, u64)], idle: bool) {
        DmaDomain::finish_clear_expiry(self, marks, idle)
    }
}

/// `value` within `[min, max]`, or `InvalidTunable`.
fn check_range(name: &'static str, value: u64, min: u64, max: u64) -> Result<(), DmaError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(DmaError::InvalidTunable {
            name,
            value,
            min,
            max,
        })
    }
}

impl Drop for DmaDomain {
    fn drop(&mut self) {
        self.shutdown.store(true, Relaxed);
        self.arm.kick();
        if let Some(h) = lock(&self.timer).take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        // No device may walk the table once it is freed: take every
        // device's context away and drain, then free. If that cannot be
        // done from this thread (it holds a section of a unit), the table
        // and the pools are leaked instead: memory, never isolation.
        let mut revoked = true;
        for &sid in lock(&self.devices).iter() {
            if let Some((_, unit)) = self.system.unit_of(sid) {
                revoked &= unit.set_context(sid, None).is_ok();
            }
            self.system.release(sid, self.id);
        }
        for unit in self.units_in(self.unit_mask()) {
            revoked &= unit.revoke(self.did, 0, 0).is_ok();
        }
        if !revoked {
            return;
        }
        for (phys, bytes) in self.bounce.iter().flat_map(BouncePool::phys_ranges) {
            let order = (bytes / PAGE_SIZE).ilog2();
            let _ = self.mem.free_owned(phys, order, FrameOwner::Bounce);
        }
        for (phys, rec) in lock(&self.coherent).drain() {
            let _ = self.mem.free_owned(phys, rec.order, FrameOwner::Coherent);
        }
        let in_flight = self.in_flight.drain();
        for batch in lock(&self.pending.batches).drain(..).chain(in_flight) {
            for t in batch.tables {
                let _ = self.mem.free_owned(t, 0, FrameOwner::Iommu);
            }
        }
        // SAFETY: `table` is dropped here once and never used again (this
        // is the domain's `drop`). It may be freed: no context points at
        // it any more and every translation in flight has been drained.
        unsafe { ManuallyDrop::drop(&mut self.table) };
    }
}
