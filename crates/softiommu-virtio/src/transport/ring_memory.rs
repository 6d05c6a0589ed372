//! [`RingMemory`]: how the device side of a split virtqueue
//! ([`DeviceQueue`](super::DeviceQueue)) reaches the rings — the one seam
//! between the ring code and where its addresses are translated.
//!
//! Two implementations: every vm-memory [`GuestMemory`] (for the devices
//! behind a softiommu unit, `IommuMemory` over the unit: a refused
//! translation is a fault in the unit's log), and the `softiommu-vhost`
//! crate's front-end IOTLB (its `DmaSpace`, ring addresses translated as
//! `SET_VRING_ADDR` gives them, misses asked of the front-end within a
//! bound). vm-memory's `Iommu` trait cannot carry the second: its
//! translations are read out of vm-memory's own `Iotlb` (a locked range
//! map) and the bytes are copied after the translation returns, so an
//! invalidation acknowledged in between could not be waited for.
//!
//! # Contract
//! - Each call moves all of its bytes or fails with a typed
//!   [`Fault`](RingMemory::Fault); a failed write wrote no byte the
//!   translation refused.
//! - [`load_u16`](RingMemory::load_u16) with `Acquire` orders the reads
//!   after it behind it; [`store_u16`](RingMemory::store_u16) with
//!   `Release` orders every write before it ahead of it (the ring's index
//!   protocol, §2.7.13 and §2.7.14).
//! - [`is_abort`](RingMemory::is_abort) names the faults that are the
//!   device's being stopped (a vhost-user ring stop cancelling a miss),
//!   not the driver's mistake: the queue reports them as
//!   [`DeviceError::DmaAborted`](super::DeviceError::DmaAborted).

use std::fmt::Display;
use std::sync::atomic::Ordering;

use vm_memory::{Bytes, GuestAddress, GuestMemory};

/// Where a device's rings are read and written, by the addresses the
/// driver gave for them.
pub trait RingMemory {
    /// Why an access did not happen.
    type Fault: Display;

    /// Copies `buf.len()` bytes at `addr` into `buf`.
    fn read_ring(&self, addr: u64, buf: &mut [u8]) -> Result<(), Self::Fault>;

    /// Copies `buf` to `addr`.
    fn write_ring(&self, addr: u64, buf: &[u8]) -> Result<(), Self::Fault>;

    /// Loads the le16 at `addr` (2-byte aligned) with `order`.
    fn load_u16(&self, addr: u64, order: Ordering) -> Result<u16, Self::Fault>;

    /// Stores `v` as le16 at `addr` (2-byte aligned) with `order`.
    fn store_u16(&self, addr: u64, v: u16, order: Ordering) -> Result<(), Self::Fault>;

    /// Whether `fault` means the device is being stopped rather than that
    /// the driver's memory was refused.
    fn is_abort(fault: &Self::Fault) -> bool {
        let _ = fault;
        false
    }
}

impl<M: GuestMemory + ?Sized> RingMemory for M {
    type Fault = vm_memory::GuestMemoryError;

    #[inline]
    fn read_ring(&self, addr: u64, buf: &mut [u8]) -> Result<(), Self::Fault> {
        self.read_slice(buf, GuestAddress(addr))
    }

    #[inline]
    fn write_ring(&self, addr: u64, buf: &[u8]) -> Result<(), Self::Fault> {
        self.write_slice(buf, GuestAddress(addr))
    }

    #[inline]
    fn load_u16(&self, addr: u64, order: Ordering) -> Result<u16, Self::Fault> {
        self.load::<u16>(GuestAddress(addr), order)
            .map(u16::from_le)
    }

    #[inline]
    fn store_u16(&self, addr: u64, v: u16, order: Ordering) -> Result<(), Self::Fault> {
        self.store(v.to_le(), GuestAddress(addr), order)
    }
}
