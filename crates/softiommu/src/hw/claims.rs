//! Domain-id claims: a range of a unit's domain ids reserved for one
//! owner, such as a paravirtual IOMMU whose guest chooses its domain ids
//! while the host's own DMA domains share the unit.
//!
//! A claimed id is given to a translated context only through the claim
//! ([`Unit::attach_bounded_claimed`](super::Unit::attach_bounded_claimed));
//! anyone else's context with it is refused
//! ([`HwError::DomainIdClaimed`](super::HwError::DomainIdClaimed)), and a
//! range is claimed only while no context uses any of its ids and no other
//! claim overlaps it. So an owner's ids never alias a domain it did not
//! make (nothing cached or mapped under another owner's use of the id can
//! reach its devices, nor its tables another's), for as long as the claim
//! lives.
//!
//! A claimed id is a guest's: a walk of its tables that ends on a leaf
//! over a bounce pool's frame (RAM the guest mapped before the host's DMA
//! layer took it for a pool) faults `BounceFrame` instead of filling the
//! IOTLB; making a pool invalidates every unit's IOTLB, so no entry cached
//! before serves it. One bit per id, read by the walk (slow path) only.

use std::fmt;
use std::sync::Weak;

use super::unit::Shared;

/// The claims of one unit.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    /// Claimed ranges (inclusive) and their tokens.
    ranges: Vec<(u16, u16, u64)>,
    /// The next token (0 is never one).
    next: u64,
}

impl Claims {
    /// The token of the claim holding `did`, if any.
    pub(crate) fn owner_of(&self, did: u16) -> Option<u64> {
        self.ranges
            .iter()
            .find(|&&(lo, hi, _)| (lo..=hi).contains(&did))
            .map(|&(_, _, t)| t)
    }

    /// The first id of `lo..=hi` another claim holds.
    pub(crate) fn overlap(&self, lo: u16, hi: u16) -> Option<u16> {
        self.ranges
            .iter()
            .filter(|&&(a, b, _)| a <= hi && lo <= b)
            .map(|&(a, _, _)| a.max(lo))
            .min()
    }

    /// Records `lo..=hi` (checked free by the caller) and returns its token.
    pub(crate) fn add(&mut self, lo: u16, hi: u16) -> u64 {
        self.next += 1;
        self.ranges.push((lo, hi, self.next));
        self.next
    }

    /// Forgets the claim with `token`; returns its range.
    pub(crate) fn remove(&mut self, token: u64) -> Option<(u16, u16)> {
        let i = self.ranges.iter().position(|&(_, _, t)| t == token)?;
        let (lo, hi, _) = self.ranges.swap_remove(i);
        Some((lo, hi))
    }
}

/// A range of domain ids reserved on one unit; made by
/// [`Unit::claim_domain_ids`](super::Unit::claim_domain_ids). Dropping it
/// gives the range back (contexts already using its ids keep them; no
/// other owner can take an id while a context uses it with another root).
pub struct DomainIdClaim {
    pub(crate) unit: Weak<Shared>,
    pub(crate) lo: u16,
    pub(crate) hi: u16,
    pub(crate) token: u64,
}

impl DomainIdClaim {
    /// The claimed ids, inclusive.
    pub fn range(&self) -> (u16, u16) {
        (self.lo, self.hi)
    }
}

impl fmt::Debug for DomainIdClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainIdClaim")
            .field("lo", &self.lo)
            .field("hi", &self.hi)
            .finish()
    }
}

impl Drop for DomainIdClaim {
    fn drop(&mut self) {
        if let Some(sh) = self.unit.upgrade() {
            sh.release_claim(self.token);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::hw::{ContextEntry, HwError, SourceId, Unit, UnitConfig};
    use crate::mem::PhysMemory;
    use crate::pgtable::{IoPageTable, VtdConfig, VtdPageTable};

    const T: Duration = Duration::from_secs(5);

    fn ctx(did: u16, table: &VtdPageTable) -> ContextEntry {
        ContextEntry::Translated {
            did,
            root: table.root(),
        }
    }

    #[test]
    fn claimed_ids_go_only_to_their_claimant_until_it_lets_go() {
        let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
        let unit = Unit::new(mem.clone(), UnitConfig::default()).unwrap();
        let other = Unit::new(mem.clone(), UnitConfig::default()).unwrap();
        let (a, b) = (SourceId(1), SourceId(2));
        let t = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        let u = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        unit.attach(a, ctx(3, &t)).unwrap();
        // An id a context uses cannot be claimed; nor a reversed range;
        // nothing is claimed by a refusal.
        assert_eq!(
            unit.claim_domain_ids(1, 10).unwrap_err(),
            HwError::DomainIdInUse { did: 3 }
        );
        assert!(matches!(
            unit.claim_domain_ids(9, 8),
            Err(HwError::DomainOutOfRange { did: 9, .. })
        ));
        let claim = unit.claim_domain_ids(4, 10).unwrap();
        assert_eq!(claim.range(), (4, 10));
        assert_eq!(
            unit.claim_domain_ids(10, 12).unwrap_err(),
            HwError::DomainIdInUse { did: 10 }
        );
        // Anyone else's context with a claimed id is refused, unchanged.
        assert_eq!(
            unit.attach(b, ctx(5, &u)).unwrap_err(),
            HwError::DomainIdClaimed { did: 5 }
        );
        assert_eq!(
            unit.set_context(b, Some(ctx(10, &u))).unwrap_err(),
            HwError::DomainIdClaimed { did: 10 }
        );
        assert_eq!(unit.context(b), None);
        // A claim of another unit claims nothing here.
        let foreign = other.claim_domain_ids(4, 10).unwrap();
        assert_eq!(
            unit.attach_bounded_claimed(&foreign, b, ctx(5, &u), T, || false)
                .unwrap_err(),
            HwError::DomainIdClaimed { did: 5 }
        );
        // The claimant's own.
        unit.attach_bounded_claimed(&claim, b, ctx(5, &u), T, || false)
            .unwrap();
        assert_eq!(unit.context(b), Some(ctx(5, &u)));
        // Ids outside the claim go on as before.
        unit.attach(a, ctx(11, &t)).unwrap();
        unit.detach(b).unwrap();
        drop(claim);
        unit.attach(b, ctx(5, &u)).unwrap();
        unit.detach(a).unwrap();
        unit.detach(b).unwrap();
        drop(foreign);
    }
}
