//! Per-CPU statistics: each counter has one writer (its CPU's handle), which
//! updates it with a plain load and store on a cache line of its own;
//! readers sum every CPU's. No shared cache line is written on the hot path.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

/// One CPU's counters.
#[derive(Debug, Default)]
pub struct CpuStats {
    inner: CachePadded<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    maps: AtomicU64,
    unmaps: AtomicU64,
    flushes: AtomicU64,
    flushed_entries: AtomicU64,
    invalidations: AtomicU64,
    bounced_bytes: AtomicU64,
    /// Flushes this CPU's owner issued of its own queue as it unmapped (at
    /// the high-water mark or at the owners' flush age; not `flush_own`,
    /// which a handle also runs as it goes away): the flush timer reads
    /// them to tell whether the owners flush on their own.
    own_flushes: AtomicU64,
}

/// A snapshot of counters, one CPU's or summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DmaStats {
    /// Buffers mapped (a scatter list counts once).
    pub maps: u64,
    /// Buffers unmapped.
    pub unmaps: u64,
    /// Flushes of a deferred queue.
    pub flushes: u64,
    /// Entries those flushes freed.
    pub flushed_entries: u64,
    /// Invalidation requests sent to units (each followed by a wait or
    /// part of a batch that is).
    pub invalidations: u64,
    /// Bytes copied through bounce buffers.
    pub bounced_bytes: u64,
    /// Flushes of a deferred queue that failed (their batches were kept
    /// and retried; see `DmaDomain::last_flush_error`). Domain-wide.
    pub flush_failures: u64,
    /// Batches whose flush failed and that wait for a retry now.
    pub pending_batches: u64,
}

impl DmaStats {
    /// Mappings live: maps minus unmaps.
    pub fn live(&self) -> u64 {
        self.maps.saturating_sub(self.unmaps)
    }

    /// Entries per flush, on average.
    pub fn entries_per_flush(&self) -> f64 {
        if self.flushes == 0 {
            0.0
        } else {
            self.flushed_entries as f64 / self.flushes as f64
        }
    }
}

impl std::ops::AddAssign for DmaStats {
    fn add_assign(&mut self, o: DmaStats) {
        self.maps += o.maps;
        self.unmaps += o.unmaps;
        self.flushes += o.flushes;
        self.flushed_entries += o.flushed_entries;
        self.invalidations += o.invalidations;
        self.bounced_bytes += o.bounced_bytes;
        self.flush_failures += o.flush_failures;
        self.pending_batches += o.pending_batches;
    }
}

#[inline]
fn bump(c: &AtomicU64, by: u64) {
    // Single writer: a plain load and store, not a read-modify-write.
    c.store(c.load(Relaxed) + by, Relaxed);
}

impl CpuStats {
    /// Counts a map.
    #[inline]
    pub(crate) fn map(&self) {
        bump(&self.inner.maps, 1);
    }

    /// Counts an unmap.
    #[inline]
    pub(crate) fn unmap(&self) {
        bump(&self.inner.unmaps, 1);
    }

    /// Counts a flush of `entries` entries and `invalidations` requests.
    pub(crate) fn flush(&self, entries: u64, invalidations: u64) {
        bump(&self.inner.flushes, 1);
        bump(&self.inner.flushed_entries, entries);
        bump(&self.inner.invalidations, invalidations);
    }

    /// Counts a flush the owner issued of its own queue.
    pub(crate) fn own_flush(&self) {
        bump(&self.inner.own_flushes, 1);
    }

    /// Flushes the owner issued of its own queue, ever.
    pub(crate) fn own_flushes(&self) -> u64 {
        self.inner.own_flushes.load(Relaxed)
    }

    /// Counts invalidation requests outside flushes (strict unmaps).
    #[inline]
    pub(crate) fn invalidations(&self, n: u64) {
        bump(&self.inner.invalidations, n);
    }

    /// Counts bytes bounced.
    #[inline]
    pub(crate) fn bounced(&self, bytes: u64) {
        bump(&self.inner.bounced_bytes, bytes);
    }

    /// A snapshot.
    pub fn snapshot(&self) -> DmaStats {
        let c = &self.inner;
        DmaStats {
            maps: c.maps.load(Relaxed),
            unmaps: c.unmaps.load(Relaxed),
            flushes: c.flushes.load(Relaxed),
            flushed_entries: c.flushed_entries.load(Relaxed),
            invalidations: c.invalidations.load(Relaxed),
            bounced_bytes: c.bounced_bytes.load(Relaxed),
            flush_failures: 0,
            pending_batches: 0,
        }
    }
}
