//! A hand-written driver that builds bad chains on purpose. For each, the
//! device records the exact error, sets `DEVICE_NEEDS_RESET`, stops the
//! queue, and neither panics, hangs, nor touches memory outside a live
//! mapping; a reset brings it back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::dma::{DmaCpu, DmaDirection, DmaPolicy};
use softiommu::hw::{Access, FaultReason};
use softiommu::mem::{PhysAddr, PhysMemory};
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::net::{wire, RingLayout, WireConfig, WirePort, HDR_LEN};
use softiommu_virtio::spec::{desc, feature, reg, status};
use softiommu_virtio::transport::{DeviceError, MmioTransport};

const SIZE: u16 = 16;
const RX: usize = 0;
const TX: usize = 1;

struct Raw {
    host: Host,
    peer: WirePort,
    cpu: DmaCpu,
    t: MmioTransport,
    mem: Arc<PhysMemory>,
    /// Per queue: ring physical address, DMA address, next avail index.
    rings: [(PhysAddr, u64, u16); 2],
    layout: RingLayout,
}

impl Raw {
    fn new() -> Self {
        let (pa, peer, _) = wire(WireConfig::default());
        let host = Host::new(
            &HostConfig {
                policy: DmaPolicy::Strict,
                mem_bytes: 64 << 20,
                ..HostConfig::default()
            },
            pa,
        )
        .unwrap();
        let cpu = host.domain.cpu();
        let t = host.device.transport().clone();
        let mem = host.mem.clone();
        let mut r = Self {
            host,
            peer,
            cpu,
            t,
            mem,
            rings: [(0, 0, 0); 2],
            layout: RingLayout::new(SIZE),
        };
        r.init();
        r
    }

    fn init(&mut self) {
        let t = &self.t;
        t.write(reg::STATUS, 0);
        t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        let f = 1u64 << feature::VERSION_1 | 1 << feature::ACCESS_PLATFORM;
        t.write(reg::DRIVER_FEATURES_SEL, 1);
        t.write(reg::DRIVER_FEATURES, (f >> 32) as u32);
        t.write(
            reg::STATUS,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
        );
        for q in 0..2 {
            let (phys, iova) = self
                .cpu
                .alloc_coherent(&self.host.dev, self.layout.bytes)
                .unwrap();
            t.write(reg::QUEUE_SEL, q as u32);
            t.write(reg::QUEUE_NUM, u32::from(SIZE));
            for (lo, v) in [
                (reg::QUEUE_DESC_LOW, iova),
                (reg::QUEUE_DRIVER_LOW, iova + self.layout.avail),
                (reg::QUEUE_DEVICE_LOW, iova + self.layout.used),
            ] {
                t.write(lo, v as u32);
                t.write(lo + 4, (v >> 32) as u32);
            }
            t.write(reg::QUEUE_READY, 1);
            self.rings[q] = (phys, iova, 0);
        }
        t.write(
            reg::STATUS,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        );
        assert_eq!(t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    }

    /// A buffer of `len` bytes holding `data`, mapped `dir`: (phys, iova).
    fn buffer(&mut self, len: u64, data: &[u8], dir: DmaDirection) -> (PhysAddr, u64) {
        let phys = self.mem.alloc_zeroed_frames(0).unwrap();
        self.mem.write(phys, data).unwrap();
        let iova = self.cpu.map(&self.host.dev, phys, len, dir).unwrap();
        (phys, iova)
    }

    fn desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write(self.rings[q].0 + 16 * u64::from(i), &d)
            .unwrap();
    }

    /// Publishes chain `head` on queue `q` with avail index `idx` (normally
    /// one past the previous) and notifies.
    fn publish_at(&mut self, q: usize, head: u16, idx: u16) {
        let (phys, _, cur) = self.rings[q];
        let slot = phys + self.layout.avail + 4 + 2 * u64::from(cur % SIZE);
        self.mem.write(slot, &head.to_le_bytes()).unwrap();
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.mem
            .write(phys + self.layout.avail + 2, &idx.to_le_bytes())
            .unwrap();
        self.rings[q].2 = idx;
        self.t.write(reg::QUEUE_NOTIFY, q as u32);
    }

    fn publish(&mut self, q: usize, head: u16) {
        let idx = self.rings[q].2.wrapping_add(1);
        self.publish_at(q, head, idx);
    }

    fn used_idx(&self, q: usize) -> u16 {
        let mut b = [0u8; 2];
        self.mem
            .read(self.rings[q].0 + self.layout.used + 2, &mut b)
            .unwrap();
        u16::from_le_bytes(b)
    }

    /// A frame from the peer onto the host's receive side.
    fn inject(&mut self, frame: &[u8]) {
        let mut s = self.peer.tx.reserve().expect("room on the wire");
        s.buf()[..frame.len()].copy_from_slice(frame);
        s.commit(frame.len());
    }

    /// Waits (bounded) for DEVICE_NEEDS_RESET, then returns the errors.
    fn errors_after_reset_request(&self) -> Vec<DeviceError> {
        let t0 = Instant::now();
        while self.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no DEVICE_NEEDS_RESET"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        self.t.errors().drain()
    }

    /// Waits (bounded) until queue `q`'s used index reaches `n`.
    fn wait_used(&self, q: usize, n: u16) {
        let t0 = Instant::now();
        while self.used_idx(q) != n {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "used index stuck at {}",
                self.used_idx(q)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A valid transmit packet: header + a 60-byte Ethernet frame.
fn packet() -> Vec<u8> {
    let mut p = vec![0u8; HDR_LEN + 60];
    p[HDR_LEN..HDR_LEN + 6].copy_from_slice(&[0xff; 6]);
    p[HDR_LEN + 12..HDR_LEN + 14].copy_from_slice(&[0x08, 0x00]);
    p
}

/// After an error, the queue is stopped: a valid chain is not used; a
/// reset and a new initialisation bring the device back.
fn assert_stopped_then_recovers(r: &mut Raw, q: usize) {
    let before = r.used_idx(q);
    if q == TX {
        let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
        r.desc(TX, 3, iova, packet().len() as u32, 0, 0);
        r.publish(TX, 3);
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.used_idx(q), before, "a stopped queue uses nothing");
    r.init();
    let (_, iova) = r.buffer(4096, &packet(), DmaDirection::ToDevice);
    r.desc(TX, 0, iova, packet().len() as u32, 0, 0);
    r.publish(TX, 0);
    r.wait_used(TX, 1);
    assert!(r.t.errors().drain().is_empty());
}

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
                max: 1526
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
fn a_receive_buffer_too_small_for_the_frame_is_refused() {
    let mut r = Raw::new();
    let (_, iova) = r.buffer(4096, &[], DmaDirection::FromDevice);
    r.desc(RX, 0, iova, 40, desc::F_WRITE, 0);
    r.publish(RX, 0);
    r.inject(&packet()[HDR_LEN..]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::ChainLength {
                queue: 0,
                head: 0,
                len: 40,
                min: 72,
                ..
            }]
        ),
        "{e:?}"
    );
    assert_stopped_then_recovers(&mut r, RX);
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
