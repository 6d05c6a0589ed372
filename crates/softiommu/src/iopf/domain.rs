//! An address space whose memory is mapped on demand: a guest's (or a
//! process's) memory map of regions, a VT-d table that starts empty, the
//! devices that fault into it, and reclaim.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::error::IopfError;
use super::groups::PartialGroups;
use crate::hw::{ContextEntry, HwError, PageRequest, ResponseCode, SourceId, System, UnitId};
use crate::mem::{PhysAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::pgtable::{
    IoPageTable, IotlbGather, Perm, Translation, VtdConfig, VtdPageTable, VTD_IOVA_BITS,
};
use crate::sync::lock_std as lock;

/// The largest pre-map window: 512 pages (2 MiB), the seed's largest
/// `PREMAP_LEN`, times 512 (a 1 GiB leaf's worth).
pub const MAX_PREMAP_PAGES: u64 = 1 << 18;
/// The largest region: 64 GiB (its mapped-page bitmap is 2 MiB).
pub const MAX_REGION_BYTES: u64 = 64 << 30;
/// The block a promotion collapses: 2 MiB, one last-level table's span.
const BLOCK: u64 = 2 << 20;
/// 4 KiB pages per block.
const BLOCK_PAGES: u64 = BLOCK >> PAGE_SHIFT;
/// The default [`IopfConfig::fence_timeout`]: 100 ms. A section's work is
/// bounded (at most `max_access_bytes`, 1 MiB by default: well under a
/// millisecond of copying), so a section open this long is a device
/// thread that is parked or hostile, or one the host has descheduled for
/// many of its time slices (a loaded Linux CPU runs each of its threads
/// at least every 24 ms, CFS's default latency target at 8+ CPUs); 100
/// ms keeps a merely descheduled device from being fenced on a busy
/// machine while bounding what one device can hold a reclaim to.
pub const DEFAULT_FENCE_TIMEOUT: Duration = Duration::from_millis(100);
/// The longest [`IopfConfig::fence_timeout`]: 60 s.
pub const MAX_FENCE_TIMEOUT: Duration = Duration::from_secs(60);

/// How an [`IopfDomain`] is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IopfConfig {
    /// The VT-d domain id its devices' contexts use.
    pub did: u16,
    /// Pages mapped per fault, the faulting page included (seed `002`'s
    /// `PREMAP_LEN`: 1 maps only the page that faulted; 512 maps up to a
    /// 2 MiB window from it), never past the end of the region and
    /// skipping what is mapped. 1 to [`MAX_PREMAP_PAGES`].
    pub premap_pages: u64,
    /// Whether the units' walkers are cache-coherent.
    pub coherent: bool,
    /// Whether serving a fault *promotes*: when the fault (with its pre-map
    /// window) leaves a 2 MiB-aligned 2 MiB block of IOVA wholly mapped
    /// with 4 KiB leaves, inside one region and 2 MiB-aligned in physical
    /// memory too (a region's backing is contiguous), the 512 leaves are
    /// collapsed into one 2 MiB leaf ([`VtdPageTable::collapse_2m`]), as
    /// Linux's `khugepaged` does for CPU page tables. No translation
    /// changes; the old table page is freed after the units' invalidation
    /// and wait. A device that faults its memory in page by page then
    /// needs one IOTLB entry per 2 MiB, as a pinned, pre-mapped one does.
    /// Counted in [`IopfStats::promotions`]. Default `true`; `false` keeps
    /// 4 KiB leaves for whatever was faulted in page by page.
    pub promote: bool,
    /// How long a reclaim (or a promotion) waits for the translation
    /// sections in flight on a unit before it *fences* those still open
    /// instead of waiting for them without end: see
    /// [`IopfDomain::reclaim`]. Default [`DEFAULT_FENCE_TIMEOUT`] (100
    /// ms); 1 ms to [`MAX_FENCE_TIMEOUT`].
    pub fence_timeout: Duration,
}

impl Default for IopfConfig {
    fn default() -> Self {
        Self {
            did: 2,
            premap_pages: 1,
            coherent: true,
            promote: true,
            fence_timeout: DEFAULT_FENCE_TIMEOUT,
        }
    }
}

/// A range of the address space a device may fault in: IOVAs
/// `[iova, iova + len)` are backed by physical `[phys, phys + len)` with
/// rights `perm`. The memory is not pinned: it is mapped when a device
/// first touches it and may be reclaimed at any time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First IOVA (page aligned).
    pub iova: u64,
    /// First physical byte of the backing (page aligned).
    pub phys: PhysAddr,
    /// Length in bytes (pages).
    pub len: u64,
    /// The rights a device gets.
    pub perm: Perm,
}

impl Region {
    fn end(&self) -> u64 {
        self.iova + self.len
    }

    fn contains(&self, iova: u64) -> bool {
        iova >= self.iova && iova < self.end()
    }
}

/// A region and which of its pages are mapped.
#[derive(Debug)]
struct Backed {
    region: Region,
    /// Bit `i`: page `i` of the region is mapped (written under `map`).
    mapped: Vec<u64>,
}

impl Backed {
    fn is_mapped(&self, page: u64) -> bool {
        self.mapped
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// Whether pages `[first, first + n)` are all mapped, a word at a time.
    fn all_mapped(&self, first: u64, n: u64) -> bool {
        let (mut p, end) = (first, first + n);
        while p < end {
            let (word, bit) = ((p / 64) as usize, p % 64);
            let take = (64 - bit).min(end - p);
            let mask = if take == 64 {
                u64::MAX
            } else {
                ((1u64 << take) - 1) << bit
            };
            if self.mapped.get(word).is_none_or(|w| w & mask != mask) {
                return false;
            }
            p += take;
        }
        true
    }

    fn set(&mut self, page: u64, on: bool) {
        if let Some(w) = self.mapped.get_mut((page / 64) as usize) {
            if on {
                *w |= 1 << (page % 64);
            } else {
                *w &= !(1 << (page % 64));
            }
        }
    }
}

/// Counts of an [`IopfDomain`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IopfStats {
    /// Page requests answered `Success` (the page was mapped, or found
    /// mapped already by a request before it).
    pub served: u64,
    /// Page requests answered `Invalid`: outside every region, without the
    /// right asked for, from a device of another domain, with a PASID or
    /// beyond the address width.
    pub refused: u64,
    /// Pages mapped on demand (the faulting pages and the pre-mapped ones).
    pub pages_mapped: u64,
    /// Of those, pages mapped ahead of a fault by the pre-map window.
    pub pages_premapped: u64,
    /// Reclaim calls that took pages back.
    pub reclaims: u64,
    /// Pages reclaimed (unmapped, invalidated, waited for).
    pub pages_reclaimed: u64,
    /// 2 MiB blocks promoted: their 512 4 KiB leaves collapsed into one
    /// 2 MiB leaf when a fault completed them ([`IopfConfig::promote`]).
    /// A block reclaimed in part (split back to 4 KiB leaves) and faulted
    /// in again is counted again.
    pub promotions: u64,
    /// Reclaims and promotions that finished without waiting for a
    /// translation section still open after
    /// [`IopfConfig::fence_timeout`] (fenced; see
    /// [`IopfDomain::reclaim`]): the table pages they freed were leaked.
    pub fenced_flushes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    served: AtomicU64,
    refused: AtomicU64,
    pages_mapped: AtomicU64,
    pages_premapped: AtomicU64,
    reclaims: AtomicU64,
    pages_reclaimed: AtomicU64,
    promotions: AtomicU64,
    fenced_flushes: AtomicU64,
}

/// An address space mapped on demand. Share it as `Arc<IopfDomain>`;
/// describe its memory with [`add_region`](Self::add_region), attach
/// fault-capable devices with [`attach`](Self::attach), and serve their
/// page requests with an [`IopfHandler`](super::IopfHandler).
#[derive(Debug)]
pub struct IopfDomain {
    id: u64,
    config: IopfConfig,
    system: Arc<System>,
    /// Dropped by hand in `drop`, and only once no device can walk it.
    table: ManuallyDrop<VtdPageTable>,
    /// The regions, sorted by IOVA, with their mapped bitmaps. Mapping
    /// (serving a fault) and unmapping (reclaim) hold it for writing, so
    /// a fault and a reclaim of the same page resolve in one order.
    regions: RwLock<Vec<Backed>>,
    devices: Mutex<Vec<(SourceId, UnitId)>>,
    /// The units whose walks of this domain id refuse bounce-pool leaves
    /// ([`Unit::mark_guest_ram`](crate::hw::Unit)): unmarked when the
    /// domain goes, once no context names it.
    marked: Mutex<Vec<UnitId>>,
    /// Live handlers per unit ([`IopfHandler`](super::IopfHandler)s
    /// started and not stopped).
    handlers: Mutex<Vec<(UnitId, usize)>>,
    /// Page request groups in assembly, for every handler of the domain;
    /// its lock is held while a handler takes a request off a queue (see
    /// `groups`). Taken before `devices` where both are.
    groups: Mutex<PartialGroups>,
    counters: Counters,
}

impl IopfDomain {
    /// An empty address space over `system`'s memory.
    pub fn new(system: Arc<System>, config: IopfConfig) -> Result<Arc<Self>, IopfError> {
        if !(1..=MAX_PREMAP_PAGES).contains(&config.premap_pages) {
            return Err(IopfError::InvalidConfig {
                name: "premap_pages",
                value: config.premap_pages,
                max: MAX_PREMAP_PAGES,
            });
        }
        let ms = config.fence_timeout.as_millis();
        let max_ms = MAX_FENCE_TIMEOUT.as_millis() as u64;
        if !(1..=u128::from(max_ms)).contains(&ms) {
            return Err(IopfError::InvalidConfig {
                name: "fence_timeout (ms)",
                value: u64::try_from(ms).unwrap_or(u64::MAX),
                max: max_ms,
            });
        }
        let vtd = if config.coherent {
            VtdConfig::coherent()
        } else {
            VtdConfig::non_coherent()
        };
        let table = VtdPageTable::new(system.memory().clone(), vtd)?;
        Ok(Arc::new(Self {
            id: System::next_owner_id(),
            config,
            system,
            table: ManuallyDrop::new(table),
            regions: RwLock::new(Vec::new()),
            devices: Mutex::new(Vec::new()),
            marked: Mutex::new(Vec::new()),
            handlers: Mutex::new(Vec::new()),
            groups: Mutex::new(PartialGroups::default()),
            counters: Counters::default(),
        }))
    }

    /// The configuration.
    pub fn config(&self) -> IopfConfig {
        self.config
    }

    /// The system the domain lives in.
    pub fn system(&self) -> &Arc<System> {
        &self.system
    }

    /// The owner id `System` records for the domain's devices, by which
    /// the units route their page requests to its handlers.
    pub(crate) fn owner_id(&self) -> u64 {
        self.id
    }

    /// The groups in assembly, locked: a handler takes a request off its
    /// unit's queue and adds it here under this one lock, so a group's
    /// requests arrive in queue order whichever handler thread took each.
    pub(crate) fn partial_groups(&self) -> std::sync::MutexGuard<'_, PartialGroups> {
        lock(&self.groups)
    }

    /// Adds `[iova, iova + len)` backed by physical `phys` with rights
    /// `perm`. Everything page aligned; the backing in the arena and
    /// outside the IOMMU's own frames; no overlap with another region.
    pub fn add_region(&self, region: Region) -> Result<(), IopfError> {
        let Region {
            iova,
            phys,
            len,
            perm,
        } = region;
        if len == 0 || perm.is_empty() {
            return Err(IopfError::EmptyRegion { iova });
        }
        if !(iova | phys | len).is_multiple_of(PAGE_SIZE) {
            return Err(IopfError::Unaligned { iova, phys, len });
        }
        if len > MAX_REGION_BYTES {
            return Err(IopfError::RegionTooLarge {
                len,
                max: MAX_REGION_BYTES,
            });
        }
        if iova
            .checked_add(len)
            .is_none_or(|end| end > 1 << VTD_IOVA_BITS)
        {
            return Err(IopfError::BeyondWidth { iova, len });
        }
        self.system.memory().check_device_range(phys, len)?;
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if regions
            .iter()
            .any(|b| iova < b.region.end() && b.region.iova < iova + len)
        {
            return Err(IopfError::Overlap { iova, len });
        }
        let pages = len >> PAGE_SHIFT;
        let at = regions.partition_point(|b| b.region.iova < iova);
        regions.insert(
            at,
            Backed {
                region,
                mapped: vec![0; pages.div_ceil(64) as usize],
            },
        );
        Ok(())
    }

    /// The regions.
    pub fn regions(&self) -> Vec<Region> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        regions.iter().map(|b| b.region).collect()
    }

    /// Attaches fault-capable device `sid` (assigned to a unit of the
    /// system): its context points at this domain's table and its misses
    /// raise page requests. A device of another domain is refused
    /// (`Hw(DeviceOwned)`); a device attached here already is left as it
    /// is (`Ok`, its unit, nothing done). A failed attach changes nothing:
    /// the unit checks its queue and the caller before it writes the
    /// context, and the device is given back.
    ///
    /// **Bounded.** The context is written around the unit's queue (a
    /// queue wait would wait without limit for every translation section
    /// in flight, a parked device's too). A device that had no context
    /// has no translation in flight to wait for; otherwise the sections
    /// are drained as [`reclaim`](Self::reclaim) drains them, at most
    /// [`IopfConfig::fence_timeout`], and if one had to be fenced the
    /// attach, otherwise complete, returns [`IopfError::ContextFenced`].
    pub fn attach(&self, sid: SourceId) -> Result<UnitId, IopfError> {
        let (id, unit) = self
            .system
            .unit_of(sid)
            .ok_or(HwError::DeviceNotAssigned { sid })?;
        // Held across the attach: an attach and a detach of one device
        // resolve in one order.
        let mut devices = lock(&self.devices);
        if let Some(&(_, listed)) = devices.iter().find(|&&(s, _)| s == sid) {
            if listed == id {
                return Ok(id);
            }
        }
        // A stopped queue is refused as before (the unit could not carry
        // this domain's invalidations), though the attach itself goes
        // around it.
        unit.check_queue().map_err(HwError::Queue)?;
        self.system.claim(sid, self.id)?;
        // Before the context names the domain id: every walk of it checks
        // its leaves against the bounce pools (a pool may take RAM this
        // domain maps by identity). Cleared only when the domain goes.
        unit.mark_guest_ram(self.config.did, true);
        {
            let mut marked = lock(&self.marked);
            if !marked.contains(&id) {
                marked.push(id);
            }
        }
        let ctx = ContextEntry::Translated {
            did: self.config.did,
            root: self.table.root(),
        };
        let old = match unit.set_context(sid, Some(ctx)) {
            Ok(old) => old,
            Err(e) => {
                if !devices.iter().any(|&(s, _)| s == sid) {
                    self.system.release(sid, self.id);
                }
                return Err(e.into());
            }
        };
        unit.route_page_requests(sid, Some(self.id));
        unit.enable_page_requests(sid);
        devices.retain(|&(s, _)| s != sid);
        devices.push((sid, id));
        drop(devices);
        // Translations in flight under the old context (if any) end, or
        // are fenced, before this returns.
        let fenced = match old {
            None => 0,
            Some(ContextEntry::Translated { did, .. }) => self.drain_unit(unit, did)?,
            Some(_) => self.drain_unit(unit, self.config.did)?,
        };
        if fenced > 0 {
            return Err(IopfError::ContextFenced {
                sid,
                attached: true,
                sections: fenced,
            });
        }
        Ok(id)
    }

    /// A handler of `unit` started.
    pub(crate) fn handler_started(&self, unit: UnitId) {
        let mut h = lock(&self.handlers);
        match h.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, n)) => *n += 1,
            None => h.push((unit, 1)),
        }
    }

    /// A handler of `unit` stopped; whether it was the last.
    pub(crate) fn handler_stopped(&self, unit: UnitId) -> bool {
        let mut h = lock(&self.handlers);
        let Some(i) = h.iter().position(|(u, _)| *u == unit) else {
            return true;
        };
        let left = h.get_mut(i).map_or(0, |(_, n)| {
            *n = n.saturating_sub(1);
            *n
        });
        if left == 0 {
            h.swap_remove(i);
        }
        left == 0
    }

    /// Drops `did`'s cached translations on `unit` and drains its
    /// translation sections, waiting at most
    /// [`IopfConfig::fence_timeout`]; the sections fenced (counted in
    /// [`IopfStats::fenced_flushes`]).
    fn drain_unit(&self, unit: &crate::hw::Unit, did: u16) -> Result<u64, IopfError> {
        let fenced = unit
            .revoke_bounded(did, 0, 0, self.config.fence_timeout)
            .map_err(HwError::Queue)?;
        if fenced > 0 {
            self.counters.fenced_flushes.fetch_add(1, Relaxed);
        }
        Ok(fenced)
    }

    /// Detaches `sid`: its outstanding page requests are answered
    /// `Invalid`, its context removed and drained (around the unit's
    /// queue). Fails only for a caller holding a section of the device's
    /// unit (`Hw(Queue(GuardHeld))`), checked before anything changes.
    ///
    /// **Bounded**, as [`attach`](Self::attach): the drain waits at most
    /// [`IopfConfig::fence_timeout`]; if a section had to be fenced the
    /// detach, otherwise complete (the device released), returns
    /// [`IopfError::ContextFenced`].
    pub fn detach(&self, sid: SourceId) -> Result<(), IopfError> {
        let mut devices = lock(&self.devices);
        let Some(i) = devices.iter().position(|&(s, _)| s == sid) else {
            return Err(IopfError::NotAttached { sid });
        };
        let Some(&(_, unit_id)) = devices.get(i) else {
            return Err(IopfError::NotAttached { sid });
        };
        let mut drain = None;
        if let Some(unit) = self.system.unit(unit_id) {
            unit.check_caller().map_err(HwError::Queue)?;
            unit.disable_page_requests(sid);
            if let Some(old) = unit.set_context(sid, None)? {
                drain = Some((unit, old));
            }
        }
        devices.swap_remove(i);
        drop(devices);
        // Its groups were answered `Invalid` by the unit: what it held
        // goes (after `devices`: that lock is not held with this one).
        lock(&self.groups).forget(sid);
        let fenced = match drain {
            None => Ok(0),
            Some((unit, ContextEntry::Translated { did, .. })) => self.drain_unit(unit, did),
            Some((unit, _)) => self.drain_unit(unit, self.config.did),
        };
        // Released whatever the drain said: the context is gone, and a
        // fenced section can only reach this domain's table, which lives
        // as long as the domain.
        self.system.release(sid, self.id);
        match fenced? {
            0 => Ok(()),
            sections => Err(IopfError::ContextFenced {
                sid,
                attached: false,
                sections,
            }),
        }
    }

    /// The attached devices and their units.
    pub fn devices(&self) -> Vec<(SourceId, UnitId)> {
        lock(&self.devices).clone()
    }

    /// Whether `sid` is attached here.
    pub fn is_attached(&self, sid: SourceId) -> bool {
        lock(&self.devices).iter().any(|&(s, _)| s == sid)
    }

    /// Serves one page request: maps the page and up to the pre-map window
    /// after it (within its region, skipping what is mapped), or refuses.
    /// The answer to send.
    ///
    /// With [`IopfConfig::promote`], a 2 MiB block this leaves wholly
    /// mapped is then collapsed into one 2 MiB leaf, and before this
    /// returns the units are invalidated for it and waited for, and the
    /// old table page freed (a promotion a caller holding a translation
    /// section of a unit could not wait for is skipped: the block keeps
    /// its 4 KiB leaves). A promotion that fails changes nothing; the
    /// request is answered as served either way.
    pub fn serve(&self, r: &PageRequest) -> ResponseCode {
        let ok = self.try_serve(r);
        let c = if ok.is_ok() {
            &self.counters.served
        } else {
            &self.counters.refused
        };
        c.fetch_add(1, Relaxed);
        if ok.is_ok() {
            ResponseCode::Success
        } else {
            ResponseCode::Invalid
        }
    }

    fn try_serve(&self, r: &PageRequest) -> Result<(), ()> {
        if r.pasid.is_some() || r.addr >> VTD_IOVA_BITS != 0 || !self.is_attached(r.sid) {
            return Err(());
        }
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let b = regions
            .iter_mut()
            .find(|b| b.region.contains(r.addr))
            .ok_or(())?;
        let perm = b.region.perm;
        if (r.read && !perm.read()) || (r.write && !perm.write()) || r.exec {
            return Err(());
        }
        let first = (r.addr - b.region.iova) >> PAGE_SHIFT;
        let pages = b.region.len >> PAGE_SHIFT;
        let last = (first + self.config.premap_pages).min(pages);
        // Map the unmapped runs of the window, one table call each.
        let mut p = first;
        let (mut mapped, mut premapped) = (0, 0);
        // The pages this call mapped lie in `[lo, hi)`.
        let (mut lo, mut hi) = (last, first);
        while p < last {
            if b.is_mapped(p) {
                p += 1;
                continue;
            }
            // Up to the next mapped page, or the next frame a device may
            // not reach now (a bounce pool took RAM after the region was
            // added): that frame is never mapped, and a request for it is
            // answered `Invalid`.
            let mem = self.system.memory();
            let reachable = |q: u64| {
                mem.check_device_range(b.region.phys + (q << PAGE_SHIFT), PAGE_SIZE)
                    .is_ok()
            };
            if !reachable(p) {
                break;
            }
            let run_end = (p..last)
                .find(|&q| b.is_mapped(q) || !reachable(q))
                .unwrap_or(last);
            let n = run_end - p;
            let iova = b.region.iova + (p << PAGE_SHIFT);
            let phys = b.region.phys + (p << PAGE_SHIFT);
            if self.table.map(iova, phys, n << PAGE_SHIFT, perm).is_err() {
                // Out of table pages: what was mapped stays; the faulting
                // page's request is served only if it is among them.
                break;
            }
            for q in p..run_end {
                b.set(q, true);
            }
            mapped += n;
            premapped += n - u64::from(p == first);
            (lo, hi) = (lo.min(p), run_end);
            p = run_end;
        }
        self.counters.pages_mapped.fetch_add(mapped, Relaxed);
        self.counters.pages_premapped.fetch_add(premapped, Relaxed);
        let served = b.is_mapped(first);
        let mut gather = IotlbGather::new();
        if self.config.promote && lo < hi {
            self.promote(b, lo, hi, &mut gather);
        }
        // As in `reclaim`: the invalidation and its wait run without
        // holding the other handlers off. Faults and reclaims of the block
        // may run meanwhile; the old table page is freed only below.
        drop(regions);
        if let Some((start, end)) = gather.range() {
            if self.flush_units(start, end - start + 1) == Ok(0) {
                // Cannot fail for pages a collapse gathered.
                let _ = gather.complete();
            }
            // Otherwise (a section fenced, or a failure) the gather is
            // dropped: its pages leak (counted by `leaked_table_pages`),
            // never freed while a walker may be in them.
        }
        if served {
            Ok(())
        } else {
            Err(())
        }
    }

    /// Collapses every 2 MiB block of `b` that holds a page of `[lo, hi)`
    /// (pages of the region, just mapped) and is now wholly mapped, inside
    /// the region and 2 MiB-aligned in physical memory; the old tables go
    /// to `gather`. Called with the regions locked for writing, which
    /// serialises it with every map and unmap of the block.
    fn promote(&self, b: &Backed, lo: u64, hi: u64, gather: &mut IotlbGather) {
        let r = b.region;
        // The backing is contiguous: every block of the region is 2 MiB
        // aligned in physical memory, or none is.
        if !r.phys.wrapping_sub(r.iova).is_multiple_of(BLOCK) {
            return;
        }
        let end = r.iova + (hi << PAGE_SHIFT);
        let mut block = (r.iova + (lo << PAGE_SHIFT)) & !(BLOCK - 1);
        let mut may_wait = None;
        while block < end {
            let inside = block >= r.iova && block + BLOCK <= r.end();
            if inside && b.all_mapped((block - r.iova) >> PAGE_SHIFT, BLOCK_PAGES) {
                // Checked once, before the first collapse: a caller holding
                // a section of a unit could not wait for the invalidation
                // that must precede the free.
                if !*may_wait.get_or_insert_with(|| self.may_wait()) {
                    return;
                }
                // `None`: a 2 MiB leaf already (a window that covered the
                // block mapped it so). An error changed nothing.
                if let Ok(Some(_)) = self.table.collapse_2m(block, gather) {
                    self.counters.promotions.fetch_add(1, Relaxed);
                }
            }
            block += BLOCK;
        }
    }

    /// The units the domain's devices sit behind, each once.
    fn units(&self) -> Vec<UnitId> {
        let mut units: Vec<UnitId> = self.devices().iter().map(|&(_, u)| u).collect();
        units.sort();
        units.dedup();
        units
    }

    /// Fails if the calling thread holds a translation section of a unit
    /// of the domain: a wait for that unit would wait for itself.
    fn check_callers(&self) -> Result<(), IopfError> {
        for u in self.units() {
            if let Some(unit) = self.system.unit(u) {
                unit.check_caller()?;
            }
        }
        Ok(())
    }

    /// Whether the calling thread may wait for every unit of the domain.
    fn may_wait(&self) -> bool {
        self.check_callers().is_ok()
    }

    /// Revokes `[iova, iova + len)` of the domain on every unit a device
    /// of it sits behind, without their invalidation queues, waiting at
    /// most [`IopfConfig::fence_timeout`] per unit for the translation
    /// sections in flight (`Unit::revoke_bounded`). Not through the queue:
    /// a wait there holds the queue's head until every section it waits
    /// for ends, and the page group responses that answer every other
    /// device's faults are queued behind it. Returns the sections it did
    /// not wait for (fenced), 0 when every unit drained. Fails only for a
    /// caller holding a section (checked beforehand by the callers).
    fn flush_units(&self, iova: u64, len: u64) -> Result<u64, IopfError> {
        let mut fenced = 0;
        for u in self.units() {
            if let Some(unit) = self.system.unit(u) {
                fenced +=
                    unit.revoke_bounded(self.config.did, iova, len, self.config.fence_timeout)?;
            }
        }
        if fenced > 0 {
            self.counters.fenced_flushes.fetch_add(1, Relaxed);
        }
        Ok(fenced)
    }

    /// Takes back `[iova, iova + len)` (an MMU notifier's invalidation:
    /// the memory is not pinned): every mapped page in the range is
    /// unmapped, the units are invalidated and waited for (around their
    /// queues if they cannot carry it), and only then does this return.
    /// The backing keeps its data: a later access faults and is served
    /// again. Returns the pages taken back; a range with none mapped is
    /// [`IopfError::NotMapped`]. Racing a fault on the same page, one of
    /// the two goes first: the page ends mapped (the fault after) or not
    /// (the reclaim after, and the next access faults again).
    ///
    /// If the table cannot unmap a run (`Pgtable(Mem(OutOfFrames))`: no
    /// frame to split a large leaf at the run's end), the runs before it
    /// are reclaimed completely — unmapped, marked, invalidated and
    /// waited for, as a reclaim of just them would — and that run and
    /// the rest of the range stay mapped and translating as before; then
    /// the error is returned. Every page ends reclaimed or untouched,
    /// never cleared while still marked mapped or cached.
    ///
    /// **Bounded.** The wait for translations in flight lasts at most
    /// [`IopfConfig::fence_timeout`] per unit. A device still inside a
    /// section that began before the invalidation is then *fenced*: not
    /// waited for (counted in `UnitStats::fenced_sections` and
    /// [`IopfStats::fenced_flushes`]). Its cached translations of the range
    /// are gone and the entries cleared, so once it leaves its section
    /// its next access to a reclaimed page faults (and is served afresh);
    /// other devices' faults are answered meanwhile (nothing waits on the
    /// invalidation queue). Inside the open section it may still use what
    /// it translated before, so nothing it could reach is handed back: the
    /// backing stays the region's (reclaim never frees it) and the table
    /// pages the unmap freed are leaked, never reused. The call then
    /// returns [`IopfError::SectionsFenced`], the reclaim otherwise
    /// complete; [`Unit::fenced_sections_open`](crate::hw::Unit::fenced_sections_open)
    /// says when the fenced sections have ended and the backing is out of
    /// the device's reach.
    pub fn reclaim(&self, iova: u64, len: u64) -> Result<u64, IopfError> {
        if len == 0 || !(iova | len).is_multiple_of(PAGE_SIZE) {
            return Err(IopfError::Unaligned { iova, phys: 0, len });
        }
        let end = iova
            .checked_add(len)
            .ok_or(IopfError::BeyondWidth { iova, len })?;
        // Check first: a caller holding a translation section would wait
        // for itself.
        self.check_callers()?;
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let mut gather = IotlbGather::new();
        let mut taken = Vec::new();
        // A run the table refuses to unmap (no frame to split a large leaf
        // at its end) stops the loop; it changed no translation. The runs
        // cleared before it are finished below — marked, invalidated,
        // waited for — before the error is returned: a cleared entry is
        // never left marked mapped or cached.
        let mut failed = None;
        'regions: for b in regions.iter_mut() {
            let lo = iova.max(b.region.iova);
            let hi = end.min(b.region.end());
            let mut p = lo;
            while p < hi {
                let page = (p - b.region.iova) >> PAGE_SHIFT;
                if !b.is_mapped(page) {
                    p += PAGE_SIZE;
                    continue;
                }
                let mut q = p;
                while q < hi && b.is_mapped((q - b.region.iova) >> PAGE_SHIFT) {
                    q += PAGE_SIZE;
                }
                if let Err(e) = self.table.unmap(p, q - p, &mut gather) {
                    failed = Some(IopfError::from(e));
                    break 'regions;
                }
                taken.push((p, q - p));
                p = q;
            }
        }
        if taken.is_empty() {
            return Err(failed.unwrap_or(IopfError::NotMapped { iova, len }));
        }
        let mut pages = 0;
        for (p, n) in taken {
            for b in regions.iter_mut() {
                let mut q = p.max(b.region.iova);
                while q < (p + n).min(b.region.end()) {
                    b.set((q - b.region.iova) >> PAGE_SHIFT, false);
                    q += PAGE_SIZE;
                    pages += 1;
                }
            }
        }
        // The entries are cleared and the pages marked unmapped: faults
        // may be served again from here on (they map the same backing, so
        // an IOTLB entry of the old mapping that lives until the wait
        // below translates them the same way). The invalidation and its
        // wait — milliseconds when the drain waits for a device — run
        // without holding the handlers off.
        drop(regions);
        // Invalidate every unit a device of the domain sits behind, then
        // wait (bounded). Only a caller holding a section can make this
        // fail, checked above; the table pages stay unfreed (leaked) if it
        // does.
        let fenced = self.flush_units(iova, len)?;
        self.counters.reclaims.fetch_add(1, Relaxed);
        self.counters.pages_reclaimed.fetch_add(pages, Relaxed);
        if fenced > 0 {
            // A fenced section may still be in a table page the unmap
            // freed: dropping the gather leaks them (counted by
            // `leaked_table_pages`).
            drop(gather);
            return Err(IopfError::SectionsFenced {
                pages,
                sections: fenced,
            });
        }
        // Freed only now: no walker can hold them any more.
        gather.complete()?;
        match failed {
            Some(e) => Err(e),
            None => Ok(pages),
        }
    }

    /// Maps every region whole (the pinned, pre-mapped baseline: what a
    /// VMM without page faults does before a device may run); returns the
    /// pages it mapped. Not all or nothing: if the table runs out of
    /// frames (`Pgtable(Mem(OutOfFrames))`), the runs mapped before the
    /// failure stay mapped and marked (each run is mapped whole or not at
    /// all), the rest is left unmapped to be faulted in, and the error is
    /// returned.
    pub fn map_all(&self) -> Result<u64, IopfError> {
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        for b in regions.iter_mut() {
            let pages = b.region.len >> PAGE_SHIFT;
            let mut p = 0;
            while p < pages {
                if b.is_mapped(p) {
                    p += 1;
                    continue;
                }
                let run_end = (p..pages).find(|&q| b.is_mapped(q)).unwrap_or(pages);
                self.table.map(
                    b.region.iova + (p << PAGE_SHIFT),
                    b.region.phys + (p << PAGE_SHIFT),
                    (run_end - p) << PAGE_SHIFT,
                    b.region.perm,
                )?;
                for q in p..run_end {
                    b.set(q, true);
                }
                n += run_end - p;
                p = run_end;
            }
        }
        Ok(n)
    }

    /// What the domain's table translates `iova` to now (the leaf's size
    /// shows a promotion), `None` if it is not mapped; `Pgtable` for an
    /// IOVA past the 48-bit width.
    pub fn translation(&self, iova: u64) -> Result<Option<Translation>, IopfError> {
        Ok(self.table.iova_to_phys(iova)?)
    }

    /// Whether the page holding `iova` is mapped now.
    pub fn is_mapped(&self, iova: u64) -> bool {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        regions
            .iter()
            .find(|b| b.region.contains(iova))
            .is_some_and(|b| b.is_mapped((iova - b.region.iova) >> PAGE_SHIFT))
    }

    /// The counts.
    pub fn stats(&self) -> IopfStats {
        let c = &self.counters;
        IopfStats {
            served: c.served.load(Relaxed),
            refused: c.refused.load(Relaxed),
            pages_mapped: c.pages_mapped.load(Relaxed),
            pages_premapped: c.pages_premapped.load(Relaxed),
            reclaims: c.reclaims.load(Relaxed),
            pages_reclaimed: c.pages_reclaimed.load(Relaxed),
            promotions: c.promotions.load(Relaxed),
            fenced_flushes: c.fenced_flushes.load(Relaxed),
        }
    }
}

impl Drop for IopfDomain {
    fn drop(&mut self) {
        // No device may walk the table once it is freed: detach every
        // device (their requests are answered `Invalid`), or leak the
        // table if that cannot be done from this thread, or if a device
        // still inside a section after `fence_timeout` had to be fenced
        // (the wait for it is bounded; it may still be in the table).
        let devices = std::mem::take(&mut *lock(&self.devices));
        let mut revoked = true;
        for (sid, u) in devices {
            if let Some(unit) = self.system.unit(u) {
                unit.disable_page_requests(sid);
                revoked &= unit.set_context(sid, None).is_ok();
                revoked &=
                    unit.revoke_bounded(self.config.did, 0, 0, self.config.fence_timeout) == Ok(0);
            }
            self.system.release(sid, self.id);
        }
        if revoked {
            // No context names the domain id any more: another domain may
            // take it without the check (a bounce-policy domain's tables
            // map its pool's slots).
            for u in std::mem::take(&mut *lock(&self.marked)) {
                if let Some(unit) = self.system.unit(u) {
                    unit.mark_guest_ram(self.config.did, false);
                }
            }
            // SAFETY: `table` is dropped here once and never used again
            // (this is the domain's `drop`); no context points at it and
            // every translation in flight was drained.
            unsafe { ManuallyDrop::drop(&mut self.table) };
        }
    }
}
