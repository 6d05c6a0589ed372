//! The record of pass-through mappings, so that an unmap in pass-through is
//! checked as strictly as in any other policy.
//!
//! A pass-through mapping has no IOVA and no page-table entry to check an
//! unmap against, yet an unmap of something never mapped must be refused,
//! and a switch out of pass-through must know exactly which mappings are
//! live (the device's context changes under them). Each CPU keeps the
//! mappings it made, keyed by (address, length, owner: the mapping
//! device and direction, packed above the length in one word) with a
//! count (a buffer may be mapped twice), in a map behind its own lock:
//! the owner is the only one to take it unless another CPU unmaps what
//! this one mapped (a
//! completion handled elsewhere), which then searches every CPU's record.
//! So the usual map and unmap cost an uncontended lock and a short probe,
//! and nothing is shared between CPUs on that path.

#![deny(clippy::indexing_slicing)]

use std::sync::Mutex;

use super::error::DmaError;
use super::owner::{dir_bits, dir_of};
use super::policy::DmaDirection;
use crate::hw::SourceId;
use crate::sync::lock_std as lock;

/// One recorded mapping: `len == 0` marks a free slot (no mapping has
/// length 0: `map` refuses it). `len` is the record's key length: the
/// mapping's length with its owner above it (see [`key`]).
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    addr: u64,
    len: u64,
    count: u64,
}

/// An open-addressing table of mappings, keyed by (address, length), with
/// linear probing and deletion by backward shift (Knuth, TAOCP vol. 3,
/// §6.4, Algorithm R), so no tombstones build up. Its size is a power of
/// two, grown (doubled) past 3/4 full: an allocation only on growth, never
/// on an ordinary map or unmap. The hash is Fibonacci hashing (same
/// section): the keys are addresses and lengths the CPU's own caller
/// mapped, not attacker-chosen strings a flood could aim at.
#[derive(Debug, Default)]
struct Table {
    slots: Vec<Slot>,
    used: usize,
}

/// The table's first size.
const FIRST_SLOTS: usize = 64;

impl Table {
    #[inline]
    fn home(&self, addr: u64, len: u64) -> usize {
        let h = (addr ^ len.rotate_left(40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // The top bits, as many as the size has (a power of two >= 64).
        (h >> (64 - self.slots.len().trailing_zeros())) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot of (addr, len), or the free slot where it would go.
    #[inline]
    fn find(&self, addr: u64, len: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(addr, len);
        // The table is never full (3/4 at most), so a free slot ends the
        // probe.
        loop {
            match self.slots.get(i) {
                Some(s) if s.len == 0 => return (i, false),
                Some(s) if s.addr == addr && s.len == len => return (i, true),
                Some(_) => i = (i + 1) & mask,
                None => return (i, false), // unreachable: `i <= mask`
            }
        }
    }

    fn add(&mut self, addr: u64, len: u64, n: u64) {
        if (self.used + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let (i, found) = self.find(addr, len);
        if let Some(s) = self.slots.get_mut(i) {
            if found {
                s.count += n;
            } else {
                *s = Slot {
                    addr,
                    len,
                    count: n,
                };
                self.used += 1;
            }
        }
    }

    #[cold]
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(FIRST_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); size]);
        self.used = 0;
        for s in old.into_iter().filter(|s| s.len != 0) {
            self.add(s.addr, s.len, s.count);
        }
    }

    fn take(&mut self, addr: u64, len: u64) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let (i, found) = self.find(addr, len);
        if !found {
            return false;
        }
        match self.slots.get_mut(i) {
            Some(s) if s.count > 1 => s.count -= 1,
            Some(_) => self.remove_at(i),
            None => return false,
        }
        true
    }

    /// Frees slot `i` and moves later entries of its probe run back, so
    /// every entry stays reachable from its home slot.
    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some(&s) = self.slots.get(j) else { break };
            if s.len == 0 {
                break;
            }
            let home = self.home(s.addr, s.len);
            // `s` may fill the hole if its home is not in (hole, j]
            // (cyclically): then the hole lies on its probe path.
            let moves = if hole <= j {
                home <= hole || home > j
            } else {
                home <= hole && home > j
            };
            if moves {
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = s;
                }
                hole = j;
            }
        }
        if let Some(h) = self.slots.get_mut(hole) {
            *h = Slot::default();
        }
        self.used -= 1;
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|s| s.len != 0)
    }
}

/// One CPU's (or the retired CPUs') pass-through mappings.
#[derive(Debug, Default)]
pub(crate) struct PtRecord {
    live: Mutex<Table>,
}

/// Bits of a record's key length that hold the mapping's length; its
/// owner (see [`pt_owner`], 18 bits) sits above them. A mapping lies in
/// the arena, so its length fits.
const LEN_BITS: u32 = 44;
const LEN_MASK: u64 = (1 << LEN_BITS) - 1;
const _: () = assert!(crate::mem::MAX_ARENA_BYTES <= LEN_MASK);

/// The key length of a mapping of `len` bytes for `owner`: one word, so
/// the table's probe compares what it compared before owners were kept.
#[inline]
fn key(len: u64, owner: u32) -> u64 {
    (len & LEN_MASK) | (u64::from(owner) << LEN_BITS)
}

impl PtRecord {
    /// Records a mapping of `len` bytes (not 0) at `addr` for `owner`.
    #[inline]
    pub(crate) fn add(&self, addr: u64, len: u64, owner: u32) {
        debug_assert!(len != 0, "map refuses length 0");
        // A zero length would read as a free slot; it is never recorded
        // (and so never found by an unmap).
        if len != 0 {
            lock(&self.live).add(addr, key(len, owner), 1);
        }
    }

    /// Removes one mapping of `len` bytes at `addr` for `owner`, if
    /// recorded here.
    #[inline]
    pub(crate) fn take(&self, addr: u64, len: u64, owner: u32) -> bool {
        len != 0 && len <= LEN_MASK && lock(&self.live).take(addr, key(len, owner))
    }

    /// Whether a mapping of `len` bytes at `addr` for `owner` is recorded.
    pub(crate) fn holds(&self, addr: u64, len: u64, owner: u32) -> bool {
        let t = lock(&self.live);
        len != 0 && len <= LEN_MASK && !t.slots.is_empty() && t.find(addr, key(len, owner)).1
    }

    /// The owner of some mapping of exactly `len` bytes at `addr`
    /// (whichever owner: to tell a wrong device or direction).
    fn owner_of(&self, addr: u64, len: u64) -> Option<u32> {
        lock(&self.live)
            .iter()
            .find(|s| s.addr == addr && s.len & LEN_MASK == len)
            .map(|s| (s.len >> LEN_BITS) as u32)
    }

    /// How well a recorded mapping covers `[addr, end)`: `Some(true)` if
    /// one holds it whole, `Some(false)` if one holds `addr` only, `None`
    /// if none holds `addr`. A scan: syncs in pass-through are not the
    /// path a device's throughput rides on.
    pub(crate) fn covers(&self, addr: u64, end: u64) -> Option<bool> {
        let t = lock(&self.live);
        let mut best = None;
        for s in t.iter() {
            let len = s.len & LEN_MASK;
            if s.addr <= addr && addr - s.addr < len {
                if end - s.addr <= len {
                    return Some(true);
                }
                best = Some(false);
            }
        }
        best
    }

    /// Whether a mapping at `addr` of any length is recorded (to tell a
    /// wrong length from an address never mapped).
    pub(crate) fn has_addr(&self, addr: u64) -> bool {
        lock(&self.live).iter().any(|s| s.addr == addr)
    }

    /// Moves every record into `into` (a CPU's handle is going away; its
    /// mappings stay live).
    pub(crate) fn move_into(&self, into: &PtRecord) {
        let taken = std::mem::take(&mut *lock(&self.live));
        let mut dst = lock(&into.live);
        for s in taken.iter() {
            dst.add(s.addr, s.len, s.count);
        }
    }

    /// Mappings recorded.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        lock(&self.live).iter().map(|s| s.count).sum()
    }
}

/// Removes one mapping of `len` bytes at `addr` made by device `sid` in
/// direction `dir` from the first record of `records` (`own` first) that
/// has it. If none does, nothing changes and the reason is given:
/// `WrongDevice` or `WrongDirection` (the exact mapping is another
/// device's or direction's), `WrongLength` (one of another length starts
/// there), else `NotMapped`.
pub(crate) fn take_any<'a>(
    own: &PtRecord,
    others: impl Iterator<Item = &'a PtRecord> + Clone,
    addr: u64,
    len: u64,
    sid: SourceId,
    dir: DmaDirection,
) -> Result<(), DmaError> {
    let owner = pt_owner(sid, dir);
    if own.take(addr, len, owner) || others.clone().any(|r| r.take(addr, len, owner)) {
        return Ok(());
    }
    let other = own
        .owner_of(addr, len)
        .or_else(|| others.clone().find_map(|r| r.owner_of(addr, len)));
    if let Some(o) = other {
        return Err(if o >> 2 != owner >> 2 {
            DmaError::WrongDevice {
                sid: sid.to_string(),
            }
        } else {
            DmaError::WrongDirection {
                addr,
                mapped: dir_of(o),
                asked: dir,
            }
        });
    }
    if own.has_addr(addr) || others.into_iter().any(|r| r.has_addr(addr)) {
        Err(DmaError::WrongLength { addr, len })
    } else {
        Err(DmaError::NotMapped { addr })
    }
}

/// A pass-through mapping's owner key: the device's source id and the
/// direction's bits.
#[inline]
pub(crate) fn pt_owner(sid: SourceId, dir: DmaDirection) -> u32 {
    (u32::from(sid.0) << 2) | dir_bits(dir)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    const S: SourceId = SourceId(1);
    const D: DmaDirection = DmaDirection::ToDevice;
    /// The owner key of `S` mapping in `D`.
    const O: u32 = (1 << 2) | 1;

    #[test]
    fn owners_and_lengths_past_the_key_are_told_apart() {
        let r = PtRecord::default();
        r.add(0x1000, 100, O);
        // A length that would alias in the packed key is refused.
        assert!(!r.take(0x1000, 100 | 1 << LEN_BITS, O));
        assert!(!r.take(0x1000, 100, O ^ 1));
        assert_eq!(
            take_any(&r, std::iter::empty(), 0x1000, 100, SourceId(2), D),
            Err(DmaError::WrongDevice {
                sid: SourceId(2).to_string()
            })
        );
        assert_eq!(
            take_any(
                &r,
                std::iter::empty(),
                0x1000,
                100,
                S,
                DmaDirection::FromDevice
            ),
            Err(DmaError::WrongDirection {
                addr: 0x1000,
                mapped: D,
                asked: DmaDirection::FromDevice
            })
        );
        assert_eq!(r.covers(0x1010, 0x1064), Some(true));
        assert_eq!(r.covers(0x1010, 0x1065), Some(false));
        assert_eq!(r.covers(0x2000, 0x2001), None);
        assert!(r.take(0x1000, 100, O));
    }

    /// The table against a model (a multiset), through growth and many
    /// removals that shift probe runs back.
    #[test]
    fn the_table_agrees_with_a_model() {
        use std::collections::HashMap;
        let r = PtRecord::default();
        let mut model: HashMap<(u64, u64), u64> = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct keys near each other: long probe runs.
            let addr = (x % 700) * 0x40;
            let len = 1 + (x >> 20) % 3;
            if (x >> 40).is_multiple_of(3) {
                r.add(addr, len, O);
                *model.entry((addr, len)).or_insert(0) += 1;
            } else {
                let want = match model.get_mut(&(addr, len)) {
                    Some(n) if *n > 1 => {
                        *n -= 1;
                        true
                    }
                    Some(_) => {
                        model.remove(&(addr, len));
                        true
                    }
                    None => false,
                };
                assert_eq!(r.take(addr, len, O), want, "step {step}");
            }
        }
        assert_eq!(r.len(), model.values().sum::<u64>());
        for (&(addr, len), &n) in &model {
            for _ in 0..n {
                assert!(r.take(addr, len, O));
            }
            assert!(!r.take(addr, len, O));
        }
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn mappings_are_counted_and_taken_exactly() {
        let (a, b) = (PtRecord::default(), PtRecord::default());
        a.add(0x1000, 64, O);
        a.add(0x1000, 64, O);
        b.add(0x9000, 8, O);
        assert_eq!(take_any(&b, [&a].into_iter(), 0x1000, 64, S, D), Ok(()));
        assert_eq!(
            take_any(&b, [&a].into_iter(), 0x1000, 65, S, D),
            Err(DmaError::WrongLength {
                addr: 0x1000,
                len: 65
            })
        );
        assert_eq!(
            take_any(&a, [&b].into_iter(), 0x5000, 1, S, D),
            Err(DmaError::NotMapped { addr: 0x5000 })
        );
        assert_eq!(a.len(), 1);
        b.move_into(&a);
        assert_eq!(a.len(), 2);
        assert_eq!(take_any(&a, std::iter::empty(), 0x9000, 8, S, D), Ok(()));
        assert_eq!(take_any(&a, std::iter::empty(), 0x1000, 64, S, D), Ok(()));
        assert_eq!(
            take_any(&a, std::iter::empty(), 0x1000, 64, S, D),
            Err(DmaError::NotMapped { addr: 0x1000 })
        );
    }
}
