//! One error type for callers who want to use `?` across the crate's
//! layers: every layer's error converts into [`Error`], keeping the layer's
//! own typed error inside (match on it for the facts).

use crate::access::AccessError;
use crate::dma::DmaError;
use crate::hw::{HwError, QiError, TranslateError};
use crate::iova::IovaError;
use crate::mem::MemError;
use crate::pgtable::PgtableError;

/// Any error of the crate, by the layer that returned it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Physical memory.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// IOVA allocation.
    #[error(transparent)]
    Iova(#[from] IovaError),
    /// Page tables.
    #[error(transparent)]
    Pgtable(#[from] PgtableError),
    /// The IOMMU unit.
    #[error(transparent)]
    Hw(#[from] HwError),
    /// The invalidation queue.
    #[error(transparent)]
    Queue(#[from] QiError),
    /// A translation.
    #[error(transparent)]
    Translate(#[from] TranslateError),
    /// The DMA API.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// A device access.
    #[error(transparent)]
    Access(#[from] AccessError),
}
