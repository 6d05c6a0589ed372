//! A virtio-iommu device (virtio 1.2 §5.13, device id 23) on this crate's
//! virtio-mmio transport, backed by a softiommu unit.
//!
//! # The model
//!
//! The device manages a set of endpoints (PCI requester ids in the unit's
//! scope; endpoint id = requester id). Each virtio-iommu domain is one of
//! the unit's domain ids with its own VT-d table, built and changed with
//! the crate's page-table code, beside a record of what each MAP created
//! — the unit UNMAP removes. An attached endpoint's context points at its
//! domain's table; an unattached one has none (its DMA faults) or, with
//! `bypass`, is pass-through. The unit's IOTLB, invalidation queue and
//! fault log are the real thing: an UNMAP's used entry is written only
//! after the unit's invalidation for it has completed, the UNMAPs of one
//! round (one notification's worth, at most `batch` requests) share one
//! invalidation per domain and one wait, and the faults the unit records
//! for managed endpoints reach the driver on the event queue.
//!
//! The device's own rings and request buffers are in guest RAM and
//! reached directly (a virtio-iommu is not behind an IOMMU): through
//! [`PhysGuestMemory`](softiommu::access::PhysGuestMemory), which refuses
//! the unit's reserve, so no request can read or write a page table.
//!
//! # Requests
//!
//! Every rule of §5.13.6 that sets a status is checked before anything
//! changes, so a refused request leaves the mappings, tables and
//! contexts as they were. A chain with no room for the tail, or of an
//! unknown type, is returned with used length 0 and nothing written; a
//! request shorter than its type's layout is `INVAL`. A malformed chain
//! (a bad index, a loop, a write-only descriptor before a read-only one)
//! is the transport's [`DeviceError`](crate::transport::DeviceError) and
//! stops the queue until reset.

mod chain;
mod config;
mod device;
mod dma;
mod domain;
mod driver;
mod events;
mod mapper;
mod ops;
mod pending;
mod probe;
mod request;
mod serve;
mod state;
mod stats;
mod status;

pub use config::{
    ViommuConfig, ViommuError, GRANULE, INPUT_END, MAX_PROBE_SIZE, PAGE_SIZE_MASK, RESV_MEM_PROP,
};
pub use device::ViommuDevice;
pub use dma::{resv_regions, ViommuDma, ViommuDmaError, ViommuDmaStats, ViommuMapping, ViommuMode};
pub use domain::MappingRecord;
pub use driver::{
    Completion, FaultEvent, RawDesc, ViommuDriver, ViommuDriverConfig, ViommuDriverError,
    ViommuGeometry,
};
pub use events::fault_bytes;
pub use ops::encode;
pub use stats::ViommuStats;
pub use status::Status;
