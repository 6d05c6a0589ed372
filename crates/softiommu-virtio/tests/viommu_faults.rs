//! Faults reach the guest: an endpoint's translation fault in the unit is
//! reported on the virtio-iommu's event queue in the `virtio_iommu_fault`
//! layout (§5.13.6.7), the unit's fault log keeps its record, and a full
//! event queue drops and counts events without stopping the device.

mod viommu_common;

use std::time::{Duration, Instant};

use softiommu::hw::{Access, FaultReason, SourceId};
use softiommu_virtio::spec::iommu as s;
use softiommu_virtio::viommu::{FaultEvent, Status, ViommuDriverConfig};
use viommu_common::*;

fn expect(ev: &FaultEvent, reason: u8, dir: u32, ep: u32, addr: u64) {
    assert_eq!(
        (
            ev.reason,
            ev.flags,
            ev.endpoint,
            ev.address,
            ev.reserved_zero
        ),
        (reason, dir | s::FAULT_F_ADDRESS, ep, addr, true)
    );
}

#[test]
fn endpoint_touching_an_unmapped_iova_is_reported_as_mapping() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    assert!(r.reach(A, 0x5000, Access::Read).is_err());
    let evs = r.drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    expect(&evs[0], s::FAULT_R_MAPPING, s::FAULT_F_READ, EA, 0x5000);
    // The unit's log keeps the record for its owner.
    let log = r.system.unit(r.unit).unwrap().faults().drain();
    assert_eq!(log.records.len(), 1);
    assert_eq!(log.records[0].reason, FaultReason::NotPresent);
    assert_eq!(log.records[0].iova, 0x5000);
}

#[test]
fn write_to_a_read_only_mapping_is_reported_with_the_write_flag() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    assert_eq!(
        r.drv.map(1, 0x1000, 0x1fff, phys, s::MAP_F_READ).unwrap(),
        Some(Status::Ok)
    );
    assert!(r.reach(A, 0x1008, Access::Write).is_err());
    let evs = r.drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    expect(&evs[0], s::FAULT_R_MAPPING, s::FAULT_F_WRITE, EA, 0x1008);
}

#[test]
fn unattached_endpoint_is_reported_as_domain() {
    let mut r = rig();
    assert!(r.reach(B, 0x7000, Access::Write).is_err());
    let evs = r.drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    expect(&evs[0], s::FAULT_R_DOMAIN, s::FAULT_F_WRITE, EB, 0x7000);
}

#[test]
fn access_after_a_completed_unmap_faults_and_is_reported() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x3000, 0x3fff, phys);
    assert!(r.reach(A, 0x3000, Access::Read).is_ok());
    assert_eq!(r.drv.unmap(1, 0x3000, 0x3fff).unwrap(), Some(Status::Ok));
    assert!(r.reach(A, 0x3000, Access::Read).is_err());
    let evs = r.drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    expect(&evs[0], s::FAULT_R_MAPPING, s::FAULT_F_READ, EA, 0x3000);
}

#[test]
fn faults_of_endpoints_the_device_does_not_manage_are_not_reported() {
    let mut r = rig();
    let other = SourceId(0x0100);
    r.system.assign(other, r.unit).unwrap();
    assert!(r.reach(other, 0x1000, Access::Read).is_err());
    assert!(r.reach(A, 0x2000, Access::Read).is_err());
    // Reports follow the log's order: once A's is in, the other's would
    // have come first.
    let evs = r.drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].endpoint, EA);
    assert_eq!(r.dev.stats().events_dropped, 0);
}

#[test]
fn a_full_event_queue_drops_and_counts_and_never_blocks() {
    let mut r = rig_with(
        config(),
        ViommuDriverConfig {
            events: 2,
            ..Default::default()
        },
    );
    r.attach_ok(1, EA);
    for i in 0..5u64 {
        assert!(r.reach(A, 0x10_0000 + i * 0x1000, Access::Read).is_err());
    }
    let t0 = Instant::now();
    while r.dev.stats().events + r.dev.stats().events_dropped < 5 {
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", r.dev.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = r.dev.stats();
    assert_eq!((st.events, st.events_dropped), (2, 3));
    // The device still serves requests.
    assert_eq!(r.drv.detach(1, EA).unwrap(), Some(Status::Ok));
    let evs = r.drv.take_events();
    assert_eq!(evs.len(), 2);
    assert_eq!(evs[1].address, 0x10_1000);
    // Buffers reposted: the next fault is reported again.
    assert!(r.reach(A, 0x9000, Access::Read).is_err());
    let evs = r.drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    expect(&evs[0], s::FAULT_R_DOMAIN, s::FAULT_F_READ, EA, 0x9000);
    // Every fault is in the unit's log.
    assert_eq!(r.system.unit(r.unit).unwrap().faults().len(), 6);
}

#[test]
fn faults_a_full_unit_log_dropped_are_counted_as_missed() {
    use softiommu::hw::{System, UnitConfig};
    use softiommu::mem::PhysMemory;
    use softiommu_virtio::viommu::{ViommuDevice, ViommuDriver};
    use std::sync::Arc;
    let mem = Arc::new(PhysMemory::new(RAM).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys
        .add_unit(UnitConfig {
            fault_log_capacity: 2,
            ..UnitConfig::default()
        })
        .unwrap();
    sys.assign(A, unit).unwrap();
    let system = Arc::new(sys);
    let mut cfg = config();
    cfg.endpoints = vec![A];
    let dev = ViommuDevice::spawn(cfg, system.clone(), unit).unwrap();
    let mut drv = ViommuDriver::probe(dev.transport().clone(), mem, Default::default()).unwrap();
    for i in 0..5u64 {
        assert!(reach_in(&system, unit, A, 0x1000 * (i + 1), Access::Read).is_err());
    }
    let t0 = Instant::now();
    while dev.stats().events + dev.stats().faults_missed < 5 {
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", dev.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    // Two recorded and reported; three the log had no room for.
    assert_eq!((dev.stats().events, dev.stats().faults_missed), (2, 3));
    assert_eq!(drv.take_events().len(), 2);
    // The owner drains the log: reporting goes on.
    assert_eq!(system.unit(unit).unwrap().faults().drain().dropped, 3);
    assert!(reach_in(&system, unit, A, 0x9000, Access::Write).is_err());
    let evs = drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].address, 0x9000);
}

/// An event buffer the device may not write (a read-only descriptor, a
/// driver's bug) is returned unwritten, as a too-short one is: the
/// device does not stop the event queue or ask for a reset, so the
/// request queue stays usable, and the next event finds the next
/// buffer. Before, one such buffer set `DEVICE_NEEDS_RESET`, and every
/// driver wait that polled before an answer failed with it.
#[test]
fn a_read_only_event_buffer_is_returned_unwritten_and_breaks_nothing() {
    use softiommu_virtio::spec::{desc, reg, status as st};
    use softiommu_virtio::viommu::encode;
    use softiommu_virtio::vring::{DriverRing, RingLayout};
    let r = rig();
    let Rig {
        mem,
        system,
        unit,
        dev,
        drv,
    } = r;
    drop(drv);
    let t = dev.transport().clone();
    t.write(reg::STATUS, st::ACKNOWLEDGE | st::DRIVER);
    for sel in 0..2 {
        t.write(reg::DEVICE_FEATURES_SEL, sel);
        let f = t.read(reg::DEVICE_FEATURES);
        t.write(reg::DRIVER_FEATURES_SEL, sel);
        t.write(reg::DRIVER_FEATURES, f);
    }
    t.write(reg::STATUS, st::ACKNOWLEDGE | st::DRIVER | st::FEATURES_OK);
    let l = RingLayout::new(8);
    let (rp, ep, buf) = (
        mem.alloc_zeroed_frames(0).unwrap(),
        mem.alloc_zeroed_frames(0).unwrap(),
        mem.alloc_zeroed_frames(0).unwrap(),
    );
    let mut req = DriverRing::new(mem.clone(), rp, rp, l).unwrap();
    let mut evt = DriverRing::new(mem.clone(), ep, ep, l).unwrap();
    t.program_queue(0, 8, req.device_addresses());
    t.program_queue(1, 8, evt.device_addresses());
    t.write(
        reg::STATUS,
        st::ACKNOWLEDGE | st::DRIVER | st::FEATURES_OK | st::DRIVER_OK,
    );
    // A read-only event buffer, then a good one.
    evt.set_desc(0, buf, 64, 0, 0);
    evt.set_desc(1, buf + 0x40, 64, desc::F_WRITE, 0);
    evt.push_avail(0);
    evt.push_avail(1);
    evt.publish();
    t.write(reg::QUEUE_NOTIFY, 1);
    let send = |req: &mut DriverRing, bytes: &[u8]| -> Option<(u32, u32)> {
        mem.write(buf + 0x100, bytes).unwrap();
        req.set_desc(0, buf + 0x100, bytes.len() as u32, desc::F_NEXT, 1);
        req.set_desc(1, buf + 0x200, 4, desc::F_WRITE, 0);
        req.push_avail(0);
        req.publish();
        t.write(reg::QUEUE_NOTIFY, 0);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Some(u) = req.pop_used() {
                return Some(u);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    };
    assert_eq!(send(&mut req, &encode::attach(1, EA, 0)), Some((0, 4)));
    assert!(reach_in(&system, unit, A, 0x5000, Access::Read).is_err());
    let mut used = Vec::new();
    let t0 = Instant::now();
    while used.len() < 2 && t0.elapsed() < Duration::from_secs(5) {
        used.extend(evt.pop_used());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(used, vec![(0, 0), (1, s::FAULT_LEN as u32)]);
    assert_eq!(t.read(reg::STATUS) & st::DEVICE_NEEDS_RESET, 0);
    assert_eq!(dev.stats().event_buffers_refused, 1);
    // The request queue goes on: DETACH answered OK.
    assert_eq!(send(&mut req, &encode::detach(1, EA)), Some((0, 4)));
    let mut tail = [0u8; 4];
    mem.read(buf + 0x200, &mut tail).unwrap();
    assert_eq!(tail[0], Status::Ok.code());
}
