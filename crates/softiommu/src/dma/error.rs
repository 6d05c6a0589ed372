//! Errors of the DMA API.

use super::policy::DmaDirection;
use crate::hw::{HwError, QiError};
use crate::iova::IovaError;
use crate::mem::MemError;
use crate::pgtable::PgtableError;

/// What went wrong with a DMA API call. A failed call changes nothing: no
/// mapping is lost or left half made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// A zero-length buffer, or a scatter list with a zero-length entry.
    #[error("zero-length DMA buffer")]
    ZeroLength,
    /// The buffer lies (partly) above what the device's DMA mask reaches.
    #[error("buffer {addr:#x}+{len:#x} is beyond the device's DMA mask {mask:#x}")]
    BeyondMask {
        /// The buffer.
        addr: u64,
        /// Its length.
        len: u64,
        /// The device's mask.
        mask: u64,
    },
    /// The device's mask leaves no IOVA space in the domain.
    #[error("DMA mask {mask:#x} is too small for any IOVA of the domain")]
    MaskTooSmall {
        /// The mask.
        mask: u64,
    },
    /// No IOVA space is left for the mapping, even after flushing.
    #[error("out of IOVA space for {len:#x} bytes")]
    NoSpace {
        /// The length asked for.
        len: u64,
    },
    /// The address is not a live mapping of this domain (never mapped, or
    /// unmapped already).
    #[error("DMA address {addr:#x} is not mapped")]
    NotMapped {
        /// The address.
        addr: u64,
    },
    /// The address is mapped, but with another length.
    #[error("DMA address {addr:#x} was mapped with another length than {len:#x}")]
    WrongLength {
        /// The address.
        addr: u64,
        /// The length given.
        len: u64,
    },
    /// Switching to or from pass-through while mappings are live would
    /// strand them.
    #[error("cannot switch to or from pass-through with {live} mappings live")]
    PolicySwitchBusy {
        /// Mappings live at the time.
        live: u64,
    },
    /// An untrusted device and pass-through: attaching one to a domain in
    /// pass-through, or switching a domain with one attached to
    /// pass-through, is refused (an untrusted device is always
    /// translated and bounced; Linux never gives one an identity domain).
    #[error("untrusted device {sid} cannot be in pass-through")]
    UntrustedPassthrough {
        /// The untrusted device.
        sid: String,
    },
    /// No bounce pool lies below the device's DMA mask (bounce buffering
    /// is off for the domain, or no pool fits under the mask).
    #[error("no bounce pool reachable with DMA mask {mask:#x}")]
    BounceUnavailable {
        /// The device's mask.
        mask: u64,
    },
    /// The bounce pool is full.
    #[error("bounce pool exhausted for {len:#x} bytes")]
    BounceFull {
        /// The length asked for.
        len: u64,
    },
    /// The domain spans more units than a flush can track (64).
    #[error("a domain spans at most 64 IOMMU units")]
    TooManyUnits,
    /// The device is attached to another domain than this handle's.
    #[error("device {sid} belongs to another DMA domain")]
    WrongDomain {
        /// The device's source id, as text.
        sid: String,
    },
    /// The device is not attached to this domain (detached already).
    #[error("device {sid} is not attached to this DMA domain")]
    NotAttached {
        /// The device's source id, as text.
        sid: String,
    },
    /// The device is not the one the allocation or mapping was made for
    /// (a coherent free, or an unmap or sync of a streaming mapping or
    /// scatter list, through another device of the domain).
    #[error("the allocation or mapping belongs to another device than {sid}")]
    WrongDevice {
        /// The device given, as text.
        sid: String,
    },
    /// An unmap (or scatter-list unmap) names another direction than the
    /// map did, as DMA-API debug reports; nothing was unmapped.
    #[error("DMA address {addr:#x} was mapped {mapped:?}, not {asked:?}")]
    WrongDirection {
        /// The address.
        addr: u64,
        /// The direction it was mapped in.
        mapped: DmaDirection,
        /// The direction given.
        asked: DmaDirection,
    },
    /// The physical address is not a live coherent allocation of this
    /// domain (never allocated, freed already, or other memory).
    #[error("physical address {phys:#x} is not a live coherent allocation of this domain")]
    NotCoherent {
        /// The address.
        phys: u64,
    },
    /// The output slice is shorter than the scatter list.
    #[error("output holds {given} entries, the scatter list needs {needed}")]
    OutputTooShort {
        /// Entries needed.
        needed: usize,
        /// Entries given.
        given: usize,
    },
    /// A deferred unmap found its CPU's flush queue full and could not
    /// flush it (see `DmaStats::flush_failures`).
    #[error("the flush queue ({capacity} entries) is full")]
    QueueFull {
        /// The queue's capacity.
        capacity: usize,
    },
    /// A configuration value is out of range.
    #[error("{name} = {value:#x} is larger than the maximum {max:#x}")]
    InvalidConfig {
        /// The field.
        name: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A run-time tunable is out of range.
    #[error("{name} = {value} is outside [{min}, {max}]")]
    InvalidTunable {
        /// The tunable.
        name: &'static str,
        /// The value given.
        value: u64,
        /// The smallest accepted.
        min: u64,
        /// The largest accepted.
        max: u64,
    },
    /// The flush timer thread could not be started.
    #[error("could not start the flush timer thread")]
    TimerSpawn,
    /// IOVA allocation failed for another reason.
    #[error(transparent)]
    Iova(#[from] IovaError),
    /// The page table refused.
    #[error(transparent)]
    Pgtable(#[from] PgtableError),
    /// The IOMMU unit refused.
    #[error(transparent)]
    Hw(#[from] HwError),
    /// The invalidation queue failed.
    #[error(transparent)]
    Queue(#[from] QiError),
    /// Physical memory refused.
    #[error(transparent)]
    Mem(#[from] MemError),
}
