//! [`DeviceQueue`]: the device's side of one split virtqueue (§2.7), a
//! `virtio_queue::Queue` with the checks a device owes its host: every
//! index the driver wrote is bounded before use, every chain is walked
//! with a limit, and every failure is a typed [`DeviceError`] rather than
//! a silently shortened chain.
//!
//! All ring accesses go through the `GuestMemory` the device is given —
//! for our devices `vm_memory::IommuMemory` over the unit — so every
//! address here is an IOVA and a refused translation is a fault in the
//! unit's log and a [`DeviceError::DmaFault`] here.

use std::fmt::Display;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use softiommu::hw::Access;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use super::error::DeviceError;
use crate::spec::{desc, feature, ring};

/// Where a queue's rings are and how large it is, as the driver set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    /// The queue's index.
    pub index: u16,
    /// Entries (a power of two).
    pub size: u16,
    /// Descriptor table IOVA.
    pub desc: u64,
    /// Available ring IOVA.
    pub avail: u64,
    /// Used ring IOVA.
    pub used: u64,
}

impl QueueLayout {
    /// The queue's three areas as `(what, address, bytes)`: the
    /// descriptor table (§2.7.5: 16 bytes an entry), the available ring
    /// (§2.7.6) and the used ring (§2.7.8), event fields included.
    pub fn areas(&self) -> [(&'static str, u64, u64); 3] {
        let desc = desc::SIZE.saturating_mul(u64::from(self.size));
        [
            ("descriptor table", self.desc, desc),
            ("available ring", self.avail, ring::avail_bytes(self.size)),
            ("used ring", self.used, ring::used_bytes(self.size)),
        ]
    }

    /// Checks that every area ends inside the 64-bit address space (the
    /// address one past its last byte is representable), so that no
    /// offset the device adds within an area can wrap:
    /// [`DeviceError::AddressOverflow`] otherwise.
    pub fn check_extents(&self) -> Result<(), DeviceError> {
        for (what, addr, len) in self.areas() {
            if addr.checked_add(len).is_none() {
                return Err(DeviceError::AddressOverflow {
                    queue: self.index,
                    what,
                    addr,
                    len,
                });
            }
        }
        Ok(())
    }
}

/// One descriptor of a walked chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainDesc {
    /// The buffer's IOVA.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u32,
    /// Device-writable (`VIRTQ_DESC_F_WRITE`).
    pub writable: bool,
    /// The descriptor's index in the table.
    pub index: u16,
}

/// What a device needs of every descriptor of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainDir {
    /// Every descriptor device-readable (a transmit or request chain).
    Readable,
    /// Every descriptor device-writable (a receive chain).
    Writable,
    /// Device-readable descriptors, then device-writable ones (a block
    /// request: header and data out, then data in and status). §2.7.4.2:
    /// "The driver MUST place any device-writable descriptor elements after
    /// any device-readable descriptor elements."
    ReadableThenWritable,
}

/// The device side of a live split virtqueue.
#[derive(Debug)]
pub struct DeviceQueue {
    layout: QueueLayout,
    q: Queue,
    /// The available index as last read: entries up to it are known
    /// published, so it is re-read only when the device catches up.
    avail_seen: u16,
    stopped: bool,
    indirect: bool,
    generation: u64,
}

/// Gives each live queue a number of its own (see
/// [`DeviceQueue::generation`]).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

fn fault(
    queue: u16,
    what: &'static str,
    iova: u64,
    access: Access,
    e: impl Display,
) -> DeviceError {
    DeviceError::DmaFault {
        queue,
        what,
        iova,
        access,
        reason: e.to_string(),
    }
}

impl DeviceQueue {
    /// A live queue with `layout` (already checked by the transport) and
    /// the negotiated `features`. Refused if a ring runs past the end of
    /// the 64-bit address space ([`QueueLayout::check_extents`]), or
    /// (never with a layout the transport checked) if `virtio-queue` will
    /// not take it.
    pub fn new(layout: QueueLayout, features: u64) -> Result<Self, DeviceError> {
        layout.check_extents()?;
        let bad = |what, addr, align| DeviceError::QueueLayoutInvalid {
            queue: layout.index,
            what,
            addr,
            align,
        };
        let mut q = Queue::new(layout.size).map_err(|_| bad("size", u64::from(layout.size), 1))?;
        q.try_set_size(layout.size)
            .map_err(|_| bad("size", u64::from(layout.size), 1))?;
        q.try_set_desc_table_address(GuestAddress(layout.desc))
            .map_err(|_| bad("descriptor table", layout.desc, ring::DESC_ALIGN))?;
        q.try_set_avail_ring_address(GuestAddress(layout.avail))
            .map_err(|_| bad("available ring", layout.avail, ring::AVAIL_ALIGN))?;
        q.try_set_used_ring_address(GuestAddress(layout.used))
            .map_err(|_| bad("used ring", layout.used, ring::USED_ALIGN))?;
        q.set_ready(true);
        Ok(Self {
            layout,
            q,
            avail_seen: 0,
            stopped: false,
            indirect: features & 1 << feature::RING_INDIRECT_DESC != 0,
            generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The layout.
    pub fn layout(&self) -> QueueLayout {
        self.layout
    }

    /// `base + off`, the first of `len` bytes inside one of the queue's
    /// areas. The extents were checked when the queue was made, so this
    /// cannot fail for an offset inside an area; an overflow is still the
    /// typed error, never a wrap.
    fn at(&self, what: &'static str, base: u64, off: u64, len: u64) -> Result<u64, DeviceError> {
        base.checked_add(off)
            .filter(|a| a.checked_add(len).is_some())
            .ok_or(DeviceError::AddressOverflow {
                queue: self.layout.index,
                what,
                addr: base,
                len: off.saturating_add(len),
            })
    }

    /// A number no other queue made in this process has: a device that
    /// keeps per-queue state across batches (chains it holds back) knows by
    /// it that a reset replaced the queue, and drops that state.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The queue's index.
    pub fn index(&self) -> u16 {
        self.layout.index
    }

    /// Whether an error stopped the queue (it stays stopped until reset).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Stops the queue: it yields no more chains.
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// The next chain head the driver made available, if any (§2.7.13.3).
    /// Reads the available index only when the entries it last saw are
    /// used up.
    pub fn pop<M: GuestMemory>(&mut self, mem: &M) -> Result<Option<u16>, DeviceError> {
        if self.stopped {
            return Ok(None);
        }
        let (i, size) = (self.layout.index, self.layout.size);
        let next = self.q.next_avail();
        if next == self.avail_seen {
            let idx_at = self.at("available ring", self.layout.avail, 2, 2)?;
            let idx = self
                .q
                .avail_idx(mem, Ordering::Acquire)
                .map_err(|e| fault(i, "available ring", idx_at, Access::Read, e))?
                .0;
            let ahead = idx.wrapping_sub(next);
            if ahead > size {
                return Err(DeviceError::AvailIndexTooFar {
                    queue: i,
                    avail: idx,
                    next,
                    size,
                });
            }
            self.avail_seen = idx;
            if ahead == 0 {
                return Ok(None);
            }
        }
        // Inside the ring: `next % size < size`.
        let addr = self.at(
            "available ring",
            self.layout.avail,
            ring::AVAIL_HEADER + 2 * u64::from(next % size),
            2,
        )?;
        // Relaxed: ordered after the Acquire load of the index above.
        let head: u16 = mem
            .load(GuestAddress(addr), Ordering::Relaxed)
            .map(u16::from_le)
            .map_err(|e| fault(i, "available ring", addr, Access::Read, e))?;
        self.q.set_next_avail(next.wrapping_add(1));
        Ok(Some(head))
    }

    /// Gives back the chain the last [`pop`](Self::pop) returned, unused
    /// and untouched (a frame the device dropped): the next `pop` returns
    /// it again. Call only right after a `pop` that returned a head.
    pub(crate) fn unpop(&mut self) {
        let prev = self.q.next_avail().wrapping_sub(1);
        self.q.set_next_avail(prev);
    }

    /// Walks the chain from `head` into `out` (cleared first), checking
    /// every index, the length (at most the queue size: §2.7.5.2, so a loop
    /// is caught), the direction each descriptor must have, and that no
    /// indirect table appears unless negotiated. Returns the chain's total
    /// bytes.
    pub fn walk<M: GuestMemory>(
        &self,
        mem: &M,
        head: u16,
        dir: ChainDir,
        out: &mut Vec<ChainDesc>,
    ) -> Result<u64, DeviceError> {
        let (q, size) = (self.layout.index, self.layout.size);
        out.clear();
        let mut index = head;
        let mut total = 0u64;
        let mut seen_writable = false;
        loop {
            if index >= size {
                return Err(DeviceError::DescriptorIndexOutOfRange {
                    queue: q,
                    index,
                    size,
                });
            }
            if out.len() >= usize::from(size) {
                return Err(DeviceError::ChainLoop {
                    queue: q,
                    head,
                    size,
                });
            }
            // Inside the table: `index < size`.
            let at = self.at(
                "descriptor table",
                self.layout.desc,
                desc::SIZE * u64::from(index),
                desc::SIZE,
            )?;
            let mut raw = [0u8; desc::SIZE as usize];
            mem.read_slice(&mut raw, GuestAddress(at))
                .map_err(|e| fault(q, "descriptor", at, Access::Read, e))?;
            let addr = u64::from_le_bytes([
                raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
            ]);
            let len = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
            let flags = u16::from_le_bytes([raw[12], raw[13]]);
            let next = u16::from_le_bytes([raw[14], raw[15]]);
            if flags & desc::F_INDIRECT != 0 && !self.indirect {
                return Err(DeviceError::IndirectNotNegotiated { queue: q, index });
            }
            let writable = flags & desc::F_WRITE != 0;
            let wrong = match dir {
                ChainDir::Readable if writable => Some(("write-only", "readable")),
                ChainDir::Writable if !writable => Some(("read-only", "writable")),
                ChainDir::ReadableThenWritable if seen_writable && !writable => {
                    Some(("read-only after a write-only", "writable"))
                }
                _ => None,
            };
            seen_writable |= writable;
            if let Some((found, needed)) = wrong {
                return Err(DeviceError::WrongDirection {
                    queue: q,
                    head,
                    index,
                    found,
                    needed,
                });
            }
            if addr.checked_add(u64::from(len)).is_none() {
                // Every offset the device adds inside the buffer is below
                // `len`, so none of them can wrap once this holds.
                return Err(DeviceError::AddressOverflow {
                    queue: q,
                    what: "buffer",
                    addr,
                    len: u64::from(len),
                });
            }
            total = total.saturating_add(u64::from(len));
            out.push(ChainDesc {
                addr,
                len,
                writable,
                index,
            });
            if flags & desc::F_NEXT == 0 {
                return Ok(total);
            }
            index = next;
        }
    }

    /// Returns the chain at `head` to the driver with `len` bytes written
    /// (§2.7.8), publishing the used index with Release.
    pub fn add_used<M: GuestMemory>(
        &mut self,
        mem: &M,
        head: u16,
        len: u32,
    ) -> Result<(), DeviceError> {
        let q = self.layout.index;
        let used = self.layout.used;
        self.q
            .add_used(mem, head, len)
            .map_err(|e| fault(q, "used ring", used, Access::Write, e))
    }

    /// Whether the driver wants an interrupt for what was just used: the
    /// available ring's `VIRTQ_AVAIL_F_NO_INTERRUPT` is clear (§2.7.7.2;
    /// `virtio-queue` does not read the flag itself). The full fence orders
    /// the used-index store before this load, pairing with the driver's
    /// fence between re-enabling interrupts and re-reading the used index.
    pub fn interrupt_wanted<M: GuestMemory>(&mut self, mem: &M) -> Result<bool, DeviceError> {
        fence(Ordering::SeqCst);
        let at = self.layout.avail;
        let flags: u16 = mem
            .load(GuestAddress(at), Ordering::Relaxed)
            .map(u16::from_le)
            .map_err(|e| fault(self.layout.index, "available ring", at, Access::Read, e))?;
        Ok(flags & ring::AVAIL_F_NO_INTERRUPT == 0)
    }

    /// Asks the driver to notify again (clears `VIRTQ_USED_F_NO_NOTIFY`,
    /// §2.7.10) and reports whether chains arrived meanwhile (then the
    /// device should go on instead of sleeping).
    pub fn enable_notification<M: GuestMemory>(&mut self, mem: &M) -> Result<bool, DeviceError> {
        if self.stopped {
            return Ok(false);
        }
        let used = self.layout.used;
        self.q
            .enable_notification(mem)
            .map_err(|e| fault(self.layout.index, "used ring", used, Access::Write, e))
    }

    /// Asks the driver not to notify (sets `VIRTQ_USED_F_NO_NOTIFY`): the
    /// device is polling.
    pub fn disable_notification<M: GuestMemory>(&mut self, mem: &M) -> Result<(), DeviceError> {
        if self.stopped {
            return Ok(());
        }
        let used = self.layout.used;
        self.q
            .disable_notification(mem)
            .map_err(|e| fault(self.layout.index, "used ring", used, Access::Write, e))
    }

    /// Whether the available ring is known to hold chains the device has
    /// not popped (without reading memory).
    pub fn known_pending(&self) -> bool {
        !self.stopped && self.q.next_avail() != self.avail_seen
    }
}
