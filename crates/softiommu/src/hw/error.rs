//! The errors of `hw`: of a translation (each also a recorded fault), of
//! the driver's queue operations, and of configuring units and contexts.

use super::context::SourceId;
use super::context::UnitId;
use super::fault::{Access, FaultReason};
use super::inv_queue::QueueFault;
use crate::mem::{MemError, PhysAddr};
use crate::pgtable::Perm;

/// Why a translation failed. Every variant is also recorded in the unit's
/// fault log ([`ZeroLength`] as a malformed request).
///
/// [`ZeroLength`]: TranslateError::ZeroLength
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// An access of no bytes (a caller error, not a fault).
    #[error("{sid}: zero-length access at {iova:#x}")]
    ZeroLength {
        /// The requester.
        sid: SourceId,
        /// The address.
        iova: u64,
    },
    /// An access longer than the unit serves in one translation
    /// ([`UnitConfig::max_access_bytes`](super::UnitConfig::max_access_bytes)):
    /// the work one request may cause is bounded, as a bus bounds a burst.
    #[error("{sid}: access of {len:#x} bytes at {iova:#x} exceeds the {max:#x}-byte maximum")]
    TooLong {
        /// The requester.
        sid: SourceId,
        /// The address.
        iova: u64,
        /// The length asked for.
        len: u64,
        /// The longest access served.
        max: u64,
    },
    /// Not a failure yet: the device may fault (page requests enabled), so
    /// the miss raised page request group `prgi`. The device leaves its
    /// section, waits for the answer
    /// ([`Translator::wait_page_response`](super::Translator::wait_page_response))
    /// and retries. Not recorded as a fault.
    #[error("{sid}: {access} of {iova:#x} raised page request group {prgi}")]
    PageRequested {
        /// The requester.
        sid: SourceId,
        /// The address that missed.
        iova: u64,
        /// The access.
        access: Access,
        /// The page request group index to wait for.
        prgi: u16,
    },
    /// A page request was answered `Invalid` or `Failure`, found the queue
    /// full, or went unanswered past the deadline: the access fails.
    #[error("{sid}: the page request for {access} of {iova:#x} was refused")]
    PageRequestDenied {
        /// The requester.
        sid: SourceId,
        /// The address.
        iova: u64,
        /// The access.
        access: Access,
    },
    /// The device has no context in this unit.
    #[error("{sid}: no context")]
    NoContext {
        /// The requester.
        sid: SourceId,
    },
    /// The device's context blocks it.
    #[error("{sid}: context blocks all requests")]
    ContextBlocked {
        /// The requester.
        sid: SourceId,
    },
    /// The address is past the context's address width.
    #[error("{sid}: address {iova:#x} is past the {width}-bit width")]
    AddressTooWide {
        /// The requester.
        sid: SourceId,
        /// The first address that cannot be translated.
        iova: u64,
        /// The width in bits.
        width: u32,
    },
    /// Nothing maps the address.
    #[error("{sid}: {access} of unmapped address {iova:#x}")]
    NotPresent {
        /// The requester.
        sid: SourceId,
        /// The first unmapped address of the access.
        iova: u64,
        /// Read or write.
        access: Access,
    },
    /// The mapping does not allow the access.
    #[error("{sid}: {access} of {iova:#x}, mapped {allowed}")]
    PermissionDenied {
        /// The requester.
        sid: SourceId,
        /// The address.
        iova: u64,
        /// Read or write.
        access: Access,
        /// What the mapping allows.
        allowed: Perm,
    },
    /// A table entry on the walk has a reserved bit set.
    #[error("{sid}: reserved bits in the level-{level} entry {raw:#x} for {iova:#x}")]
    ReservedEntry {
        /// The requester.
        sid: SourceId,
        /// The address.
        iova: u64,
        /// The entry's level.
        level: u32,
        /// The raw entry.
        raw: u64,
    },
    /// A table address on the walk lies outside physical memory.
    #[error("{sid}: level-{level} table {table:#x} for {iova:#x} is outside memory")]
    BadTableAddress {
        /// The requester.
        sid: SourceId,
        /// The address.
        iova: u64,
        /// The level of the table.
        level: u32,
        /// Its address.
        table: PhysAddr,
    },
    /// An untranslated (pass-through) access names a bounce pool's frame:
    /// RAM, but the DMA layer's, reachable only through the mappings the
    /// pool's own domain made of it.
    #[error("{sid}: {access} of {iova:#x} names a bounce pool's frame")]
    BounceFrame {
        /// The requester.
        sid: SourceId,
        /// The address (the physical address too).
        iova: u64,
        /// Read or write.
        access: Access,
    },
}

impl TranslateError {
    /// The fault reason recorded for it (`None` for a caller error).
    pub fn reason(&self) -> Option<FaultReason> {
        Some(match self {
            TranslateError::ZeroLength { .. } => FaultReason::ZeroLength,
            TranslateError::TooLong { .. } => FaultReason::TooLong,
            TranslateError::PageRequested { .. } => return None,
            TranslateError::PageRequestDenied { .. } => FaultReason::PageRequestDenied,
            TranslateError::NoContext { .. } => FaultReason::NoContext,
            TranslateError::ContextBlocked { .. } => FaultReason::ContextBlocked,
            TranslateError::AddressTooWide { .. } => FaultReason::AddressTooWide,
            TranslateError::NotPresent { .. } => FaultReason::NotPresent,
            TranslateError::PermissionDenied { .. } => FaultReason::PermissionDenied,
            TranslateError::ReservedEntry { .. } => FaultReason::ReservedEntry,
            TranslateError::BadTableAddress { .. } => FaultReason::BadTableAddress,
            TranslateError::BounceFrame { .. } => FaultReason::BounceFrame,
        })
    }
}

/// Why a queue operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QiError {
    /// The queue stopped on an invalidation-queue error before this
    /// operation completed; see [`Unit::recover_queue`](super::Unit::recover_queue).
    #[error("invalidation queue stopped: {0:?}")]
    Stopped(QueueFault),
    /// The calling thread holds a translation guard of this unit: waiting
    /// for the unit to drain would wait for itself.
    #[error("the calling thread holds a translation guard of this unit")]
    GuardHeld,
    /// The queue carries nothing more: the unit is shutting down, or its
    /// queue thread is gone (it died; see
    /// [`Unit::inject_queue_thread_death`](super::Unit::inject_queue_thread_death)).
    #[error("the unit's invalidation queue is shut down")]
    ShutDown,
    /// A page group response for a group index that does not fit VT-d's
    /// 9-bit field (not below [`PRG_INDICES`](super::PRG_INDICES)): nothing
    /// is queued (truncated, it would answer another group).
    #[error("page request group index {prgi} exceeds the 9-bit field")]
    GroupIndexTooLarge {
        /// The index asked for.
        prgi: u16,
    },
    /// A bounded wait ([`InvBatch::wait_timeout`](super::InvBatch::wait_timeout),
    /// [`Unit::attach_bounded`](super::Unit::attach_bounded)) gave up: the
    /// wait had not completed after `timeout` (its drain found a
    /// translation section still open: a device parked or hostile inside
    /// one). The descriptors stay queued and complete later; nothing
    /// about them is promised until then.
    #[error("the invalidation's wait did not complete within {timeout:?}")]
    InvalidationTimeout {
        /// The bound that passed.
        timeout: std::time::Duration,
    },
    /// A bounded wait gave up before its bound because its caller asked
    /// it to (its `give_up` returned `true`: the caller is stopping).
    /// Promises what [`InvalidationTimeout`](Self::InvalidationTimeout)
    /// does: nothing.
    #[error("the invalidation's wait was abandoned")]
    WaitAbandoned,
    /// Physical memory refused a descriptor write.
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// Why configuring a unit, a context or a system failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HwError {
    /// A configuration value is out of range.
    #[error("unit configuration: {field} = {value} is out of range")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// `DrainBarrier::Membarrier` was asked for and the kernel lacks it.
    #[error("membarrier(PRIVATE_EXPEDITED) is not available")]
    MembarrierUnavailable,
    /// A domain id beyond the unit's domain count.
    #[error("domain id {did} is beyond the unit's {domains} domains")]
    DomainOutOfRange {
        /// The DID.
        did: u16,
        /// The number of domains.
        domains: u32,
    },
    /// A translated context with a domain id another owner claimed
    /// ([`Unit::claim_domain_ids`](super::Unit::claim_domain_ids)).
    #[error("domain id {did} is claimed by another owner")]
    DomainIdClaimed {
        /// The DID.
        did: u16,
    },
    /// A claim of domain ids of which one is in use: a context uses it,
    /// or another claim holds it.
    #[error("domain id {did} is in use")]
    DomainIdInUse {
        /// The lowest such DID.
        did: u16,
    },
    /// A table root that is not a 4 KiB-aligned page of physical memory.
    #[error("page-table root {root:#x} is not an aligned page of physical memory")]
    BadRoot {
        /// The root.
        root: PhysAddr,
    },
    /// A domain id already bound to another table root.
    #[error("domain {did} uses root {bound:#x}, not {asked:#x}")]
    DomainRootMismatch {
        /// The DID.
        did: u16,
        /// The root its devices use.
        bound: PhysAddr,
        /// The root asked for.
        asked: PhysAddr,
    },
    /// Every translator slot of the unit is taken.
    #[error("all {max} translator slots are in use")]
    TooManyTranslators {
        /// The unit's limit.
        max: usize,
    },
    /// No such unit in the system.
    #[error("no unit {0:?}")]
    UnknownUnit(UnitId),
    /// The device belongs to another unit.
    #[error("{sid} belongs to unit {unit:?}")]
    DeviceInOtherUnit {
        /// The device.
        sid: SourceId,
        /// Its unit.
        unit: UnitId,
    },
    /// The device belongs to no unit.
    #[error("{sid} belongs to no unit")]
    DeviceNotAssigned {
        /// The device.
        sid: SourceId,
    },
    /// The device is attached to a DMA domain already: detach it there
    /// first.
    #[error("device {sid} is attached to another DMA domain")]
    DeviceOwned {
        /// The device.
        sid: SourceId,
    },
    /// A queue operation failed.
    #[error(transparent)]
    Queue(#[from] QiError),
    /// Physical memory refused.
    #[error(transparent)]
    Mem(#[from] MemError),
}
