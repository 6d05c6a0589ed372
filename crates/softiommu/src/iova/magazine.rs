//! A magazine: a fixed-capacity stack of cached IOVA page frames of one size
//! class (the Bonwick & Adams design, USENIX 2001, that Linux's `iova.c`
//! rcache follows).

use super::policy::MAX_MAGAZINE_SIZE;

/// Unused slots before and after the entries: 128 bytes, so that no cache
/// line holding entries is shared with another heap object (two CPUs'
/// magazines allocated side by side would otherwise ping-pong a line).
const PAD: usize = 16;

/// A stack of at most `capacity` page-frame numbers.
#[derive(Debug)]
pub(crate) struct Magazine {
    /// `PAD` unused words, the entries, `PAD` unused words.
    slots: Box<[u64]>,
    len: usize,
    /// `slots.len() - 2 * PAD`, kept so that a push compares with a field
    /// instead of computing it.
    cap: usize,
}

impl Magazine {
    /// An empty magazine of `capacity` entries (at most
    /// [`MAX_MAGAZINE_SIZE`]: larger asks are clamped, so the sum below
    /// cannot overflow whatever the caller passes).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.min(MAX_MAGAZINE_SIZE);
        Self {
            slots: vec![0; capacity + 2 * PAD].into_boxed_slice(),
            len: 0,
            cap: capacity,
        }
    }

    /// The most entries it holds.
    #[inline(always)]
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length to `n` (clamped to the capacity): for a holder
    /// that keeps the length elsewhere while it works through
    /// [`get_unchecked`](Self::get_unchecked) and
    /// [`set_unchecked`](Self::set_unchecked) (`class.rs`).
    #[inline]
    pub(crate) fn set_len(&mut self, n: usize) {
        self.len = n.min(self.cap);
    }

    /// Entry `i` (0: the bottom).
    ///
    /// # Safety
    /// `i < capacity`.
    #[inline(always)]
    pub(crate) unsafe fn get_unchecked(&self, i: usize) -> u64 {
        debug_assert!(i < self.cap);
        // SAFETY: `i < capacity` (the contract) and `capacity ==
        // slots.len() - 2 * PAD`, as in `push`.
        unsafe { *self.slots.get_unchecked(PAD + i) }
    }

    /// Writes entry `i` (0: the bottom); the length is the caller's.
    ///
    /// # Safety
    /// `i < capacity`.
    #[inline(always)]
    pub(crate) unsafe fn set_unchecked(&mut self, i: usize, pfn: u64) {
        debug_assert!(i < self.cap);
        // SAFETY: as in `get_unchecked`.
        unsafe { *self.slots.get_unchecked_mut(PAD + i) = pfn };
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        // `>=`, the test `push` makes, so that the two fold into one.
        self.len >= self.capacity()
    }

    /// Pushes `pfn`; returns `false`, pushing nothing, if the magazine is
    /// full (callers check `is_full` first).
    #[inline]
    pub(crate) fn push(&mut self, pfn: u64) -> bool {
        // The length read once: the entry's store cannot then make the
        // compiler read it again for the increment.
        let len = self.len;
        if len >= self.capacity() {
            return false;
        }
        // SAFETY: `len < capacity` (checked above) and `capacity == cap ==
        // slots.len() - 2 * PAD` (both set in `new`, where the sum cannot
        // overflow, and never changed), so `PAD + len < slots.len()`. (The
        // compiler keeps this one comparison instead of a second bounds
        // check.)
        unsafe { *self.slots.get_unchecked_mut(PAD + len) = pfn };
        self.len = len + 1;
        true
    }

    /// The free slots above the top, bottom first: a caller that fills the
    /// first `n` of them then calls [`commit`](Self::commit)`(n)` (a run
    /// of pushes with one bound and one length update).
    #[inline]
    pub(crate) fn spare(&mut self) -> &mut [u64] {
        let (lo, hi) = (PAD + self.len, PAD + self.cap);
        // `len <= cap` and `cap + 2 * PAD == slots.len()` (see `push`).
        &mut self.slots[lo..hi]
    }

    /// Counts as pushed the first `n` slots of [`spare`](Self::spare)
    /// (clamped to the room there is).
    #[inline]
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n.min(self.cap - self.len);
    }

    /// The entry `k` places below the top (0: the top), if there is one:
    /// what the `k`-th pop from now takes, if nothing is pushed meanwhile.
    #[cfg(test)]
    pub(crate) fn peek_below(&self, k: usize) -> Option<u64> {
        let i = self.len.checked_sub(1)?.checked_sub(k)?;
        self.slots.get(PAD + i).copied()
    }

    /// Pops an entry at or below `limit` (the highest start a block may have
    /// to end within the caller's limit): the top one if it qualifies (the
    /// common case), else the first that does, as Linux's magazine pop does.
    #[inline]
    pub(crate) fn pop_below(&mut self, limit: u64) -> Option<u64> {
        let top = self.len.checked_sub(1)?;
        // SAFETY: `top < len <= capacity` (`len` only grows in `push` and
        // `commit`, which both keep it at most `capacity`, and `capacity ==
        // slots.len() - 2 * PAD`, as in `push`), so `PAD + top <
        // slots.len()`.
        let pfn = unsafe { *self.slots.get_unchecked(PAD + top) };
        if pfn <= limit {
            self.len = top;
            return Some(pfn);
        }
        self.pop_scan(limit)
    }

    /// Pops the first entry at or below `limit`, wherever it is.
    #[cold]
    pub(crate) fn pop_scan(&mut self, limit: u64) -> Option<u64> {
        let i = self.slots[PAD..PAD + self.len]
            .iter()
            .position(|&p| p <= limit)?;
        let pfn = self.slots[PAD + i];
        self.len -= 1;
        self.slots[PAD + i] = self.slots[PAD + self.len];
        Some(pfn)
    }

    /// Empties the magazine, yielding its entries.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = u64> + '_ {
        let n = std::mem::take(&mut self.len);
        self.slots[PAD..PAD + n].iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_respect_the_limit() {
        let mut m = Magazine::new(4);
        for p in [10, 50, 20, 90] {
            m.push(p);
        }
        assert!(m.is_full());
        assert_eq!(m.pop_below(100), Some(90));
        assert_eq!(m.pop_below(30), Some(20), "the top qualifies");
        assert_eq!(m.pop_below(15), Some(10), "found below the top");
        assert_eq!(m.pop_below(5), None);
        assert_eq!(m.len(), 1);
        assert_eq!(m.drain().collect::<Vec<_>>(), vec![50]);
        assert!(m.is_empty());
    }
}
