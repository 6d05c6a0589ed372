//! [`PhysGuestMemory`]: softiommu's [`PhysMemory`] as a vm-memory
//! [`GuestMemoryBackend`] (one region, guest physical address = arena
//! offset), so that `IommuMemory` can sit on the same bytes the unit's
//! page tables and the DMA API use. No copy: slices point into the arena.
//!
//! (It adapts `mem` to vm-memory and would sit in `mem`; it lives here
//! because `access` owns the vm-memory integration for now.)

use std::sync::Arc;

use vm_memory::bitmap::BS;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryRegion, GuestMemoryRegionBytes,
    GuestUsize, MemoryRegionAddress, VolatileSlice,
};

use crate::mem::PhysMemory;

/// The arena as one vm-memory region starting at guest address 0.
#[derive(Debug, Clone)]
pub struct PhysRegion {
    mem: Arc<PhysMemory>,
}

impl GuestMemoryRegion for PhysRegion {
    type B = ();

    fn len(&self) -> GuestUsize {
        self.mem.size()
    }

    fn start_addr(&self) -> GuestAddress {
        GuestAddress(0)
    }

    fn bitmap(&self) -> BS<'_, ()> {}

    fn get_host_address(&self, addr: MemoryRegionAddress) -> vm_memory::GuestMemoryResult<*mut u8> {
        self.mem
            .device_ptr(addr.0, 0)
            .ok()
            .filter(|_| addr.0 < self.mem.size())
            .ok_or(GuestMemoryError::InvalidBackendAddress)
    }

    fn get_slice(
        &self,
        offset: MemoryRegionAddress,
        count: usize,
    ) -> vm_memory::GuestMemoryResult<VolatileSlice<'_, BS<'_, ()>>> {
        let p = self
            .mem
            .device_ptr(offset.0, count as u64)
            .map_err(|_| GuestMemoryError::InvalidBackendAddress)?;
        // SAFETY: `device_ptr` checked that `[offset, offset + count)` lies
        // in the arena's RAM (never the IOMMU's reserve), which lives as long as `self.mem`, borrowed by the
        // slice's lifetime. The arena is memory the guest, devices and the
        // unit share: exactly what volatile slices are for.
        Ok(unsafe { VolatileSlice::new(p, count) })
    }
}

impl GuestMemoryRegionBytes for PhysRegion {}

/// softiommu's physical memory as a vm-memory backend: give it to
/// `vm_memory::IommuMemory::new` with a [`UnitIommu`](super::UnitIommu).
#[derive(Debug, Clone)]
pub struct PhysGuestMemory {
    region: PhysRegion,
}

impl PhysGuestMemory {
    /// The backend over `mem`.
    pub fn new(mem: Arc<PhysMemory>) -> Self {
        Self {
            region: PhysRegion { mem },
        }
    }

    /// The arena underneath.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.region.mem
    }
}

impl GuestMemoryBackend for PhysGuestMemory {
    type R = PhysRegion;

    fn num_regions(&self) -> usize {
        1
    }

    fn find_region(&self, addr: GuestAddress) -> Option<&PhysRegion> {
        (addr.0 < self.region.mem.size()).then_some(&self.region)
    }

    fn iter(&self) -> impl Iterator<Item = &PhysRegion> {
        std::iter::once(&self.region)
    }
}
