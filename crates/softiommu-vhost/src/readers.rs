//! Reader slots: how an invalidation knows which device accesses are in
//! flight, at the cost of two plain stores per access and no shared write.
//!
//! Each slot is a counter only its owner thread writes: odd while an
//! access is in its section, even otherwise, one higher at every change,
//! so no value repeats.
//!
//! - `enter`: `state := 2k + 1` (Release), then the light fence of the
//!   [`Barrier`]. Every IOTLB and memory-table load of the access comes after.
//! - `exit`: `state := 2k + 2` (Release): everything the access did (its
//!   copy into or out of guest memory) happens before a drain that sees it.
//! - `drain`, after the IOTLB change: the heavy fence, then a snapshot of
//!   each slot; an odd snapshot is waited on until the slot changes.
//!
//! Why that suffices: take any access A of slot S. If the drain's snapshot
//! of S saw A's `enter` (odd), the drain waits for A's `exit`. If it did
//! not, then by the fence pair (A stored, fenced, loaded; the drain's
//! caller stored the change, fenced, loaded S) A's loads see the change. So
//! when `drain` returns, every access has either finished or cannot see
//! what was removed.
//!
//! A thread gets its slot once per space (a thread-local seat, see
//! `seat`); a thread that finds every slot taken uses the overflow lock
//! instead (read side for its section; `drain` passes through the write
//! side), which is slow but keeps the contract.

use std::sync::{Mutex, RwLock, RwLockReadGuard};

use crate::sync::{AtomicU64, Barrier, Ordering};

/// Slots per space: device threads of one back-end (a handful) and the
/// session thread; more threads share the overflow lock.
#[cfg(not(loom))]
pub(crate) const SLOTS: usize = 64;
#[cfg(loom)]
pub(crate) const SLOTS: usize = 2;

/// One slot, alone on its cache lines (two, for the adjacent-line prefetcher).
#[derive(Debug)]
#[repr(align(128))]
struct Slot {
    state: AtomicU64,
}

/// The slots of one space.
#[derive(Debug)]
pub(crate) struct Readers {
    slots: Box<[Slot]>,
    /// Which slots are owned (by index), taken on a thread's first access.
    owned: Mutex<Vec<bool>>,
    overflow: RwLock<()>,
    barrier: Barrier,
    /// Set when the space is dropped: seats still naming it are let go.
    closed: std::sync::atomic::AtomicBool,
}

impl Readers {
    /// `n` free slots, fenced by `barrier`.
    pub(crate) fn new(n: usize, barrier: Barrier) -> Self {
        Self {
            slots: (0..n)
                .map(|_| Slot {
                    state: AtomicU64::new(0),
                })
                .collect(),
            owned: Mutex::new(vec![false; n]),
            overflow: RwLock::new(()),
            barrier,
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Marks the space gone (its seats may be dropped).
    pub(crate) fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the space is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Claims a free slot (its index), or `None` when every one is owned.
    /// The lock orders the new owner's reads of the slot's counter after
    /// the last owner's final (even) store.
    pub(crate) fn claim(&self) -> Option<usize> {
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        let index = owned.iter().position(|o| !o)?;
        owned[index] = true;
        Some(index)
    }

    /// Frees a claimed slot; its state must be even.
    pub(crate) fn release(&self, index: usize) {
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = owned.get_mut(index) {
            *o = false;
        }
    }

    /// Slot `index`'s counter, as its owner thread last wrote it (only the
    /// owner calls this, so Relaxed reads its own store).
    #[inline(always)]
    pub(crate) fn state(&self, index: usize) -> u64 {
        self.slots[index].state.load(Ordering::Relaxed)
    }

    /// Marks slot `index` active with the odd `state`, then fences.
    #[inline(always)]
    pub(crate) fn enter(&self, index: usize, state: u64) {
        debug_assert_eq!(state & 1, 1);
        // Release: a drain waiting on this slot's previous section that
        // sees this store instead of that section's exit must still be
        // ordered after everything that section did.
        self.slots[index].state.store(state, Ordering::Release);
        self.barrier.light();
    }

    /// Marks slot `index` quiescent with the even `state`.
    #[inline(always)]
    pub(crate) fn exit(&self, index: usize, state: u64) {
        debug_assert_eq!(state & 1, 0);
        // Release: pairs with the drain's Acquire loads.
        self.slots[index].state.store(state, Ordering::Release);
    }

    /// The section of a thread without a slot: the overflow lock's read side.
    pub(crate) fn enter_overflow(&self) -> RwLockReadGuard<'_, ()> {
        self.overflow.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every access that might not see the stores this thread
    /// made before the call has finished. The caller must not be inside a
    /// section of this space itself, nor hold a lock an access takes.
    /// Returns how many sections it waited for.
    pub(crate) fn drain(&self) -> u64 {
        self.barrier.heavy();
        // Acquire: pairs with `enter`'s and `exit`'s Release stores.
        let mut pending: Vec<(usize, u64)> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.state.load(Ordering::Acquire)))
            .filter(|&(_, v)| v & 1 == 1)
            .collect();
        let waited = pending.len() as u64;
        let mut spins = 0u32;
        while !pending.is_empty() {
            // Whichever later store this sees (the exit, or a next enter),
            // the section it waited for happened before.
            pending.retain(|&(i, v)| self.slots[i].state.load(Ordering::Acquire) == v);
            if !pending.is_empty() {
                backoff(&mut spins);
            }
        }
        drop(self.overflow.write().unwrap_or_else(|p| p.into_inner()));
        waited
    }
}

/// One step of a wait for sections to end: spin briefly, then give the
/// core away (on two cores the access we wait for may need this one), then
/// sleep in short steps (an access may be in a disk read).
fn backoff(spins: &mut u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        *spins += 1;
        if *spins < 64 {
            std::hint::spin_loop();
        } else if *spins < 128 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}
