//! Why a device access failed.

use crate::dma::DmaDirection;
use crate::hw::{SourceId, TranslateError};
use crate::mem::MemError;

/// Why a DMA access (or a zero-copy mapping) failed. Whatever the variant,
/// **nothing was copied**: a failed read leaves the caller's buffer as it
/// was and a failed write or fill has changed no byte of guest memory (see
/// the [module documentation](super) on partial accesses).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The unit refused the translation. Every variant of the inner error
    /// but `ZeroLength` is a device fault, also recorded in the unit's
    /// fault log ([`Unit::faults`](crate::hw::Unit::faults)).
    #[error(transparent)]
    Translate(#[from] TranslateError),
    /// The translation named physical memory that does not exist (a
    /// pass-through device addressing past the end of RAM; a master abort
    /// on real hardware, not an IOMMU fault, so not in the fault log).
    #[error("{sid}: iova {iova:#x} translates outside physical memory: {source}")]
    Memory {
        /// The requester.
        sid: SourceId,
        /// The access's first address.
        iova: u64,
        /// What memory said.
        source: MemError,
    },
    /// An access through a mapping beyond its end.
    #[error("offset {offset:#x}+{len:#x} is past the end of a {size:#x}-byte mapping")]
    OutOfMapping {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The mapping's length.
        size: u64,
    },
    /// An access through a mapping in a direction it was not made for.
    #[error("a {asked} access through a mapping made {made:?}")]
    WrongDirection {
        /// "read" or "write".
        asked: &'static str,
        /// The direction the mapping was made for.
        made: DmaDirection,
    },
}

impl AccessError {
    /// Whether this error is a device fault: a translation the unit
    /// refused and recorded in its fault log. A zero-length access is a
    /// caller error, not a fault (it is logged as a malformed request, but
    /// no translation was refused), and a page request is not a failure;
    /// for both this is `false`, as for every other variant.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            AccessError::Translate(e)
                if e.reason().is_some() && !matches!(e, TranslateError::ZeroLength { .. })
        )
    }
}
