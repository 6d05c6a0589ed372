//! The commands over results: the suite (`run`), and `history`, `compare`
//! and `report` over the database.

pub mod compare;
pub mod history;
pub mod out_path;
pub mod report;
pub mod run;

use std::path::PathBuf;

/// Where results are kept.
#[derive(Debug, Clone, clap::Args)]
pub struct DbArgs {
    /// The results database (`run` writes it; `history`, `compare` and
    /// `report` only read it, but open it for writing where they can, so
    /// that SQLite rolls back the journal of a writer that died).
    #[arg(long, default_value = crate::store::DEFAULT_DB)]
    pub db: PathBuf,
}
