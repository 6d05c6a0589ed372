//! The gate every map and unmap passes, and that a policy switch closes:
//! what lets a switch stop the world without a lock on the per-op path.
//!
//! A CPU's operation runs between [`Gate::enter`] and the drop of the
//! [`Entered`] it returns; a switch runs between [`Gate::close`] and the
//! drop of its [`Closed`]. The two never overlap, and an operation that
//! starts after a switch sees everything the switch did (its policy, its
//! flushed queues, the devices' new contexts).
//!
//! An operation stores "active" in its CPU's flag, then loads `closing`; a
//! switch stores `closing`, then loads every CPU's flag. A store then a
//! load on each side (Dekker): each side needs a full fence between them,
//! or both could miss the other. Operations are millions per second and
//! switches are rare, so the fences are asymmetric ([`Barrier`], the pair
//! `hw`'s drain uses): a compiler fence on the operation's side,
//! `membarrier(2)` on the switch's. Where the kernel lacks it both sides
//! take a `SeqCst` fence. An operation that finds the gate closing backs
//! out (clears its flag) and waits for the switch to end before trying
//! again; a switch waits for every flag it finds set to clear.
//!
//! Leaving is a `Release` store of the flag, which the switch reads with
//! `Acquire`: a switch sees every effect of the operations it waited for
//! (their counters, their table writes). The switch reopens with a
//! `Release` store of `closing` that an entering operation reads with
//! `Acquire`, so that it sees the new policy.
//!
//! The loom models at the bottom check both directions.

use crossbeam_utils::CachePadded;

use crate::sync::barrier::Barrier;
use crate::sync::{AtomicBool, Backoff, Ordering};

/// One CPU's "an operation is running" flag, on a cache line of its own.
#[derive(Debug, Default)]
pub(crate) struct ActiveFlag(CachePadded<AtomicBool>);

/// A domain's gate.
#[derive(Debug)]
pub(crate) struct Gate {
    closing: AtomicBool,
    barrier: Barrier,
}

/// An operation in progress; leaving is dropping it.
#[derive(Debug)]
pub(crate) struct Entered<'a>(&'a ActiveFlag);

/// A switch in progress; reopening is dropping it.
#[must_use = "dropping it reopens the gate"]
#[derive(Debug)]
pub(crate) struct Closed<'a>(&'a Gate);

impl Gate {
    /// A gate whose sides agree on `barrier`.
    pub(crate) fn new(barrier: Barrier) -> Self {
        Self {
            closing: AtomicBool::new(false),
            barrier,
        }
    }

    /// Starts an operation of the CPU owning `flag` (one operation at a
    /// time per flag; the owner's `&mut` handle guarantees it).
    #[inline]
    pub(crate) fn enter<'a>(&self, flag: &'a ActiveFlag) -> Entered<'a> {
        loop {
            flag.0.store(true, Ordering::Relaxed);
            self.barrier.light();
            if !self.closing.load(Ordering::Acquire) {
                return Entered(flag);
            }
            self.back_out(flag);
        }
    }

    #[cold]
    fn back_out(&self, flag: &ActiveFlag) {
        flag.0.store(false, Ordering::Release);
        let mut b = Backoff::default();
        while self.closing.load(Ordering::Acquire) {
            b.snooze();
        }
    }

    /// Closes the gate: operations that start from now on wait. The caller
    /// serialises switches, then waits on every CPU's flag with
    /// [`Closed::wait_for`], collecting the flags only after this call (a
    /// CPU registered later finds the gate closing on its first entry).
    /// Dropping the result reopens the gate.
    pub(crate) fn close(&self) -> Closed<'_> {
        self.closing.store(true, Ordering::Relaxed);
        self.barrier.heavy();
        Closed(self)
    }
}

impl Closed<'_> {
    /// Waits until the CPU owning `flag` runs no operation; none starts
    /// again before the gate reopens.
    pub(crate) fn wait_for(&self, flag: &ActiveFlag) {
        let mut b = Backoff::default();
        while flag.0.load(Ordering::Acquire) {
            b.snooze();
        }
    }
}

impl Drop for Entered<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0 .0.store(false, Ordering::Release);
    }
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        self.0.closing.store(false, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn a_switch_waits_for_the_running_operation_and_blocks_new_ones() {
        let gate = Arc::new(Gate::new(Barrier::default_for_process()));
        let flag = Arc::new(ActiveFlag::default());
        let ops = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (gate, flag, ops, stop) = (gate.clone(), flag.clone(), ops.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _in = gate.enter(&flag);
                    // Two steps a switch must never see half done.
                    ops.fetch_add(1, Ordering::Relaxed);
                    std::hint::spin_loop();
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        for _ in 0..200 {
            let closed = gate.close();
            closed.wait_for(&flag);
            let a = ops.load(Ordering::Relaxed);
            assert_eq!(a % 2, 0, "an operation was caught half done");
            std::hint::spin_loop();
            assert_eq!(
                ops.load(Ordering::Relaxed),
                a,
                "an operation ran inside a switch"
            );
        }
        stop.store(true, Ordering::Relaxed);
        worker.join().unwrap();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicU8;
    use loom::sync::Arc;

    /// What an operation and a switch both touch: loom reports a data race
    /// if they ever touch it at once.
    struct Shared {
        gate: Gate,
        flag: ActiveFlag,
        policy: AtomicU8,
        data: UnsafeCell<u64>,
    }

    // SAFETY: `data` is reached only inside the gate's mutual exclusion,
    // which is what the model checks.
    unsafe impl Sync for Shared {}

    /// An operation and a switch never overlap; an operation entering after
    /// a switch sees the switch's policy and data.
    #[test]
    fn loom_operations_and_switches_exclude_each_other() {
        loom::model(|| {
            let s = Arc::new(Shared {
                gate: Gate::new(Barrier::Fence),
                flag: ActiveFlag::default(),
                policy: AtomicU8::new(0),
                data: UnsafeCell::new(0),
            });
            let op = {
                let s = s.clone();
                loom::thread::spawn(move || {
                    for _ in 0..2 {
                        let _in = s.gate.enter(&s.flag);
                        let p = s.policy.load(Ordering::Relaxed);
                        // The switch writes data = 1 together with policy 1.
                        let d = s.data.with_mut(|d| {
                            // SAFETY: inside the gate (what is checked): no
                            // other access to `data` runs at once.
                            let v = unsafe { *d };
                            // SAFETY: as above.
                            unsafe { *d = v + 10 };
                            v
                        });
                        assert!(p == 0 || d % 10 == 1, "a new policy without its data");
                    }
                })
            };
            {
                let closed = s.gate.close();
                closed.wait_for(&s.flag);
                // SAFETY: the gate is closed and every operation waited
                // for: this is the only access (what the model checks).
                s.data.with_mut(|d| unsafe { *d += 1 });
                s.policy.store(1, Ordering::Relaxed);
            }
            op.join().unwrap();
            // SAFETY: both threads are joined.
            let total = s.data.with(|d| unsafe { *d });
            assert_eq!(total, 21, "both operations and the switch ran once each");
        });
    }
}
