//! The entry format (VT-d §9.8): constants, decoding, the walk.

use super::*;

/// Levels of the table: 4-level paging, adjusted guest address width 48
/// (VT-d §3.7, `CAP.SAGAW` bit 2).
pub const VTD_LEVELS: u32 = 4;
/// IOVA width in bits of 4-level paging.
pub const VTD_IOVA_BITS: u32 = 48;
/// Width of the address field of an entry: bits 51:12, so physical
/// addresses below 2^52 (the largest host address width VT-d defines).
pub const VTD_ADDR_BITS: u32 = 52;
/// Read permission (bit 0 of every second-level entry, VT-d §9.8).
pub(crate) const SL_R: u64 = 1 << 0;
/// Write permission (bit 1, VT-d §9.8).
pub(crate) const SL_W: u64 = 1 << 1;
/// Page size (bit 7, VT-d §9.8): at levels 3 and 2 the entry maps a 1 GiB or
/// 2 MiB page instead of pointing to a table; reserved at level 4, ignored
/// at level 1.
pub(crate) const SL_PS: u64 = 1 << 7;
/// The address field, bits 51:12 (VT-d §9.8).
pub(crate) const SL_ADDR_MASK: u64 = ((1 << VTD_ADDR_BITS) - 1) & !(PAGE_SIZE - 1);
/// `ECAP_REG.C`, bit 0 (VT-d §11.4.3, "Page-walk Coherency"): set when the
/// hardware's walks snoop the CPU caches.
pub const ECAP_C: u64 = 1 << 0;

/// Entries per table page.
pub(crate) const ENTRIES: u64 = 512;
/// IOVA bits translated per level.
pub(crate) const STRIDE: u32 = 9;
/// Size of one entry in bytes.
pub(crate) const ENTRY_BYTES: u64 = 8;

/// log2 of the IOVA span one entry at `level` (1 to 4) covers.
pub(crate) fn level_shift(level: u32) -> u32 {
    PAGE_SIZE.trailing_zeros() + STRIDE * level.saturating_sub(1)
}

/// The index of `iova`'s entry in the table at `level` (1 to 4).
pub(crate) fn level_index(iova: u64, level: u32) -> u64 {
    (iova >> level_shift(level)) & (ENTRIES - 1)
}

/// A decoded second-level entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlEntry {
    /// R and W clear: the walk stops, the IOVA is not mapped.
    NotPresent,
    /// A pointer to the next level's table.
    Table {
        /// Physical address of the next table.
        addr: PhysAddr,
        /// The rights this level allows.
        perm: Perm,
    },
    /// A leaf: the page the IOVA translates into.
    Leaf {
        /// Physical address of the page.
        addr: PhysAddr,
        /// Its size.
        size: PageSize,
        /// The rights this level allows.
        perm: Perm,
    },
    /// Present, but a reserved bit is set (PS at level 4, or address bits
    /// below a large leaf's alignment): the hardware reports a fault.
    Reserved {
        /// The raw entry.
        raw: u64,
    },
}

/// Decodes the raw entry `raw` found at `level` (1 to 4) per VT-d §9.8.
pub(crate) fn decode_entry(raw: u64, level: u32) -> SlEntry {
    let perm = perm_of(raw);
    if perm.is_empty() {
        return SlEntry::NotPresent;
    }
    let addr = raw & SL_ADDR_MASK;
    let size = match level {
        1 => Some(PageSize::Size4K),
        2 if raw & SL_PS != 0 => Some(PageSize::Size2M),
        3 if raw & SL_PS != 0 => Some(PageSize::Size1G),
        2 | 3 => None,
        _ if raw & SL_PS != 0 => return SlEntry::Reserved { raw },
        _ => None,
    };
    match size {
        Some(size) if addr & (size.bytes() - 1) != 0 => SlEntry::Reserved { raw },
        Some(size) => SlEntry::Leaf { addr, size, perm },
        None => SlEntry::Table { addr, perm },
    }
}

pub(crate) fn perm_of(raw: u64) -> Perm {
    let mut p = Perm::NONE;
    if raw & SL_R != 0 {
        p = p | Perm::READ;
    }
    if raw & SL_W != 0 {
        p = p | Perm::WRITE;
    }
    p
}

pub(crate) fn perm_bits(perm: Perm) -> u64 {
    (if perm.read() { SL_R } else { 0 }) | (if perm.write() { SL_W } else { 0 })
}

/// The entry pointing to the table at `page`: R and W, so that the leaf
/// alone decides the rights.
pub(crate) fn table_entry(page: PhysAddr) -> u64 {
    (page & SL_ADDR_MASK) | SL_R | SL_W
}

/// The leaf entry at `level` mapping the page at `phys`.
pub(crate) fn leaf_entry(phys: PhysAddr, level: u32, perm: Perm) -> u64 {
    let ps = if level > 1 { SL_PS } else { 0 };
    (phys & SL_ADDR_MASK) | ps | perm_bits(perm)
}

/// The physical address of `iova`'s entry in the table at `table`.
pub(crate) fn slot(table: PhysAddr, level: u32, iova: u64) -> PhysAddr {
    table + level_index(iova, level) * ENTRY_BYTES
}

/// The end of the part of `[cur, end)` that `cur`'s entry at `level` covers.
pub(crate) fn entry_end(cur: u64, level: u32, end: u64) -> u64 {
    let shift = level_shift(level);
    (((cur >> shift) + 1) << shift).min(end)
}

/// Whether `[iova, iova + len)` → `phys` can be one leaf at `level`.
pub(crate) fn fits_leaf(level: u32, iova: u64, phys: PhysAddr, len: u64) -> bool {
    if !(1..=3).contains(&level) {
        return false;
    }
    let span = 1u64 << level_shift(level);
    iova & (span - 1) == 0 && phys & (span - 1) == 0 && len >= span
}

/// Whether the entry at `level` holding `addr` lies wholly in `[start, end)`.
pub(crate) fn entry_inside(addr: u64, level: u32, start: u64, end: u64) -> bool {
    let span = 1u64 << level_shift(level);
    let base = addr & !(span - 1);
    base >= start && base + span <= end
}

/// Translates `iova` by walking the table rooted at `root` as the hardware
/// does (VT-d §3.7): `None` if an entry on the way is not present or has a
/// reserved bit set. The permissions are those of every level together.
pub(crate) fn walk(
    mem: &PhysMemory,
    root: PhysAddr,
    iova: u64,
) -> Result<Option<Translation>, PgtableError> {
    if iova >> VTD_IOVA_BITS != 0 {
        return Err(PgtableError::AddressTooWide {
            iova,
            len: 1,
            width: VTD_IOVA_BITS,
        });
    }
    let mut table = root;
    let mut perm = Perm::RW;
    for level in (1..=VTD_LEVELS).rev() {
        // Acquire: pairs with the Release store that linked the entry, so
        // the table or page it points to is seen as it was written.
        let raw = mem.load_u64(slot(table, level, iova), Ordering::Acquire)?;
        match decode_entry(raw, level) {
            SlEntry::NotPresent | SlEntry::Reserved { .. } => return Ok(None),
            SlEntry::Table { addr, perm: p } => {
                table = addr;
                perm = perm & p;
            }
            SlEntry::Leaf {
                addr,
                size,
                perm: p,
            } => {
                return Ok(Some(Translation {
                    phys: addr | (iova & (size.bytes() - 1)),
                    size,
                    perm: perm & p,
                }));
            }
        }
    }
    Ok(None)
}
