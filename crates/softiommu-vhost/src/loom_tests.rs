//! Loom models of the hit path against the changes it must never outlive.
//! Run with `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo
//! test -p softiommu-vhost --release --lib loom -- --nocapture`.
//!
//! The models call the same `Readers` and `PageCache` code, in the same
//! order, as `DmaSpace::access` (enter the slot, look the page up, copy,
//! exit) and as `invalidate`/`set_memory` (clear or swap, then drain).
//! Guest memory is a loom `UnsafeCell`: the front-end reusing a page once
//! the back-end acknowledged its invalidation is a write to it after the
//! drain, so a device copy not ordered before that drain is a data race
//! loom reports. The fences are the `Barrier::Fence` pair (loom cannot
//! model `membarrier(2)`; `sync` says why the two are equivalent).

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::pagecache::{Hit, PageCache, Piece, PAGE};
use crate::readers::Readers;
use crate::sync::Barrier;

const PG: u64 = 0x5000;

/// Runs `f` under loom (bounded preemptions) and prints how many
/// executions it explored.
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = 20_000;
    let counter = runs.clone();
    b.check(move || {
        counter.fetch_add(1, StdOrdering::Relaxed);
        f()
    });
    println!("{name}: {} executions", runs.load(StdOrdering::Relaxed));
}

/// A loom thread whose first atomic operation is a store: loom 0.7 does not
/// explore a thread whose first operation is a load (tokio-rs/loom#392).
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::spawn(move || {
        AtomicU64::new(0).store(1, Ordering::Relaxed);
        f()
    })
}

fn piece(host: usize, lo: u64, hi: u64) -> Piece {
    Piece {
        page: PG,
        lo,
        hi,
        host,
        read: true,
        write: true,
    }
}

struct World {
    readers: Readers,
    cache: PageCache,
    /// The guest page the cached translation points at.
    guest: UnsafeCell<u64>,
}

// SAFETY: `guest` is loom's checked cell; the models' claim is exactly
// that its accesses are ordered.
unsafe impl Sync for World {}
// SAFETY: as above.
unsafe impl Send for World {}

impl World {
    fn new() -> Arc<Self> {
        let w = World {
            readers: Readers::new(2, Barrier::Fence),
            cache: PageCache::new(4),
            guest: UnsafeCell::new(0),
        };
        assert_eq!(w.readers.claim(), Some(0));
        w.cache.fill(piece(0x9000, 0, PAGE - 1));
        Arc::new(w)
    }

    /// One device access in slot 0, section number `k` (0, 1, ...): a
    /// write of the page through the cache if it hits.
    fn access(&self, k: u64) -> bool {
        self.readers.enter(0, 2 * k + 1);
        let hit = self.cache.lookup(PG + 8, true).is_some();
        if hit {
            // SAFETY: loom checks this write against the front-end's.
            self.guest.with_mut(|p| unsafe { *p = 1 });
        }
        self.readers.exit(0, 2 * k + 2);
        hit
    }
}

/// An invalidation clears the page and drains; the front-end then reuses
/// the page. Every device write that hit is ordered before that reuse, in
/// either of two back-to-back accesses (the second reuses the slot).
#[test]
fn loom_no_access_through_an_invalidated_page_after_the_drain() {
    model("invalidate vs hit", || {
        let w = World::new();
        let dev = {
            let w = w.clone();
            spawn(move || (w.access(0), w.access(1)))
        };
        w.cache.clear_range(PG, PG + PAGE - 1);
        w.readers.drain();
        // SAFETY: loom checks this write against the device's.
        w.guest.with_mut(|p| unsafe { *p = 2 });
        let (a, b) = dev.join().unwrap();
        // Once the first access missed, the second cannot hit.
        assert!(a || !b);
    });
}

/// The entry's sequence lock: a reader racing two fills of the page gets
/// one fill's fields or none, never a mix.
#[test]
fn loom_a_lookup_never_returns_a_torn_entry() {
    model("seqlock", || {
        let c = Arc::new(PageCache::new(4));
        let r = {
            let c = c.clone();
            spawn(move || c.lookup(PG + 0x180, false))
        };
        c.fill(piece(0x1000, 0, PAGE - 1));
        c.fill(piece(0x2100, 0x100, 0x1ff));
        let got = r.join().unwrap();
        let ok = [
            None,
            Some(Hit {
                host: 0x1180,
                len: 0xe80,
            }),
            Some(Hit {
                host: 0x2180,
                len: 0x80,
            }),
        ];
        assert!(ok.contains(&got), "torn: {got:?}");
    });
}

/// A new memory table is published with a swap and the old one freed only
/// after the drain: a device read of the old table is ordered before the
/// free (here, the write that stands for the unmapping).
#[test]
fn loom_an_old_memory_table_is_unused_after_the_drain() {
    model("memory table swap", || {
        let readers = Arc::new(Readers::new(2, Barrier::Fence));
        assert_eq!(readers.claim(), Some(0));
        let first = Box::into_raw(Box::new(UnsafeCell::new(1u64)));
        let mem = Arc::new(AtomicPtr::new(first));
        let dev = {
            let (readers, mem) = (readers.clone(), mem.clone());
            spawn(move || {
                readers.enter(0, 1);
                let p = mem.load(Ordering::Acquire);
                // SAFETY: inside the section, so not freed yet (the claim).
                let v = unsafe { (*p).with(|v| *v) };
                readers.exit(0, 2);
                v
            })
        };
        let old = mem.swap(
            Box::into_raw(Box::new(UnsafeCell::new(2u64))),
            Ordering::AcqRel,
        );
        readers.drain();
        // SAFETY: unpublished and drained.
        let old = unsafe { Box::from_raw(old) };
        // SAFETY: loom checks this write against the device's read.
        old.with_mut(|v| unsafe { *v = 0 });
        let v = dev.join().unwrap();
        assert!(v == 1 || v == 2, "read a freed table: {v}");
        // SAFETY: the device is done; the current table is freed once.
        drop(unsafe { Box::from_raw(mem.load(Ordering::Relaxed)) });
    });
}
