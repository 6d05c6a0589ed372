//! IOPF mode, shared by every host of this crate and asked for the same
//! way for each (`HostConfig::iopf`, `BlkHostConfig::iopf`): a device
//! whose memory is not pre-mapped. Its first touch of each page faults and a handler maps it
//! on demand.
//!
//! The seam keeps the drivers as Linux writes them: a driver still calls
//! `map`/`map_sg`/`alloc_coherent` on a `DmaCpu`, but of a **pass-through**
//! `DmaDomain`, so a "map" is a registration that hands out the physical
//! address and maps nothing (as a guest's driver under a stage-2-only IOPF
//! set-up hands out guest-physical addresses). The device is detached from
//! that domain before its threads start (so it never runs with an
//! attachment about to change) and attached with
//! [`IopfMode::over_guest_ram`] to an [`IopfDomain`] whose memory map is
//! the guest's RAM, identity-mapped (IOVA = physical address) and empty at
//! first, with an [`IopfHandler`] serving its page requests. Every address
//! a driver hands out therefore lies in a region, and the first touch of
//! each page — rings, headers, data — raises a page request, waits for the
//! answer and retries; an address outside every region is answered
//! `Invalid` and the access fails, moving no byte.

use std::sync::Arc;

use softiommu::hw::{SourceId, System};
use softiommu::iopf::{IopfConfig, IopfDomain, IopfError, IopfHandler, Region};
use softiommu::mem::{MemError, PhysMemory, PAGE_SIZE};
use softiommu::pgtable::Perm;

/// How a device runs in IOPF mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IopfModeConfig {
    /// Pages mapped per fault (the pre-map window, seed `002`'s
    /// `PREMAP_LEN`).
    pub premap_pages: u64,
    /// Page request handler threads.
    pub handler_threads: usize,
}

impl Default for IopfModeConfig {
    fn default() -> Self {
        Self {
            premap_pages: 1,
            handler_threads: 1,
        }
    }
}

/// What a host in IOPF mode holds: the address space its device faults
/// into and the handler serving it. Drop it after the device has stopped
/// (the handler answers what is still outstanding `Invalid`).
#[derive(Debug)]
pub struct IopfMode {
    /// The device's address space: the guest's RAM (every frame of the
    /// arena that was not the IOMMU's when the host was built),
    /// identity-mapped on demand.
    pub domain: Arc<IopfDomain>,
    /// The page request handler.
    pub handler: IopfHandler,
}

impl IopfMode {
    /// Attaches device `sid` of `system` (assigned to a unit, attached to
    /// no other domain) fault-capable to a new [`IopfDomain`] whose regions
    /// are the guest's RAM, identity-mapped and empty, and starts a handler
    /// on the device's unit. Nothing is mapped until the device faults.
    pub fn over_guest_ram(
        system: &Arc<System>,
        sid: SourceId,
        cfg: IopfModeConfig,
    ) -> Result<Self, IopfError> {
        let domain = IopfDomain::new(
            system.clone(),
            IopfConfig {
                premap_pages: cfg.premap_pages,
                ..IopfConfig::default()
            },
        )?;
        for (phys, len) in guest_ram(system.memory()) {
            domain.add_region(Region {
                iova: phys,
                phys,
                len,
                perm: Perm::RW,
            })?;
        }
        let unit = domain.attach(sid)?;
        let handler = IopfHandler::start(domain.clone(), unit, cfg.handler_threads)?;
        Ok(Self { domain, handler })
    }
}

/// Whether device `sid`'s misses raise page requests (it is attached to an
/// `IopfDomain`): its device threads must then run their work without a
/// translation section spanning it, since an access inside a section
/// cannot wait for its page request's answer (every invalidation wait on
/// the unit waits for the section, and the answer may be queued behind
/// one); each access still translates in a section of its own.
pub(crate) fn may_fault(system: &System, sid: SourceId) -> bool {
    system
        .unit_of(sid)
        .is_some_and(|(_, u)| u.page_requests_enabled(sid))
}

/// The arena's runs of RAM a device may be given, as (address, length):
/// the RAM a guest would expose, less any bounce pool. The IOMMU's tables
/// and queues, including the page-table pages the fault handler takes
/// later, come from the arena's IOMMU reserve outside RAM, so no run can
/// ever hold them.
fn guest_ram(mem: &PhysMemory) -> Vec<(u64, u64)> {
    let size = mem.size() & !(PAGE_SIZE - 1);
    let mut runs = Vec::new();
    let mut start = 0;
    while start < size {
        match mem.check_device_range(start, size - start) {
            Ok(()) => {
                runs.push((start, size - start));
                break;
            }
            Err(MemError::IommuFrame { addr, .. }) => {
                if addr > start {
                    runs.push((start, addr - start));
                }
                start = addr + PAGE_SIZE;
            }
            // Nothing else can be refused inside the arena.
            Err(_) => break,
        }
    }
    // A region is at most `MAX_REGION_BYTES`: a larger run (more than
    // 64 GiB of RAM) is given as several (before: refused whole, so IOPF
    // mode could not be built over such a guest).
    runs.into_iter()
        .flat_map(|(at, len)| {
            let max = softiommu::iopf::MAX_REGION_BYTES;
            (0..len.div_ceil(max)).map(move |k| (at + k * max, (len - k * max).min(max)))
        })
        .collect()
}

#[cfg(test)]
mod guest_ram_tests {
    use super::*;

    /// RAM past one region's 64 GiB is given as several regions, each at
    /// most `MAX_REGION_BYTES`, together the whole of it (before: one run,
    /// refused whole).
    #[test]
    fn ram_past_one_regions_size_is_split_into_regions() {
        let mem = PhysMemory::new(130 << 30).unwrap();
        let runs = guest_ram(&mem);
        let max = softiommu::iopf::MAX_REGION_BYTES;
        assert_eq!(runs, vec![(0, max), (max, max), (2 * max, 2 << 30)]);
    }
}
