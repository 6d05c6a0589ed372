//! The driver's side of the invalidation queue: writing descriptors at the
//! tail, ringing the doorbell, and waiting for completion.
//!
//! Two levels:
//!
//! - **Register level**, as a driver of the real hardware: write 128-bit
//!   descriptors into the ring ([`Unit::queue_registers`] gives its base)
//!   and move the tail ([`Unit::write_tail`]), or let [`Unit::submit_raw`]
//!   do both; poll a status word of your own.
//! - **Convenience**: [`Unit::invalidate_pages`] and friends queue one
//!   descriptor; [`Unit::wait`] queues a wait descriptor (IF set, no status
//!   write) that completes a ticket in the unit's private completion word,
//!   and returns when it has; [`Unit::batch`] collects many descriptors and
//!   ends them with one wait (deferred flushing: many unmaps, one
//!   completion).
//!
//! Tickets are handed out in queue order, so a completion word holding
//! ticket `t` means every wait up to `t` completed. A ticket whose wait sat
//! behind a descriptor that raised a queue error fails (its waiter gets
//! [`QiError::Stopped`]), even if the queue later resumes. Descriptors
//! queued through these calls run as given even if the ring's bytes are
//! overwritten meanwhile (see `inv_queue` on the shadow).

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::descriptor::{covering_mask, InvDescriptor};
use super::error::QiError;
use super::inv_queue::{QueueFault, QueueRecovery, QueueRegisters};
use super::processor::TicketState;
use super::unit::{QueueMode, Shared, Unit};
use crate::hw::IqeReason;
use crate::sync::Backoff;
use crate::sync::{lock_std as lock, try_lock_std};

/// Descriptors collected to be queued together, usually ended by one wait.
/// Made by [`Unit::batch`].
#[derive(Debug)]
pub struct InvBatch<'a> {
    unit: &'a Unit,
    descs: Vec<InvDescriptor>,
}

impl InvBatch<'_> {
    /// Adds a descriptor.
    pub fn push(&mut self, d: InvDescriptor) -> &mut Self {
        self.descs.push(d);
        self
    }

    /// Adds a global IOTLB invalidation.
    pub fn global(&mut self) -> &mut Self {
        self.push(InvDescriptor::iotlb_global())
    }

    /// Adds a domain-selective IOTLB invalidation.
    pub fn domain(&mut self, did: u16) -> &mut Self {
        self.push(InvDescriptor::iotlb_domain(did))
    }

    /// Adds a page-selective IOTLB invalidation of 2^`am` pages.
    pub fn pages(&mut self, did: u16, iova: u64, am: u8, ih: bool) -> &mut Self {
        self.push(InvDescriptor::iotlb_pages(did, iova, am, ih))
    }

    /// Adds what invalidates `[iova, iova + len)` of `did`: one
    /// page-selective descriptor covering it, or a domain-selective one if
    /// the covering mask would exceed the unit's maximum.
    pub fn range(&mut self, did: u16, iova: u64, len: u64) -> &mut Self {
        let d = match covering_mask(iova, len, self.unit.shared.limits.mamv) {
            Some((addr, am)) => InvDescriptor::iotlb_pages(did, addr, am, false),
            None => InvDescriptor::iotlb_domain(did),
        };
        self.push(d)
    }

    /// Descriptors collected.
    pub fn len(&self) -> usize {
        self.descs.len()
    }

    /// Whether none were collected.
    pub fn is_empty(&self) -> bool {
        self.descs.is_empty()
    }

    /// Queues the descriptors and rings the doorbell, without waiting.
    pub fn submit(self) -> Result<(), QiError> {
        with_encoded(&self.descs, |raw| self.unit.enqueue(raw, false)).map(|_| ())
    }

    /// Queues the descriptors and one wait, and returns when the wait has
    /// completed: every descriptor is done and no translation that began
    /// before them can still return, or still use, what they invalidated.
    pub fn wait(self) -> Result<(), QiError> {
        match with_encoded(&self.descs, |raw| self.unit.enqueue(raw, true))? {
            Some(t) => self.unit.wait_ticket(t),
            None => Ok(()),
        }
    }

    /// As [`wait`](Self::wait), but gives up after `timeout` — counted
    /// from the call, queueing included (a full ring behind a stalled
    /// wait is waited for within the same bound) — with
    /// [`QiError::InvalidationTimeout`]. A wait stalls only on its drain:
    /// a translation section that began before it and is still open (a
    /// device parked or hostile inside one). On a timeout the descriptors
    /// may be queued, or queued in part, and complete later; nothing
    /// about them is promised: the caller must act as if they never
    /// ran (keep what they were to make unreachable out of every
    /// device's reach by other means, and never free it).
    pub fn wait_timeout(self, timeout: Duration) -> Result<(), QiError> {
        self.wait_bounded(timeout, || false)
    }

    /// As [`wait_timeout`](Self::wait_timeout), and gives up early, with
    /// [`QiError::WaitAbandoned`], once `give_up` returns `true` (a
    /// stopping caller's flag). `give_up` is called about every
    /// millisecond while the wait is blocked, sometimes with a lock of the
    /// unit held: it must be cheap and must not call into the unit.
    pub fn wait_bounded(
        self,
        timeout: Duration,
        mut give_up: impl FnMut() -> bool,
    ) -> Result<(), QiError> {
        let mut limit = Limit::new(timeout, &mut give_up);
        let ticket = with_encoded(&self.descs, |raw| {
            self.unit.enqueue_then(raw, true, || {}, Some(&mut limit))
        })?;
        match ticket {
            Some(t) => self.unit.wait_ticket_until(t, Some(&mut limit)),
            None => Ok(()),
        }
    }
}

/// How long a bounded wait sleeps between looks at its deadline and its
/// caller's `give_up`.
const BOUNDED_SLICE: Duration = Duration::from_millis(1);

/// The bound of a bounded wait: a deadline, and the caller's wish to stop.
pub(crate) struct Limit<'a> {
    deadline: Option<Instant>,
    timeout: Duration,
    give_up: &'a mut dyn FnMut() -> bool,
}

impl<'a> Limit<'a> {
    /// `timeout` from now (a timeout too large for the clock never
    /// passes; `give_up` is still heard).
    pub(crate) fn new(timeout: Duration, give_up: &'a mut dyn FnMut() -> bool) -> Self {
        Self {
            deadline: Instant::now().checked_add(timeout),
            timeout,
            give_up,
        }
    }

    /// Fails if the caller gave up or the deadline passed.
    pub(crate) fn check(&mut self) -> Result<(), QiError> {
        if (self.give_up)() {
            return Err(QiError::WaitAbandoned);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(QiError::InvalidationTimeout {
                timeout: self.timeout,
            });
        }
        Ok(())
    }
}

/// Encodes `descs` and hands them to `f`: on the stack for the usual few
/// (an unmap's invalidation is one descriptor, a wait another), on the heap
/// beyond, so that a strict unmap allocates nothing here.
fn with_encoded<R>(descs: &[InvDescriptor], f: impl FnOnce(&[[u64; 2]]) -> R) -> R {
    const ON_STACK: usize = 4;
    if descs.len() <= ON_STACK {
        let mut buf = [[0u64; 2]; ON_STACK];
        for (b, d) in buf.iter_mut().zip(descs) {
            *b = d.encode();
        }
        #[allow(clippy::indexing_slicing)] // `descs.len() <= ON_STACK`, checked above.
        f(&buf[..descs.len()])
    } else {
        let raw: Vec<[u64; 2]> = descs.iter().map(InvDescriptor::encode).collect();
        f(&raw)
    }
}

impl Shared {
    /// Fails if the queue cannot carry a descriptor now: it is stopped
    /// (`Stopped`, with its fault) or the unit is shutting down.
    pub(crate) fn check_queue(&self) -> Result<(), QiError> {
        if self.queue.stopped() {
            return Err(self.stopped_error());
        }
        if self.shutdown.load(Ordering::Acquire) {
            return Err(QiError::ShutDown);
        }
        Ok(())
    }

    /// Whether ticket `t`'s wait has completed (`true`) or may still
    /// (`false`); fails if it failed, or if the queue stopped or the unit
    /// shut down first (no pass will complete it).
    pub(crate) fn ticket_outcome(&self, t: u32) -> Result<bool, QiError> {
        match self.ticket_state(t) {
            TicketState::Done => Ok(true),
            TicketState::Failed(f) => Err(QiError::Stopped(f)),
            TicketState::Pending if self.queue.stopped() => Err(self.stopped_error()),
            TicketState::Pending if self.shutdown.load(Ordering::Acquire) => Err(QiError::ShutDown),
            TicketState::Pending => Ok(false),
        }
    }

    /// The error to report for a stopped queue.
    fn stopped_error(&self) -> QiError {
        QiError::Stopped(self.queue.fault().unwrap_or(QueueFault {
            head: self.queue.head(),
            raw: [0, 0],
            reason: IqeReason::Fetch,
        }))
    }
}

impl Unit {
    /// Queues `descs` and rings the doorbell (in inline mode, they are done
    /// when this returns unless a wait ahead of them is stalled on a drain;
    /// in thread mode, soon). Completion is known only through a wait.
    pub fn submit(&self, descs: &[InvDescriptor]) -> Result<(), QiError> {
        with_encoded(descs, |raw| self.enqueue(raw, false)).map(|_| ())
    }

    /// Queues raw 128-bit descriptors as they are: the way to hand the unit
    /// malformed ones. A bad one stops the queue when it is reached.
    pub fn submit_raw(&self, raw: &[[u64; 2]]) -> Result<(), QiError> {
        self.enqueue(raw, false).map(|_| ())
    }

    /// Queues a wait and returns when it completes (see [`InvBatch::wait`]).
    pub fn wait(&self) -> Result<(), QiError> {
        self.batch().wait()
    }

    /// Starts a batch.
    pub fn batch(&self) -> InvBatch<'_> {
        InvBatch {
            unit: self,
            descs: Vec::new(),
        }
    }

    /// Queues a global IOTLB invalidation (no wait). The cached
    /// translations are dropped as soon as the descriptor is queued (see
    /// [`Unit::invalidate_domain`]).
    pub fn invalidate_all(&self) -> Result<(), QiError> {
        let raw = [InvDescriptor::iotlb_global().encode()];
        self.enqueue_then(&raw, false, || self.shared.iotlb.invalidate_global(), None)
            .map(|_| ())
    }

    /// Queues a domain-selective IOTLB invalidation (no wait).
    ///
    /// The domain's cached translations are dropped as soon as the
    /// descriptor is queued, before the queue is processed: a cache may
    /// drop entries at any time, and a generation bump is O(1) and safe
    /// beside fills and lookups (see `iotlb`). This matters when a wait
    /// ahead of it is stalled on a drain, waiting for a device thread the
    /// host's scheduler has descheduled inside a translation: on hardware
    /// that drain takes nanoseconds, here it can take a scheduling slice,
    /// and the descriptor would not run before it (nor, then, would the
    /// deferred policy's stale window end). The descriptor is still
    /// carried out in order (its counters, its modelled latency, the drain
    /// at the next wait), so completion means what it always did.
    pub fn invalidate_domain(&self, did: u16) -> Result<(), QiError> {
        let raw = [InvDescriptor::iotlb_domain(did).encode()];
        self.enqueue_then(&raw, false, || self.drop_cached(did), None)
            .map(|_| ())
    }

    /// Drops every cached translation of domain `did` now, without the
    /// queue: what a queued domain-selective invalidation does first (see
    /// [`Unit::invalidate_domain`]). No lock and no wait; completion (no
    /// translation still using an old entry) is known only through a
    /// queued invalidation and its wait. The deferred policy's timer calls
    /// it for a queue past its age, before it takes any lock that a
    /// descheduled thread may hold.
    pub(crate) fn drop_cached(&self, did: u16) {
        self.shared.iotlb.invalidate_domain(did);
    }

    /// Whether domain `did` has an expiry deadline armed (one load).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn expiry_armed(&self, did: u16) -> bool {
        self.shared.iotlb.deadline(did) != 0
    }

    /// A deferred unmap of domain `did` was queued (call after the push and
    /// a light fence of the unit's barrier): makes sure an expiry deadline
    /// no later than `period` from now is armed before the unmap returns.
    /// A translator that finds it due drops the domain's cached
    /// translations itself, whatever became of the flush that should have
    /// come (see `Iotlb::expire`). One load when one is armed.
    #[inline(always)]
    pub(crate) fn cover_unmap(&self, did: u16, period: impl FnOnce() -> std::time::Duration) {
        self.shared.iotlb.cover_unmap(did, period);
    }

    /// Domain `did`'s expiry deadline word (see `Iotlb::deadline_word`):
    /// it lives as long as this unit's shared state.
    pub(crate) fn deadline_word(&self, did: u16) -> &crate::sync::AtomicU64 {
        self.shared.iotlb.deadline_word(did)
    }

    /// Arms domain `did`'s expiry deadline at `period` from now, unless
    /// one no later is armed (an armed deadline never moves later).
    pub(crate) fn arm_expiry(&self, did: u16, period: std::time::Duration) {
        let tlb = &self.shared.iotlb;
        let p = tlb.clock().ticks(period);
        tlb.arm_deadline_at(did, tlb.clock().now().saturating_add(p), p);
    }

    /// The clearer's first step (see `Iotlb::begin_clear`): the marked
    /// word to hand to [`finish_clear_expiry`](Self::finish_clear_expiry).
    pub(crate) fn begin_clear_expiry(&self, did: u16) -> Option<u64> {
        self.shared.iotlb.begin_clear(did)
    }

    /// The clearer's last step: clears the deadline if it is still
    /// `marked` and `idle`, else removes the mark; whether it cleared.
    pub(crate) fn finish_clear_expiry(&self, did: u16, marked: u64, idle: bool) -> bool {
        self.shared.iotlb.finish_clear(did, marked, idle)
    }

    /// Makes domain `did`'s expiry deadline due now (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn force_expiry_due(&self, did: u16) {
        let tlb = &self.shared.iotlb;
        tlb.force_deadline(did, tlb.clock().now());
    }

    /// Queues a page-selective IOTLB invalidation of the 2^`am` pages
    /// holding `iova` (no wait).
    pub fn invalidate_pages(&self, did: u16, iova: u64, am: u8, ih: bool) -> Result<(), QiError> {
        self.submit(&[InvDescriptor::iotlb_pages(did, iova, am, ih)])
    }

    /// Queues what invalidates `[iova, iova + len)` (see
    /// [`InvBatch::range`]; no wait).
    pub fn invalidate_range(&self, did: u16, iova: u64, len: u64) -> Result<(), QiError> {
        let mut b = self.batch();
        b.range(did, iova, len);
        b.submit()
    }

    /// The queue's registers.
    pub fn queue_registers(&self) -> QueueRegisters {
        self.shared.queue.registers()
    }

    /// Writes the tail register: the doorbell for descriptors a driver
    /// wrote into the ring itself. A tail past the ring, or one in
    /// `[head, current tail)` (a move that would cross the head), raises a
    /// queue error and is not taken.
    pub fn write_tail(&self, tail: u32) -> Result<(), QiError> {
        let sh = &*self.shared;
        sh.check_caller()?;
        {
            let _sub = lock(&sh.submit);
            if sh.queue.ring_from_driver(tail).is_err() {
                sh.note_stop();
                sh.notify_done();
                return Err(sh.stopped_error());
            }
        }
        sh.kick();
        Ok(())
    }

    /// The error that stopped the queue, if it is stopped (`FSTS.IQE` and
    /// `IQERCD_REG`).
    pub fn queue_error(&self) -> Option<QueueFault> {
        self.shared.queue.fault()
    }

    /// Restarts a stopped queue; returns whether it was stopped. With
    /// [`QueueRecovery::Discard`], the waits dropped fail.
    pub fn recover_queue(&self, how: QueueRecovery) -> Result<bool, QiError> {
        let sh = &*self.shared;
        let was = {
            let _sub = lock(&sh.submit);
            let mut p = lock(&sh.proc);
            let fault = sh.queue.fault();
            let was = sh.queue.recover(how)?;
            if was && how == QueueRecovery::Discard {
                // The wait a pass stalled on may be gone with the rest: its
                // drain's snapshot must not stand for a later wait's. And
                // the next wait drains whatever was discarded: a waiter
                // whose invalidation went with it (the cached translations
                // were dropped when it was queued) still learns of no
                // completion before the sections open now have ended.
                p.drain = None;
                p.dirty = true;
            }
            if let (true, QueueRecovery::Discard, Some(f)) = (was, how, fault) {
                sh.fail_outstanding(f);
            }
            was
        };
        sh.kick();
        sh.notify_done();
        Ok(was)
    }

    /// Processes the queue now (inline mode) or wakes the unit thread.
    pub fn process_queue(&self) -> Result<(), QiError> {
        self.shared.check_caller()?;
        self.shared.kick();
        match self.shared.queue.stopped() {
            true => Err(self.shared.stopped_error()),
            false => Ok(()),
        }
    }

    /// Writes `raw` (and, if `wait`, a ticketed wait) at the tail and rings
    /// the doorbell; returns the ticket.
    pub(crate) fn enqueue(&self, raw: &[[u64; 2]], wait: bool) -> Result<Option<u32>, QiError> {
        self.enqueue_then(raw, wait, || {}, None)
    }

    /// [`Unit::enqueue`], running `queued` once the descriptors are in the
    /// ring and the doorbell rung, before the queue is processed (which in
    /// inline mode may wait for another submitter's pass). With a
    /// `limit`, a full ring is waited for only within it (then the
    /// descriptors written so far stay queued, and the error is
    /// returned).
    pub(crate) fn enqueue_then(
        &self,
        raw: &[[u64; 2]],
        wait: bool,
        queued: impl FnOnce(),
        mut limit: Option<&mut Limit<'_>>,
    ) -> Result<Option<u32>, QiError> {
        let sh = &*self.shared;
        sh.check_caller()?;
        let ticket = {
            let _sub = match limit.as_deref_mut() {
                None => lock(&sh.submit),
                // With a limit, the lock too is waited for only within
                // it: its holder may be a submitter without one, waiting
                // in `make_room` for a ring a device's open section keeps
                // full.
                Some(l) => {
                    // A quick holder (another submitter) is waited for by
                    // spinning first; a slow one by naps of 50 µs.
                    let mut backoff = Backoff::default();
                    loop {
                        if let Some(g) = try_lock_std(&sh.submit) {
                            break g;
                        }
                        l.check()?;
                        if backoff.is_spinning() {
                            backoff.snooze();
                        } else {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                }
            };
            // Nothing is queued where no processor will ever run it.
            sh.check_queue()?;
            let len = sh.queue.len();
            let mut tail = sh.queue.tail();
            let ticket = wait.then(|| sh.next_ticket.load(Ordering::Relaxed));
            let last = ticket.map(|_| InvDescriptor::wait_event().encode());
            for (i, d) in raw.iter().chain(last.iter()).enumerate() {
                if i == raw.len() {
                    if let Some(t) = ticket {
                        // Release, before the doorbell that publishes the
                        // wait: a queue error seen later counts this ticket
                        // as issued (see `fail_outstanding`).
                        sh.next_ticket.store(t.wrapping_add(1), Ordering::Release);
                    }
                }
                while sh.queue.free(tail) == 0 {
                    self.ring(tail)?;
                    self.make_room(tail, limit.as_deref_mut())?;
                }
                let t = if i == raw.len() { ticket } else { None };
                sh.queue.write(tail, *d, t)?;
                tail = (tail + 1) % len;
            }
            self.ring(tail)?;
            ticket
        };
        queued();
        sh.kick();
        Ok(ticket)
    }

    fn ring(&self, tail: u32) -> Result<(), QiError> {
        let sh = &*self.shared;
        sh.queue.ring(tail).map_err(|_| {
            sh.note_stop();
            // Waiters learn of the stop, as `write_tail`'s do.
            sh.notify_done();
            sh.stopped_error()
        })
    }

    /// Waits (holding the submission lock) until the ring has a free slot,
    /// or, with a `limit`, until it fails.
    fn make_room(&self, cursor: u32, limit: Option<&mut Limit<'_>>) -> Result<(), QiError> {
        let sh = &*self.shared;
        match sh.config.queue_mode {
            QueueMode::Inline => {
                let stalled = {
                    let mut p = lock(&sh.proc);
                    sh.run_inline(&mut p).stalled
                };
                if stalled {
                    // The head waits on a drain: give the translations it
                    // waits for a moment before the caller looks again.
                    match limit {
                        None => std::thread::yield_now(),
                        Some(l) => {
                            l.check()?;
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                }
            }
            QueueMode::Thread => {
                let mut g = lock(&sh.signal);
                sh.doorbell.notify_one();
                let mut limit = limit;
                while sh.queue.free(cursor) == 0
                    && !sh.queue.stopped()
                    && !sh.shutdown.load(Ordering::Acquire)
                {
                    g = match limit.as_deref_mut() {
                        None => sh.done.wait(g).unwrap_or_else(|e| e.into_inner()),
                        Some(l) => {
                            l.check()?;
                            sh.done
                                .wait_timeout(g, BOUNDED_SLICE)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        }
                    };
                }
            }
        }
        if sh.queue.stopped() {
            return Err(sh.stopped_error());
        }
        if sh.shutdown.load(Ordering::Acquire) {
            return Err(QiError::ShutDown);
        }
        Ok(())
    }

    /// Queues a ticketed wait and rings the doorbell without waiting for
    /// it: see [`Unit::poll_ticket`].
    #[cfg(test)]
    pub(crate) fn queue_wait(&self) -> Result<u32, QiError> {
        // A wait was asked for, so a ticket comes back with an `Ok`.
        self.enqueue(&[], true)?.ok_or(QiError::ShutDown)
    }

    /// Queues a domain-selective IOTLB invalidation of `did` and a ticketed
    /// wait behind it, in one submission (nothing can come between them,
    /// not even a discard), dropping the domain's cached translations as
    /// they are queued (see [`Unit::invalidate_domain`]); returns the
    /// wait's ticket without waiting for it. A deferred flush's issue
    /// (`dma::inflight`).
    pub(crate) fn queue_domain_flush(&self, did: u16) -> Result<u32, QiError> {
        let raw = [InvDescriptor::iotlb_domain(did).encode()];
        self.enqueue_then(&raw, true, || self.drop_cached(did), None)?
            .ok_or(QiError::ShutDown)
    }

    /// Whether ticket `t`'s wait has completed, without waiting for it,
    /// and if so when (at the latest: the time of the unit's last
    /// completion, which is `t`'s or a later ticket's). In inline mode this
    /// runs one pass first if no other pass is running (a stalled drain is
    /// looked at again). Fails as [`InvBatch::wait`] does: the ticket
    /// failed, the queue stopped, the unit shut down.
    pub(crate) fn poll_ticket(&self, t: u32) -> Result<Option<std::time::Instant>, QiError> {
        let sh = &*self.shared;
        let done_at = |sh: &Shared| {
            // After the Acquire load of `completed` in `ticket_state`.
            let ns = sh.completed_at.load(Ordering::Relaxed);
            sh.born + Duration::from_nanos(ns)
        };
        if sh.ticket_outcome(t)? {
            return Ok(Some(done_at(sh)));
        }
        // A thread in a section of this unit does not process: the drain
        // would only find itself.
        if sh.config.queue_mode == QueueMode::Inline && sh.check_caller().is_ok() {
            if let Some(mut p) = crate::sync::try_lock_std(&sh.proc) {
                sh.run_inline(&mut p);
            }
        }
        Ok(sh.ticket_outcome(t)?.then(|| done_at(sh)))
    }

    /// Returns when ticket `t`'s wait has completed, or fails.
    pub(crate) fn wait_ticket(&self, t: u32) -> Result<(), QiError> {
        self.wait_ticket_until(t, None)
    }

    /// [`wait_ticket`](Self::wait_ticket), which with a `limit` also fails
    /// when the limit does (looked at about every [`BOUNDED_SLICE`]). The
    /// ticket's outcome is read as the unbounded wait reads it (no new
    /// ordering: the bound only ends the looking early).
    pub(crate) fn wait_ticket_until(
        &self,
        t: u32,
        mut limit: Option<&mut Limit<'_>>,
    ) -> Result<(), QiError> {
        let sh = &*self.shared;
        let mut backoff = Backoff::default();
        let mut g = lock(&sh.signal);
        loop {
            if sh.ticket_outcome(t)? {
                return Ok(());
            }
            if let Some(l) = limit.as_deref_mut() {
                l.check()?;
            }
            g = match sh.config.queue_mode {
                QueueMode::Thread if limit.is_some() => {
                    sh.done
                        .wait_timeout(g, BOUNDED_SLICE)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                QueueMode::Thread => sh.done.wait(g).unwrap_or_else(|e| e.into_inner()),
                QueueMode::Inline => {
                    // Our own doorbell processed the queue up to our wait,
                    // unless a pass stalled on a drain before it (ours or
                    // an earlier one), or the queue was being recovered
                    // meanwhile: run one more pass ourselves, and poll.
                    drop(g);
                    sh.kick();
                    let g = lock(&sh.signal);
                    if sh.ticket_state(t) != TicketState::Pending {
                        g
                    } else if backoff.is_spinning() {
                        drop(g);
                        backoff.snooze();
                        lock(&sh.signal)
                    } else {
                        sh.done
                            .wait_timeout(g, Duration::from_micros(50))
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    }
                }
            };
        }
    }
}
