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

/// Fails as the final write of `out` (given as `flag`) would, before any
/// work. A path that exists and is not a regular file or a directory (a
/// FIFO, a device, a socket; links followed) is refused unopened: opening
/// a FIFO for writing would block until a reader came, and the report is
/// written by renaming a new file over `out`. Then, as the final write
/// does, the directories are created and a temporary file beside `out` is
/// created and removed again, and an existing `out` is opened for writing
/// without truncating (it keeps its bytes). A directory, a path under
/// `/proc`, a read-only file or file system is refused here rather than
/// after a suite has run.
pub fn check_writable(out: &Path, flag: &'static str) -> LabResult<()> {
    let fail = |source| LabError::Write {
        path: out.to_path_buf(),
        source,
    };
    if out.is_dir() {
        return Err(fail(std::io::Error::from_raw_os_error(libc::EISDIR)));
    }
    if let Some(kind) = non_regular(out) {
        return Err(LabError::OutputNotAFile {
            flag,
            out: out.to_path_buf(),
            kind,
        });
    }
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| LabError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    if out.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .map(drop)
            .map_err(fail)?;
    }
    let tmp = temp_beside(out);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(fail)?;
    std::fs::remove_file(&tmp).map_err(fail)
}

/// Refuses an output `out` (given as `flag`) that exists and is a FIFO,
/// a device or a socket, without opening it (a cheap first look, before
/// anything is created; [`check_writable`] makes it too).
pub fn refuse_non_regular(out: &Path, flag: &'static str) -> LabResult<()> {
    match non_regular(out) {
        Some(kind) => Err(LabError::OutputNotAFile {
            flag,
            out: out.to_path_buf(),
            kind,
        }),
        None => Ok(()),
    }
}

/// What `p` is when it exists and is neither a regular file nor a
/// directory (looked at with `metadata`, which never opens it).
fn non_regular(p: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(p).ok()?.file_type();
    if t.is_file() || t.is_dir() {
        None
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device")
    } else {
        Some("not a regular file")
    }
}

/// The temporary file an output `out` is written to before it is renamed
/// over `out`: in the same directory (a rename never crosses file
/// systems), hidden, named after this process.
pub fn temp_beside(out: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(
        out.file_name()
            .unwrap_or_else(|| std::ffi::OsStr::new("out")),
    );
    name.push(format!(".tmp-{}", std::process::id()));
    out.with_file_name(name)
}

/// Writes `bytes` to `out` atomically: into [`temp_beside`] first, then
/// renamed over `out` (over the file a symbolic link names, when `out` is
/// one). A write that fails (a full disk) removes the temporary file and
/// leaves the old `out` as it was; a non-regular existing `out` is
/// refused unopened.
pub fn write_atomically(out: &Path, flag: &'static str, bytes: &[u8]) -> LabResult<()> {
    use std::io::Write;
    if let Some(kind) = non_regular(out) {
        return Err(LabError::OutputNotAFile {
            flag,
            out: out.to_path_buf(),
            kind,
        });
    }
    let fail = |source| LabError::Write {
        path: out.to_path_buf(),
        source,
    };
    let target = match std::fs::symlink_metadata(out) {
        Ok(m) if m.file_type().is_symlink() => resolve(out).unwrap_or_else(|| out.to_path_buf()),
        _ => out.to_path_buf(),
    };
    let tmp = temp_beside(&target);
    let r = std::fs::File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, &target));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
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
        assert!(matches!(check_writable(&kept, "--out"), Ok(())));
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "old");
        let fresh = d.join("sub").join("new.html");
        assert!(matches!(check_writable(&fresh, "--out"), Ok(())));
        assert!(!fresh.exists());
        let e = check_writable(&d, "--out").unwrap_err();
        assert!(
            matches!(&e, LabError::Write { path, source } if path == &d && source.raw_os_error() == Some(libc::EISDIR)),
            "{e}"
        );
        let e = check_writable(Path::new("/proc/softiommu-x.html"), "--out").unwrap_err();
        assert!(matches!(e, LabError::Write { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A FIFO (opening it to write would block until a reader came) or a
    /// device is refused unopened, in one typed error, by the check and by
    /// the write itself.
    #[test]
    fn a_fifo_or_a_device_as_the_output_is_refused_unopened() {
        let d = std::env::temp_dir().join(format!("softiommu-ofifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        for out in [fifo.as_path(), Path::new("/dev/full")] {
            let e = check_writable(out, "--out").unwrap_err();
            assert!(
                matches!(&e, LabError::OutputNotAFile { flag: "--out", out: o, kind } if o == out && (*kind == "a FIFO" || *kind == "a device")),
                "{e}"
            );
            let e = write_atomically(out, "--report", b"x").unwrap_err();
            assert!(
                matches!(
                    e,
                    LabError::OutputNotAFile {
                        flag: "--report",
                        ..
                    }
                ),
                "{e}"
            );
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The report replaces the old one whole, or not at all: a write that
    /// fails leaves the old bytes.
    #[test]
    fn a_failed_write_keeps_the_old_output() {
        let d = std::env::temp_dir().join(format!("softiommu-oatomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let out = d.join("report.html");
        std::fs::write(&out, "old").unwrap();
        write_atomically(&out, "--out", b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        // The rename cannot replace a non-empty directory at the temporary
        // file's target: make the final step fail.
        let blocked = d.join("blocked.html");
        std::fs::write(&blocked, "old").unwrap();
        let tmp = temp_beside(&blocked);
        std::fs::create_dir_all(tmp.join("x")).unwrap();
        let e = write_atomically(&blocked, "--out", b"new").unwrap_err();
        assert!(
            matches!(&e, LabError::Write { path, .. } if path == &blocked),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&blocked).unwrap(), "old");
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
