//! `bench iova`'s `contract-floor` row: `owner-store-floor` (see
//! `iova_floor`) with the checks our allocator's contract makes on every
//! pair and the bare model leaves out, each in its least form. It prices
//! what the contract costs, apart from how our code does it: the gap from
//! `owner-store-floor` to this row is the contract's, the gap from this
//! row to ours is our code's.
//!
//! What it adds to the bare model, and why each is the contract's:
//! - **The caller's limit** (a device's DMA mask): a popped block must end
//!   at or below it; a block above it is left where it is.
//! - **A flush asked for**, seen on free: another thread may ask every
//!   cache to give its blocks back (Linux's `flush_rcache` when the tree
//!   has no room), and each cache must see that at its next free (an
//!   allocation its loaded magazine serves does not look). As ours, the
//!   flusher rings the owner slot, whose state word the owner's free
//!   reads anyway; a rung slot sends the free down the checking path,
//!   which reads the epoch.
//! - **The owner slot's revocation** on the owner's free: after another
//!   thread revoked the slot, the owner must take the exchange (the bare
//!   model's free has no such check, so it is not a correct free). The
//!   same load as the ring's.
//! - **A 64-bit state word** (state, owner and the DMA layer's tag): the
//!   free compares the low 32 bits, as ours does. Its words sit in one
//!   flat array committed on touch, as ours do where the process can
//!   reserve the domain's whole map (a two-level map of chunks, our
//!   fallback, measured about 2 ns a pair more in this row: the chunk's
//!   pointer is one more dependent load).
//!
//! It is written as tightly as ours: magazine slots indexed without bounds
//! checks, the order rounded up with one leading-zero count, the state
//! words on transparent huge pages, the magazine's length read before the
//! claim's fence, and the owner's count kept in the model (only the holder
//! writes it).
//!
//! It leaves out what the contract does not need on every pair: the
//! published counts (statistics), the domain's tree, sharing between
//! threads (at N threads each runs its own model), and the slot's
//! revocation itself.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{
    compiler_fence, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::iova_floor::{order_of, prefer_huge_pages, BlockModel, Magazine};

/// Blocks a magazine holds: as `iova_floor`'s.
#[cfg(test)]
const MAGAZINE: usize = 128;
/// Orders served: blocks of 1 to 256 pages (the bench's mix).
const ORDERS: usize = 9;
/// Frames the model hands out: as `iova_floor`'s.
const FRAMES: u64 = 1 << 30;
/// State of a live block (or'ed with its order and owner bits).
const LIVE: u64 = 0x40;
/// State of a cached block (or'ed with its order).
const CACHED: u64 = 0x80;
/// This cache's owner number in a word's bits 16..31.
const OWNER: u64 = 1 << 16;
/// A slot's revocation state while its holder may free by store.
const BIASED: u64 = 0;
/// A slot rung by a flush (as ours): its holder's next free takes the
/// checking path.
const RUNG: u64 = 3;

/// What the domain shares with its caches: the flush epoch and the owner
/// slot (its revocation state, which a flush rings, and its holder's
/// count).
#[derive(Debug, Default)]
struct Shared {
    flush_epoch: AtomicU64,
    revoked: AtomicU64,
    freeing: AtomicU64,
}

/// One thread's model allocator; see the module documentation.
#[derive(Debug)]
pub struct ContractFloor {
    /// Padded to its own lines: the models of a multi-thread row are
    /// built side by side on one thread, and the holder writes `freeing`
    /// on every free (as ours, whose owner slots are padded).
    shared: Arc<CachePadded<Shared>>,
    epoch: u64,
    limit: u64,
    words: Box<[AtomicU64]>,
    mags: [Magazine; ORDERS],
    spilled: [Vec<u64>; ORDERS],
    bump: u64,
    /// The owner's count, as last stored (only this model writes it).
    count: u64,
}

impl Default for ContractFloor {
    fn default() -> Self {
        let words = zeroed_words(FRAMES as usize);
        prefer_huge_pages(&words);
        Self {
            shared: Arc::default(),
            epoch: 0,
            limit: FRAMES - 1,
            words,
            mags: std::array::from_fn(|_| Magazine::default()),
            spilled: std::array::from_fn(|_| Vec::new()),
            // Frame 0 is never handed out: a handle is never zero.
            bump: 1,
            count: 0,
        }
    }
}

/// `n` state words, all 0: a zeroed allocation, whose pages the OS
/// commits only when first touched (8 GiB of address space for the
/// model's 2^30 frames; the frames touched are the peak live and cached
/// ones).
fn zeroed_words(n: usize) -> Box<[AtomicU64]> {
    // SAFETY: `AtomicU64` has `u64`'s layout, and all-zero bytes are a
    // valid `AtomicU64` (0).
    unsafe { Box::<[AtomicU64]>::new_zeroed_slice(n).assume_init() }
}

impl ContractFloor {
    /// A block for an empty magazine (or a top above the limit): a
    /// spilled one, else a new one. (A miss looks at the epoch, as ours.)
    #[cold]
    #[inline(never)]
    fn refill(&mut self, order: usize) -> Option<u64> {
        self.epoch = self.shared.flush_epoch.load(Relaxed);
        if let Some(pfn) = self.spilled[order].pop() {
            return Some(pfn);
        }
        let span = 1u64 << order;
        let pfn = self.bump.checked_add(span - 1)? & !(span - 1);
        let end = pfn.checked_add(span)?;
        if end > FRAMES || end - 1 > self.limit {
            return None;
        }
        self.bump = end;
        Some(pfn)
    }

    /// A free past a full magazine, a rung slot or a revoked one: the
    /// ring lowered and the epoch read (a flush would give all back; the
    /// row never flushes), half the magazine spilled if it is full, then
    /// the free by exchange.
    #[cold]
    #[inline(never)]
    fn free_slow(&mut self, pfn: u64, order: usize) -> bool {
        let _ = self
            .shared
            .revoked
            .compare_exchange(RUNG, BIASED, Acquire, Relaxed);
        self.epoch = self.shared.flush_epoch.load(Relaxed);
        let m = &mut self.mags[order];
        let len = match m.room() {
            Some(len) => len,
            None => {
                m.spill_half(&mut self.spilled[order]);
                m.room().unwrap_or(0)
            }
        };
        let live = LIVE | order as u64 | OWNER;
        let Some(word) = self.words.get(pfn as usize) else {
            return false;
        };
        if word
            .compare_exchange(live, CACHED | order as u64, SeqCst, Relaxed)
            .is_err()
        {
            return false;
        }
        m.push_at(len, pfn);
        true
    }
}

impl BlockModel for ContractFloor {
    /// Allocates a size-aligned block of `pages` ending at or below the
    /// limit: its first frame.
    #[inline(always)]
    fn alloc_block(&mut self, pages: u64) -> Option<u64> {
        let order = order_of(pages)?;
        let span_m1 = (1u64 << order) - 1;
        let limit = self.limit;
        let pfn = match self.mags[order].pop_if(|p| p + span_m1 <= limit) {
            Some(p) => p,
            None => self.refill(order)?,
        };
        self.words
            .get(pfn as usize)?
            .store(LIVE | order as u64 | OWNER, Relaxed);
        Some(pfn)
    }

    /// Frees the block of `pages` at `pfn`; `false`, the block left as it
    /// was, if it is not a live block of that size.
    #[inline(always)]
    fn free_block(&mut self, pfn: u64, pages: u64) -> bool {
        let Some(order) = order_of(pages) else {
            return false;
        };
        let Some(word) = self.words.get(pfn as usize) else {
            return false;
        };
        let live = LIVE | order as u64 | OWNER;
        let m = &mut self.mags[order];
        let Some(len) = m.room() else {
            return self.free_slow(pfn, order);
        };
        // The owner's free, as ours (`softiommu::iova`'s owner slots):
        // the count raised, the light fence, the slot's state checked (a
        // ring or a revocation), the word compared (tag ignored) and
        // stored, the count dropped. The count is this model's own copy
        // (only the holder writes it).
        let s = &self.shared;
        let count = self.count;
        s.freeing.store(count.wrapping_add(1), Release);
        compiler_fence(SeqCst);
        let biased = s.revoked.load(Relaxed) == BIASED;
        let freed = biased && word.load(Relaxed) as u32 == live as u32;
        if freed {
            word.store(CACHED | order as u64, Relaxed);
        }
        self.count = count.wrapping_add(2);
        s.freeing.store(self.count, Release);
        if freed {
            m.push_at(len, pfn);
            return true;
        }
        if biased {
            // Not a live block of this size: refused.
            return false;
        }
        self.free_slow(pfn, order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_keeps_the_block_contract() {
        super::super::iova_floor::check_model::<ContractFloor>(MAGAZINE, FRAMES);
    }

    #[test]
    fn a_revoked_slot_and_a_flush_take_the_checked_paths() {
        let mut a = ContractFloor::default();
        let x = a.alloc_block(1).expect("room");
        let y = a.alloc_block(1).expect("room");
        a.shared.revoked.store(1, Relaxed);
        // The owner's store refused: the free takes the exchange, which
        // frees it once and refuses it the second time.
        assert!(a.free_block(x, 1), "revoked: freed by exchange");
        assert!(!a.free_block(x, 1), "a double free refused");
        a.shared.revoked.store(BIASED, Relaxed);
        // A flush: the epoch raised, the slot rung.
        a.shared.flush_epoch.store(1, Relaxed);
        a.shared.revoked.store(RUNG, Relaxed);
        assert!(a.free_block(y, 1), "a ring sends the free the slow way");
        assert_eq!(a.epoch, 1);
        assert_eq!(a.shared.revoked.load(Relaxed), BIASED, "ring lowered");
        // A limit below the magazine's top (and every new block): no
        // block, and the top stays for a caller it fits.
        a.limit = y - 1;
        assert_eq!(a.alloc_block(1), None);
        a.limit = FRAMES - 1;
        assert_eq!(a.alloc_block(1), Some(y));
    }
}
