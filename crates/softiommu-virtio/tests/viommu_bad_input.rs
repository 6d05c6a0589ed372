//! Bad input from the guest to the virtio-iommu device: each case with
//! the exact status §5.13.6 gives it (or, where the device cannot write a
//! status, the exact used length and untouched buffer), and the state
//! unchanged by every refused request.

mod viommu_common;

use softiommu::hw::{Access, TranslateError};
use softiommu_virtio::spec::iommu as s;
use softiommu_virtio::viommu::{encode, RawDesc, Status, ViommuDriverConfig, INPUT_END};
use viommu_common::*;

#[test]
fn short_request_is_inval() {
    let mut r = rig();
    r.attach_ok(1, EA);
    let map = encode::map(1, 0x1000, 0x1fff, 0x1000, RW);
    for len in [s::HEAD_LEN, s::MAP_LEN - 1] {
        let (used, w) = raw(&mut r, &map[..len], &[4]);
        assert_eq!(
            (used, w[0], &w[1..]),
            (4, s::S_INVAL, &[0u8, 0, 0][..]),
            "{len}"
        );
    }
    assert_eq!(r.ranges(1), []);
}

#[test]
fn request_shorter_than_its_head_is_inval() {
    let mut r = rig();
    let (used, w) = raw(&mut r, &[s::T_ATTACH, 0], &[4]);
    assert_eq!((used, w[0]), (4, s::S_INVAL));
}

#[test]
fn unknown_type_is_returned_unwritten() {
    let mut r = rig();
    for ty in [0u8, 6, 0x7f, 0xff] {
        let mut req = encode::attach(1, EA, 0);
        req[0] = ty;
        let (used, w) = raw(&mut r, &req, &[4]);
        assert_eq!((used, w), (0, vec![0xaa; 4]), "type {ty}");
    }
    assert_eq!(r.dev.attached(EA), None);
    assert_eq!(r.dev.stats().unwritten, 4);
}

#[test]
fn writable_part_too_short_for_the_tail_is_returned_unwritten() {
    let mut r = rig();
    let req = encode::attach(1, EA, 0);
    let (used, w) = raw(&mut r, &req, &[3]);
    assert_eq!((used, w), (0, vec![0xaa; 3]));
    // No writable descriptor at all.
    let base = r.drv.scratch();
    r.mem.write(base, &req).unwrap();
    let used = r
        .drv
        .raw(&[RawDesc {
            addr: base,
            len: req.len() as u32,
            writable: false,
        }])
        .unwrap();
    assert_eq!(used, 0);
    // Neither request was carried out.
    assert_eq!(r.dev.attached(EA), None);
}

#[test]
fn tail_split_over_descriptors_is_written_in_place() {
    let mut r = rig();
    let (used, w) = raw(&mut r, &encode::attach(1, EA, 0), &[1, 3]);
    assert_eq!((used, w), (4, vec![s::S_OK, 0, 0, 0]));
    assert_eq!(r.dev.attached(EA), Some(1));
}

#[test]
fn attach_with_reserved_bytes_set_is_inval() {
    let mut r = rig();
    let mut req = encode::attach(1, EA, 0);
    req[19] = 1;
    assert_eq!(r.drv.request(&req).unwrap(), Some(Status::Inval));
    assert_eq!(r.dev.attached(EA), None);
}

#[test]
fn attach_with_unknown_flag_is_inval() {
    let mut r = rig();
    assert_eq!(r.drv.attach(1, EA, 1 << 1).unwrap(), Some(Status::Inval));
    assert_eq!(r.dev.attached(EA), None);
}

#[test]
fn attach_bypass_flag_without_bypass_config_is_inval() {
    let mut r = rig_with(
        config(),
        ViommuDriverConfig {
            accept: !(1 << s::F_BYPASS_CONFIG),
            ..Default::default()
        },
    );
    assert_eq!(
        r.drv.attach(1, EA, s::ATTACH_F_BYPASS).unwrap(),
        Some(Status::Inval)
    );
}

#[test]
fn unmap_with_reserved_bytes_set_is_inval_and_removes_nothing() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    let mut req = encode::unmap(1, 0x1000, 0x1fff);
    req[24] = 0x80;
    assert_eq!(r.drv.request(&req).unwrap(), Some(Status::Inval));
    assert_eq!(r.ranges(1), [(0x1000, 0x1fff)]);
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
}

#[test]
fn reserved_bytes_the_device_must_ignore_are_ignored() {
    let mut r = rig();
    // The head's reserved bytes (§5.13.6.2), DETACH's and PROBE's.
    let mut att = encode::attach(1, EA, 0);
    att[1..4].copy_from_slice(&[1, 2, 3]);
    assert_eq!(r.drv.request(&att).unwrap(), Some(Status::Ok));
    let mut det = encode::detach(1, EA);
    det[12..20].fill(0xff);
    assert_eq!(r.drv.request(&det).unwrap(), Some(Status::Ok));
    let mut probe = encode::probe(EA);
    probe[8..].fill(0x55);
    let size = r.drv.geometry().probe_size;
    let c = r.drv.call(&probe, size + 4).unwrap();
    assert_eq!(c.status(), Some(Status::Ok));
}

#[test]
fn domain_out_of_range_is_range() {
    let mut r = rig();
    let phys = r.ram(0);
    for d in [0u32, 1024, u32::MAX] {
        assert_eq!(r.drv.attach(d, EA, 0).unwrap(), Some(Status::Range), "{d}");
        assert_eq!(
            r.drv.map(d, 0x1000, 0x1fff, phys, RW).unwrap(),
            Some(Status::Range)
        );
        assert_eq!(r.drv.unmap(d, 0x1000, 0x1fff).unwrap(), Some(Status::Range));
        assert_eq!(r.drv.detach(d, EA).unwrap(), Some(Status::Range));
    }
    assert_eq!(r.dev.attached(EA), None);
}

#[test]
fn endpoint_out_of_range_or_unknown_is_noent() {
    let mut r = rig();
    for ep in [0x0018u32, 0x1_0008, u32::MAX] {
        assert_eq!(
            r.drv.attach(1, ep, 0).unwrap(),
            Some(Status::NoEnt),
            "{ep:#x}"
        );
        assert_eq!(r.drv.detach(1, ep).unwrap(), Some(Status::NoEnt));
        assert_eq!(r.drv.probe_endpoint(ep).unwrap().0, Some(Status::NoEnt));
    }
    // The refused ATTACH created no domain.
    assert_eq!(r.dev.mappings(1), None);
}

#[test]
fn unknown_domain_is_noent() {
    let mut r = rig();
    let phys = r.ram(0);
    assert_eq!(
        r.drv.map(7, 0x1000, 0x1fff, phys, RW).unwrap(),
        Some(Status::NoEnt)
    );
    assert_eq!(r.drv.unmap(7, 0x1000, 0x1fff).unwrap(), Some(Status::NoEnt));
}

#[test]
fn map_with_no_permission_flag_is_inval() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    assert_eq!(
        r.drv.map(1, 0x1000, 0x1fff, phys, 0).unwrap(),
        Some(Status::Inval)
    );
    assert_eq!(
        r.drv.map(1, 0x1000, 0x1fff, phys, s::MAP_F_MMIO).unwrap(),
        Some(Status::Inval)
    );
    assert_eq!(r.ranges(1), []);
}

#[test]
fn map_with_unknown_flag_is_inval() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    assert_eq!(
        r.drv.map(1, 0x1000, 0x1fff, phys, RW | 1 << 3).unwrap(),
        Some(Status::Inval)
    );
    assert_eq!(r.ranges(1), []);
}

#[test]
fn map_mmio_flag_without_the_feature_is_inval() {
    let mut r = rig_with(
        config(),
        ViommuDriverConfig {
            accept: !(1 << s::F_MMIO),
            ..Default::default()
        },
    );
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    assert_eq!(
        r.drv
            .map(1, 0x1000, 0x1fff, phys, RW | s::MAP_F_MMIO)
            .unwrap(),
        Some(Status::Inval)
    );
    assert_eq!(r.ranges(1), []);
}

#[test]
fn map_beyond_the_input_range_is_range() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    for (a, b) in [
        (INPUT_END + 1, INPUT_END + 0x1000),
        (INPUT_END - 0xfff, INPUT_END + 0x1000),
        (u64::MAX - 0xfff, u64::MAX),
    ] {
        assert_eq!(
            r.drv.map(1, a, b, phys, RW).unwrap(),
            Some(Status::Range),
            "{a:#x}"
        );
    }
    assert_eq!(r.ranges(1), []);
}

#[test]
fn unaligned_addresses_are_range() {
    let mut r = rig();
    let phys = r.ram(1);
    r.attach_ok(1, EA);
    for (a, b, p) in [
        (0x1001, 0x1fff, phys),
        (0x1000, 0x1ffe, phys),
        (0x1000, 0x2000, phys),
        (0x1000, 0x1fff, phys + 8),
    ] {
        assert_eq!(
            r.drv.map(1, a, b, p, RW).unwrap(),
            Some(Status::Range),
            "{a:#x} {b:#x} {p:#x}"
        );
    }
    assert_eq!(r.ranges(1), []);
}

#[test]
fn map_end_before_start_is_inval() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    assert_eq!(
        r.drv.map(1, 0x2000, 0xfff, phys, RW).unwrap(),
        Some(Status::Inval)
    );
    assert_eq!(r.drv.unmap(1, 0x2000, 0xfff).unwrap(), Some(Status::Inval));
}

#[test]
fn map_of_memory_outside_guest_ram_is_range() {
    let mut r = rig();
    r.attach_ok(1, EA);
    let (reserve, _) = r.mem.iommu_reserve();
    // Past RAM, and the unit's own reserve (its tables), with or without
    // MMIO: no mapping may reach them.
    for (p, f) in [
        (RAM, RW),
        (reserve, RW),
        (reserve, RW | s::MAP_F_MMIO),
        (RAM - 0x1000, RW),
    ] {
        let end = if p == RAM - 0x1000 { 0x2fff } else { 0x1fff };
        assert_eq!(
            r.drv.map(1, 0x1000, end, p, f).unwrap(),
            Some(Status::Range),
            "{p:#x}"
        );
    }
    assert_eq!(r.ranges(1), []);
}

#[test]
fn attach_of_an_endpoint_attached_elsewhere_moves_it() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
    r.attach_ok(2, EA);
    // As if DETACH came first: the old domain (its last endpoint gone)
    // ceased to exist, and its mappings are out of the endpoint's reach.
    assert_eq!(r.dev.attached(EA), Some(2));
    assert_eq!(r.dev.mappings(1), None);
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
}

#[test]
fn detach_of_an_endpoint_not_attached_is_inval() {
    let mut r = rig();
    assert_eq!(r.drv.detach(1, EA).unwrap(), Some(Status::Inval));
    r.attach_ok(1, EA);
    assert_eq!(r.drv.detach(2, EA).unwrap(), Some(Status::Inval));
    assert_eq!(r.dev.attached(EA), Some(1));
}

#[test]
fn probe_with_properties_shorter_than_probe_size_is_inval_and_writes_no_property() {
    let mut r = rig();
    let (used, w) = raw(&mut r, &encode::probe(EA), &[24 + 4]);
    // The used length claims the 24 bytes before the tail: they are
    // written, zeroes (no property), never left as the driver's bytes.
    assert_eq!(used, 28);
    assert_eq!(&w[..24], &[0; 24][..]);
    assert_eq!(w[24], s::S_INVAL);
}

#[test]
fn request_buffer_outside_guest_ram_is_fault_or_unwritten() {
    let mut r = rig();
    let (reserve, _) = r.mem.iommu_reserve();
    // The readable part points at the unit's tables: not read, FAULT.
    let tail = r.drv.scratch() + 0x800;
    let used = two_descs(&mut r, reserve, s::ATTACH_LEN as u32, tail);
    assert_eq!(used, 4);
    let mut b = [0u8; 4];
    r.mem.read(tail, &mut b).unwrap();
    assert_eq!(b[0], s::S_FAULT);
    // The tail points at the unit's reserve: nothing is written there.
    let req = r.drv.scratch();
    r.mem.write(req, &encode::attach(1, EA, 0)).unwrap();
    let used = two_descs(&mut r, req, s::ATTACH_LEN as u32, reserve);
    assert_eq!(used, 0);
    // Unanswerable, so not carried out.
    assert_eq!(r.dev.attached(EA), None);
}

/// A PROBE whose readable part faults after its first bytes (the type
/// read, the endpoint in memory the device may not read) is answered
/// `FAULT` in the tail after its `probe_size` bytes of properties, where
/// the driver reads it (§5.13.6.5). (Before: the type was lost with the
/// fault and `FAULT` went to byte 0 with used length 4, which a driver
/// waiting for `probe_size + 4` bytes took for its own zeroed, `OK`,
/// tail.)
#[test]
fn a_probe_whose_request_faults_answers_in_its_own_tail() {
    let mut r = rig();
    let probe_size = config().probe_size;
    let (reserve, _) = r.mem.iommu_reserve();
    let base = r.drv.scratch();
    let wbase = base + 0x800;
    r.mem.write(base, &encode::probe(EA)[..4]).unwrap();
    let wlen = probe_size + 4;
    r.mem.fill(wbase, u64::from(wlen), 0xaa).unwrap();
    let used = r
        .drv
        .raw(&[
            RawDesc {
                addr: base,
                len: 4,
                writable: false,
            },
            RawDesc {
                addr: reserve,
                len: s::PROBE_LEN as u32 - 4,
                writable: false,
            },
            RawDesc {
                addr: wbase,
                len: wlen,
                writable: true,
            },
        ])
        .unwrap();
    assert_eq!(used, wlen);
    let mut w = vec![0u8; wlen as usize];
    r.mem.read(wbase, &mut w).unwrap();
    assert_eq!(w[probe_size as usize], s::S_FAULT);
    assert!(w[..probe_size as usize].iter().all(|&b| b == 0));
}

/// A readable part of 1 to 3 bytes whose type the device does not know
/// is returned unwritten, as any unknown type is (§5.13.6.2: "SHOULD NOT
/// write the buffer and SHOULD set the used length to zero"); a known
/// type that short is still `INVAL`.
#[test]
fn an_unknown_type_shorter_than_a_head_is_returned_unwritten() {
    let mut r = rig();
    for req in [&[9u8][..], &[0x7f, 0], &[0xff, 0, 0]] {
        let (used, w) = raw(&mut r, req, &[4]);
        assert_eq!((used, w), (0, vec![0xaa; 4]), "{req:?}");
    }
    let (used, w) = raw(&mut r, &[s::T_MAP], &[4]);
    assert_eq!((used, w[0]), (4, s::S_INVAL));
}
