//! The synchronisation the crate's lock-free parts are built on, in one
//! place: atomics, locks and condition variables from `std`, or from
//! `loom` under `cfg(loom)` so that the model checker can explore the
//! interleavings of the parts that go through this shim (the IOTLB, the
//! translator slots, the flush queues and their timer, the policy gate, the
//! units list, the accessors' fences); the asymmetric fence pair
//! ([`barrier`]); a back-off for waits that may last; and the one way the
//! crate takes a lock.

pub(crate) mod barrier;
pub(crate) mod spin;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Locks one of the shim's mutexes, taking over a poisoned lock: every
/// critical section in this crate leaves its data consistent at each step
/// that can panic, so a panic elsewhere must not take the lock down too.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(loom)]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(loom))]
    {
        lock_std(m)
    }
}

/// Takes one of the shim's mutexes if it is free (a poisoned one is taken
/// over, as [`lock`] does); `None` if another thread holds it.
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Takes a `std` mutex (one outside the loom models) if it is free, as
/// [`try_lock`] does.
pub(crate) fn try_lock_std<T>(m: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Locks a `std` mutex (one outside the loom models), as [`lock`] does.
pub(crate) fn lock_std<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Backs off inside a wait that may last: spins a little, then gives the
/// core away (on two cores the thread we wait for may need this one).
/// Under loom it yields, which is how a model tells the checker that this
/// thread cannot progress until another runs.
#[derive(Debug, Default)]
pub(crate) struct Backoff(u32);

/// Turns of [`Backoff::snooze`] that spin before it yields.
const SPINS: u32 = 64;

impl Backoff {
    /// One step of waiting.
    #[inline]
    pub(crate) fn snooze(&mut self) {
        #[cfg(loom)]
        loom::thread::yield_now();
        #[cfg(not(loom))]
        {
            if self.0 < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.0 = self.0.saturating_add(1);
    }

    /// Whether the next [`snooze`](Self::snooze) still spins rather than
    /// giving the core away: a caller with a better way to sleep (a
    /// condition variable with a timeout) takes it past this point.
    #[inline]
    pub(crate) fn is_spinning(&self) -> bool {
        self.0 < SPINS
    }
}
