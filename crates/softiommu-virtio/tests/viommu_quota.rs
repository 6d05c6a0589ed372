//! The device's page-table frame quota (`ViommuConfig::table_frames`):
//! a guest cannot drain the memory reserve the unit's other users share,
//! by mapping sparsely or by making domains. Past the quota a MAP is
//! undone and answered `NOMEM`, an ATTACH that would make a domain is
//! answered `NOMEM`, and nothing else changes.

mod viommu_common;

use std::sync::Arc;

use softiommu::hw::{Access, System, TranslateError, UnitConfig};
use softiommu::mem::PhysMemory;
use softiommu_virtio::spec::iommu as s;
use softiommu_virtio::viommu::{
    encode, Status, ViommuConfig, ViommuDevice, ViommuDriverConfig, ViommuError,
};
use viommu_common::*;

/// 1 GiB: a MAP there needs a level-2 and a level-1 table of its own.
const GIB: u64 = 1 << 30;

fn quota_rig(frames: u64) -> Rig {
    rig_with(
        ViommuConfig {
            table_frames: frames,
            ..config()
        },
        ViommuDriverConfig::default(),
    )
}

/// Four frames: domain 1's root and the three tables (one per 2 MiB,
/// 1 GiB and 512 GiB region) its first 4 KiB mapping may take. A second
/// MAP may take three more: `NOMEM`, nothing mapped or reachable, no
/// frame taken; a second translated domain's root would be a fifth frame:
/// `NOMEM`, no domain made, the endpoint left blocked. The first mapping
/// stands throughout.
#[test]
fn a_map_past_the_frame_quota_is_nomem_and_maps_nothing() {
    let mut r = quota_rig(4);
    let (p0, p1) = (r.ram(0), r.ram(0));
    r.attach_ok(1, EA);
    r.map_ok(1, 0, 0xfff, p0);
    assert_eq!(
        r.drv.map(1, GIB, GIB + 0xfff, p1, RW).unwrap(),
        Some(Status::NoMem)
    );
    assert_eq!(r.ranges(1), [(0, 0xfff)]);
    assert!(matches!(
        r.reach(A, GIB, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
    assert!(r.reach(A, 0, Access::Write).is_ok());
    assert_eq!(r.drv.attach(2, EB, 0).unwrap(), Some(Status::NoMem));
    assert_eq!(r.dev.mappings(2), None, "no domain 2 made");
    assert_eq!(r.dev.attached(EB), None);
}

/// The quota counts what the tables hold: with room for two worst cases
/// (root + 3 + 3), MAPs in two regions both fit, and a third is refused.
#[test]
fn maps_fit_until_their_worst_case_would_pass_the_quota() {
    let mut r = quota_rig(7);
    let (p0, p1, p2) = (r.ram(0), r.ram(0), r.ram(0));
    r.attach_ok(1, EA);
    r.map_ok(1, 0, 0xfff, p0);
    r.map_ok(1, GIB, GIB + 0xfff, p1);
    assert_eq!(
        r.drv.map(1, 2 * GIB, 2 * GIB + 0xfff, p2, RW).unwrap(),
        Some(Status::NoMem)
    );
    assert_eq!(r.ranges(1), [(0, 0xfff), (GIB, GIB + 0xfff)]);
}

/// Table frames an UNMAP unlinked stay taken until the round's
/// invalidation completes, and count against the quota meanwhile. In one
/// notification, each MAP of a whole 2 MiB region at an address that is
/// not 2 MiB-aligned in RAM takes a leaf table, and the UNMAP after it
/// unlinks that table into the round's gather: the pairs cannot take
/// more frames from the reserve than the quota (before, each MAP saw only
/// the linked frames, and every pair passed).
#[test]
fn frames_waiting_for_the_rounds_invalidation_count_against_the_quota() {
    const MIB2: u64 = 2 << 20;
    let mut r = quota_rig(8);
    // 4 MiB of RAM; the mapping starts 4 KiB into it, so no 2 MiB leaf.
    let p = r.ram(10) + 0x1000;
    r.attach_ok(1, EA);
    for i in 0..6u64 {
        let at = GIB + i * MIB2;
        r.drv
            .queue(
                &encode::map(1, at, at + MIB2 - 1, p, RW),
                s::TAIL_LEN as u32,
            )
            .unwrap();
        r.drv
            .queue(&encode::unmap(1, at, at + MIB2 - 1), s::TAIL_LEN as u32)
            .unwrap();
    }
    let done = r.drv.sync().unwrap();
    let maps: Vec<Option<Status>> = done.iter().step_by(2).map(|c| c.status()).collect();
    let ok = maps.iter().filter(|m| **m == Some(Status::Ok)).count();
    let nomem = maps.iter().filter(|m| **m == Some(Status::NoMem)).count();
    assert_eq!(ok + nomem, 6, "{maps:?}");
    assert!(nomem >= 1, "every pair passed the quota: {maps:?}");
    // Once refused, refused for the rest of the round.
    assert!(
        maps[ok..].iter().all(|m| *m == Some(Status::NoMem)),
        "{maps:?}"
    );
    assert!(r.ranges(1).is_empty());
}

/// A quota of no frame at all is refused when the device is built.
#[test]
fn a_quota_of_zero_frames_is_refused() {
    let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
    let mut sys = System::new(mem);
    let unit = sys.add_unit(UnitConfig::default()).unwrap();
    for sid in [A, B] {
        sys.assign(sid, unit).unwrap();
    }
    let r = ViommuDevice::spawn(
        ViommuConfig {
            table_frames: 0,
            ..config()
        },
        Arc::new(sys),
        unit,
    );
    assert!(matches!(
        r,
        Err(ViommuError::InvalidConfig {
            field: "table_frames",
            value: 0
        })
    ));
}

/// The mapping quota (`ViommuConfig::max_mappings`): each MAP's record
/// costs host memory and an UNMAP removes every record its range holds,
/// so a guest mapping one 4 KiB page at a time (the table quota alone
/// allowed millions of records) is stopped at the quota, across its
/// domains, with `NOMEM` and nothing mapped; an UNMAP makes room again.
#[test]
fn a_map_past_the_mapping_quota_is_nomem_and_maps_nothing() {
    let mut r = rig_with(
        ViommuConfig {
            max_mappings: 3,
            ..config()
        },
        ViommuDriverConfig::default(),
    );
    let p = r.ram(0);
    r.attach_ok(1, EA);
    r.attach_ok(2, EB);
    r.map_ok(1, 0x1000, 0x1fff, p);
    r.map_ok(1, 0x3000, 0x3fff, p);
    r.map_ok(2, 0x1000, 0x1fff, p);
    assert_eq!(
        r.drv.map(1, 0x5000, 0x5fff, p, RW).unwrap(),
        Some(Status::NoMem)
    );
    assert_eq!(r.ranges(1), [(0x1000, 0x1fff), (0x3000, 0x3fff)]);
    assert!(matches!(
        r.reach(A, 0x5000, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
    assert_eq!(r.drv.unmap(2, 0, 0xffff).unwrap(), Some(Status::Ok));
    r.map_ok(1, 0x5000, 0x5fff, p);
    assert_eq!(
        ViommuDevice::spawn(
            ViommuConfig {
                max_mappings: 0,
                ..config()
            },
            r.system.clone(),
            r.unit,
        )
        .map(|_| ()),
        Err(ViommuError::InvalidConfig {
            field: "max_mappings",
            value: 0
        })
    );
}
