//! One state byte per page frame of the domain: which block starts there,
//! of what order, and whether it is held by a user or by a cache.
//!
//! This is what lets a free through the per-CPU cache, which never touches
//! the tree, still refuse a double free, a free of something never
//! allocated, or a free with the wrong size. Only the first page of a block
//! has a state; blocks are size aligned, so the block holding any page is
//! found by checking the O(log) aligned candidates below it.
//!
//! The bytes live in a lazily committed `mmap` reservation (a 48-bit domain
//! reserves 64 GiB of address space; only pages near live IOVAs are
//! committed). Access is relaxed atomic loads and stores, which compile to
//! plain moves: no read-modify-write on the hot path. The cost of that
//! choice: a check and its update are two steps, so two threads freeing the
//! *same* IOVA at the same instant can both pass the check. Every sequential
//! misuse is caught.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use crate::mem::{MemError, Reservation};

/// The block starting here is held by a user (bits 0..6 = order).
pub(crate) const LIVE: u8 = 0x40;
/// The block starting here sits in a per-CPU cache or the depot.
pub(crate) const CACHED: u8 = 0x80;
/// The block starting here was released by its user but is not free yet:
/// a deferred unmap's IOVA, waiting for the flush that makes it reusable.
pub(crate) const RETIRED: u8 = LIVE | CACHED;
const ORDER_MASK: u8 = 0x3f;

/// The state map of one domain.
#[derive(Debug)]
pub(crate) struct LiveMap {
    bytes: Reservation,
    len: u64,
}

impl LiveMap {
    /// A map for frames `0..=end_pfn`.
    pub(crate) fn new(end_pfn: u64) -> Result<Self, MemError> {
        let len = end_pfn + 1;
        Ok(Self {
            bytes: Reservation::new(len)?,
            len,
        })
    }

    fn cell(&self, pfn: u64) -> Option<&AtomicU8> {
        // SAFETY: `pfn < len <= mapping length`; the byte lives as long as
        // `self`, and every access to it is atomic.
        (pfn < self.len).then(|| unsafe { AtomicU8::from_ptr(self.bytes.base().add(pfn as usize)) })
    }

    /// The raw state at `pfn` (0 when out of range).
    #[inline]
    pub(crate) fn get(&self, pfn: u64) -> u8 {
        self.cell(pfn).map_or(0, |c| c.load(Relaxed))
    }

    /// Sets the state at `pfn` (in range by construction of the callers).
    #[inline]
    pub(crate) fn set(&self, pfn: u64, state: u8) {
        if let Some(c) = self.cell(pfn) {
            c.store(state, Relaxed);
        }
    }

    /// The block (start, order, state) that contains `pfn`, if one is
    /// allocated in the tree (live or cached).
    pub(crate) fn block_containing(&self, pfn: u64) -> Option<(u64, u32, u8)> {
        for k in 0..=ORDER_MASK as u32 {
            let start = pfn & !((1u64 << k) - 1);
            let s = self.get(start);
            if s != 0 && (s & ORDER_MASK) as u32 == k {
                return Some((start, k, s & !ORDER_MASK));
            }
            if start == 0 {
                break;
            }
        }
        None
    }
}

/// The state byte of a block of `order` with flag `flag`.
#[inline]
pub(crate) fn state(flag: u8, order: u32) -> u8 {
    flag | order as u8
}
