//! A hand-written driver that builds bad chains on purpose. For each, the
//! device records the exact error, sets `DEVICE_NEEDS_RESET`, stops the
//! queue, and neither panics, hangs, nor touches memory outside a live
//! mapping; a reset brings it back.

mod net_raw;

use std::time::Duration;

use net_raw::{assert_stopped_then_recovers, packet, Raw, RX, SIZE, TX};
use softiommu::dma::DmaDirection;
use softiommu::hw::{Access, FaultReason};
use softiommu_virtio::net::HDR_LEN;
use softiommu_virtio::spec::{desc, reg, status};
use softiommu_virtio::transport::DeviceError;

#[test]
fn a_valid_chain_is_transmitted_and_used() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
    // Header and frame in two descriptors.
    r.desc(TX, 0, iova, HDR_LEN as u32, desc::F_NEXT, 5);
    r.desc(TX, 5, iova + HDR_LEN as u64, 60, 0, 0);
    r.publish(TX, 0);
    r.wait_used(TX, 1);
    let f = loop {
        match r.peer.rx.peek() {
            Ok(f) => break f.to_vec(),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    assert_eq!(f, packet()[HDR_LEN..]);
    assert!(r.t.errors().drain().is_empty());
}

#[test]
fn a_transmit_chain_too_short_for_the_header_is_refused() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
    r.desc(TX, 0, iova, 8, 0, 0);
    r.publish(TX, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::ChainLength {
                queue: 1,
                head: 0,
                len: 8,
                min: 26,
                // A driver told no MTU: the header and an IP packet's
                // 16-bit length behind a doubly tagged Ethernet header.
                max: 65569
            }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn a_chain_that_loops_is_cut_at_the_queue_size() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
    r.desc(TX, 0, iova, 8, desc::F_NEXT, 1);
    r.desc(TX, 1, iova + 8, 8, desc::F_NEXT, 0);
    r.publish(TX, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::ChainLoop {
                queue: 1,
                head: 0,
                size: SIZE
            }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn a_length_past_the_mapped_buffer_faults_and_reads_nothing_beyond() {
    let mut r = Raw::new();
    // Two buffers; the later one sits just below the first (the IOVA
    // allocator works downwards), and the first is unmapped again, so the
    // page after the kept buffer is a hole.
    let (_, first) = r.buffer(4096, &[], DmaDirection::ToDevice);
    let (_, iova) = r.buffer(4096, &[], DmaDirection::ToDevice);
    r.cpu
        .unmap(&r.host.dev, first, 4096, DmaDirection::ToDevice)
        .unwrap();
    let past = iova + 4096;
    assert!(
        matches!(r.host.domain.iova_to_phys(past), Ok(None)),
        "the page after the buffer is not mapped"
    );
    // Starts 6 bytes before the end of the mapping, runs 66 past it.
    r.desc(TX, 0, past - 6, 72, 0, 0);
    r.publish(TX, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(e[..], [DeviceError::DmaFault { queue: 1, what: "buffer", iova: at, access: Access::Read, .. }] if at == past - 6),
        "{e:?}"
    );
    let faults = r.host.take_faults();
    assert!(
        matches!(faults[..], [ref f] if f.iova == past && f.access == Access::Read && f.reason == FaultReason::NotPresent),
        "{faults:?}"
    );
    assert!(r.peer.rx.peek().is_err(), "nothing went on the wire");
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn a_write_only_descriptor_in_a_transmit_chain_is_refused() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &packet(), DmaDirection::Bidirectional);
    r.desc(TX, 2, iova, 72, desc::F_WRITE, 0);
    r.publish(TX, 2);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::WrongDirection {
                queue: 1,
                head: 2,
                index: 2,
                found: "write-only",
                needed: "readable"
            }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn a_read_only_receive_buffer_is_refused() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &[], DmaDirection::FromDevice);
    r.desc(RX, 0, iova, 2048, 0, 0);
    r.publish(RX, 0);
    r.inject(&packet()[HDR_LEN..]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::WrongDirection {
                queue: 0,
                head: 0,
                index: 0,
                found: "read-only",
                needed: "writable"
            }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, RX);
}

#[test]
fn a_receive_buffer_mapped_read_only_faults_on_the_write() {
    let mut r = Raw::new();
    // The driver marks it writable but maps it ToDevice: the IOMMU refuses.
    let (phys, iova) = r.buffer(4096, &[7; 128], DmaDirection::ToDevice);
    r.desc(RX, 0, iova, 2048, desc::F_WRITE, 0);
    r.publish(RX, 0);
    r.inject(&packet()[HDR_LEN..]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(e[..], [DeviceError::DmaFault { queue: 0, what: "buffer", iova: at, access: Access::Write, .. }] if at == iova),
        "{e:?}"
    );
    let faults = r.host.take_faults();
    assert!(
        matches!(faults[..], [ref f] if f.iova == iova && f.reason == FaultReason::PermissionDenied),
        "{faults:?}"
    );
    let mut b = [0u8; 128];
    r.mem.read(phys, &mut b).unwrap();
    assert_eq!(b, [7; 128], "not a byte written");
    assert_stopped_then_recovers(&mut r, RX);
}

#[test]
fn a_receive_buffer_too_small_for_the_header_is_refused() {
    // A chain that cannot hold even the virtio-net header could never
    // receive any frame: that is the driver's fault.
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &[], DmaDirection::FromDevice);
    r.desc(RX, 0, iova, HDR_LEN as u32 - 1, desc::F_WRITE, 0);
    r.publish(RX, 0);
    r.inject(&packet()[HDR_LEN..]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::ChainLength {
                queue: 0,
                head: 0,
                len: 11,
                min: 12,
                ..
            }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, RX);
}

#[test]
fn a_receive_buffer_too_small_for_the_frame_drops_the_frame() {
    // A chain that holds the header but not this frame: the frame is the
    // wire's, so it is dropped and counted, the chain kept unwritten, and
    // the device neither stops nor asks for a reset.
    let mut r = Raw::new();
    let (phys, iova) = r.buffer(4096, &[], DmaDirection::FromDevice);
    r.desc(RX, 0, iova, 40, desc::F_WRITE, 0);
    r.publish(RX, 0);
    r.inject(&packet()[HDR_LEN..]);
    let t0 = std::time::Instant::now();
    while r.host.device.stats().rx_oversize_drops == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "never dropped");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(30));
    let st = r.host.device.stats();
    assert_eq!((st.rx_oversize_drops, st.rx_frames), (1, 0));
    assert_eq!(r.used_idx(RX), 0, "the chain is still the driver's");
    assert_eq!(r.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert!(r.t.errors().drain().is_empty());
    let mut got = [0u8; 40];
    r.mem.read(phys, &mut got).unwrap();
    assert_eq!(got, [0u8; 40], "no byte of the dropped frame written");
}

#[test]
fn a_descriptor_index_past_the_table_is_refused() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
    r.desc(TX, 0, iova, 12, desc::F_NEXT, 40);
    r.publish(TX, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::DescriptorIndexOutOfRange {
                queue: 1,
                index: 40,
                size: SIZE
            }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn an_available_index_beyond_the_queue_size_is_refused() {
    let mut r = Raw::new();
    r.publish_at(TX, 0, 1000);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::AvailIndexTooFar {
                queue: 1,
                avail: 1000,
                next: 0,
                size: SIZE
            }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn an_indirect_descriptor_without_the_feature_is_refused() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
    r.desc(TX, 0, iova, 32, desc::F_INDIRECT, 0);
    r.publish(TX, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::IndirectNotNegotiated { queue: 1, index: 0 }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn a_header_asking_for_an_offload_not_negotiated_is_refused() {
    let mut r = Raw::new();
    let mut p = packet();
    p[0] = 1; // VIRTIO_NET_HDR_F_NEEDS_CSUM without VIRTIO_NET_F_CSUM.
    let (_, iova) = r.buffer(4096, &p, DmaDirection::ToDevice);
    r.desc(TX, 0, iova, p.len() as u32, 0, 0);
    r.publish(TX, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::HeaderOffload {
                queue: 1,
                head: 0,
                flags: 1,
                gso_type: 0
            }]
        ),
        "{e:?}"
    );
    assert!(r.peer.rx.peek().is_err(), "the frame was not sent");
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn a_revoked_ring_faults_and_stops_the_queue() {
    let mut r = Raw::new();
    // The driver frees the transmit ring while the device still has it.
    let (phys, iova, _) = r.rings[TX];
    r.cpu
        .free_coherent(&r.host.dev, phys, iova, r.layout.bytes)
        .unwrap();
    r.t.write(reg::QUEUE_NOTIFY, TX as u32);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::DmaFault {
                queue: 1,
                what: "available ring",
                access: Access::Read,
                ..
            }]
        ),
        "{e:?}"
    );
    assert!(r
        .host
        .take_faults()
        .iter()
        .all(|f| f.reason == FaultReason::NotPresent));
}

/// Transmit-queue rings programmed where they would run past the end of
/// the 64-bit IOVA space, one area at a time, as `(what, rewrite, address,
/// bytes)`: each is refused when the driver sets `DRIVER_OK`, before the
/// device computes an address in it.
type TopCase = (
    &'static str,
    fn((u64, u64, u64)) -> (u64, u64, u64),
    u64,
    u64,
);

const TOP_CASES: [TopCase; 4] = [
    (
        "descriptor table",
        |(_, a, u)| (u64::MAX - 15, a, u),
        u64::MAX - 15,
        16 * SIZE as u64,
    ),
    (
        "descriptor table",
        |(_, a, u)| (0xffff_ffff_ffff_ff00, a, u),
        0xffff_ffff_ffff_ff00,
        16 * SIZE as u64,
    ),
    (
        "available ring",
        |(d, _, u)| (d, u64::MAX - 1, u),
        u64::MAX - 1,
        6 + 2 * SIZE as u64,
    ),
    (
        "used ring",
        |(d, a, _)| (d, a, u64::MAX - 3),
        u64::MAX - 3,
        6 + 8 * SIZE as u64,
    ),
];

#[test]
fn rings_past_the_top_of_the_iova_space_need_a_reset_and_the_device_serves_again() {
    for (what, rewrite, addr, len) in TOP_CASES {
        let mut r = Raw::new();
        r.init_with(|q, rings| if q == TX { rewrite(rings) } else { rings });
        // A chain from descriptor 1, so that a device that took the table
        // would add 16 to its address.
        let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
        r.desc(TX, 1, iova, packet().len() as u32, 0, 0);
        r.publish(TX, 1);
        let e = r.errors_after_reset_request();
        assert!(
            matches!(
                e[..],
                [DeviceError::AddressOverflow { queue: 1, what: w, addr: a, len: l }]
                    if w == what && a == addr && l == len
            ),
            "{what} at {addr:#x}: {e:?}"
        );
        assert_ne!(r.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
        // Reset, valid rings: a frame is transmitted.
        assert_stopped_then_recovers(&mut r, TX);
    }
}

#[test]
fn rings_at_the_top_of_the_iova_space_that_fit_fault_then_the_device_serves_again() {
    // Inside the 64-bit space but past the unit's address width: the
    // first ring access faults (the available index).
    let mut r = Raw::new();
    let top = 0xffff_ffff_ffff_f000;
    r.init_with(|q, rings| if q == TX { (top, top, top) } else { rings });
    r.publish(TX, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::DmaFault { queue: 1, what: "available ring", iova, access: Access::Read, .. }]
                if iova == top + 2
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, TX);
}

#[test]
fn a_descriptor_whose_buffer_wraps_the_iova_space_is_refused() {
    let mut r = Raw::new();
    r.desc(TX, 0, u64::MAX - 7, packet().len() as u32, 0, 0);
    r.publish(TX, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::AddressOverflow { queue: 1, what: "buffer", addr, len: 72 }]
                if addr == u64::MAX - 7
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, TX);
}

/// Chains the device used before a later chain of the same batch stopped
/// the queue are announced with the used-buffer interrupt (§2.7.7.2: with
/// the driver's flags 0 "the device MUST send a notification"); a driver
/// reads its used ring on that bit alone (Linux's `vm_interrupt`). (Before:
/// only the configuration-change interrupt was raised, and the two
/// transmitted frames sat unseen.)
#[test]
fn chains_used_before_a_fault_in_the_batch_are_announced() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
    r.desc(TX, 0, iova, packet().len() as u32, 0, 0);
    r.desc(TX, 1, iova, packet().len() as u32, 0, 0);
    // Too short for the header: stops the queue.
    r.desc(TX, 2, iova, 8, 0, 0);
    let (phys, _, _) = r.rings[TX];
    for (k, head) in [0u16, 1, 2].into_iter().enumerate() {
        let slot = phys + r.layout.avail + 4 + 2 * k as u64;
        r.mem.write(slot, &head.to_le_bytes()).unwrap();
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    r.mem
        .write(phys + r.layout.avail + 2, &3u16.to_le_bytes())
        .unwrap();
    r.rings[TX].2 = 3;
    r.t.write(reg::QUEUE_NOTIFY, TX as u32);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::ChainLength {
                queue: 1,
                head: 2,
                ..
            }]
        ),
        "{e:?}"
    );
    assert_eq!(r.used_idx(TX), 2);
    let isr = r.t.read(reg::INTERRUPT_STATUS);
    assert_eq!(isr & 1, 1, "no used-buffer interrupt (status {isr:#x})");
}
