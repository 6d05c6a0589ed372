//! Records the git revision the binary is built from as
//! `SOFTIOMMU_GIT_REV` (`unknown` outside a checkout or without git;
//! `-dirty` when tracked files differ from it at build time), so that a
//! run stores the source that measured it, wherever it is started from.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let o = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let rev = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{rev}-dirty")
            } else {
                rev
            }
        }
        None => "unknown".to_string(),
    };
    println!("cargo:rustc-env=SOFTIOMMU_GIT_REV={rev}");
    // Run again when HEAD moves (a commit, a checkout) or the index
    // changes (files staged): the files git keeps that say so.
    for what in ["HEAD", "index"] {
        if let Some(p) = git(&["rev-parse", "--git-path", what]) {
            watch(&p);
        }
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &r]) {
            watch(&p);
        }
    }
    if let Some(p) = git(&["rev-parse", "--git-path", "packed-refs"]) {
        watch(&p);
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// Asks cargo to run this again when the file git named changes (a file
/// that does not exist is not named: cargo would run this every build).
fn watch(p: &str) {
    let p = abs(p);
    if std::path::Path::new(&p).exists() {
        println!("cargo:rerun-if-changed={p}");
    }
}

/// A path git printed, made absolute against the manifest directory.
fn abs(p: &str) -> String {
    let path = std::path::Path::new(p);
    if path.is_absolute() {
        return p.to_string();
    }
    std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join(path)
        .display()
        .to_string()
}
