//! The per-CPU handle of a DMA domain: where maps and unmaps happen.

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use super::bounce::BouncePool;
use super::device::DmaDevice;
use super::domain::{BounceRecord, CoherentRecord, DmaDomain};
use super::error::DmaError;
use super::flush_queue::{FqEntry, Pushed};
use super::owner::{dir_bits, owner_tag, perm_bits, tag_dir, TAG_DIR, TAG_OWNER};
use super::passthrough::{pt_owner, take_any};
use super::policy::{DmaDirection, DmaPolicy};
use super::slot::CpuSlot;
use crate::hw::SourceId;
use crate::iova::{BlockKind, IovaCpuCache, IovaError};
use crate::mem::{FrameOwner, PhysAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::pgtable::{IoPageTable, IotlbGather, LeafHint, Perm, PgtableError};
use crate::sync::lock_std as lock;

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
    /// When the list was merged into one contiguous range (every inner
    /// boundary page aligned, policy translating): the bytes from the first
    /// entry's DMA address to the last one's end, `[dma, dma + span)`.
    /// Otherwise the same difference where it is positive, else 0: the
    /// entries' DMA addresses need not ascend.
    pub span: u64,
    /// Whether the list was merged into one contiguous range.
    pub contiguous: bool,
    pages: u64,
    entries: usize,
    /// The device and direction it was mapped for.
    sid: SourceId,
    dir: DmaDirection,
    /// Fingerprints of the entries' DMA addresses and of their physical
    /// addresses and lengths, so an unmap naming other entries is refused
    /// before anything changes.
    fingerprint: Fingerprint,
}

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
    pushes: u32,
    /// The last leaf table this CPU mapped or unmapped in.
    hint: LeafHint,
}

/// A CPU checks its own queue's age (and frees what its finished flushes
/// released) every this many deferred unmaps. The check is a backstop: the
/// bound on the stale window rests on the timer and, whatever the
/// scheduling, on the expiry deadline every unmap arms; 64 unmaps are tens
/// of microseconds at the rates where the check matters at all, against a
/// 10 ms timeout. At 16 its clock read, taker lock and poll of the flushes
/// in flight cost about 28 instructions a pair (callgrind).
const OWNER_EXPIRY_EVERY: u32 = 64;

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
        DmaCpu::new(self.clone(), self.iova.cpu_cache(), slot)
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
                pushes: 0,
                hint: LeafHint::default(),
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
            slot.passthrough.add_keyed(phys, len, dev.pt_key(dir));
            slot.stats.map();
            return Ok(phys);
        }
        let r = w.map_entered(slot, dev, phys, len, dir);
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
            && slot.passthrough.take_keyed(addr, len, dev.pt_key(dir))
        {
            slot.stats.unmap();
            return Ok(());
        }
        let r = w.unmap_entered(slot, dev, addr, len, dir);
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
            return Err(DmaError::OutputTooShort {
                needed: sg.len(),
                given: out.len(),
            });
        }
        let mem = &self.w.domain.mem;
        let mut pages = 0u64;
        for e in sg {
            mem.check_device_range(e.phys, e.len)?;
            pages = pages
                .checked_add(pages_of(e.phys, e.len))
                .ok_or(DmaError::NoSpace { len: u64::MAX })?;
        }
        let Some(last) = sg.last() else {
            return Err(DmaError::ZeroLength);
        };
        let n = sg.len();
        // `out` holds the DMA addresses of `sg`'s entries (`out.len() >= n`).
        let span = |out: &[u64]| match (out.first(), out.get(n - 1)) {
            (Some(&lo), Some(&hi)) => (hi + last.len).saturating_sub(lo),
            _ => 0,
        };
        // The policy is read inside the gate, and the translated path
        // keeps the gate until its mapping is counted: read before it, a
        // switch to pass-through could complete in between and the list
        // be mapped into the table and handed out as IOVAs that the
        // device's pass-through context takes for physical addresses.
        // Found by `tests/fault_injection.rs`.
        {
            let (slot, w) = (&*self.slot, &mut self.w);
            let op = w.domain.gate.enter(&slot.active);
            let policy = w.domain.policy();
            if policy.is_translated() && policy != DmaPolicy::Bounce && !dev.untrusted {
                let contiguous = w.map_sg_block(slot, dev, sg, dir, out, pages)?;
                slot.stats.map();
                drop(op);
                return Ok(SgMapping {
                    dma: out.first().copied().unwrap_or(0),
                    span: span(out),
                    contiguous,
                    pages,
                    entries: sg.len(),
                    sid: dev.sid,
                    dir,
                    fingerprint: fingerprint(sg, out),
                });
            }
        }
        // One mapping per entry; passed through or bounced (each map reads
        // the policy in force inside the gate itself).
        for (i, (e, slot)) in sg.iter().zip(out.iter_mut()).enumerate() {
            match self.map(dev, e.phys, e.len, dir) {
                Ok(a) => *slot = a,
                Err(err) => {
                    for (p, &a) in sg.iter().zip(out.iter()).take(i) {
                        let _ = self.unmap(dev, a, p.len, dir);
                    }
                    return Err(err);
                }
            }
        }
        Ok(SgMapping {
            dma: out.first().copied().unwrap_or(0),
            span: span(out),
            contiguous: false,
            pages: 0,
            entries: sg.len(),
            sid: dev.sid,
            dir,
            fingerprint: fingerprint(sg, out),
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
        if sg.len() < m.entries || dma.len() < m.entries {
            return Err(DmaError::OutputTooShort {
                needed: m.entries,
                given: sg.len().min(dma.len()),
            });
        }
        // Everything the map recorded is checked before anything changes:
        // a refused call leaves every entry mapped.
        let (sg, dma) = (
            sg.get(..m.entries).unwrap_or(sg),
            dma.get(..m.entries).unwrap_or(dma),
        );
        let fp = fingerprint(sg, dma);
        if fp.dma != m.fingerprint.dma {
            // Other DMA addresses: not this mapping.
            let at = dma.first().copied().unwrap_or(m.dma);
            return Err(DmaError::NotMapped { addr: at });
        }
        if dev.sid != m.sid {
            return Err(DmaError::WrongDevice {
                sid: dev.sid.to_string(),
            });
        }
        if dir != m.dir {
            return Err(DmaError::WrongDirection {
                addr: m.dma,
                mapped: m.dir,
                asked: dir,
            });
        }
        if fp.entries != m.fingerprint.entries {
            let total = sg.iter().fold(0u64, |t, e| t.saturating_add(e.len));
            return Err(DmaError::WrongLength {
                addr: m.dma,
                len: total,
            });
        }
        if m.pages == 0 {
            // One mapping per entry (a list mapped while the policy
            // switched between bounce and a translating one mixes bounced
            // and translated entries): each must still be live as mapped
            // (not unmapped on its own meanwhile) before the first goes.
            for (e, &a) in sg.iter().zip(dma) {
                self.w.check_entry_live(&self.slot, dev, a, e.len, dir)?;
            }
            // The bounced entries: checked again and taken all at once (an
            // entry unmapped meanwhile on its own refuses the whole call,
            // every entry left mapped). In pass-through no slot is live.
            let (slot, w) = (&*self.slot, &mut self.w);
            let op = w.domain.gate.enter(&slot.active);
            if w.domain.policy() != DmaPolicy::Passthrough {
                let n = w.bounce_unmap_sg(slot, dev.sid, sg, dma, dir)?;
                for _ in 0..n {
                    slot.stats.unmap();
                }
            }
            drop(op);
            for (e, &a) in sg.iter().zip(dma) {
                if self.w.domain.policy() == DmaPolicy::Passthrough
                    || self.w.domain.bounce.find(a).is_none()
                {
                    self.unmap(dev, a, e.len, dir)?;
                }
            }
            return Ok(());
        }
        let (slot, w) = (&*self.slot, &mut self.w);
        let _op = w.domain.gate.enter(&slot.active);
        let start = m.dma & !(PAGE_SIZE - 1);
        let deferred = w.domain.policy() == DmaPolicy::Deferred;
        w.unmap_pages(
            slot,
            start,
            m.pages << PAGE_SHIFT,
            deferred,
            BlockKind::ScatterList,
            dev,
            owner_tag(dev.owner, dir_bits(dir)),
        )?;
        slot.stats.unmap();
        Ok(())
    }

    /// Allocates `len` bytes of zeroed memory the CPU and the device share,
    /// mapped both ways: `(physical address, DMA address)`. Free it with
    /// [`free_coherent`](Self::free_coherent) (the frames cannot be freed
    /// any other way).
    pub fn alloc_coherent(
        &mut self,
        dev: &DmaDevice,
        len: u64,
    ) -> Result<(PhysAddr, u64), DmaError> {
        self.check_device(dev)?;
        let order = coherent_order(len)?;
        let (slot, w) = (&*self.slot, &mut self.w);
        let phys = w
            .domain
            .mem
            .alloc_zeroed_owned(order, FrameOwner::Coherent)?;
        // Coherent memory is never bounced: it is the device's by design.
        let r = {
            let _op = w.domain.gate.enter(&slot.active);
            let r = match w.domain.policy() {
                DmaPolicy::Passthrough if phys + (PAGE_SIZE << order) - 1 > dev.mask => {
                    Err(DmaError::BeyondMask {
                        addr: phys,
                        len,
                        mask: dev.mask,
                    })
                }
                DmaPolicy::Passthrough => Ok(phys),
                _ => w.map_pages(
                    slot,
                    dev,
                    phys,
                    PAGE_SIZE << order,
                    Perm::RW,
                    BlockKind::Coherent,
                ),
            };
            // Recorded and counted live before the gate opens: a switch
            // to or from pass-through refuses while anything is live, and
            // it reads the count once the gate is closed. Counted after
            // the gate, a switch could slip in between and strand the
            // mapping under the other policy (a translated IOVA used as a
            // physical address, and `free_coherent` finding the mapping
            // of another policy: refused, or nothing unmapped). Found by
            // `tests/fault_injection.rs`.
            if let Ok(dma) = r {
                lock(&w.domain.coherent).insert(
                    phys,
                    CoherentRecord {
                        dma,
                        order,
                        len,
                        sid: dev.sid,
                    },
                );
                slot.stats.map();
            }
            r
        };
        match r {
            Ok(dma) => Ok((phys, dma)),
            Err(e) => {
                w.domain.mem.free_owned(phys, order, FrameOwner::Coherent)?;
                Err(e)
            }
        }
    }

    /// Frees what [`alloc_coherent`](Self::alloc_coherent) returned for
    /// `dev`: the same physical address, DMA address and length. Anything
    /// else — memory this domain did not allocate coherent, or freed
    /// already, another device's, a wrong DMA address or length — is
    /// refused with nothing changed. The memory goes back only once no
    /// device can reach it any more.
    pub fn free_coherent(
        &mut self,
        dev: &DmaDevice,
        phys: PhysAddr,
        dma: u64,
        len: u64,
    ) -> Result<(), DmaError> {
        self.check_device(dev)?;
        let order = coherent_order(len)?;
        let (slot, w) = (&*self.slot, &mut self.w);
        {
            let mut coherent = lock(&w.domain.coherent);
            match coherent.get(&phys) {
                Some(r)
                    if *r
                        == CoherentRecord {
                            dma,
                            order,
                            len,
                            sid: dev.sid,
                        } => {}
                Some(r) if r.sid != dev.sid => {
                    return Err(DmaError::WrongDevice {
                        sid: dev.sid.to_string(),
                    })
                }
                Some(r) if r.dma != dma => return Err(DmaError::NotMapped { addr: dma }),
                Some(_) => return Err(DmaError::WrongLength { addr: dma, len }),
                None => return Err(DmaError::NotCoherent { phys }),
            }
            // Nothing below fails on a precondition the caller controls
            // once the caller's thread may wait (checked first).
            w.domain.check_callers()?;
            coherent.remove(&phys);
        }
        {
            let _op = w.domain.gate.enter(&slot.active);
            match w.domain.policy() {
                DmaPolicy::Passthrough => {}
                p => w.unmap_pages(
                    slot,
                    dma,
                    PAGE_SIZE << order,
                    p == DmaPolicy::Deferred,
                    BlockKind::Coherent,
                    dev,
                    0,
                )?,
            }
        }
        slot.stats.unmap();
        // The pages may still be reachable until a deferred flush; coherent
        // frees are rare, so flush this CPU's queue before giving them back.
        // If that fails the frames stay allocated: leaked, never reused
        // while reachable.
        w.flush_own(slot)?;
        w.domain.mem.free_owned(phys, order, FrameOwner::Coherent)?;
        Ok(())
    }

    /// Makes the CPU's writes to a streaming buffer visible to the device
    /// (bounce mappings: the bytes `[addr, addr + len)` copied in again,
    /// for `ToDevice` and `Bidirectional` mappings only — a `FromDevice`
    /// slot keeps what the device wrote; others: nothing to do, memory is
    /// coherent). The range may start
    /// anywhere inside a live mapping but must end inside it: an address no
    /// live mapping holds is `NotMapped`, a range running past its mapping's
    /// end `WrongLength`, a zero length `ZeroLength`; a refused sync copies
    /// nothing.
    pub fn sync_for_device(&mut self, addr: u64, len: u64) -> Result<(), DmaError> {
        self.w.sync(&self.slot, addr, len, true)
    }

    /// Makes the device's writes visible to the CPU (bounce mappings: the
    /// bytes `[addr, addr + len)` copied out, for `FromDevice` and
    /// `Bidirectional` mappings only — a `ToDevice` buffer is left as the
    /// CPU wrote it; others: nothing to do).
    /// Checked as [`sync_for_device`](Self::sync_for_device) is.
    pub fn sync_for_cpu(&mut self, addr: u64, len: u64) -> Result<(), DmaError> {
        self.w.sync(&self.slot, addr, len, false)
    }
}

/// The frame order of a coherent allocation of `len` bytes.
fn coherent_order(len: u64) -> Result<u32, DmaError> {
    if len == 0 {
        return Err(DmaError::ZeroLength);
    }
    let pages = len.div_ceil(PAGE_SIZE);
    match pages.checked_next_power_of_two() {
        Some(p) if p.ilog2() <= crate::mem::MAX_FRAME_ORDER => Ok(p.ilog2()),
        _ => Err(DmaError::InvalidConfig {
            name: "coherent length",
            value: len,
            max: PAGE_SIZE << crate::mem::MAX_FRAME_ORDER,
        }),
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

    /// `map_sg`'s translated path, run inside the gate: one IOVA block
    /// for the `pages` pages of `sg`, each entry's address into `out`;
    /// returns whether the list is one contiguous range. On failure
    /// nothing stays mapped and the block goes back (or, if the
    /// invalidation of what was mapped fails, stays allocated: leaked,
    /// never reused under a stale entry).
    fn map_sg_block(
        &mut self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        sg: &[SgEntry],
        dir: DmaDirection,
        out: &mut [u64],
        pages: u64,
    ) -> Result<bool, DmaError> {
        // Only `unmap_sg` may retire this block (a streaming unmap naming
        // it is refused).
        let pfn = self.alloc_iova_as(slot, dev, pages, BlockKind::ScatterList)?;
        // Every page's tag (see `sg_page_tag`): where entries start and
        // end, for a sync; on the block's first page also the list's
        // device and direction, as a streaming mapping's, which `unmap_sg`
        // checks against the block itself, not only against the caller's
        // (copyable, replayable) `SgMapping`. Written before anything is
        // mapped: a failure here changes nothing.
        let owner = owner_tag(dev.owner, dir_bits(dir));
        let mut p = pfn;
        for e in sg {
            let n = pages_of(e.phys, e.len);
            for i in 0..n {
                let mut tag = sg_page_tag(e, i, n);
                if p == pfn {
                    tag = (tag & !(TAG_DIR | TAG_OWNER)) | owner;
                }
                if let Err(err) = self.cache.set_tag(p, tag) {
                    self.free_fresh(pfn, pages, BlockKind::ScatterList)?;
                    return Err(err.into());
                }
                p += 1;
            }
        }
        let mut at = pfn << PAGE_SHIFT;
        for (e, o) in sg.iter().zip(out.iter_mut()) {
            let n = pages_of(e.phys, e.len);
            if let Err(err) = self.domain.table.map_fresh(
                at,
                e.phys & !(PAGE_SIZE - 1),
                n << PAGE_SHIFT,
                dir.perm(),
            ) {
                if at > pfn << PAGE_SHIFT {
                    let mapped = at - (pfn << PAGE_SHIFT);
                    let _ = self
                        .domain
                        .table
                        .unmap(pfn << PAGE_SHIFT, mapped, &mut self.gather);
                    // Nothing was given to the device yet, but a stray walk
                    // may have cached it: invalidate before reuse. If that
                    // fails the block stays allocated (leaked), never
                    // reused under a stale entry.
                    let units = self.domain.unit_mask_after_clear();
                    self.domain.invalidate(units, pfn << PAGE_SHIFT, mapped)?;
                    self.gather.complete()?;
                }
                self.free_fresh(pfn, pages, BlockKind::ScatterList)?;
                return Err(err.into());
            }
            *o = at | (e.phys & (PAGE_SIZE - 1));
            at += n << PAGE_SHIFT;
        }
        Ok(sg
            .iter()
            .zip(sg.iter().skip(1))
            .all(|(a, b)| (a.phys + a.len) % PAGE_SIZE == 0 && b.phys % PAGE_SIZE == 0))
    }

    #[inline]
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
        // Claimed with the block (the tag map shares the state map's
        // chunks' layout): a store, the lock only on a chunk's first use.
        let tag = span_tag(phys, len) | owner_tag(dev.owner, perm_bits(perm));
        if let Err(e) = self.cache.set_tag(pfn, tag) {
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
            },
        );
        d.bounce_live.fetch_add(1, Relaxed);
        Ok(slot.dma())
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
            DmaPolicy::Bounce => self.bounce_map(slot, dev, phys, len, dir)?,
            _ if dev.untrusted => self.bounce_map(slot, dev, phys, len, dir)?,
            _ => self.map_pages(slot, dev, phys, len, dir.perm(), BlockKind::Plain)?,
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
    ) -> Result<(), DmaError> {
        let policy = self.domain.policy();
        if self.try_bounce_unmap(slot, addr, len, dev.sid, dir)? {
            slot.stats.unmap();
            return Ok(());
        }
        match policy {
            DmaPolicy::Passthrough => {
                // Mapped on another CPU (or on one whose handle went).
                self.take_other_pt(slot, addr, len, dev.sid, dir)?;
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
        _slot: &CpuSlot,
        addr: u64,
        len: u64,
        sid: SourceId,
        dir: DmaDirection,
    ) -> Result<(), DmaError> {
        let cpus = lock(&self.domain.cpus).clone();
        take_any(
            &self.domain.pt_retired,
            cpus.iter().map(|s| &s.passthrough),
            addr,
            len,
            sid,
            dir,
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
    ) -> Result<bool, DmaError> {
        if self.domain.bounce.find(addr).is_none() {
            return Ok(false);
        }
        self.bounce_unmap(cpu, addr, len, sid, dir).map(|()| true)
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
            check_bounce_owner(&rec, addr, len, sid, dir)?;
            map.remove(&addr);
            rec
        };
        self.bounce_release(cpu, &rec)
    }

    /// Unmaps the bounced entries of a scatter list (those whose address
    /// lies in a pool), all or none: every such entry's record is
    /// checked, then all are taken, under one hold of the records' lock
    /// (an entry unmapped meanwhile on its own refuses the whole call,
    /// with every entry still mapped). Returns how many were unmapped.
    fn bounce_unmap_sg(
        &mut self,
        cpu: &CpuSlot,
        sid: SourceId,
        sg: &[SgEntry],
        dma: &[u64],
        dir: DmaDirection,
    ) -> Result<usize, DmaError> {
        let d = &*self.domain;
        let bounced = |a: &u64| d.bounce.find(*a).is_some();
        if !dma.iter().take(sg.len()).any(bounced) {
            return Ok(0);
        }
        d.check_callers()?;
        let recs: Vec<BounceRecord> = {
            let mut map = lock(&d.bounce_map);
            for (e, a) in sg.iter().zip(dma).filter(|(_, a)| bounced(a)) {
                match map.get(a) {
                    Some(rec) => check_bounce_owner(rec, *a, e.len, sid, dir)?,
                    None => return Err(DmaError::NotMapped { addr: *a }),
                }
            }
            dma.iter()
                .take(sg.len())
                .filter(|a| bounced(a))
                .filter_map(|a| map.remove(a))
                .collect()
        };
        let mut result = Ok(recs.len());
        for rec in &recs {
            if let Err(e) = self.bounce_release(cpu, rec) {
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
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
        let d = &*self.domain;
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
        self.cache
            .retire_block_of(pfn, pages, kind)
            .map_err(|e| match e {
                IovaError::WrongSize { .. } => DmaError::WrongLength { addr, len },
                _ => DmaError::NotMapped { addr },
            })?;
        // The exact bytes (the pages were checked by the retire), the
        // device and the direction, as DMA-API debug checks an unmap
        // against its map: another start in the page was never mapped,
        // another end is the wrong length.
        let (tag, want) = (self.cache.tag(pfn), span_tag(addr, len) | owner);
        if kind == BlockKind::Plain && tag != want {
            let _ = d.iova.unretire_block(pfn, pages, kind);
            return Err(tag_mismatch(tag, want, addr, len, dev.sid));
        }
        // A scatter list's block: its device and direction (a stale
        // `SgMapping` replayed over another device's list, or another
        // direction's, at the same IOVA).
        let sg_owner = tag & (SG_TAG | TAG_DIR | TAG_OWNER);
        if kind == BlockKind::ScatterList && sg_owner != SG_TAG | owner {
            let _ = d.iova.unretire_block(pfn, pages, kind);
            return Err(tag_mismatch(sg_owner, SG_TAG | owner, addr, len, dev.sid));
        }
        if let Err(e) = self.unmap_checks(slot, iova, pages, deferred) {
            // Nothing was changed: the block is the caller's again.
            let _ = self.domain.iova.unretire_block(pfn, pages, kind);
            return Err(match e {
                DmaError::WrongLength { .. } => DmaError::WrongLength { addr, len },
                e => e,
            });
        }
        let Work {
            domain: d,
            cache,
            gather,
            pushes,
            hint,
        } = self;
        if let Err(e) = d
            .table
            .unmap_hinted(iova, pages << PAGE_SHIFT, gather, hint, !deferred)
        {
            // Nothing was cleared (a failed unmap changes nothing): the
            // block is the caller's again.
            let _ = d.iova.unretire_block(pfn, pages, kind);
            return Err(match e {
                PgtableError::NotMapped { .. } => DmaError::NotMapped { addr },
                e => e.into(),
            });
        }
        if deferred {
            // Until its flush the block is retired, not free: a second unmap
            // of it is refused, and only the flush frees it.
            let tables = gather.defer();
            let entry = FqEntry { pfn, pages };
            // The barrier mode read once for both light fences (the
            // mask's after the clear, the arm's after the push).
            let barrier = d.barrier;
            let (units, high_water) = (d.units.mask_after_clear(barrier), d.tunables.high_water());
            let pushed = slot.fq.push(entry, &tables, units, high_water);
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
            d.cover_unmap(units);
            if matches!(pushed, Pushed::Full) {
                flush_full_queue(d, slot, cache);
            } else {
                // The owner enforces the age limit too, every few pushes,
                // so the stale window holds while the timer thread waits
                // for a core.
                *pushes = pushes.wrapping_add(1);
                if pushes.is_multiple_of(OWNER_EXPIRY_EVERY) {
                    owner_expiry_check(d, slot, cache);
                }
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

    fn sync(
        &mut self,
        slot: &CpuSlot,
        addr: u64,
        len: u64,
        to_device: bool,
    ) -> Result<(), DmaError> {
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        let end = addr
            .checked_add(len)
            .ok_or(DmaError::WrongLength { addr, len })?;
        let d = &*self.domain;
        let _op = d.gate.enter(&slot.active);
        if d.policy() == DmaPolicy::Passthrough {
            let own = slot.passthrough.covers(addr, end);
            let found = match own {
                Some(true) => Some(true),
                _ => {
                    let cpus = lock(&d.cpus).clone();
                    cpus.iter()
                        .map(|s| &s.passthrough)
                        .chain(std::iter::once(&d.pt_retired))
                        .filter_map(|r| r.covers(addr, end))
                        .max()
                        .or(own)
                }
            };
            return match found {
                Some(true) => Ok(()),
                Some(false) => Err(DmaError::WrongLength { addr, len }),
                None => Err(DmaError::NotMapped { addr }),
            };
        }
        // A pool's lanes are live blocks of the table too: an address in
        // one is a slot's or nothing.
        if d.bounce.find(addr).is_some() {
            return self.bounce_sync(slot, addr, len, end, to_device);
        }
        self.translated_covers(addr, len, end)
    }

    /// A bounce sync: the slot holding `addr` found, the range checked
    /// against it, exactly `[addr, end)` copied — in the direction the
    /// mapping allows, as swiotlb does: toward the device only for
    /// `ToDevice` and `Bidirectional` mappings, toward the CPU only for
    /// `FromDevice` and `Bidirectional` ones; otherwise a checked no-op
    /// (a `FromDevice` slot holds what the device wrote, a `ToDevice`
    /// buffer is the CPU's). The copy runs under the records' lock, so
    /// that an unmap racing the sync (and a new map of the same slot)
    /// cannot make it copy for a record no longer live.
    #[cold]
    fn bounce_sync(
        &mut self,
        slot: &CpuSlot,
        addr: u64,
        len: u64,
        end: u64,
        to_device: bool,
    ) -> Result<(), DmaError> {
        let d = &*self.domain;
        let map = lock(&d.bounce_map);
        let rec = match map.get(&addr) {
            Some(r) => *r,
            None => *map
                .values()
                .find(|r| r.slot.dma() <= addr && addr - r.slot.dma() < r.len)
                .ok_or(DmaError::NotMapped { addr })?,
        };
        // `addr` lies in the record: no subtraction underflows.
        let off = addr - rec.slot.dma();
        if end - rec.slot.dma() > rec.len {
            return Err(DmaError::WrongLength { addr, len });
        }
        let (buf, at) = (rec.buf + off, rec.slot.data() + off);
        match (to_device, rec.dir) {
            (true, DmaDirection::FromDevice) | (false, DmaDirection::ToDevice) => return Ok(()),
            (true, _) => d.mem.copy_within(buf, at, len)?,
            (false, _) => d.mem.copy_within(at, buf, len)?,
        }
        drop(map);
        slot.stats.bounced(len);
        Ok(())
    }

    /// Whether a live translated mapping holds `[addr, end)`, lock-free:
    /// the streaming block holding `addr` is found by its state word
    /// (naturally aligned, so one candidate per order), its tag gives the
    /// mapping's first byte and end offset, and the page table whether
    /// the range's last page is the mapping's last. A scatter list's or a
    /// coherent buffer's block (no per-byte tag) falls back to the
    /// allocator's lookup and the table: every page of the range mapped
    /// in that block.
    fn translated_covers(&self, addr: u64, len: u64, end: u64) -> Result<(), DmaError> {
        let d = &*self.domain;
        let mapped = |iova: u64| {
            d.table
                .iova_to_phys(iova & !(PAGE_SIZE - 1))
                .map(|t| t.is_some())
        };
        let (first, last) = (addr >> PAGE_SHIFT, (end - 1) >> PAGE_SHIFT);
        let block = (0..MAX_BLOCK_ORDER)
            .map(|k| (first & !((1u64 << k) - 1), k))
            .find(|&(start, k)| d.iova.check_live_block(start, 1 << k).is_ok());
        let Some((start, k)) = block else {
            return self.other_block_covers(addr, len, first, last);
        };
        let tag = d.iova.tag(start);
        let begin = (start << PAGE_SHIFT) | u64::from(tag & TAG_OFFSET);
        if addr < begin || !mapped(addr)? {
            return Err(DmaError::NotMapped { addr });
        }
        let wrong = DmaError::WrongLength { addr, len };
        if last - start >= 1 << k || !mapped(last << PAGE_SHIFT)? {
            return Err(wrong);
        }
        let more = last + 1 - start < 1 << k && mapped((last + 1) << PAGE_SHIFT)?;
        let end_off = u64::from((tag >> 12) & TAG_OFFSET);
        if !more && end_off != 0 && end > (last << PAGE_SHIFT) + end_off {
            return Err(wrong);
        }
        Ok(())
    }

    /// [`translated_covers`](Self::translated_covers) for an address no
    /// streaming block holds: a coherent buffer's (checked against its
    /// record's exact length) or a scatter list's (checked against its
    /// entries, from its page tags: the range must lie in one entry, from
    /// its first byte to its end).
    #[cold]
    fn other_block_covers(
        &self,
        addr: u64,
        len: u64,
        first: u64,
        last: u64,
    ) -> Result<(), DmaError> {
        let d = &*self.domain;
        let b = d
            .iova
            .find(first)
            .filter(|b| b.state == crate::iova::BlockState::Live)
            .ok_or(DmaError::NotMapped { addr })?;
        let mapped = |p: u64| -> Result<bool, DmaError> {
            Ok(p - b.pfn < b.pages && d.table.iova_to_phys(p << PAGE_SHIFT)?.is_some())
        };
        if !mapped(first)? {
            return Err(DmaError::NotMapped { addr });
        }
        for p in first + 1..=last {
            if !mapped(p)? {
                return Err(DmaError::WrongLength { addr, len });
            }
        }
        let end = addr + len;
        let coherent = lock(&d.coherent)
            .values()
            .find(|r| r.dma >> PAGE_SHIFT == b.pfn)
            .map(|r| (r.dma, r.len));
        if let Some((dma, bytes)) = coherent {
            // `addr` lies in the block, which starts at `dma`.
            return if addr - dma >= bytes {
                Err(DmaError::NotMapped { addr })
            } else if end - dma > bytes {
                Err(DmaError::WrongLength { addr, len })
            } else {
                Ok(())
            };
        }
        // A scatter list: every page of the list carries its tag.
        let is_first = |p: u64| p == b.pfn || d.iova.tag(p) & SG_FIRST != 0;
        let is_last = |p: u64| -> Result<bool, DmaError> { Ok(!mapped(p + 1)? || is_first(p + 1)) };
        let end_off = |p: u64| match (d.iova.tag(p) >> 12) & TAG_OFFSET {
            0 => PAGE_SIZE,
            o => u64::from(o),
        };
        let off = addr & (PAGE_SIZE - 1);
        if is_first(first) && off < u64::from(d.iova.tag(first) & TAG_OFFSET) {
            return Err(DmaError::NotMapped { addr });
        }
        if is_last(first)? && off >= end_off(first) {
            return Err(DmaError::NotMapped { addr });
        }
        if (first + 1..=last).any(is_first) {
            return Err(DmaError::WrongLength { addr, len });
        }
        if is_last(last)? && end - (last << PAGE_SHIFT) > end_off(last) {
            return Err(DmaError::WrongLength { addr, len });
        }
        Ok(())
    }

    /// Whether a per-entry scatter-list unmap of `[addr, addr + len)`
    /// would find its mapping (nothing changed): a bounce slot's record
    /// or a pass-through record, of this device and direction.
    fn check_entry_live(
        &self,
        slot: &CpuSlot,
        dev: &DmaDevice,
        addr: u64,
        len: u64,
        dir: DmaDirection,
    ) -> Result<(), DmaError> {
        let d = &*self.domain;
        // In `unmap`'s order: in pass-through this CPU's record first (no
        // bounce slot is live there), then a bounce pool's address is a
        // slot or nothing.
        if d.policy() == DmaPolicy::Passthrough
            && slot
                .passthrough
                .take_keyed_probe(addr, len, dev.pt_key(dir))
        {
            return Ok(());
        }
        if d.bounce.find(addr).is_some() {
            return match lock(&d.bounce_map).get(&addr) {
                Some(rec) => check_bounce_owner(rec, addr, len, dev.sid, dir),
                None => Err(DmaError::NotMapped { addr }),
            };
        }
        if d.policy() == DmaPolicy::Passthrough {
            let owner = pt_owner(dev.sid, dir);
            let own = slot.passthrough.holds(addr, len, owner);
            let any = own || {
                let cpus = lock(&d.cpus).clone();
                d.pt_retired.holds(addr, len, owner)
                    || cpus.iter().any(|s| s.passthrough.holds(addr, len, owner))
            };
            if !any {
                return Err(DmaError::NotMapped { addr });
            }
        }
        Ok(())
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
/// bounce slot's record.
fn check_bounce_owner(
    rec: &BounceRecord,
    addr: u64,
    len: u64,
    sid: SourceId,
    dir: DmaDirection,
) -> Result<(), DmaError> {
    if rec.len != len {
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
/// DMA-API debug's order: the start, the length, the device, the direction.
#[cold]
fn tag_mismatch(tag: u32, want: u32, addr: u64, len: u64, sid: SourceId) -> DmaError {
    let diff = tag ^ want;
    if diff & TAG_OFFSET != 0 {
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

/// A scatter list's fingerprints (see [`fingerprint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    /// Of the entries' DMA addresses.
    dma: u64,
    /// Of their physical addresses and lengths.
    entries: u64,
}

/// A scatter list's fingerprints as mapped: its DMA addresses, and its
/// entries' physical addresses and lengths, each folded in order through
/// a 64-bit mixer (splitmix64's finaliser, Steele et al., "Fast
/// splittable pseudorandom number generators", OOPSLA 2014).
fn fingerprint(sg: &[SgEntry], dma: &[u64]) -> Fingerprint {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let n = sg.len() as u64;
    Fingerprint {
        dma: dma.iter().take(sg.len()).fold(n, |h, &a| mix(h ^ a)),
        entries: sg
            .iter()
            .fold(n, |h, e| mix(mix(h ^ e.phys).wrapping_add(e.len))),
    }
}

/// The largest block order a streaming sync looks for (blocks are at most
/// this many pages, as a power of two: far more than any mapping).
const MAX_BLOCK_ORDER: u32 = 40;

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
    (1 << 31) | ((end as u32) << 12) | off as u32
}

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
