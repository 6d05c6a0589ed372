//! Bounce buffers for untrusted devices.
//!
//! A pool of pages is mapped once into the device's domain and stays
//! mapped. Mapping a buffer takes a slot of the pool (a power-of-two number
//! of 256-byte units, from a buddy allocator), copies the data in for the
//! device (`ToDevice`, `Bidirectional`) and hands out the slot's IOVA;
//! unmapping copies the device's data back (`FromDevice`, `Bidirectional`)
//! and returns the slot. The device only ever reaches pool pages: never the
//! pages around a small buffer, never a buffer after its unmap has copied it
//! back. What it can still reach after an unmap is the slot, which holds
//! only data bounced for this same domain.
//!
//! The pool is behind one lock: bounce buffering is the safe path for
//! untrusted devices, and its cost is dominated by the copies.

use std::sync::Mutex;

use crate::mem::frames::Buddy;
use crate::mem::{MemError, PhysAddr, PhysMemory};

/// Bytes in one unit of a bounce slot.
pub const BOUNCE_UNIT: u64 = 256;

/// A slot of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BounceSlot {
    /// The slot's IOVA (what the device is given).
    pub iova: u64,
    /// The slot's physical address in the pool.
    pub phys: PhysAddr,
    /// log2 of the slot's size in units.
    pub order: u32,
}

/// A domain's bounce pool.
#[derive(Debug)]
pub struct BouncePool {
    iova: u64,
    phys: PhysAddr,
    bytes: u64,
    units: Mutex<Buddy>,
}

impl BouncePool {
    /// A pool of `bytes` at physical `phys`, mapped at `iova`.
    pub fn new(iova: u64, phys: PhysAddr, bytes: u64) -> Self {
        Self {
            iova,
            phys,
            bytes,
            units: Mutex::new(Buddy::new(bytes / BOUNCE_UNIT)),
        }
    }

    /// The pool's IOVA range start and size.
    pub fn iova_range(&self) -> (u64, u64) {
        (self.iova, self.bytes)
    }

    /// Takes a slot of at least `len` bytes, or `None` when the pool is full
    /// (or `len` larger than the pool).
    pub fn take(&self, len: u64) -> Option<BounceSlot> {
        let units = len.max(1).div_ceil(BOUNCE_UNIT);
        let order = 64 - (units - 1).leading_zeros();
        let unit = self
            .units
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc(order)
            .ok()?;
        Some(BounceSlot {
            iova: self.iova + unit * BOUNCE_UNIT,
            phys: self.phys + unit * BOUNCE_UNIT,
            order,
        })
    }

    /// Returns a slot.
    pub fn give_back(&self, slot: BounceSlot) -> Result<(), MemError> {
        let unit = (slot.phys - self.phys) / BOUNCE_UNIT;
        self.units
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free(unit, slot.order)
    }

    /// The slot whose IOVA range starts at `iova`, if it lies in the pool.
    pub fn contains(&self, iova: u64) -> bool {
        iova >= self.iova && iova < self.iova + self.bytes
    }

    /// Copies `len` bytes from the buffer at `buf` into the slot.
    pub fn copy_in(
        mem: &PhysMemory,
        slot: &BounceSlot,
        buf: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        mem.copy_within(buf, slot.phys, len)
    }

    /// Copies `len` bytes from the slot back to the buffer at `buf`.
    pub fn copy_out(
        mem: &PhysMemory,
        slot: &BounceSlot,
        buf: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        mem.copy_within(slot.phys, buf, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_sub_page_and_recycled() {
        let pool = BouncePool::new(0x10_0000, 0x4000, 4096);
        let a = pool.take(100).unwrap();
        let b = pool.take(300).unwrap();
        assert_eq!(a.order, 0);
        assert_eq!(b.order, 1);
        assert_ne!(a.iova, b.iova);
        assert!(pool.contains(a.iova) && pool.contains(b.iova));
        assert!(pool.take(8192).is_none(), "larger than the pool");
        pool.give_back(a).unwrap();
        assert!(pool.give_back(a).is_err(), "double return refused");
        pool.give_back(b).unwrap();
        assert_eq!(pool.take(4096).unwrap().iova, 0x10_0000, "all merged back");
    }

    #[test]
    fn copies_go_both_ways() {
        let mem = PhysMemory::new(1 << 20).unwrap();
        let pool = BouncePool::new(0, 0x8000, 4096);
        mem.write(0x100, b"payload").unwrap();
        let s = pool.take(7).unwrap();
        BouncePool::copy_in(&mem, &s, 0x100, 7).unwrap();
        mem.write(s.phys, b"PAY").unwrap();
        BouncePool::copy_out(&mem, &s, 0x100, 7).unwrap();
        let mut b = [0u8; 7];
        mem.read(0x100, &mut b).unwrap();
        assert_eq!(&b, b"PAYload");
    }
}
