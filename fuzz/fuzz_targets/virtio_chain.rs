//! Virtio descriptor chains and virtio-mmio register writes against the
//! net device or the blk device (memory back-end), behind the unit with
//! the strict policy.
//!
//! The driver side is hostile: any register write, descriptors with any
//! address, length, flags and next, chains published at any index,
//! buffers unmapped under the device's feet, bytes of its choosing in the
//! buffers (block request headers), frames arriving for the receive
//! queue. The device must never panic, never touch memory outside
//! a live mapping (canary frames never mapped, and buffers unmapped before
//! the device could use them, keep their bytes; read-only buffers are
//! never written), and settle within a bounded time (the harness gives it
//! 100 ms after the last operation; dropping the host joins its thread,
//! so a device stuck in a loop is a libFuzzer timeout).

#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softiommu::dma::{DmaCpu, DmaDevice, DmaDirection, DmaPolicy};
use softiommu::mem::{PhysAddr, PhysMemory};
use softiommu_virtio::blk::{BackendConfig, BlkDeviceConfig, BlkHost, BlkHostConfig};
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::net::{wire, RingLayout, WireConfig};
use softiommu_virtio::spec::{feature, reg, status};
use softiommu_virtio::transport::MmioTransport;

const SIZE: u16 = 16;
const BUFS: usize = 8;
const CANARY: u8 = 0xa5;
const FILL: u8 = 0x5a;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Addr {
    /// Into buffer `buf`, at `off`.
    Buf {
        buf: u8,
        off: u16,
    },
    /// Into queue `q`'s own ring memory.
    Ring {
        q: u8,
        off: u16,
    },
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Any register write (offsets below 0x200, 4-byte aligned or not).
    Reg {
        offset: u16,
        value: u32,
    },
    Read {
        offset: u16,
    },
    /// The whole initialisation, with the queues at their rings.
    Init {
        features_hi: u32,
        features_lo: u32,
    },
    Desc {
        q: bool,
        i: u16,
        addr: Addr,
        len: u32,
        flags: u16,
        next: u16,
    },
    /// Put `head` in the next avail slot, set the index to `idx_delta`
    /// past the current one, and notify.
    Publish {
        q: bool,
        head: u16,
        idx_delta: u8,
    },
    Notify(u32),
    /// Unmap buffer `buf` (it becomes a canary).
    Unmap(u8),
    /// A frame from the wire for the receive queue (net).
    Frame(u16),
    /// Driver-written bytes in buffer `buf` at `off` (a block request's
    /// header, a status byte).
    Fill {
        buf: u8,
        off: u16,
        bytes: [u8; 16],
    },
    Reset,
}

struct Buf {
    phys: PhysAddr,
    iova: u64,
    dir: DmaDirection,
    live: bool,
    /// What the driver last wrote (a read-only buffer must still hold it).
    bytes: Vec<u8>,
}

/// The device under test, with what the harness needs of it.
enum Dev {
    Net(Host, softiommu_virtio::net::WirePort),
    Blk(BlkHost),
}

impl Dev {
    fn mem(&self) -> &Arc<PhysMemory> {
        match self {
            Dev::Net(h, _) => &h.mem,
            Dev::Blk(h) => &h.mem,
        }
    }
    fn dev(&self) -> &DmaDevice {
        match self {
            Dev::Net(h, _) => &h.dev,
            Dev::Blk(h) => &h.dev,
        }
    }
    fn cpu(&self) -> DmaCpu {
        match self {
            Dev::Net(h, _) => h.domain.cpu(),
            Dev::Blk(h) => h.domain.cpu(),
        }
    }
    fn transport(&self) -> MmioTransport {
        match self {
            Dev::Net(h, _) => h.device.transport().clone(),
            Dev::Blk(h) => h.device.transport().clone(),
        }
    }
    fn queues(&self) -> usize {
        match self {
            Dev::Net(..) => 2,
            Dev::Blk(_) => 1,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// The blk device instead of the net device.
    blk: bool,
    /// Start from an uninitialised device instead of a ready one.
    raw: bool,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let mut d = if input.blk {
        let mut cfg = BlkHostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 32 << 20,
            bounce_bytes: 1 << 20,
            ..BlkHostConfig::default()
        };
        cfg.device = BlkDeviceConfig {
            backend: BackendConfig::Memory { capacity: 64 * 512 },
            idle_wait: Duration::from_millis(1),
            ..BlkDeviceConfig::default()
        };
        Dev::Blk(BlkHost::new(&cfg).expect("blk host"))
    } else {
        let (pa, peer, _) = wire(WireConfig::default());
        let mut cfg = HostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 32 << 20,
            bounce_bytes: 1 << 20,
            ..HostConfig::default()
        };
        cfg.device.idle_wait = Duration::from_millis(1);
        Dev::Net(Host::new(&cfg, pa).expect("host"), peer)
    };
    let mut cpu = d.cpu();
    let t = d.transport();
    let mem = d.mem().clone();
    let queues = d.queues();
    let layout = RingLayout::new(SIZE);
    let mut rings = vec![(0u64, 0u64, 0u16); queues];
    for r in &mut rings {
        let (phys, iova) = cpu.alloc_coherent(d.dev(), layout.bytes).expect("ring");
        *r = (phys, iova, 0);
    }
    let canary = mem.alloc_zeroed_frames(2).expect("canary");
    mem.fill(canary, 4 * 4096, CANARY).expect("fill");
    let mut bufs: Vec<Buf> = (0..BUFS)
        .map(|i| {
            let phys = mem.alloc_zeroed_frames(0).expect("buffer");
            mem.fill(phys, 4096, FILL).expect("fill");
            let dir = match i % 3 {
                0 => DmaDirection::ToDevice,
                1 => DmaDirection::FromDevice,
                _ => DmaDirection::Bidirectional,
            };
            let iova = cpu.map(d.dev(), phys, 4096, dir).expect("map");
            Buf {
                phys,
                iova,
                dir,
                live: true,
                bytes: vec![FILL; 4096],
            }
        })
        .collect();
    if !input.raw {
        init(&t, &rings, &layout, 0, 0);
    }
    for op in input.ops.into_iter().take(64) {
        match op {
            Op::Reg { offset, value } => t.write(u64::from(offset % 0x200), value),
            Op::Read { offset } => {
                let _ = t.read(u64::from(offset % 0x200));
            }
            Op::Init {
                features_hi,
                features_lo,
            } => init(&t, &rings, &layout, features_hi, features_lo),
            Op::Desc {
                q,
                i,
                addr,
                len,
                flags,
                next,
            } => {
                let a = match addr {
                    Addr::Buf { buf, off } => {
                        bufs[usize::from(buf) % BUFS].iova + u64::from(off % 4200)
                    }
                    Addr::Ring { q, off } => {
                        rings[usize::from(q) % queues].1 + u64::from(off) % layout.bytes
                    }
                    Addr::Raw(a) => a,
                };
                let mut d = [0u8; 16];
                d[..8].copy_from_slice(&a.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[12..14].copy_from_slice(&flags.to_le_bytes());
                d[14..].copy_from_slice(&next.to_le_bytes());
                let at = rings[usize::from(q) % queues].0 + 16 * u64::from(i % SIZE);
                mem.write(at, &d).expect("desc");
            }
            Op::Publish { q, head, idx_delta } => {
                let q = usize::from(q) % queues;
                let (phys, _, cur) = rings[q];
                let slot = phys + layout.avail + 4 + 2 * u64::from(cur % SIZE);
                mem.write(slot, &head.to_le_bytes()).expect("avail");
                std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
                let idx = cur.wrapping_add(u16::from(idx_delta));
                mem.write(phys + layout.avail + 2, &idx.to_le_bytes())
                    .expect("avail idx");
                rings[q].2 = idx;
                t.write(reg::QUEUE_NOTIFY, q as u32);
            }
            Op::Notify(v) => t.write(reg::QUEUE_NOTIFY, v),
            Op::Unmap(b) => {
                let b = &mut bufs[usize::from(b) % BUFS];
                if b.live {
                    cpu.unmap(d.dev(), b.iova, 4096, b.dir).expect("unmap");
                    b.live = false;
                    // From here on, no device write may reach it.
                    mem.fill(b.phys, 4096, CANARY).expect("fill");
                }
            }
            Op::Frame(n) => {
                if let Dev::Net(_, peer) = &mut d {
                    if let Some(mut s) = peer.tx.reserve() {
                        let n = usize::from(n) % s.buf().len().min(2048) + 1;
                        s.buf()[..n].fill(0x42);
                        s.commit(n);
                    }
                }
            }
            Op::Fill { buf, off, bytes } => {
                let b = &mut bufs[usize::from(buf) % BUFS];
                if b.live {
                    let off = usize::from(off) % (4096 - bytes.len());
                    mem.write(b.phys + off as u64, &bytes).expect("fill");
                    b.bytes[off..off + bytes.len()].copy_from_slice(&bytes);
                }
            }
            Op::Reset => t.write(reg::STATUS, 0),
        }
        if let Dev::Net(_, peer) = &mut d {
            while peer.rx.peek().is_ok() {
                peer.rx.consume();
            }
        }
    }
    // Let the device settle: both used indices caught up, or it asked for
    // a reset, or 100 ms passed.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(100) {
        if t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET != 0 {
            break;
        }
        let caught_up = rings.iter().all(|&(phys, _, cur)| {
            let mut b = [0u8; 2];
            mem.read(phys + layout.used + 2, &mut b).expect("used idx");
            u16::from_le_bytes(b) == cur
        });
        if caught_up {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Stop the device, then look at memory.
    t.write(reg::STATUS, 0);
    drop(cpu);
    drop(d);
    check(&mem, canary, 4 * 4096, CANARY, "a canary frame");
    for b in &bufs {
        if !b.live {
            check(&mem, b.phys, 4096, CANARY, "an unmapped buffer");
        } else if b.dir == DmaDirection::ToDevice {
            let mut now = vec![0u8; 4096];
            mem.read(b.phys, &mut now).expect("read back");
            assert!(now == b.bytes, "the device wrote a read-only buffer");
        }
    }
});

fn init(t: &MmioTransport, rings: &[(u64, u64, u16)], layout: &RingLayout, hi: u32, lo: u32) {
    t.write(reg::STATUS, 0);
    t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    let f = 1u64 << feature::VERSION_1 | 1 << feature::ACCESS_PLATFORM;
    t.write(reg::DRIVER_FEATURES_SEL, 0);
    t.write(reg::DRIVER_FEATURES, lo);
    t.write(reg::DRIVER_FEATURES_SEL, 1);
    t.write(reg::DRIVER_FEATURES, (f >> 32) as u32 | hi);
    t.write(
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
    for (q, &(_, iova, _)) in rings.iter().enumerate() {
        t.write(reg::QUEUE_SEL, q as u32);
        t.write(reg::QUEUE_NUM, u32::from(layout.size));
        for (lo, v) in [
            (reg::QUEUE_DESC_LOW, iova),
            (reg::QUEUE_DRIVER_LOW, iova + layout.avail),
            (reg::QUEUE_DEVICE_LOW, iova + layout.used),
        ] {
            t.write(lo, v as u32);
            t.write(lo + 4, (v >> 32) as u32);
        }
        t.write(reg::QUEUE_READY, 1);
    }
    t.write(
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
    );
}

fn check(mem: &Arc<PhysMemory>, at: PhysAddr, len: usize, byte: u8, what: &str) {
    let mut b = vec![0u8; len];
    mem.read(at, &mut b).expect("read back");
    if let Some(i) = b.iter().position(|&x| x != byte) {
        panic!(
            "the device wrote {what} at {:#x}: {:#x}",
            at + i as u64,
            b[i]
        );
    }
}
