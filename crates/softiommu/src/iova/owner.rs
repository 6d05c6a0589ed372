//! Biased ownership of blocks: a cache frees the blocks it handed out
//! itself with a load and a store, where any other free takes a
//! compare-exchange.
//!
//! A free must refuse a double free even when two threads free one block
//! at the same instant: of the two, exactly one may move the block's state
//! word from live to cached. A compare-exchange on every free gives that,
//! at the cost of a locked instruction (about 4 ns of a 10 ns pair on the
//! lab's machine, `bench iova`'s `magazine-floor` and `owner-store-floor`
//! rows). Most frees are made by the cache that allocated the block, so
//! the cost is moved off that case, as the drain's fence pair moves it off
//! the translator (`sync::barrier`):
//!
//! - A cache may hold one of the domain's owner slots (1..`SLOTS`; 0 is
//!   "no owner"). Its allocations write the slot's number into bits 16..31
//!   of the block's state word.
//! - **The owner's free** ([`OwnerRef::free`]): raise the slot's `freeing`
//!   flag (a count made odd); a compiler fence (the light half of the
//!   pair); if the slot is not being revoked, load the word, and if it is
//!   this slot's live block, store it cached; lower the flag (the count
//!   made even, `Release`). No read-modify-write.
//! - **Everyone else** (another cache, the domain's own calls) changes a
//!   live word by compare-exchange, as before, but a word that carries
//!   another slot's number is changed only once that slot is *revoked*
//!   ([`Owners::before_claim`]): under the domain's slot lock, the revoker
//!   stores "revoking", runs the heavy half (`membarrier(2)`, which makes
//!   every running thread of the process pass a full barrier), waits for
//!   the free in flight, if the flag is up, to end (the count to move on:
//!   one free, not a gap between frees), and publishes "revoked"
//!   (`Release`). A slot no cache holds is marked revoked at once (its
//!   last holder gave it back under the lock, after its last free). From
//!   then on the slot's holder frees by compare-exchange too, for good: a
//!   slot is never biased again (a revoker that read "revoked" and is
//!   about to exchange must never race a plain store).
//!
//! - **A flush's doorbell** ([`Owners::ring`]): a thread that asks every
//!   cache to flush raises the domain's flush epoch, then marks each held,
//!   unrevoked slot "rung". The holder's plain free, which reads the slot's
//!   state anyway, refuses on a rung slot; the free then takes the exchange,
//!   whose path lowers the ring and checks the epoch
//!   ([`OwnerRef::take_ring`]). So a holder's fast free sees a flush
//!   without loading the epoch. A ring is not a revocation: the holder's
//!   exchange finds its own owner bits, revokes nothing, and its next free
//!   is plain again.
//!
//! Why exactly one of an owner's free and another thread's change wins:
//! `membarrier` gives a point in the owner's run before which its stores
//! are visible to the revoker and after which its loads see the
//! revoker's "revoking". An owner's free that loaded "not revoked" did so
//! before that point, so its raised flag was visible too, and the revoker
//! waits for it to drop, which is after the free's store: the revoker's
//! exchange then sees the block cached and is refused. An owner's free
//! past that point sees "revoking" and takes the compare-exchange. The
//! loom model (`loom_tests.rs`) checks this with fences on both sides, as
//! the drain's model does.
//!
//! The price is on the rare side: one revocation, a few microseconds to
//! tens of microseconds with other threads running (one `membarrier`,
//! under the domain's slot lock, which cache creation also takes), once
//! per slot for the slot's life; the holder notices at its next free
//! that takes the exchange, or its next slow path (a free out of line, a
//! magazine refill or spill), and from then on stamps no
//! owner and frees as every free did before biasing. A change that loses
//! its race after revoking leaves the slot revoked (a cost, not a change
//! of any block). A cache's own blocks are best retired and freed
//! through the cache: the domain's calls hold no slot, so they revoke the
//! block's slot even when the caller is its holder. Where the kernel has
//! no `membarrier`, no slot is handed out and every free takes the
//! compare-exchange. The DMA layer's caches take no slot (their unmaps
//! retire blocks by compare-exchange, often on another CPU than the map).

use crossbeam_utils::CachePadded;

use super::live_map::ClaimWord;
use crate::sync::barrier::Barrier;
use crate::sync::{lock, AtomicU64, Backoff, Mutex, Ordering};

/// Where a word's owner slot starts (bits 16..31, between the state and
/// the tag).
pub(crate) const OWNER_SHIFT: u32 = 16;
/// A word's owner bits.
pub(crate) const OWNER_MASK: u64 = 0xffff << OWNER_SHIFT;
/// Owner slots per domain, slot 0 ("no owner") included: up to 63 caches
/// of a domain hold one at a time (later ones free by compare-exchange).
pub(crate) const SLOTS: usize = 64;

/// A slot's bias holds: its holder frees its own blocks plainly.
const BIASED: u64 = 0;
/// A revoker is waiting for the holder's free in flight.
const REVOKING: u64 = 1;
/// Revoked for good: every free of the slot's blocks is an exchange.
const REVOKED: u64 = 2;
/// The bias holds, and a flush was asked of the holder since it last
/// looked ([`Owners::ring`]): its plain free refuses, so that its next
/// free takes the path that checks the flush epoch, which lowers this
/// back to [`BIASED`] ([`OwnerRef::take_ring`]). The doorbell through
/// which a flush reaches a holder's frees without their loading the
/// epoch: the plain free reads this word already.
const RUNG: u64 = 3;

/// One owner slot, on its own cache lines. Its count is written by its
/// holder on each of its plain frees; its state by a revoker (once), a
/// flusher (a ring), the holder (lowering a ring) and a new holder's take.
#[derive(Debug, Default)]
pub(crate) struct OwnerSlot {
    /// The holder's free count, doubled: odd for the length of a plain
    /// free (raised to the next odd value, dropped to the next even one),
    /// so that a revoker waits for one free to end, not for a moment
    /// between frees. Only the holder writes it.
    freeing: AtomicU64,
    /// [`BIASED`], [`RUNG`], [`REVOKING`] or [`REVOKED`]. Between the
    /// first two it moves both ways (a flusher rings, the holder lowers
    /// the ring); from either it only moves forward, to [`REVOKING`] and
    /// then [`REVOKED`], and never back. Every change is a
    /// read-modify-write.
    revoked: AtomicU64,
}

/// The owner slots of one domain.
#[derive(Debug)]
pub(crate) struct Owners {
    slots: Box<[CachePadded<OwnerSlot>]>,
    /// The lock under which slots are taken, given back and revoked.
    slot_lock: Mutex<()>,
    /// Which slots a cache holds (bit `s`): changed only under
    /// `slot_lock`, read without it by a ringer ([`Owners::ring`]), so
    /// that a domain whose caches hold no slot (the baselines', the DMA
    /// layer's) rings nothing and takes no lock.
    taken: AtomicU64,
    /// Whether slots are handed out at all (the process has `membarrier`).
    enabled: bool,
    /// Slots revoked so far.
    revocations: AtomicU64,
}

impl Owners {
    /// The slots of a new domain: biasing on where the process can use
    /// `membarrier(2)` (always under loom, whose fences model it).
    pub(crate) fn new() -> Self {
        let enabled = cfg!(loom) || Barrier::default_for_process() == Barrier::Membarrier;
        Self::with(enabled)
    }

    /// Slots handed out only if `enabled`.
    pub(crate) fn with(enabled: bool) -> Self {
        Self {
            slots: (0..SLOTS).map(|_| CachePadded::default()).collect(),
            slot_lock: Mutex::new(()),
            taken: AtomicU64::new(0),
            enabled,
            revocations: AtomicU64::new(0),
        }
    }

    /// A free slot for a new cache, never revoked: its number (1..SLOTS)
    /// and its handle; `None` if biasing is off or every slot is held or
    /// spent.
    pub(crate) fn take(&self) -> Option<(u64, OwnerRef)> {
        if !self.enabled {
            return None;
        }
        let _guard = lock(&self.slot_lock);
        let taken = self.taken.load(Ordering::Relaxed);
        let s = (1..SLOTS).find(|&s| {
            taken & (1 << s) == 0
                && matches!(self.slots[s].revoked.load(Ordering::Relaxed), BIASED | RUNG)
        })?;
        self.taken.store(taken | 1 << s, Ordering::Relaxed);
        // A ring left by a flush its last holder never looked at is not
        // this cache's (it holds nothing yet). A swap: every change of a
        // slot's state is a read-modify-write (see `revoke`).
        self.slots[s].revoked.swap(BIASED, Ordering::Relaxed);
        Some((s as u64, OwnerRef(&*self.slots[s])))
    }

    /// Rings every held slot: a biased one becomes [`RUNG`], so that its
    /// holder's next free refuses the plain store and takes the path that
    /// checks the flush epoch. The caller raised the epoch first. Every
    /// held slot, whatever its state, gets a release read-modify-write
    /// (a rung slot stays rung, a revoked one revoked): the holder's
    /// acquire on the slot's state (lowering the ring, or finding the
    /// slot revoked) then reads this write or a later one in its release
    /// sequence (every change of the state is a read-modify-write), and
    /// so sees this epoch, even where an earlier flush's ring was still
    /// up. Without the lock: a slot taken meanwhile belongs to a cache
    /// that holds nothing yet and reads the epoch after its take; a ring
    /// on a slot given back meanwhile is cleared by its next take.
    pub(crate) fn ring(&self) {
        // A read-modify-write reads the mask's last value: a slot taken
        // before this flush is rung.
        let mut held = self.taken.fetch_or(0, Ordering::Relaxed);
        while held != 0 {
            let s = held.trailing_zeros() as usize;
            held &= held - 1;
            let ring = |state| Some(if state == BIASED { RUNG } else { state });
            let _ = self.slots[s]
                .revoked
                .fetch_update(Ordering::Release, Ordering::Relaxed, ring);
        }
    }

    /// Gives slot `s` back (its cache is gone). A revoked slot stays spent.
    pub(crate) fn release(&self, s: u64) {
        if let Some(bit) = 1u64.checked_shl(s as u32) {
            let _guard = lock(&self.slot_lock);
            let taken = self.taken.load(Ordering::Relaxed);
            self.taken.store(taken & !bit, Ordering::Relaxed);
        }
    }

    /// Slots revoked so far.
    pub(crate) fn revocations(&self) -> u64 {
        self.revocations.load(Ordering::Relaxed)
    }

    /// Called by a thread that is about to change the live word `seen` by
    /// compare-exchange, `me` being its own owner bits (0 for none): if the
    /// word carries another slot's number, that slot is revoked first (at
    /// once if it already is), so that its holder's plain free cannot
    /// overwrite the exchange.
    #[inline]
    pub(crate) fn before_claim(&self, seen: u64, me: u64) {
        let owner = seen & OWNER_MASK;
        if owner != 0 && owner != me {
            self.revoke((owner >> OWNER_SHIFT) as usize);
        }
    }

    /// Revokes slot `s` (see the module documentation); returns once its
    /// holder frees by exchange only.
    #[cold]
    #[inline(never)]
    fn revoke(&self, s: usize) {
        let Some(slot) = self.slots.get(s) else {
            return;
        };
        // Acquire: pairs with the revoker's Release below, so what the
        // holder stored before the revocation is seen by this exchange.
        if slot.revoked.load(Ordering::Acquire) == REVOKED {
            return;
        }
        let _guard = lock(&self.slot_lock);
        if slot.revoked.load(Ordering::Acquire) == REVOKED {
            return;
        }
        if self.taken.load(Ordering::Relaxed) & (1 << s) != 0 {
            // A swap, not a store: every change of a slot's state is a
            // read-modify-write, so that the holder's lowering of a ring
            // (a compare-exchange) is ordered whole before or after it
            // (the C11 model gives that against a plain store too; loom,
            // which checks this protocol, does not: tokio-rs/loom#254).
            slot.revoked.swap(REVOKING, Ordering::Relaxed);
            // The heavy half: the holder's plain free in flight has its
            // flag visible now, or sees "revoking" (see the module
            // documentation).
            Barrier::Membarrier.heavy();
            // Acquire: pairs with the flag's Release drop, after the
            // free's store to the word. A free in flight (an odd count)
            // ends at its next change; a later free sees "revoking" and
            // stores nothing. So this waits for at most one free of a few
            // instructions that wait on nothing (or the holder's time off
            // the CPU in the middle of it).
            let seen = slot.freeing.load(Ordering::Acquire);
            if seen & 1 == 1 {
                let mut backoff = Backoff::default();
                while slot.freeing.load(Ordering::Acquire) == seen {
                    backoff.snooze();
                }
            }
        }
        // No holder: the last one gave the slot back under this lock after
        // its last free, so its stores are seen; spent all the same, so
        // that no cache takes it while another thread exchanges a word
        // that still names it.
        slot.revoked.swap(REVOKED, Ordering::Release);
        self.revocations.fetch_add(1, Ordering::Relaxed);
    }
}

impl OwnerSlot {
    /// A slot no domain hands out, revoked from the start: the handle of
    /// a cache that holds none (every free of it refuses the plain store
    /// and takes the exchange), so that a cache's handle is never null
    /// and the owner's free tests nothing before its count.
    pub(crate) fn spent() -> Self {
        Self {
            freeing: AtomicU64::new(0),
            revoked: AtomicU64::new(REVOKED),
        }
    }
}

/// A cache's handle on the slot it holds (or on a [spent](OwnerSlot::spent)
/// one of its own): valid for as long as the slot, which the cache keeps
/// alive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnerRef(*const OwnerSlot);

// SAFETY: the pointer is to a slot its holder keeps alive (in an `Arc`);
// the slot is atomics only.
unsafe impl Send for OwnerRef {}
// SAFETY: as above.
unsafe impl Sync for OwnerRef {}

impl OwnerRef {
    /// A handle on `slot`.
    ///
    /// # Safety
    /// `slot` outlives every use of the handle (and of its copies).
    pub(crate) unsafe fn to(slot: &OwnerSlot) -> Self {
        Self(slot)
    }

    /// The slot.
    #[inline(always)]
    fn slot(&self) -> &OwnerSlot {
        // SAFETY: a slot its holder keeps alive (see `to`, and
        // `Owners::take`, whose slots live as long as their domain, which
        // the holder keeps).
        unsafe { &*self.0 }
    }

    /// Whether the slot was revoked (or is being): its holder should stop
    /// trying plain frees.
    #[inline(always)]
    pub(crate) fn is_revoked(&self) -> bool {
        matches!(
            // Acquire: a revoked slot's holder then sees the flush epoch
            // of every ring before (see `Owners::ring`).
            self.slot().revoked.load(Ordering::Acquire),
            REVOKING | REVOKED
        )
    }

    /// Lowers a ring ([`Owners::ring`]) if there is one, and says whether
    /// there was: the caller then checks the flush epoch, which this
    /// acquire makes it see as the ringer raised it. A revocation that
    /// came first wins (the ring is then gone, and the slot's frees take
    /// the checking path for good).
    #[inline]
    pub(crate) fn take_ring(&self) -> bool {
        let s = self.slot();
        s.revoked.load(Ordering::Relaxed) == RUNG
            && s.revoked
                .compare_exchange(RUNG, BIASED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    /// The owner's free: if the low half of `word` (state and owner) is
    /// `live` and the slot is neither rung nor being revoked, stores
    /// `cached` (the tag cleared) and returns true; else changes nothing
    /// and returns false (the caller takes the exchange). Only the slot's holder may
    /// call this, and only with its own owner bits in `live`.
    #[inline(always)]
    pub(crate) fn free(&self, word: &impl ClaimWord, live: u64, cached: u64) -> bool {
        let slot = self.slot();
        // Only this thread writes the count: the load reads its own last
        // store (an even value).
        let count = slot.freeing.load(Ordering::Relaxed);
        // Release too (a plain move on x86): a revoker that reads this
        // raise, a later free's, then sees the previous free's store to
        // its word (a Release store's later plain stores do not extend
        // its release sequence).
        slot.freeing.store(count.wrapping_add(1), Ordering::Release);
        // The light half: the flag's store stays before the loads below
        // in this thread's instructions; `membarrier` orders them in the
        // hardware when a revoker needs it (`Barrier::light`).
        Barrier::Membarrier.light();
        let freed = slot.revoked.load(Ordering::Relaxed) == BIASED
            && word.load_word() as u32 == live as u32;
        if freed {
            word.store_word(cached);
        }
        // Release: a revoker that reads the count move on sees the store.
        slot.freeing.store(count.wrapping_add(2), Ordering::Release);
        freed
    }
}
