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
