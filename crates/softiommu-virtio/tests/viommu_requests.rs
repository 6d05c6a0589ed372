//! The virtio-iommu device's requests as §5.13.6 defines them: features,
//! configuration, ATTACH/DETACH/MAP/UNMAP/PROBE, the UNMAP rules, and an
//! endpoint's reach through the unit before and after.

mod viommu_common;

use softiommu::hw::{Access, TranslateError};
use softiommu_virtio::spec::{self, iommu as s, reg};
use softiommu_virtio::viommu::{Status, INPUT_END, PAGE_SIZE_MASK};
use viommu_common::*;

#[test]
fn device_id_features_and_config() {
    let r = rig();
    let t = r.dev.transport();
    assert_eq!(t.read(reg::DEVICE_ID), 23);
    let f = r.drv.features();
    for bit in [
        s::F_INPUT_RANGE,
        s::F_DOMAIN_RANGE,
        s::F_MAP_UNMAP,
        s::F_PROBE,
        s::F_MMIO,
        s::F_BYPASS_CONFIG,
    ] {
        assert_ne!(f & 1 << bit, 0, "feature {bit}");
    }
    // §5.13.3.2: not both BYPASS and BYPASS_CONFIG.
    assert_eq!(f & 1 << s::F_BYPASS, 0);
    let g = r.drv.geometry();
    assert_eq!(g.page_size_mask, PAGE_SIZE_MASK);
    assert_eq!(PAGE_SIZE_MASK, 0x1000 | 0x20_0000 | 0x4000_0000);
    assert_eq!(g.input_range, (0, (1 << 48) - 1));
    assert_eq!(g.domain_range, (1, 1023));
    assert_eq!(g.bypass, 0);
    assert!(g.probe_size >= 48);
    assert_eq!(
        t.read(reg::STATUS) & spec::status::DRIVER_OK,
        spec::status::DRIVER_OK
    );
}

#[test]
fn attach_map_reach_unmap_fault() {
    let mut r = rig();
    let phys = r.ram(0);
    // Unattached, not bypass: no access reaches memory.
    assert!(matches!(
        r.reach(A, 0x10_0000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    r.attach_ok(1, EA);
    assert_eq!(r.dev.attached(EA), Some(1));
    r.map_ok(1, 0x10_0000, 0x10_0fff, phys);
    let got = r.reach(A, 0x10_0010, Access::Write).expect("mapped");
    assert_eq!(got.as_slice()[0].phys, phys + 0x10);
    assert_eq!(
        r.drv.unmap(1, 0x10_0000, 0x10_0fff).unwrap(),
        Some(Status::Ok)
    );
    // The UNMAP completed: the unit's invalidation has completed too, so
    // the endpoint faults (an IOTLB entry filled above is gone).
    assert!(matches!(
        r.reach(A, 0x10_0010, Access::Write),
        Err(TranslateError::NotPresent {
            iova: 0x10_0010,
            ..
        })
    ));
    let st = r.dev.stats();
    assert_eq!((st.maps, st.unmaps, st.invalidation_waits), (1, 1, 1));
}

#[test]
fn read_only_mapping_refuses_writes() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    assert_eq!(
        r.drv.map(1, 0x2000, 0x2fff, phys, s::MAP_F_READ).unwrap(),
        Some(Status::Ok)
    );
    assert!(r.reach(A, 0x2000, Access::Read).is_ok());
    assert!(matches!(
        r.reach(A, 0x2000, Access::Write),
        Err(TranslateError::PermissionDenied { .. })
    ));
}

#[test]
fn map_overlapping_an_existing_mapping_is_inval_and_changes_nothing() {
    let mut r = rig();
    let phys = r.ram(4);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x4000, 0x7fff, phys);
    for (a, b) in [
        (0x4000, 0x4fff),
        (0x3000, 0x4fff),
        (0x7000, 0x8fff),
        (0x0, 0xffff),
    ] {
        assert_eq!(
            r.drv.map(1, a, b, phys + 0x8000, RW).unwrap(),
            Some(Status::Inval),
            "{a:#x}..={b:#x}"
        );
    }
    assert_eq!(r.ranges(1), [(0x4000, 0x7fff)]);
    // Nothing of the refused maps reached the table either.
    assert!(matches!(
        r.reach(A, 0x3000, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
    assert_eq!(
        r.reach(A, 0x4000, Access::Read).unwrap().as_slice()[0].phys,
        phys
    );
}

#[test]
fn unmap_that_would_split_a_mapping_is_range_and_removes_nothing() {
    let mut r = rig();
    let phys = r.ram(4);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x0, 0x9fff, phys);
    r.map_ok(1, 0xa000, 0xafff, phys + 0xa000);
    // §5.13.6.4 example (4), and a range that ends inside a mapping
    // after covering another whole.
    assert_eq!(r.drv.unmap(1, 0x0, 0x4fff).unwrap(), Some(Status::Range));
    assert_eq!(r.drv.unmap(1, 0x5000, 0xafff).unwrap(), Some(Status::Range));
    assert_eq!(r.drv.unmap(1, 0x9000, 0xffff).unwrap(), Some(Status::Range));
    assert_eq!(r.ranges(1), [(0x0, 0x9fff), (0xa000, 0xafff)]);
    assert!(r.reach(A, 0x4000, Access::Read).is_ok());
    assert!(r.reach(A, 0xa000, Access::Read).is_ok());
}

#[test]
fn unmap_over_several_mappings_removes_them_all() {
    let mut r = rig();
    let phys = r.ram(5);
    r.attach_ok(1, EA);
    // §5.13.6.4 examples (3), (5), (6), (7), and (1).
    r.map_ok(1, 0x0, 0x4fff, phys);
    r.map_ok(1, 0x5000, 0x9fff, phys + 0x5000);
    r.map_ok(1, 0x10000, 0x14fff, phys + 0x10000);
    r.map_ok(1, 0x20000, 0x20fff, phys + 0x20000);
    assert_eq!(r.drv.unmap(1, 0x0, 0x4fff).unwrap(), Some(Status::Ok));
    assert_eq!(r.ranges(1).len(), 3);
    assert_eq!(r.drv.unmap(1, 0x0, 0x1ffff).unwrap(), Some(Status::Ok));
    assert_eq!(r.ranges(1), [(0x20000, 0x20fff)]);
    assert_eq!(r.drv.unmap(1, 0x20000, 0x2ffff).unwrap(), Some(Status::Ok));
    assert_eq!(r.ranges(1), []);
    assert_eq!(r.drv.unmap(1, 0x0, 0x4fff).unwrap(), Some(Status::Ok));
    for iova in [0x0, 0x5000, 0x10000, 0x20000] {
        assert!(matches!(
            r.reach(A, iova, Access::Read),
            Err(TranslateError::NotPresent { .. })
        ));
    }
}

#[test]
fn large_pages_map_and_unmap_whole() {
    let mut r = rig();
    // A 2 MiB-aligned 2 MiB buffer of guest RAM.
    let phys = r.ram(9);
    assert_eq!(phys % (2 << 20), 0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x4000_0000, 0x401f_ffff, phys);
    assert_eq!(
        r.reach(A, 0x4010_0000, Access::Read).unwrap().as_slice()[0].phys,
        phys + 0x10_0000
    );
    assert_eq!(
        r.drv.unmap(1, 0x4000_0000, 0x4000_0fff).unwrap(),
        Some(Status::Range)
    );
    assert_eq!(
        r.drv.unmap(1, 0x4000_0000, 0x401f_ffff).unwrap(),
        Some(Status::Ok)
    );
    assert!(r.reach(A, 0x4010_0000, Access::Read).is_err());
}

#[test]
fn two_endpoints_share_a_domain_and_detach_ends_reach() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(3, EA);
    r.attach_ok(3, EB);
    r.map_ok(3, 0x1000, 0x1fff, phys);
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
    assert!(r.reach(B, 0x1000, Access::Read).is_ok());
    assert_eq!(r.drv.detach(3, EA).unwrap(), Some(Status::Ok));
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    // The domain lives on with B.
    assert!(r.reach(B, 0x1000, Access::Read).is_ok());
    assert_eq!(r.drv.detach(3, EB).unwrap(), Some(Status::Ok));
    // The last endpoint gone, the domain ceased to exist (§5.13.6.2).
    assert_eq!(r.dev.mappings(3), None);
    assert_eq!(
        r.drv.map(3, 0x1000, 0x1fff, phys, RW).unwrap(),
        Some(Status::NoEnt)
    );
}

#[test]
fn attach_elsewhere_detaches_first_and_old_mappings_are_unreachable() {
    let mut r = rig();
    let phys = r.ram(1);
    r.attach_ok(1, EA);
    r.attach_ok(1, EB);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    r.attach_ok(2, EA);
    assert_eq!(r.dev.attached(EA), Some(2));
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
    // Domain 1 still serves B.
    assert!(r.reach(B, 0x1000, Access::Read).is_ok());
    r.map_ok(2, 0x1000, 0x1fff, phys + 0x1000);
    assert_eq!(
        r.reach(A, 0x1000, Access::Read).unwrap().as_slice()[0].phys,
        phys + 0x1000
    );
    // Attaching where it is already attached is a no-op.
    r.attach_ok(2, EA);
    assert_eq!(r.ranges(2), [(0x1000, 0x1fff)]);
}

#[test]
fn probe_reports_the_msi_window_and_reserved_regions() {
    let mut cfg = config();
    cfg.reserved = vec![(0x8000_0000, 0x8000_ffff)];
    let mut r = rig_with(cfg, Default::default());
    let (st, props) = r.drv.probe_endpoint(EA).unwrap();
    assert_eq!(st, Some(Status::Ok));
    assert_eq!(props.len(), r.drv.geometry().probe_size as usize);
    let prop = |at: usize| {
        let p = &props[at..at + 24];
        let le16 = |i: usize| u16::from_le_bytes([p[i], p[i + 1]]);
        let le64 = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().unwrap());
        (le16(0), le16(2), p[4], &p[5..8], le64(8), le64(16))
    };
    assert_eq!(
        prop(0),
        (
            s::PROBE_T_RESV_MEM,
            20,
            s::RESV_MEM_T_MSI,
            &[0u8, 0, 0][..],
            0xfee0_0000,
            0xfeef_ffff
        )
    );
    // The next property starts `length + 4` bytes after the first.
    assert_eq!(
        prop(24),
        (
            s::PROBE_T_RESV_MEM,
            20,
            s::RESV_MEM_T_RESERVED,
            &[0u8, 0, 0][..],
            0x8000_0000,
            0x8000_ffff
        )
    );
    assert!(props[48..].iter().all(|&b| b == 0));
    // MAP into either region is refused.
    r.attach_ok(1, EA);
    let phys = r.ram(0);
    assert_eq!(
        r.drv.map(1, 0xfee0_0000, 0xfee0_0fff, phys, RW).unwrap(),
        Some(Status::Inval)
    );
    assert_eq!(
        r.drv.map(1, 0x8000_f000, 0x8001_0fff, phys, RW).unwrap(),
        Some(Status::Inval)
    );
    assert_eq!(r.ranges(1), []);
}

#[test]
fn input_range_end_maps() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, INPUT_END - 0xfff, INPUT_END, phys);
    assert!(r.reach(A, INPUT_END - 7, Access::Read).is_ok());
}

#[test]
fn bypass_config_lets_unattached_endpoints_through() {
    let mut r = rig();
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    assert!(r.drv.set_bypass(true));
    let t0 = std::time::Instant::now();
    while r.reach(A, 0x1000, Access::Read).is_err() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(2),
            "bypass not applied"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        r.reach(A, 0x1000, Access::Read).unwrap().as_slice()[0].phys,
        0x1000
    );
    // Attached endpoints are translated whatever bypass says.
    r.attach_ok(1, EA);
    assert!(r.reach(A, 0x1000, Access::Read).is_err());
    // A bypass domain (ATTACH_F_BYPASS) passes its endpoints through.
    assert_eq!(
        r.drv.attach(2, EB, s::ATTACH_F_BYPASS).unwrap(),
        Some(Status::Ok)
    );
    assert!(r.reach(B, 0x3000, Access::Read).is_ok());
    assert_eq!(
        r.drv.map(2, 0x1000, 0x1fff, 0x1000, RW).unwrap(),
        Some(Status::Inval)
    );
    assert_eq!(r.drv.unmap(2, 0x1000, 0x1fff).unwrap(), Some(Status::Inval));
    // Inconsistent bypass flag for an existing domain.
    assert_eq!(r.drv.attach(2, EA, 0).unwrap(), Some(Status::Inval));
    assert_eq!(
        r.drv.attach(1, EB, s::ATTACH_F_BYPASS).unwrap(),
        Some(Status::Inval)
    );
    // The config byte only ever reads 0 or 1: bits 1-7 are not the
    // driver's (a write changing them is refused and recorded).
    let t = r.drv.transport().clone();
    let bypass = |t: &softiommu_virtio::transport::MmioTransport| {
        let mut b = [0u8];
        t.read_config(s::CFG_BYPASS as u64, &mut b);
        b[0]
    };
    assert_eq!(bypass(&t), 1);
    let errors = t.errors().total();
    t.write_config(s::CFG_BYPASS as u64, &[0xfe]);
    assert_eq!(bypass(&t), 1);
    assert_eq!(t.errors().total(), errors + 1);
    // A 32-bit write carrying `bypass` and the reserved bytes unchanged
    // is taken; one changing `probe_size` is refused whole.
    t.write(reg::CONFIG + s::CFG_BYPASS as u64, 0);
    assert_eq!(bypass(&t), 0);
    assert_eq!(t.errors().total(), errors + 1);
    t.write(reg::CONFIG + s::CFG_PROBE_SIZE as u64, 1);
    assert_eq!(t.errors().total(), errors + 2);
    let mut b = [0u8; 4];
    t.read_config(s::CFG_PROBE_SIZE as u64, &mut b);
    assert_eq!(u32::from_le_bytes(b), r.drv.geometry().probe_size);
}

#[test]
fn device_reset_detaches_every_endpoint() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    r.dev.transport().write(reg::STATUS, 0);
    let t0 = std::time::Instant::now();
    while r.dev.attached(EA).is_some() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(2),
            "not reset"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    assert_eq!(r.dev.mappings(1), None);
}

#[test]
fn a_configuration_the_unit_cannot_serve_is_refused() {
    use softiommu::hw::{System, UnitConfig};
    use softiommu_virtio::viommu::{ViommuConfig, ViommuDevice, ViommuError};
    use std::sync::Arc;
    let mem = Arc::new(softiommu::mem::PhysMemory::new(16 << 20).unwrap());
    let mut sys = System::new(mem);
    let unit = sys.add_unit(UnitConfig::default()).unwrap();
    sys.assign(A, unit).unwrap();
    let sys = Arc::new(sys);
    let spawn = |cfg: ViommuConfig| ViommuDevice::spawn(cfg, sys.clone(), unit).map(|_| ());
    assert_eq!(
        spawn(ViommuConfig {
            domain_range: (0, 9),
            ..config()
        }),
        Err(ViommuError::InvalidConfig {
            field: "domain_range.start",
            value: 0
        })
    );
    assert_eq!(
        spawn(ViommuConfig {
            domain_range: (1, 1 << 16),
            ..config()
        }),
        Err(ViommuError::InvalidConfig {
            field: "domain_range.end",
            value: 1 << 16
        })
    );
    // Reserved regions: past the input range, over the MSI window, over
    // each other.
    for (reserved, at) in [
        (vec![(INPUT_END + 1, INPUT_END + 0x1000)], INPUT_END + 1),
        (vec![(0xfee0_0000, 0xfee0_0fff)], 0xfee0_0000),
        (vec![(0xfed0_0000, 0xfee0_0fff)], 0xfed0_0000),
        (vec![(0x1_0000, 0x1_ffff), (0x1_f000, 0x2_0fff)], 0x1_f000),
    ] {
        assert_eq!(
            spawn(ViommuConfig {
                reserved,
                endpoints: vec![A],
                ..config()
            }),
            Err(ViommuError::InvalidConfig {
                field: "reserved",
                value: at
            })
        );
    }
    assert_eq!(
        spawn(ViommuConfig {
            reserved: vec![(0x1_0000, 0x1_ffff), (0x2_0000, 0x2_0fff)],
            endpoints: vec![A],
            ..config()
        }),
        Ok(())
    );
    assert_eq!(
        spawn(ViommuConfig {
            probe_size: 20,
            endpoints: vec![A],
            ..config()
        }),
        Err(ViommuError::InvalidConfig {
            field: "probe_size",
            value: 20
        })
    );
    // B is not in the unit's scope here.
    assert_eq!(
        spawn(config()),
        Err(ViommuError::EndpointNotInUnit { sid: B, unit })
    );
    assert_eq!(
        ViommuDevice::spawn(config(), sys.clone(), softiommu::hw::UnitId(3)).map(|_| ()),
        Err(ViommuError::NoUnit(softiommu::hw::UnitId(3)))
    );
}

#[test]
fn a_dma_domain_over_an_endpoint_the_device_refuses_is_an_error() {
    use softiommu_virtio::viommu::{ViommuDma, ViommuDmaError, ViommuMode};
    let r = rig();
    let err = ViommuDma::new(r.drv, 1, &[0x0018], ViommuMode::Strict).unwrap_err();
    assert_eq!(
        err,
        ViommuDmaError::Refused {
            op: "PROBE",
            status: Some(Status::NoEnt)
        }
    );
}

#[test]
fn mmio_flag_is_recorded_and_the_range_must_still_be_guest_ram() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    let (base, len) = r.mem.iommu_reserve();
    // Outside guest RAM the unit reaches nothing: RANGE with MMIO too.
    let regs = (base + len + 0x1000_0000) & !0xfff;
    assert_eq!(
        r.drv
            .map(1, 0x5000, 0x5fff, regs, RW | s::MAP_F_MMIO)
            .unwrap(),
        Some(Status::Range)
    );
    assert_eq!(
        r.drv
            .map(1, 0x5000, 0x5fff, phys, RW | s::MAP_F_MMIO)
            .unwrap(),
        Some(Status::Ok)
    );
    assert_eq!(
        r.reach(A, 0x5008, Access::Write).unwrap().as_slice()[0].phys,
        phys + 8
    );
    assert_eq!(r.dev.mappings(1).unwrap()[0].flags, RW | s::MAP_F_MMIO);
}

#[test]
fn dropping_the_device_detaches_its_endpoints_before_freeing_tables() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
    let Rig {
        system,
        unit,
        dev,
        drv,
        ..
    } = r;
    // No driver reset first (that would detach them too): the device
    // alone goes away.
    std::mem::forget(drv);
    drop(dev);
    assert_eq!(system.unit(unit).unwrap().context(A), None);
    assert!(matches!(
        reach_in(&system, unit, A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
}

/// §5.13.6.4.2: a failing UNMAP SHOULD NOT remove any mapping. The table
/// refusing the k-th of three whole mappings (fault injection) fails the
/// request `DEVERR`, and the mappings it had removed before are back:
/// every one listed and reachable at its address, whichever k failed.
#[test]
fn an_unmap_the_table_refuses_midway_removes_no_mapping() {
    let mut r = rig();
    let phys = r.ram(5);
    r.attach_ok(1, EA);
    let maps = [
        (0x0, 0x4fff, phys),
        (0x5000, 0x9fff, phys + 0x5000),
        (0x10000, 0x14fff, phys + 0x10000),
    ];
    for (a, b, p) in maps {
        r.map_ok(1, a, b, p);
    }
    let all: Vec<(u64, u64)> = maps.iter().map(|m| (m.0, m.1)).collect();
    for k in 0..3 {
        r.dev.inject_unmap_failure(k);
        let st = r.drv.unmap(1, 0x0, 0x1ffff).unwrap();
        assert!(matches!(st, Some(Status::DevErr)), "victim {k}: {st:?}");
        assert_eq!(r.ranges(1), all, "victim {k}");
        for (a, b, p) in maps {
            for iova in [a, b & !0xfff] {
                let got = r.reach(A, iova, Access::Write).expect("still mapped");
                assert_eq!(got.as_slice()[0].phys, p + (iova - a), "victim {k}");
            }
        }
    }
    let st = r.dev.stats();
    assert_eq!((st.unmaps_rolled_back, st.mappings_lost), (3, 0));
    // Disarmed: the same UNMAP now removes them all.
    assert_eq!(r.drv.unmap(1, 0x0, 0x1ffff).unwrap(), Some(Status::Ok));
    assert_eq!(r.ranges(1), []);
    assert!(matches!(
        r.reach(A, 0x5000, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
}

/// §5.13.4.2: a driver's write of `bypass` is in effect when the write
/// returns — an unattached endpoint's very next access passes through
/// after `bypass = 1` and faults after `bypass = 0`, with no wait for the
/// device thread.
#[test]
fn a_bypass_write_is_in_effect_when_it_returns() {
    let r = rig();
    for _ in 0..20 {
        assert!(r.drv.set_bypass(true));
        assert_eq!(
            r.reach(A, 0x1000, Access::Read)
                .expect("bypassed")
                .as_slice()[0]
                .phys,
            0x1000
        );
        assert!(r.drv.set_bypass(false));
        assert!(matches!(
            r.reach(A, 0x1000, Access::Read),
            Err(TranslateError::NoContext { .. })
        ));
    }
}
