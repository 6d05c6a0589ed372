//! [`ViommuDma`]: the DMA API over a virtio-iommu — a domain whose map
//! and unmap are MAP and UNMAP requests instead of page-table writes.
//!
//! - **Strict**: each map sends its MAPs and waits; each unmap sends its
//!   UNMAP and waits, so when it returns the device has invalidated the
//!   unit's IOTLB and the IOVA is free for reuse.
//! - **Lazy** (Linux's virtio-iommu driver since 6.8): requests are
//!   queued on the request ring without a notification. A map is made
//!   usable by one notification and one wait for all the MAPs of the call
//!   (`iotlb_sync_map`); an unmap queues its UNMAP and puts the IOVA on a
//!   flush queue, and a full flush queue (or [`flush`](ViommuDma::flush))
//!   sends everything queued with one notification and one wait
//!   (`flush_iotlb_all`) before freeing those IOVAs. An IOVA is never
//!   handed out again before the UNMAP that covers it has completed.

use std::sync::Arc;

use softiommu::dma::DmaDirection;
use softiommu::iova::{
    IovaCpuCache, IovaDomain, IovaError, IovaPolicy, IovaStats, MSI_WINDOW_PFNS,
};
use softiommu::mem::{PAGE_SHIFT, PAGE_SIZE};

use super::driver::{ViommuDriver, ViommuDriverError};
use super::ops::encode;
use super::status::Status;
use crate::spec::iommu as s;

/// How unmaps reach the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViommuMode {
    /// UNMAP and wait before an unmap returns.
    Strict,
    /// Queue requests; one notification and wait per map sync or per
    /// flush of `flush_queue` unmaps.
    Lazy {
        /// Unmaps held before a flush (Linux: 256 per CPU).
        flush_queue: usize,
    },
}

/// Why a DMA call over the virtio-iommu failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViommuDmaError {
    /// The transport or the device.
    #[error(transparent)]
    Driver(#[from] ViommuDriverError),
    /// IOVA space.
    #[error(transparent)]
    Iova(#[from] IovaError),
    /// The device refused a request (`None`: returned unwritten).
    #[error("the device answered {op} with {status:?}")]
    Refused {
        /// The request.
        op: &'static str,
        /// Its status.
        status: Option<Status>,
    },
    /// The domain is outside the device's `domain_range`: refused before
    /// any request.
    #[error("domain {domain} outside the device's domain range {range:?}")]
    DomainOutOfRange {
        /// The domain asked for.
        domain: u32,
        /// `domain_range` (inclusive).
        range: (u32, u32),
    },
    /// The device's granule (the least page of `page_size_mask`) is
    /// larger than the CPU page this domain maps in, or it has none.
    #[error(
        "the device's page_size_mask {page_size_mask:#x} has no granule of at most one CPU page"
    )]
    Granule {
        /// `page_size_mask`.
        page_size_mask: u64,
    },
    /// The device did not offer (or the driver did not accept)
    /// `VIRTIO_IOMMU_F_MAP_UNMAP`: its domains cannot be mapped by request.
    #[error("VIRTIO_IOMMU_F_MAP_UNMAP not negotiated")]
    NoMapUnmap,
    /// A lazy UNMAP the device refused (`None`: returned unwritten) when a
    /// flush sent it: the mapping may still be live, so it is kept and its
    /// UNMAP sent again by every later flush until the device answers `OK`
    /// (its IOVA is held until then, never reused). Names the mapping, as
    /// [`ViommuMapping`] gave it: `iova` and `len`.
    #[error("the device answered the UNMAP of {len:#x} bytes at IOVA {iova:#x} with {status:?}; kept and sent again by the next flush")]
    UnmapKept {
        /// The mapping's DMA address.
        iova: u64,
        /// The mapping's length.
        len: u64,
        /// The device's status.
        status: Option<Status>,
    },
    /// A length of zero, or one whose pages overflow.
    #[error("bad DMA length {len:#x}")]
    BadLength {
        /// The length.
        len: u64,
    },
}

/// Counts of a [`ViommuDma`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ViommuDmaStats {
    /// Maps made.
    pub maps: u64,
    /// Unmaps made.
    pub unmaps: u64,
    /// Requests sent (MAP and UNMAP).
    pub requests: u64,
    /// Flushes of the lazy flush queue.
    pub flushes: u64,
    /// Errors a flush an unmap triggered found while an earlier one was
    /// still kept for the next [`flush`](ViommuDma::flush): counted here,
    /// not reported (the earlier one is).
    pub errors_coalesced: u64,
}

/// One mapping handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViommuMapping {
    /// The DMA address of the buffer's first byte.
    pub iova: u64,
    /// The buffer's length.
    pub len: u64,
    /// First page of the IOVA block.
    pfn: u64,
    /// Pages of the block (a power of two).
    pages: u64,
    /// Pages mapped (the buffer's).
    mapped: u64,
}

/// A DMA domain over a virtio-iommu device.
#[derive(Debug)]
pub struct ViommuDma {
    drv: ViommuDriver,
    domain: u32,
    mode: ViommuMode,
    iova: Arc<IovaDomain>,
    /// The IOVAs this domain hands out and takes back, through a
    /// per-thread cache in front of the domain's tree (Linux's
    /// `alloc_iova_fast` and its per-CPU rcache): a map and an unmap
    /// take no lock once the cache is warm. The domain is used from one
    /// thread (`&mut self`), so one cache serves it.
    cache: IovaCpuCache,
    /// Lazy mode: the requests queued on the driver, in its order (its
    /// completions come back in the same order). An IOVA is freed only
    /// when its UNMAP's completion says `OK` (or its MAP's says it mapped
    /// nothing).
    queued: Vec<Queued>,
    /// UNMAPs among `queued` (the flush queue's fill).
    unmaps_queued: usize,
    /// Serial of the next MAP queued.
    serial: u64,
    /// Serials of queued MAPs the device refused (nothing mapped).
    refused_maps: Vec<u64>,
    /// Mappings owed an UNMAP that no caller holds any more: lazy UNMAPs
    /// the device refused, and MAPs of a failed `map_sg` whose outcome
    /// could not be learnt (or whose undo failed). Every sync sends their
    /// UNMAPs again (behind anything queued before) until one is answered
    /// `OK`, which frees the IOVA; never dropped.
    owed: Vec<ViommuMapping>,
    /// The statuses of a sync, in `queued`'s order (reused: no
    /// allocation per sync).
    statuses: Vec<Option<Status>>,
    /// Lazy mode: what a flush an unmap triggered found wrong with other
    /// requests, kept for the next [`flush`](ViommuDma::flush) to report
    /// (the unmap itself succeeded: its UNMAP is queued).
    deferred: Option<ViommuDmaError>,
    stats: ViommuDmaStats,
}

/// A request queued in lazy mode.
#[derive(Debug, Clone, Copy)]
enum Queued {
    /// A MAP, with its serial.
    Map(ViommuMapping, u64),
    /// A MAP of a failed `map_sg` whose answer could not be learnt before
    /// the call returned: owned by nobody, its UNMAP owed (`owed`), so
    /// its answer is judged by nobody either.
    Orphan,
    /// An UNMAP.
    Unmap(ViommuMapping),
}

impl ViommuDma {
    /// Attaches `endpoints` to domain `domain` through `drv` and builds
    /// an IOVA space over the device's input range, less every reserved
    /// region PROBE reports.
    pub fn new(
        mut drv: ViommuDriver,
        domain: u32,
        endpoints: &[u32],
        mode: ViommuMode,
    ) -> Result<Self, ViommuDmaError> {
        let g = drv.geometry();
        // Everything the device's configuration decides, before any
        // request: a domain the device would refuse RANGE, a granule our
        // page-sized mappings would not be a multiple of, no MAP/UNMAP.
        if !(g.domain_range.0..=g.domain_range.1).contains(&domain) {
            return Err(ViommuDmaError::DomainOutOfRange {
                domain,
                range: g.domain_range,
            });
        }
        let mask = g.page_size_mask;
        if mask == 0 || 1u64 << mask.trailing_zeros() > PAGE_SIZE {
            return Err(ViommuDmaError::Granule {
                page_size_mask: mask,
            });
        }
        if drv.features() & 1 << s::F_MAP_UNMAP == 0 {
            return Err(ViommuDmaError::NoMapUnmap);
        }
        let end_pfn = g.input_range.1 >> PAGE_SHIFT;
        let start_pfn = (g.input_range.0 >> PAGE_SHIFT).max(1);
        let iova = IovaDomain::new(start_pfn, end_pfn, IovaPolicy::Softiommu)?;
        // The MSI doorbell window never holds a DMA buffer (x86's, as the
        // core DMA domain keeps it out), with or without PROBE to report
        // it: an IOVA space with nothing reserved would hand it out, and
        // the device would answer the MAP INVAL. (Before: the comment
        // below said the space kept it out; it did not.)
        keep_out_msi(&iova, start_pfn, end_pfn)?;
        // §5.13.6.5: PROBE only with VIRTIO_IOMMU_F_PROBE; without it the
        // MSI window reserved above is all that is kept out.
        let probe = drv.features() & 1 << s::F_PROBE != 0;
        for &ep in endpoints.iter().filter(|_| probe) {
            let (st, props) = drv.probe_endpoint(ep)?;
            if st != Some(Status::Ok) {
                return Err(ViommuDmaError::Refused {
                    op: "PROBE",
                    status: st,
                });
            }
            for (lo, hi) in resv_regions(&props) {
                let (a, b) = (lo >> PAGE_SHIFT, hi >> PAGE_SHIFT);
                if a <= end_pfn && b >= start_pfn {
                    // A region already reserved (the MSI window,
                    // reserved above) is fine.
                    let _ = iova.reserve(a.max(start_pfn), b.min(end_pfn));
                }
            }
        }
        for &ep in endpoints {
            let st = drv.attach(domain, ep, 0)?;
            if st != Some(Status::Ok) {
                return Err(ViommuDmaError::Refused {
                    op: "ATTACH",
                    status: st,
                });
            }
        }
        let cache = iova.cpu_cache();
        Ok(Self {
            drv,
            domain,
            mode,
            iova,
            cache,
            queued: Vec::new(),
            unmaps_queued: 0,
            serial: 0,
            refused_maps: Vec::new(),
            owed: Vec::new(),
            deferred: None,
            statuses: Vec::new(),
            stats: ViommuDmaStats::default(),
        })
    }

    /// The driver underneath.
    pub fn driver(&self) -> &ViommuDriver {
        &self.drv
    }

    /// Counts so far.
    pub fn stats(&self) -> ViommuDmaStats {
        self.stats
    }

    /// The IOVA space's counts (its tree's allocations and frees: what
    /// the per-thread cache did not serve).
    pub fn iova_stats(&self) -> IovaStats {
        self.iova.stats()
    }

    /// The mode.
    pub fn mode(&self) -> ViommuMode {
        self.mode
    }

    /// Maps each `(phys, len)` for `dir` and makes the mappings usable
    /// before returning: strict sends and waits per MAP; lazy queues
    /// them all and sends them with one notification and one wait.
    pub fn map_sg(
        &mut self,
        sg: &[(u64, u64)],
        dir: DmaDirection,
    ) -> Result<Vec<ViommuMapping>, ViommuDmaError> {
        let segs: Vec<(u64, u64, DmaDirection)> = sg.iter().map(|&(p, l)| (p, l, dir)).collect();
        self.map_segments(&segs)
    }

    /// As [`map_sg`](Self::map_sg) with a direction per segment: the
    /// buffers of one request (a block request's header to the device,
    /// data and status from it), made usable together — in lazy mode
    /// with one notification.
    pub fn map_segments(
        &mut self,
        sg: &[(u64, u64, DmaDirection)],
    ) -> Result<Vec<ViommuMapping>, ViommuDmaError> {
        let mut out = Vec::with_capacity(sg.len());
        // Lazy: the serial of `out[0]`'s MAP (the next ones follow it).
        let first_serial = self.serial;
        self.refused_maps.clear();
        for &(phys, len, dir) in sg {
            let flags = match dir {
                DmaDirection::ToDevice => s::MAP_F_READ,
                DmaDirection::FromDevice => s::MAP_F_WRITE,
                DmaDirection::Bidirectional => s::MAP_F_READ | s::MAP_F_WRITE,
            };
            let off = phys % PAGE_SIZE;
            let bytes = off
                .checked_add(len)
                .filter(|_| len != 0)
                .ok_or(ViommuDmaError::BadLength { len })?;
            let mapped = bytes.div_ceil(PAGE_SIZE);
            let pages = mapped.next_power_of_two();
            let pfn = match self.cache.alloc(pages, u64::MAX) {
                Ok(p) => p,
                Err(e) => {
                    self.abandon(&out, first_serial);
                    return Err(e.into());
                }
            };
            let start = pfn << PAGE_SHIFT;
            let req = encode::map(
                self.domain,
                start,
                start + mapped * PAGE_SIZE - 1,
                phys - off,
                flags,
            );
            let m = ViommuMapping {
                iova: start + off,
                len,
                pfn,
                pages,
                mapped,
            };
            self.stats.requests += 1;
            let sent = match self.mode {
                ViommuMode::Strict => self.expect_ok("MAP", &req),
                ViommuMode::Lazy { .. } => {
                    let synced = if self.drv.free_slots() == 0 {
                        self.sync(Some(first_serial))
                    } else {
                        Ok(())
                    };
                    synced.and_then(|()| {
                        self.drv
                            .queue(&req, s::TAIL_LEN as u32)
                            .map_err(ViommuDmaError::from)
                    })
                }
            };
            if let Err(e) = sent {
                // A MAP the device answered with a status other than OK
                // mapped nothing, and one never sent (lazy: queueing or
                // the sync before it failed) neither: its IOVA is free
                // again. A strict MAP with no answer (no status, a
                // timeout, a reset) may have been applied late: it is
                // undone like the others (UNMAP, the IOVA freed only on
                // OK), never freed while it may still be mapped.
                let answered = matches!(
                    e,
                    ViommuDmaError::Refused {
                        status: Some(_),
                        ..
                    }
                );
                if answered || !matches!(self.mode, ViommuMode::Strict) {
                    let _ = self.cache.free(pfn, pages);
                    self.abandon(&out, first_serial);
                } else {
                    let mut maybe = out.clone();
                    maybe.push(m);
                    self.abandon(&maybe, first_serial);
                }
                return Err(e);
            }
            if matches!(self.mode, ViommuMode::Lazy { .. }) {
                self.queued.push(Queued::Map(m, self.serial));
                self.serial += 1;
            }
            out.push(m);
        }
        if matches!(self.mode, ViommuMode::Lazy { .. }) {
            // `iotlb_sync_map`: the MAPs (and any UNMAPs queued before
            // them) with one notification. A refused MAP fails the whole
            // call, and the MAPs that succeeded are undone: nothing the
            // caller was not given stays mapped.
            if let Err(e) = self.sync(Some(first_serial)) {
                self.abandon(&out, first_serial);
                return Err(e);
            }
        }
        self.stats.maps += out.len() as u64;
        Ok(out)
    }

    /// Maps one buffer (see [`map_sg`](Self::map_sg)).
    pub fn map(
        &mut self,
        phys: u64,
        len: u64,
        dir: DmaDirection,
    ) -> Result<ViommuMapping, ViommuDmaError> {
        let mut v = self.map_sg(&[(phys, len)], dir)?;
        v.pop().ok_or(ViommuDmaError::BadLength { len })
    }

    /// Unmaps `m`. Strict: the UNMAP has completed (the unit's IOTLB is
    /// invalidated) and the IOVA is free when this returns. Lazy: the
    /// UNMAP is queued and the IOVA held until the flush that sends it.
    pub fn unmap(&mut self, m: ViommuMapping) -> Result<(), ViommuDmaError> {
        let start = m.pfn << PAGE_SHIFT;
        let req = encode::unmap(self.domain, start, start + m.mapped * PAGE_SIZE - 1);
        self.stats.requests += 1;
        self.stats.unmaps += 1;
        match self.mode {
            ViommuMode::Strict => {
                self.expect_ok("UNMAP", &req)?;
                self.cache.free(m.pfn, m.pages)?;
            }
            ViommuMode::Lazy { flush_queue } => {
                // What a flush here finds wrong with *other* requests (an
                // UNMAP refused) is not this call's to report: a caller
                // that took it for its own would unmap `m` again, maybe
                // over the next mapping given its IOVA. It is kept for
                // the next `flush`.
                if self.drv.free_slots() == 0 {
                    // The ring is full of queued requests: flush them
                    // (and check them) before queueing more. Still full
                    // (the driver failed): `m` stays mapped, an error.
                    // That failure is this call's (the driver's: a
                    // flush that completed emptied the ring); what an
                    // earlier flush kept stays for the next `flush`.
                    let r = self.flush_now();
                    if self.drv.free_slots() == 0 {
                        return Err(r.err().unwrap_or(ViommuDmaError::Refused {
                            op: "UNMAP",
                            status: None,
                        }));
                    }
                    if let Err(e) = r {
                        self.defer(e);
                    }
                }
                self.drv.queue(&req, s::TAIL_LEN as u32)?;
                self.queued.push(Queued::Unmap(m));
                self.unmaps_queued += 1;
                if self.unmaps_queued >= flush_queue.max(1) {
                    // `m`'s UNMAP is queued: this unmap is done, as a
                    // lazy unmap is.
                    self.flush_deferring();
                }
            }
        }
        Ok(())
    }

    /// Sends every queued request with one notification, waits for them,
    /// and frees the IOVAs of the unmaps among them. Every UNMAP still
    /// owed — one the device refused before ([`ViommuDmaError::UnmapKept`]),
    /// or the undo of a failed map whose outcome was unknown — is sent
    /// again with them.
    ///
    /// Also reports what a flush an [`unmap`](Self::unmap) or a
    /// [`map_sg`](Self::map_sg) found wrong with other requests (the
    /// first such error, before this flush's own, which the next flush
    /// then reports).
    pub fn flush(&mut self) -> Result<(), ViommuDmaError> {
        let r = if self.nothing_to_send() {
            Ok(())
        } else {
            self.stats.flushes += 1;
            self.sync(None)
        };
        match (self.deferred.take(), r) {
            (Some(e), Err(later)) => {
                self.deferred = Some(later);
                Err(e)
            }
            (Some(e), Ok(())) => Err(e),
            (None, r) => r,
        }
    }

    /// Mappings whose UNMAP is owed and not yet answered `OK` (kept and
    /// sent again by every flush): a caller may keep their buffers pinned
    /// until this is empty.
    pub fn unmaps_owed(&self) -> Vec<(u64, u64)> {
        self.owed.iter().map(|m| (m.iova, m.len)).collect()
    }

    /// Whether a sync would send nothing.
    fn nothing_to_send(&self) -> bool {
        self.queued.is_empty() && self.drv.queued() == 0 && self.owed.is_empty()
    }

    /// [`flush`](Self::flush) for an unmap: its error kept for the next
    /// `flush` (the first one kept) instead of returned.
    fn flush_deferring(&mut self) {
        if let Err(e) = self.flush_now() {
            self.defer(e);
        }
    }

    /// Sends what is queued, if anything; its error returned, nothing
    /// kept.
    fn flush_now(&mut self) -> Result<(), ViommuDmaError> {
        if self.nothing_to_send() {
            return Ok(());
        }
        self.stats.flushes += 1;
        self.sync(None)
    }

    /// Keeps `e` for the next [`flush`](Self::flush): the first one kept,
    /// a later one counted (`errors_coalesced`) while one is waiting.
    fn defer(&mut self, e: ViommuDmaError) {
        if self.deferred.is_some() {
            self.stats.errors_coalesced += 1;
        } else {
            self.deferred = Some(e);
        }
    }

    /// Queues the UNMAPs owed (`owed`) behind whatever is queued, as far
    /// as the ring has free slots (the rest wait for the next sync).
    fn queue_owed(&mut self) {
        while self.drv.free_slots() > 0 {
            let Some(m) = self.owed.pop() else { break };
            let start = m.pfn << PAGE_SHIFT;
            let req = encode::unmap(self.domain, start, start + m.mapped * PAGE_SIZE - 1);
            if self.drv.queue(&req, s::TAIL_LEN as u32).is_err() {
                // A free slot, so only guest memory refused: still owed.
                self.owed.push(m);
                break;
            }
            self.stats.requests += 1;
            self.queued.push(Queued::Unmap(m));
        }
    }

    /// Sends what is queued (and the UNMAPs owed, behind it) and judges
    /// each completion against the request it answers (never discarding
    /// one): an UNMAP's IOVA is freed only on `OK`; a refused UNMAP may
    /// leave the range mapped, so its mapping is owed again (`owed`:
    /// sent again by every later sync, its IOVA never reused meanwhile)
    /// and reported as [`ViommuDmaError::UnmapKept`]; a MAP refused with
    /// a status mapped nothing (its IOVA is freed, its serial kept in
    /// `refused_maps`); a MAP with no status may have mapped, and is left
    /// to the caller's undo; an orphaned MAP's answer is nobody's (its
    /// UNMAP is owed). A driver error (timeout, reset) judges nothing and
    /// frees nothing: everything stays queued for the next sync, which
    /// judges the answers the device gave meanwhile.
    ///
    /// `own`: `None` — every error is the caller's (the first returned);
    /// `Some(first)` — only the MAPs of serial `first` on are (a
    /// `map_sg`'s): any other request's error is kept for the next
    /// [`flush`](Self::flush) ([`defer`](Self::defer)), never returned as
    /// the call's own.
    fn sync(&mut self, own: Option<u64>) -> Result<(), ViommuDmaError> {
        self.queue_owed();
        self.drv.sync_statuses(&mut self.statuses)?;
        self.unmaps_queued = 0;
        // Requests the driver sent for a strict call whose wait failed
        // come first, and are answered here too: nobody judges them (their
        // mappings are owed or the caller's).
        let skip = self.statuses.len().saturating_sub(self.queued.len());
        let mut first: Option<ViommuDmaError> = None;
        for i in 0..self.queued.len() {
            let q = self.queued[i];
            let st = self.statuses.get(skip + i).copied().flatten();
            let (err, mine) = match (q, st) {
                (Queued::Unmap(m), Some(Status::Ok)) => (
                    self.cache.free(m.pfn, m.pages).err().map(Into::into),
                    own.is_none(),
                ),
                (Queued::Unmap(m), status) => {
                    self.owed.push(m);
                    let e = ViommuDmaError::UnmapKept {
                        iova: m.iova,
                        len: m.len,
                        status,
                    };
                    (Some(e), own.is_none())
                }
                (Queued::Orphan, _) | (Queued::Map(..), Some(Status::Ok)) => (None, true),
                (Queued::Map(m, serial), status) => {
                    if status.is_some() {
                        let _ = self.cache.free(m.pfn, m.pages);
                        self.refused_maps.push(serial);
                    }
                    let e = ViommuDmaError::Refused { op: "MAP", status };
                    (Some(e), own.is_none_or(|f| serial >= f))
                }
            };
            match err {
                Some(e) if mine => {
                    first.get_or_insert(e);
                }
                Some(e) => self.defer(e),
                None => {}
            }
        }
        self.queued.clear();
        first.map_or(Ok(()), Err)
    }

    /// A `map_segments` that fails undoes what it did: in lazy mode the
    /// queue is synced first (its statuses judged, not lost), then every
    /// MAP of `out` not refused is unmapped. If the sync fails (the
    /// driver timed out: the MAPs may be applied whenever the device gets
    /// to them), those MAPs are orphaned and their UNMAPs owed: the next
    /// sync sends them behind the MAPs, and their IOVAs are freed only on
    /// `OK` — no mapping the caller was not given stays reachable once
    /// the device has answered.
    fn abandon(&mut self, out: &[ViommuMapping], first_serial: u64) {
        if matches!(self.mode, ViommuMode::Lazy { .. }) {
            // Its own MAPs' errors are why it abandons; others' are kept.
            let _ = self.sync(Some(first_serial));
            let live: Vec<ViommuMapping> = out
                .iter()
                .zip(first_serial..)
                .filter(|(_, s)| !self.refused_maps.contains(s))
                .map(|(m, _)| *m)
                .collect();
            for q in &mut self.queued {
                if matches!(*q, Queued::Map(_, s) if s >= first_serial) {
                    *q = Queued::Orphan;
                }
            }
            self.owed.extend(live);
            if self.queued.is_empty() {
                // Judged: undo now, with one notification (errors kept
                // for the next flush; refused UNMAPs stay owed).
                let _ = self.sync(Some(u64::MAX));
            }
            return;
        }
        self.undo(out);
    }

    fn expect_ok(&mut self, op: &'static str, req: &[u8]) -> Result<(), ViommuDmaError> {
        match self.drv.request(req)? {
            Some(Status::Ok) => Ok(()),
            status => Err(ViommuDmaError::Refused { op, status }),
        }
    }

    /// Gives back the mappings of a failed strict `map_sg`: each UNMAP
    /// sent and waited for, then its IOVA freed. One refused stays owed
    /// (sent again by the next flush); once the driver fails, the rest are
    /// owed without a wait each, so the call waits at most once more.
    fn undo(&mut self, done: &[ViommuMapping]) {
        for (i, m) in done.iter().enumerate() {
            let start = m.pfn << PAGE_SHIFT;
            let req = encode::unmap(self.domain, start, start + m.mapped * PAGE_SIZE - 1);
            match self.drv.request(&req) {
                Ok(Some(Status::Ok)) => {
                    let _ = self.cache.free(m.pfn, m.pages);
                }
                Ok(_) => self.owed.push(*m),
                Err(_) => {
                    self.owed.extend_from_slice(&done[i..]);
                    return;
                }
            }
        }
    }
}

/// The RESV_MEM regions `(start, end)` of a PROBE's properties
/// (§5.13.6.5: each `length + 4` bytes after the last; an empty type
/// ends the list; a property with reserved bits set is ignored).
pub fn resv_regions(props: &[u8]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(h) = props.get(at..at + s::PROBE_PROP_HEAD) {
        let word = u16::from_le_bytes([h[0], h[1]]);
        let len = usize::from(u16::from_le_bytes([h[2], h[3]]));
        let ty = word & s::PROBE_TYPE_MASK;
        if ty == 0 {
            break;
        }
        let body = at + s::PROBE_PROP_HEAD;
        if word & !s::PROBE_TYPE_MASK == 0 && ty == s::PROBE_T_RESV_MEM && len >= s::RESV_MEM_LEN {
            if let Some(b) = props.get(body..body + s::RESV_MEM_LEN) {
                let le64 = |i: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&b[i..i + 8]);
                    u64::from_le_bytes(w)
                };
                out.push((le64(4), le64(12)));
            }
        }
        at = body.saturating_add(len);
    }
    out
}

/// Reserves the part of the MSI window inside `[start_pfn, end_pfn]` in
/// `iova`, so no buffer is given an address there.
fn keep_out_msi(iova: &IovaDomain, start_pfn: u64, end_pfn: u64) -> Result<(), IovaError> {
    let (lo, hi) = MSI_WINDOW_PFNS;
    if lo <= end_pfn && hi >= start_pfn {
        iova.reserve(lo.max(start_pfn), hi.min(end_pfn))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocation just under the window's top lands below it (before:
    /// the space reserved nothing, and the page at 0xfeeff was handed out).
    #[test]
    fn the_msi_window_is_kept_out_of_the_iova_space() {
        let iova = IovaDomain::new(1, (1 << 36) - 1, IovaPolicy::Softiommu).unwrap();
        keep_out_msi(&iova, 1, (1 << 36) - 1).unwrap();
        let pfn = iova.alloc(1, MSI_WINDOW_PFNS.1).unwrap();
        assert!(pfn < MSI_WINDOW_PFNS.0, "{pfn:#x}");
        // A space that ends inside the window keeps out its part.
        let low = IovaDomain::new(1, 0xfee80, IovaPolicy::Softiommu).unwrap();
        keep_out_msi(&low, 1, 0xfee80).unwrap();
        assert!(low.alloc(1, 0xfee80).unwrap() < MSI_WINDOW_PFNS.0);
        // One below the window is untouched.
        let below = IovaDomain::new(1, 0x1000, IovaPolicy::Softiommu).unwrap();
        keep_out_msi(&below, 1, 0x1000).unwrap();
        assert_eq!(below.alloc(1, 0x1000).unwrap(), 0x1000);
    }
}
