//! The record of pass-through mappings, so that an unmap in pass-through is
//! checked as strictly as in any other policy.
//!
//! A pass-through mapping has no IOVA and no page-table entry to check an
//! unmap against, yet an unmap of something never mapped must be refused,
//! and a switch out of pass-through must know exactly which mappings are
//! live (the device's context changes under them). Each CPU keeps the
//! mappings it made, keyed by (address, length, owner: the mapping
//! device and direction, packed above the length in one word), one entry
//! per mapping (a buffer may be mapped twice), in a table behind its own
//! spin lock ([`SpinLock`]: one compare-exchange and one store per call):
//! the owner is the only one to take it unless another CPU unmaps what
//! this one mapped (a
//! completion handled elsewhere), which then searches every CPU's record.
//! So the usual map and unmap cost an uncontended lock and a short probe,
//! and nothing is shared between CPUs on that path.

#![deny(clippy::indexing_slicing)]

use super::error::DmaError;
use super::owner::{dir_bits, dir_of};
use super::policy::DmaDirection;
use crate::hw::SourceId;
use crate::sync::spin::SpinLock;

/// One recorded mapping: `len == 0` marks a free slot (no mapping has
/// length 0: `map` refuses it). `len` is the record's key length: the
/// mapping's length with its owner above it (see [`key`]). A buffer mapped
/// twice has two slots.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    addr: u64,
    len: u64,
}

/// An open-addressing table of mappings, keyed by (address, length), with
/// linear probing and deletion by backward shift (Knuth, TAOCP vol. 3,
/// §6.4, Algorithm R), so no tombstones build up. Its size is a power of
/// two, at least [`FIRST_SLOTS`] from the start, doubled at 3/4 full: an
/// allocation only when a CPU's first handle is made and on growth, never
/// on an ordinary map or unmap. The hash is Fibonacci hashing (same
/// section): the keys are addresses and lengths the CPU's own caller
/// mapped, not attacker-chosen strings a flood could aim at. Equal keys
/// (a buffer mapped twice) are separate entries of one probe run: an add
/// stops at the first free slot, a take at the first equal key.
#[derive(Debug)]
struct Table {
    /// Never empty, a power of two long (every index is taken `& mask`).
    slots: Vec<Slot>,
    used: usize,
    /// `used` at which the next add grows the table (3/4 of its size).
    limit: usize,
    /// 64 minus log2 of the size: the hash's top bits index the table.
    shift: u32,
}

/// The table's first size.
const FIRST_SLOTS: usize = 64;

impl Default for Table {
    fn default() -> Self {
        Self::with_size(FIRST_SLOTS)
    }
}

impl Table {
    /// An empty table of `size` slots (a power of two, at least 2).
    fn with_size(size: usize) -> Self {
        debug_assert!(size.is_power_of_two() && size >= 2);
        Self {
            slots: vec![Slot::default(); size],
            used: 0,
            limit: size / 4 * 3,
            shift: 64 - size.trailing_zeros(),
        }
    }

    /// The home slot of a key.
    #[inline(always)]
    fn home(&self, addr: u64, len: u64) -> usize {
        let h = (addr ^ len.rotate_left(40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> self.shift) as usize & self.mask()
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Slot `i & mask`.
    #[inline(always)]
    fn at(&self, i: usize) -> &Slot {
        let i = i & self.mask();
        // SAFETY: `slots` is never empty and a power of two long, so
        // `i & (len - 1) < len`.
        unsafe { self.slots.get_unchecked(i) }
    }

    /// Slot `i & mask`, to write.
    #[inline(always)]
    fn at_mut(&mut self, i: usize) -> &mut Slot {
        let i = i & self.mask();
        // SAFETY: as in `at`.
        unsafe { self.slots.get_unchecked_mut(i) }
    }

    /// The slot of (addr, len), if recorded.
    #[inline(always)]
    fn find(&self, addr: u64, len: u64) -> Option<usize> {
        let mut i = self.home(addr, len);
        // The table is never full (3/4 at most), so a free slot ends the
        // probe.
        loop {
            let s = self.at(i);
            if s.addr == addr && s.len == len {
                return Some(i & self.mask());
            }
            if s.len == 0 {
                return None;
            }
            i += 1;
        }
    }

    #[inline(always)]
    fn add(&mut self, addr: u64, len: u64) {
        if self.used >= self.limit {
            self.grow();
        }
        let mut i = self.home(addr, len);
        while self.at(i).len != 0 {
            i += 1;
        }
        *self.at_mut(i) = Slot { addr, len };
        self.used += 1;
    }

    #[cold]
    fn grow(&mut self) {
        let old = std::mem::replace(self, Self::with_size(self.slots.len() * 2));
        for s in old.iter() {
            self.add(s.addr, s.len);
        }
    }

    #[inline(always)]
    fn take(&mut self, addr: u64, len: u64) -> bool {
        match self.find(addr, len) {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// Frees slot `i` and moves later entries of its probe run back, so
    /// every entry stays reachable from its home slot.
    #[inline(always)]
    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let s = *self.at(j);
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
                *self.at_mut(hole) = s;
                hole = j;
            }
        }
        self.at_mut(hole).len = 0;
        self.used -= 1;
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|s| s.len != 0)
    }
}

/// One CPU's (or the retired CPUs') pass-through mappings.
#[derive(Debug, Default)]
pub(crate) struct PtRecord {
    live: SpinLock<Table>,
}

/// Bits of a record's key length that hold the mapping's length; its
/// owner (see [`pt_owner`], 18 bits, and [`PT_SG`]) sits above them. A mapping lies in
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
    /// As [`add`](Self::add), with the owner as [`owner_key`] made it
    /// (the device keeps it, so the fast path does not build it).
    #[inline(always)]
    pub(crate) fn add_keyed(&self, addr: u64, len: u64, owner_key: u64) {
        debug_assert!(len != 0 && len <= LEN_MASK, "map checks the range");
        if len != 0 {
            self.live
                .with(|t| t.add(addr, (len & LEN_MASK) | owner_key));
        }
    }

    /// As [`take`](Self::take), with the owner as [`owner_key`] made it.
    #[inline(always)]
    pub(crate) fn take_keyed(&self, addr: u64, len: u64, owner_key: u64) -> bool {
        len != 0 && len <= LEN_MASK && self.live.with(|t| t.take(addr, len | owner_key))
    }

    /// Whether [`take_keyed`](Self::take_keyed) would find the mapping
    /// (nothing changed).
    pub(crate) fn take_keyed_probe(&self, addr: u64, len: u64, owner_key: u64) -> bool {
        len != 0 && len <= LEN_MASK && self.live.with(|t| t.find(addr, len | owner_key).is_some())
    }

    #[inline(always)]
    #[cfg(test)]
    pub(crate) fn add(&self, addr: u64, len: u64, owner: u32) {
        debug_assert!(len != 0, "map refuses length 0");
        // A zero length would read as a free slot; it is never recorded
        // (and so never found by an unmap).
        if len != 0 {
            self.live.with(|t| t.add(addr, key(len, owner)));
        }
    }

    /// Removes one mapping of `len` bytes at `addr` for `owner`, if
    /// recorded here.
    #[inline(always)]
    pub(crate) fn take(&self, addr: u64, len: u64, owner: u32) -> bool {
        len != 0 && len <= LEN_MASK && self.live.with(|t| t.take(addr, key(len, owner)))
    }

    /// Whether a mapping of `len` bytes at `addr` for `owner` is recorded.
    pub(crate) fn holds(&self, addr: u64, len: u64, owner: u32) -> bool {
        len != 0 && len <= LEN_MASK && self.live.with(|t| t.find(addr, key(len, owner)).is_some())
    }

    /// The owner of some mapping of exactly `len` bytes at `addr` whose
    /// [`PT_SG`] bit is `sg`'s (whichever device and direction: to tell a
    /// wrong device or direction).
    fn owner_of(&self, addr: u64, len: u64, sg: u32, device: Option<u32>) -> Option<u32> {
        self.live.with(|t| {
            t.iter()
                .filter(|s| s.addr == addr && s.len & LEN_MASK == len)
                .map(|s| (s.len >> LEN_BITS) as u32)
                .filter(|o| device.is_none_or(|d| o & OWNER_DEVICE == d))
                .find(|o| o & PT_SG == sg)
        })
    }

    /// How well a recorded mapping covers `[addr, end)`: `Some(true)` if
    /// one holds it whole, `Some(false)` if one holds `addr` only, `None`
    /// if none holds `addr`. A scan: syncs in pass-through are not the
    /// path a device's throughput rides on.
    pub(crate) fn covers(&self, addr: u64, end: u64) -> Option<bool> {
        self.live.with(|t| {
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
        })
    }

    /// Whether a mapping at `addr` of any length is recorded (to tell a
    /// wrong length from an address never mapped).
    pub(crate) fn has_addr(&self, addr: u64) -> bool {
        self.live.with(|t| t.iter().any(|s| s.addr == addr))
    }

    /// Moves every record into `into` (a CPU's handle is going away; its
    /// mappings stay live).
    pub(crate) fn move_into(&self, into: &PtRecord) {
        let taken = self.live.with(std::mem::take);
        into.live.with(|dst| {
            for s in taken.iter() {
                dst.add(s.addr, s.len);
            }
        });
    }

    /// Mappings recorded.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.live.with(|t| t.iter().count() as u64)
    }
}

/// Removes one mapping of `len` bytes at `addr` made by device `sid` in
/// direction `dir` (a scatter-list entry's if `sg`) from the first record
/// of `records` (`own` first) that has it. If none does, nothing changes
/// and the reason is given: `WrongDirection` (the device has the exact
/// mapping of that kind in another direction), `WrongDevice` (only other
/// devices have it), `NotMapped`
/// (only one of the other kind is), `WrongLength` (one of another length
/// starts there), else `NotMapped`.
pub(crate) fn take_any<'a>(
    own: &PtRecord,
    others: impl Iterator<Item = &'a PtRecord> + Clone,
    addr: u64,
    len: u64,
    sid: SourceId,
    dir: DmaDirection,
    sg: bool,
) -> Result<(), DmaError> {
    let kind = if sg { PT_SG } else { 0 };
    let owner = pt_owner(sid, dir) | kind;
    if own.take(addr, len, owner) || others.clone().any(|r| r.take(addr, len, owner)) {
        return Ok(());
    }
    let of = |kind, device| {
        own.owner_of(addr, len, kind, device).or_else(|| {
            others
                .clone()
                .find_map(|r| r.owner_of(addr, len, kind, device))
        })
    };
    // The asking device's own mapping there names the direction; only if
    // none is its own is the device the reason (two devices may hold the
    // same bytes in pass-through, where the address is the physical one).
    if let Some(o) = of(kind, Some(owner & OWNER_DEVICE)) {
        return Err(DmaError::WrongDirection {
            addr,
            mapped: dir_of(o),
            asked: dir,
        });
    }
    if of(kind, None).is_some() {
        return Err(DmaError::WrongDevice {
            sid: sid.to_string(),
        });
    }
    if of(kind ^ PT_SG, None).is_some() {
        return Err(DmaError::NotMapped { addr });
    }
    if own.has_addr(addr) || others.into_iter().any(|r| r.has_addr(addr)) {
        Err(DmaError::WrongLength { addr, len })
    } else {
        Err(DmaError::NotMapped { addr })
    }
}

/// The owner bit of a scatter-list entry mapped entry by entry: a single
/// unmap never takes one, nor a scatter-list unmap a single mapping (as
/// DMA-API debug checks the unmap's kind against the map's).
pub(crate) const PT_SG: u32 = 1 << 18;
const _: () = assert!(LEN_BITS + 19 <= 64);

/// The bits of an owner that name its device.
const OWNER_DEVICE: u32 = 0xffff << 2;

/// The bits an owner sets in a record's key length (see [`key`]).
#[inline]
pub(crate) fn owner_key(owner: u32) -> u64 {
    u64::from(owner) << LEN_BITS
}

/// A pass-through mapping's owner: the device's source id and the
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
            take_any(&r, std::iter::empty(), 0x1000, 100, SourceId(2), D, false),
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
                DmaDirection::FromDevice,
                false
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

    /// Two devices may map the same bytes in pass-through; an unmap by one
    /// of them in the wrong direction names the direction, whichever
    /// device's mapping the record holds first.
    #[test]
    fn a_devices_own_mapping_decides_the_reason_over_anothers() {
        let other = (2 << 2) | 1;
        for first_is_other in [true, false] {
            let r = PtRecord::default();
            if first_is_other {
                r.add(0x1000, 100, other);
                r.add(0x1000, 100, O);
            } else {
                r.add(0x1000, 100, O);
                r.add(0x1000, 100, other);
            }
            let asked = DmaDirection::Bidirectional;
            assert_eq!(
                take_any(&r, std::iter::empty(), 0x1000, 100, S, asked, false),
                Err(DmaError::WrongDirection {
                    addr: 0x1000,
                    mapped: D,
                    asked
                })
            );
            assert_eq!(
                take_any(&r, std::iter::empty(), 0x1000, 100, SourceId(3), D, false),
                Err(DmaError::WrongDevice {
                    sid: SourceId(3).to_string()
                })
            );
            assert_eq!(r.len(), 2, "a refused unmap takes nothing");
        }
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
        assert_eq!(
            take_any(&b, [&a].into_iter(), 0x1000, 64, S, D, false),
            Ok(())
        );
        assert_eq!(
            take_any(&b, [&a].into_iter(), 0x1000, 65, S, D, false),
            Err(DmaError::WrongLength {
                addr: 0x1000,
                len: 65
            })
        );
        assert_eq!(
            take_any(&a, [&b].into_iter(), 0x5000, 1, S, D, false),
            Err(DmaError::NotMapped { addr: 0x5000 })
        );
        assert_eq!(a.len(), 1);
        b.move_into(&a);
        assert_eq!(a.len(), 2);
        assert_eq!(
            take_any(&a, std::iter::empty(), 0x9000, 8, S, D, false),
            Ok(())
        );
        assert_eq!(
            take_any(&a, std::iter::empty(), 0x1000, 64, S, D, false),
            Ok(())
        );
        assert_eq!(
            take_any(&a, std::iter::empty(), 0x1000, 64, S, D, false),
            Err(DmaError::NotMapped { addr: 0x1000 })
        );
    }
}
