//! `softiommu lab iopf`: seed `002`'s experiment. An accelerator-like
//! device processes messages of `msg_len` bytes that the CPU wrote, `times`
//! sends over the same buffer, either with the buffer pinned and mapped
//! before the device runs (without IOPF) or left unmapped so that the
//! device's first touch of each page faults and the page request handler
//! maps it on demand with a pre-map window of `premap_pages` (with IOPF).
//!
//! Every send is real work by our code: the device reads the whole message
//! through the unit's translation (IOTLB, page walks, and with IOPF the page
//! requests, the handler's mapping and the group responses) into a
//! device-local buffer of [`CHUNK`] bytes and folds it into a checksum,
//! which must equal the CPU's (the data arrived intact). Nothing is
//! modelled: the unit's latency model is zero and the handler's time is
//! what its thread takes.
//!
//! The configurations run side by side: each has its own device on its
//! own unit over the same backing (the pinned one, and one per pre-map
//! window), and a run sends on each device in turn, `times` rounds, timing
//! every send; a burst of load from elsewhere on a shared machine falls on
//! all of them alike. A run is repeated `repeats` times on fresh address
//! spaces and each configuration's fastest run is kept.
//!
//! A configuration's time is the sum of its sends' times, with one robust
//! step: the sends during which its device raised no page request do
//! exactly the same work in every configuration, and on a machine shared
//! with other processes their wall times carry whatever preemption
//! happened to land on them; they count as their median each. The sends
//! that faulted (the first, and any later one that did) count as measured.
//!
//! # On CPU time
//!
//! Beside each configuration's wall-clock time (the seed's kB/s), the lab
//! takes the CPU time of its work. The fault path needs two parties'
//! work: the device misses, raises and retries, the handler maps and
//! answers. With handler threads, each on its own core, both spin while
//! the other works, and what each fault costs them follows how far apart
//! the machine put their cores: on this 2-vCPU VM the same build read
//! the device's CPU per fault (less its waits) 1.8 or 2.3 µs and the
//! handler's 1.0 or 1.7 µs from one process to the next, the pinned
//! device's send unchanged, so the headline ratio read 12-21 % in quiet
//! runs; and timing both sides' waits took four clock reads (system
//! calls, ~0.5 µs each here) per fault, a cost the figure then carried.
//! So the CPU runs serve each faulting configuration's page requests
//! *inline*: the device's thread, between raising a request and waiting
//! for its answer, takes it off the unit's queue and serves it
//! (`IopfHandler::inline`, called from `DmaAccessor::on_page_request`),
//! and a send's CPU is its thread's CPU clock over the send, two reads a
//! send. That is the same work — the miss, the request through the unit's
//! queue, the handler's map and answer, the retry — done one step after
//! the other on one core, without the cost of two cores talking and with
//! no waiting to take out: a lower bound on a fault path's CPU (a real
//! one moves the request and the page table's lines between cores and
//! pays a doorbell or a wake-up), where the threaded figure was an upper
//! one that the machine's placement moved. Each repeat runs twice: untimed with handler
//! threads for the wall-clock figures and the latencies, then timed with
//! inline handlers for the CPU figures. The same robust step applies
//! (fault-free sends count as their median). The headline ratio,
//! `cpu_ratio_pct`, is kB per CPU-second with IOPF over pinned's, the
//! median over the timed runs of each run's paired ratio with its
//! spread; a co-runner that delays the handler's wake-up or takes a core
//! mid-send moves the wall figure (`ratio_pct`, the seed's own column,
//! kept beside it) but not the work.
//!
//! With `--promote on` (the default, the library's default) the faulting
//! domains promote: a fault that completes a 2 MiB block of the message
//! collapses its 4 KiB leaves into one 2 MiB leaf, so after the first send
//! the device needs the pinned side's 5 IOTLB entries for 10 MiB, not
//! 2,560. `--promote off` shows the 4 KiB-only behaviour.

mod args;
mod out;
mod render;
mod run;
#[cfg(test)]
mod tests;

pub use args::IopfArgs;
pub use run::{run, TIMED_SENDS};

use softiommu::SourceId;

/// The device-local buffer a send reads the message into, chunk by chunk:
/// 64 KiB, an accelerator's on-chip SRAM order of magnitude.
const CHUNK: usize = 64 << 10;
/// The message's IOVA (1 GiB aligned, so that a 2 MiB-aligned backing is
/// mapped with 2 MiB leaves when the window or the pinning covers them).
const MSG_IOVA: u64 = 1 << 30;
/// The accelerator's requester id.
const DEV: SourceId = SourceId(0x0a00);
/// The largest message: 256 MiB.
pub const MAX_MSG_LEN: u64 = 256 << 20;
/// The lab's handler spin: 2^15 empty polls (16,384 pausing, then 16,384
/// yielding the core), so the handler is awake for the next fault of a
/// burst without starving a device that shares its core.
const LAB_SPIN_POLLS: u64 = 1 << 15;
/// The largest pre-map window, the library's.
const MAX_PREMAP: u64 = softiommu::iopf::MAX_PREMAP_PAGES;
