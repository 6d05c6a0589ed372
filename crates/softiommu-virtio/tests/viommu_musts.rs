//! The virtio-iommu device's MUSTs a review found broken: the order in
//! which a request's checks decide its status, used lengths that claim
//! only bytes written, and an UNMAP whose invalidation fails.

mod viommu_common;

use std::time::{Duration, Instant};

use softiommu::hw::{Access, TranslateError};
use softiommu_virtio::spec::{iommu as s, reg};
use softiommu_virtio::transport::DeviceError;
use softiommu_virtio::viommu::{encode, RawDesc, Status, ViommuDriverConfig, ViommuDriverError};
use viommu_common::*;

// ----- check order -----

#[test]
fn map_with_an_unknown_flag_is_inval_even_in_a_domain_out_of_range() {
    let mut r = rig();
    let phys = r.ram(0);
    // §5.13.6.3.2: an unrecognised flags bit MUST be rejected INVAL.
    for d in [0u32, 1024, u32::MAX] {
        assert_eq!(
            r.drv.map(d, 0x1000, 0x1fff, phys, RW | 1 << 3).unwrap(),
            Some(Status::Inval),
            "domain {d}"
        );
    }
    // A known flag in a domain out of range is still RANGE.
    assert_eq!(
        r.drv.map(1024, 0x1000, 0x1fff, phys, RW).unwrap(),
        Some(Status::Range)
    );
}

#[test]
fn attach_of_an_unknown_endpoint_is_noent_even_in_a_domain_out_of_range() {
    let mut r = rig();
    for d in [0u32, 1024, u32::MAX] {
        assert_eq!(
            r.drv.attach(d, 0x0018, 0).unwrap(),
            Some(Status::NoEnt),
            "domain {d}"
        );
    }
    // A known endpoint in a domain out of range is still RANGE.
    assert_eq!(r.drv.attach(1024, EA, 0).unwrap(), Some(Status::Range));
    assert_eq!(r.dev.attached(EA), None);
}

// ----- used lengths -----

#[test]
fn a_larger_writable_part_gets_the_tail_first_and_only_it_is_claimed() {
    let mut r = rig();
    let (used, w) = raw(&mut r, &encode::attach(1, EA, 0), &[12]);
    // The tail is the whole writable structure of ATTACH: at 0, 4 bytes
    // used; the rest untouched and not claimed.
    assert_eq!(used, 4);
    assert_eq!(&w[..4], &[s::S_OK, 0, 0, 0]);
    assert_eq!(&w[4..], &[0xaa; 8]);
    assert_eq!(r.dev.attached(EA), Some(1));
    // A failed request likewise.
    let (used, w) = raw(&mut r, &encode::attach(1, 0x0018, 0), &[12]);
    assert_eq!(
        (used, &w[..4], &w[4..]),
        (4, &[s::S_NOENT, 0, 0, 0][..], &[0xaa; 8][..])
    );
}

#[test]
fn a_failed_probe_zeroes_its_properties_and_claims_only_what_it_wrote() {
    let mut r = rig();
    let size = r.drv.geometry().probe_size;
    let n = size as usize;
    // Unknown endpoint: the properties area is written (zeroes, no
    // property), the tail right after it; bytes past it untouched.
    let (used, w) = raw(&mut r, &encode::probe(0x0018), &[size + 4 + 8]);
    assert_eq!(used, size + 4);
    assert!(w[..n].iter().all(|&b| b == 0), "properties not zeroed");
    assert_eq!(&w[n..n + 4], &[s::S_NOENT, 0, 0, 0]);
    assert_eq!(&w[n + 4..], &[0xaa; 8]);
    // A good PROBE in the same larger buffer: the tail at probe_size.
    let (used, w) = raw(&mut r, &encode::probe(EA), &[size + 4 + 8]);
    assert_eq!(used, size + 4);
    assert_eq!(u16::from_le_bytes([w[0], w[1]]), s::PROBE_T_RESV_MEM);
    assert_eq!(&w[n..n + 4], &[s::S_OK, 0, 0, 0]);
    assert_eq!(&w[n + 4..], &[0xaa; 8]);
}

// ----- a failed invalidation -----

/// Stops the unit's invalidation queue (a descriptor with a reserved
/// granularity) and waits, bounded, until it has stopped.
fn stop_queue(r: &Rig) {
    let unit = r.system.unit(r.unit).unwrap();
    unit.submit_raw(&[[0x2u64, 0]]).unwrap();
    let t0 = Instant::now();
    while unit.queue_error().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(5), "queue not stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn an_unmap_whose_invalidation_fails_is_deverr_and_the_range_is_unreachable() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.attach_ok(2, EB);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    r.map_ok(2, 0x1000, 0x1fff, phys);
    // The endpoint's translation is cached.
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
    assert!(r.reach(B, 0x1000, Access::Read).is_ok());
    stop_queue(&r);
    assert_eq!(
        r.drv.unmap(1, 0x1000, 0x1fff).unwrap(),
        Some(Status::DevErr)
    );
    // The IOTLB entry was not invalidated, yet the endpoint reaches
    // nothing: its context is gone.
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    // The device asks for a reset and says why; a driver retries nothing
    // (and the device would refuse it DEVERR until the reset).
    let t = r.dev.transport();
    // Reported right after the round's chains are returned, which the
    // driver may see first.
    needs_reset(t);
    assert!(t.errors().snapshot().contains(&DeviceError::BackendFailed {
        what: "an UNMAP's IOTLB invalidation did not complete"
    }));
    assert!(matches!(
        r.drv.unmap(1, 0x1000, 0x1fff),
        Err(ViommuDriverError::NeedsReset(_))
    ));
    // An endpoint of another domain, whose range nothing unmapped, keeps
    // its reach.
    assert!(r.reach(B, 0x1000, Access::Read).is_ok());
    assert_eq!(r.dev.stats().invalidation_errors, 1);
}

#[test]
fn an_unmap_tail_reads_ok_only_after_its_invalidation_completed() {
    let mut r = rig();
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    // A slow completion: the flush takes 30 ms, a wide window in which a
    // guest looking at the tail must not see OK.
    let unit = r.system.unit(r.unit).unwrap();
    let mut lat = unit.latency();
    lat.wait_completion = Duration::from_millis(30);
    unit.set_latency(lat);
    let base = r.drv.scratch();
    let tail = base + 0x800;
    let req = encode::unmap(1, 0x1000, 0x1fff);
    r.mem.write(base, &req).unwrap();
    r.mem.fill(tail, 4, 0xaa).unwrap();
    let before = r.dev.stats().invalidations;
    let descs = [
        RawDesc {
            addr: base,
            len: req.len() as u32,
            writable: false,
        },
        RawDesc {
            addr: tail,
            len: 4,
            writable: true,
        },
    ];
    let done = std::sync::atomic::AtomicBool::new(false);
    let (mem, dev, drv) = (&r.mem, &r.dev, &mut r.drv);
    // The invalidation count when OK was first seen in the tail.
    let seen = std::thread::scope(|sc| {
        let w = sc.spawn(|| loop {
            // Read after `done` is seen, so the last look is after the
            // request was used.
            let last = done.load(std::sync::atomic::Ordering::Acquire);
            let mut b = [0u8];
            mem.read(tail, &mut b).unwrap();
            if b[0] == s::S_OK {
                return Some(dev.stats().invalidations);
            }
            if last {
                return None;
            }
            std::hint::spin_loop();
        });
        let used = drv.raw(&descs).unwrap();
        done.store(true, std::sync::atomic::Ordering::Release);
        assert_eq!(used, 4);
        w.join().unwrap()
    });
    let mut b = [0u8; 4];
    r.mem.read(tail, &mut b).unwrap();
    assert_eq!(b, [s::S_OK, 0, 0, 0]);
    let seen = seen.expect("OK seen");
    assert!(
        seen > before,
        "OK visible before the invalidation completed"
    );
}

// ----- bypass without BYPASS_CONFIG -----

#[test]
fn a_bypass_write_without_bypass_config_is_ignored_and_put_back() {
    let mut r = rig_with(
        config(),
        ViommuDriverConfig {
            accept: !(1 << s::F_BYPASS_CONFIG),
            ..Default::default()
        },
    );
    // The driver does not write it without the feature.
    assert!(!r.drv.set_bypass(true));
    let t = r.dev.transport().clone();
    let bypass = || {
        let mut b = [0u8];
        t.read_config(s::CFG_BYPASS as u64, &mut b);
        b[0]
    };
    t.write_config(s::CFG_BYPASS as u64, &[1]);
    // The device puts back the value it applies (bounded wait).
    let t0 = Instant::now();
    while bypass() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(2), "bypass kept");
        std::thread::sleep(Duration::from_millis(1));
    }
    // And never applied it: the unattached endpoint reaches nothing.
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
    // Requests still work.
    r.attach_ok(1, EA);
}

// ----- device reset -----

#[test]
fn once_status_reads_zero_no_endpoint_is_attached() {
    // A device thread that sleeps long once idle: a reset it would only
    // notice on its next pass is visibly late.
    let cfg = softiommu_virtio::viommu::ViommuConfig {
        idle_wait: Duration::from_secs(10),
        poll: Duration::ZERO,
        ..config()
    };
    let mut r = rig_with(cfg, ViommuDriverConfig::default());
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
    std::thread::sleep(Duration::from_millis(20));
    let t = r.dev.transport();
    t.write(reg::STATUS, 0);
    assert_eq!(t.read(reg::STATUS), 0);
    // No wait: the reset was complete when status read 0.
    assert_eq!(r.dev.attached(EA), None);
    assert_eq!(r.dev.mappings(1), None);
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
}

// ----- event queue -----

#[test]
fn an_event_buffer_too_short_is_returned_and_the_next_one_takes_the_event() {
    let mut r = rig_with(
        config(),
        ViommuDriverConfig {
            events: 2,
            short_events: 1,
            ..Default::default()
        },
    );
    let phys = r.ram(0);
    r.attach_ok(1, EA);
    r.map_ok(1, 0x1000, 0x1fff, phys);
    assert!(r.reach(A, 0x5000, Access::Read).is_err());
    let evs = r.drv.wait_events(1);
    assert_eq!(evs.len(), 1);
    assert_eq!(
        (evs[0].reason, evs[0].endpoint, evs[0].address),
        (s::FAULT_R_MAPPING, EA, 0x5000)
    );
    let st = r.dev.stats();
    assert_eq!(
        (st.events, st.events_dropped, st.event_buffers_refused),
        (1, 0, 1)
    );
}

// ----- the DMA domain over the device -----

#[test]
fn a_dma_domain_outside_the_domain_range_is_refused_before_any_request() {
    let r = rig();
    let requests = r.dev.stats().requests;
    let e = softiommu_virtio::viommu::ViommuDma::new(
        r.drv,
        1024,
        &[EA],
        softiommu_virtio::viommu::ViommuMode::Strict,
    )
    .unwrap_err();
    assert!(matches!(
        e,
        softiommu_virtio::viommu::ViommuDmaError::DomainOutOfRange {
            domain: 1024,
            range: (1, 1023)
        }
    ));
    assert_eq!(r.dev.stats().requests, requests);
    assert_eq!(r.dev.attached(EA), None);
}

#[test]
fn a_dma_domain_without_map_unmap_is_refused() {
    let r = rig_with(
        config(),
        ViommuDriverConfig {
            accept: !(1 << s::F_MAP_UNMAP),
            ..Default::default()
        },
    );
    let e = softiommu_virtio::viommu::ViommuDma::new(
        r.drv,
        1,
        &[EA],
        softiommu_virtio::viommu::ViommuMode::Strict,
    )
    .unwrap_err();
    assert!(matches!(
        e,
        softiommu_virtio::viommu::ViommuDmaError::NoMapUnmap
    ));
    assert_eq!(r.dev.attached(EA), None);
}

// ----- the device's own accesses -----

#[test]
fn a_request_in_a_bounce_pool_is_never_read_or_answered() {
    use softiommu::dma::{DmaDomain, DmaDomainConfig};
    let mut r = rig();
    // A DMA domain of the same unit (its own domain id) whose untrusted
    // device (endpoint B, which the test leaves to it) gets a bounce pool
    // in guest RAM.
    let dom = DmaDomain::new(
        r.system.clone(),
        DmaDomainConfig {
            did: 4000,
            bounce_bytes: 1 << 16,
            ..DmaDomainConfig::default()
        },
    )
    .unwrap();
    let _dev = dom.attach(B, u64::MAX, true).unwrap();
    // Find a bounce frame: RAM the device view must refuse.
    let pool = (0..RAM)
        .step_by(4096)
        .find(|&p| r.mem.check_device_range(p, 4096).is_err())
        .expect("a bounce frame in RAM");
    // An ATTACH placed there, the tail in ordinary RAM.
    r.mem.write(pool, &encode::attach(1, EA, 0)).unwrap();
    let tail = r.drv.scratch() + 0x800;
    r.mem.fill(tail, 4, 0xaa).unwrap();
    let used = two_descs(&mut r, pool, s::ATTACH_LEN as u32, tail);
    let mut b = [0u8; 4];
    r.mem.read(tail, &mut b).unwrap();
    assert_eq!((used, b), (4, [s::S_FAULT, 0, 0, 0]));
    assert_eq!(r.dev.attached(EA), None);
    // A tail there: not written, the request not carried out.
    let req = r.drv.scratch();
    r.mem.write(req, &encode::attach(1, EA, 0)).unwrap();
    let used = two_descs(&mut r, req, s::ATTACH_LEN as u32, pool + 0x100);
    assert_eq!(used, 0);
    assert_eq!(r.dev.attached(EA), None);
}

#[test]
fn a_lazy_map_sg_with_a_refused_segment_leaves_nothing_mapped() {
    use softiommu::dma::DmaDirection;
    use softiommu_virtio::viommu::{ViommuDma, ViommuDmaError, ViommuMode};
    let r = rig();
    let phys = r.ram(0);
    let Rig { dev, drv, .. } = r;
    let mut d = ViommuDma::new(drv, 1, &[EA], ViommuMode::Lazy { flush_queue: 32 }).unwrap();
    // The second segment lies past guest RAM: its MAP is refused RANGE.
    let e = d
        .map_sg(&[(phys, 0x1000), (RAM, 0x1000)], DmaDirection::ToDevice)
        .unwrap_err();
    // The first segment's MAP succeeded, and was undone: the caller got
    // no mapping, so none may stay.
    assert_eq!(dev.mappings(1), Some(vec![]));
    assert!(matches!(
        e,
        ViommuDmaError::Refused {
            op: "MAP",
            status: Some(Status::Range)
        }
    ));
    // The domain goes on working.
    let m = d.map(phys, 0x1000, DmaDirection::ToDevice).unwrap();
    let again = dev.mappings(1).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].start, m.iova);
}

/// A switch to "no bypass" the unit refuses (its queue stopped) fails
/// closed: when the write returns, every unattached endpoint is blocked
/// and the device asks for a reset (§2.1.2). (This test used to accept
/// the endpoint staying in pass-through until the queue was recovered.)
#[test]
fn a_bypass_switch_the_unit_refused_blocks_every_endpoint_and_asks_for_a_reset() {
    let cfg = softiommu_virtio::viommu::ViommuConfig {
        bypass: true,
        ..config()
    };
    let r = rig_with(cfg, ViommuDriverConfig::default());
    // Unattached and bypass: pass-through.
    assert!(r.reach(A, 0x1000, Access::Read).is_ok());
    assert!(r.reach(B, 0x1000, Access::Read).is_ok());
    // The unit cannot detach now: the switch to "no bypass" fails.
    stop_queue(&r);
    assert!(r.drv.set_bypass(false));
    for sid in [A, B] {
        assert!(matches!(
            r.reach(sid, 0x1000, Access::Read),
            Err(TranslateError::NoContext { .. })
        ));
    }
    assert_ne!(
        r.dev.transport().read(softiommu_virtio::spec::reg::STATUS)
            & softiommu_virtio::spec::status::DEVICE_NEEDS_RESET,
        0
    );
    // Recovering the queue gives nobody pass-through back.
    let unit = r.system.unit(r.unit).unwrap();
    assert!(unit
        .recover_queue(softiommu::hw::QueueRecovery::Skip)
        .unwrap());
    std::thread::sleep(Duration::from_millis(20));
    assert!(matches!(
        r.reach(A, 0x1000, Access::Read),
        Err(TranslateError::NoContext { .. })
    ));
}
