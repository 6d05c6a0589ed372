//! Loom models of the orderer's fences: the guest's view of a device that
//! accesses through `Orderer` (the same code the accessors run, with loom's
//! fences and atomics standing for the machine's), against a guest CPU that
//! uses the barriers a driver would.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! softiommu --release --lib access::`.
//!
//! Typed accesses are loom atomics with the ordering the orderer hands out;
//! bulk copies are modelled as relaxed atomic byte accesses inside the
//! orderer's bulk brackets (what the fences order at the hardware level).
//! Each pattern is checked for `ordered` and `full`; `relaxed` is checked
//! to *fail* the same patterns, so the model is known to see the
//! reorderings the fences exist to prevent.

use std::sync::atomic::AtomicBool as StdBool;
use std::sync::atomic::Ordering::{self, Acquire, Relaxed, Release, SeqCst};

use loom::sync::atomic::{fence, AtomicU32};
use loom::sync::Arc;
use loom::thread;

use super::attrs::OrderMode;
use super::fence::LoomFences;
use super::order::Orderer;

type Dev = Orderer<LoomFences>;

/// Runs `body` under loom; returns whether any execution returned `true`
/// (a forbidden outcome).
fn explore(body: impl Fn() -> bool + Sync + Send + 'static) -> bool {
    let seen = std::sync::Arc::new(StdBool::new(false));
    let s = seen.clone();
    loom::model(move || {
        if body() {
            s.store(true, Ordering::SeqCst);
        }
    });
    seen.load(Ordering::SeqCst)
}

/// MP, device to guest: the device writes data then flag; the guest reads
/// flag (acquire) then data. Forbidden: flag = 1, data = 0.
fn mp_device_writes(mode: OrderMode, bulk: bool) -> bool {
    explore(move || {
        let data = Arc::new(AtomicU32::new(0));
        let flag = Arc::new(AtomicU32::new(0));
        let (d, f) = (data.clone(), flag.clone());
        let guest = thread::spawn(move || {
            let r1 = f.load(Acquire);
            let r2 = d.load(Relaxed);
            (r1, r2)
        });
        let mut o = Dev::new();
        if bulk {
            o.bulk_write(mode, || data.store(1, Relaxed));
        } else {
            o.store(mode, |ord| data.store(1, ord));
        }
        o.store(mode, |ord| flag.store(1, ord));
        guest.join().unwrap() == (1, 0)
    })
}

/// MP, guest to device: the guest writes data then flag (release); the
/// device reads flag then data. `first_relaxed` makes the flag load relaxed
/// (the data load, in `mode`, must still come after it).
fn mp_device_reads(mode: OrderMode, bulk: bool, first_relaxed: bool) -> bool {
    explore(move || {
        let data = Arc::new(AtomicU32::new(0));
        let flag = Arc::new(AtomicU32::new(0));
        let (d, f) = (data.clone(), flag.clone());
        let guest = thread::spawn(move || {
            d.store(1, Relaxed);
            f.store(1, Release);
        });
        let mut o = Dev::new();
        let first = if first_relaxed {
            OrderMode::Relaxed
        } else {
            mode
        };
        let r1 = o.load(first, |ord| flag.load(ord));
        let r2 = if bulk {
            o.bulk_read(mode, || data.load(Relaxed))
        } else {
            o.load(mode, |ord| data.load(ord))
        };
        guest.join().unwrap();
        (r1, r2) == (1, 0)
    })
}

/// SB: the device stores x then loads y; the guest stores y, fences
/// (`smp_mb`), loads x. Forbidden: both loads see 0.
fn sb(mode: OrderMode, bulk: bool) -> bool {
    explore(move || {
        let x = Arc::new(AtomicU32::new(0));
        let y = Arc::new(AtomicU32::new(0));
        let (gx, gy) = (x.clone(), y.clone());
        let guest = thread::spawn(move || {
            gy.store(1, Relaxed);
            fence(SeqCst);
            gx.load(Relaxed)
        });
        let mut o = Dev::new();
        if bulk {
            o.bulk_write(mode, || x.store(1, Relaxed));
        } else {
            o.store(mode, |ord| x.store(1, ord));
        }
        let r1 = o.load(mode, |ord| y.load(ord));
        let r2 = guest.join().unwrap();
        (r1, r2) == (0, 0)
    })
}

const STRONG: [OrderMode; 2] = [OrderMode::Ordered, OrderMode::Full];

#[test]
fn message_passing_device_to_guest() {
    for m in STRONG {
        for bulk in [false, true] {
            assert!(!mp_device_writes(m, bulk), "{m} bulk={bulk}");
        }
    }
    assert!(mp_device_writes(OrderMode::Relaxed, false));
}

#[test]
fn message_passing_guest_to_device() {
    for m in STRONG {
        for bulk in [false, true] {
            assert!(!mp_device_reads(m, bulk, false), "{m} bulk={bulk}");
        }
        // A relaxed flag load followed by an ordered data load.
        assert!(!mp_device_reads(m, false, true), "{m} after relaxed");
    }
    assert!(mp_device_reads(OrderMode::Relaxed, false, false));
}

#[test]
fn store_buffering() {
    for m in STRONG {
        for bulk in [false, true] {
            assert!(!sb(m, bulk), "{m} bulk={bulk}");
        }
    }
    assert!(sb(OrderMode::Relaxed, false));
}

#[test]
fn a_mapping_is_ordered_as_a_whole() {
    // The device maps for reading, reads flag and data inside without
    // fences, and unmaps: ordered mode puts the acquire at the end.
    for m in STRONG {
        let bad = explore(move || {
            let data = Arc::new(AtomicU32::new(0));
            let flag = Arc::new(AtomicU32::new(0));
            let (d, f) = (data.clone(), flag.clone());
            let guest = thread::spawn(move || {
                let r1 = f.load(Acquire);
                let r2 = d.load(Relaxed);
                (r1, r2)
            });
            let mut o = Dev::new();
            // The device writes a buffer through a mapping, then the
            // status with an ordered store.
            o.map_start(m, false, true);
            data.store(1, Relaxed);
            o.map_end(m, false, true);
            o.store(m, |ord| flag.store(1, ord));
            guest.join().unwrap() == (1, 0)
        });
        assert!(!bad, "{m}");
    }
}

/// The bounce generation (`PhysMemory::mark_bounce` and the pass-through
/// epoch in `epoch`): the maker sets a pool's bitmap bits (Release), then
/// bumps the count (`gen_store`); a device that reads the new count
/// (Acquire) and refills its cache must then see the bits. Forbidden: the
/// new count with the bit clear.
fn bounce_generation(gen_store: Ordering) -> bool {
    explore(move || {
        let bits = Arc::new(loom::sync::atomic::AtomicU64::new(0));
        let gen = Arc::new(loom::sync::atomic::AtomicU64::new(0));
        let (b, g) = (bits.clone(), gen.clone());
        let device = thread::spawn(move || {
            let seen = g.load(Acquire);
            let bit = b.load(Acquire) & 1;
            (seen, bit)
        });
        bits.fetch_or(1, Release);
        gen.fetch_add(1, gen_store);
        device.join().unwrap() == (1, 0)
    })
}

#[test]
fn a_new_bounce_generation_comes_with_the_pools_bits() {
    assert!(!bounce_generation(Release));
    // The model sees the reordering the Release exists to prevent.
    assert!(bounce_generation(Relaxed));
}
