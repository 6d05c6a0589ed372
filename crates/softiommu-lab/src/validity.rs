//! Whether a report's figures measure what they claim: a lab whose
//! workload failed part of its work (a back-end's I/O errors, reads that
//! came back wrong) marks its contract `"valid": false` with a `"why"`,
//! and the command exits 1 after printing it.

use crate::report::Report;

/// Why the report's figures are invalid, or `None` when they stand (a
/// contract without `valid` stands).
pub fn invalid(r: &Report) -> Option<String> {
    if r.contract.get("valid").and_then(|v| v.as_bool()) != Some(false) {
        return None;
    }
    Some(
        r.contract
            .get("why")
            .and_then(|w| w.as_str())
            .unwrap_or("(no reason recorded)")
            .to_string(),
    )
}
