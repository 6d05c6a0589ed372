//! The DMA layer over a virtio-iommu after a failure: what a request
//! still owes is never dropped. A lazy UNMAP the device refused is kept,
//! named and sent again; a lazy map whose outcome the driver could not
//! learn is undone by the next flush; answers a timed-out wait took are
//! judged by the retry; a device without PROBE is still usable.

mod viommu_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use softiommu::dma::DmaDirection;
use softiommu::hw::{Access, System, TranslateError, UnitId};
use softiommu_virtio::spec::iommu as s;
use softiommu_virtio::viommu::{
    encode, Status, ViommuConfig, ViommuDma, ViommuDmaError, ViommuDriverConfig, ViommuDriverError,
    ViommuMode,
};
use viommu_common::*;

const LAZY: ViommuMode = ViommuMode::Lazy { flush_queue: 64 };

/// A thread inside a translation section of the rig's unit until the
/// sender is sent to or dropped: every drain queued meanwhile waits.
fn hold_section(sys: &Arc<System>, unit: UnitId) -> (JoinHandle<()>, mpsc::Sender<()>) {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let sys = sys.clone();
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

/// A thread re-entering translation sections of `hold` each until `stop`.
fn churn_sections(r: &Rig, hold: Duration, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    let (sys, unit) = (r.system.clone(), r.unit);
    std::thread::spawn(move || {
        let mut tr = sys.unit(unit).unwrap().translator().unwrap();
        while !stop.load(Ordering::Acquire) {
            tr.section(|_| std::thread::sleep(hold));
        }
    })
}

/// A lazy UNMAP refused at the flush: the flush's error names the
/// mapping, the mapping is owed, and the next flush sends its UNMAP
/// again — after which the endpoint no longer reaches the buffer. Before,
/// the error named no mapping and the UNMAP was never sent again: the
/// endpoint kept writing the buffer for the domain's life.
#[test]
fn a_lazy_unmap_refused_at_a_flush_is_named_kept_and_sent_again() {
    let r = rig();
    let phys = r.ram(0);
    let Rig {
        dev,
        drv,
        system,
        unit,
        ..
    } = r;
    let mut d = ViommuDma::new(drv, 1, &[EA], LAZY).unwrap();
    let m = d.map(phys, 0x1000, DmaDirection::Bidirectional).unwrap();
    dev.inject_unmap_failure(0);
    d.unmap(m).unwrap();
    assert_eq!(
        d.flush().unwrap_err(),
        ViommuDmaError::UnmapKept {
            iova: m.iova,
            len: 0x1000,
            status: Some(Status::DevErr)
        }
    );
    assert_eq!(d.unmaps_owed(), vec![(m.iova, 0x1000)]);
    assert!(reach_in(&system, unit, A, m.iova, Access::Write).is_ok());
    // The next flush sends it again; the device takes it this time.
    assert_eq!(d.flush(), Ok(()));
    assert_eq!(d.unmaps_owed(), vec![]);
    assert_eq!(dev.mappings(1), Some(vec![]));
    assert!(matches!(
        reach_in(&system, unit, A, m.iova, Access::Write),
        Err(TranslateError::NotPresent { .. })
    ));
}

/// A lazy map whose sync finds an earlier, unrelated UNMAP refused
/// succeeds (its own MAP did); the refusal is the next flush's to report,
/// naming the unmapped buffer, and that flush unmaps it. Before, the map
/// failed with the UNMAP's error and the flush then reported nothing.
#[test]
fn a_lazy_map_is_not_failed_by_an_earlier_unmaps_refusal() {
    let r = rig();
    let phys = r.ram(0);
    let Rig { dev, drv, .. } = r;
    let mut d = ViommuDma::new(drv, 1, &[EA], LAZY).unwrap();
    let a = d.map(phys, 0x1000, DmaDirection::ToDevice).unwrap();
    dev.inject_unmap_failure(0);
    d.unmap(a).unwrap();
    let b = d.map(phys, 0x1000, DmaDirection::ToDevice).unwrap();
    assert_ne!(b.iova, a.iova);
    assert_eq!(
        d.flush().unwrap_err(),
        ViommuDmaError::UnmapKept {
            iova: a.iova,
            len: 0x1000,
            status: Some(Status::DevErr)
        }
    );
    let left: Vec<u64> = dev.mappings(1).unwrap().iter().map(|m| m.start).collect();
    assert_eq!(left, vec![b.iova], "a's UNMAP was sent again; b stays");
    assert_eq!(d.flush(), Ok(()));
}

/// A lazy map whose sync (and abandon's sync) time out in the driver,
/// while the device has applied its MAP: the call fails, and the next
/// flush — once the device answers — unmaps what the call mapped, so no
/// mapping the caller was not given stays reachable. Before, the MAP
/// stayed applied, owned by nobody, and the endpoint could write the
/// buffer the caller was told was not mapped.
#[test]
fn a_lazy_map_that_times_out_is_undone_by_the_next_flush() {
    let wait = Duration::from_millis(150);
    let r = rig_with(
        ViommuConfig {
            invalidation_timeout: Duration::from_secs(10),
            ..config()
        },
        ViommuDriverConfig {
            wait,
            ..Default::default()
        },
    );
    let (pa, pb) = (r.ram(0), r.ram(0));
    let Rig {
        dev,
        drv,
        system,
        unit,
        ..
    } = r;
    let mut d = ViommuDma::new(drv, 1, &[EA], LAZY).unwrap();
    let a = d.map(pa, 0x1000, DmaDirection::ToDevice).unwrap();
    d.unmap(a).unwrap();
    // The round [UNMAP a, MAP b] stalls on the UNMAP's invalidation,
    // with MAP b applied.
    let (holder, release) = hold_section(&system, unit);
    let e = d.map(pb, 0x1000, DmaDirection::Bidirectional).unwrap_err();
    assert_eq!(e, ViommuDmaError::Driver(ViommuDriverError::Timeout(wait)));
    release.send(()).unwrap();
    holder.join().unwrap();
    // The device's state (its lock is held through the stalled round).
    assert!(
        dev.mappings(1).unwrap().iter().any(|m| m.phys == pb),
        "control: the device applied the MAP"
    );
    assert_eq!(d.flush(), Ok(()));
    assert_eq!(dev.mappings(1), Some(vec![]));
    assert_eq!(d.unmaps_owed(), vec![]);
}

/// Answers a wait took before it timed out are judged by the retry:
/// every UNMAP the device completed is `OK`. Before, each retry wiped
/// the answers already taken, and requests the device completed were
/// judged "no status".
#[test]
fn answers_taken_before_a_driver_timeout_are_judged_by_the_retry() {
    let mut r = rig_with(
        ViommuConfig {
            batch: 1,
            ..config()
        },
        ViommuDriverConfig {
            wait: Duration::from_millis(150),
            ..Default::default()
        },
    );
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    let n = 6u64;
    let at = |i: u64| 0x10000 * (i + 1);
    for i in 0..n {
        r.map_ok(1, at(i), at(i) + 0xfff, phys);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let h = churn_sections(&r, Duration::from_millis(200), stop.clone());
    std::thread::sleep(Duration::from_millis(20));
    for i in 0..n {
        r.drv
            .queue(&encode::unmap(1, at(i), at(i) + 0xfff), s::TAIL_LEN as u32)
            .unwrap();
    }
    let mut timeouts = 0;
    let got = loop {
        match r.drv.sync() {
            Err(ViommuDriverError::Timeout(_)) if timeouts < 100 => timeouts += 1,
            other => break other,
        }
    };
    stop.store(true, Ordering::Release);
    h.join().unwrap();
    assert!(timeouts > 0, "control: the driver timed out");
    let statuses: Vec<_> = got.unwrap().iter().map(|c| c.status()).collect();
    assert_eq!(statuses, vec![Some(Status::Ok); n as usize]);
    assert_eq!(r.dev.mappings(1), Some(vec![]));
}

/// §5.13.6.5: the driver PROBEs only with `VIRTIO_IOMMU_F_PROBE`. A DMA
/// domain over a driver that did not negotiate it comes up (no PROBE
/// sent) and maps. Before, it sent PROBE anyway and refused to come up
/// on the device's `UNSUPP`.
#[test]
fn a_dma_domain_comes_up_without_probe_when_f_probe_is_not_negotiated() {
    let r = rig_with(
        config(),
        ViommuDriverConfig {
            accept: !(1u64 << s::F_PROBE),
            ..Default::default()
        },
    );
    let phys = r.ram(0);
    let Rig { dev, drv, .. } = r;
    assert_eq!(drv.features() & 1 << s::F_PROBE, 0);
    let mut d = ViommuDma::new(drv, 1, &[EA], ViommuMode::Strict).unwrap();
    let m = d.map(phys, 0x1000, DmaDirection::ToDevice).unwrap();
    assert_eq!(dev.mappings(1).unwrap()[0].start, m.iova);
    // ATTACH and MAP only.
    assert_eq!(dev.stats().requests, 2);
}
