//! The DMA layer's paths for one buffer: map a fresh IOVA block, unmap it,
//! in 4 KiB pages inside one 2 MiB region of a coherent table, with no walk
//! from the root when the CPU used the same last-level table last time.
//!
//! A [`LeafHint`] is a CPU's memory of the last leaf table it used: the
//! 2 MiB region, the table's entries in the arena, and the table's count of unlinks
//! when it was taken. A hint is used only while the count is unchanged, so
//! a table that was unlinked (and may have been freed and reused since) is
//! never written through an old hint. Between the count's check and the
//! write, the table cannot be unlinked: only an unmap that covers its whole
//! 2 MiB region unlinks it, and such an unmap needs every entry of the
//! region mapped, while the caller holds (unmapped, in a map; or mapped,
//! in an unmap) a block of that region that nobody else can unmap.
//!
//! The hint's memory-ordering argument is checked by the loom model at the
//! end of this file.
//!
//! Measured (callgrind, `softiommu bench dma --instructions`): a deferred
//! map+unmap pair of one page went from ~1,500 instructions (one walk from
//! the root per call) to ~1,030, pass-through's being ~650. Keeping the
//! table's entry words (its place in the arena) in the hint, so that a hit
//! needs no range check of the table's address, took 27 more off the pair
//! (`benches/dma_pair.rs`, 771 → 744).

use super::*;
use crate::mem::PAGE_SHIFT;

/// See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeafHint {
    /// The 2 MiB region's number plus one (0: no hint).
    region: u64,
    /// The table's first entry in the arena (null: no hint): kept with the
    /// hint so that a hit needs no range check of the table's address.
    words: *mut u64,
    unlinks: u64,
}

impl Default for LeafHint {
    fn default() -> Self {
        Self {
            region: 0,
            words: std::ptr::null_mut(),
            unlinks: 0,
        }
    }
}

// SAFETY: `words` is only dereferenced by `hinted_words`'s callers, through
// the page table the hint was taken from (whose arena outlives the table),
// and only while the hint is valid (module doc); every access is atomic.
unsafe impl Send for LeafHint {}
// SAFETY: a shared hint is plain data: the pointer is dereferenced only by
// the paths that hold the hint mutably.
unsafe impl Sync for LeafHint {}

/// Entries per last-level table, as a shift of 4 KiB pages.
const REGION_SHIFT: u32 = 21;

impl VtdPageTable {
    /// The entry words of `pages` entries from `iova`'s in the last-level
    /// table of the 2 MiB region holding `iova`, from the hint or a walk
    /// (which then becomes the hint). `None`: no such table (the region
    /// needs tables built, or holds a large leaf). The caller checked that
    /// `[iova, iova + pages * 4 KiB)` lies in one 2 MiB region, so the
    /// words lie in the table. A hint is used only with the table it was
    /// taken from (each CPU handle keeps one per domain).
    #[inline(always)]
    fn hinted_words(&self, iova: u64, pages: u64, hint: &mut LeafHint) -> Option<*mut u64> {
        let region = (iova >> REGION_SHIFT) + 1;
        // Acquire: pairs with the Release increment before an unlink, so a
        // count read unchanged means the hint's table was linked after it.
        let unlinks = self.unlinks.load(Ordering::Acquire);
        if hint.region == region && hint.unlinks == unlinks {
            // In the table: `level_index < 512` (a table's entries).
            return Some(hint.words.wrapping_add(level_index(iova, 1) as usize));
        }
        self.hinted_words_walk(iova, pages, region, unlinks, hint)
    }

    /// [`hinted_words`](Self::hinted_words) without a usable hint: a walk.
    #[inline(never)]
    fn hinted_words_walk(
        &self,
        iova: u64,
        pages: u64,
        region: u64,
        unlinks: u64,
        hint: &mut LeafHint,
    ) -> Option<*mut u64> {
        debug_assert!(level_index(iova, 1) + pages <= ENTRIES);
        let table = self.leaf_table(iova, iova + PAGE_SIZE)?;
        let words = self.mem.as_ptr(table, PAGE_SIZE).ok()?.cast::<u64>();
        *hint = LeafHint {
            region,
            words,
            unlinks,
        };
        Some(words.wrapping_add(level_index(iova, 1) as usize))
    }

    /// Maps `[iova, iova + len)` → `phys` for a block fresh from the
    /// domain's allocator (see `map_fresh`: nothing is mapped there), in
    /// one store per page when the range lies in one 2 MiB region of a
    /// coherent table whose last-level table exists; otherwise through
    /// `map_fresh`. `phys` and `len` are 4 KiB aligned.
    #[inline(always)]
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
            if let Some(words) = self.hinted_words(iova, pages, hint) {
                let first = leaf_entry(phys, 1, perm);
                if pages == 1 {
                    // The usual buffer (an MTU frame, a sector run): one
                    // store, no loop set-up.
                    // SAFETY: as below, for the first word.
                    let w = unsafe { AtomicU64::from_ptr(words) };
                    w.store(first, Ordering::Release);
                    return Ok(());
                }
                for i in 0..pages {
                    // SAFETY: `hinted_words` gave `pages` words of one
                    // last-level table page in the arena (8-byte aligned),
                    // which lives as long as `self`; every access to
                    // entries is atomic.
                    let w = unsafe { AtomicU64::from_ptr(words.add(i as usize)) };
                    // Release: as `store_leaf`'s.
                    w.store(first + (i << PAGE_SHIFT), Ordering::Release);
                }
                return Ok(());
            }
        }
        self.map_fresh(iova, phys, len, perm).map(|_| ())
    }

    /// Unmaps `[iova, iova + len)` (4 KiB aligned), adding unlinked tables
    /// (and, with `track_range`, the range) to `gather`: in one load and
    /// one store per page when every entry is a 4 KiB leaf of one
    /// last-level table of a coherent table; otherwise through the general
    /// unmap (which checks and reports everything). A deferred unmap needs
    /// no range: its flush invalidates the whole domain.
    #[inline(always)]
    pub(crate) fn unmap_hinted(
        &self,
        iova: u64,
        len: u64,
        gather: &mut IotlbGather,
        hint: &mut LeafHint,
        track_range: bool,
    ) -> Result<(), PgtableError> {
        let pages = len >> PAGE_SHIFT;
        let fits = self.flush.is_none()
            && len != 0
            && (iova | len) & (PAGE_SIZE - 1) == 0
            && iova >> REGION_SHIFT == (iova + len - 1) >> REGION_SHIFT;
        if fits {
            if let Some(words) = self.hinted_words(iova, pages, hint) {
                // SAFETY (both loops): as in `map_hinted`.
                let word = |i: u64| unsafe { AtomicU64::from_ptr(words.add(i as usize)) };
                if pages == 1 {
                    let w = word(0);
                    // Acquire: as the walk's.
                    if matches!(
                        decode_entry(w.load(Ordering::Acquire), 1),
                        SlEntry::Leaf { .. }
                    ) {
                        // Relaxed: as `clear_entry`'s.
                        w.store(0, Ordering::Relaxed);
                        if track_range {
                            gather.add_range(iova, len);
                        }
                        return Ok(());
                    }
                    return self.unmap(iova, len, gather).map(|_| ());
                }
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
                    if track_range {
                        gather.add_range(iova, len);
                    }
                    return Ok(());
                }
            }
        }
        self.unmap(iova, len, gather).map(|_| ())
    }
}

/// The hint's protocol, modelled: an unmap that empties a 2 MiB region
/// bumps `unlinks` (Release) before it unlinks the table and frees the
/// table page, and only then frees the IOVA block it unmapped; a CPU that
/// holds an old hint can write through it only after it allocated a block
/// of that region, i.e. after acquiring that free. Then its `unlinks` read
/// must see the bump: a stale hint is never used on a freed table.
#[cfg(all(test, loom))]
mod loom_tests {
    use crate::sync::{AtomicBool, AtomicU64, Ordering};
    use loom::sync::Arc;

    #[test]
    fn loom_a_stale_hint_is_never_used_after_its_table_is_freed() {
        loom::model(|| {
            let unlinks = Arc::new(AtomicU64::new(0));
            let table_live = Arc::new(AtomicBool::new(true));
            // The IOVA block of the region: held by the unmapper, then
            // free (what the allocator's release/acquire hand-off gives).
            let block_free = Arc::new(AtomicBool::new(false));
            let unmapper = {
                let (unlinks, table_live, block_free) =
                    (unlinks.clone(), table_live.clone(), block_free.clone());
                loom::thread::spawn(move || {
                    unlinks.fetch_add(1, Ordering::Release);
                    table_live.store(false, Ordering::Relaxed);
                    block_free.store(true, Ordering::Release);
                })
            };
            // The mapper: its hint was taken when the count was 0.
            let hint_unlinks = 0;
            if block_free.load(Ordering::Acquire) {
                // It owns a block of the region now, and maps through the
                // hint only if the count is unchanged.
                if unlinks.load(Ordering::Acquire) == hint_unlinks {
                    assert!(
                        table_live.load(Ordering::Relaxed),
                        "a stale hint wrote into a freed table"
                    );
                }
            }
            unmapper.join().unwrap();
        });
    }
}
