//! `softiommu report [RUN]`: the HTML report of a stored run (default the
//! newest).

use std::path::PathBuf;

use super::DbArgs;
use crate::error::LabResult;
use crate::store::Store;

/// Options of `report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The run (default: the newest with results).
    pub run: Option<i64>,
    /// Where the HTML file goes (never the database itself).
    #[arg(long, default_value = "results/report.html")]
    pub out: PathBuf,
    /// The results database.
    #[command(flatten)]
    pub db: DbArgs,
}

/// Writes the report; returns the run it shows.
pub fn report(a: &ReportArgs) -> LabResult<i64> {
    super::out_path::refuse_database_as_output(&a.out, "--out", &a.db.db)?;
    super::out_path::check_writable(&a.out, "--out")?;
    let store = Store::open(&a.db.db)?;
    let id = match a.run {
        Some(id) => store.run(id)?.id,
        None => store.latest_run()?.id,
    };
    crate::html::write(&store, id, &a.out, "--out")?;
    Ok(id)
}
