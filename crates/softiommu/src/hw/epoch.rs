//! Translator slots: how a draining wait knows which translations are in
//! flight, at the cost of two plain stores per translation.
//!
//! Each translator owns one slot, a counter only its owner writes: odd while
//! a translation (or a [`TranslationGuard`](super::TranslationGuard)) is
//! active, even otherwise, one higher at every change, so no value repeats.
//!
//! - `enter`: `state := 2k + 1` (Release), then the light fence of the
//!   unit's [`Barrier`]. Every IOTLB and table load of the translation comes
//!   after.
//! - `exit`: `state := 2k + 2` (Release). Both pair with the Acquire loads
//!   in `drain`: everything the translation did, and everything the guard's
//!   holder did with its result (the memory copy), happens before the
//!   drain's return, whichever later store the drain happens to see.
//! - `drain`, after the invalidations: the heavy fence, then for each slot,
//!   a snapshot; an odd snapshot is waited on until the slot changes.
//!
//! Why that suffices: take any translation T of slot S. If the drain's
//! snapshot of S saw T's `enter` store (odd), the drain waits for T's
//! `exit`. If it did not, then by the fence pair (a Dekker argument: T
//! stored then fenced then loaded; the drain stored its invalidations then
//! fenced then loaded S) T's loads see every store the waiter made before
//! its fence, i.e. every invalidation. So when `drain` returns, every
//! translation either has finished or cannot see what was invalidated.
//! No read-modify-write, no `SeqCst` fence on the translator's side when
//! the barrier is `membarrier`.
//!
//! (In inline mode the invalidations may have been carried out by another
//! submitter's pass; they happen before this drain through the processing
//! lock, and on the multi-copy-atomic targets we run on — x86-64, AArch64 —
//! a store visible to the draining thread is visible to every thread.)

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::AtomicPtr;
use std::sync::Mutex;

use crossbeam_utils::CachePadded;

use crate::sync::barrier::Barrier;
use crate::sync::{AtomicU64, AtomicUsize, Backoff, Ordering};

/// Slots come in chunks of 2^`CHUNK_SHIFT`, allocated as translators are
/// asked for (a unit that serves four device threads costs four cache
/// lines, one that serves thousands grows to them). Two under loom, to keep
/// the models small.
#[cfg(not(loom))]
const CHUNK_SHIFT: usize = 6;
#[cfg(loom)]
const CHUNK_SHIFT: usize = 1;
const CHUNK: usize = 1 << CHUNK_SHIFT;

type Chunk = [CachePadded<Slot>; CHUNK];

/// One translator's slot.
#[derive(Debug)]
struct Slot {
    /// Odd: a translation is active. Written only by the owner.
    state: AtomicU64,
    /// A token of the thread that owns the slot, 0 if free.
    owner: AtomicUsize,
}

/// What a drain did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DrainStats {
    /// Slots found active and waited for.
    pub(crate) waited: u64,
}

/// The slots of one unit.
#[derive(Debug)]
pub(crate) struct Slots {
    /// Chunk `c` holds slots `c << CHUNK_SHIFT ..`; null until a claim
    /// needs it. A chunk, once published, lives as long as `self`.
    chunks: Box<[AtomicPtr<Chunk>]>,
    /// Serialises the making of chunks.
    grow: Mutex<()>,
    /// The most slots there may be.
    capacity: usize,
    /// One past the highest slot ever claimed: the drain scans below it.
    high: CachePadded<AtomicUsize>,
}

fn new_chunk() -> *mut Chunk {
    let chunk: Box<Chunk> = Box::new(std::array::from_fn(|_| {
        CachePadded::new(Slot {
            state: AtomicU64::new(0),
            owner: AtomicUsize::new(0),
        })
    }));
    Box::into_raw(chunk)
}

impl Slots {
    /// Room for up to `n` slots; none is allocated yet.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            chunks: (0..n.div_ceil(CHUNK))
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            grow: Mutex::new(()),
            capacity: n,
            high: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// The most slots there may be.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slot `i`, if its chunk exists.
    #[inline(always)]
    fn slot(&self, i: usize) -> Option<&Slot> {
        // Acquire: pairs with the Release publication in `claim`, so the
        // chunk is seen initialised.
        let chunk = self.chunks.get(i >> CHUNK_SHIFT)?.load(Ordering::Acquire);
        // SAFETY: a non-null chunk pointer came from `Box::into_raw` in
        // `claim` and is freed only in `drop`, which cannot run while
        // `self` is borrowed.
        let chunk = unsafe { chunk.as_ref()? };
        chunk.get(i & (CHUNK - 1)).map(|s| &**s)
    }

    /// Claims a free slot for the thread `owner` (non-zero); returns its
    /// index and its current (even) state, or `None` if all are taken.
    pub(crate) fn claim(&self, owner: usize) -> Option<(usize, u64)> {
        debug_assert_ne!(owner, 0);
        loop {
            let mut seen = 0;
            for i in 0..self.capacity {
                let Some(s) = self.slot(i) else {
                    break;
                };
                seen = i + 1;
                // Acquire on success: pairs with `release`'s Release store,
                // so we see the last owner's final (even) state.
                if s.owner
                    .compare_exchange(0, owner, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    // A read-modify-write, so it is ordered before this
                    // slot's first `enter`; a drain that misses the new
                    // `high` is covered by the same fence argument as a
                    // missed `enter` (the `enter` comes later still).
                    self.high.fetch_max(i + 1, Ordering::SeqCst);
                    return Some((i, s.state.load(Ordering::Relaxed)));
                }
            }
            // Every existing slot is taken: add a chunk (or find that
            // another thread just did), then look again.
            let _g = self.grow.lock().unwrap_or_else(|e| e.into_inner());
            let next = self
                .chunks
                .iter()
                .position(|c| c.load(Ordering::Acquire).is_null())?;
            if next << CHUNK_SHIFT > seen {
                continue;
            }
            if let Some(c) = self.chunks.get(next) {
                c.store(new_chunk(), Ordering::Release);
            }
        }
    }

    /// Frees slot `i`; its state must be even (no translation active).
    pub(crate) fn release(&self, i: usize) {
        if let Some(s) = self.slot(i) {
            debug_assert_eq!(s.state.load(Ordering::Relaxed) & 1, 0);
            s.owner.store(0, Ordering::Release);
        }
    }

    /// The state word of slot `i`, if its chunk exists. A claimed slot's
    /// word lives (at a fixed address) as long as `self`: a translator
    /// keeps a pointer to it so that its hit path reaches its slot with no
    /// chunk lookup.
    pub(crate) fn state_cell(&self, i: usize) -> Option<&AtomicU64> {
        self.slot(i).map(|s| &s.state)
    }

    /// Marks slot `i` (a claimed one) active with the odd value `state`,
    /// then fences.
    #[cfg(any(test, loom))]
    pub(crate) fn enter(&self, i: usize, state: u64, barrier: Barrier) {
        if let Some(cell) = self.state_cell(i) {
            Self::enter_cell(cell, state, barrier);
        }
    }

    /// [`enter`](Self::enter) on a slot's state word (from
    /// [`state_cell`](Self::state_cell)).
    #[inline(always)]
    pub(crate) fn enter_cell(cell: &AtomicU64, state: u64, barrier: Barrier) {
        debug_assert_eq!(state & 1, 1);
        // The fence below orders this store before the translation's loads
        // (the light half of the fence pair; see the module documentation).
        // Release, because a drain waiting for the *previous* section may
        // see this store rather than that section's `exit`: it must then
        // synchronize with everything that section did too. (A plain store
        // on x86; loom found the gap with Relaxed.)
        cell.store(state, Ordering::Release);
        barrier.light();
    }

    /// Marks slot `i` quiescent with the even value `state`.
    #[cfg(any(test, loom))]
    pub(crate) fn exit(&self, i: usize, state: u64) {
        if let Some(cell) = self.state_cell(i) {
            Self::exit_cell(cell, state);
        }
    }

    /// [`exit`](Self::exit) on a slot's state word.
    #[inline(always)]
    pub(crate) fn exit_cell(cell: &AtomicU64, state: u64) {
        debug_assert_eq!(state & 1, 0);
        // Release: pairs with the Acquire loads in `drain`, so everything
        // done under the translation happens before the drain returns.
        cell.store(state, Ordering::Release);
    }

    /// Whether a slot owned by `owner` is active: a thread that holds a
    /// guard and waits for a drain would wait for itself.
    pub(crate) fn active_owned_by(&self, owner: usize) -> bool {
        let high = self.high.load(Ordering::Acquire).min(self.capacity);
        (0..high).filter_map(|i| self.slot(i)).any(|s| {
            s.owner.load(Ordering::Relaxed) == owner && s.state.load(Ordering::Relaxed) & 1 == 1
        })
    }

    /// Waits until every translation that might not see the stores this
    /// thread made before the call has finished.
    pub(crate) fn drain(&self, barrier: Barrier) -> DrainStats {
        let mut pending = self.drain_start(barrier);
        let stats = DrainStats {
            waited: pending.len() as u64,
        };
        let mut backoff = Backoff::default();
        while !self.drain_poll(&mut pending) {
            backoff.snooze();
        }
        stats
    }

    /// The first half of [`drain`](Self::drain): the heavy fence, then the
    /// snapshot of every slot; returns the sections found active, as
    /// (slot, state) pairs.
    pub(crate) fn drain_start(&self, barrier: Barrier) -> Vec<(usize, u64)> {
        barrier.heavy();
        let high = self.high.load(Ordering::Acquire).min(self.capacity);
        (0..high)
            .filter_map(|i| self.slot(i).map(|s| (i, s)))
            // Acquire: pairs with `enter`'s and `exit`'s Release stores.
            .map(|(i, s)| (i, s.state.load(Ordering::Acquire)))
            .filter(|&(_, snap)| snap & 1 == 1)
            .collect()
    }

    /// The second half: drops from `pending` the sections that have ended
    /// (their slot moved on); returns whether none is left.
    pub(crate) fn drain_poll(&self, pending: &mut Vec<(usize, u64)>) -> bool {
        // Acquire: as in `drain_start`; whichever later store it sees
        // (`exit`, or the next `enter`) orders the ended section before us.
        pending.retain(|&(i, snap)| {
            self.slot(i)
                .is_some_and(|s| s.state.load(Ordering::Acquire) == snap)
        });
        pending.is_empty()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for c in self.chunks.iter() {
            let p = c.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: from `Box::into_raw` in `claim`; `&mut self`
                // means no slot reference is alive, and each chunk is
                // freed once.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn slots_are_claimed_released_and_reused() {
        let s = Slots::new(2);
        let (a, sa) = s.claim(7).unwrap();
        let (b, _) = s.claim(7).unwrap();
        assert_ne!(a, b);
        assert!(s.claim(7).is_none(), "at capacity");
        assert_eq!(sa, 0);
        s.enter(a, 1, Barrier::Fence);
        assert!(s.active_owned_by(7));
        assert!(!s.active_owned_by(8));
        s.exit(a, 2);
        assert!(!s.active_owned_by(7));
        s.release(a);
        let (c, sc) = s.claim(9).unwrap();
        assert_eq!(c, a);
        assert_eq!(sc, 2, "a new owner continues the counter");
        assert_eq!(s.capacity(), 2);
    }

    #[test]
    fn slots_grow_by_chunks_up_to_the_capacity() {
        let n = 3 * CHUNK + 5;
        let s = Slots::new(n);
        let got: Vec<usize> = (0..n).map(|k| s.claim(k + 1).unwrap().0).collect();
        assert_eq!(got, (0..n).collect::<Vec<_>>());
        assert!(s.claim(99).is_none());
        s.release(2 * CHUNK + 1);
        assert_eq!(s.claim(100).unwrap().0, 2 * CHUNK + 1, "reused");
        s.enter(n - 1, 1, Barrier::Fence);
        assert!(s.active_owned_by(n));
        assert_eq!(s.drain_start(Barrier::Fence), vec![(n - 1, 1)]);
    }

    #[test]
    fn drain_waits_for_an_active_translation_only() {
        let s = Arc::new(Slots::new(4));
        let (i, _) = s.claim(1).unwrap();
        assert_eq!(s.drain(Barrier::Fence).waited, 0);
        s.enter(i, 1, Barrier::Fence);
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (s, done) = (s.clone(), done.clone());
            std::thread::spawn(move || {
                let st = s.drain(Barrier::Fence);
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                st
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!done.load(std::sync::atomic::Ordering::SeqCst));
        s.exit(i, 2);
        assert_eq!(t.join().unwrap().waited, 1);
    }
}
