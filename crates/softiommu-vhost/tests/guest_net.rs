//! A real Linux guest under QEMU (TCG) drives our vhost-user-net back-end
//! with its own virtio_net driver, through its own intel-iommu driver: the
//! guest sends a random pattern over TCP to a smoltcp peer on our wire,
//! which checksums it, and receives the peer's pattern and checksums it;
//! both checksums are compared on the host. Strict and lazy invalidation.
//!
//! Needs the guest kit (`scripts/guest-kit.sh`); without it each test
//! prints one line saying how to get it and is skipped — unless
//! `SOFTIOMMU_GUEST_REQUIRED=1` (as CI sets), which makes a missing kit fail.

mod guest_common;

use guest_common::{assert_booted, assert_session, kit, say, GUEST_DEADLINE, ONE_GUEST};
use softiommu_vhost::guest::{run_net, HostSide, IommuMode};

const MIB: u64 = 4;

fn check(mode: IommuMode) {
    let _one = ONE_GUEST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(kit) = kit() else { return };
    let r = run_net(&kit, mode, MIB, GUEST_DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    for l in &r.dmesg {
        say(l);
    }
    say(&r.result);
    let rep = r
        .report
        .as_ref()
        .expect("the back-end's session ends when QEMU exits");
    let (s, n) = (&rep.iotlb, &rep.net);
    let HostSide::Net { peer, wire } = &r.host else {
        panic!("a network run reports the peer's side: {:?}", r.host)
    };
    say(&format!(
        "guest-net {}: {:.1} s wall; peer received={} sha={:?} sent={} sha={:?} timed_out={}",
        mode.name(),
        r.wall_seconds,
        peer.received,
        peer.received_sha256,
        peer.sent,
        peer.sent_sha256,
        peer.timed_out
    ));
    say(&format!(
        "guest-net {}: back-end {n:?}; iotlb updates={} invalidations={} misses={} miss_timeouts={} refused={} flushes={} evictions={} rejected_messages={}; wire {:?} / {:?}",
        mode.name(),
        s.updates,
        s.invalidations,
        s.misses,
        s.miss_timeouts,
        s.refused,
        s.flushes,
        s.evictions,
        rep.rejected_messages,
        wire.a_to_b(),
        wire.b_to_a(),
    ));
    assert_booted(&r.dmesg, &r.result, |k| r.field(k), mode);
    assert_eq!(peer.received, MIB << 20, "{:?}", peer);
    assert_eq!(peer.sent, MIB << 20, "{:?}", peer);
    assert!(r.checksum_ok(), "guest {} / peer {:?}", r.result, peer);
    assert_session(rep);
    assert!(n.tx_frames > 0 && n.rx_frames > 0, "{n:?}");
    assert_eq!((n.tx_bad, n.rx_bad, n.ring_faults), (0, 0, 0), "{n:?}");
}

#[test]
fn guest_net_strict_tcp_checksums_match() {
    check(IommuMode::Strict);
}

#[test]
fn guest_net_lazy_tcp_checksums_match() {
    check(IommuMode::Lazy);
}
