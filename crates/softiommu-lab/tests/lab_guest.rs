//! `lab guest` without the guest kit: one line saying it was skipped and
//! why (a JSON object under `--json`), exit 0; a bad option: exit 2.

use std::process::Command;

fn lab_guest(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args(["lab", "guest"])
        .args(args)
        .env("SOFTIOMMU_GUEST_KIT", "/nonexistent/guest-kit")
        .output()
        .unwrap()
}

#[test]
fn without_the_kit_lab_guest_says_it_was_skipped_in_one_line() {
    let o = lab_guest(&[]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with("lab guest skipped: no guest kit at /nonexistent/guest-kit"),
        "{out}"
    );
    assert!(out.contains("scripts/guest-kit.sh"), "{out}");

    let o = lab_guest(&["--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["lab"], "guest");
    assert!(
        v["skipped"].as_str().unwrap().contains("no guest kit"),
        "{v}"
    );
}

#[test]
fn a_disk_size_out_of_range_exits_2() {
    let o = lab_guest(&["--mib", "4"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `run` with the real-guest scenario and no kit: the scenario prints one
/// line saying it was skipped and why, the run goes on and ends well, and
/// its JSON names the skip — never a silent pass.
#[test]
fn without_the_kit_the_real_guest_scenario_is_skipped_in_one_line_and_the_run_goes_on() {
    let d = std::env::temp_dir().join(format!("softiommu-lab-guest-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let db = d.join("r.db");
    let report = d.join("r.html");
    let o = Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args([
            "run",
            "--quick",
            "--json",
            "--scenarios",
            "real-guest,pgtable-flush",
        ])
        .arg("--db")
        .arg(&db)
        .arg("--report")
        .arg(&report)
        .env("SOFTIOMMU_GUEST_KIT", "/nonexistent/guest-kit")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let skips: Vec<&str> = err.lines().filter(|l| l.contains("SKIPPED")).collect();
    assert_eq!(skips.len(), 1, "{err}");
    assert!(
        skips[0].contains("real-guest SKIPPED: no guest kit at /nonexistent/guest-kit")
            && skips[0].contains("scripts/guest-kit.sh"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sc = v["scenarios"].as_array().unwrap();
    assert_eq!(sc.len(), 2, "{v}");
    assert_eq!(sc[0]["scenario"], "real-guest");
    assert!(
        sc[0]["skipped"].as_str().unwrap().contains("no guest kit"),
        "{v}"
    );
    assert!(sc[1]["skipped"].is_null(), "{v}");
    let _ = std::fs::remove_dir_all(&d);
}
