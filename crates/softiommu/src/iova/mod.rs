//! IOVA allocation: handing out I/O virtual address ranges to DMA mappings.
//!
//! An [`IovaDomain`] owns the IOVA space of one DMA domain in page frames,
//! `[start_pfn, end_pfn]`. Blocks are powers of two in size and aligned to
//! their size (as DMA APIs expect), allocated top-down below a per-call
//! limit (the device's DMA mask). Reserved ranges, such as the x86 MSI
//! window, are never handed out.
//!
//! The design follows Linux's `iova.c` in shape — a slow exact allocator
//! behind a fast cache — and departs from it where seed `004` shows it fails:
//!
//! - **The tree.** Ours holds *free extents* and is augmented with the
//!   largest aligned block each subtree can hold, so a search is O(log n)
//!   whatever the holes, and frees coalesce neighbours. Linux's holds
//!   *allocated* ranges and is walked linearly from a cached node.
//! - **The caches.** Each thread that allocates owns an [`IovaCpuCache`]: two
//!   magazines per size class, touched with no lock. A free of a block
//!   the same cache handed out is a load and a store inside an asymmetric
//!   fence pair (the cache's owner slot, `owner.rs`); any other free
//!   claims the block's state word with one compare-exchange, so that of
//!   two threads freeing one block exactly one may. "Per CPU" in user
//!   space is per thread: a thread is the unit that runs without
//!   preemption by its peers on the cache's data, so a thread-owned cache
//!   needs no lock, where a cache per core would need one (threads
//!   migrate). Full magazines go to a per-class depot behind a
//!   lock, which is bounded, and whose idle magazines go back to the tree.
//! - **Baselines.** [`IovaPolicy`] selects ours or the Linux designs of 2016,
//!   2020 and 2023, written from their descriptions, for side-by-side runs.
//!
//! Errors are typed ([`IovaError`]); a failed call changes nothing.
//!
//! A thread's cache is flushed by that thread: when another thread asks for
//! all caches to be flushed (a full depot under `linux-2020`, an exhausted
//! space, [`IovaDomain::flush_caches`]), each cache gives its IOVAs back at
//! its owner's next free, its next call that leaves the fast path (a miss,
//! a full magazine, a batch), or when it is dropped. An allocation its
//! loaded magazine serves does not look: the block it hands out serves the
//! space as well as one given back would, and a cache that only allocates
//! empties that magazine and then misses. (A free sees the flush through
//! its owner slot's ring, a word it reads anyway; see `owner.rs`.) An idle
//! thread's cache keeps at most two magazines per size class.

mod class;
mod cpu_cache;
mod depot;
mod domain;
mod gap_tree;
mod linear_tree;
mod live_map;
mod magazine;
mod owner;
mod policy;

pub use cpu_cache::IovaCpuCache;
pub(crate) use cpu_cache::RetireRefused;
pub use domain::{BlockKind, BlockState, IovaBlock, IovaDomain, IovaStats};
pub use policy::{
    CacheParams, DepotRule, IovaPolicy, LinearSearch, WhenFull, MAX_CACHED_ORDER, MAX_DEPOT,
    MAX_MAGAZINE_SIZE,
};

use crate::mem::MemError;

/// The x86 MSI address window `0xFEE0_0000..=0xFEEF_FFFF` in 4 KiB frames,
/// which DMA must never be given (Intel VT-d spec, "Interrupt Remapping").
pub const MSI_WINDOW_PFNS: (u64, u64) = (0xFEE00, 0xFEEFF);

/// Errors of IOVA allocation and freeing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IovaError {
    /// A size of zero pages.
    #[error("zero-sized IOVA request")]
    ZeroSize,
    /// The size is larger than the whole domain.
    #[error("{pages} pages is larger than the domain's {domain_pages}")]
    TooLarge {
        /// Pages asked for.
        pages: u64,
        /// Pages in the domain.
        domain_pages: u64,
    },
    /// The limit (DMA mask) lies below the domain's first frame.
    #[error("limit pfn {limit:#x} lies below the domain start {start:#x}")]
    LimitBelowStart {
        /// The limit given.
        limit: u64,
        /// The domain's first frame.
        start: u64,
    },
    /// No aligned free block of that size is left below the limit.
    #[error("no free IOVA block of {pages} pages at or below pfn {limit:#x}")]
    NoSpace {
        /// Pages asked for (rounded up to a power of two).
        pages: u64,
        /// The limit.
        limit: u64,
    },
    /// The pfn is not the start of an allocated block: never allocated, or
    /// freed already.
    #[error("pfn {pfn:#x} is not an allocated IOVA block")]
    NotAllocated {
        /// The pfn freed.
        pfn: u64,
    },
    /// A block freed as retired (after a deferred flush) was never retired:
    /// it is still held by its user.
    #[error("pfn {pfn:#x} is live, not retired: its user still holds it")]
    NotRetired {
        /// The block's first page frame.
        pfn: u64,
    },
    /// The block exists but with another size.
    #[error("pfn {pfn:#x} was allocated with {allocated_pages} pages, freed with {pages}")]
    WrongSize {
        /// The pfn freed.
        pfn: u64,
        /// Pages given to the free, rounded up to a power of two: 0 for a
        /// count past 2^63, whose rounding (2^64) no `u64` holds.
        pages: u64,
        /// Pages it was allocated with.
        allocated_pages: u64,
    },
    /// A pfn or range outside `[start_pfn, end_pfn]`.
    #[error("pfn range {lo:#x}..={hi:#x} lies outside the domain")]
    OutsideDomain {
        /// First frame.
        lo: u64,
        /// Last frame.
        hi: u64,
    },
    /// A reserved range overlaps another reservation or allocated IOVAs.
    #[error("reserved range {lo:#x}..={hi:#x} overlaps a reservation or an allocation")]
    ReservedOverlap {
        /// First frame.
        lo: u64,
        /// Last frame.
        hi: u64,
    },
    /// A cache parameter is out of range (see [`CacheParams::check`]).
    #[error("cache parameter {field} = {value} is outside [{min}, {max}]")]
    InvalidParams {
        /// The parameter.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The smallest accepted.
        min: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A domain with `start_pfn > end_pfn`, a start of zero, or an inverted range.
    #[error("invalid pfn range {lo:#x}..={hi:#x}")]
    InvalidRange {
        /// First frame.
        lo: u64,
        /// Last frame.
        hi: u64,
    },
    /// The state map could not be reserved.
    #[error(transparent)]
    Memory(#[from] MemError),
}

/// The order (log2 of the page count, rounded up) of a request of `pages`.
///
/// Branch-free but for the zero check (a bit scan): a fast path for one
/// page (one compare) took 28 instructions off the deferred pair under
/// callgrind but made `bench iova`'s mixed sizes 20–40 % slower (the branch
/// mispredicts on a mix), so it was taken out.
#[inline]
pub(crate) fn order_of(pages: u64) -> Result<u32, IovaError> {
    if pages == 0 {
        return Err(IovaError::ZeroSize);
    }
    Ok(64 - (pages - 1).leading_zeros())
}

/// [`order_of`] without the zero check, for fast paths that serve only
/// cached orders: 0 pages (and any count past 2^63) maps to 64, an order
/// no cache serves, so such a request always reaches a slow path, which
/// takes its exact error from `order_of` (or `check_request`). Two
/// instructions a call fewer than `order_of` (`bench iova`'s pair calls it
/// twice).
#[inline(always)]
pub(crate) fn order_hint(pages: u64) -> u32 {
    64 - pages.wrapping_sub(1).leading_zeros()
}

#[cfg(test)]
mod domain_tests;
#[cfg(all(test, loom))]
mod loom_tests;
