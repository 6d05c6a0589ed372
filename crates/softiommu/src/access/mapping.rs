//! [`DmaMapping`]: a range translated once, for bulk copies without a
//! translation (or a fence) per access.
//!
//! A mapping holds its accessor's translation section open (a
//! [`TranslationGuard`]): a driver's invalidation wait on the unit waits
//! for the mapping to end, so the physical pages it names stay the
//! device's for as long as it lives — it can never outlive an unmap's
//! wait. It is only ever lent to a closure
//! ([`DmaAccessor::with_map`](super::DmaAccessor::with_map)), which ends it
//! when it returns: safe code cannot leak it (`mem::forget` of a section
//! would make every later wait hang), and the borrow checker keeps every
//! slice it hands out inside that window.

#![deny(clippy::indexing_slicing)]

use std::fmt;

use super::attrs::OrderMode;
use super::error::AccessError;
use super::fence::CpuFences;
use super::order::Orderer;
use crate::dma::DmaDirection;
use crate::hw::{PhysRange, PhysRanges, TranslationGuard};
use crate::mem::PhysMemory;

/// A translated range of IOVAs, usable for bulk copies while the closure
/// of [`DmaAccessor::with_map`](super::DmaAccessor::with_map) it is lent to
/// runs.
///
/// Accesses through it are unordered with each other (the device orders
/// itself); the mapping as a whole is ordered as the attributes it was made
/// with say.
pub struct DmaMapping<'a> {
    /// Held, not used: the open section.
    pub(super) _section: TranslationGuard<'a>,
    pub(super) mem: &'a PhysMemory,
    pub(super) ranges: PhysRanges,
    pub(super) iova: u64,
    pub(super) len: u64,
    pub(super) dir: DmaDirection,
    pub(super) mode: OrderMode,
    pub(super) order: &'a mut Orderer<CpuFences>,
}

impl fmt::Debug for DmaMapping<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaMapping")
            .field("iova", &self.iova)
            .field("len", &self.len)
            .field("dir", &self.dir)
            .field("ranges", &self.ranges)
            .finish_non_exhaustive()
    }
}

impl DmaMapping<'_> {
    /// The first IOVA.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty (never: a mapping has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The direction it was made for.
    pub fn direction(&self) -> DmaDirection {
        self.dir
    }

    /// The physical pieces it covers, in IOVA order (for a device that
    /// hands them to vectored I/O of its own, through
    /// [`PhysMemory::as_ptr`]; they stay its own until the mapping drops).
    pub fn ranges(&self) -> &[PhysRange] {
        self.ranges.as_slice()
    }

    fn can_read(&self) -> bool {
        self.dir != DmaDirection::FromDevice
    }

    fn can_write(&self) -> bool {
        self.dir != DmaDirection::ToDevice
    }

    /// Calls `f(phys, start, n)` for each piece of `[offset, offset + len)`,
    /// where `start` is the offset of the piece within the request.
    fn pieces(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(u64, usize, usize),
    ) -> Result<(), AccessError> {
        let out = || AccessError::OutOfMapping {
            offset,
            len,
            size: self.len,
        };
        let end = offset.checked_add(len).ok_or_else(out)?;
        if end > self.len {
            return Err(out());
        }
        let (mut at, mut done) = (0u64, 0u64);
        for r in self.ranges.iter() {
            let (lo, hi) = (at, at + r.len);
            at = hi;
            if hi <= offset + done || lo >= end {
                continue;
            }
            let from = offset + done - lo;
            let n = (hi.min(end) - (offset + done)) as usize;
            f(r.phys + from, done as usize, n);
            done += n as u64;
        }
        Ok(())
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        if !self.can_read() {
            return Err(AccessError::WrongDirection {
                asked: "read",
                made: self.dir,
            });
        }
        let mem = self.mem;
        self.pieces(offset, buf.len() as u64, |phys, start, n| {
            // Cannot fail: the pieces were checked when mapped, and they
            // add up to `buf.len()`.
            if let Some(dst) = buf.get_mut(start..start + n) {
                let _ = mem.read(phys, dst);
            }
        })
    }

    /// Copies `buf` to `offset`.
    pub fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), AccessError> {
        if !self.can_write() {
            return Err(AccessError::WrongDirection {
                asked: "write",
                made: self.dir,
            });
        }
        let mem = self.mem;
        self.pieces(offset, buf.len() as u64, |phys, start, n| {
            // Cannot fail: the pieces were checked when mapped, and they
            // add up to `buf.len()`.
            if let Some(src) = buf.get(start..start + n) {
                let _ = mem.write(phys, src);
            }
        })
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill_at(&self, offset: u64, len: u64, byte: u8) -> Result<(), AccessError> {
        if !self.can_write() {
            return Err(AccessError::WrongDirection {
                asked: "write",
                made: self.dir,
            });
        }
        let mem = self.mem;
        self.pieces(offset, len, |phys, _, n| {
            // Cannot fail: the pieces were checked when mapped.
            let _ = mem.fill(phys, n as u64, byte);
        })
    }

    /// The mapping's pieces as vm-memory volatile slices, for zero-copy I/O
    /// (`ReadVolatile` / `WriteVolatile`). A volatile slice can be both read
    /// and written, so only a [`Bidirectional`](DmaDirection::Bidirectional)
    /// mapping hands them out: a device must not reach through a slice what
    /// the IOMMU would refuse it.
    #[cfg(feature = "vm-memory")]
    pub fn volatile_slices(
        &self,
    ) -> Result<impl Iterator<Item = vm_memory::VolatileSlice<'_>> + '_, AccessError> {
        if self.dir != DmaDirection::Bidirectional {
            return Err(AccessError::WrongDirection {
                asked: "read and write",
                made: self.dir,
            });
        }
        let mem = self.mem;
        Ok(self.ranges.iter().filter_map(move |r| {
            let p = mem.device_ptr(r.phys, r.len).ok()?;
            // SAFETY: `device_ptr` checked the piece lies in the arena's RAM, which
            // lives as long as `mem` (borrowed for the slice's lifetime);
            // the slice cannot outlive `self`, whose open section keeps the
            // piece the device's; volatile slices are made for memory that
            // others (the guest) access concurrently.
            Some(unsafe { vm_memory::VolatileSlice::new(p, r.len as usize) })
        }))
    }
}

impl Drop for DmaMapping<'_> {
    fn drop(&mut self) {
        // Before the section closes (the fields drop after this).
        self.order
            .map_end(self.mode, self.can_read(), self.can_write());
    }
}
