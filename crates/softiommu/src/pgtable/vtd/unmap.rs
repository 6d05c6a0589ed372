//! The general unmap path: check the range is mapped, split large leaves
//! at its ends, clear, and hand unlinked tables to the gather.

use super::*;

impl VtdPageTable {
    /// Checks that all of `[start, end)` under `table` is mapped.
    pub(super) fn check_mapped(
        &self,
        table: PhysAddr,
        level: u32,
        start: u64,
        end: u64,
    ) -> Result<(), Stop> {
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            // Acquire: as in `plan_map`.
            let raw = self
                .mem
                .load_u64(slot(table, level, cur), Ordering::Acquire)?;
            match decode_entry(raw, level) {
                SlEntry::NotPresent | SlEntry::Reserved { .. } => return Err(Stop::At(cur)),
                SlEntry::Leaf { .. } => {}
                SlEntry::Table { addr, .. } => self.check_mapped(addr, level - 1, cur, next)?,
            }
            cur = next;
        }
        Ok(())
    }

    /// If the leaf holding `addr` reaches outside `[start, end)`, replaces it
    /// by a table of smaller leaves with the same translation and rights,
    /// down to a leaf inside the range (or 4 KiB).
    pub(super) fn split_at(
        &self,
        op: &mut Op,
        addr: u64,
        start: u64,
        end: u64,
    ) -> Result<(), Stop> {
        let mut table = self.root;
        let mut level = VTD_LEVELS;
        let (at, raw, leaf_phys, perm) = loop {
            let at = slot(table, level, addr);
            let raw = self.mem.load_u64(at, Ordering::Acquire)?;
            match decode_entry(raw, level) {
                SlEntry::Table { addr: t, .. } if level > 1 => {
                    table = t;
                    level -= 1;
                }
                SlEntry::Leaf { addr: p, perm, .. }
                    if level > 1 && !entry_inside(addr, level, start, end) =>
                {
                    break (at, raw, p, perm);
                }
                _ => return Ok(()),
            }
        };
        // How many levels down the split must go.
        let mut depth = 1;
        while level - depth > 1 && !entry_inside(addr, level - depth, start, end) {
            depth += 1;
        }
        let mut frames = Frames::alloc(&self.mem, u64::from(depth))?;
        let top = frames.take().ok_or(Stop::Raced(addr))?;
        let (mut page, mut l) = (top, level - 1);
        let mut base = addr & !((1u64 << level_shift(level)) - 1);
        let mut base_phys = leaf_phys;
        loop {
            let span = 1u64 << level_shift(l);
            for i in 0..ENTRIES {
                let e = leaf_entry(base_phys + i * span, l, perm);
                // Relaxed: the page is linked below with a Release store.
                self.mem
                    .store_u64(page + i * ENTRY_BYTES, e, Ordering::Relaxed)?;
            }
            op.st.entries_written += ENTRIES;
            if l == 1 || entry_inside(addr, l, start, end) {
                break;
            }
            // The smaller leaf holding `addr` still reaches out: split it too.
            let child = frames.take().ok_or(Stop::Raced(addr))?;
            let child_base = addr & !(span - 1);
            base_phys += child_base - base;
            base = child_base;
            self.mem
                .store_u64(slot(page, l, addr), table_entry(child), Ordering::Relaxed)?;
            op.st.entries_written += 1;
            page = child;
            l -= 1;
        }
        for &p in &frames.fresh {
            op.fl.record_range(p, PAGE_SIZE);
        }
        op.fl.flush(&self.mem);
        // Release: the walker sees the new tables whole. The compare-exchange
        // (against the leaf we read) only detects a broken contract.
        match self
            .mem
            .compare_exchange_u64(at, raw, table_entry(top), Ordering::Release)?
        {
            Ok(_) => {
                op.fl.record(at);
                op.st.entries_written += 1;
                op.st.tables_allocated += u64::from(depth);
                op.st.splits += u64::from(depth);
                frames.fresh.clear(); // linked now: no longer ours to free
                Ok(())
            }
            Err(_) => Err(Stop::Raced(addr)),
        }
    }

    /// Clears `[start, end)` under `table`: every leaf met lies wholly inside
    /// (after `split_at`). An entry whose whole span is inside is cleared
    /// without visiting below it, and the tables below go to `gather`.
    pub(super) fn clear(
        &self,
        op: &mut Op,
        gather: &mut IotlbGather,
        table: PhysAddr,
        level: u32,
        start: u64,
        end: u64,
    ) -> Result<(), Stop> {
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            let at = slot(table, level, cur);
            let whole = next - cur == 1 << level_shift(level);
            let raw = self.mem.load_u64(at, Ordering::Acquire)?;
            match decode_entry(raw, level) {
                SlEntry::Leaf { .. } if whole => self.clear_entry(op, at)?,
                SlEntry::Table { addr, .. } if whole => {
                    // Before the unlink: a hint that sees the old count
                    // saw the table linked (see `hinted`).
                    self.unlinks.fetch_add(1, Ordering::Release);
                    self.clear_entry(op, at)?;
                    self.gather_tables(op, gather, addr, level - 1)?;
                }
                SlEntry::Table { addr, .. } => {
                    self.clear(op, gather, addr, level - 1, cur, next)?
                }
                // `check_mapped` and `split_at` ruled these out.
                _ => return Err(Stop::Raced(cur)),
            }
            cur = next;
        }
        Ok(())
    }

    /// Stores leaf `entry` at `at` of a linked table, recording the write.
    pub(super) fn store_leaf(&self, op: &mut Op, at: PhysAddr, entry: u64) -> Result<(), Stop> {
        // Release: a walker that reads the leaf (Acquire) also sees what the
        // caller wrote before mapping.
        self.mem.store_u64(at, entry, Ordering::Release)?;
        op.fl.record(at);
        op.st.entries_written += 1;
        Ok(())
    }

    /// Clears the entry at `at` of a linked table, recording the write.
    pub(super) fn clear_entry(&self, op: &mut Op, at: PhysAddr) -> Result<(), Stop> {
        // Relaxed: clearing publishes nothing. The caller's invalidation
        // request, issued after this call returns, is a Release store that
        // orders this one before it.
        self.mem.store_u64(at, 0, Ordering::Relaxed)?;
        op.fl.record(at);
        op.st.entries_written += 1;
        Ok(())
    }

    /// Hands the unlinked table at `table` (level `level`) and every table
    /// below it to `gather`. Their entries are left as they are: no walker
    /// can reach them once the invalidation completes, and until then one
    /// that already could reads what they held.
    pub(super) fn gather_tables(
        &self,
        op: &mut Op,
        gather: &mut IotlbGather,
        table: PhysAddr,
        level: u32,
    ) -> Result<(), Stop> {
        if level > 1 {
            for i in 0..ENTRIES {
                let raw = self
                    .mem
                    .load_u64(table + i * ENTRY_BYTES, Ordering::Acquire)?;
                if let SlEntry::Table { addr, .. } = decode_entry(raw, level) {
                    self.gather_tables(op, gather, addr, level - 1)?;
                }
            }
        }
        gather.add_freed_table(&self.mem, table);
        op.st.tables_freed += 1;
        Ok(())
    }

    pub(super) fn unmap_inner(
        &self,
        op: &mut Op,
        gather: &mut IotlbGather,
        iova: u64,
        end: u64,
    ) -> Result<(), PgtableError> {
        let len = end - iova;
        gather.check_memory(&self.mem)?;
        self.check_mapped(self.root, VTD_LEVELS, iova, end)
            .map_err(|s| s.into_error(|at| PgtableError::NotMapped { iova, len, at }))?;
        let raced = |s: Stop| s.into_error(|at| PgtableError::Raced { at });
        self.split_at(op, iova, iova, end).map_err(raced)?;
        if end - PAGE_SIZE != iova {
            self.split_at(op, end - PAGE_SIZE, iova, end)
                .map_err(raced)?;
        }
        self.clear(op, gather, self.root, VTD_LEVELS, iova, end)
            .map_err(raced)?;
        gather.add_range(iova, len);
        Ok(())
    }

    // ----- the one-walk path -----
}
