//! `softiommu lab iova-aging`: seed `004`'s experiment.
//!
//! Twelve jobs do storage-like I/O in deferred mode: each I/O allocates an
//! IOVA of a mixed size, keeps it while `--iodepth` later I/Os are issued,
//! then completes. Completions are handled by interrupt CPUs (`--irq-cpus`,
//! as a controller with fewer vectors than CPUs has): each puts the IOVA in
//! its flush queue (an array of 256, as Linux's) and frees the whole batch
//! into its own per-CPU cache when the queue is full or its oldest entry is
//! 10 ms old. So IOVAs are allocated on some CPUs and freed on others: the
//! caches and the depot fill, and the policies differ in what happens next.
//!
//! The jobs and interrupt CPUs are *logical* CPUs, each with its own
//! per-CPU cache, run in slices of 32 I/Os on `--threads` OS threads (one
//! by default), each thread hosting a share of the jobs and of the
//! interrupt CPUs that serve them. Sixteen OS threads on two cores would
//! spend their time in the scheduler; this way the time goes to the
//! allocator. One thread by default because the figure is about aging,
//! and two threads' throughput moves in phases the allocator does not
//! make: measured on the 2-vCPU machine this was built on, two threads
//! ran 62-82 M ops/s in phases of seconds (how much the shared lines
//! bounce between the cores), and two runs of one build disagreed by up
//! to 0.19 on `retained`; one thread ran flat at 42-43 M ops/s (three
//! runs: 1.011, 0.988, 0.992). `--threads 2` shares the allocator (tree,
//! depots, state map) between cores for real.
//!
//! # Aging on CPU time
//!
//! `retained` and `stability` are taken on I/Os per CPU-second of the
//! worker threads (each one's CPU clock, `pthread_getcpuclockid`, read by
//! the conductor at every window's end and summed, plus the CPU the
//! conductor spends in the allocator's background work, timed on its own
//! clock around each call): the allocator's work, so a co-runner taking
//! the core for part of a window lowers the I/Os and the CPU time alike.
//! A Linux tree's cliff is CPU work (walks of a grown tree), so it still
//! shows. The wall-clock figures stand beside them (`retained_wall`,
//! `stability_wall`); see `softiommu_virtio::workload::aging` for the
//! CPU floor below which a window is merged with its neighbours.
//!
//! The windows themselves are CPU time: a window ends when the worker
//! threads have spent `seconds / windows` of CPU each in the two arms'
//! slices (at the latest after four times that in wall time), so a run
//! does the same work on a busy machine as on a quiet one, and the slow
//! I/Os held for a count of I/Os come back at the same point of it.

mod args;
mod out;
mod render;
mod run;
#[cfg(test)]
mod tests;

pub use args::AgingArgs;
pub use run::run;

use std::time::Duration;

/// Flush-queue high-water mark: Linux's `IOVA_FQ_SIZE` is 256 (seed `000`
/// used 250).
const FQ_SIZE: usize = 256;
/// Flush-queue timeout: Linux's `IOVA_FQ_TIMEOUT`, 10 ms (seed `000`).
const FQ_TIMEOUT: Duration = Duration::from_millis(10);
