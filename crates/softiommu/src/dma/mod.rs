//! The driver-side DMA API: domains, map/unmap of buffers and scatter
//! lists, coherent allocations, and the invalidation policies.
//!
//! A [`DmaDomain`] owns an IOVA space ([`crate::iova`]) and a VT-d page
//! table ([`crate::pgtable`]) and spans the IOMMU units ([`crate::hw`]) its
//! devices sit behind. Devices are attached with a DMA mask; each thread
//! maps and unmaps through its own [`DmaCpu`].
//!
//! Policies ([`DmaPolicy`]), switchable at run time:
//! - `Passthrough`: DMA address = physical address; no protection.
//! - `Strict`: an unmap clears the PTEs, invalidates, waits, then frees the
//!   IOVA and the table pages.
//! - `Deferred`: an unmap clears the PTEs and queues the IOVA on this CPU's
//!   flush queue (an array); at the high-water mark or the timeout, one
//!   invalidation per unit the domain spans and one wait free the whole batch. The
//!   time an unmapped buffer stays reachable is measured
//!   ([`DmaDomain::stale_window`]).
//! - `Bounce`: data is copied through a pool that stays mapped.
//!
//! Whatever the policy, an IOVA is freed (and so can be handed out again)
//! only after the invalidation that covers it has completed.

mod bounce;
mod bounce_alloc;
mod cover;
mod cpu;
mod device;
mod domain;
mod error;
mod flush_queue;
mod gate;
mod inflight;
mod mapper;
mod owner;
mod passthrough;
mod policy;
mod slot;
mod stale;
mod stats;
mod timer;
mod units;

#[cfg(all(test, not(loom)))]
mod round_alloc_tests;
#[cfg(all(test, not(loom)))]
mod tests;

pub use bounce::BOUNCE_UNIT;
pub use cpu::{DmaCpu, SgEntry, SgMapping};
pub use device::DmaDevice;
pub use domain::{
    DmaDomain, DmaDomainConfig, MAX_BOUNCE_BYTES, MAX_FQ_SIZE, MAX_TIMEOUT, MIN_LOW_WINDOW_BYTES,
    MIN_TIMEOUT,
};
pub use error::DmaError;
pub use mapper::{BoundDma, BoundMapping, DmaMapper};
pub use policy::{
    DmaDirection, DmaPolicy, Tunables, DEFAULT_FQ_SIZE, DEFAULT_HIGH_WATER, DEFAULT_TIMEOUT,
};
pub use stale::StaleReport;
pub use stats::DmaStats;
