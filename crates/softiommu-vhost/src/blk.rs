//! The virtio-blk device as a vhost-user back-end: one split virtqueue
//! (virtio 1.2 §2.7) served by a worker thread whose every ring and buffer
//! access goes through the [`DmaSpace`](crate::space::DmaSpace), the request decoded with
//! `softiommu-virtio`'s [`BlkHeader`]/[`BlkOp`].
//!
//! A chain whose shape is wrong (no readable 16-byte header first, no
//! writable status byte last, a loop, an indirect descriptor — not
//! offered) is completed with used length 0 and counted; a well-shaped
//! request that fails (past the end of the disk, a buffer in the wrong
//! direction, an access the IOTLB refuses) completes with
//! `VIRTIO_BLK_S_IOERR`, and the queue goes on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softiommu_virtio::blk::{BlkHeader, BlkOp};
use softiommu_virtio::spec::blk::{self as sb, HDR_LEN, SECTOR_SIZE};
use softiommu_virtio::spec::desc;

use crate::disk::Disk;
use crate::error::AccessError;
use crate::space::AddrKind;
use crate::vring::{Chain, Desc, Pop, Queue};

/// The id string `VIRTIO_BLK_T_GET_ID` answers.
pub const DEVICE_ID: &[u8] = b"softiommu-vhost-blk";
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
}

/// CPU time of the calling thread, nanoseconds.
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
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
        }
    }
}

pub(crate) struct Worker {
    pub(crate) q: Queue,
    pub(crate) disk: Arc<Disk>,
    pub(crate) counters: Arc<BlkCounters>,
    /// The avail index up to which chains were looked at ahead.
    pub(crate) ahead: u16,
}

/// Chains looked at ahead of the one served (their missing pages asked
/// for while it is served): Linux's read-ahead keeps a few large requests
/// in flight.
const LOOK_AHEAD: u16 = 4;

/// Asks for every missing page of `chain`: the header and device-read
/// data, then the device-written data and status. Returns the last page
/// asked (or still outstanding), to wait for.
fn prefetch_chain(space: &crate::space::DmaSpace, chain: &[Desc]) -> Option<u64> {
    let seg = |d: &Desc| (d.addr, u64::from(d.len));
    let r = space.prefetch(
        &mut chain
            .iter()
            .filter(|d| d.flags & desc::F_WRITE == 0)
            .map(seg),
        false,
    );
    let w = space.prefetch(
        &mut chain
            .iter()
            .filter(|d| d.flags & desc::F_WRITE != 0)
            .map(seg),
        true,
    );
    w.or(r)
}

impl Worker {
    /// Serves the ring until told to stop; returns the next avail index.
    pub(crate) fn run(mut self) -> u16 {
        while !self.q.stopping() {
            if self.q.enabled() {
                match self.drain() {
                    // Misses cancelled: the rings are stopping (the stop
                    // flag ends the loop) or another ring stopped.
                    Ok(()) | Err(AccessError::Cancelled { .. }) => {}
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
        self.q.last_avail
    }

    /// Asks the front-end for the missing pages of the chains available
    /// after the one being served (at most [`LOOK_AHEAD`] chains, each
    /// once), so that it answers them while this one is served.
    /// Failures are left for the serving of those chains to meet.
    fn look_ahead(&mut self) {
        let Ok(avail) = self.q.avail_idx() else {
            return;
        };
        let ahead = avail.wrapping_sub(self.q.last_avail);
        if ahead > self.q.ring.num {
            return;
        }
        // Chains looked at before stay looked at (`self.ahead` is at or
        // past `last_avail`, the chain after the one being served, and
        // within what is available; else it starts there again).
        if self.ahead.wrapping_sub(self.q.last_avail) > ahead {
            self.ahead = self.q.last_avail;
        }
        let mut budget = LOOK_AHEAD;
        while self.ahead != avail && budget > 0 {
            let idx = self.ahead;
            self.ahead = self.ahead.wrapping_add(1);
            budget -= 1;
            let Ok(head) = self.q.head_at(idx) else {
                return;
            };
            if let Ok(Chain::Ok(chain)) = self.q.walk(head) {
                prefetch_chain(&self.q.space, &chain);
                self.q.recycle(chain);
            }
        }
    }

    /// Serves every available chain, then signals the driver once.
    fn drain(&mut self) -> Result<(), AccessError> {
        let r = loop {
            if self.q.stopping() {
                break Ok(());
            }
            match self.q.pop() {
                Ok(Pop::Head(head)) => {
                    let len = match self.serve(head) {
                        Ok(l) => l,
                        Err(e) => {
                            self.q.unpop();
                            break Err(e);
                        }
                    };
                    if let Err(e) = self.q.push_used(head, len) {
                        break Err(e);
                    }
                }
                Ok(Pop::Empty) => break Ok(()),
                Ok(Pop::Overrun) => {
                    self.counters.ring_faults.fetch_add(1, Ordering::Relaxed);
                    break Ok(());
                }
                Err(e) => break Err(e),
            }
        };
        self.q.signal_if_wanted()?;
        r
    }

    /// Serves one chain; returns the used length. Only a cancelled access
    /// (the rings stopping) is an error: every other failure completes the
    /// request.
    fn serve(&mut self, head: u16) -> Result<u32, AccessError> {
        let c = &self.counters;
        let chain = match self.q.walk(head) {
            Ok(Chain::Ok(d)) => d,
            Ok(Chain::Bad) => {
                c.bad_chains.fetch_add(1, Ordering::Relaxed);
                return Ok(0);
            }
            Err(e @ AccessError::Cancelled { .. }) => return Err(e),
            Err(_) => {
                c.bad_chains.fetch_add(1, Ordering::Relaxed);
                return Ok(0);
            }
        };
        let r = self.serve_chain(&chain);
        self.q.recycle(chain);
        r
    }

    /// Serves one walked chain (see [`Worker::serve`]).
    fn serve_chain(&mut self, chain: &[Desc]) -> Result<u32, AccessError> {
        let n = chain.len();
        let hdr_ok = chain[0].flags & desc::F_WRITE == 0 && chain[0].len as usize >= HDR_LEN;
        let st = &chain[n - 1];
        if n < 2 || !hdr_ok || st.flags & desc::F_WRITE == 0 || st.len == 0 {
            self.counters.bad_chains.fetch_add(1, Ordering::Relaxed);
            return Ok(0);
        }
        // Every missing page of the request asked at once (unless the look
        // ahead already did), then those of the chains available after it
        // (answered while this one is served), then one wait for the last
        // page of this one: the front-end answers in order, so the
        // accesses below hit instead of waking once per page.
        let last = prefetch_chain(&self.q.space, chain);
        self.look_ahead();
        if let Some(pg) = last {
            self.q.space.await_page(pg);
        }
        let mut h = [0u8; HDR_LEN];
        let (status, written) =
            match self
                .q
                .space
                .read_bytes(AddrKind::Buffer, chain[0].addr, &mut h)
            {
                Err(e @ AccessError::Cancelled { .. }) => return Err(e),
                Err(_) => (sb::S_IOERR, 0),
                Ok(()) => self.request(BlkHeader::decode(&h), &chain[1..n - 1])?,
            };
        let at = st.addr.checked_add(u64::from(st.len) - 1);
        let wrote = match at {
            Some(a) => self.q.space.write_bytes(AddrKind::Buffer, a, &[status]),
            None => Err(AccessError::Wraps {
                iova: st.addr,
                len: u64::from(st.len),
            }),
        };
        let c = &self.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        match status {
            sb::S_IOERR => c.io_errors.fetch_add(1, Ordering::Relaxed),
            sb::S_UNSUPP => c.unsupported.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        match wrote {
            Ok(()) => Ok(written.saturating_add(1)),
            Err(e @ AccessError::Cancelled { .. }) => Err(e),
            Err(_) => Ok(0),
        }
    }

    /// Runs a decoded request over its data descriptors; returns the
    /// status and the bytes written into guest memory.
    fn request(&self, h: BlkHeader, data: &[Desc]) -> Result<(u8, u32), AccessError> {
        let Some(op) = BlkOp::from_type(h.type_) else {
            return Ok((sb::S_UNSUPP, 0));
        };
        let total: u64 = data.iter().map(|d| u64::from(d.len)).sum();
        let want_write = op.device_writes();
        if data
            .iter()
            .any(|d| (d.flags & desc::F_WRITE != 0) != want_write)
        {
            return Ok((sb::S_IOERR, 0));
        }
        let r = match op {
            BlkOp::Flush => self
                .disk
                .flush()
                .map_err(|e| AccessError::Io(e.to_string())),
            BlkOp::GetId => {
                let mut left = DEVICE_ID;
                let mut r = Ok(());
                for d in data {
                    let k = left.len().min(d.len as usize);
                    r = self
                        .q
                        .space
                        .write_bytes(AddrKind::Buffer, d.addr, &left[..k]);
                    left = &left[k..];
                    if r.is_err() || left.is_empty() {
                        break;
                    }
                }
                r
            }
            BlkOp::Read | BlkOp::Write => {
                let start = h.sector.checked_mul(SECTOR_SIZE);
                match start.and_then(|s| s.checked_add(total)) {
                    Some(end) if end <= self.disk.bytes() => {
                        self.transfer(op, start.unwrap_or(0), data)
                    }
                    _ => return Ok((sb::S_IOERR, 0)),
                }
            }
        };
        match r {
            Ok(()) => {
                let written = match op {
                    BlkOp::Read => total.min(u64::from(u32::MAX - 1)) as u32,
                    BlkOp::GetId => DEVICE_ID.len() as u32,
                    _ => 0,
                };
                Ok((sb::S_OK, written))
            }
            Err(e @ AccessError::Cancelled { .. }) => Err(e),
            Err(_) => Ok((sb::S_IOERR, 0)),
        }
    }

    fn transfer(&self, op: BlkOp, mut pos: u64, data: &[Desc]) -> Result<(), AccessError> {
        let read = op == BlkOp::Read;
        for d in data {
            let len = u64::from(d.len);
            let disk = &self.disk;
            let base = pos;
            self.q
                .space
                .access(AddrKind::Buffer, d.addr, len, read, &mut |p, n, off| {
                    let at = base + off;
                    let r = if read {
                        // SAFETY: p is valid for n bytes of shared guest memory.
                        disk.read_at(unsafe { std::slice::from_raw_parts_mut(p, n) }, at)
                    } else {
                        // SAFETY: as above.
                        disk.write_at(unsafe { std::slice::from_raw_parts(p, n) }, at)
                    };
                    r.map_err(|e| AccessError::Io(e.to_string()))
                })?;
            pos += len;
            let ctr = if read {
                &self.counters.bytes_read
            } else {
                &self.counters.bytes_written
            };
            ctr.fetch_add(len, Ordering::Relaxed);
        }
        Ok(())
    }
}
