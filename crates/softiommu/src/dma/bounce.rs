//! Bounce buffers for untrusted devices.
//!
//! A pool of pages is mapped once into the device's domain and stays
//! mapped. Mapping a buffer takes a slot of the pool (a power-of-two number
//! of 256-byte units, from a buddy allocator), copies the caller's buffer
//! into it whatever the direction, and hands out the slot's IOVA;
//! unmapping copies the slot back (`FromDevice`, `Bidirectional`) and
//! returns the slot. The device only ever reaches pool pages: never the
//! pages around a small buffer, never a buffer after its unmap has copied it
//! back. What it can still reach after an unmap is the slot, which holds
//! only data bounced for this same domain.
//!
//! Two rules close the holes a pool can open:
//!
//! - **A pool the device can reach.** A domain keeps one pool per DMA-mask
//!   class ([`BouncePools`]): a device is given the highest pool that lies
//!   wholly below its mask, made below that mask when none does. A device
//!   with a 24-bit mask is never handed an IOVA near the top of the 48-bit
//!   space.
//! - **No stale bytes.** The slot is filled from the caller's buffer at
//!   map even for `FromDevice` (as Linux's swiotlb does since the fix for
//!   CVE-2022-0854): the copy back at unmap then returns the caller's own
//!   bytes wherever the device wrote nothing, never what the slot's
//!   previous user left there.
//!
//! Each pool is behind one lock: bounce buffering is the safe path for
//! untrusted devices, and its cost is dominated by the copies.

#![deny(clippy::indexing_slicing)]

use std::sync::{Mutex, OnceLock};

use super::policy::DmaDirection;
use crate::mem::frames::{Buddy, FrameOwner};
use crate::mem::{MemError, PhysAddr, PhysMemory};
use crate::sync::lock_std as lock;

/// Bytes in one unit of a bounce slot.
pub const BOUNCE_UNIT: u64 = 256;

/// The most pools a domain holds: one per DMA-mask width at most.
const MAX_POOLS: usize = 64;

/// A slot of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BounceSlot {
    /// The slot's IOVA (what the device is given).
    pub(crate) iova: u64,
    /// The slot's physical address in the pool.
    pub(crate) phys: PhysAddr,
    /// log2 of the slot's size in units.
    pub(crate) order: u32,
    /// The lane (direction) the slot belongs to.
    pub(crate) lane: usize,
}

/// The lanes of a pool, one per direction, in this order: each mapped
/// with its direction's permission only, so a device can neither write a
/// `ToDevice` slot nor read a `FromDevice` one (slots of one direction
/// share pages, never with another direction's).
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

/// One lane: pages mapped with one direction's permission.
#[derive(Debug)]
struct Lane {
    iova: u64,
    phys: PhysAddr,
    units: Mutex<Buddy>,
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
                units: Mutex::new(Buddy::new(bytes / BOUNCE_UNIT)),
            }),
            bytes,
            span: (lo, hi),
        }
    }

    /// The last IOVA of the pool.
    pub(crate) fn last_iova(&self) -> u64 {
        self.span.1
    }

    /// The lanes' physical starts, and their size.
    pub(crate) fn phys_ranges(&self) -> impl Iterator<Item = (PhysAddr, u64)> + '_ {
        self.lanes.iter().map(|l| (l.phys, self.bytes))
    }

    /// Takes a slot of at least `len` bytes in the lane of `dir`, or
    /// `None` when that lane is full (or `len` larger than a lane).
    pub(crate) fn take(&self, len: u64, dir: DmaDirection) -> Option<BounceSlot> {
        if len > self.bytes {
            return None;
        }
        let lane = lane_of(dir);
        let l = self.lanes.get(lane)?;
        let units = len.max(1).div_ceil(BOUNCE_UNIT);
        let order = 64 - (units - 1).leading_zeros();
        let unit = lock(&l.units).alloc(order, FrameOwner::User).ok()?;
        Some(BounceSlot {
            iova: l.iova + unit * BOUNCE_UNIT,
            phys: l.phys + unit * BOUNCE_UNIT,
            order,
            lane,
        })
    }

    /// Returns a slot.
    pub(crate) fn give_back(&self, slot: BounceSlot) -> Result<(), MemError> {
        let l = self.lanes.get(slot.lane).ok_or(MemError::NotAllocated {
            addr: slot.phys,
            order: slot.order,
        })?;
        let unit = (slot.phys - l.phys) / BOUNCE_UNIT;
        lock(&l.units).free(unit, slot.order, FrameOwner::User)
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

    /// Copies `len` bytes from the buffer at `buf` into the slot.
    pub(crate) fn copy_in(
        mem: &PhysMemory,
        slot: &BounceSlot,
        buf: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        mem.copy_within(buf, slot.phys, len)
    }

    /// Copies `len` bytes from the slot back to the buffer at `buf`.
    pub(crate) fn copy_out(
        mem: &PhysMemory,
        slot: &BounceSlot,
        buf: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        mem.copy_within(slot.phys, buf, len)
    }
}

/// A domain's pools, one per DMA-mask class, made as devices attach and
/// read without a lock on every unmap.
#[derive(Debug)]
pub(crate) struct BouncePools {
    pools: [OnceLock<BouncePool>; MAX_POOLS],
    /// Serialises the making of pools.
    grow: Mutex<()>,
}

impl Default for BouncePools {
    fn default() -> Self {
        Self {
            pools: std::array::from_fn(|_| OnceLock::new()),
            grow: Mutex::new(()),
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
        Ok(self.pools.get(i).and_then(|p| p.set(pool).ok()).map(|_| i))
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_sub_page_and_recycled() {
        let pool = BouncePool::new(
            [
                (0x10_0000, 0x4000),
                (0x20_0000, 0x5000),
                (0x30_0000, 0x6000),
            ],
            4096,
        );
        let a = pool.take(100, DmaDirection::ToDevice).unwrap();
        let b = pool.take(300, DmaDirection::ToDevice).unwrap();
        let c = pool.take(300, DmaDirection::FromDevice).unwrap();
        assert_eq!((c.iova, c.phys, c.lane), (0x20_0000, 0x5000, 1));
        pool.give_back(c).unwrap();
        assert_eq!(a.order, 0);
        assert_eq!(b.order, 1);
        assert_ne!(a.iova, b.iova);
        assert!(pool.contains(a.iova) && pool.contains(b.iova));
        assert!(
            pool.take(8192, DmaDirection::ToDevice).is_none(),
            "larger than the pool"
        );
        pool.give_back(a).unwrap();
        assert!(matches!(
            pool.give_back(a),
            Err(MemError::NotAllocated { .. })
        ));
        pool.give_back(b).unwrap();
        assert_eq!(
            pool.take(4096, DmaDirection::ToDevice).unwrap().iova,
            0x10_0000,
            "all merged back"
        );
        assert!(pool.take(u64::MAX, DmaDirection::Bidirectional).is_none());
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
    fn copies_go_both_ways() {
        let mem = PhysMemory::new(1 << 20).unwrap();
        let pool = BouncePool::new([(0, 0x8000), (0x1000, 0x9000), (0x2000, 0xa000)], 4096);
        mem.write(0x100, b"payload").unwrap();
        let s = pool.take(7, DmaDirection::Bidirectional).unwrap();
        BouncePool::copy_in(&mem, &s, 0x100, 7).unwrap();
        mem.write(s.phys, b"PAY").unwrap();
        BouncePool::copy_out(&mem, &s, 0x100, 7).unwrap();
        let mut b = [0u8; 7];
        mem.read(0x100, &mut b).unwrap();
        assert_eq!(&b, b"PAYload");
    }
}
