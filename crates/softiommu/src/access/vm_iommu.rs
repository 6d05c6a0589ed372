//! [`UnitIommu`]: vm-memory's [`Iommu`] trait for one device's view of a
//! softiommu unit, so that `vm_memory::IommuMemory` — and every rust-vmm
//! crate written against `GuestMemory`, such as `virtio-queue` — reaches
//! guest memory through softiommu's translation, with its permissions, its
//! faults and its invalidations.
//!
//! # How a translation is served
//!
//! vm-memory asks an `Iommu` to serve every translation from an [`Iotlb`]
//! of its own. Each thread keeps one per device (see `vm_thread`), filled
//! from the unit on a miss, page by page (a page's leaf, its rights, as far
//! as it runs), and dropped whole when the device's invalidation epoch
//! moves (see `epoch`): a revoked mapping is never served from it after
//! the invalidation's wait has completed, and turns into
//! [`iommu::Error::CannotResolve`] — with the fault in the unit's log —
//! like any IOVA the device was not given.
//!
//! A device that wants a driver's invalidation wait to also wait for its
//! copies runs its work inside [`UnitIommu::section`]: every translation
//! and every copy in it then sits in one translation section of the
//! thread, which the wait drains. Outside such a section, each translation
//! is its own short section, and vm-memory's copies that follow it (its
//! `Bytes` methods, a `VolatileSlice` kept by `virtio-queue`'s `Reader`)
//! can race an unmap, as a vhost-user back-end's can. The guards vm-memory
//! keeps hold no section, so leaking one leaks nothing but memory.
//!
//! # Costs
//!
//! A hit costs a section entry (two plain stores), the epoch (a few
//! acquire loads) and vm-memory's `Iotlb` lookup (a B-tree search); a miss
//! adds one softiommu translation per page. Nothing is shared between
//! threads but the unit itself.

#![deny(clippy::indexing_slicing)]

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::rc::Rc;
use std::sync::Arc;

use vm_memory::iommu::{Error as IommuError, IotlbIterator, IovaRange};
use vm_memory::{GuestAddress, Iommu, Iotlb, Permissions};

use super::epoch::device_epoch;
use super::vm_thread::{self, PendingRequest, SectionError};
use crate::dma::DmaDevice;
use crate::hw::{
    Access, HwError, PhysSpan, SourceId, System, TranslateError, TranslationGuard, Unit, UnitId,
};
use crate::pgtable::Perm;

/// One device's view of its unit, as a vm-memory [`Iommu`]: hand it to
/// `vm_memory::IommuMemory::new`. Cheap to clone; usable from any thread
/// (each thread translates with a translator of its own).
#[derive(Debug, Clone)]
pub struct UnitIommu {
    system: Arc<System>,
    unit: UnitId,
    sid: SourceId,
}

impl UnitIommu {
    /// The view of device `sid`, which `system` must have assigned to a
    /// unit.
    pub fn new(system: Arc<System>, sid: SourceId) -> Result<Self, HwError> {
        let (unit, _) = system
            .unit_of(sid)
            .ok_or(HwError::DeviceNotAssigned { sid })?;
        Ok(Self { system, unit, sid })
    }

    /// The view of a device attached through the DMA API.
    pub fn for_device(dev: &DmaDevice) -> Result<Self, HwError> {
        Self::new(dev.domain().system().clone(), dev.source_id())
    }

    /// The device.
    pub fn source_id(&self) -> SourceId {
        self.sid
    }

    /// The unit it translates through.
    pub fn unit_id(&self) -> UnitId {
        self.unit
    }

    /// Gives back the calling thread's translator slot for this view's
    /// unit (and its cached translations). Returns `false`, doing nothing,
    /// while a [`section`](Self::section) of this thread is running. A
    /// thread's state also goes when the thread exits.
    pub fn release_thread(&self) -> bool {
        self.system.unit(self.unit).is_none_or(vm_thread::release)
    }

    /// Runs `f` — a device's piece of work: popping descriptor chains,
    /// copying their buffers, pushing used entries — with the calling
    /// thread's translation section for this unit held open throughout.
    /// Every access `f` makes through an `IommuMemory` over this view (or
    /// any view of the same unit) then completes before a driver's
    /// invalidation wait does, as the hardware drains DMA in flight: a
    /// buffer the driver unmaps is never written after its unmap returns.
    /// Outside a section, an access that vm-memory makes after its
    /// translation returned (a `VolatileSlice` kept by `virtio-queue`'s
    /// `Reader`, say) can race an unmap, as a vhost-user back-end's can.
    ///
    /// Keep `f` bounded and never block in it: every wait on the unit
    /// waits for it. A driver call that waits on the unit from inside `f`
    /// fails with `QiError::GuardHeld` instead of deadlocking. Fails only
    /// if no translator can be made for the thread.
    pub fn section<R>(&self, f: impl FnOnce() -> R) -> Result<R, HwError> {
        let unit = self
            .system
            .unit(self.unit)
            .ok_or(HwError::DeviceNotAssigned { sid: self.sid })?;
        vm_thread::scope(unit, f)
    }
}

/// Runs `f` with the calling thread's translation section for `unit`
/// held open throughout (nested calls share it), for a device that
/// reaches guest memory without a translation of its own — through
/// [`PhysGuestMemory::new`](super::PhysGuestMemory::new), e.g. a
/// paravirtual IOMMU's rings. Such a view checks the bounce-pool bitmap
/// when it hands out a slice, but writes through the slice afterwards;
/// inside the section, making a bounce pool (which waits for every
/// unit's sections after marking its frames) cannot finish while the
/// write is still to come, so a pool never gets a byte written through a
/// slice handed out before its frames were marked.
///
/// Keep `f` bounded and never wait on the unit in it (such a call fails
/// with `QiError::GuardHeld`). Fails only if no translator can be made
/// for the thread.
pub fn unit_section<R>(unit: &Unit, f: impl FnOnce() -> R) -> Result<R, HwError> {
    vm_thread::scope(unit, f)
}

/// The guard of a translation: the translations, a snapshot that never
/// changes under it. It holds no section (see
/// [`UnitIommu::section`] for what keeps the translations the device's
/// while it copies). Not `Send`: the snapshot belongs to the thread.
pub struct IotlbSection<'a> {
    iotlb: Rc<Iotlb>,
    _view: PhantomData<&'a UnitIommu>,
}

impl fmt::Debug for IotlbSection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IotlbSection").finish_non_exhaustive()
    }
}

impl Deref for IotlbSection<'_> {
    type Target = Iotlb;
    fn deref(&self) -> &Iotlb {
        &self.iotlb
    }
}

fn permissions(p: Perm) -> Permissions {
    match (p.read(), p.write()) {
        (true, true) => Permissions::ReadWrite,
        (true, false) => Permissions::Read,
        (false, true) => Permissions::Write,
        (false, false) => Permissions::No,
    }
}

fn cannot_resolve(base: u64, length: usize, reason: String) -> IommuError {
    IommuError::CannotResolve {
        iova_range: IovaRange {
            base: GuestAddress(base),
            length,
        },
        reason,
    }
}

/// Translates the page holding `iova` for `access`, recording a fault if
/// the unit refuses. `ReadWrite` needs both rights; `No` (a presence probe)
/// is asked as a read, then as a write if the page is write-only.
fn page(
    sec: &mut TranslationGuard<'static>,
    sid: SourceId,
    iova: u64,
    access: Permissions,
) -> Result<PhysSpan, TranslateError> {
    match access {
        Permissions::Read => sec.translate_page(sid, iova, Access::Read),
        Permissions::Write => sec.translate_page(sid, iova, Access::Write),
        Permissions::ReadWrite => {
            let span = sec.translate_page(sid, iova, Access::Write)?;
            if span.perm.read() {
                Ok(span)
            } else {
                // Faults (and is recorded) as the read it is.
                sec.translate_page(sid, iova, Access::Read)
            }
        }
        Permissions::No => match sec.translate_page(sid, iova, Access::Read) {
            Err(TranslateError::PermissionDenied { .. }) => {
                sec.translate_page(sid, iova, Access::Write)
            }
            r => r,
        },
    }
}

/// Why a fill stopped.
enum FillError {
    /// vm-memory's error, for the caller.
    Iommu(IommuError),
    /// A miss raised a page request, to be waited for outside the section.
    PageRequested(PendingRequest),
}

impl From<IommuError> for FillError {
    fn from(e: IommuError) -> Self {
        FillError::Iommu(e)
    }
}

/// Fills `iotlb` with the unit's translations of `[start, start + len)`.
fn fill(
    iotlb: &mut Iotlb,
    sec: &mut TranslationGuard<'static>,
    sid: SourceId,
    start: u64,
    len: u64,
    access: Permissions,
) -> Result<(), FillError> {
    let end = start.saturating_add(len);
    let mut cur = start;
    while cur < end {
        let span = page(sec, sid, cur, access).map_err(|e| match e {
            TranslateError::PageRequested {
                sid,
                iova,
                access,
                prgi,
            } => FillError::PageRequested(PendingRequest {
                sid,
                iova,
                access,
                prgi,
            }),
            e => FillError::Iommu(cannot_resolve(cur, (end - cur) as usize, e.to_string())),
        })?;
        // The whole leaf from `cur` on: later requests in it hit. (A span
        // ends below 2^52, so the sum cannot wrap.)
        let n = span.len.max(1);
        iotlb.set_mapping(
            GuestAddress(cur),
            GuestAddress(span.phys),
            n as usize,
            permissions(span.perm),
        )?;
        cur = cur.saturating_add(n);
    }
    Ok(())
}

impl UnitIommu {
    fn unit(&self) -> Result<&Unit, IommuError> {
        self.system
            .unit(self.unit)
            .ok_or_else(|| IommuError::IommuMisconfigured {
                reason: format!("unit {:?} is not in the system", self.unit),
            })
    }
}

impl UnitIommu {
    /// Joins this thread's section for the unit, checks the device's epoch
    /// (inside the section: see `epoch`), fills the cached translations
    /// with `[start, start + len)` for `access` if asked, and returns a
    /// guard over them.
    fn join(
        &self,
        unit: &Unit,
        fill_range: Option<(u64, u64, Permissions)>,
    ) -> Result<IotlbSection<'_>, FillError> {
        let sid = self.sid;
        let served = vm_thread::with_section(unit, sid, |sec, dev| {
            let epoch = device_epoch(unit, sid);
            if dev.epoch != Some(epoch) {
                dev.iotlb = Rc::new(Iotlb::new());
                dev.epoch = Some(epoch);
            }
            if let Some((start, len, access)) = fill_range {
                if Rc::get_mut(&mut dev.iotlb).is_none() {
                    // A live guard of this thread shares the cache: leave
                    // its snapshot alone and start a new one.
                    dev.iotlb = Rc::new(Iotlb::new());
                }
                if let Some(t) = Rc::get_mut(&mut dev.iotlb) {
                    fill(t, sec, sid, start, len, access)?;
                }
            }
            Ok(dev.iotlb.clone())
        });
        match served {
            Ok(iotlb) => Ok(IotlbSection {
                iotlb,
                _view: PhantomData,
            }),
            Err(SectionError::Inner(e)) => Err(e),
            Err(SectionError::Setup(e)) => Err(FillError::Iommu(IommuError::IommuMisconfigured {
                reason: e.to_string(),
            })),
        }
    }

    /// [`join`](Self::join) with a fill, serving page requests: a miss of a
    /// device that may fault raises one; outside a device section the
    /// thread waits for the answer (its section closed) and tries again;
    /// inside one it cannot wait (every invalidation wait on the unit waits
    /// for the section, and the answer may be queued behind one), so the
    /// request is left to be collected when the section ends and the access
    /// fails now (the device retries its piece of work).
    fn join_serving(
        &self,
        unit: &Unit,
        start: u64,
        len: u64,
        access: Permissions,
    ) -> Result<IotlbSection<'_>, IommuError> {
        for _ in 0..crate::access::PAGE_REQUEST_ROUNDS {
            match self.join(unit, Some((start, len, access))) {
                Ok(g) => return Ok(g),
                Err(FillError::Iommu(e)) => return Err(e),
                Err(FillError::PageRequested(p)) => {
                    if let Err(reason) = vm_thread::settle_page_request(unit, p) {
                        return Err(cannot_resolve(p.iova, len as usize, reason));
                    }
                }
            }
        }
        Err(cannot_resolve(
            start,
            len as usize,
            "page requests kept being raised".into(),
        ))
    }
}

impl Iommu for UnitIommu {
    type IotlbGuard<'a> = IotlbSection<'a>;

    fn translate(
        &self,
        iova: GuestAddress,
        length: usize,
        access: Permissions,
    ) -> Result<IotlbIterator<IotlbSection<'_>>, IommuError> {
        let start = iova.0;
        let fail = |reason: String| cannot_resolve(start, length, reason);
        if length == 0 {
            // Nothing to translate (vm-memory hands out an empty iterator).
            let empty = IotlbSection {
                iotlb: Rc::new(Iotlb::new()),
                _view: PhantomData,
            };
            return Iotlb::lookup(empty, iova, 0, access).map_err(|_| fail("empty range".into()));
        }
        let end = start
            .checked_add(length as u64)
            .ok_or_else(|| fail("the range wraps the address space".into()))?;
        let unit = self.unit()?;
        // The hit path: one lookup in the cached translations, under the
        // section the guard keeps.
        let guard = self.join(unit, None).map_err(|e| match e {
            FillError::Iommu(e) => e,
            FillError::PageRequested(p) => cannot_resolve(p.iova, length, "page request".into()),
        })?;
        let fails = match Iotlb::lookup(guard, iova, length, access) {
            Ok(hit) => return Ok(hit),
            // (The failed lookup dropped its guard, leaving the section.)
            Err(fails) => fails,
        };
        if fails.misses.is_empty() && fails.access_fails.is_empty() {
            return Err(fail("not mapped".into()));
        }
        // A miss: ask the unit for the whole range, page by page, then
        // look up again.
        let guard = self.join_serving(unit, start, end - start, access)?;
        Iotlb::lookup(guard, iova, length, access).map_err(|f| {
            let first = f.misses.first().or(f.access_fails.first());
            match first {
                Some(r) => cannot_resolve(r.base.0, r.length, "not mapped".into()),
                None => fail("not mapped".into()),
            }
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use vm_memory::{Bytes, GuestAddress, GuestMemoryError, IommuMemory};

    use super::*;
    use crate::access::PhysGuestMemory;
    use crate::dma::{DmaDirection, DmaPolicy, MAX_FQ_SIZE};

    const SID: SourceId = SourceId(0x0100);

    /// vm-memory's per-thread cache obeys the deferred bound as the unit's
    /// IOTLB does: filled before a deferred unmap, it is not served from
    /// once `flush_timeout + 1 ms` has passed, though no flush ran (the
    /// timer paused). Before, only an invalidation moved the device's
    /// epoch, and the stale translation was served until the flush.
    #[test]
    fn a_vm_memory_cache_is_not_served_past_the_deferred_bound() {
        let p = crate::Platform::builder()
            .policy(DmaPolicy::Deferred)
            .device(SID)
            .build()
            .unwrap();
        let timeout = Duration::from_millis(10);
        p.domain.set_timeout(timeout).unwrap();
        p.domain.set_high_water(MAX_FQ_SIZE).unwrap();
        p.domain.arm.pause(true);
        let dev = p.devices.first().unwrap();
        let mut cpu = p.domain.cpu();
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        let iova = cpu
            .map(dev, buf, 4096, DmaDirection::Bidirectional)
            .unwrap();
        let m = IommuMemory::new(
            PhysGuestMemory::behind_iommu(p.mem.clone()),
            UnitIommu::for_device(dev).unwrap(),
            true,
            (),
        );
        m.write_obj(7u32, GuestAddress(iova)).unwrap();
        assert_eq!(m.read_obj::<u32>(GuestAddress(iova)).unwrap(), 7);
        cpu.unmap(dev, iova, 4096, DmaDirection::Bidirectional)
            .unwrap();
        std::thread::sleep(timeout + Duration::from_millis(2));
        let e = m.read_obj::<u32>(GuestAddress(iova)).unwrap_err();
        assert!(
            matches!(
                e,
                GuestMemoryError::IommuError(IommuError::CannotResolve { .. })
            ),
            "{e:?}"
        );
        assert_eq!(p.domain.stats().flushes, 0, "no flush ran");
        p.domain.arm.pause(false);
        cpu.flush_own().unwrap();
    }
}
