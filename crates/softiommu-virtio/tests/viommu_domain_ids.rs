//! The virtio-iommu shares its unit with the host's own DMA domains: the
//! domain ids of its `domain_range` are its own (the unit's claim), so a
//! guest-chosen domain never aliases a domain the guest did not make, and
//! the host never takes one of the guest's ids.

mod viommu_common;

use std::sync::Arc;

use softiommu::dma::{DmaDirection, DmaDomain, DmaDomainConfig, DmaError};
use softiommu::hw::{Access, HwError, System, TranslateError, UnitConfig};
use softiommu::mem::PhysMemory;
use softiommu_virtio::viommu::{Status, ViommuDevice, ViommuError};
use viommu_common::*;

#[test]
fn a_host_domain_cannot_take_a_guest_domain_id_and_the_guest_keeps_its_own() {
    let mut r = rig();
    // The host's DMA domain 1 on the same unit (the default id), device B.
    let host = DmaDomain::new(
        r.system.clone(),
        DmaDomainConfig {
            did: 1,
            ..DmaDomainConfig::default()
        },
    )
    .unwrap();
    assert!(matches!(
        host.attach(B, u64::MAX, false),
        Err(DmaError::Hw(HwError::DomainIdClaimed { did: 1 }))
    ));
    assert_eq!(r.system.unit(r.unit).unwrap().context(B), None);
    // The guest's domain 1 is its own: made, attached and mapped.
    assert_eq!(r.drv.attach(1, EA, 0).unwrap(), Some(Status::Ok));
    let phys = r.ram(0);
    assert_eq!(
        r.drv.map(1, 0x10_0000, 0x10_0fff, phys, RW).unwrap(),
        Some(Status::Ok)
    );
    assert!(r.reach(A, 0x10_0000, Access::Read).is_ok());
    // And the host still cannot join it.
    assert!(matches!(
        host.attach(B, u64::MAX, false),
        Err(DmaError::Hw(HwError::DomainIdClaimed { did: 1 }))
    ));
}

#[test]
fn a_guest_domain_id_never_reaches_a_host_domain_of_that_id() {
    // The host's domain 5 exists, its device attached, a buffer mapped;
    // a virtio-iommu whose range would hold 5 is refused at creation, and
    // one whose range leaves it out works beside it.
    let mem = Arc::new(PhysMemory::new(RAM).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).unwrap();
    for sid in [A, B] {
        sys.assign(sid, unit).unwrap();
    }
    let system = Arc::new(sys);
    let host = DmaDomain::new(
        system.clone(),
        DmaDomainConfig {
            did: 5,
            ..DmaDomainConfig::default()
        },
    )
    .unwrap();
    let hdev = host.attach(B, u64::MAX, false).unwrap();
    let buf = mem.alloc_zeroed_frames(0).unwrap();
    let iova = host
        .cpu()
        .map(&hdev, buf, 4096, DmaDirection::Bidirectional)
        .unwrap();
    let cfg = |range| softiommu_virtio::viommu::ViommuConfig {
        endpoints: vec![A],
        domain_range: range,
        ..softiommu_virtio::viommu::ViommuConfig::default()
    };
    assert!(matches!(
        ViommuDevice::spawn(cfg((1, 1023)), system.clone(), unit),
        Err(ViommuError::Hw(HwError::DomainIdInUse { did: 5 }))
    ));
    let dev = ViommuDevice::spawn(cfg((6, 1023)), system.clone(), unit).unwrap();
    let mut drv = softiommu_virtio::viommu::ViommuDriver::probe(
        dev.transport().clone(),
        mem.clone(),
        Default::default(),
    )
    .unwrap();
    // Domain 5 is not the guest's to name.
    assert_eq!(drv.attach(5, EA, 0).unwrap(), Some(Status::Range));
    assert_eq!(
        drv.map(5, iova, iova + 0xfff, buf, RW).unwrap(),
        Some(Status::Range)
    );
    assert!(matches!(
        reach_in(&system, unit, A, iova, Access::Read),
        Err(TranslateError::NoContext { .. } | TranslateError::ContextBlocked { .. })
    ));
    // The host's device still reaches its buffer.
    assert!(reach_in(&system, unit, B, iova, Access::Read).is_ok());
}
