//! The virtio-net device as a vhost-user back-end (virtio 1.2 §5.1): queue
//! 0 receives, queue 1 transmits, each served by its own worker over the
//! ring code shared with the devices behind a softiommu unit
//! (`softiommu-virtio`'s `DeviceQueue`), every ring and buffer access
//! through the [`DmaSpace`](crate::space::DmaSpace)'s device IOTLB. Frames travel on one end of
//! `softiommu-virtio`'s wire ([`WirePort`]); the other end is the peer's
//! (a smoltcp stack in the tests).
//!
//! Offered: `VERSION_1` (12-byte header), `ACCESS_PLATFORM`, `MAC`; no
//! offloads and no mergeable buffers, so every packet is one plain header
//! and one Ethernet frame of at most the wire's frame size.
//!
//! Bad input is dropped and counted, never an error that stops a queue: a
//! transmit chain of the wrong shape (a loop, an indirect or writable
//! descriptor, shorter than header plus Ethernet header, longer than the
//! wire's frame, lengths that overflow) or with an offload in its header is
//! completed unsent; a receive chain of the wrong shape is completed with
//! length 0 and the frame kept for the next buffer; a frame larger than the
//! buffer is dropped and the buffer given back, unused, for the next frame
//! (as a NIC does: no used entry for a frame it did not deliver). A full
//! wire drops the frame (the wire counts it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use softiommu_virtio::net::{
    gather_frame, offloads, plain_header, scatter_frame, FrameFault, WirePort, WireRx, WireTx,
    HDR_LEN,
};
use softiommu_virtio::spec::net as sn;
use softiommu_virtio::transport::{ChainDesc, ChainDir, DeviceError};

use crate::blk::thread_cpu_ns;
use crate::error::{AccessError, ConfigError};
use crate::proto::{pf, vf};
use crate::queue::{is_abort, is_fault, Queue};
use crate::session::{serve_device, SessionReport, VhostDevice, CONFIG_MAX};

/// `VIRTIO_NET_F_MAC` (virtio 1.2 §5.1.3): the device has a MAC address.
pub const F_MAC: u32 = 5;
/// The virtio features offered.
pub const FEATURES: u64 =
    vf::VERSION_1 | vf::ACCESS_PLATFORM | vf::PROTOCOL_FEATURES | (1 << F_MAC);
/// The protocol features offered: an IOMMU needs reply-ack and the
/// back-end channel; QEMU's net front-end refuses `CONFIG`.
pub const PROTOCOL_FEATURES: u64 = pf::REPLY_ACK | pf::BACKEND_REQ | pf::RESET_DEVICE;
/// How long an idle worker waits for a kick (or, receiving, for the wire)
/// before looking at its stop flag and the wire again.
const IDLE_WAIT: Duration = Duration::from_millis(1);
/// How long a transmit worker sleeps on its kick descriptor.
const KICK_POLL: Duration = Duration::from_millis(50);
/// Frames delivered before the receive worker signals the driver anyway.
const RX_SIGNAL_BATCH: u32 = 64;

/// How a net back-end is set up.
#[derive(Debug, Clone)]
pub struct NetBackendConfig {
    /// How long a device access waits for the front-end to answer a miss.
    pub miss_timeout: Duration,
    /// Entries the device IOTLB holds before it is emptied.
    pub iotlb_capacity: usize,
    /// The MAC address in the config space.
    pub mac: [u8; 6],
}

impl Default for NetBackendConfig {
    /// A 2 s miss bound, 16,384 entries, MAC 52:54:00:12:34:56.
    fn default() -> Self {
        Self {
            miss_timeout: Duration::from_secs(2),
            iotlb_capacity: 16384,
            mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
        }
    }
}

/// The net device's counters, as a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames the guest sent, put on the wire.
    pub tx_frames: u64,
    /// Their bytes (Ethernet frames, header excluded).
    pub tx_bytes: u64,
    /// Transmit chains dropped for their shape or header (past the
    /// longest frame a driver told no MTU may send among them).
    pub tx_bad: u64,
    /// Transmit frames a driver may send (no MTU is offered: up to a
    /// doubly tagged header and an IP packet's 16-bit length) but longer
    /// than a wire slot: dropped unread, not the driver's fault.
    pub tx_oversize: u64,
    /// Transmit frames dropped because the wire's queue was full.
    pub tx_wire_full: u64,
    /// Transmit chains completed unread while the ring was disabled.
    pub tx_discarded: u64,
    /// Transmit frames dropped because a buffer access failed.
    pub tx_faults: u64,
    /// Frames delivered into guest receive buffers.
    pub rx_frames: u64,
    /// Their bytes (Ethernet frames, header excluded).
    pub rx_bytes: u64,
    /// Receive chains of the wrong shape (completed with length 0).
    pub rx_bad: u64,
    /// Received frames dropped: larger than the buffer (which is given back
    /// unused), or a buffer access failed (completed with length 0).
    pub rx_dropped: u64,
    /// Frames from the wire shorter than an Ethernet header (14 bytes):
    /// not frames, dropped before any buffer is taken.
    pub rx_runts: u64,
    /// Ring accesses that failed, or an avail index past the ring.
    pub ring_faults: u64,
    /// CPU time of the queue threads, nanoseconds (summed over ring starts).
    pub worker_cpu_ns: u64,
}

#[derive(Debug, Default)]
struct NetCounters {
    tx_frames: AtomicU64,
    tx_bytes: AtomicU64,
    tx_bad: AtomicU64,
    tx_oversize: AtomicU64,
    tx_wire_full: AtomicU64,
    tx_discarded: AtomicU64,
    tx_faults: AtomicU64,
    rx_frames: AtomicU64,
    rx_bytes: AtomicU64,
    rx_bad: AtomicU64,
    rx_dropped: AtomicU64,
    rx_runts: AtomicU64,
    ring_faults: AtomicU64,
    worker_cpu_ns: AtomicU64,
}

fn bump(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

impl NetCounters {
    fn snapshot(&self) -> NetStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NetStats {
            tx_frames: l(&self.tx_frames),
            tx_bytes: l(&self.tx_bytes),
            tx_bad: l(&self.tx_bad),
            tx_oversize: l(&self.tx_oversize),
            tx_wire_full: l(&self.tx_wire_full),
            tx_discarded: l(&self.tx_discarded),
            tx_faults: l(&self.tx_faults),
            rx_frames: l(&self.rx_frames),
            rx_bytes: l(&self.rx_bytes),
            rx_bad: l(&self.rx_bad),
            rx_dropped: l(&self.rx_dropped),
            rx_runts: l(&self.rx_runts),
            ring_faults: l(&self.ring_faults),
            worker_cpu_ns: l(&self.worker_cpu_ns),
        }
    }
}

/// A vhost-user-net back-end on one end of a wire; serves sessions one at
/// a time (the wire's ends stay with the back-end between sessions).
#[derive(Debug)]
pub struct NetBackend {
    cfg: NetBackendConfig,
    tx: Arc<Mutex<Option<WireTx>>>,
    rx: Arc<Mutex<Option<WireRx>>>,
}

impl NetBackend {
    /// Checks the configuration; frames go out on `port.tx` and come in
    /// from `port.rx`.
    pub fn new(cfg: NetBackendConfig, port: WirePort) -> Result<Self, ConfigError> {
        let ms = u64::try_from(cfg.miss_timeout.as_millis()).unwrap_or(u64::MAX);
        if !crate::BlkBackendConfig::MISS_TIMEOUT_MS.contains(&ms) {
            return Err(ConfigError::Range {
                option: "miss timeout (ms)",
                range: "1..=60000",
                value: ms,
            });
        }
        if !crate::BlkBackendConfig::IOTLB_CAPACITY.contains(&cfg.iotlb_capacity) {
            return Err(ConfigError::Range {
                option: "IOTLB capacity",
                range: "1..=1048576",
                value: cfg.iotlb_capacity as u64,
            });
        }
        Ok(Self {
            cfg,
            tx: Arc::new(Mutex::new(Some(port.tx))),
            rx: Arc::new(Mutex::new(Some(port.rx))),
        })
    }

    /// Serves one front-end until it goes away; the back-end is reusable after.
    pub fn serve(&self, sock: std::os::unix::net::UnixStream) -> SessionReport {
        let dev = NetDevice {
            mac: self.cfg.mac,
            tx: self.tx.clone(),
            rx: self.rx.clone(),
            counters: Arc::new(NetCounters::default()),
        };
        let mut r = serve_device(&dev, sock, self.cfg.iotlb_capacity, self.cfg.miss_timeout);
        r.net = dev.counters.snapshot();
        r
    }
}

struct NetDevice {
    mac: [u8; 6],
    tx: Arc<Mutex<Option<WireTx>>>,
    rx: Arc<Mutex<Option<WireRx>>>,
    counters: Arc<NetCounters>,
}

/// A wire end lent to a queue worker: put back into its slot when the
/// worker is dropped, however that happens — it returned, it panicked, or
/// its thread could not be started — so the next ring start finds it.
struct Lent<T> {
    slot: Arc<Mutex<Option<T>>>,
    item: std::mem::ManuallyDrop<T>,
}

impl<T> Lent<T> {
    /// Takes the end out of `slot`; `None` while another worker holds it.
    fn take(slot: &Arc<Mutex<Option<T>>>) -> Option<Self> {
        let item = slot.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        Some(Self {
            slot: slot.clone(),
            item: std::mem::ManuallyDrop::new(item),
        })
    }
}

impl<T> std::ops::Deref for Lent<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.item
    }
}

impl<T> std::ops::DerefMut for Lent<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.item
    }
}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        // SAFETY: `item` is taken here only, once, and never used after.
        let v = unsafe { std::mem::ManuallyDrop::take(&mut self.item) };
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
    }
}

impl VhostDevice for NetDevice {
    fn features(&self) -> u64 {
        FEATURES
    }

    fn protocol_features(&self) -> u64 {
        PROTOCOL_FEATURES
    }

    /// `VERSION_1`: every frame carries the 12-byte header (§5.1.6); a
    /// legacy driver's is 10 bytes without `MRG_RXBUF`, which this device
    /// does not speak, so its rings are refused rather than served with
    /// frames cut or prefixed by two bytes.
    fn required_features(&self) -> u64 {
        vf::VERSION_1
    }

    fn queues(&self) -> u32 {
        2
    }

    fn config(&self, cfg: &mut [u8; CONFIG_MAX]) {
        cfg[..6].copy_from_slice(&self.mac);
    }

    fn spawn(&self, index: u32, q: Queue) -> std::io::Result<JoinHandle<u16>> {
        let busy = || std::io::Error::other("the wire's end is held by another worker");
        let counters = self.counters.clone();
        // The wire end goes back to its slot when the worker is dropped:
        // as `run` returns, or with the closure if the thread cannot start.
        if index == u32::from(sn::RX_QUEUE) {
            let rx = Lent::take(&self.rx).ok_or_else(busy)?;
            let w = RxWorker {
                q,
                rx,
                counters,
                descs: Vec::new(),
            };
            std::thread::Builder::new()
                .name("vhost-net-rx".into())
                .spawn(move || w.run())
        } else {
            let tx = Lent::take(&self.tx).ok_or_else(busy)?;
            let w = TxWorker {
                q,
                tx,
                counters,
                descs: Vec::new(),
            };
            std::thread::Builder::new()
                .name("vhost-net-tx".into())
                .spawn(move || w.run())
        }
    }
}

struct TxWorker {
    q: Queue,
    tx: Lent<WireTx>,
    counters: Arc<NetCounters>,
    /// The chain in hand, as the shared frame code takes it.
    descs: Vec<ChainDesc>,
}

impl TxWorker {
    fn run(mut self) -> u16 {
        // A paced line frees in microseconds: the waits for it end then,
        // not up to Linux's default 50 µs of timer slack later (which
        // would hold a line to one frame per frame time plus the slack).
        softiommu_virtio::affinity::precise_timers();
        // Started: a kick came (vhost-user, "Ring states": a ring starts
        // upon a kick). Before it a disabled ring is left alone.
        let mut started = false;
        while !self.q.stopping() {
            // A started but disabled ring still takes the driver's frames
            // and discards them, unread ("Ring states": a disabled net
            // ring "must process and discard any TX packets"), so the
            // driver's transmit queue does not stall.
            let mut wait = KICK_POLL;
            if started || self.q.enabled() {
                match self.drain() {
                    Ok(Some(line)) => wait = line.min(KICK_POLL),
                    Ok(None) => {}
                    Err(e) => {
                        if !is_abort(&e) {
                            bump(&self.counters.ring_faults, 1);
                            eprintln!("softiommu-vhost: net tx ring access failed: {e}");
                        }
                    }
                }
            }
            started |= self.q.wait_kick(wait);
        }
        bump(&self.counters.worker_cpu_ns, thread_cpu_ns());
        // A frame whose completion could not be published is given back
        // and sent once more after resuming (a duplicate the network
        // tolerates), so the base equals the used index.
        self.q.finish()
    }

    /// Sends (or, the ring disabled, discards) what the driver offered;
    /// `Some(wait)` when the wire's line is busy for `wait` more: the
    /// rest stays in the ring until then, as a NIC stops fetching while
    /// its port transmits, rather than being dropped at the wire.
    fn drain(&mut self) -> Result<Option<Duration>, DeviceError> {
        let r = loop {
            if self.q.stopping() {
                break Ok(None);
            }
            if self.q.enabled() {
                if let Some(line) = self.tx.busy_until() {
                    break Ok(Some(line));
                }
            }
            match self.q.pop() {
                Ok(Some(h)) if !self.q.enabled() => {
                    bump(&self.counters.tx_discarded, 1);
                    if let Err(e) = self.q.push_used(h, 0) {
                        break Err(e);
                    }
                }
                Ok(Some(h)) => {
                    if let Err(e) = self.send(h) {
                        // Refused only without the pop just above.
                        let _ = self.q.unpop();
                        break Err(e);
                    }
                    if let Err(e) = self.q.push_used(h, 0) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(None),
                Err(DeviceError::AvailIndexTooFar { .. }) => {
                    bump(&self.counters.ring_faults, 1);
                    break Ok(None);
                }
                Err(e) => break Err(e),
            }
        };
        self.q.signal_if_wanted()?;
        r
    }

    /// Puts one chain's frame on the wire, or drops and counts it: a chain
    /// the walk refuses (a loop, an index past the ring, an indirect or
    /// writable descriptor) as bad, an unreachable descriptor table as a
    /// fault. Only an aborted access is an error.
    fn send(&mut self, head: u16) -> Result<(), DeviceError> {
        let total = match self.q.walk(head, ChainDir::Readable, &mut self.descs) {
            Ok(t) => t,
            Err(e) if is_abort(&e) => return Err(e),
            Err(e) if is_fault(&e) => {
                bump(&self.counters.tx_faults, 1);
                return Ok(());
            }
            Err(_) => {
                bump(&self.counters.tx_bad, 1);
                return Ok(());
            }
        };
        self.send_chain(total).map_err(|e| DeviceError::DmaAborted {
            queue: sn::TX_QUEUE,
            what: "buffer",
            iova: e.iova,
            access: e.access,
        })
    }

    /// Puts the walked chain's frame (`total` bytes with its header) on
    /// the wire (see [`TxWorker::send`]); only an aborted access is an
    /// error.
    fn send_chain(&mut self, total: u64) -> Result<(), FrameFault<AccessError>> {
        let c = &self.counters;
        let max = self.tx.max_frame() as u64;
        // No MTU is offered: the longest frame a driver may send.
        let bound = sn::NO_MTU_MAX_FRAME as u64;
        let frame_len = match total.checked_sub(HDR_LEN as u64) {
            Some(f) if f >= sn::ETH_HLEN as u64 && f <= max => f as usize,
            Some(f) if f >= sn::ETH_HLEN as u64 && f <= bound => {
                bump(&c.tx_oversize, 1);
                return Ok(());
            }
            _ => {
                bump(&c.tx_bad, 1);
                return Ok(());
            }
        };
        let mut space = &**self.q.space();
        let mut hdr = [0u8; HDR_LEN];
        let Some(mut slot) = self.tx.reserve() else {
            // The wire is full: the header alone is read, as a NIC learns
            // of an offload before it learns the port is congested.
            match gather_frame(&mut space, &self.descs, &mut hdr, &mut []) {
                Ok(()) => {}
                Err(e) if matches!(e.fault, AccessError::Cancelled { .. }) => return Err(e),
                Err(_) => {
                    bump(&c.tx_faults, 1);
                    return Ok(());
                }
            }
            if offloads(&hdr) != (0, sn::GSO_NONE) {
                bump(&c.tx_bad, 1);
                return Ok(());
            }
            self.tx.drop_frame();
            bump(&c.tx_wire_full, 1);
            return Ok(());
        };
        // Header and frame in one pass; the slot is committed only for a
        // frame read whole with a plain header: nothing else goes on the
        // wire.
        match gather_frame(
            &mut space,
            &self.descs,
            &mut hdr,
            &mut slot.buf()[..frame_len],
        ) {
            Ok(()) => {}
            Err(e) if matches!(e.fault, AccessError::Cancelled { .. }) => return Err(e),
            Err(_) => {
                bump(&c.tx_faults, 1);
                return Ok(());
            }
        }
        if offloads(&hdr) != (0, sn::GSO_NONE) {
            bump(&c.tx_bad, 1);
            return Ok(());
        }
        slot.commit(frame_len);
        bump(&c.tx_frames, 1);
        bump(&c.tx_bytes, frame_len as u64);
        Ok(())
    }
}

struct RxWorker {
    q: Queue,
    rx: Lent<WireRx>,
    counters: Arc<NetCounters>,
    /// The chain in hand, as the shared frame code takes it.
    descs: Vec<ChainDesc>,
}

/// What delivering one frame did.
enum Delivered {
    /// The frame was used (delivered; or dropped, its buffer completed
    /// or, too small for it, given back for the next frame): take the
    /// next.
    Consumed,
    /// The buffer was bad: the frame waits for the next buffer.
    Kept,
    /// No buffer available.
    NoBuffer,
    /// The frame was used, but publishing its buffer's used entry failed
    /// (kept by the queue, published before the next pop): the frame is
    /// not delivered again, and the error ends the batch.
    ConsumedUnpublished(DeviceError),
}

impl RxWorker {
    fn run(mut self) -> u16 {
        while !self.q.stopping() {
            if !self.q.enabled() {
                self.q.wait_kick(KICK_POLL);
                continue;
            }
            match self.pump() {
                Ok(wait) => {
                    if let Err(e) = self.q.signal_if_wanted() {
                        self.fault(e);
                    }
                    if let Some(w) = wait {
                        self.q.wait_kick(w);
                    }
                }
                Err(e) => {
                    // What was published before the failure is signalled
                    // (a lost interrupt stalls the driver; an unreadable
                    // flag signals anyway), the one failure counted.
                    let _ = self.q.signal_if_wanted();
                    self.fault(e);
                    self.q.wait_kick(IDLE_WAIT);
                }
            }
        }
        bump(&self.counters.worker_cpu_ns, thread_cpu_ns());
        // A buffer whose completion could not be published is given back
        // and filled again after resuming (its frame lost, as a drop), so
        // the base equals the used index.
        self.q.finish()
    }

    fn fault(&self, e: DeviceError) {
        if !is_abort(&e) {
            bump(&self.counters.ring_faults, 1);
            eprintln!("softiommu-vhost: net rx ring access failed: {e}");
        }
    }

    /// Delivers arrived frames while there are buffers; returns how long to
    /// wait before the next try (`None`: go again now).
    fn pump(&mut self) -> Result<Option<Duration>, DeviceError> {
        // A buffer filled whose completion could not be published goes
        // out now, not only when the next frame arrives.
        self.q.publish_pending()?;
        let mut n = 0u32;
        loop {
            if self.q.stopping() {
                return Ok(None);
            }
            if n >= RX_SIGNAL_BATCH {
                return Ok(None);
            }
            let frame = match self.rx.peek() {
                Ok(f) => f,
                Err(None) => return Ok(Some(IDLE_WAIT)),
                Err(Some(d)) => return Ok(Some(d.min(IDLE_WAIT))),
            };
            if frame.len() < sn::ETH_HLEN {
                // Shorter than its own header: the peer's doing, dropped
                // before any buffer is taken (counted in the batch, so a
                // flood of them still ends the turn and its signal).
                self.rx.consume();
                bump(&self.counters.rx_runts, 1);
                n += 1;
                continue;
            }
            match deliver(&mut self.q, &self.counters, &mut self.descs, frame)? {
                Delivered::Consumed => {
                    self.rx.consume();
                    n += 1;
                }
                Delivered::Kept => {}
                Delivered::NoBuffer => return Ok(Some(IDLE_WAIT)),
                Delivered::ConsumedUnpublished(e) => {
                    self.rx.consume();
                    return Err(e);
                }
            }
        }
    }
}

/// Puts `frame` into the next receive buffer. A chain the walk refuses (a
/// readable descriptor, a loop, an index past the ring, an indirect
/// descriptor, an unreachable table) is completed with length 0 and the
/// frame kept. Only an aborted access or a failed ring access is an error.
fn deliver(
    q: &mut Queue,
    c: &NetCounters,
    descs: &mut Vec<ChainDesc>,
    frame: &[u8],
) -> Result<Delivered, DeviceError> {
    let head = match q.pop() {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(Delivered::NoBuffer),
        Err(DeviceError::AvailIndexTooFar { .. }) => {
            bump(&c.ring_faults, 1);
            return Ok(Delivered::NoBuffer);
        }
        Err(e) => return Err(e),
    };
    let total = match q.walk(head, ChainDir::Writable, descs) {
        Ok(t) => t,
        Err(e) if is_abort(&e) => {
            // Refused only without the pop above.
            let _ = q.unpop();
            return Err(e);
        }
        Err(_) => {
            bump(&c.rx_bad, 1);
            q.push_used(head, 0)?;
            return Ok(Delivered::Kept);
        }
    };
    let need = (HDR_LEN + frame.len()) as u64;
    // The frame is used from here on: a failed publication must not have
    // it delivered again into the next buffer.
    let published = |r: Result<(), DeviceError>| match r {
        Ok(()) => Delivered::Consumed,
        Err(e) => Delivered::ConsumedUnpublished(e),
    };
    if total < need {
        bump(&c.rx_dropped, 1);
        // The buffer is the driver's still: given back for the next frame
        // (completed with 0 only if the give-back is refused, which it is
        // not right after the pop).
        return Ok(match q.unpop() {
            Ok(()) => Delivered::Consumed,
            Err(_) => published(q.push_used(head, 0)),
        });
    }
    let mut space = &**q.space();
    match scatter_frame(&mut space, descs, &plain_header(true), frame) {
        Ok(()) => {
            bump(&c.rx_frames, 1);
            bump(&c.rx_bytes, frame.len() as u64);
            Ok(published(q.push_used(head, need as u32)))
        }
        Err(e) if matches!(e.fault, AccessError::Cancelled { .. }) => {
            // Refused only without the pop above.
            let _ = q.unpop();
            Err(DeviceError::DmaAborted {
                queue: sn::RX_QUEUE,
                what: "buffer",
                iova: e.iova,
                access: e.access,
            })
        }
        Err(_) => {
            bump(&c.rx_dropped, 1);
            Ok(published(q.push_used(head, 0)))
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! The receive worker when a buffer's completion cannot be published:
    //! the frame is not delivered twice, the completion goes out once the
    //! used ring is back.

    use std::time::Instant;

    use softiommu_virtio::net::{wire, WireConfig};
    use softiommu_virtio::spec::desc as d;

    use super::*;
    use crate::proto::iotlb as m;
    use crate::queue::tests::{rig, RINGS, UA, USED, USED_PAGE};

    const BUF: u64 = RINGS + 0x2000;

    fn wait(what: &str, f: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(10), "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn send(tx: &mut WireTx, byte: u8) {
        let mut slot = tx.reserve().unwrap();
        slot.buf()[..60].fill(byte);
        slot.commit(60);
    }

    #[test]
    fn a_received_frame_whose_completion_failed_is_not_delivered_again() {
        let (dev, mut peer, _) = wire(WireConfig::default());
        let mut r = rig(0);
        let space = r.q.space().clone();
        space
            .update(BUF, 0x1000, UA + 0x2000, m::ACCESS_RW)
            .unwrap();
        r.desc(0, BUF, 0x800, d::F_WRITE, 0);
        r.desc(1, BUF + 0x800, 0x800, d::F_WRITE, 0);
        r.offer(0, 0, 1);
        // The used ring's page gone, no front-end to answer its miss.
        space.invalidate(USED_PAGE, 0x1000).unwrap();
        let q = r.take_queue();
        let shared = q.worker_shared().clone();
        let counters = Arc::new(NetCounters::default());
        let slot = Arc::new(Mutex::new(Some(dev.rx)));
        let w = RxWorker {
            q,
            rx: Lent::take(&slot).unwrap(),
            counters: counters.clone(),
            descs: Vec::new(),
        };
        assert!(Lent::take(&slot).is_none(), "lent to the worker");
        let h = std::thread::spawn(move || w.run());
        send(&mut peer.tx, 0xa1);
        wait("frame A in buffer 0", || r.peek(BUF + 12, 60) == [0xa1; 60]);
        wait("a failed publication", || {
            counters.ring_faults.load(Ordering::Relaxed) >= 1
        });
        assert_eq!(r.used_idx(), 0);
        // A second buffer, then the used ring back: A's completion goes out
        // without a new frame, and A is not put into buffer 1.
        r.offer(1, 1, 2);
        space
            .update(USED_PAGE, 0x1000, UA + 0x1000, m::ACCESS_RW)
            .unwrap();
        wait("A's completion", || r.used_idx() == 1);
        assert_eq!(r.peek(USED + 4, 8), [0, 0, 0, 0, 72, 0, 0, 0]);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(r.peek(BUF + 0x800 + 12, 60), [0u8; 60]);
        send(&mut peer.tx, 0xb2);
        wait("B's completion", || r.used_idx() == 2);
        assert_eq!(r.peek(USED + 12, 8), [1, 0, 0, 0, 72, 0, 0, 0]);
        assert_eq!(r.peek(BUF + 0x800 + 12, 60), [0xb2; 60]);
        shared.stop.store(true, Ordering::Release);
        space.cancel();
        let base = h.join().unwrap();
        assert_eq!(base, 2);
        assert_eq!(counters.snapshot().rx_frames, 2);
        // The worker ended: its wire end is back for the next start.
        assert!(slot.lock().unwrap().is_some());
    }

    /// A lent wire end goes back to its slot however its holder ends: a
    /// worker that panics, or one whose thread never started (its closure
    /// dropped unrun) — else every later start of the ring would find the
    /// end held by a worker that no longer exists.
    #[test]
    fn a_lent_end_goes_back_when_its_holder_panics_or_never_runs() {
        let slot = Arc::new(Mutex::new(Some(7u32)));
        let lent = Lent::take(&slot).unwrap();
        assert_eq!(*lent, 7);
        assert!(Lent::take(&slot).is_none());
        let r = std::thread::spawn(move || {
            let _held = lent;
            panic!("a worker that panics");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*slot.lock().unwrap_or_else(|p| p.into_inner()), Some(7));
        let lent = Lent::take(&slot).unwrap();
        let never_run = move || *lent;
        drop(never_run);
        assert_eq!(*slot.lock().unwrap(), Some(7));
    }
}
