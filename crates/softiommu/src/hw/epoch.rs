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

use crossbeam_utils::CachePadded;

use super::barrier::Barrier;
use super::sync::{AtomicU64, AtomicUsize, Backoff, Ordering};

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
    slots: Box<[CachePadded<Slot>]>,
    /// One past the highest slot ever claimed: the drain scans below it.
    high: CachePadded<AtomicUsize>,
}

impl Slots {
    /// `n` free slots.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            slots: (0..n)
                .map(|_| {
                    CachePadded::new(Slot {
                        state: AtomicU64::new(0),
                        owner: AtomicUsize::new(0),
                    })
                })
                .collect(),
            high: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// The number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Claims a free slot for the thread `owner` (non-zero); returns its
    /// index and its current (even) state, or `None` if all are taken.
    pub(crate) fn claim(&self, owner: usize) -> Option<(usize, u64)> {
        debug_assert_ne!(owner, 0);
        for (i, s) in self.slots.iter().enumerate() {
            // Acquire on success: pairs with `release`'s Release store, so we
            // see the last owner's final (even) state.
            if s.owner
                .compare_exchange(0, owner, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                // A read-modify-write, so it is ordered before this slot's
                // first `enter`; a drain that misses the new `high` is
                // covered by the same fence argument as a missed `enter`
                // (the `enter` comes later still).
                self.high.fetch_max(i + 1, Ordering::SeqCst);
                return Some((i, s.state.load(Ordering::Relaxed)));
            }
        }
        None
    }

    /// Frees slot `i`; its state must be even (no translation active).
    pub(crate) fn release(&self, i: usize) {
        if let Some(s) = self.slots.get(i) {
            debug_assert_eq!(s.state.load(Ordering::Relaxed) & 1, 0);
            s.owner.store(0, Ordering::Release);
        }
    }

    /// Marks slot `i` active with the odd value `state`, then fences.
    #[inline(always)]
    pub(crate) fn enter(&self, i: usize, state: u64, barrier: Barrier) {
        debug_assert_eq!(state & 1, 1);
        // The fence below orders this store before the translation's loads
        // (the light half of the fence pair; see the module documentation).
        // Release, because a drain waiting for the *previous* section may
        // see this store rather than that section's `exit`: it must then
        // synchronize with everything that section did too. (A plain store
        // on x86; loom found the gap with Relaxed.)
        self.slots[i].state.store(state, Ordering::Release);
        barrier.light();
    }

    /// Marks slot `i` quiescent with the even value `state`.
    #[inline(always)]
    pub(crate) fn exit(&self, i: usize, state: u64) {
        debug_assert_eq!(state & 1, 0);
        // Release: pairs with the Acquire loads in `drain`, so everything
        // done under the translation happens before the drain returns.
        self.slots[i].state.store(state, Ordering::Release);
    }

    /// Whether a slot owned by `owner` is active: a thread that holds a
    /// guard and waits for a drain would wait for itself.
    pub(crate) fn active_owned_by(&self, owner: usize) -> bool {
        let high = self.high.load(Ordering::Acquire).min(self.slots.len());
        self.slots[..high].iter().any(|s| {
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
        let high = self.high.load(Ordering::Acquire).min(self.slots.len());
        self.slots[..high]
            .iter()
            .enumerate()
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
        pending.retain(|&(i, snap)| self.slots[i].state.load(Ordering::Acquire) == snap);
        pending.is_empty()
    }
}

#[cfg(all(test, not(loom)))]
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
        assert!(s.claim(7).is_none());
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
