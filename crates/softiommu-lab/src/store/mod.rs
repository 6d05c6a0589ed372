//! The results database: every run, its host, and every scenario's
//! parameters and figures with their units, in one SQLite file (default
//! `results/softiommu.db`). The schema is versioned (`PRAGMA
//! user_version`, migrated by `rusqlite_migration`); a database written by
//! a newer softiommu is refused before anything touches it.

mod absent;
mod error;
mod open;
mod read;
mod schema;
mod write;

pub use error::StoreError;
pub use open::{Store, DEFAULT_DB};
pub use read::{RunRow, StoredScenario};
pub use write::RunStatus;

#[cfg(test)]
mod tests;
