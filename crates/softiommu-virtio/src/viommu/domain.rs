//! [`Domain`]: one virtio-iommu domain — a unit domain id, its VT-d table
//! (absent for a bypass domain), and the record of what each MAP created,
//! the unit UNMAP works in (§5.13.6.4).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, IotlbGather, Perm, PgtableError, VtdConfig, VtdPageTable};

use super::status::Status;
use crate::spec::iommu as s;

/// One MAP's mapping: `[start, end]` (inclusive) to `phys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingRecord {
    /// First IOVA.
    pub start: u64,
    /// Last IOVA (inclusive).
    pub end: u64,
    /// Physical address of `start`.
    pub phys: u64,
    /// The MAP's flags (`VIRTIO_IOMMU_MAP_F_*`).
    pub flags: u32,
}

/// A domain of the device.
#[derive(Debug)]
pub(crate) struct Domain {
    /// The unit's domain id.
    pub(crate) did: u16,
    /// The table its endpoints translate through; `None` for a bypass
    /// domain (its endpoints are pass-through).
    pub(crate) table: Option<VtdPageTable>,
    /// Mappings by first IOVA; disjoint.
    pub(crate) maps: BTreeMap<u64, MappingRecord>,
    /// Endpoints attached.
    pub(crate) endpoints: u32,
}

/// Why an UNMAP found nothing it may remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Split {
    /// A mapping crosses the range's edge (§5.13.6.4 example 4).
    Crosses,
}

impl Domain {
    /// A domain with id `did`: a fresh, empty table, or none for bypass.
    pub(crate) fn new(did: u16, bypass: bool, mem: &Arc<PhysMemory>) -> Result<Self, Status> {
        let table = if bypass {
            None
        } else {
            Some(VtdPageTable::new(mem.clone(), VtdConfig::coherent()).map_err(table_status)?)
        };
        Ok(Self {
            did,
            table,
            maps: BTreeMap::new(),
            endpoints: 0,
        })
    }

    /// Whether any mapping meets `[start, end]`: the mapping with the
    /// largest start at or before `end` is the one that reaches furthest
    /// (mappings are disjoint), so it alone decides.
    pub(crate) fn overlaps(&self, start: u64, end: u64) -> bool {
        self.maps
            .range(..=end)
            .next_back()
            .is_some_and(|(_, m)| m.end >= start)
    }

    /// Maps `[start, end]` to `phys` in the table and records it; the
    /// caller checked alignment, ranges and overlap. On error nothing was
    /// mapped (the table's contract).
    pub(crate) fn map(&mut self, rec: MappingRecord, perm: Perm) -> Result<(), Status> {
        let table = self.table.as_ref().ok_or(Status::Inval)?;
        let len = rec.end - rec.start + 1;
        table
            .map(rec.start, rec.phys, len, perm)
            .map_err(table_status)?;
        self.maps.insert(rec.start, rec);
        Ok(())
    }

    /// The mappings wholly inside `[start, end]`, into `out` (cleared
    /// first), or [`Split::Crosses`] if one crosses an edge of it (then
    /// nothing is to be removed).
    pub(crate) fn covered(
        &self,
        start: u64,
        end: u64,
        out: &mut Vec<MappingRecord>,
    ) -> Result<(), Split> {
        out.clear();
        // The usual UNMAP names exactly one MAP's range: one lookup. The
        // mappings are disjoint, so none other meets `[start, end]` and
        // none crosses its edges.
        if let Some(m) = self.maps.get(&start).filter(|m| m.end == end) {
            out.push(*m);
            return Ok(());
        }
        if let Some((_, m)) = self.maps.range(..start).next_back() {
            if m.end >= start {
                return Err(Split::Crosses);
            }
        }
        if let Some((_, m)) = self.maps.range(..=end).next_back() {
            if m.end > end {
                return Err(Split::Crosses);
            }
        }
        out.extend(
            self.maps
                .range((Bound::Included(start), Bound::Included(end)))
                .map(|(_, m)| *m),
        );
        Ok(())
    }

    /// Unmaps `m` (a recorded mapping) from the table into `gather` and
    /// forgets it. A table that refuses (only if its contract was broken)
    /// leaves the record, so it still says what may be reachable.
    pub(crate) fn unmap(
        &mut self,
        m: &MappingRecord,
        gather: &mut IotlbGather,
    ) -> Result<(), Status> {
        let table = self.table.as_ref().ok_or(Status::Inval)?;
        table
            .unmap(m.start, m.end - m.start + 1, gather)
            .map_err(table_status)?;
        self.maps.remove(&m.start);
        Ok(())
    }

    /// Installs `m` again after [`unmap`](Self::unmap) removed it (an
    /// UNMAP that failed midway undoing itself): the same range, address
    /// and access, so the same leaves. Fails (nothing mapped) only when
    /// the table needs a page the reserve cannot give.
    pub(crate) fn reinstall(&mut self, m: &MappingRecord) -> Result<(), Status> {
        self.map(*m, perm_of(m.flags))
    }
}

/// The access a MAP's `flags` grant (`MMIO` changes none).
pub(crate) fn perm_of(flags: u32) -> Perm {
    let mut perm = Perm::NONE;
    if flags & s::MAP_F_READ != 0 {
        perm = perm | Perm::READ;
    }
    if flags & s::MAP_F_WRITE != 0 {
        perm = perm | Perm::WRITE;
    }
    perm
}

/// The status a table error becomes: out of frames is `NOMEM`, anything
/// else (the checks before the call exclude it) `DEVERR`.
fn table_status(e: PgtableError) -> Status {
    match e {
        PgtableError::Mem(softiommu::mem::MemError::OutOfFrames { .. }) => Status::NoMem,
        _ => Status::DevErr,
    }
}
