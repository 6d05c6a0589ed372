//! [`DmaAccessor`]: a device thread's reads, writes, fills and typed loads
//! and stores at IOVAs, through its unit's translation, ordered as its
//! [`DmaAttrs`] say.
//!
//! Every access is one translation section (`Translator::begin`) around
//! translate *and* copy: a driver's completed invalidation wait therefore
//! means no access is still moving bytes through what it revoked. The
//! whole range is translated, and checked against physical memory, before
//! the first byte moves, so a fault anywhere leaves nothing half done.

#![deny(clippy::indexing_slicing)]

use std::sync::Arc;

use super::attrs::{DmaAttrs, DmaFence};
use super::error::AccessError;
use super::fence::CpuFences;
use super::mapping::DmaMapping;
use super::order::Orderer;
use super::word::DmaWord;
use crate::dma::{DmaDevice, DmaDirection};
use crate::hw::{
    Access, HwError, PhysRanges, SourceId, TranslateError, TranslationGuard, Translator,
    TranslatorStats, Unit,
};
use crate::mem::{MemError, PhysMemory};

/// Counts of one accessor, kept in the accessor (no shared writes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccessStats {
    /// Reads (bulk and typed) that completed.
    pub reads: u64,
    /// Writes and fills that completed.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Accesses (and mappings) refused.
    pub errors: u64,
    /// Full fences issued (the ordered mode's store-load fences, and every
    /// fence of the full mode).
    pub full_fences: u64,
    /// Page requests this accessor's misses raised and had answered
    /// `Success` (then retried).
    pub page_requests: u64,
    /// CPU nanoseconds this accessor's thread spent waiting for page
    /// responses (spinning, yielding; its thread CPU clock), when the
    /// waits are timed ([`DmaAccessor::time_page_waits`]); 0 otherwise.
    pub page_wait_cpu_ns: u64,
}

/// A device's side of DMA: accesses at IOVAs through a unit's translation.
///
/// It owns a [`Translator`], so it is made on, and stays on, the device
/// thread that uses it (it is neither `Send` nor `Sync`); make one per
/// device thread. Accesses never allocate unless one spans more than
/// [`PhysRanges::INLINE`] discontiguous physical pieces.
pub struct DmaAccessor {
    tr: Translator,
    sid: SourceId,
    mem: Arc<PhysMemory>,
    order: Orderer<CpuFences>,
    stats: AccessStats,
    time_waits: bool,
    on_request: Option<Box<dyn FnMut()>>,
}

impl std::fmt::Debug for DmaAccessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaAccessor")
            .field("sid", &self.sid)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Where an access's bytes are, checked.
enum Pieces {
    /// One physically contiguous piece of the access's length.
    One(u64),
    /// Several, in IOVA order.
    Many(PhysRanges),
}

/// The most page requests one access may raise and have answered: one per
/// page of the longest access (1 GiB at 4 KiB is 262,144; the default 1 MiB
/// is 256) would be unbounded in time, so twice the default's pages plus a
/// margin for a reclaim racing the device.
pub const PAGE_REQUEST_ROUNDS: u32 = 2 * 256 + 8;

/// Checks that every piece lies in RAM: never the IOMMU's reserve, whatever
/// a table's leaf says.
fn check_ranges(mem: &PhysMemory, ranges: &PhysRanges) -> Result<(), MemError> {
    for r in ranges {
        mem.device_ptr(r.phys, r.len)?;
    }
    Ok(())
}

impl DmaAccessor {
    /// An accessor for device `sid` behind `unit`, taking one of the unit's
    /// translator slots ([`HwError::TooManyTranslators`] if none is free).
    pub fn new(unit: &Unit, sid: SourceId) -> Result<Self, HwError> {
        Ok(Self {
            tr: unit.translator()?,
            sid,
            mem: unit.memory().clone(),
            order: Orderer::new(),
            stats: AccessStats::default(),
            time_waits: false,
            on_request: None,
        })
    }

    /// Whether each wait for a page response is timed on the thread's CPU
    /// clock into [`AccessStats::page_wait_cpu_ns`] (off by default: two
    /// clock reads, a system call each, per page request), so that a lab
    /// can take the device's work apart from its waiting.
    pub fn time_page_waits(&mut self, on: bool) {
        self.time_waits = on;
    }

    /// Runs `hook` on this thread each time one of this accessor's accesses
    /// has raised a page request, before it waits for the answer, outside
    /// this accessor's translation section; `None` removes it. For a
    /// device model that serves its own faults: the hook calls an inline
    /// [`IopfHandler`](crate::iopf::IopfHandler::inline)'s
    /// `serve_pending`, and the wait then finds the answer carried out
    /// (with the unit's queue in inline mode; a queue thread's pass
    /// otherwise). After the hook returns, the wait is bounded by the
    /// unit's page response timeout; a hook that blocks holds its device
    /// as long.
    pub fn on_page_request(&mut self, hook: Option<Box<dyn FnMut()>>) {
        self.on_request = hook;
    }

    /// An accessor for a device attached through the DMA API, behind the
    /// unit its system assigned it to.
    pub fn for_device(dev: &DmaDevice) -> Result<Self, HwError> {
        let sid = dev.source_id();
        let (_, unit) = dev
            .domain()
            .system()
            .unit_of(sid)
            .ok_or(HwError::DeviceNotAssigned { sid })?;
        Self::new(unit, sid)
    }

    /// The device's source id.
    pub fn source_id(&self) -> SourceId {
        self.sid
    }

    /// The physical memory behind the IOVAs.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.mem
    }

    /// This accessor's counts.
    pub fn stats(&self) -> AccessStats {
        AccessStats {
            full_fences: self.order.full_fences(),
            ..self.stats
        }
    }

    /// The counts of the translator underneath (IOTLB hits, walks, faults).
    pub fn translator_stats(&self) -> TranslatorStats {
        self.tr.stats()
    }

    fn fail<T>(&mut self, e: AccessError) -> Result<T, AccessError> {
        if !matches!(
            e,
            AccessError::Translate(TranslateError::PageRequested { .. })
        ) {
            self.stats.errors += 1;
        }
        Err(e)
    }

    /// Runs `op`, one access in one section. While it raises a page request
    /// (the device may fault: see `hw`'s page requests), waits for the
    /// answer outside any section and runs it again: at most
    /// [`PAGE_REQUEST_ROUNDS`] times, so the work one access can cause
    /// stays bounded even if a reclaim keeps taking the page back.
    #[inline]
    fn retrying<T>(
        &mut self,
        mut op: impl FnMut(&mut Self) -> Result<T, AccessError>,
    ) -> Result<T, AccessError> {
        let mut rounds = 0;
        loop {
            match op(self) {
                Err(e) => self.after_page_request(e, &mut rounds)?,
                ok => return ok,
            }
        }
    }

    /// What follows a failed attempt: `Ok` to try again after the page
    /// request it raised was answered `Success`; the error otherwise.
    #[cold]
    fn after_page_request(&mut self, e: AccessError, rounds: &mut u32) -> Result<(), AccessError> {
        let AccessError::Translate(TranslateError::PageRequested {
            sid,
            iova,
            access,
            prgi,
        }) = e
        else {
            return Err(e);
        };
        if let Some(hook) = self.on_request.as_mut() {
            hook();
        }
        let c0 = self.time_waits.then(crate::cpu_clock::thread);
        let answered = self.tr.wait_page_response(sid, iova, access, prgi);
        if let Some(c0) = c0 {
            let spent = crate::cpu_clock::thread().saturating_sub(c0);
            self.stats.page_wait_cpu_ns = self
                .stats
                .page_wait_cpu_ns
                .saturating_add(u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX));
        }
        *rounds += 1;
        match answered {
            Ok(()) if *rounds < PAGE_REQUEST_ROUNDS => {
                self.stats.page_requests += 1;
                Ok(())
            }
            Ok(()) => {
                self.stats.errors += 1;
                Err(TranslateError::PageRequestDenied { sid, iova, access }.into())
            }
            Err(e) => {
                self.stats.errors += 1;
                Err(e.into())
            }
        }
    }

    /// Translates `[iova, iova + len)` whole and checks it against
    /// physical memory: one piece (the common case, an access inside one
    /// page, with no `PhysRanges` built), or all of them.
    #[inline(always)]
    fn pieces(
        g: &mut TranslationGuard<'_>,
        mem: &PhysMemory,
        sid: SourceId,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Pieces, AccessError> {
        if len.wrapping_sub(1) >= g.max_access() {
            // Zero or too long: through the translator, so that the
            // malformed request is recorded in the unit's fault log like
            // any other.
            let e = g.translate(sid, iova, len, access).err();
            return Err(e.unwrap_or(TranslateError::ZeroLength { sid, iova }).into());
        }
        let first = g.translate_page(sid, iova, access)?;
        let checked = |r: Result<*mut u8, MemError>| {
            r.map_err(|source| AccessError::Memory { sid, iova, source })
        };
        if first.len >= len {
            checked(mem.device_ptr(first.phys, len))?;
            return Ok(Pieces::One(first.phys));
        }
        let ranges = g.translate(sid, iova, len, access)?;
        for r in &ranges {
            checked(mem.device_ptr(r.phys, r.len))?;
        }
        Ok(Pieces::Many(ranges))
    }

    /// Copies `buf.len()` bytes at `iova` into `buf` (the device reads
    /// guest memory). On error `buf` is unchanged.
    pub fn read(&mut self, iova: u64, buf: &mut [u8], attrs: DmaAttrs) -> Result<(), AccessError> {
        self.retrying(|a| a.read_once(iova, buf, attrs))
    }

    fn read_once(&mut self, iova: u64, buf: &mut [u8], attrs: DmaAttrs) -> Result<(), AccessError> {
        let (sid, mode) = (self.sid, attrs.mode());
        let len = buf.len() as u64;
        let mem = &*self.mem;
        let mut g = self.tr.begin();
        let pieces = match Self::pieces(&mut g, mem, sid, iova, len, Access::Read) {
            Ok(p) => p,
            Err(e) => {
                drop(g);
                return self.fail(e);
            }
        };
        let copied = self.order.bulk_read(mode, || match &pieces {
            Pieces::One(phys) => mem.read(*phys, buf),
            Pieces::Many(ranges) => {
                let mut off = 0usize;
                for r in ranges {
                    let n = r.len as usize;
                    // The pieces add up to `buf.len()` (one translation of it).
                    let dst = buf.get_mut(off..off + n).ok_or(MemError::OutOfRange {
                        addr: r.phys,
                        len: r.len,
                        size: mem.size(),
                    })?;
                    mem.read(r.phys, dst)?;
                    off += n;
                }
                Ok(())
            }
        });
        drop(g);
        // Cannot fail: every piece was checked above.
        copied.map_err(|source| AccessError::Memory { sid, iova, source })?;
        self.stats.reads += 1;
        self.stats.bytes_read += len;
        Ok(())
    }

    /// Copies `buf` to `iova` (the device writes guest memory). On error no
    /// byte was written.
    pub fn write(&mut self, iova: u64, buf: &[u8], attrs: DmaAttrs) -> Result<(), AccessError> {
        self.retrying(|a| a.write_once(iova, buf, attrs))
    }

    fn write_once(&mut self, iova: u64, buf: &[u8], attrs: DmaAttrs) -> Result<(), AccessError> {
        self.store_bytes(iova, buf.len() as u64, attrs, |mem, pieces| match pieces {
            Pieces::One(phys) => mem.write(*phys, buf),
            Pieces::Many(ranges) => {
                let mut off = 0usize;
                for r in ranges {
                    let n = r.len as usize;
                    // The pieces add up to `buf.len()` (one translation of it).
                    let src = buf.get(off..off + n).ok_or(MemError::OutOfRange {
                        addr: r.phys,
                        len: r.len,
                        size: mem.size(),
                    })?;
                    mem.write(r.phys, src)?;
                    off += n;
                }
                Ok(())
            }
        })
    }

    /// Sets `len` bytes at `iova` to `byte`. On error no byte was written.
    pub fn fill(
        &mut self,
        iova: u64,
        len: u64,
        byte: u8,
        attrs: DmaAttrs,
    ) -> Result<(), AccessError> {
        self.retrying(|a| a.fill_once(iova, len, byte, attrs))
    }

    fn fill_once(
        &mut self,
        iova: u64,
        len: u64,
        byte: u8,
        attrs: DmaAttrs,
    ) -> Result<(), AccessError> {
        self.store_bytes(iova, len, attrs, |mem, pieces| match pieces {
            Pieces::One(phys) => mem.fill(*phys, len, byte),
            Pieces::Many(ranges) => {
                for r in ranges {
                    mem.fill(r.phys, r.len, byte)?;
                }
                Ok(())
            }
        })
    }

    /// The write path: translate all, check all, then store.
    #[inline(always)]
    fn store_bytes(
        &mut self,
        iova: u64,
        len: u64,
        attrs: DmaAttrs,
        store: impl FnOnce(&PhysMemory, &Pieces) -> Result<(), MemError>,
    ) -> Result<(), AccessError> {
        let (sid, mode) = (self.sid, attrs.mode());
        let mem = &*self.mem;
        let mut g = self.tr.begin();
        let pieces = match Self::pieces(&mut g, mem, sid, iova, len, Access::Write) {
            Ok(p) => p,
            Err(e) => {
                drop(g);
                return self.fail(e);
            }
        };
        let stored = self.order.bulk_write(mode, || store(mem, &pieces));
        drop(g);
        // Cannot fail: every piece was checked above.
        stored.map_err(|source| AccessError::Memory { sid, iova, source })?;
        self.stats.writes += 1;
        self.stats.bytes_written += len;
        Ok(())
    }

    /// Loads the little-endian word at `iova`: one atomic load when `iova`
    /// is aligned to the word's size, a byte copy otherwise.
    #[inline]
    fn read_word<W: DmaWord>(&mut self, iova: u64, attrs: DmaAttrs) -> Result<W, AccessError> {
        let (sid, mode) = (self.sid, attrs.mode());
        let size = W::SIZE as u64;
        if iova.is_multiple_of(size) {
            let mut g = self.tr.begin();
            match aligned_word(&mut g, &self.mem, sid, iova, size, Access::Read) {
                Err(e) => {
                    drop(g);
                    return self.fail(e);
                }
                Ok(Some(p)) => {
                    // SAFETY: `p` is valid for `SIZE` bytes and aligned
                    // (checked by `aligned_word`); the arena outlives the
                    // call; guest-side users of shared words access them
                    // atomically.
                    let v = self.order.load(mode, |o| unsafe { W::load_le(p, o) });
                    drop(g);
                    self.stats.reads += 1;
                    self.stats.bytes_read += size;
                    return Ok(v);
                }
                Ok(None) => {}
            }
        }
        let mut b = [0u8; 8];
        #[allow(clippy::indexing_slicing)] // `W::SIZE` is 2, 4 or 8 (`DmaWord`).
        let bytes = &mut b[..W::SIZE];
        self.read_once(iova, bytes, attrs)?;
        Ok(W::from_le_slice(bytes))
    }

    /// Stores `v` little-endian at `iova`: one atomic store when aligned.
    #[inline]
    fn write_word<W: DmaWord>(
        &mut self,
        iova: u64,
        v: W,
        attrs: DmaAttrs,
    ) -> Result<(), AccessError> {
        let (sid, mode) = (self.sid, attrs.mode());
        let size = W::SIZE as u64;
        if iova.is_multiple_of(size) {
            let mut g = self.tr.begin();
            match aligned_word(&mut g, &self.mem, sid, iova, size, Access::Write) {
                Err(e) => {
                    drop(g);
                    return self.fail(e);
                }
                Ok(Some(p)) => {
                    // SAFETY: as in `read_word`, for a store.
                    self.order.store(mode, |o| unsafe { W::store_le(p, v, o) });
                    drop(g);
                    self.stats.writes += 1;
                    self.stats.bytes_written += size;
                    return Ok(());
                }
                Ok(None) => {}
            }
        }
        let b = v.to_le_array();
        #[allow(clippy::indexing_slicing)] // `W::SIZE` is 2, 4 or 8 (`DmaWord`).
        let bytes = &b[..W::SIZE];
        self.write_once(iova, bytes, attrs)
    }

    /// Loads a little-endian `u16` (atomic when 2-byte aligned).
    pub fn read_u16(&mut self, iova: u64, attrs: DmaAttrs) -> Result<u16, AccessError> {
        self.retrying(|a| a.read_word(iova, attrs))
    }

    /// Loads a little-endian `u32` (atomic when 4-byte aligned).
    pub fn read_u32(&mut self, iova: u64, attrs: DmaAttrs) -> Result<u32, AccessError> {
        self.retrying(|a| a.read_word(iova, attrs))
    }

    /// Loads a little-endian `u64` (atomic when 8-byte aligned).
    pub fn read_u64(&mut self, iova: u64, attrs: DmaAttrs) -> Result<u64, AccessError> {
        self.retrying(|a| a.read_word(iova, attrs))
    }

    /// Stores a little-endian `u16` (atomic when 2-byte aligned).
    pub fn write_u16(&mut self, iova: u64, v: u16, attrs: DmaAttrs) -> Result<(), AccessError> {
        self.retrying(|a| a.write_word(iova, v, attrs))
    }

    /// Stores a little-endian `u32` (atomic when 4-byte aligned).
    pub fn write_u32(&mut self, iova: u64, v: u32, attrs: DmaAttrs) -> Result<(), AccessError> {
        self.retrying(|a| a.write_word(iova, v, attrs))
    }

    /// Stores a little-endian `u64` (atomic when 8-byte aligned).
    pub fn write_u64(&mut self, iova: u64, v: u64, attrs: DmaAttrs) -> Result<(), AccessError> {
        self.retrying(|a| a.write_word(iova, v, attrs))
    }

    /// An explicit fence, for a device that accesses relaxed and orders
    /// itself where its protocol needs it.
    pub fn fence(&mut self, f: DmaFence) {
        match f {
            DmaFence::Read => self.order.explicit(true, false),
            DmaFence::Write => self.order.explicit(false, true),
            DmaFence::Full => self.order.explicit(true, true),
        }
    }

    /// Translates `[iova, iova + len)` once for bulk, zero-copy use in
    /// direction `dir`, and calls `f` with the mapping (see
    /// [`DmaMapping`]). The mapping keeps a translation section open while
    /// `f` runs: until it returns, a driver's invalidation wait for this
    /// unit does not complete, so what the mapping names cannot be unmapped
    /// and reused under the device. The mapping is lent, never given: it
    /// cannot outlive `f` or be leaked (a leaked section would hold every
    /// later wait forever). Copy in `f`; never block in it.
    ///
    /// `attrs` orders the mapping as a whole: in ordered mode, its accesses
    /// come after every earlier access of this accessor and before every
    /// later ordered one; inside it, ordering is up to the device.
    pub fn with_map<R>(
        &mut self,
        iova: u64,
        len: u64,
        dir: DmaDirection,
        attrs: DmaAttrs,
        f: impl FnOnce(&DmaMapping<'_>) -> R,
    ) -> Result<R, AccessError> {
        let mut rounds = 0;
        loop {
            let e = match self.map(iova, len, dir, attrs) {
                Ok(m) => return Ok(f(&m)),
                Err(e) => e,
            };
            self.after_page_request(e, &mut rounds)?;
        }
    }

    fn map(
        &mut self,
        iova: u64,
        len: u64,
        dir: DmaDirection,
        attrs: DmaAttrs,
    ) -> Result<DmaMapping<'_>, AccessError> {
        let (sid, mode) = (self.sid, attrs.mode());
        let (read, write) = match dir {
            DmaDirection::ToDevice => (true, false),
            DmaDirection::FromDevice => (false, true),
            DmaDirection::Bidirectional => (true, true),
        };
        let mut g = self.tr.begin();
        let first = if write { Access::Write } else { Access::Read };
        let mut res = g.translate(sid, iova, len, first);
        if read && write && res.is_ok() {
            // Both rights are needed: a missing read right faults as such.
            if let Err(e) = g.translate(sid, iova, len, Access::Read) {
                res = Err(e);
            }
        }
        let ranges = match res {
            Ok(r) => r,
            Err(e) => {
                drop(g);
                // (Not `fail`: the borrow of `self` this returns.)
                if !matches!(e, TranslateError::PageRequested { .. }) {
                    self.stats.errors += 1;
                }
                return Err(e.into());
            }
        };
        if let Err(source) = check_ranges(&self.mem, &ranges) {
            drop(g);
            self.stats.errors += 1;
            return Err(AccessError::Memory { sid, iova, source });
        }
        self.order.map_start(mode, read, write);
        Ok(DmaMapping {
            _section: g,
            mem: &self.mem,
            ranges,
            iova,
            len,
            dir,
            mode,
            order: &mut self.order,
        })
    }
}

/// The aligned fast path of a typed access: where the word at `iova` lies in
/// the arena, when the page is mapped for `access` and the word is aligned
/// there too (`None`: take the byte path). An aligned word never crosses a
/// page, and the arena is page aligned, so this holds whenever `iova` is.
#[inline(always)]
fn aligned_word(
    g: &mut TranslationGuard<'_>,
    mem: &PhysMemory,
    sid: SourceId,
    iova: u64,
    size: u64,
    access: Access,
) -> Result<Option<*mut u8>, AccessError> {
    let span = g.translate_page(sid, iova, access)?;
    let p = mem
        .device_ptr(span.phys, size)
        .map_err(|source| AccessError::Memory { sid, iova, source })?;
    Ok((span.len >= size && (p as usize).is_multiple_of(size as usize)).then_some(p))
}
