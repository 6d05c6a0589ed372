//! The device IOTLB: IOVA ranges to front-end virtual addresses, fed by the
//! front-end's `IOTLB_MSG` updates and invalidations.
//!
//! It takes every range the protocol allows: a range may end exactly at
//! 2^64 (a global flush arrives as two invalidations, the second ending
//! there); a zero-length or wrapping update is a typed [`IotlbError`] and
//! leaves the table as it was, while an invalidation of size 0 or one that
//! wraps past 2^64 removes every translation (invalidating more than asked
//! is always safe; refusing would keep what the front-end takes for gone).
//! Entries never overlap: an update first
//! removes what it overlaps. The table is bounded: past `capacity` entries
//! it is emptied (counted) and refilled through misses — a device IOTLB may
//! drop any translation at any time.

use std::collections::BTreeMap;

use crate::error::IotlbError;
use crate::proto::iotlb as m;

/// The first and last IOVA an invalidation of `[iova, +size)` removes:
/// the whole space for a size of 0 or a range that wraps past 2^64 (see
/// [`DeviceIotlb::invalidate`]).
pub(crate) fn invalidation_range(iova: u64, size: u64) -> (u64, u64) {
    match (size, last_of(iova, size)) {
        (0, _) | (_, None) => (0, u64::MAX),
        (_, Some(last)) => (iova, last),
    }
}

/// Access rights of a translation (`VHOST_ACCESS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perm {
    /// Device may read only.
    Ro,
    /// Device may write only.
    Wo,
    /// Device may read and write.
    Rw,
}

impl Perm {
    /// The perm for a message's `perm` byte.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            m::ACCESS_RO => Some(Perm::Ro),
            m::ACCESS_WO => Some(Perm::Wo),
            m::ACCESS_RW => Some(Perm::Rw),
            _ => None,
        }
    }

    /// Whether it allows a device write (`write`) or read (`!write`).
    pub fn allows(self, write: bool) -> bool {
        match self {
            Perm::Rw => true,
            Perm::Ro => !write,
            Perm::Wo => write,
        }
    }
}

/// One translation: `[iova, last]` (inclusive) to `uaddr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// First IOVA.
    pub iova: u64,
    /// Last IOVA (inclusive, so a range may end at 2^64).
    pub last: u64,
    /// Front-end virtual address of `iova`.
    pub uaddr: u64,
    /// Access rights.
    pub perm: Perm,
}

/// The outcome of an accepted message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IotlbOutcome {
    /// An update inserted; `replaced` entries (or parts) it overlapped were removed,
    /// `evicted` is true when the table was full and emptied first.
    Updated {
        /// Entries removed or trimmed because the update overlapped them.
        replaced: usize,
        /// Whether the table was emptied to make room.
        evicted: bool,
    },
    /// An invalidation removed (or trimmed) `removed` entries; `evicted`
    /// is true when the pieces it split left the table over its capacity
    /// and it was emptied.
    Invalidated {
        /// Entries removed or trimmed.
        removed: usize,
        /// Whether the table was emptied to stay within its capacity.
        evicted: bool,
    },
}

/// Inclusive last address of `[start, +size)`, or `None` when size is
/// zero or the range runs past 2^64 (the caller tells the two apart).
fn last_of(start: u64, size: u64) -> Option<u64> {
    if size == 0 {
        return None;
    }
    start.checked_add(size - 1)
}

/// The table. Not synchronised: [`crate::space`] guards it.
#[derive(Debug)]
pub struct DeviceIotlb {
    map: BTreeMap<u64, Entry>,
    capacity: usize,
}

impl DeviceIotlb {
    /// An empty table holding at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            map: BTreeMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// The entry covering `iova`, if any.
    pub fn lookup(&self, iova: u64) -> Option<Entry> {
        let (_, e) = self.map.range(..=iova).next_back()?;
        (e.last >= iova).then_some(*e)
    }

    /// Inserts `[iova, +size) -> uaddr` with `perm` (a `VHOST_ACCESS_*` byte).
    pub fn update(
        &mut self,
        iova: u64,
        size: u64,
        uaddr: u64,
        perm: u8,
    ) -> Result<IotlbOutcome, IotlbError> {
        let op = "update";
        if size == 0 {
            return Err(IotlbError::ZeroLength { op, iova });
        }
        let last = last_of(iova, size).ok_or(IotlbError::IovaWraps { op, iova, size })?;
        if last_of(uaddr, size).is_none() {
            return Err(IotlbError::UaddrWraps { uaddr, size });
        }
        let perm = Perm::from_byte(perm).ok_or(IotlbError::BadPerm { perm })?;
        let replaced = self.punch(iova, last);
        let evicted = self.map.len() >= self.capacity;
        if evicted {
            self.map.clear();
        }
        self.map.insert(
            iova,
            Entry {
                iova,
                last,
                uaddr,
                perm,
            },
        );
        Ok(IotlbOutcome::Updated { replaced, evicted })
    }

    /// Removes every translation of `[iova, +size)`; entries partly inside
    /// keep their parts outside. A `size` of 0 is 2^64 bytes — QEMU sends
    /// an invalidation's size as its address mask plus one, which wraps
    /// to 0 for a mask covering the whole address space — and removes
    /// every translation: refusing it would keep translations the guest
    /// has unmapped, and invalidating more than asked is always safe. For
    /// the same reason a range that wraps past 2^64 removes every
    /// translation rather than being refused (QEMU logs a failed
    /// invalidation and goes on as if it were done; a front-end whose own
    /// sum wrapped meant both ends of the address space).
    pub fn invalidate(&mut self, iova: u64, size: u64) -> Result<IotlbOutcome, IotlbError> {
        let (iova, last) = invalidation_range(iova, size);
        let removed = self.punch(iova, last);
        // An invalidation inside one entry splits it in two: a run of them
        // would grow the table one entry each. Past the capacity it is
        // emptied, as a full update empties it.
        let evicted = self.map.len() > self.capacity;
        if evicted {
            self.map.clear();
        }
        Ok(IotlbOutcome::Invalidated { removed, evicted })
    }

    /// Removes `[first, last]` from the table, splitting entries that
    /// straddle its ends; returns how many entries it touched. The work is
    /// bounded by the entries touched (at most the capacity).
    fn punch(&mut self, first: u64, last: u64) -> usize {
        let mut hit: Vec<Entry> = Vec::new();
        if let Some((_, e)) = self.map.range(..first).next_back() {
            if e.last >= first {
                hit.push(*e);
            }
        }
        hit.extend(self.map.range(first..=last).map(|(_, e)| *e));
        for e in &hit {
            self.map.remove(&e.iova);
            if e.iova < first {
                // The part below the hole: [e.iova, first - 1].
                self.map.insert(
                    e.iova,
                    Entry {
                        last: first - 1,
                        ..*e
                    },
                );
            }
            if e.last > last {
                // The part above: [last + 1, e.last]; last < e.last so last + 1 fits.
                let start = last + 1;
                let uaddr = e.uaddr.wrapping_add(start - e.iova);
                self.map.insert(
                    start,
                    Entry {
                        iova: start,
                        uaddr,
                        ..*e
                    },
                );
            }
        }
        hit.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RW: u8 = m::ACCESS_RW;

    #[test]
    fn global_flush_ending_at_2_pow_64_is_taken() {
        let mut t = DeviceIotlb::new(16);
        t.update(0x1000, 0x1000, 0x7000_0000, RW).unwrap();
        t.update(u64::MAX - 0xfff, 0x1000, 0x8000_0000, RW).unwrap();
        // What QEMU sends for a global device-IOTLB flush.
        assert_eq!(
            t.invalidate(0, 0xfef0_0000).unwrap(),
            IotlbOutcome::Invalidated {
                removed: 1,
                evicted: false
            }
        );
        assert_eq!(
            t.invalidate(0xfef0_0000, 0xffff_ffff_0110_0000).unwrap(),
            IotlbOutcome::Invalidated {
                removed: 1,
                evicted: false
            }
        );
        assert!(t.is_empty());
    }

    #[test]
    fn an_invalidation_of_size_zero_is_the_whole_space() {
        // QEMU's size is the address mask plus one: 0 for a mask of all
        // ones, an invalidation of every address.
        let mut t = DeviceIotlb::new(16);
        t.update(0x1000, 0x1000, 0x7000_0000, RW).unwrap();
        t.update(0xffff_f000_0000_0000, 0x1000, 0x7000_1000, RW)
            .unwrap();
        assert_eq!(
            t.invalidate(0x5000, 0).unwrap(),
            IotlbOutcome::Invalidated {
                removed: 2,
                evicted: false
            }
        );
        assert!(t.is_empty());
    }

    #[test]
    fn zero_length_and_wrapping_ranges_are_typed_and_change_nothing() {
        let mut t = DeviceIotlb::new(16);
        t.update(0x1000, 0x1000, 0x7000_0000, RW).unwrap();
        assert!(matches!(
            t.update(0x2000, 0, 0, RW),
            Err(IotlbError::ZeroLength {
                op: "update",
                iova: 0x2000
            })
        ));
        assert!(matches!(
            t.update(u64::MAX, 2, 0, RW),
            Err(IotlbError::IovaWraps { op: "update", .. })
        ));
        assert!(matches!(
            t.update(0, 0x1000, u64::MAX, RW),
            Err(IotlbError::UaddrWraps { .. })
        ));
        assert!(matches!(
            t.update(0, 0x1000, 0, 7),
            Err(IotlbError::BadPerm { perm: 7 })
        ));
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup(0x1fff).unwrap().uaddr, 0x7000_0000);
        // The whole address space in one update ends at 2^64 - 1 inclusive.
        t.update(0, u64::MAX, 0, RW).unwrap();
        assert!(t.lookup(u64::MAX - 1).is_some());
    }

    #[test]
    fn an_invalidation_wrapping_past_the_top_removes_every_translation() {
        // Refused, it would leave the translations a front-end takes for
        // gone; it removes both ends of the address space, and the rest.
        let mut t = DeviceIotlb::new(16);
        t.update(0x1000, 0x1000, 0x7000_0000, RW).unwrap();
        t.update(0x10_0000, 0x1000, 0x7000_1000, RW).unwrap();
        t.update(0xffff_ffff_ffff_0000, 0x10000, 0x7100_0000, RW)
            .unwrap();
        assert_eq!(
            t.invalidate(0xffff_ffff_ffff_f000, 0x2000).unwrap(),
            IotlbOutcome::Invalidated {
                removed: 3,
                evicted: false
            }
        );
        assert!(t.is_empty());
        // Ending exactly at 2^64 does not wrap: only its range goes.
        t.update(0x1000, 0x1000, 0x7000_0000, RW).unwrap();
        t.update(0xffff_ffff_ffff_0000, 0x10000, 0x7100_0000, RW)
            .unwrap();
        t.invalidate(0xffff_ffff_ffff_f000, 0x1000).unwrap();
        assert!(t.lookup(u64::MAX).is_none());
        assert_eq!(t.lookup(0x1000).map(|e| e.uaddr), Some(0x7000_0000));
    }

    #[test]
    fn invalidation_splits_straddling_entries() {
        let mut t = DeviceIotlb::new(16);
        t.update(0x10000, 0x10000, 0x100000, RW).unwrap();
        t.invalidate(0x14000, 0x1000).unwrap();
        assert_eq!(t.lookup(0x13fff).unwrap().last, 0x13fff);
        assert!(t.lookup(0x14000).is_none());
        let hi = t.lookup(0x15000).unwrap();
        assert_eq!((hi.iova, hi.uaddr, hi.last), (0x15000, 0x105000, 0x1ffff));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = DeviceIotlb::new(4);
        for i in 0..4 {
            t.update(i * 0x1000, 0x1000, 0, RW).unwrap();
        }
        assert_eq!(
            t.update(0x9000, 0x1000, 0, RW).unwrap(),
            IotlbOutcome::Updated {
                replaced: 0,
                evicted: true
            }
        );
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn invalidations_that_split_an_entry_stay_within_the_capacity() {
        let mut t = DeviceIotlb::new(4);
        t.update(0, 1 << 40, 0x7000_0000_0000, RW).unwrap();
        // Each one-byte hole inside the entry splits a piece in two.
        for k in 1..=3u64 {
            assert_eq!(
                t.invalidate(2 * k + 1, 1).unwrap(),
                IotlbOutcome::Invalidated {
                    removed: 1,
                    evicted: false
                }
            );
            assert_eq!(t.len() as u64, k + 1);
        }
        assert_eq!(
            t.invalidate(9, 1).unwrap(),
            IotlbOutcome::Invalidated {
                removed: 1,
                evicted: true
            }
        );
        assert!(t.is_empty());
        for k in 0..1000u64 {
            t.update(0, 1 << 40, 0x7000_0000_0000, RW).unwrap();
            t.invalidate(2 * k + 1, 1).unwrap();
            assert!(t.len() <= 4, "{} entries", t.len());
        }
    }
}
