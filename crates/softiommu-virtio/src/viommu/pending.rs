//! [`Pending`]: the IOTLB invalidations one round of requests owes the
//! unit, coalesced — one span per domain id, however many UNMAPs the
//! round held — and the table pages to free once they have completed.

use std::time::Duration;

use softiommu::hw::{QiError, Unit};
use softiommu::pgtable::IotlbGather;

/// What the UNMAPs of one round left to invalidate.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// `(did, first, last)`: the span of every range unmapped in `did`.
    spans: Vec<(u16, u64, u64)>,
    /// Table pages the unmaps unlinked.
    pub(crate) gather: IotlbGather,
    /// The domain ids of the last flush that failed: their endpoints may
    /// still reach what was unmapped.
    pub(crate) failed: Vec<u16>,
}

impl Pending {
    /// Adds `[first, last]` of `did`, widening that domain's span.
    pub(crate) fn add(&mut self, did: u16, first: u64, last: u64) {
        match self.spans.iter_mut().find(|s| s.0 == did) {
            Some(s) => {
                s.1 = s.1.min(first);
                s.2 = s.2.max(last);
            }
            None => self.spans.push((did, first, last)),
        }
    }

    /// Whether nothing is owed.
    pub(crate) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Invalidates every span (one descriptor per domain: page-selective
    /// with a covering mask, or domain-selective if none fits) and waits
    /// for the wait descriptor behind them — at most `timeout`, and not
    /// once `give_up` says so — then frees the gathered pages.
    /// Returns the descriptors submitted. On a queue error, a timeout or
    /// giving up, the pages are
    /// kept (leaked, never freed early), the domain ids are left in
    /// [`failed`](Self::failed) and the error returned.
    pub(crate) fn flush(
        &mut self,
        unit: &Unit,
        timeout: Duration,
        give_up: impl FnMut() -> bool,
    ) -> Result<u64, QiError> {
        if self.spans.is_empty() {
            return Ok(0);
        }
        let mut batch = unit.batch();
        for &(did, first, last) in &self.spans {
            // `last - first + 1` cannot wrap: spans lie inside the 48-bit
            // input range.
            batch.range(did, first, last - first + 1);
        }
        let n = batch.len() as u64;
        self.failed.clear();
        self.failed.extend(self.spans.iter().map(|s| s.0));
        self.spans.clear();
        match batch.wait_bounded(timeout, give_up) {
            Ok(()) => {
                self.failed.clear();
                let _ = self.gather.complete();
                Ok(n)
            }
            Err(e) => {
                // No proof the invalidation completed: hand the pages to a
                // fresh gather's drop, which leaks them.
                let _ = self.gather.defer();
                Err(e)
            }
        }
    }
}
