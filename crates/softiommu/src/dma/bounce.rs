//! Bounce buffers for untrusted devices.
//!
//! A domain keeps pools of pages that no device reaches by default: a
//! pool's IOVA range is reserved in the domain's allocator, but nothing of
//! it is mapped until a buffer is bounced. Mapping a buffer takes a slot
//! of whole pages (next fit, see `bounce_alloc`: a slot just given back is
//! the last one reused; no other mapping's bytes share a page with it), places the buffer at its
//! own offset within its first page (the DMA address keeps that offset, as
//! every other policy's does), zeroes everything around it, copies the
//! caller's buffer in whatever the direction, and maps just the pages the
//! buffer touches with the direction's permission. Unmapping clears those
//! entries, invalidates and waits (always strict, whatever the policy),
//! then copies the slot back (`FromDevice`, `Bidirectional`) and returns
//! the slot: after an unmap returns the device faults at the address, and
//! its late writes can never land in the slot's next user's buffer.
//!
//! The device thus only ever reaches the pages of its live mappings, and
//! within them only the caller's bytes and zeroes:
//!
//! - **A pool the device can reach.** A domain keeps one pool per DMA-mask
//!   class ([`BouncePools`]): a device is given the highest pool that lies
//!   wholly below its mask, made below that mask when none does. A device
//!   with a 24-bit mask is never handed an IOVA near the top of the 48-bit
//!   space.
//! - **No stale bytes.** The padding of the pages a mapping exposes is
//!   zeroed, and the buffer's bytes in the slot are filled from the
//!   caller's buffer at map even for `FromDevice` (as Linux's swiotlb does
//!   since the fix for CVE-2022-0854): the copy back at unmap then returns
//!   the caller's own bytes wherever the device wrote nothing, never what
//!   the slot's previous user (or its device) left there.
//! - **Direction lanes.** A pool has one lane per direction, so that a
//!   burst of one direction cannot starve the others; each mapping carries
//!   its own direction's permission.
//!
//! Each lane's allocator is behind one lock: bounce buffering is the safe
//! path for untrusted devices, and its cost is dominated by the copies,
//! the zeroing and the invalidation every unmap waits for.

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use super::bounce_alloc::NextFit;
use super::policy::DmaDirection;
use crate::mem::{MemError, PhysAddr, PhysMemory, PAGE_SIZE};
use crate::sync::lock_std as lock;

/// Bytes in one unit of a bounce slot: a page, the IOVA granule, so that
/// no two mappings share a page the device can reach.
pub const BOUNCE_UNIT: u64 = PAGE_SIZE;

/// The most pools a domain holds: one per DMA-mask width at most.
const MAX_POOLS: usize = 64;

/// A slot of a pool, holding one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BounceSlot {
    /// The IOVA of the slot's first page.
    pub(crate) iova: u64,
    /// The physical address of the slot's first page.
    pub(crate) phys: PhysAddr,
    /// The buffer's offset within its first page (and the slot's).
    pub(crate) off: u64,
    /// The pages the buffer touches: what is mapped for the device.
    pub(crate) pages: u64,
    /// The lane (direction) the slot belongs to.
    pub(crate) lane: usize,
}

impl BounceSlot {
    /// The address the device is given: the slot's IOVA plus the buffer's
    /// offset in its page.
    #[inline]
    pub(crate) fn dma(&self) -> u64 {
        self.iova + self.off
    }

    /// Where the buffer's copy lies in the pool.
    #[inline]
    pub(crate) fn data(&self) -> PhysAddr {
        self.phys + self.off
    }

    /// The bytes mapped for the device: whole pages.
    #[inline]
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.pages * PAGE_SIZE
    }
}

/// The lanes of a pool, one per direction, in this order (each slot is
/// mapped with its own mapping's direction; the lanes keep one
/// direction's burst from starving the others).
pub(crate) const LANES: [DmaDirection; 3] = [
    DmaDirection::ToDevice,
    DmaDirection::FromDevice,
    DmaDirection::Bidirectional,
];

/// The lane of direction `dir`.
pub(crate) fn lane_of(dir: DmaDirection) -> usize {
    match dir {
        DmaDirection::ToDevice => 0,
        DmaDirection::FromDevice => 1,
        DmaDirection::Bidirectional => 2,
    }
}

/// One lane: pages of one direction's slots.
#[derive(Debug)]
struct Lane {
    iova: u64,
    phys: PhysAddr,
    pages: Mutex<NextFit>,
}

/// One pool of a domain: three lanes of `bytes` each.
#[derive(Debug)]
pub(crate) struct BouncePool {
    lanes: [Lane; 3],
    bytes: u64,
    /// The lowest and the highest IOVA of the lanes: a range that holds
    /// them all, so that most IOVAs (every unmap asks) are told apart in
    /// two comparisons.
    span: (u64, u64),
}

impl BouncePool {
    /// A pool whose lanes (in [`LANES`] order) are `bytes` at physical
    /// `phys`, mapped at `iova`, each.
    pub(crate) fn new(lanes: [(u64, PhysAddr); 3], bytes: u64) -> Self {
        let lo = lanes.iter().map(|l| l.0).min().unwrap_or(0);
        let hi = lanes.iter().map(|l| l.0 + bytes - 1).max().unwrap_or(0);
        Self {
            lanes: lanes.map(|(iova, phys)| Lane {
                iova,
                phys,
                pages: Mutex::new(NextFit::new(bytes / BOUNCE_UNIT)),
            }),
            bytes,
            span: (lo, hi),
        }
    }

    /// The lanes' first IOVAs (tests).
    #[cfg(test)]
    pub(crate) fn lane_iovas(&self) -> [u64; 3] {
        [self.lanes[0].iova, self.lanes[1].iova, self.lanes[2].iova]
    }

    /// The last IOVA of the pool.
    pub(crate) fn last_iova(&self) -> u64 {
        self.span.1
    }

    /// The lanes' physical starts, and their size.
    pub(crate) fn phys_ranges(&self) -> impl Iterator<Item = (PhysAddr, u64)> + '_ {
        self.lanes.iter().map(|l| (l.phys, self.bytes))
    }

    /// Takes a slot in the lane of `dir` for the `len` bytes of a buffer
    /// at `buf`: the whole pages the buffer touches at its own offset in
    /// its page (next fit: see `bounce_alloc`). `None` when that lane is full (or the buffer needs more
    /// pages than a lane has).
    pub(crate) fn take(&self, buf: PhysAddr, len: u64, dir: DmaDirection) -> Option<BounceSlot> {
        let off = buf % PAGE_SIZE;
        let pages = off.checked_add(len.max(1))?.div_ceil(PAGE_SIZE);
        if pages > self.bytes / PAGE_SIZE {
            return None;
        }
        let lane = lane_of(dir);
        let l = self.lanes.get(lane)?;
        let page = lock(&l.pages).alloc(pages)?;
        Some(BounceSlot {
            iova: l.iova + page * BOUNCE_UNIT,
            phys: l.phys + page * BOUNCE_UNIT,
            off,
            pages,
            lane,
        })
    }

    /// Returns a slot (its pages unmapped and invalidated already). A
    /// slot not taken, or given back already, is refused
    /// (`NotAllocated`).
    pub(crate) fn give_back(&self, slot: BounceSlot) -> Result<(), MemError> {
        let l = self
            .lanes
            .get(slot.lane)
            .filter(|l| slot.phys >= l.phys)
            .ok_or(MemError::NotAllocated {
                addr: slot.phys,
                order: 0,
            })?;
        let page = (slot.phys - l.phys) / BOUNCE_UNIT;
        lock(&l.pages).free(page, slot.pages)
    }

    /// Whether `iova` lies in the pool.
    #[inline]
    pub(crate) fn contains(&self, iova: u64) -> bool {
        iova >= self.span.0
            && iova <= self.span.1
            && self
                .lanes
                .iter()
                .any(|l| iova >= l.iova && iova - l.iova < self.bytes)
    }

    /// Fills the pages of `slot` the device will reach: the `len` bytes
    /// of the buffer at `buf` copied in at the buffer's offset, every
    /// other byte of those pages zeroed (the padding never shows a
    /// previous user's bytes).
    pub(crate) fn fill(
        mem: &PhysMemory,
        slot: &BounceSlot,
        buf: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        if slot.off > 0 {
            mem.fill(slot.phys, slot.off, 0)?;
        }
        mem.copy_within(buf, slot.data(), len)?;
        let tail = slot.mapped_bytes() - slot.off - len;
        if tail > 0 {
            mem.fill(slot.data() + len, tail, 0)?;
        }
        Ok(())
    }

    /// Copies `len` bytes from the slot back to the buffer at `buf`.
    pub(crate) fn copy_out(
        mem: &PhysMemory,
        slot: &BounceSlot,
        buf: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        mem.copy_within(slot.data(), buf, len)
    }
}

/// A domain's pools, one per DMA-mask class, made as devices attach and
/// read without a lock on every unmap.
#[derive(Debug)]
pub(crate) struct BouncePools {
    pools: [OnceLock<BouncePool>; MAX_POOLS],
    /// Serialises the making of pools.
    grow: Mutex<()>,
    /// The lowest and highest IOVA of every pool made (`u64::MAX` and 0
    /// while there is none): most IOVAs an unmap asks about are told
    /// apart from every pool in two comparisons. Only ever widened, before
    /// the pool is published: a caller holding an IOVA of a pool (handed
    /// out after the pool was made) sees a span that covers it.
    lo: AtomicU64,
    hi: AtomicU64,
}

impl Default for BouncePools {
    fn default() -> Self {
        Self {
            pools: std::array::from_fn(|_| OnceLock::new()),
            grow: Mutex::new(()),
            lo: AtomicU64::new(u64::MAX),
            hi: AtomicU64::new(0),
        }
    }
}

impl BouncePools {
    /// The pools made so far.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &BouncePool> {
        self.pools.iter().map_while(OnceLock::get)
    }

    /// Pool `i`.
    pub(crate) fn get(&self, i: usize) -> Option<&BouncePool> {
        self.pools.get(i).and_then(OnceLock::get)
    }

    /// The pool holding `iova`, if one does.
    #[inline]
    pub(crate) fn find(&self, iova: u64) -> Option<&BouncePool> {
        // Relaxed: see `lo`; an IOVA of a pool comes with a
        // happens-before from the pool's making, and so from the span's
        // widening.
        if iova < self.lo.load(Relaxed) || iova > self.hi.load(Relaxed) {
            return None;
        }
        self.iter().find(|p| p.contains(iova))
    }

    /// The index of the highest pool wholly at or below `mask`, made with
    /// `make` (which returns it mapped) when none is. `None` when no pool
    /// fits and none can be made.
    pub(crate) fn for_mask<E>(
        &self,
        mask: u64,
        make: impl FnOnce() -> Result<BouncePool, E>,
    ) -> Result<Option<usize>, E> {
        let _g = lock(&self.grow);
        let best = self
            .iter()
            .enumerate()
            .filter(|(_, p)| p.last_iova() <= mask)
            .max_by_key(|(_, p)| p.last_iova())
            .map(|(i, _)| i);
        if best.is_some() {
            return Ok(best);
        }
        let Some(i) = self.pools.iter().position(|p| p.get().is_none()) else {
            return Ok(None);
        };
        let pool = make()?;
        // Widened before the pool is published (the set below, a release).
        self.lo.fetch_min(pool.span.0, Relaxed);
        self.hi.fetch_max(pool.span.1, Relaxed);
        Ok(self.pools.get(i).and_then(|p| p.set(pool).ok()).map(|_| i))
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_whole_pages_keep_the_offset_and_are_recycled() {
        let pool = BouncePool::new(
            [
                (0x10_0000, 0x4000),
                (0x20_0000, 0x8000),
                (0x30_0000, 0xc000),
            ],
            4 * PAGE_SIZE,
        );
        let a = pool.take(0x5_0123, 100, DmaDirection::ToDevice).unwrap();
        assert_eq!((a.off, a.pages), (0x123, 1));
        assert_eq!(a.dma() & (PAGE_SIZE - 1), 0x123, "the offset is kept");
        // Two pages: the buffer crosses a page boundary.
        let b = pool.take(0x5_0f00, 0x200, DmaDirection::ToDevice).unwrap();
        assert_eq!(b.pages, 2);
        assert_eq!(b.iova % PAGE_SIZE, 0);
        assert!(b.iova >= a.iova + PAGE_SIZE || a.iova >= b.iova + b.mapped_bytes());
        let c = pool.take(0, 300, DmaDirection::FromDevice).unwrap();
        assert_eq!((c.iova, c.phys, c.lane), (0x20_0000, 0x8000, 1));
        pool.give_back(c).unwrap();
        assert!(pool.contains(a.dma()) && pool.contains(b.dma()));
        assert!(
            pool.take(0x123, 4 * PAGE_SIZE, DmaDirection::ToDevice)
                .is_none(),
            "five pages: larger than the lane"
        );
        pool.give_back(a).unwrap();
        assert!(matches!(
            pool.give_back(a),
            Err(MemError::NotAllocated { .. })
        ));
        pool.give_back(b).unwrap();
        assert_eq!(
            pool.take(0, 4 * PAGE_SIZE, DmaDirection::ToDevice)
                .unwrap()
                .iova,
            0x10_0000,
            "all free again"
        );
        assert!(pool
            .take(0x10, u64::MAX, DmaDirection::Bidirectional)
            .is_none());
    }

    #[test]
    fn a_device_gets_a_pool_below_its_mask() {
        let pools = BouncePools::default();
        let make = |iova: u64| {
            move || {
                let l = 1 << 20;
                Ok::<_, ()>(BouncePool::new(
                    [(iova, 0), (iova + l, l), (iova + 2 * l, 2 * l)],
                    l,
                ))
            }
        };
        assert_eq!(pools.for_mask(u64::MAX, make(1 << 40)), Ok(Some(0)));
        assert_eq!(pools.for_mask(u64::MAX, make(0)), Ok(Some(0)), "reused");
        assert_eq!(
            pools.for_mask(0xff_ffff, make(0x10_0000)),
            Ok(Some(1)),
            "a 24-bit device gets a pool of its own"
        );
        assert_eq!(pools.for_mask(0xffff_ffff, make(0)), Ok(Some(1)));
        assert_eq!(
            pools.find((1 << 40) + 5).map(|p| p.last_iova()),
            Some((1 << 40) + (3 << 20) - 1)
        );
        assert!(pools.find(5).is_none());
    }

    #[test]
    fn a_fill_zeroes_the_padding_and_copies_go_both_ways() {
        let mem = PhysMemory::new(1 << 20).unwrap();
        let pool = BouncePool::new(
            [(0, 0x8000), (0x1_0000, 0xa000), (0x2_0000, 0xc000)],
            2 * PAGE_SIZE,
        );
        mem.write(0x100, b"payload").unwrap();
        let s = pool.take(0x100, 7, DmaDirection::Bidirectional).unwrap();
        // A previous user's bytes all over the slot.
        mem.fill(s.phys, s.mapped_bytes(), 0x5e).unwrap();
        BouncePool::fill(&mem, &s, 0x100, 7).unwrap();
        let mut page = vec![0u8; PAGE_SIZE as usize];
        mem.read(s.phys, &mut page).unwrap();
        assert_eq!(&page[0x100..0x107], b"payload");
        assert!(page[..0x100].iter().chain(&page[0x107..]).all(|&b| b == 0));
        mem.write(s.data(), b"PAY").unwrap();
        BouncePool::copy_out(&mem, &s, 0x100, 7).unwrap();
        let mut b = [0u8; 7];
        mem.read(0x100, &mut b).unwrap();
        assert_eq!(&b, b"PAYload");
    }
}
