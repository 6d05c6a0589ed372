//! One 64-bit word per page frame of the domain. Its low 16 bits are the
//! frame's state: which block starts there, of what order, whether it is
//! held by a user or by a cache, and for a held block, what kind of mapping
//! holds it (a streaming mapping, a scatter list, a coherent buffer), so
//! that an unmap of one kind cannot retire a block of another. Bits 16..31
//! of a live block name the owner slot of the cache that handed it out,
//! if it held one (`owner.rs`: the slot's holder, which may be a later
//! cache, frees such blocks without a read-modify-write); every other word
//! has them 0. Its high 32 bits are the block holder's tag (the DMA
//! layer's record of the exact bytes a mapping covers, its device and
//! direction): in the same word, so
//! that one compare-exchange checks an unmap's block, size, kind and tag
//! together and retires it.
//!
//! At a block's first frame only a live block carries a tag: every
//! allocation stores its state with tag 0, every change of state (a kind
//! taken off, a retire, a free) clears it, and a tag store keeps the
//! state bits it finds. A tag is stored by a
//! load and a store only where no other thread can change the word
//! meanwhile; a block some unmap could retire is tagged by one
//! compare-exchange (the DMA layer's scatter lists). A scatter list also
//! tags the frames inside its block, whose state bits are 0: those tags
//! stay behind when the block is freed, and nothing compares them (a
//! block that later starts there stores its word whole).
//!
//! This is what lets a free through the per-CPU cache, which never touches
//! the tree, still refuse a double free, a free of something never
//! allocated, or a free with the wrong size. Only the first page of a block
//! has a state; blocks are size aligned, so the block holding any page is
//! found by checking the O(log) aligned candidates below it.
//!
//! The words live in one lazily committed `mmap` reservation when the
//! process can have it (a 48-bit domain reserves 512 GiB of address space;
//! only pages near live IOVAs are committed). Where it cannot (valgrind,
//! which `bench dma --iters` is for, refuses that much; a VMM with very
//! many domains runs out of address space), the map falls back to chunks
//! of 16 MiB (2^21 frames, 8 GiB of IOVA space), each reserved the first time
//! the tree hands out a block there (a slow path, under the tree's lock),
//! so the hot paths never allocate; an access then costs one more load
//! (the chunk's base). A per-CPU cache reaches the words through a
//! [`Cursor`] of its own (the flat map, or the chunk it last used): a
//! subtraction and a compare per access, in either form. Access is relaxed
//! atomic loads and stores (plain moves), but for the transitions two
//! threads may race on, which are one successful compare-exchange each (a
//! tagged word tried a second time with its tag): a free's
//! claim (live to cached, [`claim_for_free`]), so that of two threads
//! freeing the *same* IOVA at the same instant exactly one frees it and
//! the other is refused as a double free; an unmap's retire
//! ([`IovaDomain::retire_block`]); a retired block's free. An alloc's
//! store stays plain: the block it marks live is its own cache's.
//!
//! [`IovaDomain::retire_block`]: super::IovaDomain::retire_block

use std::ptr::null_mut;
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::Mutex;

use super::owner::Owners;
use crate::mem::{MemError, Reservation};

/// The block starting here is held by a user (bits 0..6 = order).
pub(crate) const LIVE: u16 = 0x40;
/// The block starting here sits in a per-CPU cache or the depot.
pub(crate) const CACHED: u16 = 0x80;
/// The block starting here was released by its user but is not free yet:
/// a deferred unmap's IOVA, waiting for the flush that makes it reusable.
pub(crate) const RETIRED: u16 = LIVE | CACHED;
/// A state's order bits.
pub(crate) const ORDER_MASK: u16 = 0x3f;
/// Bits 8 and 9 of a live block: the kind of mapping that holds it (0: a
/// streaming mapping, or a block the allocator's own callers hold; see
/// `BlockKind`). Cached and retired blocks carry no kind.
pub(crate) const KIND_SHIFT: u32 = 8;
/// The flags that say where a block is (live, cached, retired).
const WHERE_MASK: u16 = LIVE | CACHED;
/// Where a word's tag starts.
const TAG_SHIFT: u32 = 32;

/// Frames per chunk of the map, as a shift.
const CHUNK_SHIFT: u32 = 21;
/// The most chunks a map may have (2^41 frames: an 8 PiB IOVA space).
const MAX_CHUNKS: u64 = 1 << 20;

/// An atomic word a [`WordMap`] holds per frame.
pub(crate) trait Word: Sized {
    /// The word's value type.
    type V: Copy + Default;
    /// The word's size in bytes.
    const BYTES: u64;
    /// The atomic at `p`.
    ///
    /// # Safety
    /// `p` is aligned for `Self`, lies in memory that lives for `'a`, and
    /// is accessed only atomically.
    unsafe fn at<'a>(p: *mut u8) -> &'a Self;
    /// A relaxed load.
    fn get(&self) -> Self::V;
    /// A relaxed store.
    fn put(&self, v: Self::V);
}

impl Word for AtomicU64 {
    type V = u64;
    const BYTES: u64 = 8;
    unsafe fn at<'a>(p: *mut u8) -> &'a Self {
        // SAFETY: the caller's contract.
        unsafe { AtomicU64::from_ptr(p.cast()) }
    }
    #[inline(always)]
    fn get(&self) -> u64 {
        self.load(Relaxed)
    }
    #[inline(always)]
    fn put(&self, v: u64) {
        self.store(v, Relaxed)
    }
}

/// The state map of one domain: a [`WordMap`] of state-and-tag words.
pub(crate) type LiveMap = WordMap<AtomicU64>;

/// One atomic word per page frame of a domain, lazily committed.
#[derive(Debug)]
pub(crate) struct WordMap<W> {
    /// The whole map as one reservation, when the process could reserve
    /// it: then an access is base + pfn, with no chunk to look up.
    flat: Option<Reservation>,
    /// `flat`'s base, or null: read on every access.
    flat_base: *mut u8,
    /// Otherwise: each chunk's first byte, null until claimed (one more
    /// load per access; the reservations themselves sit in `owned`).
    chunks: Box<[AtomicPtr<u8>]>,
    owned: Mutex<Vec<Reservation>>,
    len: u64,
    word: std::marker::PhantomData<W>,
}

// SAFETY: `flat_base` points into `flat`, which the map owns; every access
// through it is atomic, as for the chunks.
unsafe impl<W> Send for WordMap<W> {}
// SAFETY: as above.
unsafe impl<W> Sync for WordMap<W> {}

impl<W: Word> WordMap<W> {
    /// A map for frames `0..=end_pfn`: one flat reservation if the process
    /// can have it, else chunks reserved on first use.
    pub(crate) fn new(end_pfn: u64) -> Result<Self, MemError> {
        let mut m = Self::chunked(end_pfn)?;
        if let Ok(r) = Reservation::new(m.len.saturating_mul(W::BYTES)) {
            r.prefer_huge_pages();
            m.flat_base = r.base().cast();
            m.flat = Some(r);
            m.chunks = Box::new([]);
        }
        Ok(m)
    }

    /// A map for frames `0..=end_pfn` in chunks; none is reserved yet.
    pub(crate) fn chunked(end_pfn: u64) -> Result<Self, MemError> {
        let len = end_pfn.saturating_add(1);
        let n = len.div_ceil(1 << CHUNK_SHIFT);
        if n > MAX_CHUNKS {
            return Err(MemError::Reserve {
                len,
                errno: libc::EOVERFLOW,
            });
        }
        Ok(Self {
            flat: None,
            flat_base: null_mut(),
            chunks: (0..n).map(|_| AtomicPtr::new(null_mut())).collect(),
            owned: Mutex::new(Vec::new()),
            len,
            word: std::marker::PhantomData,
        })
    }

    #[inline(always)]
    fn cell(&self, pfn: u64) -> Option<&W> {
        if pfn >= self.len {
            return None;
        }
        if !self.flat_base.is_null() {
            // SAFETY: `pfn < len` words, the flat reservation's length in
            // words (`BYTES * len` bytes, page aligned, so every word is
            // aligned); the word lives as long as `self`, and every access
            // to it is atomic.
            return Some(unsafe { W::at(self.flat_base.add((pfn * W::BYTES) as usize)) });
        }
        // SAFETY: `pfn < len`, checked above.
        unsafe { self.chunk_cell(pfn) }
    }

    /// (Inlined, like the flat path: it is the path valgrind runs, where
    /// the flat reservation is refused, and instruction counts taken there
    /// should not pay a call per access.)
    ///
    /// # Safety
    /// `pfn < self.len`.
    #[inline]
    unsafe fn chunk_cell(&self, pfn: u64) -> Option<&W> {
        // Acquire: pairs with the claim's Release, so the chunk's mapping is
        // seen whole (it is fresh zeroed memory either way).
        let i = (pfn >> CHUNK_SHIFT) as usize;
        debug_assert!(i < self.chunks.len());
        // SAFETY: `pfn < len` (the contract), and `chunks` has
        // `len.div_ceil(2^CHUNK_SHIFT)` entries (`chunked`; a flat map,
        // with none, never gets here), so `i` is in bounds.
        let base = unsafe { self.chunks.get_unchecked(i) }.load(Acquire);
        if base.is_null() {
            return None;
        }
        let off = (pfn & ((1 << CHUNK_SHIFT) - 1)) as usize;
        // SAFETY: `base` is a live, page-aligned reservation of
        // 2^CHUNK_SHIFT words owned by `owned` until `self` drops, and `off`
        // is below that length; every access to the word is atomic.
        Some(unsafe { W::at(base.add(off * W::BYTES as usize)) })
    }

    /// The flat reservation's first word and its length in words, or
    /// null and 0 for a chunked map: a caller that keeps both reaches the
    /// word of any `pfn < len` as `base + pfn` (see [`FlatWords`]).
    pub(crate) fn flat_words(&self) -> FlatWords<W> {
        FlatWords {
            base: self.flat_base.cast(),
            len: if self.flat_base.is_null() {
                0
            } else {
                self.len
            },
        }
    }

    /// Whether the map is one flat reservation (where
    /// [`prefetch`](Self::prefetch) does anything).
    #[inline(always)]
    pub(crate) fn is_flat(&self) -> bool {
        !self.flat_base.is_null()
    }

    /// Starts bringing the state word of `pfn` into the cache: a hint, for
    /// the flat map only (a chunked map's lookup would cost more than the
    /// hint saves). The address is only computed (`wrapping_add`, no bounds
    /// needed) and handed to a prefetch, which never faults.
    #[inline(always)]
    pub(crate) fn prefetch(&self, pfn: u64) {
        if !self.flat_base.is_null() {
            crate::mem::prefetch::prefetch(self.flat_base.wrapping_add((pfn * W::BYTES) as usize));
        }
    }

    /// The raw word at `pfn` (0 when out of range or never claimed).
    #[inline]
    pub(crate) fn get(&self, pfn: u64) -> W::V {
        self.cell(pfn).map_or_else(W::V::default, |c| c.get())
    }

    /// Sets the word at `pfn`, whose chunk a [`claim`](Self::claim) made
    /// (every block a cache holds came from the tree, which claims). An
    /// unclaimed word is left as it is (it reads as 0).
    #[inline]
    pub(crate) fn set(&self, pfn: u64, v: W::V) {
        if let Some(c) = self.cell(pfn) {
            c.put(v);
        }
    }

    /// Sets the word at `pfn`, reserving its chunk first if need be: the
    /// tree's paths call this when they hand out a block.
    pub(crate) fn claim(&self, pfn: u64, v: W::V) -> Result<(), MemError> {
        self.claim_chunk(pfn)?;
        self.set(pfn, v);
        Ok(())
    }

    /// Reserves the chunk holding `pfn` if it is not yet (nothing to do
    /// for a flat map, or for a frame out of range).
    fn claim_chunk(&self, pfn: u64) -> Result<(), MemError> {
        if !self.flat_base.is_null() {
            return Ok(());
        }
        if let Some(slot) = self.chunks.get((pfn >> CHUNK_SHIFT) as usize) {
            if slot.load(Acquire).is_null() {
                let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
                // Re-checked under the lock: one reservation per chunk.
                if slot.load(Acquire).is_null() {
                    let r = Reservation::new(W::BYTES << CHUNK_SHIFT)?;
                    slot.store(r.base(), Release);
                    owned.push(r);
                }
            }
        }
        Ok(())
    }
}

/// A flat [`WordMap`]'s words, kept by a caller beside the map: a word
/// found with one compare and one scaled add (no window to subtract, as a
/// [`Cursor`] does). Empty (0 words) for a chunked map.
#[derive(Debug)]
pub(crate) struct FlatWords<W> {
    base: *const W,
    len: u64,
}

// SAFETY: plain data; the pointer is only dereferenced through `get`, which
// borrows the map it came from, and the words are atomics.
unsafe impl<W> Send for FlatWords<W> {}
// SAFETY: as above.
unsafe impl<W> Sync for FlatWords<W> {}

impl<W: Word> FlatWords<W> {
    /// The word of `pfn` in `map`, if `map` is flat and holds it.
    ///
    /// # Safety
    /// `self` came from `map`'s [`WordMap::flat_words`].
    #[inline(always)]
    pub(crate) unsafe fn get<'m>(&self, map: &'m WordMap<W>, pfn: u64) -> Option<&'m W> {
        debug_assert!(self.len == 0 || std::ptr::eq(self.base.cast(), map.flat_base));
        if pfn < self.len {
            // SAFETY: `pfn < len`, the flat reservation's length in words
            // (`WordMap::cell`'s flat case), of `map` (the contract), which
            // lives for `'m`.
            return Some(unsafe { &*self.base.add(pfn as usize) });
        }
        None
    }
}

/// A thread's window on one [`WordMap`]: the frames one base pointer
/// reaches (the whole map when it is flat, else the chunk last used),
/// kept by the caller so that repeated accesses near each other skip the
/// map's lookup (its bounds, its form, the chunk's pointer): a
/// subtraction and a compare. A per-CPU cache keeps one per map it
/// touches on its hot paths.
#[derive(Debug)]
pub(crate) struct Cursor<W> {
    /// The word of frame `lo`; null until filled.
    base: *mut u8,
    lo: u64,
    /// Frames from `lo` that `base` reaches (0: none).
    span: u64,
    word: std::marker::PhantomData<W>,
}

// SAFETY: the pointer is only dereferenced through `cell`, whose contract
// keeps the map it points into alive; the words are atomics.
unsafe impl<W> Send for Cursor<W> {}
// SAFETY: a shared cursor is plain data: nothing reachable through `&self`
// dereferences the pointer (`cell` takes `&mut self`).
unsafe impl<W> Sync for Cursor<W> {}

impl<W: Word> Default for Cursor<W> {
    fn default() -> Self {
        Self {
            base: null_mut(),
            lo: 0,
            span: 0,
            word: std::marker::PhantomData,
        }
    }
}

impl<W: Word> Cursor<W> {
    /// The word of `pfn` in `map`, as [`WordMap`]'s own lookup finds it
    /// (`None`: out of range, or a chunk never claimed).
    ///
    /// # Safety
    /// Every call on one cursor passes the same `map`.
    #[inline(always)]
    pub(crate) unsafe fn cell<'m>(&mut self, map: &'m WordMap<W>, pfn: u64) -> Option<&'m W> {
        let off = pfn.wrapping_sub(self.lo);
        if off < self.span {
            // SAFETY: `base` reaches `span` words of `map` from `lo` (set by
            // `refill` from this same map, the contract), which live as
            // long as `map`; every access is atomic.
            return Some(unsafe { W::at(self.base.add((off * W::BYTES) as usize)) });
        }
        self.refill(map, pfn)
    }

    /// Points the cursor at the part of `map` holding `pfn`, if it exists.
    #[inline(never)]
    fn refill<'m>(&mut self, map: &'m WordMap<W>, pfn: u64) -> Option<&'m W> {
        if pfn >= map.len {
            return None;
        }
        let (lo, span) = if map.flat_base.is_null() {
            let lo = pfn & !((1 << CHUNK_SHIFT) - 1);
            (lo, (1u64 << CHUNK_SHIFT).min(map.len - lo))
        } else {
            (0, map.len)
        };
        // The word of `lo`: found as every access finds it (`lo < len`).
        let first = map.cell(lo)?;
        self.base = std::ptr::from_ref(first).cast_mut().cast();
        self.lo = lo;
        self.span = span;
        map.cell(pfn)
    }
}

impl LiveMap {
    /// The state bits at `pfn` (0: no block starts there, or out of range).
    #[inline]
    pub(crate) fn state_at(&self, pfn: u64) -> u16 {
        state_of(self.get(pfn))
    }

    /// The tag at `pfn` (0 if none).
    #[inline]
    pub(crate) fn tag_at(&self, pfn: u64) -> u32 {
        tag_of(self.get(pfn))
    }

    /// Stores state `s`, with no tag, at `pfn` (as [`set`](WordMap::set)).
    #[inline]
    pub(crate) fn set_state(&self, pfn: u64, s: u16) {
        self.set(pfn, u64::from(s));
    }

    /// Stores state `s`, with no tag, at `pfn`, reserving its chunk first
    /// if need be (as [`claim`](WordMap::claim)).
    pub(crate) fn claim_state(&self, pfn: u64, s: u16) -> Result<(), MemError> {
        self.claim(pfn, u64::from(s))
    }

    /// Tags `pfn`, keeping its state bits, reserving its chunk first if
    /// need be (a scatter list's frame past the chunk of its block's
    /// first). The load and the store are not one step: only for a word
    /// no other thread can change meanwhile (a frame inside a block its
    /// caller holds, or a block nothing can retire yet).
    pub(crate) fn set_tag(&self, pfn: u64, tag: u32) -> Result<(), MemError> {
        if pfn >= self.len {
            return Ok(());
        }
        self.claim_chunk(pfn)?;
        if let Some(c) = self.cell(pfn) {
            put_tag(c, tag);
        }
        Ok(())
    }

    /// Moves the block at `pfn` from state `from` to `to`, atomically,
    /// whatever tag and owner it carries (cleared; another cache's slot
    /// revoked first, see `owner.rs`): of two threads racing to change one
    /// block, exactly one wins.
    /// Returns the state seen when it was not `from`.
    #[inline]
    pub(crate) fn compare_exchange(
        &self,
        pfn: u64,
        from: u16,
        to: u16,
        owners: &Owners,
    ) -> Result<(), u16> {
        match self.cell(pfn) {
            Some(c) => move_state(c, from, to, owners, 0),
            None => Err(0),
        }
    }

    /// Replaces the whole word at `pfn` (state and tag) with `to` if it is
    /// `from`, atomically (AcqRel, as every state change); `Err` holds the
    /// word seen (0 for a chunk never claimed).
    #[inline]
    pub(crate) fn exchange_word(&self, pfn: u64, from: u64, to: u64) -> Result<(), u64> {
        match self.cell(pfn) {
            Some(c) => c.claim(from, to),
            None => Err(0),
        }
    }

    /// The block (start, order, where: live, cached or retired) that
    /// contains `pfn`, if one is allocated in the tree.
    pub(crate) fn block_containing(&self, pfn: u64) -> Option<(u64, u32, u16)> {
        for k in 0..=ORDER_MASK as u32 {
            let start = pfn & !((1u64 << k) - 1);
            let s = self.state_at(start);
            if s != 0 && (s & ORDER_MASK) as u32 == k {
                return Some((start, k, s & WHERE_MASK));
            }
            if start == 0 {
                break;
            }
        }
        None
    }
}

/// The state bits of a word.
#[inline(always)]
pub(crate) fn state_of(w: u64) -> u16 {
    w as u16
}

/// The tag of a word.
#[inline(always)]
pub(crate) fn tag_of(w: u64) -> u32 {
    (w >> TAG_SHIFT) as u32
}

/// The word of a block in state `s` tagged `tag`.
#[inline(always)]
pub(crate) fn tagged(s: u16, tag: u32) -> u64 {
    u64::from(tag) << TAG_SHIFT | u64::from(s)
}

/// Replaces the tag of word `c`, keeping its state bits (the holder's
/// store: a load and a relaxed store, not one step).
#[inline(always)]
pub(crate) fn put_tag(c: &AtomicU64, tag: u32) {
    c.put((c.get() & 0xffff_ffff) | u64::from(tag) << TAG_SHIFT);
}

/// A state word a free can claim: the map's own word, or (under loom) a
/// model's.
pub(crate) trait ClaimWord {
    /// `compare_exchange(from, to)`, AcqRel on success (the winner sees
    /// everything the block's last owner did before its own change);
    /// `Err` holds the word seen.
    fn claim(&self, from: u64, to: u64) -> Result<(), u64>;
    /// A relaxed load (an owner's free, `owner::OwnerRef::free`).
    fn load_word(&self) -> u64;
    /// A relaxed store (an owner's free).
    fn store_word(&self, v: u64);
}

impl ClaimWord for AtomicU64 {
    #[inline(always)]
    fn claim(&self, from: u64, to: u64) -> Result<(), u64> {
        self.compare_exchange(from, to, AcqRel, Relaxed).map(|_| ())
    }
    #[inline(always)]
    fn load_word(&self) -> u64 {
        self.load(Relaxed)
    }
    #[inline(always)]
    fn store_word(&self, v: u64) {
        self.store(v, Relaxed)
    }
}

#[cfg(loom)]
impl ClaimWord for loom::sync::atomic::AtomicU64 {
    fn claim(&self, from: u64, to: u64) -> Result<(), u64> {
        self.compare_exchange(from, to, AcqRel, Relaxed).map(|_| ())
    }
    fn load_word(&self) -> u64 {
        self.load(Relaxed)
    }
    fn store_word(&self, v: u64) {
        self.store(v, Relaxed)
    }
}

/// Moves `word` from state `from` to `to` with one successful
/// compare-exchange, whatever tag and owner it carries; both are cleared
/// (a block changing state is no longer its mapping's, nor its cache's).
/// `me` is the caller's own owner bits (0 for none, and for a word that
/// is not live: only live words carry an owner). The first try expects
/// no tag and `me`'s owner (every block but a tagged or another cache's
/// live one), in line; a word whose state matched but whose tag or owner
/// did not is tried once more with the word seen, out of line, after
/// another owner's slot is revoked ([`Owners::before_claim`]). `Err`
/// holds the state seen (a tag that changed again meanwhile, which only
/// the block's holder does before it hands the block out, reads as the
/// state `from` refused).
#[inline(always)]
pub(crate) fn move_state(
    word: &impl ClaimWord,
    from: u16,
    to: u16,
    owners: &Owners,
    me: u64,
) -> Result<(), u16> {
    let first = u64::from(from) | me;
    match word.claim(first, u64::from(to)) {
        Ok(()) => Ok(()),
        Err(seen) => move_seen_state(word, (from, first), to, seen, owners, me),
    }
}

/// [`move_state`] of a word `seen` that was not `first` (the first try's
/// word for state `from`): tagged, another cache's, or in another state.
#[cold]
#[inline(never)]
fn move_seen_state(
    word: &impl ClaimWord,
    (from, first): (u16, u64),
    to: u16,
    seen: u64,
    owners: &Owners,
    me: u64,
) -> Result<(), u16> {
    if state_of(seen) != from || seen == first {
        return Err(state_of(seen));
    }
    owners.before_claim(seen, me);
    word.claim(seen, u64::from(to)).map_err(state_of)
}

/// The state words a free moves a block of `order` between: live,
/// untagged, with owner bits `me` (0 for none), and cached. Built in 64
/// bits (no widening of a 16-bit state on the allocator's hot path).
#[inline(always)]
pub(crate) fn free_words(order: u32, me: u64) -> (u64, u64) {
    let o = u64::from(order) & u64::from(ORDER_MASK);
    (u64::from(LIVE) | o | me, u64::from(CACHED) | o)
}

/// A free's claim on the block of `order` whose state word is `word`: live
/// (plain kind) to cached, so that of two threads freeing one block at the
/// same instant exactly one gets it (a load and a store would let both pass
/// their check, and the block would sit in two caches; an owner's plain
/// free is the exception `owner.rs` makes safe). One compare-exchange for
/// an untagged block of `me`'s (the caller's owner bits, 0 for none).
/// `Err` holds the state seen instead, from which [`free_error_seen`]
/// names the refusal.
#[inline(always)]
pub(crate) fn claim_for_free(
    word: &impl ClaimWord,
    order: u32,
    owners: &Owners,
    me: u64,
) -> Result<(), u16> {
    let (first, cached) = free_words(order, me);
    match word.claim(first, cached) {
        Ok(()) => Ok(()),
        Err(seen) => move_seen_state(
            word,
            (state(LIVE, order), first),
            state(CACHED, order),
            seen,
            owners,
            me,
        ),
    }
}

/// Why a free of a block of `order` at `pfn` (inside the domain) was
/// refused, its state word having been `seen`: a live block of the kind
/// freed but another order is [`IovaError::WrongSize`]; anything else
/// (free, cached, retired, another kind) is [`IovaError::NotAllocated`].
pub(crate) fn free_error_seen(pfn: u64, order: u32, seen: u16) -> super::IovaError {
    if seen & (LIVE | CACHED) == LIVE && order_in(seen) != order {
        super::IovaError::WrongSize {
            pfn,
            pages: 1u64.checked_shl(order).unwrap_or(0),
            allocated_pages: 1 << order_in(seen),
        }
    } else {
        super::IovaError::NotAllocated { pfn }
    }
}

/// The state word of a block of `order` with flag `flag` (and kind bits).
#[inline]
pub(crate) fn state(flag: u16, order: u32) -> u16 {
    flag | (order as u16 & ORDER_MASK)
}

/// The order a state word records.
#[inline]
pub(crate) fn order_in(s: u16) -> u32 {
    u32::from(s & ORDER_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_reserved_on_claim_only() {
        let m = LiveMap::chunked((1 << 36) - 1).expect("a 48-bit domain's map");
        assert_eq!(m.chunks.len(), 1 << 15);
        assert!(
            m.owned.lock().unwrap().is_empty(),
            "nothing reserved up front"
        );
        let far = (1 << 36) - 1;
        assert_eq!(m.get(far), 0);
        m.set_state(far, 0); // a clear of an unclaimed frame is a no-op
        m.claim_state(far, state(LIVE, 0)).unwrap();
        assert_eq!(m.state_at(far), state(LIVE, 0));
        assert_eq!(m.get(far - 1), 0);
        // The neighbouring chunk is still unreserved.
        let below = (1 << 36) - 2 * (1 << CHUNK_SHIFT);
        assert_eq!(m.get(below), 0);
        m.claim_state(below, state(CACHED, 3)).unwrap();
        assert_eq!(m.block_containing(below + 5), Some((below, 3, CACHED)));
        assert_eq!(m.owned.lock().unwrap().len(), 2);
        assert_eq!(m.get(1 << 36), 0, "out of range reads as free");
    }

    #[test]
    fn a_cursor_reaches_the_words_the_map_does() {
        let flat = LiveMap::new((1 << 23) - 1).unwrap();
        let chunked = LiveMap::chunked((1 << 23) - 1).unwrap();
        for m in [&flat, &chunked] {
            let mut c = Cursor::default();
            let far = (1 << 22) + 5;
            // SAFETY (each `cell` below): one map per cursor.
            assert!(
                m.flat_base.is_null() == unsafe { c.cell(m, far) }.is_none(),
                "an unclaimed chunk has no word"
            );
            m.claim_state(7, state(LIVE, 0)).unwrap();
            m.claim_state(far, state(LIVE, 2)).unwrap();
            for pfn in [7, far, 8, far + 1, (1 << 21) + 3, 7] {
                let via = unsafe { c.cell(m, pfn) }.map(|w| w.get());
                assert_eq!(via.unwrap_or(0), m.get(pfn), "pfn {pfn:#x}");
            }
            unsafe { c.cell(m, far) }
                .unwrap()
                .put(state(RETIRED, 2).into());
            assert_eq!(m.state_at(far), state(RETIRED, 2));
            assert!(unsafe { c.cell(m, 1 << 23) }.is_none(), "out of range");
        }
    }

    #[test]
    fn a_word_keeps_its_tag_only_while_its_block_is_live() {
        let owners = Owners::with(false);
        for m in [
            &LiveMap::new((1 << 23) - 1).unwrap(),
            &LiveMap::chunked((1 << 23) - 1).unwrap(),
        ] {
            let far = (1 << 22) + 8;
            m.claim_state(far, state(LIVE, 3)).unwrap();
            m.set_tag(far, 0x8000_0042).unwrap();
            assert_eq!(
                (m.state_at(far), m.tag_at(far)),
                (state(LIVE, 3), 0x8000_0042)
            );
            // Any change of state clears the tag (a kind taken off too).
            m.compare_exchange(far, state(LIVE, 3), state(LIVE | 0x100, 3), &owners)
                .unwrap();
            assert_eq!(m.tag_at(far), 0);
            m.set_tag(far, 0x8000_0043).unwrap();
            assert_eq!(
                m.compare_exchange(far, state(LIVE, 3), state(RETIRED, 3), &owners),
                Err(state(LIVE | 0x100, 3)),
                "another state is refused, whatever the tag"
            );
            m.compare_exchange(far, state(LIVE | 0x100, 3), state(RETIRED, 3), &owners)
                .unwrap();
            assert_eq!(m.get(far), u64::from(state(RETIRED, 3)));
            // A frame inside a block (no state of its own) keeps its zero
            // state under a tag; a chunk never claimed is claimed for it.
            let inside = (3 << 21) + 1;
            m.set_tag(inside, 0x0000_7000).unwrap();
            assert_eq!((m.state_at(inside), m.tag_at(inside)), (0, 0x7000));
            assert_eq!(m.block_containing(inside), None);
            m.set_tag(1 << 23, 1).unwrap(); // out of range: nothing
            assert_eq!(m.get(1 << 23), 0);
        }
    }

    #[test]
    fn a_map_too_large_is_refused() {
        assert!(matches!(
            LiveMap::new(u64::MAX),
            Err(MemError::Reserve { .. })
        ));
    }

    #[test]
    fn the_flat_map_and_the_chunked_one_agree() {
        let flat = LiveMap::new((1 << 30) - 1).unwrap();
        assert!(
            !flat.flat_base.is_null(),
            "1 GiB of address space is granted"
        );
        let chunked = LiveMap::chunked((1 << 30) - 1).unwrap();
        for m in [&flat, &chunked] {
            m.claim_state(0x12340, state(LIVE, 4)).unwrap();
            m.set_state(0x12340, state(RETIRED, 4));
            assert_eq!(m.state_at(0x12340), state(RETIRED, 4));
            assert_eq!(m.block_containing(0x1234f), Some((0x12340, 4, RETIRED)));
            assert_eq!(m.get(1 << 30), 0);
        }
    }
}
