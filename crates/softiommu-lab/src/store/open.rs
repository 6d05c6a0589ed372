//! Opening the database: create it (and its directory) for writers, refuse
//! a missing one for readers, classify locked and corrupt files, refuse a
//! newer schema before any write, migrate an older one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::schema::{migrations, LATEST, OLDEST_READABLE};
use super::StoreError;

/// Where results go unless `--db` says otherwise.
pub const DEFAULT_DB: &str = "results/softiommu.db";

/// How long opening waits for another process holding the database
/// before calling it locked (nothing has been measured yet, so refusing
/// loses nothing).
pub const OPEN_WAIT: Duration = Duration::from_secs(2);

/// The tables every softiommu results database has (schema version 1).
const OUR_TABLES: [&str; 4] = ["runs", "scenarios", "params", "metrics"];

/// An open results database.
#[derive(Debug)]
pub struct Store {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
    /// The schema version of the file as opened (a reader reads an older
    /// one as it is).
    pub(super) version: i64,
    /// SQLite's busy timeout as last set.
    pub(super) write_wait: Duration,
}

impl Store {
    /// Opens `path` to write results, creating it and its directory (an
    /// empty file is given the schema; an SQLite file with tables of
    /// another program's is refused, never migrated).
    pub fn create(path: &Path) -> Result<Store, StoreError> {
        refuse_non_regular(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        Self::open_with(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            true,
        )
    }

    /// Opens an existing `path` to read results: nothing is created,
    /// migrated or written (`PRAGMA query_only`), and a file that is not a
    /// softiommu results database of a schema this build reads is refused.
    /// It is opened read-write where the file allows (without creating),
    /// so that SQLite can roll back the hot journal a writer that died
    /// mid-transaction left; a file this user cannot write is read
    /// read-only (SQLite's own fallback), and such a journal then is
    /// [`StoreError::HotJournal`].
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
            });
        }
        refuse_non_regular(path)?;
        precheck_header(path)?;
        Self::open_with(path, OpenFlags::SQLITE_OPEN_READ_WRITE, false)
    }

    /// How long each later write waits for another process holding the
    /// database (SQLite's busy timeout) before it fails as locked.
    pub fn set_write_wait(&mut self, wait: Duration) -> Result<(), StoreError> {
        self.conn.busy_timeout(wait).map_err(|e| self.err(e))?;
        self.write_wait = wait;
        Ok(())
    }

    fn open_with(path: &Path, flags: OpenFlags, writer: bool) -> Result<Store, StoreError> {
        let sql = |e| StoreError::sql(path, e);
        let flags = flags | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags).map_err(sql)?;
        conn.busy_timeout(OPEN_WAIT).map_err(sql)?;
        if !writer {
            // A reader never writes; the first read below may still roll
            // back a dead writer's hot journal (the pager does, not SQL).
            conn.execute_batch("PRAGMA query_only = ON").map_err(sql)?;
        }
        // Reading the header first: a file that is not a database, or one
        // locked by a writer, fails here, before anything is written.
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql)?;
        let tables = table_names(&conn).map_err(sql)?;
        if version > LATEST {
            return Err(StoreError::TooNew {
                path: path.to_path_buf(),
                found: version,
                supported: LATEST,
            });
        }
        if version < 0 {
            return Err(StoreError::NotOurs {
                path: path.to_path_buf(),
                why: format!(
                    "schema version {version}, not softiommu's {OLDEST_READABLE} to {LATEST}"
                ),
            });
        }
        let fresh = version == 0 && tables.is_empty();
        if !(fresh && writer) {
            check_ours(path, version, &tables)?;
        }
        if writer && version < LATEST {
            migrations().to_latest(&mut conn).map_err(|e| match e {
                rusqlite_migration::Error::RusqliteError { err, .. } => StoreError::sql(path, err),
                source => StoreError::Migrate {
                    path: path.to_path_buf(),
                    source,
                },
            })?;
        }
        if writer {
            conn.execute_batch("PRAGMA foreign_keys = ON")
                .map_err(sql)?;
        }
        let version = if writer { LATEST } else { version };
        Ok(Store {
            conn,
            path: path.to_path_buf(),
            version,
            write_wait: OPEN_WAIT,
        })
    }

    pub(super) fn err(&self, e: rusqlite::Error) -> StoreError {
        StoreError::sql(&self.path, e)
    }
}

/// The first bytes of every SQLite 3 database (sqlite.org/fileformat2.html,
/// "The Database Header": offset 0, 16 bytes).
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Looks at the header before SQLite opens the file for a reader: an
/// empty file is refused, one without SQLite's magic is corrupt, and a
/// WAL-mode database (header bytes 18 and 19 are 2) whose user version
/// (offset 60, big-endian) is not ours is refused without being opened,
/// since opening it would create its `-wal` and `-shm` files beside it.
fn precheck_header(path: &Path) -> Result<(), StoreError> {
    use std::io::Read;
    let mut head = Vec::with_capacity(100);
    std::fs::File::open(path)
        .and_then(|f| f.take(100).read_to_end(&mut head))
        .map_err(|e| StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if head.is_empty() {
        return Err(StoreError::NotOurs {
            path: path.to_path_buf(),
            why: "an empty file: no softiommu schema".to_string(),
        });
    }
    if head.len() < 100 || !head.starts_with(SQLITE_MAGIC) {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: "no SQLite header".to_string(),
        });
    }
    let user_version = i64::from(i32::from_be_bytes([head[60], head[61], head[62], head[63]]));
    if head[18] == 2 && head[19] == 2 && !(OLDEST_READABLE..=LATEST).contains(&user_version) {
        return Err(StoreError::NotOurs {
            path: path.to_path_buf(),
            why: format!("an SQLite database in WAL mode with schema version {user_version}, not softiommu's {OLDEST_READABLE} to {LATEST}"),
        });
    }
    Ok(())
}

/// Refuses a path that exists and is not a regular file (a FIFO, a
/// directory, a device, a socket; a symbolic link is followed) before
/// anything opens it: opening a FIFO would block until a writer came.
/// Looked at with `metadata`, which never opens the file.
fn refuse_non_regular(path: &Path) -> Result<(), StoreError> {
    let Ok(meta) = std::fs::metadata(path) else {
        // Missing (or unreadable): the open that follows says which.
        return Ok(());
    };
    let t = meta.file_type();
    if t.is_file() {
        return Ok(());
    }
    let kind = {
        use std::os::unix::fs::FileTypeExt;
        if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        }
    };
    Err(StoreError::NotAFile {
        path: path.to_path_buf(),
        kind,
    })
}

/// The names of the tables in the database (SQLite's own left out).
fn table_names(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut q = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )?;
    let names = q.query_map([], |r| r.get(0))?;
    names.collect()
}

/// Refuses a database that is not softiommu's at this build's schema: no
/// schema version (an empty file, another program's database), or our
/// version without our tables. The message counts, never lists, what is
/// there.
fn check_ours(path: &Path, version: i64, tables: &[String]) -> Result<(), StoreError> {
    let missing: Vec<&str> = OUR_TABLES
        .iter()
        .copied()
        .filter(|t| !tables.iter().any(|x| x == t))
        .collect();
    let why = if version == 0 && tables.is_empty() {
        "an empty SQLite database: no softiommu schema".to_string()
    } else if version == 0 {
        format!(
            "an SQLite database with {} table(s) of another program's and no softiommu schema version",
            tables.len()
        )
    } else if !missing.is_empty() {
        format!(
            "schema version {version} but no table {} of softiommu's",
            missing.join(", ")
        )
    } else {
        return Ok(());
    };
    Err(StoreError::NotOurs {
        path: path.to_path_buf(),
        why,
    })
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
    fn a_foreign_or_empty_database_is_not_ours_and_left_unchanged() {
        let p = tmp("foreign");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let c = Connection::open(&p).unwrap();
        c.execute_batch("CREATE TABLE notes (t TEXT); INSERT INTO notes VALUES ('x');")
            .unwrap();
        drop(c);
        let before = std::fs::read(&p).unwrap();
        for e in [Store::open(&p).unwrap_err(), Store::create(&p).unwrap_err()] {
            assert!(
                matches!(&e, StoreError::NotOurs { why, .. } if why.contains("1 table(s) of another program's")),
                "{e}"
            );
        }
        assert_eq!(std::fs::read(&p).unwrap(), before);
        // An empty file: readers refuse it; a writer gives it the schema.
        std::fs::write(&p, b"").unwrap();
        let e = Store::open(&p).unwrap_err();
        assert!(
            matches!(&e, StoreError::NotOurs { why, .. } if why.contains("empty")),
            "{e}"
        );
        assert!(std::fs::read(&p).unwrap().is_empty());
        drop(Store::create(&p).unwrap());
        let store = Store::open(&p).unwrap();
        assert!(store.runs().unwrap().is_empty());
        // Our version without our tables is not ours either.
        let q = tmp("versioned");
        std::fs::create_dir_all(q.parent().unwrap()).unwrap();
        let c = Connection::open(&q).unwrap();
        c.execute_batch("CREATE TABLE runs (id); PRAGMA user_version = 1;")
            .unwrap();
        drop(c);
        let e = Store::open(&q).unwrap_err();
        assert!(
            matches!(&e, StoreError::NotOurs { why, .. } if why.contains("no table scenarios, params, metrics")),
            "{e}"
        );
    }

    #[test]
    fn a_foreign_wal_database_is_refused_unopened_and_gains_no_side_files() {
        let p = tmp("wal");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let c = Connection::open(&p).unwrap();
        c.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x);")
            .unwrap();
        drop(c);
        let before = std::fs::read(&p).unwrap();
        let e = Store::open(&p).unwrap_err();
        assert!(
            matches!(&e, StoreError::NotOurs { why, .. } if why.contains("WAL mode with schema version 0")),
            "{e}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), before);
        let shm = PathBuf::from(format!("{}-shm", p.display()));
        assert!(!shm.exists());
    }

    #[test]
    fn readers_open_read_only() {
        let p = tmp("readonly");
        drop(Store::create(&p).unwrap());
        let store = Store::open(&p).unwrap();
        let e = store
            .begin_run("x", false, &crate::host::Host::detect(), "rev")
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Sql { source, .. } if source.sqlite_error_code() == Some(rusqlite::ErrorCode::ReadOnly)),
            "{e}"
        );
    }

    /// A writer that died inside a transaction leaves a hot journal; a
    /// reader opened read-only cannot roll it back and every read failed
    /// with "attempt to write a readonly database". Readers now let
    /// SQLite recover it: the unfinished write is undone and the runs
    /// before it read.
    #[test]
    fn a_reader_recovers_the_hot_journal_of_a_writer_that_died() {
        let p = tmp("hot");
        let store = Store::create(&p).unwrap();
        store
            .begin_run("x", false, &crate::host::Host::detect(), "rev")
            .unwrap();
        drop(store);
        // A writer in a child process changes the file inside a
        // transaction (a cache too small to hold the change, so the pages
        // reach the file) and dies before committing.
        let script = format!(
            "import sqlite3, os\n\
             c = sqlite3.connect({:?}, isolation_level=None)\n\
             c.execute('PRAGMA cache_size=1')\n\
             c.execute('BEGIN')\n\
             c.execute(\"UPDATE runs SET command = hex(randomblob(20000))\")\n\
             c.execute(\"CREATE TABLE junk(x)\")\n\
             c.execute(\"INSERT INTO junk SELECT randomblob(4000) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<200) SELECT i FROM n)\")\n\
             os._exit(0)\n",
            p.to_str().unwrap()
        );
        let st = std::process::Command::new("python3")
            .args(["-c", &script])
            .status()
            .unwrap();
        assert!(st.success());
        let mut journal = p.as_os_str().to_owned();
        journal.push("-journal");
        assert!(
            std::fs::metadata(&journal).is_ok_and(|m| m.len() > 0),
            "the dead writer left a hot journal"
        );
        let store = Store::open(&p).unwrap();
        let runs = store.runs().unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].command, "x");
        drop(store);
        let tables: Vec<String> = table_names(&Connection::open(&p).unwrap()).unwrap();
        assert!(!tables.iter().any(|t| t == "junk"), "{tables:?}");
    }

    /// A negative schema version is no version of ours: readers refused
    /// it (they read it as if it were ours), and `run` failed with the
    /// migration library's words.
    #[test]
    fn a_negative_schema_version_is_not_ours() {
        let p = tmp("negative");
        drop(Store::create(&p).unwrap());
        Connection::open(&p)
            .unwrap()
            .execute_batch("PRAGMA user_version = -1")
            .unwrap();
        for e in [Store::open(&p).unwrap_err(), Store::create(&p).unwrap_err()] {
            assert!(
                matches!(&e, StoreError::NotOurs { why, .. } if why == "schema version -1, not softiommu's 1 to 3"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_missing_database_is_not_created_by_readers() {
        let p = tmp("missing");
        assert!(matches!(Store::open(&p), Err(StoreError::Missing { .. })));
        assert!(!p.exists());
    }
}
