//! The per-CPU (per-thread) front of the allocator: two magazines per size
//! class, touched without locks. A free of a block this cache handed out
//! is a load and a store while the cache holds its owner slot
//! (`owner.rs`); any other free claims the block's state word with a
//! compare-exchange (of two threads freeing one block at once, exactly one
//! may).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::class::{ClassMut, ClassTable};
use super::domain::{BlockKind, CacheShared, IovaDomain};
use super::live_map::{
    claim_for_free, free_words, move_state, put_tag, state, state_of, tag_of, tagged, ClaimWord,
    Cursor, FlatWords, LiveMap, Word, CACHED, LIVE, RETIRED,
};
use super::magazine::Magazine;
use super::owner::{OwnerRef, Owners, OWNER_MASK, OWNER_SHIFT};
use super::policy::WhenFull;
use super::IovaError;

/// A refill takes one chunk of up to 2^7 = 128 pages, whose state words
/// fill 1 KiB: at least the 128 bytes in which x86's adjacent-line
/// prefetcher moves lines (why crossbeam pads to 128 bytes too), so
/// refills of different threads never share one. Measured: 64-page chunks left `bench iova --threads 2`
/// at about half the per-thread throughput of one thread.
const REFILL_CHUNK_ORDER: u32 = 7;

/// How far ahead a batch free prefetches state words: enough misses in
/// flight to cover a memory latency of ~140 ns (measured on the lab's VM)
/// at a few ns per free, within the ~20 outstanding misses a core tracks.
const PREFETCH_AHEAD: usize = 16;

/// The state word of `pfn` in `map`: `flat`'s words first, else `cur`.
///
/// # Safety
/// `flat` came from `map` (`WordMap::flat_words`), and every call on `cur`
/// passes this same `map`.
#[inline(always)]
unsafe fn word_of<'m>(
    flat: &FlatWords<AtomicU64>,
    cur: &mut Cursor<AtomicU64>,
    map: &'m LiveMap,
    pfn: u64,
) -> Option<&'m AtomicU64> {
    // SAFETY: the contract.
    match unsafe { flat.get(map, pfn) } {
        Some(c) => Some(c),
        // SAFETY: the contract.
        None => unsafe { cur.cell(map, pfn) },
    }
}

/// A thread's cache over an [`IovaDomain`]. Create one per allocating
/// thread with [`IovaDomain::cpu_cache`]; it is `Send` (it may move with its
/// thread's work) but not shared. Dropping it gives its IOVAs back.
///
/// An IOVA allocated through one cache may be freed through another (a
/// completion handled on another CPU), or through the domain.
#[derive(Debug)]
pub struct IovaCpuCache {
    domain: Arc<IovaDomain>,
    classes: ClassTable,
    epoch: u64,
    misses: u64,
    /// The domain's bounds, kept here so that a hit reads no domain
    /// field.
    start_pfn: u64,
    end_pfn: u64,
    max_order: u32,
    shared: Arc<CacheShared>,
    /// Ours: a low-first allocation takes the magazine's top block from
    /// either side of the low window (see `alloc_low_first`).
    recycle_any: bool,
    /// This cache's window on the domain's state map (used with that map
    /// only): an access near the last one skips the map's lookup.
    live_cur: Cursor<AtomicU64>,
    /// The domain's state map's words where it is flat (empty where it is
    /// chunked): the pair's paths find a word with a compare and a scaled
    /// add, before trying the cursor.
    flat: FlatWords<AtomicU64>,
    /// The owner slot this cache holds (`owner.rs`), else (none to be
    /// had, or revoked) the spare, spent slot in `shared`.
    owner: OwnerRef,
    /// The owner bits the cache stamps: its slot's number while it holds
    /// the slot unrevoked, else 0.
    me: u64,
    /// The slot's number, to give it back (0: none), kept after a
    /// revocation.
    owner_slot: u64,
}

/// Why [`IovaCpuCache::retire_tagged`] refused a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RetireRefused {
    /// The block is live, of the kind and size asked, but carries this tag.
    Tag(u32),
    /// No such live block (the allocator's reason, as a free's refusal).
    Block(IovaError),
}

impl IovaDomain {
    /// A per-CPU (per-thread) cache over this domain. It holds one of the
    /// domain's owner slots while one is free (63 at most at a time), so
    /// that it frees the blocks it handed out without a locked
    /// instruction; another thread's first change of one of them revokes
    /// that, once (see [`IovaStats::owner_revocations`]).
    ///
    /// [`IovaStats::owner_revocations`]: super::IovaStats::owner_revocations
    pub fn cpu_cache(self: &Arc<Self>) -> IovaCpuCache {
        IovaCpuCache::new(self.clone(), true)
    }

    /// A per-CPU cache that takes no owner slot: every free of it is a
    /// compare-exchange (the DMA layer's, whose blocks are retired by
    /// exchange, often from another CPU than the map's).
    pub(crate) fn cpu_cache_unbiased(self: &Arc<Self>) -> IovaCpuCache {
        IovaCpuCache::new(self.clone(), false)
    }
}

impl IovaCpuCache {
    pub(super) fn new(domain: Arc<IovaDomain>, biased: bool) -> Self {
        let p = domain.params();
        let held = biased.then(|| domain.owners.take()).flatten();
        let owner_slot = held.map_or(0, |(s, _)| s);
        let classes = ClassTable::new((0..=p.max_cached_order).map(|order| {
            let (live, cached) = free_words(order, owner_slot << OWNER_SHIFT);
            ClassMut {
                loaded: Magazine::new(p.magazine_size),
                prev: Magazine::new(p.magazine_size),
                span_m1: (1 << order) - 1,
                live,
                cached,
            }
        }));
        let shared = domain.register_cache(classes.readers());
        let owner = match held {
            Some((_, r)) => r,
            // SAFETY: the spare slot lives in `shared`, which the cache
            // keeps for as long as it keeps the handle.
            None => unsafe { OwnerRef::to(&shared.spare) },
        };
        let epoch = domain.flush_epoch.load(Relaxed);
        let flat = domain.live.flat_words();
        let (start_pfn, end_pfn) = (domain.start_pfn(), domain.end_pfn());
        let max_order = (end_pfn - start_pfn + 1).ilog2();
        Self {
            domain,
            classes,
            epoch,
            misses: 0,
            start_pfn,
            end_pfn,
            max_order,
            shared,
            recycle_any: !p.linear_tree,
            live_cur: Cursor::default(),
            flat,
            owner,
            me: owner_slot << OWNER_SHIFT,
            owner_slot,
        }
    }

    /// The owner bits this cache stamps into its blocks: its slot's
    /// number while it holds the slot unrevoked, else 0.
    #[inline(always)]
    fn owner_bits(&self) -> u64 {
        self.me
    }

    /// Marks the cached block of `order` at `pfn` live, untagged, with
    /// this cache's owner bits (a plain store: the block is this cache's).
    #[inline(always)]
    fn set_live(&mut self, pfn: u64, order: u32) {
        let w = free_words(order, self.owner_bits()).0;
        self.put_word(pfn, w);
    }

    /// Stores the whole word `w` at `pfn` (a no-op for an unclaimed chunk).
    #[inline(always)]
    fn put_word(&mut self, pfn: u64, w: u64) {
        if let Some(c) = self.live_cell(pfn) {
            c.put(w);
        }
    }

    /// If another thread revoked this cache's owner slot: its allocations
    /// name no owner and its frees take the exchange from now on (its
    /// blocks still carrying the slot's number are claimed by the
    /// exchange's second try). Run when a free of its own took the
    /// exchange and found the slot revoked, and on the slow paths (a free
    /// out of line, a magazine refill or spill).
    fn drop_bias_if_revoked(&mut self) {
        if self.me != 0 && self.owner.is_revoked() {
            self.me = 0;
            // SAFETY: as in `new`.
            self.owner = unsafe { OwnerRef::to(&self.shared.spare) };
            for order in 0..self.classes.len() as u32 {
                let mut class = self.classes.at(order);
                (class.live, class.cached) = free_words(order, 0);
            }
        }
    }

    /// The state word of `pfn` on the pair's paths (`alloc`, `free`):
    /// the flat map's words first, else the cursor. (The other paths take
    /// the cursor alone: under valgrind, where `bench dma --instructions`
    /// counts them, the map is chunked and the flat try would only add a
    /// compare.)
    #[inline(always)]
    fn pair_cell(&mut self, pfn: u64) -> Option<&AtomicU64> {
        // SAFETY: `flat` and `live_cur` came from, and are only ever used
        // with, this domain's state map, which the cache keeps alive.
        unsafe { word_of(&self.flat, &mut self.live_cur, &self.domain.live, pfn) }
    }

    /// The state word of `pfn`, through this cache's cursor.
    #[inline(always)]
    fn live_cell(&mut self, pfn: u64) -> Option<&AtomicU64> {
        // SAFETY: `live_cur` is only ever used with this domain's state map.
        unsafe { self.live_cur.cell(&self.domain.live, pfn) }
    }

    /// Sets the state of `pfn`, untagged (a no-op for an unclaimed chunk,
    /// as `LiveMap::set_state`).
    #[inline(always)]
    fn set_state(&mut self, pfn: u64, v: u16) {
        if let Some(c) = self.live_cell(pfn) {
            c.put(v.into());
        }
    }

    /// Moves the state of `pfn` from `from` to `to` (as
    /// `LiveMap::compare_exchange`).
    #[inline(always)]
    fn move_state(&mut self, pfn: u64, from: u16, to: u16) -> Result<(), u16> {
        // SAFETY: as in `live_cell` (the fields borrowed apart).
        match unsafe { self.live_cur.cell(&self.domain.live, pfn) } {
            // Only live words carry an owner: a move from another state
            // (retired) is made with none.
            Some(c) => move_state(c, from, to, &self.domain.owners, 0),
            None => Err(0),
        }
    }

    /// [`IovaDomain::retire_block_of`] through this cache's cursor, for a
    /// block whose tag must hold `want` in the bits of `mask` (0 and 0:
    /// any tag): the state and those bits checked on one load, the block
    /// retired by a compare-exchange of that exact word (a tag that changed
    /// in between fails it, as a state that changed does). A refusal
    /// changes nothing: [`RetireRefused::Tag`] with the tag seen, or the
    /// allocator's reason. Returns the tag the block held (the retire
    /// clears it; [`IovaDomain::unretire_block`] puts it back).
    #[inline]
    pub(crate) fn retire_block_of(
        &mut self,
        pfn: u64,
        pages: u64,
        kind: BlockKind,
        mask: u32,
        want: u32,
    ) -> Result<u32, RetireRefused> {
        let order = super::order_of(pages).map_err(RetireRefused::Block)?;
        if order < 64 {
            let live = state(LIVE | kind.bits(), order);
            let me = self.owner_bits();
            // SAFETY: as in `live_cell` (the fields borrowed apart, so that
            // the owner slots can be reached with the word in hand).
            if let Some(c) = unsafe { self.live_cur.cell(&self.domain.live, pfn) } {
                let w = c.get();
                if state_of(w) == live {
                    if tag_of(w) & mask != want {
                        return Err(RetireRefused::Tag(tag_of(w)));
                    }
                    self.domain.owners.before_claim(w, me);
                    if c.claim(w, state(RETIRED, order).into()).is_ok() {
                        return Ok(tag_of(w));
                    }
                }
            }
        }
        Err(RetireRefused::Block(self.domain.free_error(pfn, order)))
    }

    /// Retires the live block of a streaming mapping (plain kind) of
    /// `pages` at `pfn` if it carries exactly `tag`: the block, its size,
    /// its kind and its tag checked and the block retired by one
    /// compare-exchange (of two racing unmaps, one wins; one that names
    /// another mapping's bytes changes nothing). The tag is cleared.
    #[inline(always)]
    pub(crate) fn retire_tagged(
        &mut self,
        pfn: u64,
        pages: u64,
        tag: u32,
    ) -> Result<(), RetireRefused> {
        let order = super::order_of(pages).map_err(RetireRefused::Block)?;
        let (from, to) = (
            tagged(state(LIVE, order), tag),
            u64::from(state(RETIRED, order)),
        );
        // SAFETY: as in `live_cell` (the fields borrowed apart).
        match unsafe { self.live_cur.cell(&self.domain.live, pfn) } {
            // The first try expects no owner (the DMA layer's blocks, whose
            // caches hold no slot); a block with one is tried again.
            Some(c) if order < 64 => match c.claim(from, to) {
                Ok(()) => Ok(()),
                Err(seen) => self.retire_seen(c, (pfn, order), (from, to), seen),
            },
            _ => Err(self.retire_refused(pfn, order, 0)),
        }
    }

    /// [`retire_tagged`](Self::retire_tagged) of a word `seen` that was not
    /// `from`: tried again if only its owner bits differ (another slot
    /// revoked first), else refused.
    #[cold]
    #[inline(never)]
    fn retire_seen(
        &self,
        c: &AtomicU64,
        (pfn, order): (u64, u32),
        (from, to): (u64, u64),
        seen: u64,
    ) -> Result<(), RetireRefused> {
        if seen & !OWNER_MASK != from {
            return Err(self.retire_refused(pfn, order, seen));
        }
        self.domain.owners.before_claim(seen, self.owner_bits());
        c.claim(seen, to)
            .map_err(|seen| self.retire_refused(pfn, order, seen))
    }

    /// Why [`retire_tagged`](Self::retire_tagged) was refused, the word at
    /// `pfn` having been `seen`.
    #[cold]
    #[inline(never)]
    fn retire_refused(&self, pfn: u64, order: u32, seen: u64) -> RetireRefused {
        if order < 64 && state_of(seen) == state(LIVE, order) {
            RetireRefused::Tag(tag_of(seen))
        } else {
            RetireRefused::Block(self.domain.free_error(pfn, order))
        }
    }

    /// Tags the block of `pages` at `pfn` that this thread just allocated
    /// and marked `kind` and has not handed out: one store of its whole
    /// word (its state is known), where [`set_tag`](Self::set_tag) reads
    /// the state to keep it.
    #[inline(always)]
    pub(crate) fn tag_fresh(
        &mut self,
        pfn: u64,
        pages: u64,
        kind: BlockKind,
        tag: u32,
    ) -> Result<(), IovaError> {
        let order = super::order_of(pages)?;
        match self.live_cell(pfn) {
            Some(c) => {
                c.put(tagged(state(LIVE | kind.bits(), order), tag));
                Ok(())
            }
            None => self.domain.set_tag(pfn, tag),
        }
    }

    /// Marks the plain, untagged live block of `pages` at `pfn` (just
    /// allocated by this thread, not handed out) as `kind`, tagged `tag`:
    /// one compare-exchange, so that an unmap of that kind never sees the
    /// block marked and untagged. A block in any other state is refused
    /// (the allocator's reason), nothing changed.
    pub(crate) fn mark_tagged(
        &mut self,
        pfn: u64,
        pages: u64,
        kind: BlockKind,
        tag: u32,
    ) -> Result<(), IovaError> {
        let order = super::order_of(pages)?;
        // This cache's block: from a magazine (its owner bits) or from the
        // tree (none). Its slot's number is accepted even after a
        // revocation dropped the bias (blocks stamped before it). The mark
        // clears them (a marked block is freed by exchange).
        let me = self.owner_slot << OWNER_SHIFT;
        let marked = order < 64
            && self.live_cell(pfn).is_some_and(|c| {
                let w = c.get();
                let live = u64::from(state(LIVE, order));
                (w == live || w == live | me)
                    && c.claim(w, tagged(state(LIVE | kind.bits(), order), tag))
                        .is_ok()
            });
        if marked {
            Ok(())
        } else {
            Err(self.domain.free_error(pfn, order))
        }
    }

    /// [`IovaDomain::set_tag`] through this cache's cursor (a chunk not
    /// claimed yet is claimed by the domain's path). A load and a store:
    /// only for a word no other thread can change meanwhile (a frame
    /// inside a block, or a block no unmap can retire yet); a block an
    /// unmap could retire is tagged by [`mark_tagged`](Self::mark_tagged)
    /// or, where no unmap can match it untagged, [`tag_fresh`](Self::tag_fresh).
    #[inline(always)]
    pub(crate) fn set_tag(&mut self, pfn: u64, tag: u32) -> Result<(), IovaError> {
        match self.live_cell(pfn) {
            Some(c) => {
                put_tag(c, tag);
                Ok(())
            }
            None => self.domain.set_tag(pfn, tag),
        }
    }

    /// The domain this cache serves.
    pub fn domain(&self) -> &Arc<IovaDomain> {
        &self.domain
    }

    /// Allocations this cache could not serve from its magazines.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    #[inline]
    fn check_epoch(&mut self) {
        // The ring first: lowering it (an acquire) makes the epoch the
        // ringer raised visible to the load below.
        self.owner.take_ring();
        if self.domain.flush_epoch.load(Relaxed) != self.epoch {
            self.flush();
        }
    }

    /// Allocates a block of `pages` (rounded up to a power of two, aligned to
    /// its size) at or below `limit_pfn`. If the tree has no room, every
    /// cache of the domain is asked to flush, the depots and this cache
    /// are given back to it, and the tree is tried once more (Linux's
    /// `alloc_iova_fast` with `flush_rcache`, except that another thread's
    /// cache gives its blocks back at its own next free or miss, not
    /// before the retry).
    #[inline(always)]
    pub fn alloc(&mut self, pages: u64, limit_pfn: u64) -> Result<u64, IovaError> {
        self.alloc_in::<true>(pages, limit_pfn)
    }

    /// As [`alloc`](Self::alloc), but if the tree has no room the caches
    /// stay as they are and the result is [`IovaError::NoSpace`]: a first
    /// try below a lower limit that has a fallback (a device preferring the
    /// low window, as Linux's `iommu_dma_alloc_iova` tries 32 bits first).
    #[inline(always)]
    pub fn try_alloc(&mut self, pages: u64, limit_pfn: u64) -> Result<u64, IovaError> {
        self.alloc_in::<false>(pages, limit_pfn)
    }

    /// Allocates below `low` while there is room there, else below `limit`
    /// (giving the caches back only for the second): a device that prefers
    /// the low window, as Linux's `iommu_dma_alloc_iova` tries 32 bits
    /// first for a PCI device. With `low >= limit`, or `low` below the
    /// domain's first frame, this is [`alloc`](Self::alloc) at `limit`:
    /// one try, which gives the caches back if the tree has no room (as
    /// Linux's single `alloc_iova_fast(.., true)` for a device without the
    /// 32-bit preference).
    ///
    /// The Linux baselines do what Linux does: search the loaded magazine
    /// for a block below `low`, then the tree. Ours keeps the preference
    /// where it chooses space, in the tree: a magazine's top block is
    /// handed out whichever side of `low` it lies (any block below the
    /// mask is as valid), and while the low window is known to be full the
    /// tree is not searched there. Measured on `lab iova-aging --quick`
    /// with the window full, the Linux search cost ours ~20 % of its
    /// throughput.
    #[inline(always)]
    pub fn alloc_low_first(&mut self, pages: u64, low: u64, limit: u64) -> Result<u64, IovaError> {
        let limit = limit.min(self.end_pfn);
        let low = if low < self.start_pfn { limit } else { low };
        self.alloc_within_as::<true>(pages, low.min(limit), limit)
    }

    /// [`alloc_low_first`](Self::alloc_low_first) for limits already
    /// clamped: `low <= limit <= end_pfn`, as a [`DmaDevice`]'s are from
    /// its attach (two instructions a map fewer, measured by `bench dma
    /// --instructions`). Broken, the bound still holds: a block never
    /// ends past `low` or `limit`, whichever the search was for, and
    /// every pop checks it.
    ///
    /// [`DmaDevice`]: crate::dma::DmaDevice
    #[inline(always)]
    pub(crate) fn alloc_within(
        &mut self,
        pages: u64,
        low: u64,
        limit: u64,
    ) -> Result<u64, IovaError> {
        // The DMA layer's caches hold no owner slot: its blocks are
        // stored without owner bits, two instructions a map fewer.
        self.alloc_within_as::<false>(pages, low, limit)
    }

    /// [`alloc_within`](Self::alloc_within); a block from a magazine names
    /// this cache as its owner if `OWNED` (see `owner.rs`).
    #[inline(always)]
    fn alloc_within_as<const OWNED: bool>(
        &mut self,
        pages: u64,
        low: u64,
        limit: u64,
    ) -> Result<u64, IovaError> {
        // A zero (or absurd) count is order 64: past `max_order`, so
        // `check_request` refuses it with its exact error.
        let order = super::order_hint(pages);
        if order > self.max_order || low < self.start_pfn {
            self.domain.check_request(pages, low)?;
        }
        // No look at the flush epoch here, as in `alloc_in`: the slow path
        // below looks.
        if let Some(mut class) = self.classes.hot(order) {
            let mut got = class.pop_top_within(low);
            if got.is_none() && self.recycle_any && low < limit {
                got = class.pop_top_within(limit);
            }
            if let Some(pfn) = got {
                if OWNED {
                    let live = class.live();
                    self.put_word(pfn, live);
                } else {
                    self.set_state(pfn, state(LIVE, order));
                }
                return Ok(pfn);
            }
        }
        self.alloc_low_first_slow(order, pages, low, limit)
    }

    #[cold]
    fn alloc_low_first_slow(
        &mut self,
        order: u32,
        pages: u64,
        low: u64,
        limit: u64,
    ) -> Result<u64, IovaError> {
        self.check_epoch();
        let limit = limit.min(self.end_pfn);
        let low = low.min(limit);
        // One try only (no preference, or none left: the window is known
        // to be full): the caches are given back if the tree has no room.
        // The full-window memo is consulted only here, where the caller
        // has a higher fallback; a caller without one searches its caches.
        if low >= limit || self.domain.low_window_full(order, low) {
            return self.alloc_in::<true>(pages, limit);
        }
        let first = if self.domain.params().flush_on_low_miss {
            // Linux before v4.15: the 32-bit try flushes every cache first.
            self.alloc_in::<true>(pages, low)
        } else if (order as usize) < self.classes.len() {
            let last_start = (low + 1).saturating_sub(1 << order);
            self.alloc_slow::<false>(order, low, last_start)
        } else {
            self.tree_alloc::<false>(order, low)
        };
        match first {
            Err(IovaError::NoSpace { .. }) if low < limit => self.alloc_in::<true>(pages, limit),
            r => r,
        }
    }

    #[inline(always)]
    fn alloc_in<const GIVE_BACK: bool>(
        &mut self,
        pages: u64,
        limit_pfn: u64,
    ) -> Result<u64, IovaError> {
        // A zero (or absurd) count is order 64, which no class serves: the
        // miss path refuses it (`check_request`) with its exact error.
        let order = super::order_hint(pages);
        // No look at the flush epoch: a block the loaded magazine hands
        // out serves the space as well as one given back would. A flush
        // asked for is seen at the next free or miss (after the request's
        // checks: a refused call changes nothing).
        if let Some(mut class) = self.classes.hot(order) {
            // The whole block must end at or below the limit, not only
            // start there: cached blocks are checked by their start
            // against this. (No block of an order past the domain's, nor
            // one below its first frame, is ever cached, so a pop finds a
            // block only for a request `check_request` passes; the miss
            // path checks it.)
            if let Some(pfn) = class.pop_top_within(limit_pfn) {
                let live = class.live();
                if let Some(c) = self.pair_cell(pfn) {
                    c.put(live);
                }
                return Ok(pfn);
            }
        }
        self.alloc_miss::<GIVE_BACK>(order, pages, limit_pfn)
    }

    /// [`alloc_in`](Self::alloc_in) past the loaded magazine's top: the
    /// request checked (the domain builds the precise error), then the
    /// rest of the cache and the tree.
    #[cold]
    #[inline(never)]
    fn alloc_miss<const GIVE_BACK: bool>(
        &mut self,
        order: u32,
        pages: u64,
        limit_pfn: u64,
    ) -> Result<u64, IovaError> {
        if order > self.max_order || limit_pfn < self.start_pfn {
            self.domain.check_request(pages, limit_pfn)?;
        }
        let limit = limit_pfn.min(self.end_pfn);
        self.check_epoch();
        if (order as usize) < self.classes.len() {
            return self.alloc_slow::<GIVE_BACK>(order, limit, last_start(limit, order));
        }
        self.tree_alloc::<GIVE_BACK>(order, limit)
    }

    /// The loaded magazine's top was not at or below `last_start`. As in
    /// Linux, the rest of it is searched, and `prev` and then the depot
    /// are tried only for an empty loaded magazine: one that holds blocks
    /// only above a caller's limit sends that caller to the tree, and the
    /// depot is not stirred for it.
    #[cold]
    fn alloc_slow<const GIVE_BACK: bool>(
        &mut self,
        order: u32,
        limit: u64,
        last_start: u64,
    ) -> Result<u64, IovaError> {
        self.drop_bias_if_revoked();
        let mut class = self.classes.at(order);
        let mut pfn = class.loaded.pop_scan(last_start);
        let mut both_empty = false;
        if pfn.is_none() && class.loaded.is_empty() {
            if !class.prev.is_empty() {
                let ClassMut { loaded, prev, .. } = &mut *class;
                std::mem::swap(loaded, prev);
                pfn = class.loaded.pop_below(last_start);
            } else if let Some(full) = self.domain.depot_pop(order, self.shared.id) {
                // The empty loaded magazine is dropped, as Linux frees it.
                class.loaded = full;
                pfn = class.loaded.pop_below(last_start);
            } else {
                both_empty = true;
            }
        }
        // Published (the guard), before the paths below look again.
        drop(class);
        match pfn {
            Some(pfn) => {
                self.set_live(pfn, order);
                Ok(pfn)
            }
            None => {
                self.misses += 1;
                if both_empty {
                    if let Some(pfn) = self.refill(order, limit) {
                        return Ok(pfn);
                    }
                }
                self.tree_alloc::<GIVE_BACK>(order, limit)
            }
        }
    }

    /// Refills the empty magazines of `order` from one tree chunk (ours
    /// only) and returns the first block. One tree operation serves a
    /// whole magazine (two, for magazines smaller than half a chunk's
    /// blocks), and a thread's IOVAs sit together, so their state words
    /// share cache lines only with each other.
    fn refill(&mut self, order: u32, limit: u64) -> Option<u64> {
        let mag = self.domain.params().magazine_size as u64;
        let mut class = self.classes.at(order);
        if !class.loaded.is_empty() || !class.prev.is_empty() {
            return None;
        }
        // As many blocks as both magazines hold, from at most one chunk
        // (with ours, magazines of 128 and chunks of up to 128 pages: one
        // magazine's worth for order 0, fewer above).
        let fit = (2 * mag).max(1).ilog2();
        let chunk = REFILL_CHUNK_ORDER.min(order + fit).max(order);
        let start = self.domain.alloc_chunk(order, chunk, limit)?;
        let n = 1u64 << (chunk - order);
        // Hand out the highest block and push the rest low to high (the
        // lowest into `prev` if they overflow `loaded`), so that blocks keep
        // coming top-down, as from the tree.
        let into_prev = (n - 1).saturating_sub(mag);
        for i in 0..n - 1 {
            let pfn = start + (i << order);
            if i < into_prev {
                class.prev.push(pfn);
            } else {
                class.loaded.push(pfn);
            }
        }
        drop(class);
        let top = start + ((n - 1) << order);
        self.set_live(top, order);
        Some(top)
    }

    /// The tree path; on exhaustion this cache is flushed first.
    #[cold]
    fn tree_alloc<const GIVE_BACK: bool>(
        &mut self,
        order: u32,
        limit: u64,
    ) -> Result<u64, IovaError> {
        let domain = self.domain.clone();
        if GIVE_BACK {
            domain.alloc_from_tree(order, limit, Some(&mut || self.flush()))
        } else {
            domain.try_alloc_from_tree(order, limit)
        }
    }

    /// Frees a block: `pfn` and the `pages` it was allocated with.
    ///
    /// The common case inline: a live block of a cached order into a
    /// loaded magazine with room, its state word found once and claimed
    /// (live to cached): by a load and a store if this cache handed the
    /// block out and still holds its owner slot, else by one
    /// compare-exchange. Of two threads freeing the same block at once
    /// exactly one frees it and the other gets
    /// [`IovaError::NotAllocated`], as a double free one after the other
    /// does (the first exchange that meets an owner's block revokes the
    /// owner's slot: about 12 µs once, with other threads running; see
    /// the module `owner`). Everything else out of line.
    #[inline(always)]
    pub fn free(&mut self, pfn: u64, pages: u64) -> Result<(), IovaError> {
        // A zero (or absurd) count is order 64, which no class serves: the
        // path out of line refuses it with the exact error (`ZeroSize` from
        // `order_of`, else the domain's reason for that block).
        let order = super::order_hint(pages);
        // A flush asked for reaches this path through the owner slot's
        // ring (`owner.rs`), which the plain free reads anyway: the free
        // then takes the exchange and the checking path below, which
        // flushes before placing the block. Without a slot, every free
        // takes that path. A cached order is at most `MAX_CACHED_ORDER`,
        // so the state word below holds the order whole.
        if let Some(mut class) = self.classes.hot(order) {
            // SAFETY: as in `pair_cell` (the fields are borrowed apart so
            // that the word stays in hand for the store below).
            if let Some(c) =
                unsafe { word_of(&self.flat, &mut self.live_cur, &self.domain.live, pfn) }
            {
                // Room first, then the claim: a claimed block always finds
                // its place, and a refused one changed nothing.
                match class.free_into(self.owner, &self.domain.owners, c, pfn, order) {
                    Some(true) => return Ok(()),
                    Some(false) => return self.free_claimed(pfn, order),
                    None => {}
                }
            }
        }
        self.free_pages_other(pfn, pages)
    }

    /// [`free`](Self::free) of a block its exchange claimed: a revoked
    /// slot given up, a flush asked for run (`check_epoch`), then the
    /// block placed.
    #[inline(never)]
    fn free_claimed(&mut self, pfn: u64, order: u32) -> Result<(), IovaError> {
        self.drop_bias_if_revoked();
        self.free_checked(pfn, order)
    }

    /// [`free`](Self::free) out of line: a count of 0 refused
    /// (`order_of`), then [`free_other`](Self::free_other).
    #[inline(never)]
    fn free_pages_other(&mut self, pfn: u64, pages: u64) -> Result<(), IovaError> {
        let order = super::order_of(pages)?;
        self.free_other(pfn, order)
    }

    /// [`free`](Self::free) of anything but the common case: the block
    /// claimed as the fast path claims it (a refusal named by the domain,
    /// which builds the precise error), then a flush asked for, a full
    /// magazine, an uncached order or an unclaimed chunk.
    #[inline(never)]
    fn free_other(&mut self, pfn: u64, order: u32) -> Result<(), IovaError> {
        self.drop_bias_if_revoked();
        let (owner, me) = (self.owner, self.owner_bits());
        // SAFETY: as in `live_cell` (the fields borrowed apart).
        let claimed = order < 64
            && unsafe { self.live_cur.cell(&self.domain.live, pfn) }
                .is_some_and(|c| claim_own(owner, me, &self.domain.owners, c, order));
        if !claimed {
            return Err(self.domain.free_error(pfn, order));
        }
        self.free_checked(pfn, order)
    }

    /// Frees every `(pfn, pages)` of `blocks`, as [`free`](Self::free)
    /// does one by one (each block claimed on its own, plainly or by
    /// exchange as `free` claims it, each refusal the same error), with
    /// the state of the blocks a few places ahead already on its way into
    /// the cache (a flush queue's batch, a scatter list's unmap). The flush
    /// epoch is checked at the start of the batch, and again only where a
    /// block's free finds a flush asked for meanwhile (as `free` does).
    /// Every block is tried; the first error is returned.
    pub fn free_all(&mut self, blocks: &[(u64, u64)]) -> Result<(), IovaError> {
        self.check_epoch();
        let mut result = Ok(());
        for (i, &(pfn, pages)) in blocks.iter().enumerate() {
            if let Some(&(ahead, _)) = blocks.get(i + PREFETCH_AHEAD) {
                self.domain.live.prefetch(ahead);
            }
            let r = match super::order_of(pages) {
                Ok(order) if self.free_quiet(pfn, order) => Ok(()),
                Ok(order) => self.free_other(pfn, order),
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                result = result.and(Err(e));
            }
        }
        result
    }

    /// The common case of a free, with no epoch check (the batch makes
    /// it): a live block of a cached order claimed into a loaded magazine
    /// with room (a block the exchange claimed goes the checking way,
    /// `free_claimed`). `false`: nothing done, the general path must take
    /// it.
    #[inline(always)]
    fn free_quiet(&mut self, pfn: u64, order: u32) -> bool {
        let Some(mut class) = self.classes.hot(order) else {
            return false;
        };
        // SAFETY: as in `free`.
        let freed = unsafe { self.live_cur.cell(&self.domain.live, pfn) }
            .and_then(|c| class.free_into(self.owner, &self.domain.owners, c, pfn, order));
        match freed {
            Some(true) => true,
            // Claimed: placed now (it cannot fail: the block is ours).
            Some(false) => self.free_claimed(pfn, order).is_ok(),
            None => false,
        }
    }

    /// Allocates a block for every `(pfn, pages)` of `blocks` at or below
    /// `limit_pfn`, writing each block's first frame into its `pfn`, as
    /// [`alloc`](Self::alloc) does one by one (a scatter list's map). The
    /// flush epoch is checked once for the batch, not per block. All or
    /// nothing: on an error, the blocks
    /// this call allocated are freed again (the `pfn`s written are then
    /// meaningless) and the first error is returned.
    pub fn alloc_all(
        &mut self,
        blocks: &mut [(u64, u64)],
        limit_pfn: u64,
    ) -> Result<(), IovaError> {
        self.check_epoch();
        for i in 0..blocks.len() {
            let pages = blocks[i].1;
            let got = match super::order_of(pages) {
                Ok(order) => match self.pop_quiet(order, limit_pfn) {
                    Some(pfn) => Ok(pfn),
                    None => self.alloc_miss::<true>(order, pages, limit_pfn),
                },
                Err(e) => Err(e),
            };
            match got {
                Ok(pfn) => blocks[i].0 = pfn,
                Err(e) => {
                    for &(pfn, pages) in &blocks[..i] {
                        // Live and ours (allocated just above): cannot fail.
                        let _ = self.free(pfn, pages);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The common case of an alloc, with no epoch check (the batch makes
    /// it): the loaded magazine's top, if it ends at or
    /// below `limit`, marked live.
    #[inline(always)]
    fn pop_quiet(&mut self, order: u32, limit: u64) -> Option<u64> {
        let pfn = self.classes.hot(order)?.pop_top_within(limit)?;
        self.set_live(pfn, order);
        Some(pfn)
    }

    /// Frees a block its user retired with [`IovaDomain::retire_block`],
    /// once the flush that covers it has completed.
    #[inline]
    pub fn free_retired(&mut self, pfn: u64, pages: u64) -> Result<(), IovaError> {
        let order = super::order_of(pages)?;
        // One compare-exchange checks the block is retired and claims it
        // (cached from here on); a block in any other state is refused,
        // with the precise reason.
        if order >= 64
            || self
                .move_state(pfn, state(RETIRED, order), state(CACHED, order))
                .is_err()
        {
            return Err(self.domain.retired_error(pfn, order));
        }
        self.check_epoch();
        self.place(pfn, order);
        Ok(())
    }

    /// [`free_retired`](Self::free_retired) of every `(pfn, pages)` that
    /// `block` reads from `blocks`, as a flush frees its batch (the state
    /// of the blocks a few places ahead already on its way into the
    /// cache): the epoch is checked once for the batch, not per block, and
    /// a run of blocks of one cached order goes
    /// straight into the loaded magazine's free room (one class lookup and
    /// one room check per run; each block still moves from retired to
    /// cached with its own compare-exchange, so a block in any other state
    /// is refused as `free_retired` refuses it). Every block is tried; the
    /// first error is returned.
    pub(crate) fn free_retired_all<T>(
        &mut self,
        blocks: &[T],
        block: impl Fn(&T) -> (u64, u64),
    ) -> Result<(), IovaError> {
        self.check_epoch();
        let flat = self.domain.live.is_flat();
        let mut result = Ok(());
        let mut i = 0;
        while let Some(b) = blocks.get(i) {
            let (pfn, pages) = block(b);
            let n = match super::order_of(pages) {
                Ok(order) => self.free_retired_run(&blocks[i..], &block, order, flat),
                Err(_) => 0,
            };
            if n == 0 {
                // Not cached by order, a full magazine, or a block not
                // retired: one block the general way (its error kept).
                if flat {
                    if let Some(ahead) = blocks.get(i + PREFETCH_AHEAD) {
                        self.domain.live.prefetch(block(ahead).0);
                    }
                }
                if let Err(e) = self.free_retired_one(pfn, pages) {
                    result = result.and(Err(e));
                }
                i += 1;
            } else {
                i += n;
            }
        }
        result
    }

    /// The fast part of [`free_retired_all`](Self::free_retired_all): moves
    /// the blocks at the head of `run` that are of `order` (a cached one),
    /// retired, and fit in the loaded magazine's room, into it; returns how
    /// many (0: the first did not qualify, and is left to the caller).
    #[inline]
    fn free_retired_run<T>(
        &mut self,
        run: &[T],
        block: &impl Fn(&T) -> (u64, u64),
        order: u32,
        flat: bool,
    ) -> usize {
        let Self {
            domain,
            classes,
            live_cur,
            ..
        } = self;
        let Some(mut class) = classes.guard(order) else {
            return 0;
        };
        let (retired, to) = (state(RETIRED, order), state(CACHED, order));
        // The run written straight into the magazine's free slots (one
        // bound for both), its length updated once.
        let room = class.loaded.spare();
        let mut n = 0;
        for (b, dst) in run.iter().zip(room.iter_mut()) {
            if flat {
                if let Some(ahead) = run.get(n + PREFETCH_AHEAD) {
                    domain.live.prefetch(block(ahead).0);
                }
            }
            // The block's size is checked by the exchange: its state word
            // holds its order, which must be the run's (a block of another
            // order ends the run, left to the general path).
            let (pfn, _) = block(b);
            // SAFETY: `live_cur` is only ever used with this domain's
            // state map. AcqRel (`claim`): as `LiveMap::compare_exchange`.
            // A retired block carries no tag: one exchange of the whole
            // word (one that does not match is left to the general path).
            let moved = unsafe { live_cur.cell(&domain.live, pfn) }
                .is_some_and(|c| c.claim(retired.into(), to.into()).is_ok());
            if !moved {
                break;
            }
            *dst = pfn;
            n += 1;
        }
        class.loaded.commit(n);
        n
    }

    /// One block of `free_retired_all` (no epoch check).
    #[inline]
    fn free_retired_one(&mut self, pfn: u64, pages: u64) -> Result<(), IovaError> {
        let order = super::order_of(pages)?;
        if order >= 64
            || self
                .move_state(pfn, state(RETIRED, order), state(CACHED, order))
                .is_err()
        {
            return Err(self.domain.retired_error(pfn, order));
        }
        self.place(pfn, order);
        Ok(())
    }

    /// Puts a block this thread has claimed (its state word moved from
    /// live to cached) into this cache, or the tree.
    #[inline]
    fn free_checked(&mut self, pfn: u64, order: u32) -> Result<(), IovaError> {
        self.check_epoch();
        self.place(pfn, order);
        Ok(())
    }

    /// Places a block this thread claimed (cached in its state word): on
    /// the loaded magazine of its class, else the slow way (a full
    /// magazine), else the tree (an order no class serves).
    #[inline]
    fn place(&mut self, pfn: u64, order: u32) {
        match self.classes.hot(order).map(|mut c| c.push(pfn)) {
            Some(true) => {}
            Some(false) => self.free_slow(pfn, order),
            None => self.domain.free_to_tree(pfn, order),
        }
    }

    #[cold]
    fn free_slow(&mut self, pfn: u64, order: u32) {
        self.drop_bias_if_revoked();
        let size = self.domain.params().magazine_size;
        let mut class = self.classes.at(order);
        if !class.prev.is_full() {
            let ClassMut { loaded, prev, .. } = &mut *class;
            std::mem::swap(loaded, prev);
        } else {
            let full = std::mem::replace(&mut class.loaded, Magazine::new(size));
            match self.domain.depot_push(order, self.shared.id, full) {
                Ok(()) => {}
                Err((mut full, WhenFull::FreeMagazine)) => {
                    self.domain.free_magazine(&mut full, order);
                }
                Err((full, WhenFull::FlushAllCaches)) => {
                    // Put the magazine back, send this IOVA to the tree and
                    // have every CPU cache flushed (seed 004's fix).
                    class.loaded = full;
                    drop(class);
                    self.domain.free_to_tree(pfn, order);
                    self.domain.request_cpu_flush();
                    self.flush();
                    return;
                }
            }
        }
        class.loaded.push(pfn);
        drop(class);
        self.set_state(pfn, state(CACHED, order));
    }

    /// Gives every IOVA this cache holds back to the tree.
    pub fn flush(&mut self) {
        // A ring now answered (the epoch is read below, after it).
        self.owner.take_ring();
        for order in 0..self.classes.len() as u32 {
            let mut class = self.classes.at(order);
            self.domain.free_magazine(&mut class.loaded, order);
            self.domain.free_magazine(&mut class.prev, order);
        }
        self.epoch = self.domain.flush_epoch.load(Relaxed);
    }
}

/// A free's claim on the live block of `order` whose state word is `c`:
/// the owner's plain free if the word carries `me` (the cache's owner bits,
/// `owner` its slot), else the compare-exchange (`claim_for_free`). True:
/// the block is the caller's, cached; false: nothing changed.
#[inline(always)]
pub(super) fn claim_own(
    owner: OwnerRef,
    me: u64,
    owners: &Owners,
    c: &impl ClaimWord,
    order: u32,
) -> bool {
    let (live, cached) = free_words(order, me);
    owner.free(c, live, cached) || claim_for_free(c, order, owners, me).is_ok()
}

/// The highest start a cached block of `order` may have to end at or below
/// `limit`: `limit + 1 - 2^order`, 0 when the block cannot fit (a pop then
/// takes nothing, as no block starts at frame 0), with no overflow for any
/// `limit`.
#[inline(always)]
fn last_start(limit: u64, order: u32) -> u64 {
    limit.saturating_sub((1 << order) - 1)
}

impl Drop for IovaCpuCache {
    fn drop(&mut self) {
        self.flush();
        if self.owner_slot != 0 {
            self.domain.owners.release(self.owner_slot);
        }
        self.domain.cache_dropped();
    }
}
