//! What a device records when a driver (or its memory) gives it bad input,
//! and the bounded log those records go to.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use softiommu::hw::Access;

/// One error a device or its transport recorded. Each says enough to find
/// the driver's mistake; none is a panic, and each that breaks a queue also
/// sets `DEVICE_NEEDS_RESET` (see the variant).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A register offset the layout does not have, or a misaligned one
    /// (§4.2.2: registers are 32 bits wide and aligned). Ignored.
    #[error("{op} of unknown register offset {offset:#x}")]
    BadRegister {
        /// The offset.
        offset: u64,
        /// "read" or "write".
        op: &'static str,
    },
    /// The driver cleared a status bit without a reset (§2.1.2: "The
    /// driver MUST NOT clear a device status bit"). Ignored.
    #[error("status bits {cleared:#x} cleared without a reset")]
    StatusBitCleared {
        /// The bits the write would have cleared.
        cleared: u32,
    },
    /// `FEATURES_OK` refused: the driver's features are not acceptable
    /// (§3.1.1 step 6: the device leaves the bit clear).
    #[error("features {driver:#x} refused: {reason}")]
    FeaturesRefused {
        /// What the driver wrote.
        driver: u64,
        /// Why.
        reason: &'static str,
    },
    /// A write not allowed in the device's status now (driver features
    /// after `FEATURES_OK`; a queue's layout while it is ready; a queue's
    /// registers or `QueueReady` before `FEATURES_OK` or once `FAILED` or
    /// `DEVICE_NEEDS_RESET` is set; `DRIVER_OK` after `FAILED`). Ignored.
    #[error("write to register {offset:#x} in status {status:#x} is not allowed now")]
    LateWrite {
        /// The register.
        offset: u64,
        /// The status at the time.
        status: u32,
    },
    /// `DRIVER_OK` without `FEATURES_OK` (§3.1.1 order). Sets
    /// `DEVICE_NEEDS_RESET`.
    #[error("DRIVER_OK written before FEATURES_OK (status {status:#x})")]
    DriverOkBeforeFeaturesOk {
        /// The status written.
        status: u32,
    },
    /// `QueueNum` of zero, above `QueueNumMax`, or not a power of two (§2.7:
    /// "Queue Size value is always a power of 2"). Sets
    /// `DEVICE_NEEDS_RESET`; the queue cannot be made ready.
    #[error("queue {queue}: size {size} refused (max {max}, must be a power of two)")]
    QueueSizeInvalid {
        /// The queue.
        queue: u16,
        /// The size written.
        size: u32,
        /// `QueueNumMax`.
        max: u16,
    },
    /// A ring address not aligned as §2.7's table requires, or `QueueReady`
    /// written with no valid size. Sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: {what} at {addr:#x} is not {align}-byte aligned")]
    QueueLayoutInvalid {
        /// The queue.
        queue: u16,
        /// Which area: "descriptor table", "available ring", "used ring",
        /// or "size" (no size set).
        what: &'static str,
        /// The address (or size).
        addr: u64,
        /// The alignment needed.
        align: u64,
    },
    /// A queue register written with `QueueSel` naming no queue. Ignored.
    #[error("queue {queue} does not exist ({queues} queues)")]
    NoSuchQueue {
        /// The selected queue.
        queue: u32,
        /// Queues the device has.
        queues: u16,
    },
    /// `QueueNotify` before `DRIVER_OK` (§3.1.1: the device must not be used
    /// before). Sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue} notified before DRIVER_OK (status {status:#x})")]
    NotifyBeforeDriverOk {
        /// The queue notified.
        queue: u32,
        /// The status at the time.
        status: u32,
    },
    /// A config-space write to a field the device does not let the driver
    /// write (all of virtio-net's we offer are read-only). Ignored.
    #[error("config-space write at offset {offset:#x} ignored")]
    ConfigWrite {
        /// Offset into the config space.
        offset: u64,
    },
    /// The available index moved more than a queue's size past the device's
    /// position: a driver publishing chains it never made (§2.7.6).
    /// Stops the queue, sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: available index {avail} is more than {size} past {next}")]
    AvailIndexTooFar {
        /// The queue.
        queue: u16,
        /// The index read.
        avail: u16,
        /// The device's next position.
        next: u16,
        /// The queue size.
        size: u16,
    },
    /// A chain head or `next` field past the descriptor table. Stops the
    /// queue, sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: descriptor index {index} is past the table of {size}")]
    DescriptorIndexOutOfRange {
        /// The queue.
        queue: u16,
        /// The index.
        index: u16,
        /// The queue size.
        size: u16,
    },
    /// A chain longer than the queue size: it loops (§2.7.5.2: a chain
    /// cannot be longer than the queue). Stops the queue, sets
    /// `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: chain from {head} is longer than the queue size {size} (a loop)")]
    ChainLoop {
        /// The queue.
        queue: u16,
        /// The chain's head.
        head: u16,
        /// The queue size.
        size: u16,
    },
    /// `VIRTQ_DESC_F_INDIRECT` used without `VIRTIO_F_INDIRECT_DESC`
    /// negotiated (§2.7.5.3.1). Stops the queue, sets `DEVICE_NEEDS_RESET`.
    #[error(
        "queue {queue}: indirect descriptor {index} but indirect descriptors were not negotiated"
    )]
    IndirectNotNegotiated {
        /// The queue.
        queue: u16,
        /// The descriptor.
        index: u16,
    },
    /// A queue made live with ring features the device's ring code does
    /// not implement (`VIRTIO_F_INDIRECT_DESC`, `VIRTIO_F_EVENT_IDX`,
    /// §6.3): a driver or transport that acknowledged a feature no device
    /// offers. The queue is not made. Sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: ring features {features:#x} are not implemented")]
    RingFeatureUnsupported {
        /// The queue.
        queue: u16,
        /// The unimplemented feature bits asked for.
        features: u64,
    },
    /// The device gave back a chain ([`DeviceQueue::unpop`]) it had not
    /// just taken, or had already completed or given back: moving the
    /// position back would hand the driver's chain out twice. The
    /// position is left where it was. A device's own mistake, not the
    /// driver's; sets `DEVICE_NEEDS_RESET` if recorded.
    ///
    /// [`DeviceQueue::unpop`]: super::DeviceQueue::unpop
    #[error("queue {queue}: no chain to give back before available entry {next_avail}")]
    UnpopWithoutPop {
        /// The queue.
        queue: u16,
        /// The device's position, unchanged.
        next_avail: u16,
    },
    /// A device-writable descriptor where the device must read (a transmit
    /// chain), or a readable one where it must write (a receive chain)
    /// (§2.7.5: transmit buffers are device-readable, receive buffers
    /// device-writable). Stops the queue, sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: descriptor {index} of the chain from {head} is {found}, the device needs it {needed}")]
    WrongDirection {
        /// The queue.
        queue: u16,
        /// The chain's head.
        head: u16,
        /// The offending descriptor.
        index: u16,
        /// "write-only" or "read-only".
        found: &'static str,
        /// "readable" or "writable".
        needed: &'static str,
    },
    /// A chain whose bytes do not hold what the device needs: shorter than
    /// the header, a frame past the largest the device allows, or a
    /// receive chain too small for the frame and shorter than the 1,526
    /// bytes §5.1.6.3.1 asks a driver to post (a frame that does not fit
    /// a chain of at least that size is the wire's doing: dropped and
    /// counted, no error). Stops the queue, sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: chain from {head} has {len} bytes, needs {min}..={max}")]
    ChainLength {
        /// The queue.
        queue: u16,
        /// The chain's head.
        head: u16,
        /// Bytes the chain has (saturated at `u32::MAX`).
        len: u64,
        /// The fewest bytes allowed.
        min: u64,
        /// The most bytes allowed.
        max: u64,
    },
    /// A `virtio_net_hdr` asking for an offload that was not negotiated
    /// (§5.1.6.2.1: without `VIRTIO_NET_F_CSUM` the driver must not set
    /// `NEEDS_CSUM`, without GSO features `gso_type` must be NONE). Stops
    /// the queue, sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: chain from {head}: header flags {flags:#x} gso_type {gso_type} not negotiated")]
    HeaderOffload {
        /// The queue.
        queue: u16,
        /// The chain's head.
        head: u16,
        /// `flags`.
        flags: u8,
        /// `gso_type`.
        gso_type: u8,
    },
    /// A block request chain without room for its header (16 readable
    /// bytes) and its status byte (1 writable byte), §5.2.6: the device
    /// cannot even say it failed. Stops the queue, sets
    /// `DEVICE_NEEDS_RESET` (as QEMU's "missing headers").
    #[error("queue {queue}: block request from {head} has {readable} readable and {writable} writable bytes, needs at least 16 and 1")]
    BlkRequestShape {
        /// The queue.
        queue: u16,
        /// The chain's head.
        head: u16,
        /// Device-readable bytes (saturated).
        readable: u64,
        /// Device-writable bytes (saturated).
        writable: u64,
    },
    /// A guest-supplied address whose area runs past the end of the 64-bit
    /// address space: a ring whose last byte would be past `u64::MAX`
    /// (found when the queue is made live), or a descriptor whose buffer
    /// wraps (found when its chain is walked). Stops the queue, sets
    /// `DEVICE_NEEDS_RESET`; the device computed no address from it.
    #[error("queue {queue}: {what} at {addr:#x} of {len} bytes runs past the end of the 64-bit address space")]
    AddressOverflow {
        /// The queue.
        queue: u16,
        /// "descriptor table", "available ring", "used ring", or "buffer".
        what: &'static str,
        /// The address the driver gave.
        addr: u64,
        /// The bytes the area holds (a ring's whole size, a descriptor's
        /// `len`).
        len: u64,
    },
    /// The device's back-end failed in a way no request's status can
    /// answer (an IOMMU unit that could not complete an invalidation the
    /// device owed): the device is unusable until reset. Sets
    /// `DEVICE_NEEDS_RESET`.
    #[error("the device's back-end failed: {what}")]
    BackendFailed {
        /// What failed.
        what: &'static str,
    },
    /// The IOMMU refused a DMA: an unmapped address, or a write to a
    /// read-only mapping. The unit has recorded the fault in its log; the
    /// device moved no byte. Stops the queue, sets `DEVICE_NEEDS_RESET`.
    #[error("queue {queue}: DMA {access} of {what} at IOVA {iova:#x} faulted: {reason}")]
    DmaFault {
        /// The queue.
        queue: u16,
        /// What the device was reaching: "descriptor", "available ring",
        /// "used ring", "buffer".
        what: &'static str,
        /// The IOVA (the first byte of the access).
        iova: u64,
        /// Read or write.
        access: Access,
        /// What the IOMMU said.
        reason: String,
    },
    /// A ring access was cancelled because the device is being stopped (a
    /// vhost-user ring stop cancelling a wait for the front-end's
    /// translation): not the driver's doing. The device moved no byte of
    /// it and leaves the chain on the ring, uncompleted.
    #[error(
        "queue {queue}: DMA {access} of {what} at IOVA {iova:#x} aborted: the device is stopping"
    )]
    DmaAborted {
        /// The queue.
        queue: u16,
        /// What the device was reaching, as for `DmaFault`.
        what: &'static str,
        /// The IOVA (the first byte of the access).
        iova: u64,
        /// Read or write.
        access: Access,
    },
}

impl DeviceError {
    /// Whether this error stops a queue and sets `DEVICE_NEEDS_RESET`.
    pub fn needs_reset(&self) -> bool {
        !matches!(
            self,
            DeviceError::BadRegister { .. }
                | DeviceError::StatusBitCleared { .. }
                | DeviceError::FeaturesRefused { .. }
                | DeviceError::LateWrite { .. }
                | DeviceError::NoSuchQueue { .. }
                | DeviceError::ConfigWrite { .. }
        )
    }
}

/// The errors a device recorded: the first [`ErrorLog::CAPACITY`] kept, the
/// rest counted (a misbehaving driver cannot make the log grow without
/// bound).
#[derive(Debug, Default)]
pub struct ErrorLog {
    kept: Mutex<VecDeque<DeviceError>>,
    total: AtomicU64,
}

impl ErrorLog {
    /// Records kept before the rest are only counted.
    pub const CAPACITY: usize = 64;

    /// Records `e` (a slow path: a lock).
    pub fn record(&self, e: DeviceError) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < Self::CAPACITY {
            kept.push_back(e);
        }
    }

    /// Takes the kept records, oldest first.
    pub fn drain(&self) -> Vec<DeviceError> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.drain(..).collect()
    }

    /// A copy of the kept records, oldest first.
    pub fn snapshot(&self) -> Vec<DeviceError> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter().cloned().collect()
    }

    /// Errors recorded over the log's life, kept or not.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}
