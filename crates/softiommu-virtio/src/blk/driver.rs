//! [`BlkDriver`]: a virtio-blk driver on softiommu's DMA API, used the way
//! Linux's block drivers use the kernel's: it probes the device through
//! the register block only (§3.1.1 initialisation, §4.2.3.2 queue setup),
//! reads the configuration (§5.2.4), and sets up one [`BlkQueue`] per
//! request queue, each with its own DMA handle ("CPU"), so that each queue
//! can be driven by its own thread (blk-mq's hardware contexts).
//!
//! Teardown: [`BlkDriver::reset`] stops the device (every queue, waiting
//! for its batches in flight), after which each queue gives back its
//! memory with [`BlkQueue::release`].

use std::sync::Arc;

use softiommu::dma::{DmaDevice, DmaDomain, DmaError};
use softiommu::mem::{MemError, PAGE_SIZE};

use super::config::{BlkGeometry, REQUIRED};
use super::queue::{BlkQueue, QueueParts};
use crate::driver_init::{Init, InitError, Wanted};
use crate::spec::{blk, reg, status};
use crate::transport::{DeviceError, MmioTransport};
use crate::vring::RingLayout;

/// How to set up a [`BlkDriver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkDriverConfig {
    /// Request queues wanted (capped by the device's `num_queues`).
    pub queues: u16,
    /// Entries per queue (a power of two; capped by `QueueNumMax`).
    pub queue_size: u16,
    /// Requests in flight per queue at most (request slots, each with its
    /// own header, status byte and data pages): 1 to `queue_size / 3`
    /// (a request needs three descriptors at least).
    pub depth: u16,
    /// Extra slots of one page each, for requests of at most 4 KiB
    /// submitted with [`BlkQueue::submit_small`] (a load's slow tail, say:
    /// many small requests held long, without a large slot's memory each).
    /// `depth + small_slots` is at most `queue_size / 3`.
    pub small_slots: u16,
    /// Whether the small slots share one set of `max_request_bytes` pages
    /// per queue instead of owning a page each: then they take requests
    /// up to the full size, whose data the queue's other small requests
    /// in flight may overwrite (for loads that measure the IOMMU, not the
    /// data: a slow tail of every size without a full slot's memory each).
    pub shared_small: bool,
    /// The largest request the driver issues, in bytes: each slot owns
    /// this much data memory, as single pages (a request over several
    /// pages is a real scatter list). A multiple of 4 KiB, at most
    /// `seg_max` pages and at most 16 MiB.
    pub max_request_bytes: u64,
}

impl Default for BlkDriverConfig {
    fn default() -> Self {
        Self {
            queues: 1,
            queue_size: 256,
            depth: 64,
            small_slots: 0,
            shared_small: false,
            max_request_bytes: 128 << 10,
        }
    }
}

/// What went wrong in the block driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlkDriverError {
    /// The register block is not a virtio-mmio v2 block device.
    #[error(
        "not a virtio-mmio v2 block device (magic {magic:#x}, version {version}, id {device_id})"
    )]
    NotVirtioBlk {
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
    /// A driver setting out of range (or beyond what the device allows).
    #[error("driver setting {field} = {value} is outside {min}..={max}")]
    BadConfig {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The least allowed.
        min: u64,
        /// The most allowed.
        max: u64,
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
    /// A request the driver refuses to send (the block layer's checks).
    #[error("request refused: {reason} (sector {sector}, {len} bytes)")]
    BadRequest {
        /// What is wrong: "empty", "past the end", "unaligned", "too large",
        /// "data longer than the request".
        reason: &'static str,
        /// The sector.
        sector: u64,
        /// The length.
        len: u64,
    },
    /// The DMA API refused.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// Memory could not be had.
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
    /// A queue's memory was to be given back while the device could still
    /// use it: reset the device first.
    #[error("queue {queue}: the device is live (status {status:#x}); reset it first")]
    DeviceLive {
        /// The queue.
        queue: u16,
        /// The status.
        status: u32,
    },
}

/// A virtio-blk driver bound to one device; its queues are handed out to
/// the threads that drive them.
#[derive(Debug)]
pub struct BlkDriver {
    transport: MmioTransport,
    geometry: BlkGeometry,
    queues: Vec<Option<BlkQueue>>,
}

fn config_u32(t: &MmioTransport, at: usize) -> u32 {
    let mut b = [0u8; 4];
    t.read_config(at as u64, &mut b);
    u32::from_le_bytes(b)
}

/// Reads the configuration (§5.2.4), retrying while `ConfigGeneration`
/// moves (§4.2.2.2), a bounded number of times.
fn read_geometry(t: &MmioTransport, f: u64) -> BlkGeometry {
    let has = |bit: u32| f & 1 << bit != 0;
    let mut g = BlkGeometry {
        capacity_sectors: 0,
        seg_max: 1,
        size_max: u32::MAX,
        blk_size: 512,
        num_queues: 1,
        flush: has(blk::F_FLUSH),
    };
    for _ in 0..16 {
        let g0 = t.read(reg::CONFIG_GENERATION);
        let mut c = [0u8; 8];
        t.read_config(blk::CFG_CAPACITY as u64, &mut c);
        g.capacity_sectors = u64::from_le_bytes(c);
        if has(blk::F_SEG_MAX) {
            g.seg_max = config_u32(t, blk::CFG_SEG_MAX).max(1);
        }
        if has(blk::F_SIZE_MAX) {
            g.size_max = config_u32(t, blk::CFG_SIZE_MAX).max(512);
        }
        if has(blk::F_BLK_SIZE) {
            let b = config_u32(t, blk::CFG_BLK_SIZE);
            // §5.2.5: a driver ignores a block size it cannot use.
            g.blk_size = if b.is_power_of_two() && (512..=65536).contains(&b) {
                b
            } else {
                512
            };
        }
        if has(blk::F_MQ) {
            let mut n = [0u8; 2];
            t.read_config(blk::CFG_NUM_QUEUES as u64, &mut n);
            g.num_queues = u16::from_le_bytes(n).max(1);
        }
        if t.read(reg::CONFIG_GENERATION) == g0 {
            break;
        }
    }
    g
}

impl BlkDriver {
    /// Initialises the device behind `transport` (§3.1.1) on DMA device
    /// `dev` of `domain`, with `cfg.queues` request queues (at most the
    /// device's), each with its own DMA handle from `domain`.
    pub fn probe(
        transport: MmioTransport,
        domain: &Arc<DmaDomain>,
        dev: DmaDevice,
        cfg: BlkDriverConfig,
    ) -> Result<Self, BlkDriverError> {
        let init = Init::begin(
            &transport,
            &Wanted {
                device_id: blk::DEVICE_ID,
                required: &REQUIRED,
                optional: [
                    blk::F_SEG_MAX,
                    blk::F_SIZE_MAX,
                    blk::F_BLK_SIZE,
                    blk::F_FLUSH,
                    blk::F_MQ,
                ]
                .iter()
                .fold(0, |m, &bit| m | 1 << bit),
            },
        )?;
        // 7. device-specific setup: the config space, then the queues (an
        // error drops `init`, which fails the device).
        let geometry = read_geometry(&transport, init.features());
        check_config(&cfg, &geometry)?;
        let n = cfg.queues.min(geometry.num_queues);
        let mut queues = Vec::with_capacity(usize::from(n));
        for index in 0..n {
            let q = setup_queue(&init, domain, &dev, index, &cfg, &geometry)?;
            queues.push(Some(q));
        }
        init.driver_ok();
        let d = Self {
            transport,
            geometry,
            queues,
        };
        d.check_device()?;
        Ok(d)
    }

    /// What the device said of itself.
    pub fn geometry(&self) -> BlkGeometry {
        self.geometry
    }

    /// The register block.
    pub fn transport(&self) -> &MmioTransport {
        &self.transport
    }

    /// Request queues set up.
    pub fn queue_count(&self) -> u16 {
        self.queues.len() as u16
    }

    /// Takes queue `i` to drive it (from any thread); `None` if there is
    /// no such queue or it was taken.
    pub fn take_queue(&mut self, i: u16) -> Option<BlkQueue> {
        self.queues.get_mut(usize::from(i)).and_then(Option::take)
    }

    /// Takes every queue not yet taken, in order.
    pub fn take_queues(&mut self) -> Vec<BlkQueue> {
        self.queues.iter_mut().filter_map(Option::take).collect()
    }

    /// `Ok` while the device works; the device's first error once it has
    /// set `DEVICE_NEEDS_RESET`.
    pub fn check_device(&self) -> Result<(), BlkDriverError> {
        check_device(&self.transport)
    }

    /// Resets the device (§4.2.2.1: writing 0 to `Status`), which returns
    /// once no device thread uses any queue; the queues can then be
    /// released.
    pub fn reset(&self) {
        self.transport.write(reg::STATUS, 0);
    }
}

/// `Ok` while the device behind `t` works; its first error once it has set
/// `DEVICE_NEEDS_RESET`.
pub(crate) fn check_device(t: &MmioTransport) -> Result<(), BlkDriverError> {
    let st = t.status();
    if st & (status::DEVICE_NEEDS_RESET | status::FAILED) != 0 || st & status::DRIVER_OK == 0 {
        return Err(BlkDriverError::DeviceNeedsReset {
            status: st,
            first: t.errors().snapshot().into_iter().next(),
        });
    }
    Ok(())
}

/// The largest request a driver issues: 16 MiB.
pub const MAX_DRIVER_REQUEST: u64 = 16 << 20;

fn check_config(cfg: &BlkDriverConfig, g: &BlkGeometry) -> Result<(), BlkDriverError> {
    let bad = |field, value: u64, min: u64, max: u64| BlkDriverError::BadConfig {
        field,
        value,
        min,
        max,
    };
    let range = |field, value: u64, min: u64, max: u64| {
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(bad(field, value, min, max))
        }
    };
    range("queues", cfg.queues.into(), 1, 64)?;
    range("queue_size", cfg.queue_size.into(), 4, 32768)?;
    range(
        "depth",
        cfg.depth.into(),
        1,
        u64::from(cfg.queue_size / 3).max(1),
    )?;
    let max_pages = u64::from(g.seg_max).min(MAX_DRIVER_REQUEST / PAGE_SIZE);
    range(
        "max_request_bytes",
        cfg.max_request_bytes,
        PAGE_SIZE,
        max_pages * PAGE_SIZE,
    )?;
    if !cfg.max_request_bytes.is_multiple_of(PAGE_SIZE) {
        return Err(bad(
            "max_request_bytes",
            cfg.max_request_bytes,
            PAGE_SIZE,
            max_pages * PAGE_SIZE,
        ));
    }
    Ok(())
}

/// §4.2.3.2: select the queue, check it is free, size it, allocate and
/// program its ring, mark it ready; then its request slots.
fn setup_queue(
    init: &Init<'_>,
    domain: &Arc<DmaDomain>,
    dev: &DmaDevice,
    index: u16,
    cfg: &BlkDriverConfig,
    g: &BlkGeometry,
) -> Result<BlkQueue, BlkDriverError> {
    let size = init.queue_size(index, cfg.queue_size, 1)?;
    let layout = RingLayout::new(size);
    let q = BlkQueue::new(QueueParts {
        transport: init.transport().clone(),
        cpu: domain.cpu(),
        dev: dev.clone(),
        index,
        layout,
        depth: cfg.depth.min((size / 3).max(1)),
        small: cfg
            .small_slots
            .min((size / 3).max(1).saturating_sub(cfg.depth)),
        shared_small: cfg.shared_small,
        max_request_bytes: cfg.max_request_bytes,
        geometry: *g,
    })?;
    init.program_queue(index, size, q.ring_addresses());
    Ok(q)
}

impl From<InitError> for BlkDriverError {
    fn from(e: InitError) -> Self {
        match e {
            InitError::NotTheDevice {
                magic,
                version,
                device_id,
            } => Self::NotVirtioBlk {
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
