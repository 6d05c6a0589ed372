//! `softiommu lab stress`: a soak with an independent checker.
//!
//! Two DMA domains, each with one device behind one unit. In each domain a
//! CPU thread maps and unmaps sub-page buffers of its slots (one page per
//! slot, tagged word by word; see [`super::check`]) and records each
//! mapping's life in a shadow the library never sees; a device thread,
//! through a raw [`DmaAccessor`], reads what it owns and probes what it
//! does not: just-unmapped IOVAs, the neighbouring bytes of its sub-page
//! buffers, IOVAs near its own, the other domain's IOVAs, and writes
//! through its read-only mappings. Every access that succeeds is judged by
//! the checker: legal, a permitted stale access (deferred only, before the
//! covering flush, younger than the flush timeout), or a violation.
//!
//! One phase per policy, and a last one in which a switcher thread moves
//! both domains between strict, deferred and bounce every few
//! milliseconds. Under pass-through nothing is isolated, so its device
//! thread only reads what it owns (and checks the data).

mod args;
pub mod bound;
pub mod check;
mod device;
pub mod extra;
mod out;
mod render;
mod run;
#[cfg(test)]
mod tests;

pub use args::StressArgs;
pub use run::run;
pub(crate) use run::run_as_load;

use std::time::Duration;

/// Seconds per phase of the quick form.
const QUICK_SECONDS: f64 = 5.0;
/// Bytes of each domain's bounce pool.
const POOL_BYTES: u64 = 1 << 20;
/// The CPU threads call `flush_own` every this many operations.
const FLUSH_EVERY: u64 = 4096;
/// The switcher changes the policy every this long.
const SWITCH_EVERY: Duration = Duration::from_millis(2);
/// The name of the switching phase's row.
const SWITCHING: &str = "switching";
