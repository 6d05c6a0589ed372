//! A CPU's cover cache: where its domain's expiry deadline word lives in
//! the unit it spans, so that a deferred unmap's cover check (an armed
//! deadline bounds its stale window; see [`DmaDomain::cover_unmap`]) is
//! one compare and one load, not a walk of the domain's unit list and a
//! lookup of each unit and of the domain's counters in its IOTLB.
//!
//! The cache only finds the word: the load, its ordering and the arming
//! when no deadline covers the unmap are `DmaDomain::cover_unmap`'s,
//! unchanged. A domain spanning several units takes that path whole.

use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;

use super::domain::DmaDomain;
use crate::hw::iotlb::Iotlb;
use crate::sync::AtomicU64;

/// See the module documentation. Used with one domain only (its owner's
/// `Work`, whose domain never changes).
#[derive(Debug, Default)]
pub(crate) struct CoverCache {
    /// The unit mask `one` was found for.
    mask: u64,
    /// The deadline word when `mask` names exactly one unit.
    one: Option<WordRef>,
}

/// The address of a deadline word in a unit's IOTLB.
#[derive(Debug)]
struct WordRef(NonNull<AtomicU64>);

// SAFETY: a `WordRef` is only read through (`AtomicU64` is `Sync`), and
// only while its word lives (see `CoverCache::cover`).
unsafe impl Send for WordRef {}
// SAFETY: as above.
unsafe impl Sync for WordRef {}

impl CoverCache {
    /// Makes sure an expiry deadline covers the unmap just queued in each
    /// unit of `units` (the mask read after the clear), as
    /// `d.cover_unmap(units)` does. `d` must be the one domain this cache
    /// is used with.
    #[inline(always)]
    pub(crate) fn cover(&mut self, d: &DmaDomain, units: u64) {
        if units == self.mask {
            if let Some(w) = &self.one {
                // SAFETY: the word is in the IOTLB of a unit of `d`'s
                // system (`cover_slow` took it from `d`); `d` keeps the
                // system alive and a system never drops a unit, so the
                // word outlives every call with `d`. Relaxed: as
                // `Iotlb::cover_unmap_with`'s load, for which this is.
                if Iotlb::covers(unsafe { w.0.as_ref() }.load(Relaxed)) {
                    return;
                }
            }
        }
        self.cover_slow(d, units);
    }

    /// [`cover`](Self::cover) when the mask changed, the domain spans
    /// more than one unit, or no deadline covers the unmap: finds the
    /// word again, then the domain's own cover (which arms).
    #[cold]
    #[inline(never)]
    fn cover_slow(&mut self, d: &DmaDomain, units: u64) {
        if units != self.mask {
            let words = d.deadline_words(units);
            self.one = match words[..] {
                [w] => Some(WordRef(NonNull::from(w))),
                _ => None,
            };
            self.mask = units;
        }
        d.cover_unmap(units);
    }
}
