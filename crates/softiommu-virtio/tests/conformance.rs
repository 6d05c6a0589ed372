//! Conformance against an independent driver: rcore's `virtio-drivers`
//! (`VirtIONetRaw`) drives our device through a `Transport` over our
//! register block, with a `Hal` whose every DMA address comes from
//! softiommu's DMA API (so the device, which reaches memory only through
//! its IOMMU unit, sees IOVAs as `VIRTIO_F_ACCESS_PLATFORM` requires —
//! `virtio-drivers` 0.13 does not negotiate that bit itself, so the
//! transport is built without requiring it). It sends a frame onto the
//! wire and receives one from it, and goes on receiving after its link
//! partner sent a frame past the device's MTU.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::dma::{DmaCpu, DmaDevice, DmaDirection, DmaPolicy};
use softiommu::mem::{PhysAddr, PhysMemory, PAGE_SIZE};
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::net::{wire, NetDeviceConfig, WireConfig, WirePort, WireStats};
use softiommu_virtio::spec::{reg, status};
use softiommu_virtio::transport::{MmioTransport, TransportConfig};
use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{BufferDirection, Hal};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// The DMA context of the test's thread.
struct Ctx {
    mem: Arc<PhysMemory>,
    cpu: DmaCpu,
    dev: DmaDevice,
    /// Coherent allocations: DMA address → (phys, bytes).
    coherent: HashMap<u64, (PhysAddr, u64)>,
    /// Shared buffers: DMA address → (bounce phys, order, len, direction).
    shared: HashMap<u64, (PhysAddr, u32, u64, DmaDirection)>,
}

thread_local! {
    static CTX: RefCell<Option<Ctx>> = const { RefCell::new(None) };
}

fn with<R>(f: impl FnOnce(&mut Ctx) -> R) -> R {
    CTX.with(|c| f(c.borrow_mut().as_mut().expect("the test set a context")))
}

fn dir(d: BufferDirection) -> DmaDirection {
    match d {
        BufferDirection::DriverToDevice => DmaDirection::ToDevice,
        BufferDirection::DeviceToDriver => DmaDirection::FromDevice,
        BufferDirection::Both => DmaDirection::Bidirectional,
    }
}

/// `virtio-drivers`' HAL on softiommu's DMA API.
struct SoftHal;

// SAFETY: `dma_alloc` returns zeroed, coherent memory of the size asked,
// mapped for the device and valid until `dma_dealloc`; `share` returns a
// DMA address through which the device reaches a copy of the buffer (a
// bounce copy in `PhysMemory`, since the caller's buffer is not in it),
// valid until `unshare`, which copies the device's writes back.
unsafe impl Hal for SoftHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (u64, NonNull<u8>) {
        with(|c| {
            let len = pages as u64 * PAGE_SIZE;
            match c.cpu.alloc_coherent(&c.dev, len) {
                Ok((phys, iova)) => {
                    let p = c.mem.as_ptr(phys, len).expect("in the arena");
                    c.coherent.insert(iova, (phys, len));
                    (iova, NonNull::new(p).expect("not null"))
                }
                Err(_) => (0, NonNull::dangling()),
            }
        })
    }

    unsafe fn dma_dealloc(paddr: u64, _vaddr: NonNull<u8>, _pages: usize) -> i32 {
        with(|c| match c.coherent.remove(&paddr) {
            Some((phys, len)) => match c.cpu.free_coherent(&c.dev, phys, paddr, len) {
                Ok(()) => 0,
                Err(_) => -1,
            },
            None => -1,
        })
    }

    unsafe fn mmio_phys_to_virt(_paddr: u64, _size: usize) -> NonNull<u8> {
        // Our transport is a register block, not a memory window.
        NonNull::dangling()
    }

    unsafe fn share(buffer: NonNull<[u8]>, direction: BufferDirection) -> u64 {
        with(|c| {
            let len = buffer.len() as u64;
            let order = len.max(1).div_ceil(PAGE_SIZE).next_power_of_two().ilog2();
            let phys = c.mem.alloc_zeroed_frames(order).expect("memory");
            if direction != BufferDirection::DeviceToDriver {
                // SAFETY: virtio-drivers hands a valid buffer of `len`
                // bytes, not accessed by it until `unshare`.
                let src = unsafe { buffer.as_ref() };
                c.mem.write(phys, src).expect("in the arena");
            }
            let d = dir(direction);
            let iova = c.cpu.map(&c.dev, phys, len.max(1), d).expect("mapped");
            c.shared.insert(iova, (phys, order, len.max(1), d));
            iova
        })
    }

    unsafe fn unshare(paddr: u64, mut buffer: NonNull<[u8]>, direction: BufferDirection) {
        with(|c| {
            let (phys, order, len, d) = c.shared.remove(&paddr).expect("shared before");
            c.cpu.unmap(&c.dev, paddr, len, d).expect("unmapped");
            if direction != BufferDirection::DriverToDevice {
                // SAFETY: the same buffer `share` was given, now the
                // driver's again.
                let dst = unsafe { buffer.as_mut() };
                c.mem.read(phys, dst).expect("in the arena");
            }
            c.mem.free_frames(phys, order).expect("freed");
        })
    }
}

/// `virtio-drivers`' `Transport` over our register block.
struct Regs(MmioTransport);

impl Transport for Regs {
    fn device_type(&self) -> DeviceType {
        DeviceType::try_from(self.0.read(reg::DEVICE_ID)).expect("a known type")
    }

    fn read_device_features(&mut self) -> u64 {
        self.0.write(reg::DEVICE_FEATURES_SEL, 0);
        let lo = u64::from(self.0.read(reg::DEVICE_FEATURES));
        self.0.write(reg::DEVICE_FEATURES_SEL, 1);
        lo | u64::from(self.0.read(reg::DEVICE_FEATURES)) << 32
    }

    fn write_driver_features(&mut self, f: u64) {
        self.0.write(reg::DRIVER_FEATURES_SEL, 0);
        self.0.write(reg::DRIVER_FEATURES, f as u32);
        self.0.write(reg::DRIVER_FEATURES_SEL, 1);
        self.0.write(reg::DRIVER_FEATURES, (f >> 32) as u32);
    }

    fn max_queue_size(&mut self, queue: u16) -> u32 {
        self.0.write(reg::QUEUE_SEL, u32::from(queue));
        self.0.read(reg::QUEUE_NUM_MAX)
    }

    fn notify(&mut self, queue: u16) {
        self.0.write(reg::QUEUE_NOTIFY, u32::from(queue));
    }

    fn get_status(&self) -> DeviceStatus {
        DeviceStatus::from_bits_truncate(self.0.read(reg::STATUS))
    }

    fn set_status(&mut self, status: DeviceStatus) {
        self.0.write(reg::STATUS, status.bits());
    }

    fn set_guest_page_size(&mut self, _size: u32) {
        // Legacy only (§4.2.4); a modern device has no such register.
    }

    fn requires_legacy_layout(&self) -> bool {
        false
    }

    fn queue_set(
        &mut self,
        queue: u16,
        size: u32,
        descriptors: u64,
        driver_area: u64,
        device_area: u64,
    ) {
        let t = &self.0;
        t.write(reg::QUEUE_SEL, u32::from(queue));
        t.write(reg::QUEUE_NUM, size);
        for (lo, v) in [
            (reg::QUEUE_DESC_LOW, descriptors),
            (reg::QUEUE_DRIVER_LOW, driver_area),
            (reg::QUEUE_DEVICE_LOW, device_area),
        ] {
            t.write(lo, v as u32);
            t.write(lo + 4, (v >> 32) as u32);
        }
        t.write(reg::QUEUE_READY, 1);
    }

    fn queue_unset(&mut self, queue: u16) {
        self.0.write(reg::QUEUE_SEL, u32::from(queue));
        self.0.write(reg::QUEUE_READY, 0);
    }

    fn queue_used(&mut self, queue: u16) -> bool {
        self.0.write(reg::QUEUE_SEL, u32::from(queue));
        self.0.read(reg::QUEUE_READY) != 0
    }

    fn ack_interrupt(&mut self) -> InterruptStatus {
        let isr = self.0.read(reg::INTERRUPT_STATUS);
        self.0.write(reg::INTERRUPT_ACK, isr);
        InterruptStatus::from_bits_truncate(isr)
    }

    fn read_config_generation(&self) -> u32 {
        self.0.read(reg::CONFIG_GENERATION)
    }

    fn read_config_space<T: FromBytes + IntoBytes>(
        &self,
        offset: usize,
    ) -> virtio_drivers::Result<T> {
        let mut b = vec![0u8; size_of::<T>()];
        self.0.read_config(offset as u64, &mut b);
        T::read_from_bytes(&b).map_err(|_| virtio_drivers::Error::ConfigSpaceTooSmall)
    }

    fn write_config_space<T: IntoBytes + Immutable>(
        &mut self,
        _offset: usize,
        _value: T,
    ) -> virtio_drivers::Result<()> {
        Err(virtio_drivers::Error::Unsupported)
    }
}

const QUEUE: usize = 16;

fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A strict host on a wire built from `w`, with the DMA context of the
/// calling thread set for it: `(host, its config, the peer's port, the
/// wire's counters)`.
fn host(w: WireConfig) -> (Host, HostConfig, WirePort, WireStats) {
    let (pa, peer, stats) = wire(w);
    let cfg = HostConfig {
        policy: DmaPolicy::Strict,
        mem_bytes: 64 << 20,
        device: NetDeviceConfig {
            transport: TransportConfig {
                require_access_platform: false,
                ..TransportConfig::default()
            },
            ..NetDeviceConfig::default()
        },
        ..HostConfig::default()
    };
    let host = Host::new(&cfg, pa).unwrap();
    CTX.with(|c| {
        *c.borrow_mut() = Some(Ctx {
            mem: host.mem.clone(),
            cpu: host.domain.cpu(),
            dev: host.dev.clone(),
            coherent: HashMap::new(),
            shared: HashMap::new(),
        })
    });
    (host, cfg, peer, stats)
}

#[test]
fn virtio_drivers_net_raw_sends_and_receives_through_our_device() {
    let (host, cfg, mut peer, stats) = host(WireConfig::default());
    let transport = host.device.transport().clone();
    let mut net =
        VirtIONetRaw::<SoftHal, Regs, QUEUE>::new(Regs(transport.clone())).expect("probe");
    assert_eq!(net.mac_address(), cfg.device.net.mac);

    // Transmit: header + a broadcast frame.
    let frame: Vec<u8> = (0..100u8).map(|i| if i < 6 { 0xff } else { i }).collect();
    let mut tx = vec![0u8; 12 + frame.len()];
    let hdr = net.fill_buffer_header(&mut tx).unwrap();
    assert_eq!(hdr, 12, "the v1 header (VERSION_1 negotiated)");
    tx[hdr..].copy_from_slice(&frame);
    // SAFETY: `tx` is not touched until the transmission completes.
    let token = unsafe { net.transmit_begin(&tx) }.unwrap();
    let done = wait_for(|| net.poll_transmit());
    assert_eq!(done, token);
    // SAFETY: the same buffer as `transmit_begin`.
    unsafe { net.transmit_complete(token, &tx) }.unwrap();
    let on_wire = wait_for(|| peer.rx.peek().ok().map(|f| f.to_vec()));
    assert_eq!(on_wire, frame);
    peer.rx.consume();

    // Receive: post a buffer, send a frame from the peer.
    let mut rx = vec![0u8; 1526];
    // SAFETY: `rx` is not touched until the reception completes.
    let token = unsafe { net.receive_begin(&mut rx) }.unwrap();
    let incoming: Vec<u8> = (0..64u8).map(|i| i ^ 0x3c).collect();
    let mut slot = peer.tx.reserve().unwrap();
    slot.buf()[..incoming.len()].copy_from_slice(&incoming);
    slot.commit(incoming.len());
    let got = wait_for(|| net.poll_receive());
    assert_eq!(got, token);
    // SAFETY: the same buffer as `receive_begin`.
    let (hdr_len, pkt_len) = unsafe { net.receive_complete(token, &mut rx) }.unwrap();
    assert_eq!((hdr_len, pkt_len), (12, incoming.len()));
    assert_eq!(&rx[12..12 + pkt_len], &incoming[..]);
    assert_eq!(u16::from_le_bytes([rx[10], rx[11]]), 1, "num_buffers");

    assert!(
        transport.errors().snapshot().is_empty(),
        "{:?}",
        transport.errors().snapshot()
    );
    assert!(host.take_faults().is_empty());
    assert_eq!(stats.a_to_b().sent, 1);
    assert_eq!(stats.b_to_a().delivered, 1);
    drop(net);
    CTX.with(|c| {
        let ctx = c.borrow_mut().take().unwrap();
        assert!(ctx.shared.is_empty(), "every share was unshared");
    });
}

#[test]
fn virtio_drivers_net_raw_keeps_receiving_after_a_jumbo_frame() {
    let (host, _, mut peer, _) = host(WireConfig {
        max_frame: 9014,
        ..WireConfig::default()
    });
    let transport = host.device.transport().clone();
    let mut net =
        VirtIONetRaw::<SoftHal, Regs, QUEUE>::new(Regs(transport.clone())).expect("probe");
    // What §5.1.6.3.1 asks for at MTU 1500.
    let mut rx = vec![0u8; 1526];
    // SAFETY: `rx` is not touched until the reception completes.
    let token = unsafe { net.receive_begin(&mut rx) }.unwrap();
    let jumbo = vec![0xaa; 9014];
    let normal: Vec<u8> = (0..64u8).map(|i| i ^ 0x3c).collect();
    for f in [&jumbo, &normal] {
        let mut slot = peer.tx.reserve().unwrap();
        slot.buf()[..f.len()].copy_from_slice(f);
        slot.commit(f.len());
    }
    let got = wait_for(|| net.poll_receive());
    assert_eq!(got, token);
    // SAFETY: the same buffer as `receive_begin`.
    let (hdr_len, pkt_len) = unsafe { net.receive_complete(token, &mut rx) }.unwrap();
    assert_eq!((hdr_len, pkt_len), (12, normal.len()));
    assert_eq!(&rx[12..12 + pkt_len], &normal[..]);
    assert_eq!(host.device.stats().rx_oversize_drops, 1);
    assert_eq!(transport.status() & status::DEVICE_NEEDS_RESET, 0);
    assert!(
        transport.errors().snapshot().is_empty(),
        "{:?}",
        transport.errors().snapshot()
    );
    drop(net);
    CTX.with(|c| {
        let ctx = c.borrow_mut().take().unwrap();
        assert!(ctx.shared.is_empty(), "every share was unshared");
    });
}
