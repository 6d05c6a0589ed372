//! [`DeviceQueue`]: the device's side of one split virtqueue (§2.7),
//! with the checks a device owes its host: every index the driver wrote
//! is bounded before use, every chain is walked with a limit, and every
//! failure is a typed [`DeviceError`] rather than a silently shortened
//! chain.
//!
//! It is the one ring implementation of the workspace: the devices behind
//! a softiommu unit and the vhost-user back-ends both pop, walk and
//! publish through it. Every ring access goes through the [`RingMemory`]
//! the caller hands in — vm-memory's `IommuMemory` over the unit, or a
//! vhost-user front-end's IOTLB — so every address here is an IOVA and a
//! refused translation is a [`DeviceError::DmaFault`] here (a
//! [`DeviceError::DmaAborted`] when the device is being stopped).

use std::sync::atomic::{fence, AtomicU64, Ordering};

use softiommu::hw::Access;

use super::error::DeviceError;
use super::ring_memory::RingMemory;
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
    /// The next available entry to take.
    next_avail: u16,
    /// The next used entry to fill.
    next_used: u16,
    /// The available index as last read: entries up to it are known
    /// published, so it is re-read only when the device catches up.
    avail_seen: u16,
    stopped: bool,
    /// The available entry the last [`DeviceQueue::pop`] took, while it
    /// may still be given back (neither given back nor followed by a
    /// completion).
    last_popped: Option<u16>,
    generation: u64,
}

/// The ring features [`DeviceQueue`] does not implement: a queue asked to
/// run with any of them is refused rather than run without honouring them
/// (an indirect table walked as a plain buffer, event indices ignored).
const UNIMPLEMENTED_FEATURES: u64 = 1 << feature::RING_INDIRECT_DESC | 1 << feature::RING_EVENT_IDX;

/// Gives each live queue a number of its own (see
/// [`DeviceQueue::generation`]).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// The error for a ring access `mem` refused: an abort when the device is
/// being stopped, else the fault with what the translation said.
fn fault<R: RingMemory + ?Sized>(
    queue: u16,
    what: &'static str,
    iova: u64,
    access: Access,
    e: R::Fault,
) -> DeviceError {
    if R::is_abort(&e) {
        return DeviceError::DmaAborted {
            queue,
            what,
            iova,
            access,
        };
    }
    DeviceError::DmaFault {
        queue,
        what,
        iova,
        access,
        reason: e.to_string(),
    }
}

impl DeviceQueue {
    /// A live queue with `layout` and the negotiated `features`, taking
    /// its first chain from available entry 0. Refused if the size is not
    /// a power of two in `1..=32768` or an area is misaligned
    /// ([`DeviceError::QueueLayoutInvalid`], §2.7's table), or if a ring
    /// runs past the end of the 64-bit address space
    /// ([`QueueLayout::check_extents`]). Features with
    /// `VIRTIO_F_INDIRECT_DESC` or `VIRTIO_F_EVENT_IDX`, which this ring
    /// code does not implement, are refused
    /// ([`DeviceError::RingFeatureUnsupported`]).
    pub fn new(layout: QueueLayout, features: u64) -> Result<Self, DeviceError> {
        if features & UNIMPLEMENTED_FEATURES != 0 {
            return Err(DeviceError::RingFeatureUnsupported {
                queue: layout.index,
                features: features & UNIMPLEMENTED_FEATURES,
            });
        }
        layout.check_extents()?;
        let bad = |what, addr, align| DeviceError::QueueLayoutInvalid {
            queue: layout.index,
            what,
            addr,
            align,
        };
        if layout.size == 0 || layout.size > ring::MAX_SIZE || !layout.size.is_power_of_two() {
            return Err(bad("size", u64::from(layout.size), 1));
        }
        for (what, addr, align) in [
            ("descriptor table", layout.desc, ring::DESC_ALIGN),
            ("available ring", layout.avail, ring::AVAIL_ALIGN),
            ("used ring", layout.used, ring::USED_ALIGN),
        ] {
            if addr % align != 0 {
                return Err(bad(what, addr, align));
            }
        }
        Ok(Self {
            layout,
            next_avail: 0,
            next_used: 0,
            avail_seen: 0,
            stopped: false,
            last_popped: None,
            generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Moves the queue's position to `base`: the next chain taken is
    /// available entry `base` and the next used entry filled is `base`
    /// (a vhost-user `SET_VRING_BASE`: the ring resumes where it stopped,
    /// everything taken before completed).
    pub fn set_base(&mut self, base: u16) {
        self.next_avail = base;
        self.next_used = base;
        self.avail_seen = base;
        self.last_popped = None;
    }

    /// The next available entry the device will take (what a vhost-user
    /// `GET_VRING_BASE` answers).
    pub fn next_avail(&self) -> u16 {
        self.next_avail
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

    /// The driver's available index now, read with `order`.
    fn read_avail_idx<M: RingMemory + ?Sized>(
        &self,
        mem: &M,
        order: Ordering,
    ) -> Result<u16, DeviceError> {
        let at = self.at("available ring", self.layout.avail, 2, 2)?;
        mem.load_u16(at, order)
            .map_err(|e| fault::<M>(self.layout.index, "available ring", at, Access::Read, e))
    }

    /// The driver's available index now (Acquire), checked to be at most
    /// the queue's size ahead of the device's position
    /// ([`DeviceError::AvailIndexTooFar`] otherwise). Does not move the
    /// position.
    pub fn avail_idx<M: RingMemory + ?Sized>(&self, mem: &M) -> Result<u16, DeviceError> {
        let idx = self.read_avail_idx(mem, Ordering::Acquire)?;
        let (next, size) = (self.next_avail, self.layout.size);
        if idx.wrapping_sub(next) > size {
            return Err(DeviceError::AvailIndexTooFar {
                queue: self.layout.index,
                avail: idx,
                next,
                size,
            });
        }
        Ok(idx)
    }

    /// The head in available entry `idx` (mod the size), without taking
    /// it: a device looking at chains ahead of the one it serves. Call
    /// only for entries [`avail_idx`](Self::avail_idx) showed published.
    pub fn head_at<M: RingMemory + ?Sized>(&self, mem: &M, idx: u16) -> Result<u16, DeviceError> {
        // Inside the ring: `idx % size < size`.
        let addr = self.at(
            "available ring",
            self.layout.avail,
            ring::AVAIL_HEADER + 2 * u64::from(idx % self.layout.size),
            2,
        )?;
        // Relaxed: ordered after the Acquire load of the index that
        // showed the entry published.
        mem.load_u16(addr, Ordering::Relaxed)
            .map_err(|e| fault::<M>(self.layout.index, "available ring", addr, Access::Read, e))
    }

    /// The next chain head the driver made available, if any (§2.7.13.3).
    /// Reads the available index only when the entries it last saw are
    /// used up. A head past the descriptor table is
    /// [`DeviceError::DescriptorIndexOutOfRange`], the entry left untaken.
    pub fn pop<M: RingMemory + ?Sized>(&mut self, mem: &M) -> Result<Option<u16>, DeviceError> {
        if self.stopped {
            return Ok(None);
        }
        let next = self.next_avail;
        if next == self.avail_seen {
            let idx = self.avail_idx(mem)?;
            self.avail_seen = idx;
            if idx == next {
                return Ok(None);
            }
        }
        let head = self.head_at(mem, next)?;
        // A head past the descriptor table is the driver's error, and no
        // used entry can return it (`add_used` refuses it): the entry is
        // not taken, so the ring stays on it.
        if head >= self.layout.size {
            return Err(DeviceError::DescriptorIndexOutOfRange {
                queue: self.layout.index,
                index: head,
                size: self.layout.size,
            });
        }
        self.next_avail = next.wrapping_add(1);
        self.last_popped = Some(next);
        Ok(Some(head))
    }

    /// Gives back the chain the last [`pop`](Self::pop) returned, unused
    /// and untouched (a frame the device dropped, a request whose access
    /// was aborted): the next `pop` returns it again. Refused
    /// ([`DeviceError::UnpopWithoutPop`], nothing moved) unless a `pop`
    /// returned a head since the last `unpop`, [`add_used`](Self::add_used)
    /// or [`set_base`](Self::set_base): a chain given back twice, or after
    /// a completion, would be served and completed twice.
    pub fn unpop(&mut self) -> Result<(), DeviceError> {
        let prev = self.next_avail.wrapping_sub(1);
        if self.last_popped != Some(prev) {
            return Err(DeviceError::UnpopWithoutPop {
                queue: self.layout.index,
                next_avail: self.next_avail,
            });
        }
        self.next_avail = prev;
        self.last_popped = None;
        Ok(())
    }

    /// Walks the chain from `head` into `out` (cleared first), checking
    /// every index, the length (at most the queue size: §2.7.5.2, so a loop
    /// is caught), and the direction each descriptor must have. An
    /// indirect descriptor is refused
    /// ([`DeviceError::IndirectNotNegotiated`]): indirect tables are not
    /// implemented, so the feature is never negotiated
    /// ([`DeviceQueue::new`] refuses it). Returns the chain's total bytes.
    pub fn walk<M: RingMemory + ?Sized>(
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
            mem.read_ring(at, &mut raw)
                .map_err(|e| fault::<M>(q, "descriptor", at, Access::Read, e))?;
            let addr = u64::from_le_bytes([
                raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
            ]);
            let len = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
            let flags = u16::from_le_bytes([raw[12], raw[13]]);
            let next = u16::from_le_bytes([raw[14], raw[15]]);
            if flags & desc::F_INDIRECT != 0 {
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
    /// (§2.7.8): the element, then the used index published with Release.
    /// A head past the table is [`DeviceError::DescriptorIndexOutOfRange`].
    /// On any error the used position is unchanged (the entry may be
    /// tried again).
    pub fn add_used<M: RingMemory + ?Sized>(
        &mut self,
        mem: &M,
        head: u16,
        len: u32,
    ) -> Result<(), DeviceError> {
        let (q, size) = (self.layout.index, self.layout.size);
        if head >= size {
            return Err(DeviceError::DescriptorIndexOutOfRange {
                queue: q,
                index: head,
                size,
            });
        }
        // Inside the ring: `next_used % size < size`.
        let at = self.at(
            "used ring",
            self.layout.used,
            ring::USED_HEADER + ring::USED_ELEM * u64::from(self.next_used % size),
            ring::USED_ELEM,
        )?;
        let mut elem = [0u8; ring::USED_ELEM as usize];
        elem[0..4].copy_from_slice(&u32::from(head).to_le_bytes());
        elem[4..8].copy_from_slice(&len.to_le_bytes());
        mem.write_ring(at, &elem)
            .map_err(|e| fault::<M>(q, "used ring", at, Access::Write, e))?;
        let next = self.next_used.wrapping_add(1);
        let idx_at = self.at("used ring", self.layout.used, 2, 2)?;
        mem.store_u16(idx_at, next, Ordering::Release)
            .map_err(|e| fault::<M>(q, "used ring", idx_at, Access::Write, e))?;
        // Moved only once the index is published: a failed call leaves the
        // position where it was, so trying the same entry again fills the
        // same slot and the device's count never runs ahead of the ring's.
        self.next_used = next;
        self.last_popped = None;
        Ok(())
    }

    /// The next used entry the device will fill: the used index it last
    /// published.
    pub fn next_used(&self) -> u16 {
        self.next_used
    }

    /// Whether the driver wants an interrupt for what was just used: the
    /// available ring's `VIRTQ_AVAIL_F_NO_INTERRUPT` is clear (§2.7.7.2).
    /// The full fence orders the used-index store before this load,
    /// pairing with the driver's fence between re-enabling interrupts and
    /// re-reading the used index.
    pub fn interrupt_wanted<M: RingMemory + ?Sized>(
        &mut self,
        mem: &M,
    ) -> Result<bool, DeviceError> {
        fence(Ordering::SeqCst);
        let at = self.layout.avail;
        let flags = mem
            .load_u16(at, Ordering::Relaxed)
            .map_err(|e| fault::<M>(self.layout.index, "available ring", at, Access::Read, e))?;
        Ok(flags & ring::AVAIL_F_NO_INTERRUPT == 0)
    }

    /// Writes the used ring's flags (`VIRTQ_USED_F_NO_NOTIFY` or none).
    fn set_used_flags<M: RingMemory + ?Sized>(
        &self,
        mem: &M,
        flags: u16,
    ) -> Result<(), DeviceError> {
        let used = self.layout.used;
        mem.store_u16(used, flags, Ordering::Relaxed)
            .map_err(|e| fault::<M>(self.layout.index, "used ring", used, Access::Write, e))
    }

    /// Asks the driver to notify again (clears `VIRTQ_USED_F_NO_NOTIFY`,
    /// §2.7.10) and reports whether chains arrived meanwhile (then the
    /// device should go on instead of sleeping). The full fence orders the
    /// flag's store before the index's load, so a chain the driver
    /// published without notifying is seen here.
    pub fn enable_notification<M: RingMemory + ?Sized>(
        &mut self,
        mem: &M,
    ) -> Result<bool, DeviceError> {
        if self.stopped {
            return Ok(false);
        }
        self.set_used_flags(mem, 0)?;
        fence(Ordering::SeqCst);
        Ok(self.read_avail_idx(mem, Ordering::Relaxed)? != self.next_avail)
    }

    /// Asks the driver not to notify (sets `VIRTQ_USED_F_NO_NOTIFY`): the
    /// device is polling.
    pub fn disable_notification<M: RingMemory + ?Sized>(
        &mut self,
        mem: &M,
    ) -> Result<(), DeviceError> {
        if self.stopped {
            return Ok(());
        }
        self.set_used_flags(mem, ring::USED_F_NO_NOTIFY)
    }

    /// Whether the available ring is known to hold chains the device has
    /// not popped (without reading memory).
    pub fn known_pending(&self) -> bool {
        !self.stopped && self.next_avail != self.avail_seen
    }
}

#[cfg(test)]
mod tests {
    //! The queue's own refusals: ring features it does not implement, an
    //! indirect descriptor, a give-back without a take, and a used entry
    //! whose publication failed leaving the position where it was.

    use std::cell::Cell;
    use std::sync::atomic::Ordering;

    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::*;

    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    const NUM: u16 = 8;

    fn layout() -> QueueLayout {
        QueueLayout {
            index: 2,
            size: NUM,
            desc: DESC,
            avail: AVAIL,
            used: USED,
        }
    }

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    fn put_desc(m: &GuestMemoryMmap, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..16].copy_from_slice(&next.to_le_bytes());
        m.write_slice(&b, GuestAddress(DESC + 16 * u64::from(i)))
            .unwrap();
    }

    /// Publishes `head` in avail entry `slot` and the avail index `idx`.
    fn offer(m: &GuestMemoryMmap, slot: u16, head: u16, idx: u16) {
        m.write_obj(
            head.to_le(),
            GuestAddress(AVAIL + 4 + 2 * u64::from(slot % NUM)),
        )
        .unwrap();
        m.write_obj(idx.to_le(), GuestAddress(AVAIL + 2)).unwrap();
    }

    #[test]
    fn ring_features_not_implemented_are_refused_when_the_queue_is_made() {
        for bit in [feature::RING_INDIRECT_DESC, feature::RING_EVENT_IDX] {
            let f = 1u64 << feature::VERSION_1 | 1 << bit;
            let e = DeviceQueue::new(layout(), f).unwrap_err();
            assert!(
                matches!(e, DeviceError::RingFeatureUnsupported { queue: 2, features }
                    if features == 1 << bit),
                "{e:?}"
            );
        }
        assert!(DeviceQueue::new(layout(), 1 << feature::VERSION_1).is_ok());
    }

    #[test]
    fn an_indirect_descriptor_is_refused_by_the_walk() {
        let m = memory();
        let q = DeviceQueue::new(layout(), 0).unwrap();
        put_desc(&m, 1, 0x8000, 16, desc::F_NEXT, 3);
        put_desc(&m, 3, 0x9000, 32, desc::F_INDIRECT, 0);
        let mut out = Vec::new();
        let e = q.walk(&m, 1, ChainDir::Readable, &mut out).unwrap_err();
        assert!(
            matches!(e, DeviceError::IndirectNotNegotiated { queue: 2, index: 3 }),
            "{e:?}"
        );
    }

    #[test]
    fn unpop_is_refused_without_a_pop_after_a_completion_and_twice() {
        let m = memory();
        let mut q = DeviceQueue::new(layout(), 0).unwrap();
        q.set_base(5);
        // Nothing taken yet.
        let e = q.unpop().unwrap_err();
        assert!(matches!(
            e,
            DeviceError::UnpopWithoutPop {
                queue: 2,
                next_avail: 5
            }
        ));
        assert_eq!(q.next_avail(), 5);
        offer(&m, 5, 0, 6);
        offer(&m, 6, 1, 7);
        assert_eq!(q.pop(&m).unwrap(), Some(0));
        // Given back once, then refused.
        q.unpop().unwrap();
        assert_eq!(q.next_avail(), 5);
        assert!(matches!(
            q.unpop().unwrap_err(),
            DeviceError::UnpopWithoutPop { next_avail: 5, .. }
        ));
        assert_eq!(q.next_avail(), 5);
        // Taken again and completed: it cannot be given back.
        assert_eq!(q.pop(&m).unwrap(), Some(0));
        q.add_used(&m, 0, 0).unwrap();
        assert!(matches!(
            q.unpop().unwrap_err(),
            DeviceError::UnpopWithoutPop { next_avail: 6, .. }
        ));
        assert_eq!(q.next_avail(), 6);
        assert_eq!(q.pop(&m).unwrap(), Some(1));
        assert_eq!(q.pop(&m).unwrap(), None);
    }

    /// Memory whose used-index store fails while `fail_index` is set.
    struct IndexStoreFails<'a> {
        m: &'a GuestMemoryMmap,
        fail_index: Cell<bool>,
    }

    impl RingMemory for IndexStoreFails<'_> {
        type Fault = vm_memory::GuestMemoryError;
        fn read_ring(&self, addr: u64, buf: &mut [u8]) -> Result<(), Self::Fault> {
            self.m.read_ring(addr, buf)
        }
        fn write_ring(&self, addr: u64, buf: &[u8]) -> Result<(), Self::Fault> {
            self.m.write_ring(addr, buf)
        }
        fn load_u16(&self, addr: u64, order: Ordering) -> Result<u16, Self::Fault> {
            self.m.load_u16(addr, order)
        }
        fn store_u16(&self, addr: u64, v: u16, order: Ordering) -> Result<(), Self::Fault> {
            if addr == USED + 2 && self.fail_index.get() {
                return Err(vm_memory::GuestMemoryError::InvalidGuestAddress(
                    GuestAddress(addr),
                ));
            }
            self.m.store_u16(addr, v, order)
        }
    }

    #[test]
    fn a_used_index_store_that_fails_leaves_the_used_position_for_a_retry() {
        let m = memory();
        let mem = IndexStoreFails {
            m: &m,
            fail_index: Cell::new(true),
        };
        let mut q = DeviceQueue::new(layout(), 0).unwrap();
        offer(&m, 0, 3, 1);
        assert_eq!(q.pop(&mem).unwrap(), Some(3));
        let e = q.add_used(&mem, 3, 7).unwrap_err();
        assert!(
            matches!(e, DeviceError::DmaFault { queue: 2, what: "used ring", iova, .. } if iova == USED + 2),
            "{e:?}"
        );
        assert_eq!(q.next_used(), 0);
        // Tried again: the same slot, and the index published once.
        mem.fail_index.set(false);
        q.add_used(&mem, 3, 7).unwrap();
        assert_eq!(q.next_used(), 1);
        let idx: u16 = m.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(u16::from_le(idx), 1);
        let elem: [u8; 8] = m.read_obj(GuestAddress(USED + 4)).unwrap();
        assert_eq!(elem, [3, 0, 0, 0, 7, 0, 0, 0]);
    }
}
