//! A cache's size classes, and the one count of each that others read.
//!
//! A class holds two magazines of one block size. The cache that owns it
//! is the only thread that touches them; [`IovaDomain::stats`] (any
//! thread) reads how many IOVAs they hold. The loaded magazine's length
//! is therefore kept outside the magazines, as an atomic that *is* the
//! length: the fast paths move it with a relaxed load and store (plain
//! moves), and the count others read costs them nothing more. (A separate
//! published copy cost the pair a pointer load and a store per call,
//! measured at about 0.3 ns of an 8 ns pair.)
//!
//! The magazines themselves sit in an [`UnsafeCell`], reached only through
//! a [`ClassTable`] borrowed mutably, which the owning cache alone holds:
//! - [`ClassTable::hot`] gives the fast paths the magazines with the
//!   atomic length ([`Hot`]); the magazine's own length field is stale
//!   meanwhile.
//! - [`ClassTable::guard`] gives every other path the magazines with the
//!   length brought in ([`ClassGuard`]); dropping the guard stores the
//!   lengths back, so that a magazine swapped or replaced under it is
//!   counted as it now is.
//!
//! Readers get `&Class` through the shared table and read only
//! [`Class::held`]: atomics outside the cell (the loaded magazine's
//! length, and a copy of the other's that each guard leaves).
//!
//! [`IovaDomain::stats`]: super::IovaDomain::stats

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::live_map::claim_for_free;
use super::magazine::Magazine;
use super::owner::{OwnerRef, Owners, OWNER_MASK};

/// What a class holds apart from its loaded magazine's length.
#[derive(Debug)]
pub(super) struct ClassMut {
    /// The magazine allocations pop from and frees push to.
    pub(super) loaded: Magazine,
    /// The other magazine (Bonwick's "previous"): swapped in when the
    /// loaded one empties or fills.
    pub(super) prev: Magazine,
    /// `2^order - 1`: a block starting at `pfn` ends at `pfn + span_m1`.
    pub(super) span_m1: u64,
    /// The state word of a block of this class as the cache hands it
    /// out: live, untagged, with the cache's owner bits (kept here so that
    /// the hot paths load it instead of building it).
    pub(super) live: u64,
    /// The state word of a block of this class in a cache.
    pub(super) cached: u64,
}

/// One size class of a cache; see the module documentation.
#[derive(Debug)]
pub(super) struct Class {
    /// The loaded magazine's length: the truth while no [`ClassGuard`] is
    /// alive (the magazine's own field is brought in line by the guard),
    /// at most the magazine's capacity, and what statistics read.
    loaded_len: AtomicU32,
    /// The other magazine's length as the last guard left it (only guards
    /// change that magazine): a published copy, for statistics.
    prev_len: AtomicU32,
    cell: UnsafeCell<ClassMut>,
}

// SAFETY: `cell` is reached only through `ClassTable::hot`,
// `ClassTable::guard` and `ClassTable::at`, which take the table `&mut`;
// the one table that reaches a class mutably is its cache's
// (`ClassTable` is not `Clone`, and `ClassTable::readers` hands out only
// `&Class`, through which nothing reaches the cell). Other threads read `loaded_len` and
// `prev_len`, atomics.
unsafe impl Sync for Class {}

impl Class {
    /// How many IOVAs the class holds, both magazines (any thread; exact
    /// once the owner's call that moved them has returned).
    pub(super) fn held(&self) -> u64 {
        u64::from(self.loaded_len.load(Relaxed)) + u64::from(self.prev_len.load(Relaxed))
    }
}

/// A cache's classes, in order: the only handle that reaches their
/// magazines.
#[derive(Debug)]
pub(super) struct ClassTable {
    classes: Arc<[CachePadded<Class>]>,
    /// `classes`' first class and count, kept apart so that a lookup is
    /// a compare and a scaled add (the `Arc`'s data sits past its
    /// counts, an add more through the `Arc`).
    first: *const CachePadded<Class>,
    len: usize,
}

// SAFETY: `first` points into `classes`, which the table owns (an `Arc`
// of `Sync` classes); the table is otherwise an `Arc`.
unsafe impl Send for ClassTable {}
// SAFETY: as above; through `&ClassTable` only `&Class` is reached.
unsafe impl Sync for ClassTable {}

impl ClassTable {
    /// A table of `classes`, each with an empty loaded magazine.
    pub(super) fn new(classes: impl Iterator<Item = ClassMut>) -> Self {
        let classes: Arc<[CachePadded<Class>]> = classes
            .map(|m| {
                CachePadded::new(Class {
                    loaded_len: AtomicU32::new(m.loaded.len() as u32),
                    prev_len: AtomicU32::new(m.prev.len() as u32),
                    cell: UnsafeCell::new(m),
                })
            })
            .collect();
        Self {
            first: classes.as_ptr(),
            len: classes.len(),
            classes,
        }
    }

    /// Class `order`, if it is cached.
    #[inline(always)]
    fn get(&self, order: u32) -> Option<&Class> {
        let i = order as usize;
        // SAFETY: `i < len`, the count of the classes `first` points at,
        // which `classes` keeps alive for as long as `self`.
        (i < self.len).then(|| unsafe { &**self.first.add(i) })
    }

    /// The classes for readers of their counts ([`Class::held`]).
    pub(super) fn readers(&self) -> Arc<[CachePadded<Class>]> {
        self.classes.clone()
    }

    /// The number of classes (cached orders `0..len`).
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The fast paths' view of class `order`, if it is cached.
    #[inline(always)]
    pub(super) fn hot(&mut self, order: u32) -> Option<Hot<'_>> {
        let c = self.get(order)?;
        // SAFETY: `&mut self` is the only way to the cell (see `Class`),
        // and the returned borrow holds it for as long as the view lives.
        let m = unsafe { &mut *c.cell.get() };
        Some(Hot {
            len: &c.loaded_len,
            m,
        })
    }

    /// Every other path's view of class `order`, if it is cached: the
    /// magazines whole, their lengths published when the guard drops.
    #[inline]
    pub(super) fn guard(&mut self, order: u32) -> Option<ClassGuard<'_>> {
        // SAFETY: `&mut self` is held for the guard's life.
        self.get(order).map(|c| unsafe { Self::guard_of(c) })
    }

    /// [`guard`](Self::guard) for a path that knows `order` is cached.
    ///
    /// # Panics
    /// If it is not (a caller's bug, as an index out of bounds).
    #[inline]
    pub(super) fn at(&mut self, order: u32) -> ClassGuard<'_> {
        // SAFETY: `&mut self` is held for the guard's life.
        unsafe { Self::guard_of(&self.classes[order as usize]) }
    }

    /// The guard of `c`.
    ///
    /// # Safety
    /// `c` is a class of a table the caller holds `&mut` for as long as
    /// the guard lives.
    #[inline]
    unsafe fn guard_of(c: &Class) -> ClassGuard<'_> {
        // SAFETY: the contract: the table borrowed `&mut` is the only way
        // to the cell (see `Class`).
        let m = unsafe { &mut *c.cell.get() };
        m.loaded.set_len(c.loaded_len.load(Relaxed) as usize);
        ClassGuard { class: c, m }
    }
}

/// The fast paths' view of a class: the magazines, with the loaded
/// one's length in the class's atomic (its own field is stale).
#[derive(Debug)]
pub(super) struct Hot<'a> {
    len: &'a AtomicU32,
    m: &'a mut ClassMut,
}

impl Hot<'_> {
    /// The live word of a block of this class (see [`ClassMut::live`]).
    #[inline(always)]
    pub(super) fn live(&self) -> u64 {
        self.m.live
    }

    /// Pops the loaded magazine's top block if it ends at or below
    /// `limit`. (`pfn + span_m1` cannot overflow: a cached block lies in
    /// its domain, whose frames a state map covers, below 2^41.)
    #[inline(always)]
    pub(super) fn pop_top_within(&mut self, limit: u64) -> Option<u64> {
        let top = self.len.load(Relaxed).checked_sub(1)?;
        // SAFETY: `top < loaded_len <= capacity` (the class's invariant).
        let pfn = unsafe { self.m.loaded.get_unchecked(top as usize) };
        if pfn + self.m.span_m1 > limit {
            return None;
        }
        self.len.store(top, Relaxed);
        Some(pfn)
    }

    /// Pushes `pfn` onto the loaded magazine if it has room.
    #[inline(always)]
    pub(super) fn push(&mut self, pfn: u64) -> bool {
        let len = self.len.load(Relaxed);
        if len as usize >= self.m.loaded.capacity() {
            return false;
        }
        // SAFETY: `len < capacity`, checked above.
        unsafe { self.m.loaded.set_unchecked(len as usize, pfn) };
        self.len.store(len + 1, Relaxed);
        true
    }

    /// The fast free of the block of this class at `pfn`, whose state word
    /// is `c`, into the loaded magazine: room first, then the claim (the
    /// owner's plain free with the cache's slot `owner`, else the
    /// exchange, as `claim_own`), so that a claimed block always finds its
    /// place and a refused one changed nothing. `None`: nothing done;
    /// `Some(true)`: freed by the owner's plain free; `Some(false)`:
    /// claimed by the exchange and not yet placed (the caller then takes
    /// the checking path, out of line: `IovaCpuCache::free_claimed`).
    #[inline(always)]
    pub(super) fn free_into(
        &mut self,
        owner: OwnerRef,
        owners: &Owners,
        c: &AtomicU64,
        pfn: u64,
        order: u32,
    ) -> Option<bool> {
        // The length read before the claim: its fences would otherwise
        // make the compiler read it again for the push.
        let len = self.len.load(Relaxed);
        if len as usize >= self.m.loaded.capacity() {
            return None;
        }
        if owner.free(c, self.m.live, self.m.cached) {
            // SAFETY: `len < capacity`, checked above; the magazine was
            // not touched since (`&mut self` is held; the claim reaches
            // only the word and the owner slot).
            unsafe { self.m.loaded.set_unchecked(len as usize, pfn) };
            self.len.store(len + 1, Relaxed);
            return Some(true);
        }
        claim_for_free(c, order, owners, self.m.live & OWNER_MASK).ok()?;
        Some(false)
    }
}

/// Every other path's view of a class: [`ClassMut`] whole, the loaded
/// magazine's length brought in; dropping it stores both magazines'
/// lengths back to the class's atomics (published).
#[derive(Debug)]
pub(super) struct ClassGuard<'a> {
    class: &'a Class,
    m: &'a mut ClassMut,
}

impl Deref for ClassGuard<'_> {
    type Target = ClassMut;
    fn deref(&self) -> &ClassMut {
        self.m
    }
}

impl DerefMut for ClassGuard<'_> {
    fn deref_mut(&mut self) -> &mut ClassMut {
        self.m
    }
}

impl Drop for ClassGuard<'_> {
    fn drop(&mut self) {
        // At most the capacity (the magazine's invariant), which fits.
        let c = self.class;
        c.loaded_len.store(self.m.loaded.len() as u32, Relaxed);
        c.prev_len.store(self.m.prev.len() as u32, Relaxed);
    }
}
