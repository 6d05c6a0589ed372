//! A block device's counters (one writer per worker: no read-modify-write
//! on the data path) and the bounded log of the requests it refused.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::request::RequestError;

/// One worker's counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) write_bytes: AtomicU64,
    pub(crate) io_errors: AtomicU64,
    pub(crate) request_errors: AtomicU64,
    pub(crate) dma_faults: AtomicU64,
    pub(crate) held: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) held_ns: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) sleeps: AtomicU64,
}

/// Adds `n` to a counter only its worker writes (a load and a store, no
/// atomic read-modify-write).
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// A snapshot of a block device's counters, summed over its workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlkDeviceStats {
    /// Requests completed (returned on a used ring), errors included.
    pub requests: u64,
    /// Reads served.
    pub reads: u64,
    /// Writes served.
    pub writes: u64,
    /// Flushes served.
    pub flushes: u64,
    /// Bytes read from the back-end into memory.
    pub read_bytes: u64,
    /// Bytes written to the back-end.
    pub write_bytes: u64,
    /// Requests the back-end failed (completed with `VIRTIO_BLK_S_IOERR`).
    pub io_errors: u64,
    /// Requests refused or failed for any reason (back-end, DMA, checks).
    pub request_errors: u64,
    /// Data or header accesses the IOMMU refused.
    pub dma_faults: u64,
    /// Requests held in the slow region.
    pub held: u64,
    /// Held requests returned on their used ring.
    pub released: u64,
    /// Their total time in the device, ns: from the worker taking each
    /// off the available ring to returning it on the used ring (the
    /// achieved device time, beside the hold the model asks for).
    pub held_ns: u64,
    /// Turns of the workers' loops that did work.
    pub batches: u64,
    /// Times a worker parked for want of work.
    pub sleeps: u64,
}

impl BlkDeviceStats {
    pub(crate) fn sum<'a>(all: impl IntoIterator<Item = &'a Counters>) -> Self {
        let mut s = Self::default();
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for c in all {
            s.requests += r(&c.requests);
            s.reads += r(&c.reads);
            s.writes += r(&c.writes);
            s.flushes += r(&c.flushes);
            s.read_bytes += r(&c.read_bytes);
            s.write_bytes += r(&c.write_bytes);
            s.io_errors += r(&c.io_errors);
            s.request_errors += r(&c.request_errors);
            s.dma_faults += r(&c.dma_faults);
            s.held += r(&c.held);
            s.released += r(&c.released);
            s.held_ns += r(&c.held_ns);
            s.batches += r(&c.batches);
            s.sleeps += r(&c.sleeps);
        }
        s
    }
}

/// A refused or failed request, as the device logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// The queue.
    pub queue: u16,
    /// The chain's head.
    pub head: u16,
    /// What was wrong.
    pub error: RequestError,
}

/// The requests a device refused: the first [`RequestLog::CAPACITY`] kept,
/// the rest counted (a driver sending bad requests cannot make it grow).
#[derive(Debug, Default)]
pub struct RequestLog {
    kept: Mutex<VecDeque<RequestRecord>>,
    total: AtomicU64,
}

impl RequestLog {
    /// Records kept before the rest are only counted.
    pub const CAPACITY: usize = 64;

    /// Records one (a slow path: a lock).
    pub(crate) fn record(&self, r: RequestRecord) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < Self::CAPACITY {
            kept.push_back(r);
        }
    }

    /// Takes the kept records, oldest first.
    pub fn drain(&self) -> Vec<RequestRecord> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.drain(..).collect()
    }

    /// Records over the log's life, kept or not.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}
