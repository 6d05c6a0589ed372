//! Streaming syncs: a range checked against the live mapping that holds
//! it (pass-through records, bounce slots, translated blocks and their
//! tags), and a bounce slot's bytes copied in the direction it allows.

use super::{lock, DmaCpu, Work, SG_FIRST, SPAN_TAG, TAG_OFFSET};
use crate::dma::error::DmaError;
use crate::dma::policy::{DmaDirection, DmaPolicy};
use crate::dma::slot::CpuSlot;
use crate::mem::{PAGE_SHIFT, PAGE_SIZE};
use crate::pgtable::IoPageTable;

/// The largest block order a streaming sync looks for (blocks are at most
/// this many pages, as a power of two: far more than any mapping).
const MAX_BLOCK_ORDER: u32 = 40;

impl DmaCpu {
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

impl Work {
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
        // The block and its tag on one load: a tag read apart could be a
        // racing unmap's cleared one.
        let block = (0..MAX_BLOCK_ORDER).find_map(|k| {
            let start = first & !((1u64 << k) - 1);
            d.iova.live_tag(start, 1 << k).map(|tag| (start, k, tag))
        });
        let Some((start, k, tag)) = block else {
            return self.other_block_covers(addr, len, first, last);
        };
        // A block no mapping tagged yet (being mapped): nothing mapped.
        if tag & SPAN_TAG == 0 {
            return Err(DmaError::NotMapped { addr });
        }
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
        // A coherent buffer's record is keyed by its frames' physical
        // address, which its block's first page maps to.
        let head = d.table.iova_to_phys(b.pfn << PAGE_SHIFT)?;
        let coherent = head.and_then(|t| {
            lock(&d.coherent)
                .get(&t.phys)
                .filter(|r| r.dma >> PAGE_SHIFT == b.pfn)
                .map(|r| (r.dma, r.len))
        });
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
}
