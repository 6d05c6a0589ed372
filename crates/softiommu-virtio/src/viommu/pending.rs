//! [`Pending`]: the IOTLB invalidations one round of requests owes the
//! unit, coalesced — one descriptor per domain id, however many UNMAPs
//! the round held — and the table pages to free once they have completed.
//!
//! The descriptor is page-selective when the aligned block covering the
//! round's ranges is at most [`COVER_SLACK`] times the pages they held
//! (a lone UNMAP's range, or neighbours), and domain-selective otherwise,
//! as Linux's VT-d driver flushes a lazy flush queue with one
//! domain-selective invalidation (`intel_flush_iotlb_all`). The unit's
//! page-selective invalidation visits the set of every page of its block
//! (a block of 2^am pages costs 2^am reads of a set's two fingerprint
//! words, a read-modify-write each, and an entry lock per way whose fingerprint
//! matches; more once a large leaf was cached; every entry of the IOTLB
//! locked past 256 pages, its default sets), while a
//! domain-selective one is a generation bump whose price is a walk for
//! each of the domain's translations still in use: scattered ranges of
//! one round (one read's header, data and status IOVAs, from different
//! size classes) made a covering block of thousands of pages, whose
//! invalidation cost the round more than its requests.

use std::time::Duration;

use softiommu::hw::{QiError, Unit};
use softiommu::mem::PAGE_SHIFT;
use softiommu::pgtable::IotlbGather;

/// A round's covering block may be this many times the pages its
/// ranges held and still be invalidated page by page; past it, the
/// domain's translations are invalidated at once.
pub(crate) const COVER_SLACK: u64 = 2;

/// The pages of the aligned power-of-two block covering `[first, last]`
/// (what a page-selective descriptor for the span must invalidate).
fn covering_pages(first: u64, last: u64) -> u64 {
    let x = (first >> PAGE_SHIFT) ^ (last >> PAGE_SHIFT);
    if x == 0 {
        1
    } else {
        1u64.checked_shl(64 - x.leading_zeros()).unwrap_or(u64::MAX)
    }
}

/// Whether a domain's round of ranges spanning `[first, last]` and
/// holding `pages` pages in all is invalidated domain-selectively.
pub(crate) fn domain_selective(first: u64, last: u64, pages: u64) -> bool {
    covering_pages(first, last) > pages.saturating_mul(COVER_SLACK)
}

/// What the UNMAPs of one round left to invalidate.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// `(did, first, last, pages)`: the span of every range unmapped in
    /// `did`, and the pages those ranges held.
    spans: Vec<(u16, u64, u64, u64)>,
    /// Table pages the unmaps unlinked.
    pub(crate) gather: IotlbGather,
    /// The domain ids of the last flush that failed: their endpoints may
    /// still reach what was unmapped.
    pub(crate) failed: Vec<u16>,
    /// The table pages of flushes that failed: no proof their
    /// invalidation completed, so kept (counted against the device's
    /// quota) until a reset whose changes all drain
    /// ([`release_held`](Self::release_held)); leaked if the device goes
    /// away first.
    held: Vec<IotlbGather>,
}

impl Pending {
    /// Adds `[first, last]` of `did`, widening that domain's span.
    pub(crate) fn add(&mut self, did: u16, first: u64, last: u64) {
        // Inside the 48-bit input range: no overflow.
        let pages = ((last >> PAGE_SHIFT) - (first >> PAGE_SHIFT)).saturating_add(1);
        match self.spans.iter_mut().find(|s| s.0 == did) {
            Some(s) => {
                s.1 = s.1.min(first);
                s.2 = s.2.max(last);
                s.3 = s.3.saturating_add(pages);
            }
            None => self.spans.push((did, first, last, pages)),
        }
    }

    /// Table pages kept by failed flushes.
    pub(crate) fn held_frames(&self) -> u64 {
        self.held
            .iter()
            .map(|g| g.freed_tables().len() as u64)
            .fold(0, u64::saturating_add)
    }

    /// Whether failed flushes kept table pages.
    pub(crate) fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// Frees the pages failed flushes kept: the caller has switched every
    /// endpoint's context and the change has drained, so no walk can
    /// reach them.
    pub(crate) fn release_held(&mut self) {
        for mut g in self.held.drain(..) {
            let _ = g.complete();
        }
    }

    /// Whether nothing is owed.
    pub(crate) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Invalidates every span (one descriptor per domain: page-selective
    /// with a covering mask, or domain-selective if none fits or the
    /// covering block is more than [`COVER_SLACK`] times the pages its
    /// ranges held: [`domain_selective`]) and waits
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
        for &(did, first, last, pages) in &self.spans {
            if domain_selective(first, last, pages) {
                batch.domain(did);
            } else {
                // `last - first + 1` cannot wrap: spans lie inside the
                // 48-bit input range.
                batch.range(did, first, last - first + 1);
            }
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
                // No proof the invalidation completed: the pages are kept
                // with their gather, never freed early.
                if !self.gather.freed_tables().is_empty() {
                    self.held.push(std::mem::take(&mut self.gather));
                }
                let _ = self.gather.defer();
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 1 << PAGE_SHIFT;

    /// A lone range (a strict UNMAP, a size-aligned IOVA block) and
    /// neighbours are invalidated page by page; one round's ranges
    /// scattered over a block many times their size (a read's header
    /// and status IOVAs far from its data's) domain-selectively.
    #[test]
    fn a_round_is_page_selective_only_when_its_block_is_tight() {
        // One page; 32 pages at a 32-page boundary (a 128 KiB read).
        assert!(!domain_selective(0x10_0000, 0x10_0000 + P - 1, 1));
        assert!(!domain_selective(0x20_0000, 0x20_0000 + 32 * P - 1, 32));
        // Three adjacent pages: a block of 4, within the slack.
        let mut p = Pending::default();
        for i in 0..3 {
            p.add(1, 0x40_0000 + i * P, 0x40_0000 + (i + 1) * P - 1);
        }
        let (did, first, last, pages) = p.spans[0];
        assert_eq!((did, pages), (1, 3));
        assert!(!domain_selective(first, last, pages));
        // A page and 32 pages 1 GiB apart: one domain-selective.
        let mut p = Pending::default();
        p.add(1, 0x4000_0000, 0x4000_0000 + P - 1);
        p.add(1, 0x8000_0000, 0x8000_0000 + 32 * P - 1);
        let (_, first, last, pages) = p.spans[0];
        assert_eq!(pages, 33);
        assert!(domain_selective(first, last, pages));
        assert_eq!(covering_pages(0, u64::MAX), 1 << 52);
    }
}
