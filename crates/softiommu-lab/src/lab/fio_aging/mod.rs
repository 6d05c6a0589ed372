//! `softiommu lab fio-aging`: seed `004`'s run on the storage path.
//!
//! Twelve fio-like jobs (`softiommu_virtio::workload::fio`) drive a
//! virtio-blk device through the IOMMU: each request is one `map_sg` over
//! its segments, the device reads its header, moves its data and writes
//! its status through the unit, and the completion is one `unmap_sg`.
//! Two parts:
//!
//! 1. **Cost per DMA policy** (pass-through, strict, deferred): the seed's
//!    twelve jobs of 4 KiB random reads; IOPS, GB/s and the driver side's
//!    CPU per request (thread CPU clocks of the job threads: submission,
//!    `map_sg`, completion, `unmap_sg`; and of the DMA domain's flush
//!    timer, whose share stands beside), the device threads' apart (they
//!    stand for hardware).
//! 2. **Aging per IOVA allocator design** (ours and the Linux 2016 / 2020 /
//!    2023 baselines) in deferred mode, with the two conditions that age
//!    the caches in the seed: completions on fewer interrupt CPUs than jobs
//!    (IOVAs allocated on one CPU, freed on another) and a slow tail (a
//!    share of requests held by the device for seconds, each pinning its
//!    IOVA while many others come and go). The time line is fio's status
//!    line; the figure is `workload::aging`'s (warm-up discarded, medians
//!    of the first and last quarter, 5th percentile over median), taken
//!    on the driver side's requests per CPU-second (`retained`,
//!    `stability`) and, beside it, on wall-clock IOPS (`retained_wall`,
//!    `stability_wall`).
//!
//! # Which CPU ages
//!
//! The allocator runs on the driver side: the job threads' submissions
//! (`map_sg`) and completions (on the interrupt CPUs: `unmap_sg` and the
//! flush queue's frees into the caches, where the Linux trees walk), the
//! DMA domain's flush timer (frees of queues that aged out), and the
//! allocator's background work the conductor runs every 100 ms. The
//! figure's CPU time per window is the window's requests × the job
//! threads' CPU per request, measured on their own calls (every
//! submitting or reaping call timed on the thread's CPU clock,
//! `softiommu_virtio::workload::fio`'s `sample` module), plus the flush
//! timer's CPU clock and the background work's (timed on the conductor's
//! own clock). What the job threads spend between those calls — polls of
//! queues that had nothing, arming interrupts, sleeping and waking,
//! doorbells that wake a device thread — is left out: how much of it
//! comes per request follows the device threads' pace, which a co-runner
//! sets, not the allocator's state. The device threads stand for
//! hardware and are not counted.
//!
//! Everything is real work of this process; the unit's hardware latencies
//! are the zero model (nothing is modelled in this lab's figures).
//!
//! The lab in four parts, one job each: `args` (the options, and the
//! configuration of the engine they give), `out` (the JSON object),
//! `run` (the measurement) and `render` (the one typed `Report`).

mod args;
mod out;
mod render;
mod run;
#[cfg(test)]
mod tests;

pub use args::FioAgingArgs;
pub use run::run;
