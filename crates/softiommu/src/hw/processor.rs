//! The unit's side of the invalidation queue: carrying out descriptors,
//! draining at waits, writing status words, and the unit thread.
//!
//! Processing runs under the processing lock, on the submitting thread
//! ([`QueueMode::Inline`](super::QueueMode::Inline)) or on the unit's own
//! thread ([`QueueMode::Thread`](super::QueueMode::Thread)); either way one
//! pass at a time, in queue order, as the hardware does.
//!
//! At a wait descriptor that follows any invalidation, the processor
//! *drains* (see `epoch`): every translation that might not see those
//! invalidations must have finished before it charges the modelled
//! completion time and writes the status word (Release, paired with the
//! driver's Acquire load). So when a driver sees the status, no translation
//! that began before its invalidations can still return, or still be using,
//! a stale result.
//!
//! The drain never blocks a pass. At the wait, the processor takes the
//! drain's snapshot (the heavy fence, then the sections active), keeps it
//! in the processing state and, while any of those sections is still
//! open, ends the pass *stalled* with the head on the wait, as hardware
//! leaves a wait descriptor at the head until it can complete. The next
//! pass (any submitter's doorbell, a waiter polling, the unit thread)
//! looks at the same snapshot again. A submitter that only queues (a
//! deferred flush, see `dma::inflight`) is never held by a device thread
//! the host has descheduled inside a translation; a waiter polls, with
//! backoff, as a driver polls a status word.
//!
//! The unit's own waits complete a *ticket* in a private word
//! (`Shared::completed`), never in physical memory: a descriptor's status
//! write can only reach memory, and a status address inside the IOMMU's
//! own frames (the ring, a page-table page, a bounce pool) stops the queue
//! instead of writing there.

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::descriptor::{InvDescriptor, IotlbScope, IqeReason};
use super::error::QiError;
use super::inv_queue::{Pass, QueueFault, Step};
use super::latency::spin_ns;
use super::unit::{thread_token, Counters, ProcState, QueueMode, Shared};
use crate::mem::{PhysAddr, PhysMemory};
use crate::sync::lock_std as lock;
use crate::sync::Backoff;

/// Where a wait ticket stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TicketState {
    /// Its status was written.
    Done,
    /// A queue error or a discard stopped it.
    Failed(QueueFault),
    /// Not yet.
    Pending,
}

/// The 32-bit status word at `addr`, if it is aligned, inside `mem`, and
/// not in a frame of the IOMMU's own.
pub(crate) fn status_word(mem: &PhysMemory, addr: PhysAddr) -> Result<&AtomicU32, IqeReason> {
    if addr & 3 != 0 {
        return Err(IqeReason::StatusAddress { addr });
    }
    if mem.is_iommu_frame(addr) {
        return Err(IqeReason::StatusAddressProtected { addr });
    }
    let p = mem
        .as_ptr(addr, 4)
        .map_err(|_| IqeReason::StatusAddress { addr })?;
    // SAFETY: `as_ptr` checked that the 4 bytes are inside the arena; `p` is
    // 4-byte aligned because the arena's base is page aligned and `addr` is
    // a multiple of 4; the arena lives as long as `mem`, which the returned
    // reference borrows. The unit touches status words only atomically.
    Ok(unsafe { AtomicU32::from_ptr(p.cast()) })
}

/// Whether `t` lies in the wrapping inclusive range `[lo, hi]`.
fn in_range(t: u32, lo: u32, hi: u32) -> bool {
    t.wrapping_sub(lo) <= hi.wrapping_sub(lo)
}

impl Shared {
    /// Refuses a queue operation from a thread that holds a guard of this
    /// unit: the drain would wait for that thread forever.
    pub(crate) fn check_caller(&self) -> Result<(), QiError> {
        if self.slots.active_owned_by(thread_token()) {
            Err(QiError::GuardHeld)
        } else {
            Ok(())
        }
    }

    /// The unit thread: sleeps until the doorbell, processes, repeats.
    pub(crate) fn worker(&self) {
        // However the thread ends (shut down, an injected crash, a panic
        // unwinding it), the queue is left shut down and every waiter
        // woken: a wait in thread mode sleeps until a pass ends, and with
        // the thread gone none ever would (before this guard, a thread
        // that died left every later wait hanging).
        struct Exit<'a>(&'a Shared);
        impl Drop for Exit<'_> {
            fn drop(&mut self) {
                let sh = self.0;
                let _g = lock(&sh.signal);
                sh.shutdown.store(true, Ordering::Release);
                sh.worker_gone.store(true, Ordering::Release);
                sh.done.notify_all();
            }
        }
        let _exit = Exit(self);
        let mut backoff = Backoff::default();
        loop {
            {
                let mut g = lock(&self.signal);
                loop {
                    if self.shutdown.load(Ordering::Acquire) || self.crash.load(Ordering::Acquire) {
                        return;
                    }
                    if !self.queue.stopped() && self.queue.head() != self.queue.tail() {
                        break;
                    }
                    g = self.doorbell.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            }
            let pass = {
                let mut p = lock(&self.proc);
                self.run_queue(&mut p)
            };
            // A pass that only stalled changed nothing a waiter waits for.
            if !pass.stalled || pass.done > 0 {
                self.notify_done();
            }
            if pass.stalled {
                // A drain waits for translations in flight: look again
                // soon, as the hardware keeps checking.
                backoff.snooze();
            } else {
                backoff = Backoff::default();
            }
        }
    }

    /// Wakes whoever waits for a pass to end.
    pub(crate) fn notify_done(&self) {
        let _g = lock(&self.signal);
        self.done.notify_all();
    }

    /// Gets the queue processed: now, on this thread (inline mode), or by
    /// waking the unit thread.
    pub(crate) fn kick(&self) {
        match self.config.queue_mode {
            QueueMode::Inline => {
                let mut p = lock(&self.proc);
                self.run_inline(&mut p);
            }
            QueueMode::Thread => {
                let _g = lock(&self.signal);
                self.doorbell.notify_one();
            }
        }
    }

    /// One processing pass, up to the tail or the first error.
    pub(crate) fn run_queue(&self, p: &mut ProcState) -> Pass {
        let limits = self.limits;
        let pass = self
            .queue
            .process(&limits, |d, ticket| self.exec(p, d, ticket));
        Counters::add(&self.counters.descriptors, u64::from(pass.done));
        if pass.raised {
            self.note_stop();
        }
        pass
    }

    /// Records a new queue error: every ticket issued and not yet done
    /// fails (their waits sit behind the bad descriptor).
    pub(crate) fn note_stop(&self) {
        Counters::add(&self.counters.queue_errors, 1);
        if let Some(f) = self.queue.fault() {
            self.fail_outstanding(f);
        }
    }

    /// Marks the tickets issued and not done as failed with `f`.
    pub(crate) fn fail_outstanding(&self, f: QueueFault) {
        let done = self.status_now();
        // Acquire: pairs with the submitter's Release store of the ticket,
        // which precedes its doorbell.
        let issued = self.next_ticket.load(Ordering::Acquire).wrapping_sub(1);
        if issued != done {
            let mut failed = lock(&self.failed);
            let range = (done.wrapping_add(1), issued, f);
            if failed.last() != Some(&range) {
                failed.push(range);
            }
        }
    }

    /// The last ticket completed.
    fn status_now(&self) -> u32 {
        // Acquire: pairs with the processor's Release store in `exec`.
        self.completed.load(Ordering::Acquire)
    }

    /// Where ticket `t` stands.
    pub(crate) fn ticket_state(&self, t: u32) -> TicketState {
        if let Some(&(_, _, f)) = lock(&self.failed)
            .iter()
            .find(|(lo, hi, _)| in_range(t, *lo, *hi))
        {
            return TicketState::Failed(f);
        }
        if self.status_now().wrapping_sub(t) as i32 >= 0 {
            TicketState::Done
        } else {
            TicketState::Pending
        }
    }

    /// Carries out one descriptor; `ticket`: it is the unit's own wait for
    /// that ticket.
    fn exec(
        &self,
        p: &mut ProcState,
        d: &InvDescriptor,
        ticket: Option<u32>,
    ) -> Result<Step, IqeReason> {
        let c = &self.counters;
        match *d {
            InvDescriptor::ContextCache(_) => {
                // Contexts are read afresh by every translation; what must
                // still happen is the drain at the next wait.
                p.invalidated();
                Counters::add(&c.context_invalidations, 1);
                p.spun(c, spin_ns(self.latency.context_invalidation_ns()));
            }
            InvDescriptor::Iotlb { scope, .. } => {
                match scope {
                    IotlbScope::Global => {
                        self.iotlb.invalidate_global();
                        Counters::add(&c.iotlb_global, 1);
                    }
                    IotlbScope::Domain { did } => {
                        self.iotlb.invalidate_domain(did);
                        Counters::add(&c.iotlb_domain, 1);
                    }
                    IotlbScope::Pages { did, addr, am, .. } => {
                        let n = self.iotlb.invalidate_pages(did, addr, u32::from(am));
                        Counters::add(&c.iotlb_pages, 1);
                        Counters::add(&c.entries_cleared, n);
                    }
                }
                p.invalidated();
                p.spun(c, spin_ns(self.latency.iotlb_invalidation_ns()));
            }
            InvDescriptor::PageGroupResponse {
                sid, prgi, code, ..
            } => {
                // A response is not an invalidation: nothing to drain.
                self.prq.respond(sid, prgi, code);
            }
            InvDescriptor::Wait(w) => {
                // Check the status address before doing anything, so that a
                // bad one stops the queue with nothing half done.
                let word = match w.status {
                    Some(s) => Some((status_word(&self.mem, s.addr)?, s.data)),
                    None => None,
                };
                if p.dirty {
                    // The snapshot is taken once, at the first look; later
                    // passes only poll it. No invalidation can run between
                    // (the head stays here); one that does after a skip or
                    // a discard clears it (`invalidated`, `recover_queue`).
                    let d = p.drain.get_or_insert_with(|| {
                        let t0 = Instant::now();
                        let sections = self.slots.drain_start(self.barrier);
                        PendingDrain {
                            waited: sections.len() as u64,
                            sections,
                            t0,
                            stalled: false,
                        }
                    });
                    if !self.slots.drain_poll(&mut d.sections) {
                        if !d.stalled {
                            d.stalled = true;
                            Counters::add(&c.drain_stalls, 1);
                        }
                        return Ok(Step::Stall);
                    }
                    Counters::add(&c.drains, 1);
                    Counters::add(&c.drain_waited, d.waited);
                    Counters::add(&c.drain_ns, nanos(d.t0.elapsed()));
                    p.spun(c, spin_ns(self.latency.wait_completion_ns()));
                    p.drain = None;
                    p.dirty = false;
                }
                if let Some((word, data)) = word {
                    // Release: pairs with the driver's Acquire load; the
                    // drain above happens before it sees the status.
                    word.store(data, Ordering::Release);
                }
                if let Some(t) = ticket {
                    // Relaxed, ordered before the ticket's Release store
                    // below: a waiter that sees the ticket sees this time
                    // (or a later completion's).
                    self.completed_at
                        .store(nanos(self.born.elapsed()), Ordering::Relaxed);
                    // Release: pairs with `status_now`'s Acquire load; the
                    // drain above happens before a waiter sees its ticket.
                    self.completed.store(t, Ordering::Release);
                }
                Counters::add(&c.waits, 1);
                if w.interrupt {
                    Counters::add(&c.completion_events, 1);
                }
            }
        }
        Ok(Step::Done)
    }
}

/// A wait's drain under way: the sections it waits for, as
/// `Slots::drain_start` found them.
#[derive(Debug)]
pub(crate) struct PendingDrain {
    sections: Vec<(usize, u64)>,
    waited: u64,
    t0: Instant,
    /// A pass has stalled on it (counted once).
    stalled: bool,
}

impl ProcState {
    /// Modelled latency `ns` was spun by this pass: counted as the unit's
    /// modelled time, and kept apart from its inline CPU (`pass_cpu`).
    fn spun(&mut self, c: &Counters, ns: u64) {
        Counters::add(&c.modelled_ns, ns);
        self.spun_ns = self.spun_ns.wrapping_add(ns);
    }

    /// An invalidation ran: the next wait drains, with a snapshot taken
    /// after it (one taken before would not cover it; one can be left here
    /// only if the wait that took it was skipped or rewritten).
    fn invalidated(&mut self) {
        self.dirty = true;
        self.drain = None;
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
