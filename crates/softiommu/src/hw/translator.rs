//! The device side: a [`Translator`] per device thread, and the
//! [`TranslationGuard`] a device holds while it uses what it translated.
//!
//! A translator owns one of the unit's slots (see `epoch`): every
//! translation runs inside an *active* section of that slot, and a draining
//! wait waits for sections that began before its invalidations. A plain
//! [`Translator::translate`] is one section. [`Translator::begin`] opens a
//! longer one: translations made through the guard stay usable — the
//! physical pages they name cannot be unmapped, reused and handed to
//! someone else under the device — until the guard is dropped, because a
//! driver's wait (and so its unmap's completion) waits for the drop. Hold
//! guards across a memory copy, not across anything that blocks.
//!
//! A translator is neither `Send` nor `Sync`: it is made on the thread that
//! uses it (its slot records that thread, so that a thread holding a guard
//! and then waiting on the same unit gets [`QiError::GuardHeld`] instead of
//! a deadlock).
//!
//! [`QiError::GuardHeld`]: super::QiError::GuardHeld

#![deny(clippy::indexing_slicing)]

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use super::context::{self, ContextEntry, ContextWord, SourceId};
use super::epoch::Slots;
use super::error::HwError;
use super::error::TranslateError;
use super::fault::{Access, FaultRecord};
use super::iotlb::{
    binding_of, key_4k_base, val_perm, val_phys, DomainGen, FillOutcome, Iotlb, Leaf,
};
use super::latency::spin_ns;
use super::prq::{Raised, ResponseCode};
use super::ranges::{PhysRanges, PhysSpan};
use super::unit::{thread_token, Shared, Unit};
use super::walker::{walk, WalkEnd};
use crate::mem::PhysMemory;
use crate::mem::PAGE_SIZE;
use crate::pgtable::{Perm, VTD_ADDR_BITS, VTD_IOVA_BITS};
use crate::sync::barrier::Barrier;
use crate::sync::AtomicU64;

/// Counts of one translator, kept in the translator (no shared writes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TranslatorStats {
    /// Pages looked up (a multi-page access counts each page).
    pub lookups: u64,
    /// Lookups served by the IOTLB.
    pub hits: u64,
    /// Lookups that walked the table.
    pub walks: u64,
    /// Walks whose leaf was cached.
    pub fills: u64,
    /// Walks whose leaf was not cached because a page-selective
    /// invalidation ran meanwhile (or the entry was busy).
    pub fills_dropped: u64,
    /// Lookups that faulted.
    pub faults: u64,
    /// Modelled walk time charged, in nanoseconds.
    pub modelled_ns: u64,
    /// Misses that raised a page request.
    pub page_requests: u64,
    /// Times this translator found its domain's expiry deadline due and
    /// dropped the domain's cached translations (a deferred flush late).
    pub expiries: u64,
}

/// A device thread's handle on a unit's translation. Made by
/// [`Unit::translator`](super::Unit::translator).
pub struct Translator {
    shared: Arc<Shared>,
    slot: usize,
    /// The slot's state word, in `shared.slots` (which outlives it: `shared`
    /// is held here). Kept so that opening and closing a section are one
    /// store each, with no chunk lookup.
    cell: NonNull<AtomicU64>,
    /// The slot's state as of the last section's end (even): a section
    /// stores `state + 1` (kept in its guard) on entry and `state + 2` on
    /// exit, which becomes this. Sections open only through guards that
    /// cannot be leaked (see `section`), so entries never repeat a value.
    state: u64,
    /// The source id whose context word `ctx_cell` is, widened; `NO_SID`
    /// until a translation finds its device's bus in use.
    ctx_sid: u32,
    /// That device's context word, in `shared.contexts` (which outlives
    /// it, as `cell`'s slot does): the hit path's context read is one load.
    ctx_cell: NonNull<ContextWord>,
    /// The translated context word the hit path last served, `NO_WORD`
    /// before the first; for it: its domain, that domain's counters (in
    /// `shared.iotlb`, which outlives them) and the domain's part of a
    /// 4 KiB tag. The hit path compares the word it loads with this one
    /// instead of decoding it and indexing the domains.
    ctx_word: u64,
    ctx_did: u16,
    ctx_dom: NonNull<DomainGen>,
    ctx_key: u64,
    /// The binding part (`iotlb::binding_of`) of that domain's generation
    /// counter, read between two loads of `ctx_word`.
    ctx_bind: u64,
    barrier: Barrier,
    /// The unit's longest access (its configuration, kept here).
    max_access: u64,
    rng: u64,
    stats: TranslatorStats,
    /// Lookups that took the slow path (`stats.lookups` is hits + these).
    slow: u64,
    /// The error of the last lookup that failed (see `lookup`).
    err: TranslateError,
    /// Neither `Send` nor `Sync`: bound to the thread that made it.
    _thread: PhantomData<*const ()>,
}

impl fmt::Debug for Translator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Translator")
            .field("slot", &self.slot)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// An open translation section; see the module documentation. Lent to the
/// closure of [`Translator::section`], which ends the section when it
/// returns.
pub struct TranslationGuard<'a> {
    t: &'a mut Translator,
    /// The slot state this section stored (odd); the translator's own
    /// copy is brought up to date when the section ends.
    state: u64,
}

impl fmt::Debug for TranslationGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TranslationGuard")
            .field("slot", &self.t.slot)
            .finish()
    }
}

/// Where a page of a translated context starts and how far it runs.
#[inline(always)]
fn span_of(leaf: Leaf, iova: u64) -> PhysSpan {
    let off = iova & (leaf.size.bytes() - 1);
    PhysSpan {
        phys: leaf.phys + off,
        len: leaf.size.bytes() - off,
        perm: leaf.perm,
    }
}

/// Where a page of a pass-through context starts (IOVA = physical address)
/// and how far it runs: to the next bounce pool frame at most, so that
/// an untranslated access never reaches a pool (the pool is reachable only
/// through the mappings its domain made of it); `None` when `iova`'s own
/// frame is a pool's. Memory past RAM is left to the access's RAM check.
#[inline(always)]
fn pass_through_span(mem: &PhysMemory, iova: u64) -> Option<PhysSpan> {
    Some(PhysSpan {
        phys: iova,
        len: mem.direct_run(iova, 1 << VTD_ADDR_BITS)?,
        perm: Perm::RW,
    })
}

/// `ctx_sid` of a translator that caches no context word: no source id
/// (a `u16`) widens to it.
const NO_SID: u32 = u32::MAX;

/// Reads of a context word [`Translator::stable_context`] makes before it
/// takes a word that keeps changing for blocked.
const CONTEXT_READS: usize = 8;

/// `ctx_word` of a translator that has served no translated context: no
/// context word is all ones (`context::encode` leaves bits 58 and up 0).
const NO_WORD: u64 = u64::MAX;

/// Where `slow_split` packs a span's rights in its length word: spans run
/// at most to the end of the 2^52 address space, far below.
const SPLIT_PERM_SHIFT: u32 = 56;
const SPLIT_LEN_MASK: u64 = (1 << SPLIT_PERM_SHIFT) - 1;
// A span never reaches past the address width, so its length fits below
// the rights, in release builds too.
const _: () = assert!(VTD_ADDR_BITS < SPLIT_PERM_SHIFT);

/// xorshift64: a translator's own generator, so that choosing a victim
/// writes nothing shared.
fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

impl Unit {
    /// A translator for the calling thread (one per device thread).
    pub fn translator(&self) -> Result<Translator, HwError> {
        let sh = &self.shared;
        let (slot, state) = sh
            .slots
            .claim(thread_token())
            .ok_or(HwError::TooManyTranslators {
                max: sh.slots.capacity(),
            })?;
        let Some(cell) = sh.slots.state_cell(slot).map(NonNull::from) else {
            // A claimed slot's chunk exists; unreachable, but not a panic.
            sh.slots.release(slot);
            return Err(HwError::TooManyTranslators {
                max: sh.slots.capacity(),
            });
        };
        Ok(Translator::new(Arc::clone(sh), slot, cell, state))
    }
}

impl Translator {
    pub(crate) fn new(
        shared: Arc<Shared>,
        slot: usize,
        cell: NonNull<AtomicU64>,
        state: u64,
    ) -> Self {
        let barrier = shared.barrier;
        let max_access = shared.config.max_access_bytes;
        Self {
            shared,
            slot,
            cell,
            state,
            ctx_sid: NO_SID,
            ctx_cell: NonNull::dangling(),
            ctx_word: NO_WORD,
            ctx_did: 0,
            ctx_dom: NonNull::dangling(),
            ctx_key: 0,
            ctx_bind: 0,
            barrier,
            max_access,
            rng: 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(slot as u64 + 1) | 1,
            stats: TranslatorStats::default(),
            slow: 0,
            err: TranslateError::NoContext { sid: SourceId(0) },
            _thread: PhantomData,
        }
    }

    /// This translator's slot state word.
    #[inline(always)]
    fn cell(&self) -> &AtomicU64 {
        // SAFETY: `cell` came from `shared.slots.state_cell(slot)`; a
        // slot's chunk is freed only when the `Slots` is dropped, and
        // `self.shared` keeps it alive for as long as `self` exists.
        unsafe { self.cell.as_ref() }
    }

    /// Runs `f` inside one translation section: what is translated
    /// through the guard stays the device's to use until `f` returns,
    /// because a driver's invalidation wait waits for the section to end.
    /// The section ends when `f` returns or unwinds; the guard cannot be
    /// kept, leaked or forgotten (a leaked section would hold every later
    /// wait forever), so keep `f` short and never block in it.
    #[inline(always)]
    pub fn section<R>(&mut self, f: impl FnOnce(&mut TranslationGuard<'_>) -> R) -> R {
        let mut g = self.begin();
        f(&mut g)
    }

    /// Opens a translation section (crate-internal: users get sections
    /// only through [`section`](Self::section), so none can be leaked).
    #[inline(always)]
    pub(crate) fn begin(&mut self) -> TranslationGuard<'_> {
        // Kept in the guard, in a register on the hit path; `self.state`
        // is written once, at the end (nothing reads it in between).
        let state = self.state + 1;
        Slots::enter_cell(self.cell(), state, self.barrier);
        TranslationGuard { t: self, state }
    }

    /// Translates `[iova, iova + len)` of device `sid` for `access`: the
    /// physical pieces, or a typed error that is also recorded as a fault.
    #[inline]
    pub fn translate(
        &mut self,
        sid: SourceId,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<PhysRanges, TranslateError> {
        self.begin().translate(sid, iova, len, access)
    }

    /// Translates the page holding `iova`: where `iova` lands and how many
    /// bytes run on contiguously from there. The cheap call for an access
    /// that stays in one page.
    #[inline(always)]
    pub fn translate_page(
        &mut self,
        sid: SourceId,
        iova: u64,
        access: Access,
    ) -> Result<PhysSpan, TranslateError> {
        self.begin().translate_page(sid, iova, access)
    }

    /// This translator's counts.
    pub fn stats(&self) -> TranslatorStats {
        TranslatorStats {
            lookups: self.stats.hits + self.slow,
            ..self.stats
        }
    }

    /// The physical memory translations point into.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.shared.mem
    }

    /// The context word of `sid`, as `ContextTable::load` reads it: one
    /// load when `sid` is the device this translator served last.
    #[inline(always)]
    fn context_word(&mut self, sid: SourceId) -> u64 {
        if u32::from(sid.0) == self.ctx_sid {
            // SAFETY: `ctx_sid` is set (it matched `sid`).
            return unsafe { self.kept_cell_word() };
        }
        self.context_word_cold(sid)
    }

    /// The word in `ctx_cell`, loaded as `ContextTable::load` does
    /// (Acquire).
    ///
    /// # Safety
    ///
    /// `ctx_sid` must have been set (it is set only with `ctx_cell`
    /// pointing at a word of `shared.contexts`, whose buses are freed only
    /// with the table, which `self.shared` keeps alive).
    #[inline(always)]
    unsafe fn kept_cell_word(&self) -> u64 {
        // SAFETY: the caller's contract.
        unsafe { self.ctx_cell.as_ref() }.load(std::sync::atomic::Ordering::Acquire)
    }

    /// [`context_word`](Self::context_word) for a device other than the
    /// last one: looks its word up, and keeps it if its bus is in use.
    #[inline(never)]
    fn context_word_cold(&mut self, sid: SourceId) -> u64 {
        match self.shared.contexts.cell(sid) {
            Some(cell) => {
                self.ctx_sid = u32::from(sid.0);
                self.ctx_cell = NonNull::from(cell);
                // Acquire: as in `ContextTable::load`.
                cell.load(std::sync::atomic::Ordering::Acquire)
            }
            None => 0,
        }
    }

    /// The hit path: the translation of `iova`'s page if the context is
    /// pass-through, or translated and the IOTLB holds a valid entry that
    /// allows `access`; `None` for everything else (a miss, a fault). Small
    /// enough a result to stay in registers.
    ///
    /// A domain id that loses its last device and is bound again (to
    /// other tables) has its generation counter's binding part moved on
    /// (`Iotlb::rebind_domain`) after the old context's change, in a later
    /// call under the unit's bindings lock, and before the new context's
    /// word is stored. A translator keeps, with a translated context, the
    /// binding part it read *between two loads* of that context's word
    /// (`hit_other`): the first load's word was stored under the kept
    /// binding or an earlier one, the second's under it or a later one (a
    /// later one shows on the next generation read). A hit
    /// reads the word, then the generation, and serves only if the
    /// generation's binding part is still the kept one (`hit_translated`).
    /// Without that check, a translator that loaded its device's old word
    /// before a detach and the generation after the id's new binding would
    /// hit the new tables' entries; and after a binding that came and went
    /// (the device attached again with its old word), the same. With it: a
    /// generation read that sees a later binding's bump has a larger
    /// binding part; one that does not is older than every entry of that
    /// binding; and a word loaded after the keep's counter read was stored
    /// under the kept binding or a later one, so an equal binding part
    /// means the kept one. The slow path checks the same by reading the
    /// word again (`stable_context`).
    #[inline(always)]
    fn hit(&mut self, sid: SourceId, iova: u64, access: Access) -> Option<PhysSpan> {
        let word = self.context_word(sid);
        // The translated context served last: one compare.
        if word != self.ctx_word {
            // Pass-through inline too (one more compare): its accesses are
            // the baseline every policy is measured against.
            if word == context::PASS_THROUGH_WORD && iova < 1 << VTD_ADDR_BITS {
                return pass_through_span(&self.shared.mem, iova);
            }
            return self.hit_other(word, iova, access);
        }
        self.hit_translated(iova, access)
    }

    /// [`hit`](Self::hit) in a context other than the translated one
    /// served last and not pass-through within the address width (`hit`
    /// serves that): a translated one, kept for the next hits; else `None`
    /// (the slow path faults it, pass-through past the width included).
    #[inline(never)]
    fn hit_other(&mut self, word: u64, iova: u64, access: Access) -> Option<PhysSpan> {
        let did = context::translated_did(word)?;
        let dom = self.shared.iotlb.domain_of(did);
        // The binding part between two loads of the word (see `hit`): the
        // word was stored under that binding or an earlier one, and is
        // still the device's after it.
        let own = self.shared.iotlb.domain_gen_at(dom);
        // SAFETY: a translated `word` came from `context_word` through
        // `ctx_cell` (its cold path returns 0 where it sets no cell), so
        // `ctx_sid` is set.
        if unsafe { self.kept_cell_word() } != word {
            return None;
        }
        self.ctx_dom = NonNull::from(dom);
        self.ctx_did = did;
        self.ctx_key = key_4k_base(did);
        self.ctx_word = word;
        self.ctx_bind = binding_of(own);
        self.hit_translated(iova, access)
    }

    /// The hit path found the kept domain bound again since its context
    /// was kept: the context is read afresh next time (this access
    /// misses).
    #[cold]
    #[inline(never)]
    fn forget_context(&mut self) {
        self.ctx_word = NO_WORD;
    }

    /// [`hit`](Self::hit) in the translated context `ctx_word`, the word
    /// of the device `ctx_cell` holds.
    #[inline(always)]
    fn hit_translated(&mut self, iova: u64, access: Access) -> Option<PhysSpan> {
        if iova >> VTD_IOVA_BITS != 0 {
            return None;
        }
        // SAFETY: `ctx_dom` is set (with `ctx_word`, which is `NO_WORD`
        // until then, and no loaded word equals) to counters in
        // `shared.iotlb`, freed only with it; `self.shared` keeps it alive.
        let dom = unsafe { self.ctx_dom.as_ref() };
        // The domain's expiry deadline, on the line `gen` is read from
        // below: 0 (strict, idle deferred) costs this one predictable
        // branch. Armed, every hit compares the clock with it, so no access
        // that begins past it is served from the cache, whatever became of
        // the flush timer.
        let (dl, gen, own) = self.shared.iotlb.deadline_then_gen_at(dom);
        // The binding the kept context was read under (see `hit`).
        if binding_of(own) != self.ctx_bind {
            self.forget_context();
            return None;
        }
        // The `Arc`, not the IOTLB: the cold call then costs the hit path
        // no register kept for its argument.
        if dl != 0 && Self::expired(&self.shared, &mut self.stats, self.ctx_did, dl) {
            return None;
        }
        let sh = &*self.shared;
        // The 4 KiB probe inline, its rights and span computed from the
        // entry's value word with constants; the large sets out of line.
        if let Some(val) = sh.iotlb.lookup_4k_keyed(self.ctx_key, iova, gen) {
            let perm = val_perm(val);
            if !perm.contains(access.perm()) {
                // Walk, as `served` does.
                return None;
            }
            self.stats.hits += 1;
            let off = iova & (PAGE_SIZE - 1);
            return Some(PhysSpan {
                phys: val_phys(val) + off,
                len: PAGE_SIZE - off,
                perm,
            });
        }
        let leaf = sh.iotlb.lookup_large(self.ctx_did, iova, gen)?;
        Self::served(&mut self.stats, leaf, iova, access)
    }

    /// A hit's last step: the rights check, the count, the span.
    #[inline(always)]
    fn served(
        stats: &mut TranslatorStats,
        leaf: Leaf,
        iova: u64,
        access: Access,
    ) -> Option<PhysSpan> {
        if !leaf.perm.contains(access.perm()) {
            // Walk, in case the mapping was upgraded (hardware re-walks on
            // a permission miss before faulting).
            return None;
        }
        stats.hits += 1;
        Some(span_of(leaf, iova))
    }

    /// Whether domain `did`'s armed deadline word `dl` has fallen due; if
    /// so, drops the domain's cached translations (see `Iotlb::expire`)
    /// and the caller's lookup misses.
    #[cold]
    #[inline(never)]
    fn expired(sh: &Arc<Shared>, stats: &mut TranslatorStats, did: u16, dl: u64) -> bool {
        let tlb = &sh.iotlb;
        let now = tlb.clock().now();
        if !Iotlb::due(dl, now) {
            return false;
        }
        tlb.expire(did, dl, now, Barrier::default_for_process());
        stats.expiries += 1;
        true
    }

    /// One page: the hit path, or else the slow path.
    #[inline(always)]
    fn lookup(
        &mut self,
        sid: SourceId,
        iova: u64,
        access: Access,
    ) -> Result<PhysSpan, TranslateError> {
        if let Some(s) = self.hit(sid, iova, access) {
            return Ok(s);
        }
        // The slow path's span comes back in two registers and its error
        // through `self.err`: its result never merges with the hit's in a
        // `Result` kept in memory, which the inline hit would have to build.
        let (phys, len_perm) = self.slow_split(sid, iova, access);
        if len_perm == 0 {
            return Err(self.err);
        }
        Ok(PhysSpan {
            phys,
            len: len_perm & SPLIT_LEN_MASK,
            perm: Perm::from_low_bits(len_perm >> SPLIT_PERM_SHIFT),
        })
    }

    /// [`slow`](Self::slow), its span packed in two words: the address,
    /// and the length (never 0) with the rights above bit
    /// `SPLIT_PERM_SHIFT`; its error in `self.err`, with a length word of 0.
    #[inline(never)]
    fn slow_split(&mut self, sid: SourceId, iova: u64, access: Access) -> (u64, u64) {
        match self.slow(sid, iova, access) {
            Ok(s) => {
                debug_assert!(s.len != 0 && s.len <= SPLIT_LEN_MASK);
                (s.phys, s.len | s.perm.low_bits() << SPLIT_PERM_SHIFT)
            }
            Err(e) => {
                self.err = e;
                (0, 0)
            }
        }
    }

    /// Everything but a hit: faults of the context or the address, and the
    /// walk of a miss.
    #[inline(never)]
    fn slow(
        &mut self,
        sid: SourceId,
        iova: u64,
        access: Access,
    ) -> Result<PhysSpan, TranslateError> {
        self.slow += 1;
        let (word, gen) = self.stable_context(sid);
        let err = match context::decode(word) {
            Some(ContextEntry::Translated { did, root }) if iova >> VTD_IOVA_BITS == 0 => {
                return self.walk(sid, did, root, iova, access, gen);
            }
            Some(ContextEntry::Translated { .. }) => TranslateError::AddressTooWide {
                sid,
                iova,
                width: VTD_IOVA_BITS,
            },
            Some(ContextEntry::PassThrough) if iova < 1 << VTD_ADDR_BITS => {
                // The context changed since the hit path looked, or the
                // address is a bounce pool's frame.
                match pass_through_span(&self.shared.mem, iova) {
                    Some(span) => return Ok(span),
                    None => TranslateError::BounceFrame { sid, iova, access },
                }
            }
            Some(ContextEntry::PassThrough) => TranslateError::AddressTooWide {
                sid,
                iova,
                width: VTD_ADDR_BITS,
            },
            Some(ContextEntry::Blocked) => TranslateError::ContextBlocked { sid },
            None => TranslateError::NoContext { sid },
        };
        Err(self.fault(err, iova, access))
    }

    /// `sid`'s context word and, if it is translated, its domain's
    /// generation, read so that the word was loaded again after the
    /// generation and found unchanged, and the domain's counter after that
    /// (see [`hit`](Self::hit) on why a generation read after the word can
    /// belong to another binding of the domain id). A word that keeps
    /// changing (a driver rewriting the entry faster than a translation
    /// reads it) is taken as blocked after
    /// `CONTEXT_READS` reads: the translation faults, as it would if it had
    /// met the entry cleared.
    fn stable_context(&self, sid: SourceId) -> (u64, u64) {
        let sh = &*self.shared;
        let mut word = sh.contexts.load(sid);
        for _ in 0..CONTEXT_READS {
            let Some(did) = context::translated_did(word) else {
                return (word, 0);
            };
            let dom = sh.iotlb.domain_of(did);
            let (_, gen, own) = sh.iotlb.deadline_then_gen_at(dom);
            let again = sh.contexts.load(sid);
            // The binding part only: an invalidation in between makes
            // the walk's fill stale by itself.
            if again == word && binding_of(sh.iotlb.domain_gen_at(dom)) == binding_of(own) {
                return (word, gen);
            }
            word = again;
        }
        match context::translated_did(word) {
            None => (word, 0),
            Some(_) => (context::encode(Some(ContextEntry::Blocked)), 0),
        }
    }

    /// The miss path: a page walk over the table's bytes, and a fill.
    #[inline(never)]
    fn walk(
        &mut self,
        sid: SourceId,
        did: u16,
        root: u64,
        iova: u64,
        access: Access,
        gen: u64,
    ) -> Result<PhysSpan, TranslateError> {
        let sh = &*self.shared;
        // Read before the walk: see `iotlb` on why a fill needs it.
        let ticket = sh.iotlb.ticket(did, gen);
        let w = walk(&sh.mem, root, iova);
        self.stats.walks += 1;
        self.stats.modelled_ns += spin_ns(sh.latency.walk_level_ns() * u64::from(w.levels));
        let err = match w.end {
            WalkEnd::Leaf { phys, size, .. }
                if sh.refuses_bounce_leaves(did)
                    && sh.mem.check_device_range(phys, size.bytes()).is_err() =>
            {
                // A guest's leaf over a bounce pool (RAM it, or an I/O
                // page-fault domain over guest RAM, mapped before the pool
                // took it): never cached, never reached.
                TranslateError::BounceFrame { sid, iova, access }
            }
            WalkEnd::Leaf { phys, size, perm } => {
                let leaf = Leaf { phys, size, perm };
                let rnd = xorshift(&mut self.rng);
                match sh.iotlb.fill(did, iova, leaf, ticket, rnd) {
                    FillOutcome::Filled => self.stats.fills += 1,
                    FillOutcome::Withdrawn | FillOutcome::Busy => self.stats.fills_dropped += 1,
                }
                if perm.contains(access.perm()) {
                    return Ok(span_of(leaf, iova));
                }
                TranslateError::PermissionDenied {
                    sid,
                    iova,
                    access,
                    allowed: perm,
                }
            }
            WalkEnd::NotPresent { .. } => TranslateError::NotPresent { sid, iova, access },
            WalkEnd::Reserved { level, raw } => TranslateError::ReservedEntry {
                sid,
                iova,
                level,
                raw,
            },
            WalkEnd::BadTable { level, table } => TranslateError::BadTableAddress {
                sid,
                iova,
                level,
                table,
            },
        };
        Err(self.fault(err, iova, access))
    }

    /// Records `err` as a fault and returns it.
    #[cold]
    #[inline(never)]
    fn fault(&mut self, err: TranslateError, iova: u64, access: Access) -> TranslateError {
        // A miss of a device that may fault raises a page request instead.
        if let TranslateError::NotPresent { sid, .. }
        | TranslateError::PermissionDenied { sid, .. } = err
        {
            if let Some(e) = self.page_request(sid, iova, access) {
                return e;
            }
        }
        self.stats.faults += 1;
        self.record(err, iova, access);
        err
    }

    /// Records `err` in the fault log if it is a fault.
    fn record(&self, err: TranslateError, iova: u64, access: Access) {
        if let Some(reason) = err.reason() {
            let sid = match err {
                TranslateError::NoContext { sid }
                | TranslateError::ContextBlocked { sid }
                | TranslateError::ZeroLength { sid, .. }
                | TranslateError::TooLong { sid, .. }
                | TranslateError::PageRequested { sid, .. }
                | TranslateError::PageRequestDenied { sid, .. }
                | TranslateError::AddressTooWide { sid, .. }
                | TranslateError::NotPresent { sid, .. }
                | TranslateError::PermissionDenied { sid, .. }
                | TranslateError::ReservedEntry { sid, .. }
                | TranslateError::BadTableAddress { sid, .. }
                | TranslateError::BounceFrame { sid, .. } => sid,
            };
            self.shared.faults.record(FaultRecord {
                sid,
                iova,
                access,
                reason,
            });
        }
    }

    /// Raises a page request for `sid`'s miss at `iova`, if the device has
    /// page requests enabled: `PageRequested` to wait for, or at once
    /// `PageRequestDenied` (recorded) when the queue is full. `None`: the
    /// device cannot fault; the miss is an ordinary fault.
    #[cold]
    fn page_request(&mut self, sid: SourceId, iova: u64, access: Access) -> Option<TranslateError> {
        let prq = &self.shared.prq;
        if !prq.enabled(sid) {
            return None;
        }
        let (read, write) = (access == Access::Read, access == Access::Write);
        match prq.raise(sid, iova, read, write) {
            Ok(Raised::Queued { prgi }) => {
                self.stats.page_requests += 1;
                Some(TranslateError::PageRequested {
                    sid,
                    iova,
                    access,
                    prgi,
                })
            }
            // Full (overflow set, counted), or all 512 groups outstanding,
            // or the ring unreadable: refused at once, as the fault it is.
            Ok(Raised::Overflow | Raised::NoGroup) | Err(_) => {
                let e = TranslateError::PageRequestDenied { sid, iova, access };
                self.stats.faults += 1;
                self.record(e, iova, access);
                Some(e)
            }
        }
    }

    /// Waits for the answer to page request group `prgi` that a miss of
    /// `sid` at `iova` raised (call it outside any section: a section held
    /// while waiting would hold every invalidation wait on the unit, and
    /// the answer may be queued behind one). `Ok` on `Success`: retry the
    /// access. Otherwise `PageRequestDenied`, recorded as a fault: on
    /// `Invalid` or `Failure`, or when the unit's
    /// [`page_response_timeout`](super::UnitConfig::page_response_timeout)
    /// passes first (the unit then answers the group `Invalid` itself).
    pub fn wait_page_response(
        &mut self,
        sid: SourceId,
        iova: u64,
        access: Access,
        prgi: u16,
    ) -> Result<(), TranslateError> {
        let deadline = std::time::Instant::now() + self.shared.config.page_response_timeout;
        match self.shared.prq.wait(sid, prgi, deadline) {
            ResponseCode::Success => Ok(()),
            ResponseCode::Invalid | ResponseCode::Failure => {
                let e = TranslateError::PageRequestDenied { sid, iova, access };
                self.stats.faults += 1;
                self.record(e, iova, access);
                Err(e)
            }
        }
    }
}

impl Drop for Translator {
    fn drop(&mut self) {
        self.shared.slots.release(self.slot);
    }
}

impl TranslationGuard<'_> {
    /// As [`Translator::translate`], inside this section.
    #[inline]
    pub fn translate(
        &mut self,
        sid: SourceId,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<PhysRanges, TranslateError> {
        // One comparison for both bad lengths: 0 wraps to the top.
        if len.wrapping_sub(1) >= self.t.max_access {
            return Err(self.bad_length(sid, iova, len, access));
        }
        if let Some(first) = self.t.hit(sid, iova, access) {
            if first.len >= len {
                return Ok(PhysRanges::one(first.phys, len));
            }
        }
        self.translate_slow(sid, iova, len, access)
    }

    /// A zero-length or too long request: a fault.
    #[cold]
    #[inline(never)]
    fn bad_length(&mut self, sid: SourceId, iova: u64, len: u64, access: Access) -> TranslateError {
        let e = if len == 0 {
            TranslateError::ZeroLength { sid, iova }
        } else {
            TranslateError::TooLong {
                sid,
                iova,
                len,
                max: self.t.max_access,
            }
        };
        self.t.fault(e, iova, access)
    }

    /// An access that missed, faulted or crosses pages.
    #[inline(never)]
    fn translate_slow(
        &mut self,
        sid: SourceId,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<PhysRanges, TranslateError> {
        let first = self.t.lookup(sid, iova, access)?;
        if first.len >= len {
            return Ok(PhysRanges::one(first.phys, len));
        }
        let mut out = PhysRanges::one(first.phys, first.len);
        // Past the first page. An access running off the top of the address
        // space meets an untranslatable address (2^48 or 2^52) long before
        // the sum could wrap, and faults there.
        let end = iova.saturating_add(len);
        let mut cur = iova + first.len;
        while cur < end {
            let span = self.t.lookup(sid, cur, access)?;
            let take = span.len.min(end - cur);
            out.push(span.phys, take);
            cur += take;
        }
        Ok(out)
    }

    /// As [`Translator::translate_page`], inside this section.
    #[inline(always)]
    pub fn translate_page(
        &mut self,
        sid: SourceId,
        iova: u64,
        access: Access,
    ) -> Result<PhysSpan, TranslateError> {
        self.t.lookup(sid, iova, access)
    }

    /// The physical memory translations point into.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.t.shared.mem
    }

    /// The longest access one translation serves
    /// ([`UnitConfig::max_access_bytes`](super::UnitConfig::max_access_bytes)).
    pub fn max_access(&self) -> u64 {
        self.t.max_access
    }
}

impl Drop for TranslationGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let state = self.state + 1;
        self.t.state = state;
        Slots::exit_cell(self.t.cell(), state);
    }
}
