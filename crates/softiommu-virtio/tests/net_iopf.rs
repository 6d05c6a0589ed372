//! virtio-net with a NIC in IOPF mode. Its memory is not
//! pre-mapped: the driver's maps are registrations (a pass-through DMA
//! domain hands it physical addresses), the NIC sits in an `IopfDomain`
//! over the guest's RAM that starts empty, and its first touch of every
//! page — descriptor tables, rings, receive and transmit buffers — raises
//! a page request that the handler serves. UDP echoes between two hosts
//! must come back intact with faults counted and none refused; a second
//! round over the same buffers hardly faults; a reclaim of the buffers
//! mid-run makes them fault again without losing a byte; and a buffer
//! outside the domain's regions is answered `Invalid`, the NIC records a
//! fault and asks for a reset, and the refused access writes no byte.

mod common;
mod net_raw;

use std::time::Duration;

use common::{ip, run_both, stacks, B_IP};
use net_raw::{assert_stopped_then_recovers, packet, Raw, RX};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::udp;
use smoltcp::wire::IpEndpoint;
use softiommu::dma::{DmaDirection, DmaPolicy};
use softiommu::hw::{Access, FaultReason};
use softiommu::iopf::{IopfDomain, IopfStats};
use softiommu::mem::PAGE_SIZE;
use softiommu_virtio::host::{pair, Host, HostConfig, HostPair};
use softiommu_virtio::iopf_mode::IopfModeConfig;
use softiommu_virtio::net::{NetStack, WireConfig, HDR_LEN};
use softiommu_virtio::spec::{desc, net};
use softiommu_virtio::transport::DeviceError;

/// Datagrams per echo round: more than the 256 receive buffers of a
/// queue, so a round posts (and touches) every one of them.
const ROUND: usize = 320;
/// Datagrams in flight at once.
const WINDOW: usize = 16;
/// Bytes per datagram (one frame, no fragmentation).
const LEN: usize = 1000;

fn cfg(iopf: bool) -> HostConfig {
    HostConfig {
        policy: DmaPolicy::Strict, // ignored in IOPF mode: nothing is mapped up front
        mem_bytes: 256 << 20,
        iopf: iopf.then(IopfModeConfig::default),
        ..HostConfig::default()
    }
}

fn hosts(a_iopf: bool, b_iopf: bool) -> HostPair {
    let p = pair(&cfg(a_iopf), &cfg(b_iopf), WireConfig::default()).expect("hosts");
    for (h, on) in [(&p.a, a_iopf), (&p.b, b_iopf)] {
        if let Some(i) = &h.iopf {
            assert_eq!(i.domain.stats().pages_mapped, 0, "nothing pre-mapped");
        }
        assert_eq!(h.iopf.is_some(), on);
    }
    p
}

fn domain(h: &Host) -> &IopfDomain {
    &h.iopf.as_ref().expect("IOPF mode").domain
}

fn udp_socket(st: &mut NetStack, port: u16) -> SocketHandle {
    let buf = || udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 64], vec![0; 128 << 10]);
    let mut s = udp::Socket::new(buf(), buf());
    s.bind(port).expect("bind");
    st.sockets.add(s)
}

/// The `seq`th datagram: its number, then bytes that depend on it.
fn datagram(seq: usize) -> Vec<u8> {
    let mut d: Vec<u8> = (0..LEN).map(|i| (i * 31 + seq * 7) as u8).collect();
    d[..8].copy_from_slice(&(seq as u64).to_le_bytes());
    d
}

/// Echoes datagrams `first..first + n` from A off B's port 7 with
/// `WINDOW` in flight, checking each echo byte for byte and in order;
/// `at(i, b)` runs once after the `i`th echo came back (0-based within
/// the round), with host B's stack. Bounded: fails after 60 s.
fn echo_round(
    a: &mut NetStack,
    b: &mut NetStack,
    first: usize,
    n: usize,
    mut at: impl FnMut(usize, &mut NetStack),
) {
    let (ha, hb) = (udp_socket(a, 5000 + first as u16), udp_socket(b, 7));
    let peer = IpEndpoint::new(ip(B_IP), 7);
    let (mut sent, mut back) = (0usize, 0usize);
    run_both(a, b, Duration::from_secs(60), |a, b| {
        let sb = b.sockets.get_mut::<udp::Socket>(hb);
        while let Ok((data, meta)) = sb.recv() {
            let (data, from) = (data.to_vec(), meta.endpoint);
            sb.send_slice(&data, from).map_err(|e| e.to_string())?;
        }
        let sa = a.sockets.get_mut::<udp::Socket>(ha);
        while let Ok((data, _)) = sa.recv() {
            assert!(
                data == datagram(first + back),
                "echo {} came back different",
                first + back
            );
            back += 1;
            at(back - 1, b);
        }
        let sa = a.sockets.get_mut::<udp::Socket>(ha);
        while sent < n && sent - back < WINDOW && sa.can_send() {
            sa.send_slice(&datagram(first + sent), peer)
                .map_err(|e| e.to_string())?;
            sent += 1;
        }
        Ok(back == n)
    })
    .expect("echo round");
    a.sockets.remove(ha);
    b.sockets.remove(hb);
}

/// Nothing refused, no DMA fault, no device error on host `h`; returns
/// its domain's counts.
fn clean(h: &Host) -> IopfStats {
    let s = domain(h).stats();
    assert!(matches!(s.refused, 0), "no request refused: {s:?}");
    let hs = h.iopf.as_ref().expect("IOPF mode").handler.stats();
    assert!(matches!(hs.answered_invalid, 0), "{hs:?}");
    assert!(hs.answered_success >= s.served, "{hs:?} {s:?}");
    assert!(h.take_faults().is_empty(), "no DMA fault recorded");
    assert_eq!(h.device.transport().errors().total(), 0);
    s
}

/// Page requests the host's unit raised.
fn raised(h: &Host) -> u64 {
    h.system
        .unit(h.unit)
        .expect("unit")
        .page_request_stats()
        .raised
}

#[test]
fn udp_echo_between_two_iopf_hosts_faults_its_memory_in_once() {
    let p = hosts(true, true);
    let (mut a, mut b) = stacks(&p);
    echo_round(&mut a, &mut b, 0, ROUND, |_, _| {});
    let first = [clean(&p.a).served, clean(&p.b).served];
    echo_round(&mut a, &mut b, ROUND, ROUND, |_, _| {});
    let second = [clean(&p.a).served - first[0], clean(&p.b).served - first[1]];
    println!("faults served: first round {first:?}, second round {second:?}");
    for (h, f1, f2) in [(&p.a, first[0], second[0]), (&p.b, first[1], second[1])] {
        // Every receive buffer was touched: the pool's 128 pages at least.
        assert!(f1 >= 128, "first round served {f1}");
        assert!(f2 * 8 < f1, "second round {f2} vs first {f1}");
        let s = domain(h).stats();
        assert_eq!(s.pages_premapped, 0, "premap 1 maps the faulting page only");
        assert_eq!(s.pages_mapped, s.served, "one page per fault");
        assert!(raised(h) >= s.served, "the unit raised {}", raised(h));
    }
    assert_eq!(p.wire.a_to_b().dropped + p.wire.b_to_a().dropped, 0);
}

#[test]
fn reclaiming_the_buffers_mid_run_faults_them_in_again_and_keeps_the_data() {
    // Host A maps through the DMA API as usual; host B faults.
    let p = hosts(false, true);
    assert!(p.a.iopf.is_none());
    let (mut a, mut b) = stacks(&p);
    let d = domain(&p.b);
    let pools = [net::RX_QUEUE, net::TX_QUEUE]
        .map(|q| b.driver.buffer_pool(q).expect("a queue of the driver"));
    let mut before = None;
    let mut reclaimed = 0;
    echo_round(&mut a, &mut b, 0, 2 * ROUND, |i, _| {
        if i != ROUND {
            return;
        }
        // Mid-run, with datagrams in flight: take both pools back (an MMU
        // notifier's invalidation), the device running.
        before = Some(d.stats().served);
        for (base, len) in pools {
            let r = d.reclaim(base, len);
            assert!(matches!(r, Ok(n) if n > 0), "reclaim {base:#x}: {r:?}");
            reclaimed += r.unwrap_or(0);
        }
    });
    let before = before.expect("the reclaim ran");
    let s = clean(&p.b);
    let after = s.served - before;
    println!("faults served: {before} before the reclaim of {reclaimed} pages, {after} after");
    assert_eq!(s.reclaims, 2);
    assert_eq!(s.pages_reclaimed, reclaimed);
    // Every receive buffer is posted again and written after the reclaim.
    assert!(after >= 128, "{after} faults after the reclaim");
    assert!(p.a.take_faults().is_empty());
    assert_eq!(p.wire.a_to_b().dropped + p.wire.b_to_a().dropped, 0);
}

fn raw_iopf() -> Raw {
    let r = Raw::with(&HostConfig {
        mem_bytes: 64 << 20,
        iopf: Some(IopfModeConfig::default()),
        ..HostConfig::default()
    });
    let last = domain(&r.host).regions().last().map(|g| g.iova + g.len);
    assert_eq!(last, Some(r.mem.size()), "the guest's RAM runs to the end");
    r
}

#[test]
fn a_receive_buffer_outside_the_regions_is_answered_invalid() {
    let mut r = raw_iopf();
    let outside = r.mem.size() + (1 << 20);
    r.desc(RX, 0, outside, 2048, desc::F_WRITE, 0);
    r.publish(RX, 0);
    r.inject(&packet()[HDR_LEN..]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(e[..], [DeviceError::DmaFault { queue: 0, what: "buffer", iova: at, access: Access::Write, .. }] if at == outside),
        "{e:?}"
    );
    let faults = r.host.take_faults();
    assert!(
        matches!(faults[..], [ref f] if f.iova == outside && f.access == Access::Write && f.reason == FaultReason::PageRequestDenied),
        "{faults:?}"
    );
    let i = r.host.iopf.as_ref().expect("IOPF mode");
    let s = i.domain.stats();
    assert!(matches!(s.refused, 1), "{s:?}");
    assert!(s.served > 0, "the rings faulted in: {s:?}");
    assert!(matches!(i.handler.stats().answered_invalid, 1));
    assert!(!i.domain.is_mapped(outside));
    assert_stopped_then_recovers(&mut r, RX);
}

#[test]
fn a_frame_running_past_the_regions_is_refused_whole() {
    let mut r = raw_iopf();
    // The last 32 bytes of the guest's RAM, then the end of the map: the
    // header (its own access) fits, the frame's access runs past the end.
    let end = r.mem.size();
    let at = end - 32;
    let frame_at = at + HDR_LEN as u64;
    let mut was = [0u8; 32];
    r.mem.read(at, &mut was).expect("the last bytes");
    r.desc(RX, 0, at, 2048, desc::F_WRITE, 0);
    r.publish(RX, 0);
    r.inject(&packet()[HDR_LEN..]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(e[..], [DeviceError::DmaFault { queue: 0, what: "buffer", iova, access: Access::Write, .. }] if iova == frame_at),
        "{e:?}"
    );
    let faults = r.host.take_faults();
    assert!(
        matches!(faults[..], [ref f] if f.iova == end && f.reason == FaultReason::PageRequestDenied),
        "{faults:?}"
    );
    let d = domain(&r.host);
    assert!(d.is_mapped(end - PAGE_SIZE), "the page inside was served");
    assert!(matches!(d.stats().refused, 1), "{:?}", d.stats());
    let mut now = [0u8; 32];
    r.mem.read(at, &mut now).expect("the last bytes");
    assert_eq!(
        now[HDR_LEN..],
        was[HDR_LEN..],
        "not a byte of the refused access written inside the map either"
    );
    // The recovery maps a transmit buffer through the pass-through
    // domain: its physical address, faulted in.
    let (phys, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
    assert_eq!(phys, iova);
    assert_stopped_then_recovers(&mut r, RX);
}
