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
//! A back-end that does not block (`null`, `memory`: its
//! [`BlkBackend::blocks`] is false) runs the whole turn inside one
//! translation section of the unit: every access of the batch completes
//! before a driver's invalidation wait does. A blocking one (`file`, and
//! any back-end that does not say otherwise) must not hold a section across a `pread` (every invalidation
//! wait on the unit would wait for the disk), so each request runs its
//! DMA before the I/O in one section and its DMA after in another; a
//! buffer unmapped in between faults, as on hardware.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use softiommu::hw::Access;

use super::backend::BlkBackend;
use super::request::{BlkLimits, BlkOp, BlkPlan, RequestError};
use super::serve::{BlkRequests, Completed, Prepared, ServeError};
use super::slow::{
    device_priority, due_with_bandwidth, precise_timers, Held, HeldQueue, SlowRegion, DUE_SPIN,
};
use super::stats::{bump, Counters, RequestLog, RequestRecord};
use crate::dma_side::{DmaFence, DmaSide};
use crate::spec::blk;
use crate::transport::{ChainDir, DeviceEnd, DeviceError, DeviceQueue};

/// What a worker is built from.
pub(crate) struct WorkerParts<S: DmaSide> {
    /// What the rings are reached through.
    pub(crate) ring: S::Ring,
    /// How a turn is held against invalidations.
    pub(crate) fence: S::Fence,
    /// What buffers move through.
    pub(crate) dma: S::Dma,
    pub(crate) backend: Arc<dyn BlkBackend>,
    pub(crate) limits: BlkLimits,
    pub(crate) queues: Vec<u16>,
    pub(crate) queue_max: u16,
    pub(crate) batch: usize,
    pub(crate) slow: Option<SlowRegion>,
    pub(crate) counters: Arc<CachePadded<Counters>>,
    pub(crate) log: Arc<RequestLog>,
    pub(crate) id: [u8; blk::ID_BYTES],
}

/// What one turn did.
#[derive(Debug, Default, Clone, Copy)]
struct Turn {
    used: usize,
    more: bool,
    next_due: Option<Instant>,
}

pub(crate) struct Worker<S: DmaSide> {
    p: WorkerParts<S>,
    mask: u64,
    blocking: bool,
    held: Vec<HeldQueue>,
    notify_on: Vec<bool>,
    req: BlkRequests,
}

/// Runs `f` inside a section of `fence` when one is given.
fn scoped<F: DmaFence, R>(fence: Option<&F>, mut f: impl FnMut() -> R) -> R {
    match fence {
        Some(v) => v.section(f),
        None => f(),
    }
}

/// Whether a worker over `backend` runs each request's DMA in sections of
/// its own, none spanning the back-end's I/O: what the back-end says of
/// itself ([`BlkBackend::blocks`]), never its kind's name.
pub(crate) fn runs_blocking(backend: &dyn BlkBackend) -> bool {
    backend.blocks()
}

impl<S: DmaSide> Worker<S> {
    pub(crate) fn new(p: WorkerParts<S>) -> Self {
        let n = p.queues.len();
        let mask = p.queues.iter().fold(0u64, |m, &q| m | 1 << (q & 63));
        let cap = usize::from(p.queue_max);
        let blocking = runs_blocking(&*p.backend);
        let mut req = BlkRequests::new(p.limits, p.id, p.backend.buffer_align());
        req.chain_mut().reserve(cap);
        Self {
            mask,
            blocking,
            held: (0..n)
                .map(|_| HeldQueue::new(if p.slow.is_some() { cap } else { 0 }))
                .collect(),
            notify_on: vec![true; n],
            req,
            p,
        }
    }

    pub(crate) fn mask(&self) -> u64 {
        self.mask
    }

    /// Whether the controller's misses raise page requests (it was
    /// attached to an `IopfDomain`).
    fn may_fault(&self) -> bool {
        self.p.fence.may_fault()
    }

    pub(crate) fn run(mut self, end: &DeviceEnd, stop: &AtomicBool, idle_wait: Duration) {
        let view = self.p.fence.clone();
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
                q.enable_notification(&self.p.ring).map(|p| pending |= p)
            } else {
                q.disable_notification(&self.p.ring)
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
    fn turn(&mut self, end: &DeviceEnd, view: Option<&S::Fence>) -> Turn {
        let mut t = Turn::default();
        let features = end.features();
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
                let head = match q.pop(&self.p.ring) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        fail(end, q, e);
                        break;
                    }
                };
                match self.serve(q, k, head, features, view) {
                    Ok(true) => used += 1,
                    Ok(false) => {}
                    Err(e) => {
                        fail(end, q, e);
                        break;
                    }
                }
            }
            if used > 0 && q.is_stopped() {
                // A later chain stopped the queue: the ones completed
                // before it are announced all the same (§2.7.7.2; a driver
                // reads its used ring on the used-buffer interrupt alone),
                // and the driver's flag, a hint, may be what faulted.
                end.queue_interrupt(qi);
            } else if used > 0 {
                match q.interrupt_wanted(&self.p.ring) {
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
            if let Err(e) = q.add_used(&self.p.ring, h.head, h.len) {
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
        features: u64,
        view: Option<&S::Fence>,
    ) -> Result<bool, DeviceError> {
        let arrived = Instant::now();
        let mut prep = scoped(view, || self.prepare(q, head, features))?;
        self.req.io(&*self.p.backend, &mut prep);
        if matches!(prep.error(), Some(RequestError::Backend { .. })) {
            bump(&self.p.counters.io_errors, 1);
        }
        scoped(view, || self.complete(q, k, head, prep.clone(), arrived))
    }

    /// Walks the chain, reads and checks the header, gathers a write's
    /// data.
    fn prepare(
        &mut self,
        q: &DeviceQueue,
        head: u16,
        features: u64,
    ) -> Result<Prepared, DeviceError> {
        q.walk(
            &self.p.ring,
            head,
            ChainDir::ReadableThenWritable,
            self.req.chain_mut(),
        )?;
        self.req
            .prepare(&mut self.p.dma, features)
            .map_err(|e| serve_error(q.index(), head, e))
    }

    /// Moves a read's data to memory, writes the status byte, returns (or
    /// holds) the chain.
    fn complete(
        &mut self,
        q: &mut DeviceQueue,
        k: usize,
        head: u16,
        prep: Prepared,
        arrived: Instant,
    ) -> Result<bool, DeviceError> {
        let done = match self.req.finish(&mut self.p.dma, prep) {
            Ok(d) => d,
            Err(ServeError::Status { iova, fault, done }) => {
                self.record(q.index(), head, done);
                return Err(DeviceError::DmaFault {
                    queue: q.index(),
                    what: "status byte",
                    iova,
                    access: Access::Write,
                    reason: fault.to_string(),
                });
            }
            Err(e) => return Err(serve_error(q.index(), head, e)),
        };
        let (status, len, plan) = (done.status, done.used_len, done.plan);
        self.record(q.index(), head, done);
        if let (Some(slow), Some(plan)) = (self.p.slow, plan) {
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
        q.add_used(&self.p.ring, head, len)?;
        bump(&self.p.counters.requests, 1);
        Ok(true)
    }

    /// Counts a completed request, and logs it when it failed.
    fn record(&self, queue: u16, head: u16, done: Completed) {
        if let Some(plan) = done.plan {
            self.count(plan);
        }
        if let Some(e) = done.error {
            bump(&self.p.counters.request_errors, 1);
            if matches!(e, RequestError::DmaFault { .. }) {
                bump(&self.p.counters.dma_faults, 1);
            }
            self.p.log.record(RequestRecord {
                queue,
                head,
                error: e,
            });
        }
    }

    fn count(&self, plan: BlkPlan) {
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

/// The queue error for a chain the request code could not complete (an
/// aborted access — the device being stopped — breaks the queue too: the
/// device is going away).
fn serve_error<F: std::error::Error>(queue: u16, head: u16, e: ServeError<F>) -> DeviceError {
    match e {
        ServeError::Shape { readable, writable } => DeviceError::BlkRequestShape {
            queue,
            head,
            readable,
            writable,
        },
        ServeError::Status { iova, fault, .. } => DeviceError::DmaFault {
            queue,
            what: "status byte",
            iova,
            access: Access::Write,
            reason: fault.to_string(),
        },
        ServeError::Aborted {
            iova,
            access,
            fault,
        } => DeviceError::DmaFault {
            queue,
            what: "request",
            iova,
            access,
            reason: fault.to_string(),
        },
    }
}

/// Records `e`, stops the queue and asks for a reset.
fn fail(end: &DeviceEnd, q: &mut DeviceQueue, e: DeviceError) {
    q.stop();
    end.report(e);
}
