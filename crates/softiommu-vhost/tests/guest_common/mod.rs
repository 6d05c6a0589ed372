//! What both real-guest tests share: one guest at a time, lines written
//! past the harness's capture, and finding the kit (a missing kit is one
//! `SKIPPED` line, or a failure under `SOFTIOMMU_GUEST_REQUIRED=1`).

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use softiommu_vhost::guest::GuestKit;

/// One guest at a time: the machine has few cores and TCG is CPU-bound.
pub static ONE_GUEST: Mutex<()> = Mutex::new(());

/// The longest a guest run may take before it is stopped.
pub const GUEST_DEADLINE: Duration = Duration::from_secs(600);

/// Writes past the test harness's capture, so the log shows it.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The guest kit, or `None` after one line saying how to get it; with
/// `SOFTIOMMU_GUEST_REQUIRED=1` (as CI sets) a missing kit fails.
pub fn kit() -> Option<GuestKit> {
    match GuestKit::find() {
        Ok(k) => Some(k),
        Err(e) => {
            if std::env::var("SOFTIOMMU_GUEST_REQUIRED").is_ok_and(|v| v == "1") {
                panic!("{e} — and SOFTIOMMU_GUEST_REQUIRED=1");
            }
            say(&format!("SKIPPED guest test: {e}"));
            None
        }
    }
}
