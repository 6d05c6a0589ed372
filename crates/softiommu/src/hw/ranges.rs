//! What a translation returns: physical ranges, held inline (no heap) up to
//! [`PhysRanges::INLINE`] pieces, which covers every access that touches at
//! most four discontiguous pages.

use std::fmt;

use crate::mem::PhysAddr;
use crate::pgtable::Perm;

/// A contiguous piece of physical memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PhysRange {
    /// First byte.
    pub phys: PhysAddr,
    /// Length in bytes.
    pub len: u64,
}

/// One page's worth of translation: where `iova` lands, and how far the
/// mapping runs on contiguously from there (to the end of its leaf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhysSpan {
    /// The physical address of the IOVA asked for.
    pub phys: PhysAddr,
    /// Bytes from `phys` to the end of the leaf (or of the address space,
    /// for pass-through).
    pub len: u64,
    /// The rights the mapping grants.
    pub perm: Perm,
}

/// The physical ranges an IOVA range translates to, in IOVA order, with
/// physically adjacent pieces merged.
#[derive(Clone, Default)]
pub struct PhysRanges {
    inline: [PhysRange; PhysRanges::INLINE],
    n: usize,
    /// Every piece, once there are more than fit inline.
    spill: Vec<PhysRange>,
}

impl PhysRanges {
    /// Pieces held without allocating.
    pub const INLINE: usize = 4;

    /// No ranges.
    #[inline]
    pub fn new() -> Self {
        Self::default()
    }

    /// One range (the common case: an access within one page).
    #[inline]
    pub fn one(phys: PhysAddr, len: u64) -> Self {
        let mut inline = [PhysRange::default(); Self::INLINE];
        inline[0] = PhysRange { phys, len };
        Self {
            inline,
            n: 1,
            spill: Vec::new(),
        }
    }

    /// Appends `[phys, phys + len)`, merging it into the last piece if it
    /// continues it.
    #[inline]
    pub fn push(&mut self, phys: PhysAddr, len: u64) {
        if let Some(last) = self.last_mut() {
            if last.phys.checked_add(last.len) == Some(phys) {
                last.len += len;
                return;
            }
        }
        let r = PhysRange { phys, len };
        if self.spill.is_empty() && self.n < Self::INLINE {
            self.inline[self.n] = r;
            self.n += 1;
        } else {
            if self.spill.is_empty() {
                self.spill.extend_from_slice(&self.inline[..self.n]);
            }
            self.spill.push(r);
        }
    }

    #[inline]
    fn last_mut(&mut self) -> Option<&mut PhysRange> {
        if self.spill.is_empty() {
            self.inline[..self.n].last_mut()
        } else {
            self.spill.last_mut()
        }
    }

    /// The pieces.
    #[inline]
    pub fn as_slice(&self) -> &[PhysRange] {
        if self.spill.is_empty() {
            &self.inline[..self.n]
        } else {
            &self.spill
        }
    }

    /// The number of pieces.
    #[inline]
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total bytes.
    #[inline]
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|r| r.len).sum()
    }

    /// The pieces, in order.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, PhysRange> {
        self.as_slice().iter()
    }
}

impl fmt::Debug for PhysRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for PhysRanges {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for PhysRanges {}

impl<'a> IntoIterator for &'a PhysRanges {
    type Item = &'a PhysRange;
    type IntoIter = std::slice::Iter<'a, PhysRange>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pieces_merge_and_spill() {
        let mut r = PhysRanges::new();
        assert!(r.is_empty());
        r.push(0x1000, 0x1000);
        r.push(0x2000, 0x1000);
        assert_eq!(
            r.as_slice(),
            &[PhysRange {
                phys: 0x1000,
                len: 0x2000
            }]
        );
        for i in 0..5u64 {
            r.push(0x10_0000 * (i + 1), 0x100);
        }
        assert_eq!(r.len(), 6);
        assert_eq!(r.total_len(), 0x2000 + 5 * 0x100);
        r.push(0x50_0100, 0x10);
        assert_eq!(r.len(), 6, "merges after spilling too");
        assert_eq!(r.iter().last().unwrap().len, 0x110);
        let c = r.clone();
        assert_eq!(c, r);
    }
}
