//! The invalidation epoch of a device's translations: a value that changes
//! whenever the unit carries out an invalidation that could change what the
//! device's IOVAs translate to. A cache of translations kept *outside* the
//! unit (vm-memory's `Iotlb`, in `vm_iommu`) stays valid exactly as long as
//! the epoch it was filled under.
//!
//! # Why a cache checked this way is never stale after a wait
//!
//! The epoch is read inside an open translation section (after `begin`'s
//! store and light fence), like every IOTLB load of a translation. An
//! invalidation bumps the counters it is made of before the drain at its
//! wait. By the drain's fence pair (see `hw`'s module documentation): if
//! the drain did not see the section, the section's epoch load sees the
//! bump and the cache is dropped; if it did, the wait waits for the section
//! to end. Either way no access through the cache uses a revoked
//! translation once the wait has completed. Adding a mapping needs no
//! invalidation; a cache miss then asks the unit.
//!
//! A deferred unmap's stale window ends here too: reading the epoch checks
//! the domain's expiry deadline first, as every IOTLB hit does, so a cache
//! of translations outlives a deferred unmap by no more than the deadline's
//! period even if no flush runs.
//!
//! # The hook this needs from `hw`
//!
//! `hw` exposes no epoch, so this file reads the counters it is made of
//! through crate-internal fields: the IOTLB's global and per-domain
//! generations and its per-domain page-selective count, and the device's
//! context word. The minimal public hook that would replace it is
//! `Unit::invalidation_epoch(sid) -> u64`, with the contract above ("read
//! inside a section; changes whenever an invalidation that can affect
//! `sid` is carried out"). Everything else in `access` uses `hw`'s public
//! API only.

use crate::hw::iotlb::Iotlb;
use crate::hw::{ContextEntry, SourceId, Unit};
use crate::sync::barrier::Barrier;

/// What a device's translations were derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceEpoch {
    /// The device's context (a context change needs no IOTLB invalidation).
    ctx: Option<ContextEntry>,
    /// Global + domain generation + page-selective count of its domain.
    inv: u64,
}

/// The device's epoch now. Call it inside an open translation section.
pub(crate) fn device_epoch(unit: &Unit, sid: SourceId) -> DeviceEpoch {
    let ctx = unit.context(sid);
    let inv = match ctx {
        Some(ContextEntry::Translated { did, .. }) => {
            let iotlb = &unit.shared.iotlb;
            // The domain's expiry deadline, as the unit's own hit path
            // checks it: past it, the domain's translations are dropped
            // (a generation bump) and the epoch below moves, so a cache
            // filled before it is not served from after it, whatever
            // became of the deferred flush (see `Iotlb::expire`).
            let dl = iotlb.deadline(did);
            if dl != 0 {
                let now = iotlb.clock().now();
                if Iotlb::due(dl, now) {
                    iotlb.expire(did, dl, now, Barrier::default_for_process());
                }
            }
            // Acquire loads both (see `Iotlb::gen` and `Iotlb::ticket`):
            // they pair with the invalidations' Release bumps. Each counter
            // only grows, so the sum moves whenever one of them does.
            let gen = iotlb.gen(did);
            gen.wrapping_add(iotlb.ticket(did, gen).psi)
        }
        // Pass-through: what the device reaches changes with its context
        // (seen in `ctx`) and when RAM becomes a bounce pool's, which an
        // untranslated span cached before must not cover (Acquire: a new
        // count comes with the pool's bits, which the refill then sees).
        Some(ContextEntry::PassThrough) => unit.memory().bounce_generation(),
        // Blocked or absent: only a context change.
        _ => 0,
    };
    DeviceEpoch { ctx, inv }
}
