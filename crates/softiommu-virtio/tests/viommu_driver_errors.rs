//! The guest-side driver's and DMA domain's own errors: each refused
//! with its typed error, nothing sent or mapped.

mod viommu_common;

use std::time::Duration;

use softiommu::dma::DmaDirection;
use softiommu_virtio::spec;
use softiommu_virtio::transport::{DeviceInfo, MmioTransport, TransportConfig};
use softiommu_virtio::viommu::{
    encode, ViommuDma, ViommuDmaError, ViommuDriver, ViommuDriverConfig, ViommuDriverError,
    ViommuMode,
};
use viommu_common::*;

#[test]
fn probing_another_device_type_is_not_viommu() {
    let r = rig();
    let blk = MmioTransport::new(
        DeviceInfo {
            device_id: 2,
            features: 0,
            queues: 1,
            queue_max: 64,
            config: vec![0; 8],
        },
        TransportConfig::default(),
    );
    let e = ViommuDriver::probe(blk, r.mem.clone(), ViommuDriverConfig::default()).unwrap_err();
    assert!(matches!(
        e,
        ViommuDriverError::NotViommu { device_id: 2, .. }
    ));
}

#[test]
fn a_queue_size_that_is_no_power_of_two_is_refused() {
    let r = rig();
    let e = ViommuDriver::probe(
        r.dev.transport().clone(),
        r.mem.clone(),
        ViommuDriverConfig {
            queue_size: 3,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        e,
        ViommuDriverError::InvalidConfig {
            field: "queue_size",
            value: 3
        }
    );
}

#[test]
fn a_request_larger_than_a_slot_is_too_large() {
    let mut r = rig();
    let e = r.drv.call(&[0u8; 300], 4).unwrap_err();
    assert!(matches!(e, ViommuDriverError::TooLarge { descs: 2, .. }));
    assert_eq!(r.dev.stats().requests, 0);
}

#[test]
fn a_device_that_stopped_answering_times_out() {
    let r = rig_with(
        config(),
        ViommuDriverConfig {
            wait: Duration::from_millis(50),
            ..Default::default()
        },
    );
    let Rig { dev, mut drv, .. } = r;
    dev.stop();
    let e = drv.request(&encode::attach(1, EA, 0)).unwrap_err();
    assert_eq!(e, ViommuDriverError::Timeout(Duration::from_millis(50)));
}

#[test]
fn a_zero_length_map_is_bad_length_and_maps_nothing() {
    let r = rig();
    let phys = r.ram(0);
    let Rig { dev, drv, .. } = r;
    let mut d = ViommuDma::new(drv, 1, &[EA], ViommuMode::Strict).unwrap();
    let e = d.map(phys, 0, DmaDirection::ToDevice).unwrap_err();
    assert_eq!(e, ViommuDmaError::BadLength { len: 0 });
    assert_eq!(dev.mappings(1).unwrap(), []);
    assert_eq!(d.stats().requests, 0);
}

/// A strict unmap whose UNMAP the device refuses returns the device's
/// status and keeps the IOVA out of the allocator: the mapping stays, and
/// the next map gets another address (after a good unmap, the freed one
/// comes back).
#[test]
fn a_strict_unmap_the_device_refuses_keeps_its_iova() {
    let r = rig();
    let phys = r.ram(0);
    let Rig { dev, drv, .. } = r;
    let mut d = ViommuDma::new(drv, 1, &[EA], ViommuMode::Strict).unwrap();
    let to = DmaDirection::ToDevice;
    // Control: a freed IOVA is the next one handed out.
    let a = d.map(phys, 0x1000, to).unwrap();
    d.unmap(a).unwrap();
    let b = d.map(phys, 0x1000, to).unwrap();
    assert_eq!(b.iova, a.iova);
    dev.inject_unmap_failure(0);
    assert_eq!(
        d.unmap(b).unwrap_err(),
        ViommuDmaError::Refused {
            op: "UNMAP",
            status: Some(softiommu_virtio::viommu::Status::DevErr)
        }
    );
    assert_eq!(dev.mappings(1).unwrap().len(), 1);
    let c = d.map(phys, 0x1000, to).unwrap();
    assert_ne!(c.iova, b.iova, "the refused UNMAP's IOVA is never reused");
}

/// The same in lazy mode: the refused UNMAP is learnt at the flush,
/// reported as its error naming the mapping, and its IOVA is not freed
/// before the UNMAP, sent again, is answered `OK`.
#[test]
fn a_lazy_unmap_the_device_refuses_is_reported_at_the_flush_and_keeps_its_iova() {
    let r = rig();
    let phys = r.ram(0);
    let Rig { dev, drv, .. } = r;
    let mode = ViommuMode::Lazy { flush_queue: 64 };
    let mut d = ViommuDma::new(drv, 1, &[EA], mode).unwrap();
    let to = DmaDirection::ToDevice;
    let a = d.map(phys, 0x1000, to).unwrap();
    d.unmap(a).unwrap();
    d.flush().unwrap();
    let b = d.map(phys, 0x1000, to).unwrap();
    assert_eq!(b.iova, a.iova, "control: a flushed IOVA comes back");
    dev.inject_unmap_failure(0);
    d.unmap(b).unwrap();
    assert_eq!(
        d.flush().unwrap_err(),
        ViommuDmaError::UnmapKept {
            iova: b.iova,
            len: 0x1000,
            status: Some(softiommu_virtio::viommu::Status::DevErr)
        }
    );
    assert_eq!(dev.mappings(1).unwrap().len(), 1);
    // Its IOVA is held while its UNMAP is owed (this map's sync sends
    // it again, after the IOVA was handed out).
    let c = d.map(phys, 0x1000, to).unwrap();
    assert_ne!(c.iova, b.iova, "the refused UNMAP's IOVA is never reused");
}

/// A virtio-iommu register block whose `page_size_mask` is `mask` and
/// nothing behind it (no device thread: a request sent would time out).
fn device_with_mask(mask: u64) -> MmioTransport {
    let cfg = config();
    let mut space = cfg.config_space();
    space[spec::iommu::CFG_PAGE_SIZE_MASK..][..8].copy_from_slice(&mask.to_le_bytes());
    MmioTransport::new(
        DeviceInfo {
            device_id: spec::iommu::DEVICE_ID,
            features: cfg.features(),
            queues: 2,
            queue_max: 64,
            config: space,
        },
        cfg.transport,
    )
}

/// §5.13.6.3: the driver maps in multiples of the device's granule, the
/// least page of `page_size_mask`. The DMA domain maps CPU pages (4 KiB),
/// so a device whose granule is larger (64 KiB) or that has none is
/// refused before any request — as Linux's driver refuses a granule
/// above the system page size. A granule at or below 4 KiB is served.
#[test]
fn a_device_granule_larger_than_a_cpu_page_is_refused_before_any_request() {
    let mem = std::sync::Arc::new(softiommu::mem::PhysMemory::new(RAM).unwrap());
    let wait = ViommuDriverConfig {
        wait: Duration::from_millis(50),
        ..Default::default()
    };
    for mask in [0x1_0000u64, 0x1_0000 | 0x20_0000, 0] {
        let drv = ViommuDriver::probe(device_with_mask(mask), mem.clone(), wait).unwrap();
        assert_eq!(drv.geometry().page_size_mask, mask);
        let e = ViommuDma::new(drv, 1, &[EA], ViommuMode::Strict).unwrap_err();
        assert_eq!(
            e,
            ViommuDmaError::Granule {
                page_size_mask: mask
            }
        );
    }
    // A 4 KiB granule passes the check (and then probes the endpoint,
    // which this register block never answers).
    let drv = ViommuDriver::probe(device_with_mask(0x1000 | 0x20_0000), mem.clone(), wait).unwrap();
    let e = ViommuDma::new(drv, 1, &[EA], ViommuMode::Strict).unwrap_err();
    assert_eq!(
        e,
        ViommuDmaError::Driver(ViommuDriverError::Timeout(Duration::from_millis(50)))
    );
}

/// A lazy unmap whose own UNMAP is queued succeeds, even when the flush
/// it triggers finds another UNMAP refused: that refusal is the next
/// `flush`'s to report. Before, the unmap returned it, though its own
/// UNMAP was done and its IOVA freed — a caller taking the error for its
/// own would unmap again, over whatever mapping got the IOVA next.
#[test]
fn a_lazy_unmap_is_not_failed_by_another_unmaps_refusal() {
    let r = rig();
    let phys = r.ram(0);
    let Rig { dev, drv, .. } = r;
    let mut d = ViommuDma::new(drv, 1, &[EA], ViommuMode::Lazy { flush_queue: 2 }).unwrap();
    let to = DmaDirection::ToDevice;
    let a = d.map(phys, 0x1000, to).unwrap();
    let b = d.map(phys, 0x1000, to).unwrap();
    // `a`'s UNMAP (the round's first table unmap) is refused.
    dev.inject_unmap_failure(0);
    d.unmap(a).unwrap();
    // The second unmap fills the flush queue: the flush runs here.
    d.unmap(b).unwrap();
    let left: Vec<u64> = dev.mappings(1).unwrap().iter().map(|m| m.start).collect();
    assert_eq!(left, vec![a.iova], "b is unmapped, a (refused) stays");
    // Reported once, naming a; the flush sent a's UNMAP again, which the
    // device took this time.
    assert_eq!(
        d.flush().unwrap_err(),
        ViommuDmaError::UnmapKept {
            iova: a.iova,
            len: 0x1000,
            status: Some(softiommu_virtio::viommu::Status::DevErr)
        }
    );
    assert_eq!(dev.mappings(1).unwrap(), []);
    d.flush().unwrap();
    let c = d.map(phys, 0x1000, to).unwrap();
    assert!(c.iova == a.iova || c.iova == b.iova, "both came back");
}

/// A lazy unmap that finds the ring full, and the flush it makes fail in
/// the driver (the device stopped answering), returns that failure — its
/// own UNMAP is not queued — not a refusal of another UNMAP an earlier
/// ring-full flush kept; that refusal stays for the next `flush`, which
/// reports it once.
#[test]
fn a_lazy_unmap_on_a_full_ring_returns_its_own_failure_not_a_kept_refusal() {
    let wait = Duration::from_millis(50);
    let r = rig_with(
        config(),
        ViommuDriverConfig {
            queue_size: 8,
            wait,
            ..Default::default()
        },
    );
    let phys = r.ram(0);
    let Rig { dev, drv, .. } = r;
    let mut d = ViommuDma::new(drv, 1, &[EA], ViommuMode::Lazy { flush_queue: 1000 }).unwrap();
    let to = DmaDirection::ToDevice;
    let mut ms = Vec::new();
    for _ in 0..60 {
        ms.push(d.map(phys, 0x1000, to).unwrap());
        d.flush().unwrap();
    }
    // The first queued UNMAP is refused; the ring fills, and the unmap
    // that finds it full flushes it: the refusal is kept.
    dev.inject_unmap_failure(0);
    let flushes = d.stats().flushes;
    while d.stats().flushes == flushes {
        d.unmap(ms.pop().unwrap()).unwrap();
    }
    // A second ring-full flush with a refusal while the first is kept:
    // counted, not reported.
    dev.inject_unmap_failure(0);
    let flushes = d.stats().flushes;
    while d.stats().flushes == flushes {
        d.unmap(ms.pop().unwrap()).unwrap();
    }
    assert_eq!(d.stats().errors_coalesced, 1);
    // The device stops answering; the ring fills again.
    dev.stop();
    let got = loop {
        match d.unmap(
            ms.pop()
                .expect("the ring fills before the mappings run out"),
        ) {
            Ok(()) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(
        got,
        ViommuDmaError::Driver(ViommuDriverError::Timeout(wait))
    );
    assert!(matches!(
        d.flush().unwrap_err(),
        ViommuDmaError::UnmapKept {
            status: Some(softiommu_virtio::viommu::Status::DevErr),
            ..
        }
    ));
    assert!(matches!(
        d.flush().unwrap_err(),
        ViommuDmaError::Driver(ViommuDriverError::Timeout(_))
    ));
}

/// A device that returns a chain the driver does not have in flight (a
/// slot never sent, here) is refused `BadUsed`: the driver neither
/// judges a request from it nor frees a slot the device may still own.
/// Before, any used id counted as an answer for its slot, and the
/// request actually sent was judged "no status" and its slot freed.
#[test]
fn a_used_element_naming_no_chain_in_flight_is_bad_used() {
    let mem = std::sync::Arc::new(softiommu::mem::PhysMemory::new(RAM).unwrap());
    let t = device_with_mask(0x1000);
    let end = softiommu_virtio::transport::DeviceEnd::new(&t);
    let gm = softiommu::access::PhysGuestMemory::new(mem.clone());
    let mut drv = ViommuDriver::probe(
        t.clone(),
        mem.clone(),
        ViommuDriverConfig {
            wait: Duration::from_millis(500),
            ..Default::default()
        },
    )
    .unwrap();
    // The "device": once the request is notified, it returns head 2 (the
    // second slot's, never queued) instead of the request's head 0.
    let fake = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while end.take_notified() & 1 == 0 {
            assert!(t0.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut g = end.queue(0).unwrap();
        let q = g.as_mut().expect("the request queue is live");
        q.add_used(&gm, 2, 4).unwrap();
    });
    let got = drv.request(&encode::detach(1, EA));
    fake.join().unwrap();
    assert_eq!(got, Err(ViommuDriverError::BadUsed(2)));
}
