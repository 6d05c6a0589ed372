//! The synchronisation `dma`'s flush queues are built on: `std`'s, or
//! `loom`'s under `cfg(loom)` so that the model checker can explore the
//! queue owners' and the flush timer's interleavings.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Locks, taking over a poisoned lock: every critical section here leaves
/// its data consistent before anything that can panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(loom)]
    {
        m.lock().unwrap()
    }
    #[cfg(not(loom))]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Backs off inside a wait that may last (shared with `hw`).
pub(crate) use crate::hw::sync::Backoff;
