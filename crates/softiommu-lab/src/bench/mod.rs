//! Micro-benchmarks: each prints a table, or one JSON object with `--json`.

pub mod iova;
pub mod iova_peers;
pub mod pgtable;
