//! [`DriverRing`]: the driver's side of a split virtqueue (§2.7) in a
//! coherent DMA allocation: it writes descriptors and the available ring
//! and reads the used ring, every access to the shared bytes a single
//! aligned atomic load or store of the field's width (a device can reach
//! the ring at any time, so no plain copy touches it).
//!
//! Orderings (§2.7.13): descriptors and the available entry are written
//! before the Release store of the available index; the used index is
//! loaded with Acquire before the used entries it covers; a full fence
//! separates a store that re-enables the other side's notifications from
//! the load that re-checks for work (the store-load pair both sides need
//! so that neither sleeps on work the other has published).

use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use softiommu::mem::{MemError, PhysAddr, PhysMemory};

use crate::spec::{desc, ring};

/// Why a [`DriverRing`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The layout is not [`RingLayout::new`] of a power-of-two size from
    /// 1 to 32,768 (§2.7: "Queue Size value is always a power of 2"; the
    /// ring's every offset is computed from it).
    #[error("ring layout {layout:?} is not RingLayout::new of a power-of-two size up to 32768")]
    BadLayout {
        /// The layout given.
        layout: RingLayout,
    },
    /// The ring's DMA address plus its size runs past the end of the
    /// 64-bit address space: the addresses it would hand the device wrap.
    #[error(
        "ring at DMA address {dma:#x} of {bytes} bytes runs past the end of the address space"
    )]
    AddressOverflow {
        /// The DMA address given.
        dma: u64,
        /// The ring's bytes.
        bytes: u64,
    },
    /// The ring's physical address is not 16-byte aligned (§2.7's
    /// descriptor table alignment): its words are accessed atomically in
    /// place, which a misaligned address would make undefined.
    #[error("ring at physical address {phys:#x} is not 16-byte aligned")]
    Misaligned {
        /// The physical address given.
        phys: PhysAddr,
    },
    /// The physical range is not inside the memory's RAM (the IOMMU's
    /// reserve included: a driver's ring never lies there).
    #[error(transparent)]
    Memory(#[from] MemError),
}

/// Byte offsets of a split ring's three parts in one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Entries (a power of two).
    pub size: u16,
    /// Offset of the available ring (the descriptor table is at 0).
    pub avail: u64,
    /// Offset of the used ring.
    pub used: u64,
    /// Bytes in all.
    pub bytes: u64,
}

impl RingLayout {
    /// The layout of a ring of `size` entries: descriptor table, available
    /// ring, then the used ring at the next 4-byte boundary (§2.7's
    /// alignment table).
    pub fn new(size: u16) -> Self {
        let avail = desc::SIZE * u64::from(size);
        let used = (avail + ring::avail_bytes(size)).next_multiple_of(ring::USED_ALIGN);
        Self {
            size,
            avail,
            used,
            bytes: used + ring::used_bytes(size),
        }
    }
}

/// The driver side of one split virtqueue, over memory it owns.
#[derive(Debug)]
pub struct DriverRing {
    mem: Arc<PhysMemory>,
    base: *mut u8,
    layout: RingLayout,
    /// Where the allocation sits (physical) and what the device uses.
    phys: PhysAddr,
    dma: u64,
    avail_idx: u16,
    last_used: u16,
}

// SAFETY: `base` points into `mem`'s arena, which lives as long as the
// `Arc` this ring holds; the ring is used by one thread at a time (it is
// moved, never shared), and every access this side makes to the shared
// bytes is an atomic load or store (`u16_at`, `u32_at`, `u64_at`), so a
// device touching them at the same time (through the IOMMU, or a hostile
// one at any moment) is no data race.
unsafe impl Send for DriverRing {}

impl DriverRing {
    /// A ring over `layout.bytes` at physical `phys` (zeroed, owned by the
    /// caller), which the device reaches at `dma`. Refused unless `layout`
    /// is [`RingLayout::new`] of a valid size (every offset this ring
    /// writes at is computed from it) and `dma + layout.bytes` fits in 64
    /// bits.
    pub fn new(
        mem: Arc<PhysMemory>,
        phys: PhysAddr,
        dma: u64,
        layout: RingLayout,
    ) -> Result<Self, RingError> {
        let size_ok = layout.size.is_power_of_two() && layout.size <= ring::MAX_SIZE;
        if !size_ok || layout != RingLayout::new(layout.size) {
            return Err(RingError::BadLayout { layout });
        }
        if dma.checked_add(layout.bytes).is_none() {
            return Err(RingError::AddressOverflow {
                dma,
                bytes: layout.bytes,
            });
        }
        if !phys.is_multiple_of(16) {
            return Err(RingError::Misaligned { phys });
        }
        // RAM only (the unit's reserve refused), then the pointer.
        mem.check_device_range(phys, layout.bytes)?;
        let base = mem.as_ptr(phys, layout.bytes)?;
        Ok(Self {
            mem,
            base,
            layout,
            phys,
            dma,
            avail_idx: 0,
            last_used: 0,
        })
    }

    /// The layout.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Physical address of the allocation.
    pub fn phys(&self) -> PhysAddr {
        self.phys
    }

    /// The device's addresses of the descriptor table, the available ring
    /// and the used ring (no sum wraps: `new` checked `dma + bytes`).
    pub fn device_addresses(&self) -> (u64, u64, u64) {
        (
            self.dma,
            self.dma + self.layout.avail,
            self.dma + self.layout.used,
        )
    }

    fn u16_at(&self, off: u64) -> &AtomicU16 {
        debug_assert!(off.is_multiple_of(2) && off + 2 <= self.layout.bytes);
        // SAFETY: every caller passes an even offset inside the ring's
        // bytes (fixed fields, or an index reduced modulo the size), and
        // the arena is 4 KiB-aligned, so the pointer is in bounds and
        // aligned for a u16; the memory lives as long as `self.mem`.
        unsafe { AtomicU16::from_ptr(self.base.add(off as usize).cast()) }
    }

    fn u32_at(&self, off: u64) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.layout.bytes);
        // SAFETY: as `u16_at`, with offsets that are multiples of 4 (fields
        // of a descriptor at `16 * i`, of a used element at `used + 4 +
        // 8 * slot` with `used` 4-aligned by the layout).
        unsafe { AtomicU32::from_ptr(self.base.add(off as usize).cast()) }
    }

    fn u64_at(&self, off: u64) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.layout.bytes);
        // SAFETY: as `u16_at`, with offsets that are multiples of 8 (a
        // descriptor's address at `16 * i`).
        unsafe { AtomicU64::from_ptr(self.base.add(off as usize).cast()) }
    }

    /// Writes descriptor `i` (§2.7.5): `i` is reduced modulo the size.
    ///
    /// Each field is one relaxed atomic store: a device may read (or, if
    /// hostile, write) the table at any time, so plain stores would race
    /// with it; the device is meant to read the entry only after the
    /// Release in `publish`, which orders these stores before it.
    pub fn set_desc(&mut self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let off = desc::SIZE * u64::from(i % self.layout.size);
        self.u64_at(off).store(addr.to_le(), Ordering::Relaxed);
        self.u32_at(off + 8).store(len.to_le(), Ordering::Relaxed);
        self.u16_at(off + 12)
            .store(flags.to_le(), Ordering::Relaxed);
        self.u16_at(off + 14).store(next.to_le(), Ordering::Relaxed);
    }

    /// Puts chain `head` in the next available slot (not yet visible to the
    /// device: see [`publish`](Self::publish)).
    pub fn push_avail(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.layout.size);
        let off = self.layout.avail + ring::AVAIL_HEADER + 2 * slot;
        self.u16_at(off).store(head.to_le(), Ordering::Relaxed);
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Publishes every chain pushed so far: a Release store of the
    /// available index (§2.7.13.3).
    pub fn publish(&mut self) {
        self.u16_at(self.layout.avail + 2)
            .store(self.avail_idx.to_le(), Ordering::Release);
    }

    /// Whether the device wants a notification (§2.7.10: its used ring's
    /// `VIRTQ_USED_F_NO_NOTIFY` is clear). The full fence orders the
    /// `publish` before the load, pairing with the device's fence between
    /// re-enabling notifications and re-reading the available index.
    pub fn needs_kick(&self) -> bool {
        fence(Ordering::SeqCst);
        let flags = u16::from_le(self.u16_at(self.layout.used).load(Ordering::Relaxed));
        flags & ring::USED_F_NO_NOTIFY == 0
    }

    /// The next used element `(id, len)`, if the device returned one.
    pub fn pop_used(&mut self) -> Option<(u32, u32)> {
        // Acquire: the elements the device wrote before its Release store
        // of the index are visible.
        let idx = u16::from_le(self.u16_at(self.layout.used + 2).load(Ordering::Acquire));
        if idx == self.last_used {
            return None;
        }
        let slot = u64::from(self.last_used % self.layout.size);
        let off = self.layout.used + ring::USED_HEADER + ring::USED_ELEM * slot;
        // Relaxed atomic loads, ordered after the device's writes by the
        // Acquire above; a hostile device writing the element meanwhile
        // yields some value, never a data race.
        let id = u32::from_le(self.u32_at(off).load(Ordering::Relaxed));
        let len = u32::from_le(self.u32_at(off + 4).load(Ordering::Relaxed));
        self.last_used = self.last_used.wrapping_add(1);
        Some((id, len))
    }

    /// Whether a used element is waiting (without taking it).
    pub fn has_used(&self) -> bool {
        u16::from_le(self.u16_at(self.layout.used + 2).load(Ordering::Acquire)) != self.last_used
    }

    /// Asks the device not to interrupt (`VIRTQ_AVAIL_F_NO_INTERRUPT`,
    /// §2.7.7) or to interrupt again. Re-enabling is followed by a full
    /// fence: the caller re-checks [`has_used`](Self::has_used) before it
    /// sleeps.
    pub fn set_interrupts(&mut self, on: bool) {
        let v = if on { 0 } else { ring::AVAIL_F_NO_INTERRUPT };
        self.u16_at(self.layout.avail)
            .store(v.to_le(), Ordering::Relaxed);
        if on {
            fence(Ordering::SeqCst);
        }
    }

    /// Chains pushed and not yet used (as far as this side knows).
    pub fn outstanding(&self) -> u16 {
        self.avail_idx.wrapping_sub(self.last_used)
    }

    /// The memory the ring lives in.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.mem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_aligns_each_part_as_the_spec_requires() {
        let l = RingLayout::new(256);
        assert_eq!(l.avail, 4096);
        assert_eq!(l.used % ring::USED_ALIGN, 0);
        assert!(l.used >= l.avail + 4 + 2 * 256 + 2);
        assert_eq!(l.bytes, l.used + 4 + 8 * 256 + 2);
        let s = RingLayout::new(1);
        assert_eq!((s.avail, s.used), (16, 24));
    }

    /// A ring at a misaligned physical address (its words are accessed
    /// atomically in place: undefined behaviour before), or in the unit's
    /// reserve, is refused.
    #[test]
    fn a_ring_misaligned_or_outside_ram_is_refused() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let phys = mem.alloc_zeroed_frames(1).unwrap();
        let l = RingLayout::new(4);
        assert!(matches!(
            DriverRing::new(mem.clone(), phys + 1, phys + 1, l),
            Err(RingError::Misaligned { .. })
        ));
        let (reserve, _) = mem.iommu_reserve();
        assert!(matches!(
            DriverRing::new(mem.clone(), reserve, reserve, l),
            Err(RingError::Memory(MemError::IommuFrame { .. }))
        ));
        assert!(DriverRing::new(mem, phys, phys, l).is_ok());
    }

    #[test]
    fn a_ring_with_a_bad_layout_or_a_wrapping_address_is_refused() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let phys = mem.alloc_zeroed_frames(1).unwrap();
        let l = RingLayout::new(4);
        let e = DriverRing::new(mem.clone(), phys, u64::MAX - 64, l).unwrap_err();
        assert!(
            matches!(e, RingError::AddressOverflow { dma, bytes } if dma == u64::MAX - 64 && bytes == l.bytes),
            "{e:?}"
        );
        for bad in [
            RingLayout::new(0),
            RingLayout::new(3),
            RingLayout {
                avail: 1 << 40,
                ..l
            },
            RingLayout { bytes: 8, ..l },
        ] {
            let e = DriverRing::new(mem.clone(), phys, 0x1000, bad).unwrap_err();
            assert!(
                matches!(e, RingError::BadLayout { layout } if layout == bad),
                "{e:?}"
            );
        }
        let e = DriverRing::new(mem.clone(), 1 << 30, 0x1000, l).unwrap_err();
        assert!(
            matches!(e, RingError::Memory(MemError::OutOfRange { .. })),
            "{e:?}"
        );
    }

    #[test]
    fn descriptors_and_rings_land_where_the_device_reads_them() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let phys = mem.alloc_zeroed_frames(1).unwrap();
        let l = RingLayout::new(4);
        let mut r = DriverRing::new(mem.clone(), phys, 0x1000_0000, l).unwrap();
        r.set_desc(5, 0xabcd, 99, desc::F_WRITE, 0);
        let mut d = [0u8; 16];
        mem.read(phys + 16, &mut d).unwrap();
        assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), 0xabcd);
        assert_eq!(u32::from_le_bytes(d[8..12].try_into().unwrap()), 99);
        r.push_avail(1);
        r.publish();
        let mut a = [0u8; 6];
        mem.read(phys + l.avail, &mut a).unwrap();
        assert_eq!(a, [0, 0, 1, 0, 1, 0]);
        assert!(r.pop_used().is_none());
        // The device returns chain 1 with 60 bytes.
        mem.write(phys + l.used + 4, &[1, 0, 0, 0, 60, 0, 0, 0])
            .unwrap();
        mem.write(phys + l.used + 2, &[1, 0]).unwrap();
        assert!(r.has_used());
        assert_eq!(r.pop_used(), Some((1, 60)));
        assert_eq!(r.outstanding(), 0);
        assert!(r.needs_kick());
        assert_eq!(
            r.device_addresses(),
            (0x1000_0000, 0x1000_0040, 0x1000_0050)
        );
    }
}
