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

#![deny(clippy::indexing_slicing)]

use std::time::Instant;

use super::descriptor::covering_mask;
use super::error::QiError;
use super::latency::spin_ns;
use super::unit::{Counters, Shared, Unit};

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
        let page = if len == 0 {
            None
        } else {
            covering_mask(iova, len, sh.limits.mamv)
        };
        match page {
            Some((addr, am)) => {
                sh.iotlb.invalidate_pages(did, addr, u32::from(am));
            }
            None => sh.iotlb.invalidate_domain(did),
        }
        sh.drain_direct();
        Ok(())
    }
}

impl Shared {
    /// Drains every translation in flight on the calling thread, without
    /// the queue, and charges and counts it as a revocation. The caller
    /// must have checked that it holds no section of this unit
    /// (`check_caller`): the drain would wait for itself.
    pub(crate) fn drain_direct(&self) {
        let t0 = Instant::now();
        let st = self.slots.drain(self.barrier);
        let c = &self.counters;
        Counters::add(&c.drains, 1);
        Counters::add(&c.drain_waited, st.waited);
        Counters::add(
            &c.drain_ns,
            u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX),
        );
        Counters::add(&c.modelled_ns, spin_ns(self.latency.wait_completion_ns()));
        Counters::add(&c.bypass_revocations, 1);
    }
}
