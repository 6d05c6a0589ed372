//! The virtio-blk device as a vhost-user back-end: one split virtqueue
//! (virtio 1.2 §2.7) served by a worker thread whose every ring and buffer
//! access goes through the [`DmaSpace`](crate::space::DmaSpace), each
//! request served by `softiommu-virtio`'s [`BlkRequests`] — the same
//! header, checks, data transfer and status code as the device behind a
//! softiommu unit, over the space as its `DeviceDma`.
//!
//! A chain whose shape is wrong (no readable 16-byte header, no writable
//! status byte, a loop, an indirect descriptor — not offered) is
//! completed with used length 0 and counted; a well-shaped request that
//! fails (past the end of the disk, a buffer in the wrong direction, more
//! than [`MAX_REQUEST_BYTES`], more than `seg_max` segments or one longer
//! than `size_max` where the driver acknowledged those features, an
//! access the IOTLB
//! refuses) completes with `VIRTIO_BLK_S_IOERR`, and the queue goes on. A
//! miss cancelled because the rings stop leaves the request on the ring.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softiommu_virtio::blk::{BlkLimits, BlkOp, BlkRequests, Completed, ServeError};
use softiommu_virtio::cpu_clock;
use softiommu_virtio::spec::blk::{self as sb, SECTOR_SIZE};
use softiommu_virtio::transport::{ChainDesc, ChainDir, DeviceError};

use crate::disk::Disk;
use crate::queue::{is_abort, Queue};
use crate::session::{SEG_MAX, SIZE_MAX};

/// The id string `VIRTIO_BLK_T_GET_ID` answers (NUL-padded to 20 bytes).
pub const DEVICE_ID: &[u8] = b"softiommu-vhost-blk";
/// The most data bytes one request may move (the worker's buffer): a
/// Linux guest's requests stay under its `max_sectors_kb` (1280 KiB by
/// default); a larger one completes with `VIRTIO_BLK_S_IOERR`.
pub const MAX_REQUEST_BYTES: u64 = 8 << 20;
// What `seg_max` and `size_max` announce fits the buffer.
const _: () = assert!(SEG_MAX as u64 * SIZE_MAX as u64 <= MAX_REQUEST_BYTES);
/// How long the worker sleeps on its kick descriptor before looking at its
/// stop flag again.
const KICK_POLL: Duration = Duration::from_millis(50);

/// The block device's counters, as a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlkStats {
    /// Requests completed (any status).
    pub requests: u64,
    /// Completed with `VIRTIO_BLK_S_IOERR`.
    pub io_errors: u64,
    /// Completed with `VIRTIO_BLK_S_UNSUPP`.
    pub unsupported: u64,
    /// Chains of the wrong shape, completed with length 0.
    pub bad_chains: u64,
    /// Bytes read from the disk into guest memory.
    pub bytes_read: u64,
    /// Bytes written from guest memory to the disk.
    pub bytes_written: u64,
    /// Ring accesses that failed (the ring left for the next kick).
    pub ring_faults: u64,
    /// CPU time of the queue threads, nanoseconds (summed over ring starts).
    pub worker_cpu_ns: u64,
    /// Time the queue threads were runnable but waited for a CPU,
    /// nanoseconds (Linux's `schedstat`; zero where it is missing).
    pub worker_wait_ns: u64,
    /// Time slices the queue threads ran (each wake-up counts one).
    pub worker_slices: u64,
}

#[derive(Debug, Default)]
pub(crate) struct BlkCounters {
    requests: AtomicU64,
    io_errors: AtomicU64,
    unsupported: AtomicU64,
    bad_chains: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    ring_faults: AtomicU64,
    worker_cpu_ns: AtomicU64,
    worker_wait_ns: AtomicU64,
    worker_slices: AtomicU64,
}

/// CPU time of the calling thread, nanoseconds (the workspace's one
/// thread clock, `softiommu_virtio::cpu_clock`).
pub(crate) fn thread_cpu_ns() -> u64 {
    u64::try_from(cpu_clock::thread().as_nanos()).unwrap_or(u64::MAX)
}

impl BlkCounters {
    pub(crate) fn snapshot(&self) -> BlkStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BlkStats {
            requests: l(&self.requests),
            io_errors: l(&self.io_errors),
            unsupported: l(&self.unsupported),
            bad_chains: l(&self.bad_chains),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            ring_faults: l(&self.ring_faults),
            worker_cpu_ns: l(&self.worker_cpu_ns),
            worker_wait_ns: l(&self.worker_wait_ns),
            worker_slices: l(&self.worker_slices),
        }
    }
}

pub(crate) struct Worker {
    q: Queue,
    disk: Arc<Disk>,
    counters: Arc<BlkCounters>,
    /// The avail index up to which chains were looked at ahead.
    ahead: u16,
    /// The chain looked at ahead (its vector reused).
    ahead_chain: Vec<ChainDesc>,
    /// The request code shared with the devices behind a softiommu unit.
    req: BlkRequests,
}

/// Chains looked at ahead of the one served (their missing pages asked
/// for while it is served): Linux's read-ahead keeps a few large requests
/// in flight.
const LOOK_AHEAD: u16 = 4;

/// Asks for every missing page of `chain`: the header and device-read
/// data, then the device-written data and status. Returns the last page
/// asked (or still outstanding), to wait for. A chain past the buffer
/// ([`MAX_REQUEST_BYTES`] of data: the request checks refuse it before any
/// data moves) is not looked at: no scan of a chain that will not be
/// served. (Its segments are not counted here: `seg_max` binds only a
/// front-end that acknowledged it, and the scan is bounded by itself,
/// `PREFETCH_SCAN_PAGES`, with the chain bounded by the queue size.)
fn prefetch_chain(space: &crate::space::DmaSpace, chain: &[ChainDesc]) -> Option<u64> {
    // Header and status besides the data.
    let bytes_max = MAX_REQUEST_BYTES + 16 + 1;
    let bytes = chain
        .iter()
        .try_fold(0u64, |t, d| t.checked_add(u64::from(d.len)));
    if bytes.is_none_or(|b| b > bytes_max) {
        return None;
    }
    let seg = |d: &ChainDesc| (d.addr, u64::from(d.len));
    let r = space.prefetch(&mut chain.iter().filter(|d| !d.writable).map(seg), false);
    let w = space.prefetch(&mut chain.iter().filter(|d| d.writable).map(seg), true);
    w.or(r)
}

impl Worker {
    /// A worker serving `q` from `disk`.
    pub(crate) fn new(q: Queue, disk: Arc<Disk>, counters: Arc<BlkCounters>) -> Self {
        let limits = BlkLimits {
            capacity_sectors: disk.sectors(),
            blk_size: SECTOR_SIZE as u32,
            seg_max: SEG_MAX,
            size_max: SIZE_MAX,
            max_bytes: MAX_REQUEST_BYTES,
            // Taken from the features negotiated, per request.
            flush: false,
        };
        let mut id = [0u8; sb::ID_BYTES];
        id[..DEVICE_ID.len()].copy_from_slice(DEVICE_ID);
        Self {
            ahead: q.last_avail(),
            ahead_chain: Vec::new(),
            q,
            disk,
            counters,
            req: BlkRequests::new(limits, id, 1),
        }
    }

    /// Serves the ring until told to stop; returns the ring's base, equal
    /// to the used index it shows ([`Queue::finish`]: a request whose
    /// completion could not be published is given back and re-executed
    /// after resuming, the same sectors from the same buffers).
    pub(crate) fn run(mut self) -> u16 {
        while !self.q.stopping() {
            if self.q.enabled() {
                match self.drain() {
                    // Misses cancelled: the rings are stopping (the stop
                    // flag ends the loop) or another ring stopped.
                    Ok(()) => {}
                    Err(e) if is_abort(&e) => {}
                    Err(e) => {
                        self.counters.ring_faults.fetch_add(1, Ordering::Relaxed);
                        eprintln!("softiommu-vhost: ring access failed: {e}");
                    }
                }
            }
            self.q.wait_kick(KICK_POLL);
        }
        self.counters
            .worker_cpu_ns
            .fetch_add(thread_cpu_ns(), Ordering::Relaxed);
        // The thread serves this ring only: its figures since it started.
        let sched = crate::sched::Sched::this_thread();
        let c = &self.counters;
        c.worker_wait_ns.fetch_add(sched.wait_ns, Ordering::Relaxed);
        c.worker_slices.fetch_add(sched.slices, Ordering::Relaxed);
        self.q.finish()
    }

    /// Asks the front-end for the missing pages of the chains available
    /// after the one being served (at most [`LOOK_AHEAD`] chains, each
    /// once), so that it answers them while this one is served.
    /// Failures are left for the serving of those chains to meet.
    fn look_ahead(&mut self) {
        let Ok(avail) = self.q.avail_idx() else {
            return;
        };
        let last = self.q.last_avail();
        let ahead = avail.wrapping_sub(last);
        // Chains looked at before stay looked at (`self.ahead` is at or
        // past `last`, the chain after the one being served, and within
        // what is available; else it starts there again).
        if self.ahead.wrapping_sub(last) > ahead {
            self.ahead = last;
        }
        let mut budget = LOOK_AHEAD;
        while self.ahead != avail && budget > 0 {
            let idx = self.ahead;
            self.ahead = self.ahead.wrapping_add(1);
            budget -= 1;
            let Ok(head) = self.q.head_at(idx) else {
                return;
            };
            let dir = ChainDir::ReadableThenWritable;
            if self.q.walk(head, dir, &mut self.ahead_chain).is_ok() {
                prefetch_chain(self.q.space(), &self.ahead_chain);
            }
        }
    }

    /// Serves every available chain, then signals the driver once. An
    /// avail index past the ring is counted and left for the next kick.
    fn drain(&mut self) -> Result<(), DeviceError> {
        let r = loop {
            if self.q.stopping() {
                break Ok(());
            }
            match self.q.pop() {
                Ok(Some(head)) => {
                    let len = match self.serve(head) {
                        Ok(l) => l,
                        Err(e) => {
                            // Refused only without the pop just above.
                            let _ = self.q.unpop();
                            break Err(e);
                        }
                    };
                    // A failure keeps the entry, published before the
                    // next pop or given back when the worker stops.
                    if let Err(e) = self.q.push_used(head, len) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(()),
                Err(DeviceError::AvailIndexTooFar { .. }) => {
                    self.counters.ring_faults.fetch_add(1, Ordering::Relaxed);
                    break Ok(());
                }
                Err(e) => break Err(e),
            }
        };
        self.q.signal_if_wanted()?;
        r
    }

    /// Serves one chain; returns the used length. A chain the walk
    /// refuses for its shape (a loop, an index past the ring, an indirect
    /// descriptor, a readable descriptor after a writable one) is
    /// completed with length 0 and counted; a request that fails completes
    /// with its status (`IOERR`). Not completed — an error, the head given
    /// back to the ring to be served again after the next kick or poll —
    /// are a request whose status byte cannot be written (a guest driver
    /// reads the status byte, not the used length: completing it would
    /// show whatever the byte held, `OK` for a fresh Linux request) and a
    /// chain whose descriptor table cannot be read (its status byte is not
    /// even known), as well as an aborted access (the rings stopping).
    fn serve(&mut self, head: u16) -> Result<u32, DeviceError> {
        let dir = ChainDir::ReadableThenWritable;
        match self.q.walk(head, dir, self.req.chain_mut()) {
            Ok(_) => {}
            Err(e) if is_abort(&e) => return Err(e),
            Err(e @ DeviceError::DmaFault { .. }) => return Err(e),
            Err(_) => {
                self.counters.bad_chains.fetch_add(1, Ordering::Relaxed);
                return Ok(0);
            }
        }
        // Every missing page of the request asked at once (unless the look
        // ahead already did), then those of the chains available after it
        // (answered while this one is served), then one wait for the last
        // page of this one: the front-end answers in order, so the
        // accesses below hit instead of waking once per page.
        let last = prefetch_chain(self.q.space(), self.req.chain_mut());
        self.look_ahead();
        if let Some(pg) = last {
            self.q.space().await_page(pg);
        }
        let mut space = &**self.q.space();
        let c = &self.counters;
        // Limits as negotiated: without FLUSH a FLUSH request is
        // unsupported and every write is committed before it completes
        // (§5.2.6.2); `seg_max` and `size_max` hold only where their
        // features were acknowledged, as on the unit device.
        let done = match self.req.serve(&mut space, &*self.disk, self.q.features()) {
            Ok(done) => Some(done),
            Err(ServeError::Shape { .. }) => {
                c.bad_chains.fetch_add(1, Ordering::Relaxed);
                return Ok(0);
            }
            Err(ServeError::Aborted { iova, access, .. }) => {
                return Err(DeviceError::DmaAborted {
                    queue: 0,
                    what: "buffer",
                    iova,
                    access,
                })
            }
            Err(ServeError::Status { iova, fault, .. }) => {
                // Served again after a kick: a read reads the same sectors
                // into the same buffers, a write writes the same data (the
                // driver has not seen it complete; its buffers are still
                // the device's, virtio 1.2 §2.7.13).
                return Err(DeviceError::DmaFault {
                    queue: 0,
                    what: "status byte",
                    iova,
                    access: softiommu::hw::Access::Write,
                    reason: fault.to_string(),
                });
            }
        };
        Ok(done.map_or(0, |d| {
            self.count(&d);
            d.used_len
        }))
    }

    /// Counts a completed request.
    fn count(&self, d: &Completed) {
        let c = &self.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        match d.status {
            sb::S_IOERR => c.io_errors.fetch_add(1, Ordering::Relaxed),
            sb::S_UNSUPP => c.unsupported.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        match d.plan.map(|p| (p.op, p.len)) {
            Some((BlkOp::Read, n)) => c.bytes_read.fetch_add(n, Ordering::Relaxed),
            Some((BlkOp::Write, n)) => c.bytes_written.fetch_add(n, Ordering::Relaxed),
            _ => 0,
        };
    }
}
