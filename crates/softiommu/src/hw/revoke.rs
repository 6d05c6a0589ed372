//! Revocation that needs no queue: what a driver falls back on when the
//! invalidation queue cannot carry an unmap's invalidation (stopped on an
//! error another submitter caused, shut down, its bytes unusable).
//!
//! An unmap that has cleared its entries must end with the device unable
//! to use them: the alternative, a cleared entry that the IOTLB still
//! serves, is a leak no retry can close (the entry is gone, so a retry
//! finds nothing to unmap). [`Unit::revoke`] does what the queue's
//! invalidation and wait would have done — drop the IOTLB entries, then
//! drain the translations in flight — on the caller's thread, without
//! touching the ring. It fails only if the caller itself holds a
//! translation section of this unit (the drain would wait for itself), a
//! condition a driver checks before it clears anything
//! ([`Unit::check_caller`]).
//!
//! **Bounded revocation** (`revoke_bounded`, used by the I/O page fault
//! domain's reclaim and promotion): the same, but a section that is still
//! open after the caller's timeout is *fenced* instead of waited for
//! forever — recorded (slot and section), counted
//! ([`UnitStats::fenced_sections`](super::UnitStats::fenced_sections)),
//! and not waited for again by later bounded revocations. Its device's
//! IOTLB entries for the range are gone and the table entries cleared, so
//! once its section ends its next translation of the range misses and
//! faults; but inside the section it may still use what it translated
//! before. So the caller learns how many sections it did not wait for and
//! must keep what they could reach (the domain keeps the backing, which
//! it never frees, and leaks the table pages the change freed).
//! Every other wait (the queue's, `revoke`) still waits for fenced
//! sections. Like VT-d's invalidation time-out error (ITE), which ends a
//! device-TLB invalidation a device does not complete in time, this is the
//! unit giving up on a device, not a guarantee about it.
//!
//! No new ordering argument: the bounded drain is `Slots::drain` (the
//! heavy fence, the snapshot, Acquire polls) with an early exit; a section
//! it stops waiting for is promised nothing, and the caller is told.

#![deny(clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use super::descriptor::covering_mask;
use super::error::QiError;
use super::latency::spin_ns;
use super::submit::Limit;
use super::unit::{Counters, Shared, Unit};
use crate::sync::lock_std as lock;
use crate::sync::Backoff;

impl Unit {
    /// Fails with [`QiError::GuardHeld`] if the calling thread holds a
    /// translation section of this unit: a wait, or a revocation, from it
    /// would wait for itself.
    pub fn check_caller(&self) -> Result<(), QiError> {
        self.shared.check_caller()
    }

    /// Revokes `[iova, iova + len)` of domain `did` (the whole domain when
    /// `len` is 0) without the invalidation queue: the IOTLB entries are
    /// dropped and every translation in flight is drained before it
    /// returns, as a completed wait after the invalidation would promise.
    /// The modelled completion latency is charged as for a wait.
    pub(crate) fn revoke(&self, did: u16, iova: u64, len: u64) -> Result<(), QiError> {
        let sh = &*self.shared;
        sh.check_caller()?;
        sh.drop_entries(did, iova, len);
        sh.drain_direct();
        Ok(())
    }

    /// As [`revoke`](Self::revoke), but waits at most `timeout` for the
    /// translation sections in flight: a section still open then is fenced
    /// (see the module documentation). Returns the number of sections
    /// that may still be open and were not waited for — fenced now, or
    /// fenced by an earlier bounded revocation and still open — 0 when
    /// this was a full revocation.
    pub(crate) fn revoke_bounded(
        &self,
        did: u16,
        iova: u64,
        len: u64,
        timeout: Duration,
    ) -> Result<u64, QiError> {
        let sh = &*self.shared;
        sh.check_caller()?;
        sh.drop_entries(did, iova, len);
        let t0 = Instant::now();
        let mut pending = sh.slots.drain_start(sh.barrier);
        let waited = pending.len() as u64;
        let skipped = {
            let mut fenced = lock(&sh.fenced);
            // Forget the fenced sections that have ended.
            sh.slots.drain_poll(&mut fenced);
            let before = pending.len();
            pending.retain(|s| !fenced.contains(s));
            (before - pending.len()) as u64
        };
        let mut backoff = Backoff::default();
        while !sh.slots.drain_poll(&mut pending) {
            if t0.elapsed() >= timeout {
                break;
            }
            if backoff.is_spinning() {
                backoff.snooze();
            } else {
                // A device parked in a section may stay there: sleep
                // rather than burn the core it may need.
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let fenced_now = pending.len() as u64;
        if fenced_now > 0 {
            lock(&sh.fenced).extend(pending);
        }
        let c = &sh.counters;
        Counters::add(&c.fenced_sections, fenced_now);
        Counters::add(&c.drains, 1);
        Counters::add(&c.drain_waited, waited);
        Counters::add(
            &c.drain_ns,
            u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX),
        );
        Counters::add(&c.modelled_ns, spin_ns(sh.latency.wait_completion_ns()));
        Ok(skipped + fenced_now)
    }

    /// Sections fenced by a bounded revocation that are still open: while
    /// this is not 0, a fenced device may still be using a translation
    /// made before the revocation that fenced it.
    pub fn fenced_sections_open(&self) -> usize {
        let sh = &*self.shared;
        let mut fenced = lock(&sh.fenced);
        sh.slots.drain_poll(&mut fenced);
        fenced.len()
    }
}

impl Shared {
    /// Drops `did`'s IOTLB entries for `[iova, iova + len)` (the whole
    /// domain when `len` is 0), without the queue.
    fn drop_entries(&self, did: u16, iova: u64, len: u64) {
        let page = if len == 0 {
            None
        } else {
            covering_mask(iova, len, self.limits.mamv)
        };
        match page {
            Some((addr, am)) => {
                self.iotlb.invalidate_pages(did, addr, u32::from(am));
            }
            None => self.iotlb.invalidate_domain(did),
        }
    }

    /// [`drain_direct`](Self::drain_direct) within `limit`: fails with
    /// the limit's error, the drain not complete (sections that began
    /// before it may still be open), when the limit does.
    pub(crate) fn drain_direct_bounded(&self, limit: &mut Limit<'_>) -> Result<(), QiError> {
        let (t0, waited) = self.drain_within(limit)?;
        self.count_direct_drain(t0, waited);
        Ok(())
    }

    /// Waits, on the calling thread, for every translation section open
    /// now to end, looking at `limit` between polls; returns when the wait
    /// began and how many sections it waited for, or the limit's error
    /// (sections that began before it may still be open).
    fn drain_within(&self, limit: &mut Limit<'_>) -> Result<(Instant, u64), QiError> {
        let t0 = Instant::now();
        let mut pending = self.slots.drain_start(self.barrier);
        let waited = pending.len() as u64;
        let mut backoff = Backoff::default();
        while !self.slots.drain_poll(&mut pending) {
            limit.check()?;
            if backoff.is_spinning() {
                backoff.snooze();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok((t0, waited))
    }

    /// Makes RAM that just became a bounce pool's unreachable to every
    /// translation that may have reached it before: every IOTLB entry of
    /// the unit is dropped (a claimed domain's walk then refuses the pool,
    /// see `claims`), and every translation section open now is waited
    /// for, at most `timeout` (`InvalidationTimeout`: one is still open
    /// and may still be copying through an older translation). Refused
    /// from inside a section of this unit (`GuardHeld`).
    pub(crate) fn quiesce_for_pool(&self, timeout: Duration) -> Result<(), QiError> {
        self.check_caller()?;
        self.iotlb.invalidate_global();
        let mut never = || false;
        let mut limit = Limit::new(timeout, &mut never);
        // Not a revocation around the queue: counted as a drain only.
        let (t0, waited) = self.drain_within(&mut limit)?;
        self.count_drain(t0, waited);
        Ok(())
    }

    /// Drains every translation in flight on the calling thread, without
    /// the queue, and charges and counts it as a revocation. The caller
    /// must have checked that it holds no section of this unit
    /// (`check_caller`): the drain would wait for itself.
    pub(crate) fn drain_direct(&self) {
        let t0 = Instant::now();
        let st = self.slots.drain(self.barrier);
        self.count_direct_drain(t0, st.waited);
    }

    /// Counts a drain done around the queue that began at `t0` and waited
    /// for `waited` sections, and spins the modelled completion wait.
    fn count_direct_drain(&self, t0: Instant, waited: u64) {
        self.count_drain(t0, waited);
        let c = &self.counters;
        Counters::add(&c.modelled_ns, spin_ns(self.latency.wait_completion_ns()));
        Counters::add(&c.bypass_revocations, 1);
    }

    /// Counts a drain that began at `t0` and waited for `waited` sections.
    fn count_drain(&self, t0: Instant, waited: u64) {
        let c = &self.counters;
        Counters::add(&c.drains, 1);
        Counters::add(&c.drain_waited, waited);
        Counters::add(
            &c.drain_ns,
            u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX),
        );
    }
}
