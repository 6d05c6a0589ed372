//! [`State`]: the device's endpoints and domains, and what each request
//! does to them and to the unit (§5.13.6). Every rule that decides a
//! status is checked before anything changes, so a refused request
//! leaves the state — records, tables, contexts — as it was.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softiommu::hw::{
    ContextEntry, DomainIdClaim, HwError, QiError, SourceId, System, Unit, UnitId,
};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::IoPageTable;

use super::config::{ViommuConfig, GRANULE, INPUT_END};
use super::domain::{perm_of, Domain, MappingRecord};
use super::pending::Pending;
use super::stats::{bump, Counters};
use super::status::Status;
use crate::spec::iommu as s;

/// What the driver negotiated that changes how requests are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Negotiated {
    /// `VIRTIO_IOMMU_F_MAP_UNMAP`.
    pub(crate) map_unmap: bool,
    /// `VIRTIO_IOMMU_F_MMIO`.
    pub(crate) mmio: bool,
    /// `VIRTIO_IOMMU_F_BYPASS_CONFIG`.
    pub(crate) bypass_config: bool,
    /// `VIRTIO_IOMMU_F_PROBE`.
    pub(crate) probe: bool,
}

impl Negotiated {
    /// From the transport's feature word.
    pub(crate) fn from_features(f: u64) -> Self {
        let has = |b: u32| f & 1 << b != 0;
        Self {
            map_unmap: has(s::F_MAP_UNMAP),
            mmio: has(s::F_MMIO),
            bypass_config: has(s::F_BYPASS_CONFIG),
            probe: has(s::F_PROBE),
        }
    }
}

/// The device's endpoints and domains over one unit.
#[derive(Debug)]
pub(crate) struct State {
    system: Arc<System>,
    unit: UnitId,
    mem: Arc<PhysMemory>,
    domain_range: (u32, u32),
    /// Reserved regions (inclusive), the MSI window first.
    resv: Vec<(u64, u64, u8)>,
    /// Endpoint id → (requester id, domain attached to).
    endpoints: BTreeMap<u32, (SourceId, Option<u32>)>,
    domains: BTreeMap<u32, Domain>,
    /// Domains a reset dropped before every endpoint's detach drained: a
    /// walk may still read their tables, so they are kept (counted in
    /// the table-frame quota, [`frames_held`](Self::frames_held)) until a
    /// later reset whose changes all drain frees them.
    held: Vec<Domain>,
    /// `bypass` as the device applies it now.
    bypass: bool,
    /// A `bypass` switch the unit refused for some endpoint: to retry.
    bypass_pending: bool,
    /// Invalidations this round owes.
    pub(crate) pending: Pending,
    /// An invalidation the device owed did not complete: the endpoints
    /// that could reach the ranges are blocked, and every request is
    /// refused until a reset.
    broken: bool,
    /// Why the device broke, not yet reported ([`take_broke`](Self::take_broke)).
    broke: Option<Broke>,
    /// The longest wait for one of the unit's invalidations.
    timeout: Duration,
    /// The device's stop flag: a bounded wait gives up when it is set.
    stop: Arc<AtomicBool>,
    /// The mappings one UNMAP removes (kept: no allocation per UNMAP once
    /// it has grown).
    victims: Vec<MappingRecord>,
    /// Fault injection: a table unmap to fail.
    unmap_failpoint: Failpoint,
    /// The most table frames the domains may hold together.
    table_frames: u64,
    /// The most mappings the domains may hold together.
    max_mappings: usize,
    /// The unit's domain ids of `domain_range`, the device's alone: no
    /// other user of the unit (the host's DMA domains) gives a device a
    /// context with one, so a guest's domain never aliases one it did not
    /// make. Given back on drop only once no endpoint can hold a context
    /// naming one of its ids (leaked otherwise: a context still naming an
    /// unclaimed id would escape the walk's bounce-frame check).
    claim: std::mem::ManuallyDrop<DomainIdClaim>,
}

/// Why the device broke: what it reports with `DEVICE_NEEDS_RESET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Broke {
    /// The reason, for `DeviceError::BackendFailed`.
    pub(crate) what: &'static str,
    /// Whether a wait ran out of time (or was abandoned) rather than the
    /// queue refusing.
    pub(crate) timed_out: bool,
}

/// Whether a unit error is a bounded wait that ended without the drain:
/// the change was made but is not known drained.
fn undrained(e: &HwError) -> bool {
    matches!(
        e,
        HwError::Queue(QiError::InvalidationTimeout { .. } | QiError::WaitAbandoned)
    )
}

/// Counts down to one injected failure (`None`: disarmed).
#[derive(Debug, Default)]
struct Failpoint(Option<u32>);

impl Failpoint {
    /// Whether this call is the one to fail (then disarmed).
    fn fire(&mut self) -> bool {
        match self.0 {
            Some(0) => {
                self.0 = None;
                true
            }
            Some(n) => {
                self.0 = Some(n - 1);
                false
            }
            None => false,
        }
    }
}

impl State {
    /// The state of a device just built (or reset): no endpoint attached,
    /// each given the unattached context `bypass` calls for.
    pub(crate) fn new(
        system: Arc<System>,
        unit: UnitId,
        cfg: &ViommuConfig,
        stop: Arc<AtomicBool>,
    ) -> Result<Self, softiommu::hw::HwError> {
        let mut resv = vec![(s::MSI_START, s::MSI_END, s::RESV_MEM_T_MSI)];
        resv.extend(
            cfg.reserved
                .iter()
                .map(|&(a, b)| (a, b, s::RESV_MEM_T_RESERVED)),
        );
        let endpoints = cfg
            .endpoints
            .iter()
            .map(|&sid| (u32::from(sid.0), (sid, None)))
            .collect();
        let mem = system.memory().clone();
        let (lo, hi) = cfg.domain_range;
        let did = |d: u32| u16::try_from(d).unwrap_or(u16::MAX);
        let claim = system
            .unit(unit)
            .ok_or(HwError::UnknownUnit(unit))?
            .claim_domain_ids(did(lo), did(hi))?;
        let st = Self {
            system,
            unit,
            mem,
            domain_range: cfg.domain_range,
            resv,
            endpoints,
            domains: BTreeMap::new(),
            held: Vec::new(),
            bypass: cfg.bypass,
            bypass_pending: false,
            pending: Pending::default(),
            broken: false,
            broke: None,
            timeout: cfg.invalidation_timeout,
            stop,
            victims: Vec::new(),
            unmap_failpoint: Failpoint::default(),
            table_frames: cfg.table_frames,
            max_mappings: cfg.max_mappings,
            claim: std::mem::ManuallyDrop::new(claim),
        };
        for &(sid, _) in st.endpoints.values() {
            st.set_unattached(sid)?;
        }
        Ok(st)
    }

    /// The system and the device's unit in it (a handle that outlives a
    /// borrow of the state).
    pub(crate) fn unit_handle(&self) -> (Arc<System>, UnitId) {
        (self.system.clone(), self.unit)
    }

    /// The unit.
    pub(crate) fn unit(&self) -> &Unit {
        // Checked at creation; a system's units are never removed.
        self.system
            .unit(self.unit)
            .expect("the device's unit exists for the system's life")
    }

    /// Issues the invalidations this round owes and waits for them
    /// ([`Pending::flush`]).
    ///
    /// If they fail, the unit's IOTLB may still serve the unmapped ranges
    /// (a stopped queue drops nothing): every endpoint attached to a
    /// domain of the failed flush loses its context at once — a context
    /// write needs no queue, and a translation reads its context afresh —
    /// so none of them reaches the ranges; the domain id's binding is then
    /// released, and its cached translations can never hit again. The
    /// device is then broken ([`is_broken`](Self::is_broken)) until a
    /// reset; the tables stay alive (a walk begun before the context
    /// write may still read them).
    pub(crate) fn flush_pending(&mut self) -> Result<u64, softiommu::hw::QiError> {
        let unit = self
            .system
            .unit(self.unit)
            .expect("the device's unit exists for the system's life");
        // Borrowed, not cloned: no shared-counter traffic per round.
        let stop = &*self.stop;
        let r = self
            .pending
            .flush(unit, self.timeout, || stop.load(Ordering::Acquire));
        if let Err(e) = &r {
            self.mark_broken(Broke {
                what: "an UNMAP's IOTLB invalidation did not complete",
                timed_out: matches!(
                    e,
                    QiError::InvalidationTimeout { .. } | QiError::WaitAbandoned
                ),
            });
            for &(sid, dom) in self.endpoints.values() {
                let did = dom.and_then(|d| self.domains.get(&d)).map(|d| d.did);
                if did.is_some_and(|did| self.pending.failed.contains(&did)) {
                    // `None` is refused by nothing but a caller inside a
                    // section, which the device thread never is.
                    let _ = self.unit().set_context(sid, None);
                }
            }
        }
        r
    }

    /// The device is broken until a reset: every request `DEVERR`.
    fn mark_broken(&mut self, why: Broke) {
        if !self.broken {
            self.broke = Some(why);
        }
        self.broken = true;
    }

    /// Why the device broke since the last call, if it did: to report
    /// once (`DEVICE_NEEDS_RESET`).
    pub(crate) fn take_broke(&mut self) -> Option<Broke> {
        self.broke.take()
    }

    /// Whether an invalidation failed since the last reset (every request
    /// is then refused `DEVERR`).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// The reserved regions `(start, end, subtype)` PROBE reports.
    pub(crate) fn reserved_regions(&self) -> &[(u64, u64, u8)] {
        &self.resv
    }

    /// The endpoint id of `sid`, if the device manages it.
    pub(crate) fn endpoint_of(&self, sid: SourceId) -> Option<u32> {
        let id = u32::from(sid.0);
        self.endpoints.contains_key(&id).then_some(id)
    }

    /// Mappings of `domain`, in IOVA order (`None`: no such domain).
    pub(crate) fn mappings(&self, domain: u32) -> Option<Vec<MappingRecord>> {
        self.domains
            .get(&domain)
            .map(|d| d.maps.values().copied().collect())
    }

    /// The domain `endpoint` is attached to.
    pub(crate) fn attached(&self, endpoint: u32) -> Option<u32> {
        self.endpoints.get(&endpoint).and_then(|e| e.1)
    }

    fn in_range(&self, domain: u32) -> bool {
        (self.domain_range.0..=self.domain_range.1).contains(&domain)
    }

    /// The context of an endpoint attached to no domain (§5.13.6: bypass
    /// mode is identity; otherwise no access reaches guest memory),
    /// drained within the device's bound ([`undrained`] errors: written,
    /// not known drained).
    fn set_unattached(&self, sid: SourceId) -> Result<(), HwError> {
        let stop = &*self.stop;
        let give_up = || stop.load(Ordering::Acquire);
        if self.bypass {
            self.unit()
                .attach_bounded(sid, ContextEntry::PassThrough, self.timeout, give_up)
        } else {
            self.unit().detach_bounded(sid, self.timeout, give_up)
        }
    }

    /// Gives every endpoint `ctx(sid)` (its unattached context, or none):
    /// each drained within the bound while the unit drains; once one
    /// change is not drained in time (the queue is stalled, and every
    /// later wait would stall behind it), the rest are written without a
    /// wait. `Ok` only if every change was made and drained: then no
    /// translation can reach a table the endpoints used before.
    fn set_all(&self, blocked: bool) -> Result<(), HwError> {
        let mut first = Ok(());
        let mut stalled = false;
        for &(sid, _) in self.endpoints.values() {
            let r = if stalled {
                let ctx = (!blocked && self.bypass).then_some(ContextEntry::PassThrough);
                // No wait: refused only inside a section, which the
                // device's threads never hold.
                self.unit().set_context(sid, ctx).map(|_| ())
            } else if blocked {
                let stop = &*self.stop;
                self.unit()
                    .detach_bounded(sid, self.timeout, || stop.load(Ordering::Acquire))
            } else {
                self.set_unattached(sid)
            };
            if let Err(e) = r {
                stalled |= undrained(&e);
                first = first.and(Err(e));
            }
        }
        first
    }

    /// `bypass` as the device applies it now.
    pub(crate) fn bypass(&self) -> bool {
        self.bypass
    }

    /// Applies a new `bypass` to every unattached endpoint.
    ///
    /// A switch to bypass the unit refuses part-way is tried again whole
    /// on the next call; until then `bypass` reads off, the stricter value
    /// for endpoints that become unattached.
    ///
    /// A switch to "no bypass" fails closed: once one endpoint's change is
    /// refused or not drained within the bound, that endpoint and every
    /// unattached one after it get no context at once (a context write
    /// needs no queue, and a translation reads its context afresh), so no
    /// unattached endpoint stays in pass-through once this returns; the
    /// change is not known drained (a translation begun before it may
    /// still be in flight), so the device is broken — every request
    /// `DEVERR`, `DEVICE_NEEDS_RESET` — until a reset.
    pub(crate) fn set_bypass(&mut self, on: bool) -> Result<(), softiommu::hw::HwError> {
        if self.bypass == on && !self.bypass_pending {
            return Ok(());
        }
        let old = self.bypass;
        self.bypass = on;
        let mut first = Ok(());
        let mut closed = false;
        for &(sid, dom) in self.endpoints.values() {
            if dom.is_some() {
                continue;
            }
            if closed {
                // No wait: refused only inside a section, which the
                // threads applying `bypass` never hold.
                let _ = self.unit().set_context(sid, None);
                continue;
            }
            if let Err(e) = self.set_unattached(sid) {
                // A stalled queue would stall every later change too.
                let stalled = undrained(&e);
                first = first.and(Err(e));
                if !on {
                    let _ = self.unit().set_context(sid, None);
                    closed = true;
                } else if stalled {
                    break;
                }
            }
        }
        self.bypass_pending = first.is_err() && on;
        if self.bypass_pending {
            self.bypass = old && on;
        }
        if let Err(e) = &first {
            if !on {
                self.mark_broken(Broke {
                    what: "a bypass switch's context invalidation did not complete",
                    timed_out: undrained(e),
                });
            }
        }
        first
    }

    /// Device reset (§5.13.5: "endpoints are not attached to any
    /// domain"): every endpoint detached, every domain gone. `bypass`
    /// keeps its value (§5.13.4.2).
    pub(crate) fn reset(&mut self) -> Result<(), softiommu::hw::HwError> {
        let first = self.set_all(false);
        for e in self.endpoints.values_mut() {
            e.1 = None;
        }
        let domains = std::mem::take(&mut self.domains);
        // A reset whose detaches all succeeded starts afresh; one that
        // failed stays broken — every request DEVERR, and the device asks
        // for another reset (`DEVICE_NEEDS_RESET`) after the first round
        // the driver sends — and the next pass tries again.
        self.broken = first.is_err();
        self.broke = first.as_ref().err().map(|e| Broke {
            what: "a reset's endpoint detach did not complete",
            timed_out: undrained(e),
        });
        if first.is_ok() {
            // Contexts are switched and drained: no walker reaches a table,
            // neither the domains' nor those an earlier reset or a failed
            // flush had to keep.
            drop(domains);
            self.held.clear();
            self.pending.release_held();
        } else {
            // An endpoint may still point at a table: kept, never freed
            // early, and still counted against the quota.
            self.held.extend(domains.into_values());
        }
        first
    }

    /// Whether a reset has work to do: anything attached, tables kept, or
    /// the device broken.
    pub(crate) fn is_dirty(&self) -> bool {
        !self.domains.is_empty() || !self.held.is_empty() || self.pending.holds() || self.broken
    }

    /// ATTACH (§5.13.6.1.2).
    pub(crate) fn attach(
        &mut self,
        domain: u32,
        endpoint: u32,
        flags: u32,
        reserved_set: bool,
        neg: Negotiated,
    ) -> Status {
        if reserved_set {
            return Status::Inval;
        }
        let known = if neg.bypass_config {
            s::ATTACH_F_BYPASS
        } else {
            0
        };
        if flags & !known != 0 {
            return Status::Inval;
        }
        // §5.13.6.1.2 lists the endpoint's NOENT before the domain's
        // RANGE: an unknown endpoint is NOENT whatever the domain.
        let Some(&(sid, old)) = self.endpoints.get(&endpoint) else {
            return Status::NoEnt;
        };
        if !self.in_range(domain) {
            return Status::Range;
        }
        let bypass = flags & s::ATTACH_F_BYPASS != 0;
        if let Some(d) = self.domains.get(&domain) {
            if d.table.is_none() != bypass {
                return Status::Inval;
            }
        }
        if old == Some(domain) {
            return Status::Ok;
        }
        // The new domain first: running out of frames changes nothing.
        let created = !self.domains.contains_key(&domain);
        if created && !bypass && self.frames_held() >= self.table_frames {
            // Its root would take a frame past the device's quota.
            return Status::NoMem;
        }
        if created {
            // In range, so below the unit's domain count (checked at
            // creation), so a u16.
            let did = domain as u16;
            match Domain::new(did, bypass, &self.mem) {
                Ok(d) => {
                    self.domains.insert(domain, d);
                }
                Err(st) => return st,
            }
        }
        let d = &self.domains[&domain];
        let ctx = match &d.table {
            Some(t) => ContextEntry::Translated {
                did: d.did,
                root: softiommu::pgtable::IoPageTable::root(t),
            },
            None => ContextEntry::PassThrough,
        };
        // One context write replaces the old domain's: once it has
        // drained, the endpoint reaches nothing of the old domain, as if
        // DETACH had run first.
        let stop = &*self.stop;
        let r = self
            .unit()
            .attach_bounded_claimed(&self.claim, sid, ctx, self.timeout, || {
                stop.load(Ordering::Acquire)
            });
        match r {
            Ok(()) => {}
            Err(e) if undrained(&e) => {
                self.undrained_change(endpoint, sid);
                return Status::DevErr;
            }
            Err(_) => {
                if created {
                    self.domains.remove(&domain);
                }
                return Status::DevErr;
            }
        }
        if let Some(o) = old {
            self.drop_endpoint(o);
        }
        if let Some(d) = self.domains.get_mut(&domain) {
            d.endpoints += 1;
        }
        if let Some(e) = self.endpoints.get_mut(&endpoint) {
            e.1 = Some(domain);
        }
        Status::Ok
    }

    /// One endpoint fewer in `domain`; the last one takes the domain with
    /// it (§5.13.6.2: it "ceases to exist"). Its endpoints' contexts are
    /// already switched and drained, so dropping its table is safe.
    fn drop_endpoint(&mut self, domain: u32) {
        if let Some(d) = self.domains.get_mut(&domain) {
            d.endpoints = d.endpoints.saturating_sub(1);
            if d.endpoints == 0 {
                self.domains.remove(&domain);
            }
        }
    }

    /// DETACH (§5.13.6.2.2).
    pub(crate) fn detach(&mut self, domain: u32, endpoint: u32) -> Status {
        let Some(&(sid, cur)) = self.endpoints.get(&endpoint) else {
            return Status::NoEnt;
        };
        if !self.in_range(domain) {
            return Status::Range;
        }
        if cur != Some(domain) {
            return Status::Inval;
        }
        match self.set_unattached(sid) {
            Ok(()) => {}
            Err(e) if undrained(&e) => {
                self.undrained_change(endpoint, sid);
                return Status::DevErr;
            }
            Err(_) => return Status::DevErr,
        }
        if let Some(e) = self.endpoints.get_mut(&endpoint) {
            e.1 = None;
        }
        self.drop_endpoint(domain);
        Status::Ok
    }

    /// An ATTACH's or DETACH's context change was written but not drained
    /// within the bound: translations begun under the old context may
    /// still be in flight. The endpoint is blocked (no context: a write
    /// needs no queue, and a translation reads its context afresh), no
    /// domain is dropped (a table may still be walked: every domain stays
    /// until a reset whose changes all drain), and the device is broken.
    fn undrained_change(&mut self, endpoint: u32, sid: SourceId) {
        // `None` is refused by nothing but a caller inside a section,
        // which the device's threads never are.
        let _ = self.unit().set_context(sid, None);
        if let Some(e) = self.endpoints.get_mut(&endpoint) {
            e.1 = None;
        }
        self.mark_broken(Broke {
            what: "an ATTACH or DETACH's context invalidation did not complete",
            timed_out: true,
        });
    }

    /// Whether `[start, end]` meets a reserved region.
    fn hits_reserved(&self, start: u64, end: u64) -> bool {
        self.resv.iter().any(|&(a, b, _)| a <= end && start <= b)
    }

    /// Whether `[phys, phys + len)` may be mapped: guest RAM, never the
    /// unit's reserve nor a bounce pool. That holds with `MMIO` too: the
    /// guest-physical space is the arena's RAM (the unit reaches nothing
    /// else, so a mapping elsewhere could only fault), and `MMIO` is the
    /// memory type of a mapping, recorded, not a licence to leave it.
    fn phys_ok(&self, phys: u64, len: u64) -> bool {
        self.mem.check_device_range(phys, len).is_ok()
    }

    /// MAP (§5.13.6.3.2).
    pub(crate) fn map(
        &mut self,
        domain: u32,
        start: u64,
        end: u64,
        phys: u64,
        flags: u32,
        neg: Negotiated,
    ) -> Status {
        // Flags first: §5.13.6.3.2 "If the device doesn't recognize a
        // flags bit, it MUST reject the request" with INVAL, whatever the
        // domain.
        let mut known = s::MAP_F_READ | s::MAP_F_WRITE;
        if neg.mmio {
            known |= s::MAP_F_MMIO;
        }
        if flags & !known != 0 {
            return Status::Inval;
        }
        if !self.in_range(domain) {
            return Status::Range;
        }
        let perm = perm_of(flags);
        // Deliberate, beyond §5.13.6.3 (which has no such rule; QEMU
        // answers OK): a MAP granting no access is refused INVAL, as the
        // device's specification asks, rather than recorded as a mapping
        // no endpoint can use.
        if perm.is_empty() {
            return Status::Inval;
        }
        if end < start {
            return Status::Inval;
        }
        // `end + 1` of `u64::MAX` is 2^64, aligned; the range check below
        // refuses it.
        let aligned = |x: u64| x.is_multiple_of(GRANULE);
        if !aligned(start) || !aligned(phys) || !aligned(end.wrapping_add(1)) {
            return Status::Range;
        }
        if end > INPUT_END {
            return Status::Range;
        }
        // `end <= INPUT_END < u64::MAX` and `start <= end`: no wrap.
        let len = end - start + 1;
        if !self.phys_ok(phys, len) {
            return Status::Range;
        }
        let reserved = self.hits_reserved(start, end);
        let held = self.frames_held();
        let records = self.mappings_held();
        let Some(d) = self.domains.get_mut(&domain) else {
            return Status::NoEnt;
        };
        if d.table.is_none() || reserved || d.overlaps(start, end) {
            return Status::Inval;
        }
        let rec = MappingRecord {
            start,
            end,
            phys,
            flags,
        };
        if records >= self.max_mappings {
            // Checked before the table is touched, as the frame quota.
            return Status::NoMem;
        }
        if held.saturating_add(worst_tables(start, end)) > self.table_frames {
            // Checked before the table is touched: a MAP refused for the
            // quota takes no frame (an undone MAP would leave its new,
            // empty tables linked, and refusals could pile them up).
            return Status::NoMem;
        }
        match d.map(rec, perm) {
            Ok(()) => Status::Ok,
            Err(st) => st,
        }
    }

    /// The mappings the device's domains hold (one record per MAP; the
    /// domains are at most the endpoints, so this is a short sum).
    fn mappings_held(&self) -> usize {
        self.domains.values().map(|d| d.maps.len()).sum()
    }

    /// The table frames the device holds: those linked into its domains'
    /// tables, and those an UNMAP unlinked that wait in the round's
    /// gather until its invalidation completes (still taken from the
    /// reserve: without them, a round of MAP/UNMAP pairs could take many
    /// times the quota before any came back).
    fn frames_held(&self) -> u64 {
        let linked = self
            .domains
            .values()
            .chain(&self.held)
            .filter_map(|d| d.table.as_ref())
            .fold(0u64, |a, t| a.saturating_add(t.stats().table_pages));
        linked
            .saturating_add(self.pending.gather.freed_tables().len() as u64)
            .saturating_add(self.pending.held_frames())
    }

    /// UNMAP (§5.13.6.4.2). What it removes is owed an invalidation, in
    /// [`pending`](Self::pending): the caller completes the request only
    /// after that invalidation has completed.
    pub(crate) fn unmap(
        &mut self,
        domain: u32,
        start: u64,
        end: u64,
        reserved_set: bool,
        c: &Counters,
    ) -> Status {
        if !self.in_range(domain) {
            return Status::Range;
        }
        if reserved_set || end < start {
            return Status::Inval;
        }
        let Some(d) = self.domains.get_mut(&domain) else {
            return Status::NoEnt;
        };
        if d.table.is_none() {
            return Status::Inval;
        }
        if d.covered(start, end, &mut self.victims).is_err() {
            return Status::Range;
        }
        // All or nothing (§5.13.6.4.2: a failing UNMAP SHOULD NOT remove
        // any mapping): the victims are unmapped in order; if the table
        // refuses one, those already removed are installed again exactly
        // as their MAPs made them, so the request fails with every
        // mapping in place.
        let mut failed = None;
        let mut removed = 0;
        for m in &self.victims {
            let r = if self.unmap_failpoint.fire() {
                Err(Status::DevErr)
            } else {
                d.unmap(m, &mut self.pending.gather)
            };
            if let Err(st) = r {
                failed = Some(st);
                break;
            }
            removed += 1;
        }
        for m in &self.victims[..removed] {
            // Removed, or removed and installed again: either way its
            // entries were cleared and its table pages (in the gather)
            // unlinked, so the range is owed an invalidation before those
            // pages are freed.
            self.pending.add(d.did, m.start, m.end);
            if failed.is_some() && d.reinstall(m).is_err() {
                // Out of table pages: the mapping stays removed (record
                // and table agree, and its range is invalidated) — fewer
                // mappings reachable, never more.
                bump(&c.mappings_lost, 1);
            }
        }
        if failed.is_some() {
            bump(&c.unmaps_rolled_back, 1);
        }
        failed.unwrap_or(Status::Ok)
    }

    /// Makes the `nth` table unmap from now (0: the next) fail as a
    /// table that broke its contract would: fault injection for the
    /// all-or-nothing UNMAP.
    pub(crate) fn inject_unmap_failure(&mut self, nth: u32) {
        self.unmap_failpoint = Failpoint(Some(nth));
    }

    /// Whether PROBE may describe `endpoint`.
    pub(crate) fn probe_ok(&self, endpoint: u32) -> Status {
        if self.endpoints.contains_key(&endpoint) {
            Status::Ok
        } else {
            Status::NoEnt
        }
    }
}

/// The most table frames a MAP of `[start, end]` can take: one table per
/// 2 MiB, 1 GiB and 512 GiB region it touches (a level-1, level-2 and
/// level-3 table each; the root exists). An upper bound whatever leaves
/// the table chooses and whatever tables exist already, so a MAP it lets
/// through never takes the domains past the quota; near the quota it
/// refuses some MAPs that would have needed fewer.
fn worst_tables(start: u64, end: u64) -> u64 {
    let regions = |shift: u32| (end >> shift) - (start >> shift) + 1;
    regions(21) + regions(30) + regions(39)
}

impl Drop for State {
    /// The device goes away: every endpoint loses its context (its DMA
    /// faults) before the domains' tables are freed, so no walker can
    /// reach a freed table page. An endpoint the unit would not detach,
    /// or whose detach did not drain within the device's bound, keeps the
    /// tables alive: they are leaked, never freed early. A broken device
    /// does not wait at all. Whenever not every endpoint was detached and
    /// drained (a broken device, or a unit whose queue refused: stopped,
    /// shut down, timed out), every endpoint is blocked without a wait
    /// and the device's domain-id claim is leaked with the tables: an
    /// endpoint whose context could not be cleared keeps naming a claimed
    /// id, so its walks still refuse a leaf over a bounce pool.
    fn drop(&mut self) {
        let all_detached = !self.broken && {
            // Bounded by the device's timeout, not its stop flag (set by
            // now): a healthy unit drains, and the tables are freed.
            self.stop = Arc::new(AtomicBool::new(false));
            self.set_all(true).is_ok()
        };
        if !all_detached {
            // No wait (the queue failed, stalled or refused, or the device
            // is broken): every endpoint blocked at once, whatever the
            // queued path managed.
            for &(sid, _) in self.endpoints.values() {
                let _ = self.unit().set_context(sid, None);
            }
            for (_, d) in std::mem::take(&mut self.domains) {
                std::mem::forget(d);
            }
            for d in std::mem::take(&mut self.held) {
                std::mem::forget(d);
            }
            // The pending's kept gathers leak with it (a gather dropped
            // before its invalidation completed frees nothing).
        } else {
            // SAFETY: dropped once, here, in `drop`; never used after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.claim) };
        }
    }
}
