//! The atomics the lock-free parts of `hw` (the IOTLB and the translator
//! slots) are built on: the standard library's, or `loom`'s under
//! `cfg(loom)` so that the model checker can explore their interleavings.
//!
//! Only those two parts go through this shim; everything else in `hw`
//! (contexts, the queue's registers, the fault log) uses `std` directly and
//! is not part of the loom models.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};

/// Backs off inside a wait that may last: spins a little, then gives the
/// core away (on two cores the thread we wait for may need this one).
/// Under loom it yields, which is how a model tells the checker that this
/// thread cannot progress until another runs.
#[derive(Debug, Default)]
pub(crate) struct Backoff(u32);

impl Backoff {
    /// One step of waiting.
    #[inline]
    pub(crate) fn snooze(&mut self) {
        #[cfg(loom)]
        loom::thread::yield_now();
        #[cfg(not(loom))]
        {
            if self.0 < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.0 = self.0.saturating_add(1);
    }
}
