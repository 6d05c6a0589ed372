//! Tests of the soak's checker and of its report.

use std::sync::Arc;

use softiommu::hw::{SourceId, System, UnitConfig};
use softiommu::mem::PhysMemory;

use super::device::*;
use softiommu::hw::ContextEntry;
use softiommu::pgtable::{IoPageTable, VtdConfig, VtdPageTable};

/// The checker's frame look-up reports an access that lands in a
/// frame of IOMMU state (here a page-table root, reached by a
/// pass-through device, which reaches everything) and nothing for an
/// ordinary frame.
#[test]
fn an_access_landing_in_a_frame_of_iommu_state_is_reported() {
    let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).unwrap();
    let sid = SourceId(0x0100);
    sys.assign(sid, unit).unwrap();
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
    let u = sys.unit(unit).unwrap();
    u.attach(sid, ContextEntry::PassThrough).unwrap();
    let mut tr = u.translator().unwrap();
    let root = table.root();
    assert!(mem.is_iommu_frame(root));
    assert_eq!(iommu_state_at(&mem, &mut tr, sid, root + 8), Some(root + 8));
    let plain = mem.alloc_zeroed_frames(0).unwrap();
    assert_eq!(iommu_state_at(&mem, &mut tr, sid, plain), None);
}
