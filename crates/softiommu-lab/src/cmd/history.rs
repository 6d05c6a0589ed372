//! `softiommu history`: the runs stored, oldest first.

use serde_json::json;

use super::DbArgs;
use crate::error::LabResult;
use crate::report::{Column, Param, Report, Table, Unit};
use crate::store::Store;

/// Options of `history`.
#[derive(Debug, Clone, clap::Args)]
pub struct HistoryArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The results database.
    #[command(flatten)]
    pub db: DbArgs,
}

/// The runs as a report.
pub fn history(a: &HistoryArgs) -> LabResult<Report> {
    let store = Store::open(&a.db.db)?;
    let runs = store.runs()?;
    let mut t = Table::new(
        "runs",
        format!("runs stored in {}", a.db.db.display()),
        vec![
            Column::label("run"),
            Column::text("started (UTC)"),
            Column::text("status"),
            Column::text("why"),
            Column::text("quick"),
            Column::metric("scenarios", "scenarios", Unit::Count, 0),
            Column::text("git"),
            Column::text("host"),
        ],
    );
    for r in &runs {
        t.row(vec![
            r.id.to_string().into(),
            r.started_at.clone().into(),
            r.status.clone().into(),
            r.failure.clone().unwrap_or_default().into(),
            if r.quick { "yes" } else { "no" }.into(),
            (r.scenarios as u64).into(),
            r.git_rev.clone().into(),
            format!("{} ({})", r.host.hostname, r.host.line()).into(),
        ]);
    }
    let contract = json!({
        "db": a.db.db.display().to_string(),
        "runs": runs.iter().map(|r| json!({
            "run_id": r.id,
            "started_at": r.started_at,
            "finished_at": r.finished_at,
            "status": r.status,
            "failure": r.failure,
            "quick": r.quick,
            "scenarios": r.scenarios,
            "git_rev": r.git_rev,
            "host": r.host,
            "command": r.command,
        })).collect::<Vec<_>>(),
    });
    let mut rep = Report::new("history", "the runs in the results database", contract);
    rep.params.push(Param::text("db", a.db.db.display()));
    rep.tables.push(t);
    Ok(rep)
}
