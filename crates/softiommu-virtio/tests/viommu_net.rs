//! The virtio-net driver over a virtio-iommu: a guest whose NIC's DMA
//! the unit translates through the virtio-iommu's domain, its driver
//! (`NetDriver<ViommuDma>`) mapping every buffer with MAP and UNMAP
//! requests and its rings mapped once. A UDP round trip with a peer host
//! sends the requests and makes the unit invalidate; lazy mode notifies
//! less per datagram than strict; and a receive buffer unmapped (strict:
//! UNMAP completed) while the device still owns it makes the device's
//! write fault — recorded by the unit, reported on the event queue, and
//! the device's typed error — with nothing written. An UNMAP the device
//! refuses is the driver's typed error.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use smoltcp::socket::udp;
use smoltcp::wire::{IpEndpoint, Ipv4Cidr};
use softiommu::dma::DmaPolicy;
use softiommu::hw::{Access, FaultReason, SourceId, System, UnitConfig, UnitId};
use softiommu::mem::PhysMemory;
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::net::{
    wire, DriverError, NetConfig, NetDevice, NetDeviceConfig, NetDriver, NetDriverConfig, NetStack,
    WireConfig,
};
use softiommu_virtio::transport::DeviceError;
use softiommu_virtio::viommu::{
    Status, ViommuConfig, ViommuDevice, ViommuDma, ViommuDmaError, ViommuDriver,
    ViommuDriverConfig, ViommuMode,
};

/// The guest NIC's requester id, the virtio-iommu's endpoint.
const SID: SourceId = SourceId(0x0018);

/// The guest (host B, 10.0.0.2): its NIC behind the unit, translated
/// through the virtio-iommu's domain 1. Fields drop in order: the stack
/// (whose driver unmaps through the virtio-iommu) before the devices.
struct Guest {
    stack: NetStack<ViommuDma>,
    _nic: NetDevice,
    viommu: ViommuDevice,
    mem: Arc<PhysMemory>,
    system: Arc<System>,
    unit: UnitId,
}

/// The peer (host A, 10.0.0.1, its own IOMMU strict) and the guest over
/// a virtio-iommu in `mode`, wired together.
fn rig(mode: ViommuMode) -> (Host, NetStack, Guest) {
    let w = WireConfig {
        max_frame: NetConfig::default().max_frame(),
        ..WireConfig::default()
    };
    let (pa, pb, _) = wire(w);
    let peer = Host::new(
        &HostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 256 << 20,
            ..HostConfig::default()
        },
        pa,
    )
    .expect("peer");
    let ps = peer
        .stack(NetDriverConfig::default(), Ipv4Cidr::new(A_IP, 24))
        .expect("peer stack");
    let mem = Arc::new(PhysMemory::new(256 << 20).expect("memory"));
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).expect("unit");
    sys.assign(SID, unit).expect("assign");
    let system = Arc::new(sys);
    let viommu = ViommuDevice::spawn(
        ViommuConfig {
            endpoints: vec![SID],
            ..ViommuConfig::default()
        },
        system.clone(),
        unit,
    )
    .expect("virtio-iommu");
    let vdrv = ViommuDriver::probe(
        viommu.transport().clone(),
        mem.clone(),
        ViommuDriverConfig::default(),
    )
    .expect("virtio-iommu driver");
    let dma = ViommuDma::new(vdrv, 1, &[u32::from(SID.0)], mode).expect("domain");
    let nic = NetDevice::spawn(
        NetDeviceConfig {
            net: NetConfig {
                mac: [0x02, 0, 0, 0, 0, 0x02],
                ..NetConfig::default()
            },
            ..NetDeviceConfig::default()
        },
        system.clone(),
        SID,
        pb,
    )
    .expect("nic");
    let drv = NetDriver::probe_with(
        nic.transport().clone(),
        mem.clone(),
        dma,
        NetDriverConfig::default(),
    )
    .expect("net driver over the virtio-iommu");
    let guest = Guest {
        stack: NetStack::new(drv, Ipv4Cidr::new(B_IP, 24)),
        _nic: nic,
        viommu,
        mem,
        system,
        unit,
    };
    (peer, ps, guest)
}

fn socket(port: u16) -> udp::Socket<'static> {
    let rx = udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 256], vec![0; 1 << 18]);
    let tx = udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 256], vec![0; 1 << 18]);
    let mut s = udp::Socket::new(rx, tx);
    s.bind(port).expect("bind");
    s
}

/// What the virtio-iommu did over `n` round trips after a warm-up:
/// `(requests, notifications, invalidations)`.
fn round_trips(mode: ViommuMode, n: u64) -> (u64, u64, u64) {
    let (_peer, mut ps, mut g) = rig(mode);
    let hp = ps.sockets.add(socket(7));
    let hg = g.stack.sockets.add(socket(5000));
    let to = IpEndpoint::new(ip(A_IP), 7);
    let mut counts = None;
    let (mut sent, mut back) = (0u64, 0u64);
    let warm = 8;
    let t0 = Instant::now();
    while back < warm + n {
        assert!(t0.elapsed() < Duration::from_secs(30), "{back} of {n}");
        if back == warm && counts.is_none() {
            let st = g.viommu.stats();
            counts = Some((
                st.requests,
                g.viommu.transport().notifications(),
                st.invalidations,
            ));
        }
        // One datagram out at a time: a round trip each.
        let sg = g.stack.sockets.get_mut::<udp::Socket>(hg);
        if sent == back && sg.can_send() {
            sg.send_slice(&[0x3c; 32], to).unwrap();
            sent += 1;
        }
        g.stack.poll().expect("guest");
        ps.poll().expect("peer");
        // The peer echoes.
        let sp = ps.sockets.get_mut::<udp::Socket>(hp);
        while let Ok((d, meta)) = sp.recv() {
            let d = d.to_vec();
            sp.send_slice(&d, meta.endpoint).unwrap();
        }
        ps.poll().expect("peer");
        g.stack.poll().expect("guest");
        let sg = g.stack.sockets.get_mut::<udp::Socket>(hg);
        while let Ok((d, _)) = sg.recv() {
            assert_eq!(d, &[0x3c; 32][..]);
            back += 1;
        }
        std::thread::park_timeout(Duration::from_micros(100));
    }
    // The guest has reclaimed what it sent and reposted what it got.
    g.stack.driver.reclaim_tx().unwrap();
    let st = g.viommu.stats();
    let (r0, n0, i0) = counts.unwrap();
    (
        st.requests - r0,
        g.viommu.transport().notifications() - n0,
        st.invalidations - i0,
    )
}

/// Strict: every datagram out is a MAP and an UNMAP, every one back an
/// UNMAP and a MAP (its buffer reposted), each notified on its own, and
/// every UNMAP the unit's invalidation. Lazy: one notification per map
/// sync (the UNMAPs wait on the flush queue), so fewer per datagram.
#[test]
fn a_udp_round_trip_over_the_viommu_sends_requests_and_invalidates() {
    let n = 40;
    let (req, notes, inv) = round_trips(ViommuMode::Strict, n);
    let per = |x: u64| x as f64 / n as f64;
    assert!(
        (3.5..=4.5).contains(&per(req)),
        "strict: {req} requests for {n} round trips"
    );
    assert_eq!(notes, req, "strict notifies every request");
    assert!(
        (1.5..=2.5).contains(&per(inv)),
        "strict: {inv} invalidations for {n} round trips"
    );
    let (lreq, lnotes, linv) = round_trips(ViommuMode::Lazy { flush_queue: 256 }, n);
    assert!(per(lreq) >= 3.5, "lazy sends the same MAPs and UNMAPs");
    assert!(
        per(lnotes) < per(notes) && per(lnotes) <= 2.5,
        "lazy notifications {lnotes} vs strict {notes}"
    );
    assert!(linv < inv, "lazy invalidations {linv} vs strict {inv}");
}

/// A receive buffer unmapped while the device owns it (strict: the UNMAP
/// and its invalidation completed): the datagram that lands in it makes
/// the device's write fault — the unit records it at the buffer's IOVA,
/// the virtio-iommu reports it on its event queue, the device stops with
/// its typed error — and the buffer's bytes are untouched.
#[test]
fn the_device_faults_on_a_buffer_after_its_unmap_completed() {
    let (_peer, mut ps, mut g) = rig(ViommuMode::Strict);
    let hp = ps.sockets.add(socket(5000));
    let hg = g.stack.sockets.add(socket(9));
    let to = IpEndpoint::new(ip(B_IP), 9);
    const MARK: [u8; 64] = [0xa5; 64];
    let (mut sent, mut got) = (0u64, 0u64);
    let mut revoked = None;
    let t0 = Instant::now();
    let err = loop {
        assert!(t0.elapsed() < Duration::from_secs(30), "no fault came");
        ps.poll().expect("the peer is fine");
        if let Err(e) = g.stack.poll() {
            break e;
        }
        let sp = ps.sockets.get_mut::<udp::Socket>(hp);
        if sp.can_send() && sent < got + 8 {
            sp.send_slice(&[0x5a; 200], to).unwrap();
            sent += 1;
        }
        let sg = g.stack.sockets.get_mut::<udp::Socket>(hg);
        while let Ok((d, _)) = sg.recv() {
            assert_eq!(d, &[0x5a; 200][..]);
            got += 1;
        }
        if got >= 20 && revoked.is_none() {
            let before = g.viommu.stats().unmaps;
            let (iova, phys, len) = g
                .stack
                .driver
                .revoke_posted_rx()
                .unwrap()
                .expect("posted buffers");
            assert_eq!(g.viommu.stats().unmaps, before + 1, "the UNMAP completed");
            g.mem.write(phys, &MARK).unwrap();
            revoked = Some((iova, phys, len));
        }
        std::thread::park_timeout(Duration::from_micros(100));
    };
    let (iova, phys, _) = revoked.expect("revoked before the fault");
    let DriverError::DeviceNeedsReset { first, .. } = &err else {
        panic!("expected DeviceNeedsReset, got {err:?}");
    };
    assert!(
        matches!(
            first,
            Some(DeviceError::DmaFault { queue: 0, what: "buffer", iova: at, access: Access::Write, .. }) if *at == iova
        ),
        "{first:?}"
    );
    // The virtio-iommu reports it on its event queue (its own thread: a
    // bounded wait),
    // before the log is drained here.
    let t1 = Instant::now();
    while g.viommu.stats().events == 0 && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(g.viommu.stats().events >= 1, "{:?}", g.viommu.stats());
    let faults = g
        .system
        .unit(g.unit)
        .map(|u| u.faults().drain().records)
        .unwrap_or_default();
    assert!(
        faults.iter().any(|f| f.iova == iova
            && f.access == Access::Write
            && f.reason == FaultReason::NotPresent),
        "{faults:?}"
    );
    let mut now = [0u8; 64];
    g.mem.read(phys, &mut now).unwrap();
    assert_eq!(
        now, MARK,
        "the device wrote nothing into the revoked buffer"
    );
}

/// The device refuses an UNMAP (a page-table unmap that failed: `DEVERR`):
/// the driver's call that unmapped returns it, typed, as
/// `DriverError::Viommu` (the buffer is retired, never reposted: it may
/// still be mapped).
#[test]
fn an_unmap_the_viommu_refuses_is_the_drivers_typed_error() {
    let (_peer, mut ps, mut g) = rig(ViommuMode::Strict);
    let hg = g.stack.sockets.add(socket(5000));
    g.viommu.inject_unmap_failure(0);
    let to = IpEndpoint::new(ip(A_IP), 7);
    g.stack
        .sockets
        .get_mut::<udp::Socket>(hg)
        .send_slice(&[1; 32], to)
        .unwrap();
    let t0 = Instant::now();
    let err = loop {
        assert!(t0.elapsed() < Duration::from_secs(30), "no error came");
        let r = g.stack.poll().and_then(|_| g.stack.driver.reclaim_tx());
        if let Err(e) = r {
            break e;
        }
        ps.poll().expect("peer");
        std::thread::park_timeout(Duration::from_micros(100));
    };
    assert!(
        matches!(
            err,
            DriverError::Viommu(ViommuDmaError::Refused {
                op: "UNMAP",
                status: Some(Status::DevErr)
            })
        ),
        "{err:?}"
    );
}
