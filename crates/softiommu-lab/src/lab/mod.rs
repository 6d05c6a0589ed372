//! Lab scenarios: workloads over the library, with seed-shaped output.

pub mod fio_aging;
pub mod guest;
pub mod iopf;
pub mod iova_aging;
pub mod iperf_tcp;
pub mod litmus;
pub mod netperf_udp;
pub mod policy_physics;
pub mod steal;
pub mod stress;
pub mod viommu;
