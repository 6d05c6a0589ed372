//! `softiommu lab netperf-udp`: seed `000`'s UDP_STREAM on the real path —
//! smoltcp on host A sends `--msg-size`-byte datagrams through its
//! virtio-net driver (each frame mapped `ToDevice`, unmapped at
//! completion), A's device thread fetches them through A's IOMMU unit,
//! the wire carries them, B's device writes them through B's unit into
//! receive buffers mapped `FromDevice`, and B's smoltcp delivers them.
//! Nothing is hand-built: the engine is
//! `softiommu_virtio::workload::udp_stream`.
//!
//! Two passes. First every policy at full speed (the `full_speed` table:
//! each policy's maximum delivered rate). Then every policy paced to one
//! common rate, `--pace-percent` of the slowest policy's maximum, so all
//! deliver the same throughput with no drops, in batches polled
//! NAPI-style, the threads busy-polling between batches (that idling not
//! counted) so that wake-ups do not dominate (the `results` table).
//! Service demand is netperf's: the CPU of every software thread the
//! traffic makes work — both driver+stack threads and both domains'
//! flush timer threads, thread CPU clocks — per datagram delivered; the
//! device threads stand for hardware and are reported apart. Per row: its
//! spread over the rounds, the ratio to pass-through, and the physics
//! checks (deferred must not cost less than pass-through, nor strict
//! less than deferred, beyond the spread; a row that does is marked
//! invalid with why). Rows run once per round, rounds interleaved, and
//! each row is its median round. Threads are pinned by `--placement`
//! (split by default: drivers and devices on CPUs of their own). The time
//! the hardware takes to complete an invalidation and a walk level's
//! memory latency are modelled (`--latency`); everything else is
//! measured.
//!
//! The lab in four parts, one job each: `args` (the options), `out` (the
//! JSON object and its rows), `run` (the measurement: both passes, the
//! common rate, the comparison and the checks) and `render` (the one
//! typed `Report`).

mod args;
mod out;
mod render;
mod run;
#[cfg(test)]
mod tests;

pub use args::NetperfArgs;
pub use run::run;
