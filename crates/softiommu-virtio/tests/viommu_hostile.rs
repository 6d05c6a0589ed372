//! A hostile guest against the virtio-iommu: what a second review's
//! probing found, one test each.

mod viommu_common;

use softiommu::dma::DmaDomain;
use softiommu::hw::{Access, FaultReason, TranslateError};
use softiommu_virtio::spec::iommu as s;
use softiommu_virtio::viommu::{Status, ViommuConfig, ViommuDevice, ViommuError, MAX_PROBE_SIZE};
use viommu_common::*;

/// A bounce pool of a host DMA domain (id 4000, outside the device's
/// range) on the device's unit, whose untrusted device is `B`: its first
/// frame.
fn host_pool(r: &Rig) -> (std::sync::Arc<DmaDomain>, softiommu::DmaDevice, u64) {
    let dom = host_bounce_domain(&r.system);
    let dev = dom.attach(B, u64::MAX, true).unwrap();
    let pool = first_pool_frame(&r.mem);
    (dom, dev, pool)
}

#[test]
fn a_probe_size_the_device_would_allocate_per_request_is_refused() {
    let r = rig();
    drop(r.dev);
    // The guest sends as many PROBEs as it likes, each zeroing and
    // writing `probe_size` bytes: a configuration of gigabytes would let
    // it make the device allocate and write them per request.
    for probe_size in [0xffff_fffc, MAX_PROBE_SIZE + 4] {
        assert_eq!(
            ViommuDevice::spawn(
                ViommuConfig {
                    probe_size,
                    ..config()
                },
                r.system.clone(),
                r.unit,
            )
            .map(|_| ()),
            Err(ViommuError::InvalidConfig {
                field: "probe_size",
                value: u64::from(probe_size)
            })
        );
    }
    assert!(ViommuDevice::spawn(
        ViommuConfig {
            probe_size: MAX_PROBE_SIZE,
            ..config()
        },
        r.system.clone(),
        r.unit,
    )
    .is_ok());
}

#[test]
fn a_map_of_a_bounce_pool_is_range_and_maps_nothing() {
    let mut r = rig();
    let (_dom, _dev, pool) = host_pool(&r);
    r.attach_ok(1, EA);
    // The pool's frame itself, and a range running into it.
    for (phys, end) in [(pool, 0x1fff), (pool - 0x1000, 0x2fff)] {
        assert_eq!(
            r.drv.map(1, 0x1000, end, phys, RW).unwrap(),
            Some(Status::Range)
        );
    }
    assert_eq!(r.ranges(1), vec![]);
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
}

#[test]
fn a_bypassed_endpoint_cannot_reach_a_bounce_pool_and_the_guest_hears_of_it() {
    let mut r = rig();
    let (_dom, _dev, pool) = host_pool(&r);
    r.mem.fill(pool, 64, 0x5a).unwrap();
    // A bypass domain: its endpoint's IOVA is the physical address.
    assert_eq!(
        r.drv.attach(2, EA, s::ATTACH_F_BYPASS).unwrap(),
        Some(Status::Ok)
    );
    assert!(r.reach(A, pool - 0x1000, Access::Write).is_ok());
    assert_eq!(
        r.reach(A, pool, Access::Write).unwrap_err(),
        TranslateError::BounceFrame {
            sid: A,
            iova: pool,
            access: Access::Write
        }
    );
    let mut b = [0u8; 64];
    r.mem.read(pool, &mut b).unwrap();
    assert_eq!(b, [0x5a; 64]);
    let evs = r.drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    assert_eq!(
        (evs[0].reason, evs[0].endpoint, evs[0].address),
        (s::FAULT_R_UNKNOWN, EA, pool)
    );
    assert_ne!(evs[0].flags & s::FAULT_F_WRITE, 0);
    let log = r.system.unit(r.unit).unwrap().faults().drain();
    assert!(log
        .records
        .iter()
        .any(|f| f.sid == A && f.reason == FaultReason::BounceFrame));
}

#[test]
fn an_unmap_of_the_whole_address_space_removes_every_mapping_at_the_edges() {
    use softiommu_virtio::viommu::INPUT_END;
    let mut r = rig();
    let p = r.ram(0);
    r.attach_ok(1, EA);
    // The lowest and the highest page of the input range.
    r.map_ok(1, 0, 0xfff, p);
    r.map_ok(1, INPUT_END - 0xfff, INPUT_END, p);
    assert!(r.reach(A, INPUT_END - 7, Access::Write).is_ok());
    // An end past the input range (even 2^64 - 1) names no mapping the
    // device could hold: the whole space, both removed.
    assert_eq!(r.drv.unmap(1, 0, u64::MAX).unwrap(), Some(Status::Ok));
    assert_eq!(r.ranges(1), vec![]);
    for iova in [0, INPUT_END - 7] {
        assert!(matches!(
            r.reach(A, iova, Access::Read),
            Err(TranslateError::NotPresent { .. })
        ));
    }
    // And again: nothing to remove is OK.
    assert_eq!(r.drv.unmap(1, 0, u64::MAX).unwrap(), Some(Status::Ok));
}

/// A guest maps RAM that is free (checked at MAP: no IOMMU frame yet),
/// its endpoint reaches it and the unit caches the translation; then the
/// host's DMA layer takes the same frames for a bounce pool. The guest's
/// mapping must not reach the pool: its domain id is the device's
/// (claimed), so the walk refuses a leaf over a pool frame, and making the
/// pool dropped the cached entry.
#[test]
fn a_guest_mapping_of_ram_later_taken_for_a_bounce_pool_no_longer_reaches_it() {
    use softiommu::{DmaAccessor, DmaAttrs};
    let mut r = rig();
    // Where a pool lands: made, then given back.
    let (dom, dev, pool) = host_pool(&r);
    drop(dev);
    drop(dom);
    assert!(
        r.mem.check_device_range(pool, 4096).is_ok(),
        "free RAM again"
    );
    r.attach_ok(1, EA);
    r.map_ok(1, 0x10_0000, 0x10_0fff, pool);
    let mut acc = DmaAccessor::new(r.system.unit(r.unit).unwrap(), A).unwrap();
    acc.write(0x10_0000, &[0x11; 8], DmaAttrs::ORDERED).unwrap();
    // The pool takes the same frames again.
    let (_dom, _dev, again) = host_pool(&r);
    assert_eq!(again, pool);
    r.mem.fill(pool, 64, 0x5a).unwrap();
    assert_eq!(
        acc.write(0x10_0000, &[0xee; 8], DmaAttrs::ORDERED),
        Err(softiommu::AccessError::Translate(
            TranslateError::BounceFrame {
                sid: A,
                iova: 0x10_0000,
                access: Access::Write
            }
        ))
    );
    assert!(matches!(
        r.reach(A, 0x10_0000, Access::Read),
        Err(TranslateError::BounceFrame { .. })
    ));
    let mut b = [0u8; 64];
    r.mem.read(pool, &mut b).unwrap();
    assert_eq!(b, [0x5a; 64]);
    // The guest hears of it.
    let evs = r.drv.wait_events(1);
    assert!(evs
        .iter()
        .any(|e| e.endpoint == EA && e.address == 0x10_0000 && e.reason == s::FAULT_R_UNKNOWN));
}

/// The same, with the guest's endpoint holding a zero-copy mapping of the
/// frames open (a translation section) while the host makes its pool: the
/// pool must not get data while an access translated before it may still
/// copy. The pool waits for the section, at most a bound; past it no pool
/// is made of those frames (the attach fails, the frames stay RAM). Once
/// the section ends, the pool is made and the guest's mapping refused.
#[test]
fn a_bounce_pool_is_not_made_under_an_open_guest_mapping_of_its_frames() {
    use softiommu::dma::{DmaDirection, DmaError};
    use softiommu::hw::QiError;
    use softiommu::{DmaAccessor, DmaAttrs};
    use std::sync::mpsc;
    let mut r = rig();
    let (dom, dev, pool) = host_pool(&r);
    drop(dev);
    drop(dom);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x10_0000, 0x10_0fff, pool);
    let unit = r.system.unit(r.unit).unwrap();
    let (opened, open_rx) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            let mut acc = DmaAccessor::new(unit, A).unwrap();
            acc.with_map(
                0x10_0000,
                64,
                DmaDirection::FromDevice,
                DmaAttrs::ORDERED,
                |_m| {
                    opened.send(()).unwrap();
                    release_rx.recv().unwrap();
                },
            )
            .unwrap();
        });
        open_rx.recv().unwrap();
        let dom = host_bounce_domain(&r.system);
        let t0 = std::time::Instant::now();
        assert!(matches!(
            dom.attach(B, u64::MAX, true),
            Err(DmaError::Queue(QiError::InvalidationTimeout { .. }))
        ));
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
        assert!(r.mem.check_device_range(pool, 4096).is_ok(), "no pool made");
        release.send(()).unwrap();
    });
    let (_dom, _dev, again) = host_pool(&r);
    assert_eq!(again, pool);
    assert!(matches!(
        r.reach(A, 0x10_0000, Access::Write),
        Err(TranslateError::BounceFrame { .. })
    ));
}

/// The device goes away while its unit's queue is dead: no queued detach
/// can be made, yet every endpoint must lose its guest context (cleared
/// without a wait) and the device's domain ids stay claimed while any
/// context may still name them. A pool the host later makes on a frame
/// the guest had mapped is never reached through the guest's mapping.
#[test]
fn a_device_dropped_with_a_dead_queue_leaves_no_endpoint_on_a_guest_table() {
    use softiommu::hw::{QueueMode, UnitConfig};
    use softiommu_virtio::viommu::ViommuDriverConfig;
    let mut r = rig_on(
        config(),
        ViommuDriverConfig::default(),
        UnitConfig {
            queue_mode: QueueMode::Thread,
            ..UnitConfig::default()
        },
    );
    // Where a pool lands: made, then given back.
    let (dom, dev, pool) = host_pool(&r);
    drop(dev);
    drop(dom);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x10_0000, 0x10_0fff, pool);
    assert!(r.reach(A, 0x10_0000, Access::Write).is_ok());
    let unit = r.system.unit(r.unit).unwrap();
    assert!(unit.inject_queue_thread_death());
    while unit.queue_thread_alive() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let Rig {
        mem,
        system,
        unit: uid,
        dev,
        drv,
    } = r;
    // The device goes first: the driver's reset would detach.
    drop(dev);
    let dom = host_bounce_domain(&system);
    // On the other unit: the dead one's queue takes no attach.
    let _dev = dom.attach(C, u64::MAX, true).unwrap();
    assert!(
        mem.check_device_range(pool, 4096).is_err(),
        "the pool is on the guest's frame"
    );
    let got = reach_in(&system, uid, A, 0x10_0000, Access::Write);
    drop(drv);
    assert!(
        matches!(
            got,
            Err(TranslateError::NoContext { .. } | TranslateError::BounceFrame { .. })
        ),
        "{got:?}"
    );
}

/// The device's own writes to guest memory (a request's tail, through a
/// view that checks the bounce bitmap when it hands out the slice) are
/// made inside its thread's translation section on its unit: a bounce
/// pool made while such a write is still to come waits for it, so the
/// pool never gets a byte written through a slice handed out before its
/// frames were marked.
#[test]
fn a_bounce_pool_waits_for_the_devices_own_write_in_progress() {
    use softiommu::hw::UnitConfig;
    use softiommu_virtio::viommu::ViommuDriverConfig;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let mut r = rig_on(
        config(),
        ViommuDriverConfig::default(),
        UnitConfig::default(),
    );
    let (entered, release) = r.dev.inject_access_stall();
    let released = AtomicBool::new(false);
    let system = r.system.clone();
    let drv = &mut r.drv;
    std::thread::scope(|sc| {
        let guest = sc.spawn(move || drv.attach(1, EA, 0));
        // The device thread holds the tail's slice, not yet written.
        entered.recv().unwrap();
        let released = &released;
        sc.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            released.store(true, Ordering::SeqCst);
            release.send(()).unwrap();
        });
        let dom = host_bounce_domain(&system);
        // On the other unit: the pool's drain covers every unit.
        let _dev = dom.attach(C, u64::MAX, true).unwrap();
        assert!(
            released.load(Ordering::SeqCst),
            "the pool was made while the device's write was still to come"
        );
        assert_eq!(guest.join().unwrap().unwrap(), Some(Status::Ok));
    });
}
