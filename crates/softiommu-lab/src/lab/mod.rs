//! Lab scenarios: workloads over the library, with seed-shaped output.

pub mod iova_aging;
pub mod packet;
