//! Writing a run: one row when it starts, one transaction per finished
//! scenario (so an interrupted run keeps every scenario that finished),
//! and its status at the end.

use std::time::{Duration, Instant};

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

/// How long [`Store::finish_run`] keeps retrying a write the database
/// holds back, unless the caller gives its own bound.
#[cfg(test)]
pub const FINISH_WAIT: Duration = Duration::from_secs(60);

/// Whether process `pid` of this host still exists (Linux: `/proc/PID`).
fn alive(pid: i64) -> bool {
    pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The reason stored for a run whose process ended while it said running.
pub(crate) fn abandoned_reason(pid: i64) -> String {
    format!("abandoned: process {pid} ended without finishing")
}

impl Store {
    /// Records the start of a run, with this process's id; returns its
    /// id. First, every run of this host still `running` whose recorded
    /// process no longer exists is marked failed with the reason
    /// [`abandoned_reason`] (rows without a process id, written before
    /// the schema had one, are left as they are).
    pub fn begin_run(
        &self,
        command: &str,
        quick: bool,
        host: &Host,
        git_rev: &str,
    ) -> Result<i64, StoreError> {
        self.mark_abandoned(&host.hostname)?;
        self.conn
            .execute(
                "INSERT INTO runs (started_at, status, command, quick, git_rev, hostname, cpu_model, cores, kernel, pid)
                 VALUES (strftime('%Y-%m-%dT%H:%M:%SZ', 'now'), 'running', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    command,
                    quick,
                    git_rev,
                    host.hostname,
                    host.cpu_model,
                    host.cores,
                    host.kernel,
                    i64::from(std::process::id())
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Marks failed every `running` run of `hostname` whose process is
    /// gone; returns how many.
    fn mark_abandoned(&self, hostname: &str) -> Result<usize, StoreError> {
        let dead: Vec<(i64, i64)> = {
            let mut q = self
                .conn
                .prepare(
                    "SELECT id, pid FROM runs WHERE status = 'running' AND pid IS NOT NULL AND hostname = ?1",
                )
                .map_err(|e| self.err(e))?;
            let rows = q
                .query_map(params![hostname], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(|e| self.err(e))?
                .collect::<Result<Vec<(i64, i64)>, _>>()
                .map_err(|e| self.err(e))?;
            rows.into_iter()
                .filter(|&(_, pid)| pid != i64::from(std::process::id()) && !alive(pid))
                .collect()
        };
        for &(id, pid) in &dead {
            self.conn
                .execute(
                    "UPDATE runs SET status = 'failed', failure = ?1,
                         finished_at = strftime('%Y-%m-%dT%H:%M:%SZ', 'now')
                     WHERE id = ?2 AND status = 'running'",
                    params![abandoned_reason(pid), id],
                )
                .map_err(|e| self.err(e))?;
        }
        Ok(dead.len())
    }

    /// Stores one finished scenario: its report, parameters and figures,
    /// in one transaction. A figure that is not finite is absent (see
    /// [`super::absent`]): no metric row, an empty cell, no plot point.
    pub fn add_scenario(
        &mut self,
        run_id: i64,
        ord: usize,
        report: &Report,
        seconds: f64,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let err = |e| StoreError::sql(&path, e);
        let report = &super::absent::without_absent(report);
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
                    "INSERT INTO metrics (scenario_id, tbl, row, name, unit, value, modelled, spread_min, spread_median, spread_max) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
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
                        x.modelled,
                        x.spread.map(|s| s.min),
                        x.spread.map(|s| s.median),
                        x.spread.map(|s| s.max)
                    ])
                    .map_err(err)?;
                }
            }
        }
        tx.commit().map_err(err)
    }

    /// Records how the run ended (no reason), retrying a write the
    /// database holds back for up to [`FINISH_WAIT`].
    #[cfg(test)]
    pub fn finish_run(&self, run_id: i64, status: RunStatus) -> Result<(), StoreError> {
        self.finish_run_why(run_id, status, None, FINISH_WAIT)
    }

    /// Records how the run ended and, for a run that did not complete,
    /// why. While another process holds the database the write is
    /// retried until `bound` has passed (each attempt waits at most what
    /// is left of it); then the last `Locked` is returned and the row
    /// still says running (the next writer's [`begin_run`](Self::begin_run)
    /// marks it failed once this process is gone). The write wait set
    /// before is restored.
    pub fn finish_run_why(
        &self,
        run_id: i64,
        status: RunStatus,
        why: Option<&str>,
        bound: Duration,
    ) -> Result<(), StoreError> {
        let deadline = Instant::now() + bound;
        let before = self.write_wait;
        let r = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            self.conn
                .busy_timeout(left.max(Duration::from_millis(1)))
                .map_err(|e| self.err(e))?;
            let r = self.conn.execute(
                "UPDATE runs SET status = ?1, failure = ?2,
                     finished_at = strftime('%Y-%m-%dT%H:%M:%SZ', 'now') WHERE id = ?3",
                params![status.name(), why, run_id],
            );
            match r.map_err(|e| self.err(e)) {
                Err(StoreError::Locked { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other,
            }
        };
        self.conn.busy_timeout(before).map_err(|e| self.err(e))?;
        r.map(|_| ())
    }
}
