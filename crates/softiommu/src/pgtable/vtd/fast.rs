//! The one-walk paths: a map or unmap inside one 2 MiB region whose tables
//! exist (the usual DMA shape) walks once to the last-level table.

use super::*;

impl VtdPageTable {
    /// The last-level table holding `[iova, end)`, when the range lies in
    /// one 2 MiB region whose tables all exist and no large leaf covers it:
    /// the usual shape of a DMA map or unmap (a few 4 KiB pages). Such a call
    /// allocates, splits and frees no table, so it needs one walk, not the
    /// general path's planning and checking passes. `None` sends the call
    /// to the general path, which also reports every error.
    pub(super) fn leaf_table(&self, iova: u64, end: u64) -> Option<PhysAddr> {
        if iova >> level_shift(2) != (end - 1) >> level_shift(2)
            || end - iova == 1 << level_shift(2)
        {
            return None;
        }
        let mut table = self.root;
        for level in (2..=VTD_LEVELS).rev() {
            // Acquire: pairs with the Release link of a new table.
            let raw = self
                .mem
                .load_u64(slot(table, level, iova), Ordering::Acquire)
                .ok()?;
            match decode_entry(raw, level) {
                SlEntry::Table { addr, .. } => table = addr,
                _ => return None,
            }
        }
        Some(table)
    }

    /// Whether every entry of `[iova, end)` in last-level `table` is empty.
    pub(super) fn leaves_empty(&self, table: PhysAddr, iova: u64, end: u64) -> bool {
        let mut cur = iova;
        while cur < end {
            match self.mem.load_u64(slot(table, 1, cur), Ordering::Relaxed) {
                Ok(0) => cur += PAGE_SIZE,
                _ => return false,
            }
        }
        true
    }

    /// Writes 4 KiB leaves for `[iova, end)` into last-level `table`;
    /// `false` (nothing written) if the table is outside the memory.
    pub(super) fn write_leaves(
        &self,
        op: &mut Op,
        table: PhysAddr,
        iova: u64,
        end: u64,
        phys: PhysAddr,
        perm: Perm,
    ) -> bool {
        let (mut cur, mut p) = (iova, phys);
        while cur < end {
            if self
                .store_leaf(op, slot(table, 1, cur), leaf_entry(p, 1, perm))
                .is_err()
            {
                return false;
            }
            cur += PAGE_SIZE;
            p += PAGE_SIZE;
        }
        true
    }

    /// [`IoPageTable::map`] for a range its caller owns and knows to be
    /// unmapped: an IOVA block the domain's allocator just handed out (an
    /// allocator returns a block only after the unmap that cleared it). On
    /// the one-walk path the entries are written without being read first.
    /// That read is what `map` uses to refuse an overlap, and it misses in
    /// the cache whenever a device walked the line since the CPU last wrote
    /// it: measured in `lab netperf-udp` (deferred, 32 B), skipping it took
    /// the CPU's cost from 0.46 to 0.36 µs per packet. Debug builds still
    /// read and refuse. Crate-internal: the precondition is `dma`'s to keep.
    pub(crate) fn map_fresh(
        &self,
        iova: u64,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
    ) -> Result<OpStats, PgtableError> {
        self.map_reading(iova, phys, len, perm, cfg!(debug_assertions))
    }

    /// A map whose one-walk path reads the entries first (and refuses an
    /// overlap) if `read_first`; the general path always checks.
    pub(super) fn map_reading(
        &self,
        iova: u64,
        phys: PhysAddr,
        len: u64,
        perm: Perm,
        read_first: bool,
    ) -> Result<OpStats, PgtableError> {
        let end = Self::check_map(iova, phys, len, perm)?;
        let mut op = self.op();
        if let Some(t) = self.leaf_table(iova, end) {
            if (!read_first || self.leaves_empty(t, iova, end))
                && self.write_leaves(&mut op, t, iova, end, phys, perm)
            {
                return Ok(self.finish(op));
            }
        }
        let result = self.map_inner(&mut op, iova, end, phys, perm);
        // Flush whatever was written, even on a (contract-breaking) error.
        let st = self.finish(op);
        result.map(|()| st)
    }

    /// Unmaps `[iova, end)` from last-level `table` if every entry is a
    /// 4 KiB leaf; `false` (nothing written) otherwise.
    pub(super) fn unmap_fast(
        &self,
        op: &mut Op,
        gather: &mut IotlbGather,
        table: PhysAddr,
        iova: u64,
        end: u64,
    ) -> bool {
        let mut cur = iova;
        while cur < end {
            match self.mem.load_u64(slot(table, 1, cur), Ordering::Acquire) {
                Ok(raw) if matches!(decode_entry(raw, 1), SlEntry::Leaf { .. }) => cur += PAGE_SIZE,
                _ => return false,
            }
        }
        let mut cur = iova;
        while cur < end {
            if self.clear_entry(op, slot(table, 1, cur)).is_err() {
                return false;
            }
            cur += PAGE_SIZE;
        }
        gather.add_range(iova, end - iova);
        true
    }
}
