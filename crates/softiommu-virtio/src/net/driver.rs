//! [`NetDriver`]: a virtio-net driver on softiommu's DMA API, used the way
//! Linux's `virtio_net` uses the kernel's:
//!
//! - the rings are coherent allocations (`dma_alloc_coherent`:
//!   [`DmaCpu::alloc_coherent`]), or, over another [`NetDma`] (a
//!   virtio-iommu's), frames mapped once with it;
//! - each transmit buffer is mapped `ToDevice` just before it is posted
//!   and unmapped when the device returns it (`dma_map_single` /
//!   `dma_unmap_single` in `start_xmit` and `free_old_xmit`);
//! - receive buffers are posted mapped `FromDevice` and unmapped when the
//!   device has filled them, then mapped again when re-posted;
//! - buffers live in [`PhysMemory`], the header (`virtio_net_hdr_v1`) in
//!   front of each frame in the same buffer (`VIRTIO_F_VERSION_1`'s
//!   "any layout", one descriptor per packet).
//!
//! It drives the device only through the register block ([`MmioTransport`])
//! and the rings: the initialisation of §3.1.1, feature negotiation,
//! queue setup of §4.2.3.2, `QueueNotify` when the device asks for it, and
//! `InterruptStatus` / `InterruptACK`.
//!
//! Its DMA API is a type parameter: [`BoundDma`] (the crate's DMA domain,
//! writing the unit's tables) by default, or any [`NetDma`] — e.g.
//! [`ViommuDma`](crate::viommu::ViommuDma), whose maps and unmaps are
//! virtio-iommu requests ([`NetDriver::probe_with`]).
//!
//! Nothing the device writes is trusted: a used id or length out of range
//! is a [`DriverError`], not an index.

use std::sync::Arc;
use std::time::Duration;

use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

use softiommu::dma::{BoundDma, DmaCpu, DmaDevice, DmaDirection, DmaError};
use softiommu::mem::{MemError, PhysAddr, PhysMemory, PAGE_SIZE};

use super::config::{MAC_OFFSET, MTU_OFFSET};
use super::dma::{NetDma, RingMemory};
use super::hdr::{self, HDR_LEN};
use crate::driver_init::{Init, InitError, Wanted};
use crate::spec::{self, feature, net, reg, status};
use crate::transport::{DeviceError, MmioTransport};
use crate::vring::{DriverRing, RingLayout};

/// How to set up a [`NetDriver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetDriverConfig {
    /// Entries per queue (a power of two; capped by `QueueNumMax`).
    pub queue_size: u16,
    /// The MTU to use (capped by the device's, if it offers one).
    pub mtu: u16,
}

impl Default for NetDriverConfig {
    fn default() -> Self {
        Self {
            queue_size: 256,
            mtu: 1500,
        }
    }
}

/// What went wrong in the driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The register block is not a virtio-mmio v2 network device.
    #[error(
        "not a virtio-mmio v2 network device (magic {magic:#x}, version {version}, id {device_id})"
    )]
    NotVirtioNet {
        /// `MagicValue`.
        magic: u32,
        /// `Version`.
        version: u32,
        /// `DeviceID`.
        device_id: u32,
    },
    /// The device did not keep `FEATURES_OK` (§3.1.1 step 6).
    #[error("the device refused features {wanted:#x} (offered {offered:#x})")]
    FeaturesRefused {
        /// What the device offered.
        offered: u64,
        /// What the driver asked for.
        wanted: u64,
    },
    /// A feature the driver cannot work without is not offered.
    #[error("the device does not offer {name}")]
    MissingFeature {
        /// The feature.
        name: &'static str,
    },
    /// A queue is missing or already live.
    #[error("queue {queue} is unavailable (QueueNumMax {max}, QueueReady {ready})")]
    QueueUnavailable {
        /// The queue.
        queue: u16,
        /// `QueueNumMax`.
        max: u32,
        /// `QueueReady`.
        ready: u32,
    },
    /// The DMA API refused.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// The DMA API over a virtio-iommu refused (a request failed, timed
    /// out, or the IOVA space is full).
    #[error(transparent)]
    Viommu(#[from] crate::viommu::ViommuDmaError),
    /// Memory for buffers could not be had.
    #[error(transparent)]
    Memory(#[from] MemError),
    /// A ring the driver could not make (a bad layout or DMA address, or
    /// its memory).
    #[error(transparent)]
    Ring(#[from] crate::vring::RingError),
    /// The device set `DEVICE_NEEDS_RESET` (or the driver `FAILED`); the
    /// first error it recorded says why.
    #[error("device needs reset (status {status:#x}){}", .first.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    DeviceNeedsReset {
        /// The status.
        status: u32,
        /// The device's first recorded error.
        first: Option<DeviceError>,
    },
    /// The device returned an id it was never given.
    #[error("queue {queue}: the device returned id {id}, which is not outstanding")]
    BadUsedId {
        /// The queue.
        queue: u16,
        /// The id.
        id: u32,
    },
    /// The device said it wrote more than the buffer holds, or less than a
    /// header.
    #[error("queue {queue}: the device returned id {id} with length {len} (buffer {max})")]
    BadUsedLength {
        /// The queue.
        queue: u16,
        /// The id.
        id: u32,
        /// The length.
        len: u32,
        /// The buffer's length.
        max: u32,
    },
}

impl From<InitError> for DriverError {
    fn from(e: InitError) -> Self {
        match e {
            InitError::NotTheDevice {
                magic,
                version,
                device_id,
            } => Self::NotVirtioNet {
                magic,
                version,
                device_id,
            },
            InitError::MissingFeature { name } => Self::MissingFeature { name },
            InitError::FeaturesRefused { offered, wanted } => {
                Self::FeaturesRefused { offered, wanted }
            }
            InitError::QueueUnavailable { queue, max, ready } => {
                Self::QueueUnavailable { queue, max, ready }
            }
        }
    }
}

/// The driver's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Frames posted for transmission.
    pub tx_packets: u64,
    /// Frames received.
    pub rx_packets: u64,
    /// Frames dropped because no transmit slot was free when a reply had
    /// to be sent with a received packet.
    pub tx_dropped: u64,
    /// Times the transmit ring was full when the stack wanted to send.
    pub tx_ring_full: u64,
    /// `QueueNotify` writes.
    pub kicks: u64,
    /// Times the driver slept waiting for an interrupt.
    pub waits: u64,
}

/// Buffers of one queue: `count` buffers of `len` bytes, back to back in
/// one physically contiguous block.
#[derive(Debug)]
struct Pool {
    base: PhysAddr,
    order: u32,
    len: u64,
}

impl Pool {
    fn new(mem: &PhysMemory, count: u16, len: u64) -> Result<Self, MemError> {
        let pages = (u64::from(count) * len).div_ceil(PAGE_SIZE).max(1);
        let order = pages.next_power_of_two().ilog2();
        Ok(Self {
            base: mem.alloc_zeroed_frames(order)?,
            order,
            len,
        })
    }

    fn phys(&self, id: u16) -> PhysAddr {
        self.base + u64::from(id) * self.len
    }
}

/// One queue: its ring and its buffers (`M`: the DMA API's mapping).
#[derive(Debug)]
struct Queue<M> {
    index: u16,
    ring: DriverRing,
    ring_mem: RingMemory<M>,
    pool: Pool,
    /// Per buffer: its mapping, while the device owns it.
    mapped: Vec<Option<M>>,
}

impl<M: Copy> Queue<M> {
    /// The next buffer the device returned, unmapped: `(id, len)`.
    fn take_used<D: NetDma<Mapping = M>>(
        &mut self,
        dma: &mut D,
    ) -> Result<Option<(u16, u32)>, DriverError> {
        let Some((id, len)) = self.ring.pop_used() else {
            return Ok(None);
        };
        let q = self.index;
        let slot = usize::try_from(id)
            .ok()
            .and_then(|i| self.mapped.get_mut(i))
            .and_then(Option::take)
            .ok_or(DriverError::BadUsedId { queue: q, id })?;
        dma.dma_unmap(slot).map_err(Into::into)?;
        Ok(Some((id as u16, len)))
    }
}

/// A virtio-net driver bound to one device, on DMA API `D` (see the
/// module). Use it from one thread (the one [`probe`](NetDriver::probe)
/// or [`probe_with`](Self::probe_with) ran on receives its interrupts).
#[derive(Debug)]
pub struct NetDriver<D: NetDma = BoundDma> {
    transport: MmioTransport,
    mem: Arc<PhysMemory>,
    dma: D,
    rx: Queue<D::Mapping>,
    tx: Queue<D::Mapping>,
    /// Receive buffers consumed by the stack, to post again.
    refill: Vec<u16>,
    /// Transmit buffers free to fill.
    free: Vec<u16>,
    /// Driver-owned bytes the stack writes a frame into before it is
    /// copied into a transmit buffer (or dropped when none is free);
    /// allocated once, at the largest buffer's size.
    scratch: Vec<u8>,
    /// Driver-owned bytes a received frame is copied into before the
    /// stack sees it; allocated once, at the largest buffer's size.
    rx_copy: Vec<u8>,
    mac: [u8; 6],
    mtu: u16,
    buf_len: u64,
    stats: DriverStats,
    /// An error met where it could not be returned (inside a smoltcp
    /// token); [`take_error`](Self::take_error) hands it out.
    error: Option<DriverError>,
    closed: bool,
    /// Frames the stack may still take in this poll (NAPI's budget): the
    /// application gets to read between batches, so one poll cannot fill
    /// a socket's buffer past what the application would have drained.
    rx_budget: usize,
}

/// Frames handed to the stack per poll (Linux's NAPI weight).
pub const RX_BUDGET: usize = 64;

impl NetDriver<BoundDma> {
    /// Initialises the device behind `transport` (§3.1.1) and posts every
    /// receive buffer. `cpu` and `dev` are the driver's handle on its DMA
    /// domain; the calling thread receives the device's interrupts.
    pub fn probe(
        transport: MmioTransport,
        cpu: DmaCpu,
        dev: DmaDevice,
        cfg: NetDriverConfig,
    ) -> Result<Self, DriverError> {
        let mem = dev.domain().system().memory().clone();
        Self::probe_with(transport, mem, BoundDma::new(cpu, dev), cfg)
    }

    /// The DMA handle (e.g. for its statistics).
    pub fn dma_cpu(&self) -> &DmaCpu {
        self.dma.cpu_ref()
    }
}

impl<D: NetDma> NetDriver<D> {
    /// As [`probe`](NetDriver::probe), on any DMA API: `dma` maps every
    /// buffer and makes the rings (from `mem`, the memory the buffers
    /// are allocated from) reachable by the device.
    pub fn probe_with(
        transport: MmioTransport,
        mem: Arc<PhysMemory>,
        dma: D,
        cfg: NetDriverConfig,
    ) -> Result<Self, DriverError> {
        let mut dma = dma;
        let init = Init::begin(
            &transport,
            &Wanted {
                device_id: net::DEVICE_ID,
                required: &[
                    (feature::VERSION_1, "VIRTIO_F_VERSION_1"),
                    (feature::ACCESS_PLATFORM, "VIRTIO_F_ACCESS_PLATFORM"),
                ],
                optional: 1 << feature::NET_MAC | 1 << feature::NET_MTU,
            },
        )?;
        let t = &transport;
        // 7. device-specific setup: the config space, then the queues (an
        // error drops `init`, which fails the device).
        let (mac, dev_mtu) = Self::read_config(t, init.features());
        let mtu = dev_mtu
            .map_or(cfg.mtu, |m| cfg.mtu.min(m))
            .max(net::MIN_MTU);
        // Buffers never straddle a page when they fit in one (half-page
        // buffers for MTU 1500, as Linux's page-split receive buffers);
        // larger ones start on a page.
        let need = (HDR_LEN + net::ETH_HLEN + usize::from(mtu)) as u64;
        let buf_len = if need <= PAGE_SIZE {
            need.next_power_of_two()
        } else {
            need.next_multiple_of(PAGE_SIZE)
        };
        let rx = Self::setup_queue(
            &init,
            &mem,
            &mut dma,
            net::RX_QUEUE,
            cfg.queue_size,
            buf_len,
        )?;
        let tx = match Self::setup_queue(
            &init,
            &mem,
            &mut dma,
            net::TX_QUEUE,
            cfg.queue_size,
            buf_len,
        ) {
            Ok(q) => q,
            Err(e) => {
                // The receive queue goes back (no buffer of it is mapped
                // yet), after a reset so that the device reaches its ring
                // no more; dropping `init` then writes FAILED.
                transport.write(reg::STATUS, 0);
                let _ = dma.ring_free(&mem, rx.ring_mem);
                let _ = mem.free_frames(rx.pool.base, rx.pool.order);
                return Err(e);
            }
        };
        init.driver_ok();
        transport.bind_interrupt(std::thread::current());
        let size = rx.ring.layout().size;
        let tx_size = tx.ring.layout().size;
        let mut d = Self {
            transport,
            mem,
            dma,
            rx,
            tx,
            refill: (0..size).collect(),
            free: (0..tx_size).rev().collect(),
            scratch: vec![0u8; buf_len as usize],
            rx_copy: vec![0u8; buf_len as usize],
            mac,
            mtu,
            buf_len,
            stats: DriverStats::default(),
            error: None,
            closed: false,
            rx_budget: RX_BUDGET,
        };
        d.rx.ring.set_interrupts(false);
        d.tx.ring.set_interrupts(false);
        d.refill_rx()?;
        d.check_device()?;
        Ok(d)
    }

    /// Reads the MAC and the MTU, retrying while `ConfigGeneration` moves
    /// (§4.2.2.2), a bounded number of times.
    fn read_config(t: &MmioTransport, features: u64) -> ([u8; 6], Option<u16>) {
        let mut mac = [0u8; 6];
        let mut mtu = None;
        for _ in 0..16 {
            let g0 = t.read(reg::CONFIG_GENERATION);
            if features & 1 << feature::NET_MAC != 0 {
                t.read_config(MAC_OFFSET as u64, &mut mac);
            } else {
                mac = [0x02, 0, 0, 0, 0, 0xfe];
            }
            if features & 1 << feature::NET_MTU != 0 {
                let mut m = [0u8; 2];
                t.read_config(MTU_OFFSET as u64, &mut m);
                mtu = Some(u16::from_le_bytes(m));
            }
            if t.read(reg::CONFIG_GENERATION) == g0 {
                break;
            }
        }
        (mac, mtu)
    }

    /// §4.2.3.2: select the queue, check it is free, size it, allocate
    /// and program its ring, mark it ready. On an error nothing of the
    /// queue is left allocated or mapped.
    fn setup_queue(
        init: &Init<'_>,
        mem: &Arc<PhysMemory>,
        dma: &mut D,
        index: u16,
        want: u16,
        buf_len: u64,
    ) -> Result<Queue<D::Mapping>, DriverError> {
        let size = init.queue_size(index, want, 1)?;
        let layout = RingLayout::new(size);
        let ring_mem = dma.ring_alloc(mem, layout.bytes)?;
        let made = DriverRing::new(mem.clone(), ring_mem.phys, ring_mem.dma, layout)
            .map_err(DriverError::from)
            .and_then(|ring| Ok((ring, Pool::new(mem, size, buf_len)?)));
        let (ring, pool) = match made {
            Ok(made) => made,
            Err(e) => {
                // The ring memory goes back (unmapped and flushed first).
                let _ = dma.ring_free(mem, ring_mem);
                return Err(e);
            }
        };
        init.program_queue(index, size, ring.device_addresses());
        Ok(Queue {
            index,
            ring,
            ring_mem,
            pool,
            mapped: vec![None; usize::from(size)],
        })
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The MTU in use.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// The largest frame (Ethernet header included) the driver sends.
    pub fn max_frame(&self) -> usize {
        net::ETH_HLEN + usize::from(self.mtu)
    }

    /// The counters.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// The register block.
    pub fn transport(&self) -> &MmioTransport {
        &self.transport
    }

    /// The DMA API the driver maps through (e.g. for its statistics).
    pub fn dma(&self) -> &D {
        &self.dma
    }

    /// Makes every unmap the driver has made take effect (the DMA API's
    /// flush: under a lazy or deferred policy the device may reach an
    /// unmapped buffer until then).
    pub fn flush_dma(&mut self) -> Result<(), DriverError> {
        self.dma.dma_flush().map_err(Into::into)
    }

    /// Where queue `queue`'s buffers lie ([`net::RX_QUEUE`] or
    /// [`net::TX_QUEUE`]): the physical address and length of the block
    /// holding all of them (`None` for another queue). In IOPF mode these
    /// are also the device's addresses (its domain is identity-mapped), so
    /// the range can be reclaimed from it.
    pub fn buffer_pool(&self, queue: u16) -> Option<(PhysAddr, u64)> {
        let pool = match queue {
            net::RX_QUEUE => &self.rx.pool,
            net::TX_QUEUE => &self.tx.pool,
            _ => return None,
        };
        Some((pool.base, PAGE_SIZE << pool.order))
    }

    /// Receive buffers posted and not yet returned.
    pub fn rx_posted(&self) -> u16 {
        self.rx.ring.outstanding()
    }

    /// Transmit buffers posted and not yet completed.
    pub fn tx_in_flight(&self) -> u16 {
        self.tx.ring.outstanding()
    }

    /// Gives the stack a fresh receive budget (64 frames, Linux's NAPI weight); the
    /// stack's poll calls it before each run.
    pub fn reset_rx_budget(&mut self) {
        self.rx_budget = RX_BUDGET;
    }

    /// The error a smoltcp token met, if any (it could not return it).
    pub fn take_error(&mut self) -> Option<DriverError> {
        self.error.take()
    }

    /// `Ok` while the device works; [`DriverError::DeviceNeedsReset`] with
    /// the device's first error once it has set `DEVICE_NEEDS_RESET`.
    pub fn check_device(&self) -> Result<(), DriverError> {
        let st = self.transport.status();
        if st & (status::DEVICE_NEEDS_RESET | status::FAILED) != 0 || st & status::DRIVER_OK == 0 {
            return Err(DriverError::DeviceNeedsReset {
                status: st,
                first: self.transport.errors().snapshot().into_iter().next(),
            });
        }
        Ok(())
    }

    fn kick_rx(&mut self) {
        if self.rx.ring.needs_kick() {
            self.transport
                .write(reg::QUEUE_NOTIFY, u32::from(net::RX_QUEUE));
            self.stats.kicks += 1;
        }
    }

    /// Maps and posts every receive buffer the stack has given back, then
    /// notifies the device once if it wants it.
    pub fn refill_rx(&mut self) -> Result<(), DriverError> {
        if self.refill.is_empty() {
            return Ok(());
        }
        let len = self.buf_len;
        while let Some(&id) = self.refill.last() {
            let phys = self.rx.pool.phys(id);
            let m = self
                .dma
                .dma_map(phys, len, DmaDirection::FromDevice)
                .map_err(Into::into)?;
            let iova = D::dma_addr(&m);
            self.refill.pop();
            self.rx.mapped[usize::from(id)] = Some(m);
            self.rx
                .ring
                .set_desc(id, iova, len as u32, spec::desc::F_WRITE, 0);
            self.rx.ring.push_avail(id);
        }
        self.rx.ring.publish();
        self.kick_rx();
        Ok(())
    }

    /// Unmaps the transmit buffers the device has finished with.
    pub fn reclaim_tx(&mut self) -> Result<usize, DriverError> {
        let mut n = 0;
        while let Some((id, _)) = self.tx.take_used(&mut self.dma)? {
            self.free.push(id);
            n += 1;
        }
        Ok(n)
    }

    /// Whether every transmit buffer is in flight (after reclaiming the
    /// completed ones): the stack can send nothing until the device
    /// completes some.
    pub fn tx_ring_full(&mut self) -> Result<bool, DriverError> {
        if self.free.is_empty() {
            self.reclaim_tx()?;
        }
        Ok(self.free.is_empty())
    }

    /// The next received frame, if any: its buffer is unmapped, the frame
    /// (header stripped) copied out into a driver-owned buffer and handed
    /// to `f` there (a device may still reach the DMA buffer), then the
    /// buffer is queued for re-posting.
    pub fn receive_with<R>(
        &mut self,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, DriverError> {
        let Some((id, len)) = self.next_rx()? else {
            return Ok(None);
        };
        let frame = rx_frame(&self.mem, &self.rx.pool, id, len, &mut self.rx_copy);
        let r = f(frame);
        self.refill.push(id);
        Ok(Some(r))
    }

    /// Takes the next used receive buffer: `(id, frame length)`.
    fn next_rx(&mut self) -> Result<Option<(u16, usize)>, DriverError> {
        let Some((id, len)) = self.rx.take_used(&mut self.dma)? else {
            return Ok(None);
        };
        if (len as usize) < HDR_LEN || u64::from(len) > self.buf_len {
            // The buffer is ours again; post it back.
            self.refill.push(id);
            return Err(DriverError::BadUsedLength {
                queue: net::RX_QUEUE,
                id: u32::from(id),
                len,
                max: self.buf_len as u32,
            });
        }
        self.stats.rx_packets += 1;
        Ok(Some((id, len as usize - HDR_LEN)))
    }

    /// Sends one frame of `len` bytes that `f` writes into a driver-owned
    /// buffer, then copied into a transmit buffer (after the header) with
    /// `PhysMemory::write`: `f` never holds a reference into memory a
    /// device can reach. Returns `false`, calling
    /// nothing, when every transmit buffer is in flight.
    pub fn transmit_with(
        &mut self,
        len: usize,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<bool, DriverError> {
        if self.free.is_empty() {
            self.reclaim_tx()?;
        }
        let Some(id) = self.free.pop() else {
            self.stats.tx_ring_full += 1;
            return Ok(false);
        };
        let len = len.min(self.max_frame()).min(self.scratch.len());
        f(&mut self.scratch[..len]);
        if let Err(e) = tx_fill(&self.mem, &self.tx.pool, id, &self.scratch[..len]) {
            self.free.push(id);
            return Err(e.into());
        }
        self.post_tx(id, len)?;
        Ok(true)
    }

    /// Maps transmit buffer `id` (header + `len` bytes of frame) and posts
    /// it.
    fn post_tx(&mut self, id: u16, len: usize) -> Result<(), DriverError> {
        self.tx_half().post(id, len)
    }

    /// Sleeps until the device interrupts or `timeout` passes: re-enables
    /// interrupts, re-checks the used rings (so an interrupt that came
    /// between the last look and now is not lost), parks, acknowledges
    /// `InterruptStatus`, then suppresses interrupts again (the driver polls
    /// while it has work). Returns the device's error if it needs a reset.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), DriverError> {
        self.rx.ring.set_interrupts(true);
        self.tx.ring.set_interrupts(true);
        let work = self.rx.ring.has_used() || self.tx.ring.has_used();
        if !work && self.check_device().is_ok() {
            self.stats.waits += 1;
            std::thread::park_timeout(timeout);
        }
        let isr = self.transport.read(reg::INTERRUPT_STATUS);
        if isr != 0 {
            self.transport.write(reg::INTERRUPT_ACK, isr);
        }
        self.rx.ring.set_interrupts(false);
        self.tx.ring.set_interrupts(false);
        self.check_device()
    }

    /// Unmaps one posted receive buffer while the device still owns it, as
    /// a buggy driver would (the fault-injection hook of the tests): with a
    /// strict policy the device can no longer reach it, and the frame that
    /// lands in it faults. Returns the buffer's former DMA address, its
    /// physical address and its length.
    pub fn revoke_posted_rx(&mut self) -> Result<Option<(u64, PhysAddr, u64)>, DriverError> {
        let found = self
            .rx
            .mapped
            .iter_mut()
            .enumerate()
            .find_map(|(i, m)| m.take().map(|v| (i, v)));
        let Some((i, m)) = found else {
            return Ok(None);
        };
        self.dma.dma_unmap(m).map_err(Into::into)?;
        Ok(Some((
            D::dma_addr(&m),
            self.rx.pool.phys(i as u16),
            self.buf_len,
        )))
    }

    /// Resets the device (which waits for its batch in flight), then unmaps
    /// every buffer and frees the rings and the buffers.
    pub fn shutdown(mut self) -> Result<(), DriverError> {
        self.close()
    }

    fn close(&mut self) -> Result<(), DriverError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.transport.write(reg::STATUS, 0);
        let mut first = Ok(());
        for q in [&mut self.rx, &mut self.tx] {
            for m in q.mapped.iter_mut() {
                if let Some(m) = m.take() {
                    if let Err(e) = self.dma.dma_unmap(m) {
                        first = first.and(Err(e.into()));
                    }
                }
            }
            // Unmaps, flushes, frees (a coherent ring: frees).
            if let Err(e) = self.dma.ring_free(&self.mem, q.ring_mem) {
                first = first.and(Err(e));
            }
            if let Err(e) = self.mem.free_frames(q.pool.base, q.pool.order) {
                first = first.and(Err(e.into()));
            }
        }
        first
    }
}

impl<D: NetDma> Drop for NetDriver<D> {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Copies the frame in receive buffer `id` (after its header) into
/// `copy`, driver-owned, and returns it there.
///
/// The buffer is unmapped, but a device may still reach it (always under
/// pass-through, until the flush under deferred): a reference into it
/// would be raced by the device's writes, so the stack never gets one.
/// `PhysMemory::read` copies with relaxed atomic loads, which a device's
/// concurrent writes cannot turn into a data race. A frame that does not
/// lie in the arena or fit `copy` reads as empty.
fn rx_frame<'c>(
    mem: &PhysMemory,
    pool: &Pool,
    id: u16,
    len: usize,
    copy: &'c mut [u8],
) -> &'c [u8] {
    let at = pool.phys(id) + HDR_LEN as u64;
    let Some(dst) = copy.get_mut(..len) else {
        return &[];
    };
    match mem.read(at, dst) {
        Ok(()) => dst,
        Err(_) => &[],
    }
}

/// Copies `frame` into transmit buffer `id` (after its header).
///
/// The stack built `frame` in driver-owned memory; the copy into the DMA
/// buffer is `PhysMemory::write` (relaxed atomic stores), so a device that
/// reaches the buffer while it is being filled (a hostile one under
/// pass-through) races no plain store.
fn tx_fill(mem: &PhysMemory, pool: &Pool, id: u16, frame: &[u8]) -> Result<(), MemError> {
    mem.write(pool.phys(id) + HDR_LEN as u64, frame)
}

// smoltcp's `phy::Device` over the driver.

/// A received frame, lent to the stack.
#[derive(Debug)]
pub struct NetRxToken<'a> {
    mem: &'a PhysMemory,
    pool: &'a Pool,
    copy: &'a mut Vec<u8>,
    refill: &'a mut Vec<u16>,
    id: u16,
    len: usize,
}

/// Room to send one frame.
#[derive(Debug)]
pub struct NetTxToken<'a, D: NetDma = BoundDma> {
    drv: TxHalf<'a, D>,
}

/// What a transmit token needs of the driver.
#[derive(Debug)]
struct TxHalf<'a, D: NetDma> {
    transport: &'a MmioTransport,
    mem: &'a PhysMemory,
    dma: &'a mut D,
    tx: &'a mut Queue<D::Mapping>,
    free: &'a mut Vec<u16>,
    scratch: &'a mut Vec<u8>,
    stats: &'a mut DriverStats,
    error: &'a mut Option<DriverError>,
    max_frame: usize,
}

impl phy::RxToken for NetRxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        let r = f(rx_frame(self.mem, self.pool, self.id, self.len, self.copy));
        self.refill.push(self.id);
        r
    }
}

impl<D: NetDma> TxHalf<'_, D> {
    fn post(&mut self, id: u16, len: usize) -> Result<(), DriverError> {
        let phys = self.tx.pool.phys(id);
        self.mem.write(phys, &hdr::plain(false))?;
        let total = (HDR_LEN + len) as u64;
        let m = match self.dma.dma_map(phys, total, DmaDirection::ToDevice) {
            Ok(m) => m,
            Err(e) => {
                self.free.push(id);
                return Err(e.into());
            }
        };
        let iova = D::dma_addr(&m);
        self.tx.mapped[usize::from(id)] = Some(m);
        self.tx.ring.set_desc(id, iova, total as u32, 0, 0);
        self.tx.ring.push_avail(id);
        self.tx.ring.publish();
        self.stats.tx_packets += 1;
        if self.tx.ring.needs_kick() {
            self.transport
                .write(reg::QUEUE_NOTIFY, u32::from(net::TX_QUEUE));
            self.stats.kicks += 1;
        }
        Ok(())
    }
}

impl<D: NetDma> phy::TxToken for NetTxToken<'_, D> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let mut d = self.drv;
        let slot = if len <= d.max_frame && len <= d.scratch.len() {
            d.free.pop()
        } else {
            None
        };
        let Some(id) = slot else {
            // No room (or a frame past the MTU): the stack's frame is
            // built and dropped, as a full NIC queue drops.
            d.stats.tx_dropped += 1;
            if len <= d.scratch.len() {
                return f(&mut d.scratch[..len]);
            }
            return f(&mut vec![0u8; len]);
        };
        // The stack writes driver-owned bytes; only the finished frame is
        // copied into the DMA buffer.
        let r = f(&mut d.scratch[..len]);
        if let Err(e) = tx_fill(d.mem, &d.tx.pool, id, &d.scratch[..len]) {
            d.free.push(id);
            *d.error = Some(e.into());
            d.stats.tx_dropped += 1;
            return r;
        }
        if let Err(e) = d.post(id, len) {
            *d.error = Some(e);
        }
        r
    }
}

impl<D: NetDma> NetDriver<D> {
    fn tx_half(&mut self) -> TxHalf<'_, D> {
        let max_frame = self.max_frame();
        TxHalf {
            transport: &self.transport,
            mem: &self.mem,
            dma: &mut self.dma,
            tx: &mut self.tx,
            free: &mut self.free,
            scratch: &mut self.scratch,
            stats: &mut self.stats,
            error: &mut self.error,
            max_frame,
        }
    }

    /// Reposts receive buffers and reclaims transmit buffers, keeping
    /// the first error for [`take_error`](NetDriver::take_error).
    fn service(&mut self) {
        let r = self.refill_rx().and_then(|_| self.reclaim_tx().map(|_| ()));
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }
}

impl<D: NetDma> phy::Device for NetDriver<D> {
    type RxToken<'a>
        = NetRxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = NetTxToken<'a, D>
    where
        Self: 'a;

    fn receive(&mut self, _timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        if self.rx_budget == 0 {
            return None;
        }
        self.rx_budget -= 1;
        self.service();
        let (id, len) = match self.next_rx() {
            Ok(Some(x)) => x,
            Ok(None) => return None,
            Err(e) => {
                self.error.get_or_insert(e);
                return None;
            }
        };
        let max_frame = self.max_frame();
        let rx = NetRxToken {
            mem: &self.mem,
            pool: &self.rx.pool,
            copy: &mut self.rx_copy,
            refill: &mut self.refill,
            id,
            len,
        };
        let tx = NetTxToken {
            drv: TxHalf {
                transport: &self.transport,
                mem: &self.mem,
                dma: &mut self.dma,
                tx: &mut self.tx,
                free: &mut self.free,
                scratch: &mut self.scratch,
                stats: &mut self.stats,
                error: &mut self.error,
                max_frame,
            },
        };
        Some((rx, tx))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<Self::TxToken<'_>> {
        if self.free.is_empty() {
            if let Err(e) = self.reclaim_tx() {
                self.error.get_or_insert(e);
                return None;
            }
            if self.free.is_empty() {
                self.stats.tx_ring_full += 1;
                return None;
            }
        }
        Some(NetTxToken {
            drv: self.tx_half(),
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        // For Ethernet, smoltcp's MTU includes the Ethernet header.
        caps.max_transmission_unit = self.max_frame();
        caps
    }
}
