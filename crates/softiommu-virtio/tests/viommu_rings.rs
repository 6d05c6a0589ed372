//! The virtio-iommu's own rings are guest RAM, reached directly: rings a
//! driver places in the unit's reserve (where the page tables live) are
//! never read or written, and a malformed chain stops the queue without
//! a panic; after a reset the device serves again.

mod viommu_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::mem::PhysMemory;
use softiommu_virtio::spec::{self, desc, iommu as s, reg, status};
use softiommu_virtio::transport::{DeviceError, MmioTransport};
use softiommu_virtio::viommu::{encode, Status, ViommuDevice, ViommuDriver};
use softiommu_virtio::vring::{DriverRing, RingLayout};
use viommu_common::*;

/// Takes the device to `DRIVER_OK` with queue 0 at `(desc, avail, used)`
/// of `size` entries.
fn live_with_queue(t: &MmioTransport, size: u16, rings: (u64, u64, u64)) {
    t.write(reg::STATUS, 0);
    t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    let f = 1u64 << spec::feature::VERSION_1
        | 1 << s::F_MAP_UNMAP
        | 1 << s::F_INPUT_RANGE
        | 1 << s::F_DOMAIN_RANGE;
    t.write(reg::DRIVER_FEATURES_SEL, 0);
    t.write(reg::DRIVER_FEATURES, f as u32);
    t.write(reg::DRIVER_FEATURES_SEL, 1);
    t.write(reg::DRIVER_FEATURES, (f >> 32) as u32);
    let st = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    t.write(reg::STATUS, st);
    start_queue(t, size, rings);
    t.write(reg::STATUS, st | status::DRIVER_OK);
}

fn snapshot(mem: &PhysMemory, at: u64, len: usize) -> Vec<u8> {
    // The reserve is not readable through the RAM accessors; its bytes
    // are read as the unit reads them.
    let mut v = vec![0u8; len];
    mem.read(at, &mut v).unwrap();
    v
}

#[test]
fn rings_in_the_units_reserve_are_never_touched() {
    let r = rig();
    let Rig { mem, dev, drv, .. } = r;
    drop(drv);
    // The rings at the reserve's last two pages: the unit's own live
    // structures (its invalidation queue, whose descriptors a reset's
    // detaches write, and the tables) are taken from its start, so any
    // change here is the device's.
    let (start, len) = mem.iommu_reserve();
    let base = start + len - 8192;
    let before = snapshot(&mem, base, 8192);
    rings_refused_untouched_then_served(&dev, mem, base, 8192, before);
}

/// Programs queue 0 with `rings` and starts it (`QueueReady` 1).
fn start_queue(t: &MmioTransport, size: u16, rings: (u64, u64, u64)) {
    t.write(reg::QUEUE_SEL, 0);
    t.write(reg::QUEUE_NUM, u32::from(size));
    for (lo, v) in [
        (reg::QUEUE_DESC_LOW, rings.0),
        (reg::QUEUE_DRIVER_LOW, rings.1),
        (reg::QUEUE_DEVICE_LOW, rings.2),
    ] {
        t.write(lo, v as u32);
        t.write(lo + 4, (v >> 32) as u32);
    }
    t.write(reg::QUEUE_READY, 1);
}

/// Sends `req` (a request without its tail) as a two-descriptor chain
/// with a writable tail, and returns the status the device wrote.
fn request(t: &MmioTransport, mem: &PhysMemory, ring: &mut DriverRing, req: &[u8]) -> Status {
    let buf = mem.alloc_zeroed_frames(0).unwrap();
    mem.write(buf, req).unwrap();
    let tail = buf + 0x800;
    mem.write(tail, &[0xff; s::TAIL_LEN]).unwrap();
    ring.set_desc(0, buf, req.len() as u32, desc::F_NEXT, 1);
    ring.set_desc(1, tail, s::TAIL_LEN as u32, desc::F_WRITE, 0);
    ring.push_avail(0);
    ring.publish();
    t.write(reg::QUEUE_NOTIFY, 0);
    let t0 = Instant::now();
    while ring.pop_used().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "not used");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut b = [0u8];
    mem.read(tail, &mut b).unwrap();
    Status::from_code(b[0]).expect("a status code")
}

/// Restarting the request queue (`QueueReady` 0, new rings, then
/// `QueueReady` 1) is not a device reset: the attachments and mappings
/// stay (§2.4 and §5.13.5 clear them on a reset only). Before, the device took the new
/// queue for a reset and dropped every domain, so the MAP below read
/// NOENT and the endpoint was no longer attached.
#[test]
fn restarting_the_request_queue_keeps_domains_and_attachments() {
    let r = rig();
    let Rig { mem, dev, drv, .. } = r;
    drop(drv);
    let t = dev.transport().clone();
    let layout = RingLayout::new(8);
    let phys = mem.alloc_zeroed_frames(0).unwrap();
    let mut ring = DriverRing::new(mem.clone(), phys, phys, layout).unwrap();
    live_with_queue(&t, 8, ring.device_addresses());
    assert_eq!(
        request(&t, &mem, &mut ring, &encode::attach(1, EA, 0)),
        Status::Ok
    );
    assert_eq!(dev.attached(EA), Some(1));
    t.write(reg::QUEUE_SEL, 0);
    t.write(reg::QUEUE_READY, 0);
    assert_eq!(t.read(reg::QUEUE_READY), 0);
    let phys2 = mem.alloc_zeroed_frames(0).unwrap();
    let mut ring2 = DriverRing::new(mem.clone(), phys2, phys2, layout).unwrap();
    start_queue(&t, 8, ring2.device_addresses());
    let frame = mem.alloc_zeroed_frames(0).unwrap();
    let map = encode::map(1, 0x1000, 0x1fff, frame, s::MAP_F_READ | s::MAP_F_WRITE);
    assert_eq!(request(&t, &mem, &mut ring2, &map), Status::Ok);
    assert_eq!(dev.attached(EA), Some(1));
    assert_eq!(dev.mappings(1).unwrap().len(), 1);
    assert_eq!(t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
}

#[test]
fn a_chain_that_loops_stops_the_queue_and_a_reset_recovers() {
    let r = rig();
    let Rig { mem, dev, drv, .. } = r;
    drop(drv);
    let layout = RingLayout::new(8);
    let phys = mem.alloc_zeroed_frames(0).unwrap();
    let mut ring = DriverRing::new(mem.clone(), phys, phys, layout).unwrap();
    let t = dev.transport().clone();
    let (d, a, u) = ring.device_addresses();
    live_with_queue(&t, 8, (d, a, u));
    let buf = mem.alloc_zeroed_frames(0).unwrap();
    mem.write(buf, &encode::attach(1, EA, 0)).unwrap();
    // 0 -> 1 -> 0 -> ...
    ring.set_desc(0, buf, s::ATTACH_LEN as u32, desc::F_NEXT, 1);
    ring.set_desc(1, buf, s::ATTACH_LEN as u32, desc::F_NEXT, 0);
    ring.push_avail(0);
    ring.publish();
    t.write(reg::QUEUE_NOTIFY, 0);
    needs_reset(&t);
    assert!(t
        .errors()
        .snapshot()
        .iter()
        .any(|e| matches!(e, DeviceError::ChainLoop { queue: 0, .. })));
    assert_eq!(dev.attached(EA), None);
    drop(ring);
    let mut drv = ViommuDriver::probe(t, mem, Default::default()).unwrap();
    assert_eq!(drv.attach(1, EA, 0).unwrap(), Some(Status::Ok));
}

#[test]
fn rings_in_a_bounce_pool_are_never_touched() {
    let r = rig();
    let Rig {
        mem,
        dev,
        drv,
        system,
        ..
    } = r;
    drop(drv);
    // A DMA domain of the same unit whose untrusted device gets a bounce
    // pool in guest RAM: RAM, but the DMA layer's.
    let dom = host_bounce_domain(&system);
    let _b = dom.attach(B, u64::MAX, true).unwrap();
    let pool = first_pool_frame(&mem);
    mem.fill(pool, 4096, 0x5a).unwrap();
    let before = snapshot(&mem, pool, 4096);
    rings_refused_untouched_then_served(&dev, mem, pool, 4096, before);
}

/// Rings at `at` (`len` bytes holding `before`): the first notification
/// faults on queue 0 and puts the device in NEEDS_RESET, the bytes stay as
/// they were and no request is served; after a reset a proper driver is
/// served again.
fn rings_refused_untouched_then_served(
    dev: &ViommuDevice,
    mem: Arc<PhysMemory>,
    at: u64,
    len: usize,
    before: Vec<u8>,
) {
    let t = dev.transport().clone();
    live_with_queue(&t, 16, (at, at + 0x400, at + 0x800));
    t.write(reg::QUEUE_NOTIFY, 0);
    needs_reset(&t);
    assert!(t
        .errors()
        .snapshot()
        .iter()
        .any(|e| matches!(e, DeviceError::DmaFault { queue: 0, .. })));
    assert_eq!(snapshot(&mem, at, len), before);
    assert_eq!(dev.stats().requests, 0);
    let mut drv = ViommuDriver::probe(t, mem, Default::default()).unwrap();
    assert_eq!(drv.attach(1, EA, 0).unwrap(), Some(Status::Ok));
}

/// A driver that declines INPUT_RANGE or DOMAIN_RANGE would have every
/// 64-bit address and every 32-bit domain id valid (§5.13.6); the unit's
/// tables take 48 bits and its domain ids are the device's claimed range,
/// so `FEATURES_OK` is refused (§2.2.2) — before: taken, and both limits
/// enforced anyway (`ATTACH` of domain 0 answered `S_RANGE`). With both
/// accepted, it is set.
#[test]
fn features_ok_needs_input_and_domain_range() {
    let r = rig();
    let Rig { dev, drv, .. } = r;
    drop(drv);
    let t = dev.transport().clone();
    let base = 1u64 << spec::feature::VERSION_1 | 1 << s::F_MAP_UNMAP;
    let both = 1 << s::F_INPUT_RANGE | 1 << s::F_DOMAIN_RANGE;
    for (f, ok) in [
        (base, false),
        (base | 1 << s::F_INPUT_RANGE, false),
        (base | 1 << s::F_DOMAIN_RANGE, false),
        (base | both, true),
    ] {
        t.write(reg::STATUS, 0);
        let _ = t.errors().drain();
        t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        t.write(reg::DRIVER_FEATURES_SEL, 0);
        t.write(reg::DRIVER_FEATURES, f as u32);
        t.write(reg::DRIVER_FEATURES_SEL, 1);
        t.write(reg::DRIVER_FEATURES, (f >> 32) as u32);
        let st = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        t.write(reg::STATUS, st);
        assert_eq!(t.read(reg::STATUS) & status::FEATURES_OK != 0, ok, "{f:#x}");
        let e = t.errors().drain();
        if ok {
            assert!(e.is_empty(), "{e:?}");
        } else {
            assert!(
                matches!(&e[..], [DeviceError::FeaturesRefused { reason, .. }] if reason.contains("cannot work without")),
                "{f:#x}: {e:?}"
            );
        }
    }
}
