//! [`BlkQueue`]: one request queue of the block driver, driven by one
//! thread at a time, the way a blk-mq hardware context drives a queue:
//!
//! - the ring and the request headers/status bytes are coherent
//!   allocations (`dma_alloc_coherent`), as NVMe and SCSI drivers keep
//!   their command structures;
//! - each request's data is a scatter list of single pages, mapped with
//!   one `map_sg` at submission and unmapped with one `unmap_sg` at
//!   completion (`blk_rq_map_sg` + `dma_map_sg`); segments the IOMMU made
//!   contiguous are merged up to `size_max`, as `iommu_dma_map_sg` does;
//! - completions can be handled on another DMA handle than submissions
//!   (an interrupt CPU): the IOVA is then freed where the unmap runs, as
//!   in Linux, which is what seed `004`'s caches age on.
//!
//! Nothing the device writes is trusted: a used id that is not an
//! outstanding head is a [`BlkDriverError::BadUsedId`], not an index.

use std::sync::Arc;
use std::time::Duration;

use softiommu::dma::{DmaCpu, DmaDevice, DmaDirection, SgEntry, SgMapping};
use softiommu::mem::{PhysAddr, PhysMemory, PAGE_SIZE};

use super::completion::{BlkCompletion, QueueStats, SlotData};
use super::config::BlkGeometry;
use super::driver::{check_device, BlkDriverError};
use super::request::{BlkHeader, BlkOp};
use crate::spec::{blk, desc, reg, status};
use crate::transport::MmioTransport;
use crate::vring::{DriverRing, RingLayout};

/// Bytes of each slot's command area: the 16-byte header, then the status
/// byte, padded.
const CMD_STRIDE: u64 = 32;
/// Where the status byte sits in a command area.
const STATUS_AT: u64 = blk::HDR_LEN as u64;
/// What the status byte holds until the device writes it.
const STATUS_UNSET: u8 = 0xff;
/// No slot.
const NONE: u16 = u16::MAX;

/// What a queue is built from.
#[derive(Debug)]
pub(crate) struct QueueParts {
    pub(crate) transport: MmioTransport,
    pub(crate) cpu: DmaCpu,
    pub(crate) dev: DmaDevice,
    pub(crate) index: u16,
    pub(crate) layout: RingLayout,
    pub(crate) depth: u16,
    pub(crate) small: u16,
    pub(crate) shared_small: bool,
    pub(crate) max_request_bytes: u64,
    pub(crate) geometry: BlkGeometry,
}

/// One request slot: its data pages, its scatter list and mapping while
/// in flight, the descriptors it holds.
#[derive(Debug)]
struct Slot {
    pages: Vec<PhysAddr>,
    sg: Vec<SgEntry>,
    dma: Vec<u64>,
    nsg: usize,
    mapping: Option<SgMapping>,
    dir: DmaDirection,
    descs: Vec<u16>,
    op: BlkOp,
    sector: u64,
    len: u64,
}

/// One request queue of a [`BlkDriver`](super::BlkDriver). `Send`: hand
/// it to the thread that drives it.
#[derive(Debug)]
pub struct BlkQueue {
    transport: MmioTransport,
    mem: Arc<PhysMemory>,
    cpu: DmaCpu,
    dev: DmaDevice,
    index: u16,
    ring: DriverRing,
    ring_dma: u64,
    cmd_phys: PhysAddr,
    cmd_dma: u64,
    cmd_bytes: u64,
    slots: Vec<Slot>,
    /// Free full-size slots (ids below `large`).
    free_slots: Vec<u16>,
    /// Free one-page slots (ids from `large` on).
    free_small: Vec<u16>,
    /// The pages every small slot uses when they are shared (see
    /// `BlkDriverConfig::shared_small`); empty otherwise.
    pool: Vec<PhysAddr>,
    large: u16,
    free_descs: Vec<u16>,
    /// Descriptor index → the slot whose chain starts there.
    by_head: Vec<u16>,
    geometry: BlkGeometry,
    max_request_bytes: u64,
    segs: Vec<(u64, u32)>,
    stats: QueueStats,
    unpublished: bool,
    released: bool,
}

impl BlkQueue {
    pub(crate) fn new(p: QueueParts) -> Result<Self, BlkDriverError> {
        let QueueParts {
            transport,
            mut cpu,
            dev,
            index,
            layout,
            depth,
            small,
            shared_small,
            max_request_bytes,
            geometry,
        } = p;
        let total = depth.saturating_add(small);
        let mem = dev.domain().system().memory().clone();
        let (ring_phys, ring_dma) = cpu.alloc_coherent(&dev, layout.bytes)?;
        let ring = DriverRing::new(mem.clone(), ring_phys, ring_dma, layout)?;
        let cmd_bytes = CMD_STRIDE * u64::from(total);
        let (cmd_phys, cmd_dma) = cpu.alloc_coherent(&dev, cmd_bytes)?;
        let pages = (max_request_bytes / PAGE_SIZE) as usize;
        let mut q = Self {
            transport,
            mem,
            cpu,
            dev,
            index,
            ring,
            ring_dma,
            cmd_phys,
            cmd_dma,
            cmd_bytes,
            slots: Vec::with_capacity(usize::from(total)),
            free_slots: (0..depth).rev().collect(),
            free_small: (depth..total).rev().collect(),
            pool: Vec::new(),
            large: depth,
            free_descs: (0..layout.size).rev().collect(),
            by_head: vec![NONE; usize::from(layout.size)],
            geometry,
            max_request_bytes,
            segs: Vec::with_capacity(pages),
            stats: QueueStats::default(),
            unpublished: false,
            released: false,
        };
        if shared_small && small > 0 {
            for _ in 0..pages {
                match q.mem.alloc_zeroed_frames(0) {
                    Ok(a) => q.pool.push(a),
                    Err(e) => {
                        let _ = q.free_memory();
                        q.released = true;
                        return Err(e.into());
                    }
                }
            }
        }
        for id in 0..total {
            // A shared small slot owns no pages; its lists grow on use.
            let pages = match (id < depth, shared_small) {
                (true, _) => pages,
                (false, false) => 1,
                (false, true) => 0,
            };
            let mut s = Slot {
                pages: Vec::with_capacity(pages),
                sg: Vec::with_capacity(pages),
                dma: vec![0; pages.max(1)],
                nsg: 0,
                mapping: None,
                dir: DmaDirection::FromDevice,
                descs: Vec::with_capacity(pages + 2),
                op: BlkOp::Read,
                sector: 0,
                len: 0,
            };
            for _ in 0..pages {
                match q.mem.alloc_zeroed_frames(0) {
                    Ok(a) => s.pages.push(a),
                    Err(e) => {
                        q.slots.push(s);
                        let _ = q.free_memory();
                        q.released = true;
                        return Err(e.into());
                    }
                }
            }
            q.slots.push(s);
        }
        q.ring.set_interrupts(false);
        Ok(q)
    }

    /// The device addresses of the descriptor table, available and used
    /// rings.
    pub(crate) fn ring_addresses(&self) -> (u64, u64, u64) {
        self.ring.device_addresses()
    }

    /// The queue's index.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// What the device said of itself.
    pub fn geometry(&self) -> BlkGeometry {
        self.geometry
    }

    /// Requests in flight at most (full-size and one-page slots).
    pub fn depth(&self) -> u16 {
        self.slots.len() as u16
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u16 {
        (self.slots.len() - self.free_slots.len() - self.free_small.len()) as u16
    }

    /// The largest request this queue issues.
    pub fn max_request_bytes(&self) -> u64 {
        self.max_request_bytes
    }

    /// The counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The queue's own DMA handle (the submitting CPU).
    pub fn dma_cpu(&self) -> &DmaCpu {
        &self.cpu
    }

    /// Checks a request as the block layer would before it reaches a
    /// driver: never empty, aligned to the block size, inside the disk, no
    /// larger than a slot.
    fn check(&self, op: BlkOp, sector: u64, len: u64, max: u64) -> Result<(), BlkDriverError> {
        let bad = |reason| BlkDriverError::BadRequest {
            reason,
            sector,
            len,
        };
        if !matches!(op, BlkOp::Read | BlkOp::Write) {
            return Ok(());
        }
        let bs = u64::from(self.geometry.blk_size);
        if len == 0 {
            return Err(bad("empty"));
        }
        if len > max {
            return Err(bad("too large"));
        }
        let offset = sector
            .checked_mul(blk::SECTOR_SIZE)
            .ok_or(bad("past the end"))?;
        if !len.is_multiple_of(bs) || offset % bs != 0 {
            return Err(bad("unaligned"));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.geometry.capacity_bytes() => Ok(()),
            _ => Err(bad("past the end")),
        }
    }

    /// Adds a request to the available ring (visible to the device at the
    /// next [`commit`](Self::commit)): `op` on `len` bytes from `sector`.
    /// A write's data is copied from `data` into the slot first (when
    /// given; otherwise the slot's pages go as they are). `GetId` reads 20
    /// bytes; `Flush` moves none. Returns the slot, or `None` when every
    /// slot or descriptor is in use (reap, then retry).
    pub fn submit(
        &mut self,
        op: BlkOp,
        sector: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<Option<u16>, BlkDriverError> {
        self.submit_in(false, op, sector, len, data)
    }

    /// As [`submit`](Self::submit), in a one-page slot (see
    /// [`BlkDriverConfig::small_slots`](super::BlkDriverConfig::small_slots)):
    /// at most 4 KiB.
    pub fn submit_small(
        &mut self,
        op: BlkOp,
        sector: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<Option<u16>, BlkDriverError> {
        self.submit_in(true, op, sector, len, data)
    }

    fn submit_in(
        &mut self,
        small: bool,
        op: BlkOp,
        sector: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<Option<u16>, BlkDriverError> {
        let len = match op {
            BlkOp::Read | BlkOp::Write => len,
            BlkOp::GetId => blk::ID_BYTES as u64,
            BlkOp::Flush => 0,
        };
        let max = if small && self.pool.is_empty() {
            PAGE_SIZE
        } else {
            self.max_request_bytes
        };
        self.check(op, sector, len, max)?;
        if data.is_some_and(|d| d.len() as u64 > len) {
            return Err(BlkDriverError::BadRequest {
                reason: "data longer than the request",
                sector,
                len,
            });
        }
        let free = if small {
            &self.free_small
        } else {
            &self.free_slots
        };
        let Some(&id) = free.last() else {
            self.stats.full += 1;
            return Ok(None);
        };
        let si = usize::from(id);
        let dir = if op.device_writes() {
            DmaDirection::FromDevice
        } else {
            DmaDirection::ToDevice
        };
        // The data: a scatter list of the slot's pages (or the shared ones).
        let slot = &mut self.slots[si];
        let pages = if small && !self.pool.is_empty() {
            &self.pool[..]
        } else {
            &slot.pages[..]
        };
        slot.sg.clear();
        let mut left = len;
        for &p in pages {
            if left == 0 {
                break;
            }
            let n = left.min(PAGE_SIZE);
            slot.sg.push(SgEntry { phys: p, len: n });
            left -= n;
        }
        if let Some(d) = data {
            let mut off = 0usize;
            for e in &slot.sg {
                if off >= d.len() {
                    break;
                }
                let n = (d.len() - off).min(e.len as usize);
                self.mem.write(e.phys, &d[off..off + n])?;
                off += n;
            }
        }
        let n = slot.sg.len();
        if slot.dma.len() < n {
            // A shared small slot's first request of this many segments.
            slot.dma.resize(n, 0);
        }
        let mapping = if n > 0 {
            Some(
                self.cpu
                    .map_sg(&self.dev, &slot.sg, dir, &mut slot.dma[..n])?,
            )
        } else {
            None
        };
        // Segments the IOMMU made contiguous, merged up to size_max.
        self.segs.clear();
        let size_max = u64::from(self.geometry.size_max);
        for (e, &a) in slot.sg.iter().zip(&slot.dma) {
            match self.segs.last_mut() {
                Some((at, l)) if *at + u64::from(*l) == a && u64::from(*l) + e.len <= size_max => {
                    *l += e.len as u32;
                }
                _ => self.segs.push((a, e.len as u32)),
            }
        }
        let need = self.segs.len() + 2;
        if self.segs.len() > self.geometry.seg_max as usize || self.free_descs.len() < need {
            if let Some(m) = mapping {
                self.cpu
                    .unmap_sg(&self.dev, &m, &slot.sg, &slot.dma[..n], dir)?;
            }
            self.stats.full += 1;
            return Ok(None);
        }
        if small {
            self.free_small.pop();
        } else {
            self.free_slots.pop();
        }
        slot.nsg = n;
        slot.mapping = mapping;
        slot.dir = dir;
        slot.op = op;
        slot.sector = sector;
        slot.len = len;
        // The command: header, then the status byte (unset).
        let cmd = self.cmd_phys + CMD_STRIDE * u64::from(id);
        let cmd_dma = self.cmd_dma + CMD_STRIDE * u64::from(id);
        let h = BlkHeader {
            type_: op.type_code(),
            reserved: 0,
            sector,
        };
        self.mem.write(cmd, &h.encode())?;
        self.mem.write(cmd + STATUS_AT, &[STATUS_UNSET])?;
        // Descriptors: header (readable), data, status (writable).
        slot.descs.clear();
        for _ in 0..need {
            if let Some(d) = self.free_descs.pop() {
                slot.descs.push(d);
            }
        }
        let data_flags = if op.device_writes() { desc::F_WRITE } else { 0 };
        for (k, &d) in slot.descs.iter().enumerate() {
            let next = slot.descs.get(k + 1).copied();
            let flags_next = if next.is_some() { desc::F_NEXT } else { 0 };
            let (addr, l, flags) = if k == 0 {
                (cmd_dma, blk::HDR_LEN as u32, 0)
            } else if k == need - 1 {
                (cmd_dma + STATUS_AT, 1, desc::F_WRITE)
            } else {
                let (a, l) = self.segs[k - 1];
                (a, l, data_flags)
            };
            self.ring
                .set_desc(d, addr, l, flags | flags_next, next.unwrap_or(0));
        }
        let head = slot.descs[0];
        self.by_head[usize::from(head)] = id;
        self.ring.push_avail(head);
        self.unpublished = true;
        self.stats.submitted += 1;
        Ok(Some(id))
    }

    /// Publishes every request submitted since the last commit and
    /// notifies the device if it asks for it (§2.7.13.3–4). Returns
    /// whether it notified.
    pub fn commit(&mut self) -> bool {
        if !self.unpublished {
            return false;
        }
        self.unpublished = false;
        self.ring.publish();
        if self.ring.needs_kick() {
            self.transport
                .write(reg::QUEUE_NOTIFY, u32::from(self.index));
            self.stats.kicks += 1;
            return true;
        }
        false
    }

    /// Takes every completed request: unmaps its data on `irq` (an
    /// interrupt CPU's handle) or, when `None`, on the queue's own handle,
    /// reads its status, calls `f` with it and its data, and frees the
    /// slot. Returns how many were taken.
    pub fn reap(
        &mut self,
        irq: Option<&mut DmaCpu>,
        mut f: impl FnMut(&BlkCompletion, &SlotData<'_>),
    ) -> Result<usize, BlkDriverError> {
        let cpu = match irq {
            Some(c) => c,
            None => &mut self.cpu,
        };
        let mut n = 0;
        while let Some((id, used_len)) = self.ring.pop_used() {
            let q = self.index;
            let si = usize::try_from(id)
                .ok()
                .and_then(|h| self.by_head.get_mut(h))
                .map(|s| std::mem::replace(s, NONE))
                .filter(|&s| s != NONE)
                .ok_or(BlkDriverError::BadUsedId { queue: q, id })?;
            let slot = &mut self.slots[usize::from(si)];
            if let Some(m) = slot.mapping.take() {
                cpu.unmap_sg(
                    &self.dev,
                    &m,
                    &slot.sg[..slot.nsg],
                    &slot.dma[..slot.nsg],
                    slot.dir,
                )?;
            }
            self.free_descs.extend(slot.descs.drain(..).rev());
            let mut st = [STATUS_UNSET];
            self.mem.read(
                self.cmd_phys + CMD_STRIDE * u64::from(si) + STATUS_AT,
                &mut st,
            )?;
            let c = BlkCompletion {
                slot: si,
                op: slot.op,
                sector: slot.sector,
                len: slot.len,
                status: st[0],
                used_len,
            };
            let pages = slot.sg.len().min(slot.pages.len());
            f(
                &c,
                &SlotData {
                    mem: &self.mem,
                    pages: &slot.pages[..pages],
                    len: slot.len,
                },
            );
            if si < self.large {
                self.free_slots.push(si);
            } else {
                self.free_small.push(si);
            }
            self.stats.completed += 1;
            if !c.is_ok() {
                self.stats.errors += 1;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Whether a completion is waiting (without taking it).
    pub fn has_completions(&self) -> bool {
        self.ring.has_used()
    }

    /// Routes this queue's interrupts to the calling thread.
    pub fn bind_interrupt(&self) {
        self.transport
            .bind_queue_interrupt(self.index, std::thread::current());
    }

    /// Asks the device to interrupt (before the thread sleeps) and returns
    /// whether completions already wait (then do not sleep). The fence in
    /// the ring orders the flag store before the used-index load.
    pub fn arm_interrupt(&mut self) -> bool {
        self.ring.set_interrupts(true);
        self.ring.has_used()
    }

    /// Suppresses interrupts again (the thread polls while it has work).
    pub fn disarm_interrupt(&mut self) {
        self.ring.set_interrupts(false);
    }

    /// Sleeps until this queue's interrupt or `timeout` (the queue must be
    /// bound to the calling thread), unless completions already wait;
    /// then acknowledges `InterruptStatus`. Returns the device's error if
    /// it needs a reset.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), BlkDriverError> {
        if !self.arm_interrupt() && check_device(&self.transport).is_ok() {
            std::thread::park_timeout(timeout);
        }
        self.disarm_interrupt();
        let isr = self.transport.read(reg::INTERRUPT_STATUS);
        if isr != 0 {
            self.transport.write(reg::INTERRUPT_ACK, isr);
        }
        check_device(&self.transport)
    }

    /// `Ok` while the device works.
    pub fn check_device(&self) -> Result<(), BlkDriverError> {
        check_device(&self.transport)
    }

    /// Unmaps the data of the first request in flight while the device
    /// still owns it, as a buggy driver would (the tests' fault
    /// injection): with a strict policy the device can no longer reach it.
    /// Returns the slot, or `None` when nothing is in flight.
    pub fn revoke_in_flight(&mut self) -> Result<Option<u16>, BlkDriverError> {
        let Some(si) = (0..self.slots.len()).find(|&i| self.slots[i].mapping.is_some()) else {
            return Ok(None);
        };
        let slot = &mut self.slots[si];
        if let Some(m) = slot.mapping.take() {
            self.cpu.unmap_sg(
                &self.dev,
                &m,
                &slot.sg[..slot.nsg],
                &slot.dma[..slot.nsg],
                slot.dir,
            )?;
        }
        Ok(Some(si as u16))
    }

    /// The physical pages of slot `slot` (for a test that looks at what
    /// the device did or did not write).
    pub fn slot_pages(&self, slot: u16) -> &[PhysAddr] {
        self.slots
            .get(usize::from(slot))
            .map_or(&[], |s| s.pages.as_slice())
    }

    /// Gives back the queue's memory: unmaps what is still mapped, frees
    /// the ring, the command area and the data pages. The device must have
    /// been reset ([`BlkDriver::reset`](super::BlkDriver::reset)) so that
    /// it no longer uses the queue.
    pub fn release(&mut self) -> Result<(), BlkDriverError> {
        if self.released {
            return Ok(());
        }
        let st = self.transport.status();
        if st & status::DRIVER_OK != 0 {
            return Err(BlkDriverError::DeviceLive {
                queue: self.index,
                status: st,
            });
        }
        self.released = true;
        self.free_memory()
    }

    fn free_memory(&mut self) -> Result<(), BlkDriverError> {
        let mut first = Ok(());
        let mut keep = |r: Result<(), BlkDriverError>| {
            if first.is_ok() {
                first = r;
            }
        };
        for s in &mut self.slots {
            if let Some(m) = s.mapping.take() {
                keep(
                    self.cpu
                        .unmap_sg(&self.dev, &m, &s.sg[..s.nsg], &s.dma[..s.nsg], s.dir)
                        .map_err(Into::into),
                );
            }
        }
        // Deferred unmaps must be invalidated before the pages are reused.
        keep(self.cpu.flush_own().map_err(Into::into));
        for s in &mut self.slots {
            for p in s.pages.drain(..) {
                keep(self.mem.free_frames(p, 0).map_err(Into::into));
            }
        }
        for p in self.pool.drain(..) {
            keep(self.mem.free_frames(p, 0).map_err(Into::into));
        }
        let l = self.ring.layout();
        keep(
            self.cpu
                .free_coherent(&self.dev, self.ring.phys(), self.ring_dma, l.bytes)
                .map_err(Into::into),
        );
        keep(
            self.cpu
                .free_coherent(&self.dev, self.cmd_phys, self.cmd_dma, self.cmd_bytes)
                .map_err(Into::into),
        );
        first
    }
}

impl Drop for BlkQueue {
    fn drop(&mut self) {
        // Only once the device is reset; a live device could still use the
        // memory, which is then leaked rather than handed to it.
        let _ = self.release();
    }
}
