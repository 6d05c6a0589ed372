//! A device as the DMA API sees it: its source id, its DMA mask, which unit
//! it sits behind, whether it is trusted.

use std::sync::Arc;

use super::domain::DmaDomain;
use crate::hw::SourceId;

/// A device attached to a [`DmaDomain`]; made by [`DmaDomain::attach`].
#[derive(Debug, Clone)]
pub struct DmaDevice {
    pub(crate) domain: Arc<DmaDomain>,
    pub(crate) sid: SourceId,
    pub(crate) mask: u64,
    pub(crate) limit_pfn: u64,
    pub(crate) untrusted: bool,
    /// The domain's bounce pool this device reaches (below its mask).
    pub(crate) bounce: Option<usize>,
}

impl DmaDevice {
    /// The device's PCI source id.
    pub fn source_id(&self) -> SourceId {
        self.sid
    }

    /// The device's DMA mask (highest address it can put on the bus).
    pub fn dma_mask(&self) -> u64 {
        self.mask
    }

    /// Whether its buffers are always bounced.
    pub fn is_untrusted(&self) -> bool {
        self.untrusted
    }

    /// The domain it belongs to.
    pub fn domain(&self) -> &Arc<DmaDomain> {
        &self.domain
    }
}
