//! The physical-memory arena: bounds-checked byte access and frame allocation.

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::copy;
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

/// The IOMMU reserve a [`PhysMemory::new`] arena gets: an eighth of its RAM,
/// at least 16 MiB and at most 256 GiB. Address space only (nothing is
/// committed until a table page is written). Page tables for RAM mapped
/// wholly at 4 KiB take 1/512 of it per domain (one 4 KiB leaf table per
/// 2 MiB), so an eighth holds 64 such domains; the 16 MiB floor holds
/// 4,096 table pages, enough for small test arenas that map the same RAM
/// many times.
pub fn default_iommu_reserve(size: u64) -> u64 {
    (size / 8).clamp(16 << 20, 256 << 30)
}

/// The IOMMU reserve starts on a 2 MiB boundary, so its blocks (ring
/// buffers, table pages) are aligned in physical address as the buddy
/// aligns them in the reserve.
const RESERVE_ALIGN: u64 = 2 << 20;

/// The unmapped gap between RAM and the reserve: as large as RAM, and at
/// least 1 GiB. An access that runs past the end of RAM is out of range
/// however far it runs within reason, as it was before the reserve
/// existed, and never lands in IOMMU state by accident. Address space
/// only, never touched.
const MIN_GUARD: u64 = 1 << 30;

/// A sparse arena of physical memory with a page-frame allocator.
///
/// Physical addresses `[0, size)` are RAM: what callers allocate, map and
/// give to devices. The IOMMU's own structures (root and context tables,
/// page tables, invalidation, fault and page-request queues) live in a
/// separate reserve above RAM and a guard gap, `[iommu_base, iommu_base +
/// reserve)`, with a
/// frame allocator of its own. No frame ever moves between the two, so a
/// range that is RAM when a device is given it (a mapping, an I/O page-fault
/// region) is RAM for ever: no device can reach IOMMU state, now or after
/// frames are reused, by construction. Every device-side access checks its
/// translated range against RAM ([`Self::check_device_range`], and the
/// accessors' own bound), one comparison.
///
/// Shared by reference (`Arc<PhysMemory>`) between driver threads, device
/// threads and the emulated IOMMU. All methods take `&self`.
#[derive(Debug)]
pub struct PhysMemory {
    region: Reservation,
    /// RAM: `[0, size)`.
    size: u64,
    /// The IOMMU reserve's first byte (`size` rounded up to 2 MiB).
    iommu_base: u64,
    /// The IOMMU reserve's length in bytes.
    iommu_len: u64,
    frames: Mutex<Buddy>,
    /// The reserve's allocator, over frame numbers relative to `iommu_base`.
    iommu: Mutex<Buddy>,
    /// One bit per RAM frame, set while the frame is a bounce pool's
    /// ([`FrameOwner::Bounce`]): device-reachable through the pool's own
    /// mappings, never mapped as a caller's buffer nor written by a wait
    /// descriptor. Read without a lock.
    bounce_frames: Reservation,
    /// Bumped (Release, after the bits) whenever frames become a bounce
    /// pool's: a cache of untranslated spans filled before the bump may
    /// cover them, and must be dropped.
    bounce_gen: AtomicU64,
}

impl PhysMemory {
    /// Reserves an arena of `size` bytes of RAM (rounded up to 4 KiB; at
    /// most [`MAX_ARENA_BYTES`]) and an IOMMU reserve of
    /// [`default_iommu_reserve`] above it. Nothing is committed until
    /// touched.
    pub fn new(size: u64) -> Result<Self, MemError> {
        let ram = Self::ram_size(size)?;
        Self::with_iommu_reserve(ram, default_iommu_reserve(ram))
    }

    /// As [`new`](Self::new), with an IOMMU reserve of `reserve` bytes
    /// (rounded up to 4 KiB, at most [`MAX_ARENA_BYTES`]). A reserve too small
    /// for the tables and queues the system builds makes those builds fail
    /// with [`MemError::OutOfFrames`].
    pub fn with_iommu_reserve(size: u64, reserve: u64) -> Result<Self, MemError> {
        let size = Self::ram_size(size)?;
        let reserve = match reserve.checked_next_multiple_of(PAGE_SIZE) {
            Some(r) if r <= MAX_ARENA_BYTES => r,
            _ => {
                return Err(MemError::TooLarge {
                    size: reserve,
                    max: MAX_ARENA_BYTES,
                })
            }
        };
        // All at most 2^43 or so: no overflow.
        let iommu_base = (size + size.max(MIN_GUARD)).next_multiple_of(RESERVE_ALIGN);
        let region = Reservation::new(iommu_base + reserve)?;
        let frames = size >> PAGE_SHIFT;
        let bounce_frames = Reservation::new(frames.div_ceil(64) * 8)?;
        Ok(Self {
            region,
            size,
            iommu_base,
            iommu_len: reserve,
            frames: Mutex::new(Buddy::new(frames)),
            iommu: Mutex::new(Buddy::new(reserve >> PAGE_SHIFT)),
            bounce_frames,
            bounce_gen: AtomicU64::new(0),
        })
    }

    fn ram_size(size: u64) -> Result<u64, MemError> {
        match size.max(PAGE_SIZE).checked_next_multiple_of(PAGE_SIZE) {
            Some(s) if s <= MAX_ARENA_BYTES => Ok(s),
            _ => Err(MemError::TooLarge {
                size,
                max: MAX_ARENA_BYTES,
            }),
        }
    }

    /// The arena's RAM in bytes: physical addresses `[0, size)`.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The IOMMU reserve, as (first byte, length): where the IOMMU's tables
    /// and queues live, outside RAM.
    pub fn iommu_reserve(&self) -> (PhysAddr, u64) {
        (self.iommu_base, self.iommu_len)
    }

    /// Whether `[addr, addr + len)` lies in the IOMMU reserve.
    fn in_reserve(&self, addr: PhysAddr, len: u64) -> bool {
        addr >= self.iommu_base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.iommu_base + self.iommu_len)
    }

    /// A pointer to `[addr, addr + len)` if it lies in RAM or in the IOMMU
    /// reserve: what the host side (drivers, the unit) may touch.
    fn check(&self, addr: PhysAddr, len: u64) -> Result<*mut u8, MemError> {
        // One end, two ranges: RAM `[0, size)`, the reserve
        // `[iommu_base, iommu_base + iommu_len)` (both far below 2^64).
        let ok = match addr.checked_add(len) {
            Some(end) => {
                end <= self.size
                    || (addr >= self.iommu_base && end - self.iommu_base <= self.iommu_len)
            }
            None => false,
        };
        if ok {
            // SAFETY: the range lies inside the reservation (RAM, or the
            // reserve, which ends at the reservation's end).
            Ok(unsafe { self.region.base().add(addr as usize) })
        } else {
            Err(MemError::OutOfRange {
                addr,
                len,
                size: self.size,
            })
        }
    }

    /// Atomically loads the word at `addr` if it lies in the IOMMU reserve
    /// (8-byte aligned): what the unit's walker reads tables with, so that
    /// no table outside the reserve — memory a device might write — is
    /// ever followed.
    #[inline]
    pub(crate) fn iommu_load_u64(&self, addr: PhysAddr, order: Ordering) -> Option<u64> {
        if !addr.is_multiple_of(8) || !self.in_reserve(addr, 8) {
            return None;
        }
        self.check_word(addr).ok().map(|w| w.load(order))
    }

    /// A pointer to `[addr, addr + len)` if it lies wholly in RAM: the only
    /// memory a device's access may touch once translated. A range reaching
    /// into the IOMMU reserve is [`MemError::IommuFrame`], anything else
    /// outside RAM [`MemError::OutOfRange`].
    #[inline]
    pub(crate) fn device_ptr(&self, addr: PhysAddr, len: u64) -> Result<*mut u8, MemError> {
        match addr.checked_add(len) {
            Some(end) if end <= self.size => {
                // SAFETY: inside RAM, which starts the reservation.
                Ok(unsafe { self.region.base().add(addr as usize) })
            }
            _ => Err(self.outside_ram(addr, len)),
        }
    }

    /// The error for a device range that does not lie in RAM: one that
    /// starts in the IOMMU reserve names its frame, any other (starting
    /// past RAM, or running off its end) is out of range.
    #[cold]
    fn outside_ram(&self, addr: PhysAddr, len: u64) -> MemError {
        if addr >= self.iommu_base && addr - self.iommu_base < self.iommu_len {
            MemError::IommuFrame {
                addr: addr & !(PAGE_SIZE - 1),
            }
        } else {
            MemError::OutOfRange {
                addr,
                len,
                size: self.size,
            }
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

    /// Copies `buf.len()` bytes at `addr` into `buf`. Safe to race with
    /// devices and other threads touching the same bytes (each byte or
    /// aligned word is read atomically, `Relaxed`): the result then holds,
    /// per word, either the old or the new value.
    pub fn read(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        let p = self.check(addr, buf.len() as u64)?;
        // SAFETY: the range is in bounds (checked) and every shared access
        // to the arena is atomic (this module's contract), so racing
        // accesses are not data races.
        unsafe { copy::read_shared(p, buf) };
        Ok(())
    }

    /// Copies `buf` to `addr` (atomic per aligned word or byte, as
    /// [`read`](Self::read)).
    pub fn write(&self, addr: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        let p = self.check(addr, buf.len() as u64)?;
        // SAFETY: as in `read`.
        unsafe { copy::write_shared(p, buf) };
        Ok(())
    }

    /// Sets `len` bytes at `addr` to `byte` (atomic per aligned word or
    /// byte, as [`read`](Self::read)).
    pub fn fill(&self, addr: PhysAddr, len: u64, byte: u8) -> Result<(), MemError> {
        let p = self.check(addr, len)?;
        // SAFETY: as in `read`; `len` fits in the reservation, so in usize.
        unsafe { copy::fill_shared(p, len as usize, byte) };
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst` inside the arena (the ranges
    /// may overlap; atomic per aligned word or byte, as
    /// [`read`](Self::read)).
    pub fn copy_within(&self, src: PhysAddr, dst: PhysAddr, len: u64) -> Result<(), MemError> {
        let s = self.check(src, len)?;
        let d = self.check(dst, len)?;
        // SAFETY: both ranges are in bounds (checked); as in `read`.
        unsafe { copy::copy_within_shared(s, d, len as usize) };
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

    /// Allocates a block for `owner`: the IOMMU's from its reserve, every
    /// other owner's from RAM.
    pub(crate) fn alloc_owned(&self, order: u32, owner: FrameOwner) -> Result<PhysAddr, MemError> {
        if owner == FrameOwner::Iommu {
            let pfn = lock(&self.iommu).alloc(order, owner)?;
            return Ok(self.iommu_base + (pfn << PAGE_SHIFT));
        }
        let mut frames = lock(&self.frames);
        let pfn = frames.alloc(order, owner)?;
        if owner == FrameOwner::Bounce {
            self.mark_bounce(pfn, order, true);
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
        if addr >= self.iommu_base {
            // Only the IOMMU's blocks live in the reserve.
            let pfn = (addr - self.iommu_base) >> PAGE_SHIFT;
            let mut iommu = lock(&self.iommu);
            return match owner {
                FrameOwner::Iommu => iommu.free(pfn, order, owner),
                _ => Err(match iommu.free(pfn, order, FrameOwner::User) {
                    Err(MemError::NotOwner { owner, .. }) => MemError::NotOwner { addr, owner },
                    _ => MemError::NotAllocated { addr, order },
                }),
            };
        }
        let mut frames = lock(&self.frames);
        frames.free(addr >> PAGE_SHIFT, order, owner)?;
        if owner == FrameOwner::Bounce {
            self.mark_bounce(addr >> PAGE_SHIFT, order, false);
        }
        drop(frames);
        if order >= DISCARD_ORDER {
            // A freed block lies inside the arena: it was allocated there.
            let _ = self.region.discard(addr, PAGE_SIZE << order);
        }
        Ok(())
    }

    /// Takes every free frame of the IOMMU reserve, for tests of what a
    /// table or queue build does when the reserve is exhausted; give them
    /// back with [`release_iommu_frames`](Self::release_iommu_frames). The
    /// frames stay the IOMMU's: nothing can map or free them otherwise.
    pub fn hold_iommu_frames(&self) -> Vec<PhysAddr> {
        let mut iommu = lock(&self.iommu);
        let mut held = Vec::new();
        while let Ok(pfn) = iommu.alloc(0, FrameOwner::Iommu) {
            held.push(self.iommu_base + (pfn << PAGE_SHIFT));
        }
        held
    }

    /// Gives back frames taken by [`hold_iommu_frames`](Self::hold_iommu_frames);
    /// an address it did not return is refused as a free of the IOMMU's
    /// frames would be.
    pub fn release_iommu_frames(&self, held: Vec<PhysAddr>) -> Result<(), MemError> {
        for addr in held {
            self.free_owned(addr, 0, FrameOwner::Iommu)?;
        }
        Ok(())
    }

    /// The word of the bounce bitmap holding RAM frame `pfn`'s bit.
    fn bounce_word(&self, pfn: u64) -> Option<&AtomicU64> {
        let byte = (pfn / 64) * 8;
        if byte + 8 > self.bounce_frames.len() {
            return None;
        }
        // SAFETY: `byte + 8 <= len`, so the word lies inside the bitmap's
        // reservation, which is page aligned (so the word is 8-byte
        // aligned) and lives as long as `self`; every access is atomic.
        Some(unsafe { AtomicU64::from_ptr(self.bounce_frames.base().add(byte as usize).cast()) })
    }

    /// The bounce word of RAM frame `pfn`, which the caller found below
    /// `size >> PAGE_SHIFT` (a range ending at most at `size`): no bound
    /// to check.
    #[inline(always)]
    fn ram_bounce_word(&self, pfn: u64) -> &AtomicU64 {
        debug_assert!(pfn < self.size >> PAGE_SHIFT);
        let byte = (pfn / 64) * 8;
        // SAFETY: the bitmap holds `frames.div_ceil(64)` words for RAM's
        // `frames = size >> PAGE_SHIFT` frames (`size` is a page multiple)
        // and `pfn < frames`, so the word lies inside its reservation,
        // which is page aligned (so the word is 8-byte aligned) and lives
        // as long as `self`; every access is atomic.
        unsafe { AtomicU64::from_ptr(self.bounce_frames.base().add(byte as usize).cast()) }
    }

    /// The count of blocks ever made bounce pools' (Acquire: a reader
    /// that sees a count also sees those blocks' bounce bits).
    pub(crate) fn bounce_generation(&self) -> u64 {
        self.bounce_gen.load(Ordering::Acquire)
    }

    /// Sets or clears the bounce bits of a block (under the frame lock).
    fn mark_bounce(&self, pfn: u64, order: u32, set: bool) {
        for f in pfn..pfn + (1u64 << order) {
            if let Some(w) = self.bounce_word(f) {
                let bit = 1u64 << (f % 64);
                // Release / Acquire in the checks: the bit is seen set
                // before anything written into the frame after.
                if set {
                    w.fetch_or(bit, Ordering::Release);
                } else {
                    w.fetch_and(!bit, Ordering::Release);
                }
            }
        }
        if set {
            // After the bits: whoever sees the new count sees them.
            self.bounce_gen.fetch_add(1, Ordering::Release);
        }
    }

    /// Whether the frame holding `addr` belongs to the IOMMU: its reserve
    /// (tables and queues) or a bounce pool. Memory no caller may map for a
    /// device and no descriptor may write.
    pub fn is_iommu_frame(&self, addr: PhysAddr) -> bool {
        if addr >= self.iommu_base {
            return addr - self.iommu_base < self.iommu_len;
        }
        let pfn = addr >> PAGE_SHIFT;
        self.bounce_word(pfn)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (pfn % 64)) != 0)
    }

    /// Checks that `[addr, addr + len)` lies in RAM and touches no bounce
    /// pool: what a caller may hand to a device. The IOMMU reserve is
    /// [`MemError::IommuFrame`], as is a bounce pool's frame. One load per
    /// 64 frames.
    #[inline]
    pub fn check_device_range(&self, addr: PhysAddr, len: u64) -> Result<(), MemError> {
        self.device_ptr(addr, len)?;
        if len == 0 {
            return Ok(());
        }
        let (first, last) = (addr >> PAGE_SHIFT, (addr + len - 1) >> PAGE_SHIFT);
        // The usual buffer's frames share one word of the bitmap: one load.
        if first >> 6 == last >> 6 {
            // `last - first < 64`: the shift stays in range.
            let mask = (u64::MAX >> (63 - (last - first))) << (first % 64);
            let hit = self.ram_bounce_word(last).load(Ordering::Acquire) & mask;
            if hit != 0 {
                let at = (first & !63) + u64::from(hit.trailing_zeros());
                return Err(MemError::IommuFrame {
                    addr: at << PAGE_SHIFT,
                });
            }
            return Ok(());
        }
        self.check_frames_of_device_range(first, last)
    }

    /// How far an untranslated (pass-through) access starting at `addr`
    /// may run before it reaches a bounce pool's frame: `None` if `addr`'s
    /// own frame is a pool's, else the bytes up to the next pool frame or
    /// the end of `addr`'s 64-frame group of the bitmap (one load), at
    /// least to the end of `addr`'s page. Addresses past RAM hold no pool:
    /// up to `limit` (the caller's address-space end, above `addr`); the
    /// RAM check of the access itself refuses them.
    #[inline(always)]
    pub(crate) fn direct_run(&self, addr: PhysAddr, limit: u64) -> Option<u64> {
        if addr >= self.size {
            return Some(limit - addr);
        }
        let pfn = addr >> PAGE_SHIFT;
        let bits = self.ram_bounce_word(pfn).load(Ordering::Acquire) >> (pfn % 64);
        if bits & 1 != 0 {
            return None;
        }
        // Frames of the group from `pfn` on that hold no pool: the shifted
        // word's zeros up to its first bit, or to the group's end.
        let clean = if bits == 0 {
            64 - pfn % 64
        } else {
            u64::from(bits.trailing_zeros())
        };
        Some(((pfn + clean) << PAGE_SHIFT) - addr)
    }

    /// [`check_device_range`](Self::check_device_range)'s bitmap check of
    /// frames `first..=last` spanning several words.
    #[inline(never)]
    fn check_frames_of_device_range(&self, first: u64, last: u64) -> Result<(), MemError> {
        let mut pfn = first;
        while pfn <= last {
            let hi = (pfn | 63).min(last);
            let span = hi - pfn + 1;
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << (pfn % 64)
            };
            if let Some(w) = self.bounce_word(pfn) {
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

    /// Counts of the frame allocators, RAM and IOMMU reserve together.
    pub fn frame_stats(&self) -> FrameStats {
        let (ram, iommu) = (lock(&self.frames).stats(), lock(&self.iommu).stats());
        FrameStats {
            total_frames: ram.total_frames + iommu.total_frames,
            allocated_frames: ram.allocated_frames + iommu.allocated_frames,
            allocated_blocks: ram.allocated_blocks + iommu.allocated_blocks,
        }
    }

    /// Counts of the IOMMU reserve's allocator alone.
    pub fn iommu_frame_stats(&self) -> FrameStats {
        lock(&self.iommu).stats()
    }
}

/// Takes an allocator's lock. A panic while holding it cannot leave the
/// buddy lists half updated in a way that matters more than losing the
/// process, so a poisoned lock is taken over rather than propagated.
fn lock(m: &Mutex<Buddy>) -> std::sync::MutexGuard<'_, Buddy> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        let (base, len) = m.iommu_reserve();
        assert!(base >= m.size() && len >= 16 << 20);
        let user = m.alloc_frames(0).unwrap();
        let ring = m.alloc_zeroed_owned(1, FrameOwner::Iommu).unwrap();
        assert!(ring >= base, "the IOMMU's frames come from its reserve");
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
            m.check_device_range(ring, 4096),
            Err(MemError::IommuFrame { addr: ring })
        );
        // RAM running into the reserve: refused.
        assert!(matches!(
            m.check_device_range(0, base + 4096),
            Err(MemError::OutOfRange { .. })
        ));
        assert_eq!(
            m.check_device_range(base + 4100, 8),
            Err(MemError::IommuFrame { addr: base + 4096 })
        );
        assert!(matches!(
            m.check_device_range(1 << 20, 1),
            Err(MemError::OutOfRange { .. })
        ));
        // The host side reads and writes the reserve (the unit's tables).
        m.write(ring + 8, &[1, 2]).unwrap();
        m.free_owned(ring, 1, FrameOwner::Iommu).unwrap();
        // Freed, the frames are still the reserve's: never RAM.
        assert!(m.is_iommu_frame(ring));
        assert_eq!(
            m.check_device_range(ring, 1),
            Err(MemError::IommuFrame { addr: ring })
        );
        m.check_device_range(0, 1 << 20).unwrap();
    }

    #[test]
    fn past_the_end_of_ram_is_out_of_range_whatever_the_size() {
        // RAM a multiple of 2 MiB, and not: the reserve lies a guard gap
        // away, so a host access running off RAM is refused as before.
        for size in [64 << 20, (1 << 20) + 4096] {
            let m = PhysMemory::new(size).unwrap();
            let mut b = [0u8; 8];
            for (addr, len) in [(size, 1), (size - 2, 4), (size + (1 << 20), 8)] {
                assert!(
                    matches!(m.write(addr, &b[..len]), Err(MemError::OutOfRange { .. })),
                    "{size:#x}: {addr:#x}+{len}"
                );
            }
            assert!(matches!(
                m.read(size - 2, &mut b[..4]),
                Err(MemError::OutOfRange { .. })
            ));
            assert!(m.iommu_reserve().0 >= size + size.max(1 << 30));
        }
    }

    #[test]
    fn a_bounce_pool_is_ram_but_not_a_callers_buffer() {
        let m = PhysMemory::new(1 << 20).unwrap();
        let pool = m.alloc_zeroed_owned(2, FrameOwner::Bounce).unwrap();
        assert!(pool < m.size() && m.is_iommu_frame(pool));
        assert_eq!(
            m.check_device_range(pool + 4096, 4096),
            Err(MemError::IommuFrame { addr: pool + 4096 })
        );
        // The pool's own mappings reach it: it is RAM.
        assert!(m.device_ptr(pool, 4 * 4096).is_ok());
        assert_eq!(
            m.free_frames(pool, 2),
            Err(MemError::NotOwner {
                addr: pool,
                owner: FrameOwner::Bounce
            })
        );
        m.free_owned(pool, 2, FrameOwner::Bounce).unwrap();
        m.check_device_range(pool, 4 * 4096).unwrap();
    }

    #[test]
    fn ram_is_never_the_reserve_however_frames_are_reused() {
        // Take every RAM frame and give them back: none came from the
        // reserve. Then exhaust the reserve: every table frame lies above
        // RAM, so a device range checked once stays RAM for ever.
        let m = PhysMemory::with_iommu_reserve(1 << 20, 64 << 10).unwrap();
        let mut ram = Vec::new();
        while let Ok(f) = m.alloc_frames(0) {
            assert!(f < m.size());
            ram.push(f);
        }
        assert_eq!(ram.len(), 256);
        let held = m.hold_iommu_frames();
        assert_eq!(held.len(), 16);
        assert!(held.iter().all(|&f| f >= m.size() && m.is_iommu_frame(f)));
        assert_eq!(
            m.alloc_owned(0, FrameOwner::Iommu),
            Err(MemError::OutOfFrames { order: 0 })
        );
        // A reserve frame is not a RAM block, whoever frees it.
        assert_eq!(
            m.free_frames(held[0], 0),
            Err(MemError::NotOwner {
                addr: held[0],
                owner: FrameOwner::Iommu
            })
        );
        m.release_iommu_frames(held).unwrap();
        for f in ram {
            m.free_frames(f, 0).unwrap();
        }
        assert_eq!(m.frame_stats().allocated_frames, 0);
    }

    #[test]
    fn concurrent_copies_are_not_data_races() {
        // Run under ThreadSanitizer to check: a writer, a filler and a
        // word loader race a reader on the same bytes. Without it, the
        // reader still sees only whole words that some writer stored.
        let m = std::sync::Arc::new(PhysMemory::new(1 << 16).unwrap());
        std::thread::scope(|s| {
            let w = m.clone();
            s.spawn(move || {
                for i in 0..2000u32 {
                    let b = [(i % 2) as u8 * 0xff; 64];
                    w.write(64, &b).unwrap();
                }
            });
            let f = m.clone();
            s.spawn(move || {
                for i in 0..2000u32 {
                    f.fill(64, 64, (i % 2) as u8 * 0xff).unwrap();
                    let _ = f.load_u64(64, Ordering::Relaxed).unwrap();
                    f.copy_within(64, 256, 64).unwrap();
                }
            });
            for _ in 0..2000 {
                let mut b = [0u8; 64];
                m.read(64, &mut b).unwrap();
                for word in b.chunks(8) {
                    assert!(word.iter().all(|&x| x == word[0]), "torn word {word:?}");
                }
            }
        });
    }

    #[test]
    fn a_64_gib_arena_is_cheap() {
        let m = PhysMemory::new(64 << 30).unwrap();
        let top = m.alloc_frames(18).unwrap();
        m.write(top + 4096, &[1, 2, 3]).unwrap();
        assert_eq!(m.size(), 64 << 30);
    }
}
