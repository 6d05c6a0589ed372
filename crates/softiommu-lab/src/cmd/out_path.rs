//! An output file must never be the results database: `report --out`
//! and `run --report` are refused when they name the database (or its
//! journal) by any path: the same name, a relative path, a symbolic link
//! (dangling ones followed too), or a hard link.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use crate::error::{LabError, LabResult};

/// The most symbolic links followed while resolving a path that does not
/// exist yet (Linux's own limit, `MAXSYMLINKS`, is 40).
const MAX_LINKS: usize = 40;

/// The files SQLite keeps beside a database `db`.
const SIDE_FILES: [&str; 3] = ["-journal", "-wal", "-shm"];

/// Refuses `out` (given as `flag`) when it resolves to the database `db`
/// or one of its side files.
pub fn refuse_database_as_output(out: &Path, flag: &'static str, db: &Path) -> LabResult<()> {
    let mut dbs = vec![db.to_path_buf()];
    for side in SIDE_FILES {
        let mut name = db.as_os_str().to_owned();
        name.push(side);
        dbs.push(PathBuf::from(name));
    }
    if dbs.iter().any(|d| same_file(out, d)) {
        return Err(LabError::OutputIsDatabase {
            flag,
            out: out.to_path_buf(),
            db: db.to_path_buf(),
        });
    }
    Ok(())
}

/// Fails as the final write of `out` would, before any work: opens it
/// for writing without truncating (an existing file keeps its bytes), or,
/// when it does not exist, creates its directories (as the final write
/// does) and the file, then removes the file again. A directory, a path
/// under `/proc`, a read-only file or file system is refused here rather
/// than after a suite has run.
pub fn check_writable(out: &Path) -> LabResult<()> {
    let fail = |source| LabError::Write {
        path: out.to_path_buf(),
        source,
    };
    if out.is_dir() {
        return Err(fail(std::io::Error::from_raw_os_error(libc::EISDIR)));
    }
    if out.exists() {
        return std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .map(drop)
            .map_err(fail);
    }
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| LabError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .map_err(fail)?;
    std::fs::remove_file(out).map_err(fail)
}

/// Whether `a` and `b` name one file: by device and inode when both
/// exist, else by their resolved absolute paths.
fn same_file(a: &Path, b: &Path) -> bool {
    if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return x.dev() == y.dev() && x.ino() == y.ino();
    }
    match (resolve(a), resolve(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// The absolute path `p` names, with every symbolic link of the part
/// that exists resolved and the rest normalised; `None` if the links go
/// round (past [`MAX_LINKS`]) or the working directory is unknown.
fn resolve(p: &Path) -> Option<PathBuf> {
    let mut p = std::path::absolute(p).ok()?;
    for _ in 0..MAX_LINKS {
        if let Ok(c) = p.canonicalize() {
            return Some(c);
        }
        // A dangling link is followed to where its target would be.
        if let Ok(target) = std::fs::read_link(&p) {
            p = p.parent()?.join(target);
            continue;
        }
        // Missing: resolve the parent, then add the name.
        let name = p.file_name()?.to_owned();
        let parent = resolve(p.parent()?)?;
        return Some(normalise(&parent.join(name)));
    }
    None
}

/// `p` with `.` and `..` taken out lexically (for parts that do not
/// exist, which no link can redirect).
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writability_check_keeps_an_existing_file_and_leaves_no_new_one() {
        let d = std::env::temp_dir().join(format!("softiommu-ow-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let kept = d.join("kept.html");
        std::fs::write(&kept, "old").unwrap();
        assert!(matches!(check_writable(&kept), Ok(())));
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "old");
        let fresh = d.join("sub").join("new.html");
        assert!(matches!(check_writable(&fresh), Ok(())));
        assert!(!fresh.exists());
        let e = check_writable(&d).unwrap_err();
        assert!(
            matches!(&e, LabError::Write { path, source } if path == &d && source.raw_os_error() == Some(libc::EISDIR)),
            "{e}"
        );
        let e = check_writable(Path::new("/proc/softiommu-x.html")).unwrap_err();
        assert!(matches!(e, LabError::Write { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_database_is_refused_by_any_name_and_other_files_are_not() {
        let d = std::env::temp_dir().join(format!("softiommu-outpath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let db = d.join("r.db");
        // Before the database exists: the same path through `..`.
        let via = d.join("sub/../r.db");
        assert!(refuse_database_as_output(&via, "--out", &db).is_err());
        std::fs::write(&db, b"x").unwrap();
        std::os::unix::fs::symlink(&db, d.join("link.html")).unwrap();
        std::fs::hard_link(&db, d.join("hard.html")).unwrap();
        std::os::unix::fs::symlink(d.join("later.db"), d.join("dangling.html")).unwrap();
        for out in [
            "r.db",
            "link.html",
            "hard.html",
            "sub/../r.db",
            "r.db-journal",
        ] {
            let e = refuse_database_as_output(&d.join(out), "--out", &db).unwrap_err();
            assert!(matches!(e, LabError::OutputIsDatabase { .. }), "{out}: {e}");
        }
        let e = refuse_database_as_output(&d.join("dangling.html"), "--out", &d.join("later.db"))
            .unwrap_err();
        assert!(matches!(e, LabError::OutputIsDatabase { .. }), "{e}");
        assert!(refuse_database_as_output(&d.join("report.html"), "--out", &db).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
