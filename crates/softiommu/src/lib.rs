//! # softiommu
//!
//! A software IOMMU stack for virtual machine monitors, device emulators and
//! user-space drivers, after the Linux `drivers/iommu` design:
//!
//! - [`mem`]: a sparse physical-memory arena and its page-frame allocator:
//!   the real bytes that page tables, queues and DMA buffers live in;
//! - [`iova`]: IOVA allocation: an O(log n) size-aligned range allocator with
//!   per-CPU magazine caches and a bounded depot, beside the historical Linux
//!   policies as selectable baselines.
//! - [`pgtable`]: IO page tables (VT-d second-level) as real bytes in `mem`,
//!   an IOTLB gather, and cache flushes for walkers that are not coherent.
//! - [`hw`]: the emulated IOMMU unit: contexts, a page walker over those
//!   bytes, a lock-free IOTLB, an invalidation queue of real VT-d
//!   descriptors with drain semantics, a fault log and a latency model.
//! - [`dma`]: the driver-side DMA API: domains, map/unmap of buffers and
//!   scatter lists, coherent allocations; pass-through, strict, deferred
//!   (batched) and bounce policies, switchable at run time.
//! - [`access`]: the device side: DMA reads, writes and typed loads and
//!   stores at IOVAs, ordered by `DmaAttrs` with the lightest correct fence,
//!   zero-copy mappings, and vm-memory's `Iommu` trait for `IommuMemory`.
//! - [`iopf`]: I/O page faults: devices fault, a handler maps on demand
//!   with a pre-map window, and memory can be reclaimed.
//! - [`Platform`]: one builder for all of it (memory, units, devices, a
//!   domain), and [`Error`], one error type for `?` across the layers.
//! - [`cpu_clock`], [`affinity`]: thread CPU clocks, and pinning threads
//!   to CPUs (the flush timer's own, and the device crate's).
//!
//! See `docs/ARCHITECTURE.md` in the repository for the whole map, and
//! `docs/ERRORS.md` for every error, its cause and the state it leaves.
//!
//! The crate root re-exports the names a user needs, so an example needs
//! one `use softiommu::{…}`.
//!
//! # A driver maps a buffer, a device reads it, the unmap revokes it
//!
//! ```
//! use softiommu::{DmaAccessor, DmaAttrs, DmaDirection, DmaPolicy, Platform, SourceId};
//!
//! # fn main() -> Result<(), softiommu::Error> {
//! // Physical memory, one IOMMU unit, a NIC (PCI 01:00.0) behind it, and a
//! // DMA domain with the deferred (batched) policy.
//! let nic = SourceId::new(1, 0, 0).unwrap_or_default();
//! let p = Platform::builder()
//!     .memory(64 << 20)
//!     .policy(DmaPolicy::Deferred)
//!     .device(nic)
//!     .build()?;
//! let dev = &p.devices[0];
//!
//! // The driver side: one handle per driver thread.
//! let mut cpu = p.domain.cpu();
//! let buf = p.mem.alloc_zeroed_frames(0)?;
//! p.mem.write(buf, &42u32.to_le_bytes())?;
//! let iova = cpu.map(dev, buf, 4, DmaDirection::ToDevice)?;
//!
//! // The device side (an emulated NIC's thread): ordered DMA through the unit.
//! let mut nic_dma = DmaAccessor::for_device(dev)?;
//! assert_eq!(nic_dma.read_u32(iova, DmaAttrs::ORDERED)?, 42);
//! assert!(nic_dma.write(iova, &[1], DmaAttrs::ORDERED).is_err(), "mapped read-only: a fault");
//!
//! // Unmap; once this CPU's queue is flushed the device can no longer reach it.
//! cpu.unmap(dev, iova, 4, DmaDirection::ToDevice)?;
//! cpu.flush_own()?;
//! assert!(nic_dma.read_u32(iova, DmaAttrs::ORDERED).is_err());
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]
// No panics across the API: a broken internal invariant fails
// closed with an error or `None`, never by unwinding through a caller.
// Tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod access;
pub mod affinity;
pub mod cpu_clock;
pub mod dma;
mod error;
pub mod hw;
pub mod iopf;
pub mod iova;
pub mod mem;
pub mod pgtable;
mod platform;
pub(crate) mod sync;

pub use access::{AccessError, DmaAccessor, DmaAttrs, DmaMapping};
#[cfg(feature = "vm-memory")]
pub use access::{PhysGuestMemory, UnitIommu};
pub use dma::{
    DmaCpu, DmaDevice, DmaDirection, DmaDomain, DmaDomainConfig, DmaError, DmaPolicy, DmaStats,
    SgEntry, SgMapping,
};
pub use error::Error;
pub use hw::{
    Access, ContextEntry, FaultReason, FaultRecord, HwError, LatencyModel, QiError, QueueMode,
    SourceId, System, TranslateError, Translator, Unit, UnitConfig, UnitId,
};
pub use iova::{IovaError, IovaPolicy};
pub use mem::{MemError, PhysAddr, PhysMemory, PAGE_SIZE};
pub use pgtable::{Perm, PgtableError};
pub use platform::{DeviceSpec, Platform, PlatformBuilder};
