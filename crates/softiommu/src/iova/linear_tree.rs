//! The Linux range allocator as a baseline: a tree of *allocated* ranges,
//! searched linearly downwards from a cached node.
//!
//! Our own code, written from the behaviour of `drivers/iommu/iova.c`
//! (v4.15 to v6.x): an allocation starts below the cached node (the last
//! range allocated, one node for 32-bit limits and one for the rest, moved up when a range at or above it is freed) and walks
//! the allocated ranges one by one towards lower addresses until the gap
//! below one of them holds an aligned block; if it reaches the bottom it
//! retries once from the limit. IOVAs held in the per-CPU caches stay in this
//! tree, so the walk lengthens as the caches grow and fragment it: the
//! mechanism behind seed `004`'s throughput cliff.

use std::collections::BTreeMap;

/// The first frame above 4 GiB: Linux keeps a separate cached node for
/// allocations below it (`dma_32bit_pfn`).
const DMA_32BIT_PFN: u64 = 1 << 20;

/// Allocated ranges (`lo -> hi`, inclusive) with a Linux-style cached node.
#[derive(Debug)]
pub(crate) struct LinearTree {
    start: u64,
    ranges: BTreeMap<u64, u64>,
    /// `lo` of the cached node for allocations above 4 GiB; `None` stands
    /// for the anchor above the top.
    cached: Option<u64>,
    /// The cached node for allocations limited to 32 bits.
    cached32: Option<u64>,
    /// Ranges stepped over by searches, in all (the cost that grows).
    pub(crate) scan_steps: u64,
}

impl LinearTree {
    /// An empty tree over `[start, ...]`.
    pub(crate) fn new(start: u64) -> Self {
        Self {
            start,
            ranges: BTreeMap::new(),
            cached: None,
            cached32: None,
            scan_steps: 0,
        }
    }

    /// The number of allocated ranges (tree nodes).
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Walks down from `from` (exclusive) looking for an aligned block of
    /// `size` pages at or below `limit`.
    fn walk(&mut self, from: u64, limit: u64, size: u64) -> Option<u64> {
        let mut high = from.min(limit.saturating_add(1)); // exclusive end of the gap
        let fit = |high: u64| high.checked_sub(size).map(|h| h & !(size - 1));
        let mut steps = 0u64;
        let mut found = None;
        for (&lo, &hi) in self.ranges.range(..from).rev() {
            steps += 1;
            if let Some(c) = fit(high) {
                if c > hi && c >= self.start {
                    found = Some(c);
                    break;
                }
            }
            high = high.min(lo);
        }
        self.scan_steps += steps;
        found.or_else(|| fit(high).filter(|&c| c >= self.start && high > c))
    }

    /// Allocates an aligned block of 2^`order` pages at or below `limit`.
    pub(crate) fn alloc(&mut self, order: u32, limit: u64) -> Option<u64> {
        let size = 1u64.checked_shl(order)?;
        let top = limit.saturating_add(1);
        let cached = if limit < DMA_32BIT_PFN {
            self.cached32
        } else {
            self.cached
        };
        let from = match cached {
            Some(c) if c <= top => c,
            _ => top,
        };
        let pfn = self.walk(from, limit, size).or_else(|| {
            // Retry over the whole range below the limit, as Linux does.
            (from < top).then(|| self.walk(top, limit, size)).flatten()
        })?;
        self.ranges.insert(pfn, pfn + size - 1);
        if pfn + size - 1 < DMA_32BIT_PFN {
            self.cached32 = Some(pfn);
        } else {
            self.cached = Some(pfn);
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
        if self
            .cached32
            .is_none_or(|c| c == lo || (hi < DMA_32BIT_PFN && lo >= c))
        {
            self.cached32 = next;
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
        let mut t = LinearTree::new(1);
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
        let mut t = LinearTree::new(0);
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
}
