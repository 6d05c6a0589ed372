//! The Linux range allocator as a baseline: a tree of *allocated* ranges,
//! searched linearly downwards from a cached node.
//!
//! Our own code, written from the behaviour of `drivers/iommu/iova.c`: an
//! allocation starts below the cached node (the last range allocated,
//! moved up when a range at or above it is freed) and walks the allocated
//! ranges one by one towards lower addresses until the gap below one of
//! them holds an aligned block. What else applies depends on the kernel
//! ([`LinearSearch`]): v4.7 has a cached node only for allocations limited
//! to the low window (the rest start at the top) and fails a walk that
//! reaches the bottom; v5.10 has a second cached node, retries once above
//! the cached node (v5.7's "retry from last rb tree node"), and remembers
//! the size of a failed low-window allocation so that later ones at least
//! that large fail at once until a low-window range at or above the cached
//! node is freed (v5.0's `max32_alloc_size`). IOVAs held in the per-CPU
//! caches stay in this tree, so the walk lengthens as the caches grow and
//! fill it: the mechanism behind seed `004`'s throughput cliff.

use std::collections::BTreeMap;

use super::policy::LinearSearch;

/// The first frame above 4 GiB: Linux keeps a separate cached node for
/// allocations below it (`dma_32bit_pfn`, set by `init_iova_domain`).
pub(crate) const DMA_32BIT_PFN: u64 = 1 << 20;

/// Allocated ranges (`lo -> hi`, inclusive) with a Linux-style cached node.
#[derive(Debug)]
pub(crate) struct LinearTree {
    start: u64,
    ranges: BTreeMap<u64, u64>,
    /// `lo` of the cached node for allocations above 4 GiB; `None` stands
    /// for the anchor above the top.
    cached: Option<u64>,
    /// The cached node for allocations limited to the low window.
    cached32: Option<u64>,
    /// The first frame above the low window (Linux: 4 GiB).
    dma32: u64,
    /// Low-window allocations of at least this many pages fail without a
    /// walk (Linux's `max32_alloc_size`; v5.10 only).
    max32: u64,
    rules: LinearSearch,
    /// Ranges stepped over by searches, in all (the cost that grows).
    pub(crate) scan_steps: u64,
}

impl LinearTree {
    /// An empty tree over `[start, ...]` whose low window ends below
    /// frame `dma32` (Linux: [`DMA_32BIT_PFN`]), searched by `rules`.
    pub(crate) fn new(start: u64, dma32: u64, rules: LinearSearch) -> Self {
        Self {
            start,
            ranges: BTreeMap::new(),
            cached: None,
            cached32: None,
            dma32,
            max32: dma32,
            rules,
            scan_steps: 0,
        }
    }

    /// The number of allocated ranges (tree nodes).
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Walks down from `from` (exclusive) looking for an aligned block of
    /// `size` pages at or below `limit` and at or above `low`.
    fn walk(&mut self, from: u64, limit: u64, size: u64, low: u64) -> Option<u64> {
        let mut high = from.min(limit.saturating_add(1)); // exclusive end of the gap
        let fit = |high: u64| high.checked_sub(size).map(|h| h & !(size - 1));
        let mut steps = 0u64;
        let mut found = None;
        for (&lo, &hi) in self.ranges.range(..from).rev() {
            steps += 1;
            match fit(high) {
                Some(c) if c < low => break,
                Some(c) if c > hi => {
                    found = Some(c);
                    break;
                }
                None => break,
                _ => {}
            }
            high = high.min(lo);
        }
        self.scan_steps += steps;
        found.or_else(|| fit(high).filter(|&c| c >= low && high > c))
    }

    /// Allocates an aligned block of 2^`order` pages at or below `limit`.
    pub(crate) fn alloc(&mut self, order: u32, limit: u64) -> Option<u64> {
        let size = 1u64.checked_shl(order)?;
        let top = limit.saturating_add(1);
        let low_window = top <= self.dma32;
        let v5 = self.rules == LinearSearch::Linux5_10;
        if v5 && low_window && size >= self.max32 {
            return None;
        }
        // v4.7 uses (and later moves) its cached node only for a limit of
        // exactly the window's last frame (`limit_pfn == dma_32bit_pfn`);
        // v5.10 for any limit in the window.
        let use32 = if v5 { low_window } else { top == self.dma32 };
        let cached = match (use32, v5) {
            (true, _) => self.cached32,
            (false, true) => self.cached,
            (false, false) => None,
        };
        let from = match cached {
            Some(c) if c <= top => c,
            // v4.7 starts at the last node of the whole tree (`rb_last`)
            // and steps over every range above the limit; v5.10 starts at
            // the limit.
            None if !v5 => u64::MAX,
            _ => top,
        };
        let start = self.start;
        let found = self.walk(from, limit, size, start).or_else(|| {
            // Retry once above the cached node, up to the limit.
            let above = self.ranges.get(&from).map_or(top, |&hi| hi + 1);
            (v5 && above < top)
                .then(|| self.walk(top, limit, size, above))
                .flatten()
        });
        let Some(pfn) = found else {
            // v5.10 records the size on any failed search, whatever the
            // limit (only low-window allocations look at it).
            self.max32 = size;
            return None;
        };
        self.ranges.insert(pfn, pfn + size - 1);
        if v5 {
            if pfn + size - 1 < self.dma32 {
                self.cached32 = Some(pfn);
            } else {
                self.cached = Some(pfn);
            }
        } else if use32 {
            self.cached32 = Some(pfn);
        }
        Some(pfn)
    }

    /// Removes the range starting at `lo`; updates the cached node as Linux
    /// does: freeing at or above it moves it to the freed range's successor.
    pub(crate) fn free(&mut self, lo: u64, hi: u64) -> Result<(), ()> {
        if self.ranges.get(&lo) != Some(&hi) {
            return Err(());
        }
        self.ranges.remove(&lo);
        let next = self.ranges.range(lo..).next().map(|(&l, _)| l);
        if self.rules == LinearSearch::Linux4_7 {
            // v4.7: no cached node stays none; a free at or above it moves
            // it to the freed range's successor if that lies in the window.
            if self.cached32.is_some_and(|c| lo >= c) {
                self.cached32 = next.filter(|&n| n < self.dma32);
            }
        } else if self
            .cached32
            .is_none_or(|c| c == lo || (hi < self.dma32 && lo >= c))
        {
            self.cached32 = next;
            self.max32 = self.dma32;
        }
        if self.cached.is_none_or(|c| lo >= c) {
            self.cached = next;
        }
        Ok(())
    }

    /// Inserts `[lo, hi]` as an allocated (reserved) range if it overlaps
    /// nothing.
    pub(crate) fn carve(&mut self, lo: u64, hi: u64) -> Result<(), ()> {
        let below = self.ranges.range(..=hi).next_back();
        if below.is_some_and(|(_, &h)| h >= lo) {
            return Err(());
        }
        self.ranges.insert(lo, hi);
        Ok(())
    }

    /// Whether `pfn` is outside every allocated range.
    pub(crate) fn is_free(&self, pfn: u64) -> bool {
        self.ranges
            .range(..=pfn)
            .next_back()
            .is_none_or(|(_, &h)| h < pfn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_top_down_from_the_cached_node() {
        let mut t = LinearTree::new(1, DMA_32BIT_PFN, LinearSearch::Linux5_10);
        assert_eq!(t.alloc(0, 1023), Some(1023));
        assert_eq!(t.alloc(2, 1023), Some(1016));
        assert_eq!(t.alloc(0, 1023), Some(1015));
        t.free(1023, 1023).unwrap();
        // The cached node moved up to the top: the hole is found again.
        assert_eq!(t.alloc(0, 1023), Some(1023));
        assert_eq!(t.free(5, 5), Err(()));
        assert_eq!(t.alloc(0, 1), Some(1));
        assert_eq!(t.alloc(0, 1), None);
    }

    #[test]
    fn searches_step_over_every_range_in_the_way() {
        let mut t = LinearTree::new(0, DMA_32BIT_PFN, LinearSearch::Linux5_10);
        for _ in 0..100 {
            t.alloc(0, 999).unwrap();
        }
        // Free every other page near the top: 1-page holes, useless for 4 pages.
        for p in (900..1000).step_by(2) {
            t.free(p, p).unwrap();
        }
        let before = t.scan_steps;
        assert_eq!(t.alloc(2, 999), Some(896));
        assert!(
            t.scan_steps - before >= 45,
            "walked {} ranges",
            t.scan_steps - before
        );
    }

    #[test]
    fn v4_7_starts_above_everything_and_does_not_retry() {
        // Low window ends at 1024: ranges above it are stepped over by a
        // low-window search that has no cached node.
        let mut t = LinearTree::new(1, 1024, LinearSearch::Linux4_7);
        for _ in 0..50 {
            t.alloc(0, 1 << 20).unwrap();
        }
        let before = t.scan_steps;
        assert_eq!(t.alloc(0, 1023), Some(1023));
        assert!(
            t.scan_steps - before >= 50,
            "stepped {}",
            t.scan_steps - before
        );
        // A 64-bit search always starts at the top: 51 ranges to step over
        // before the gap below the lowest high range.
        let before = t.scan_steps;
        assert_eq!(t.alloc(0, 1 << 20), Some((1 << 20) - 50));
        assert!(
            t.scan_steps - before >= 50,
            "stepped {}",
            t.scan_steps - before
        );
        // Free the top: v4.7 has no retry, but starts from the top anyway.
        t.free((1 << 20) - 1, (1 << 20) - 1).unwrap();
        assert_eq!(t.alloc(0, 1 << 20), Some((1 << 20) - 1));
    }

    #[test]
    fn v5_10_remembers_a_full_window_until_room_is_freed() {
        let mut t = LinearTree::new(1, 9, LinearSearch::Linux5_10);
        // Fill the window [1, 8] with single pages (the cached node ends
        // at 1), empty the top and fill it again (the cached node: 8).
        for p in (1..=8).rev() {
            assert_eq!(t.alloc(0, 8), Some(p));
        }
        t.free(8, 8).unwrap();
        assert_eq!(t.alloc(0, 8), Some(8));
        assert_eq!(t.alloc(0, 8), None);
        // The failure is remembered: the next try does not walk.
        let before = t.scan_steps;
        assert_eq!(t.alloc(0, 8), None);
        assert_eq!(t.scan_steps, before);
        // A free below the cached node leaves the memory as it is (Linux's
        // rule)...
        t.free(3, 3).unwrap();
        assert_eq!(t.alloc(0, 8), None);
        assert_eq!(t.scan_steps, before);
        // ...one at the cached node clears it, and both holes are found.
        t.free(8, 8).unwrap();
        assert_eq!(t.alloc(0, 8), Some(8));
        assert_eq!(t.alloc(0, 8), Some(3));
    }

    /// `[1, 31]` filled top-down but for a one-page hole at 20 that a
    /// two-page block walked past (to 14): the cached node ends at 1.
    fn filled_around_a_hole(dma32: u64, rules: LinearSearch) -> LinearTree {
        let mut t = LinearTree::new(1, dma32, rules);
        for p in (16..=31).rev() {
            assert_eq!(t.alloc(0, 31), Some(p));
        }
        t.free(20, 20).unwrap();
        assert_eq!(t.alloc(1, 31), Some(14));
        for p in (1..=13).rev() {
            assert_eq!(t.alloc(0, 31), Some(p));
        }
        t
    }

    #[test]
    fn v5_10_retries_above_the_cached_node() {
        let mut t = filled_around_a_hole(1 << 20, LinearSearch::Linux5_10);
        // Nothing below the cached node (1): the retry above it finds 20.
        assert_eq!(t.alloc(0, 31), Some(20));
        assert_eq!(t.alloc(0, 31), None);
        // v4.7 has no retry: the same history leaves the hole unfound (its
        // cached node serves a limit of exactly the window's last frame).
        let mut t = filled_around_a_hole(32, LinearSearch::Linux4_7);
        assert_eq!(t.alloc(0, 31), None);
    }
}
