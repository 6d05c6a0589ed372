//! [`DmaMapper`]: the part of a DMA API a device driver uses — map a
//! buffer for its device, unmap it, make queued unmaps take effect — as a
//! trait, so that a driver written against it runs over this crate's DMA
//! domain, which writes VT-d tables itself ([`BoundDma`]: a [`DmaCpu`]
//! bound to one device), or over another back-end: softiommu-virtio's
//! `ViommuDma`, whose map and unmap are virtio-iommu MAP and UNMAP
//! requests to a device that writes the tables.
//!
//! The contract every implementation keeps: the address a map returns
//! reaches the buffer for the device until the unmap; once
//! [`dma_flush`](DmaMapper::dma_flush) returns `Ok` after an unmap (at
//! once, under a strict policy), the device reaches nothing of it; an
//! address is never handed out again before that.

use super::{DmaCpu, DmaDevice, DmaDirection, DmaError};
use crate::mem::PhysAddr;

/// A DMA API a driver can be written against (see the module).
pub trait DmaMapper {
    /// Why a call failed.
    type Error: std::error::Error + Send + Sync + 'static;
    /// What a map hands out, to give back to the unmap.
    type Mapping: Copy + std::fmt::Debug;

    /// The device address of a mapping's first byte.
    fn dma_addr(m: &Self::Mapping) -> u64;

    /// Maps `len` bytes at `phys` for the device, moving in `dir`.
    fn dma_map(
        &mut self,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
    ) -> Result<Self::Mapping, Self::Error>;

    /// Unmaps what [`dma_map`](Self::dma_map) returned. Under a lazy or
    /// deferred policy the device may reach the buffer until the next
    /// [`dma_flush`](Self::dma_flush).
    fn dma_unmap(&mut self, m: Self::Mapping) -> Result<(), Self::Error>;

    /// Makes every unmap made before it take effect (a no-op under a
    /// strict policy).
    fn dma_flush(&mut self) -> Result<(), Self::Error>;
}

/// One mapping of a [`BoundDma`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundMapping {
    /// The device address of the buffer's first byte.
    pub addr: u64,
    /// The buffer's length.
    pub len: u64,
    /// The direction it was mapped in.
    pub dir: DmaDirection,
}

/// A [`DmaCpu`] bound to one of its domain's devices: the crate's DMA API
/// as a [`DmaMapper`].
#[derive(Debug)]
pub struct BoundDma {
    cpu: DmaCpu,
    dev: DmaDevice,
}

impl BoundDma {
    /// Binds `cpu` (a handle of `dev`'s domain) to `dev`.
    pub fn new(cpu: DmaCpu, dev: DmaDevice) -> Self {
        Self { cpu, dev }
    }

    /// The per-CPU handle, for the rest of the API.
    pub fn cpu(&mut self) -> &mut DmaCpu {
        &mut self.cpu
    }

    /// The per-CPU handle, read-only (its statistics).
    pub fn cpu_ref(&self) -> &DmaCpu {
        &self.cpu
    }

    /// The device.
    pub fn device(&self) -> &DmaDevice {
        &self.dev
    }
}

impl DmaMapper for BoundDma {
    type Error = DmaError;
    type Mapping = BoundMapping;

    fn dma_addr(m: &BoundMapping) -> u64 {
        m.addr
    }

    fn dma_map(
        &mut self,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
    ) -> Result<BoundMapping, DmaError> {
        let addr = self.cpu.map(&self.dev, phys, len, dir)?;
        Ok(BoundMapping { addr, len, dir })
    }

    fn dma_unmap(&mut self, m: BoundMapping) -> Result<(), DmaError> {
        self.cpu.unmap(&self.dev, m.addr, m.len, m.dir)
    }

    fn dma_flush(&mut self) -> Result<(), DmaError> {
        self.cpu.flush_own()
    }
}
