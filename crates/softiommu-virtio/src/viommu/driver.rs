//! [`ViommuDriver`]: the guest side of a virtio-iommu device — probe,
//! feature negotiation, the request and event queues in guest RAM, and
//! requests sent one at a time (strict: notify and wait for each) or
//! queued without notifying and sent together by [`sync`](ViommuDriver::sync)
//! (lazy: one notification and one wait per batch, as Linux since 6.8).
//!
//! Every wait on the device is bounded by [`ViommuDriverConfig::wait`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::mem::{MemError, PhysAddr, PhysMemory, PAGE_SIZE};

use super::status::Status;
use crate::driver_init::{Init, InitError, Wanted};
use crate::spec::{self, desc, iommu as s, reg, status};
use crate::transport::MmioTransport;
use crate::vring::{DriverRing, RingError, RingLayout};

/// Bytes of one request slot: the readable part at 0, the writable part
/// at [`SLOT_WRITABLE`].
const SLOT: u64 = PAGE_SIZE;
/// Offset of a slot's writable part.
const SLOT_WRITABLE: u64 = 256;
/// Bytes of one event buffer.
const EVENT_BUF: u64 = 64;

/// How to drive the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViommuDriverConfig {
    /// Request queue entries (a power of two; cut to the device's max).
    pub queue_size: u16,
    /// Event buffers posted (a power of two, at most 64).
    pub events: u16,
    /// Of the event buffers, how many (the first ones) are posted too
    /// short for a fault report: a broken driver, for tests. 0 normally.
    pub short_events: u16,
    /// Features to accept, among those offered (`VERSION_1` is added).
    pub accept: u64,
    /// The longest wait for the device (one sync's requests, all
    /// together). Keep it above three of the device's
    /// `invalidation_timeout`s (a round's longest).
    pub wait: Duration,
    /// How long a wait polls the used ring before it sleeps between
    /// looks (a request the device answers within it costs no wake-up).
    pub spin: Duration,
}

impl Default for ViommuDriverConfig {
    fn default() -> Self {
        Self {
            queue_size: 64,
            events: 16,
            short_events: 0,
            accept: u64::MAX,
            // Above three of the device's default bounds (1 s each): the
            // longest a round of the device's can take.
            wait: Duration::from_secs(4),
            spin: Duration::from_micros(50),
        }
    }
}

/// Why the driver failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViommuDriverError {
    /// The transport is not a virtio-iommu.
    #[error("not a virtio-iommu: magic {magic:#x}, version {version}, device id {device_id}")]
    NotViommu {
        /// `MagicValue`.
        magic: u32,
        /// `Version`.
        version: u32,
        /// `DeviceID`.
        device_id: u32,
    },
    /// The device refused `FEATURES_OK`.
    #[error("the device refused features {wanted:#x}")]
    FeaturesRefused {
        /// What was asked for.
        wanted: u64,
    },
    /// A feature the driver cannot work without (`VIRTIO_F_VERSION_1`) is
    /// not offered.
    #[error("the device does not offer {name}")]
    MissingFeature {
        /// The feature.
        name: &'static str,
    },
    /// A queue could not be set up.
    #[error("queue {queue} unavailable (QueueNumMax {max})")]
    QueueUnavailable {
        /// The queue.
        queue: u16,
        /// `QueueNumMax`.
        max: u32,
    },
    /// A configuration value is out of range.
    #[error("driver configuration: {field} = {value}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A raw chain is longer than the queue, or a request than a slot.
    #[error("a chain of {descs} descriptors / {bytes} bytes does not fit")]
    TooLarge {
        /// Descriptors asked for.
        descs: usize,
        /// Bytes asked for.
        bytes: u64,
    },
    /// The device did not return a request within the bound.
    #[error("the device returned nothing within {0:?}")]
    Timeout(Duration),
    /// The device asked for a reset (`DEVICE_NEEDS_RESET`).
    #[error("the device needs a reset (status {0:#x})")]
    NeedsReset(u32),
    /// The device returned a chain the driver did not have in flight.
    #[error("the device returned unknown chain {0}")]
    BadUsed(u32),
    /// Guest memory refused.
    #[error(transparent)]
    Memory(#[from] MemError),
    /// A ring could not be made.
    #[error(transparent)]
    Ring(#[from] RingError),
}

impl From<InitError> for ViommuDriverError {
    fn from(e: InitError) -> Self {
        match e {
            InitError::NotTheDevice {
                magic,
                version,
                device_id,
            } => Self::NotViommu {
                magic,
                version,
                device_id,
            },
            InitError::MissingFeature { name } => Self::MissingFeature { name },
            InitError::FeaturesRefused { wanted, .. } => Self::FeaturesRefused { wanted },
            InitError::QueueUnavailable { queue, max, .. } => Self::QueueUnavailable { queue, max },
        }
    }
}

/// One returned request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The used length the device wrote.
    pub used: u32,
    /// The whole writable part as the device left it.
    pub writable: Vec<u8>,
}

impl Completion {
    /// The status in the tail — the last 4 bytes the device wrote (the
    /// used length ends right after the tail, wherever the request's
    /// structure puts it) — `None` if the device wrote nothing (used
    /// length below the tail, §5.13.6: a failure), claimed more than the
    /// writable part, or wrote a byte §5.13.6 does not define.
    pub fn status(&self) -> Option<Status> {
        let used = self.used as usize;
        if used < s::TAIL_LEN || used > self.writable.len() {
            return None;
        }
        Status::from_code(self.writable[used - s::TAIL_LEN])
    }
}

/// One descriptor of a raw chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDesc {
    /// Guest-physical address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Device-writable.
    pub writable: bool,
}

/// A fault report from the event queue (§5.13.6.7), decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultEvent {
    /// `reason`.
    pub reason: u8,
    /// `flags`.
    pub flags: u32,
    /// `endpoint`.
    pub endpoint: u32,
    /// `address` (meaningful with `FAULT_F_ADDRESS`).
    pub address: u64,
    /// Whether `reserved` and `reserved1` were zero (§5.13.6.7.1: a
    /// driver ignores a report otherwise).
    pub reserved_zero: bool,
}

impl FaultEvent {
    /// Decodes the 24 bytes of a `virtio_iommu_fault`.
    pub fn decode(b: &[u8; s::FAULT_LEN]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[16..24]);
        Self {
            reason: b[0],
            flags: u32_at(4),
            endpoint: u32_at(8),
            address: u64::from_le_bytes(a),
            reserved_zero: b[1..4] == [0, 0, 0] && u32_at(12) == 0,
        }
    }
}

/// What the device's configuration space says (§5.13.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViommuGeometry {
    /// `page_size_mask`.
    pub page_size_mask: u64,
    /// `input_range` (inclusive).
    pub input_range: (u64, u64),
    /// `domain_range` (inclusive).
    pub domain_range: (u32, u32),
    /// `probe_size`.
    pub probe_size: u32,
    /// `bypass`.
    pub bypass: u8,
}

/// The driver of one virtio-iommu device. Use it from one thread: it
/// binds the transport's interrupts to the thread that probed.
#[derive(Debug)]
pub struct ViommuDriver {
    transport: MmioTransport,
    mem: Arc<PhysMemory>,
    req: DriverRing,
    evt: DriverRing,
    /// Request slots (two descriptors each), `SLOT` bytes apart.
    slots: PhysAddr,
    slot_order: u32,
    free: Vec<u16>,
    /// Per slot: the writable length of the request in it.
    wlen: Vec<u32>,
    /// Slots queued but not yet notified.
    queued: Vec<u16>,
    /// Per slot: the used length of its return, `None` until the device
    /// returns it (cleared when the slot is filled, never by a later
    /// wait: an answer taken by a wait that then timed out is kept for
    /// the retry that judges it).
    used: Vec<Option<u32>>,
    /// Per slot: whether its chain is on the ring and not yet returned
    /// (a used element naming any other chain is refused, `BadUsed`).
    in_flight: Vec<bool>,
    /// The slots of the sync being judged (reused, as `used`).
    judged: Vec<u16>,
    /// The statuses of [`call_status`](Self::call_status)'s sync (reused).
    statuses: Vec<Option<Status>>,
    events: PhysAddr,
    ring_orders: (u32, u32),
    features: u64,
    geometry: ViommuGeometry,
    wait: Duration,
    spin: Duration,
    kicks: u64,
}

/// Waits until every chain in flight on `req` has come back (at most
/// `wait`; polling for `spin`, then parked in 50 µs steps); hands each
/// `(head, used)` to `out` in the order used. The clock is read only once
/// a poll finds nothing (a device served in the notifier has answered by
/// then).
fn wait_all(
    req: &mut DriverRing,
    transport: &MmioTransport,
    wait: Duration,
    spin: Duration,
    mut out: impl FnMut(u16, u32) -> Result<(), ViommuDriverError>,
) -> Result<(), ViommuDriverError> {
    let mut start: Option<Instant> = None;
    while req.outstanding() > 0 {
        match req.pop_used() {
            Some((id, len)) => {
                let head = u16::try_from(id).map_err(|_| ViommuDriverError::BadUsed(id))?;
                out(head, len)?;
            }
            None => {
                let st = transport.status();
                if st & status::DEVICE_NEEDS_RESET != 0 {
                    return Err(ViommuDriverError::NeedsReset(st));
                }
                let now = Instant::now();
                let t0 = *start.get_or_insert(now);
                if now - t0 >= wait {
                    return Err(ViommuDriverError::Timeout(wait));
                }
                if now - t0 < spin {
                    // Poll, but give the CPU to the device thread if it
                    // is waiting for one.
                    std::thread::yield_now();
                } else {
                    std::thread::park_timeout(Duration::from_micros(50));
                }
            }
        }
    }
    Ok(())
}

fn order_of(bytes: u64) -> u32 {
    let pages = bytes.div_ceil(PAGE_SIZE).max(1);
    pages.next_power_of_two().trailing_zeros()
}

fn config_u32(t: &MmioTransport, at: usize) -> u32 {
    let mut b = [0u8; 4];
    t.read_config(at as u64, &mut b);
    u32::from_le_bytes(b)
}

fn config_u64(t: &MmioTransport, at: usize) -> u64 {
    let mut b = [0u8; 8];
    t.read_config(at as u64, &mut b);
    u64::from_le_bytes(b)
}

impl ViommuDriver {
    /// Initialises the device behind `transport` (§3.1.1) with its queues
    /// in `mem`'s RAM, and posts the event buffers.
    pub fn probe(
        transport: MmioTransport,
        mem: Arc<PhysMemory>,
        cfg: ViommuDriverConfig,
    ) -> Result<Self, ViommuDriverError> {
        let bad = |field, value: u64| Err(ViommuDriverError::InvalidConfig { field, value });
        if !cfg.queue_size.is_power_of_two() || cfg.queue_size < 2 {
            return bad("queue_size", u64::from(cfg.queue_size));
        }
        if !cfg.events.is_power_of_two() || cfg.events > 64 {
            return bad("events", u64::from(cfg.events));
        }
        // Not behind an IOMMU: the rings hold guest-physical addresses,
        // which is what the platform's translation of this device is.
        let platform = 1u64 << spec::feature::ACCESS_PLATFORM;
        let init = Init::begin(
            &transport,
            &Wanted {
                device_id: s::DEVICE_ID,
                required: &[(spec::feature::VERSION_1, "VIRTIO_F_VERSION_1")],
                optional: cfg.accept & !platform,
            },
        )?;
        let t = &transport;
        t.bind_interrupt(std::thread::current());
        let wanted = init.features();
        let geometry = ViommuGeometry {
            page_size_mask: config_u64(t, s::CFG_PAGE_SIZE_MASK),
            input_range: (
                config_u64(t, s::CFG_INPUT_START),
                config_u64(t, s::CFG_INPUT_END),
            ),
            domain_range: (
                config_u32(t, s::CFG_DOMAIN_START),
                config_u32(t, s::CFG_DOMAIN_END),
            ),
            probe_size: config_u32(t, s::CFG_PROBE_SIZE),
            bypass: {
                let mut b = [0u8];
                t.read_config(s::CFG_BYPASS as u64, &mut b);
                b[0]
            },
        };
        // An error from here on drops `init`, which fails the device.
        if u64::from(geometry.probe_size) + s::TAIL_LEN as u64 > SLOT - SLOT_WRITABLE {
            return bad("probe_size", u64::from(geometry.probe_size));
        }
        // A request takes two descriptors at least.
        let req_size = init.queue_size(s::REQUEST_QUEUE, cfg.queue_size, 2)?;
        let evt_size = init.queue_size(s::EVENT_QUEUE, cfg.events, 2)?;
        let (rl, el) = (RingLayout::new(req_size), RingLayout::new(evt_size));
        let ring_orders = (order_of(rl.bytes), order_of(el.bytes));
        let rp = mem.alloc_zeroed_frames(ring_orders.0)?;
        let ep = mem.alloc_zeroed_frames(ring_orders.1)?;
        let nslots = req_size / 2;
        let slot_order = order_of(SLOT * u64::from(nslots));
        let slots = mem.alloc_zeroed_frames(slot_order)?;
        let events = mem.alloc_zeroed_frames(0)?;
        let req = DriverRing::new(mem.clone(), rp, rp, rl)?;
        let mut evt = DriverRing::new(mem.clone(), ep, ep, el)?;
        for (q, ring) in [(s::REQUEST_QUEUE, &req), (s::EVENT_QUEUE, &evt)] {
            init.program_queue(q, ring.layout().size, ring.device_addresses());
        }
        for i in 0..evt_size {
            let len = if i < cfg.short_events {
                s::FAULT_LEN as u32 - 1
            } else {
                EVENT_BUF as u32
            };
            evt.set_desc(i, events + EVENT_BUF * u64::from(i), len, desc::F_WRITE, 0);
            evt.push_avail(i);
        }
        evt.publish();
        init.driver_ok();
        t.write(reg::QUEUE_NOTIFY, u32::from(s::EVENT_QUEUE));
        Ok(Self {
            transport,
            mem,
            req,
            evt,
            slots,
            slot_order,
            free: (0..nslots).rev().collect(),
            wlen: vec![0; usize::from(nslots)],
            queued: Vec::with_capacity(usize::from(nslots)),
            used: vec![None; usize::from(nslots)],
            in_flight: vec![false; usize::from(nslots)],
            judged: Vec::with_capacity(usize::from(nslots)),
            statuses: Vec::with_capacity(usize::from(nslots)),
            events,
            ring_orders: (ring_orders.0, ring_orders.1),
            features: wanted,
            geometry,
            wait: cfg.wait,
            spin: cfg.spin,
            kicks: 1,
        })
    }

    /// The features negotiated.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The device's configuration as read at probe.
    pub fn geometry(&self) -> ViommuGeometry {
        self.geometry
    }

    /// The register block.
    pub fn transport(&self) -> &MmioTransport {
        &self.transport
    }

    /// The memory the queues live in.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.mem
    }

    /// `QueueNotify` writes this driver made.
    pub fn notifications(&self) -> u64 {
        self.kicks
    }

    /// Request slots free for [`queue`](Self::queue) before it must sync.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Requests queued and not yet sent ([`sync`](Self::sync) sends them).
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    fn slot_addr(&self, slot: u16) -> PhysAddr {
        self.slots + SLOT * u64::from(slot)
    }

    /// Puts one request in a slot and the available ring, without
    /// publishing or notifying; syncs first when no slot is free.
    fn enqueue(&mut self, readable: &[u8], wlen: u32) -> Result<u16, ViommuDriverError> {
        if readable.len() as u64 > SLOT_WRITABLE || u64::from(wlen) > SLOT - SLOT_WRITABLE {
            return Err(ViommuDriverError::TooLarge {
                descs: 2,
                bytes: readable.len() as u64 + u64::from(wlen),
            });
        }
        if self.free.is_empty() {
            self.sync()?;
        }
        let slot = self
            .free
            .pop()
            .ok_or(ViommuDriverError::TooLarge { descs: 2, bytes: 0 })?;
        let base = self.slot_addr(slot);
        self.mem.write(base, readable)?;
        self.mem
            .fill(base + SLOT_WRITABLE, u64::from(wlen), 0)
            .map_err(ViommuDriverError::from)?;
        let (d0, d1) = (2 * slot, 2 * slot + 1);
        self.req
            .set_desc(d0, base, readable.len() as u32, desc::F_NEXT, d1);
        self.req
            .set_desc(d1, base + SLOT_WRITABLE, wlen, desc::F_WRITE, 0);
        self.req.push_avail(d0);
        self.wlen[usize::from(slot)] = wlen;
        self.used[usize::from(slot)] = None;
        self.in_flight[usize::from(slot)] = true;
        self.queued.push(slot);
        Ok(slot)
    }

    fn kick(&mut self) {
        self.req.publish();
        if self.req.needs_kick() {
            self.transport
                .write(reg::QUEUE_NOTIFY, u32::from(s::REQUEST_QUEUE));
            self.kicks += 1;
        }
    }

    /// Sends every queued request with one notification and waits for
    /// all of them; returns their completions in the order queued.
    pub fn sync(&mut self) -> Result<Vec<Completion>, ViommuDriverError> {
        if self.queued.is_empty() {
            return Ok(Vec::new());
        }
        self.send_and_wait()?;
        let mut out = Vec::with_capacity(self.judged.len());
        for i in 0..self.judged.len() {
            let slot = self.judged[i];
            let wlen = self.wlen[usize::from(slot)];
            let mut writable = vec![0u8; wlen as usize];
            self.mem
                .read(self.slot_addr(slot) + SLOT_WRITABLE, &mut writable)?;
            out.push(Completion {
                used: self.used[usize::from(slot)].unwrap_or(0),
                writable,
            });
        }
        self.free.extend_from_slice(&self.judged);
        Ok(out)
    }

    /// As [`sync`](Self::sync), but only each request's status
    /// ([`Completion::status`]), into `out` (cleared first) in the order
    /// queued: one byte read per request and no allocation once `out` has
    /// grown — the path every MAP and UNMAP of the DMA API takes.
    pub fn sync_statuses(
        &mut self,
        out: &mut Vec<Option<Status>>,
    ) -> Result<(), ViommuDriverError> {
        out.clear();
        if self.queued.is_empty() {
            return Ok(());
        }
        self.send_and_wait()?;
        for i in 0..self.judged.len() {
            let slot = self.judged[i];
            let wlen = self.wlen[usize::from(slot)];
            let st = match self.used[usize::from(slot)] {
                // The tail is the last 4 bytes the device claims to have
                // written, inside the writable part (as `Completion`).
                Some(u) if u as usize >= s::TAIL_LEN && u <= wlen => {
                    let mut b = [0u8];
                    let at =
                        self.slot_addr(slot) + SLOT_WRITABLE + u64::from(u) - s::TAIL_LEN as u64;
                    self.mem.read(at, &mut b)?;
                    Status::from_code(b[0])
                }
                _ => None,
            };
            out.push(st);
        }
        self.free.extend_from_slice(&self.judged);
        Ok(())
    }

    /// Notifies, waits for every chain in flight and moves the queued
    /// slots to `judged` with their used lengths in `used` (the caller
    /// reads their answers, then frees them). On an error the slots stay
    /// queued (nothing is judged or freed).
    ///
    /// A used element must name a chain in flight — a slot's head (even),
    /// queued and not yet returned — or the wait fails `BadUsed`: a device
    /// returning a chain twice, or one it was never given, would otherwise
    /// have the driver judge and free a slot the device still owns.
    fn send_and_wait(&mut self) -> Result<(), ViommuDriverError> {
        self.kick();
        let (used, in_flight) = (&mut self.used, &mut self.in_flight);
        let (req, transport) = (&mut self.req, &self.transport);
        wait_all(req, transport, self.wait, self.spin, |head, len| {
            let slot = usize::from(head / 2);
            match in_flight.get_mut(slot) {
                Some(f) if *f && head % 2 == 0 => {
                    *f = false;
                    used[slot] = Some(len);
                    Ok(())
                }
                _ => Err(ViommuDriverError::BadUsed(u32::from(head))),
            }
        })?;
        self.judged.clear();
        self.judged.append(&mut self.queued);
        Ok(())
    }

    /// Sends one request (readable bytes, writable length) and waits for
    /// it, after whatever was queued before it.
    pub fn call(&mut self, readable: &[u8], wlen: u32) -> Result<Completion, ViommuDriverError> {
        self.enqueue(readable, wlen)?;
        let mut all = self.sync()?;
        all.pop().ok_or(ViommuDriverError::Timeout(self.wait))
    }

    /// Sends one request with a bare tail (after whatever was queued
    /// before it) and waits: its status, `None` if the device wrote none.
    /// Allocates nothing once the driver's buffers have grown.
    pub(crate) fn call_status(
        &mut self,
        readable: &[u8],
    ) -> Result<Option<Status>, ViommuDriverError> {
        self.enqueue(readable, s::TAIL_LEN as u32)?;
        let mut st = std::mem::take(&mut self.statuses);
        let r = self.sync_statuses(&mut st);
        let last = st.last().copied();
        self.statuses = st;
        r?;
        last.ok_or(ViommuDriverError::Timeout(self.wait))
    }

    /// Queues one request without notifying (lazy mode): it is sent by
    /// the next [`sync`](Self::sync) or [`call`](Self::call).
    pub fn queue(&mut self, readable: &[u8], wlen: u32) -> Result<(), ViommuDriverError> {
        self.enqueue(readable, wlen).map(|_| ())
    }

    /// Sends one chain of exactly `descs` (after syncing what was
    /// queued) and waits for it: for tests of malformed chains. Returns
    /// the used length.
    pub fn raw(&mut self, descs: &[RawDesc]) -> Result<u32, ViommuDriverError> {
        self.sync()?;
        let size = self.req.layout().size;
        if descs.is_empty() || descs.len() > usize::from(size) {
            return Err(ViommuDriverError::TooLarge {
                descs: descs.len(),
                bytes: 0,
            });
        }
        for (i, d) in descs.iter().enumerate() {
            let last = i + 1 == descs.len();
            let mut flags = if d.writable { desc::F_WRITE } else { 0 };
            if !last {
                flags |= desc::F_NEXT;
            }
            self.req
                .set_desc(i as u16, d.addr, d.len, flags, (i + 1) as u16);
        }
        self.req.push_avail(0);
        self.kick();
        let mut used = 0;
        wait_all(
            &mut self.req,
            &self.transport,
            self.wait,
            self.spin,
            |_, len| {
                used = len;
                Ok(())
            },
        )?;
        Ok(used)
    }

    /// A page of guest RAM for a test's raw chains (the last request
    /// slot's; do not mix with queued requests).
    pub fn scratch(&self) -> PhysAddr {
        self.slot_addr((self.wlen.len() - 1) as u16)
    }

    /// Takes the fault reports the device has written, reposting their
    /// buffers.
    pub fn take_events(&mut self) -> Vec<FaultEvent> {
        let mut out = Vec::new();
        let mut repost = Vec::new();
        while let Some((id, len)) = self.evt.pop_used() {
            let Ok(i) = u16::try_from(id) else { continue };
            if i >= self.evt.layout().size {
                continue;
            }
            if len as usize >= s::FAULT_LEN {
                let mut b = [0u8; s::FAULT_LEN];
                if self
                    .mem
                    .read(self.events + EVENT_BUF * u64::from(i), &mut b)
                    .is_ok()
                {
                    out.push(FaultEvent::decode(&b));
                }
            }
            repost.push(i);
        }
        if !repost.is_empty() {
            for i in repost {
                self.evt.push_avail(i);
            }
            self.evt.publish();
            self.transport
                .write(reg::QUEUE_NOTIFY, u32::from(s::EVENT_QUEUE));
        }
        out
    }

    /// Waits (bounded by the driver's wait) until at least `n` fault
    /// reports have been taken, and returns them.
    pub fn wait_events(&mut self, n: usize) -> Vec<FaultEvent> {
        let deadline = Instant::now() + self.wait;
        let mut out = self.take_events();
        while out.len() < n && Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_micros(200));
            out.extend(self.take_events());
        }
        out
    }

    /// Writes `bypass` if `VIRTIO_IOMMU_F_BYPASS_CONFIG` was negotiated
    /// (§5.13.4.1: the driver must not write it otherwise); returns
    /// whether it wrote.
    pub fn set_bypass(&self, on: bool) -> bool {
        if self.features() & 1 << s::F_BYPASS_CONFIG == 0 {
            return false;
        }
        self.transport
            .write_config(s::CFG_BYPASS as u64, &[u8::from(on)]);
        true
    }
}

impl Drop for ViommuDriver {
    fn drop(&mut self) {
        // Reset first: the device no longer uses the rings once it returns.
        self.transport.write(reg::STATUS, 0);
        let _ = self.mem.free_frames(self.slots, self.slot_order);
        let _ = self.mem.free_frames(self.events, 0);
        let _ = self.mem.free_frames(self.req.phys(), self.ring_orders.0);
        let _ = self.mem.free_frames(self.evt.phys(), self.ring_orders.1);
    }
}
