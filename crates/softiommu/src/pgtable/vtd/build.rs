//! The general map path: plan (check the range is free, count the tables
//! it needs), allocate every page up front, build the missing subtrees in
//! fresh pages, then publish them with one compare-exchange each.

use super::*;

/// Table pages one call allocated: `spare` are zeroed and unused, `fresh`
/// are being written and not yet linked. Both are freed on drop (neither was
/// ever visible to a walker); pages, once linked, are forgotten here.
pub(super) struct Frames<'a> {
    pub(super) mem: &'a PhysMemory,
    pub(super) spare: Vec<PhysAddr>,
    pub(super) fresh: Vec<PhysAddr>,
}

impl<'a> Frames<'a> {
    /// Allocates `n` zeroed pages, or none.
    pub(super) fn alloc(mem: &'a PhysMemory, n: u64) -> Result<Self, MemError> {
        let mut f = Frames {
            mem,
            spare: Vec::new(),
            fresh: Vec::new(),
        };
        for _ in 0..n {
            // On failure `f` is dropped and frees what it took.
            f.spare.push(mem.alloc_zeroed_owned(0, FrameOwner::Iommu)?);
        }
        Ok(f)
    }

    /// Takes a zeroed page to write.
    pub(super) fn take(&mut self) -> Option<PhysAddr> {
        let p = self.spare.pop()?;
        self.fresh.push(p);
        Some(p)
    }

    /// Zeroes an unlinked page and returns it to the spares.
    pub(super) fn recycle(&mut self, page: PhysAddr) -> Result<(), MemError> {
        self.mem.fill(page, PAGE_SIZE, 0)?;
        self.spare.push(page);
        Ok(())
    }
}

impl Drop for Frames<'_> {
    fn drop(&mut self) {
        for &p in self.spare.iter().chain(&self.fresh) {
            // Cannot fail: each page was allocated here and never linked.
            let _ = self.mem.free_owned(p, 0, FrameOwner::Iommu);
        }
    }
}

/// A new subtree waiting to be linked into a published table.
pub(super) struct Link {
    /// The parent entry to store it in.
    pub(super) slot: PhysAddr,
    /// The subtree's top table.
    pub(super) child: PhysAddr,
    /// The parent's level.
    pub(super) level: u32,
    /// The IOVA range it maps, and the physical address of its start.
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) phys: PhysAddr,
    /// Its pages, as indices into `Frames::fresh`.
    pub(super) pages: Range<usize>,
}

impl VtdPageTable {
    /// Checks that `[start, end)` is unmapped under `table` (`None`: a table
    /// still to be made) and counts the tables the map will add; stops as
    /// soon as the count exceeds the arena's frames.
    pub(super) fn plan_map(
        &self,
        table: Option<PhysAddr>,
        level: u32,
        start: u64,
        end: u64,
        phys: PhysAddr,
        need: &mut u64,
    ) -> Result<(), Stop> {
        if table.is_none() && level == 1 {
            return Ok(()); // a new last-level table needs no more tables
        }
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            let p = phys + (cur - start);
            let raw = match table {
                // Acquire: see the contents of a table another call linked.
                Some(t) => self.mem.load_u64(slot(t, level, cur), Ordering::Acquire)?,
                None => 0,
            };
            match decode_entry(raw, level) {
                SlEntry::NotPresent if fits_leaf(level, cur, p, next - cur) => {}
                SlEntry::NotPresent => {
                    *need += 1;
                    if *need > self.mem.iommu_reserve().1 / PAGE_SIZE {
                        return Err(Stop::Mem(MemError::OutOfFrames { order: 0 }));
                    }
                    self.plan_map(None, level - 1, cur, next, p, need)?;
                }
                SlEntry::Table { addr, .. } => {
                    self.plan_map(Some(addr), level - 1, cur, next, p, need)?;
                }
                SlEntry::Leaf { .. } | SlEntry::Reserved { .. } => return Err(Stop::At(cur)),
            }
            cur = next;
        }
        Ok(())
    }

    /// Maps `[start, end)` → `phys` under `table`, one builder for both
    /// kinds of table:
    ///
    /// - a *linked* table (`links` given), which walkers may be reading:
    ///   its entries are read first, leaves are stored at once (recorded
    ///   for flushing), and each missing subtree is built in fresh pages
    ///   and queued in `links`, to be published by [`publish`](Self::publish);
    /// - a *fresh* table (`links` is `None`), a zeroed page no walker can
    ///   see yet: nothing is read, every entry is stored plainly, and
    ///   subtrees are built in place (the whole page is flushed when it is
    ///   published).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn build(
        &self,
        op: &mut Op,
        frames: &mut Frames<'_>,
        mut links: Option<&mut Vec<Link>>,
        table: PhysAddr,
        level: u32,
        start: u64,
        end: u64,
        phys: PhysAddr,
        perm: Perm,
    ) -> Result<(), Stop> {
        let mut cur = start;
        while cur < end {
            let next = entry_end(cur, level, end);
            let p = phys + (cur - start);
            let at = slot(table, level, cur);
            let raw = match links {
                // Acquire: as in `plan_map`.
                Some(_) => self.mem.load_u64(at, Ordering::Acquire)?,
                None => 0,
            };
            let entry = match decode_entry(raw, level) {
                SlEntry::NotPresent if fits_leaf(level, cur, p, next - cur) => {
                    leaf_entry(p, level, perm)
                }
                SlEntry::NotPresent => {
                    let first = frames.fresh.len();
                    let child = frames.take().ok_or(Stop::Raced(cur))?;
                    self.build(op, frames, None, child, level - 1, cur, next, p, perm)?;
                    match links.as_deref_mut() {
                        Some(links) => {
                            links.push(Link {
                                slot: at,
                                child,
                                level,
                                start: cur,
                                end: next,
                                phys: p,
                                pages: first..frames.fresh.len(),
                            });
                            cur = next;
                            continue;
                        }
                        None => table_entry(child),
                    }
                }
                SlEntry::Table { addr, .. } => {
                    self.build(
                        op,
                        frames,
                        links.as_deref_mut(),
                        addr,
                        level - 1,
                        cur,
                        next,
                        p,
                        perm,
                    )?;
                    cur = next;
                    continue;
                }
                // `plan_map` found the range free: a concurrent call mapped it.
                SlEntry::Leaf { .. } | SlEntry::Reserved { .. } => return Err(Stop::Raced(cur)),
            };
            if links.is_some() {
                self.store_leaf(op, at, entry)?;
            } else {
                // Relaxed: no walker can see this page until it is linked
                // with a Release store (`publish`), which orders this store
                // before it.
                self.mem.store_u64(at, entry, Ordering::Relaxed)?;
                op.st.entries_written += 1;
            }
            cur = next;
        }
        Ok(())
    }

    /// Links the queued subtrees: flushes their pages (one batch), then
    /// stores each parent entry. A subtree whose entry another call filled
    /// meanwhile is rebuilt into that call's table, and its pages recycled.
    pub(super) fn publish(
        &self,
        op: &mut Op,
        frames: &mut Frames<'_>,
        mut links: Vec<Link>,
        perm: Perm,
    ) -> Result<(), Stop> {
        while !links.is_empty() {
            // A walker must find the new pages in memory before it can find
            // a pointer to them: flush them whole, fence, then link.
            for &page in &frames.fresh {
                op.fl.record_range(page, PAGE_SIZE);
            }
            op.fl.flush(&self.mem);
            let mut lost = Vec::new();
            for link in links.drain(..) {
                // Release: pairs with the walker's Acquire load of this
                // entry, so it sees the subtree as written above. On failure
                // (Acquire) we see the winner's table.
                match self.mem.compare_exchange_u64(
                    link.slot,
                    0,
                    table_entry(link.child),
                    Ordering::Release,
                )? {
                    Ok(_) => {
                        op.fl.record(link.slot);
                        op.st.entries_written += 1;
                        op.st.tables_allocated += link.pages.len() as u64;
                    }
                    Err(actual) => lost.push((link, actual)),
                }
            }
            let fresh = std::mem::take(&mut frames.fresh);
            for (link, _) in &lost {
                for &page in &fresh[link.pages.clone()] {
                    frames.recycle(page)?;
                }
            }
            for (link, actual) in lost {
                match decode_entry(actual, link.level) {
                    SlEntry::Table { addr, .. } => self.build(
                        op,
                        frames,
                        Some(&mut links),
                        addr,
                        link.level - 1,
                        link.start,
                        link.end,
                        link.phys,
                        perm,
                    )?,
                    _ => return Err(Stop::Raced(link.start)),
                }
            }
        }
        Ok(())
    }

    pub(super) fn map_inner(
        &self,
        op: &mut Op,
        iova: u64,
        end: u64,
        phys: PhysAddr,
        perm: Perm,
    ) -> Result<(), PgtableError> {
        let len = end - iova;
        let mut need = 0;
        self.plan_map(Some(self.root), VTD_LEVELS, iova, end, phys, &mut need)
            .map_err(|s| s.into_error(|at| PgtableError::AlreadyMapped { iova, len, at }))?;
        if need > 0 {
            // Fail fast rather than zero and free a whole arena of pages.
            let f = self.mem.iommu_frame_stats();
            if need > f.total_frames - f.allocated_frames {
                return Err(MemError::OutOfFrames { order: 0 }.into());
            }
        }
        let mut frames = Frames::alloc(&self.mem, need)?;
        let mut links = Vec::new();
        let raced = |s: Stop| s.into_error(|at| PgtableError::Raced { at });
        self.build(
            op,
            &mut frames,
            Some(&mut links),
            self.root,
            VTD_LEVELS,
            iova,
            end,
            phys,
            perm,
        )
        .map_err(raced)?;
        self.publish(op, &mut frames, links, perm).map_err(raced)
    }
}
