//! The IOMMU units a domain spans: bit `i` of a unit mask is entry `i`.
//! Append-only (a unit stays once a device behind it attached), so every
//! invalidation reads it without a lock or a copy.
//!
//! ## A unit joins before its first translation
//!
//! An unmap clears its entries, then reads the mask to know which units to
//! invalidate; an attach adds the unit to the mask, then installs the
//! device's context. A store then a load on each side (Dekker): without a
//! full fence on both, the unmap could miss the new unit while the new
//! device's first walk still read the entry being cleared, and that
//! translation would stay cached in a unit nobody invalidates. The fences
//! are asymmetric, as the gate's: a compiler fence per unmap
//! ([`UnitList::mask_after_clear`]), `membarrier(2)` per attach
//! ([`UnitList::join`]). The loom model at the bottom checks it.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU16, AtomicUsize};
use std::sync::Mutex;

use super::error::DmaError;
use crate::hw::UnitId;
use crate::sync::barrier::Barrier;
use crate::sync::{AtomicU64, Ordering};

/// The most units a domain can span: the width of a unit mask.
pub(crate) const MAX_UNITS: usize = 64;

/// An append-only list of at most [`MAX_UNITS`] unit ids.
#[derive(Debug)]
pub(crate) struct UnitList {
    ids: [AtomicU16; MAX_UNITS],
    len: AtomicUsize,
    /// Bit `i`: entry `i` is a unit some device of the domain sits behind.
    mask: AtomicU64,
    /// Serialises appends (attaches); readers never take it.
    append: Mutex<()>,
}

impl Default for UnitList {
    fn default() -> Self {
        Self {
            ids: std::array::from_fn(|_| AtomicU16::new(0)),
            len: AtomicUsize::new(0),
            mask: AtomicU64::new(0),
            append: Mutex::new(()),
        }
    }
}

impl UnitList {
    /// Adds `unit` to the mask (appending it if it is new) before a device
    /// behind it attaches; returns its bit. Call it before the device's
    /// context is installed (module doc).
    pub(crate) fn join(&self, unit: UnitId, barrier: Barrier) -> Result<usize, DmaError> {
        let bit = self.bit_of(unit)?;
        // Release: a reader that sees the bit (an Acquire load) sees the
        // unit's id and the list's new length (`bit_of`'s stores), so it
        // finds the unit of every bit it sees.
        self.mask.fetch_or(1 << bit, Ordering::Release);
        barrier.heavy();
        Ok(bit)
    }

    /// The mask, for a caller with nothing to order against it.
    pub(crate) fn mask(&self) -> u64 {
        // Acquire: as in `mask_after_clear`.
        self.mask.load(Ordering::Acquire)
    }

    /// The mask, read after the caller cleared entries: the light half of
    /// the fence pair [`join`](Self::join) completes.
    #[inline]
    pub(crate) fn mask_after_clear(&self, barrier: Barrier) -> u64 {
        barrier.light();
        // Acquire: pairs with `join`'s Release, so `in_mask` finds the
        // unit of every bit seen (a plain load on x86).
        self.mask.load(Ordering::Acquire)
    }

    /// The bit of `unit`, appending it if it is new.
    fn bit_of(&self, unit: UnitId) -> Result<usize, DmaError> {
        let _append = self.append.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.len.load(Relaxed);
        if let Some(i) = (0..n).find(|&i| self.ids[i].load(Relaxed) == unit.0) {
            return Ok(i);
        }
        if n == MAX_UNITS {
            return Err(DmaError::TooManyUnits);
        }
        self.ids[n].store(unit.0, Relaxed);
        // Release: a reader that sees the new length sees the id.
        self.len.store(n + 1, Release);
        Ok(n)
    }

    /// The units whose bits are set in `mask`, in bit order.
    pub(crate) fn in_mask(&self, mask: u64) -> impl Iterator<Item = UnitId> + '_ {
        let n = self.len.load(Acquire);
        // Walks the set bits only (one step per unit, not per slot): the
        // deferred unmap's deadline cover runs this on every unmap.
        let mut left = if n >= MAX_UNITS {
            mask
        } else {
            mask & ((1u64 << n) - 1)
        };
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            let i = left.trailing_zeros() as usize;
            left &= left - 1;
            self.ids.get(i).map(|id| UnitId(id.load(Relaxed)))
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn units_get_stable_bits_and_the_65th_is_refused() {
        let l = UnitList::default();
        let b = Barrier::Fence;
        assert_eq!(l.join(UnitId(7), b).unwrap(), 0);
        assert_eq!(l.join(UnitId(3), b).unwrap(), 1);
        assert_eq!(l.join(UnitId(7), b).unwrap(), 0, "known: same bit");
        assert_eq!(l.mask(), 0b11);
        assert_eq!(l.mask_after_clear(b), 0b11);
        assert_eq!(l.in_mask(0b10).collect::<Vec<_>>(), vec![UnitId(3)]);
        assert_eq!(l.in_mask(u64::MAX).count(), 2);
        for u in 100..162 {
            l.join(UnitId(u), b).unwrap();
        }
        assert!(matches!(
            l.join(UnitId(999), b),
            Err(DmaError::TooManyUnits)
        ));
        assert_eq!(l.in_mask(u64::MAX).count(), 64);
        assert_eq!(l.mask(), u64::MAX, "all 64 bits, no shift overflow");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;

    /// An unmap clears an entry while a device attaches behind a new unit:
    /// if the device's first walk read the entry before the clear (so its
    /// unit may cache it), the unmap must see the unit in the mask.
    #[test]
    fn loom_a_joining_unit_is_invalidated_or_walks_the_cleared_entry() {
        loom::model(|| {
            let list = Arc::new(UnitList::default());
            let ctx = Arc::new(AtomicBool::new(false));
            let pte = Arc::new(AtomicU64::new(0xAAA));
            let attach = {
                let (list, ctx) = (list.clone(), ctx.clone());
                loom::thread::spawn(move || {
                    list.join(UnitId(1), Barrier::Fence).unwrap();
                    ctx.store(true, Ordering::Release);
                })
            };
            let device = {
                let (ctx, pte) = (ctx.clone(), pte.clone());
                loom::thread::spawn(move || {
                    // Acquire: the context is seen installed, with what the
                    // attach did before installing it.
                    ctx.load(Ordering::Acquire) && pte.load(Ordering::Relaxed) == 0xAAA
                })
            };
            pte.store(0, Ordering::Relaxed);
            let mask = list.mask_after_clear(Barrier::Fence);
            attach.join().unwrap();
            let cached_stale = device.join().unwrap();
            assert!(
                !cached_stale || mask & 1 != 0,
                "a new unit cached the entry and the unmap did not invalidate it"
            );
        });
    }
}
