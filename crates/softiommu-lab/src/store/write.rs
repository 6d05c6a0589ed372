//! Writing a run: one row when it starts, one transaction per finished
//! scenario (so an interrupted run keeps every scenario that finished),
//! and its status at the end.

use rusqlite::params;

use super::{Store, StoreError};
use crate::host::Host;
use crate::report::Report;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Every scenario finished.
    Complete,
    /// Interrupted: the scenarios stored are the ones that finished.
    Partial,
    /// A scenario failed; the ones before it are stored.
    Failed,
}

impl RunStatus {
    /// The name stored.
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Complete => "complete",
            RunStatus::Partial => "partial",
            RunStatus::Failed => "failed",
        }
    }
}

impl Store {
    /// Records the start of a run; returns its id.
    pub fn begin_run(
        &self,
        command: &str,
        quick: bool,
        host: &Host,
        git_rev: &str,
    ) -> Result<i64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO runs (started_at, status, command, quick, git_rev, hostname, cpu_model, cores, kernel)
                 VALUES (strftime('%Y-%m-%dT%H:%M:%SZ', 'now'), 'running', ?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    command,
                    quick,
                    git_rev,
                    host.hostname,
                    host.cpu_model,
                    host.cores,
                    host.kernel
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Stores one finished scenario: its report, parameters and figures,
    /// in one transaction.
    pub fn add_scenario(
        &mut self,
        run_id: i64,
        ord: usize,
        report: &Report,
        seconds: f64,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let err = |e| StoreError::sql(&path, e);
        let json = serde_json::to_string(report).map_err(|source| StoreError::BadReport {
            run: run_id,
            scenario: report.scenario.clone(),
            path: path.clone(),
            source,
        })?;
        let tx = self.conn.transaction().map_err(err)?;
        tx.execute(
            "INSERT INTO scenarios (run_id, ord, name, kind, seed, seconds, report) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![run_id, ord as i64, report.scenario, report.kind, report.seed, seconds, json],
        )
        .map_err(err)?;
        let sid = tx.last_insert_rowid();
        {
            let mut p = tx
                .prepare(
                    "INSERT INTO params (scenario_id, name, value, unit) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(err)?;
            for x in &report.params {
                p.execute(params![sid, x.name, x.value, x.unit.map(|u| u.symbol())])
                    .map_err(err)?;
            }
            for m in &report.modelled {
                p.execute(params![
                    sid,
                    format!("latency.{}", m.name),
                    m.value.to_string(),
                    m.unit.symbol()
                ])
                .map_err(err)?;
            }
            let mut m = tx
                .prepare(
                    "INSERT INTO metrics (scenario_id, tbl, row, name, unit, value, modelled) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(err)?;
            for t in &report.tables {
                for x in t.metrics() {
                    m.execute(params![
                        sid,
                        x.table,
                        x.row,
                        x.name,
                        x.unit.symbol(),
                        x.value,
                        x.modelled
                    ])
                    .map_err(err)?;
                }
            }
        }
        tx.commit().map_err(err)
    }

    /// Records how the run ended.
    pub fn finish_run(&self, run_id: i64, status: RunStatus) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE runs SET status = ?1, finished_at = strftime('%Y-%m-%dT%H:%M:%SZ', 'now') WHERE id = ?2",
                params![status.name(), run_id],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}
