//! Reading runs back: the list (`history`), one run's reports (`report`,
//! `compare`), and one figure across runs (sparklines, noise).

use rusqlite::{params, OptionalExtension, Row};

use super::{Store, StoreError};
use crate::host::Host;
use crate::report::{Report, Spread};

/// A run as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// Its id.
    pub id: i64,
    /// When it started (UTC, RFC 3339).
    pub started_at: String,
    /// When it ended, if it did.
    pub finished_at: Option<String>,
    /// running, complete, partial or failed.
    pub status: String,
    /// The command that made it.
    pub command: String,
    /// Whether it was `--quick`.
    pub quick: bool,
    /// The source revision.
    pub git_rev: String,
    /// The host.
    pub host: Host,
    /// Scenarios stored.
    pub scenarios: i64,
    /// Why it did not complete, if that was stored (never in a database
    /// of schema version 1).
    pub failure: Option<String>,
}

/// A stored scenario.
#[derive(Debug, Clone)]
pub struct StoredScenario {
    /// Wall seconds it took.
    pub seconds: f64,
    /// Its report.
    pub report: Report,
}

/// The columns of a run row, for a database of schema `version` (version
/// 1 has no failure reason: NULL is read in its place).
fn run_columns(version: i64) -> String {
    let failure = if version >= 2 { "r.failure" } else { "NULL" };
    format!(
        "r.id, r.started_at, r.finished_at, r.status, r.command, r.quick, r.git_rev,
         r.hostname, r.cpu_model, r.cores, r.kernel,
         (SELECT count(*) FROM scenarios s WHERE s.run_id = r.id), {failure}"
    )
}

fn run_row(r: &Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        id: r.get(0)?,
        started_at: r.get(1)?,
        finished_at: r.get(2)?,
        status: r.get(3)?,
        command: r.get(4)?,
        quick: r.get(5)?,
        git_rev: r.get(6)?,
        host: Host {
            hostname: r.get(7)?,
            cpu_model: r.get(8)?,
            cores: r.get(9)?,
            kernel: r.get(10)?,
        },
        scenarios: r.get(11)?,
        failure: r.get(12)?,
    })
}

impl Store {
    /// Every run, oldest first.
    pub fn runs(&self) -> Result<Vec<RunRow>, StoreError> {
        let mut q = self
            .conn
            .prepare(&format!(
                "SELECT {} FROM runs r ORDER BY r.id",
                run_columns(self.version)
            ))
            .map_err(|e| self.err(e))?;
        let rows = q
            .query_map([], run_row)
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// The run `id`.
    pub fn run(&self, id: i64) -> Result<RunRow, StoreError> {
        let found = self
            .conn
            .query_row(
                &format!(
                    "SELECT {} FROM runs r WHERE r.id = ?1",
                    run_columns(self.version)
                ),
                params![id],
                run_row,
            )
            .optional()
            .map_err(|e| self.err(e))?;
        match found {
            Some(r) => Ok(r),
            None => Err(self.unknown_run(id)?),
        }
    }

    /// The newest run with at least one scenario.
    pub fn latest_run(&self) -> Result<RunRow, StoreError> {
        let id: Option<i64> = self
            .conn
            .query_row("SELECT max(run_id) FROM scenarios", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        match id {
            Some(id) => self.run(id),
            None => match self.unknown_run(0)? {
                StoreError::UnknownRun { path, known, .. } => {
                    Err(StoreError::NoRunWithResults { path, known })
                }
                other => Err(other),
            },
        }
    }

    fn unknown_run(&self, id: i64) -> Result<StoreError, StoreError> {
        let (lo, hi): (Option<i64>, Option<i64>) = self
            .conn
            .query_row("SELECT min(id), max(id) FROM runs", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(|e| self.err(e))?;
        Ok(StoreError::UnknownRun {
            id,
            path: self.path.clone(),
            known: match (lo, hi) {
                (Some(lo), Some(hi)) => format!("runs {lo}..={hi}"),
                _ => "no runs yet".to_string(),
            },
        })
    }

    /// The scenarios of run `id`, in the order they ran.
    pub fn scenarios(&self, id: i64) -> Result<Vec<StoredScenario>, StoreError> {
        let mut q = self
            .conn
            .prepare("SELECT name, seconds, report FROM scenarios WHERE run_id = ?1 ORDER BY ord")
            .map_err(|e| self.err(e))?;
        let rows = q
            .query_map(params![id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, f64>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        rows.into_iter()
            .map(|(name, seconds, json)| {
                let report =
                    serde_json::from_str(&json).map_err(|source| StoreError::BadReport {
                        run: id,
                        scenario: name,
                        path: self.path.clone(),
                        source,
                    })?;
                Ok(StoredScenario { seconds, report })
            })
            .collect()
    }

    /// One figure across every run that has it, oldest first: (run id,
    /// value, its spread over rounds). The spread is `None` for a figure
    /// measured once and for every figure of a database older than
    /// schema version 3, read as it is.
    pub fn metric_spread_history(
        &self,
        scenario: &str,
        table: &str,
        row: &str,
        name: &str,
    ) -> Result<Vec<(i64, f64, Option<Spread>)>, StoreError> {
        let cols = if self.version >= 3 {
            "m.spread_min, m.spread_median, m.spread_max"
        } else {
            "NULL, NULL, NULL"
        };
        let mut q = self
            .conn
            .prepare(&format!(
                "SELECT s.run_id, m.value, {cols} FROM metrics m JOIN scenarios s ON s.id = m.scenario_id
                 WHERE s.name = ?1 AND m.tbl = ?2 AND m.row = ?3 AND m.name = ?4 ORDER BY s.run_id"
            ))
            .map_err(|e| self.err(e))?;
        let rows = q
            .query_map(params![scenario, table, row, name], |r| {
                let (lo, mid, hi): (Option<f64>, Option<f64>, Option<f64>) =
                    (r.get(2)?, r.get(3)?, r.get(4)?);
                let spread = match (lo, mid, hi) {
                    (Some(min), Some(median), Some(max)) => Some(Spread { min, median, max }),
                    _ => None,
                };
                Ok((r.get(0)?, r.get(1)?, spread))
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// One figure across every run that has it, oldest first: (run id,
    /// value).
    pub fn metric_history(
        &self,
        scenario: &str,
        table: &str,
        row: &str,
        name: &str,
    ) -> Result<Vec<(i64, f64)>, StoreError> {
        let mut q = self
            .conn
            .prepare(
                "SELECT s.run_id, m.value FROM metrics m JOIN scenarios s ON s.id = m.scenario_id
                 WHERE s.name = ?1 AND m.tbl = ?2 AND m.row = ?3 AND m.name = ?4 ORDER BY s.run_id",
            )
            .map_err(|e| self.err(e))?;
        let rows = q
            .query_map(params![scenario, table, row, name], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }
}
