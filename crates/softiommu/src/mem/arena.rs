//! The physical-memory arena: bounds-checked byte access and frame allocation.

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::frames::{Buddy, FrameOwner, FrameStats};
use super::reservation::Reservation;
use super::{MemError, PhysAddr, PAGE_SHIFT, PAGE_SIZE};

/// Blocks of this order or larger are handed back to the kernel when freed
/// (2 MiB): large DMA buffers should not keep memory committed once freed.
const DISCARD_ORDER: u32 = 9;

/// The largest arena: 4 TiB (2^42 bytes) of address space, well inside a
/// 47-bit user address space, and far below the 52-bit physical addresses
/// VT-d tables can name.
pub const MAX_ARENA_BYTES: u64 = 1 << 42;

/// A sparse arena of physical memory with a page-frame allocator.
///
/// Shared by reference (`Arc<PhysMemory>`) between driver threads, device
/// threads and the emulated IOMMU. All methods take `&self`.
#[derive(Debug)]
pub struct PhysMemory {
    region: Reservation,
    size: u64,
    frames: Mutex<Buddy>,
    /// One bit per frame, set while the frame belongs to the IOMMU
    /// ([`FrameOwner::Iommu`]): read without a lock by the checks that keep
    /// devices and descriptors off those frames.
    iommu_frames: Reservation,
}

impl PhysMemory {
    /// Reserves an arena of `size` bytes (rounded up to 4 KiB; at most
    /// [`MAX_ARENA_BYTES`]). Nothing is committed until touched.
    pub fn new(size: u64) -> Result<Self, MemError> {
        let size = match size.max(PAGE_SIZE).checked_next_multiple_of(PAGE_SIZE) {
            Some(s) if s <= MAX_ARENA_BYTES => s,
            _ => {
                return Err(MemError::TooLarge {
                    size,
                    max: MAX_ARENA_BYTES,
                })
            }
        };
        let region = Reservation::new(size)?;
        let frames = size >> PAGE_SHIFT;
        let iommu_frames = Reservation::new(frames.div_ceil(64) * 8)?;
        Ok(Self {
            region,
            size,
            frames: Mutex::new(Buddy::new(frames)),
            iommu_frames,
        })
    }

    /// The arena's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn check(&self, addr: PhysAddr, len: u64) -> Result<*mut u8, MemError> {
        match addr.checked_add(len) {
            Some(end) if end <= self.size => {
                // SAFETY: `addr < size`, so the offset stays inside the mapping.
                Ok(unsafe { self.region.base().add(addr as usize) })
            }
            _ => Err(MemError::OutOfRange {
                addr,
                len,
                size: self.size,
            }),
        }
    }

    fn check_word(&self, addr: PhysAddr) -> Result<&AtomicU64, MemError> {
        if !addr.is_multiple_of(8) {
            return Err(MemError::Unaligned { addr, align: 8 });
        }
        let p = self.check(addr, 8)?;
        // SAFETY: `p` is 8-byte aligned (the mapping is page aligned and
        // `addr` is a multiple of 8), in bounds, and lives as long as `self`.
        // All concurrent word access to it goes through atomics.
        Ok(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Copies `buf.len()` bytes at `addr` into `buf`.
    pub fn read(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        let p = self.check(addr, buf.len() as u64)?;
        // SAFETY: the source range is in bounds (checked); `buf` is a distinct
        // Rust allocation, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copies `buf` to `addr`.
    pub fn write(&self, addr: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        let p = self.check(addr, buf.len() as u64)?;
        // SAFETY: the destination range is in bounds (checked) and does not
        // overlap `buf`, which is a Rust borrow outside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p, buf.len()) };
        Ok(())
    }

    /// Sets `len` bytes at `addr` to `byte`.
    pub fn fill(&self, addr: PhysAddr, len: u64, byte: u8) -> Result<(), MemError> {
        let p = self.check(addr, len)?;
        // SAFETY: the range is in bounds (checked).
        unsafe { std::ptr::write_bytes(p, byte, len as usize) };
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst` inside the arena (the ranges
    /// may overlap).
    pub fn copy_within(&self, src: PhysAddr, dst: PhysAddr, len: u64) -> Result<(), MemError> {
        let s = self.check(src, len)?;
        let d = self.check(dst, len)?;
        // SAFETY: both ranges are in bounds (checked); `copy` allows overlap.
        unsafe { std::ptr::copy(s, d, len as usize) };
        Ok(())
    }

    /// Atomically loads the little-endian `u64` at `addr` (8-byte aligned).
    pub fn load_u64(&self, addr: PhysAddr, order: Ordering) -> Result<u64, MemError> {
        Ok(self.check_word(addr)?.load(order))
    }

    /// Atomically stores `val` at `addr` (8-byte aligned).
    pub fn store_u64(&self, addr: PhysAddr, val: u64, order: Ordering) -> Result<(), MemError> {
        self.check_word(addr)?.store(val, order);
        Ok(())
    }

    /// Atomically replaces the `u64` at `addr` with `new` if it equals
    /// `current`; returns the value seen, as [`AtomicU64::compare_exchange`].
    pub fn compare_exchange_u64(
        &self,
        addr: PhysAddr,
        current: u64,
        new: u64,
        order: Ordering,
    ) -> Result<Result<u64, u64>, MemError> {
        let failure = match order {
            Ordering::AcqRel | Ordering::Release => Ordering::Acquire,
            Ordering::Relaxed => Ordering::Relaxed,
            _ => Ordering::SeqCst,
        };
        Ok(self
            .check_word(addr)?
            .compare_exchange(current, new, order, failure))
    }

    /// A raw pointer to `[addr, addr + len)`, bounds-checked. For zero-copy
    /// users that do their own synchronisation; the pointer is valid as long
    /// as `self` is.
    pub fn as_ptr(&self, addr: PhysAddr, len: u64) -> Result<*mut u8, MemError> {
        self.check(addr, len)
    }

    /// Allocates a naturally aligned block of 2^`order` frames; its contents
    /// are unspecified (zero if never used).
    pub fn alloc_frames(&self, order: u32) -> Result<PhysAddr, MemError> {
        self.alloc_owned(order, FrameOwner::User)
    }

    /// Allocates a block as [`alloc_frames`](Self::alloc_frames) and zeroes it.
    pub fn alloc_zeroed_frames(&self, order: u32) -> Result<PhysAddr, MemError> {
        self.alloc_zeroed_owned(order, FrameOwner::User)
    }

    /// Frees a block returned by `alloc_frames` with the same order. Blocks of
    /// 2 MiB and more give their memory back to the kernel. A block the
    /// IOMMU or the DMA layer owns is refused ([`MemError::NotOwner`]).
    pub fn free_frames(&self, addr: PhysAddr, order: u32) -> Result<(), MemError> {
        self.free_owned(addr, order, FrameOwner::User)
    }

    /// Allocates a block for `owner`.
    pub(crate) fn alloc_owned(&self, order: u32, owner: FrameOwner) -> Result<PhysAddr, MemError> {
        let mut frames = self.lock_frames();
        let pfn = frames.alloc(order, owner)?;
        if owner == FrameOwner::Iommu {
            self.mark_iommu(pfn, order, true);
        }
        Ok(pfn << PAGE_SHIFT)
    }

    /// Allocates a zeroed block for `owner`.
    pub(crate) fn alloc_zeroed_owned(
        &self,
        order: u32,
        owner: FrameOwner,
    ) -> Result<PhysAddr, MemError> {
        let addr = self.alloc_owned(order, owner)?;
        self.fill(addr, PAGE_SIZE << order, 0)?;
        Ok(addr)
    }

    /// Frees a block `owner` allocated.
    pub(crate) fn free_owned(
        &self,
        addr: PhysAddr,
        order: u32,
        owner: FrameOwner,
    ) -> Result<(), MemError> {
        if !addr.is_multiple_of(PAGE_SIZE) {
            return Err(MemError::Unaligned {
                addr,
                align: PAGE_SIZE,
            });
        }
        let mut frames = self.lock_frames();
        frames.free(addr >> PAGE_SHIFT, order, owner)?;
        if owner == FrameOwner::Iommu {
            self.mark_iommu(addr >> PAGE_SHIFT, order, false);
        }
        drop(frames);
        if order >= DISCARD_ORDER {
            // A freed block lies inside the arena: it was allocated there.
            let _ = self.region.discard(addr, PAGE_SIZE << order);
        }
        Ok(())
    }

    /// The word of the IOMMU-frame bitmap holding frame `pfn`'s bit.
    fn iommu_word(&self, pfn: u64) -> Option<&AtomicU64> {
        let byte = (pfn / 64) * 8;
        if byte + 8 > self.iommu_frames.len() {
            return None;
        }
        // SAFETY: `byte + 8 <= len`, so the word lies inside the bitmap's
        // reservation, which is page aligned (so the word is 8-byte
        // aligned) and lives as long as `self`; every access is atomic.
        Some(unsafe { AtomicU64::from_ptr(self.iommu_frames.base().add(byte as usize).cast()) })
    }

    /// Sets or clears the IOMMU bits of a block (under the frame lock).
    fn mark_iommu(&self, pfn: u64, order: u32, set: bool) {
        for f in pfn..pfn + (1u64 << order) {
            if let Some(w) = self.iommu_word(f) {
                let bit = 1u64 << (f % 64);
                // Release / Acquire in `is_iommu_frame`: the bit is seen
                // set before anything written into the frame after.
                if set {
                    w.fetch_or(bit, Ordering::Release);
                } else {
                    w.fetch_and(!bit, Ordering::Release);
                }
            }
        }
    }

    /// Whether the frame holding `addr` belongs to the IOMMU (an
    /// invalidation ring, a page-table page, a bounce pool): memory no
    /// device may be given and no descriptor may write.
    pub fn is_iommu_frame(&self, addr: PhysAddr) -> bool {
        let pfn = addr >> PAGE_SHIFT;
        self.iommu_word(pfn)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (pfn % 64)) != 0)
    }

    /// Checks that `[addr, addr + len)` lies in the arena and touches no
    /// frame of the IOMMU: what may be handed to a device. One load per 64
    /// frames.
    pub fn check_device_range(&self, addr: PhysAddr, len: u64) -> Result<(), MemError> {
        self.check(addr, len)?;
        if len == 0 {
            return Ok(());
        }
        let (first, last) = (addr >> PAGE_SHIFT, (addr + len - 1) >> PAGE_SHIFT);
        let mut pfn = first;
        while pfn <= last {
            let hi = (pfn | 63).min(last);
            let span = hi - pfn + 1;
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << (pfn % 64)
            };
            if let Some(w) = self.iommu_word(pfn) {
                let hit = w.load(Ordering::Acquire) & mask;
                if hit != 0 {
                    let at = (pfn & !63) + u64::from(hit.trailing_zeros());
                    return Err(MemError::IommuFrame {
                        addr: at << PAGE_SHIFT,
                    });
                }
            }
            pfn = hi + 1;
        }
        Ok(())
    }

    /// Counts of the frame allocator.
    pub fn frame_stats(&self) -> FrameStats {
        self.lock_frames().stats()
    }

    fn lock_frames(&self) -> std::sync::MutexGuard<'_, Buddy> {
        // A panic while holding the lock cannot leave the buddy lists half
        // updated in a way that matters more than losing the process, so a
        // poisoned lock is taken over rather than propagated.
        self.frames.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_bounds_are_checked() {
        let m = PhysMemory::new(1 << 20).unwrap();
        m.write(100, b"hello").unwrap();
        let mut b = [0u8; 5];
        m.read(100, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        m.fill(100, 2, b'J').unwrap();
        m.read(100, &mut b).unwrap();
        assert_eq!(&b, b"JJllo");
        assert!(matches!(
            m.read((1 << 20) - 2, &mut b),
            Err(MemError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.write(u64::MAX - 1, b"xx"),
            Err(MemError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.fill(1 << 20, 1, 0),
            Err(MemError::OutOfRange { .. })
        ));
        m.copy_within(100, 200, 5).unwrap();
        m.read(200, &mut b).unwrap();
        assert_eq!(&b, b"JJllo");
    }

    #[test]
    fn words_are_atomic_and_alignment_is_checked() {
        let m = PhysMemory::new(1 << 16).unwrap();
        m.store_u64(64, 0xdead_beef, Ordering::Release).unwrap();
        assert_eq!(m.load_u64(64, Ordering::Acquire).unwrap(), 0xdead_beef);
        assert_eq!(
            m.compare_exchange_u64(64, 0xdead_beef, 1, Ordering::AcqRel)
                .unwrap(),
            Ok(0xdead_beef)
        );
        assert_eq!(
            m.compare_exchange_u64(64, 0, 2, Ordering::AcqRel).unwrap(),
            Err(1)
        );
        assert_eq!(
            m.load_u64(65, Ordering::Relaxed),
            Err(MemError::Unaligned { addr: 65, align: 8 })
        );
        assert!(matches!(
            m.load_u64(1 << 16, Ordering::Relaxed),
            Err(MemError::OutOfRange { .. })
        ));
    }

    #[test]
    fn frames_come_zeroed_aligned_and_are_given_back() {
        let m = PhysMemory::new(64 << 20).unwrap();
        let a = m.alloc_zeroed_frames(9).unwrap();
        assert_eq!(a % (2 << 20), 0);
        m.fill(a, 4096, 0xff).unwrap();
        m.free_frames(a, 9).unwrap();
        let b = m.alloc_zeroed_frames(0).unwrap();
        let mut page = vec![1u8; 4096];
        m.read(b, &mut page).unwrap();
        assert!(page.iter().all(|&x| x == 0));
        assert!(matches!(
            m.free_frames(b + 1, 0),
            Err(MemError::Unaligned { .. })
        ));
        assert!(matches!(
            m.free_frames(b, 1),
            Err(MemError::NotAllocated { .. })
        ));
        m.free_frames(b, 0).unwrap();
        assert_eq!(m.frame_stats().allocated_frames, 0);
    }

    #[test]
    fn absurd_sizes_are_refused() {
        assert_eq!(
            PhysMemory::new(u64::MAX).unwrap_err(),
            MemError::TooLarge {
                size: u64::MAX,
                max: MAX_ARENA_BYTES
            }
        );
        assert!(matches!(
            PhysMemory::new(MAX_ARENA_BYTES + 1),
            Err(MemError::TooLarge { .. })
        ));
        assert_eq!(PhysMemory::new(0).unwrap().size(), PAGE_SIZE);
    }

    #[test]
    fn iommu_frames_are_neither_freed_nor_given_to_devices() {
        let m = PhysMemory::new(1 << 20).unwrap();
        let user = m.alloc_frames(0).unwrap();
        let ring = m.alloc_zeroed_owned(1, FrameOwner::Iommu).unwrap();
        assert!(m.is_iommu_frame(ring + 4096 + 8) && !m.is_iommu_frame(user));
        assert_eq!(
            m.free_frames(ring, 1),
            Err(MemError::NotOwner {
                addr: ring,
                owner: FrameOwner::Iommu
            })
        );
        m.check_device_range(user, 4096).unwrap();
        assert_eq!(
            m.check_device_range(ring - 4096, 3 * 4096),
            Err(MemError::IommuFrame { addr: ring })
        );
        assert_eq!(
            m.check_device_range(0, 1 << 20),
            Err(MemError::IommuFrame { addr: ring })
        );
        assert!(matches!(
            m.check_device_range(1 << 20, 1),
            Err(MemError::OutOfRange { .. })
        ));
        m.free_owned(ring, 1, FrameOwner::Iommu).unwrap();
        assert!(!m.is_iommu_frame(ring));
        m.check_device_range(0, 1 << 20).unwrap();
    }

    #[test]
    fn a_64_gib_arena_is_cheap() {
        let m = PhysMemory::new(64 << 30).unwrap();
        let top = m.alloc_frames(18).unwrap();
        m.write(top + 4096, &[1, 2, 3]).unwrap();
        assert_eq!(m.size(), 64 << 30);
    }
}
