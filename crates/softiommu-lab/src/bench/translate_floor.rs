//! `bench translate`'s `seqlock-floor` row: the least a lock-free,
//! set-associative IOTLB hit can cost in the bench's loop with the
//! concurrency protocol ours keeps, measured beside ours in the same run.
//!
//! The model keeps the protocol's parts: the translator's section around
//! each lookup (an odd then an even store to its slot, with a compiler
//! fence, as our translator with membarrier-backed drains), the domain's
//! deadline and a generation load, the same shape (256 sets of 16 ways,
//! the same hash and way fingerprints, a set's sixteen fingerprint bytes
//! read with one 16-byte load), and the per-entry sequence-lock
//! read (sequence, tag, value, generation, acquire fence, sequence
//! again). It drops everything else ours does: no context lookup by
//! source id, no address-width or rights check, no large-page probes, no
//! statistics, one generation (ours adds the unit's global one), the
//! shape in constants (ours reads it from the IOTLB), and a miss is
//! refilled from a hash map
//! rather than by a page walk (its hit rate is reported beside ours). So
//! its figure is a floor for the design, not a usable IOTLB.

use std::collections::HashMap;
use std::sync::atomic::{compiler_fence, fence, AtomicU64, Ordering};

/// Sets and ways: our IOTLB's default shape.
const SETS: usize = 256;
const WAYS: usize = 16;
/// Fibonacci hashing's multiplier, as ours.
const HASH_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// A tag's valid bit.
const VALID: u64 = 1 << 63;
/// `seq` bit 0: a writer holds the entry.
const LOCKED: u64 = 1;

#[derive(Debug, Default)]
#[repr(C, align(32))]
struct Entry {
    seq: AtomicU64,
    key: AtomicU64,
    val: AtomicU64,
    gen: AtomicU64,
}

/// Where a 4 KiB page's lookup lands, and how many bytes run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorSpan {
    /// The physical address of the IOVA looked up.
    pub phys: u64,
    /// Bytes from there to the page's end.
    pub len: u64,
}

/// The model; see the module documentation.
#[derive(Debug)]
pub struct SeqlockFloor {
    entries: Box<[Entry]>,
    fps: Box<[FpPair]>,
    gen: AtomicU64,
    deadline: AtomicU64,
    slot: AtomicU64,
    state: u64,
    rnd: u64,
    pages: HashMap<u64, u64>,
    misses: u64,
}

impl SeqlockFloor {
    /// A model cache over `pages` (IOVA page number to physical page
    /// address), empty.
    pub fn new(pages: HashMap<u64, u64>) -> Self {
        Self {
            entries: (0..SETS * WAYS).map(|_| Entry::default()).collect(),
            fps: (0..SETS).map(|_| FpPair::default()).collect(),
            gen: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            slot: AtomicU64::new(0),
            state: 0,
            rnd: 0x2545_f491_4f6c_dd1d,
            pages,
            misses: 0,
        }
    }

    /// The set and way fingerprint of tag `key`.
    #[inline(always)]
    fn place(key: u64) -> (usize, u64) {
        let h = key.wrapping_mul(HASH_MUL);
        ((h >> 32) as usize & (SETS - 1), h >> 57 | 0x80)
    }

    /// Drops every cached translation (a generation bump).
    #[cfg(test)]
    fn invalidate_all(&self) {
        self.gen.fetch_add(1, Ordering::AcqRel);
    }

    /// Translates `iova`: a hit inside a section, else a refill from the
    /// map; `None` if the page is not mapped.
    #[inline(always)]
    pub fn translate(&mut self, iova: u64) -> Option<FloorSpan> {
        self.state += 1;
        self.slot.store(self.state, Ordering::Release);
        compiler_fence(Ordering::SeqCst);
        let hit = self.probe(iova);
        self.state += 1;
        self.slot.store(self.state, Ordering::Release);
        match hit {
            Some(s) => Some(s),
            None => self.refill(iova),
        }
    }

    #[inline(always)]
    fn probe(&self, iova: u64) -> Option<FloorSpan> {
        if self.deadline.load(Ordering::Acquire) != 0 {
            return None;
        }
        let gen = self.gen.load(Ordering::Acquire);
        let key = VALID | iova >> 12;
        let (set, fp) = Self::place(key);
        let ways = &self.entries[set * WAYS..set * WAYS + WAYS];
        let mut m = matches(&self.fps[set], fp);
        while m != 0 {
            let w = m.trailing_zeros() as usize;
            m &= m - 1;
            let e = &ways[w & (WAYS - 1)];
            let s1 = e.seq.load(Ordering::Acquire);
            if s1 & LOCKED != 0 || e.key.load(Ordering::Relaxed) != key {
                continue;
            }
            let val = e.val.load(Ordering::Relaxed);
            let g = e.gen.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if e.seq.load(Ordering::Relaxed) != s1 || g != gen {
                continue;
            }
            let off = iova & 0xfff;
            return Some(FloorSpan {
                phys: val + off,
                len: 0x1000 - off,
            });
        }
        None
    }

    /// Lookups that missed so far (refilled or unmapped).
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// A miss: the page from the map, cached in a free or random way.
    #[cold]
    #[inline(never)]
    fn refill(&mut self, iova: u64) -> Option<FloorSpan> {
        self.misses += 1;
        let phys = *self.pages.get(&(iova >> 12))?;
        let key = VALID | iova >> 12;
        let (set, fp) = Self::place(key);
        let gen = self.gen.load(Ordering::Acquire);
        self.rnd ^= self.rnd << 13;
        self.rnd ^= self.rnd >> 7;
        self.rnd ^= self.rnd << 17;
        let ways = &self.entries[set * WAYS..set * WAYS + WAYS];
        let w = ways
            .iter()
            .position(|e| e.key.load(Ordering::Relaxed) == 0)
            .unwrap_or(self.rnd as usize % WAYS);
        let e = &ways[w];
        let s = e.seq.load(Ordering::Relaxed);
        e.seq.store(s | LOCKED, Ordering::Relaxed);
        fence(Ordering::Release);
        e.key.store(key, Ordering::Relaxed);
        e.val.store(phys, Ordering::Relaxed);
        e.gen.store(gen, Ordering::Relaxed);
        e.seq.store((s | LOCKED) + 1, Ordering::Release);
        let word = &self.fps[set].0[w / 8];
        let shift = w % 8 * 8;
        let bytes = word.load(Ordering::Relaxed) & !(0xff << shift) | fp << shift;
        word.store(bytes, Ordering::Relaxed);
        let off = iova & 0xfff;
        Some(FloorSpan {
            phys: phys + off,
            len: 0x1000 - off,
        })
    }
}

/// A set's sixteen fingerprint bytes, 16-aligned.
#[derive(Debug, Default)]
#[repr(C, align(16))]
struct FpPair([AtomicU64; 2]);

/// The ways whose fingerprint byte in `pair` equals `fp`, as a bit mask:
/// one 16-byte load, as ours.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn matches(pair: &FpPair, fp: u64) -> u32 {
    use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_movemask_epi8, _mm_set1_epi32};
    let bytes: std::arch::x86_64::__m128i;
    // SAFETY: `pair` is 16 readable, 16-aligned bytes; a plain load of
    // atomics in `asm!`, as our IOTLB's probe does (the model is single
    // threaded). SSE2: part of the x86-64 baseline; registers only.
    let m = unsafe {
        std::arch::asm!(
            "movdqa {b}, xmmword ptr [{p}]",
            p = in(reg) pair as *const FpPair,
            b = out(xmm_reg) bytes,
            options(nostack, readonly, preserves_flags),
        );
        let lane = (fp as u32 & 0xff).wrapping_mul(0x0101_0101);
        _mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_set1_epi32(lane as i32)))
    };
    m as u32
}

/// [`matches`] elsewhere, a byte at a time.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn matches(pair: &FpPair, fp: u64) -> u32 {
    (0..16).fold(0, |m, i| {
        let word = pair.0[i / 8].load(Ordering::Relaxed);
        m | u32::from((word >> (i % 8 * 8)) & 0xff == fp) << i
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_return_the_mapped_page_before_and_after_an_invalidation() {
        let pages: HashMap<u64, u64> = (0..3000u64).map(|p| (p * 7 + 5, (p + 1) << 12)).collect();
        let mut f = SeqlockFloor::new(pages.clone());
        for round in 0..3 {
            for (&vpn, &phys) in &pages {
                let s = f.translate(vpn << 12 | 0x40).expect("mapped");
                assert_eq!(
                    s,
                    FloorSpan {
                        phys: phys + 0x40,
                        len: 0xfc0
                    },
                    "round {round}"
                );
            }
            f.invalidate_all();
        }
        assert_eq!(f.translate(6 << 12), None, "never mapped");
    }

    #[test]
    fn a_hit_is_served_from_the_cache_and_a_stale_entry_is_not() {
        let mut f = SeqlockFloor::new(HashMap::from([(9, 0x5000)]));
        assert_eq!(f.probe(9 << 12), None, "cold");
        assert!(f.translate(9 << 12).is_some());
        assert_eq!(f.probe(9 << 12 | 1).map(|s| s.phys), Some(0x5001));
        f.invalidate_all();
        assert_eq!(f.probe(9 << 12), None, "an older generation");
    }
}
