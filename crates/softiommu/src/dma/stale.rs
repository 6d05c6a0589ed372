//! The stale window: how long, and how many, unmapped buffers stayed
//! reachable by their device because their invalidation was deferred.
//!
//! Computed once per flush, not per unmap: the flush knows when its oldest
//! entry was queued and how many entries it holds. The window closes at
//! the earlier of two instants: its invalidation's wait completing (as the
//! pass that found it complete recorded it), and the oldest entry's expiry
//! deadline, which its unmap armed no later than three quarters of the
//! timeout after it (`DmaDomain::expiry_period`): past it every translator
//! drops the domain's cached translations before its next use
//! (`Iotlb::expire`), so no new translation reaches the buffer, whenever
//! the flush comes.
//!
//! What the deadline does not end is a translation a device thread had
//! already made and still holds inside an open translation section; only
//! the wait's drain of those sections does. So the completion itself is
//! kept too (`completion_max`): with the flush timer firing once per
//! timeout, it can pass the timeout by the round's latency, and a drain
//! stalled on a section held open by a descheduled device thread adds
//! that thread's delay.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The worst stale window seen by a domain's flushes.
#[derive(Debug, Default)]
pub struct StaleWindow {
    max_ns: AtomicU64,
    completion_max_ns: AtomicU64,
    max_entries: AtomicU64,
    total_ns: AtomicU64,
    flushes: AtomicU64,
}

/// A snapshot of the stale window a domain measures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StaleReport {
    /// The longest an unmapped buffer stayed reachable through the IOTLB:
    /// from the oldest entry's unmap to the earlier of its invalidation's
    /// completion and its expiry deadline (module documentation), so at
    /// most three quarters of the timeout in force.
    pub max: Duration,
    /// The longest from an unmap to its invalidation's completion (the
    /// wait, with its drain of the translation sections open at the
    /// invalidation), whatever the deadline did: the end of the window
    /// for a translation a device already held.
    pub completion_max: Duration,
    /// The most unmapped buffers reachable at once through one queue.
    pub max_entries: u64,
    /// The mean, over flushes, of the oldest entry's window (as `max`).
    pub mean: Duration,
}

impl StaleWindow {
    /// Records a flush whose oldest entry waited `age` (queueing to the end
    /// of the invalidation wait), whose expiry deadline fell at most
    /// `expiry` after its unmap, and which held `entries` entries.
    pub fn record(&self, age: Duration, expiry: Duration, entries: u64) {
        let full = age.as_nanos().min(u64::MAX as u128) as u64;
        self.completion_max_ns.fetch_max(full, Relaxed);
        let ns = age.min(expiry).as_nanos().min(u64::MAX as u128) as u64;
        self.max_ns.fetch_max(ns, Relaxed);
        self.max_entries.fetch_max(entries, Relaxed);
        self.total_ns.fetch_add(ns, Relaxed);
        self.flushes.fetch_add(1, Relaxed);
    }

    /// The figures so far.
    pub fn report(&self) -> StaleReport {
        let n = self.flushes.load(Relaxed);
        StaleReport {
            max: Duration::from_nanos(self.max_ns.load(Relaxed)),
            completion_max: Duration::from_nanos(self.completion_max_ns.load(Relaxed)),
            max_entries: self.max_entries.load(Relaxed),
            mean: Duration::from_nanos(self.total_ns.load(Relaxed).checked_div(n).unwrap_or(0)),
        }
    }

    /// Starts a new measurement.
    pub fn reset(&self) {
        for a in [
            &self.max_ns,
            &self.completion_max_ns,
            &self.max_entries,
            &self.total_ns,
            &self.flushes,
        ] {
            a.store(0, Relaxed);
        }
    }
}
