//! Errors of on-demand mapping.

use crate::hw::{HwError, QiError, SourceId};
use crate::mem::{MemError, PhysAddr};
use crate::pgtable::PgtableError;

/// What went wrong with an [`IopfDomain`](super::IopfDomain) or an
/// [`IopfHandler`](super::IopfHandler) call. A failed call changes
/// nothing, with two documented exceptions that leave a consistent partial
/// result: [`map_all`](super::IopfDomain::map_all) keeps the runs it mapped
/// before running out of frames, and [`reclaim`](super::IopfDomain::reclaim)
/// finishes the runs it cleared before the table refused one (each page
/// ends reclaimed — unmapped, invalidated — or untouched). A reclaim that
/// fenced a device ([`SectionsFenced`](Self::SectionsFenced)) finished.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IopfError {
    /// A configuration value is out of range.
    #[error("{name} = {value} is outside [1, {max}]")]
    InvalidConfig {
        /// The field.
        name: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A region of no bytes, or with no rights.
    #[error("the region at {iova:#x} is empty or grants nothing")]
    EmptyRegion {
        /// Its IOVA.
        iova: u64,
    },
    /// An address or length that is not page aligned.
    #[error("{iova:#x} -> {phys:#x} + {len:#x} is not page aligned")]
    Unaligned {
        /// The IOVA.
        iova: u64,
        /// The physical address (0 where none applies).
        phys: PhysAddr,
        /// The length.
        len: u64,
    },
    /// A region larger than [`MAX_REGION_BYTES`](super::MAX_REGION_BYTES).
    #[error("a region of {len:#x} bytes is larger than {max:#x}")]
    RegionTooLarge {
        /// The length.
        len: u64,
        /// The largest.
        max: u64,
    },
    /// A range past the 48-bit IOVA width.
    #[error("{iova:#x} + {len:#x} is beyond the 48-bit IOVA width")]
    BeyondWidth {
        /// The IOVA.
        iova: u64,
        /// The length.
        len: u64,
    },
    /// A region overlapping another.
    #[error("the region {iova:#x} + {len:#x} overlaps another")]
    Overlap {
        /// The IOVA.
        iova: u64,
        /// The length.
        len: u64,
    },
    /// A reclaim of a range with nothing mapped in it.
    #[error("nothing is mapped in {iova:#x} + {len:#x}")]
    NotMapped {
        /// The IOVA.
        iova: u64,
        /// The length.
        len: u64,
    },
    /// The device is not attached to this domain.
    #[error("device {sid} is not attached to this domain")]
    NotAttached {
        /// The device.
        sid: SourceId,
    },
    /// A reclaim finished — its pages unmapped, every unit's cached
    /// translations of them dropped — but `sections` translation sections
    /// that began before it were still open after
    /// [`IopfConfig::fence_timeout`](super::IopfConfig::fence_timeout) and
    /// were fenced instead of waited for: their devices' next accesses to
    /// the pages fault, but until those sections end they may still use
    /// what they translated before. The backing stays the region's and the
    /// freed table pages were leaked; `Unit::fenced_sections_open` says
    /// when the sections have ended.
    #[error(
        "reclaimed {pages} pages, but {sections} translation section(s) still open after the fence timeout were fenced"
    )]
    SectionsFenced {
        /// Pages reclaimed.
        pages: u64,
        /// Sections not waited for.
        sections: u64,
    },
    /// An attach or detach finished — `sid`'s context set (`attached`) or
    /// removed, its page requests routed or cancelled — but `sections`
    /// translation sections of its unit still open after
    /// [`IopfConfig::fence_timeout`](super::IopfConfig::fence_timeout)
    /// were fenced instead of waited for (a device parked in one cannot
    /// hold the call up without limit). Until they end, a device inside
    /// one may still use what it translated under the old context;
    /// `Unit::fenced_sections_open` says when they have ended.
    #[error(
        "the context of device {sid} was {}, but {sections} translation section(s) still open after the fence timeout were fenced",
        if *attached { "set" } else { "removed" }
    )]
    ContextFenced {
        /// The device attached or detached.
        sid: SourceId,
        /// Whether it was an attach (else a detach).
        attached: bool,
        /// Sections not waited for.
        sections: u64,
    },
    /// The handler's threads could not be started.
    #[error("could not start a page request handler thread")]
    Spawn,
    /// Physical memory refused (the backing is outside the arena or in the
    /// IOMMU's own frames).
    #[error(transparent)]
    Mem(#[from] MemError),
    /// The page table refused.
    #[error(transparent)]
    Pgtable(#[from] PgtableError),
    /// The unit refused.
    #[error(transparent)]
    Hw(#[from] HwError),
    /// The invalidation queue failed.
    #[error(transparent)]
    Queue(#[from] QiError),
}
