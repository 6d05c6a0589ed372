//! The HTML report: one self-contained file (inline CSS and SVG, no
//! fetches) per stored run. Per seed, their table beside ours and our
//! plots; the parameters and latency model in force; which figures are
//! modelled; sparklines of each seed's figure across the stored runs.

mod escape;
mod page;
mod svg;

use std::path::Path;

use crate::error::{LabError, LabResult};
use crate::store::Store;

pub use page::{render, PageData};

/// Writes the report of run `run_id` to `out` (named by the option
/// `flag` in errors) atomically: a new file renamed over `out`, so a write
/// that fails keeps the old report whole.
pub fn write(store: &Store, run_id: i64, out: &Path, flag: &'static str) -> LabResult<()> {
    let data = PageData::load(store, run_id)?;
    let html = render(&data);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| LabError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    crate::cmd::out_path::write_atomically(out, flag, html.as_bytes())
}

#[cfg(test)]
mod tests;
