//! The driver-side DMA API: domains, map/unmap, and the invalidation
//! policies (pass-through, strict, deferred, bounce).
//!
//! Built so far: the deferred policy's per-CPU flush queue and its timer
//! protocol ([`FlushQueue`], [`TimerArm`]).

mod flush_queue;
mod sync;

pub use flush_queue::{Batch, FlushQueue, FqEntry, Pushed, TimerArm};
