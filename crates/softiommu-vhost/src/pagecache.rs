//! The hit path's cache: a bounded, set-associative table of 4 KiB pages,
//! each entry the host pointer of one page's translated bytes, read without
//! a lock.
//!
//! The device IOTLB ([`crate::iotlb`]) holds the front-end's ranges and
//! stays the authority; this cache holds, per page an access touched or an
//! update brought, the piece of one IOTLB entry inside that page already
//! resolved through the memory table: its byte extent `[lo, hi]` within the
//! page, the host address of byte `lo`, and the rights. It is filled and
//! cleared only by holders of the space's table lock (one writer at a
//! time); a change of the IOTLB or of the memory table clears the pages it
//! touches (or all) before the lock is released.
//!
//! # Reading without locks: a sequence lock per entry
//! `seq` is even when the entry is stable. The writer stores `seq + 1`,
//! issues a Release fence, writes the fields and stores `seq + 2`
//! (Release). A reader loads `seq` (Acquire), the fields (Relaxed), an
//! Acquire fence and `seq` again (Relaxed), and uses the fields only if
//! both loads saw the same even value: if a field load saw a later
//! writer's store, its fence synchronizes with that writer's fence and the
//! second `seq` load sees the odd value or later (H.-J. Boehm, "Can
//! seqlocks get along with programming language memory models?", MSPC
//! 2012). A reader that meets a writer falls back to the locked path.

use crate::sync::{fence, AtomicU64, Ordering};

/// Bytes of a page.
pub(crate) const PAGE: u64 = 4096;
/// Entries per set.
const WAYS: usize = 4;
/// Fibonacci hashing's multiplier, 2^64 / φ.
const HASH_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// Tag bit 0: the entry is valid (a page address has bits 11:0 clear).
const VALID: u64 = 1;

/// One cached page piece.
#[derive(Debug)]
struct Entry {
    seq: AtomicU64,
    /// Page address | `VALID`, or 0.
    tag: AtomicU64,
    /// Host address of byte `lo` of the page.
    host: AtomicU64,
    /// `lo` (bits 11:0), `hi` (bits 23:12), read (bit 24), write (bit 25).
    meta: AtomicU64,
}

/// A page piece found by [`PageCache::lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    /// Host address of the looked-up byte.
    pub(crate) host: usize,
    /// Bytes from it that stay in the piece (1 to 4096).
    pub(crate) len: u64,
}

/// What a writer stores: a piece of page `page`, bytes `[lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The page's address (4 KiB aligned).
    pub(crate) page: u64,
    /// First byte of the piece within the page.
    pub(crate) lo: u64,
    /// Last byte (inclusive), `lo <= hi < 4096`.
    pub(crate) hi: u64,
    /// Host address of byte `lo`.
    pub(crate) host: usize,
    /// Device may read.
    pub(crate) read: bool,
    /// Device may write.
    pub(crate) write: bool,
}

/// The cache.
#[derive(Debug)]
pub(crate) struct PageCache {
    entries: Box<[Entry]>,
    /// log2 of the number of sets.
    set_bits: u32,
    /// The writers' replacement cursor (writers are serialized).
    cursor: std::cell::Cell<usize>,
}

// SAFETY: `cursor` is touched only by writers, which the caller serializes
// (the space's table lock); everything else is atomic.
unsafe impl Sync for PageCache {}

impl PageCache {
    /// A cache of at least `entries` entries (rounded up to a power of two,
    /// at least one set).
    pub(crate) fn new(entries: usize) -> Self {
        let sets = (entries.max(WAYS) / WAYS).next_power_of_two();
        Self {
            entries: (0..sets * WAYS)
                .map(|_| Entry {
                    seq: AtomicU64::new(0),
                    tag: AtomicU64::new(0),
                    host: AtomicU64::new(0),
                    meta: AtomicU64::new(0),
                })
                .collect(),
            set_bits: sets.trailing_zeros(),
            cursor: std::cell::Cell::new(0),
        }
    }

    /// Entries held at most.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn capacity(&self) -> usize {
        self.entries.len()
    }

    #[inline(always)]
    fn set(&self, page: u64) -> &[Entry] {
        let s = if self.set_bits == 0 {
            0
        } else {
            ((page >> 12).wrapping_mul(HASH_MUL) >> (64 - self.set_bits)) as usize
        };
        &self.entries[s * WAYS..(s + 1) * WAYS]
    }

    /// The piece holding byte `a` with the right to `write` (or read), if
    /// cached and stable. No lock, no store.
    #[inline]
    pub(crate) fn lookup(&self, a: u64, write: bool) -> Option<Hit> {
        let page = a & !(PAGE - 1);
        let off = a - page;
        let want = page | VALID;
        for e in self.set(page) {
            let s1 = e.seq.load(Ordering::Acquire);
            if e.tag.load(Ordering::Relaxed) != want {
                continue;
            }
            let host = e.host.load(Ordering::Relaxed);
            let meta = e.meta.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            let s2 = e.seq.load(Ordering::Relaxed);
            if s1 != s2 || s1 & 1 == 1 {
                return None;
            }
            let (lo, hi) = (meta & 0xfff, (meta >> 12) & 0xfff);
            let allowed = if write {
                meta >> 25 & 1
            } else {
                meta >> 24 & 1
            };
            if off < lo || off > hi || allowed == 0 {
                return None;
            }
            return Some(Hit {
                host: (host as usize).wrapping_add((off - lo) as usize),
                len: hi - off + 1,
            });
        }
        None
    }

    fn write_entry(e: &Entry, tag: u64, host: u64, meta: u64) {
        let s = e.seq.load(Ordering::Relaxed);
        e.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        e.tag.store(tag, Ordering::Relaxed);
        e.host.store(host, Ordering::Relaxed);
        e.meta.store(meta, Ordering::Relaxed);
        e.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// Caches `p`, replacing the page's entry, else a free one, else one in
    /// turn. Returns whether a valid entry of another page was replaced.
    /// Writers only (the caller holds the table lock).
    pub(crate) fn fill(&self, p: Piece) -> bool {
        debug_assert!(p.page.is_multiple_of(PAGE) && p.lo <= p.hi && p.hi < PAGE);
        let set = self.set(p.page);
        let tag = p.page | VALID;
        let way = set
            .iter()
            .position(|e| e.tag.load(Ordering::Relaxed) == tag)
            .or_else(|| set.iter().position(|e| e.tag.load(Ordering::Relaxed) == 0));
        let (way, replaced) = match way {
            Some(w) => (w, false),
            None => {
                let c = self.cursor.get();
                self.cursor.set(c.wrapping_add(1));
                (c % WAYS, true)
            }
        };
        let meta = p.lo | p.hi << 12 | u64::from(p.read) << 24 | u64::from(p.write) << 25;
        Self::write_entry(&set[way], tag, p.host as u64, meta);
        replaced
    }

    /// Drops every entry for a page of `[first, last]` (inclusive; may end
    /// at 2^64 - 1). Walks the range's pages when they are fewer than the
    /// entries, else every entry. Writers only.
    pub(crate) fn clear_range(&self, first: u64, last: u64) {
        let (p0, p1) = (first / PAGE, last / PAGE);
        let in_range = |tag: u64| tag & VALID != 0 && (p0..=p1).contains(&(tag / PAGE));
        if p1 - p0 < self.entries.len() as u64 {
            for pg in p0..=p1 {
                for e in self.set(pg * PAGE) {
                    if e.tag.load(Ordering::Relaxed) == (pg * PAGE) | VALID {
                        Self::write_entry(e, 0, 0, 0);
                    }
                }
            }
        } else {
            for e in self.entries.iter() {
                if in_range(e.tag.load(Ordering::Relaxed)) {
                    Self::write_entry(e, 0, 0, 0);
                }
            }
        }
    }

    /// Drops every entry. Writers only.
    pub(crate) fn clear(&self) {
        for e in self.entries.iter() {
            if e.tag.load(Ordering::Relaxed) != 0 {
                Self::write_entry(e, 0, 0, 0);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn piece(page: u64, lo: u64, hi: u64, host: usize) -> Piece {
        Piece {
            page,
            lo,
            hi,
            host,
            read: true,
            write: false,
        }
    }

    #[test]
    fn a_piece_is_found_only_inside_its_extent_and_rights() {
        let c = PageCache::new(16);
        c.fill(piece(0x5000, 0x100, 0x1ff, 0x9000));
        assert_eq!(
            c.lookup(0x5180, false),
            Some(Hit {
                host: 0x9080,
                len: 0x80
            })
        );
        assert_eq!(c.lookup(0x50ff, false), None);
        assert_eq!(c.lookup(0x5200, false), None);
        assert_eq!(c.lookup(0x5180, true), None, "read-only");
        c.clear_range(0x5fff, 0x5fff);
        assert_eq!(
            c.lookup(0x5180, false),
            None,
            "any byte of the page clears it"
        );
    }

    #[test]
    fn the_cache_is_bounded_and_a_clear_to_2_pow_64_is_taken() {
        let c = PageCache::new(8);
        let mut replaced = 0;
        for k in 0..100u64 {
            replaced += u64::from(c.fill(piece(k * PAGE, 0, PAGE - 1, 0)));
        }
        assert_eq!(c.capacity(), 8);
        let held = (0..100u64)
            .filter(|k| c.lookup(k * PAGE, false).is_some())
            .count();
        assert_eq!(held, 8);
        assert_eq!(replaced, 92);
        c.fill(piece(!(PAGE - 1), 0, PAGE - 1, 0));
        c.clear_range(0xfef0_0000, u64::MAX);
        assert!(c.lookup(u64::MAX, false).is_none());
        c.clear();
        assert!((0..100u64).all(|k| c.lookup(k * PAGE, false).is_none()));
    }
}
