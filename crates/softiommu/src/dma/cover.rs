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
    /// The deadline word when `mask` names exactly one unit, found.
    one: Option<WordRef>,
    /// The domain the word was found in (checked in debug builds).
    domain: usize,
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
                debug_assert_eq!(self.domain, std::ptr::from_ref(d) as usize);
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
            // Kept only for a mask of exactly one unit whose word was
            // found: a mask with a unit not found (yet) is looked at again
            // at the next unmap, never cached short of a unit.
            let (one, mask) = match words[..] {
                [w] if units.count_ones() == 1 => (Some(WordRef(NonNull::from(w))), units),
                _ if units.count_ones() as usize == words.len() => (None, units),
                _ => (None, 0),
            };
            self.one = one;
            self.mask = mask;
            self.domain = std::ptr::from_ref(d) as usize;
        }
        d.cover_unmap(units);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::dma::DmaPolicy;

    #[test]
    fn a_mask_is_kept_only_with_every_units_word_found() {
        let p = crate::Platform::builder()
            .policy(DmaPolicy::Deferred)
            .device(crate::hw::SourceId(0x100))
            .build()
            .unwrap();
        let d = &*p.domain;
        let mut c = CoverCache::default();
        // Bit 1 names no unit of the domain (one joined): not kept, so the
        // next unmap looks again rather than skip that unit for good.
        c.cover(d, 0b11);
        assert!(c.one.is_none() && c.mask == 0, "{c:?}");
        c.cover(d, 0b1);
        assert!(c.one.is_some() && c.mask == 0b1, "{c:?}");
        assert!(
            p.unit(0).unwrap().expiry_armed(d.did()),
            "armed as the domain's own cover arms it"
        );
    }
}
