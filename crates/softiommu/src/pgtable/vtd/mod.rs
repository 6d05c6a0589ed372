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

mod build;
mod collapse;
mod config;
mod fast;
mod format;
mod hinted;
mod unmap;

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::cache_flush::{FlushMethod, LineFlusher};
use super::gather::IotlbGather;
use super::{IoPageTable, OpStats, PageSize, Perm, PgtableError, TableStats, Translation};
use crate::mem::{FrameOwner, MemError, PhysAddr, PhysMemory, PAGE_SIZE};

use build::Frames;
pub use config::VtdConfig;
pub(crate) use format::*;
pub use format::{ECAP_C, VTD_ADDR_BITS, VTD_IOVA_BITS, VTD_LEVELS};
pub(crate) use hinted::LeafHint;

/// Totals over a table's life; updated once per call, and only for counts
/// that are not zero, so a coherent steady state touches none of them.
#[derive(Debug, Default)]
pub(super) struct Totals {
    tables_allocated: AtomicU64,
    tables_freed: AtomicU64,
    splits: AtomicU64,
    collapses: AtomicU64,
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
    /// Leaf tables unlinked, ever: a [`LeafHint`] taken under an older
    /// count may name a table that is gone.
    unlinks: std::sync::atomic::AtomicU64,
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
pub(super) enum Stop {
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
pub(super) struct Op {
    fl: LineFlusher,
    st: OpStats,
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
            unlinks: std::sync::atomic::AtomicU64::new(0),
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
            | st.collapses
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
            (&t.collapses, st.collapses),
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
            collapses: t.collapses.load(Ordering::Relaxed),
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
