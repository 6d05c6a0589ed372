//! The schema, as numbered migrations. Append a migration to change it;
//! never edit one that has shipped.

use rusqlite_migration::{Migrations, M};

/// Version 1: runs (with their host), scenarios (with the whole typed
/// report as JSON), and every parameter and figure as rows.
pub(super) const V1: &str = "
CREATE TABLE runs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at  TEXT NOT NULL,
    finished_at TEXT,
    status      TEXT NOT NULL CHECK (status IN ('running', 'complete', 'partial', 'failed')),
    command     TEXT NOT NULL,
    quick       INTEGER NOT NULL,
    git_rev     TEXT NOT NULL,
    hostname    TEXT NOT NULL,
    cpu_model   TEXT NOT NULL,
    cores       INTEGER NOT NULL,
    kernel      TEXT NOT NULL
);
CREATE TABLE scenarios (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id   INTEGER NOT NULL REFERENCES runs(id),
    ord      INTEGER NOT NULL,
    name     TEXT NOT NULL,
    kind     TEXT NOT NULL,
    seed     TEXT,
    seconds  REAL NOT NULL,
    report   TEXT NOT NULL
);
CREATE INDEX scenarios_by_run ON scenarios(run_id);
CREATE TABLE params (
    scenario_id INTEGER NOT NULL REFERENCES scenarios(id),
    name        TEXT NOT NULL,
    value       TEXT NOT NULL,
    unit        TEXT
);
CREATE TABLE metrics (
    scenario_id INTEGER NOT NULL REFERENCES scenarios(id),
    tbl         TEXT NOT NULL,
    row         TEXT NOT NULL,
    name        TEXT NOT NULL,
    unit        TEXT NOT NULL,
    value       REAL NOT NULL,
    modelled    INTEGER NOT NULL
);
CREATE INDEX metrics_by_scenario ON metrics(scenario_id);
";

/// Version 2: why a run failed (`failure`, shown by `history`), and the
/// process that writes it (`pid`, on `hostname`), so that the next writer
/// can tell a `running` row whose process is gone and mark it failed.
pub(super) const V2: &str = "
ALTER TABLE runs ADD COLUMN failure TEXT;
ALTER TABLE runs ADD COLUMN pid INTEGER;
";

/// Version 3: a figure's spread over rounds (`spread_min`,
/// `spread_median`, `spread_max`), NULL for a figure measured once and
/// for every figure stored before version 3.
pub(super) const V3: &str = "
ALTER TABLE metrics ADD COLUMN spread_min REAL;
ALTER TABLE metrics ADD COLUMN spread_median REAL;
ALTER TABLE metrics ADD COLUMN spread_max REAL;
";

/// The migrations, oldest first.
pub(super) fn migrations() -> Migrations<'static> {
    Migrations::new(vec![M::up(V1), M::up(V2), M::up(V3)])
}

/// The schema version this build writes.
pub(super) const LATEST: i64 = 3;

/// The oldest schema version readers accept (read as it is, never
/// migrated: a run row of version 1 has no failure reason, a figure of
/// version 1 or 2 no spread).
pub(super) const OLDEST_READABLE: i64 = 1;
