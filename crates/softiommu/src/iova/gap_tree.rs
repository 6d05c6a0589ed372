//! softiommu's range allocator: a treap of free extents, augmented so that
//! every subtree knows the largest naturally aligned power-of-two block any
//! of its extents can hold.
//!
//! Allocation looks for the highest-addressed aligned block of 2^k pages at
//! or below a limit. The augmentation makes the search exact: a subtree whose
//! best order is below `k` holds no fit and is skipped; one whose best order
//! is at least `k` holds one for certain. So the search costs O(log n) in the
//! number of free extents whatever the fragmentation, where Linux's search
//! walks allocated nodes one by one. Free extents are merged with their
//! neighbours on every free, so holes heal as ranges come back.
//!
//! Nodes live in a vector indexed by `u32` and are recycled through a free
//! list: after warm-up, allocation and free do not touch the heap.

const NIL: u32 = u32::MAX;
/// `best` of an empty subtree.
const NONE: i8 = -1;

#[derive(Debug, Clone, Copy)]
struct Node {
    lo: u64,
    hi: u64, // inclusive
    left: u32,
    right: u32,
    prio: u32,
    best: i8, // largest aligned order held in this subtree
}

/// The largest order `k` such that an aligned block of 2^k fits in
/// `[lo, hi]`. With `n = hi - lo + 1` and `f = floor(log2 n)`, the answer is
/// `f` or `f - 1`: any range of at least 2^f pages holds an aligned block of
/// 2^(f-1), so only `f` needs checking.
pub(crate) fn extent_order(lo: u64, hi: u64) -> i8 {
    let n = hi - lo + 1; // hi >= lo always; a full 2^64 range is never built
    let f = 63 - n.leading_zeros();
    if top_fit(lo, hi, f).is_some() {
        f as i8
    } else {
        f as i8 - 1
    }
}

/// The highest aligned start of a 2^k block inside `[lo, hi]`, if any.
pub(crate) fn top_fit(lo: u64, hi: u64, k: u32) -> Option<u64> {
    let size = 1u64.checked_shl(k)?;
    let end = hi.checked_add(1)?; // exclusive
    let start = end.checked_sub(size)? & !(size - 1);
    (start >= lo).then_some(start)
}

/// A set of disjoint free extents `[lo, hi]` with an O(log n) aligned search.
#[derive(Debug)]
pub(crate) struct GapTree {
    nodes: Vec<Node>,
    free_slots: Vec<u32>,
    root: u32,
    len: usize,
    seed: u64,
}

impl GapTree {
    /// A tree holding one free extent `[lo, hi]`.
    pub(crate) fn new(lo: u64, hi: u64) -> Self {
        let mut t = Self {
            nodes: Vec::new(),
            free_slots: Vec::new(),
            root: NIL,
            len: 0,
            seed: 0x9e37_79b9_7f4a_7c15,
        };
        t.insert(lo, hi);
        t
    }

    /// The number of free extents.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn best(&self, t: u32) -> i8 {
        if t == NIL {
            NONE
        } else {
            self.nodes[t as usize].best
        }
    }

    fn pull(&mut self, t: u32) {
        let n = self.nodes[t as usize];
        let own = extent_order(n.lo, n.hi);
        let best = own.max(self.best(n.left)).max(self.best(n.right));
        self.nodes[t as usize].best = best;
    }

    fn new_node(&mut self, lo: u64, hi: u64) -> u32 {
        // xorshift64: treap priorities need only be unpredictable in shape.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let node = Node {
            lo,
            hi,
            left: NIL,
            right: NIL,
            prio: self.seed as u32,
            best: extent_order(lo, hi),
        };
        self.len += 1;
        if let Some(i) = self.free_slots.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    /// Splits `t` into (lo < key, lo >= key).
    fn split(&mut self, t: u32, key: u64) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.nodes[t as usize].lo < key {
            let (a, b) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = a;
            self.pull(t);
            (t, b)
        } else {
            let (a, b) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = b;
            self.pull(t);
            (a, t)
        }
    }

    /// Joins two treaps where every key of `a` is below every key of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].prio > self.nodes[b as usize].prio {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.pull(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.pull(b);
            b
        }
    }

    fn insert(&mut self, lo: u64, hi: u64) {
        let n = self.new_node(lo, hi);
        let (a, b) = self.split(self.root, lo);
        let left = self.merge(a, n);
        self.root = self.merge(left, b);
    }

    /// Removes the extent starting at `lo` (which must exist).
    fn remove(&mut self, lo: u64) {
        let (a, b) = self.split(self.root, lo);
        let (m, c) = self.split(b, lo + 1);
        debug_assert!(m != NIL && self.nodes[m as usize].left == NIL);
        if m != NIL {
            self.free_slots.push(m);
            self.len -= 1;
        }
        self.root = self.merge(a, c);
    }

    /// The extent with the largest `lo <= pfn`.
    fn floor(&self, pfn: u64) -> Option<(u64, u64)> {
        let (mut t, mut best) = (self.root, None);
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.lo <= pfn {
                best = Some((n.lo, n.hi));
                t = n.right;
            } else {
                t = n.left;
            }
        }
        best
    }

    /// The extent with the smallest `lo > pfn`.
    fn above(&self, pfn: u64) -> Option<(u64, u64)> {
        let (mut t, mut best) = (self.root, None);
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.lo > pfn {
                best = Some((n.lo, n.hi));
                t = n.left;
            } else {
                t = n.right;
            }
        }
        best
    }

    /// Whether `pfn` lies in a free extent.
    pub(crate) fn is_free(&self, pfn: u64) -> bool {
        self.floor(pfn).is_some_and(|(_, hi)| hi >= pfn)
    }

    /// Highest aligned 2^k block at or below `limit`, searched with the
    /// augmentation; returns the block start and the extent holding it.
    fn find(&self, t: u32, k: i8, limit: u64) -> Option<(u64, u64)> {
        if t == NIL || self.best(t) < k {
            return None;
        }
        let n = self.nodes[t as usize];
        if n.lo > limit {
            return self.find(n.left, k, limit);
        }
        if let Some(hit) = self.find(n.right, k, limit) {
            return Some(hit);
        }
        if let Some(start) = top_fit(n.lo, n.hi.min(limit), k as u32) {
            return Some((start, n.lo));
        }
        // Everything on the left ends below `n.lo <= limit`: `best` is exact.
        self.find_unbounded(n.left, k)
    }

    fn find_unbounded(&self, mut t: u32, k: i8) -> Option<(u64, u64)> {
        while t != NIL && self.best(t) >= k {
            let n = self.nodes[t as usize];
            if self.best(n.right) >= k {
                t = n.right;
            } else if let Some(start) = top_fit(n.lo, n.hi, k as u32) {
                return Some((start, n.lo));
            } else {
                t = n.left;
            }
        }
        None
    }

    /// Allocates the highest aligned block of 2^`order` pages ending at or
    /// below `limit`.
    pub(crate) fn alloc(&mut self, order: u32, limit: u64) -> Option<u64> {
        let (start, ext_lo) = self.find(self.root, order as i8, limit)?;
        // The search returned an extent of the tree; were it missing (an
        // invariant broken), the allocation fails closed: `None`.
        let (lo, hi) = self.floor(ext_lo)?;
        let end = start + (1u64 << order) - 1;
        self.remove(lo);
        if lo < start {
            self.insert(lo, start - 1);
        }
        if end < hi {
            self.insert(end + 1, hi);
        }
        Some(start)
    }

    /// Returns `[lo, hi]` to the free set, merging with adjacent extents.
    /// Fails, changing nothing, if any page of it is already free.
    pub(crate) fn free(&mut self, lo: u64, hi: u64) -> Result<(), ()> {
        let below = self.floor(lo);
        let above = self.above(lo);
        if below.is_some_and(|(_, h)| h >= lo) || above.is_some_and(|(l, _)| l <= hi) {
            return Err(());
        }
        let (mut new_lo, mut new_hi) = (lo, hi);
        if let Some((l, _)) = below.filter(|&(_, h)| h + 1 == lo) {
            self.remove(l);
            new_lo = l;
        }
        if let Some((l, h)) = above.filter(|&(l, _)| Some(l) == hi.checked_add(1)) {
            self.remove(l);
            new_hi = h;
        }
        self.insert(new_lo, new_hi);
        Ok(())
    }

    /// Takes `[lo, hi]` out of the free set; it must lie inside one free
    /// extent, else nothing changes and `Err` is returned.
    pub(crate) fn carve(&mut self, lo: u64, hi: u64) -> Result<(), ()> {
        match self.floor(lo) {
            Some((l, h)) if h >= hi => {
                self.remove(l);
                if l < lo {
                    self.insert(l, lo - 1);
                }
                if hi < h {
                    self.insert(hi + 1, h);
                }
                Ok(())
            }
            _ => Err(()),
        }
    }

    /// All free extents in ascending order (for tests and checkers).
    pub(crate) fn extents(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(self.len);
        let mut stack = Vec::new();
        let mut t = self.root;
        loop {
            while t != NIL {
                stack.push(t);
                t = self.nodes[t as usize].left;
            }
            let Some(n) = stack.pop() else { break };
            out.push((self.nodes[n as usize].lo, self.nodes[n as usize].hi));
            t = self.nodes[n as usize].right;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extent_order_is_exact() {
        for lo in 0..70u64 {
            for hi in lo..lo + 70 {
                let brute = (0..8)
                    .rev()
                    .find(|&k| top_fit(lo, hi, k).is_some())
                    .unwrap() as i8;
                assert_eq!(extent_order(lo, hi), brute, "[{lo},{hi}]");
            }
        }
    }

    #[test]
    fn allocates_top_down_aligned_and_merges_back() {
        let mut t = GapTree::new(1, 1023);
        assert_eq!(t.alloc(0, 1023), Some(1023));
        assert_eq!(t.alloc(2, 1023), Some(1016));
        assert_eq!(t.alloc(0, 1023), Some(1022));
        assert_eq!(t.alloc(3, 100), Some(88));
        t.free(1023, 1023).unwrap();
        t.free(1016, 1019).unwrap();
        t.free(1022, 1022).unwrap();
        t.free(88, 95).unwrap();
        assert_eq!(t.extents(), vec![(1, 1023)]);
        assert_eq!(t.free(5, 5), Err(()), "double free refused");
    }

    #[test]
    fn misaligned_holes_are_skipped_without_scanning() {
        // Holes of 3 pages at odd offsets hold no aligned 4-page block.
        let mut t = GapTree::new(0, 4095);
        t.carve(0, 4095).unwrap();
        for i in 0..500u64 {
            t.free(i * 8 + 1, i * 8 + 3).unwrap();
        }
        assert_eq!(t.alloc(2, 4095), None);
        assert_eq!(t.alloc(1, 4095), Some(499 * 8 + 2));
    }

    #[test]
    fn carve_needs_a_free_range() {
        let mut t = GapTree::new(0, 99);
        t.carve(10, 19).unwrap();
        assert_eq!(t.carve(15, 25), Err(()));
        assert_eq!(t.extents(), vec![(0, 9), (20, 99)]);
        assert!(t.is_free(9) && !t.is_free(10) && t.is_free(20));
    }
}
