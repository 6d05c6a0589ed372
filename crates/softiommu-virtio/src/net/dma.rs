//! [`NetDma`]: what the virtio-net driver asks of its DMA API — the
//! core's [`DmaMapper`] (a map per posted buffer, an unmap per returned
//! one) and memory for its rings that the device reaches for the
//! driver's life.
//!
//! - [`BoundDma`] (the default): this crate's DMA domain, which writes
//!   the unit's tables itself; the rings are its coherent allocations
//!   (`dma_alloc_coherent`).
//! - Any other mapper, e.g. [`ViommuDma`](crate::viommu::ViommuDma), whose
//!   map and unmap are virtio-iommu MAP and UNMAP requests: the rings are
//!   frames of guest RAM mapped once, both ways, with the mapper (the
//!   provided methods), and unmapped and flushed before they are freed.

use softiommu::dma::{BoundDma, DmaDirection, DmaMapper};
use softiommu::mem::{PhysAddr, PhysMemory, PAGE_SIZE};

use super::driver::DriverError;

/// Ring memory the device reaches: where it is, the device's address of
/// it, and (for a mapper without coherent allocations) its mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingMemory<M> {
    /// Physical address of the first byte.
    pub phys: PhysAddr,
    /// The device's address of it.
    pub dma: u64,
    /// Bytes asked for.
    pub bytes: u64,
    /// The mapping to give back (`None` for a coherent allocation).
    pub mapping: Option<M>,
}

/// The DMA API the virtio-net driver runs on (see the module). Its errors
/// become [`DriverError`]s.
pub trait NetDma: DmaMapper<Error: Into<DriverError>> + std::fmt::Debug {
    /// Allocates `bytes` of zeroed memory from `mem` the device reaches,
    /// both ways, until [`ring_free`](Self::ring_free): frames mapped
    /// `Bidirectional` with [`dma_map`](DmaMapper::dma_map). A failed
    /// map frees the frames.
    fn ring_alloc(
        &mut self,
        mem: &PhysMemory,
        bytes: u64,
    ) -> Result<RingMemory<Self::Mapping>, DriverError> {
        let order = ring_order(bytes);
        let phys = mem.alloc_zeroed_frames(order)?;
        match self.dma_map(phys, bytes, DmaDirection::Bidirectional) {
            Ok(m) => Ok(RingMemory {
                phys,
                dma: Self::dma_addr(&m),
                bytes,
                mapping: Some(m),
            }),
            Err(e) => {
                mem.free_frames(phys, order)?;
                Err(e.into())
            }
        }
    }

    /// Gives back what [`ring_alloc`](Self::ring_alloc) returned: unmaps
    /// it, flushes (so the device reaches it no more), then frees the
    /// frames. If the unmap or the flush fails the frames are kept (the
    /// device may still reach them).
    fn ring_free(
        &mut self,
        mem: &PhysMemory,
        ring: RingMemory<Self::Mapping>,
    ) -> Result<(), DriverError> {
        if let Some(m) = ring.mapping {
            self.dma_unmap(m).map_err(Into::into)?;
        }
        self.dma_flush().map_err(Into::into)?;
        mem.free_frames(ring.phys, ring_order(ring.bytes))?;
        Ok(())
    }
}

/// The order of the smallest block of frames holding `bytes`.
fn ring_order(bytes: u64) -> u32 {
    bytes
        .div_ceil(PAGE_SIZE)
        .max(1)
        .next_power_of_two()
        .trailing_zeros()
}

impl NetDma for BoundDma {
    /// A coherent allocation of the domain (`mem` is the domain's).
    fn ring_alloc(
        &mut self,
        _mem: &PhysMemory,
        bytes: u64,
    ) -> Result<RingMemory<Self::Mapping>, DriverError> {
        let dev = self.device().clone();
        let (phys, dma) = self.cpu().alloc_coherent(&dev, bytes)?;
        Ok(RingMemory {
            phys,
            dma,
            bytes,
            mapping: None,
        })
    }

    fn ring_free(
        &mut self,
        _mem: &PhysMemory,
        ring: RingMemory<Self::Mapping>,
    ) -> Result<(), DriverError> {
        let dev = self.device().clone();
        self.cpu()
            .free_coherent(&dev, ring.phys, ring.dma, ring.bytes)?;
        Ok(())
    }
}

impl NetDma for crate::viommu::ViommuDma {}

#[cfg(test)]
mod tests {
    use super::ring_order;

    /// A ring of up to one page is one frame; larger ones the next power
    /// of two of pages (the arena's blocks).
    #[test]
    fn ring_order_is_the_smallest_block() {
        assert_eq!(
            [1, 4096, 4097, 3 * 4096, 5 * 4096].map(ring_order),
            [0, 0, 1, 2, 3]
        );
    }
}
