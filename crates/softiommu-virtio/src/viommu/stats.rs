//! [`ViommuStats`]: what the device did, counted by its thread alone.

use std::sync::atomic::{AtomicU64, Ordering};

/// Totals over the device's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ViommuStats {
    /// Requests completed (used), whatever their status.
    pub requests: u64,
    /// Requests completed with a status other than `OK`, and requests
    /// returned unwritten.
    pub failed: u64,
    /// Requests returned with used length 0 and nothing written: no room
    /// for the tail, or an unknown type (§5.13.6).
    pub unwritten: u64,
    /// MAP requests that succeeded.
    pub maps: u64,
    /// UNMAP requests that succeeded.
    pub unmaps: u64,
    /// Rounds of the request queue that did work (one per notification
    /// when the driver waits for each).
    pub rounds: u64,
    /// IOTLB invalidation descriptors submitted to the unit.
    pub invalidations: u64,
    /// Waits on the unit's invalidation queue (at most one per round).
    pub invalidation_waits: u64,
    /// Rounds whose invalidation the unit's queue refused (their UNMAPs
    /// completed `DEVERR`).
    pub invalidation_errors: u64,
    /// Invalidations (an UNMAP round's, an ATTACH's or DETACH's context
    /// change) not complete within `invalidation_timeout`, or abandoned
    /// as the device stopped: each broke the device until a reset.
    pub invalidation_timeouts: u64,
    /// UNMAPs the table refused midway, undone: the mappings they had
    /// removed installed again (the request failed with every mapping
    /// in place).
    pub unmaps_rolled_back: u64,
    /// Mappings such an undo could not install again (out of table
    /// pages): removed, their records with them, and invalidated.
    pub mappings_lost: u64,
    /// Faults written to the event queue.
    pub events: u64,
    /// Faults of managed endpoints not reported: the event queue had no
    /// buffer, was not live, or the buffer was too small (§5.13.6.7: the
    /// device may drop an event rather than wait).
    pub events_dropped: u64,
    /// Event buffers returned unwritten because they were too short for
    /// a fault report (the next buffer was tried for the event).
    pub event_buffers_refused: u64,
    /// Faults the device could not see: records another reader drained
    /// from the unit's log first, and faults the log dropped when full
    /// (`FSTS.PFO`: whoever owns the log must drain it), of any endpoint.
    pub faults_missed: u64,
}

/// The live counters behind [`ViommuStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) unwritten: AtomicU64,
    pub(crate) maps: AtomicU64,
    pub(crate) unmaps: AtomicU64,
    pub(crate) rounds: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) invalidation_waits: AtomicU64,
    pub(crate) invalidation_errors: AtomicU64,
    pub(crate) invalidation_timeouts: AtomicU64,
    pub(crate) unmaps_rolled_back: AtomicU64,
    pub(crate) mappings_lost: AtomicU64,
    pub(crate) events: AtomicU64,
    pub(crate) events_dropped: AtomicU64,
    pub(crate) event_buffers_refused: AtomicU64,
    pub(crate) faults_missed: AtomicU64,
}

/// Adds `n` to `c` (one writer: the device thread).
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// A snapshot.
    pub(crate) fn snapshot(&self) -> ViommuStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ViommuStats {
            requests: l(&self.requests),
            failed: l(&self.failed),
            unwritten: l(&self.unwritten),
            maps: l(&self.maps),
            unmaps: l(&self.unmaps),
            rounds: l(&self.rounds),
            invalidations: l(&self.invalidations),
            invalidation_waits: l(&self.invalidation_waits),
            invalidation_errors: l(&self.invalidation_errors),
            invalidation_timeouts: l(&self.invalidation_timeouts),
            unmaps_rolled_back: l(&self.unmaps_rolled_back),
            mappings_lost: l(&self.mappings_lost),
            events: l(&self.events),
            events_dropped: l(&self.events_dropped),
            event_buffers_refused: l(&self.event_buffers_refused),
            faults_missed: l(&self.faults_missed),
        }
    }
}
