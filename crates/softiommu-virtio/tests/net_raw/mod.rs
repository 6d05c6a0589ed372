//! A hand-written virtio-net driver that builds chains, good or bad, on
//! purpose, on a host of its own with the peer's wire port in hand: the
//! malformed-chain tests and the IOPF-mode ones share it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::dma::{DmaCpu, DmaDirection, DmaPolicy};
use softiommu::mem::{PhysAddr, PhysMemory};
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::net::{wire, RingLayout, WireConfig, WirePort, HDR_LEN};
use softiommu_virtio::spec::{feature, reg, status};
use softiommu_virtio::transport::{DeviceError, MmioTransport};

pub const SIZE: u16 = 16;
pub const RX: usize = 0;
pub const TX: usize = 1;

pub struct Raw {
    pub host: Host,
    pub peer: WirePort,
    pub cpu: DmaCpu,
    pub t: MmioTransport,
    pub mem: Arc<PhysMemory>,
    /// Per queue: ring physical address, DMA address, next avail index.
    pub rings: [(PhysAddr, u64, u16); 2],
    pub layout: RingLayout,
    /// Feature bits 0-31 the driver accepts at its next initialisation
    /// (`VERSION_1` and `ACCESS_PLATFORM`, in the high word, always).
    pub features_low: u32,
}

impl Raw {
    /// On a host with the strict policy and 64 MiB.
    pub fn new() -> Self {
        Self::with(&HostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 64 << 20,
            ..HostConfig::default()
        })
    }

    /// On a host built from `cfg`, initialised (both queues live).
    pub fn with(cfg: &HostConfig) -> Self {
        Self::with_wire(cfg, WireConfig::default())
    }

    /// On a host built from `cfg` on a wire built from `w`, initialised.
    pub fn with_wire(cfg: &HostConfig, w: WireConfig) -> Self {
        let (pa, peer, _) = wire(w);
        let host = Host::new(cfg, pa).unwrap();
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
            features_low: 0,
        };
        r.init();
        r
    }

    pub fn init(&mut self) {
        self.init_with(|_, a| a);
        assert_eq!(self.t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    }

    /// Resets and initialises the device again, accepting feature bits
    /// `low` (0-31) beside the two it always accepts; asserts the device
    /// took them.
    pub fn init_features(&mut self, low: u32) {
        self.features_low = low;
        self.init();
        assert_ne!(self.t.read(reg::STATUS) & status::FEATURES_OK, 0);
    }

    /// Resets and initialises the device, programming queue `q`'s rings
    /// at `rings(q, (desc, avail, used))` instead of where they were
    /// allocated (a driver that hands the device bad ring addresses).
    /// Asserts nothing about the outcome.
    pub fn init_with(&mut self, rings: impl Fn(usize, (u64, u64, u64)) -> (u64, u64, u64)) {
        let t = &self.t;
        t.write(reg::STATUS, 0);
        t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        let f = 1u64 << feature::VERSION_1 | 1 << feature::ACCESS_PLATFORM;
        t.write(reg::DRIVER_FEATURES_SEL, 0);
        t.write(reg::DRIVER_FEATURES, self.features_low);
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
            let areas = rings(q, (iova, iova + self.layout.avail, iova + self.layout.used));
            t.program_queue(q as u16, SIZE, areas);
            self.rings[q] = (phys, iova, 0);
        }
        t.write(
            reg::STATUS,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        );
    }

    /// A buffer of `len` bytes holding `data`, mapped `dir`: (phys, iova).
    pub fn buffer(&mut self, len: u64, data: &[u8], dir: DmaDirection) -> (PhysAddr, u64) {
        let phys = self.mem.alloc_zeroed_frames(0).unwrap();
        self.mem.write(phys, data).unwrap();
        let iova = self.cpu.map(&self.host.dev, phys, len, dir).unwrap();
        (phys, iova)
    }

    pub fn desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
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
    pub fn publish_at(&mut self, q: usize, head: u16, idx: u16) {
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

    pub fn publish(&mut self, q: usize, head: u16) {
        let idx = self.rings[q].2.wrapping_add(1);
        self.publish_at(q, head, idx);
    }

    pub fn used_idx(&self, q: usize) -> u16 {
        let mut b = [0u8; 2];
        self.mem
            .read(self.rings[q].0 + self.layout.used + 2, &mut b)
            .unwrap();
        u16::from_le_bytes(b)
    }

    /// A frame from the peer onto the host's receive side.
    pub fn inject(&mut self, frame: &[u8]) {
        let mut s = self.peer.tx.reserve().expect("room on the wire");
        s.buf()[..frame.len()].copy_from_slice(frame);
        s.commit(frame.len());
    }

    /// Waits (bounded) for DEVICE_NEEDS_RESET, then returns the errors.
    pub fn errors_after_reset_request(&self) -> Vec<DeviceError> {
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
    pub fn wait_used(&self, q: usize, n: u16) {
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
pub fn packet() -> Vec<u8> {
    let mut p = vec![0u8; HDR_LEN + 60];
    p[HDR_LEN..HDR_LEN + 6].copy_from_slice(&[0xff; 6]);
    p[HDR_LEN + 12..HDR_LEN + 14].copy_from_slice(&[0x08, 0x00]);
    p
}

/// After an error, the queue is stopped: a valid chain is not used; a
/// reset and a new initialisation bring the device back.
pub fn assert_stopped_then_recovers(r: &mut Raw, q: usize) {
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
