//! The allocators `bench iova` runs side by side, behind one small trait.
//!
//! Peers are single-threaded data structures: on one thread each is used
//! directly; on several, one instance is shared behind a `Mutex`, as a
//! program would share one address space. Only `vm-allocator` takes an
//! alignment; `range-alloc` and `offset-allocator` are given the same sizes
//! without it (less work than ours, which aligns every block to its size).

use std::sync::{Arc, Mutex};

use softiommu::iova::{IovaCpuCache, IovaDomain, IovaPolicy};

/// One thread's view of an allocator under test. Every implementation's
/// `alloc` and `free` are `#[inline(always)]` into the bench's loop, so
/// that none pays a call frame the others do not.
pub trait PairAlloc: Send {
    /// What a free needs back.
    type Handle: Send;
    /// Allocates `pages` 4 KiB pages.
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle>;
    /// Frees an allocation.
    fn free(&mut self, h: Self::Handle);
}

/// IOVA space used by every implementation: 2^36 pages (a 48-bit IOVA width).
pub const SPACE_PAGES: u64 = 1 << 36;

/// Our allocator (any policy) through a per-thread cache.
#[derive(Debug)]
pub struct Iova {
    cache: IovaCpuCache,
    limit: u64,
}

impl Iova {
    /// One cache per thread over a fresh shared domain.
    pub fn per_thread(policy: IovaPolicy, threads: usize) -> Vec<Self> {
        let d = IovaDomain::new(1, SPACE_PAGES - 1, policy).expect("valid domain");
        (0..threads)
            .map(|_| Self {
                cache: d.cpu_cache(),
                limit: SPACE_PAGES - 1,
            })
            .collect()
    }
}

impl Iova {
    /// Allocates `pages` as `(pfn, pages)`, for the batch row.
    pub fn alloc_block(&mut self, pages: u64) -> Option<(u64, u64)> {
        Some((self.cache.alloc(pages, self.limit).ok()?, pages))
    }
    /// Frees every `(pfn, pages)` in one call.
    #[inline(always)]
    pub fn free_all(&mut self, blocks: &[(u64, u64)]) {
        self.cache.free_all(blocks).expect("freeing live IOVAs");
    }
    /// Allocates every `(_, pages)` in one call, writing the pfns.
    #[inline(always)]
    pub fn alloc_all(&mut self, blocks: &mut [(u64, u64)]) {
        self.cache
            .alloc_all(blocks, self.limit)
            .expect("room for the batch");
    }
}

impl PairAlloc for Iova {
    /// `pfn << 12 | pages`: pfns are below 2^52 and the mix's sizes below
    /// 2^12, so a handle packs into one non-zero word (as
    /// offset-allocator's does into 8 bytes) and a free gets back the
    /// pages it was allocated with, as a mapping keeps its length.
    type Handle = std::num::NonZeroU64;
    // Inlined into the bench's loop, as a driver's map path inlines the
    // cache's: a call here measured a call frame (register saves, the
    // result through memory), not the allocator.
    #[inline(always)]
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle> {
        debug_assert!(pages < 1 << 12);
        let pfn = self.cache.alloc(pages, self.limit).ok()?;
        std::num::NonZeroU64::new(pfn << 12 | pages)
    }
    #[inline(always)]
    fn free(&mut self, h: Self::Handle) {
        let (pfn, pages) = (h.get() >> 12, h.get() & 0xfff);
        self.cache.free(pfn, pages).expect("freeing a live IOVA");
    }
}

/// A single-threaded peer allocator.
pub trait Peer: Send + 'static {
    /// What a free needs back.
    type Handle: Send;
    /// A fresh instance over [`SPACE_PAGES`].
    fn create() -> Self;
    /// Allocates `pages` pages.
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle>;
    /// Frees an allocation.
    fn free(&mut self, h: Self::Handle);
}

/// rust-vmm's `vm-allocator` `AddressAllocator`, size-aligned, `LastMatch`.
#[derive(Debug)]
pub struct VmAllocator(vm_allocator::AddressAllocator);

impl Peer for VmAllocator {
    type Handle = vm_allocator::RangeInclusive;
    fn create() -> Self {
        Self(
            vm_allocator::AddressAllocator::new(4096, (SPACE_PAGES - 1) * 4096)
                .expect("valid range"),
        )
    }
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle> {
        let bytes = pages * 4096;
        self.0
            .allocate(bytes, bytes, vm_allocator::AllocPolicy::LastMatch)
            .ok()
    }
    fn free(&mut self, h: Self::Handle) {
        self.0.free(&h).expect("freeing a live range");
    }
}

/// The `range-alloc` crate (gfx-rs / wgpu), in pages.
#[derive(Debug)]
pub struct RangeAlloc(range_alloc::RangeAllocator<u64>);

impl Peer for RangeAlloc {
    type Handle = std::ops::Range<u64>;
    fn create() -> Self {
        Self(range_alloc::RangeAllocator::new(1..SPACE_PAGES))
    }
    #[inline(always)]
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle> {
        self.0.allocate_range(pages).ok()
    }
    #[inline(always)]
    fn free(&mut self, h: Self::Handle) {
        self.0.free_range(h);
    }
}

/// The `offset-allocator` crate (a two-level segregated fit), in pages.
pub struct OffsetAlloc(offset_allocator::Allocator<u32>);

impl std::fmt::Debug for OffsetAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OffsetAlloc")
    }
}

impl Peer for OffsetAlloc {
    type Handle = offset_allocator::Allocation<u32>;
    fn create() -> Self {
        // Its offsets are u32: 2^31 pages (8 TiB) is as much as it can take.
        Self(offset_allocator::Allocator::with_max_allocs(
            1 << 31,
            1 << 20,
        ))
    }
    #[inline(always)]
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle> {
        self.0.allocate(pages as u32)
    }
    #[inline(always)]
    fn free(&mut self, h: Self::Handle) {
        self.0.free(h);
    }
}

/// A peer owned by the one thread using it.
#[derive(Debug)]
pub struct Owned<P>(pub P);

impl<P: Peer> PairAlloc for Owned<P> {
    type Handle = P::Handle;
    #[inline(always)]
    fn alloc(&mut self, pages: u64) -> Option<P::Handle> {
        self.0.alloc(pages)
    }
    #[inline(always)]
    fn free(&mut self, h: P::Handle) {
        self.0.free(h)
    }
}

/// A peer shared by several threads behind a mutex.
#[derive(Debug)]
pub struct Shared<P>(pub Arc<Mutex<P>>);

impl<P: Peer> PairAlloc for Shared<P> {
    type Handle = P::Handle;
    fn alloc(&mut self, pages: u64) -> Option<P::Handle> {
        self.0.lock().expect("peer lock").alloc(pages)
    }
    fn free(&mut self, h: P::Handle) {
        self.0.lock().expect("peer lock").free(h)
    }
}

/// No allocator at all: the harness's own cost per pair (slot choice, size
/// draw, handle storage), measured so the others can be read net of it.
#[derive(Debug, Default)]
pub struct Harness(u64);

impl PairAlloc for Harness {
    type Handle = std::num::NonZeroU64;
    #[inline(always)]
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle> {
        self.0 += pages;
        std::num::NonZeroU64::new(self.0)
    }
    #[inline(always)]
    fn free(&mut self, h: Self::Handle) {
        std::hint::black_box(h);
    }
}
