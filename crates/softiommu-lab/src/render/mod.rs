//! Renderers of [`Report`](crate::report::Report)s: the terminal's tables
//! and the `--json` object. (The HTML report lives in `crate::html`.)

mod terminal;

pub use terminal::{format_cell, printable, render_report, render_table};

use crate::report::Report;

/// The `--json` output of a bench or lab: exactly one object, the report's
/// contract (the field names the issues fixed).
pub fn json(report: &Report) -> String {
    report.contract.to_string()
}
