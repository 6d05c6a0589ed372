//! Deferred flushes under way: a batch whose invalidations are queued on
//! the units, waiting for their completions before its IOVAs and table
//! pages are freed.
//!
//! A flush is two halves. [`DmaDomain::issue_flush`] queues, on each unit
//! the batch touched, a domain-selective invalidation (which drops the
//! domain's cached translations as it is queued: from then on no new
//! translation can reach an unmapped page) and a ticketed wait, and
//! returns. [`DmaDomain::complete_flushes`] later polls the tickets, in
//! issue order, and frees each batch whose waits have all completed: only
//! then can no translation that began before the invalidation still be
//! using what was unmapped (the wait's drain; see `hw::processor`).
//!
//! Linux's flush queue splits a flush the same way, with a counter of
//! flushes started and one of flushes finished, each queued IOVA freed
//! once the finished count passes the one it was queued under
//! (`drivers/iommu/dma-iommu.c`, `fq_flush_start_cnt` /
//! `fq_flush_finish_cnt`). It matters more here than there: on hardware
//! the wait completes in a microsecond; an emulated unit's drain waits for
//! the device threads' translation sections, and a device thread the host
//! has descheduled inside one would keep the unmapping thread waiting for
//! a scheduling slice.
//!
//! The owner and the timer's round issue and poll without waiting for a
//! device (a busy list is left to whoever holds it; only a flight whose
//! queue failed it is revoked there, and that revocation drains; a round
//! that leaves a flight waiting is due again); everyone else that must
//! see the batches gone (`flush_all`, a CPU handle's drop, a policy
//! switch) completes them blocking, sleeping on the oldest wait
//! pending. At most [`MAX_IN_FLIGHT`] batches wait: past it the owner
//! completes blocking too (every batch issued before its call), so the
//! IOVAs a device can keep from being freed by holding a section are
//! bounded. A batch is freed only once every unit it touched is done with
//! it. A batch is never dropped: one whose wait failed is revoked around
//! the queue (`Unit::revoke`) once its other units' waits are done, and
//! one that cannot be is kept with the failed flushes for a retry.

#![deny(clippy::indexing_slicing)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::domain::DmaDomain;
use super::error::DmaError;
use super::flush_queue::Batch;
use super::stats::CpuStats;
use crate::hw::UnitId;
use crate::iova::IovaCpuCache;
use crate::sync::{lock_std as lock, try_lock_std, Backoff};

/// The most issued flushes a domain lets wait for their completion before
/// an owner's flush waits for the oldest.
pub(crate) const MAX_IN_FLIGHT: usize = 8;

/// One issued flush.
#[derive(Debug)]
struct Flight {
    batch: Batch,
    /// Each unit the invalidation was queued on, with its wait's ticket.
    tickets: Tickets,
    /// A unit's queue refused the invalidation or its wait: every unit of
    /// the batch is revoked around the queue at completion, as
    /// `DmaDomain::invalidate` does.
    bypass: bool,
}

/// The tickets of one flight: inline for the usual one or two units (an
/// allocation per flush showed in the deferred pair's instruction count),
/// on the heap past that.
#[derive(Debug)]
struct Tickets {
    inline: [(UnitId, u32); INLINE_TICKETS],
    len: usize,
    more: Vec<(UnitId, u32)>,
}

const INLINE_TICKETS: usize = 2;

impl Default for Tickets {
    fn default() -> Self {
        Self {
            inline: [(UnitId(0), 0); INLINE_TICKETS],
            len: 0,
            more: Vec::new(),
        }
    }
}

impl Tickets {
    fn push(&mut self, t: (UnitId, u32)) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = t;
                self.len += 1;
            }
            None => self.more.push(t),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(UnitId, u32)> {
        self.inline
            .get(..self.len)
            .unwrap_or_default()
            .iter()
            .chain(&self.more)
    }
}

/// A domain's issued flushes, oldest first, and how many were issued and
/// finished ever (a blocking completion waits for the finished count to
/// reach the issued count it started with, without holding the list: an
/// owner must be able to issue meanwhile).
#[derive(Debug, Default)]
struct Flights {
    q: VecDeque<Flight>,
    issued: u64,
    finished: u64,
}

/// A domain's issued flushes.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    list: Mutex<Flights>,
    /// How many flushes wait (read without the lock on the unmap path).
    count: AtomicUsize,
}

impl InFlight {
    /// How many issued flushes wait for their completion.
    pub(crate) fn len(&self) -> usize {
        self.count.load(Relaxed)
    }

    /// Whether as many flushes wait as the domain lets wait.
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= MAX_IN_FLIGHT
    }

    /// Takes every batch away (the domain's drop: their page-table pages
    /// are freed once every unit is revoked).
    pub(crate) fn drain(&self) -> Vec<Batch> {
        let mut l = lock(&self.list);
        self.count.store(0, Relaxed);
        let n = l.q.len() as u64;
        l.finished += n;
        l.q.drain(..).map(|f| f.batch).collect()
    }
}

impl DmaDomain {
    /// Issues the flush of `batch`: a domain-selective invalidation and a
    /// wait on each unit it touched, queued and not waited for. The
    /// domain's cached translations are gone when this returns (see
    /// `Unit::invalidate_domain`); its IOVAs are freed by
    /// [`complete_flushes`](Self::complete_flushes). If the calling thread
    /// holds a translation section, nothing is queued and the batch is
    /// kept for a retry.
    pub(crate) fn issue_flush(&self, mut batch: Batch) -> Result<(), DmaError> {
        // Every unit the domain spans (queues record none per entry): read
        // after the take, which acquired each entry's push, so it holds
        // every unit each unmap's own read of the mask saw (the mask only
        // grows), and any unit attached since.
        batch.units |= self.unit_mask();
        if let Err(e) = self.check_callers() {
            self.keep_pending(batch, &e);
            return Err(e);
        }
        let mut tickets = Tickets::default();
        let mut bypass = false;
        for id in self.units.in_mask(batch.units) {
            let Some(unit) = self.system.unit(id) else {
                continue;
            };
            match unit.queue_domain_flush(self.did) {
                Ok(t) => tickets.push((id, t)),
                Err(_) => {
                    // Revoked around the queue at completion; meanwhile no
                    // new translation may use what the batch unmapped.
                    unit.drop_cached(self.did);
                    bypass = true;
                }
            }
        }
        let mut l = lock(&self.in_flight.list);
        l.q.push_back(Flight {
            batch,
            tickets,
            bypass,
        });
        l.issued += 1;
        self.in_flight.count.store(l.q.len(), Relaxed);
        Ok(())
    }

    /// Frees, oldest first, the issued batches whose waits have completed,
    /// into `cache` (recorded in `stats`). With `block`, waits until every
    /// batch issued before the call is freed (or kept for a retry); without
    /// it, never waits (stops at the first batch still pending, and does
    /// nothing if another thread holds the list). Fails with the first
    /// batch that could not be revoked (kept for a retry), or, with
    /// `block`, if the calling thread holds a section it would wait for.
    #[inline]
    pub(crate) fn complete_flushes(
        &self,
        cache: &mut IovaCpuCache,
        stats: &CpuStats,
        block: bool,
    ) -> Result<(), DmaError> {
        if self.in_flight.len() == 0 {
            return Ok(());
        }
        self.complete_some(cache, stats, block)
    }

    /// What an owner does after its unmap's push: frees what its issued
    /// flushes finished, never waiting unless [`MAX_IN_FLIGHT`] wait.
    #[inline]
    pub(crate) fn reap_owned(&self, cache: &mut IovaCpuCache, stats: &CpuStats) {
        // A batch that could not be revoked is kept for a retry and
        // counted; the unmap that got here is done.
        let _ = self.complete_flushes(cache, stats, self.in_flight.is_full());
    }

    /// [`complete_flushes`](Self::complete_flushes) with something in
    /// flight.
    #[inline(never)]
    fn complete_some(
        &self,
        cache: &mut IovaCpuCache,
        stats: &CpuStats,
        block: bool,
    ) -> Result<(), DmaError> {
        if !block {
            let Some(l) = try_lock_std(&self.in_flight.list) else {
                return Ok(());
            };
            return self.finish_ready(l, cache, stats, false).map(|_| ());
        }
        // Waiting for a drain from inside a section would wait for itself.
        self.check_callers()?;
        let target = lock(&self.in_flight.list).issued;
        let mut backoff = Backoff::default();
        loop {
            let (finished, waiting) =
                self.finish_ready(lock(&self.in_flight.list), cache, stats, true)?;
            if finished.wrapping_sub(target) as i64 >= 0 {
                return Ok(());
            }
            // Sleep on the oldest wait still pending (the list is not held:
            // owners issue meanwhile), as `Unit::wait` does: on the unit
            // thread's pass in thread mode, polling in inline mode.
            match waiting.and_then(|(id, t)| self.system.unit(id).map(|u| (u, t))) {
                Some((unit, t)) => {
                    let _ = unit.wait_ticket(t);
                }
                None => backoff.snooze(),
            }
        }
    }

    /// Frees the batches at the front of `l` whose waits have all
    /// completed (or, for those whose queue failed them, been revoked
    /// around it: by a blocking completer, which checked that it holds no
    /// section, or by any caller that holds none); returns the finished
    /// count and the
    /// oldest wait still pending. Stops at the first batch with a wait
    /// pending (a batch is freed only once *every* unit it touched is
    /// done with it), or at the first that cannot be revoked (kept for a
    /// retry, its error returned).
    fn finish_ready(
        &self,
        mut l: MutexGuard<'_, Flights>,
        cache: &mut IovaCpuCache,
        stats: &CpuStats,
        blocking: bool,
    ) -> Result<(u64, Option<(UnitId, u32)>), DmaError> {
        let mut result = Ok(());
        let mut waiting = None;
        while let Some(f) = l.q.front() {
            let mut failed = Vec::new();
            // When the last of the waits completed (at the latest).
            let mut done_at = None;
            for &(id, t) in f.tickets.iter() {
                match self.system.unit(id).map(|u| u.poll_ticket(t)) {
                    Some(Ok(Some(at))) => done_at = done_at.max(Some(at)),
                    None => {}
                    Some(Ok(None)) => {
                        waiting.get_or_insert((id, t));
                    }
                    Some(Err(_)) => failed.push(id),
                }
            }
            if waiting.is_some() && !f.bypass {
                break;
            }
            waiting = None;
            let revoke_all = f.bypass;
            // Asked only when a revocation is due (it scans the units'
            // translator slots): a thread in a section leaves the flight to
            // a blocking completer.
            if (revoke_all || !failed.is_empty()) && !blocking && self.check_callers().is_err() {
                break;
            }
            let Some(f) = l.q.pop_front() else { break };
            // A wait that failed, or an invalidation never queued: the
            // revocation around the queue does what they would have (and,
            // with `bypass`, covers a unit whose wait is still pending).
            let revoke = self
                .units
                .in_mask(f.batch.units)
                .filter(|id| revoke_all || failed.contains(id))
                .filter_map(|id| self.system.unit(id))
                .try_for_each(|u| u.revoke(self.did, 0, 0));
            l.finished += 1;
            self.in_flight.count.store(l.q.len(), Relaxed);
            if let Err(e) = revoke {
                let e = DmaError::from(e);
                self.keep_pending(f.batch, &e);
                result = Err(e);
                break;
            }
            let n = f.batch.units.count_ones().into();
            // A revocation completes now; waits when they completed.
            let done_at = if revoke_all || !failed.is_empty() {
                Instant::now()
            } else {
                done_at.unwrap_or_else(Instant::now)
            };
            if let Err(e) = self.free_flushed(f.batch, n, done_at, cache, stats) {
                result = result.and(Err(e));
            }
        }
        result.map(|()| (l.finished, waiting))
    }
}
