//! `softiommu lab viommu --json`: the contract object of the lab
//! (`lab`, and per row `device`, `mode`, `pct_of_none`,
//! `driver_cpu_us_per_io`, `requests_per_io`, `notifications_per_io`,
//! `invalidations_per_io`), on a short run: the shape and the counts a
//! mode implies, not the timings — for the storage rows (`virtio-blk/…`)
//! and the UDP stream's (`virtio-net/udp-32B`, an I/O being one datagram
//! delivered).

use std::process::Command;

use serde_json::Value;

fn softiommu(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args(args)
        .output()
        .expect("the binary runs")
}

#[test]
fn lab_viommu_json_has_the_contract_fields() {
    let out = softiommu(&[
        "lab", "viommu", "--json", "--ios", "200", "--rounds", "1", "--depth", "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["lab"], "viommu");
    assert_eq!(v["exit_us"].as_f64(), Some(3.0));
    assert_eq!(v["device_model_us"].as_f64(), Some(80.0));
    let rows = v["rows"].as_array().expect("rows");
    // Three storage jobs (null, the ssd's IOPS job, the ssd's bandwidth
    // job) and the UDP stream, three modes each.
    assert_eq!(rows.len(), 12);
    // The ssd target rows run fio's bandwidth shape, 128 KiB at depth
    // 16, whatever --bs and --depth say (those shape the null and IOPS
    // rows); each row says its shape.
    assert_eq!(v["bw_bs"].as_u64(), Some(131_072));
    assert_eq!(v["bw_depth"].as_u64(), Some(16));
    for r in rows {
        let shape = (r["bs"].as_u64(), r["depth"].as_u64());
        match r["device"].as_str().expect("device") {
            "virtio-blk/ssd-80us-3500MBps" => assert_eq!(shape, (Some(131_072), Some(16))),
            "virtio-blk/null" | "virtio-blk/ssd-80us-3500MBps/iops" => {
                assert_eq!(shape, (Some(4096), Some(2)))
            }
            _ => assert!(shape.0.is_some() && shape.1.is_some(), "{r}"),
        }
    }
    let udp = rows
        .iter()
        .filter(|r| r["device"] == "virtio-net/udp-32B")
        .count();
    assert_eq!(udp, 3, "none, strict and lazy of the UDP stream");
    for r in rows {
        for key in [
            "pct_of_none",
            "driver_cpu_us_per_io",
            "requests_per_io",
            "notifications_per_io",
            "invalidations_per_io",
            "driver_wait_cpu_us_per_io",
            "device_us_per_io",
            "pct_of_none_min",
            "pct_of_none_median",
            "pct_of_none_max",
        ] {
            assert!(r[key].as_f64().is_some(), "{key} in {r}");
        }
        // The spread over the run's slices, each against none's beside
        // it: ordered, over at least one slice, none's all 100.
        let sp = |k: &str| r[k].as_f64().unwrap();
        assert!(r["spread_slices"].as_u64().is_some_and(|n| n >= 1), "{r}");
        assert!(
            sp("pct_of_none_min") <= sp("pct_of_none_median")
                && sp("pct_of_none_median") <= sp("pct_of_none_max"),
            "{r}"
        );
        if r["mode"] == "none" {
            assert_eq!(
                (sp("pct_of_none_min"), sp("pct_of_none_max")),
                (100.0, 100.0),
                "{r}"
            );
        }
        let device = r["device"].as_str().expect("device");
        assert!(
            device == "virtio-blk/null"
                || device == "virtio-blk/ssd-80us-3500MBps"
                || device == "virtio-blk/ssd-80us-3500MBps/iops"
                || device == "virtio-net/udp-32B"
        );
        assert!(r["valid"].as_bool().is_some(), "valid in {r}");
        let per = |k: &str| r[k].as_f64().unwrap();
        if device == "virtio-net/udp-32B" {
            udp_counts(r, &per);
            continue;
        }
        match r["mode"].as_str().expect("mode") {
            "none" => {
                assert_eq!(per("pct_of_none"), 100.0);
                assert_eq!(per("requests_per_io"), 0.0);
            }
            // Three buffers per read: three MAPs and three UNMAPs, each
            // its own notification; three invalidations.
            "strict" => {
                assert_eq!(per("requests_per_io"), 6.0);
                assert_eq!(per("notifications_per_io"), 6.0);
                assert_eq!(per("invalidations_per_io"), 3.0);
            }
            // One notification per read's map sync (and the final flush).
            "lazy" => {
                assert_eq!(per("requests_per_io"), 6.0);
                assert!(per("notifications_per_io") < 1.1, "{r}");
                assert!(per("invalidations_per_io") <= 1.0, "{r}");
            }
            m => panic!("mode {m}"),
        }
    }
}

/// Per datagram delivered: strict a MAP (posted) and an UNMAP
/// (reclaimed), each its own notification, and one invalidation per
/// UNMAP; lazy the same requests with one notification per map sync
/// (and the flushes), the UNMAPs of a flush one invalidation; none no
/// request.
fn udp_counts(r: &Value, per: &dyn Fn(&str) -> f64) {
    match r["mode"].as_str().expect("mode") {
        "none" => {
            assert_eq!(per("pct_of_none"), 100.0);
            assert_eq!(per("requests_per_io"), 0.0);
            assert_eq!(per("notifications_per_io"), 0.0);
        }
        "strict" => {
            assert_eq!(per("requests_per_io"), 2.0);
            assert_eq!(per("notifications_per_io"), 2.0);
            assert_eq!(per("invalidations_per_io"), 1.0);
        }
        "lazy" => {
            assert_eq!(per("requests_per_io"), 2.0);
            assert!(per("notifications_per_io") < 1.1, "{r}");
            assert!(per("invalidations_per_io") < 0.1, "{r}");
        }
        m => panic!("mode {m}"),
    }
}

#[test]
fn lab_viommu_refuses_a_bad_depth_in_one_line() {
    let out = softiommu(&["lab", "viommu", "--depth", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn lab_viommu_refuses_a_bad_exit_cost_in_one_line() {
    for bad in ["--exit-us=-1", "--exit-us=1001", "--exit-us=nan"] {
        let out = softiommu(&["lab", "viommu", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{bad}: {err}");
    }
}

/// The bandwidth job's shape is checked as `--bs` and `--depth` are:
/// one line naming the allowed values, exit 2, nothing run.
#[test]
fn lab_viommu_refuses_a_bad_bandwidth_shape_in_one_line() {
    for (bad, allowed) in [
        (["--bw-bs", "1000"], "4096..=131072"),
        (["--bw-bs", "256k"], "4096..=131072"),
        (["--bw-depth", "0"], "1..=32"),
        (["--bw-depth", "33"], "1..=32"),
    ] {
        let out = softiommu(&["lab", "viommu", bad[0], bad[1]]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{bad:?}: {err}");
        assert!(err.contains(allowed), "{bad:?}: {err}");
    }
}
