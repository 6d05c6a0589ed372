//! `softiommu lab litmus`: the ordering the accessors promise, tested on
//! this CPU. A device thread (typed accesses through a `DmaAccessor`, at
//! IOVAs) and a guest CPU thread (atomics at the physical addresses, with a
//! driver's barriers) run message passing both ways and store buffering
//! in lock step, millions of times per access mode, and the outcomes the
//! guest must never see are counted (see `softiommu::access::litmus`).
//!
//! On x86, `relaxed` store buffering is expected to show forbidden
//! outcomes (a store waits in the store buffer while the next load runs)
//! and `ordered` none: that is the one fence the ordered mode pays for.
//! Every figure is measured.

mod args;
pub mod harness;
mod out;
mod render;
mod run;

pub use args::LitmusArgs;
pub use run::run;

/// Iterations per test and mode in the quick form.
const QUICK_RUNS: u64 = 1_000_000;
/// The most seconds per test and mode in the quick form.
const QUICK_MAX_SECONDS: u64 = 10;
