//! What an unmap leaves for the caller to do: invalidate, then free.
//!
//! An unmap clears entries at once, but a device's IOTLB (and the paging-
//! structure caches of the walker) may still hold what those entries said,
//! and a walker that read a table pointer before it was cleared may still be
//! inside the table it pointed to. So an unmap records in an [`IotlbGather`]
//! the IOVA range to invalidate and the table pages it unlinked; the caller
//! invalidates (strict: now; deferred: in a later batch) and only then calls
//! [`IotlbGather::complete`], which gives the pages back to physical memory.
//!
//! A gather dropped with pages still in it leaks them rather than risk a
//! use after free: the count of pages leaked so is [`leaked_table_pages`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::PgtableError;
use crate::mem::{FrameOwner, MemError, PhysAddr, PhysMemory};

/// Table pages leaked by gathers dropped before their invalidation
/// completed, process-wide. Should stay zero; a test or a lab run can check.
static LEAKED: AtomicU64 = AtomicU64::new(0);

/// Table pages leaked, process-wide, by [`IotlbGather`]s dropped without
/// [`IotlbGather::complete`].
pub fn leaked_table_pages() -> u64 {
    LEAKED.load(Ordering::Relaxed)
}

/// The IOVA range an unmap (or several) must invalidate, and the table pages
/// that may be freed once the invalidation has completed.
///
/// One gather may collect several unmaps of the same table (or of tables in
/// the same physical memory): the range is then the smallest one covering
/// them all, which may invalidate more than was unmapped, never less.
#[derive(Debug, Default)]
pub struct IotlbGather {
    /// `[start, end]`, inclusive, if anything was unmapped.
    range: Option<(u64, u64)>,
    /// Unlinked table pages (order-0 frames), to free after invalidation.
    freed: Vec<PhysAddr>,
    /// The memory the pages belong to, once there are pages.
    mem: Option<Arc<PhysMemory>>,
}

impl IotlbGather {
    /// An empty gather.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing was gathered: nothing to invalidate, nothing to free.
    pub fn is_empty(&self) -> bool {
        self.range.is_none() && self.freed.is_empty()
    }

    /// The IOVA range to invalidate, `(start, end)` with `end` inclusive.
    pub fn range(&self) -> Option<(u64, u64)> {
        self.range
    }

    /// The table pages unlinked, waiting for the invalidation. When there are
    /// any, the walker's paging-structure caches must be invalidated for the
    /// range too, not only the IOTLB (VT-d: the invalidation hint must be
    /// clear).
    pub fn freed_tables(&self) -> &[PhysAddr] {
        &self.freed
    }

    /// Widens the range to cover `[iova, iova + len)`. A zero `len` does
    /// nothing.
    pub fn add_range(&mut self, iova: u64, len: u64) {
        if len == 0 {
            return;
        }
        let end = iova.saturating_add(len - 1);
        self.range = Some(match self.range {
            None => (iova, end),
            Some((s, e)) => (s.min(iova), e.max(end)),
        });
    }

    /// Fails if the gather holds pages of a memory other than `mem`.
    pub(crate) fn check_memory(&self, mem: &Arc<PhysMemory>) -> Result<(), PgtableError> {
        match &self.mem {
            Some(m) if !self.freed.is_empty() && !Arc::ptr_eq(m, mem) => {
                Err(PgtableError::GatherMismatch)
            }
            _ => Ok(()),
        }
    }

    /// Adds an unlinked table page of `mem` (checked by `check_memory`
    /// beforehand).
    pub(crate) fn add_freed_table(&mut self, mem: &Arc<PhysMemory>, page: PhysAddr) {
        if self.freed.is_empty() {
            self.mem = Some(Arc::clone(mem));
        }
        debug_assert!(self.mem.as_ref().is_some_and(|m| Arc::ptr_eq(m, mem)));
        self.freed.push(page);
    }

    /// [`defer`](Self::defer) for the usual unmap, which unlinked no
    /// table: clears the range and returns `true`. `false`, nothing
    /// changed, when tables were unlinked (`defer` hands them over).
    #[inline(always)]
    pub(crate) fn defer_if_no_tables(&mut self) -> bool {
        if self.freed.is_empty() {
            self.range = None;
            true
        } else {
            false
        }
    }

    /// Hands the gathered table pages to someone who will free them after a
    /// later invalidation (a deferred flush queue), and empties the gather.
    /// The caller takes over the duty [`complete`](Self::complete) had.
    pub fn defer(&mut self) -> Vec<PhysAddr> {
        self.range = None;
        if self.freed.is_empty() {
            // The usual unmap unlinks no table: nothing to hand over, no
            // allocation to move.
            return Vec::new();
        }
        self.mem = None;
        std::mem::take(&mut self.freed)
    }

    /// Declares that the invalidation covering [`range`](Self::range) has
    /// completed: frees the gathered table pages and empties the gather for
    /// reuse. Returns the number of pages freed.
    ///
    /// Call this only once no walker and no cache can reach the pages any
    /// more, i.e. after the invalidation's wait descriptor has completed.
    pub fn complete(&mut self) -> Result<usize, MemError> {
        let n = self.freed.len();
        let mut result = Ok(n);
        if let Some(mem) = self.mem.take() {
            for page in self.freed.drain(..) {
                if let Err(e) = mem.free_owned(page, 0, FrameOwner::Iommu) {
                    // Cannot happen for pages an unmap gathered; report the
                    // first failure after trying the rest.
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
        }
        self.freed.clear();
        self.range = None;
        result
    }
}

impl Drop for IotlbGather {
    fn drop(&mut self) {
        if !self.freed.is_empty() {
            // No proof the invalidation completed: leak, never free early.
            LEAKED.fetch_add(self.freed.len() as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_covers_every_unmap() {
        let mut g = IotlbGather::new();
        assert!(g.is_empty());
        g.add_range(0x5000, 0);
        assert!(g.is_empty());
        g.add_range(0x5000, 0x1000);
        assert_eq!(g.range(), Some((0x5000, 0x5fff)));
        g.add_range(0x1000, 0x1000);
        g.add_range(0x3000, 0x1000);
        assert_eq!(g.range(), Some((0x1000, 0x5fff)));
        g.add_range(u64::MAX - 0xfff, 0x1000);
        assert_eq!(g.range(), Some((0x1000, u64::MAX)));
        assert_eq!(g.complete(), Ok(0));
        assert!(g.is_empty());
    }

    #[test]
    fn pages_are_freed_only_on_completion() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let a = mem.alloc_zeroed_owned(0, FrameOwner::Iommu).unwrap();
        let b = mem.alloc_zeroed_owned(0, FrameOwner::Iommu).unwrap();
        let mut g = IotlbGather::new();
        g.check_memory(&mem).unwrap();
        g.add_freed_table(&mem, a);
        g.add_freed_table(&mem, b);
        assert_eq!(g.freed_tables(), &[a, b]);
        assert_eq!(mem.frame_stats().allocated_frames, 2);
        assert_eq!(g.complete(), Ok(2));
        assert_eq!(mem.frame_stats().allocated_frames, 0);
        assert!(g.freed_tables().is_empty());
    }

    #[test]
    fn a_gather_refuses_pages_of_another_memory() {
        let m1 = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let m2 = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let mut g = IotlbGather::new();
        g.add_freed_table(&m1, m1.alloc_owned(0, FrameOwner::Iommu).unwrap());
        assert_eq!(g.check_memory(&m2), Err(PgtableError::GatherMismatch));
        g.complete().unwrap();
        assert_eq!(g.check_memory(&m2), Ok(()));
    }

    #[test]
    fn a_dropped_gather_leaks_instead_of_freeing() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let before = leaked_table_pages();
        {
            let mut g = IotlbGather::new();
            g.add_freed_table(&mem, mem.alloc_owned(0, FrameOwner::Iommu).unwrap());
        }
        assert!(leaked_table_pages() > before);
        assert_eq!(mem.frame_stats().allocated_frames, 1, "still allocated");
    }
}
