//! What both real-guest tests share: one guest at a time, lines written
//! past the harness's capture, and finding the kit (a missing kit is one
//! `SKIPPED` line, or a failure under `SOFTIOMMU_GUEST_REQUIRED=1`).

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use softiommu_vhost::guest::{GuestKit, IommuMode};
use softiommu_vhost::{SessionEnd, SessionReport};

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

/// What every guest run must show on its side: the kernel's version line,
/// its IOMMU enabled, and a result line saying so under `mode`'s policy.
/// `field` reads the result line's `key=value` fields.
pub fn assert_booted<'a>(
    dmesg: &[String],
    result: &str,
    field: impl Fn(&str) -> Option<&'a str>,
    mode: IommuMode,
) {
    assert!(
        dmesg.iter().any(|l| l.contains("Linux version")),
        "{dmesg:?}"
    );
    assert!(
        dmesg.iter().any(|l| l.contains("DMAR: IOMMU enabled")),
        "{dmesg:?}"
    );
    assert_eq!(field("dmar"), Some("1"), "{result}");
    assert_eq!(field("policy"), Some(mode.name()), "{result}");
}

/// What every guest run must show on the back-end's side: the session
/// ended by the front-end's disconnect, no message refused, and the device
/// IOTLB fed by updates, misses and invalidations with no miss timed out.
pub fn assert_session(rep: &SessionReport) {
    assert!(matches!(rep.end, SessionEnd::Disconnected), "{:?}", rep.end);
    assert_eq!(rep.rejected_messages, 0, "{:?}", rep.last_rejection);
    let s = &rep.iotlb;
    assert!(
        s.updates > 0 && s.misses > 0 && s.invalidations > 0,
        "{s:?}"
    );
    assert_eq!(s.miss_timeouts, 0, "{s:?}");
}
