//! Loom model of the free's claim on a block's state word: two threads
//! free one live block at the same instant (each through its own cache,
//! or the domain); exactly one may free it, and the other must be refused
//! with the exact error a sequential double free gets.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! softiommu --release --lib iova::loom`.
//!
//! The word is a loom atomic; the claim and the naming of the refusal are
//! the functions the caches and the domain run (`claim_for_free`,
//! `free_error_seen`). A check-then-store protocol (a load, then a store)
//! is modelled beside it and must be *seen* to let both threads pass, so
//! the model is known to explore the interleaving the claim exists for.
//!
//! The owner's plain free (`owner.rs`) is modelled the same way: the
//! block's cache frees it with `claim_own` (its slot's flag, a load and a
//! store) while another thread frees or retires it by exchange, revoking
//! the slot (under loom, both halves of the fence pair are `SeqCst`
//! fences). Exactly one may win, whichever path each takes.

use std::sync::atomic::AtomicBool as StdBool;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use loom::thread;

use super::cpu_cache::claim_own;
use super::live_map::{
    claim_for_free, free_error_seen, move_state, state, state_of, tagged, CACHED, LIVE, RETIRED,
};
use super::owner::{OwnerRef, Owners, OWNER_SHIFT};
use super::IovaError;

const PFN: u64 = 0x1234;

/// Runs `body` under loom; returns whether any execution returned `true`.
fn explore(body: impl Fn() -> bool + Sync + Send + 'static) -> bool {
    let seen = std::sync::Arc::new(StdBool::new(false));
    let s = seen.clone();
    loom::model(move || {
        if body() {
            s.store(true, SeqCst);
        }
    });
    seen.load(SeqCst)
}

/// The free the caches run: the claim, or the refusal named from the state
/// seen.
fn free_claiming(word: &AtomicU64, order: u32) -> Result<(), IovaError> {
    let owners = Owners::with(false);
    claim_for_free(word, order, &owners, 0).map_err(|seen| free_error_seen(PFN, order, seen))
}

/// The check-then-store free (a load, a compare, a store).
fn free_checking(word: &AtomicU64, order: u32) -> Result<(), IovaError> {
    let seen = state_of(word.load(Relaxed));
    if seen != state(LIVE, order) {
        return Err(free_error_seen(PFN, order, seen));
    }
    word.store(state(CACHED, order).into(), Relaxed);
    Ok(())
}

/// Two threads free one live block of `order`, tagged `tag`, with `free`;
/// returns the two results and the word's final value.
fn race(
    order: u32,
    tag: u32,
    free: fn(&AtomicU64, u32) -> Result<(), IovaError>,
) -> (Result<(), IovaError>, Result<(), IovaError>, u64) {
    let word = Arc::new(AtomicU64::new(tagged(state(LIVE, order), tag)));
    let w = word.clone();
    let other = thread::spawn(move || free(&w, order));
    let mine = free(&word, order);
    let theirs = other.join().unwrap();
    (mine, theirs, word.load(Relaxed))
}

#[test]
fn of_two_frees_of_one_block_exactly_one_succeeds() {
    // Untagged (the first try's exchange), and tagged (a block its holder
    // tagged: the second try, with the tag seen): the winner leaves the
    // block cached with no tag.
    for (order, tag) in [(0, 0), (3, 0), (1, 0x8000_0123)] {
        let bad = explore(move || {
            let (a, b, end) = race(order, tag, free_claiming);
            let refused = Err(IovaError::NotAllocated { pfn: PFN });
            let one_won = (a.is_ok() && b == refused) || (b.is_ok() && a == refused);
            !one_won || end != u64::from(state(CACHED, order))
        });
        assert!(
            !bad,
            "order {order}, tag {tag:#x}: both frees passed, or none, or a wrong error"
        );
    }
}

#[test]
fn the_check_then_store_free_lets_both_pass() {
    assert!(
        explore(|| {
            let (a, b, _) = race(0, 0, free_checking);
            a.is_ok() && b.is_ok()
        }),
        "the model must see the interleaving where both checks pass"
    );
}

#[test]
fn a_free_racing_one_of_another_size_is_refused_exactly() {
    // One thread frees the block with its size, the other with the wrong
    // one: the wrong size is always refused, as `WrongSize` while the
    // block is live and `NotAllocated` once it is cached.
    let bad = explore(|| {
        let word = Arc::new(AtomicU64::new(state(LIVE, 2).into()));
        let w = word.clone();
        let other = thread::spawn(move || free_claiming(&w, 1));
        let mine = free_claiming(&word, 2);
        let theirs = other.join().unwrap();
        let wrong = IovaError::WrongSize {
            pfn: PFN,
            pages: 2,
            allocated_pages: 4,
        };
        mine.is_err()
            || !(theirs == Err(wrong) || theirs == Err(IovaError::NotAllocated { pfn: PFN }))
    });
    assert!(!bad);
}

/// A domain's slots with one taken: the slots, the holder's handle and its
/// owner bits.
fn one_owner() -> (Arc<Owners>, OwnerRef, u64) {
    let owners = Arc::new(Owners::with(true));
    let (s, owner) = owners.take().expect("a free slot");
    (owners, owner, s << OWNER_SHIFT)
}

/// The holder of a block's slot frees it (`claim_own`: the plain free, or
/// the exchange once the slot is revoked) while another thread changes the
/// same live block by exchange with `other` (a free, or a retire), having
/// no slot: exactly one of the two may win, and the word ends as the
/// winner left it.
fn owner_races(other: fn(&Owners, &AtomicU64) -> bool, other_end: u16) {
    let bad = explore(move || {
        let (owners, owner, me) = one_owner();
        let word = Arc::new(AtomicU64::new(u64::from(state(LIVE, 0)) | me));
        let (o, w) = (owners.clone(), word.clone());
        let theirs = thread::spawn(move || other(&o, &w));
        let mine = claim_own(owner, me, &owners, &*word, 0);
        let theirs = theirs.join().unwrap();
        let end = word.load(Relaxed);
        let want = if mine {
            u64::from(state(CACHED, 0))
        } else {
            u64::from(other_end)
        };
        mine == theirs || end != want
    });
    assert!(
        !bad,
        "both won, or neither, or the word is not the winner's"
    );
}

#[test]
fn loom_an_owners_plain_free_and_another_threads_free_never_both_win() {
    owner_races(
        |owners, w| claim_for_free(w, 0, owners, 0).is_ok(),
        state(CACHED, 0),
    );
}

#[test]
fn loom_an_owners_plain_free_and_another_threads_retire_never_both_win() {
    owner_races(
        |owners, w| move_state(w, state(LIVE, 0), state(RETIRED, 0), owners, 0).is_ok(),
        state(RETIRED, 0),
    );
}

#[test]
fn loom_after_a_revocation_the_owner_frees_by_exchange() {
    // The other thread revokes the slot through a block of its own (one
    // the holder handed it), then the holder frees its second block while
    // the other thread frees that one too: still exactly one wins, and the
    // holder, revoked, takes the exchange.
    let bad = explore(|| {
        let (owners, owner, me) = one_owner();
        let live = u64::from(state(LIVE, 0)) | me;
        let first = Arc::new(AtomicU64::new(live));
        let second = Arc::new(AtomicU64::new(live));
        let (o, f, s) = (owners.clone(), first.clone(), second.clone());
        let theirs = thread::spawn(move || {
            let a = claim_for_free(&*f, 0, &o, 0).is_ok();
            let b = claim_for_free(&*s, 0, &o, 0).is_ok();
            (a, b)
        });
        let mine = claim_own(owner, me, &owners, &*second, 0);
        let (a, b) = theirs.join().unwrap();
        // `first` is the other thread's alone: its free always wins.
        !a || mine == b || second.load(Relaxed) != u64::from(state(CACHED, 0))
    });
    assert!(!bad);
}

#[test]
fn loom_a_revoker_that_meets_a_later_free_still_sees_the_earlier_ones_store() {
    // The holder frees two blocks, one after the other, while another
    // thread frees the first: the revoker may read the flag raised by the
    // holder's second free; the first free's store must still come before
    // the revoker's exchange.
    let bad = explore(|| {
        let (owners, owner, me) = one_owner();
        let live = u64::from(state(LIVE, 0)) | me;
        let first = Arc::new(AtomicU64::new(live));
        let second = Arc::new(AtomicU64::new(live));
        let (o, f) = (owners.clone(), first.clone());
        let theirs = thread::spawn(move || claim_for_free(&*f, 0, &o, 0).is_ok());
        let mine = claim_own(owner, me, &owners, &*first, 0);
        let mine_second = claim_own(owner, me, &owners, &*second, 0);
        let theirs = theirs.join().unwrap();
        mine == theirs || !mine_second || first.load(Relaxed) != u64::from(state(CACHED, 0))
    });
    assert!(!bad);
}

#[test]
fn loom_a_flush_ring_then_another_threads_free_never_lets_both_win() {
    // The other thread asks for a flush (rings the holder's slot) and then
    // frees the holder's block by exchange (revoking the slot): the ring
    // must neither let both frees pass nor undo the revocation.
    owner_races(
        |owners, w| {
            owners.ring();
            claim_for_free(w, 0, owners, 0).is_ok()
        },
        state(CACHED, 0),
    );
}

#[test]
fn loom_a_ring_lowered_by_the_holder_never_undoes_a_revocation() {
    // The other thread rings, then revokes through a block the holder
    // handed it; the holder frees a block of its own and lowers any ring
    // it finds. However they interleave, a revocation that happened stays.
    let bad = explore(|| {
        let (owners, owner, me) = one_owner();
        let live = u64::from(state(LIVE, 0)) | me;
        let theirs_word = Arc::new(AtomicU64::new(live));
        let (o, t) = (owners.clone(), theirs_word.clone());
        let other = thread::spawn(move || {
            o.ring();
            claim_for_free(&*t, 0, &o, 0).is_ok()
        });
        let mine_word = AtomicU64::new(live);
        let mine = claim_own(owner, me, &owners, &mine_word, 0);
        owner.take_ring();
        let revoked_theirs = other.join().unwrap();
        // The other thread's block was the holder's: its exchange revoked
        // the slot, which must read revoked from then on.
        !mine || (revoked_theirs && !owner.is_revoked())
    });
    assert!(!bad);
}

#[test]
fn loom_a_holder_that_lowers_a_ring_sees_the_flush_epoch() {
    // A flusher raises the epoch (relaxed) and rings; a holder whose free
    // finds the ring lowers it and must then read the raised epoch (the
    // ring's release, the lowering's acquire).
    let bad = explore(|| {
        let (owners, owner, me) = one_owner();
        let epoch = Arc::new(AtomicU64::new(0));
        let (o, e) = (owners.clone(), epoch.clone());
        let flusher = thread::spawn(move || {
            e.fetch_add(1, Relaxed);
            o.ring();
        });
        let word = AtomicU64::new(u64::from(state(LIVE, 0)) | me);
        let freed = claim_own(owner, me, &owners, &word, 0);
        let lowered = owner.take_ring();
        let seen = epoch.load(Relaxed);
        flusher.join().unwrap();
        !freed || (lowered && seen != 1)
    });
    assert!(!bad);
}

#[test]
fn loom_a_second_flush_while_the_ring_is_up_reaches_the_holder() {
    // A first flush (epoch 1) rang the slot, and the holder already has
    // that epoch (it flushed at a miss). A second flusher raises the epoch
    // to 2 and rings while the first ring is still up; the holder lowers
    // the ring. If the second ring came before the lowering, the holder
    // must read epoch 2 (the second ring's release, on a slot already
    // rung, is what carries it); if after, the slot stays rung for the
    // holder's next free.
    let bad = explore(|| {
        let (owners, owner, _me) = one_owner();
        let epoch = Arc::new(AtomicU64::new(1));
        owners.ring();
        let (o, e) = (owners.clone(), epoch.clone());
        let flusher = thread::spawn(move || {
            e.fetch_add(1, Relaxed);
            o.ring();
        });
        let lowered = owner.take_ring();
        let seen = epoch.load(Relaxed);
        flusher.join().unwrap();
        let rung_again = owner.take_ring();
        !lowered || (!rung_again && seen != 2)
    });
    assert!(!bad);
}
