//! The stress lab's checker catches a real violation: with the test-only
//! fault injected (the CPU threads record one unmap in 16 as returned,
//! then really unmap it 64 operations later, as a library whose unmap
//! returned before revoking would), a strict run must report violations,
//! name the first offending access on one stderr line, and exit 1.

use std::process::Command;

use serde_json::Value;

#[test]
fn an_unmap_recorded_before_it_revokes_is_reported_as_a_violation() {
    let out = Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args([
            "lab",
            "stress",
            "--json",
            // Long enough for slots to reach the injected generations on
            // a loaded machine (each success is also looked up once more
            // for the frame it landed in).
            "--seconds",
            "1.5",
            "--slots",
            "8",
            "--policies",
            "strict",
            "--switching",
            "0",
            // Strict only: the deferred bound phase has stale accesses.
            "--bound",
            "0",
            "--inject-late-unmap",
        ])
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["violations"].as_u64().unwrap_or(0) > 0, "{v}");
    assert_eq!(v["stale_accesses"], 0, "strict permits no stale access");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("softiommu: "), "{stderr}");
    assert!(
        lines[0].contains("violation(s); the first: phase strict"),
        "{stderr}"
    );
    // The injected late unmap shows either as an access after the unmap
    // returned, or as a read of the page once its owner rewrote it (no
    // longer a tag): which the device met first depends on scheduling.
    // Strict without the injection has neither (`lab stress`'s own runs).
    assert!(
        lines[0].contains("AfterUnmap") || lines[0].contains("Untagged"),
        "{stderr}"
    );
}
