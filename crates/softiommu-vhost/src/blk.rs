//! The virtio-blk device as a vhost-user back-end: one split virtqueue
//! (virtio 1.2 §2.7) served by a worker thread whose every ring and buffer
//! access goes through the [`DmaSpace`], the request decoded with
//! `softiommu-virtio`'s [`BlkHeader`]/[`BlkOp`].
//!
//! A chain whose shape is wrong (no readable 16-byte header first, no
//! writable status byte last, a loop, an indirect descriptor — not
//! offered) is completed with used length 0 and counted; a well-shaped
//! request that fails (past the end of the disk, a buffer in the wrong
//! direction, an access the IOTLB refuses) completes with
//! `VIRTIO_BLK_S_IOERR`, and the queue goes on.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softiommu_virtio::blk::{BlkHeader, BlkOp};
use softiommu_virtio::spec::blk::{self as sb, HDR_LEN, SECTOR_SIZE};
use softiommu_virtio::spec::{desc, ring};

use crate::disk::Disk;
use crate::error::AccessError;
use crate::space::{AddrKind, DmaSpace};

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

/// Where a ring is (validated by the session).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingAddrs {
    pub(crate) num: u16,
    pub(crate) desc: u64,
    pub(crate) avail: u64,
    pub(crate) used: u64,
}

/// What the worker shares with the session.
#[derive(Debug)]
pub(crate) struct WorkerShared {
    pub(crate) stop: AtomicBool,
    pub(crate) enabled: AtomicBool,
    pub(crate) call: Mutex<Option<OwnedFd>>,
}

pub(crate) struct Worker {
    pub(crate) space: Arc<DmaSpace>,
    pub(crate) disk: Arc<Disk>,
    pub(crate) ring: RingAddrs,
    pub(crate) kick: Option<OwnedFd>,
    pub(crate) shared: Arc<WorkerShared>,
    pub(crate) counters: Arc<BlkCounters>,
    pub(crate) last_avail: u16,
}

struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
}

enum Chain {
    Bad,
    Ok(Vec<Desc>),
}

impl Worker {
    /// Serves the ring until told to stop; returns the next avail index.
    pub(crate) fn run(mut self) -> u16 {
        let mut used_idx = self.last_avail;
        while !self.shared.stop.load(Ordering::Acquire) {
            if self.shared.enabled.load(Ordering::Acquire) {
                match self.drain(&mut used_idx) {
                    Ok(()) => {}
                    Err(AccessError::Cancelled { .. }) => break,
                    Err(e) => {
                        self.counters.ring_faults.fetch_add(1, Ordering::Relaxed);
                        eprintln!("softiommu-vhost: ring access failed: {e}");
                    }
                }
            }
            self.wait_kick();
        }
        self.counters
            .worker_cpu_ns
            .fetch_add(thread_cpu_ns(), Ordering::Relaxed);
        self.last_avail
    }

    fn wait_kick(&self) {
        let Some(k) = &self.kick else {
            std::thread::sleep(Duration::from_millis(1));
            return;
        };
        let mut p = libc::pollfd {
            fd: k.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, KICK_POLL.as_millis() as i32) };
        if n > 0 && p.revents & libc::POLLIN != 0 {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into v from the eventfd.
            unsafe { libc::read(k.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
    }

    /// Serves every available chain, then signals the driver once.
    fn drain(&mut self, used_idx: &mut u16) -> Result<(), AccessError> {
        let r = self.ring;
        let mut done = 0u32;
        loop {
            let avail_idx = self.space.load_u16_acquire(AddrKind::Ring, r.avail + 2)?;
            if avail_idx == self.last_avail || self.shared.stop.load(Ordering::Acquire) {
                break;
            }
            if avail_idx.wrapping_sub(self.last_avail) > r.num {
                // A driver that published more than the ring holds: leave it.
                self.counters.ring_faults.fetch_add(1, Ordering::Relaxed);
                break;
            }
            while self.last_avail != avail_idx {
                let slot = u64::from(self.last_avail % r.num);
                let mut h = [0u8; 2];
                self.space
                    .read_bytes(AddrKind::Ring, r.avail + 4 + 2 * slot, &mut h)?;
                let head = u16::from_le_bytes(h);
                let len = self.serve(head)?;
                let uslot = u64::from(*used_idx % r.num);
                let mut e = [0u8; 8];
                e[0..4].copy_from_slice(&u32::from(head).to_le_bytes());
                e[4..8].copy_from_slice(&len.to_le_bytes());
                self.space
                    .write_bytes(AddrKind::Ring, r.used + 4 + 8 * uslot, &e)?;
                *used_idx = used_idx.wrapping_add(1);
                self.space
                    .store_u16_release(AddrKind::Ring, r.used + 2, *used_idx)?;
                self.last_avail = self.last_avail.wrapping_add(1);
                done += 1;
            }
        }
        if done > 0 {
            let mut f = [0u8; 2];
            self.space.read_bytes(AddrKind::Ring, r.avail, &mut f)?;
            if u16::from_le_bytes(f) & ring::AVAIL_F_NO_INTERRUPT == 0 {
                self.signal();
            }
        }
        Ok(())
    }

    fn signal(&self) {
        let call = self.shared.call.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = call.as_ref() {
            let v = 1u64;
            // SAFETY: writes 8 bytes to the eventfd.
            unsafe { libc::write(c.as_raw_fd(), (&v as *const u64).cast(), 8) };
        }
    }

    /// Walks a chain; a loop or an out-of-range index makes it bad.
    fn walk(&self, head: u16) -> Result<Chain, AccessError> {
        let r = self.ring;
        let mut out = Vec::new();
        let mut i = head;
        loop {
            if i >= r.num || out.len() >= usize::from(r.num) {
                return Ok(Chain::Bad);
            }
            let mut d = [0u8; 16];
            self.space
                .read_bytes(AddrKind::Ring, r.desc + 16 * u64::from(i), &mut d)?;
            let addr = u64::from_le_bytes(d[0..8].try_into().expect("8"));
            let len = u32::from_le_bytes(d[8..12].try_into().expect("4"));
            let flags = u16::from_le_bytes([d[12], d[13]]);
            let next = u16::from_le_bytes([d[14], d[15]]);
            if flags & desc::F_INDIRECT != 0 {
                return Ok(Chain::Bad);
            }
            out.push(Desc { addr, len, flags });
            if flags & desc::F_NEXT == 0 {
                return Ok(Chain::Ok(out));
            }
            i = next;
        }
    }

    /// Serves one chain; returns the used length. Only a cancelled access
    /// (the rings stopping) is an error: every other failure completes the
    /// request.
    fn serve(&self, head: u16) -> Result<u32, AccessError> {
        let c = &self.counters;
        let chain = match self.walk(head) {
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
        let n = chain.len();
        let hdr_ok = chain[0].flags & desc::F_WRITE == 0 && chain[0].len as usize >= HDR_LEN;
        let st = &chain[n - 1];
        if n < 2 || !hdr_ok || st.flags & desc::F_WRITE == 0 || st.len == 0 {
            c.bad_chains.fetch_add(1, Ordering::Relaxed);
            return Ok(0);
        }
        // Ask for every missing page of the request at once: the header and
        // device-read data, then the device-written data and status.
        let seg = |d: &Desc| (d.addr, u64::from(d.len));
        self.space.prefetch(
            &mut chain
                .iter()
                .filter(|d| d.flags & desc::F_WRITE == 0)
                .map(seg),
            false,
        );
        self.space.prefetch(
            &mut chain
                .iter()
                .filter(|d| d.flags & desc::F_WRITE != 0)
                .map(seg),
            true,
        );
        let mut h = [0u8; HDR_LEN];
        let (status, written) = match self
            .space
            .read_bytes(AddrKind::Buffer, chain[0].addr, &mut h)
        {
            Err(e @ AccessError::Cancelled { .. }) => return Err(e),
            Err(_) => (sb::S_IOERR, 0),
            Ok(()) => self.request(BlkHeader::decode(&h), &chain[1..n - 1])?,
        };
        let at = st.addr.checked_add(u64::from(st.len) - 1);
        let wrote = match at {
            Some(a) => self.space.write_bytes(AddrKind::Buffer, a, &[status]),
            None => Err(AccessError::Wraps {
                iova: st.addr,
                len: u64::from(st.len),
            }),
        };
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
                    r = self.space.write_bytes(AddrKind::Buffer, d.addr, &left[..k]);
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
            self.space
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
