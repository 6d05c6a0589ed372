//! The per-CPU handle of a DMA domain: where maps and unmaps happen.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use super::bounce::BouncePool;
use super::device::DmaDevice;
use super::domain::{lock, BounceRecord, DmaDomain};
use super::error::DmaError;
use super::flush_queue::{FlushQueue, FqEntry, Pushed};
use super::gate::ActiveFlag;
use super::policy::{DmaDirection, DmaPolicy};
use super::stats::CpuStats;
use crate::iova::{IovaCpuCache, IovaError};
use crate::mem::{PhysAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::pgtable::{IoPageTable, IotlbGather, Perm};

/// What a domain keeps of each CPU: the flag its map/unmap raise while
/// they run (a policy switch waits on it, see [`super::gate`]), its flush
/// queue, its counters.
#[derive(Debug)]
pub(crate) struct CpuSlot {
    pub(crate) active: ActiveFlag,
    pub(crate) fq: FlushQueue,
    pub(crate) stats: CpuStats,
    /// Flushes the timer did of this CPU's queue.
    pub(crate) timer_stats: CpuStats,
}

impl CpuSlot {
    pub(crate) fn new(fq_size: usize) -> Self {
        Self {
            active: ActiveFlag::default(),
            fq: FlushQueue::new(fq_size),
            stats: CpuStats::default(),
            timer_stats: CpuStats::default(),
        }
    }
}

/// One entry of a scatter list: a physically contiguous piece of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SgEntry {
    /// Physical address.
    pub phys: PhysAddr,
    /// Length in bytes (not zero).
    pub len: u64,
}

/// A mapped scatter list, to hand back to [`DmaCpu::unmap_sg`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SgMapping {
    /// The first entry's DMA address.
    pub dma: u64,
    /// Bytes from the first entry's DMA address to the last one's end. When
    /// every inner boundary of the list is page aligned, the device sees the
    /// whole list as one contiguous range `[dma, dma + span)`.
    pub span: u64,
    /// Whether the list was merged into one contiguous range.
    pub contiguous: bool,
    pages: u64,
    entries: usize,
}

/// A thread's handle on a [`DmaDomain`]: map, unmap, scatter lists,
/// coherent allocations. Made by [`DmaDomain::cpu`]; one per thread.
#[derive(Debug)]
pub struct DmaCpu {
    slot: Arc<CpuSlot>,
    w: Work,
}

/// What a map or unmap changes, apart from the slot whose lock it holds:
/// two fields, so a call borrows the slot (for the lock) and the work state
/// (mutably) at once, with no `Arc` clone per call.
#[derive(Debug)]
struct Work {
    domain: Arc<DmaDomain>,
    cache: IovaCpuCache,
    gather: IotlbGather,
    pushes: u32,
}

/// A CPU checks its own queue's age every this many deferred unmaps.
const OWNER_EXPIRY_EVERY: u32 = 16;

fn pages_of(addr: u64, len: u64) -> u64 {
    ((addr & (PAGE_SIZE - 1)) + len).div_ceil(PAGE_SIZE)
}

impl DmaCpu {
    pub(crate) fn new(domain: Arc<DmaDomain>, cache: IovaCpuCache, slot: Arc<CpuSlot>) -> Self {
        Self {
            slot,
            w: Work {
                domain,
                cache,
                gather: IotlbGather::new(),
                pushes: 0,
            },
        }
    }

    /// Refuses a device of another domain: its mask and contexts say
    /// nothing about this domain's IOVAs.
    #[inline]
    fn check_device(&self, dev: &DmaDevice) -> Result<(), DmaError> {
        if Arc::ptr_eq(&dev.domain, &self.w.domain) {
            Ok(())
        } else {
            Err(DmaError::WrongDomain {
                sid: dev.sid.to_string(),
            })
        }
    }

    /// The domain.
    pub fn domain(&self) -> &Arc<DmaDomain> {
        &self.w.domain
    }

    /// This CPU's counters.
    pub fn stats(&self) -> super::DmaStats {
        self.slot.stats.snapshot()
    }

    /// Maps `len` bytes at `phys` for `dev`, moving in direction `dir`;
    /// returns the address the device must use.
    pub fn map(
        &mut self,
        dev: &DmaDevice,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
    ) -> Result<u64, DmaError> {
        self.check_device(dev)?;
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        let (slot, w) = (&*self.slot, &mut self.w);
        let _op = w.domain.gate.enter(&slot.active);
        let addr = match w.domain.policy() {
            DmaPolicy::Passthrough => {
                let end = phys.checked_add(len - 1).ok_or(DmaError::BeyondMask {
                    addr: phys,
                    len,
                    mask: dev.mask,
                })?;
                if end > dev.mask {
                    return Err(DmaError::BeyondMask {
                        addr: phys,
                        len,
                        mask: dev.mask,
                    });
                }
                phys
            }
            DmaPolicy::Bounce => w.bounce_map(slot, phys, len, dir)?,
            _ if dev.untrusted => w.bounce_map(slot, phys, len, dir)?,
            _ => w.map_pages(slot, dev, phys, len, dir.perm())?,
        };
        slot.stats.map();
        Ok(addr)
    }

    /// Unmaps what [`map`](Self::map) returned: the same address and length.
    pub fn unmap(
        &mut self,
        dev: &DmaDevice,
        addr: u64,
        len: u64,
        dir: DmaDirection,
    ) -> Result<(), DmaError> {
        self.check_device(dev)?;
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        let _ = dir;
        let (slot, w) = (&*self.slot, &mut self.w);
        let _op = w.domain.gate.enter(&slot.active);
        if w.try_bounce_unmap(slot, addr, len)? {
            slot.stats.unmap();
            return Ok(());
        }
        match w.domain.policy() {
            DmaPolicy::Passthrough => {}
            policy => w.unmap_pages(slot, addr, len, policy == DmaPolicy::Deferred)?,
        }
        slot.stats.unmap();
        Ok(())
    }

    /// Flushes this CPU's deferred queue now. When it returns, every unmap
    /// this CPU queued before the call has been invalidated, including a
    /// batch the timer took and was still flushing (this waits for it).
    pub fn flush_own(&mut self) -> Result<(), DmaError> {
        self.w.flush_own(&self.slot)
    }

    /// Maps a scatter list into one IOVA block. Entry `i`'s DMA address is
    /// written to `out[i]` (`out` must be at least as long as `sg`). When
    /// every inner boundary is page aligned the list is one contiguous
    /// range for the device.
    pub fn map_sg(
        &mut self,
        dev: &DmaDevice,
        sg: &[SgEntry],
        dir: DmaDirection,
        out: &mut [u64],
    ) -> Result<SgMapping, DmaError> {
        self.check_device(dev)?;
        if sg.is_empty() || sg.iter().any(|e| e.len == 0) {
            return Err(DmaError::ZeroLength);
        }
        if out.len() < sg.len() {
            return Err(DmaError::ZeroLength);
        }
        let policy = self.w.domain.policy();
        if !policy.is_translated() || policy == DmaPolicy::Bounce || dev.untrusted {
            // One mapping per entry; passed through or bounced.
            for (i, e) in sg.iter().enumerate() {
                match self.map(dev, e.phys, e.len, dir) {
                    Ok(a) => out[i] = a,
                    Err(err) => {
                        for (j, p) in sg[..i].iter().enumerate() {
                            let _ = self.unmap(dev, out[j], p.len, dir);
                        }
                        return Err(err);
                    }
                }
            }
            let last = sg.len() - 1;
            return Ok(SgMapping {
                dma: out[0],
                span: out[last] + sg[last].len - out[0],
                contiguous: false,
                pages: 0,
                entries: sg.len(),
            });
        }
        let (slot, w) = (&*self.slot, &mut self.w);
        let _op = w.domain.gate.enter(&slot.active);
        let pages: u64 = sg.iter().map(|e| pages_of(e.phys, e.len)).sum();
        let pfn = w.alloc_iova(slot, dev, pages)?;
        let mut at = pfn << PAGE_SHIFT;
        for (i, e) in sg.iter().enumerate() {
            let n = pages_of(e.phys, e.len);
            if let Err(err) =
                w.domain
                    .table
                    .map_fresh(at, e.phys & !(PAGE_SIZE - 1), n << PAGE_SHIFT, dir.perm())
            {
                if at > pfn << PAGE_SHIFT {
                    let mapped = at - (pfn << PAGE_SHIFT);
                    let _ = w
                        .domain
                        .table
                        .unmap(pfn << PAGE_SHIFT, mapped, &mut w.gather);
                    // Nothing was visible to the device yet, but a walk may
                    // have cached it: invalidate before reuse.
                    let _ = w.domain.invalidate(
                        w.domain.unit_mask_after_clear(),
                        pfn << PAGE_SHIFT,
                        mapped,
                    );
                    w.gather.complete()?;
                }
                w.cache.free(pfn, pages)?;
                return Err(err.into());
            }
            out[i] = at | (e.phys & (PAGE_SIZE - 1));
            at += n << PAGE_SHIFT;
        }
        let contiguous = sg
            .windows(2)
            .all(|w| (w[0].phys + w[0].len) % PAGE_SIZE == 0 && w[1].phys % PAGE_SIZE == 0);
        let last = sg.len() - 1;
        slot.stats.map();
        Ok(SgMapping {
            dma: out[0],
            span: out[last] + sg[last].len - out[0],
            contiguous,
            pages,
            entries: sg.len(),
        })
    }

    /// Unmaps a scatter list mapped by [`map_sg`](Self::map_sg); `dma` and
    /// `sg` must be the ones given and returned then.
    pub fn unmap_sg(
        &mut self,
        dev: &DmaDevice,
        m: &SgMapping,
        sg: &[SgEntry],
        dma: &[u64],
        dir: DmaDirection,
    ) -> Result<(), DmaError> {
        self.check_device(dev)?;
        if m.pages == 0 {
            for (e, &a) in sg.iter().zip(dma).take(m.entries) {
                self.unmap(dev, a, e.len, dir)?;
            }
            return Ok(());
        }
        let (slot, w) = (&*self.slot, &mut self.w);
        let _op = w.domain.gate.enter(&slot.active);
        let start = m.dma & !(PAGE_SIZE - 1);
        let deferred = w.domain.policy() == DmaPolicy::Deferred;
        w.unmap_pages(slot, start, m.pages << PAGE_SHIFT, deferred)?;
        slot.stats.unmap();
        Ok(())
    }

    /// Allocates `len` bytes of zeroed memory the CPU and the device share,
    /// mapped both ways: `(physical address, DMA address)`.
    pub fn alloc_coherent(
        &mut self,
        dev: &DmaDevice,
        len: u64,
    ) -> Result<(PhysAddr, u64), DmaError> {
        self.check_device(dev)?;
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        let (slot, w) = (&*self.slot, &mut self.w);
        let order = len.div_ceil(PAGE_SIZE).next_power_of_two().ilog2();
        let phys = w.domain.mem.alloc_zeroed_frames(order)?;
        // Coherent memory is never bounced: it is the device's by design.
        let r = {
            let _op = w.domain.gate.enter(&slot.active);
            match w.domain.policy() {
                DmaPolicy::Passthrough => Ok(phys),
                _ => w.map_pages(slot, dev, phys, PAGE_SIZE << order, Perm::RW),
            }
        };
        match r {
            Ok(dma) => {
                slot.stats.map();
                Ok((phys, dma))
            }
            Err(e) => {
                w.domain.mem.free_frames(phys, order)?;
                Err(e)
            }
        }
    }

    /// Frees what [`alloc_coherent`](Self::alloc_coherent) returned.
    pub fn free_coherent(
        &mut self,
        dev: &DmaDevice,
        phys: PhysAddr,
        dma: u64,
        len: u64,
    ) -> Result<(), DmaError> {
        self.check_device(dev)?;
        let order = len.max(1).div_ceil(PAGE_SIZE).next_power_of_two().ilog2();
        let (slot, w) = (&*self.slot, &mut self.w);
        {
            let _op = w.domain.gate.enter(&slot.active);
            match w.domain.policy() {
                DmaPolicy::Passthrough => {}
                p => w.unmap_pages(slot, dma, PAGE_SIZE << order, p == DmaPolicy::Deferred)?,
            }
        }
        slot.stats.unmap();
        // The pages may still be reachable until a deferred flush; coherent
        // frees are rare, so flush this CPU's queue before giving them back.
        w.flush_own(slot)?;
        w.domain.mem.free_frames(phys, order)?;
        Ok(())
    }

    /// Makes the CPU's writes to a streaming buffer visible to the device
    /// (bounce mappings: copied in again; others: nothing to do, memory is
    /// coherent).
    pub fn sync_for_device(&mut self, addr: u64, len: u64) -> Result<(), DmaError> {
        self.w.sync(&self.slot, addr, len, true)
    }

    /// Makes the device's writes visible to the CPU (bounce mappings: copied
    /// out; others: nothing to do).
    pub fn sync_for_cpu(&mut self, addr: u64, len: u64) -> Result<(), DmaError> {
        self.w.sync(&self.slot, addr, len, false)
    }
}

impl Work {
    /// Allocates an IOVA block for `pages` pages below the device's mask,
    /// flushing this CPU's deferred queue once if the space is exhausted.
    fn alloc_iova(&mut self, slot: &CpuSlot, dev: &DmaDevice, pages: u64) -> Result<u64, DmaError> {
        match self.cache.alloc(pages, dev.limit_pfn) {
            Ok(pfn) => Ok(pfn),
            Err(IovaError::NoSpace { .. }) => {
                self.flush_own(slot)?;
                self.domain.flush_all()?;
                self.cache.alloc(pages, dev.limit_pfn).map_err(|e| match e {
                    IovaError::NoSpace { .. } => DmaError::NoSpace {
                        len: pages << PAGE_SHIFT,
                    },
                    e => e.into(),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    fn map_pages(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
    ) -> Result<u64, DmaError> {
        let pages = pages_of(phys, len);
        let pfn = self.alloc_iova(slot, dev, pages)?;
        let iova = pfn << PAGE_SHIFT;
        // The block is fresh from this domain's allocator: nothing can be
        // mapped there (see `map_fresh`).
        if let Err(e) =
            self.domain
                .table
                .map_fresh(iova, phys & !(PAGE_SIZE - 1), pages << PAGE_SHIFT, perm)
        {
            self.cache.free(pfn, pages)?;
            return Err(e.into());
        }
        Ok(iova | (phys & (PAGE_SIZE - 1)))
    }

    fn bounce_map(
        &mut self,
        cpu: &CpuSlot,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
    ) -> Result<u64, DmaError> {
        let d = &self.domain;
        let pool = d.bounce.as_ref().ok_or(DmaError::BounceFull { len })?;
        let slot = pool.take(len).ok_or(DmaError::BounceFull { len })?;
        if dir != DmaDirection::FromDevice {
            if let Err(e) = BouncePool::copy_in(&d.mem, &slot, phys, len) {
                let _ = pool.give_back(slot);
                return Err(e.into());
            }
            cpu.stats.bounced(len);
        }
        lock(&d.bounce_map).insert(
            slot.iova,
            BounceRecord {
                slot,
                buf: phys,
                len,
                dir,
            },
        );
        d.bounce_live.fetch_add(1, Relaxed);
        Ok(slot.iova)
    }

    /// Unmaps a bounce slot if `addr` is one: copies the device's data back.
    fn try_bounce_unmap(&mut self, cpu: &CpuSlot, addr: u64, len: u64) -> Result<bool, DmaError> {
        let d = &self.domain;
        let Some(pool) = d.bounce.as_ref() else {
            return Ok(false);
        };
        if !pool.contains(addr) {
            return Ok(false);
        }
        let mut map = lock(&d.bounce_map);
        let rec = match map.get(&addr) {
            Some(r) if r.len == len => *r,
            Some(_) => return Err(DmaError::WrongLength { addr, len }),
            None => return Err(DmaError::NotMapped { addr }),
        };
        map.remove(&addr);
        drop(map);
        if rec.dir != DmaDirection::ToDevice {
            BouncePool::copy_out(&d.mem, &rec.slot, rec.buf, rec.len)?;
            cpu.stats.bounced(rec.len);
        }
        pool.give_back(rec.slot)?;
        d.bounce_live.fetch_sub(1, Relaxed);
        Ok(true)
    }

    fn unmap_pages(
        &mut self,
        slot: &CpuSlot,
        addr: u64,
        len: u64,
        deferred: bool,
    ) -> Result<(), DmaError> {
        let Work {
            domain: d,
            cache,
            gather,
            pushes,
        } = self;
        let pages = pages_of(addr, len);
        let iova = addr & !(PAGE_SIZE - 1);
        let pfn = iova >> PAGE_SHIFT;
        d.iova.check_live_block(pfn, pages).map_err(|e| match e {
            IovaError::WrongSize { .. } => DmaError::WrongLength { addr, len },
            _ => DmaError::NotMapped { addr },
        })?;
        // A shorter length than mapped in the same power-of-two block would
        // leave pages mapped: the page after the claimed end must be unmapped.
        if !pages.is_power_of_two()
            && d.table
                .iova_to_phys(iova + (pages << PAGE_SHIFT))?
                .is_some()
        {
            return Err(DmaError::WrongLength { addr, len });
        }
        d.table
            .unmap(iova, pages << PAGE_SHIFT, gather)
            .map_err(|e| match e {
                crate::pgtable::PgtableError::NotMapped { .. } => DmaError::NotMapped { addr },
                e => e.into(),
            })?;
        if deferred {
            // Until its flush the block is retired, not free: a second unmap
            // of it is refused, and only the flush frees it.
            d.iova.retire_block(pfn, pages)?;
            let tables = gather.defer();
            let entry = FqEntry { pfn, pages };
            let (units, high_water) = (d.unit_mask_after_clear(), d.tunables.high_water());
            loop {
                let queued = match slot.fq.push(entry, &tables, units, high_water) {
                    Pushed::Queued { .. } => {
                        d.arm.on_push();
                        // The owner enforces the age limit too, every few
                        // pushes, so the stale window holds while the timer
                        // thread waits for a core.
                        *pushes = pushes.wrapping_add(1);
                        if pushes.is_multiple_of(OWNER_EXPIRY_EVERY) {
                            let after = d.tunables.flush_after();
                            let mut taker = slot.fq.taker();
                            if let Some(b) = taker.take_if_older(Instant::now(), after) {
                                d.flush_batch(b, cache, &slot.stats)?;
                            }
                        }
                        break;
                    }
                    Pushed::Full => true,
                    Pushed::NoRoom => false,
                };
                let mut taker = slot.fq.taker();
                if let Some(b) = taker.take_all() {
                    d.flush_batch(b, cache, &slot.stats)?;
                }
                if queued {
                    break;
                }
            }
        } else {
            // Every device of the domain can reach its mappings: every unit the
            // domain spans is invalidated, not only this device's.
            let inv = d.invalidate(d.unit_mask_after_clear(), iova, pages << PAGE_SHIFT)?;
            slot.stats.invalidations(inv);
            gather.complete()?;
            cache.free(pfn, pages)?;
        }
        Ok(())
    }

    /// See [`DmaCpu::flush_own`].
    fn flush_own(&mut self, slot: &CpuSlot) -> Result<(), DmaError> {
        let mut taker = slot.fq.taker();
        if let Some(b) = taker.take_all() {
            self.domain.flush_batch(b, &mut self.cache, &slot.stats)?;
        }
        Ok(())
    }

    fn sync(
        &mut self,
        slot: &CpuSlot,
        addr: u64,
        len: u64,
        to_device: bool,
    ) -> Result<(), DmaError> {
        let d = &self.domain;
        if d.bounce_live.load(Relaxed) == 0 {
            return Ok(());
        }
        let Some(rec) = lock(&d.bounce_map).get(&addr).copied() else {
            return Ok(());
        };
        if len > rec.len {
            return Err(DmaError::WrongLength { addr, len });
        }
        if to_device {
            BouncePool::copy_in(&d.mem, &rec.slot, rec.buf, len)?;
        } else {
            BouncePool::copy_out(&d.mem, &rec.slot, rec.buf, len)?;
        }
        slot.stats.bounced(len);
        Ok(())
    }
}

impl Drop for DmaCpu {
    fn drop(&mut self) {
        // Queued IOVAs must not outlive the handle unflushed.
        let _ = self.flush_own();
        self.w.domain.retire(&self.slot);
    }
}
