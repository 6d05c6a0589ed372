//! `softiommu lab iperf-tcp`: seed `003` on the real path — one smoltcp
//! TCP stream from host A to host B with 64 KiB writes at MTU 1500,
//! through virtio-net and two IOMMUs, for {coherent, non-coherent page
//! walk} × {strict, deferred}: throughput, driver-side CPU seconds per GB,
//! page-table cache lines flushed per GB, and the share of the driver
//! side's CPU spent flushing, beside the seed's figures (7,908 → 4,380
//! Mbit/s with the IOMMU's walk not coherent; `clflush_cache_range` 5.86 %
//! of CPU). The engine is `softiommu_virtio::workload::tcp_stream`.
//!
//! # What is compared with the seed
//!
//! Seed 003's 0.55× is throughput with the CPU saturated: every cycle a
//! flush takes is a cycle the stream loses. Ours runs one stream that
//! need not saturate its driver threads (a non-coherent walk can move as
//! many Mbit/s as a coherent one while its CPU per GB rises), so the
//! figure compared with the seed's is the driver side's CPU per GB (both
//! hosts' driver+stack threads and flush timers) as a driver saturated on
//! CPU spends it: without the CPU the drivers spent in their waits for the
//! device (interrupts re-armed, the park, the wake-up, the status
//! acknowledged: `wait_cpu_s_per_gb`, apart), because a saturated driver
//! never goes idle, and because that CPU follows how often the stream runs
//! dry, which a co-runner on the machine changes: `saturated_vs_coherent`
//! = the coherent row's CPU per GB ÷ this row's, the throughput ratio a
//! driver saturated on CPU reaches, taken per round (the rows run one
//! after the other in each round, so a change of the machine's speed
//! between rounds falls on both) and reported as the median of the rounds'
//! paired ratios with their spread. The measured Mbit/s ratio (`vs_coherent`) stays beside it.
//!
//! A non-coherent walk does all a coherent one does and flushes the lines
//! it writes: a non-coherent row whose CPU per GB is below the coherent
//! row's in every round is marked `"valid": false` with the reason, and
//! the seed summary gives no verdict from it. So is a row one of whose
//! rounds moved nothing in its window (its CPU per GB is no figure).
//!
//! The lines flushed are counted by the page tables (real `clflushopt` /
//! `clwb` / `clflush` of exactly the lines written). The flush share is an
//! **estimate**: lines flushed × a per-line cost measured on this CPU after
//! each non-coherent run (4 KiB map+unmap pairs on a non-coherent table
//! less the same on a coherent one, per line flushed; the median of
//! interleaved rounds), over the driver threads' CPU time. The received
//! bytes are hashed and compared with the sent ones; a mismatch fails the
//! lab.

mod args;
mod out;
mod render;
mod run;
#[cfg(test)]
mod tests;

pub use args::IperfTcpArgs;
pub use run::run;

/// How `flush_cpu_share` is obtained, as the report and its JSON say.
pub const FLUSH_SHARE_METHOD: &str = "estimated: lines flushed x a per-line flush cost measured on this CPU after each non-coherent run (non-coherent less coherent 4 KiB map+unmap pairs, per line flushed), over the driver threads' CPU time without their waits for their devices";
