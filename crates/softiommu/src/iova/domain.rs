//! The IOVA domain: the tree, the depots, the state map, the statistics.

use crate::sync::lock_std as lock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::class::Class;
use super::depot::Depots;
use super::gap_tree::GapTree;
use super::linear_tree::{LinearTree, DMA_32BIT_PFN};
use super::live_map::{
    free_error_seen, state, state_of, tag_of, tagged, LiveMap, CACHED, KIND_SHIFT, LIVE, RETIRED,
};
use super::magazine::Magazine;
use super::owner::{OwnerSlot, Owners};
use super::policy::{CacheParams, DepotRule, IovaPolicy, WhenFull};
use super::{order_of, IovaError};

/// The range allocator behind the caches.
#[derive(Debug)]
enum Tree {
    Gap(GapTree),
    Linear(LinearTree),
}

#[derive(Debug)]
struct TreeState {
    tree: Tree,
    reserved: Vec<(u64, u64)>,
    allocated_blocks: u64,
    peak_nodes: u64,
    allocs: u64,
    frees: u64,
    /// The last frame of the low window.
    low_last: u64,
    /// Ours only: the smallest order the low window was found to have no
    /// room for, since the last free below its end (`u32::MAX`: none).
    /// Read without the lock by [`IovaDomain::low_window_full`], and only
    /// for a low-first try that has a higher limit to fall back to: a
    /// stale value sends one allocation above the window, never fails one.
    low_full: Arc<AtomicU32>,
}

impl TreeState {
    fn nodes(&self) -> u64 {
        match &self.tree {
            Tree::Gap(t) => t.len() as u64,
            Tree::Linear(t) => t.len() as u64,
        }
    }

    fn alloc(&mut self, order: u32, limit: u64) -> Option<u64> {
        let got = match &mut self.tree {
            Tree::Gap(t) => t.alloc(order, limit),
            Tree::Linear(t) => t.alloc(order, limit),
        };
        let Some(pfn) = got else {
            self.window_has_no_room(order, limit);
            return None;
        };
        self.allocs += 1;
        self.allocated_blocks += 1;
        self.peak_nodes = self.peak_nodes.max(self.nodes());
        Some(pfn)
    }

    /// Allocates one block of 2^`chunk` pages and counts it as 2^(chunk -
    /// order) blocks of 2^`order`: only the free-extent tree can do this,
    /// since it does not remember allocated blocks.
    fn alloc_split(&mut self, order: u32, chunk: u32, limit: u64) -> Option<u64> {
        let Tree::Gap(t) = &mut self.tree else {
            return None;
        };
        let Some(pfn) = t.alloc(chunk, limit) else {
            self.window_has_no_room(chunk, limit);
            return None;
        };
        self.allocs += 1;
        self.allocated_blocks += 1 << (chunk - order);
        self.peak_nodes = self.peak_nodes.max(self.nodes());
        Some(pfn)
    }

    /// Ours: a failed search over the whole low window means it has no
    /// aligned block of 2^`order` pages (or larger) left.
    fn window_has_no_room(&mut self, order: u32, limit: u64) {
        if matches!(self.tree, Tree::Gap(_)) && limit == self.low_last {
            self.low_full.fetch_min(order, Relaxed);
        }
    }

    /// A range starting at `pfn` went back to the tree: below the low
    /// window's end, it may make room there.
    fn room_freed(&mut self, pfn: u64) {
        if pfn <= self.low_last && self.low_full.load(Relaxed) != u32::MAX {
            self.low_full.store(u32::MAX, Relaxed);
        }
    }

    fn free(&mut self, pfn: u64, order: u32) {
        self.room_freed(pfn);
        let hi = pfn + (1u64 << order) - 1;
        let ok = match &mut self.tree {
            Tree::Gap(t) => t.free(pfn, hi),
            Tree::Linear(t) => t.free(pfn, hi),
        };
        // The state map vouched for this block, so the tree must agree.
        debug_assert!(ok.is_ok(), "tree and state map disagree on {pfn:#x}");
        self.frees += 1;
        self.allocated_blocks -= 1;
        self.peak_nodes = self.peak_nodes.max(self.nodes());
    }

    /// Frees `n` adjacent blocks of 2^`order` starting at `pfn` as one
    /// extent (the free-extent tree only).
    fn free_run(&mut self, pfn: u64, n: u64, order: u32) {
        self.room_freed(pfn);
        let hi = pfn + (n << order) - 1;
        let ok = match &mut self.tree {
            Tree::Gap(t) => t.free(pfn, hi),
            Tree::Linear(_) => Err(()),
        };
        debug_assert!(ok.is_ok(), "tree and state map disagree on {pfn:#x}+{n}");
        self.frees += 1;
        self.allocated_blocks -= n;
        self.peak_nodes = self.peak_nodes.max(self.nodes());
    }

    fn is_free(&self, pfn: u64) -> bool {
        match &self.tree {
            Tree::Gap(t) => t.is_free(pfn),
            Tree::Linear(t) => t.is_free(pfn),
        }
    }
}

/// What kind of mapping holds a live block: unmaps name the kind they
/// undo, and a block of another kind is refused (see
/// [`IovaDomain::retire_block_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// A streaming mapping (`map`), or a block the allocator's own callers
    /// hold: what every allocation starts as.
    Plain,
    /// A scatter list's block (`map_sg`).
    ScatterList,
    /// A coherent buffer's block (`alloc_coherent`).
    Coherent,
}

impl BlockKind {
    /// The kind's bits in a state word.
    #[inline]
    pub(crate) fn bits(self) -> u16 {
        let n: u16 = match self {
            BlockKind::Plain => 0,
            BlockKind::ScatterList => 1,
            BlockKind::Coherent => 2,
        };
        n << KIND_SHIFT
    }
}

/// What a block of IOVA space is being used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Handed to a user.
    Live,
    /// Freed by its user, held in a per-CPU cache or the depot.
    Cached,
    /// Released by its user, waiting for a flush before it may be freed
    /// (see [`IovaDomain::retire_block`]).
    Retired,
    /// A reserved range.
    Reserved,
}

/// A block found by [`IovaDomain::find`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IovaBlock {
    /// First page frame.
    pub pfn: u64,
    /// Pages in the block.
    pub pages: u64,
    /// What it is used for.
    pub state: BlockState,
}

/// A snapshot of a domain's counters. Cheap to take; exact when no thread is
/// allocating, within a few operations otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IovaStats {
    /// Nodes in the range allocator's tree now (free extents for ours,
    /// allocated ranges for the Linux baselines).
    pub tree_nodes: u64,
    /// The most tree nodes ever.
    pub peak_tree_nodes: u64,
    /// Blocks allocated in the tree (live, cached or both).
    pub tree_blocks: u64,
    /// IOVAs held in per-CPU caches and depots.
    pub cached_iovas: u64,
    /// Full magazines in the depots.
    pub depot_magazines: u64,
    /// Allocations served by the tree.
    pub tree_allocs: u64,
    /// Frees into the tree.
    pub tree_frees: u64,
    /// Allocated ranges stepped over by linear searches (baselines only).
    pub scan_steps: u64,
    /// Magazines whose IOVAs went back to the tree.
    pub magazines_freed: u64,
    /// Requests to flush every per-CPU cache.
    pub cache_flushes: u64,
    /// Per-CPU caches alive.
    pub cpu_caches: u64,
    /// Caches whose owner slot was revoked (another thread changed one of
    /// their live blocks), after which they free by compare-exchange.
    pub owner_revocations: u64,
}

/// What a cache shares for [`IovaDomain::stats`]: its id and its classes,
/// whose counts it keeps (see `class.rs`).
#[derive(Debug)]
pub(super) struct CacheShared {
    /// The cache's id, tagging the magazines it puts in the depot.
    pub(super) id: u32,
    /// The cache's classes, read here only for their counts.
    classes: Arc<[CachePadded<Class>]>,
    /// The owner slot the cache's handle names while it holds none of the
    /// domain's (spent: its frees take the exchange); only the cache
    /// touches it.
    pub(super) spare: CachePadded<OwnerSlot>,
}

impl CacheShared {
    /// The IOVAs the cache holds, all classes.
    fn cached_total(&self) -> u64 {
        self.classes.iter().map(|c| c.held()).sum()
    }
}

/// An IOVA space with its caches. Share it as `Arc<IovaDomain>`; give each
/// allocating thread its own [`IovaCpuCache`](super::IovaCpuCache) with
/// [`cpu_cache`](Self::cpu_cache).
///
/// Layout: the fields every cache call reads (bounds, parameters, the state
/// map) share cache lines only with each other; the tree, each depot, the
/// flush epoch and the slow-path counters each sit on lines of their own, so
/// a slow path on one CPU never evicts the fast path's data on another.
#[derive(Debug)]
pub struct IovaDomain {
    start_pfn: u64,
    end_pfn: u64,
    low_window_end: u64,
    policy: Option<IovaPolicy>,
    params: CacheParams,
    /// Each frame's state and tag ([`set_tag`](Self::set_tag)).
    pub(super) live: LiveMap,
    /// The caches' owner slots (see `owner.rs`).
    pub(super) owners: Owners,
    caches: Mutex<Vec<Weak<CacheShared>>>,
    pub(super) flush_epoch: CachePadded<AtomicU64>,
    tree: CachePadded<Mutex<TreeState>>,
    /// `TreeState::low_full`, shared for lock-free reads.
    low_full: Arc<AtomicU32>,
    depots: Depots,
    counters: CachePadded<Counters>,
}

/// Slow-path counters, updated under or beside the depot and tree locks.
#[derive(Debug, Default)]
struct Counters {
    next_cache_id: std::sync::atomic::AtomicU32,
    cpu_caches: AtomicUsize,
    magazines_freed: AtomicU64,
    cache_flushes: AtomicU64,
}

/// The low window of a domain built without one named: 4 GiB, or (for a
/// space starting above 4 GiB) its first frame only, so that such a domain
/// builds as it did before windows existed.
fn default_low_window_end(start_pfn: u64) -> u64 {
    DMA_32BIT_PFN.max(start_pfn.saturating_add(1))
}

impl IovaDomain {
    /// A domain over page frames `[start_pfn, end_pfn]` with a named policy.
    /// `start_pfn` must be at least 1 (IOVA 0 is never handed out, as in Linux).
    pub fn new(start_pfn: u64, end_pfn: u64, policy: IovaPolicy) -> Result<Arc<Self>, IovaError> {
        Self::build(
            start_pfn,
            end_pfn,
            default_low_window_end(start_pfn),
            Some(policy),
            policy.params(),
        )
    }

    /// As [`new`](Self::new), with the low window (the frames a Linux-style
    /// tree keeps a cached node of its own for: 4 GiB, Linux's
    /// `dma_32bit_pfn`, in [`new`](Self::new)) ending below frame
    /// `low_window_end`. A lab shrinks it to fill it in seconds; it must
    /// leave room above `start_pfn` ([`IovaError::InvalidRange`] if not).
    pub fn with_low_window(
        start_pfn: u64,
        end_pfn: u64,
        low_window_end: u64,
        policy: IovaPolicy,
    ) -> Result<Arc<Self>, IovaError> {
        Self::build(
            start_pfn,
            end_pfn,
            low_window_end,
            Some(policy),
            policy.params(),
        )
    }

    /// A domain with hand-set cache parameters.
    pub fn with_params(
        start_pfn: u64,
        end_pfn: u64,
        params: CacheParams,
    ) -> Result<Arc<Self>, IovaError> {
        Self::build(
            start_pfn,
            end_pfn,
            default_low_window_end(start_pfn),
            None,
            params,
        )
    }

    fn build(
        start_pfn: u64,
        end_pfn: u64,
        low_window_end: u64,
        policy: Option<IovaPolicy>,
        params: CacheParams,
    ) -> Result<Arc<Self>, IovaError> {
        if start_pfn == 0 || start_pfn > end_pfn || end_pfn >= 1 << 52 {
            return Err(IovaError::InvalidRange {
                lo: start_pfn,
                hi: end_pfn,
            });
        }
        if low_window_end <= start_pfn {
            return Err(IovaError::InvalidRange {
                lo: start_pfn,
                hi: low_window_end,
            });
        }
        params.check()?;
        let tree = if params.linear_tree {
            Tree::Linear(LinearTree::new(
                start_pfn,
                low_window_end,
                params.linear_search,
            ))
        } else {
            Tree::Gap(GapTree::new(start_pfn, end_pfn))
        };
        // Ours: a depot shard per core (see `depot`); Linux: one depot.
        let shards = if params.affine_depot {
            std::thread::available_parallelism().map_or(1, usize::from)
        } else {
            1
        };
        let depots = Depots::new(params.max_cached_order as usize + 1, shards, Instant::now());
        let low_full = Arc::new(AtomicU32::new(u32::MAX));
        Ok(Arc::new(Self {
            start_pfn,
            end_pfn,
            low_window_end,
            policy,
            params,
            live: LiveMap::new(end_pfn)?,
            owners: Owners::new(),
            caches: Mutex::new(Vec::new()),
            tree: CachePadded::new(Mutex::new(TreeState {
                tree,
                reserved: Vec::new(),
                allocated_blocks: 0,
                peak_nodes: 1,
                allocs: 0,
                frees: 0,
                low_last: low_window_end.min(end_pfn + 1) - 1,
                low_full: low_full.clone(),
            })),
            low_full,
            depots,
            flush_epoch: CachePadded::new(AtomicU64::new(0)),
            counters: CachePadded::new(Counters::default()),
        }))
    }

    /// The first page frame of the domain.
    pub fn start_pfn(&self) -> u64 {
        self.start_pfn
    }

    /// The last page frame of the domain.
    pub fn end_pfn(&self) -> u64 {
        self.end_pfn
    }

    /// The first frame above the low window (see
    /// [`with_low_window`](Self::with_low_window)).
    pub fn low_window_end(&self) -> u64 {
        self.low_window_end
    }

    /// Ours only: whether the tree is known to have no aligned block of
    /// 2^`order` pages at or below `limit`, because a search of the whole
    /// low window for one that small or smaller failed and nothing below
    /// its end was freed since. A hint read without the lock.
    #[inline]
    pub(super) fn low_window_full(&self, order: u32, limit: u64) -> bool {
        limit < self.low_window_end && order >= self.low_full.load(Relaxed)
    }

    /// The named policy, if the domain was built with one.
    pub fn policy(&self) -> Option<IovaPolicy> {
        self.policy
    }

    /// The cache parameters in force.
    pub fn params(&self) -> CacheParams {
        self.params
    }

    /// The highest pfn a device with DMA mask `mask` (e.g. `u32::MAX as u64`)
    /// may be given, clamped to the domain.
    pub fn limit_for_mask(&self, mask: u64) -> u64 {
        (mask >> crate::mem::PAGE_SHIFT).min(self.end_pfn)
    }

    /// Registers a new per-CPU cache, whose counts `classes` keep: its
    /// id and shared state.
    pub(super) fn register_cache(&self, classes: Arc<[CachePadded<Class>]>) -> Arc<CacheShared> {
        let id = self.counters.next_cache_id.fetch_add(1, Relaxed);
        let shared = Arc::new(CacheShared {
            id,
            classes,
            spare: CachePadded::new(OwnerSlot::spent()),
        });
        let mut list = lock(&self.caches);
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&shared));
        drop(list);
        self.counters.cpu_caches.fetch_add(1, Relaxed);
        shared
    }

    pub(super) fn cache_dropped(&self) {
        self.counters.cpu_caches.fetch_sub(1, Relaxed);
    }

    /// Checks the size and limit of a request; returns the order and the
    /// limit clamped to the domain.
    #[inline]
    pub(super) fn check_request(
        &self,
        pages: u64,
        limit_pfn: u64,
    ) -> Result<(u32, u64), IovaError> {
        let order = order_of(pages)?;
        let domain_pages = self.end_pfn - self.start_pfn + 1;
        if order >= 64 || (1u64 << order) > domain_pages {
            return Err(IovaError::TooLarge {
                pages,
                domain_pages,
            });
        }
        if limit_pfn < self.start_pfn {
            return Err(IovaError::LimitBelowStart {
                limit: limit_pfn,
                start: self.start_pfn,
            });
        }
        Ok((order, limit_pfn.min(self.end_pfn)))
    }

    /// Allocates a block of `pages` (rounded up to a power of two) at or below
    /// `limit_pfn` straight from the tree, bypassing the caches.
    pub fn alloc(&self, pages: u64, limit_pfn: u64) -> Result<u64, IovaError> {
        let (order, limit) = self.check_request(pages, limit_pfn)?;
        self.alloc_from_tree(order, limit, None)
    }

    /// The tree path of an allocation. On exhaustion, gives the depots (and,
    /// with `flush_own`, the calling thread's cache) back to the tree and
    /// retries once.
    pub(super) fn alloc_from_tree(
        &self,
        order: u32,
        limit: u64,
        flush_own: Option<&mut dyn FnMut()>,
    ) -> Result<u64, IovaError> {
        let first = lock(&self.tree).alloc(order, limit);
        let pfn = match first {
            Some(p) => p,
            None => {
                // The request first, then the caller's own flush, which
                // answers its own ring (so its next free stays plain).
                self.flush_caches();
                if let Some(flush) = flush_own {
                    flush();
                }
                lock(&self.tree)
                    .alloc(order, limit)
                    .ok_or(IovaError::NoSpace {
                        pages: 1 << order,
                        limit,
                    })?
            }
        };
        self.claim_from_tree(pfn, order)
    }

    /// The tree path of an allocation that gives nothing back on
    /// exhaustion: [`IovaError::NoSpace`] at once (Linux's
    /// `alloc_iova_fast` with `flush_rcache` false).
    pub(super) fn try_alloc_from_tree(&self, order: u32, limit: u64) -> Result<u64, IovaError> {
        let pfn = lock(&self.tree)
            .alloc(order, limit)
            .ok_or(IovaError::NoSpace {
                pages: 1 << order,
                limit,
            })?;
        self.claim_from_tree(pfn, order)
    }

    /// Marks a block the tree just handed out live, or gives it back.
    fn claim_from_tree(&self, pfn: u64, order: u32) -> Result<u64, IovaError> {
        if let Err(e) = self.live.claim_state(pfn, state(LIVE, order)) {
            lock(&self.tree).free(pfn, order);
            return Err(e.into());
        }
        Ok(pfn)
    }

    /// Refill for a cache that missed on `order`: one chunk of 2^`chunk`
    /// pages, split into blocks of 2^`order`, all marked cached. Returns the
    /// chunk's start, or `None` where the tree cannot split (the Linux
    /// baselines, which refill one block at a time) or has no such chunk.
    pub(super) fn alloc_chunk(&self, order: u32, chunk: u32, limit: u64) -> Option<u64> {
        if self.params.linear_tree || chunk <= order {
            return None;
        }
        let mut tree = lock(&self.tree);
        let pfn = tree.alloc_split(order, chunk, limit)?;
        // The chunk is size aligned and smaller than a map chunk: one claim
        // covers every block in it.
        if self.live.claim_state(pfn, state(CACHED, order)).is_err() {
            tree.free_run(pfn, 1 << (chunk - order), order);
            return None;
        }
        drop(tree);
        for i in 1..1u64 << (chunk - order) {
            self.live
                .set_state(pfn + (i << order), state(CACHED, order));
        }
        Some(pfn)
    }

    /// Frees a block allocated with [`alloc`](Self::alloc) (or through a
    /// cache) straight to the tree.
    pub fn free(&self, pfn: u64, pages: u64) -> Result<(), IovaError> {
        let order = order_of(pages)?;
        // Claimed with one compare-exchange (as a cache's free): of two
        // threads freeing one block at once, exactly one frees it.
        if order >= 64
            || self
                .live
                .compare_exchange(pfn, state(LIVE, order), state(CACHED, order), &self.owners)
                .is_err()
        {
            return Err(self.free_error(pfn, order));
        }
        self.free_to_tree(pfn, order);
        Ok(())
    }

    /// Whether a block of `pages` (as allocated) starting at `pfn` is held
    /// by a user: one state-word load. The DMA layer checks this before it
    /// unmaps anything, so a bad unmap changes nothing.
    pub fn check_live_block(&self, pfn: u64, pages: u64) -> Result<(), IovaError> {
        self.check_live(pfn, order_of(pages)?)
    }

    /// The tag of the live block of `pages` (as allocated, plain kind)
    /// starting at `pfn`, read on the same load that finds the block live;
    /// `None` if no such block starts there.
    pub(crate) fn live_tag(&self, pfn: u64, pages: u64) -> Option<u32> {
        let order = order_of(pages).ok()?;
        let w = self.live.get(pfn);
        (order < 64 && state_of(w) == state(LIVE, order)).then_some(tag_of(w))
    }

    /// Marks a live block as released by its user but not free yet: an
    /// IOVA an unmap is revoking, which only the invalidation that covers it
    /// may free (with [`IovaCpuCache::free_retired`](super::IovaCpuCache::free_retired)). Until then a second
    /// free or retire of it is refused (`NotAllocated`), as a double unmap
    /// must be, though the block is still allocated in the tree. One
    /// successful compare-exchange (a tagged block's word is tried again
    /// with its tag): of two threads retiring one block at once, exactly
    /// one succeeds.
    /// A block of another [`BlockKind`] than [`BlockKind::Plain`] is refused
    /// (`NotAllocated`): see [`retire_block_of`](Self::retire_block_of).
    pub fn retire_block(&self, pfn: u64, pages: u64) -> Result<(), IovaError> {
        self.retire_block_of(pfn, pages, BlockKind::Plain)
    }

    /// Tags the frame `pfn` of a live block its caller holds with `tag`,
    /// for the holder's own checks (the DMA layer records the exact bytes a
    /// mapping covers). The tag shares the block's state word: a retire
    /// can require it ([`IovaCpuCache::retire_tagged`](super::IovaCpuCache::retire_tagged)), and
    /// any change of the block's state clears it at the block's first frame,
    /// as every allocation starts untagged (a frame inside a block keeps
    /// its tag after the block goes: nothing compares it, and a block that
    /// later starts there stores its word whole).
    #[inline]
    pub(crate) fn set_tag(&self, pfn: u64, tag: u32) -> Result<(), IovaError> {
        self.live.set_tag(pfn, tag).map_err(IovaError::from)
    }

    /// The tag of frame `pfn` (0 if none).
    #[inline]
    pub(crate) fn tag(&self, pfn: u64) -> u32 {
        self.live.tag_at(pfn)
    }

    /// [`retire_block`](Self::retire_block) for a block held as `kind`: a
    /// live block of another kind is refused (`NotAllocated`: no block of
    /// that kind starts there), so an unmap of one kind of mapping can never
    /// retire a block another kind holds, whose owner would later free
    /// whatever block reused its IOVA.
    pub fn retire_block_of(&self, pfn: u64, pages: u64, kind: BlockKind) -> Result<(), IovaError> {
        self.move_block(pfn, pages, LIVE | kind.bits(), RETIRED)
    }

    /// Moves the block of `pages` at `pfn` from state `from` to `to` (one
    /// compare-exchange); a block not in `from` is refused with the
    /// reason `free_error` gives.
    #[inline]
    fn move_block(&self, pfn: u64, pages: u64, from: u16, to: u16) -> Result<(), IovaError> {
        let order = order_of(pages)?;
        if order >= 64 {
            return Err(self.free_error(pfn, order));
        }
        self.live
            .compare_exchange(pfn, state(from, order), state(to, order), &self.owners)
            .map_err(|_| self.free_error(pfn, order))
    }

    /// Undoes [`retire_block_of`](Self::retire_block_of) for an unmap that
    /// could not proceed: the block is the user's again, as `kind`, with
    /// the `tag` it held (the retire cleared it).
    pub(crate) fn unretire_block(
        &self,
        pfn: u64,
        pages: u64,
        kind: BlockKind,
        tag: u32,
    ) -> Result<(), IovaError> {
        let order = order_of(pages)?;
        let to = tagged(state(LIVE | kind.bits(), order), tag);
        self.live
            .exchange_word(pfn, state(RETIRED, order).into(), to)
            .map_err(|_| IovaError::NotRetired { pfn })
    }

    /// Changes the kind of a live block from `from` to `to` (one
    /// successful compare-exchange) and clears its tag: a caller that
    /// allocated a block for a coherent buffer marks it before it hands
    /// the IOVA out (a scatter list's block is marked with its tag in one
    /// step, `IovaCpuCache::mark_tagged`), and takes the mark off before it
    /// frees a block it could not use.
    pub(crate) fn set_kind(
        &self,
        pfn: u64,
        pages: u64,
        from: BlockKind,
        to: BlockKind,
    ) -> Result<(), IovaError> {
        self.move_block(pfn, pages, LIVE | from.bits(), LIVE | to.bits())
    }

    /// Verifies that a live block of `order` starts at `pfn`.
    #[inline]
    pub(super) fn check_live(&self, pfn: u64, order: u32) -> Result<(), IovaError> {
        self.check_state(pfn, order, LIVE)
    }

    /// Verifies that a block of `order` in state `flag` starts at `pfn`.
    #[inline]
    pub(super) fn check_state(&self, pfn: u64, order: u32, flag: u16) -> Result<(), IovaError> {
        if order < 64 && self.live.state_at(pfn) == state(flag, order) {
            Ok(())
        } else if flag == RETIRED && order < 64 && self.live.state_at(pfn) == state(LIVE, order) {
            Err(IovaError::NotRetired { pfn })
        } else {
            Err(self.free_error(pfn, order))
        }
    }

    /// Why `pfn` is not a retired block of `order` (for a refused
    /// `free_retired`).
    #[cold]
    pub(super) fn retired_error(&self, pfn: u64, order: u32) -> IovaError {
        match self.check_state(pfn, order, RETIRED) {
            Err(e) => e,
            // It was retired a moment ago: another thread freed it since.
            Ok(()) => IovaError::NotAllocated { pfn },
        }
    }

    #[cold]
    pub(super) fn free_error(&self, pfn: u64, order: u32) -> IovaError {
        if pfn < self.start_pfn || pfn > self.end_pfn {
            return IovaError::OutsideDomain { lo: pfn, hi: pfn };
        }
        // Free, cached, retired, or live as another kind with the size
        // asked: not a block the caller may free.
        free_error_seen(pfn, order, self.live.state_at(pfn))
    }

    /// Returns a validated block to the tree, clearing its state.
    pub(super) fn free_to_tree(&self, pfn: u64, order: u32) {
        self.live.set_state(pfn, 0);
        lock(&self.tree).free(pfn, order);
    }

    /// Returns a magazine's IOVAs to the tree under one lock.
    pub(super) fn free_magazine(&self, mag: &mut Magazine, order: u32) {
        if mag.is_empty() {
            return;
        }
        let mut pfns: Vec<u64> = mag.drain().collect();
        for &pfn in &pfns {
            self.live.set_state(pfn, 0);
        }
        let mut tree = lock(&self.tree);
        if matches!(tree.tree, Tree::Gap(_)) {
            // Blocks of one refill chunk come back together: sorted, adjacent
            // blocks go to the tree as one extent, one operation for a run.
            pfns.sort_unstable();
            let size = 1u64 << order;
            let mut i = 0;
            while i < pfns.len() {
                let mut j = i + 1;
                while j < pfns.len() && pfns[j] == pfns[j - 1] + size {
                    j += 1;
                }
                tree.free_run(pfns[i], (j - i) as u64, order);
                i = j;
            }
        } else {
            for pfn in pfns {
                tree.free(pfn, order);
            }
        }
        drop(tree);
        self.counters.magazines_freed.fetch_add(1, Relaxed);
    }

    /// The core the caller runs on, where the depot is sharded.
    #[inline]
    fn depot_core(&self) -> usize {
        if self.depots.shards() > 1 {
            current_core() as usize
        } else {
            0
        }
    }

    /// Takes a full magazine from the depot of `order`, if any: one that
    /// cache `owner` filled, else one filled on this core, else any. A
    /// magazine filled on another core holds IOVAs whose state lines that
    /// core last wrote: handing them to this one makes every alloc and free
    /// of them a cache-line transfer (measured, `lab iova-aging --policies
    /// softiommu` on 2 cores: runs flipped for seconds between ~80 and ~29
    /// M ops/s as magazines wandered between the threads).
    pub(super) fn depot_pop(&self, order: u32, owner: u32) -> Option<Magazine> {
        let core = self.depot_core();
        // The clock is read before the lock: the critical section is a
        // few loads and stores.
        let now = Instant::now();
        let mag = self.depots.pop(order, core, owner, now);
        self.trim_on_touch(order);
        mag
    }

    /// Offers a full magazine to the depot. Returns it back if the depot is
    /// full, with what the policy says to do about it.
    pub(super) fn depot_push(
        &self,
        order: u32,
        owner: u32,
        mag: Magazine,
    ) -> Result<(), (Magazine, WhenFull)> {
        let core = self.depot_core();
        let now = Instant::now();
        let (bound, when_full) = match self.params.depot {
            DepotRule::Bounded {
                capacity,
                per_cpu,
                when_full,
            } => (
                Some(capacity.max(per_cpu * self.counters.cpu_caches.load(Relaxed))),
                when_full,
            ),
            DepotRule::TrimToCpus { .. } => (None, WhenFull::FreeMagazine),
        };
        let res = self
            .depots
            .push(order, core, owner, mag, bound, now)
            .map_err(|m| (m, when_full));
        self.trim_on_touch(order);
        res
    }

    /// What a depot operation owes the trim rules: the `linux-2023` periodic
    /// trim, which runs on depot traffic as Linux's does on its workqueue.
    /// The idle trim cannot be due on a depot just touched, so it is left
    /// to [`maintain`](Self::maintain) and the slow paths: running it here
    /// took the depot's lock and read the clock a second time per
    /// magazine exchange (2.8 % + part of 7.6 % of `lab iova-aging`'s
    /// samples for ours).
    #[inline]
    fn trim_on_touch(&self, order: u32) {
        if matches!(self.params.depot, DepotRule::TrimToCpus { .. }) {
            self.maybe_trim(order);
        }
    }

    /// Gives depot magazines back to the tree as the policy says: one every
    /// period past the CPU count (`linux-2023`), or all of an idle depot.
    fn maybe_trim(&self, order: u32) {
        let periodic = match self.params.depot {
            DepotRule::TrimToCpus { every } => {
                Some((every, self.counters.cpu_caches.load(Relaxed).max(1)))
            }
            DepotRule::Bounded { .. } => None,
        };
        let victims = self
            .depots
            .trim(order, periodic, self.params.idle_trim, Instant::now());
        for mut m in victims {
            self.free_magazine(&mut m, order);
        }
    }

    /// Runs the background work of the caches: the `linux-2023` depot trim
    /// and the idle trim. Call it from a timer (every ~100 ms) where threads
    /// may go quiet; the slow paths also run it.
    pub fn maintain(&self) {
        for order in 0..self.depots.classes() as u32 {
            self.maybe_trim(order);
        }
    }

    /// Gives every depot magazine back to the tree and asks every per-CPU
    /// cache to do the same at its owner's next free, next call past the
    /// fast path, or drop (an allocation its loaded magazine serves does
    /// not look: see the module documentation).
    pub fn flush_caches(&self) {
        self.counters.cache_flushes.fetch_add(1, Relaxed);
        self.flush_epoch.fetch_add(1, Relaxed);
        self.owners.ring();
        for order in 0..self.depots.classes() as u32 {
            for mut m in self.depots.take_all(order) {
                self.free_magazine(&mut m, order);
            }
        }
    }

    /// Asks every per-CPU cache to flush (as
    /// [`flush_caches`](Self::flush_caches) does), leaving the depots (what
    /// `linux-2020` does when a depot fills).
    pub(super) fn request_cpu_flush(&self) {
        self.counters.cache_flushes.fetch_add(1, Relaxed);
        self.flush_epoch.fetch_add(1, Relaxed);
        self.owners.ring();
    }

    /// Marks `[lo_pfn, hi_pfn]` as never to be handed out. The range must be
    /// inside the domain and free.
    pub fn reserve(&self, lo_pfn: u64, hi_pfn: u64) -> Result<(), IovaError> {
        if lo_pfn > hi_pfn {
            return Err(IovaError::InvalidRange {
                lo: lo_pfn,
                hi: hi_pfn,
            });
        }
        if lo_pfn < self.start_pfn || hi_pfn > self.end_pfn {
            return Err(IovaError::OutsideDomain {
                lo: lo_pfn,
                hi: hi_pfn,
            });
        }
        let mut t = lock(&self.tree);
        let ok = match &mut t.tree {
            Tree::Gap(g) => g.carve(lo_pfn, hi_pfn),
            Tree::Linear(l) => l.carve(lo_pfn, hi_pfn),
        };
        ok.map_err(|()| IovaError::ReservedOverlap {
            lo: lo_pfn,
            hi: hi_pfn,
        })?;
        t.reserved.push((lo_pfn, hi_pfn));
        t.peak_nodes = t.peak_nodes.max(t.nodes());
        Ok(())
    }

    /// The block containing `pfn`, if it is allocated or reserved.
    pub fn find(&self, pfn: u64) -> Option<IovaBlock> {
        if pfn < self.start_pfn || pfn > self.end_pfn {
            return None;
        }
        let t = lock(&self.tree);
        if let Some(&(lo, hi)) = t.reserved.iter().find(|&&(lo, hi)| lo <= pfn && pfn <= hi) {
            return Some(IovaBlock {
                pfn: lo,
                pages: hi - lo + 1,
                state: BlockState::Reserved,
            });
        }
        if t.is_free(pfn) {
            return None;
        }
        drop(t);
        let (start, order, flag) = self.live.block_containing(pfn)?;
        let state = match flag {
            RETIRED => BlockState::Retired,
            CACHED => BlockState::Cached,
            _ => BlockState::Live,
        };
        Some(IovaBlock {
            pfn: start,
            pages: 1 << order,
            state,
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> IovaStats {
        let t = lock(&self.tree);
        let (tree_nodes, peak, blocks, allocs, frees) = (
            t.nodes(),
            t.peak_nodes,
            t.allocated_blocks,
            t.allocs,
            t.frees,
        );
        let scan_steps = match &t.tree {
            Tree::Linear(l) => l.scan_steps,
            Tree::Gap(_) => 0,
        };
        drop(t);
        let in_cpus: u64 = lock(&self.caches)
            .iter()
            .filter_map(Weak::upgrade)
            .map(|c| c.cached_total())
            .sum();
        let (depot_magazines, depot_iovas) = self.depots.totals();
        IovaStats {
            tree_nodes,
            peak_tree_nodes: peak,
            tree_blocks: blocks,
            cached_iovas: in_cpus + depot_iovas,
            depot_magazines,
            tree_allocs: allocs,
            tree_frees: frees,
            scan_steps,
            magazines_freed: self.counters.magazines_freed.load(Relaxed),
            cache_flushes: self.counters.cache_flushes.load(Relaxed),
            owner_revocations: self.owners.revocations(),
            cpu_caches: self.counters.cpu_caches.load(Relaxed) as u64,
        }
    }

    /// The free extents of the tree in ascending order, for checkers (ours
    /// only; `None` for the Linux baselines, whose tree holds allocations).
    pub fn free_extents(&self) -> Option<Vec<(u64, u64)>> {
        match &lock(&self.tree).tree {
            Tree::Gap(g) => Some(g.extents()),
            Tree::Linear(_) => None,
        }
    }
}

/// The core the calling thread runs on (`sched_getcpu(3)`, a vDSO call on
/// Linux), 0 if unknown: a locality hint for the depot, never a
/// correctness input.
fn current_core() -> u32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `sched_getcpu` takes no arguments and only reads the
        // calling thread's CPU number; -1 means unknown.
        let c = unsafe { libc::sched_getcpu() };
        u32::try_from(c).unwrap_or(0)
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}
