//! Who a streaming mapping belongs to: the device that mapped it and the
//! direction it was mapped in, so an unmap through another device of the
//! domain or in another direction is refused, as DMA-API debug reports
//! both ("device driver frees DMA memory with different device" and
//! "... with different direction").
//!
//! A translated mapping keeps them in spare bits of the 32-bit tag its
//! IOVA block carries already (bits 0..24 hold the first byte's and the
//! end's offsets in their pages, bit 31 marks the tag set): bits 24..26
//! the direction, bits 26..31 the device's owner index in the domain. So
//! the check costs the unmap nothing but a wider compare of a word it
//! loads anyway: no lock, no shared counter.

#![deny(clippy::indexing_slicing)]

use super::policy::DmaDirection;
use crate::hw::SourceId;

/// Owner indices a domain hands out exactly: devices attached after the
/// first `OWNER_SLOTS - 1` share the last index, so between two of those
/// the device check is not exact (the direction check still is).
pub(crate) const OWNER_SLOTS: u32 = 32;

/// Where the direction sits in a tag.
const DIR_SHIFT: u32 = 24;
/// Where the owner index sits in a tag.
const OWNER_SHIFT: u32 = 26;
/// The tag's direction bits.
pub(crate) const TAG_DIR: u32 = 0b11 << DIR_SHIFT;
/// The tag's owner bits.
pub(crate) const TAG_OWNER: u32 = (OWNER_SLOTS - 1) << OWNER_SHIFT;

/// The direction's two bits (never 0: a set direction is told from none):
/// `ToDevice` 1, `FromDevice` 2, `Bidirectional` 3 — the declaration order
/// plus one, so no branch (checked by a test below).
#[inline]
pub(crate) fn dir_bits(dir: DmaDirection) -> u32 {
    dir as u32 + 1
}

/// The direction bits of a page permission: read 1, write 2, both 3 (the
/// direction whose `perm()` it is).
#[inline]
pub(crate) fn perm_bits(perm: crate::pgtable::Perm) -> u32 {
    u32::from(perm.read()) | (u32::from(perm.write()) << 1)
}

/// The direction whose bits are `bits` (`Bidirectional` for anything else).
pub(crate) fn dir_of(bits: u32) -> DmaDirection {
    match bits & 0b11 {
        1 => DmaDirection::ToDevice,
        2 => DmaDirection::FromDevice,
        _ => DmaDirection::Bidirectional,
    }
}

/// The device part of a translated mapping's tag for owner index `owner`
/// (kept in the device handle, computed once at attach).
pub(crate) fn device_tag(owner: u32) -> u32 {
    (owner & (OWNER_SLOTS - 1)) << OWNER_SHIFT
}

/// The owner part of a translated mapping's tag: the device's
/// [`device_tag`], direction bits `dir_bits` (see [`dir_bits`],
/// [`perm_bits`]).
#[inline]
pub(crate) fn owner_tag(device_tag: u32, dir_bits: u32) -> u32 {
    device_tag | (dir_bits << DIR_SHIFT)
}

/// The direction a tag records.
pub(crate) fn tag_dir(tag: u32) -> DmaDirection {
    dir_of((tag & TAG_DIR) >> DIR_SHIFT)
}

/// The owner index of `sid` in a domain whose attached devices so far are
/// `owners` (added if new and there is room; else the shared last index).
pub(crate) fn owner_index(owners: &mut Vec<SourceId>, sid: SourceId) -> u32 {
    if let Some(i) = owners.iter().position(|&s| s == sid) {
        return u32::try_from(i).unwrap_or(OWNER_SLOTS - 1);
    }
    let i = u32::try_from(owners.len()).unwrap_or(OWNER_SLOTS - 1);
    if i < OWNER_SLOTS - 1 {
        owners.push(sid);
        i
    } else {
        OWNER_SLOTS - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_bits_stay_clear_of_the_span_bits() {
        for dir in [
            DmaDirection::ToDevice,
            DmaDirection::FromDevice,
            DmaDirection::Bidirectional,
        ] {
            assert_eq!(perm_bits(dir.perm()), dir_bits(dir));
            for owner in 0..OWNER_SLOTS {
                let t = owner_tag(device_tag(owner), dir_bits(dir));
                assert_eq!(t & 0x80ff_ffff, 0);
                assert_eq!(tag_dir(t), dir);
                assert_eq!((t & TAG_OWNER) >> OWNER_SHIFT, owner);
            }
        }
    }

    #[test]
    fn indices_are_stable_and_capped() {
        let mut v = Vec::new();
        for n in 0..40u16 {
            let i = owner_index(&mut v, SourceId(n));
            assert_eq!(i, u32::from(n).min(OWNER_SLOTS - 1));
        }
        assert_eq!(owner_index(&mut v, SourceId(3)), 3);
    }
}
