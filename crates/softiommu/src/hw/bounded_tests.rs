//! Bounded waits: a wait (or a context change) stalled behind a
//! translation section that stays open ends within its bound, typed, in
//! both queue modes, and hears its caller's wish to stop.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ContextEntry, HwError, InvDescriptor, QiError, QueueMode, SourceId, Unit, UnitConfig};
use crate::mem::PhysMemory;
use crate::pgtable::{IoPageTable, VtdConfig, VtdPageTable};

const BOUND: Duration = Duration::from_millis(60);
/// Far above `BOUND`, far below a hang.
const SLACK: Duration = Duration::from_secs(5);

/// Runs `body` on a unit of each queue mode while another thread holds a
/// translation section of it open; the section ends after `body`, or
/// when `body` calls the release it is given.
fn with_open_section(body: impl Fn(&Unit, &Arc<PhysMemory>, QueueMode, &(dyn Fn() + Sync))) {
    for mode in [QueueMode::Inline, QueueMode::Thread] {
        let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
        let cfg = UnitConfig {
            queue_mode: mode,
            ..UnitConfig::default()
        };
        let unit = Unit::new(mem.clone(), cfg).unwrap();
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let u = &unit;
            let device = s.spawn(move || {
                let mut tr = u.translator().unwrap();
                tr.section(|_| {
                    entered_tx.send(()).unwrap();
                    let _ = release_rx.recv_timeout(Duration::from_secs(20));
                });
            });
            entered_rx.recv().unwrap();
            let release = || {
                // A second release finds the section over: nothing to do.
                let _ = release_tx.send(());
            };
            body(&unit, &mem, mode, &release);
            release();
            device.join().unwrap();
            // Once the section ends, the queue goes on: an unbounded wait
            // completes.
            unit.wait().unwrap();
        });
    }
}

/// A domain invalidation's wait bounded by `BOUND` on `unit`: it fails
/// with the bound's timeout, within it and not long after.
fn a_bounded_domain_wait_times_out(unit: &Unit, mode: QueueMode) {
    let t0 = Instant::now();
    let mut b = unit.batch();
    b.domain(3);
    let e = b.wait_timeout(BOUND).unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(e, QiError::InvalidationTimeout { timeout } if timeout == BOUND),
        "{mode:?}: {e:?}"
    );
    assert!(took >= BOUND && took < SLACK, "{mode:?}: {took:?}");
}

#[test]
fn a_wait_behind_an_open_section_times_out_within_its_bound() {
    with_open_section(|unit, _, mode, _| {
        a_bounded_domain_wait_times_out(unit, mode);
        // A second one queues behind the stalled wait: bounded too.
        let mut b = unit.batch();
        b.pages(5, 0x1000, 0, false);
        let e = b.wait_timeout(BOUND).unwrap_err();
        assert!(matches!(e, QiError::InvalidationTimeout { .. }), "{mode:?}");
    });
}

#[test]
fn a_bounded_wait_hears_its_caller_give_up() {
    with_open_section(|unit, _, mode, _| {
        let t0 = Instant::now();
        let mut asked = 0;
        let mut b = unit.batch();
        b.domain(3);
        let e = b
            .wait_bounded(Duration::from_secs(3600), || {
                asked += 1;
                asked > 3
            })
            .unwrap_err();
        assert_eq!(e, QiError::WaitAbandoned, "{mode:?}");
        assert!(t0.elapsed() < SLACK, "{mode:?}");
    });
}

#[test]
fn a_bounded_context_change_behind_an_open_section_is_in_force_but_reported() {
    with_open_section(|unit, mem, mode, _| {
        let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        let sid = SourceId(0x10);
        let ctx = ContextEntry::Translated {
            did: 4,
            root: table.root(),
        };
        let t0 = Instant::now();
        let e = unit.attach_bounded(sid, ctx, BOUND, || false).unwrap_err();
        assert!(
            matches!(
                e,
                HwError::Queue(QiError::InvalidationTimeout { timeout }) if timeout == BOUND
            ),
            "{mode:?}: {e:?}"
        );
        assert!(t0.elapsed() < SLACK);
        assert_eq!(unit.context(sid), Some(ctx), "written before the drain");
        let e = unit.detach_bounded(sid, BOUND, || false).unwrap_err();
        assert!(matches!(
            e,
            HwError::Queue(QiError::InvalidationTimeout { .. })
        ));
        assert_eq!(unit.context(sid), None, "{mode:?}");
        // The section may still walk the table: never freed (leaked), as
        // the contract asks of a caller whose change was not drained.
        std::mem::forget(table);
    });
}

/// A bounded call meets the submission lock held by a submitter without
/// a bound, which waits for room in a ring that a wait stalled behind an
/// open section keeps full: the bounded call ends within its bound,
/// typed, in both queue modes (it used to wait for the lock until the
/// device left its section).
#[test]
fn a_bounded_call_behind_a_submitter_waiting_for_room_times_out_within_its_bound() {
    with_open_section(|unit, _, mode, release| {
        std::thread::scope(|s| {
            // A failed assertion below still releases the section before
            // the scope joins the threads that wait for it.
            let _release_on_unwind = OnDrop(release);
            // A wait at the head, stalled on the open section (its waiter
            // waits until the section ends).
            let waiter = s.spawn(|| {
                let mut b = unit.batch();
                b.domain(3);
                b.wait()
            });
            let t0 = Instant::now();
            while unit.queue_registers().tail == 0 {
                assert!(t0.elapsed() < SLACK, "{mode:?}: the wait never queued");
                std::thread::sleep(Duration::from_millis(1));
            }
            let len = unit.queue_registers().len;
            let filler = s.spawn(move || {
                // More than the ring holds: the last ones wait for room,
                // holding the submission lock, until the section ends.
                for i in 0..len + 8 {
                    if let Err(e) = unit.submit(&[InvDescriptor::iotlb_domain(3)]) {
                        panic!("submission {i}: {e:?}");
                    }
                }
            });
            // Until the ring is full.
            let t0 = Instant::now();
            loop {
                let r = unit.queue_registers();
                if (r.tail + 1) % r.len == r.head {
                    break;
                }
                assert!(
                    t0.elapsed() < SLACK,
                    "{mode:?}: the ring never filled: {r:?}"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            a_bounded_domain_wait_times_out(unit, mode);
            release();
            filler.join().unwrap();
            waiter.join().unwrap().unwrap();
        });
    });
}

/// Runs its closure when dropped, unwinding included.
struct OnDrop<'a>(&'a (dyn Fn() + Sync));

impl Drop for OnDrop<'_> {
    fn drop(&mut self) {
        (self.0)();
    }
}
