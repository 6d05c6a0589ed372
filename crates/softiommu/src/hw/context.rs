//! Contexts: which domain (and so which page table) a device's requests are
//! translated in, looked up on every translation without a lock.
//!
//! A device is named by its PCI requester id, [`SourceId`]
//! (bus:device.function, as in VT-d's root and context tables, §9.1–9.3).
//! Its context is one of [`ContextEntry::Translated`] (a domain id and the
//! root of that domain's second-level table), [`ContextEntry::PassThrough`]
//! (addresses used as they are, VT-d's translation type 10b) or
//! [`ContextEntry::Blocked`] (every request faults); a device with no entry
//! faults too, as one whose context entry is not present.
//!
//! The table is two levels like the hardware's (256 buses, each a lazily
//! made array of 256 entries); each entry is one 64-bit word, so a
//! translation reads it with a single load and a change is atomic. It lives
//! in the unit rather than in `mem`: nothing yet needs a guest to program it
//! through registers (the register-level front-end on the road map would
//! move it into `mem` with a context cache in front).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::mem::{PhysAddr, PAGE_SHIFT};

/// A unit's index in its [`System`](super::System).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnitId(pub u16);

/// A PCI requester id: bus (8 bits), device (5), function (3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SourceId(pub u16);

impl SourceId {
    /// The id of `bus:device.function`; `None` if `device > 31` or
    /// `function > 7`.
    pub fn new(bus: u8, device: u8, function: u8) -> Option<Self> {
        (device < 32 && function < 8)
            .then(|| SourceId(u16::from(bus) << 8 | u16::from(device) << 3 | u16::from(function)))
    }

    /// The bus number.
    pub fn bus(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// The device number.
    pub fn device(self) -> u8 {
        (self.0 >> 3 & 0x1f) as u8
    }

    /// The function number.
    pub fn function(self) -> u8 {
        (self.0 & 7) as u8
    }

    /// The device-function byte (the context table's index).
    pub fn devfn(self) -> u8 {
        self.0 as u8
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02x}:{:02x}.{}",
            self.bus(),
            self.device(),
            self.function()
        )
    }
}

impl From<u16> for SourceId {
    fn from(v: u16) -> Self {
        SourceId(v)
    }
}

/// How a device's requests are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContextEntry {
    /// Translated through the second-level table at `root`, cached in the
    /// IOTLB under domain id `did`. Every device of one domain id must use
    /// the same root.
    Translated {
        /// The domain id (VT-d DID).
        did: u16,
        /// Physical address of the table's top level (4 KiB aligned).
        root: PhysAddr,
    },
    /// Requests use their address as the physical address.
    PassThrough,
    /// Every request faults.
    Blocked,
}

const STATE_MASK: u64 = 3;
const STATE_TRANSLATED: u64 = 1;
const STATE_PASS_THROUGH: u64 = 2;
const STATE_BLOCKED: u64 = 3;
const DID_SHIFT: u32 = 2;
const ROOT_SHIFT: u32 = 18;
/// Roots are below 2^52: 40 bits of frame number above the 18 low bits.
const ROOT_FRAME_BITS: u32 = 40;

/// Packs an entry into a word: state (2 bits), DID (16), root frame (40).
pub(crate) fn encode(ctx: Option<ContextEntry>) -> u64 {
    match ctx {
        None => 0,
        Some(ContextEntry::PassThrough) => STATE_PASS_THROUGH,
        Some(ContextEntry::Blocked) => STATE_BLOCKED,
        Some(ContextEntry::Translated { did, root }) => {
            let frame = (root >> PAGE_SHIFT) & ((1 << ROOT_FRAME_BITS) - 1);
            STATE_TRANSLATED | u64::from(did) << DID_SHIFT | frame << ROOT_SHIFT
        }
    }
}

/// The word [`encode`] writes for a pass-through entry: the hit path
/// tests it with one compare.
pub(crate) const PASS_THROUGH_WORD: u64 = STATE_PASS_THROUGH;

/// The domain of a word written by [`encode`] if it is a translated
/// entry: the hit path's test, one mask and compare (no jump table).
#[inline(always)]
pub(crate) fn translated_did(word: u64) -> Option<u16> {
    (word & STATE_MASK == STATE_TRANSLATED).then_some((word >> DID_SHIFT) as u16)
}

/// Unpacks a word written by [`encode`].
#[inline(always)]
pub(crate) fn decode(word: u64) -> Option<ContextEntry> {
    match word & STATE_MASK {
        STATE_TRANSLATED => Some(ContextEntry::Translated {
            did: (word >> DID_SHIFT) as u16,
            root: (word >> ROOT_SHIFT) << PAGE_SHIFT,
        }),
        STATE_PASS_THROUGH => Some(ContextEntry::PassThrough),
        STATE_BLOCKED => Some(ContextEntry::Blocked),
        _ => None,
    }
}

/// A context word (a std atomic under loom too: the models do not
/// explore context changes).
pub(crate) type ContextWord = AtomicU64;

/// One bus's 256 context words.
type Bus = [AtomicU64; 256];

/// The context entries of one unit, by source id.
pub(crate) struct ContextTable {
    /// Fixed-size arrays: indexing by a `u8` needs no bounds check.
    buses: Box<[OnceLock<Box<Bus>>; 256]>,
}

impl fmt::Debug for ContextTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let buses = self.buses.iter().filter(|b| b.get().is_some()).count();
        f.debug_struct("ContextTable")
            .field("buses_in_use", &buses)
            .finish()
    }
}

impl ContextTable {
    /// An empty table: no device has a context.
    pub(crate) fn new() -> Self {
        Self {
            buses: Box::new(std::array::from_fn(|_| OnceLock::new())),
        }
    }

    /// The word for `sid`, 0 (no context) if its bus was never used.
    #[inline(always)]
    pub(crate) fn load(&self, sid: SourceId) -> u64 {
        match self.buses[usize::from(sid.bus())].get() {
            // Acquire: pairs with the Release store in `store`; the root
            // table a new entry names was written before it.
            Some(bus) => bus[usize::from(sid.devfn())].load(Ordering::Acquire),
            None => 0,
        }
    }

    /// The word for `sid` itself, if its bus is in use. A bus, once in
    /// use, stays (at a fixed address) as long as the table: a translator
    /// keeps the word of the device it last served, so that its hit path
    /// reads the context with one load and no bus lookup.
    pub(crate) fn cell(&self, sid: SourceId) -> Option<&ContextWord> {
        let bus = self.buses[usize::from(sid.bus())].get()?;
        Some(&bus[usize::from(sid.devfn())])
    }

    /// Replaces the word for `sid`; returns the old one.
    pub(crate) fn store(&self, sid: SourceId, word: u64) -> u64 {
        let bus = self.buses[usize::from(sid.bus())]
            .get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU64::new(0))));
        // Release: pairs with the Acquire load in `load`.
        bus[usize::from(sid.devfn())].swap(word, Ordering::AcqRel)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn source_ids_split_and_print() {
        let s = SourceId::new(0x3a, 31, 7).unwrap();
        assert_eq!((s.bus(), s.device(), s.function()), (0x3a, 31, 7));
        assert_eq!(s.to_string(), "3a:1f.7");
        assert_eq!(s.devfn(), 0xff);
        assert!(SourceId::new(0, 32, 0).is_none());
        assert!(SourceId::new(0, 0, 8).is_none());
        assert_eq!(SourceId::from(0x0108), SourceId::new(1, 1, 0).unwrap());
    }

    #[test]
    fn entries_round_trip_through_words() {
        for ctx in [
            None,
            Some(ContextEntry::PassThrough),
            Some(ContextEntry::Blocked),
            Some(ContextEntry::Translated {
                did: 0xffff,
                root: (1 << 52) - 4096,
            }),
            Some(ContextEntry::Translated { did: 0, root: 0 }),
        ] {
            assert_eq!(decode(encode(ctx)), ctx);
        }
    }

    #[test]
    fn the_table_starts_empty_and_swaps() {
        let t = ContextTable::new();
        let s = SourceId(0x1234);
        assert_eq!(t.load(s), 0);
        let w = encode(Some(ContextEntry::Blocked));
        assert_eq!(t.store(s, w), 0);
        assert_eq!(t.load(s), w);
        assert_eq!(t.load(SourceId(0x1235)), 0);
        assert_eq!(t.store(s, 0), w);
    }
}
