//! The stale window: how long, and how many, unmapped buffers stayed
//! reachable by their device because their invalidation was deferred.
//!
//! Computed once per flush, not per unmap: the flush knows when its oldest
//! entry was queued and how many entries it holds, and the window closes
//! when its invalidation wait completes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The worst stale window seen by a domain's flushes.
#[derive(Debug, Default)]
pub struct StaleWindow {
    max_ns: AtomicU64,
    max_entries: AtomicU64,
    total_ns: AtomicU64,
    flushes: AtomicU64,
}

/// A snapshot of the stale window a domain measures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StaleReport {
    /// The longest time an unmapped buffer stayed reachable.
    pub max: Duration,
    /// The most unmapped buffers reachable at once through one queue.
    pub max_entries: u64,
    /// The mean, over flushes, of the oldest entry's wait.
    pub mean: Duration,
}

impl StaleWindow {
    /// Records a flush whose oldest entry waited `age` (queueing to the end
    /// of the invalidation wait) and which held `entries` entries.
    pub fn record(&self, age: Duration, entries: u64) {
        let ns = age.as_nanos().min(u64::MAX as u128) as u64;
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
            max_entries: self.max_entries.load(Relaxed),
            mean: Duration::from_nanos(self.total_ns.load(Relaxed).checked_div(n).unwrap_or(0)),
        }
    }

    /// Starts a new measurement.
    pub fn reset(&self) {
        for a in [
            &self.max_ns,
            &self.max_entries,
            &self.total_ns,
            &self.flushes,
        ] {
            a.store(0, Relaxed);
        }
    }
}
