//! # softiommu-virtio
//!
//! Emulated virtio devices whose every DMA goes through a softiommu unit,
//! the drivers that drive them on softiommu's DMA API the way Linux's do,
//! and a network stack (smoltcp) above — the real work the lab measures
//! IOMMU policies on.
//!
//! - [`transport`]: the virtio-mmio register block, feature negotiation,
//!   status, queue setup and the device side of split virtqueues (shared
//!   by every device).
//! - [`vring`]: the driver side of a split virtqueue, shared by every
//!   driver of this crate.
//! - [`blk`]: a virtio-blk device with several request queues served by a
//!   bounded set of device threads, `null`, `memory` and `file`
//!   back-ends, its driver on the DMA API (one `map_sg` per request), and
//!   the host that builds both.
//! - [`net`]: a virtio-net device on its own thread, a wire between two of
//!   them, the driver on the DMA API, and smoltcp's `phy::Device` over it.
//! - [`host`]: one host — memory, an IOMMU unit, a DMA domain, a device,
//!   its driver — built in one call, so two can be wired together.
//! - [`iopf_mode`]: IOPF mode, shared by both devices' hosts: the device
//!   is attached fault-capable to an on-demand address space over the
//!   guest's RAM, and its first touch of each page faults.
//! - [`workload`]: the lab's engines (a UDP stream, a TCP stream) returning
//!   plain typed results.
//! - [`viommu`]: a virtio-iommu device (§5.13) backed by a unit.
//! - [`spec`]: the virtio 1.2 constants, each with its section.
//! - [`device_dma`]: where a device's DMA is translated — the trait the
//!   request code is generic over, and its unit implementation.
//! - `device_thread`: one device-thread lifecycle (start with a ready
//!   handshake, a bounded stop, the threads' CPU clocks) for every device.
//! - [`cpu_clock`], [`affinity`]: thread CPU clocks, and pinning threads
//!   to CPUs.

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]

pub use softiommu::affinity;
pub mod blk;
pub use softiommu::cpu_clock;
pub mod device_dma;
pub(crate) mod device_thread;
pub mod dma_side;
mod driver_init;
pub mod host;
mod host_platform;
pub mod iopf_mode;
pub mod net;
pub mod spec;
pub mod transport;
pub mod viommu;
pub mod vring;
pub mod workload;
