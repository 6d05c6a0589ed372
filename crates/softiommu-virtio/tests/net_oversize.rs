//! Frames longer than where they would go. A frame from the wire past the
//! device's MTU, or past the receive buffer offered (whatever its size, as
//! long as it holds the virtio-net header), is dropped and counted; the driver's buffer is
//! left untouched for the next frame and the device goes on (virtio 1.2
//! §5.1.6.3.1, §5.1.6.4.1). A device whose MTU the wire's slots cannot
//! carry is refused when it is built.

mod net_raw;

use std::time::{Duration, Instant};

use net_raw::{Raw, RX, TX};
use softiommu::dma::{DmaDirection, DmaPolicy};
use softiommu::mem::PhysAddr;
use softiommu_virtio::host::{Host, HostConfig, HostError};
use softiommu_virtio::net::{
    plain_header, wire, NetConfig, NetDeviceConfig, NetDeviceError, NetDriverConfig, WireConfig,
    HDR_LEN,
};
use softiommu_virtio::spec::{desc, feature, reg, status};
use softiommu_virtio::transport::DeviceError;

/// What §5.1.6.3.1 asks a driver to post without mergeable buffers or
/// guest offloads: header, Ethernet header, 1500 bytes.
const SPEC_BUFFER: u32 = 1526;
/// A jumbo frame (MTU 9000 and its Ethernet header).
const JUMBO: usize = 9014;

/// A broadcast IPv4 frame of `len` bytes filled with `tag`.
fn frame(len: usize, tag: u8) -> Vec<u8> {
    let mut f = vec![tag; len];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f
}

/// A host at `mtu` on a wire whose slots hold jumbo frames.
fn raw(mtu: u16) -> Raw {
    raw_on(mtu, JUMBO)
}

/// A host at `mtu` on a wire whose slots hold `slot` bytes.
fn raw_on(mtu: u16, slot: usize) -> Raw {
    Raw::with_wire(
        &HostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 64 << 20,
            device: NetDeviceConfig {
                net: NetConfig {
                    mtu,
                    ..NetConfig::default()
                },
                ..NetDeviceConfig::default()
            },
            ..HostConfig::default()
        },
        WireConfig {
            max_frame: slot,
            ..WireConfig::default()
        },
    )
}

/// Posts receive buffers of `len` bytes at descriptors `0..n`; returns
/// their physical addresses.
fn post(r: &mut Raw, n: u16, len: u32) -> Vec<PhysAddr> {
    (0..n)
        .map(|i| {
            let (phys, iova) = r.buffer(u64::from(len), &[], DmaDirection::FromDevice);
            r.desc(RX, i, iova, len, desc::F_WRITE, 0);
            r.publish(RX, i);
            phys
        })
        .collect()
}

/// Used element `k` of the receive queue: `(id, len)`.
fn used(r: &Raw, k: u16) -> (u32, u32) {
    let mut e = [0u8; 8];
    r.mem
        .read(
            r.rings[RX].0 + r.layout.used + 4 + 8 * u64::from(k % net_raw::SIZE),
            &mut e,
        )
        .unwrap();
    (
        u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
        u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
    )
}

/// After the oversize frame and a 60-byte one: only the second arrived,
/// intact, in the first buffer; the oversize one is counted, no byte of
/// it written, no error, no reset asked, the second buffer still posted.
fn assert_dropped_then_next_arrives(r: &mut Raw, bufs: &[PhysAddr]) {
    assert_dropped_then_next_arrives_in(r, bufs, SPEC_BUFFER);
}

/// [`assert_dropped_then_next_arrives`] for buffers of `len` bytes.
fn assert_dropped_then_next_arrives_in(r: &mut Raw, bufs: &[PhysAddr], len: u32) {
    let normal = frame(60, 0x55);
    r.wait_used(RX, 1);
    assert_eq!(used(r, 0), (0, (HDR_LEN + 60) as u32));
    let mut got = vec![0u8; len as usize];
    r.mem.read(bufs[0], &mut got).unwrap();
    assert_eq!(got[..HDR_LEN], plain_header(true));
    assert_eq!(got[HDR_LEN..HDR_LEN + 60], normal[..]);
    assert!(
        got[HDR_LEN + 60..].iter().all(|&b| b == 0),
        "nothing of the dropped frame written"
    );
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(r.used_idx(RX), 1, "the second buffer is still the driver's");
    let st = r.host.device.stats();
    assert_eq!((st.rx_oversize_drops, st.rx_frames), (1, 1));
    assert_eq!(r.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert!(r.t.errors().drain().is_empty());
}

#[test]
fn a_frame_past_the_mtu_is_dropped_and_counted_and_the_next_one_arrives() {
    let mut r = raw(1500);
    let bufs = post(&mut r, 2, SPEC_BUFFER);
    r.inject(&frame(JUMBO, 0xaa));
    r.inject(&frame(60, 0x55));
    assert_dropped_then_next_arrives(&mut r, &bufs);
}

#[test]
fn runts_from_the_wire_are_dropped_before_any_buffer_and_a_bare_header_arrives() {
    let mut r = raw(1500);
    let bufs = post(&mut r, 2, SPEC_BUFFER);
    // Shorter than an Ethernet header: not frames. Then a bare header,
    // the shortest frame there is.
    r.inject(&[]);
    r.inject(&[0x11]);
    r.inject(&[0x22; 13]);
    let bare = frame(14, 0x33);
    r.inject(&bare);
    r.wait_used(RX, 1);
    assert_eq!(used(&r, 0), (0, (HDR_LEN + 14) as u32));
    let mut got = vec![0u8; HDR_LEN + 14];
    r.mem.read(bufs[0], &mut got).unwrap();
    assert_eq!(got[HDR_LEN..], bare[..]);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(r.used_idx(RX), 1, "the second buffer is still the driver's");
    let st = r.host.device.stats();
    assert_eq!(
        (st.rx_runt_drops, st.rx_oversize_drops, st.rx_frames),
        (3, 0, 1)
    );
    assert_eq!(r.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert!(r.t.errors().drain().is_empty());
}

/// A VLAN on top of the interface receives full-size tagged frames:
/// at MTU 1500 a 1,518-byte 802.1Q-tagged frame reaches a buffer of
/// Linux's size (header + 1,518), the link-level header counting its tags
/// (two at most: 1,522 bytes); a frame past that is dropped and counted.
#[test]
fn a_tagged_full_frame_reaches_the_driver_and_one_past_two_tags_is_dropped() {
    let mut r = raw(1500);
    let len = (HDR_LEN + 1518) as u32;
    let bufs = post(&mut r, 2, len);
    let tagged = frame(1518, 0x66);
    r.inject(&tagged);
    r.wait_used(RX, 1);
    assert_eq!(used(&r, 0), (0, len));
    let mut got = vec![0u8; len as usize];
    r.mem.read(bufs[0], &mut got).unwrap();
    assert_eq!(got[HDR_LEN..], tagged[..]);
    // Past 1,500 + 14 + 8: dropped, the second buffer kept for the next.
    r.inject(&frame(1523, 0xaa));
    r.inject(&frame(60, 0x55));
    r.wait_used(RX, 2);
    assert_eq!(used(&r, 1), (1, (HDR_LEN + 60) as u32));
    let st = r.host.device.stats();
    assert_eq!((st.rx_oversize_drops, st.rx_frames), (1, 2));
    assert_eq!(r.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert!(r.t.errors().drain().is_empty());
}

#[test]
fn a_frame_longer_than_a_spec_sized_buffer_is_dropped_and_the_buffer_kept() {
    // MTU 9000, but the driver posted what §5.1.6.3.1 asks (1526 bytes):
    // the jumbo frame is within the MTU yet fits no buffer.
    let mut r = raw(9000);
    let bufs = post(&mut r, 2, SPEC_BUFFER);
    r.inject(&frame(JUMBO, 0xaa));
    r.inject(&frame(60, 0x55));
    assert_dropped_then_next_arrives(&mut r, &bufs);
}

#[test]
fn buffers_below_the_spec_size_drop_a_full_frame_and_receive_the_next() {
    // MTU 1500 and receive buffers of 1024 bytes (below §5.1.6.3.1's
    // SHOULD of 1526): a full 1514-byte frame from the wire does not fit.
    // The link partner must not decide whether the NIC goes down: the
    // frame is dropped and counted, the buffer kept, the 60-byte frame
    // after it delivered.
    let mut r = raw(1500);
    let bufs = post(&mut r, 2, 1024);
    r.inject(&frame(1514, 0xaa));
    r.inject(&frame(60, 0x55));
    assert_dropped_then_next_arrives_in(&mut r, &bufs, 1024);
}

/// Sends `len` frame bytes of `tag` behind a plain header in TX
/// descriptor `i` and waits until the device has used it.
fn transmit(r: &mut Raw, i: u16, len: usize, tag: u8) {
    let mut pkt = plain_header(false).to_vec();
    pkt.extend_from_slice(&frame(len, tag));
    let (_, iova) = r.buffer(pkt.len() as u64, &pkt, DmaDirection::ToDevice);
    r.desc(TX, i, iova, pkt.len() as u32, 0, 0);
    r.publish(TX, i);
    r.wait_used(TX, i + 1);
}

/// The next frame on the wire, within a bound.
fn next_on_wire(r: &mut Raw) -> Vec<u8> {
    let t0 = Instant::now();
    loop {
        match r.peer.rx.peek() {
            Ok(f) => {
                let f = f.to_vec();
                r.peer.rx.consume();
                return f;
            }
            Err(_) => {
                assert!(t0.elapsed() < Duration::from_secs(10), "not sent");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// A driver that did not negotiate `VIRTIO_NET_F_MTU` was told no MTU
/// (Linux then allows an MTU up to 65,535): a device configured at MTU 576
/// carries a 1,514-byte frame and an 802.1Q-tagged 1,518-byte one from it
/// (was: `ChainLength`, the device stopped and asked for a reset); a
/// 4,000-byte one, longer than the wire's slots, is dropped and counted,
/// never an error, and the frame after it goes; only a chain past an IP
/// packet's 16-bit length behind a doubly tagged header is the driver's
/// error.
#[test]
fn a_driver_told_no_mtu_sends_full_and_tagged_frames_and_giants_are_dropped() {
    let mut r = raw_on(576, 1518);
    transmit(&mut r, 0, 1514, 0x77);
    assert_eq!(next_on_wire(&mut r), frame(1514, 0x77));
    transmit(&mut r, 1, 1518, 0x78);
    assert_eq!(next_on_wire(&mut r), frame(1518, 0x78));
    transmit(&mut r, 2, 4000, 0x79);
    transmit(&mut r, 3, 60, 0x7a);
    assert_eq!(next_on_wire(&mut r), frame(60, 0x7a));
    assert_eq!(r.host.device.stats().tx_oversize_drops, 1);
    assert_eq!(r.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert!(r.t.errors().drain().is_empty());
    // Past 14 + 8 + 65,535 frame bytes the chain is the driver's error
    // (its length alone says so: nothing is read).
    let (_, iova) = r.buffer(4096, &plain_header(false), DmaDirection::ToDevice);
    let too_long = (HDR_LEN + 14 + 8 + 65_535 + 1) as u32;
    r.desc(TX, 4, iova, too_long, 0, 0);
    r.publish(TX, 4);
    let errors = r.errors_after_reset_request();
    assert!(
        matches!(
            errors[..],
            [DeviceError::ChainLength { len, max, .. }]
                if len == u64::from(too_long) && max == too_long as u64 - 1
        ),
        "{errors:?}"
    );
}

/// A driver that negotiated `VIRTIO_NET_F_MTU` sends at most the MTU
/// plus the link-level header, up to two VLAN tags counted in it
/// (§5.1.4.2): at MTU 576 a 598-byte frame (a VLAN on a VLAN) goes onto
/// the wire whole; one byte more is the driver's error, caught from the
/// chain's length alone — the device asks for a reset and nothing of the
/// frame reaches the wire.
#[test]
fn a_driver_that_negotiated_the_mtu_sends_two_tags_past_it_and_not_a_byte_more() {
    let mut r = raw_on(576, 1518);
    r.init_features(1 << feature::NET_MTU);
    let longest = 576 + 14 + 8;
    transmit(&mut r, 0, longest, 0x51);
    assert_eq!(next_on_wire(&mut r), frame(longest, 0x51));
    let mut pkt = plain_header(false).to_vec();
    pkt.extend_from_slice(&frame(longest + 1, 0x52));
    let (_, iova) = r.buffer(pkt.len() as u64, &pkt, DmaDirection::ToDevice);
    r.desc(TX, 1, iova, pkt.len() as u32, 0, 0);
    r.publish(TX, 1);
    let errors = r.errors_after_reset_request();
    assert!(
        matches!(
            errors[..],
            [DeviceError::ChainLength { len, max, .. }]
                if len == (HDR_LEN + longest + 1) as u64 && max == (HDR_LEN + longest) as u64
        ),
        "{errors:?}"
    );
    assert!(
        r.peer.rx.peek().is_err(),
        "a frame past the bound reached the wire"
    );
    assert_eq!(r.host.device.stats().tx_oversize_drops, 0);
}

#[test]
fn a_host_whose_mtu_the_wire_slots_cannot_carry_is_refused() {
    let (pa, _pb, _) = wire(WireConfig::default());
    let err = Host::new(
        &HostConfig {
            mem_bytes: 64 << 20,
            device: NetDeviceConfig {
                net: NetConfig {
                    mtu: 9000,
                    ..NetConfig::default()
                },
                ..NetDeviceConfig::default()
            },
            ..HostConfig::default()
        },
        pa,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            HostError::Device(NetDeviceError::WireSlotTooSmall {
                max_frame: 9014,
                slot: 1522
            })
        ),
        "{err:?}"
    );
}

/// A queue size a driver could not use (0 reads as no queue; 100 is no
/// split ring's size; past 32,768) or a zero idle wait (a spinning idle
/// thread) is refused before the device starts.
#[test]
fn a_net_configuration_out_of_range_is_refused_before_the_device_starts() {
    use std::time::Duration;
    for (queue_max, idle_wait, field) in [
        (0u16, Duration::from_millis(20), "queue_max"),
        (100, Duration::from_millis(20), "queue_max"),
        (1, Duration::from_millis(20), "queue_max"),
        (256, Duration::ZERO, "idle_wait"),
    ] {
        let (pa, _pb, _) = wire(WireConfig::default());
        let err = Host::new(
            &HostConfig {
                mem_bytes: 64 << 20,
                device: NetDeviceConfig {
                    net: NetConfig {
                        queue_max,
                        ..NetConfig::default()
                    },
                    idle_wait,
                    ..NetDeviceConfig::default()
                },
                ..HostConfig::default()
            },
            pa,
        )
        .unwrap_err();
        assert!(
            matches!(err, HostError::Device(NetDeviceError::BadConfig { field: f, .. }) if f == field),
            "{queue_max} {idle_wait:?}: {err:?}"
        );
    }
}

#[test]
fn our_driver_keeps_receiving_after_a_jumbo_frame_from_the_link_partner() {
    let (pa, mut peer, _) = wire(WireConfig {
        max_frame: JUMBO,
        ..WireConfig::default()
    });
    let h = Host::new(
        &HostConfig {
            mem_bytes: 64 << 20,
            ..HostConfig::default()
        },
        pa,
    )
    .unwrap();
    let mut d = h.driver(NetDriverConfig::default()).unwrap();
    for f in [frame(JUMBO, 0xaa), frame(60, 0x55)] {
        let mut s = peer.tx.reserve().expect("room on the wire");
        s.buf()[..f.len()].copy_from_slice(&f);
        s.commit(f.len());
    }
    let t0 = Instant::now();
    let got = loop {
        if let Some(f) = d.receive_with(|f| f.to_vec()).unwrap() {
            break f;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "nothing received");
        d.wait(Duration::from_millis(5)).expect("the device works");
    };
    assert_eq!(got, frame(60, 0x55));
    assert_eq!(h.device.stats().rx_oversize_drops, 1);
    assert_eq!(
        h.device.transport().status() & status::DEVICE_NEEDS_RESET,
        0
    );
    assert!(h.device.transport().errors().drain().is_empty());
}
