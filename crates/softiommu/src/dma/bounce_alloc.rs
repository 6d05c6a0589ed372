//! The page allocator of one bounce lane: next fit over a bitmap.
//!
//! A slot is a run of whole pages. The search starts where the last one
//! ended and wraps around the lane, so that a slot just given back is the
//! last one handed out again: a device's late access to an address it was
//! unmapped from finds no mapping there (it faults) until the allocator
//! has gone round the whole lane, rather than the next caller's buffer.

#![deny(clippy::indexing_slicing)]

use crate::mem::MemError;

/// Free and used pages of a lane; see the module.
#[derive(Debug)]
pub(crate) struct NextFit {
    /// A bit per page, set while a slot holds it.
    used: Vec<u64>,
    /// At a slot's first page, its length in pages; 0 elsewhere: a free
    /// must name a slot exactly.
    runs: Vec<u32>,
    pages: u64,
    /// Where the next search starts: the page after the last slot taken.
    cursor: u64,
}

impl NextFit {
    /// A lane of `pages` pages, all free.
    pub(crate) fn new(pages: u64) -> Self {
        let words = usize::try_from(pages.div_ceil(64)).unwrap_or(0);
        let runs = usize::try_from(pages).unwrap_or(0);
        Self {
            used: vec![0; words],
            runs: vec![0; runs],
            pages,
            cursor: 0,
        }
    }

    fn is_used(&self, page: u64) -> bool {
        let word = self.used.get((page / 64) as usize).copied().unwrap_or(!0);
        word >> (page % 64) & 1 == 1
    }

    fn set(&mut self, start: u64, n: u64, used: bool) {
        for p in start..start + n {
            if let Some(w) = self.used.get_mut((p / 64) as usize) {
                if used {
                    *w |= 1 << (p % 64);
                } else {
                    *w &= !(1 << (p % 64));
                }
            }
        }
    }

    /// The first run of `n` free pages starting in `[from, to)`.
    fn find(&self, n: u64, from: u64, to: u64) -> Option<u64> {
        let (mut start, mut run) = (from, 0);
        let mut p = from;
        while p < self.pages && (run > 0 || p < to) {
            if run == 0 && p.is_multiple_of(64) && self.used.get((p / 64) as usize) == Some(&!0) {
                // A full word: no run starts in it.
                p += 64;
                start = p;
                continue;
            }
            if self.is_used(p) {
                run = 0;
                start = p + 1;
            } else {
                run += 1;
                if run == n {
                    return Some(start);
                }
            }
            p += 1;
        }
        None
    }

    /// Takes a run of `n` pages (not zero): its first page, or `None`
    /// when no run of `n` free pages is left.
    pub(crate) fn alloc(&mut self, n: u64) -> Option<u64> {
        if n == 0 || n > self.pages {
            return None;
        }
        let at = self
            .find(n, self.cursor, self.pages)
            .or_else(|| self.find(n, 0, self.cursor))?;
        let run = self.runs.get_mut(at as usize)?;
        *run = u32::try_from(n).ok()?;
        self.set(at, n, true);
        self.cursor = if at + n >= self.pages { 0 } else { at + n };
        Some(at)
    }

    /// Gives back the run of `n` pages at `start`; refused
    /// (`NotAllocated`, nothing changed) unless a slot of exactly `n`
    /// pages starts there.
    pub(crate) fn free(&mut self, start: u64, n: u64) -> Result<(), MemError> {
        let run = usize::try_from(start)
            .ok()
            .and_then(|i| self.runs.get_mut(i))
            .filter(|r| n > 0 && u64::from(**r) == n);
        let Some(run) = run else {
            return Err(MemError::NotAllocated {
                addr: start,
                order: 0,
            });
        };
        *run = 0;
        self.set(start, n, false);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_run_is_reused_last() {
        let mut a = NextFit::new(8);
        assert_eq!(a.alloc(2), Some(0));
        a.free(0, 2).unwrap();
        assert_eq!(a.alloc(2), Some(2), "not the run just freed");
        assert_eq!(a.alloc(3), Some(4));
        // Wraps: pages 7 (free) and 0..2 (free) do not join across the end.
        assert_eq!(a.alloc(2), Some(0));
        assert_eq!(a.alloc(1), Some(7));
        assert_eq!(a.alloc(1), None, "full");
        assert!(matches!(a.free(1, 2), Err(MemError::NotAllocated { .. })));
        a.free(0, 2).unwrap();
        assert!(
            matches!(a.free(0, 2), Err(MemError::NotAllocated { .. })),
            "a double free is refused"
        );
        assert!(a.free(6, 4).is_err() && a.free(u64::MAX, 2).is_err());
        assert!(a.free(7, 2).is_err(), "a run of another length");
        assert_eq!(a.alloc(9), None);
        assert_eq!(a.alloc(0), None);
    }

    #[test]
    fn full_words_are_skipped_and_runs_cross_words() {
        let mut a = NextFit::new(200);
        assert_eq!(a.alloc(64), Some(0));
        assert_eq!(a.alloc(70), Some(64));
        a.free(0, 64).unwrap();
        assert_eq!(a.alloc(66), Some(134));
        assert_eq!(a.alloc(64), Some(0), "wrapped to the freed word");
        assert_eq!(a.alloc(1), None);
    }
}
