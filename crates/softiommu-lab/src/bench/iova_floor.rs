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
//! is a floor for the design, not a usable allocator. What it does is
//! written as tightly as ours: magazine slots indexed without bounds
//! checks, the order rounded up with one leading-zero count, the state
//! array on transparent huge pages (as our state map).
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

/// A magazine of the models: a stack of up to [`MAGAZINE`] blocks,
/// indexed without bounds checks (as ours: its length is the bound).
#[derive(Debug)]
pub(crate) struct Magazine {
    slots: Box<[u64; MAGAZINE]>,
    len: usize,
}

impl Default for Magazine {
    fn default() -> Self {
        Self {
            slots: Box::new([0; MAGAZINE]),
            len: 0,
        }
    }
}

impl Magazine {
    /// Takes the top block if `fits` it.
    #[inline(always)]
    pub(crate) fn pop_if(&mut self, fits: impl Fn(u64) -> bool) -> Option<u64> {
        let top = self.len.checked_sub(1)?;
        // SAFETY: `top < len <= MAGAZINE`.
        let pfn = unsafe { *self.slots.get_unchecked(top) };
        if !fits(pfn) {
            return None;
        }
        self.len = top;
        Some(pfn)
    }

    /// The length, if there is room for one more block.
    #[inline(always)]
    pub(crate) fn room(&self) -> Option<usize> {
        (self.len < MAGAZINE).then_some(self.len)
    }

    /// Puts `pfn` at `len`, the length [`room`](Self::room) gave (read
    /// before a claim, so that the claim's fence does not make the
    /// compiler read it again).
    #[inline(always)]
    pub(crate) fn push_at(&mut self, len: usize, pfn: u64) {
        // Masked: in bounds whatever `len` is (a no-op on `room`'s).
        // SAFETY: `len & (MAGAZINE - 1) < MAGAZINE`.
        unsafe { *self.slots.get_unchecked_mut(len & (MAGAZINE - 1)) = pfn };
        self.len = len + 1;
    }

    /// Spills the top half into `to` (a full magazine, as a depot takes
    /// one).
    pub(crate) fn spill_half(&mut self, to: &mut Vec<u64>) {
        to.extend_from_slice(&self.slots[MAGAZINE / 2..self.len.max(MAGAZINE / 2)]);
        self.len = self.len.min(MAGAZINE / 2);
    }
}

/// The order of a block of `pages`, rounded up to a power of two as ours
/// (`softiommu::iova`'s `order_of`: one leading-zero count), if the models
/// serve it (up to 256 pages).
#[inline(always)]
pub(crate) fn order_of(pages: u64) -> Option<usize> {
    if pages == 0 {
        return None;
    }
    let order = (64 - (pages - 1).leading_zeros()) as usize;
    (order < ORDERS).then_some(order)
}

/// Asks for transparent huge pages over `words`, as ours does for its
/// state map (`Reservation::prefer_huge_pages`): frees touch words at
/// random, and 4 KiB pages would cost a TLB miss where ours pays none.
pub(crate) fn prefer_huge_pages<T>(words: &[T]) {
    const HUGE: usize = 2 << 20;
    let start = words.as_ptr() as usize;
    let end = start + std::mem::size_of_val(words);
    let (lo, hi) = (start.next_multiple_of(HUGE), end & !(HUGE - 1));
    if lo < hi {
        // SAFETY: `[lo, hi)` lies within `words`' allocation, which the
        // caller owns; MADV_HUGEPAGE changes no contents.
        unsafe {
            libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
        }
    }
}

impl<const OWNER_STORE: bool> Default for MagazineFloor<OWNER_STORE> {
    fn default() -> Self {
        let state = zeroed_states(FRAMES as usize);
        prefer_huge_pages(&state);
        Self {
            state,
            mags: std::array::from_fn(|_| Magazine::default()),
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
        let order = order_of(pages)?;
        let pfn = match self.mags[order].pop_if(|_| true) {
            Some(pfn) => pfn,
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
        let Some(order) = order_of(pages) else {
            return false;
        };
        let Some(word) = self.state.get(pfn as usize) else {
            return false;
        };
        let m = &mut self.mags[order];
        let len = match m.room() {
            Some(len) => len,
            None => {
                // Half the full magazine spills, as a depot would take it.
                m.spill_half(&mut self.spilled[order]);
                MAGAZINE / 2
            }
        };
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
        m.push_at(len, pfn);
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
    assert!(!a.free_block(blocks[1].0, 0), "zero pages");
    // 3 pages round up to the 4-page block's order, as ours.
    assert!(
        a.free_block(blocks[1].0, 3),
        "3 pages name the 4-page block"
    );
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
