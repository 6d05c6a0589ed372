//! Coherent allocations: zeroed frames the CPU and the device share,
//! mapped both ways, freed only through the handle that made them.

use super::{lock, DmaCpu};
use crate::dma::device::DmaDevice;
use crate::dma::domain::CoherentRecord;
use crate::dma::error::DmaError;
use crate::dma::policy::DmaPolicy;
use crate::iova::BlockKind;
use crate::mem::{FrameOwner, PhysAddr, PAGE_SIZE};
use crate::pgtable::Perm;

/// The frame order of a coherent allocation of `len` bytes.
fn coherent_order(len: u64) -> Result<u32, DmaError> {
    if len == 0 {
        return Err(DmaError::ZeroLength);
    }
    let pages = len.div_ceil(PAGE_SIZE);
    match pages.checked_next_power_of_two() {
        Some(p) if p.ilog2() <= crate::mem::MAX_FRAME_ORDER => Ok(p.ilog2()),
        _ => Err(DmaError::InvalidConfig {
            name: "coherent length",
            value: len,
            max: PAGE_SIZE << crate::mem::MAX_FRAME_ORDER,
        }),
    }
}

impl DmaCpu {
    /// Allocates `len` bytes of zeroed memory the CPU and the device share,
    /// mapped both ways: `(physical address, DMA address)`. Free it with
    /// [`free_coherent`](Self::free_coherent) (the frames cannot be freed
    /// any other way).
    pub fn alloc_coherent(
        &mut self,
        dev: &DmaDevice,
        len: u64,
    ) -> Result<(PhysAddr, u64), DmaError> {
        self.check_device(dev)?;
        let order = coherent_order(len)?;
        let (slot, w) = (&*self.slot, &mut self.w);
        let phys = w
            .domain
            .mem
            .alloc_zeroed_owned(order, FrameOwner::Coherent)?;
        // Coherent memory is never bounced: it is the device's by design.
        let r = {
            let _op = w.domain.gate.enter(&slot.active);
            let r = match w.domain.policy() {
                DmaPolicy::Passthrough if phys + (PAGE_SIZE << order) - 1 > dev.mask => {
                    Err(DmaError::BeyondMask {
                        addr: phys,
                        len,
                        mask: dev.mask,
                    })
                }
                DmaPolicy::Passthrough => Ok(phys),
                _ => w.map_pages(
                    slot,
                    dev,
                    phys,
                    PAGE_SIZE << order,
                    Perm::RW,
                    BlockKind::Coherent,
                ),
            };
            // Recorded and counted live before the gate opens: a switch
            // to or from pass-through refuses while anything is live, and
            // it reads the count once the gate is closed. Counted after
            // the gate, a switch could slip in between and strand the
            // mapping under the other policy (a translated IOVA used as a
            // physical address, and `free_coherent` finding the mapping
            // of another policy: refused, or nothing unmapped). Found by
            // `tests/fault_injection.rs`.
            if let Ok(dma) = r {
                lock(&w.domain.coherent).insert(
                    phys,
                    CoherentRecord {
                        dma,
                        order,
                        len,
                        sid: dev.sid,
                    },
                );
                slot.stats.map();
            }
            r
        };
        match r {
            Ok(dma) => Ok((phys, dma)),
            Err(e) => {
                w.domain.mem.free_owned(phys, order, FrameOwner::Coherent)?;
                Err(e)
            }
        }
    }

    /// Frees what [`alloc_coherent`](Self::alloc_coherent) returned for
    /// `dev`: the same physical address, DMA address and length. Anything
    /// else — memory this domain did not allocate coherent, or freed
    /// already, another device's, a wrong DMA address or length — is
    /// refused with nothing changed. The memory goes back only once no
    /// device can reach it any more.
    pub fn free_coherent(
        &mut self,
        dev: &DmaDevice,
        phys: PhysAddr,
        dma: u64,
        len: u64,
    ) -> Result<(), DmaError> {
        self.check_device(dev)?;
        let order = coherent_order(len)?;
        let (slot, w) = (&*self.slot, &mut self.w);
        {
            let mut coherent = lock(&w.domain.coherent);
            match coherent.get(&phys) {
                Some(r)
                    if *r
                        == CoherentRecord {
                            dma,
                            order,
                            len,
                            sid: dev.sid,
                        } => {}
                Some(r) if r.sid != dev.sid => {
                    return Err(DmaError::WrongDevice {
                        sid: dev.sid.to_string(),
                    })
                }
                Some(r) if r.dma != dma => return Err(DmaError::NotMapped { addr: dma }),
                Some(_) => return Err(DmaError::WrongLength { addr: dma, len }),
                None => return Err(DmaError::NotCoherent { phys }),
            }
            // Nothing below fails on a precondition the caller controls
            // once the caller's thread may wait (checked first).
            w.domain.check_callers()?;
            coherent.remove(&phys);
        }
        {
            let _op = w.domain.gate.enter(&slot.active);
            match w.domain.policy() {
                DmaPolicy::Passthrough => {}
                p => w.unmap_pages(
                    slot,
                    dma,
                    PAGE_SIZE << order,
                    p == DmaPolicy::Deferred,
                    BlockKind::Coherent,
                    dev,
                    0,
                )?,
            }
        }
        slot.stats.unmap();
        // The pages may still be reachable until a deferred flush; coherent
        // frees are rare, so flush this CPU's queue before giving them back.
        // If that fails the frames stay allocated: leaked, never reused
        // while reachable.
        w.flush_own(slot)?;
        w.domain.mem.free_owned(phys, order, FrameOwner::Coherent)?;
        Ok(())
    }
}
