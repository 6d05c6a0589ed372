//! The physical-memory arena: bounds-checked byte access and frame allocation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::frames::{Buddy, FrameStats};
use super::{MemError, PhysAddr, Reservation, PAGE_SHIFT, PAGE_SIZE};

/// Blocks of this order or larger are handed back to the kernel when freed
/// (2 MiB): large DMA buffers should not keep memory committed once freed.
const DISCARD_ORDER: u32 = 9;

/// A sparse arena of physical memory with a page-frame allocator.
///
/// Shared by reference (`Arc<PhysMemory>`) between driver threads, device
/// threads and the emulated IOMMU. All methods take `&self`.
#[derive(Debug)]
pub struct PhysMemory {
    region: Reservation,
    size: u64,
    frames: Mutex<Buddy>,
}

impl PhysMemory {
    /// Reserves an arena of `size` bytes (rounded up to 4 KiB). Nothing is
    /// committed until touched.
    pub fn new(size: u64) -> Result<Self, MemError> {
        let size = size.max(PAGE_SIZE).next_multiple_of(PAGE_SIZE);
        let region = Reservation::new(size)?;
        Ok(Self {
            region,
            size,
            frames: Mutex::new(Buddy::new(size >> PAGE_SHIFT)),
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
        let pfn = self.lock_frames().alloc(order)?;
        Ok(pfn << PAGE_SHIFT)
    }

    /// Allocates a block as [`alloc_frames`](Self::alloc_frames) and zeroes it.
    pub fn alloc_zeroed_frames(&self, order: u32) -> Result<PhysAddr, MemError> {
        let addr = self.alloc_frames(order)?;
        self.fill(addr, PAGE_SIZE << order, 0)?;
        Ok(addr)
    }

    /// Frees a block returned by `alloc_frames` with the same order. Blocks of
    /// 2 MiB and more give their memory back to the kernel.
    pub fn free_frames(&self, addr: PhysAddr, order: u32) -> Result<(), MemError> {
        if !addr.is_multiple_of(PAGE_SIZE) {
            return Err(MemError::Unaligned {
                addr,
                align: PAGE_SIZE,
            });
        }
        self.lock_frames().free(addr >> PAGE_SHIFT, order)?;
        if order >= DISCARD_ORDER {
            self.region.discard(addr, PAGE_SIZE << order);
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
    fn a_64_gib_arena_is_cheap() {
        let m = PhysMemory::new(64 << 30).unwrap();
        let top = m.alloc_frames(18).unwrap();
        m.write(top + 4096, &[1, 2, 3]).unwrap();
        assert_eq!(m.size(), 64 << 30);
    }
}
