//! What can go wrong with the results database, each with the path and
//! the facts to act on.

use std::path::PathBuf;

/// A results-database failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory for the database cannot be created.
    #[error("cannot create the results directory {dir}: {source}")]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// There is no database to read.
    #[error("no results database at {path} (softiommu run creates it)")]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// Another process holds the database locked.
    #[error("results database {path} is locked by another process; nothing was changed, try again when it finishes")]
    Locked {
        /// The path.
        path: PathBuf,
    },
    /// The file is not an SQLite database, or is damaged.
    #[error(
        "{path} is not a softiommu results database or is corrupt ({detail}); it was left as it is"
    )]
    Corrupt {
        /// The path.
        path: PathBuf,
        /// SQLite's words.
        detail: String,
    },
    /// An SQLite file that is not a softiommu results database (empty,
    /// another program's, or without softiommu's tables); it is never
    /// migrated or written.
    #[error("{path} is not a softiommu results database ({why}); it was left as it is")]
    NotOurs {
        /// The path.
        path: PathBuf,
        /// What it is instead, in a few words (never its schema).
        why: String,
    },
    /// The path is not a regular file (a FIFO, a directory, a device): it
    /// is refused before anything opens it.
    #[error("{path} is {kind}, not a results database file; it was left as it is")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is, in a few words ("a FIFO", "a directory").
        kind: &'static str,
    },
    /// The database was written by a newer softiommu.
    #[error("results database {path} has schema version {found}, newer than this softiommu's {supported}; refusing to touch it (use a newer softiommu, or another --db)")]
    TooNew {
        /// The path.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// Ours.
        supported: i64,
    },
    /// No run has this id.
    #[error("no run {id} in {path} ({known})")]
    UnknownRun {
        /// The id asked for.
        id: i64,
        /// The path.
        path: PathBuf,
        /// The runs there are, as "runs 1..=7" or "no runs yet".
        known: String,
    },
    /// `report` without a run id, and no run has stored results.
    #[error("no run with results in {path} ({known}); `softiommu run` stores one")]
    NoRunWithResults {
        /// The path.
        path: PathBuf,
        /// The runs there are, as "runs 1..=7" or "no runs yet".
        known: String,
    },
    /// A stored report cannot be read back.
    #[error("run {run}, scenario {scenario} in {path}: stored report unreadable: {source}")]
    BadReport {
        /// The run.
        run: i64,
        /// The scenario.
        scenario: String,
        /// The path.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A writer died mid-transaction and left its hot journal, and this
    /// process cannot roll it back (the file or its directory is not
    /// writable to it): nothing can be read until it is.
    #[error("results database {path} holds the unfinished write of a process that ended (its hot journal), which this user cannot roll back; any softiommu command run by a user who can write {path} and its directory recovers it")]
    HotJournal {
        /// The path.
        path: PathBuf,
    },
    /// Any other SQLite failure.
    #[error("results database {path}: {source}")]
    Sql {
        /// The path.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The schema could not be brought up to date.
    #[error("results database {path}: migration failed: {source}")]
    Migrate {
        /// The path.
        path: PathBuf,
        /// Why.
        source: rusqlite_migration::Error,
    },
}

impl StoreError {
    /// Classifies an SQLite error: locked, corrupt, or other.
    pub(super) fn sql(path: &std::path::Path, e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        let path = path.to_path_buf();
        // SQLITE_READONLY_ROLLBACK (sqlite.org/rescode.html#readonly_rollback):
        // SQLITE_READONLY | (3 << 8).
        const READONLY_ROLLBACK: std::ffi::c_int = 8 | (3 << 8);
        if let rusqlite::Error::SqliteFailure(f, _) = &e {
            if f.extended_code == READONLY_ROLLBACK {
                return StoreError::HotJournal { path };
            }
        }
        match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                StoreError::Locked { path }
            }
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
                path,
                detail: e.to_string(),
            },
            _ => StoreError::Sql { path, source: e },
        }
    }
}
