//! The record of pass-through mappings, so that an unmap in pass-through is
//! checked as strictly as in any other policy.
//!
//! A pass-through mapping has no IOVA and no page-table entry to check an
//! unmap against, yet an unmap of something never mapped must be refused,
//! and a switch out of pass-through must know exactly which mappings are
//! live (the device's context changes under them). Each CPU keeps the
//! mappings it made, keyed by (address, length) with a count (a buffer
//! may be mapped twice), in a map behind its own lock: the owner is the
//! only one to take it unless another CPU unmaps what this one mapped (a
//! completion handled elsewhere), which then searches every CPU's record.
//! So the usual map and unmap cost an uncontended lock and a hash probe,
//! and nothing is shared between CPUs on that path.

#![deny(clippy::indexing_slicing)]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use super::error::DmaError;
use crate::sync::lock_std as lock;

/// A multiplicative hash of the two words of a key (Fibonacci hashing,
/// Knuth TAOCP vol. 3 §6.4): the keys are addresses and lengths, not
/// attacker-chosen strings a flood could aim at (a CPU's record holds
/// only the mappings its own caller made).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(23) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Records = HashMap<(u64, u64), u32, BuildHasherDefault<AddrHasher>>;

/// One CPU's (or the retired CPUs') pass-through mappings.
#[derive(Debug, Default)]
pub(crate) struct PtRecord {
    live: Mutex<Records>,
}

impl PtRecord {
    /// Records a mapping of `len` bytes at `addr`.
    pub(crate) fn add(&self, addr: u64, len: u64) {
        *lock(&self.live).entry((addr, len)).or_insert(0) += 1;
    }

    /// Removes one mapping of `len` bytes at `addr`, if recorded here.
    pub(crate) fn take(&self, addr: u64, len: u64) -> bool {
        let mut live = lock(&self.live);
        match live.get_mut(&(addr, len)) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                live.remove(&(addr, len));
                true
            }
            None => false,
        }
    }

    /// Whether a mapping at `addr` of any length is recorded (to tell a
    /// wrong length from an address never mapped).
    pub(crate) fn has_addr(&self, addr: u64) -> bool {
        lock(&self.live).keys().any(|&(a, _)| a == addr)
    }

    /// Moves every record into `into` (a CPU's handle is going away; its
    /// mappings stay live).
    pub(crate) fn move_into(&self, into: &PtRecord) {
        let taken = std::mem::take(&mut *lock(&self.live));
        let mut dst = lock(&into.live);
        for (k, n) in taken {
            *dst.entry(k).or_insert(0) += n;
        }
    }

    /// Mappings recorded.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        lock(&self.live).values().map(|&n| u64::from(n)).sum()
    }
}

/// Removes one mapping of `len` bytes at `addr` from the first record of
/// `records` (`own` first) that has it: `NotMapped` or `WrongLength` if
/// none does.
pub(crate) fn take_any<'a>(
    own: &PtRecord,
    others: impl Iterator<Item = &'a PtRecord> + Clone,
    addr: u64,
    len: u64,
) -> Result<(), DmaError> {
    if own.take(addr, len) || others.clone().any(|r| r.take(addr, len)) {
        return Ok(());
    }
    if own.has_addr(addr) || others.into_iter().any(|r| r.has_addr(addr)) {
        Err(DmaError::WrongLength { addr, len })
    } else {
        Err(DmaError::NotMapped { addr })
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_counted_and_taken_exactly() {
        let (a, b) = (PtRecord::default(), PtRecord::default());
        a.add(0x1000, 64);
        a.add(0x1000, 64);
        b.add(0x9000, 8);
        assert_eq!(take_any(&b, [&a].into_iter(), 0x1000, 64), Ok(()));
        assert_eq!(
            take_any(&b, [&a].into_iter(), 0x1000, 65),
            Err(DmaError::WrongLength {
                addr: 0x1000,
                len: 65
            })
        );
        assert_eq!(
            take_any(&a, [&b].into_iter(), 0x5000, 1),
            Err(DmaError::NotMapped { addr: 0x5000 })
        );
        assert_eq!(a.len(), 1);
        b.move_into(&a);
        assert_eq!(a.len(), 2);
        assert_eq!(take_any(&a, std::iter::empty(), 0x9000, 8), Ok(()));
        assert_eq!(take_any(&a, std::iter::empty(), 0x1000, 64), Ok(()));
        assert_eq!(
            take_any(&a, std::iter::empty(), 0x1000, 64),
            Err(DmaError::NotMapped { addr: 0x1000 })
        );
    }
}
