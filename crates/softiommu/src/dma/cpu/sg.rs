//! Scatter lists: one IOVA block for a whole list where the policy
//! translates, else one mapping per entry; and their unmap, checked
//! against what the map recorded before anything changes.

use super::{check_bounce_owner, lock, pages_of, sg_page_tag, DmaCpu, Work};
use crate::dma::device::DmaDevice;
use crate::dma::domain::BounceRecord;
use crate::dma::error::DmaError;
use crate::dma::owner::{dir_bits, owner_tag, TAG_DIR, TAG_OWNER};
use crate::dma::passthrough::{pt_owner, PT_SG};
use crate::dma::policy::{DmaDirection, DmaPolicy};
use crate::dma::slot::CpuSlot;
use crate::hw::SourceId;
use crate::iova::BlockKind;
use crate::mem::{PhysAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::pgtable::IoPageTable;

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

impl DmaCpu {
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
            match self.map_as(dev, e.phys, e.len, dir, true) {
                Ok(a) => *slot = a,
                Err(err) => {
                    for (p, &a) in sg.iter().zip(out.iter()).take(i) {
                        let _ = self.unmap_as(dev, a, p.len, dir, true);
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
                    self.unmap_as(dev, a, e.len, dir, true)?;
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
}

impl Work {
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
        // Allocated plain and untagged: until it is marked below, neither a
        // streaming unmap (which needs a mapping's tag) nor `unmap_sg`
        // (which needs a scatter list's block) can retire it.
        let pfn = self.alloc_iova_as(slot, dev, pages, BlockKind::Plain)?;
        // Every page's tag (see `sg_page_tag`): where entries start and
        // end, for a sync; on the block's first page also the list's
        // device and direction, as a streaming mapping's, which `unmap_sg`
        // checks against the block itself, not only against the caller's
        // (copyable, replayable) `SgMapping`. Written before anything is
        // mapped: a failure here maps nothing and gives the block back
        // (inner frames keep what was written; nothing reads them until a
        // block holding them is tagged again).
        let owner = owner_tag(dev.owner, dir_bits(dir));
        let (mut p, mut first) = (pfn, 0);
        for e in sg {
            let n = pages_of(e.phys, e.len);
            for i in 0..n {
                let tag = sg_page_tag(e, i, n);
                if p == pfn {
                    first = (tag & !(TAG_DIR | TAG_OWNER)) | owner;
                } else if let Err(err) = self.cache.set_tag(p, tag) {
                    // Frames inside the block: no state of their own, so
                    // nothing but this thread writes their words.
                    self.free_fresh(pfn, pages, BlockKind::Plain)?;
                    return Err(err.into());
                }
                p += 1;
            }
        }
        // The first frame: marked a scatter list's and tagged in one
        // compare-exchange, so `unmap_sg` (of a replayed `SgMapping`, say)
        // never finds the block marked but not yet tagged, and no store of
        // the tag can land on a block another thread retired.
        if let Err(err) = self
            .cache
            .mark_tagged(pfn, pages, BlockKind::ScatterList, first)
        {
            self.free_fresh(pfn, pages, BlockKind::Plain)?;
            return Err(err.into());
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
                    Some(rec) => check_bounce_owner(rec, *a, e.len, sid, dir, true)?,
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
                .take_keyed_probe(addr, len, super::pt_key(dev, dir, true))
        {
            return Ok(());
        }
        if d.bounce.find(addr).is_some() {
            return match lock(&d.bounce_map).get(&addr) {
                Some(rec) => check_bounce_owner(rec, addr, len, dev.sid, dir, true),
                None => Err(DmaError::NotMapped { addr }),
            };
        }
        if d.policy() == DmaPolicy::Passthrough {
            let owner = pt_owner(dev.sid, dir) | PT_SG;
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
