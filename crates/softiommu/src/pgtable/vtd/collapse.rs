//! Collapsing: a last-level table whose 512 entries are 4 KiB leaves of
//! one physically contiguous, 2 MiB-aligned block with the same rights is
//! replaced by one 2 MiB leaf in its parent (what Linux's `khugepaged`
//! does for CPU page tables, `mm/khugepaged.c`).
//!
//! Unlike `khugepaged`, which clears the PMD, flushes, then installs the
//! huge PMD (a CPU may take a fault meanwhile), the parent entry here goes
//! from "table" to "2 MiB leaf" in one atomic 64-bit compare-exchange,
//! because a device walking the block must never miss: every IOVA of the
//! block translates to the same physical address with the same rights
//! before and after, only the leaf size changes. That is the change the
//! Intel SDM (vol. 3A, "Details of TLB Use") allows without an
//! invalidation for correctness — cached translations of both sizes may
//! coexist for a while and any of them may be used — and the one it warns
//! against is changing the size *and* the frame or rights, which this
//! never does. Our IOTLB tolerates a 4 KiB and a 2 MiB entry for the same
//! IOVA likewise (a lookup takes either).
//!
//! What needs the invalidation is the old table page: a walker that read
//! the parent entry before the swap may still be reading it. It goes to
//! the caller's [`IotlbGather`] like a page an unmap unlinked, with the
//! block's range, and is freed only by [`IotlbGather::complete`] after
//! the caller's invalidation (page-structure caches too: the hint clear)
//! and its wait — Linux's order too (`collapse_and_free_pmd`: flush,
//! then `pte_free`; commit e59a47b8a453, and 723a80dafed5 on why the
//! flush must cover the collapsed range exactly when the table is freed).

use super::*;

impl VtdPageTable {
    /// Collapses the 2 MiB-aligned block at `iova` into one 2 MiB leaf if
    /// its last-level table holds 512 present 4 KiB leaves mapping one
    /// physically contiguous, 2 MiB-aligned range with the same rights.
    /// Returns `Some` with what it did, or `None` (nothing changed) if the
    /// block is not collapsible: a hole, leaves that are not contiguous or
    /// not 2 MiB-aligned in physical memory, mixed rights, or no table to
    /// collapse (unmapped, or a large leaf already).
    ///
    /// The parent entry is swapped with one atomic 64-bit compare-exchange
    /// (Release) and, for a non-coherent walker, its line flushed; the old
    /// table page is unlinked and added to `gather` with the block's range.
    /// No translation changes, so a device may walk the block throughout;
    /// but the caller must invalidate the range (IOTLB and paging-structure
    /// caches) and wait before it calls [`IotlbGather::complete`], which
    /// frees the page.
    ///
    /// Concurrency: as a map or an unmap of the block — callers serialise
    /// it with every map and unmap whose range overlaps the block.
    ///
    /// Errors (nothing changed): `Unaligned` (`iova` not a multiple of
    /// 2 MiB), `AddressTooWide` (the block reaches past 2^48),
    /// `GatherMismatch`, `Raced` (the parent entry changed under the call:
    /// the contract above was broken), `Mem` (a table outside memory).
    pub fn collapse_2m(
        &self,
        iova: u64,
        gather: &mut IotlbGather,
    ) -> Result<Option<OpStats>, PgtableError> {
        let span = 1u64 << level_shift(2);
        if !iova.is_multiple_of(span) {
            return Err(PgtableError::Unaligned {
                iova,
                len: span,
                align: span,
            });
        }
        if iova >= (1 << VTD_IOVA_BITS) {
            return Err(PgtableError::AddressTooWide {
                iova,
                len: span,
                width: VTD_IOVA_BITS,
            });
        }
        gather.check_memory(&self.mem)?;
        // Down to the block's level-2 table.
        let mut table = self.root;
        for level in (3..=VTD_LEVELS).rev() {
            // Acquire: as the walk's.
            let raw = self
                .mem
                .load_u64(slot(table, level, iova), Ordering::Acquire)?;
            match decode_entry(raw, level) {
                SlEntry::Table { addr, .. } => table = addr,
                _ => return Ok(None),
            }
        }
        let at = slot(table, 2, iova);
        let pde = self.mem.load_u64(at, Ordering::Acquire)?;
        let SlEntry::Table {
            addr: leaves,
            perm: pde_perm,
        } = decode_entry(pde, 2)
        else {
            return Ok(None);
        };
        let first = self.mem.load_u64(leaves, Ordering::Acquire)?;
        let SlEntry::Leaf {
            addr: phys, perm, ..
        } = decode_entry(first, 1)
        else {
            return Ok(None);
        };
        let rights = perm & pde_perm;
        if !phys.is_multiple_of(span) || rights.is_empty() {
            return Ok(None);
        }
        // Every entry exactly the leaf a 4 KiB map of the block would have
        // written: present, contiguous, same rights, no other bit.
        for i in 0..ENTRIES {
            let raw = self
                .mem
                .load_u64(leaves + i * ENTRY_BYTES, Ordering::Acquire)?;
            if raw != leaf_entry(phys + i * PAGE_SIZE, 1, perm) {
                return Ok(None);
            }
        }
        // Before the unlink: a hint that sees the old count saw the table
        // linked (see `hinted`).
        self.unlinks.fetch_add(1, Ordering::Release);
        // Release: pairs with the walker's Acquire load of this entry. One
        // atomic 64-bit write: a walker reads the table pointer or the
        // leaf, both translating the block the same way.
        match self.mem.compare_exchange_u64(
            at,
            pde,
            leaf_entry(phys, 2, rights),
            Ordering::Release,
        )? {
            Ok(_) => {}
            Err(_) => return Err(PgtableError::Raced { at: iova }),
        }
        let mut op = self.op();
        op.fl.record(at);
        op.st.entries_written += 1;
        op.st.tables_freed += 1;
        op.st.collapses += 1;
        gather.add_freed_table(&self.mem, leaves);
        gather.add_range(iova, span);
        Ok(Some(self.finish(op)))
    }
}
