//! Opening the database: create it (and its directory) for writers, refuse
//! a missing one for readers, classify locked and corrupt files, refuse a
//! newer schema before any write, migrate an older one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::schema::{migrations, LATEST};
use super::StoreError;

/// Where results go unless `--db` says otherwise.
pub const DEFAULT_DB: &str = "results/softiommu.db";

/// How long to wait for another writer before calling the file locked.
const BUSY_WAIT: Duration = Duration::from_secs(2);

/// An open results database.
#[derive(Debug)]
pub struct Store {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
}

impl Store {
    /// Opens `path` to write results, creating it and its directory.
    pub fn create(path: &Path) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        Self::open_with(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        )
    }

    /// Opens an existing `path` to read results.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
            });
        }
        Self::open_with(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
    }

    fn open_with(path: &Path, flags: OpenFlags) -> Result<Store, StoreError> {
        let sql = |e| StoreError::sql(path, e);
        let mut conn = Connection::open_with_flags(path, flags).map_err(sql)?;
        conn.busy_timeout(BUSY_WAIT).map_err(sql)?;
        // Reading the header first: a file that is not a database, or one
        // locked by a writer, fails here, before anything is written.
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql)?;
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(sql)?;
        if version > LATEST {
            return Err(StoreError::TooNew {
                path: path.to_path_buf(),
                found: version,
                supported: LATEST,
            });
        }
        if version < LATEST {
            migrations().to_latest(&mut conn).map_err(|e| match e {
                rusqlite_migration::Error::RusqliteError { err, .. } => StoreError::sql(path, err),
                source => StoreError::Migrate {
                    path: path.to_path_buf(),
                    source,
                },
            })?;
        }
        conn.execute_batch("PRAGMA foreign_keys = ON")
            .map_err(sql)?;
        Ok(Store {
            conn,
            path: path.to_path_buf(),
        })
    }

    pub(super) fn err(&self, e: rusqlite::Error) -> StoreError {
        StoreError::sql(&self.path, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("softiommu-store-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d.join("r.db")
    }

    #[test]
    fn migrations_are_valid() {
        assert!(migrations().validate().is_ok());
    }

    #[test]
    fn a_newer_schema_is_refused_and_left_unchanged() {
        let p = tmp("newer");
        drop(Store::create(&p).unwrap());
        let c = Connection::open(&p).unwrap();
        c.execute_batch("PRAGMA user_version = 99").unwrap();
        drop(c);
        let before = std::fs::read(&p).unwrap();
        let e = Store::create(&p).unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::TooNew {
                    found: 99,
                    supported: LATEST,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), before);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_corrupt_and_left_unchanged() {
        let p = tmp("corrupt");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let junk = b"this is not SQLite, it is a shopping list: eggs, milk\n".repeat(200);
        std::fs::write(&p, &junk).unwrap();
        let e = Store::open(&p).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), junk);
    }

    #[test]
    fn a_missing_database_is_not_created_by_readers() {
        let p = tmp("missing");
        assert!(matches!(Store::open(&p), Err(StoreError::Missing { .. })));
        assert!(!p.exists());
    }
}
