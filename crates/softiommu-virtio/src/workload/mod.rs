//! The lab's workload engines: real traffic between two [`host`](crate::host)s
//! through smoltcp, the drivers, the devices and both IOMMUs, measured
//! with thread CPU clocks. Each returns a plain typed result; printing is
//! the lab's business.
//!
//! - [`udp_stream`]: seed `000`'s netperf UDP_STREAM — packets per second
//!   each way, drops, and CPU per packet of the driver+stack threads
//!   (service demand) apart from the device threads'.
//! - [`tcp_stream`]: seed `003`'s iperf — one TCP stream with 64 KiB
//!   writes: Mbit/s, CPU seconds per GB, page-table cache lines flushed
//!   per GB and their share of the driver side's CPU, and a checksum of
//!   what arrived against what was sent.
//!
//! - [`fio`]: a fio-like storage load over virtio-blk (seed `004`):
//!   IOPS and GB/s per window, driver and device CPU per I/O.
//! - [`aging`]: seed `004`'s aging figure (warm-up, retained,
//!   stability), pure arithmetic over a window series.
//!
//! What is real and what is modelled: every copy, translation, page walk,
//! map, unmap, invalidation and cache-line flush is work this process
//! does and is measured; the only modelled costs are the unit's
//! [`LatencyModel`](softiommu::hw::LatencyModel) figures the caller
//! chooses (the time a hardware invalidation takes to complete).

pub mod aging;
pub mod fio;
mod hash;
mod side;
mod tcp_stream;
mod udp_stream;

pub use hash::StreamHash;
pub use side::Cpus;
pub use tcp_stream::{flush_cost_per_line, tcp_stream, TcpStreamConfig, TcpStreamResult};
pub use udp_stream::{pace_period, udp_stream, UdpStreamConfig, UdpStreamResult, PACE_BATCH};

use crate::host::HostError;
use crate::net::DriverError;

/// Why a workload could not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// A host could not be built.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A driver failed on one side (or its device asked for a reset).
    #[error("host {side}: {source}")]
    Driver {
        /// "a" (sender) or "b" (receiver).
        side: &'static str,
        /// What failed.
        source: DriverError,
    },
    /// A smoltcp socket refused an operation.
    #[error("host {side}: socket: {what}")]
    Socket {
        /// "a" or "b".
        side: &'static str,
        /// What it said.
        what: String,
    },
    /// A side did not get ready or finish in time.
    #[error("host {side}: {what} did not happen within {secs} s")]
    Timeout {
        /// "a" or "b".
        side: &'static str,
        /// What was awaited.
        what: &'static str,
        /// The limit.
        secs: u64,
    },
    /// A workload thread panicked (a bug).
    #[error("a workload thread panicked")]
    Panicked,
}
