//! IO page tables: the bytes an IOMMU walks to translate a device's IOVA.
//!
//! A page-table *format* ([`IoPageTable`]) knows how to lay out translation
//! entries in [`PhysMemory`](crate::mem::PhysMemory) so that the hardware
//! (here, the emulated walker in `hw`) reads them as its specification says.
//! The first format is Intel VT-d's second-level 4-level table
//! ([`VtdPageTable`]): 48-bit IOVAs, 4 KiB, 2 MiB and 1 GiB leaves.
//!
//! The model, after Linux's `io-pgtable`:
//!
//! - **A format knows nothing about invalidation.** [`IoPageTable::unmap`]
//!   clears entries and fills an [`IotlbGather`] with what changed: the IOVA
//!   range whose cached translations must be invalidated, and the table
//!   pages the unmap unlinked. The caller invalidates the IOTLB (now or
//!   later, strict or deferred) and only then calls
//!   [`IotlbGather::complete`], which frees those pages. A walker that read a
//!   pointer to an unlinked table before it was cleared can still walk it
//!   until then, and reads what it held.
//! - **Cache maintenance.** A walker is either coherent with the CPU caches
//!   or not (VT-d `ECAP.C`). For a walker that is not, every cache line of
//!   the table that an operation writes is flushed with real instructions
//!   (a line flusher), each line once per batch, one fence per batch; every
//!   call returns an [`OpStats`] that counts them.
//! - **Bad input is an error, never a panic**, and a failed call leaves the
//!   table as it was: a failed map installs nothing, a failed unmap clears
//!   nothing.
//!
//! Concurrency: all methods take `&self`; a table can be shared by several
//! updaters and walked concurrently by devices. Callers must not run map or
//! unmap calls concurrently on overlapping IOVA ranges (nor on ranges that
//! fall in one large page, as a partial unmap splits it); calls on disjoint
//! ranges may run at once. See [`VtdPageTable`] for the details.

mod cache_flush;
mod gather;
mod vtd;
#[cfg(test)]
mod vtd_tests;

pub use cache_flush::{FlushMethod, CACHE_LINE};
pub use gather::{leaked_table_pages, IotlbGather};
pub(crate) use vtd::{decode_entry, level_index, LeafHint, SlEntry};
pub use vtd::{VtdConfig, VtdPageTable, ECAP_C, VTD_ADDR_BITS, VTD_IOVA_BITS, VTD_LEVELS};

use std::fmt;
use std::ops::{AddAssign, BitAnd, BitOr};

use crate::mem::{MemError, PhysAddr};

/// Access permissions of a mapping, as seen by the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Perm(u8);

impl Perm {
    /// No access. Not a valid permission for a mapping.
    pub const NONE: Perm = Perm(0);
    /// The device may read (DMA to the device, "to device").
    pub const READ: Perm = Perm(1);
    /// The device may write (DMA from the device, "from device").
    pub const WRITE: Perm = Perm(2);
    /// The device may read and write.
    pub const RW: Perm = Perm(3);

    /// Whether reads are allowed.
    pub fn read(self) -> bool {
        self.0 & Self::READ.0 != 0
    }

    /// Whether writes are allowed.
    pub fn write(self) -> bool {
        self.0 & Self::WRITE.0 != 0
    }

    /// Whether no access at all is allowed.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The rights in the two low bits of `bits` (bit 0 read, bit 1
    /// write): a mask, where a `match` compiled to a jump table on the
    /// IOTLB's hit path.
    #[inline(always)]
    pub(crate) const fn from_low_bits(bits: u64) -> Perm {
        Perm((bits & 3) as u8)
    }

    /// The rights as [`from_low_bits`](Self::from_low_bits) reads them.
    #[inline(always)]
    pub(crate) const fn low_bits(self) -> u64 {
        self.0 as u64
    }

    /// Whether every access in `other` is allowed by `self`.
    pub fn contains(self, other: Perm) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Perm {
    type Output = Perm;
    fn bitor(self, rhs: Perm) -> Perm {
        Perm(self.0 | rhs.0)
    }
}

impl BitAnd for Perm {
    type Output = Perm;
    fn bitand(self, rhs: Perm) -> Perm {
        Perm(self.0 & rhs.0)
    }
}

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = if self.read() { 'r' } else { '-' };
        let w = if self.write() { 'w' } else { '-' };
        write!(f, "{r}{w}")
    }
}

/// The size of a leaf (a page the table maps with one entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    /// 4 KiB, a leaf of the last level.
    Size4K,
    /// 2 MiB, a leaf one level up.
    Size2M,
    /// 1 GiB, a leaf two levels up.
    Size1G,
}

impl PageSize {
    /// All sizes, smallest first.
    pub const ALL: [PageSize; 3] = [PageSize::Size4K, PageSize::Size2M, PageSize::Size1G];

    /// log2 of the size in bytes.
    pub fn shift(self) -> u32 {
        match self {
            PageSize::Size4K => 12,
            PageSize::Size2M => 21,
            PageSize::Size1G => 30,
        }
    }

    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        1 << self.shift()
    }
}

/// What an IOVA translates to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// The physical address the IOVA itself translates to (the leaf's base
    /// plus the IOVA's offset inside the leaf).
    pub phys: PhysAddr,
    /// The size of the leaf that maps it.
    pub size: PageSize,
    /// The effective permissions (those of every level along the walk).
    pub perm: Perm,
}

impl Translation {
    /// The physical address of the start of the leaf.
    pub fn leaf_phys(&self) -> PhysAddr {
        self.phys & !(self.size.bytes() - 1)
    }
}

/// What one map or unmap call did, for benchmarks and tests.
///
/// Returned by every successful call, so that a benchmark can compute, say,
/// `lines_flushed_per_op` without any shared counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpStats {
    /// Table entries stored (leaves, table pointers and clears, including
    /// those written into a new table before it was linked).
    pub entries_written: u64,
    /// Table pages allocated and linked into the table (including splits).
    pub tables_allocated: u64,
    /// Table pages unlinked and handed to the gather.
    pub tables_freed: u64,
    /// Large leaves split into a table of smaller ones.
    pub splits: u64,
    /// Last-level tables collapsed into one 2 MiB leaf
    /// ([`VtdPageTable::collapse_2m`]); each also counts in `tables_freed`.
    pub collapses: u64,
    /// Distinct cache lines of table memory written, summed over batches.
    /// Counted only when the walker is not coherent (zero otherwise).
    pub lines_written: u64,
    /// Cache lines flushed (zero when the walker is coherent).
    pub lines_flushed: u64,
    /// Flush batches, each ended by one fence (zero when coherent).
    pub flush_batches: u64,
}

impl AddAssign for OpStats {
    fn add_assign(&mut self, o: OpStats) {
        self.entries_written += o.entries_written;
        self.tables_allocated += o.tables_allocated;
        self.tables_freed += o.tables_freed;
        self.splits += o.splits;
        self.collapses += o.collapses;
        self.lines_written += o.lines_written;
        self.lines_flushed += o.lines_flushed;
        self.flush_batches += o.flush_batches;
    }
}

/// Totals over a table's life. Entry counts are not kept (they would cost a
/// shared counter update per call); sum the [`OpStats`] for those.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableStats {
    /// Table pages currently linked into the table, the root included.
    pub table_pages: u64,
    /// Table pages allocated and linked, over the table's life.
    pub tables_allocated: u64,
    /// Table pages unlinked by unmaps, over the table's life.
    pub tables_freed: u64,
    /// Large leaves split.
    pub splits: u64,
    /// Last-level tables collapsed into a 2 MiB leaf.
    pub collapses: u64,
    /// Cache lines written (non-coherent walkers only).
    pub lines_written: u64,
    /// Cache lines flushed.
    pub lines_flushed: u64,
    /// Flush batches (fences).
    pub flush_batches: u64,
}

/// Errors of page-table operations. A call that returns one changed nothing
/// (except [`PgtableError::Raced`], which reports a broken caller contract).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PgtableError {
    /// A range of length zero.
    #[error("zero-length range at IOVA {iova:#x}")]
    ZeroLength {
        /// The range's start.
        iova: u64,
    },
    /// The IOVA or the length is not a multiple of the smallest page.
    #[error("IOVA range {iova:#x}+{len:#x} is not aligned to {align:#x}")]
    Unaligned {
        /// The range's start.
        iova: u64,
        /// The range's length.
        len: u64,
        /// The alignment required.
        align: u64,
    },
    /// The physical address is not a multiple of the smallest page.
    #[error("physical address {phys:#x} is not aligned to {align:#x}")]
    UnalignedPhys {
        /// The physical address.
        phys: PhysAddr,
        /// The alignment required.
        align: u64,
    },
    /// The IOVA range reaches past the format's input width.
    #[error("IOVA range {iova:#x}+{len:#x} reaches past the {width}-bit IOVA width")]
    AddressTooWide {
        /// The range's start.
        iova: u64,
        /// The range's length.
        len: u64,
        /// The format's IOVA width in bits.
        width: u32,
    },
    /// The physical range reaches past what an entry can hold.
    #[error("physical range {phys:#x}+{len:#x} reaches past the {width}-bit address field")]
    PhysTooWide {
        /// The range's start.
        phys: PhysAddr,
        /// The range's length.
        len: u64,
        /// The width of the entries' address field in bits.
        width: u32,
    },
    /// A mapping must allow reading, writing or both.
    #[error("mapping {iova:#x}+{len:#x} with no access permission")]
    NoPermission {
        /// The range's start.
        iova: u64,
        /// The range's length.
        len: u64,
    },
    /// Part of the range is already mapped.
    #[error("IOVA range {iova:#x}+{len:#x} overlaps a mapping at {at:#x}")]
    AlreadyMapped {
        /// The range's start.
        iova: u64,
        /// The range's length.
        len: u64,
        /// The first mapped IOVA found in the range.
        at: u64,
    },
    /// Part of the range is not mapped.
    #[error("IOVA range {iova:#x}+{len:#x} is not mapped at {at:#x}")]
    NotMapped {
        /// The range's start.
        iova: u64,
        /// The range's length.
        len: u64,
        /// The first unmapped IOVA found in the range.
        at: u64,
    },
    /// The table changed under the call in a way the concurrency contract
    /// excludes (overlapping calls ran at once). The table is still a valid
    /// table, but the call may have been applied in part.
    #[error(
        "the table changed under this call at IOVA {at:#x}: overlapping calls ran concurrently"
    )]
    Raced {
        /// Where the unexpected entry was found.
        at: u64,
    },
    /// The gather holds table pages of a different physical memory.
    #[error("the gather holds table pages of another physical memory; complete it first")]
    GatherMismatch,
    /// The flush method asked for is not available on this CPU.
    #[error("cache flush method {method:?} is not supported by this CPU")]
    FlushUnsupported {
        /// The method asked for.
        method: FlushMethod,
    },
    /// Physical memory refused: no frame left for a table page, or a table
    /// page outside the arena.
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// An IO page-table format: the structure a walker reads, and the updates a
/// DMA layer makes to it.
///
/// Implementations write real entries in [`PhysMemory`](crate::mem::PhysMemory)
/// in the format's bit layout, so that a walker that knows only the
/// specification, the [`root`](Self::root) and the [`levels`](Self::levels)
/// can translate.
pub trait IoPageTable: Send + Sync + fmt::Debug {
    /// A short name of the format, e.g. `"vtd-sl4"`.
    fn name(&self) -> &'static str;

    /// The physical address of the top-level table.
    fn root(&self) -> PhysAddr;

    /// The number of levels a walk goes through.
    fn levels(&self) -> u32;

    /// The IOVA width in bits; IOVAs at or above `1 << iova_bits()` cannot
    /// be mapped.
    fn iova_bits(&self) -> u32;

    /// The leaf sizes the format supports, smallest first.
    fn page_sizes(&self) -> &'static [PageSize];

    /// Whether the walker is cache-coherent (no flushes needed).
    fn is_coherent(&self) -> bool;

    /// Maps `[iova, iova + len)` to `[phys, phys + len)` with `perm`, using
    /// the largest leaves alignment and length allow. All three must be
    /// multiples of 4 KiB and nothing in the range may be mapped. On error,
    /// nothing was mapped.
    fn map(&self, iova: u64, phys: PhysAddr, len: u64, perm: Perm)
        -> Result<OpStats, PgtableError>;

    /// Unmaps `[iova, iova + len)`, which must be wholly mapped (by any
    /// number of earlier maps; a large leaf only partly in the range is
    /// split). Adds the range and any unlinked table pages to `gather`. On
    /// error, nothing was unmapped.
    fn unmap(&self, iova: u64, len: u64, gather: &mut IotlbGather)
        -> Result<OpStats, PgtableError>;

    /// Translates `iova` by walking the table as the hardware would; `None`
    /// if it is not mapped.
    fn iova_to_phys(&self, iova: u64) -> Result<Option<Translation>, PgtableError>;

    /// Totals over the table's life.
    fn stats(&self) -> TableStats;
}
