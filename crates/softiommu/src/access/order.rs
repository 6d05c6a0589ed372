//! The orderer: which fence an access needs, given its direction, its mode
//! and what the same accessor did before. One per accessor (so per device
//! thread); its state is two bits, and it writes nothing shared.
//!
//! # The rule
//!
//! Program order between two accesses `A` then `B` of one device is kept by
//! one of four orderings; the guest relies on all four (a NIC reads a
//! descriptor *then* its buffer; writes a buffer *then* the status; writes
//! the used index *then* reads the guest's event index):
//!
//! | `A` → `B`   | how an ordered access keeps it                                   |
//! |-------------|------------------------------------------------------------------|
//! | load → load | `A` is an acquire load (bulk: an acquire fence after it)         |
//! | load → store| the same acquire, or `B` is a release store                       |
//! | store→store | `B` is a release store (bulk: a release fence before it)         |
//! | store→load  | a `store_load` fence before `B`, only if a store is pending      |
//!
//! So an ordered load pays a fence only when the accessor stored since its
//! last fence, and nothing else pays anything but acquire/release, which on
//! x86 (TSO) are plain moves: the only costly case there is a store
//! followed by a load, as the issue predicts. Relaxed accesses leave a mark
//! (`LOAD_PENDING` / `STORE_PENDING`) so that the next ordered access still
//! orders itself after them: an ordered access is ordered after *every*
//! earlier access of its accessor, relaxed or not, and an ordered load
//! before every later one.
//!
//! `Full` issues the full fence before every access, as QEMU does, and then
//! accesses as relaxed.

use std::marker::PhantomData;
use std::sync::atomic::Ordering;

use super::attrs::OrderMode;
use super::fence::Fences;

/// A load since the last fence that was not itself acquire.
const LOAD_PENDING: u8 = 1;
/// A store since the last full fence.
const STORE_PENDING: u8 = 2;

/// The ordering state of one accessor.
#[derive(Debug, Default)]
pub(crate) struct Orderer<F> {
    pending: u8,
    /// Full (store-load or unconditional) fences issued.
    full_fences: u64,
    _fences: PhantomData<F>,
}

impl<F: Fences> Orderer<F> {
    /// A fresh orderer: nothing pending.
    pub(crate) fn new() -> Self {
        Self {
            pending: 0,
            full_fences: 0,
            _fences: PhantomData,
        }
    }

    /// Full fences issued so far.
    pub(crate) fn full_fences(&self) -> u64 {
        self.full_fences
    }

    /// Before a load (typed or bulk) in `mode`.
    #[inline(always)]
    fn pre_load(&mut self, mode: OrderMode) {
        match mode {
            OrderMode::Relaxed => {}
            OrderMode::Ordered => {
                if self.pending & STORE_PENDING != 0 {
                    F::store_load();
                    self.full_fences += 1;
                } else if self.pending & LOAD_PENDING != 0 {
                    // An earlier relaxed load must not pass this one.
                    F::acquire();
                }
                self.pending = 0;
            }
            OrderMode::Full => {
                F::full();
                self.full_fences += 1;
                self.pending = 0;
            }
        }
    }

    /// Before a store (typed or bulk) in `mode`: the full fence of `Full`
    /// (the ordered mode's release is the store's own, or the bulk path's).
    #[inline(always)]
    fn pre_store(&mut self, mode: OrderMode) {
        if mode == OrderMode::Full {
            F::full();
            self.full_fences += 1;
            self.pending = 0;
        }
    }

    /// A word load: `load` gets the ordering to load with.
    #[inline(always)]
    pub(crate) fn load<T>(&mut self, mode: OrderMode, load: impl FnOnce(Ordering) -> T) -> T {
        self.pre_load(mode);
        match mode {
            // Acquire: this load before every later access (load→load,
            // load→store).
            OrderMode::Ordered => load(Ordering::Acquire),
            OrderMode::Relaxed | OrderMode::Full => {
                let v = load(Ordering::Relaxed);
                self.pending |= LOAD_PENDING;
                v
            }
        }
    }

    /// A word store: `store` gets the ordering to store with.
    #[inline(always)]
    pub(crate) fn store(&mut self, mode: OrderMode, store: impl FnOnce(Ordering)) {
        self.pre_store(mode);
        match mode {
            // Release: every earlier access before this store (load→store,
            // store→store); it settles pending loads too.
            OrderMode::Ordered => {
                store(Ordering::Release);
                self.pending = STORE_PENDING;
            }
            OrderMode::Relaxed | OrderMode::Full => {
                store(Ordering::Relaxed);
                self.pending |= STORE_PENDING;
            }
        }
    }

    /// A bulk (byte-copy) read.
    #[inline(always)]
    pub(crate) fn bulk_read<R>(&mut self, mode: OrderMode, copy: impl FnOnce() -> R) -> R {
        self.pre_load(mode);
        let r = copy();
        match mode {
            // The bytes' loads before every later access.
            OrderMode::Ordered => F::acquire(),
            OrderMode::Relaxed | OrderMode::Full => self.pending |= LOAD_PENDING,
        }
        r
    }

    /// A bulk (byte-copy or fill) write.
    #[inline(always)]
    pub(crate) fn bulk_write<R>(&mut self, mode: OrderMode, copy: impl FnOnce() -> R) -> R {
        self.pre_store(mode);
        if mode == OrderMode::Ordered {
            // Every earlier access before the bytes' stores.
            F::release();
            self.pending = 0;
        }
        let r = copy();
        self.pending |= STORE_PENDING;
        r
    }

    /// The start of a zero-copy mapping the device will `read` and/or
    /// `write` through without fences: ordered as its first access would be.
    pub(crate) fn map_start(&mut self, mode: OrderMode, read: bool, write: bool) {
        match mode {
            OrderMode::Relaxed => {}
            OrderMode::Full => self.pre_store(mode),
            OrderMode::Ordered => {
                if read {
                    self.pre_load(mode);
                }
                if write {
                    F::release();
                    self.pending = 0;
                }
            }
        }
    }

    /// The end of a zero-copy mapping: what it did is ordered before the
    /// accessor's later ordered accesses, as its last access would be.
    pub(crate) fn map_end(&mut self, mode: OrderMode, read: bool, write: bool) {
        if read {
            if mode == OrderMode::Ordered {
                F::acquire();
            } else {
                self.pending |= LOAD_PENDING;
            }
        }
        if write {
            self.pending |= STORE_PENDING;
        }
    }

    /// An explicit fence asked for by a device that orders itself.
    pub(crate) fn explicit(&mut self, loads: bool, stores: bool) {
        match (loads, stores) {
            (true, false) => {
                F::acquire();
                self.pending &= !LOAD_PENDING;
            }
            (false, true) => F::release(),
            _ => {
                F::store_load();
                self.full_fences += 1;
                self.pending = 0;
            }
        }
    }
}
