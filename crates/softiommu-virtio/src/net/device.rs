//! [`NetDevice`]: a virtio-net device model on a thread of its own, like
//! the NIC it stands for. It transmits the frames of transmitq1 onto its
//! wire port and delivers the wire's frames into the buffers of
//! receiveq1, every ring access through `vm_memory::IommuMemory` over the
//! IOMMU unit and every buffer copy through a softiommu `DmaAccessor`
//! ordered by the [`DmaAttrs`] chosen.
//!
//! # The loop
//!
//! Each turn takes the queues' lock once and does one bounded batch per
//! queue ([`NetDeviceConfig::batch`] chains at most): pop a chain, walk it
//! (at most queue-size descriptors), copy, return it on the used ring;
//! then one interrupt per queue if the driver wants it. The batch runs
//! inside one translation section, except in IOPF mode (the device's
//! misses raise page requests: see [`crate::iopf_mode`]), where each
//! access translates in a section of its own so that one that faults can
//! wait for its page request's answer. While it finds
//! work the device polls with driver notifications suppressed
//! (`VIRTQ_USED_F_NO_NOTIFY`, §2.7.10); when idle it re-enables them,
//! looks once more, and parks until a `QueueNotify`, a frame from the
//! wire, the line becoming free, or a timeout.
//!
//! # Faults
//!
//! A DMA the IOMMU refuses (an unmapped or read-only buffer, a revoked
//! ring) is in the unit's fault log; the device records a
//! [`DeviceError::DmaFault`], stops the queue and sets
//! `DEVICE_NEEDS_RESET`. In IOPF mode a miss first raises a page request;
//! only one answered `Invalid` (an address outside the domain's regions)
//! fails the access that way. A failed access moves no byte (the accessor
//! translates a whole access before copying), so the device never
//! touches memory outside a live mapping.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softiommu::access::DmaAttrs;
use softiommu::hw::{HwError, SourceId, System};

use super::config::NetConfig;
use super::frame::{gather_frame, scatter_frame, FrameFault};
use super::hdr::{self, HDR_LEN};
use super::wire::WirePort;
use crate::device_dma::DeviceDma;
use crate::device_thread::{DeviceThreads, Lifecycle, Started};
use crate::dma_side::{DmaFence, DmaSide, UnitAttachError, UnitSide};
use crate::spec::{feature, net};
use crate::transport::{
    ChainDesc, ChainDir, DeviceEnd, DeviceError, DeviceQueue, MmioTransport, RingMemory,
    TransportConfig,
};

/// How to build a [`NetDevice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetDeviceConfig {
    /// MAC, MTU, queue size.
    pub net: NetConfig,
    /// Transport policy.
    pub transport: TransportConfig,
    /// How buffer copies are ordered (seed `001`).
    pub attrs: DmaAttrs,
    /// Chains per queue per batch (at least 1).
    pub batch: usize,
    /// The longest the idle device sleeps before looking again.
    pub idle_wait: Duration,
    /// The CPU the device thread pins itself to (`None`: wherever the
    /// scheduler puts it). A CPU the kernel refuses is ignored.
    pub cpu: Option<usize>,
}

impl Default for NetDeviceConfig {
    fn default() -> Self {
        Self {
            net: NetConfig::default(),
            transport: TransportConfig::default(),
            attrs: DmaAttrs::ORDERED,
            batch: 64,
            idle_wait: Duration::from_millis(20),
            cpu: None,
        }
    }
}

/// Why a device could not start or stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetDeviceError {
    /// The device's source id has no unit, or its translator could not be
    /// made.
    #[error("device {sid}: {source}")]
    Setup {
        /// The device.
        sid: SourceId,
        /// What the unit said.
        source: HwError,
    },
    /// The OS would not start the thread.
    #[error("cannot start the device thread: {reason}")]
    Spawn {
        /// The OS error.
        reason: String,
    },
    /// The thread did not answer within the timeout.
    #[error("the device thread did not {what} within {secs} s")]
    Timeout {
        /// "start" or "stop".
        what: &'static str,
        /// The timeout.
        secs: u64,
    },
    /// The thread panicked (a bug, never a driver's doing).
    #[error("the device thread panicked")]
    Panicked,
    /// The wire's frame slots are shorter than the largest frame the
    /// device's MTU lets a driver send: a configuration that could not
    /// carry what the device announces, refused before the thread starts.
    #[error("the device's largest frame is {max_frame} bytes but the wire's slots hold {slot}")]
    WireSlotTooSmall {
        /// The device's largest frame (Ethernet header + MTU).
        max_frame: usize,
        /// Bytes a wire slot holds.
        slot: usize,
    },
    /// A configuration field out of its range, refused before the thread
    /// starts: `queue_max` not a power of two in 2..=32768 (§2.7: a split
    /// ring's size; 0 reads as "no queue", and a driver sizes its rings by
    /// it), `idle_wait` zero (the idle thread would spin).
    #[error("net device configuration: {field} = {value} ({want})")]
    BadConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What it must be.
        want: &'static str,
    },
}

/// A device's counters (one writer: the device thread).
#[derive(Debug, Default)]
struct Counters {
    tx_frames: AtomicU64,
    rx_frames: AtomicU64,
    tx_dropped: AtomicU64,
    tx_oversize_drops: AtomicU64,
    rx_oversize_drops: AtomicU64,
    rx_runt_drops: AtomicU64,
    batches: AtomicU64,
    sleeps: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// A snapshot of a device's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetDeviceStats {
    /// Frames taken from transmitq1 and put on the wire (or dropped there).
    pub tx_frames: u64,
    /// Frames delivered into receiveq1.
    pub rx_frames: u64,
    /// Transmitted frames the wire dropped (its queue was full).
    pub tx_dropped: u64,
    /// Transmitted frames the driver may send but longer than a wire slot
    /// (spawn checks the slots hold the device's MTU frame; a tagged or,
    /// from a driver told no MTU, a longer one may not fit), dropped
    /// unread.
    pub tx_oversize_drops: u64,
    /// Frames from the wire that could not be delivered and were dropped,
    /// the driver's buffers untouched and the queue going on: longer than
    /// the device's largest frame (§5.1.6.4.1: the device passes no
    /// packet past the MTU), or longer than the receive chain offered
    /// (any chain that holds at least the virtio-net header; the chain is
    /// given back unwritten for the next frame).
    pub rx_oversize_drops: u64,
    /// Frames from the wire shorter than an Ethernet header (14 bytes):
    /// not frames, dropped before any buffer is taken, as a NIC's MAC
    /// drops runts; the queue goes on.
    pub rx_runt_drops: u64,
    /// Turns of the loop that did work.
    pub batches: u64,
    /// Times the device parked for want of work.
    pub sleeps: u64,
}

/// A running virtio-net device.
#[derive(Debug)]
pub struct NetDevice {
    transport: MmioTransport,
    thread: DeviceThreads<NetDeviceError>,
    counters: Arc<Counters>,
}

/// A side whose threads always attach (a front-end's IOTLB).
impl From<std::convert::Infallible> for NetDeviceError {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

impl From<UnitAttachError> for NetDeviceError {
    fn from(e: UnitAttachError) -> Self {
        NetDeviceError::Setup {
            sid: e.sid,
            source: e.source,
        }
    }
}

impl NetDevice {
    /// Starts a device `sid` of `system` on its own thread, on wire port
    /// `port`, its DMA through the unit `sid` is attached to (copies
    /// ordered by `cfg.attrs`): [`spawn_on`](Self::spawn_on) a
    /// [`UnitSide`]. Returns once the thread has made its translators.
    pub fn spawn(
        cfg: NetDeviceConfig,
        system: Arc<System>,
        sid: SourceId,
        port: WirePort,
    ) -> Result<Self, NetDeviceError> {
        Self::spawn_on(cfg, UnitSide::new(system, sid, cfg.attrs), port)
    }

    /// Starts the device on its own thread, on wire port `port`, with its
    /// DMA translated where `side` says (the thread attaches to it on
    /// itself; `cfg.attrs` is the unit side's). Returns once the thread
    /// has attached. Refused ([`NetDeviceError::WireSlotTooSmall`]) when
    /// the wire's slots cannot hold the device's largest frame.
    pub fn spawn_on<S: DmaSide>(
        cfg: NetDeviceConfig,
        side: S,
        port: WirePort,
    ) -> Result<Self, NetDeviceError>
    where
        NetDeviceError: From<S::Error>,
    {
        let q = cfg.net.queue_max;
        if !(2..=32768).contains(&q) || !q.is_power_of_two() {
            return Err(NetDeviceError::BadConfig {
                field: "queue_max",
                value: q.into(),
                want: "a power of two in 2..=32768",
            });
        }
        if cfg.idle_wait.is_zero() {
            return Err(NetDeviceError::BadConfig {
                field: "idle_wait",
                value: 0,
                want: "more than 0",
            });
        }
        let (max_frame, slot) = (cfg.net.max_frame(), port.tx.max_frame());
        if slot < max_frame {
            return Err(NetDeviceError::WireSlotTooSmall { max_frame, slot });
        }
        Self::start(cfg, side, port)
    }

    /// [`spawn_on`](Self::spawn_on) without the wire check.
    fn start<S: DmaSide>(
        cfg: NetDeviceConfig,
        side: S,
        port: WirePort,
    ) -> Result<Self, NetDeviceError>
    where
        NetDeviceError: From<S::Error>,
    {
        let name = format!("virtio-net {}", side.name());
        let transport = MmioTransport::new(cfg.net.device_info(), cfg.transport);
        let end = DeviceEnd::new(&transport);
        let counters = Arc::new(Counters::default());
        let counters2 = counters.clone();
        let idle_wait = cfg.idle_wait;
        let setup = move || {
            crate::device_thread::pin(cfg.cpu);
            let worker = Worker::<S>::new(&cfg, &side, port, counters2)?;
            end.register_thread();
            worker.port.rx.register_receiver();
            Ok((worker, end))
        };
        let mut dev = Self {
            transport,
            thread: DeviceThreads::new(),
            counters,
        };
        dev.thread.spawn(name, setup, move |(worker, end), stop| {
            worker.run(&end, stop, idle_wait)
        })?;
        dev.thread.started().map_err(Started::into_error)?;
        Ok(dev)
    }

    /// The register block a driver programs.
    pub fn transport(&self) -> &MmioTransport {
        &self.transport
    }

    /// CPU time the device thread has used so far.
    pub fn cpu_time(&self) -> Duration {
        self.thread.cpu_time()
    }

    /// The counters.
    pub fn stats(&self) -> NetDeviceStats {
        let c = &*self.counters;
        NetDeviceStats {
            tx_frames: c.tx_frames.load(Ordering::Relaxed),
            rx_frames: c.rx_frames.load(Ordering::Relaxed),
            tx_dropped: c.tx_dropped.load(Ordering::Relaxed),
            tx_oversize_drops: c.tx_oversize_drops.load(Ordering::Relaxed),
            rx_oversize_drops: c.rx_oversize_drops.load(Ordering::Relaxed),
            rx_runt_drops: c.rx_runt_drops.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            sleeps: c.sleeps.load(Ordering::Relaxed),
        }
    }

    /// Stops the thread (within its current batch) and returns its CPU
    /// time.
    pub fn stop(mut self) -> Result<Duration, NetDeviceError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<Duration, NetDeviceError> {
        Ok(self.thread.stop()?)
    }
}

impl From<Lifecycle> for NetDeviceError {
    fn from(l: Lifecycle) -> Self {
        match l {
            Lifecycle::Spawn { reason, .. } => NetDeviceError::Spawn { reason },
            Lifecycle::Timeout { what, secs } => NetDeviceError::Timeout { what, secs },
            Lifecycle::Panicked => NetDeviceError::Panicked,
        }
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// What one batch of a queue did.
#[derive(Debug, Default, Clone, Copy)]
struct Batch {
    /// Chains used.
    used: usize,
    /// Stopped at the batch limit with more to do.
    more: bool,
    /// Work is waiting on time (the line busy, a frame still arriving).
    wait: Option<Duration>,
    /// Frames wait but the driver gave no buffers.
    starved: bool,
}

/// The device thread's state.
struct Worker<S: DmaSide> {
    /// What the rings are reached through.
    ring: S::Ring,
    /// How a turn is held against invalidations.
    fence: S::Fence,
    /// What buffers move through.
    dma: S::Dma,
    port: WirePort,
    chain: Vec<ChainDesc>,
    scratch: Vec<u8>,
    max_frame: usize,
    batch: usize,
    counters: Arc<Counters>,
    /// Whether transmitq1's notifications are enabled (the device idle).
    tx_notify: bool,
    /// Whether receiveq1's notifications are enabled (the device starved).
    rx_notify: bool,
}

impl<S: DmaSide> Worker<S> {
    fn new(
        cfg: &NetDeviceConfig,
        side: &S,
        port: WirePort,
        counters: Arc<Counters>,
    ) -> Result<Self, NetDeviceError>
    where
        NetDeviceError: From<S::Error>,
    {
        let a = side.attach()?;
        let max_frame = cfg.net.max_frame();
        // A frame the wire's slots cannot carry is dropped before it is
        // read, so the scratch holds the longest a slot can.
        let scratch = vec![0u8; port.tx.max_frame()];
        Ok(Self {
            ring: a.ring,
            fence: a.fence,
            dma: a.dma,
            port,
            chain: Vec::with_capacity(usize::from(cfg.net.queue_max)),
            scratch,
            max_frame,
            batch: cfg.batch.max(1),
            counters,
            tx_notify: true,
            rx_notify: true,
        })
    }

    fn run(mut self, end: &DeviceEnd, stop: &AtomicBool, idle_wait: Duration) {
        let view = self.fence.clone();
        while !stop.load(Ordering::Acquire) {
            let _ = end.take_notified();
            // One batch per queue, inside one translation section: every
            // ring and buffer access of the batch completes before a
            // driver's invalidation wait does (an unmapped buffer is never
            // written after its unmap returns).
            let batch = |w: &mut Self| {
                let tx = w.tx_batch(end);
                let rx = w.rx_batch(end);
                (tx, rx)
            };
            let (tx, rx) = if view.may_fault() {
                // IOPF mode: no section spans the batch, so that each
                // access that faults can wait for its page request's
                // answer (every access still translates in a section of
                // its own).
                batch(&mut self)
            } else {
                view.section(|| batch(&mut self))
            };
            if tx.used + rx.used > 0 {
                bump(&self.counters.batches, 1);
            }
            // The used rings' flags are written, and the avail indices
            // read, inside a section as the batch's accesses are: an
            // unmap of a ring that completes has no such write still to
            // land (vm-memory translates, then copies).
            let notify = |w: &mut Self, tx_on: bool, rx_on: bool| {
                if view.may_fault() {
                    w.set_notify(end, tx_on, rx_on)
                } else {
                    view.section(|| w.set_notify(end, tx_on, rx_on))
                }
            };
            if tx.more || rx.more || (tx.used + rx.used > 0 && !rx.starved) {
                // Busy: poll, with the driver's kicks suppressed.
                notify(&mut self, false, rx.starved);
                continue;
            }
            // Idle (or waiting on time or buffers): ask to be notified,
            // look once more, then sleep.
            let (tx_more, rx_more) = notify(&mut self, true, rx.starved);
            if (tx_more && tx.wait.is_none()) || rx_more {
                continue;
            }
            let mut wait = idle_wait;
            for w in [tx.wait, rx.wait].into_iter().flatten() {
                wait = wait.min(w);
            }
            bump(&self.counters.sleeps, 1);
            std::thread::park_timeout(wait);
        }
    }

    /// Sets transmitq1's notifications to `tx_on` and receiveq1's to
    /// `rx_on`; returns whether chains wait on each queue whose
    /// notifications it enabled (so the device should look again rather
    /// than sleep).
    fn set_notify(&mut self, end: &DeviceEnd, tx_on: bool, rx_on: bool) -> (bool, bool) {
        if tx_on == self.tx_notify && rx_on == self.rx_notify && !tx_on && !rx_on {
            return (false, false);
        }
        let mut more = [false; 2];
        for (k, qi, on, cur) in [
            (0, net::TX_QUEUE, tx_on, &mut self.tx_notify),
            (1, net::RX_QUEUE, rx_on, &mut self.rx_notify),
        ] {
            let Some(mut slot) = end.queue(qi) else {
                continue;
            };
            let Some(q) = slot.as_mut() else {
                continue;
            };
            let r = if on {
                q.enable_notification(&self.ring).map(|pending| {
                    more[k] = pending;
                })
            } else if *cur {
                q.disable_notification(&self.ring)
            } else {
                Ok(())
            };
            match r {
                Ok(()) => *cur = on,
                Err(e) => fail(end, q, e),
            }
        }
        (more[0], more[1])
    }

    fn tx_batch(&mut self, end: &DeviceEnd) -> Batch {
        let mut b = Batch::default();
        let Some(mut slot) = end.queue(net::TX_QUEUE) else {
            return b;
        };
        let Some(q) = slot.as_mut() else {
            return b;
        };
        let tx_max = tx_max_frame(self.max_frame, end.features());
        for i in 0..=self.batch {
            if let Some(w) = self.port.tx.busy_until() {
                b.wait = Some(w);
                break;
            }
            if i == self.batch {
                b.more = q.known_pending();
                break;
            }
            let head = match q.pop(&self.ring) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    fail(end, q, e);
                    break;
                }
            };
            match transmit(self, q, head, tx_max) {
                Ok(()) => b.used += 1,
                Err(e) => {
                    fail(end, q, e);
                    break;
                }
            }
        }
        bump(&self.counters.tx_frames, b.used as u64);
        interrupt(end, q, &self.ring, b.used);
        b
    }

    fn rx_batch(&mut self, end: &DeviceEnd) -> Batch {
        let mut b = Batch::default();
        let (mut dropped, mut runts) = (0u64, 0u64);
        let mut slot = end.queue(net::RX_QUEUE);
        let Some(q) = slot.as_mut().and_then(|s| s.as_mut()) else {
            // Not live: frames wait on the wire (and drop there when it
            // fills); the driver's DRIVER_OK or QueueReady wakes us.
            b.starved = self.port.rx.pending();
            return b;
        };
        for i in 0..=self.batch {
            let frame = match self.port.rx.peek() {
                Ok(f) => f,
                Err(wait) => {
                    b.wait = wait;
                    break;
                }
            };
            if i == self.batch {
                b.more = true;
                break;
            }
            if frame.len() > self.max_frame + net::TAGS_HLEN {
                // §5.1.6.4.1: no packet past the MTU (plus the link-level
                // header, up to two VLAN tags counted in it, as on
                // transmit) reaches the driver. The link partner's doing,
                // not the driver's: dropped before any buffer is taken.
                self.port.rx.consume();
                dropped += 1;
                continue;
            }
            if frame.len() < net::ETH_HLEN {
                // Shorter than its own header: the link partner's doing,
                // dropped before any buffer is taken.
                self.port.rx.consume();
                runts += 1;
                continue;
            }
            let head = match q.pop(&self.ring) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    b.starved = true;
                    break;
                }
                Err(e) => {
                    fail(end, q, e);
                    break;
                }
            };
            let r = receive(&self.ring, &mut self.dma, &mut self.chain, q, head, frame);
            self.port.rx.consume();
            match r {
                Ok(Received::Delivered) => b.used += 1,
                Ok(Received::NoRoom) => {
                    // Nothing was written: the chain goes back for the
                    // next frame (refused only without the pop above,
                    // which would be this device's own mistake).
                    dropped += 1;
                    if let Err(e) = q.unpop() {
                        fail(end, q, e);
                        break;
                    }
                }
                Err(e) => {
                    fail(end, q, e);
                    break;
                }
            }
        }
        bump(&self.counters.rx_frames, b.used as u64);
        bump(&self.counters.rx_oversize_drops, dropped);
        bump(&self.counters.rx_runt_drops, runts);
        interrupt(end, q, &self.ring, b.used);
        b
    }
}

/// Records `e`, stops the queue and asks for a reset.
fn fail(end: &DeviceEnd, q: &mut DeviceQueue, e: DeviceError) {
    q.stop();
    end.report(e);
}

/// One interrupt for a batch, if anything was used and the driver wants
/// it.
fn interrupt<M: RingMemory>(end: &DeviceEnd, q: &mut DeviceQueue, mem: &M, used: usize) {
    if used == 0 {
        return;
    }
    if q.is_stopped() {
        // A chain later in the batch stopped the queue: the ones used
        // before it are announced all the same (a driver reads its used
        // ring on the used-buffer interrupt, Linux's `vm_interrupt` only
        // when that bit is set; the configuration-change interrupt alone
        // left them unseen). The driver's flag that could suppress it is
        // a hint, and may be what faulted.
        end.used_interrupt();
        return;
    }
    match q.interrupt_wanted(mem) {
        Ok(true) => end.used_interrupt(),
        Ok(false) => {}
        Err(e) => fail(end, q, e),
    }
}

fn dma_fault<F: std::error::Error>(queue: u16, e: FrameFault<F>) -> DeviceError {
    DeviceError::DmaFault {
        queue,
        what: "buffer",
        iova: e.iova,
        access: e.access,
        reason: e.fault.to_string(),
    }
}

/// The longest frame a driver with `features` may transmit without
/// breaking its contract. Once `VIRTIO_NET_F_MTU` is negotiated the
/// driver sends no more than `mtu` plus the link-level header (§5.1.4.2),
/// VLAN tags counted in that header (a VLAN on top of the interface sends
/// `mtu` + 18 bytes, a VLAN on a VLAN `mtu` + 22, as Linux does): the
/// device's `max_frame` + two tags. A driver that did not negotiate it was
/// told no MTU (Linux then allows an MTU up to 65,535) and may send up to
/// an IP packet's 16-bit length behind a doubly tagged header. A frame
/// within the bound that the wire's slots cannot carry is dropped and
/// counted (`tx_oversize_drops`), never a driver error, as a NIC counts
/// the giants it cannot forward; past it the chain is the driver's error.
pub(crate) fn tx_max_frame(max_frame: usize, features: u64) -> usize {
    if features & 1 << feature::NET_MTU != 0 {
        max_frame + net::TAGS_HLEN
    } else {
        max_frame.max(net::NO_MTU_MAX_FRAME)
    }
}

/// Transmits the chain at `head`: walk, check (at most `tx_max` frame
/// bytes), copy onto the wire (or drop when the wire is full), return it
/// used.
fn transmit<S: DmaSide>(
    w: &mut Worker<S>,
    q: &mut DeviceQueue,
    head: u16,
    tx_max: usize,
) -> Result<(), DeviceError> {
    let queue = q.index();
    let total = q.walk(&w.ring, head, ChainDir::Readable, &mut w.chain)?;
    let (min, max) = ((HDR_LEN + net::ETH_HLEN) as u64, (HDR_LEN + tx_max) as u64);
    if total < min || total > max {
        return Err(DeviceError::ChainLength {
            queue,
            head,
            len: total,
            min,
            max,
        });
    }
    let frame_len = total as usize - HDR_LEN;
    let mut h = [0u8; HDR_LEN];
    let check = |h: &[u8; HDR_LEN]| {
        let (flags, gso_type) = hdr::offloads(h);
        if flags != 0 || gso_type != net::GSO_NONE {
            Err(DeviceError::HeaderOffload {
                queue,
                head,
                flags,
                gso_type,
            })
        } else {
            Ok(())
        }
    };
    if frame_len > w.port.tx.max_frame() {
        // Longer than a wire slot (a driver told no MTU, or tags past
        // the slot): dropped unread, never copied past the slot nor cut.
        bump(&w.counters.tx_oversize_drops, 1);
        return q.add_used(&w.ring, head, 0);
    }
    match w.port.tx.reserve() {
        Some(mut slot) => match slot.buf().get_mut(..frame_len) {
            Some(buf) => {
                gather_frame(&mut w.dma, &w.chain, &mut h, buf).map_err(|e| dma_fault(queue, e))?;
                check(&h)?;
                slot.commit(frame_len);
            }
            // A slot shorter than the wire says: as above.
            None => bump(&w.counters.tx_oversize_drops, 1),
        },
        None => {
            // The wire's queue is full: the frame is read (a NIC fetches
            // before it learns the port is congested) and dropped. The
            // scratch buffer holds the longest slot, so this frame
            // (checked above to fit one).
            let n = frame_len.min(w.scratch.len());
            gather_frame(&mut w.dma, &w.chain, &mut h, &mut w.scratch[..n])
                .map_err(|e| dma_fault(queue, e))?;
            check(&h)?;
            w.port.tx.drop_frame();
            bump(&w.counters.tx_dropped, 1);
        }
    }
    q.add_used(&w.ring, head, 0)
}

/// What became of a frame offered to a receive chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Received {
    /// Written and returned on the used ring.
    Delivered,
    /// Longer than the chain, which holds at least the virtio-net header:
    /// the frame is dropped, no byte written, and the caller gives the
    /// chain back for the next frame.
    NoRoom,
}

/// Delivers `frame` (at most the device's largest frame) into the chain at
/// `head`. A chain too short for it is the driver's fault only when it
/// cannot hold even the virtio-net header ([`DeviceError::ChainLength`]);
/// otherwise the frame is what does not fit ([`Received::NoRoom`]),
/// whatever the chain's size relative to §5.1.6.3.1's SHOULD.
fn receive<M: RingMemory, D: DeviceDma>(
    mem: &M,
    dma: &mut D,
    chain: &mut Vec<ChainDesc>,
    q: &mut DeviceQueue,
    head: u16,
    frame: &[u8],
) -> Result<Received, DeviceError> {
    let queue = q.index();
    let total = q.walk(mem, head, ChainDir::Writable, chain)?;
    let need = (HDR_LEN + frame.len()) as u64;
    if total < HDR_LEN as u64 {
        // Not even the header fits: no frame could ever be delivered
        // here, whatever the wire sends. That is the driver's doing.
        return Err(DeviceError::ChainLength {
            queue,
            head,
            len: total,
            min: HDR_LEN as u64,
            max: u64::from(u32::MAX),
        });
    }
    if total < need {
        // The frame is the link partner's: whether it fits a buffer the
        // driver sized (§5.1.6.3.1's 1,526 bytes is only a SHOULD) must
        // never decide whether the NIC goes down.
        return Ok(Received::NoRoom);
    }
    scatter_frame(dma, chain, &hdr::plain(true), frame).map_err(|e| dma_fault(queue, e))?;
    q.add_used(mem, head, need as u32)?;
    Ok(Received::Delivered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma_side::counting::Counting;
    use crate::net::{wire, NetConfig, NetDriver, NetDriverConfig, WireConfig};
    use crate::spec::status;
    use softiommu::dma::{DmaDomain, DmaDomainConfig};
    use softiommu::hw::UnitConfig;
    use softiommu::mem::PhysMemory;
    use std::time::Instant;

    /// A unit with `sid` assigned, attached to a fresh domain with a
    /// 64-bit mask: the system, the domain, the driver's handle, `sid`.
    fn platform(
        sid: SourceId,
    ) -> (
        Arc<System>,
        Arc<DmaDomain>,
        softiommu::dma::DmaDevice,
        SourceId,
    ) {
        let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
        let mut sys = System::new(mem);
        let unit = sys.add_unit(UnitConfig::default()).unwrap();
        sys.assign(sid, unit).unwrap();
        let system = Arc::new(sys);
        let domain = DmaDomain::new(system.clone(), DmaDomainConfig::default()).unwrap();
        let dev = domain.attach(sid, u64::MAX, false).unwrap();
        (system, domain, dev, sid)
    }

    /// The next frame on `port`'s receive side, waited for up to 10 s
    /// after `t0`.
    fn next_frame(port: &mut WirePort, t0: Instant) -> Vec<u8> {
        loop {
            if let Ok(f) = port.rx.peek() {
                return f.to_vec();
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "nothing sent");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The device spawned on a side other than a bare unit: every ring
    /// and buffer access of a transmitted and a received frame goes through
    /// that side (its counters move), and the frames arrive whole.
    #[test]
    fn a_device_spawned_on_another_dma_side_reaches_memory_only_through_it() {
        let (system, domain, dev, sid) = platform(SourceId(0x0301));
        let (pa, mut pb, _) = wire(WireConfig::default());
        let cfg = NetDeviceConfig::default();
        let side = Counting::new(UnitSide::new(system, sid, cfg.attrs));
        let (rings, dmas) = (side.ring.clone(), side.dma.clone());
        let device = NetDevice::spawn_on(cfg, side, pa).unwrap();
        let mut d = NetDriver::probe(
            device.transport().clone(),
            domain.cpu(),
            dev,
            NetDriverConfig::default(),
        )
        .unwrap();
        let (r0, d0) = (rings.load(Ordering::Relaxed), dmas.load(Ordering::Relaxed));
        assert!(d.transmit_with(60, |b| b.fill(0x5a)).unwrap());
        assert_eq!(next_frame(&mut pb, Instant::now()), vec![0x5a; 60]);
        // The frame was gathered through the side's DMA and its chain
        // popped, walked and used through the side's rings.
        assert!(dmas.load(Ordering::Relaxed) > d0);
        assert!(rings.load(Ordering::Relaxed) > r0);
        assert_eq!(device.transport().status() & status::DEVICE_NEEDS_RESET, 0);
        assert!(device.transport().errors().drain().is_empty());
        drop(d);
        device.stop().unwrap();
    }

    /// A device started, past `spawn`'s check, on a wire whose slots are
    /// shorter than its largest frame: a frame longer than a slot is
    /// dropped and counted, never copied past the slot; the thread goes on
    /// and the next frame is sent.
    #[test]
    fn a_frame_longer_than_the_wire_slot_is_dropped_and_counted() {
        let (system, domain, dev, sid) = platform(SourceId(0x0300));
        let (pa, mut pb, _) = wire(WireConfig::default());
        let cfg = NetDeviceConfig {
            net: NetConfig {
                mtu: 9000,
                ..NetConfig::default()
            },
            ..NetDeviceConfig::default()
        };
        let side = UnitSide::new(system, sid, cfg.attrs);
        let device = NetDevice::start(cfg, side, pa).unwrap();
        let mut d = NetDriver::probe(
            device.transport().clone(),
            domain.cpu(),
            dev,
            NetDriverConfig {
                mtu: 9000,
                ..NetDriverConfig::default()
            },
        )
        .unwrap();
        assert!(d.transmit_with(9014, |b| b.fill(0x11)).unwrap());
        assert!(d.transmit_with(60, |b| b.fill(0x22)).unwrap());
        let t0 = Instant::now();
        assert_eq!(next_frame(&mut pb, t0), vec![0x22; 60]);
        while device.stats().tx_frames < 2 {
            assert!(t0.elapsed() < Duration::from_secs(10), "not used");
            std::thread::sleep(Duration::from_millis(1));
        }
        let st = device.stats();
        assert_eq!((st.tx_oversize_drops, st.tx_dropped), (1, 0));
        assert_eq!(device.transport().status() & status::DEVICE_NEEDS_RESET, 0);
        assert!(device.transport().errors().drain().is_empty());
        drop(d);
        let stopped = device.stop();
        assert!(
            !matches!(stopped, Err(NetDeviceError::Panicked)),
            "{stopped:?}"
        );
        stopped.unwrap();
    }
}
