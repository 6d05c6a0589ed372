//! [`PhysGuestMemory`]: softiommu's [`PhysMemory`] as a vm-memory
//! [`GuestMemoryBackend`] (one region, guest physical address = arena
//! offset), so that `IommuMemory` can sit on the same bytes the unit's
//! page tables and the DMA API use. No copy: slices point into the arena.
//!
//! Two views, by what stands in front of them:
//!
//! - [`PhysGuestMemory::new`]: a device's memory with no IOMMU in front
//!   (a device that is not behind the unit, such as the virtio-iommu
//!   itself). A slice is handed out only for RAM that holds no IOMMU
//!   frame: never the reserve (tables, queues), never a bounce pool.
//!   vm-memory asks for one slice per region, so a range running over
//!   such a frame is refused whole, with nothing read or written.
//! - [`PhysGuestMemory::behind_iommu`]: the backend of an `IommuMemory`
//!   whose translations a [`UnitIommu`](super::UnitIommu) vets: RAM only
//!   (never the reserve), bounce pools included, because a domain's own
//!   mappings of its pool are how its device reaches it; what the device
//!   may not reach, the translation refuses (a pass-through context
//!   refuses every pool frame).
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
    /// Whether an IOMMU's translation vetted every address asked for (the
    /// bounce pools are then reachable); else every IOMMU frame is refused.
    translated: bool,
}

impl PhysRegion {
    /// A pointer to `[addr, addr + len)` if this view may reach it.
    #[inline]
    fn ptr(&self, addr: u64, len: u64) -> Option<*mut u8> {
        if !self.translated {
            self.mem.check_device_range(addr, len).ok()?;
        }
        self.mem.device_ptr(addr, len).ok()
    }
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
        self.ptr(addr.0, 1)
            .ok_or(GuestMemoryError::InvalidBackendAddress)
    }

    fn get_slice(
        &self,
        offset: MemoryRegionAddress,
        count: usize,
    ) -> vm_memory::GuestMemoryResult<VolatileSlice<'_, BS<'_, ()>>> {
        let p = self
            .ptr(offset.0, count as u64)
            .ok_or(GuestMemoryError::InvalidBackendAddress)?;
        // SAFETY: `ptr` checked that `[offset, offset + count)` lies in the
        // arena's RAM (never the IOMMU's reserve), which lives as long as
        // `self.mem`, borrowed by the slice's lifetime. The arena is memory
        // the guest, devices and the unit share: exactly what volatile
        // slices are for.
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
    /// The memory of a device with no IOMMU in front of it: RAM that holds
    /// no IOMMU frame (neither the reserve nor a bounce pool); a range
    /// touching one is refused whole (`InvalidBackendAddress`).
    pub fn new(mem: Arc<PhysMemory>) -> Self {
        Self {
            region: PhysRegion {
                mem,
                translated: false,
            },
        }
    }

    /// The backend of an `IommuMemory` over a [`UnitIommu`](super::UnitIommu)
    /// with its IOMMU enabled: RAM (never the reserve), where the unit's
    /// translation decides which bounce pool frames the device reaches.
    /// Not for a device with no IOMMU in front: use [`new`](Self::new).
    pub fn behind_iommu(mem: Arc<PhysMemory>) -> Self {
        Self {
            region: PhysRegion {
                mem,
                translated: true,
            },
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
