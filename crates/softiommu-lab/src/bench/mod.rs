//! Micro-benchmarks: each prints a table, or one JSON object with `--json`.

pub mod access;
pub mod dma;
pub mod dma_instructions;
pub mod iova;
pub mod iova_contract_floor;
pub mod iova_floor;
pub mod iova_peers;
pub mod packet;
pub mod pgtable;
pub mod ring;
pub mod translate;
pub mod translate_floor;
