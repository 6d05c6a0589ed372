//! The DMA layer's paths for one buffer: map a fresh IOVA block, unmap it,
//! in 4 KiB pages inside one 2 MiB region of a coherent table, with no walk
//! from the root when the CPU used the same last-level table last time.
//!
//! A [`LeafHint`] is a CPU's memory of the last leaf table it used: the
//! 2 MiB region, the table's address, and the table's count of unlinks
//! when it was taken. A hint is used only while the count is unchanged, so
//! a table that was unlinked (and may have been freed and reused since) is
//! never written through an old hint. Between the count's check and the
//! write, the table cannot be unlinked: only an unmap that covers its whole
//! 2 MiB region unlinks it, and such an unmap needs every entry of the
//! region mapped, while the caller holds (unmapped, in a map; or mapped,
//! in an unmap) a block of that region that nobody else can unmap.
//!
//! Measured (callgrind, `bench dma --iters`, deferred): the one-walk path
//! took about 230 instructions per map and 240 per unmap; this one takes a
//! fraction of that (see the closing notes of issue 11).

use super::*;
use crate::mem::PAGE_SHIFT;

/// See the module documentation.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeafHint {
    /// The 2 MiB region's number plus one (0: no hint).
    region: u64,
    table: PhysAddr,
    unlinks: u64,
}

/// Entries per last-level table, as a shift of 4 KiB pages.
const REGION_SHIFT: u32 = 21;

impl VtdPageTable {
    /// The last-level table of the 2 MiB region holding `iova`, from the
    /// hint or a walk (which then becomes the hint). `None`: no such table
    /// (the region needs tables built, or holds a large leaf).
    #[inline]
    fn hinted_leaf(&self, iova: u64, hint: &mut LeafHint) -> Option<PhysAddr> {
        let region = (iova >> REGION_SHIFT) + 1;
        // Acquire: pairs with the Release increment before an unlink, so a
        // count read unchanged means the hint's table was linked after it.
        let unlinks = self.unlinks.load(Ordering::Acquire);
        if hint.region == region && hint.unlinks == unlinks {
            return Some(hint.table);
        }
        let table = self.leaf_table(iova, iova + PAGE_SIZE)?;
        *hint = LeafHint {
            region,
            table,
            unlinks,
        };
        Some(table)
    }

    /// The entry words of `pages` entries of `table` from `iova`'s, when
    /// they lie in the memory.
    #[inline]
    fn leaf_words(&self, table: PhysAddr, iova: u64, pages: u64) -> Option<*mut u64> {
        let first = slot(table, 1, iova);
        let p = self.mem.as_ptr(first, pages * ENTRY_BYTES).ok()?;
        Some(p.cast())
    }

    /// Maps `[iova, iova + len)` → `phys` for a block fresh from the
    /// domain's allocator (see `map_fresh`: nothing is mapped there), in
    /// one store per page when the range lies in one 2 MiB region of a
    /// coherent table whose last-level table exists; otherwise through
    /// `map_fresh`. `phys` and `len` are 4 KiB aligned.
    pub(crate) fn map_hinted(
        &self,
        iova: u64,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
        hint: &mut LeafHint,
    ) -> Result<(), PgtableError> {
        let pages = len >> PAGE_SHIFT;
        let fits = self.flush.is_none()
            && !cfg!(debug_assertions)
            && len != 0
            && (iova | phys | len) & (PAGE_SIZE - 1) == 0
            && iova >> REGION_SHIFT == (iova + len - 1) >> REGION_SHIFT
            && phys
                .checked_add(len)
                .is_some_and(|e| e <= 1 << VTD_ADDR_BITS)
            && !perm.is_empty();
        if fits {
            if let Some(words) = self
                .hinted_leaf(iova, hint)
                .and_then(|t| self.leaf_words(t, iova, pages))
            {
                let first = leaf_entry(phys, 1, perm);
                for i in 0..pages {
                    // SAFETY: `leaf_words` checked that `pages` words from
                    // `words` lie in the arena (8-byte aligned: a table is
                    // a page and `slot` a multiple of 8), which lives as
                    // long as `self`; every access to entries is atomic.
                    let w = unsafe { AtomicU64::from_ptr(words.add(i as usize)) };
                    // Release: as `store_leaf`'s.
                    w.store(first + (i << PAGE_SHIFT), Ordering::Release);
                }
                return Ok(());
            }
        }
        self.map_fresh(iova, phys, len, perm).map(|_| ())
    }

    /// Unmaps `[iova, iova + len)` (4 KiB aligned), adding it to `gather`:
    /// in one load and one store per page when every entry is a 4 KiB leaf
    /// of one last-level table of a coherent table; otherwise through the
    /// general unmap (which checks and reports everything).
    pub(crate) fn unmap_hinted(
        &self,
        iova: u64,
        len: u64,
        gather: &mut IotlbGather,
        hint: &mut LeafHint,
    ) -> Result<(), PgtableError> {
        let pages = len >> PAGE_SHIFT;
        let fits = self.flush.is_none()
            && len != 0
            && (iova | len) & (PAGE_SIZE - 1) == 0
            && iova >> REGION_SHIFT == (iova + len - 1) >> REGION_SHIFT;
        if fits {
            if let Some(words) = self
                .hinted_leaf(iova, hint)
                .and_then(|t| self.leaf_words(t, iova, pages))
            {
                // SAFETY (both loops): as in `map_hinted`.
                let word = |i: u64| unsafe { AtomicU64::from_ptr(words.add(i as usize)) };
                // Acquire: as the walk's; all must be 4 KiB leaves first.
                let leaves = (0..pages).all(|i| {
                    matches!(
                        decode_entry(word(i).load(Ordering::Acquire), 1),
                        SlEntry::Leaf { .. }
                    )
                });
                if leaves {
                    for i in 0..pages {
                        // Relaxed: as `clear_entry`'s.
                        word(i).store(0, Ordering::Relaxed);
                    }
                    gather.add_range(iova, len);
                    return Ok(());
                }
            }
        }
        self.unmap(iova, len, gather).map(|_| ())
    }
}
