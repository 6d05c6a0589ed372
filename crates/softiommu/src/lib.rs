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

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod access;
pub mod dma;
pub mod hw;
pub mod iova;
pub mod mem;
pub mod pgtable;
