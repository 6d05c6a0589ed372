//! A driver that unmaps (strictly: invalidated and waited for) a receive
//! buffer it has posted, in the middle of a UDP stream: when the device
//! reaches that buffer its write faults in the unit, it records the fault
//! and asks for a reset, and the buffer's bytes are untouched.

mod common;

use std::time::{Duration, Instant};

use common::*;
use smoltcp::socket::udp;
use smoltcp::wire::IpEndpoint;
use softiommu::dma::DmaPolicy;
use softiommu::hw::{Access, FaultReason};
use softiommu_virtio::net::DriverError;
use softiommu_virtio::transport::DeviceError;

#[test]
fn revoking_a_posted_receive_buffer_makes_the_device_fault_not_write() {
    let p = hosts(DmaPolicy::Strict);
    let (mut a, mut b) = stacks(&p);
    let sock = |port| {
        let rx = udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 512], vec![0; 1 << 20]);
        let tx = udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 512], vec![0; 1 << 20]);
        let mut s = udp::Socket::new(rx, tx);
        s.bind(port).unwrap();
        s
    };
    let ha = a.sockets.add(sock(5000));
    let hb = b.sockets.add(sock(9));
    let to = IpEndpoint::new(ip(B_IP), 9);
    let (mut received, mut sent) = (0u64, 0u64);
    let mut revoked = None;
    const MARK: [u8; 64] = [0xa5; 64];
    let t0 = Instant::now();
    let err = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the fault never came"
        );
        a.poll().expect("the sender is fine");
        let r = b.poll();
        if let Err(e) = r {
            break e;
        }
        let sa = a.sockets.get_mut::<udp::Socket>(ha);
        if sa.can_send() && sent < received + 8 {
            sa.send_slice(&[0x5a; 200], to).unwrap();
            sent += 1;
        }
        let sb = b.sockets.get_mut::<udp::Socket>(hb);
        while let Ok((d, _)) = sb.recv() {
            assert_eq!(d, &[0x5a; 200][..]);
            received += 1;
        }
        if received >= 50 && revoked.is_none() {
            let (iova, phys, len) = b
                .driver
                .revoke_posted_rx()
                .unwrap()
                .expect("posted buffers");
            // The CPU owns the buffer again: mark it.
            p.b.mem.write(phys, &MARK).unwrap();
            revoked = Some((iova, phys, len));
        }
        std::thread::yield_now();
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
    let faults = p.b.take_faults();
    assert!(
        faults.iter().any(|f| f.iova == iova
            && f.access == Access::Write
            && f.reason == FaultReason::NotPresent),
        "{faults:?}"
    );
    let mut now = [0u8; 64];
    p.b.mem.read(phys, &mut now).unwrap();
    assert_eq!(
        now, MARK,
        "the device wrote nothing into the revoked buffer"
    );
    assert!(p.a.take_faults().is_empty());
}
