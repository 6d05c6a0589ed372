//! The Intel VT-d second-level page-table format, 4 levels, 48-bit IOVAs.
//!
//! Layout (Intel VT-d Architecture Specification, §3.7 "Second-Level
//! Translation" and §9.8 "Second-Level Paging Entries", called
//! "second-stage" from revision 4.0): each level is one 4 KiB page of 512
//! little-endian 64-bit entries, indexed by 9 bits of the IOVA:
//!
//! | level | table            | IOVA bits | a leaf here maps |
//! |-------|------------------|-----------|------------------|
//! | 4     | SL-PML4          | 47:39     | (no leaf)        |
//! | 3     | SL-PDPT          | 38:30     | 1 GiB (PS = 1)   |
//! | 2     | SL-PD            | 29:21     | 2 MiB (PS = 1)   |
//! | 1     | SL-PT            | 20:12     | 4 KiB            |
//!
//! Entry bits we use: 0 = R (read), 1 = W (write), 7 = PS (page size: the
//! entry is a leaf; reserved at level 4, ignored at level 1), 51:12 = the
//! address of the next table or of the page (for a 1 GiB leaf bits 29:12
//! and for a 2 MiB leaf bits 20:12 are reserved, zero). An entry with R and
//! W both clear is not present. The access rights of a translation are
//! those allowed at *every* level of the walk (§3.7), so table entries carry
//! R and W and the leaf carries the mapping's rights. Bits we never set
//! (X, EMT, IPAT, SNP, TM, A/D) stay zero.
//!
//! # Concurrency contract
//!
//! All operations take `&self`. A device may walk the table at any time; it
//! sees every entry either before or after an update, never torn (entries
//! are written with single atomic 64-bit stores), and a new table is fully
//! written (and, for a non-coherent walker, flushed) before the entry that
//! points to it is stored with `Release`, which pairs with the walker's
//! `Acquire` load of that entry.
//!
//! Callers must serialise map and unmap calls whose ranges overlap, or that
//! fall in one large leaf (a partial unmap splits the leaf). Calls on
//! disjoint ranges may run at once: they may race to install the same
//! missing table, which is settled by a compare-exchange on the parent
//! entry; the loser recycles its (never published) page. An unmap unlinks
//! a table only when the unmapped range covers the table's whole IOVA span,
//! so no concurrent call on a disjoint range can be using it. (A table that
//! a smaller unmap leaves empty stays linked; freeing it would race with a
//! disjoint map into the rest of its span.) Breaking the contract cannot
//! cause memory unsafety; it may yield [`PgtableError::Raced`] and a call
//! applied in part.
//!
//! # Failure atomicity
//!
//! A map first checks that the whole range is free and counts the table
//! pages it will need, allocates them all, and only then writes: running
//! out of frames fails before anything is mapped. An unmap first checks
//! that the whole range is mapped; it may then split the large leaves at the
//! range's two ends, which changes no translation (a split that fails for
//! want of frames leaves the table translating as before); then it clears.
//!
//! # Cache maintenance
//!
//! For a walker that is not coherent, each call flushes every line it
//! wrote, once per batch: new table pages are written whole, flushed in one
//! batch and fenced before they are linked; all other writes (leaves, links,
//! clears) are flushed in a final batch at the end of the call. A new page's
//! zeroes are flushed with it: the frame may hold an old table's entries in
//! memory that the CPU cache hides.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::cache_flush::{FlushMethod, LineFlusher};
use super::gather::IotlbGather;
use super::{IoPageTable, OpStats, PageSize, Perm, PgtableError, TableStats, Translation};
use crate::mem::{FrameOwner, MemError, PhysAddr, PhysMemory, PAGE_SIZE};

/// Levels of the table: 4-level paging, adjusted guest address width 48
/// (VT-d §3.7, `CAP.SAGAW` bit 2).
pub const VTD_LEVELS: u32 = 4;
/// IOVA width in bits of 4-level paging.
pub const VTD_IOVA_BITS: u32 = 48;
/// Width of the address field of an entry: bits 51:12, so physical
/// addresses below 2^52 (the largest host address width VT-d defines).
pub const VTD_ADDR_BITS: u32 = 52;
/// Read permission (bit 0 of every second-level entry, VT-d §9.8).
pub const SL_R: u64 = 1 << 0;
/// Write permission (bit 1, VT-d §9.8).
pub const SL_W: u64 = 1 << 1;
/// Page size (bit 7, VT-d §9.8): at levels 3 and 2 the entry maps a 1 GiB or
/// 2 MiB page instead of pointing to a table; reserved at level 4, ignored
/// at level 1.
pub const SL_PS: u64 = 1 << 7;
/// The address field, bits 51:12 (VT-d §9.8).
pub const SL_ADDR_MASK: u64 = ((1 << VTD_ADDR_BITS) - 1) & !(PAGE_SIZE - 1);
/// `ECAP_REG.C`, bit 0 (VT-d §11.4.3, "Page-walk Coherency"): set when the
/// hardware's walks snoop the CPU caches.
pub const ECAP_C: u64 = 1 << 0;

/// Entries per table page.
const ENTRIES: u64 = 512;
/// IOVA bits translated per level.
const STRIDE: u32 = 9;
/// Size of one entry in bytes.
const ENTRY_BYTES: u64 = 8;

/// log2 of the IOVA span one entry at `level` (1 to 4) covers.
pub fn level_shift(level: u32) -> u32 {
    PAGE_SIZE.trailing_zeros() + STRIDE * level.saturating_sub(1)
}

/// The index of `iova`'s entry in the table at `level` (1 to 4).
pub fn level_index(iova: u64, level: u32) -> u64 {
    (iova >> level_shift(level)) & (ENTRIES - 1)
}

/// A decoded second-level entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlEntry {
    /// R and W clear: the walk stops, the IOVA is not mapped.
    NotPresent,
    /// A pointer to the next level's table.
    Table {
        /// Physical address of the next table.
        addr: PhysAddr,
        /// The rights this level allows.
        perm: Perm,
    },
    /// A leaf: the page the IOVA translates into.
    Leaf {
        /// Physical address of the page.
        addr: PhysAddr,
        /// Its size.
        size: PageSize,
        /// The rights this level allows.
        perm: Perm,
    },
    /// Present, but a reserved bit is set (PS at level 4, or address bits
    /// below a large leaf's alignment): the hardware reports a fault.
    Reserved {
        /// The raw entry.
        raw: u64,
    },
}

/// Decodes the raw entry `raw` found at `level` (1 to 4) per VT-d §9.8.
pub fn decode_entry(raw: u64, level: u32) -> SlEntry {
    let perm = perm_of(raw);
    if perm.is_empty() {
        return SlEntry::NotPresent;
    }
    let addr = raw & SL_ADDR_MASK;
    let size = match level {
        1 => Some(PageSize::Size4K),
        2 if raw & SL_PS != 0 => Some(PageSize::Size2M),
        3 if raw & SL_PS != 0 => Some(PageSize::Size1G),
        2 | 3 => None,
        _ if raw & SL_PS != 0 => return SlEntry::Reserved { raw },
        _ => None,
    };
    match size {
        Some(size) if addr & (size.bytes() - 1) != 0 => SlEntry::Reserved { raw },
        Some(size) => SlEntry::Leaf { addr, size, perm },
        None => SlEntry::Table { addr, perm },
    }
}

fn perm_of(raw: u64) -> Perm {
    let mut p = Perm::NONE;
    if raw & SL_R != 0 {
        p = p | Perm::READ;
    }
    if raw & SL_W != 0 {
        p = p | Perm::WRITE;
    }
    p
}

fn perm_bits(perm: Perm) -> u64 {
    (if perm.read() { SL_R } else { 0 }) | (if perm.write() { SL_W } else { 0 })
}

/// The entry pointing to the table at `page`: R and W, so that the leaf
/// alone decides the rights.
fn table_entry(page: PhysAddr) -> u64 {
    (page & SL_ADDR_MASK) | SL_R | SL_W
}

/// The leaf entry at `level` mapping the page at `phys`.
fn leaf_entry(phys: PhysAddr, level: u32, perm: Perm) -> u64 {
    let ps = if level > 1 { SL_PS } else { 0 };
    (phys & SL_ADDR_MASK) | ps | perm_bits(perm)
}

/// The physical address of `iova`'s entry in the table at `table`.
fn slot(table: PhysAddr, level: u32, iova: u64) -> PhysAddr {
    table + level_index(iova, level) * ENTRY_BYTES
}

/// The end of the part of `[cur, end)` that `cur`'s entry at `level` covers.
fn entry_end(cur: u64, level: u32, end: u64) -> u64 {
    let shift = level_shift(level);
    (((cur >> shift) + 1) << shift).min(end)
}

/// Whether `[iova, iova + len)` → `phys` can be one leaf at `level`.
fn fits_leaf(level: u32, iova: u64, phys: PhysAddr, len: u64) -> bool {
    if !(1..=3).contains(&level) {
        return false;
    }
    let span = 1u64 << level_shift(level);
    iova & (span - 1) == 0 && phys & (span - 1) == 0 && len >= span
}

/// Whether the entry at `level` holding `addr` lies wholly in `[start, end)`.
fn entry_inside(addr: u64, level: u32, start: u64, end: u64) -> bool {
    let span = 1u64 << level_shift(level);
    let base = addr & !(span - 1);
    base >= start && base + span <= end
}

/// Translates `iova` by walking the table rooted at `root` as the hardware
/// does (VT-d §3.7): `None` if an entry on the way is not present or has a
/// reserved bit set. The permissions are those of every level together.
pub fn walk(
    mem: &PhysMemory,
    root: PhysAddr,
    iova: u64,
) -> Result<Option<Translation>, PgtableError> {
    if iova >> VTD_IOVA_BITS != 0 {
        return Err(PgtableError::AddressTooWide {
            iova,
            len: 1,
            width: VTD_IOVA_BITS,
        });
    }
    let mut table = root;
    let mut perm = Perm::RW;
    for level in (1..=VTD_LEVELS).rev() {
        // Acquire: pairs with the Release store that linked the entry, so
        // the table or page it points to is seen as it was written.
        let raw = mem.load_u64(slot(table, level, iova), Ordering::Acquire)?;
        match decode_entry(raw, level) {
            SlEntry::NotPresent | SlEntry::Reserved { .. } => return Ok(None),
            SlEntry::Table { addr, perm: p } => {
                table = addr;
                perm = perm & p;
            }
            SlEntry::Leaf {
                addr,
                size,
                perm: p,
            } => {
                return Ok(Some(Translation {
                    phys: addr | (iova & (size.bytes() - 1)),
                    size,
                    perm: perm & p,
                }));
            }
        }
    }
    Ok(None)
}

/// How a [`VtdPageTable`] treats the CPU caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VtdConfig {
    /// Whether the walker snoops the CPU caches (`ECAP.C` = 1).
    pub coherent: bool,
    /// How lines are flushed when it does not.
    pub flush: FlushMethod,
}

impl Default for VtdConfig {
    fn default() -> Self {
        Self::coherent()
    }
}

impl VtdConfig {
    /// A coherent walker: no flushes.
    pub fn coherent() -> Self {
        Self {
            coherent: true,
            flush: FlushMethod::detect(),
        }
    }

    /// A walker that does not snoop: flushes with the best method this CPU
    /// has ([`FlushMethod::detect`]).
    pub fn non_coherent() -> Self {
        Self {
            coherent: false,
            ..Self::coherent()
        }
    }

    /// As the unit's extended capability register says (bit [`ECAP_C`]).
    pub fn from_ecap(ecap: u64) -> Self {
        Self {
            coherent: ecap & ECAP_C != 0,
            ..Self::coherent()
        }
    }

    /// The same, flushing with `method`.
    pub fn with_flush(self, method: FlushMethod) -> Self {
        Self {
            flush: method,
            ..self
        }
    }
}

/// Totals over a table's life; updated once per call, and only for counts
/// that are not zero, so a coherent steady state touches none of them.
#[derive(Debug, Default)]
struct Totals {
    tables_allocated: AtomicU64,
    tables_freed: AtomicU64,
    splits: AtomicU64,
    lines_written: AtomicU64,
    lines_flushed: AtomicU64,
    flush_batches: AtomicU64,
}

/// A VT-d second-level, 4-level IO page table in [`PhysMemory`].
///
/// Table pages are 4 KiB frames of the memory it is given; the root is
/// allocated at creation and every page still linked is freed when the
/// table is dropped. Drop it only once no walker can reach it (the domain
/// is detached and its translations invalidated). Pages handed to an
/// [`IotlbGather`] are the gather's to free.
///
/// Mapped physical addresses need not lie in the memory (a device may be
/// given MMIO); they must be below 2^52.
pub struct VtdPageTable {
    mem: Arc<PhysMemory>,
    root: PhysAddr,
    flush: Option<FlushMethod>,
    totals: Totals,
}

impl fmt::Debug for VtdPageTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VtdPageTable")
            .field("root", &format_args!("{:#x}", self.root))
            .field("levels", &VTD_LEVELS)
            .field("flush", &self.flush)
            .field("totals", &self.totals)
            .finish()
    }
}

/// Why an internal walk stopped.
#[derive(Debug)]
enum Stop {
    /// The condition the walk checks failed at this IOVA.
    At(u64),
    /// An entry changed under the call at this IOVA.
    Raced(u64),
    /// Physical memory refused.
    Mem(MemError),
}

impl From<MemError> for Stop {
    fn from(e: MemError) -> Self {
        Stop::Mem(e)
    }
}

impl Stop {
    fn into_error(self, at: impl FnOnce(u64) -> PgtableError) -> PgtableError {
        match self {
            Stop::At(a) => at(a),
            Stop::Raced(a) => PgtableError::Raced { at: a },
            Stop::Mem(e) => PgtableError::Mem(e),
        }
    }
}

/// The state of one call: its flusher and its counts.
struct Op {
    fl: LineFlusher,
    st: OpStats,
}

/// Table pages one call allocated: `spare` are zeroed and unused, `fresh`
/// are being written and not yet linked. Both are freed on drop (neither was
/// ever visible to a walker); pages, once linked, are forgotten here.
struct Frames<'a> {
    mem: &'a PhysMemory,
    spare: Vec<PhysAddr>,
    fresh: Vec<PhysAddr>,
}

impl<'a> Frames<'a> {
    /// Allocates `n` zeroed pages, or none.
    fn alloc(mem: &'a PhysMemory, n: u64) -> Result<Self, MemError> {
        let mut f = Frames {
            mem,
            spare: Vec::new(),
            fresh: Vec::new(),
        };
        for _ in 0..n {
            // On failure `f` is dropped and frees what it took.
            f.spare.push(mem.alloc_zeroed_owned(0, FrameOwner::Iommu)?);
        }
        Ok(f)
    }

    /// Takes a zeroed page to write.
    fn take(&mut self) -> Option<PhysAddr> {
        let p = self.spare.pop()?;
        self.fresh.push(p);
        Some(p)
    }

    /// Zeroes an unlinked page and returns it to the spares.
    fn recycle(&mut self, page: PhysAddr) -> Result<(), MemError> {
        self.mem.fill(page, PAGE_SIZE, 0)?;
        self.spare.push(page);
        Ok(())
    }
}

impl Drop for Frames<'_> {
    fn drop(&mut self) {
        for &p in self.spare.iter().chain(&self.fresh) {
            // Cannot fail: each page was allocated here and never linked.
            let _ = self.mem.free_owned(p, 0, FrameOwner::Iommu);
        }
    }
}

/// A new subtree waiting to be linked into a published table.
struct Link {
    /// The parent entry to store it in.
    slot: PhysAddr,
    /// The subtree's top table.
    child: PhysAddr,
    /// The parent's level.
    level: u32,
    /// The IOVA range it maps, and the physical address of its start.
    start: u64,
    end: u64,
    phys: PhysAddr,
    /// Its pages, as indices into `Frames::fresh`.
    pages: Range<usize>,
}

impl VtdPageTable {
    /// A new, empty table in `mem` (one zeroed root page). Fails if `mem`
    /// has no frame left or the CPU lacks `config.flush` for a walker that
    /// is not coherent.
    pub fn new(mem: Arc<PhysMemory>, config: VtdConfig) -> Result<Self, PgtableError> {
        let flush = if config.coherent {
            None
        } else if config.flush.is_supported() {
            Some(config.flush)
        } else {
            return Err(PgtableError::FlushUnsupported {
                method: config.flush,
            });
        };
        let root = mem.alloc_zeroed_owned(0, FrameOwner::Iommu)?;
        let table = Self {
            mem,
            root,
            flush,
            totals: Totals::default(),
        };
        // The root's zeroes must reach memory before a walker is given it.
        let mut op = table.op();
        op.fl.record_range(root, PAGE_SIZE);
        table.finish(op);
        Ok(table)
    }

    /// The physical memory the table lives in.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.mem
    }

    /// The flush method in use, `None` for a coherent walker.
    pub fn flush_method(&self) -> Option<FlushMethod> {
        self.flush
    }

    fn op(&self) -> Op {
        Op {
            fl: LineFlusher::new_checked(self.flush),
            st: OpStats::default(),
        }
    }

    /// Flushes the call's last batch and adds its counts to the totals.
    #[inline]
    fn finish(&self, mut op: Op) -> OpStats {
        if op.fl.is_active() {
            op.fl.flush(&self.mem);
            op.st.lines_written = op.fl.lines_written();
            op.st.lines_flushed = op.fl.lines_flushed();
            op.st.flush_batches = op.fl.batches();
        }
        let st = op.st;
        // The usual call (coherent walker, no table built or freed) has no
        // total to add to: one test instead of six.
        if st.tables_allocated
            | st.tables_freed
            | st.splits
            | st.lines_written
            | st.lines_flushed
            | st.flush_batches
            == 0
        {
            return st;
        }
        let t = &self.totals;
        for (counter, n) in [
            (&t.tables_allocated, st.tables_allocated),
            (&t.tables_freed, st.tables_freed),
            (&t.splits, st.splits),
            (&t.lines_written, st.lines_written),
            (&t.lines_flushed, st.lines_flushed),
            (&t.flush_batches, st.flush_batches),
        ] {
            if n != 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
        st
    }

    /// Checks an IOVA range; returns its end.
    fn check_range(iova: u64, len: u64) -> Result<u64, PgtableError> {
        if len == 0 {
            return Err(PgtableError::ZeroLength { iova });
        }
        if !iova.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
            return Err(PgtableError::Unaligned {
                iova,
                len,
                align: PAGE_SIZE,
            });
        }
        match iova.checked_add(len) {
            Some(end) if end <= 1 << VTD_IOVA_BITS => Ok(end),
            _ => Err(PgtableError::AddressTooWide {
                iova,
                len,
                width: VTD_IOVA_BITS,
            }),
        }
    }

    // ----- map -----

    /// Checks that `[start, end)` is unmapped under `table` (`None`: a table
    /// still to be made) and counts the tables the map will add; stops as
    /// soon as the count exceeds the arena's frames.
    fn plan_map(
        &self,
        table: Option<PhysAddr>,
        level: u32,
        start: u64,
        end: u64,
        phys: PhysAddr,
        need: &mut u64,
    ) -> Result<(), Stop> {
        if table.is_none() && level == 1 {
            return Ok(()); // a new last-level table needs no more tables
        }
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            let p = phys + (cur - start);
            let raw = match table {
                // Acquire: see the contents of a table another call linked.
                Some(t) => self.mem.load_u64(slot(t, level, cur), Ordering::Acquire)?,
                None => 0,
            };
            match decode_entry(raw, level) {
                SlEntry::NotPresent if fits_leaf(level, cur, p, next - cur) => {}
                SlEntry::NotPresent => {
                    *need += 1;
                    if *need > self.mem.size() / PAGE_SIZE {
                        return Err(Stop::Mem(MemError::OutOfFrames { order: 0 }));
                    }
                    self.plan_map(None, level - 1, cur, next, p, need)?;
                }
                SlEntry::Table { addr, .. } => {
                    self.plan_map(Some(addr), level - 1, cur, next, p, need)?;
                }
                SlEntry::Leaf { .. } | SlEntry::Reserved { .. } => return Err(Stop::At(cur)),
            }
            cur = next;
        }
        Ok(())
    }

    /// Maps `[start, end)` → `phys` under the linked `table`: leaves are
    /// stored at once; missing tables are built in fresh pages and queued in
    /// `links`.
    #[allow(clippy::too_many_arguments)]
    fn build_linked(
        &self,
        op: &mut Op,
        frames: &mut Frames<'_>,
        links: &mut Vec<Link>,
        table: PhysAddr,
        level: u32,
        start: u64,
        end: u64,
        phys: PhysAddr,
        perm: Perm,
    ) -> Result<(), Stop> {
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            let p = phys + (cur - start);
            let at = slot(table, level, cur);
            // Acquire: as in `plan_map`.
            let raw = self.mem.load_u64(at, Ordering::Acquire)?;
            match decode_entry(raw, level) {
                SlEntry::NotPresent if fits_leaf(level, cur, p, next - cur) => {
                    self.store_leaf(op, at, leaf_entry(p, level, perm))?;
                }
                SlEntry::NotPresent => {
                    let first = frames.fresh.len();
                    let child = frames.take().ok_or(Stop::Raced(cur))?;
                    self.build_fresh(op, frames, child, level - 1, cur, next, p, perm)?;
                    links.push(Link {
                        slot: at,
                        child,
                        level,
                        start: cur,
                        end: next,
                        phys: p,
                        pages: first..frames.fresh.len(),
                    });
                }
                SlEntry::Table { addr, .. } => {
                    self.build_linked(op, frames, links, addr, level - 1, cur, next, p, perm)?;
                }
                // `plan_map` found the range free: a concurrent call mapped it.
                SlEntry::Leaf { .. } | SlEntry::Reserved { .. } => return Err(Stop::Raced(cur)),
            }
            cur = next;
        }
        Ok(())
    }

    /// Maps `[start, end)` → `phys` in the fresh (unlinked) page `table`.
    #[allow(clippy::too_many_arguments)]
    fn build_fresh(
        &self,
        op: &mut Op,
        frames: &mut Frames<'_>,
        table: PhysAddr,
        level: u32,
        start: u64,
        end: u64,
        phys: PhysAddr,
        perm: Perm,
    ) -> Result<(), Stop> {
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            let p = phys + (cur - start);
            let at = slot(table, level, cur);
            let entry = if fits_leaf(level, cur, p, next - cur) {
                leaf_entry(p, level, perm)
            } else {
                let child = frames.take().ok_or(Stop::Raced(cur))?;
                self.build_fresh(op, frames, child, level - 1, cur, next, p, perm)?;
                table_entry(child)
            };
            // Relaxed: no walker can see this page until it is linked with
            // a Release store (`publish`), which orders this store before it.
            self.mem.store_u64(at, entry, Ordering::Relaxed)?;
            op.st.entries_written += 1;
            cur = next;
        }
        Ok(())
    }

    /// Links the queued subtrees: flushes their pages (one batch), then
    /// stores each parent entry. A subtree whose entry another call filled
    /// meanwhile is rebuilt into that call's table, and its pages recycled.
    fn publish(
        &self,
        op: &mut Op,
        frames: &mut Frames<'_>,
        mut links: Vec<Link>,
        perm: Perm,
    ) -> Result<(), Stop> {
        while !links.is_empty() {
            // A walker must find the new pages in memory before it can find
            // a pointer to them: flush them whole, fence, then link.
            for &page in &frames.fresh {
                op.fl.record_range(page, PAGE_SIZE);
            }
            op.fl.flush(&self.mem);
            let mut lost = Vec::new();
            for link in links.drain(..) {
                // Release: pairs with the walker's Acquire load of this
                // entry, so it sees the subtree as written above. On failure
                // (Acquire) we see the winner's table.
                match self.mem.compare_exchange_u64(
                    link.slot,
                    0,
                    table_entry(link.child),
                    Ordering::Release,
                )? {
                    Ok(_) => {
                        op.fl.record(link.slot);
                        op.st.entries_written += 1;
                        op.st.tables_allocated += link.pages.len() as u64;
                    }
                    Err(actual) => lost.push((link, actual)),
                }
            }
            let fresh = std::mem::take(&mut frames.fresh);
            for (link, _) in &lost {
                for &page in &fresh[link.pages.clone()] {
                    frames.recycle(page)?;
                }
            }
            for (link, actual) in lost {
                match decode_entry(actual, link.level) {
                    SlEntry::Table { addr, .. } => self.build_linked(
                        op,
                        frames,
                        &mut links,
                        addr,
                        link.level - 1,
                        link.start,
                        link.end,
                        link.phys,
                        perm,
                    )?,
                    _ => return Err(Stop::Raced(link.start)),
                }
            }
        }
        Ok(())
    }

    fn map_inner(
        &self,
        op: &mut Op,
        iova: u64,
        end: u64,
        phys: PhysAddr,
        perm: Perm,
    ) -> Result<(), PgtableError> {
        let len = end - iova;
        let mut need = 0;
        self.plan_map(Some(self.root), VTD_LEVELS, iova, end, phys, &mut need)
            .map_err(|s| s.into_error(|at| PgtableError::AlreadyMapped { iova, len, at }))?;
        if need > 0 {
            // Fail fast rather than zero and free a whole arena of pages.
            let f = self.mem.frame_stats();
            if need > f.total_frames - f.allocated_frames {
                return Err(MemError::OutOfFrames { order: 0 }.into());
            }
        }
        let mut frames = Frames::alloc(&self.mem, need)?;
        let mut links = Vec::new();
        let raced = |s: Stop| s.into_error(|at| PgtableError::Raced { at });
        self.build_linked(
            op,
            &mut frames,
            &mut links,
            self.root,
            VTD_LEVELS,
            iova,
            end,
            phys,
            perm,
        )
        .map_err(raced)?;
        self.publish(op, &mut frames, links, perm).map_err(raced)
    }

    // ----- unmap -----

    /// Checks that all of `[start, end)` under `table` is mapped.
    fn check_mapped(&self, table: PhysAddr, level: u32, start: u64, end: u64) -> Result<(), Stop> {
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            // Acquire: as in `plan_map`.
            let raw = self
                .mem
                .load_u64(slot(table, level, cur), Ordering::Acquire)?;
            match decode_entry(raw, level) {
                SlEntry::NotPresent | SlEntry::Reserved { .. } => return Err(Stop::At(cur)),
                SlEntry::Leaf { .. } => {}
                SlEntry::Table { addr, .. } => self.check_mapped(addr, level - 1, cur, next)?,
            }
            cur = next;
        }
        Ok(())
    }

    /// If the leaf holding `addr` reaches outside `[start, end)`, replaces it
    /// by a table of smaller leaves with the same translation and rights,
    /// down to a leaf inside the range (or 4 KiB).
    fn split_at(&self, op: &mut Op, addr: u64, start: u64, end: u64) -> Result<(), Stop> {
        let mut table = self.root;
        let mut level = VTD_LEVELS;
        let (at, raw, leaf_phys, perm) = loop {
            let at = slot(table, level, addr);
            let raw = self.mem.load_u64(at, Ordering::Acquire)?;
            match decode_entry(raw, level) {
                SlEntry::Table { addr: t, .. } if level > 1 => {
                    table = t;
                    level -= 1;
                }
                SlEntry::Leaf { addr: p, perm, .. }
                    if level > 1 && !entry_inside(addr, level, start, end) =>
                {
                    break (at, raw, p, perm);
                }
                _ => return Ok(()),
            }
        };
        // How many levels down the split must go.
        let mut depth = 1;
        while level - depth > 1 && !entry_inside(addr, level - depth, start, end) {
            depth += 1;
        }
        let mut frames = Frames::alloc(&self.mem, u64::from(depth))?;
        let top = frames.take().ok_or(Stop::Raced(addr))?;
        let (mut page, mut l) = (top, level - 1);
        let mut base = addr & !((1u64 << level_shift(level)) - 1);
        let mut base_phys = leaf_phys;
        loop {
            let span = 1u64 << level_shift(l);
            for i in 0..ENTRIES {
                let e = leaf_entry(base_phys + i * span, l, perm);
                // Relaxed: the page is linked below with a Release store.
                self.mem
                    .store_u64(page + i * ENTRY_BYTES, e, Ordering::Relaxed)?;
            }
            op.st.entries_written += ENTRIES;
            if l == 1 || entry_inside(addr, l, start, end) {
                break;
            }
            // The smaller leaf holding `addr` still reaches out: split it too.
            let child = frames.take().ok_or(Stop::Raced(addr))?;
            let child_base = addr & !(span - 1);
            base_phys += child_base - base;
            base = child_base;
            self.mem
                .store_u64(slot(page, l, addr), table_entry(child), Ordering::Relaxed)?;
            op.st.entries_written += 1;
            page = child;
            l -= 1;
        }
        for &p in &frames.fresh {
            op.fl.record_range(p, PAGE_SIZE);
        }
        op.fl.flush(&self.mem);
        // Release: the walker sees the new tables whole. The compare-exchange
        // (against the leaf we read) only detects a broken contract.
        match self
            .mem
            .compare_exchange_u64(at, raw, table_entry(top), Ordering::Release)?
        {
            Ok(_) => {
                op.fl.record(at);
                op.st.entries_written += 1;
                op.st.tables_allocated += u64::from(depth);
                op.st.splits += u64::from(depth);
                frames.fresh.clear(); // linked now: no longer ours to free
                Ok(())
            }
            Err(_) => Err(Stop::Raced(addr)),
        }
    }

    /// Clears `[start, end)` under `table`: every leaf met lies wholly inside
    /// (after `split_at`). An entry whose whole span is inside is cleared
    /// without visiting below it, and the tables below go to `gather`.
    fn clear(
        &self,
        op: &mut Op,
        gather: &mut IotlbGather,
        table: PhysAddr,
        level: u32,
        start: u64,
        end: u64,
    ) -> Result<(), Stop> {
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            let at = slot(table, level, cur);
            let whole = next - cur == 1 << level_shift(level);
            let raw = self.mem.load_u64(at, Ordering::Acquire)?;
            match decode_entry(raw, level) {
                SlEntry::Leaf { .. } if whole => self.clear_entry(op, at)?,
                SlEntry::Table { addr, .. } if whole => {
                    self.clear_entry(op, at)?;
                    self.gather_tables(op, gather, addr, level - 1)?;
                }
                SlEntry::Table { addr, .. } => {
                    self.clear(op, gather, addr, level - 1, cur, next)?
                }
                // `check_mapped` and `split_at` ruled these out.
                _ => return Err(Stop::Raced(cur)),
            }
            cur = next;
        }
        Ok(())
    }

    /// Stores leaf `entry` at `at` of a linked table, recording the write.
    fn store_leaf(&self, op: &mut Op, at: PhysAddr, entry: u64) -> Result<(), Stop> {
        // Release: a walker that reads the leaf (Acquire) also sees what the
        // caller wrote before mapping.
        self.mem.store_u64(at, entry, Ordering::Release)?;
        op.fl.record(at);
        op.st.entries_written += 1;
        Ok(())
    }

    /// Clears the entry at `at` of a linked table, recording the write.
    fn clear_entry(&self, op: &mut Op, at: PhysAddr) -> Result<(), Stop> {
        // Relaxed: clearing publishes nothing. The caller's invalidation
        // request, issued after this call returns, is a Release store that
        // orders this one before it.
        self.mem.store_u64(at, 0, Ordering::Relaxed)?;
        op.fl.record(at);
        op.st.entries_written += 1;
        Ok(())
    }

    /// Hands the unlinked table at `table` (level `level`) and every table
    /// below it to `gather`. Their entries are left as they are: no walker
    /// can reach them once the invalidation completes, and until then one
    /// that already could reads what they held.
    fn gather_tables(
        &self,
        op: &mut Op,
        gather: &mut IotlbGather,
        table: PhysAddr,
        level: u32,
    ) -> Result<(), Stop> {
        if level > 1 {
            for i in 0..ENTRIES {
                let raw = self
                    .mem
                    .load_u64(table + i * ENTRY_BYTES, Ordering::Acquire)?;
                if let SlEntry::Table { addr, .. } = decode_entry(raw, level) {
                    self.gather_tables(op, gather, addr, level - 1)?;
                }
            }
        }
        gather.add_freed_table(&self.mem, table);
        op.st.tables_freed += 1;
        Ok(())
    }

    fn unmap_inner(
        &self,
        op: &mut Op,
        gather: &mut IotlbGather,
        iova: u64,
        end: u64,
    ) -> Result<(), PgtableError> {
        let len = end - iova;
        gather.check_memory(&self.mem)?;
        self.check_mapped(self.root, VTD_LEVELS, iova, end)
            .map_err(|s| s.into_error(|at| PgtableError::NotMapped { iova, len, at }))?;
        let raced = |s: Stop| s.into_error(|at| PgtableError::Raced { at });
        self.split_at(op, iova, iova, end).map_err(raced)?;
        if end - PAGE_SIZE != iova {
            self.split_at(op, end - PAGE_SIZE, iova, end)
                .map_err(raced)?;
        }
        self.clear(op, gather, self.root, VTD_LEVELS, iova, end)
            .map_err(raced)?;
        gather.add_range(iova, len);
        Ok(())
    }

    // ----- the one-walk path -----

    /// The last-level table holding `[iova, end)`, when the range lies in
    /// one 2 MiB region whose tables all exist and no large leaf covers it:
    /// the usual shape of a DMA map or unmap (a few 4 KiB pages). Such a call
    /// allocates, splits and frees no table, so it needs one walk, not the
    /// general path's planning and checking passes. `None` sends the call
    /// to the general path, which also reports every error.
    fn leaf_table(&self, iova: u64, end: u64) -> Option<PhysAddr> {
        if iova >> level_shift(2) != (end - 1) >> level_shift(2)
            || end - iova == 1 << level_shift(2)
        {
            return None;
        }
        let mut table = self.root;
        for level in (2..=VTD_LEVELS).rev() {
            // Acquire: pairs with the Release link of a new table.
            let raw = self
                .mem
                .load_u64(slot(table, level, iova), Ordering::Acquire)
                .ok()?;
            match decode_entry(raw, level) {
                SlEntry::Table { addr, .. } => table = addr,
                _ => return None,
            }
        }
        Some(table)
    }

    /// Whether every entry of `[iova, end)` in last-level `table` is empty.
    fn leaves_empty(&self, table: PhysAddr, iova: u64, end: u64) -> bool {
        let mut cur = iova;
        while cur < end {
            match self.mem.load_u64(slot(table, 1, cur), Ordering::Relaxed) {
                Ok(0) => cur += PAGE_SIZE,
                _ => return false,
            }
        }
        true
    }

    /// Writes 4 KiB leaves for `[iova, end)` into last-level `table`;
    /// `false` (nothing written) if the table is outside the memory.
    fn write_leaves(
        &self,
        op: &mut Op,
        table: PhysAddr,
        iova: u64,
        end: u64,
        phys: PhysAddr,
        perm: Perm,
    ) -> bool {
        let (mut cur, mut p) = (iova, phys);
        while cur < end {
            if self
                .store_leaf(op, slot(table, 1, cur), leaf_entry(p, 1, perm))
                .is_err()
            {
                return false;
            }
            cur += PAGE_SIZE;
            p += PAGE_SIZE;
        }
        true
    }

    /// Checks a map request; returns the range's end.
    fn check_map(iova: u64, phys: PhysAddr, len: u64, perm: Perm) -> Result<u64, PgtableError> {
        let end = Self::check_range(iova, len)?;
        if !phys.is_multiple_of(PAGE_SIZE) {
            return Err(PgtableError::UnalignedPhys {
                phys,
                align: PAGE_SIZE,
            });
        }
        if !matches!(phys.checked_add(len), Some(e) if e <= 1 << VTD_ADDR_BITS) {
            return Err(PgtableError::PhysTooWide {
                phys,
                len,
                width: VTD_ADDR_BITS,
            });
        }
        if perm.is_empty() {
            return Err(PgtableError::NoPermission { iova, len });
        }
        Ok(end)
    }

    /// [`IoPageTable::map`] for a range its caller owns and knows to be
    /// unmapped: an IOVA block the domain's allocator just handed out (an
    /// allocator returns a block only after the unmap that cleared it). On
    /// the one-walk path the entries are written without being read first.
    /// That read is what `map` uses to refuse an overlap, and it misses in
    /// the cache whenever a device walked the line since the CPU last wrote
    /// it: measured in `lab netperf-udp` (deferred, 32 B), skipping it took
    /// the CPU's cost from 0.46 to 0.36 µs per packet. Debug builds still
    /// read and refuse. Crate-internal: the precondition is `dma`'s to keep.
    pub(crate) fn map_fresh(
        &self,
        iova: u64,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
    ) -> Result<OpStats, PgtableError> {
        self.map_reading(iova, phys, len, perm, cfg!(debug_assertions))
    }

    /// A map whose one-walk path reads the entries first (and refuses an
    /// overlap) if `read_first`; the general path always checks.
    fn map_reading(
        &self,
        iova: u64,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
        read_first: bool,
    ) -> Result<OpStats, PgtableError> {
        let end = Self::check_map(iova, phys, len, perm)?;
        let mut op = self.op();
        if let Some(t) = self.leaf_table(iova, end) {
            if (!read_first || self.leaves_empty(t, iova, end))
                && self.write_leaves(&mut op, t, iova, end, phys, perm)
            {
                return Ok(self.finish(op));
            }
        }
        let result = self.map_inner(&mut op, iova, end, phys, perm);
        // Flush whatever was written, even on a (contract-breaking) error.
        let st = self.finish(op);
        result.map(|()| st)
    }

    /// Unmaps `[iova, end)` from last-level `table` if every entry is a
    /// 4 KiB leaf; `false` (nothing written) otherwise.
    fn unmap_fast(
        &self,
        op: &mut Op,
        gather: &mut IotlbGather,
        table: PhysAddr,
        iova: u64,
        end: u64,
    ) -> bool {
        let mut cur = iova;
        while cur < end {
            match self.mem.load_u64(slot(table, 1, cur), Ordering::Acquire) {
                Ok(raw) if matches!(decode_entry(raw, 1), SlEntry::Leaf { .. }) => cur += PAGE_SIZE,
                _ => return false,
            }
        }
        let mut cur = iova;
        while cur < end {
            if self.clear_entry(op, slot(table, 1, cur)).is_err() {
                return false;
            }
            cur += PAGE_SIZE;
        }
        gather.add_range(iova, end - iova);
        true
    }

    /// Frees `table` (at `level`) and every table below it.
    fn free_tables(&self, table: PhysAddr, level: u32) {
        if level > 1 {
            for i in 0..ENTRIES {
                let Ok(raw) = self
                    .mem
                    .load_u64(table + i * ENTRY_BYTES, Ordering::Acquire)
                else {
                    continue;
                };
                if let SlEntry::Table { addr, .. } = decode_entry(raw, level) {
                    self.free_tables(addr, level - 1);
                }
            }
        }
        // Cannot fail for a page this table allocated; nothing to do if it did.
        let _ = self.mem.free_owned(table, 0, FrameOwner::Iommu);
    }
}

impl IoPageTable for VtdPageTable {
    fn name(&self) -> &'static str {
        "vtd-sl4"
    }

    fn root(&self) -> PhysAddr {
        self.root
    }

    fn levels(&self) -> u32 {
        VTD_LEVELS
    }

    fn iova_bits(&self) -> u32 {
        VTD_IOVA_BITS
    }

    fn page_sizes(&self) -> &'static [PageSize] {
        &PageSize::ALL
    }

    fn is_coherent(&self) -> bool {
        self.flush.is_none()
    }

    fn map(
        &self,
        iova: u64,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
    ) -> Result<OpStats, PgtableError> {
        self.map_reading(iova, phys, len, perm, true)
    }

    fn unmap(
        &self,
        iova: u64,
        len: u64,
        gather: &mut IotlbGather,
    ) -> Result<OpStats, PgtableError> {
        let end = Self::check_range(iova, len)?;
        let mut op = self.op();
        if let Some(t) = self.leaf_table(iova, end) {
            if gather.check_memory(&self.mem).is_ok()
                && self.unmap_fast(&mut op, gather, t, iova, end)
            {
                return Ok(self.finish(op));
            }
        }
        let result = self.unmap_inner(&mut op, gather, iova, end);
        // A failed unmap may have split leaves (same translation): those
        // writes are flushed too.
        let st = self.finish(op);
        result.map(|()| st)
    }

    fn iova_to_phys(&self, iova: u64) -> Result<Option<Translation>, PgtableError> {
        walk(&self.mem, self.root, iova)
    }

    fn stats(&self) -> TableStats {
        let t = &self.totals;
        let tables_allocated = t.tables_allocated.load(Ordering::Relaxed);
        let tables_freed = t.tables_freed.load(Ordering::Relaxed);
        TableStats {
            table_pages: (1 + tables_allocated).saturating_sub(tables_freed),
            tables_allocated,
            tables_freed,
            splits: t.splits.load(Ordering::Relaxed),
            lines_written: t.lines_written.load(Ordering::Relaxed),
            lines_flushed: t.lines_flushed.load(Ordering::Relaxed),
            flush_batches: t.flush_batches.load(Ordering::Relaxed),
        }
    }
}

impl Drop for VtdPageTable {
    fn drop(&mut self) {
        self.free_tables(self.root, VTD_LEVELS);
    }
}
