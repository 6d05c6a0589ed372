//! The shared virtio transport every device of this crate sits behind: the
//! virtio-mmio register block (virtio 1.2 §4.2.2), feature negotiation,
//! the device status state machine, queue setup, and the device side of
//! split virtqueues.
//!
//! # The model
//!
//! A driver (ours, another crate's, or a guest's through a VMM) programs
//! an [`MmioTransport`] with 32-bit `read(offset)` / `write(offset,
//! value)`, exactly as it would the MMIO window of a virtio-mmio device:
//! it negotiates features (the device always offers
//! `VIRTIO_F_VERSION_1` and `VIRTIO_F_ACCESS_PLATFORM` — every ring and
//! buffer address is an IOVA), lays out each queue, sets `DRIVER_OK`, and
//! notifies queues through `QueueNotify`. The device model runs on a
//! thread of its own, like hardware: it takes its [`DeviceEnd`], waits for
//! notifications, and works on its live [`DeviceQueue`]s in bounded
//! batches, reaching memory only through the IOMMU. A device with several
//! queues may run several threads, each registered for its own queues
//! ([`DeviceEnd::register_queues`]); each queue has its own lock, so they
//! never wait for each other.
//!
//! # Bad input
//!
//! A driver's mistake is recorded as a [`DeviceError`] in the transport's
//! [`ErrorLog`]; one that breaks a queue (a malformed chain, a notify
//! before `DRIVER_OK`, a refused queue size, a DMA fault) also sets
//! `DEVICE_NEEDS_RESET` and stops that queue until the driver resets the
//! device by writing 0 to `Status`. Nothing a driver writes makes the
//! device panic, loop without bound, or touch memory outside a live
//! mapping: chains are walked at most queue-size descriptors deep, indices
//! are checked before use, and every access is translated by the unit.

mod device_end;
mod error;
mod mmio;
mod queue;
mod ring_memory;

pub use device_end::DeviceEnd;

use softiommu::access::{PhysGuestMemory, UnitIommu};
use vm_memory::IommuMemory;

/// A device's view of memory: the arena through its IOMMU unit, as
/// vm-memory's `GuestMemory` (a [`RingMemory`] the queues read rings through).
pub type DeviceMemory = IommuMemory<PhysGuestMemory, UnitIommu>;
pub use error::{DeviceError, ErrorLog};
pub use mmio::{DeviceInfo, MmioTransport, QueueGuard, QueueSlot, TransportConfig};
pub use queue::{ChainDesc, ChainDir, DeviceQueue, QueueLayout};
pub use ring_memory::RingMemory;
