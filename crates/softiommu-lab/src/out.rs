//! Standard output: every command's tables and JSON are written through
//! here, so that a write that fails (a full disk, `> /dev/full`; a closed
//! pipe, `| head -1`) is an error the command reports, never a panic.

use std::io::Write;

use crate::error::{LabError, LabResult};

/// Writes `text` to standard output and flushes it.
pub fn print(text: &str) -> LabResult<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .map_err(|source| LabError::Stdout { source })
}

/// Writes `text` and a newline to standard output.
pub fn println(text: &str) -> LabResult<()> {
    print(&format!("{text}\n"))
}
