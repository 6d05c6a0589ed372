//! The unit's page walker: reads VT-d second-level entries out of
//! [`PhysMemory`] as the hardware does (VT-d §3.7, entry layout §9.8), with
//! no help from the [`pgtable`](crate::pgtable) code that wrote them beyond
//! the shared decoder of the specification's bits.
//!
//! Unlike the page table's own `walk`, it says *why* a walk
//! stopped (a fault needs the reason) and how many levels it read (the
//! latency model charges per level).

use std::sync::atomic::Ordering;

use crate::mem::{PhysAddr, PhysMemory};
use crate::pgtable::{decode_entry, level_index, PageSize, Perm, SlEntry, VTD_LEVELS};

/// How a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WalkEnd {
    /// A leaf maps the IOVA.
    Leaf {
        /// Physical address of the leaf's start.
        phys: PhysAddr,
        /// Its size.
        size: PageSize,
        /// The rights of every level together.
        perm: Perm,
    },
    /// An entry on the way is not present (R = W = 0).
    NotPresent {
        /// The level of that entry (4 to 1).
        level: u32,
    },
    /// An entry on the way has a reserved bit set.
    Reserved {
        /// Its level.
        level: u32,
        /// The raw entry.
        raw: u64,
    },
    /// An address an entry names lies outside the memory it may name: a
    /// table (or the root) outside the IOMMU reserve, or a leaf outside
    /// RAM. Tables live only in the reserve and devices reach only RAM, so
    /// a table a device could write, or a leaf into IOMMU state, is never
    /// followed (and never cached).
    BadTable {
        /// Its level.
        level: u32,
        /// The table's address.
        table: PhysAddr,
    },
}

/// A walk's result and the number of entries it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Walk {
    /// How it ended.
    pub(crate) end: WalkEnd,
    /// Entries read (1 to 4).
    pub(crate) levels: u32,
}

/// Walks the 4-level table at `root` for `iova` (below 2^48, checked by the
/// caller).
pub(crate) fn walk(mem: &PhysMemory, root: PhysAddr, iova: u64) -> Walk {
    let mut table = root;
    let mut perm = Perm::RW;
    for (read, level) in (1..=VTD_LEVELS).rev().enumerate() {
        let levels = read as u32 + 1;
        let at = table + level_index(iova, level) * 8;
        // Acquire: pairs with the Release store that linked this entry, so
        // the table it points to is seen as written. Only the reserve holds
        // tables.
        let raw = match mem.iommu_load_u64(at, Ordering::Acquire) {
            Some(raw) => raw,
            None => {
                return Walk {
                    end: WalkEnd::BadTable { level, table },
                    levels,
                }
            }
        };
        let end = match decode_entry(raw, level) {
            SlEntry::NotPresent => WalkEnd::NotPresent { level },
            SlEntry::Reserved { raw } => WalkEnd::Reserved { level, raw },
            SlEntry::Leaf {
                addr,
                size,
                perm: p,
            } => match mem.device_ptr(addr, size.bytes()) {
                Ok(_) => WalkEnd::Leaf {
                    phys: addr,
                    size,
                    perm: perm & p,
                },
                Err(_) => WalkEnd::BadTable { level, table: addr },
            },
            SlEntry::Table { addr, perm: p } => {
                table = addr;
                perm = perm & p;
                continue;
            }
        };
        return Walk { end, levels };
    }
    // Level 1 entries always decode as a leaf, not-present or reserved.
    Walk {
        end: WalkEnd::NotPresent { level: 1 },
        levels: VTD_LEVELS,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pgtable::{IoPageTable, IotlbGather, VtdConfig, VtdPageTable};
    use std::sync::Arc;

    #[test]
    fn walks_agree_with_the_table_and_say_why_they_stop() {
        let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
        let t = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        t.map(0x20_0000, 0x60_0000, 0x20_0000, Perm::READ).unwrap();
        t.map(0x1000, 0x7000, 0x1000, Perm::RW).unwrap();
        let w = walk(&mem, t.root(), 0x20_1234);
        assert_eq!(
            w.end,
            WalkEnd::Leaf {
                phys: 0x60_0000,
                size: PageSize::Size2M,
                perm: Perm::READ
            }
        );
        assert_eq!(w.levels, 3);
        let w = walk(&mem, t.root(), 0x1000);
        assert_eq!(w.levels, 4);
        assert!(matches!(w.end, WalkEnd::Leaf { phys: 0x7000, .. }));
        assert_eq!(
            walk(&mem, t.root(), 0x2000).end,
            WalkEnd::NotPresent { level: 1 }
        );
        assert_eq!(
            walk(&mem, t.root(), 1 << 40).end,
            WalkEnd::NotPresent { level: 4 }
        );
        let mut g = IotlbGather::new();
        t.unmap(0x1000, 0x1000, &mut g).unwrap();
        assert_eq!(
            walk(&mem, t.root(), 0x1000).end,
            WalkEnd::NotPresent { level: 1 }
        );
        g.complete().unwrap();
    }

    #[test]
    fn corrupt_tables_are_reported_not_followed() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let root = mem
            .alloc_zeroed_owned(0, crate::mem::FrameOwner::Iommu)
            .unwrap();
        // A root in RAM is never followed: only the reserve holds tables.
        let ram = mem.alloc_zeroed_frames(0).unwrap();
        assert_eq!(
            walk(&mem, ram, 0).end,
            WalkEnd::BadTable {
                level: 4,
                table: ram
            }
        );
        // Nor a table pointer into RAM, nor a leaf into the reserve.
        mem.store_u64(root, ram | 3, Ordering::Relaxed).unwrap();
        assert_eq!(
            walk(&mem, root, 0).end,
            WalkEnd::BadTable {
                level: 3,
                table: ram
            }
        );
        let mut at = root;
        for _ in 0..3 {
            let next = mem
                .alloc_zeroed_owned(0, crate::mem::FrameOwner::Iommu)
                .unwrap();
            mem.store_u64(at, next | 3, Ordering::Relaxed).unwrap();
            at = next;
        }
        // The last-level entry names the root itself.
        mem.store_u64(at, root | 3, Ordering::Relaxed).unwrap();
        assert_eq!(
            walk(&mem, root, 0).end,
            WalkEnd::BadTable {
                level: 1,
                table: root
            }
        );
        // A table pointer far outside the 1 MiB arena.
        mem.store_u64(root, (1 << 40) | 3, Ordering::Relaxed)
            .unwrap();
        assert_eq!(
            walk(&mem, root, 0).end,
            WalkEnd::BadTable {
                level: 3,
                table: 1 << 40
            }
        );
        // PS set at level 4 is reserved.
        mem.store_u64(root, 0x2000 | 3 | 1 << 7, Ordering::Relaxed)
            .unwrap();
        assert!(matches!(
            walk(&mem, root, 0).end,
            WalkEnd::Reserved { level: 4, .. }
        ));
    }
}
