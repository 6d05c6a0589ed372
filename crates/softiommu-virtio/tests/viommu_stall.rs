//! A unit whose invalidation queue stalls (an endpoint's translation
//! section stays open, so no wait's drain can complete): the device never
//! blocks forever. A request whose invalidation does not complete within
//! `invalidation_timeout` is answered `DEVERR` within the bound, the
//! endpoints the invalidation was for are blocked, the device asks for a
//! reset, and stopping the device is heard during the wait.

mod viommu_common;

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use softiommu::hw::{Access, TranslateError};
use softiommu_virtio::spec::reg;
use softiommu_virtio::transport::DeviceError;
use softiommu_virtio::viommu::{
    Status, ViommuConfig, ViommuDriver, ViommuDriverConfig, ViommuDriverError,
};
use viommu_common::*;

/// The device's bound on an invalidation.
const BOUND: Duration = Duration::from_millis(100);

fn stall_rig(bound: Duration, driver_wait: Duration) -> Rig {
    rig_with(
        ViommuConfig {
            invalidation_timeout: bound,
            ..config()
        },
        ViommuDriverConfig {
            wait: driver_wait,
            ..Default::default()
        },
    )
}

/// An endpoint's thread inside a translation section of the rig's unit
/// until the sender is dropped or sent to: every wait queued meanwhile
/// stalls on its drain.
fn hold_section(r: &Rig) -> (JoinHandle<()>, mpsc::Sender<()>) {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let sys = r.system.clone();
    let unit = r.unit;
    let h = std::thread::spawn(move || {
        let mut tr = sys.unit(unit).unwrap().translator().unwrap();
        tr.section(|_| {
            entered_tx.send(()).unwrap();
            let _ = release_rx.recv_timeout(Duration::from_secs(30));
        });
    });
    entered_rx.recv().unwrap();
    (h, release_tx)
}

#[test]
fn an_unmap_whose_invalidation_stalls_is_deverr_within_the_bound_and_blocks_the_endpoint() {
    let mut r = stall_rig(BOUND, Duration::from_secs(5));
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.attach_ok(2, EB);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    r.map_ok(2, 0x1000, 0x1fff, phys);
    // Cached in the unit's IOTLB.
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
    assert!(r.reach(B, 0x1000, Access::Read).is_ok());
    let (holder, release) = hold_section(&r);
    let t0 = Instant::now();
    let st = r.drv.unmap(1, 0x1000, 0x1fff).unwrap();
    let took = t0.elapsed();
    assert!(matches!(st, Some(Status::DevErr)), "{st:?}");
    assert!(took >= BOUND && took < Duration::from_secs(4), "{took:?}");
    // The IOTLB entry was never invalidated, yet the endpoint reaches
    // nothing: it is blocked.
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    let unit = r.system.unit(r.unit).unwrap();
    assert_eq!(unit.context(A), None);
    // Another domain's endpoint, whose range nothing unmapped, keeps it.
    assert!(r.reach(B, 0x1000, Access::Read).is_ok());
    let t = r.dev.transport();
    needs_reset(t);
    assert!(t.errors().snapshot().contains(&DeviceError::BackendFailed {
        what: "an UNMAP's IOTLB invalidation did not complete"
    }));
    let s = r.dev.stats();
    assert_eq!((s.invalidation_timeouts, s.invalidation_errors), (1, 1));
    // Not carried out: the driver learns the device needs a reset, or,
    // when the device thread takes the chain before the driver looks at
    // the status (a loaded machine), the broken device answers it DEVERR.
    // Either way domain 2 keeps its mapping.
    match r.drv.unmap(2, 0x1000, 0x1fff) {
        Err(ViommuDriverError::NeedsReset(_)) | Ok(Some(Status::DevErr)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(r.dev.mappings(2).map(|m| m.len()), Some(1));
    // The endpoint's section ends: a reset now drains and detaches all.
    release.send(()).unwrap();
    holder.join().unwrap();
    r.dev.transport().write(reg::STATUS, 0);
    assert_eq!(r.dev.attached(EB), None);
    assert_eq!(r.dev.mappings(1), None);
    assert!(matches!(
        r.reach(B, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
}

#[test]
fn an_attach_whose_context_change_stalls_is_deverr_and_blocks_the_endpoint() {
    let mut r = stall_rig(BOUND, Duration::from_secs(5));
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
    let (holder, release) = hold_section(&r);
    let t0 = Instant::now();
    // ATTACH elsewhere: the context write to domain 2 cannot be drained.
    let st = r.drv.attach(2, EA, 0).unwrap();
    assert!(matches!(st, Some(Status::DevErr)), "{st:?}");
    assert!(t0.elapsed() < Duration::from_secs(4));
    let unit = r.system.unit(r.unit).unwrap();
    assert_eq!(unit.context(A), None, "blocked, in neither domain");
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    assert_eq!(r.dev.attached(EA), None);
    // The old domain's table may still be walked by the open section:
    // the domain is kept until a reset.
    assert_eq!(r.ranges(1), [(0x1000, 0x1fff)]);
    let t = r.dev.transport();
    needs_reset(t);
    assert!(t.errors().snapshot().contains(&DeviceError::BackendFailed {
        what: "an ATTACH or DETACH's context invalidation did not complete"
    }));
    assert_eq!(r.dev.stats().invalidation_timeouts, 1);
    release.send(()).unwrap();
    holder.join().unwrap();
    r.dev.transport().write(reg::STATUS, 0);
    assert_eq!(r.dev.mappings(1), None, "freed once a reset drained");
}

#[test]
fn a_detach_whose_context_change_stalls_is_deverr_and_blocks_the_endpoint() {
    let mut r = stall_rig(BOUND, Duration::from_secs(5));
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    let (holder, release) = hold_section(&r);
    let st = r.drv.detach(1, EA).unwrap();
    assert!(matches!(st, Some(Status::DevErr)), "{st:?}");
    let unit = r.system.unit(r.unit).unwrap();
    assert_eq!(unit.context(A), None);
    assert_eq!(r.ranges(1), [(0x1000, 0x1fff)], "kept until a reset");
    release.send(()).unwrap();
    holder.join().unwrap();
}

/// Stopping the device is heard during its wait: the thread gives up at
/// once (far before its bound), and a device broken so does not wait for
/// its detaches on the way out (its tables are leaked, never freed while
/// the section may still walk them).
#[test]
fn dropping_the_device_during_a_stalled_wait_returns_before_the_bound() {
    let long = Duration::from_secs(20);
    let mut r = stall_rig(long, Duration::from_millis(100));
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    let (holder, release) = hold_section(&r);
    // The driver gives up first; the device is still waiting.
    assert_eq!(
        r.drv.unmap(1, 0x1000, 0x1fff),
        Err(ViommuDriverError::Timeout(Duration::from_millis(100)))
    );
    let Rig {
        dev, drv, system, ..
    } = r;
    let t0 = Instant::now();
    drop(dev);
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
    let unit = system.unit(softiommu::hw::UnitId(0)).unwrap();
    assert_eq!(unit.context(A), None, "blocked on the way out");
    drop(drv);
    release.send(()).unwrap();
    holder.join().unwrap();
}

/// A reset whose endpoint detach stalls (§2.4: the status write returns
/// within the bound) leaves the device broken, and says so: the next
/// driver's requests are `DEVERR` and the device sets
/// `DEVICE_NEEDS_RESET` (§2.1.2) instead of failing every request
/// silently; once the stall ends, a reset brings it back.
#[test]
fn a_reset_whose_detach_stalls_asks_for_another_reset() {
    let mut r = stall_rig(BOUND, Duration::from_secs(5));
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    let (holder, release) = hold_section(&r);
    let Rig {
        mem,
        system,
        unit,
        dev,
        drv,
    } = r;
    let t0 = Instant::now();
    // The driver goes away: its status write of 0 resets the device, whose
    // detach of the endpoint cannot drain.
    drop(drv);
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    let t = dev.transport();
    assert_eq!(t.read(reg::STATUS), 0, "a reset reads 0 once done");
    let mut drv = ViommuDriver::probe(t.clone(), mem.clone(), ViommuDriverConfig::default())
        .expect("a new driver");
    assert_eq!(drv.attach(2, EB, 0).unwrap(), Some(Status::DevErr));
    needs_reset(t);
    assert!(t.errors().snapshot().contains(&DeviceError::BackendFailed {
        what: "a reset's endpoint detach did not complete"
    }));
    // The stalled endpoint reaches nothing meanwhile.
    assert!(matches!(
        reach_in(&system, unit, A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    release.send(()).unwrap();
    holder.join().unwrap();
    drop(drv);
    let mut drv = ViommuDriver::probe(t.clone(), mem, ViommuDriverConfig::default())
        .expect("a driver after the reset");
    assert_eq!(drv.attach(2, EB, 0).unwrap(), Some(Status::Ok));
    assert_eq!(
        t.read(reg::STATUS) & softiommu_virtio::spec::status::DEVICE_NEEDS_RESET,
        0
    );
}
