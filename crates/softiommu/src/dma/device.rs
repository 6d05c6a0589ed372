//! A device as the DMA API sees it: its source id, its DMA mask, which unit
//! it sits behind, whether it is trusted.

#![deny(clippy::indexing_slicing)]

use std::sync::Arc;

use super::bounce::{BouncePool, LANES};
use super::domain::DmaDomain;
use super::error::DmaError;
use super::passthrough::{owner_key, pt_owner};
use super::policy::{DmaDirection, DmaPolicy};
use crate::hw::{HwError, SourceId};
use crate::mem::{FrameOwner, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::lock_std as lock;

/// A device attached to a [`DmaDomain`]; made by [`DmaDomain::attach`].
#[derive(Debug, Clone)]
pub struct DmaDevice {
    pub(crate) domain: Arc<DmaDomain>,
    pub(crate) sid: SourceId,
    pub(crate) mask: u64,
    /// The limit of the first try: the low window's end when the domain
    /// puts devices there first, else the mask's.
    pub(crate) limit_pfn: u64,
    /// The mask's limit: where an allocation goes when the first try found
    /// no room (equal to `limit_pfn` when there is no low-window try).
    pub(crate) mask_limit_pfn: u64,
    pub(crate) untrusted: bool,
    /// The domain's bounce pool this device reaches (below its mask).
    pub(crate) bounce: Option<usize>,
    /// The device's owner index in the domain, as tag bits (see `owner`).
    pub(crate) owner: u32,
    /// Its pass-through owner keys, one per direction (see
    /// `passthrough::owner_key`), made once here.
    pt_keys: [u64; 3],
}

/// The longest a new bounce pool waits for the translations in flight
/// on every unit (see `quiesce_for_pool`).
const POOL_QUIESCE: std::time::Duration = std::time::Duration::from_secs(1);

impl DmaDevice {
    /// Its pass-through owner key for direction `dir`.
    #[inline(always)]
    pub(crate) fn pt_key(&self, dir: DmaDirection) -> u64 {
        // `dir as usize` is below 3: no bound is checked.
        self.pt_keys.get(dir as usize).copied().unwrap_or(0)
    }

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

impl DmaDomain {
    /// Attaches device `sid` (which the system has assigned to a unit) with
    /// DMA mask `mask`. `untrusted` devices have every buffer bounced, and
    /// are never in pass-through: attaching one to a domain in
    /// pass-through is refused ([`DmaError::UntrustedPassthrough`]), and so
    /// is a switch to pass-through while one is attached. A device attached to another domain is
    /// refused ([`HwError::DeviceOwned`]): detach it there first. Attaching
    /// a device of this domain again gives another handle on it (the mask
    /// and trust of the first attach stay in force for its context).
    ///
    /// A failed attach changes nothing: the context is written only once
    /// everything that can refuse was checked (the unit's queue included:
    /// a stopped one is `Hw(Queue(Stopped))`, with the device's context
    /// as it was), and a device attached here for the first time is given
    /// back, free for another domain.
    pub fn attach(
        self: &Arc<Self>,
        sid: SourceId,
        mask: u64,
        untrusted: bool,
    ) -> Result<DmaDevice, DmaError> {
        let mask_limit_pfn = self.iova.limit_for_mask(mask);
        if mask_limit_pfn < self.iova.start_pfn() {
            return Err(DmaError::MaskTooSmall { mask });
        }
        let limit_pfn = if self.low_window_first {
            mask_limit_pfn.min(self.iova.low_window_end() - 1)
        } else {
            mask_limit_pfn
        };
        let (unit, _) = self
            .system
            .unit_of(sid)
            .ok_or(HwError::DeviceNotAssigned { sid })?;
        let refuse_untrusted = || {
            if untrusted && self.policy() == DmaPolicy::Passthrough {
                Err(DmaError::UntrustedPassthrough {
                    sid: sid.to_string(),
                })
            } else {
                Ok(())
            }
        };
        // Before a pool is made for it, and again below under the switch
        // lock (a switch to pass-through cannot complete between that
        // check and the attach: it refuses while an untrusted device is
        // attached).
        refuse_untrusted()?;
        let bounce = self.bounce_pool_for(mask)?;
        if untrusted && bounce.is_none() {
            return Err(DmaError::BounceUnavailable { mask });
        }
        let _switch = lock(&self.switch);
        refuse_untrusted()?;
        self.system.claim(sid, self.id)?;
        let ctx = self.context_for(self.policy());
        // The unit joins the mask before the device can translate (see
        // `units`): an unmap racing this attach either invalidates the unit
        // too, or the device's first walk already sees the cleared entries.
        let attached = self
            .units
            .join(unit, self.barrier)
            .and_then(|_| self.system.attach(sid, ctx).map_err(DmaError::from));
        if let Err(e) = attached {
            if !lock(&self.devices).contains(&sid) {
                self.system.release(sid, self.id);
            }
            return Err(e);
        }
        let mut devices = lock(&self.devices);
        if !devices.contains(&sid) {
            devices.push(sid);
        }
        drop(devices);
        if untrusted {
            let mut list = lock(&self.untrusted);
            if !list.contains(&sid) {
                list.push(sid);
            }
        }
        let owner =
            super::owner::device_tag(super::owner::owner_index(&mut lock(&self.owners), sid));
        Ok(DmaDevice {
            domain: self.clone(),
            sid,
            mask,
            limit_pfn,
            mask_limit_pfn,
            untrusted,
            bounce,
            owner,
            pt_keys: [
                DmaDirection::ToDevice,
                DmaDirection::FromDevice,
                DmaDirection::Bidirectional,
            ]
            .map(|d| owner_key(pt_owner(sid, d))),
        })
    }

    /// Detaches `dev`: its context is removed (its requests fault from now
    /// on) and every translation of it in flight is drained before this
    /// returns; the device may then be attached to another domain. Every
    /// handle on the device stops working for this domain's mappings.
    pub fn detach(&self, dev: &DmaDevice) -> Result<(), DmaError> {
        if !std::ptr::eq(Arc::as_ptr(&dev.domain), self) {
            return Err(DmaError::WrongDomain {
                sid: dev.sid.to_string(),
            });
        }
        let _switch = lock(&self.switch);
        let mut devices = lock(&self.devices);
        let Some(i) = devices.iter().position(|&s| s == dev.sid) else {
            return Err(DmaError::NotAttached {
                sid: dev.sid.to_string(),
            });
        };
        let (_, unit) = self
            .system
            .unit_of(dev.sid)
            .ok_or(HwError::DeviceNotAssigned { sid: dev.sid })?;
        unit.check_caller()?;
        unit.set_context(dev.sid, None)?;
        // Its IOTLB entries are the domain's (shared with its siblings):
        // drain the translations in flight, the queue's way or else the
        // direct way.
        if unit.wait().is_err() {
            unit.revoke(self.did, 0, 0)?;
        }
        devices.swap_remove(i);
        lock(&self.untrusted).retain(|&s| s != dev.sid);
        self.system.release(dev.sid, self.id);
        Ok(())
    }

    /// The index of the bounce pool for devices with DMA mask `mask`,
    /// made if need be: `None` when bounce buffering is off or no pool
    /// fits below the mask.
    fn bounce_pool_for(&self, mask: u64) -> Result<Option<usize>, DmaError> {
        if self.bounce_bytes == 0 {
            return Ok(None);
        }
        let made = self.bounce.for_mask(mask, || {
            let pages = self.bounce_bytes.div_ceil(PAGE_SIZE).next_power_of_two();
            let mut made: Vec<(u64, u64)> = Vec::with_capacity(LANES.len());
            for dir in LANES {
                match self.bounce_lane(mask, pages, dir) {
                    Ok(lane) => made.push(lane),
                    Err(e) => {
                        for &(iova, phys) in &made {
                            self.drop_bounce_lane(iova, phys, pages);
                        }
                        return Err(e);
                    }
                }
            }
            let lanes: [(u64, u64); 3] = made
                .try_into()
                .map_err(|_| DmaError::BounceUnavailable { mask })?;
            Ok(BouncePool::new(lanes, pages << PAGE_SHIFT))
        });
        match made {
            Ok(i) => Ok(i),
            // No room below the mask for a pool: no bouncing for it.
            Err(DmaError::Iova(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One lane of a bounce pool: `pages` pages of IOVA below `mask`,
    /// reserved in the allocator (so that no other mapping is ever placed
    /// there) but mapped in no page table: a slot's pages are mapped for
    /// one mapping at a time, with that mapping's direction (`dir` names
    /// the lane). (IOVA, physical address).
    fn bounce_lane(
        &self,
        mask: u64,
        pages: u64,
        _dir: DmaDirection,
    ) -> Result<(u64, u64), DmaError> {
        let order = pages.ilog2();
        let limit = self.iova.limit_for_mask(mask);
        let pfn = self.iova.alloc(pages, limit)?;
        // Untagged, as every block the allocator hands out: a streaming
        // unmap of the lane's block (one that reached past the pool check,
        // racing the pool's making) needs a mapping's tag (every one
        // carries its valid bit) and is refused, never matching a tag a
        // previous user of this IOVA left.
        // Owned (bounce bits set) first, zeroed only after the drain
        // below: a write translated before the bits were set may land
        // until the drain ends, and must not be left in the pool.
        let phys = match self.mem.alloc_owned(order, FrameOwner::Bounce) {
            Ok(p) => p,
            Err(e) => {
                let _ = self.iova.free(pfn, pages);
                return Err(DmaError::from(e));
            }
        };
        // The frames may be RAM a guest mapped (a paravirtual IOMMU's
        // domain): its walks now refuse them (their bounce bits are set),
        // no IOTLB entry cached before serves them, and no access that
        // translated before is still copying when the pool gets data. A
        // section that stays open past the bound: no pool from these
        // frames (they are RAM again), the attach fails.
        for (_, unit) in self.system.units() {
            if let Err(e) = unit.shared.quiesce_for_pool(POOL_QUIESCE) {
                let _ = self.mem.free_owned(phys, order, FrameOwner::Bounce);
                let _ = self.iova.free(pfn, pages);
                return Err(DmaError::from(e));
            }
        }
        if let Err(e) = self.mem.fill(phys, PAGE_SIZE << order, 0) {
            let _ = self.mem.free_owned(phys, order, FrameOwner::Bounce);
            let _ = self.iova.free(pfn, pages);
            return Err(DmaError::from(e));
        }
        Ok((pfn << PAGE_SHIFT, phys))
    }

    /// Undoes a [`bounce_lane`](Self::bounce_lane) no device was given
    /// (nothing of it was mapped): freed.
    fn drop_bounce_lane(&self, iova: u64, phys: u64, pages: u64) {
        let _ = self.mem.free_owned(phys, pages.ilog2(), FrameOwner::Bounce);
        let _ = self.iova.free(iova >> PAGE_SHIFT, pages);
    }
}
