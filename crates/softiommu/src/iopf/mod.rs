//! I/O page faults: devices fault and the host maps on demand (seed `002`).
//!
//! # The model
//!
//! Instead of pinning and mapping all of a guest's memory before a device
//! may touch it, an [`IopfDomain`] starts with an empty page table and a
//! memory map of [`Region`]s (IOVA → physical backing, rights). Its
//! devices are fault-capable (PCIe PRI): a miss raises a page request in
//! the unit's page request queue (see `hw`) and the device waits. An
//! [`IopfHandler`] drains the queue, maps the page and the pre-map window
//! after it ([`IopfConfig::premap_pages`], the seed's `PREMAP_LEN`), and
//! answers `Success`, or `Invalid` for a request outside the map; it
//! measures how long each request waited. The memory is not pinned:
//! [`IopfDomain::reclaim`] (an MMU notifier's invalidation) takes pages
//! back — unmap, invalidate, wait at most [`IopfConfig::fence_timeout`] —
//! and the device's next access faults and is served again, the data
//! intact. A device still inside a translation section after the timeout
//! is fenced, not waited for ([`IopfError::SectionsFenced`]).
//!
//! Trust: a request's requester id is stamped by the unit, and each unit
//! routes requests to the domain that owns their requester, so a handler
//! serves only its own domain's devices and a device can answer, fail or
//! cancel only its own page request groups (see `hw`'s `prq`).
//!
//! Promotion ([`IopfConfig::promote`], on by default): a fault that leaves
//! a 2 MiB-aligned 2 MiB block wholly mapped with 4 KiB leaves, inside one
//! region and 2 MiB-aligned in physical memory, collapses the block into
//! one 2 MiB leaf (no translation changes; the old table page is freed
//! after the units' invalidation and wait), so a device that faulted its
//! memory in page by page needs as few IOTLB entries as a pinned one.
//! A partial reclaim splits the leaf again.
//!
//! Bounds: a device waits for an answer at most the unit's
//! `page_response_timeout` (a handler that died is detected, its groups
//! answered `Invalid` and counted); a full queue answers at once; one
//! access raises at most [`PAGE_REQUEST_ROUNDS`](crate::access::PAGE_REQUEST_ROUNDS)
//! requests.

mod domain;
mod error;
mod groups;
mod handler;
mod histogram;

pub use domain::{
    IopfConfig, IopfDomain, IopfStats, Region, DEFAULT_FENCE_TIMEOUT, MAX_FENCE_TIMEOUT,
    MAX_PREMAP_PAGES, MAX_REGION_BYTES,
};
pub use error::IopfError;
pub use groups::MAX_HELD_PER_DEVICE;
pub use handler::{
    HandlerStats, IopfHandler, DEFAULT_SPIN_POLLS, MAX_HANDLER_THREADS, MAX_SPIN_POLLS,
};
pub use histogram::{LatencyHistogram, LatencySummary};
