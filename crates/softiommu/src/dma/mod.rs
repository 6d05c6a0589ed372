//! The driver-side DMA API: domains, map/unmap, and the invalidation
//! policies (pass-through, strict, deferred, bounce).
//!
//! Built so far: the deferred policy's per-CPU flush queue and its timer
//! protocol ([`FlushQueue`], [`TimerArm`]), policies and tunables, per-CPU
//! statistics, the stale-window record and the bounce pool.

mod bounce;
mod flush_queue;
mod policy;
mod stale;
mod stats;
mod sync;

pub use bounce::{BouncePool, BounceSlot, BOUNCE_UNIT};
pub use flush_queue::{Batch, FlushQueue, FqEntry, Pushed, TimerArm};
pub use policy::{
    DmaDirection, DmaPolicy, Tunables, DEFAULT_FQ_SIZE, DEFAULT_HIGH_WATER, DEFAULT_TIMEOUT,
};
pub use stale::{StaleReport, StaleWindow};
pub use stats::{CpuStats, DmaStats};
