//! [`ViommuDma`] as the core's [`DmaMapper`]: a driver written against
//! the DMA API runs over a virtio-iommu device unchanged — its map and
//! unmap become MAP and UNMAP requests, its flush the lazy mode's flush.

use softiommu::dma::{DmaDirection, DmaMapper};
use softiommu::mem::PhysAddr;

use super::dma::{ViommuDma, ViommuDmaError, ViommuMapping};

impl DmaMapper for ViommuDma {
    type Error = ViommuDmaError;
    type Mapping = ViommuMapping;

    fn dma_addr(m: &ViommuMapping) -> u64 {
        m.iova
    }

    fn dma_map(
        &mut self,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
    ) -> Result<ViommuMapping, ViommuDmaError> {
        self.map(phys, len, dir)
    }

    fn dma_unmap(&mut self, m: ViommuMapping) -> Result<(), ViommuDmaError> {
        self.unmap(m)
    }

    fn dma_flush(&mut self) -> Result<(), ViommuDmaError> {
        self.flush()
    }
}
