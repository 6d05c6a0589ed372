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
//! - [`access`]: the device side: DMA reads, writes and typed loads and
//!   stores at IOVAs, ordered by `DmaAttrs` with the lightest correct fence,
//!   zero-copy mappings, and vm-memory's `Iommu` trait for `IommuMemory`.
//!
//! See `docs/ARCHITECTURE.md` in the repository for the whole map.
//!
//! # A driver maps a buffer, a device reads it, the unmap revokes it
//!
//! ```
//! use std::sync::Arc;
//! use softiommu::access::{DmaAccessor, DmaAttrs};
//! use softiommu::dma::{DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy};
//! use softiommu::hw::{SourceId, System, UnitConfig};
//! use softiommu::mem::PhysMemory;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Physical memory and one IOMMU unit with a NIC (PCI 01:00.0) behind it.
//! let mem = Arc::new(PhysMemory::new(64 << 20)?);
//! let mut sys = System::new(mem.clone());
//! let unit = sys.add_unit(UnitConfig::default())?;
//! let nic = SourceId::new(1, 0, 0).expect("a valid BDF");
//! sys.assign(nic, unit)?;
//! let sys = Arc::new(sys);
//!
//! // The driver side: a domain with the deferred (batched) policy.
//! let domain = DmaDomain::new(sys.clone(), DmaDomainConfig { policy: DmaPolicy::Deferred, ..Default::default() })?;
//! let dev = domain.attach(nic, u64::MAX, false)?;
//! let mut cpu = domain.cpu(); // one per driver thread
//! let buf = mem.alloc_zeroed_frames(0)?;
//! mem.write(buf, &42u32.to_le_bytes())?;
//! let iova = cpu.map(&dev, buf, 4, DmaDirection::ToDevice)?;
//!
//! // The device side (an emulated NIC's thread): ordered DMA through the unit.
//! let mut nic_dma = DmaAccessor::for_device(&dev)?;
//! assert_eq!(nic_dma.read_u32(iova, DmaAttrs::ORDERED)?, 42);
//! assert!(nic_dma.write(iova, &[1], DmaAttrs::ORDERED).is_err(), "mapped read-only: a fault");
//!
//! // Unmap; once this CPU's queue is flushed the device can no longer reach it.
//! cpu.unmap(&dev, iova, 4, DmaDirection::ToDevice)?;
//! cpu.flush_own()?;
//! assert!(nic_dma.read_u32(iova, DmaAttrs::ORDERED).is_err());
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod access;
pub mod dma;
pub mod hw;
pub mod iova;
pub mod mem;
pub mod pgtable;
pub(crate) mod sync;
