//! `bench iova`'s `magazine-floor` row: the least a magazine allocator
//! whose free checks ownership can cost in the bench's loop, measured
//! beside ours in the same run.
//!
//! The model keeps only what the design cannot drop: a magazine per
//! order (pop on alloc, push on free), a 16-bit state word per frame set
//! live on alloc, and one compare-exchange on free that takes the block
//! from live to cached, so that of two frees of one block exactly one
//! succeeds. It has none of our allocator's other work: no limit, no
//! domain bounds, no flush epoch, no published counts, no tree (a bump
//! pointer and a stack of spilled blocks stand in for it), no chunked
//! state map (one flat array over the frames it hands out), no sharing
//! between threads (the bench runs it at one thread only). So its figure
//! is a floor for the design, not a usable allocator.
//!
//! `owner-store-floor` (`MagazineFloor<true>`) is the same model with the
//! free of the design we ship (`softiommu::iova`'s owner slots), one
//! without a locked instruction when the freeing thread is the block's
//! owner: the owner's side of an asymmetric pair, as our policy gate's.
//! The owner raises a flag of its own, issues a compiler fence (the light
//! half; `membarrier(2)` is the heavy half), loads and checks the block's
//! state word, stores the cached state and lowers its flag. Another
//! thread's free (not modelled: the row runs at one thread) first revokes
//! the owner's slot, once (the heavy barrier, then a wait for the owner's
//! free in flight), and then claims by compare-exchange, so of two frees
//! exactly one succeeds. The pair of rows prices the compare-exchange the
//! owner's free no longer takes.

use std::sync::atomic::{
    compiler_fence, AtomicU16, AtomicU64, Ordering::AcqRel, Ordering::Relaxed, Ordering::Release,
    Ordering::SeqCst,
};

use super::iova_peers::PairAlloc;

/// Blocks a magazine holds, as our default magazines.
const MAGAZINE: usize = 128;
/// Orders served: blocks of 1 to 256 pages (the bench's mix).
const ORDERS: usize = 9;
/// Frames the model can hand out (its state array's length, 2 GiB of
/// address space committed only where touched): a block is taken from
/// the bump pointer only when none of its order is free, so the frames
/// touched are the peak live and cached ones, far below this for any
/// `--live` the bench takes (at most 10^6 blocks of at most 256 pages).
const FRAMES: u64 = 1 << 30;
/// State word of a live block (or'ed with its order).
const LIVE: u16 = 0x40;
/// State word of a block in a magazine or spilled (or'ed with its order).
const CACHED: u16 = 0x80;

/// One thread's model allocator; see the module documentation.
/// `OWNER_STORE`: the owner's free of the asymmetric design, in place of
/// the compare-exchange.
#[derive(Debug)]
pub struct MagazineFloor<const OWNER_STORE: bool = false> {
    state: Box<[AtomicU16]>,
    mags: [Magazine; ORDERS],
    spilled: [Vec<u64>; ORDERS],
    bump: u64,
    /// The owner's flag (the asymmetric design only): raised for the
    /// length of a free.
    freeing: AtomicU64,
}

#[derive(Debug)]
struct Magazine {
    slots: Box<[u64; MAGAZINE]>,
    len: usize,
}

impl<const OWNER_STORE: bool> Default for MagazineFloor<OWNER_STORE> {
    fn default() -> Self {
        Self {
            state: zeroed_states(FRAMES as usize),
            mags: std::array::from_fn(|_| Magazine {
                slots: Box::new([0; MAGAZINE]),
                len: 0,
            }),
            spilled: std::array::from_fn(|_| Vec::new()),
            // Frame 0 is never handed out: a handle is never zero.
            bump: 1,
            freeing: AtomicU64::new(0),
        }
    }
}

/// `n` state words, all 0 (never handed out): a zeroed allocation, whose
/// pages the OS commits only when first touched.
fn zeroed_states(n: usize) -> Box<[AtomicU16]> {
    // SAFETY: `AtomicU16` has `u16`'s layout, and all-zero bytes are a
    // valid `AtomicU16` (0).
    unsafe { Box::<[AtomicU16]>::new_zeroed_slice(n).assume_init() }
}

impl<const OWNER_STORE: bool> MagazineFloor<OWNER_STORE> {
    /// The order of `pages` if the model serves it (a power of two up to
    /// 256).
    #[inline(always)]
    fn order(pages: u64) -> Option<usize> {
        let order = pages.trailing_zeros() as usize;
        (pages.is_power_of_two() && order < ORDERS).then_some(order)
    }

    /// A block for an empty magazine: a spilled one, else a new one.
    #[cold]
    #[inline(never)]
    fn refill(&mut self, order: usize) -> Option<u64> {
        if let Some(pfn) = self.spilled[order].pop() {
            return Some(pfn);
        }
        let span = 1u64 << order;
        let pfn = self.bump.checked_add(span - 1)? & !(span - 1);
        let end = pfn.checked_add(span)?;
        if end > FRAMES {
            return None;
        }
        self.bump = end;
        Some(pfn)
    }
}

impl<const OWNER_STORE: bool> BlockModel for MagazineFloor<OWNER_STORE> {
    /// Allocates a size-aligned block of `pages`: its first frame.
    #[inline(always)]
    fn alloc_block(&mut self, pages: u64) -> Option<u64> {
        let order = Self::order(pages)?;
        let m = &mut self.mags[order];
        let pfn = match m.len.checked_sub(1) {
            Some(top) => {
                m.len = top;
                m.slots[top]
            }
            None => self.refill(order)?,
        };
        self.state
            .get(pfn as usize)?
            .store(LIVE | order as u16, Relaxed);
        Some(pfn)
    }

    /// Frees the block of `pages` at `pfn`; `false`, the block left as it
    /// was, if it is not a live block of that size.
    #[inline(always)]
    fn free_block(&mut self, pfn: u64, pages: u64) -> bool {
        let Some(order) = Self::order(pages) else {
            return false;
        };
        let Some(word) = self.state.get(pfn as usize) else {
            return false;
        };
        let m = &mut self.mags[order];
        if m.len == MAGAZINE {
            // Half the full magazine spills, as a depot would take it.
            self.spilled[order].extend_from_slice(&m.slots[MAGAZINE / 2..]);
            m.len = MAGAZINE / 2;
        }
        if OWNER_STORE {
            // The owner's side (see the module documentation): the flag
            // raised before the state is read, lowered (Release) after it
            // is written.
            self.freeing.store(1, Relaxed);
            compiler_fence(SeqCst);
            let live = word.load(Relaxed) == LIVE | order as u16;
            if live {
                word.store(CACHED | order as u16, Relaxed);
            }
            self.freeing.store(0, Release);
            if !live {
                return false;
            }
        } else if word
            // AcqRel: as our free's claim.
            .compare_exchange(LIVE | order as u16, CACHED | order as u16, AcqRel, Relaxed)
            .is_err()
        {
            return false;
        }
        m.slots[m.len] = pfn;
        m.len += 1;
        true
    }
}

/// A model allocator's block calls, which [`Blocks`] runs in the bench.
pub trait BlockModel: Default {
    /// Allocates a block of `pages` (a power of two) aligned to its size:
    /// its first frame.
    fn alloc_block(&mut self, pages: u64) -> Option<u64>;
    /// Frees the block of `pages` at `pfn`; `false`, the block left as it
    /// was, if it is not a live block of that size.
    fn free_block(&mut self, pfn: u64, pages: u64) -> bool;
}

/// A floor model as the bench runs it: handles `pfn << 12 | pages`, as
/// ours.
#[derive(Debug, Default)]
pub struct Blocks<A>(pub A);

impl<A: BlockModel + Send> PairAlloc for Blocks<A> {
    type Handle = std::num::NonZeroU64;
    #[inline(always)]
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle> {
        std::num::NonZeroU64::new(self.0.alloc_block(pages)? << 12 | pages)
    }
    #[inline(always)]
    fn free(&mut self, h: Self::Handle) {
        let ok = self.0.free_block(h.get() >> 12, h.get() & 0xfff);
        assert!(ok, "freeing a live block");
    }
}

/// Checks every floor model makes good: blocks aligned, distinct and
/// reused; a double free, a wrong size, a frame past the model's and a
/// size not a power of two refused; a full magazine spilled and every
/// block of it coming back once.
#[cfg(test)]
pub(crate) fn check_model<A: BlockModel>(magazine: usize, frames: u64) {
    let mut a = A::default();
    let mut seen = std::collections::HashSet::new();
    let blocks: Vec<(u64, u64)> = [1u64, 4, 256, 1, 2]
        .iter()
        .map(|&p| (a.alloc_block(p).expect("room"), p))
        .collect();
    for &(pfn, pages) in &blocks {
        assert_eq!(pfn % pages, 0, "{pfn} aligned to {pages}");
        assert!(
            (pfn..pfn + pages).all(|f| seen.insert(f)),
            "overlap at {pfn}"
        );
    }
    let (pfn, pages) = blocks[2];
    assert!(a.free_block(pfn, pages));
    assert!(!a.free_block(pfn, pages), "double free");
    assert!(!a.free_block(blocks[0].0, 2), "wrong size");
    assert!(!a.free_block(frames + 1, 1), "past the frames");
    assert!(!a.free_block(blocks[1].0, 3), "not a power of two");
    assert_eq!(a.alloc_block(256), Some(pfn), "the freed block comes back");

    let mut a = A::default();
    let blocks: Vec<u64> = (0..magazine + 10)
        .map(|_| a.alloc_block(1).expect("room"))
        .collect();
    for &pfn in &blocks {
        assert!(a.free_block(pfn, 1));
    }
    let mut again: Vec<u64> = (0..blocks.len())
        .map(|_| a.alloc_block(1).expect("room"))
        .collect();
    again.sort_unstable();
    let mut want = blocks.clone();
    want.sort_unstable();
    assert_eq!(again, want, "every freed block, each once");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_floor_models_keep_the_block_contract() {
        check_model::<MagazineFloor<false>>(MAGAZINE, FRAMES);
        check_model::<MagazineFloor<true>>(MAGAZINE, FRAMES);
    }
}
