//! The JSON field names the issues ask for are a contract: each command
//! named there, with `--json`, prints exactly one JSON object carrying
//! them. Short runs: this checks the shape, not the figures.

use std::process::Command;

use serde_json::Value;

fn run(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let mut objects = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
    let v = objects
        .next()
        .expect("one JSON object")
        .expect("valid JSON");
    assert!(objects.next().is_none(), "{args:?}: more than one object");
    assert!(v.is_object(), "{args:?}: not an object");
    v
}

fn number(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

/// A short `bench iova` against offset-allocator on `threads` threads.
fn bench_iova_on(threads: &str) -> Value {
    run(&[
        "bench",
        "iova",
        "--json",
        "--threads",
        threads,
        "--seconds",
        "0.05",
        "--rounds",
        "1",
        "--live",
        "256",
        "--impls",
        "offset-allocator",
    ])
}

#[test]
fn bench_iova() {
    let v = bench_iova_on("1");
    assert_eq!(v["bench"], "iova");
    assert_eq!(v["threads"], 1);
    let results = v["results"].as_array().expect("results");
    let names: Vec<_> = results
        .iter()
        .map(|r| r["impl"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"softiommu") && names.contains(&"offset-allocator"));
    for r in results {
        assert!(number(r, "ns_per_pair") > 0.0);
    }
}

#[test]
fn bench_dma() {
    let v = run(&["bench", "dma", "--json", "--iters", "3000"]);
    assert_eq!(v["bench"], "dma");
    assert_eq!(v["threads"], 1);
    assert_eq!(v["granule"], 1);
    let policies: Vec<_> = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            assert!(number(r, "map_ns") > 0.0 && number(r, "unmap_ns") > 0.0);
            r["policy"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(policies, ["passthrough", "strict", "deferred", "bounce"]);
}

#[test]
fn bench_ring() {
    let v = run(&[
        "bench",
        "ring",
        "--json",
        "--seconds",
        "0.2",
        "--rounds",
        "1",
    ]);
    assert_eq!(v["bench"], "ring");
    assert!(v.get("lab").is_none());
    let rows = v["rows"].as_array().expect("rows");
    for r in rows {
        for k in ["mpps", "cpu_pct", "us_per_pkt"] {
            assert!(number(r, k) >= 0.0, "{k}");
        }
        assert_eq!(r["device_errors"], 0, "the device verified every frame");
    }
    assert_eq!(rows.len(), 4);
}

#[test]
fn lab_netperf_udp() {
    let v = run(&[
        "lab",
        "netperf-udp",
        "--json",
        "--seconds",
        "0.1",
        "--rounds",
        "1",
    ]);
    assert_eq!(v["lab"], "netperf-udp");
    assert_eq!(v["stack"], "smoltcp");
    let rows = v["rows"].as_array().expect("rows");
    let policies: Vec<_> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["passthrough", "strict", "deferred", "bounce"]);
    for r in rows {
        assert_eq!(r["ordering"], "ordered");
        assert_eq!(r["msg_size"], 32);
        for k in [
            "tx_pps",
            "rx_pps",
            "drops",
            "driver_cpu_us_per_pkt",
            "device_cpu_us_per_pkt",
            "service_demand_vs_passthrough",
        ] {
            assert!(number(r, k) >= 0.0, "{k} in {r}");
        }
    }
    assert_eq!(rows[0]["service_demand_vs_passthrough"], 1.0);
}

#[test]
fn lab_iperf_tcp() {
    let v = run(&[
        "lab",
        "iperf-tcp",
        "--json",
        "--seconds",
        "0.1",
        "--rounds",
        "1",
        "--policies",
        "deferred",
    ]);
    assert_eq!(v["lab"], "iperf-tcp");
    let rows = v["rows"].as_array().expect("rows");
    let walks: Vec<_> = rows.iter().map(|r| r["walk"].as_str().unwrap()).collect();
    assert_eq!(walks, ["coherent", "non-coherent"]);
    for r in rows {
        assert_eq!(r["policy"], "deferred");
        assert_eq!(r["checksum_ok"], true);
        for k in [
            "mbit_s",
            "cpu_s_per_gb",
            "lines_flushed_per_gb",
            "flush_cpu_share",
        ] {
            assert!(number(r, k) >= 0.0, "{k} in {r}");
        }
    }
    assert_eq!(rows[0]["lines_flushed_per_gb"], 0.0);
    assert!(number(&rows[1], "lines_flushed_per_gb") > 0.0);
}

#[test]
fn lab_iova_aging() {
    let v = run(&[
        "lab",
        "iova-aging",
        "--json",
        "--seconds",
        "0.4",
        "--windows",
        "2",
        "--policies",
        "linux-2016,softiommu",
    ]);
    assert_eq!(v["lab"], "iova-aging");
    let policies = v["policies"].as_array().expect("policies");
    assert_eq!(policies.len(), 2);
    for p in policies {
        for k in [
            "first_window_mops",
            "last_window_mops",
            "retained",
            "peak_tree_nodes",
            "peak_cached_iovas",
        ] {
            assert!(number(p, k) >= 0.0, "{k}");
        }
    }
}

#[test]
fn bench_iova_on_two_threads_reports_scaling() {
    let v = bench_iova_on("2");
    assert_eq!(v["threads"], 2);
    let s = &v["softiommu_scaling"];
    assert!(number(s, "per_thread_throughput_ratio") > 0.0);
}
