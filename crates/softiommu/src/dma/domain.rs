//! A DMA domain: one IOVA space and one page table, shared by the devices
//! attached to it, spanning the IOMMU units those devices sit behind.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::bounce::{BouncePool, BounceSlot};
use super::cpu::{CpuSlot, DmaCpu};
use super::device::DmaDevice;
use super::error::DmaError;
use super::flush_queue::{Batch, TimerArm};
use super::gate::Gate;
use super::policy::{DmaDirection, DmaPolicy, Tunables};
use super::stale::{StaleReport, StaleWindow};
use super::stats::{CpuStats, DmaStats};
use super::units::UnitList;
use crate::hw::barrier::Barrier;
use crate::hw::{ContextEntry, SourceId, System};
use crate::iova::{IovaCpuCache, IovaDomain, IovaPolicy};
use crate::mem::{PhysAddr, PhysMemory, PAGE_SHIFT, PAGE_SIZE};
use crate::pgtable::{IoPageTable, Perm, VtdConfig, VtdPageTable};

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
    /// Bytes of bounce pool (0: no bounce buffering possible).
    pub bounce_bytes: u64,
}

impl Default for DmaDomainConfig {
    fn default() -> Self {
        Self {
            did: 1,
            policy: DmaPolicy::Strict,
            iova_policy: IovaPolicy::Softiommu,
            coherent: true,
            bounce_bytes: 1 << 20,
        }
    }
}

/// A live bounce mapping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BounceRecord {
    pub(crate) slot: BounceSlot,
    pub(crate) buf: PhysAddr,
    pub(crate) len: u64,
    pub(crate) dir: DmaDirection,
}

/// A DMA domain. Share it as `Arc<DmaDomain>`; attach devices with
/// [`attach`](Self::attach); map and unmap through a per-CPU handle from
/// [`cpu`](Self::cpu).
#[derive(Debug)]
pub struct DmaDomain {
    pub(crate) did: u16,
    pub(crate) system: Arc<System>,
    pub(crate) mem: Arc<PhysMemory>,
    pub(crate) table: VtdPageTable,
    pub(crate) iova: Arc<IovaDomain>,
    /// Units with attached devices; bit `i` of a flush's unit mask is entry `i`.
    units: UnitList,
    devices: Mutex<Vec<SourceId>>,
    pub(crate) tunables: Tunables,
    pub(crate) cpus: Mutex<Vec<Arc<CpuSlot>>>,
    pub(crate) arm: Arc<TimerArm>,
    /// What maps and unmaps pass and a policy switch closes.
    pub(crate) gate: Gate,
    /// The gate's fence pair, also ordering an attach against unmaps (see
    /// `units`).
    pub(crate) barrier: Barrier,
    pub(crate) shutdown: AtomicBool,
    timer: Mutex<Option<JoinHandle<()>>>,
    timer_cache: Mutex<Option<IovaCpuCache>>,
    pub(crate) stale: StaleWindow,
    pub(crate) bounce: Option<BouncePool>,
    pub(crate) bounce_live: AtomicU64,
    pub(crate) bounce_map: Mutex<HashMap<u64, BounceRecord>>,
    switch: Mutex<()>,
    retired: Mutex<DmaStats>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DmaDomain {
    /// A domain over `system`'s memory: a 48-bit IOVA space (IOVA 0 and the
    /// x86 MSI window are never handed out), a VT-d table, a bounce pool,
    /// and a flush timer thread that sleeps while no unmap is pending.
    pub fn new(system: Arc<System>, config: DmaDomainConfig) -> Result<Arc<Self>, DmaError> {
        let mem = system.memory().clone();
        let vtd = if config.coherent {
            VtdConfig::coherent()
        } else {
            VtdConfig::non_coherent()
        };
        let table = VtdPageTable::new(mem.clone(), vtd)?;
        let iova = IovaDomain::new(
            1,
            (1 << (table.iova_bits() - PAGE_SHIFT)) - 1,
            config.iova_policy,
        )?;
        let (msi_lo, msi_hi) = crate::iova::MSI_WINDOW_PFNS;
        iova.reserve(msi_lo, msi_hi)?;
        let bounce = if config.bounce_bytes > 0 {
            let pages = config.bounce_bytes.div_ceil(PAGE_SIZE).next_power_of_two();
            let order = pages.ilog2();
            let phys = mem.alloc_zeroed_frames(order)?;
            let pfn = iova.alloc(pages, iova.end_pfn())?;
            table.map(pfn << PAGE_SHIFT, phys, pages << PAGE_SHIFT, Perm::RW)?;
            Some(BouncePool::new(
                pfn << PAGE_SHIFT,
                phys,
                pages << PAGE_SHIFT,
            ))
        } else {
            None
        };
        // One fence pair for the gate and the timer's arm (see `gate`).
        let barrier = Barrier::default_for_process();
        let d = Arc::new(Self {
            did: config.did,
            system,
            mem,
            table,
            iova,
            units: UnitList::default(),
            devices: Mutex::new(Vec::new()),
            tunables: Tunables::new(config.policy),
            cpus: Mutex::new(Vec::new()),
            arm: Arc::new(TimerArm::new(barrier)),
            gate: Gate::new(barrier),
            barrier,
            shutdown: AtomicBool::new(false),
            timer: Mutex::new(None),
            timer_cache: Mutex::new(None),
            stale: StaleWindow::default(),
            bounce,
            bounce_live: AtomicU64::new(0),
            bounce_map: Mutex::new(HashMap::new()),
            switch: Mutex::new(()),
            retired: Mutex::new(DmaStats::default()),
        });
        *lock(&d.timer_cache) = Some(d.iova.cpu_cache());
        let weak = Arc::downgrade(&d);
        let handle = std::thread::Builder::new()
            .name(format!("dma-fq-timer-{}", config.did))
            .spawn(move || super::timer::run(weak))
            .map_err(|_| DmaError::TimerSpawn)?;
        *lock(&d.timer) = Some(handle);
        Ok(d)
    }

    /// The domain id.
    pub fn did(&self) -> u16 {
        self.did
    }

    /// The page table.
    pub fn table(&self) -> &VtdPageTable {
        &self.table
    }

    /// The IOVA allocator.
    pub fn iova(&self) -> &Arc<IovaDomain> {
        &self.iova
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
    pub fn policy(&self) -> DmaPolicy {
        self.tunables.policy()
    }

    /// Sets the deferred policy's high-water mark (entries; clamped to each
    /// queue's size). Takes effect at the next unmap.
    pub fn set_high_water(&self, entries: usize) {
        self.tunables.high_water.store(entries.max(1), Relaxed);
    }

    /// Sets the deferred policy's timeout. Takes effect at the timer's next
    /// round; a shorter timeout wakes it now.
    pub fn set_timeout(&self, timeout: Duration) {
        self.tunables.timeout_ns.store(
            timeout.as_nanos().clamp(1, u64::MAX as u128) as u64,
            Relaxed,
        );
        self.arm.kick();
    }

    /// Sets the size of the flush queues made from now on (per-CPU handles
    /// made before keep theirs).
    pub fn set_queue_size(&self, entries: usize) {
        self.tunables.fq_size.store(entries.max(1), Relaxed);
    }

    /// Attaches device `sid` (which the system has assigned to a unit) with
    /// DMA mask `mask`. `untrusted` devices have every buffer bounced while
    /// the policy translates.
    pub fn attach(
        self: &Arc<Self>,
        sid: SourceId,
        mask: u64,
        untrusted: bool,
    ) -> Result<DmaDevice, DmaError> {
        let limit_pfn = self.iova.limit_for_mask(mask);
        if limit_pfn < self.iova.start_pfn() {
            return Err(DmaError::MaskTooSmall { mask });
        }
        let ctx = self.context_for(self.policy());
        let (unit, _) = self
            .system
            .unit_of(sid)
            .ok_or(crate::hw::HwError::DeviceNotAssigned { sid })?;
        // The unit joins the mask before the device can translate (see
        // `units`): an unmap racing this attach either invalidates the unit
        // too, or the device's first walk already sees the cleared entries.
        self.units.join(unit, self.barrier)?;
        self.system.attach(sid, ctx)?;
        lock(&self.devices).push(sid);
        Ok(DmaDevice {
            domain: self.clone(),
            sid,
            mask,
            limit_pfn,
            untrusted,
        })
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

    fn context_for(&self, policy: DmaPolicy) -> ContextEntry {
        if policy.is_translated() {
            ContextEntry::Translated {
                did: self.did,
                root: self.table.root(),
            }
        } else {
            ContextEntry::PassThrough
        }
    }

    /// A per-CPU handle: its own IOVA cache, flush queue and counters. Make
    /// one per thread that maps or unmaps.
    pub fn cpu(self: &Arc<Self>) -> DmaCpu {
        let slot = Arc::new(CpuSlot::new(self.tunables.fq_size()));
        lock(&self.cpus).push(slot.clone());
        DmaCpu::new(self.clone(), self.iova.cpu_cache(), slot)
    }

    pub(crate) fn retire(&self, slot: &Arc<CpuSlot>) {
        let mut cpus = lock(&self.cpus);
        cpus.retain(|s| !Arc::ptr_eq(s, slot));
        let mut r = lock(&self.retired);
        *r += slot.stats.snapshot();
        *r += slot.timer_stats.snapshot();
    }

    /// Invalidates the units in `units` (a bit per unit of this domain) for
    /// `[iova, iova + len)` (or the whole domain if `len` is 0) and waits on
    /// each. Returns the number of invalidation requests.
    pub(crate) fn invalidate(&self, units: u64, iova: u64, len: u64) -> Result<u64, DmaError> {
        let mut n = 0;
        for unit in self
            .units
            .in_mask(units)
            .filter_map(|id| self.system.unit(id))
        {
            if len == 0 {
                unit.invalidate_domain(self.did)?;
            } else {
                unit.invalidate_range(self.did, iova, len)?;
            }
            n += 1;
        }
        for unit in self
            .units
            .in_mask(units)
            .filter_map(|id| self.system.unit(id))
        {
            unit.wait()?;
        }
        Ok(n)
    }

    /// Flushes a batch taken from a flush queue: one domain invalidation per
    /// unit with work, one wait per unit, then the IOVAs and table pages are
    /// freed into `cache`. Records the stale window, and the flush in
    /// `stats` (the counters of whoever flushed: the owner or the timer).
    pub(crate) fn flush_batch(
        &self,
        batch: Batch,
        cache: &mut IovaCpuCache,
        stats: &CpuStats,
    ) -> Result<(), DmaError> {
        let n = self.invalidate(batch.units, 0, 0)?;
        if let Some(t) = batch.oldest {
            self.stale.record(t.elapsed(), batch.entries.len() as u64);
        }
        for e in &batch.entries {
            cache.free_retired(e.pfn, e.pages)?;
        }
        for &t in &batch.tables {
            self.mem.free_frames(t, 0)?;
        }
        stats.flush(batch.entries.len() as u64, n);
        Ok(())
    }

    /// The timer's round: flushes every queue whose oldest entry has waited
    /// `age` at `now`; returns the oldest entry still queued, if any.
    pub(crate) fn flush_expired(&self, now: Instant, age: Duration) -> Option<Instant> {
        let cpus = lock(&self.cpus).clone();
        let mut cache_guard = lock(&self.timer_cache);
        let mut oldest: Option<Instant> = None;
        for slot in &cpus {
            let mut taker = slot.fq.taker();
            if let Some(batch) = taker.take_if_older(now, age) {
                if let Some(cache) = cache_guard.as_mut() {
                    // A failed flush leaves the IOVAs allocated: leaked, never
                    // reused before an invalidation.
                    let _ = self.flush_batch(batch, cache, &slot.timer_stats);
                }
            }
            drop(taker);
            if let Some(t) = slot.fq.oldest() {
                oldest = Some(oldest.map_or(t, |o| o.min(t)));
            }
        }
        oldest
    }

    /// Whether any queue holds an entry.
    pub(crate) fn any_queued(&self) -> bool {
        lock(&self.cpus).iter().any(|s| !s.fq.is_empty())
    }

    /// Flushes every queue now (the timer's cache frees the IOVAs).
    pub fn flush_all(&self) -> Result<(), DmaError> {
        let cpus = lock(&self.cpus).clone();
        let mut cache_guard = lock(&self.timer_cache);
        for slot in &cpus {
            let mut taker = slot.fq.taker();
            if let Some(batch) = taker.take_all() {
                if let Some(cache) = cache_guard.as_mut() {
                    self.flush_batch(batch, cache, &slot.timer_stats)?;
                }
            }
        }
        Ok(())
    }

    /// Switches the policy at run time. Between strict, deferred and bounce
    /// any time: live mappings stay valid (leaving deferred flushes every
    /// queue first). To or from pass-through only with no mapping live,
    /// else [`DmaError::PolicySwitchBusy`]; the devices' contexts change and
    /// the domain's IOTLB entries are invalidated.
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
        if old.is_translated() != policy.is_translated() {
            let live = self.stats().live();
            if live > 0 {
                return Err(DmaError::PolicySwitchBusy { live });
            }
        }
        if old == DmaPolicy::Deferred {
            self.flush_all()?;
        }
        if old.is_translated() != policy.is_translated() {
            let ctx = self.context_for(policy);
            for &sid in lock(&self.devices).iter() {
                self.system.attach(sid, ctx)?;
            }
            self.invalidate(self.unit_mask(), 0, 0)?;
        }
        self.tunables.policy.store(policy.to_u8(), Relaxed);
        drop(closed);
        Ok(())
    }

    /// Every CPU's counters summed (handles dropped included).
    pub fn stats(&self) -> DmaStats {
        let mut s = *lock(&self.retired);
        for slot in lock(&self.cpus).iter() {
            s += slot.stats.snapshot();
            s += slot.timer_stats.snapshot();
        }
        s
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

impl Drop for DmaDomain {
    fn drop(&mut self) {
        self.shutdown.store(true, Relaxed);
        self.arm.kick();
        if let Some(h) = lock(&self.timer).take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}
