//! The seeds' own figures, and the summary that puts ours beside them:
//! one line per seed (their figure, ours, a verdict), computed from a
//! run's reports.

mod summary;
mod theirs;
pub mod verdict;

pub use summary::{summarise, SeedLine};
pub use theirs::their_table;
