//! A fio-like storage load over the virtio-blk path (seed `004`'s twelve
//! jobs of random reads): `jobs` jobs, each on its own request queue,
//! `iodepth` I/Os in flight each, `rw` randread / randwrite / randrw, one
//! block size or a mix (`4k:60,16k:20,64k:15,128k:5`), for `runtime`,
//! with the time line reported per window as fio's status line does. Reads
//! on the `null` back-end are checked against its sector pattern on a
//! sample; an I/O the device fails (a back-end error) is counted for its
//! job and the run goes on.
//!
//! Costs: the job threads' CPU (driver side: submission, `map_sg`,
//! completion, `unmap_sg`) with the DMA domain's flush timer's, and the
//! device threads' CPU apart, are read from thread CPU clocks over the
//! measured run, per I/O; with [`FioConfig::sample_work`] the time line
//! also carries the driver's CPU per request measured on samples of its
//! own calls (the aging figure's input, see `sample.rs`). Every figure is real
//! work of this process; the only modelled cost is whatever
//! [`LatencyModel`](softiommu::hw::LatencyModel) the host was built with.
//!
//! # Aging the IOVA caches in minutes
//!
//! Two knobs reproduce seed `004`'s conditions on this path (the
//! allocator-only `lab iova-aging` uses the same two): `irq_cpus` fewer
//! than jobs, so IOVAs are allocated on the job's CPU and freed (the
//! deferred flush frees into the cache of the CPU that unmapped) on an
//! interrupt CPU, and a slow tail ([`SlowTail`]: a share of I/Os held by
//! the device for seconds, each pinning its IOVA while millions of others
//! come and go).

mod config;
mod engine;
mod fresh;
mod result;
mod sample;

pub use config::{
    BlockSizes, FioConfig, FioError, RwMode, SlowTail, MAX_IODEPTH, MAX_JOBS, MAX_RATE_IOPS,
    MAX_RUNTIME, MAX_SLOTS, MAX_SLOW_DEPTH, MAX_SLOW_PER_S, MIN_WINDOW,
};
pub use engine::{fio, run_fio, sized_for};
pub use result::{FioJobResult, FioResult, FioWindow};
