//! A hand-written block driver that sends bad requests on purpose. A
//! request that is well shaped but wrong completes with its exact status
//! (`VIRTIO_BLK_S_IOERR` or `UNSUPP`) and its exact [`RequestError`] in the
//! device's log, the queue goes on, and no byte lands outside a live
//! mapping; a chain the device cannot even complete (no header or status
//! room, a readable descriptor after a writable one, an unwritable status
//! byte, a revoked ring) is a [`DeviceError`] that sets
//! `DEVICE_NEEDS_RESET`. A mapping revoked under a request in flight
//! faults without a byte written.

mod blk_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::dma::{DmaCpu, DmaDirection, DmaPolicy};
use softiommu::hw::Access;
use softiommu::mem::{PhysAddr, PhysMemory};
use softiommu_virtio::blk::{
    BackendConfig, BlkConfig, BlkDeviceConfig, BlkDriverConfig, BlkHeader, BlkHost, BlkHostConfig,
    BlkOp, RequestError, RequestRecord,
};
use softiommu_virtio::spec::blk::{self, S_IOERR, S_OK, S_UNSUPP};
use softiommu_virtio::spec::{desc, feature, reg, status};
use softiommu_virtio::transport::{DeviceError, MmioTransport};
use softiommu_virtio::vring::RingLayout;

const SIZE: u16 = 16;
/// Sectors of the test disk (1 MiB).
const SECTORS: u64 = 2048;

struct Raw {
    /// Whether the driver acknowledges `SEG_MAX` and `SIZE_MAX`.
    limits: bool,
    host: BlkHost,
    cpu: DmaCpu,
    t: MmioTransport,
    mem: Arc<PhysMemory>,
    ring: (PhysAddr, u64),
    avail: u16,
    layout: RingLayout,
}

impl Raw {
    /// A device with a 1 MiB `memory` disk, `seg_max` 4 and `size_max`
    /// 4 KiB, driven by hand; `flush` whether the driver accepts FLUSH.
    fn new(flush: bool) -> Self {
        Self::with(
            flush,
            true,
            BlkConfig {
                seg_max: 4,
                size_max: 4096,
                ..BlkConfig::default()
            },
        )
    }

    /// A device with a 1 MiB `memory` disk configured `blk`, driven by
    /// hand; `flush` whether the driver accepts FLUSH, `limits` whether it
    /// acknowledges `SEG_MAX` and `SIZE_MAX`.
    fn with(flush: bool, limits: bool, blk: BlkConfig) -> Self {
        let host = BlkHost::new(&BlkHostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 64 << 20,
            bounce_bytes: 1 << 20,
            device: BlkDeviceConfig {
                blk,
                backend: BackendConfig::Memory {
                    capacity: SECTORS * 512,
                },
                ..BlkDeviceConfig::default()
            },
            ..BlkHostConfig::default()
        })
        .unwrap();
        let cpu = host.domain.cpu();
        let t = host.device.transport().clone();
        let mem = host.mem.clone();
        let mut r = Self {
            limits,
            host,
            cpu,
            t,
            mem,
            ring: (0, 0),
            avail: 0,
            layout: RingLayout::new(SIZE),
        };
        r.init(flush);
        r
    }

    fn init(&mut self, flush: bool) {
        self.init_with(flush, |a| a);
        assert_eq!(self.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    }

    /// Resets and initialises the device with the queue's rings at
    /// `rings((desc, avail, used))` instead of where they were allocated.
    /// Asserts nothing about the outcome.
    fn init_with(&mut self, flush: bool, rings: impl Fn((u64, u64, u64)) -> (u64, u64, u64)) {
        let t = &self.t;
        t.write(reg::STATUS, 0);
        t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        let mut f = 1u64 << feature::VERSION_1 | 1 << feature::ACCESS_PLATFORM;
        if self.limits {
            f |= 1 << blk::F_SEG_MAX | 1 << blk::F_SIZE_MAX;
        }
        if flush {
            f |= 1 << blk::F_FLUSH;
        }
        t.write(reg::DRIVER_FEATURES_SEL, 0);
        t.write(reg::DRIVER_FEATURES, f as u32);
        t.write(reg::DRIVER_FEATURES_SEL, 1);
        t.write(reg::DRIVER_FEATURES, (f >> 32) as u32);
        t.write(
            reg::STATUS,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
        );
        let (phys, iova) = self
            .cpu
            .alloc_coherent(&self.host.dev, self.layout.bytes)
            .unwrap();
        let areas = rings((iova, iova + self.layout.avail, iova + self.layout.used));
        t.program_queue(0, SIZE, areas);
        self.ring = (phys, iova);
        self.avail = 0;
        t.write(
            reg::STATUS,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        );
    }

    /// A zeroed page holding `data`, mapped `dir`: (phys, iova).
    fn buffer(&mut self, data: &[u8], dir: DmaDirection) -> (PhysAddr, u64) {
        let phys = self.mem.alloc_zeroed_frames(0).unwrap();
        self.mem.write(phys, data).unwrap();
        let iova = self.cpu.map(&self.host.dev, phys, 4096, dir).unwrap();
        (phys, iova)
    }

    /// A header page for `op`/`type_` at `sector` and a status page:
    /// (header iova, status phys, status iova).
    fn command(&mut self, type_: u32, sector: u64) -> (u64, PhysAddr, u64) {
        let h = BlkHeader {
            type_,
            reserved: 0,
            sector,
        };
        let (_, hdr) = self.buffer(&h.encode(), DmaDirection::ToDevice);
        let (sp, si) = self.buffer(&[0xee], DmaDirection::FromDevice);
        (hdr, sp, si)
    }

    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..].copy_from_slice(&next.to_le_bytes());
        self.mem.write(self.ring.0 + 16 * u64::from(i), &d).unwrap();
    }

    /// Writes a chain of `(addr, len, writable)` into descriptors 0.. and
    /// publishes it.
    fn chain(&mut self, parts: &[(u64, u32, bool)]) {
        for (i, &(a, l, w)) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let flags = if w { desc::F_WRITE } else { 0 } | if last { 0 } else { desc::F_NEXT };
            self.desc(i as u16, a, l, flags, i as u16 + 1);
        }
        self.publish(0);
    }

    fn publish(&mut self, head: u16) {
        self.publish_all(&[head]);
    }

    /// Makes the chains at `heads` available at once (one index update,
    /// one notification).
    fn publish_all(&mut self, heads: &[u16]) {
        let phys = self.ring.0;
        for &head in heads {
            let slot = phys + self.layout.avail + 4 + 2 * u64::from(self.avail % SIZE);
            self.mem.write(slot, &head.to_le_bytes()).unwrap();
            self.avail = self.avail.wrapping_add(1);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.mem
            .write(phys + self.layout.avail + 2, &self.avail.to_le_bytes())
            .unwrap();
        self.t.write(reg::QUEUE_NOTIFY, 0);
    }

    fn used_idx(&self) -> u16 {
        let mut b = [0u8; 2];
        self.mem
            .read(self.ring.0 + self.layout.used + 2, &mut b)
            .unwrap();
        u16::from_le_bytes(b)
    }

    /// Waits (bounded) for the next used element; returns its length.
    fn wait_used(&self) -> u32 {
        let t0 = Instant::now();
        while self.used_idx() != self.avail {
            assert!(t0.elapsed() < Duration::from_secs(10), "not used");
            std::thread::sleep(Duration::from_millis(1));
        }
        let slot = u64::from((self.avail.wrapping_sub(1)) % SIZE);
        let mut e = [0u8; 8];
        self.mem
            .read(self.ring.0 + self.layout.used + 4 + 8 * slot, &mut e)
            .unwrap();
        u32::from_le_bytes([e[4], e[5], e[6], e[7]])
    }

    fn status_at(&self, phys: PhysAddr) -> u8 {
        let mut b = [0u8];
        self.mem.read(phys, &mut b).unwrap();
        b[0]
    }

    /// Waits (bounded) for DEVICE_NEEDS_RESET, then returns the errors.
    fn errors_after_reset_request(&self) -> Vec<DeviceError> {
        let t0 = Instant::now();
        while self.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET == 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "no reset asked");
            std::thread::sleep(Duration::from_millis(1));
        }
        self.t.errors().drain()
    }

    fn request_errors(&self) -> Vec<RequestRecord> {
        self.host.device.request_log().drain()
    }

    /// A good 4 KiB read still works (the queue goes on).
    fn assert_still_serves(&mut self) {
        let (hdr, sp, si) = self.command(blk::T_IN, 8);
        let (_, data) = self.buffer(&[], DmaDirection::FromDevice);
        self.chain(&[(hdr, 16, false), (data, 4096, true), (si, 1, true)]);
        assert_eq!(self.wait_used(), 4097);
        assert_eq!(self.status_at(sp), S_OK);
        assert_eq!(self.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    }
}

/// Sends a read-shaped request of type `type_` at `sector` with `data`
/// writable descriptors `(len)` and returns (status, used len).
fn send(r: &mut Raw, type_: u32, sector: u64, data: &[u32]) -> (u8, u32) {
    let (hdr, sp, si) = r.command(type_, sector);
    let mut parts = vec![(hdr, 16, false)];
    for &l in data {
        let (_, a) = r.buffer(&[], DmaDirection::FromDevice);
        parts.push((a, l, true));
    }
    parts.push((si, 1, true));
    r.chain(&parts);
    let used = r.wait_used();
    (r.status_at(sp), used)
}

/// [`send`], for a request that fails: (status, used len, logged error).
fn request(r: &mut Raw, type_: u32, sector: u64, data: &[u32]) -> (u8, u32, RequestError) {
    let (st, used) = send(r, type_, sector, data);
    let mut log = r.request_errors();
    assert_eq!(log.len(), 1, "{log:?}");
    (st, used, log.remove(0).error)
}

#[test]
fn a_read_past_the_end_is_an_io_error() {
    let mut r = Raw::new(true);
    let (st, used, e) = request(&mut r, blk::T_IN, SECTORS - 4, &[4096]);
    // The whole writable area: the data area zero-filled, then the status.
    assert_eq!((st, used), (S_IOERR, 4097));
    assert!(matches!(
        e,
        RequestError::PastEnd {
            sector: 2044,
            len: 4096,
            capacity_sectors: SECTORS
        }
    ));
    // A sector whose byte offset overflows 64 bits.
    let (st, _, e) = request(&mut r, blk::T_IN, u64::MAX / 2, &[512]);
    assert_eq!(st, S_IOERR);
    assert!(matches!(e, RequestError::PastEnd { .. }));
    r.assert_still_serves();
}

#[test]
fn an_unaligned_length_is_an_io_error() {
    let mut r = Raw::new(true);
    let (st, _, e) = request(&mut r, blk::T_IN, 0, &[1000]);
    assert_eq!(st, S_IOERR);
    assert!(matches!(
        e,
        RequestError::LengthUnaligned {
            len: 1000,
            blk_size: 512
        }
    ));
    r.assert_still_serves();
}

#[test]
fn an_unknown_type_is_unsupported() {
    let mut r = Raw::new(true);
    let (st, used, e) = request(&mut r, 99, 0, &[512]);
    assert_eq!((st, used), (S_UNSUPP, 513));
    assert!(matches!(e, RequestError::Unsupported { type_: 99 }));
    r.assert_still_serves();
}

#[test]
fn a_flush_without_the_feature_is_unsupported() {
    let mut r = Raw::new(false);
    let (st, _, e) = request(&mut r, blk::T_FLUSH, 0, &[]);
    assert_eq!(st, S_UNSUPP);
    assert!(matches!(e, RequestError::FlushNotNegotiated));
    r.assert_still_serves();
}

#[test]
fn too_many_or_too_large_segments_are_io_errors() {
    let mut r = Raw::new(true);
    let (st, _, e) = request(&mut r, blk::T_IN, 0, &[512; 5]);
    assert_eq!(st, S_IOERR);
    assert!(matches!(
        e,
        RequestError::TooManySegments {
            segments: 5,
            seg_max: 4
        }
    ));
    // One 8 KiB segment (over two mapped pages would be needed anyway).
    let (st, _, e) = request(&mut r, blk::T_IN, 0, &[8192]);
    assert_eq!(st, S_IOERR);
    assert!(matches!(
        e,
        RequestError::SegmentTooLarge {
            len: 8192,
            size_max: 4096
        }
    ));
    r.assert_still_serves();
}

/// `seg_max` and `size_max` bind a driver only once it acknowledges their
/// features (§5.2.3): one that did not was told of no limit, and its
/// request of more and longer segments than the device's configuration
/// is served (bounded by the queue size and the device's buffer).
#[test]
fn segment_limits_not_negotiated_are_not_held_against_the_driver() {
    let mut r = Raw::with(
        true,
        false,
        BlkConfig {
            seg_max: 4,
            size_max: 4096,
            ..BlkConfig::default()
        },
    );
    // Six segments, past seg_max 4.
    assert_eq!(send(&mut r, blk::T_IN, 0, &[512; 6]), (S_OK, 6 * 512 + 1));
    // One 8 KiB segment, past size_max 4 KiB: two contiguous mapped pages.
    let (hdr, sp, si) = r.command(blk::T_IN, 0);
    let phys = r.mem.alloc_zeroed_frames(1).unwrap();
    let data = r
        .cpu
        .map(&r.host.dev, phys, 8192, DmaDirection::FromDevice)
        .unwrap();
    r.chain(&[(hdr, 16, false), (data, 8192, true), (si, 1, true)]);
    assert_eq!(r.wait_used(), 8193);
    assert_eq!(r.status_at(sp), S_OK);
    assert!(r.request_errors().is_empty());
    r.assert_still_serves();
}

/// `blk_size` is the optimal size, not the protocol's unit (§5.2.5: the
/// unit is always 512 bytes): a device announcing 4 KiB over a back-end
/// that needs no more serves a one-sector read at an odd sector.
#[test]
fn a_sector_read_off_blk_size_is_served() {
    let mut r = Raw::with(
        true,
        true,
        BlkConfig {
            blk_size: 4096,
            ..BlkConfig::default()
        },
    );
    assert_eq!(send(&mut r, blk::T_IN, 3, &[512]), (S_OK, 513));
    assert!(r.request_errors().is_empty());
}

#[test]
fn readable_data_in_a_read_is_an_io_error() {
    let mut r = Raw::new(true);
    let (hdr, sp, si) = r.command(blk::T_IN, 0);
    let (_, extra) = r.buffer(&[1; 512], DmaDirection::ToDevice);
    let (_, data) = r.buffer(&[], DmaDirection::FromDevice);
    r.chain(&[
        (hdr, 16, false),
        (extra, 512, false),
        (data, 512, true),
        (si, 1, true),
    ]);
    r.wait_used();
    assert_eq!(r.status_at(sp), S_IOERR);
    let log = r.request_errors();
    assert!(matches!(
        log[..],
        [RequestRecord {
            error: RequestError::WrongDirection {
                op: BlkOp::Read,
                bytes: 512
            },
            ..
        }]
    ));
    r.assert_still_serves();
}

#[test]
fn a_segment_past_its_mapping_faults_and_writes_nothing() {
    let mut r = Raw::new(true);
    // The data descriptor says 4096 bytes from the middle of a mapped
    // page: its second half lies past the mapping (the next page is not
    // mapped for the device).
    let (hdr, sp, si) = r.command(blk::T_IN, 0);
    // A data page whose IOVA successor is not mapped: map a page above it,
    // then unmap that one (strict: cleared and invalidated).
    let (phys, data) = (0..64)
        .find_map(|_| {
            let (_, above) = r.buffer(&[], DmaDirection::FromDevice);
            let (phys, data) = r.buffer(&[], DmaDirection::FromDevice);
            (data + 4096 == above).then(|| {
                r.cpu
                    .unmap(&r.host.dev, above, 4096, DmaDirection::FromDevice)
                    .unwrap();
                (phys, data)
            })
        })
        .expect("two adjacent IOVAs");
    assert!(r.host.domain.iova_to_phys(data + 4096).unwrap().is_none());
    r.chain(&[(hdr, 16, false), (data + 2048, 4096, true), (si, 1, true)]);
    // Nothing written from the first writable byte on (the status byte
    // lies past the refused data): used length 0.
    assert_eq!(r.wait_used(), 0);
    assert_eq!(r.status_at(sp), S_IOERR);
    let log = r.request_errors();
    assert!(
        matches!(
            log[..],
            [RequestRecord {
                error: RequestError::DmaFault {
                    access: Access::Write,
                    ..
                },
                ..
            }]
        ),
        "{log:?}"
    );
    // Not a byte of the mapped half was written either: the access is
    // translated whole before it copies.
    let mut page = vec![0u8; 4096];
    r.mem.read(phys, &mut page).unwrap();
    assert!(page.iter().all(|&b| b == 0));
    assert!(!r.host.take_faults().is_empty(), "the unit logged it");
    assert_eq!(r.host.device.stats().dma_faults, 1);
    r.assert_still_serves();
}

/// The used length is a prefix of the writable area the device wrote
/// (virtio 1.2 §2.7.8.2: at least `len` bytes from the first writable
/// byte): an error and a `GET_ID` with a buffer longer than the id string
/// report the whole writable area, every byte of which was written (the
/// data area zero-filled past the id string), the status byte last.
/// (Before: used length 1 or 21, with the status byte written at the end
/// of the area and the bytes before it left as they were.)
#[test]
fn errors_and_get_id_report_a_prefix_of_the_writable_area_they_wrote() {
    let mut r = Raw::new(true);
    for (type_, sector, want) in [
        (99, 0, S_UNSUPP),
        (blk::T_IN, SECTORS - 4, S_IOERR),
        (blk::T_GET_ID, 0, S_OK),
    ] {
        let (hdr, sp, si) = r.command(type_, sector);
        let (dp, data) = r.buffer(&[0xaa; 4096], DmaDirection::FromDevice);
        r.mem.write(sp, &[0xaa]).unwrap();
        r.chain(&[
            (hdr, 16, false),
            (data, 512, true),
            (data + 512, 3584, true),
            (si, 1, true),
        ]);
        let used = r.wait_used();
        assert_eq!((used, r.status_at(sp)), (4097, want), "type {type_}");
        let mut area = vec![0u8; 4096];
        r.mem.read(dp, &mut area).unwrap();
        assert!(area.iter().all(|&b| b != 0xaa), "type {type_}");
        let zeros_from = if type_ == blk::T_GET_ID {
            blk::ID_BYTES
        } else {
            0
        };
        assert!(area[zeros_from..].iter().all(|&b| b == 0), "type {type_}");
        if type_ == blk::T_GET_ID {
            assert!(area[..blk::ID_BYTES].iter().any(|&b| b != 0));
        } else {
            let log = r.request_errors();
            assert!(
                matches!(
                    log[..],
                    [RequestRecord {
                        error: RequestError::Unsupported { type_: 99 }
                            | RequestError::PastEnd { .. },
                        ..
                    }]
                ),
                "{log:?}"
            );
        }
    }
    r.assert_still_serves();
}

#[test]
fn a_chain_without_a_status_byte_breaks_the_queue() {
    let mut r = Raw::new(true);
    let (hdr, _, _) = r.command(blk::T_IN, 0);
    let (_, data) = r.buffer(&[], DmaDirection::ToDevice);
    r.chain(&[(hdr, 16, false), (data, 512, false)]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::BlkRequestShape {
                queue: 0,
                head: 0,
                readable: 528,
                writable: 0
            }]
        ),
        "{e:?}"
    );
    r.init(true);
    r.assert_still_serves();
}

#[test]
fn a_readable_descriptor_after_a_writable_one_breaks_the_queue() {
    let mut r = Raw::new(true);
    let (hdr, _, si) = r.command(blk::T_IN, 0);
    let (_, data) = r.buffer(&[], DmaDirection::FromDevice);
    r.chain(&[(hdr, 16, false), (si, 1, true), (data, 512, false)]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::WrongDirection {
                queue: 0,
                head: 0,
                index: 2,
                ..
            }]
        ),
        "{e:?}"
    );
}

#[test]
fn an_unwritable_status_byte_breaks_the_queue() {
    let mut r = Raw::new(true);
    let (hdr, _, _) = r.command(blk::T_IN, 0);
    // The "status" page is mapped read-only for the device.
    let (sp, ro) = r.buffer(&[0xee], DmaDirection::ToDevice);
    let (_, data) = r.buffer(&[], DmaDirection::FromDevice);
    r.chain(&[(hdr, 16, false), (data, 512, true), (ro, 1, true)]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::DmaFault {
                queue: 0,
                what: "status byte",
                access: Access::Write,
                ..
            }]
        ),
        "{e:?}"
    );
    assert_eq!(r.status_at(sp), 0xee, "not written");
}

#[test]
fn a_revoked_ring_breaks_the_queue() {
    let mut r = Raw::new(true);
    let (phys, iova) = r.ring;
    r.cpu
        .free_coherent(&r.host.dev, phys, iova, r.layout.bytes)
        .unwrap();
    r.t.write(reg::QUEUE_NOTIFY, 0);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::DmaFault {
                queue: 0,
                access: Access::Read,
                ..
            }]
        ),
        "{e:?}"
    );
}

#[test]
fn a_mapping_revoked_under_a_request_in_flight_faults_without_writing() {
    let h = blk_common::host(DmaPolicy::Strict, BackendConfig::default(), 1);
    let mut d = h.driver(BlkDriverConfig::default()).unwrap();
    let mut q = d.take_queue(0).unwrap();
    q.bind_interrupt();
    let slot = q.submit(BlkOp::Read, 64, 16384, None).unwrap().unwrap();
    // The driver unmaps the request's data (strict: invalidated at once)
    // before the device has served it, then lets the device see it.
    assert_eq!(q.revoke_in_flight().unwrap(), Some(slot));
    let done = blk_common::complete(&mut q, 1);
    assert_eq!(done[0].0.status, S_IOERR);
    let pages: Vec<_> = q.slot_pages(slot).to_vec();
    for p in pages {
        let mut page = vec![0u8; 4096];
        h.mem.read(p, &mut page).unwrap();
        assert!(page.iter().all(|&b| b == 0), "nothing written");
    }
    let log = h.device.request_log().drain();
    assert!(matches!(
        log[..],
        [RequestRecord {
            error: RequestError::DmaFault {
                access: Access::Write,
                ..
            },
            ..
        }]
    ));
    assert!(!h.take_faults().is_empty());
    // The queue goes on.
    q.submit(BlkOp::Read, 64, 4096, None).unwrap().unwrap();
    assert!(blk_common::complete(&mut q, 1)[0].0.is_ok());
    d.reset();
    q.release().unwrap();
}

/// The request queue's rings programmed where they would run past the end
/// of the 64-bit IOVA space, one area at a time, as `(what, rewrite,
/// address, bytes)`.
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
        let mut r = Raw::new(true);
        r.init_with(true, rewrite);
        // A request whose chain starts at descriptor 1, so that a device
        // that took the table would add 16 to its address.
        let (hdr, _, si) = r.command(blk::T_IN, 0);
        let (_, data) = r.buffer(&[], DmaDirection::FromDevice);
        r.desc(1, hdr, 16, desc::F_NEXT, 2);
        r.desc(2, data, 512, desc::F_WRITE | desc::F_NEXT, 3);
        r.desc(3, si, 1, desc::F_WRITE, 0);
        r.publish(1);
        let e = r.errors_after_reset_request();
        assert!(
            matches!(
                e[..],
                [DeviceError::AddressOverflow { queue: 0, what: w, addr: a, len: l }]
                    if w == what && a == addr && l == len
            ),
            "{what} at {addr:#x}: {e:?}"
        );
        assert_ne!(r.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
        // Reset, valid rings: a read completes.
        r.init(true);
        r.assert_still_serves();
        assert!(r.t.errors().drain().is_empty());
    }
}

#[test]
fn a_descriptor_whose_buffer_wraps_the_iova_space_breaks_the_queue() {
    let mut r = Raw::new(true);
    let (hdr, _, si) = r.command(blk::T_IN, 0);
    r.chain(&[(hdr, 16, false), (u64::MAX - 255, 512, true), (si, 1, true)]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::AddressOverflow { queue: 0, what: "buffer", addr, len: 512 }]
                if addr == u64::MAX - 255
        ),
        "{e:?}"
    );
    r.init(true);
    r.assert_still_serves();
}

/// A zero-length readable descriptor before the header carries nothing
/// and is skipped (§2.7.4.1: the device makes no assumption on the
/// descriptors' arrangement; before, its zero-length read was refused and
/// the request failed `IOERR`).
#[test]
fn a_zero_length_descriptor_before_the_header_is_skipped() {
    let mut r = Raw::new(true);
    let (hdr, sp, si) = r.command(blk::T_IN, 8);
    let (_, data) = r.buffer(&[], DmaDirection::FromDevice);
    r.chain(&[
        (hdr, 0, false),
        (hdr, 16, false),
        (data, 4096, true),
        (si, 1, true),
    ]);
    assert_eq!(r.wait_used(), 4097);
    assert_eq!(r.status_at(sp), S_OK);
    assert!(r.request_errors().is_empty());
}

/// A request completed before a later chain of the same batch stopped the
/// queue is announced with the used-buffer interrupt (§2.7.7.2: with the
/// driver's flags 0 "the device MUST send a notification"; a driver reads
/// its used ring on that bit alone). Before: only the configuration-change
/// interrupt, and the completed read sat unseen.
#[test]
fn a_request_completed_before_a_fault_in_the_batch_is_announced() {
    let mut r = Raw::new(true);
    let (hdr, sp, si) = r.command(blk::T_IN, 8);
    let (_, data) = r.buffer(&[], DmaDirection::FromDevice);
    let (hdr2, _, _) = r.command(blk::T_IN, 0);
    let (_, ro) = r.buffer(&[0xee], DmaDirection::ToDevice);
    let (_, data2) = r.buffer(&[], DmaDirection::FromDevice);
    // Chain 0..2 good; chain 3..5 with a status byte the device may not
    // write: it stops the queue.
    r.desc(0, hdr, 16, desc::F_NEXT, 1);
    r.desc(1, data, 4096, desc::F_WRITE | desc::F_NEXT, 2);
    r.desc(2, si, 1, desc::F_WRITE, 0);
    r.desc(3, hdr2, 16, desc::F_NEXT, 4);
    r.desc(4, data2, 512, desc::F_WRITE | desc::F_NEXT, 5);
    r.desc(5, ro, 1, desc::F_WRITE, 0);
    r.publish_all(&[0, 3]);
    let e = r.errors_after_reset_request();
    assert!(
        matches!(
            e[..],
            [DeviceError::DmaFault {
                what: "status byte",
                ..
            }]
        ),
        "{e:?}"
    );
    assert_eq!(r.used_idx(), 1);
    assert_eq!(r.status_at(sp), S_OK);
    let isr = r.t.read(reg::INTERRUPT_STATUS);
    assert_eq!(isr & 1, 1, "no used-buffer interrupt (status {isr:#x})");
}
