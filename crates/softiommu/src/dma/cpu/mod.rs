//! The per-CPU handle of a DMA domain: where maps and unmaps happen.

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use super::bounce::BouncePool;
use super::cover::CoverCache;
use super::device::DmaDevice;
use super::domain::{BounceRecord, DmaDomain};
use super::error::DmaError;
use super::flush_queue::{FqEntry, Pushed};
use super::owner::{dir_bits, owner_tag, perm_bits, tag_dir, TAG_DIR, TAG_OWNER};
use super::passthrough::{owner_key, take_any, PT_SG};
use super::policy::{DmaDirection, DmaPolicy};
use super::slot::CpuSlot;
use crate::hw::SourceId;
use crate::iova::{BlockKind, IovaCpuCache, IovaError, RetireRefused};
use crate::mem::{PhysAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::pgtable::{IoPageTable, IotlbGather, LeafHint, Perm, PgtableError};
use crate::sync::lock_std as lock;

mod coherent;
mod sg;
mod syncs;

pub use sg::{SgEntry, SgMapping};

/// A thread's handle on a [`DmaDomain`]: map, unmap, scatter lists,
/// coherent allocations. Made by [`DmaDomain::cpu`]; one per thread.
#[derive(Debug)]
pub struct DmaCpu {
    pub(super) slot: Arc<CpuSlot>,
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
    /// The last leaf table this CPU mapped or unmapped in.
    hint: LeafHint,
    /// Where `domain`'s expiry deadline is, for the deferred unmap's
    /// cover check (used with `domain` only, which never changes).
    cover: CoverCache,
}

/// A CPU checks its own queue's age (and frees what its finished flushes
/// released) at each deferred unmap whose push leaves the queue's count a
/// multiple of this and does not fill it (a push that fills it flushes the
/// whole queue instead), so about every this many unmaps. The check is a
/// backstop: the bound on the stale window rests on the timer and,
/// whatever the scheduling, on the expiry deadline every unmap arms; 64
/// unmaps are tens of microseconds at the rates where the check matters at
/// all, against a 10 ms timeout. At 16 its clock read, taker lock and poll
/// of the flushes in flight cost about 28 instructions a pair (callgrind).
const OWNER_EXPIRY_EVERY: usize = 64;

/// A pass-through record's key for `dev` in `dir`: a scatter-list entry's
/// if `sg` (a constant at every call but the scatter list's, so the single
/// map's and unmap's fast paths build the key they built before).
#[inline(always)]
fn pt_key(dev: &DmaDevice, dir: DmaDirection, sg: bool) -> u64 {
    dev.pt_key(dir) | if sg { owner_key(PT_SG) } else { 0 }
}

/// The pages `[addr, addr + len)` touches; `len` is not zero and the
/// range was checked to lie in the arena (so nothing overflows).
fn pages_of(addr: u64, len: u64) -> u64 {
    ((addr & (PAGE_SIZE - 1)) + len).div_ceil(PAGE_SIZE)
}

impl DmaDomain {
    /// A per-CPU handle: its own IOVA cache, flush queue and counters. Make
    /// one per thread that maps or unmaps.
    pub fn cpu(self: &Arc<Self>) -> DmaCpu {
        let slot = Arc::new(CpuSlot::new(self.tunables.fq_size()));
        lock(&self.cpus).push(slot.clone());
        DmaCpu::new(self.clone(), self.iova.cpu_cache_unbiased(), slot)
    }
}

impl DmaCpu {
    pub(crate) fn new(domain: Arc<DmaDomain>, cache: IovaCpuCache, slot: Arc<CpuSlot>) -> Self {
        Self {
            slot,
            w: Work {
                domain,
                cache,
                gather: IotlbGather::new(),
                hint: LeafHint::default(),
                cover: CoverCache::default(),
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
            Err(wrong_domain(dev.sid))
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
    /// returns the address the device must use. The buffer must lie in
    /// physical memory and outside the IOMMU's own frames.
    ///
    /// Inlined into its caller: the pass-through map is a few dozen
    /// instructions, which a call's saves and restores would add to.
    #[inline(always)]
    pub fn map(
        &mut self,
        dev: &DmaDevice,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
    ) -> Result<u64, DmaError> {
        self.map_as(dev, phys, len, dir, false)
    }

    /// [`map`](Self::map), of a scatter-list entry mapped on its own if
    /// `sg` (its pass-through record carries [`PT_SG`]).
    #[inline(always)]
    fn map_as(
        &mut self,
        dev: &DmaDevice,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
        sg: bool,
    ) -> Result<u64, DmaError> {
        self.check_device(dev)?;
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        let (slot, w) = (&*self.slot, &mut self.w);
        if let Err(e) = w.domain.mem.check_device_range(phys, len) {
            return Err(range_error(e));
        }
        let op = w.domain.gate.enter(&slot.active);
        // The pass-through map inline (a probe of this CPU's record); the
        // rest out of line. In the arena (checked above), so no sum wraps.
        if w.domain.tunables.is_passthrough() && phys + (len - 1) <= dev.mask {
            slot.passthrough.add_keyed(phys, len, pt_key(dev, dir, sg));
            slot.stats.map();
            return Ok(phys);
        }
        // Strict and deferred maps of a device that does not bounce (the
        // usual translated map) inline too: `map_entered` would choose
        // `map_pages` for them, behind a call frame, spills and a result
        // passed through memory. Measured (`bench dma --instructions`):
        // the deferred pair 651 -> 551 instructions, strict 3,254 -> 3,170,
        // pass-through 137.6 -> 140.0.
        if !dev.untrusted && w.domain.tunables.is_strict_or_deferred() {
            let r = w.map_translated(slot, dev, phys, len, dir.perm());
            drop(op);
            return r;
        }
        let r = w.map_entered(slot, dev, phys, len, dir, sg);
        drop(op);
        r
    }

    /// Unmaps what [`map`](Self::map) returned: the same address and length.
    /// Anything else — an address never mapped or unmapped already, a
    /// wrong length — is refused with nothing changed, in every policy
    /// and under concurrency (of two unmaps of one mapping, one fails).
    /// Inlined into its caller, as [`map`](Self::map) is.
    #[inline(always)]
    pub fn unmap(
        &mut self,
        dev: &DmaDevice,
        addr: u64,
        len: u64,
        dir: DmaDirection,
    ) -> Result<(), DmaError> {
        self.unmap_as(dev, addr, len, dir, false)
    }

    /// [`unmap`](Self::unmap) of what [`map_as`](Self::map_as) mapped with
    /// the same `sg`.
    #[inline(always)]
    fn unmap_as(
        &mut self,
        dev: &DmaDevice,
        addr: u64,
        len: u64,
        dir: DmaDirection,
        sg: bool,
    ) -> Result<(), DmaError> {
        self.check_device(dev)?;
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        let (slot, w) = (&*self.slot, &mut self.w);
        let op = w.domain.gate.enter(&slot.active);
        // In pass-through no bounce slot is live (a switch waits for every
        // mapping to go, and pass-through never bounces), so a mapping this
        // CPU recorded is the answer the bounce check would not change:
        // the usual unmap is one probe, inline; the rest out of line.
        if w.domain.tunables.is_passthrough()
            && slot.passthrough.take_keyed(addr, len, pt_key(dev, dir, sg))
        {
            slot.stats.unmap();
            return Ok(());
        }
        // A deferred unmap of an address no bounce pool holds: straight to
        // `unmap_pages`, as `unmap_entered` would take it, past its policy
        // dispatch. Out of line: inline as well, it saved the deferred
        // pair 11 instructions and cost pass-through 13 (the caller's loop
        // spills around it).
        if w.domain.tunables.is_deferred() && w.domain.bounce.find(addr).is_none() {
            let r = w.unmap_deferred(slot, dev, addr, len, dir);
            drop(op);
            return r.map_err(|e| *e);
        }
        let r = w.unmap_entered(slot, dev, addr, len, dir, sg);
        drop(op);
        r
    }

    /// Flushes this CPU's deferred queue now, and retries any flush that
    /// failed before. When it returns `Ok`, every unmap this CPU queued
    /// before the call has been invalidated, including a batch the timer
    /// took and was still flushing (this waits for it).
    pub fn flush_own(&mut self) -> Result<(), DmaError> {
        self.w.flush_own(&self.slot)
    }
}

impl Work {
    /// Allocates an IOVA block for `pages` pages below the device's mask,
    /// flushing this CPU's deferred queue once if the space is exhausted.
    // Always inlined (with the cache's `alloc`) into `map_pages`, the one
    // hot caller: callgrind counted the two calls' frames at ~30
    // instructions a map.
    #[inline(always)]
    fn alloc_iova(&mut self, slot: &CpuSlot, dev: &DmaDevice, pages: u64) -> Result<u64, DmaError> {
        // The low window first, if the domain says so, then the mask; the
        // caches are given back only for the second try, and a full space
        // is the slow path's (a flush of the deferred queues).
        match self
            .cache
            .alloc_within(pages, dev.limit_pfn, dev.mask_limit_pfn)
        {
            Ok(pfn) => Ok(pfn),
            Err(e) => self.alloc_iova_slow(slot, dev, pages, e),
        }
    }

    /// [`alloc_iova`](Self::alloc_iova) for a mapping of `kind`, marked
    /// before it is mapped or handed out (a plain block needs no mark: it
    /// is what every allocation starts as; see [`free_fresh`](Self::free_fresh)
    /// for the way back).
    #[inline(always)]
    fn alloc_iova_as(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        pages: u64,
        kind: BlockKind,
    ) -> Result<u64, DmaError> {
        let pfn = self.alloc_iova(slot, dev, pages)?;
        if kind != BlockKind::Plain {
            if let Err(e) = self
                .domain
                .iova
                .set_kind(pfn, pages, BlockKind::Plain, kind)
            {
                self.cache.free(pfn, pages)?;
                return Err(DmaError::Iova(e));
            }
        }
        Ok(pfn)
    }

    /// `alloc_iova` when the cache refused: out of space (flush and try
    /// once more) or a request it can never satisfy.
    #[cold]
    #[inline(never)]
    fn alloc_iova_slow(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        pages: u64,
        first: IovaError,
    ) -> Result<u64, DmaError> {
        let no_space = |e| match e {
            IovaError::NoSpace { .. } | IovaError::TooLarge { .. } => DmaError::NoSpace {
                len: pages.saturating_mul(PAGE_SIZE),
            },
            e => e.into(),
        };
        match first {
            IovaError::NoSpace { .. } => {
                self.flush_own(slot)?;
                self.domain.flush_all()?;
                self.cache
                    .alloc(pages, dev.mask_limit_pfn)
                    .map_err(no_space)
            }
            e => Err(no_space(e)),
        }
    }

    // Always inlined: into `DmaCpu::map` (through `map_translated`), the
    // hot caller, it saves the call frame, the spills and the result
    // passed through memory (~100 instructions a deferred pair by
    // callgrind); `map_entered` and the coherent allocation's caller get
    // copies as well.
    #[inline(always)]
    fn map_pages(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
        kind: BlockKind,
    ) -> Result<u64, DmaError> {
        let pages = pages_of(phys, len);
        let pfn = self.alloc_iova_as(slot, dev, pages, kind)?;
        let iova = pfn << PAGE_SHIFT;
        // The block is fresh from this domain's allocator: nothing can be
        // mapped there (see `map_fresh`).
        if let Err(e) = self.domain.table.map_hinted(
            iova,
            phys & !(PAGE_SIZE - 1),
            pages << PAGE_SHIFT,
            perm,
            &mut self.hint,
        ) {
            self.free_fresh(pfn, pages, kind)?;
            return Err(e.into());
        }
        // The tag shares the block's state word (claimed with the block):
        // one store of the whole word, after the mapping exists.
        let tag = span_tag(phys, len) | owner_tag(dev.owner, perm_bits(perm));
        if let Err(e) = self.cache.tag_fresh(pfn, pages, kind, tag) {
            self.unmap_fresh(iova, pages, kind)?;
            return Err(e.into());
        }
        Ok(iova | (phys & (PAGE_SIZE - 1)))
    }

    /// Undoes a [`map_pages`](Self::map_pages) whose address was never
    /// handed out: the entries cleared and invalidated (a stray walk may
    /// have cached them), then the block freed; if the invalidation fails
    /// the block stays allocated (leaked), never reused under a stale
    /// entry.
    #[cold]
    fn unmap_fresh(&mut self, iova: u64, pages: u64, kind: BlockKind) -> Result<(), DmaError> {
        let len = pages << PAGE_SHIFT;
        self.domain.table.unmap(iova, len, &mut self.gather)?;
        let units = self.domain.unit_mask_after_clear();
        self.domain.invalidate(units, iova, len)?;
        self.gather.complete()?;
        self.free_fresh(iova >> PAGE_SHIFT, pages, kind)
    }

    /// Gives back a block this thread allocated and marked `kind` but never
    /// handed out: the mark comes off, then the block goes to the cache.
    fn free_fresh(&mut self, pfn: u64, pages: u64, kind: BlockKind) -> Result<(), DmaError> {
        if kind != BlockKind::Plain {
            self.domain
                .iova
                .set_kind(pfn, pages, kind, BlockKind::Plain)
                .map_err(DmaError::Iova)?;
        }
        self.cache.free(pfn, pages)?;
        Ok(())
    }

    /// Bounces `len` bytes at `phys` for `dev`: a slot of whole pages
    /// taken, filled (the buffer at its own page offset, the rest of the
    /// pages zeroed), and those pages alone mapped with `dir`'s
    /// permission. A failed map leaves nothing mapped and the slot free.
    fn bounce_map(
        &mut self,
        cpu: &CpuSlot,
        dev: &DmaDevice,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
        sg: bool,
    ) -> Result<u64, DmaError> {
        let d = &self.domain;
        let (pool_index, pool) = dev
            .bounce
            .and_then(|i| Some((i, d.bounce.get(i)?)))
            .ok_or(DmaError::BounceUnavailable { mask: dev.mask })?;
        let slot = pool
            .take(phys, len, dir)
            .ok_or(DmaError::BounceFull { len })?;
        // Whatever the direction: a `FromDevice` slot starts as the
        // caller's buffer, so the copy back at unmap returns the caller's
        // own bytes where the device wrote none (module `bounce`).
        if let Err(e) = BouncePool::fill(&d.mem, &slot, phys, len) {
            let _ = pool.give_back(slot);
            return Err(e.into());
        }
        // The slot's pages were unmapped (and invalidated) before it was
        // given back, or never mapped: nothing is mapped there.
        if let Err(e) = d.table.map_hinted(
            slot.iova,
            slot.phys,
            slot.mapped_bytes(),
            dir.perm(),
            &mut self.hint,
        ) {
            let _ = pool.give_back(slot);
            return Err(e.into());
        }
        cpu.stats.bounced(len);
        lock(&d.bounce_map).insert(
            slot.dma(),
            BounceRecord {
                slot,
                pool: pool_index,
                buf: phys,
                len,
                dir,
                sid: dev.sid,
                sg,
            },
        );
        d.bounce_live.fetch_add(1, Relaxed);
        Ok(slot.dma())
    }

    /// A strict or deferred map of a device that does not bounce.
    #[inline(always)]
    fn map_translated(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
    ) -> Result<u64, DmaError> {
        // Matched, not kept whole and returned: the `Ok` path then returns
        // the address alone rather than copying an error-sized result
        // through the stack (`bench dma --instructions`: deferred 10 a
        // pair fewer, pass-through unchanged).
        match self.map_pages(slot, dev, phys, len, perm, BlockKind::Plain) {
            Ok(a) => {
                slot.stats.map();
                Ok(a)
            }
            Err(e) => Err(e),
        }
    }

    /// A deferred unmap of an address no bounce pool holds. The error
    /// boxed: the result is one register, where a `DmaError` returned in
    /// place cost the `Ok` path a store of every field of the enum (11
    /// instructions a pair, and the caller's copy).
    #[inline(never)]
    fn unmap_deferred(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        addr: u64,
        len: u64,
        dir: DmaDirection,
    ) -> Result<(), Box<DmaError>> {
        let owner = owner_tag(dev.owner, dir_bits(dir));
        match self.unmap_pages(slot, addr, len, true, BlockKind::Plain, dev, owner) {
            Ok(()) => {
                slot.stats.unmap();
                Ok(())
            }
            Err(e) => Err(Box::new(e)),
        }
    }

    /// [`DmaCpu::map`] past its pass-through fast path, inside the gate.
    #[inline(never)]
    fn map_entered(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
        sg: bool,
    ) -> Result<u64, DmaError> {
        let addr = match self.domain.policy() {
            DmaPolicy::Passthrough => {
                // The fast path took every pass-through map within the
                // mask.
                return Err(DmaError::BeyondMask {
                    addr: phys,
                    len,
                    mask: dev.mask,
                });
            }
            DmaPolicy::Bounce => self.bounce_map(slot, dev, phys, len, dir, sg)?,
            _ if dev.untrusted => self.bounce_map(slot, dev, phys, len, dir, sg)?,
            // `map_as` takes these inline before it comes here.
            _ => return self.map_translated(slot, dev, phys, len, dir.perm()),
        };
        slot.stats.map();
        Ok(addr)
    }

    /// [`DmaCpu::unmap`] past its pass-through fast path, inside the gate.
    #[inline(never)]
    fn unmap_entered(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        addr: u64,
        len: u64,
        dir: DmaDirection,
        sg: bool,
    ) -> Result<(), DmaError> {
        let policy = self.domain.policy();
        if self.try_bounce_unmap(slot, addr, len, dev.sid, dir, sg)? {
            slot.stats.unmap();
            return Ok(());
        }
        match policy {
            DmaPolicy::Passthrough => {
                // Mapped on another CPU (or on one whose handle went).
                self.take_other_pt(addr, len, dev.sid, dir, sg)?;
            }
            policy => self.unmap_pages(
                slot,
                addr,
                len,
                policy == DmaPolicy::Deferred,
                BlockKind::Plain,
                dev,
                owner_tag(dev.owner, dir_bits(dir)),
            )?,
        }
        slot.stats.unmap();
        Ok(())
    }

    /// A pass-through unmap this CPU's record did not hold: taken from
    /// another CPU's (or the retired handles') record, or refused with the
    /// reason.
    #[cold]
    #[inline(never)]
    fn take_other_pt(
        &mut self,
        addr: u64,
        len: u64,
        sid: SourceId,
        dir: DmaDirection,
        sg: bool,
    ) -> Result<(), DmaError> {
        let cpus = lock(&self.domain.cpus).clone();
        take_any(
            &self.domain.pt_retired,
            cpus.iter().map(|s| &s.passthrough),
            addr,
            len,
            sid,
            dir,
            sg,
        )
    }

    /// Unmaps a bounce slot if `addr` is one: copies the device's data back.
    #[inline]
    fn try_bounce_unmap(
        &mut self,
        cpu: &CpuSlot,
        addr: u64,
        len: u64,
        sid: SourceId,
        dir: DmaDirection,
        sg: bool,
    ) -> Result<bool, DmaError> {
        if self.domain.bounce.find(addr).is_none() {
            return Ok(false);
        }
        self.bounce_unmap(cpu, addr, len, sid, dir, sg)
            .map(|()| true)
    }

    /// Unmaps the bounce slot at `addr` (in a pool): checked against its
    /// record (and the record taken, so that of two racing unmaps one
    /// fails), then released (see [`bounce_release`](Self::bounce_release)).
    #[inline(never)]
    fn bounce_unmap(
        &mut self,
        cpu: &CpuSlot,
        addr: u64,
        len: u64,
        sid: SourceId,
        dir: DmaDirection,
        sg: bool,
    ) -> Result<(), DmaError> {
        // The wait below must not wait for this thread's own section:
        // checked before anything changes.
        self.domain.check_callers()?;
        let rec = {
            let mut map = lock(&self.domain.bounce_map);
            let rec = match map.get(&addr) {
                Some(r) => *r,
                None => return Err(DmaError::NotMapped { addr }),
            };
            check_bounce_owner(&rec, addr, len, sid, dir, sg)?;
            map.remove(&addr);
            rec
        };
        self.bounce_release(cpu, &rec)
    }

    /// Releases a bounce mapping whose record was taken: its pages
    /// unmapped, invalidated on every unit of the domain and waited for
    /// (strict, whatever the policy), the device's data copied back
    /// (`FromDevice`, `Bidirectional`), then the slot given back. If the
    /// invalidation fails the slot (and any table page unlinked) is kept
    /// out of use for good: leaked, never reused while a device may still
    /// reach it.
    fn bounce_release(&mut self, cpu: &CpuSlot, rec: &BounceRecord) -> Result<(), DmaError> {
        let d = &*self.domain;
        let (iova, bytes) = (rec.slot.iova, rec.slot.mapped_bytes());
        if let Err(e) = d
            .table
            .unmap_hinted(iova, bytes, &mut self.gather, &mut self.hint, true)
        {
            // Nothing was cleared: the mapping is live again.
            lock(&d.bounce_map).insert(rec.slot.dma(), *rec);
            return Err(e.into());
        }
        d.bounce_live.fetch_sub(1, Relaxed);
        match d.invalidate(d.unit_mask_after_clear(), iova, bytes) {
            Ok(n) => cpu.stats.invalidations(n),
            Err(e) => {
                drop(self.gather.defer());
                return Err(e);
            }
        }
        self.gather.complete()?;
        if rec.dir != DmaDirection::ToDevice {
            BouncePool::copy_out(&d.mem, &rec.slot, rec.buf, rec.len)?;
            cpu.stats.bounced(rec.len);
        }
        if let Some(pool) = d.bounce.get(rec.pool) {
            pool.give_back(rec.slot)?;
        }
        Ok(())
    }

    /// Unmaps a translated mapping: strict (revoked before returning) or
    /// deferred (queued for the next flush). Either way the IOVA block is
    /// first *retired* with one compare-exchange, so that of two unmaps of
    /// one mapping racing each other exactly one proceeds, and every check
    /// that can fail runs before an entry is cleared: a failed unmap leaves
    /// the mapping as it was. A streaming (`Plain`) block's tag must be
    /// exactly the unmap's `span_tag` with `owner` (the device's and the
    /// direction's bits); a scatter list's block's tag `SG_TAG | owner`;
    /// a coherent block's owner is checked by its caller (`owner` unused).
    #[allow(clippy::too_many_arguments)]
    // Always inlined, as `map_pages`: into `unmap_deferred`, the hot
    // caller, and `unmap_entered` (the scatter list's and the coherent
    // free's callers get copies).
    #[inline(always)]
    fn unmap_pages(
        &mut self,
        slot: &CpuSlot,
        addr: u64,
        len: u64,
        deferred: bool,
        kind: BlockKind,
        dev: &DmaDevice,
        owner: u32,
    ) -> Result<(), DmaError> {
        let iova = addr & !(PAGE_SIZE - 1);
        let pfn = iova >> PAGE_SHIFT;
        let pages = (addr & (PAGE_SIZE - 1))
            .checked_add(len)
            .map(|n| n.div_ceil(PAGE_SIZE))
            .ok_or(DmaError::WrongLength { addr, len })?;
        // The one step that decides between racing unmaps: the block goes
        // from live to retired (or the unmap is refused, with the reason).
        // A block another kind of mapping holds is refused (`NotMapped`):
        // a streaming unmap cannot take a scatter list's or a coherent
        // buffer's block, whose owner would later free a reused IOVA.
        // A streaming mapping's block must also carry the exact bytes, the
        // device and the direction of this unmap (as DMA-API debug checks
        // an unmap against its map: another start in the page was never
        // mapped, another end is the wrong length), checked by the same
        // compare-exchange: its tag shares the block's state word.
        let block_error = |e| match e {
            IovaError::WrongSize { .. } => DmaError::WrongLength { addr, len },
            _ => DmaError::NotMapped { addr },
        };
        // A scatter list's block: its device and direction too (a stale
        // `SgMapping` replayed over another device's list, or another
        // direction's, at the same IOVA), checked before the block is
        // retired, so a refused replay never holds the list's block.
        let tag = if kind == BlockKind::Plain {
            let want = span_tag(addr, len) | owner;
            match self.cache.retire_tagged(pfn, pages, want) {
                Ok(()) => want,
                Err(RetireRefused::Tag(tag)) => {
                    return Err(tag_mismatch(tag, want, addr, len, dev.sid))
                }
                Err(RetireRefused::Block(e)) => return Err(block_error(e)),
            }
        } else {
            let (mask, want) = if kind == BlockKind::ScatterList {
                (SG_TAG | TAG_DIR | TAG_OWNER, SG_TAG | owner)
            } else {
                (0, 0)
            };
            match self.cache.retire_block_of(pfn, pages, kind, mask, want) {
                Ok(tag) => tag,
                Err(RetireRefused::Tag(tag)) => {
                    return Err(tag_mismatch(tag & mask, want, addr, len, dev.sid))
                }
                Err(RetireRefused::Block(e)) => return Err(block_error(e)),
            }
        };
        if let Err(e) = self.unmap_checks(slot, iova, pages, deferred) {
            // Nothing was changed: the block is the caller's again.
            let _ = self.domain.iova.unretire_block(pfn, pages, kind, tag);
            return Err(match e {
                DmaError::WrongLength { .. } => DmaError::WrongLength { addr, len },
                e => e,
            });
        }
        let Work {
            domain: d,
            cache,
            gather,
            hint,
            cover,
        } = self;
        if let Err(e) = d
            .table
            .unmap_hinted(iova, pages << PAGE_SHIFT, gather, hint, !deferred)
        {
            // Nothing was cleared (a failed unmap changes nothing): the
            // block is the caller's again.
            let _ = d.iova.unretire_block(pfn, pages, kind, tag);
            return Err(match e {
                PgtableError::NotMapped { .. } => DmaError::NotMapped { addr },
                e => e.into(),
            });
        }
        if deferred {
            // Until its flush the block is retired, not free: a second unmap
            // of it is refused, and only the flush frees it.
            let entry = FqEntry { pfn, pages };
            // The barrier mode read once for both light fences (the
            // mask's after the clear, the arm's after the push).
            let barrier = d.barrier;
            let (units, high_water) = (d.units.mask_after_clear(barrier), d.tunables.high_water());
            // The usual unmap unlinked no table: a push with none, its
            // check folded away; else the tables go with the entry.
            let pushed = if gather.defer_if_no_tables() {
                slot.fq.push(entry, &[], high_water)
            } else {
                slot.fq.push(entry, &gather.defer(), high_water)
            };
            if matches!(pushed, Pushed::NoRoom) {
                // Room was made above and only this CPU pushes.
                return Err(DmaError::QueueFull {
                    capacity: slot.fq.capacity(),
                });
            }
            d.arm.on_push_with(barrier);
            // After `on_push`'s light fence: the deadline that bounds this
            // unmap's stale window is armed before it returns (one load
            // per unit when one is).
            cover.cover(d, units);
            match pushed {
                Pushed::Full => flush_full_queue(d, slot, cache),
                // The owner enforces the age limit too, every few pushes
                // (the queue's count, in hand from the push), so the stale
                // window holds while the timer thread waits for a core.
                Pushed::Queued { pushed: n, .. } if n.is_multiple_of(OWNER_EXPIRY_EVERY) => {
                    owner_expiry_check(d, slot, cache)
                }
                _ => {}
            }
        } else {
            // Every device of the domain can reach its mappings: every unit the
            // domain spans is invalidated, not only this device's. An `Ok`
            // means revoked (through the queue or around it).
            let inv = d.invalidate(d.unit_mask_after_clear(), iova, pages << PAGE_SHIFT)?;
            slot.stats.invalidations(inv);
            gather.complete()?;
            cache.free_retired(pfn, pages)?;
        }
        Ok(())
    }

    /// What an unmap checks once it holds the block, before it clears
    /// anything: the length (a shorter one than mapped in the same
    /// power-of-two block would leave pages mapped), room in the queue
    /// (deferred; only this CPU pushes, so room cannot shrink before the
    /// push: a queue left full by failed flushes is flushed now), or that
    /// this thread holds no section its wait would wait for (strict).
    #[inline]
    fn unmap_checks(
        &mut self,
        slot: &CpuSlot,
        iova: u64,
        pages: u64,
        deferred: bool,
    ) -> Result<(), DmaError> {
        if !pages.is_power_of_two()
            && self
                .domain
                .table
                .iova_to_phys(iova + (pages << PAGE_SHIFT))?
                .is_some()
        {
            return Err(DmaError::WrongLength {
                addr: iova,
                len: pages << PAGE_SHIFT,
            });
        }
        if deferred {
            if slot.fq.len() >= slot.fq.capacity() {
                self.flush_own(slot)?;
            }
        } else {
            self.domain.check_callers()?;
        }
        Ok(())
    }

    /// See [`DmaCpu::flush_own`].
    fn flush_own(&mut self, slot: &CpuSlot) -> Result<(), DmaError> {
        // First: a thread in a section could wait for a taker that waits
        // for its section.
        self.domain.check_callers()?;
        // The own queue is taken whatever the retry does: a batch whose
        // flush fails is kept by the domain (for the timer), never left in
        // a queue whose handle may be going away.
        let retried = self.domain.retry_pending(&mut self.cache, &slot.stats);
        let mut taker = slot.fq.taker();
        if let Some(b) = taker.take_all() {
            self.domain.issue_flush(b)?;
        }
        // What this CPU issued now or earlier, freed before the return.
        self.domain
            .complete_flushes(&mut self.cache, &slot.stats, true)?;
        retried
    }
}

/// A deferred unmap filled its queue to the high-water mark: the queue is
/// taken and its flush issued, not waited for (its IOVAs are freed by a
/// later look: here, at the next check, or the timer's round). Out of line:
/// one unmap in the high-water mark gets here, and kept inline its
/// registers cost every unmap a larger frame.
#[cold]
#[inline(never)]
fn flush_full_queue(d: &DmaDomain, slot: &CpuSlot, cache: &mut IovaCpuCache) {
    if let Some(mut taker) = slot.fq.try_taker() {
        if let Some(b) = taker.take_all() {
            slot.stats.own_flush();
            // A failed flush keeps its batch for a retry and is counted;
            // the unmap that got here is done.
            let _ = d.issue_flush(b);
        }
        drop(taker);
        d.reap_owned(cache, &slot.stats);
    }
}

/// The owner's own age check of its queue, every [`OWNER_EXPIRY_EVERY`]
/// deferred unmaps (out of line, as [`flush_full_queue`]): a queue whose
/// oldest entry waited `flush_after` is taken and flushed; if a taker
/// holds it (the timer, or `flush_all`, possibly off its CPU mid-flush),
/// a batch past its age leaves the IOTLB now, lock-free.
#[cold]
#[inline(never)]
fn owner_expiry_check(d: &DmaDomain, slot: &CpuSlot, cache: &mut IovaCpuCache) {
    let after = d.tunables.flush_after();
    // Never blocks: a taker that holds the queue is flushing it already
    // (and may be waiting for a section this thread holds).
    let now = Instant::now();
    if let Some(mut taker) = slot.fq.try_taker() {
        if let Some(b) = taker.take_if_older(now, after) {
            slot.stats.own_flush();
            // A failed flush keeps its batch for a retry and is counted;
            // this unmap itself is done.
            let _ = d.issue_flush(b);
        }
        drop(taker);
        d.reap_owned(cache, &slot.stats);
    } else if slot
        .fq
        .oldest()
        .is_some_and(|t| now.saturating_duration_since(t) >= after)
    {
        d.drop_cached();
    }
}

/// The error of a device of another domain (out of line: the map and
/// unmap fast paths are inlined into their callers).
#[cold]
#[inline(never)]
fn wrong_domain(sid: SourceId) -> DmaError {
    DmaError::WrongDomain {
        sid: sid.to_string(),
    }
}

/// A memory error of a map's range, as the map returns it (out of line,
/// as [`wrong_domain`]).
#[cold]
#[inline(never)]
fn range_error(e: crate::mem::MemError) -> DmaError {
    e.into()
}

/// Checks an unmap of `[addr, addr + len)` by `sid` in `dir` against the
/// bounce slot's record, in DMA-API debug's order: the kind (a single
/// unmap names no scatter list's entry, nor `unmap_sg` a single mapping:
/// `NotMapped`, as in pass-through), the length, the device, the
/// direction.
fn check_bounce_owner(
    rec: &BounceRecord,
    addr: u64,
    len: u64,
    sid: SourceId,
    dir: DmaDirection,
    sg: bool,
) -> Result<(), DmaError> {
    if rec.sg != sg {
        Err(DmaError::NotMapped { addr })
    } else if rec.len != len {
        Err(DmaError::WrongLength { addr, len })
    } else if rec.sid != sid {
        Err(DmaError::WrongDevice {
            sid: sid.to_string(),
        })
    } else if rec.dir != dir {
        Err(DmaError::WrongDirection {
            addr,
            mapped: rec.dir,
            asked: dir,
        })
    } else {
        Ok(())
    }
}

/// The reason an unmap's tag `want` differs from its block's `tag`, in
/// DMA-API debug's order: the start, the length, the device, the direction
/// (a block no mapping tagged: nothing mapped there).
#[cold]
fn tag_mismatch(tag: u32, want: u32, addr: u64, len: u64, sid: SourceId) -> DmaError {
    let diff = tag ^ want;
    // A block no mapping tagged (one being mapped, a bounce lane's):
    // nothing mapped there for this unmap.
    if tag & SPAN_TAG == 0 || diff & TAG_OFFSET != 0 {
        DmaError::NotMapped { addr }
    } else if diff & !(TAG_DIR | TAG_OWNER) != 0 {
        DmaError::WrongLength { addr, len }
    } else if diff & TAG_OWNER != 0 {
        DmaError::WrongDevice {
            sid: sid.to_string(),
        }
    } else {
        DmaError::WrongDirection {
            addr,
            mapped: tag_dir(tag),
            asked: tag_dir(want),
        }
    }
}

impl Drop for DmaCpu {
    fn drop(&mut self) {
        // Queued IOVAs must not outlive the handle unflushed; a failed
        // flush keeps its batch for the timer.
        let _ = self.flush_own();
        self.w.domain.retire(&self.slot);
    }
}

/// The tag a translated mapping of `len` bytes at `addr` (physical or
/// IOVA: the page offset is the same) leaves on its block: the offset of
/// its first byte and of its end in their pages, and a bit that makes it
/// non-zero. With the page count, which the block's state checks, it
/// gives the length to the byte.
#[inline]
fn span_tag(addr: u64, len: u64) -> u32 {
    const _: () = assert!(TAG_OFFSET == (PAGE_SIZE - 1) as u32);
    let off = addr & (PAGE_SIZE - 1);
    let end = off.wrapping_add(len) & (PAGE_SIZE - 1);
    SPAN_TAG | ((end as u32) << 12) | off as u32
}

/// The bit every streaming mapping's tag has: a block without it was
/// tagged by no mapping (an allocation starts untagged).
const SPAN_TAG: u32 = 1 << 31;

/// The bits of a [`span_tag`] that hold the start's offset in its page.
const TAG_OFFSET: u32 = 0xfff;

/// The bit every page tag of a scatter list's block has (its first
/// page's tag also holds the list's owner bits).
const SG_TAG: u32 = 1 << 31;

/// In a scatter list's page tag (not the block's first page, which is
/// always an entry's first): the page is its entry's first.
const SG_FIRST: u32 = 1 << 24;

/// The tag of page `i` of the `n` pages of scatter-list entry `e`:
/// [`SG_TAG`], [`SG_FIRST`] on its first page, the offset of the entry's
/// first byte on its first page (bits 0..12) and of its end on its last
/// page (bits 12..24; 0: the page's end). A sync reads them to stay
/// inside one entry.
fn sg_page_tag(e: &SgEntry, i: u64, n: u64) -> u32 {
    let mut tag = SG_TAG;
    if i == 0 {
        tag |= SG_FIRST | (e.phys & (PAGE_SIZE - 1)) as u32;
    }
    if i + 1 == n {
        tag |= (((e.phys + e.len) & (PAGE_SIZE - 1)) as u32) << 12;
    }
    tag
}
