//! One device thread of a virtio-blk device: it serves a fixed group of
//! request queues (queue `q` goes to worker `q % workers`), each turn one
//! bounded batch per queue.
//!
//! # A request
//!
//! Pop a chain; walk it (readable descriptors, then writable, at most
//! queue-size deep); read the 16-byte header through the IOMMU; check the
//! request ([`request::check`]); for a write, gather the data through the
//! IOMMU into the worker's buffer; do the back-end I/O; for a read,
//! scatter the data through the IOMMU; write the status byte; return the
//! chain on the used ring (or hold it, in the slow region). Data and
//! header faults fail the request (`VIRTIO_BLK_S_IOERR`); ring faults and
//! a status byte the device cannot write break the queue
//! (`DEVICE_NEEDS_RESET`).
//!
//! # Sections
//!
//! A back-end that does not block (`null`, `memory`) runs the whole turn
//! inside one translation section of the unit: every access of the batch
//! completes before a driver's invalidation wait does. A blocking one
//! (`file`) must not hold a section across a `pread` (every invalidation
//! wait on the unit would wait for the disk), so each request runs its
//! DMA before the I/O in one section and its DMA after in another; a
//! buffer unmapped in between faults, as on hardware.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use softiommu::access::{DmaAccessor, DmaAttrs, UnitIommu};
use softiommu::hw::Access;

use super::backend::{AlignedBuf, BlkBackend};
use super::request::{self, BlkHeader, BlkOp, Limits, Plan, RequestError, Shape};
use super::slow::{
    device_priority, due_with_bandwidth, precise_timers, Held, HeldQueue, SlowRegion, DUE_SPIN,
};
use super::stats::{bump, Counters, RequestLog, RequestRecord};
use crate::spec::blk;
use crate::transport::{ChainDesc, ChainDir, DeviceEnd, DeviceError, DeviceMemory, DeviceQueue};

/// What a worker is built from.
#[derive(Debug)]
pub(crate) struct WorkerParts {
    pub(crate) mem: DeviceMemory,
    pub(crate) view: UnitIommu,
    /// The system, to see whether the device may fault (IOPF mode).
    pub(crate) system: Arc<softiommu::hw::System>,
    pub(crate) dma: DmaAccessor,
    pub(crate) attrs: DmaAttrs,
    pub(crate) backend: Arc<dyn BlkBackend>,
    pub(crate) limits: Limits,
    pub(crate) queues: Vec<u16>,
    pub(crate) queue_max: u16,
    pub(crate) batch: usize,
    pub(crate) slow: Option<SlowRegion>,
    pub(crate) counters: Arc<CachePadded<Counters>>,
    pub(crate) log: Arc<RequestLog>,
    pub(crate) id: [u8; blk::ID_BYTES],
}

/// A request checked and ready for its I/O.
#[derive(Debug, Clone, Copy)]
struct Prepared {
    shape: Shape,
    plan: Result<Plan, ()>,
}

/// What one turn did.
#[derive(Debug, Default, Clone, Copy)]
struct Turn {
    used: usize,
    more: bool,
    next_due: Option<Instant>,
}

pub(crate) struct Worker {
    p: WorkerParts,
    mask: u64,
    blocking: bool,
    held: Vec<HeldQueue>,
    notify_on: Vec<bool>,
    chain: Vec<ChainDesc>,
    segs: Vec<(u64, u32)>,
    scratch: AlignedBuf,
    /// The error of the request in hand, when it failed.
    failed: Option<RequestError>,
}

/// Runs `f` inside a section of `view` when one is given (falling back to
/// running it bare if the unit has no translator for the thread).
fn scoped<R>(view: Option<&UnitIommu>, mut f: impl FnMut() -> R) -> R {
    match view {
        Some(v) => v.section(&mut f).unwrap_or_else(|_| f()),
        None => f(),
    }
}

fn fault(iova: u64, access: Access, e: impl std::fmt::Display) -> RequestError {
    RequestError::DmaFault {
        iova,
        access,
        reason: e.to_string(),
    }
}

impl Worker {
    pub(crate) fn new(p: WorkerParts) -> Self {
        let n = p.queues.len();
        let mask = p.queues.iter().fold(0u64, |m, &q| m | 1 << (q & 63));
        let cap = usize::from(p.queue_max);
        let blocking = p.backend.kind() == "file";
        let scratch = AlignedBuf::new(p.limits.max_bytes as usize, p.backend.buffer_align());
        Self {
            mask,
            blocking,
            held: (0..n)
                .map(|_| HeldQueue::new(if p.slow.is_some() { cap } else { 0 }))
                .collect(),
            notify_on: vec![true; n],
            chain: Vec::with_capacity(cap),
            segs: Vec::with_capacity(cap),
            scratch,
            failed: None,
            p,
        }
    }

    pub(crate) fn mask(&self) -> u64 {
        self.mask
    }

    /// Whether the controller's misses raise page requests (it was
    /// attached to an `IopfDomain`).
    fn may_fault(&self) -> bool {
        crate::iopf_mode::may_fault(&self.p.system, self.p.view.source_id())
    }

    pub(crate) fn run(mut self, end: &DeviceEnd, stop: &AtomicBool, idle_wait: Duration) {
        let view = self.p.view.clone();
        if self.p.slow.is_some() {
            // Held chains fall due at deadlines: sleeps must end on time,
            // and the thread must get a CPU then.
            precise_timers();
            device_priority();
        }
        while !stop.load(Ordering::Acquire) {
            let _ = end.take_notified_in(self.mask);
            let t = if self.may_fault() {
                // IOPF mode: no section spans the turn, so that each
                // access that faults can wait for its page request's
                // answer (inside a section it could not; every access
                // still translates in a section of its own).
                self.turn(end, None)
            } else if self.blocking {
                self.turn(end, Some(&view))
            } else {
                scoped(Some(&view), || self.turn(end, None))
            };
            if t.used > 0 {
                bump(&self.p.counters.batches, 1);
            }
            if t.used > 0 || t.more {
                // Busy: poll, with the driver's kicks suppressed.
                self.set_notify(end, false);
                continue;
            }
            // Idle: ask to be notified, look once more, then sleep (until
            // a kick, the next held chain's time, or the idle timeout).
            if self.set_notify(end, true) {
                continue;
            }
            let mut wait = idle_wait;
            if let Some(d) = t.next_due {
                let left = d.saturating_duration_since(Instant::now());
                if left <= DUE_SPIN {
                    // Close to a deadline: poll for it (a sleep would end
                    // a wake-up latency after it).
                    std::thread::yield_now();
                    continue;
                }
                wait = wait.min(left - DUE_SPIN);
            }
            bump(&self.p.counters.sleeps, 1);
            std::thread::park_timeout(wait);
        }
    }

    /// Enables (`on`) or suppresses the driver's notifications on every
    /// live queue of the worker; when enabling, returns whether chains
    /// arrived meanwhile.
    fn set_notify(&mut self, end: &DeviceEnd, on: bool) -> bool {
        let mut pending = false;
        for (k, &qi) in self.p.queues.iter().enumerate() {
            let Some(cur) = self.notify_on.get_mut(k) else {
                continue;
            };
            if *cur == on {
                continue;
            }
            let Some(mut slot) = end.queue(qi) else {
                continue;
            };
            let Some(q) = slot.as_mut() else {
                // Not live: a new queue starts with notifications on.
                *cur = true;
                continue;
            };
            let r = if on {
                q.enable_notification(&self.p.mem).map(|p| pending |= p)
            } else {
                q.disable_notification(&self.p.mem)
            };
            match r {
                Ok(()) => *cur = on,
                Err(e) => fail(end, q, e),
            }
        }
        pending
    }

    /// One batch per queue. `view`: run each request's DMA in sections of
    /// its own (a blocking back-end); `None`: the caller holds one.
    fn turn(&mut self, end: &DeviceEnd, view: Option<&UnitIommu>) -> Turn {
        let mut t = Turn::default();
        let flush = end.features() & 1 << blk::F_FLUSH != 0;
        for k in 0..self.p.queues.len() {
            let qi = self.p.queues[k];
            let Some(mut slot) = end.queue(qi) else {
                continue;
            };
            let Some(q) = slot.as_mut() else {
                self.held[k].adopt(0);
                continue;
            };
            self.held[k].adopt(q.generation());
            let mut used = self.release_due(end, q, k);
            for i in 0..=self.p.batch {
                if q.is_stopped() {
                    break;
                }
                if i == self.p.batch {
                    t.more |= q.known_pending();
                    break;
                }
                let head = match q.pop(&self.p.mem) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        fail(end, q, e);
                        break;
                    }
                };
                match self.serve(q, k, head, flush, view) {
                    Ok(true) => used += 1,
                    Ok(false) => {}
                    Err(e) => {
                        fail(end, q, e);
                        break;
                    }
                }
            }
            if used > 0 && !q.is_stopped() {
                match q.interrupt_wanted(&self.p.mem) {
                    Ok(true) => end.queue_interrupt(qi),
                    Ok(false) => {}
                    Err(e) => fail(end, q, e),
                }
            }
            t.used += used;
            if let Some(d) = self.held[k].next_due() {
                t.next_due = Some(t.next_due.map_or(d, |n| n.min(d)));
            }
        }
        t
    }

    /// Returns the held chains of queue `k` whose time has come.
    fn release_due(&mut self, end: &DeviceEnd, q: &mut DeviceQueue, k: usize) -> usize {
        if self.held[k].next_due().is_none() {
            return 0;
        }
        let now = Instant::now();
        let mut n = 0;
        while let Some(h) = self.held[k].pop_due(now) {
            if let Err(e) = q.add_used(&self.p.mem, h.head, h.len) {
                fail(end, q, e);
                break;
            }
            bump(&self.p.counters.requests, 1);
            bump(&self.p.counters.released, 1);
            let ns = now.saturating_duration_since(h.arrived).as_nanos();
            bump(
                &self.p.counters.held_ns,
                u64::try_from(ns).unwrap_or(u64::MAX),
            );
            n += 1;
        }
        n
    }

    /// Serves the chain at `head`; `Ok(false)` when it is held back.
    fn serve(
        &mut self,
        q: &mut DeviceQueue,
        k: usize,
        head: u16,
        flush: bool,
        view: Option<&UnitIommu>,
    ) -> Result<bool, DeviceError> {
        let arrived = Instant::now();
        let prep = scoped(view, || self.prepare(q, head, flush))?;
        let plan = match prep.plan {
            Ok(plan) => self.io(plan),
            Err(()) => Err(()),
        };
        scoped(view, || {
            self.complete(q, k, head, prep.shape, plan, arrived)
        })
    }

    /// Walks the chain, reads and checks the header, gathers a write's
    /// data. A request error is kept in `self.failed`.
    fn prepare(
        &mut self,
        q: &DeviceQueue,
        head: u16,
        flush: bool,
    ) -> Result<Prepared, DeviceError> {
        self.failed = None;
        q.walk(
            &self.p.mem,
            head,
            ChainDir::ReadableThenWritable,
            &mut self.chain,
        )?;
        let Some(shape) = request::shape(&self.chain) else {
            let (mut readable, mut writable) = (0u64, 0u64);
            for d in &self.chain {
                let n = u64::from(d.len);
                if d.writable {
                    writable = writable.saturating_add(n);
                } else {
                    readable = readable.saturating_add(n);
                }
            }
            return Err(DeviceError::BlkRequestShape {
                queue: q.index(),
                head,
                readable,
                writable,
            });
        };
        let plan = self.decode(&shape, flush).map_err(|e| {
            self.failed = Some(e);
        });
        Ok(Prepared { shape, plan })
    }

    fn decode(&mut self, shape: &Shape, flush: bool) -> Result<Plan, RequestError> {
        let mut hb = [0u8; blk::HDR_LEN];
        let mut got = 0usize;
        for d in self.chain.iter().filter(|d| !d.writable) {
            if got == hb.len() {
                break;
            }
            let n = (d.len as usize).min(hb.len() - got);
            self.p
                .dma
                .read(d.addr, &mut hb[got..got + n], self.p.attrs)
                .map_err(|e| fault(d.addr, Access::Read, e))?;
            got += n;
        }
        let h = BlkHeader::decode(&hb);
        let op = BlkOp::from_type(h.type_).ok_or(RequestError::Unsupported { type_: h.type_ })?;
        let len = request::data_segments(&self.chain, shape, op.device_writes(), &mut self.segs);
        let lim = Limits {
            flush,
            ..self.p.limits
        };
        let plan = request::check(&h, shape, &self.segs, len, &lim)?;
        if plan.op == BlkOp::Write {
            let buf = self.scratch.get_mut(plan.len as usize);
            let mut off = 0usize;
            for &(addr, n) in &self.segs {
                let n = n as usize;
                self.p
                    .dma
                    .read(addr, &mut buf[off..off + n], self.p.attrs)
                    .map_err(|e| fault(addr, Access::Read, e))?;
                off += n;
            }
        }
        Ok(plan)
    }

    /// The back-end I/O of a checked request (outside any section).
    fn io(&mut self, plan: Plan) -> Result<Plan, ()> {
        let len = plan.len as usize;
        let (op, r) = match plan.op {
            BlkOp::Read => (
                "read",
                self.p
                    .backend
                    .read_at(plan.offset, self.scratch.get_mut(len)),
            ),
            BlkOp::Write => (
                "write",
                self.p
                    .backend
                    .write_at(plan.offset, self.scratch.get_mut(len)),
            ),
            BlkOp::Flush => ("flush", self.p.backend.flush()),
            BlkOp::GetId => return Ok(plan),
        };
        r.map(|()| plan).map_err(|e| {
            bump(&self.p.counters.io_errors, 1);
            self.failed = Some(RequestError::Backend {
                op,
                offset: plan.offset,
                len: plan.len,
                reason: e.to_string(),
            });
        })
    }

    /// Moves a read's data to memory, writes the status byte, returns (or
    /// holds) the chain.
    fn complete(
        &mut self,
        q: &mut DeviceQueue,
        k: usize,
        head: u16,
        shape: Shape,
        plan: Result<Plan, ()>,
        arrived: Instant,
    ) -> Result<bool, DeviceError> {
        let mut written = 0u64;
        if let Ok(plan) = plan {
            let r = match plan.op {
                BlkOp::Read => self.scatter(plan.len as usize, false),
                BlkOp::GetId => self.scatter(plan.len as usize, true),
                BlkOp::Write | BlkOp::Flush => Ok(()),
            };
            match r {
                Ok(()) => {
                    written = if plan.op.device_writes() { plan.len } else { 0 };
                    self.count(plan);
                }
                Err(e) => self.failed = Some(e),
            }
        }
        let status = match self.failed.take() {
            None => blk::S_OK,
            Some(e) => {
                written = 0;
                bump(&self.p.counters.request_errors, 1);
                if matches!(e, RequestError::DmaFault { .. }) {
                    bump(&self.p.counters.dma_faults, 1);
                }
                let status = e.status();
                self.p.log.record(RequestRecord {
                    queue: q.index(),
                    head,
                    error: e,
                });
                status
            }
        };
        self.p
            .dma
            .write(shape.status, &[status], self.p.attrs)
            .map_err(|e| DeviceError::DmaFault {
                queue: q.index(),
                what: "status byte",
                iova: shape.status,
                access: Access::Write,
                reason: e.to_string(),
            })?;
        let len = u32::try_from(written + 1).unwrap_or(u32::MAX);
        if let (Some(slow), Ok(plan)) = (self.p.slow, plan) {
            let slow_io = matches!(plan.op, BlkOp::Read | BlkOp::Write)
                && plan.offset / blk::SECTOR_SIZE >= slow.from_sector;
            let due = due_with_bandwidth(
                arrived,
                slow.hold,
                plan.len,
                slow.bytes_per_sec,
                self.held[k].last_due(),
            );
            if let (true, blk::S_OK, Some(due)) = (slow_io, status, due) {
                let held = Held {
                    head,
                    len,
                    arrived,
                    due,
                };
                if self.held[k].push(held) {
                    bump(&self.p.counters.held, 1);
                    return Ok(false);
                }
            }
        }
        q.add_used(&self.p.mem, head, len)?;
        bump(&self.p.counters.requests, 1);
        Ok(true)
    }

    /// Copies the first `len` bytes of the worker's buffer (or of the id
    /// string) into the data segments through the IOMMU.
    fn scatter(&mut self, len: usize, id: bool) -> Result<(), RequestError> {
        let idb = self.p.id;
        let src: &[u8] = if id {
            &idb[..len.min(blk::ID_BYTES)]
        } else {
            self.scratch.get_mut(len)
        };
        let mut off = 0usize;
        for &(addr, n) in &self.segs {
            let n = (n as usize).min(src.len() - off);
            if n == 0 {
                break;
            }
            self.p
                .dma
                .write(addr, &src[off..off + n], self.p.attrs)
                .map_err(|e| fault(addr, Access::Write, e))?;
            off += n;
        }
        Ok(())
    }

    fn count(&self, plan: Plan) {
        let c = &self.p.counters;
        match plan.op {
            BlkOp::Read => {
                bump(&c.reads, 1);
                bump(&c.read_bytes, plan.len);
            }
            BlkOp::Write => {
                bump(&c.writes, 1);
                bump(&c.write_bytes, plan.len);
            }
            BlkOp::Flush => bump(&c.flushes, 1),
            BlkOp::GetId => {}
        }
    }
}

/// Records `e`, stops the queue and asks for a reset.
fn fail(end: &DeviceEnd, q: &mut DeviceQueue, e: DeviceError) {
    q.stop();
    end.report(e);
}
