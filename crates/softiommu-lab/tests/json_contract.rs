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
    bench_iova_with(threads, "offset-allocator")
}

/// A short `bench iova` beside `imp` on `threads` threads.
fn bench_iova_with(threads: &str, imp: &str) -> Value {
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
        imp,
    ])
}

#[test]
fn bench_iova_runs_the_floor_of_its_design_when_asked() {
    for imp in ["magazine-floor", "owner-store-floor", "contract-floor"] {
        let v = bench_iova_with("1", imp);
        let results = v["results"].as_array().expect("results");
        let floor = results
            .iter()
            .find(|r| r["impl"] == imp)
            .unwrap_or_else(|| panic!("a {imp} row"));
        assert!(number(floor, "ns_per_pair") > 0.0, "{imp}");
        assert_eq!(floor["pairs_per_call"], 1, "{imp}");
    }
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
        assert!(number(r, "cpu_ns_per_pair") > 0.0);
        assert!(r["ns_per_pair_spread"].is_null(), "one round: no spread");
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
            assert!(r["valid"].is_boolean(), "{r}");
            // Counted only with --instructions.
            assert!(r["instructions_per_pair"].is_null(), "{r}");
            assert_eq!(r.get("why").is_some(), r["valid"] == false, "{r}");
            r["policy"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(policies, ["passthrough", "strict", "deferred", "bounce"]);
    assert_eq!(v["instructions_source"], "none");
}

/// `bench dma --instructions`: `instructions_per_pair` for every policy
/// asked, counted by callgrind, and each policy's figure over
/// pass-through's beside it, pass-through's the lower (a policy cheaper
/// than doing nothing would be a measurement bug). Needs valgrind: where
/// `.ci/run` found or installed it (`SOFTIOMMU_VALGRIND_REQUIRED`), its
/// absence fails the test.
#[test]
fn bench_dma_instructions() {
    let have = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var_os("SOFTIOMMU_VALGRIND_REQUIRED").is_none(),
            "valgrind is required here and missing"
        );
        eprintln!("SKIPPED: bench dma --instructions needs valgrind");
        return;
    }
    let v = run(&[
        "bench",
        "dma",
        "--json",
        "--instructions",
        "--iters",
        "2000",
        "--policies",
        "passthrough,deferred",
    ]);
    assert_eq!(v["instructions_source"], "callgrind");
    let rows = v["results"].as_array().expect("results");
    assert_eq!(rows.len(), 2, "{v}");
    let (pt, deferred) = (&rows[0], &rows[1]);
    assert_eq!(
        (&pt["policy"], &deferred["policy"]),
        (&"passthrough".into(), &"deferred".into())
    );
    let (p, d) = (
        number(pt, "instructions_per_pair"),
        number(deferred, "instructions_per_pair"),
    );
    assert!(p > 0.0 && d > p, "pass-through {p}, deferred {d}");
    assert_eq!(number(pt, "instructions_over_passthrough"), 0.0);
    assert!((number(deferred, "instructions_over_passthrough") - (d - p)).abs() < 1e-9);
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
    assert_eq!(v["msg_size"], 32);
    let rows = v["rows"].as_array().expect("rows");
    for r in rows {
        for k in ["mpps", "cpu_pct", "us_per_pkt", "device_busy_pct"] {
            assert!(number(r, k) >= 0.0, "{k}");
        }
        assert!(number(r, "packets") > 0.0, "{r}");
        assert_eq!(r["device_errors"], 0, "the device verified every frame");
        let deferred = r["policy"] == "deferred";
        assert_eq!(r.get("stale_window_ms_max").is_some(), deferred, "{r}");
        if deferred {
            // The window ends at the earlier of the flush's completion and
            // the expiry deadline, 3/4 of the default 10 ms timeout.
            assert!(number(r, "stale_window_ms_max") <= 7.5 + 1e-6, "{r}");
        }
        assert_eq!(r.get("flushes").is_some(), deferred, "{r}");
        assert!(r["us_per_pkt_spread"].is_null(), "one round: no spread");
        assert!(r["valid"].is_boolean(), "{r}");
    }
    let policies: Vec<_> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["passthrough", "strict", "deferred", "bounce"]);
}

/// The fields every `lab netperf-udp` row has carried.
const NETPERF_ROW: [&str; 9] = [
    "policy",
    "ordering",
    "msg_size",
    "tx_pps",
    "rx_pps",
    "drops",
    "driver_cpu_us_per_pkt",
    "device_cpu_us_per_pkt",
    "service_demand_vs_passthrough",
];

#[test]
fn lab_netperf_udp() {
    let v = run(&[
        "lab",
        "netperf-udp",
        "--json",
        "--seconds",
        "0.2",
        "--rounds",
        "1",
    ]);
    assert_eq!(v["lab"], "netperf-udp");
    assert_eq!(v["stack"], "smoltcp");
    let rows = v["rows"].as_array().expect("rows");
    let policies: Vec<_> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["passthrough", "strict", "deferred", "bounce"]);
    for r in rows {
        for k in NETPERF_ROW {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
        assert_eq!(r["ordering"], "ordered");
        assert_eq!(r["msg_size"], 32);
        for k in &NETPERF_ROW[3..] {
            assert!(number(r, k) >= 0.0, "{k} in {r}");
        }
        assert!(
            number(r, "tx_pps") > 0.0 && number(r, "rx_pps") > 0.0,
            "{r}"
        );
        assert!(number(r, "driver_cpu_us_per_pkt") > 0.0, "{r}");
        assert!(r["drops"].is_u64(), "drops is a count: {r}");
        let deferred = r["policy"] == "deferred";
        assert_eq!(r.get("stale_window_ms_max").is_some(), deferred, "{r}");
        assert_eq!(r.get("stale_completion_ms_max").is_some(), deferred, "{r}");
        if deferred {
            // The window ends at the earlier of the flush's completion and
            // the expiry deadline, 3/4 of the default 10 ms timeout.
            let stale = number(r, "stale_window_ms_max");
            assert!(stale <= 7.5 + 1e-6, "{r}");
            assert!(stale <= number(r, "stale_completion_ms_max"), "{r}");
        }
        assert!(number(r, "timer_wakeups_per_s") >= 0.0, "{r}");
        // Service demand as netperf defines it, at one common rate.
        let sd = number(r, "service_demand_us_per_pkt");
        let spread = &r["service_demand_spread"];
        let (lo, med, hi) = (
            number(spread, "min"),
            number(spread, "median"),
            number(spread, "max"),
        );
        assert!(0.0 < lo && lo <= med && med <= hi && med == sd, "{r}");
        // Each round's figure, in the order the rounds ran: the pairs
        // behind the ratio to pass-through.
        let per_round = r["service_demand_rounds"].as_array().expect("rounds");
        assert_eq!(Some(per_round.len() as u64), v["rounds"].as_u64(), "{r}");
        assert!(per_round.iter().any(|x| x.as_f64() == Some(sd)), "{r}");
        // The timers' share is inside it.
        assert!(sd >= number(r, "flush_cpu_us_per_pkt"), "{r}");
        assert!(number(r, "flush_cpu_us_per_pkt") >= 0.0, "{r}");
        // The modelled IOMMU's inline work is apart: pass-through runs no
        // queue pass at all, strict one per unmap.
        let unit = number(r, "unit_inline_cpu_us_per_pkt");
        assert!(unit >= 0.0, "{r}");
        match r["policy"].as_str() {
            Some("passthrough") => assert_eq!(unit, 0.0, "{r}"),
            Some("strict") => assert!(unit > 0.0, "{r}"),
            _ => {}
        }
        assert_eq!(r["offered_pps"], v["offered_pps"], "one rate for all: {r}");
        assert!(r["valid"].is_boolean(), "{r}");
        assert_eq!(r.get("why").is_some(), r["valid"] == false, "{r}");
    }
    assert!(number(&v, "offered_pps") > 0.0);
    assert!(number(&v, "pace_period_ms") > 0.0);
    assert_eq!(rows[0]["service_demand_vs_passthrough"], 1.0);
    // The full-speed pass: each policy's maximum, apart.
    let full = v["full_speed"].as_array().expect("full_speed");
    let policies: Vec<_> = full.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["passthrough", "strict", "deferred", "bounce"]);
    for r in full {
        assert!(r["offered_pps"].is_null(), "{r}");
        assert!(number(r, "rx_pps_max") >= number(&v, "offered_pps"), "{r}");
        assert!(number(r, "service_demand_us_per_pkt") > 0.0, "{r}");
    }
}

#[test]
fn lab_netperf_udp_orderings_and_sizes() {
    let v = run(&[
        "lab",
        "netperf-udp",
        "--json",
        "--seconds",
        "0.1",
        "--rounds",
        "1",
        "--msg-size",
        "16384",
        "--ordering",
        "relaxed,full",
        "--policies",
        "passthrough,deferred",
        "--placement",
        "os",
    ]);
    assert_eq!(v["placement"], "os");
    let rows = v["rows"].as_array().expect("rows");
    let cells: Vec<_> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["msg_size"], 16384);
            if number(r, "tx_pps") > 0.0 {
                assert!(number(r, "frames_per_packet") >= 2.0, "fragmented: {r}");
            } else {
                // A 0.1 s window on a loaded machine can end before a
                // policy's first 16 KiB datagram is out (the common rate
                // then falls to its floor, 1 a second): the row says so.
                assert!(
                    r["valid"] == false
                        && r["why"]
                            .as_str()
                            .is_some_and(|w| w.starts_with("measurement invalid")),
                    "a row that sent nothing is not valid: {r}"
                );
            }
            format!(
                "{}/{}",
                r["policy"].as_str().unwrap(),
                r["ordering"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        cells,
        [
            "passthrough/relaxed",
            "deferred/relaxed",
            "passthrough/full",
            "deferred/full"
        ]
    );
}

#[test]
fn lab_iperf_tcp() {
    let v = run(&[
        "lab",
        "iperf-tcp",
        "--json",
        "--seconds",
        "0.2",
        "--rounds",
        "1",
    ]);
    assert_eq!(v["lab"], "iperf-tcp");
    assert!(
        v["flush_share_method"]
            .as_str()
            .is_some_and(|m| m.starts_with("estimated")),
        "{v}"
    );
    let rows = v["rows"].as_array().expect("rows");
    let cells: Vec<_> = rows
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["walk"].as_str().unwrap(),
                r["policy"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        cells,
        [
            "coherent/strict",
            "coherent/deferred",
            "non-coherent/strict",
            "non-coherent/deferred"
        ]
    );
    for r in rows {
        for k in [
            "walk",
            "policy",
            "mbit_s",
            "cpu_s_per_gb",
            "lines_flushed_per_gb",
            "flush_cpu_share",
            "checksum_ok",
            "saturated_vs_coherent",
            "saturated_vs_coherent_spread",
            "saturated_vs_coherent_interval",
            "wait_cpu_s_per_gb",
        ] {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
        // The drivers' waits are a CPU figure of their own, apart.
        assert!(number(r, "wait_cpu_s_per_gb") >= 0.0, "{r}");
        // One round: no spread and no interval to judge by.
        assert!(r["saturated_vs_coherent_interval"].is_null(), "{r}");
        assert_eq!(r["checksum_ok"], true);
        for k in ["mbit_s", "cpu_s_per_gb"] {
            assert!(number(r, k) > 0.0, "{k} in {r}");
        }
        let share = number(r, "flush_cpu_share");
        assert!((0.0..=1.0).contains(&share), "{r}");
        if r["walk"] == "coherent" {
            assert_eq!(r["lines_flushed_per_gb"], 0.0);
            assert_eq!(share, 0.0);
        } else {
            assert!(number(r, "lines_flushed_per_gb") > 0.0, "{r}");
        }
        // The modelled IOMMU's inline work, apart from driver CPU: strict
        // runs a queue pass per unmap.
        let unit = number(r, "unit_inline_cpu_s_per_gb");
        assert!(unit >= 0.0, "{r}");
        if r["policy"] == "strict" {
            assert!(unit > 0.0, "{r}");
        }
    }
}

#[test]
fn lab_iova_aging() {
    let v = run(&[
        "lab",
        "iova-aging",
        "--json",
        // Long enough that each window holds the allocator's CPU time on
        // a loaded machine (at 0.4 s in 8 windows, a loaded run left no
        // window past the warm-up with any).
        "--seconds",
        "1.2",
        "--windows",
        "8",
        "--policies",
        "linux-2016,softiommu",
    ]);
    assert_eq!(v["lab"], "iova-aging");
    let policies = v["policies"].as_array().expect("policies");
    assert_eq!(policies.len(), 2);
    for p in policies {
        for k in [
            "warmup_s",
            "retained",
            "stability",
            "iops_first",
            "iops_last",
            "first_window_mops",
            "last_window_mops",
            "peak_tree_nodes",
            "peak_cached_iovas",
        ] {
            assert!(number(p, k) >= 0.0, "{k}");
        }
        assert!(number(p, "stability") <= 1.0, "{p}");
        assert!(p["settled"].is_boolean());
        cpu_time_aging_fields(p);
        let paired = vs_fresh_fields(p);
        let w = p["windows"].as_array().expect("windows");
        assert_eq!(w.len(), 8);
        assert!(number(&w[0], "iops") >= 0.0);
        for w in w {
            assert!(number(w, "cpu_s") >= 0.0, "{w}");
            assert!(number(w, "mops_per_cpu_s") >= 0.0, "{w}");
            assert!(number(w, "fresh_cpu_s") >= 0.0, "{w}");
            if paired {
                assert!(number(w, "fresh_mops_per_cpu_s") > 0.0, "{w}");
                let r = number(w, "paired_mops_per_cpu_s") / number(w, "fresh_mops_per_cpu_s");
                assert!((number(w, "vs_fresh") - r).abs() < 1e-9, "{w}");
            }
        }
    }
}

/// An aging row's headline against its fresh control arm (both aging
/// labs): every field present; a debug build on a loaded machine (this
/// test runs beside the others of the file) may run a fresh arm in too
/// few of the short windows for a figure — null then, never absent; when
/// present, consistent: `retained_vs_fresh` is the last ÷ first quarter
/// of aged ÷ fresh. Whether the row has its paired figure.
fn vs_fresh_fields(p: &Value) -> bool {
    for k in [
        "retained_vs_fresh",
        "stability_vs_fresh",
        "warmup_vs_fresh_s",
        "vs_fresh_first",
        "vs_fresh_last",
        "fresh_ops_per_cpu_s_first",
        "fresh_ops_per_cpu_s_last",
        "retained_fresh",
        "settled_vs_fresh",
    ] {
        assert!(p.get(k).is_some(), "{k} missing in {p}");
    }
    assert!(number(p, "fresh_lives") >= 1.0, "{p}");
    if p["retained_vs_fresh"].is_null() {
        return false;
    }
    for k in [
        "retained_vs_fresh",
        "stability_vs_fresh",
        "warmup_vs_fresh_s",
        "vs_fresh_first",
        "vs_fresh_last",
        "fresh_ops_per_cpu_s_first",
        "fresh_ops_per_cpu_s_last",
        "retained_fresh",
    ] {
        assert!(number(p, k) >= 0.0, "{k} in {p}");
    }
    assert!(number(p, "fresh_ops_per_cpu_s_first") > 0.0, "{p}");
    assert!(number(p, "stability_vs_fresh") <= 1.0, "{p}");
    assert!(p["settled_vs_fresh"].is_boolean(), "{p}");
    let ratio = number(p, "vs_fresh_last") / number(p, "vs_fresh_first");
    assert!((number(p, "retained_vs_fresh") - ratio).abs() < 1e-9, "{p}");
    true
}

/// The aging figure on CPU time (`retained`, `stability`) and on the
/// wall clock beside it, as both aging labs report it per policy.
fn cpu_time_aging_fields(p: &Value) {
    for k in [
        "ops_per_cpu_s_first",
        "ops_per_cpu_s_last",
        "retained_wall",
        "stability_wall",
        "warmup_wall_s",
        "cpu_floor_s",
        "cpu_merged_windows",
    ] {
        assert!(number(p, k) >= 0.0, "{k} in {p}");
    }
    assert!(number(p, "ops_per_cpu_s_first") > 0.0, "{p}");
    assert!(number(p, "stability_wall") <= 1.0, "{p}");
    assert!(p["settled_wall"].is_boolean(), "{p}");
    // `retained` is the CPU-time figure: last ÷ first quarter per CPU-second.
    let ratio = number(p, "ops_per_cpu_s_last") / number(p, "ops_per_cpu_s_first");
    assert!((number(p, "retained") - ratio).abs() < 1e-9, "{p}");
}

#[test]
fn lab_fio_aging() {
    let v = run(&[
        "lab",
        "fio-aging",
        "--json",
        "--seconds",
        "0.8",
        "--windows",
        "8",
        "--dma-seconds",
        "0.2",
        "--jobs",
        "2",
        "--disk-mib",
        "64",
        "--policies",
        "linux-2016,softiommu",
    ]);
    assert_eq!(v["lab"], "fio-aging");
    assert_eq!(v["device"], "virtio-blk");
    assert_eq!(v["backend"], "null");
    assert_eq!(v["jobs"], 2);
    // How aging is accelerated is part of the report.
    assert_eq!(v["low_window_mib"], 128);
    assert_eq!(v["low_window_first"], true);
    assert_eq!(v["slow_sizes"], "mix");
    // The aging part is paced: 400 fast requests a second per job.
    assert_eq!(v["rate_iops"], 400.0);
    // Both arms' device threads run on one CPU: the last this process
    // may use.
    let allowed = softiommu_virtio::affinity::allowed_cpus();
    match allowed.last() {
        Some(&c) => assert_eq!(v["device_cpu"], c),
        None => assert!(v["device_cpu"].is_null()),
    }
    // The default tail is a rate: 1.5 low windows (128 MiB) over the hold
    // (0.8 s) at the mix's mean size (21.6 KiB), per job (2), but no more
    // than the slow depth (10,000) holds over the hold.
    assert!(v["slow_pct"].is_null());
    assert_eq!(v["slow_depth"], 10_000);
    let per_s = v["slow_per_s"].as_f64().expect("slow_per_s");
    let want = (1.5 * (128u64 << 20) as f64 / (0.8 * 22_118.4 * 2.0)).min(10_000.0 / 0.8);
    assert!((per_s - want).abs() < 1e-6 * want, "{per_s} vs {want}");
    let policies = v["policies"].as_array().expect("policies");
    assert_eq!(policies.len(), 2);
    assert_eq!(policies[0]["policy"], "linux-2016");
    for p in policies {
        for k in [
            "warmup_s",
            "retained",
            "stability",
            "iops_first",
            "iops_last",
        ] {
            assert!(number(p, k) >= 0.0, "{k} in {p}");
        }
        assert!(number(p, "iops_first") > 0.0, "{p}");
        assert_eq!(p["verify_failures"], 0);
        assert_eq!(p["io_errors"], 0);
        cpu_time_aging_fields(p);
        let paired = vs_fresh_fields(p);
        let w = p["windows"].as_array().expect("windows");
        assert_eq!(w.len(), 8);
        assert!(number(&w[0], "iops") >= 0.0);
        for w in w {
            assert!(number(w, "driver_cpu_s") >= 0.0, "{w}");
            assert!(number(w, "iops_per_cpu_s") >= 0.0, "{w}");
            assert!(number(w, "fresh_ops") >= 0.0, "{w}");
            assert!(number(w, "fresh_cpu_s") >= 0.0, "{w}");
            if paired {
                assert!(number(w, "fresh_iops_per_cpu_s") > 0.0, "{w}");
                let r = number(w, "iops_per_cpu_s") / number(w, "fresh_iops_per_cpu_s");
                assert!((number(w, "vs_fresh") - r).abs() < 1e-9, "{w}");
            }
            // The sampled CPU per request is its submitting part plus its
            // reaping part.
            let parts = number(w, "submit_cpu_us_per_req") + number(w, "reap_cpu_us_per_req");
            assert!(
                (number(w, "work_cpu_us_per_req") - parts).abs() < 1e-9,
                "{w}"
            );
            // The allocator's and the page table's work, window by window.
            for k in [
                "tree_allocs",
                "tree_frees",
                "magazines_freed",
                "tree_nodes",
                "cached_iovas",
                "table_pages",
                "tables_allocated",
            ] {
                assert!(number(w, k) >= 0.0, "{k} in {w}");
            }
        }
    }
    let dma = v["dma"].as_array().expect("dma");
    let names: Vec<&str> = dma.iter().map(|d| d["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["passthrough", "strict", "deferred"]);
    for d in dma {
        assert!(number(d, "iops") > 0.0, "{d}");
        assert!(number(d, "driver_cpu_us_per_req") > 0.0, "{d}");
        assert!(number(d, "device_cpu_us_per_req") >= 0.0, "{d}");
        assert!(number(d, "cpu_ratio_to_passthrough") > 0.0, "{d}");
    }
    assert_eq!(dma[0]["cpu_ratio_to_passthrough"], 1.0);
}

/// A file back-end smaller than the disk asked for, or than the jobs need:
/// one line naming the sizes, exit 2, nothing on stdout.
#[test]
fn lab_fio_aging_refuses_a_file_that_is_too_small() {
    let path = std::env::temp_dir().join(format!("softiommu-small-{}.img", std::process::id()));
    std::fs::write(&path, vec![0u8; 4096]).expect("a temporary file");
    let file = path.to_string_lossy().into_owned();
    for (extra, want) in [
        (
            &["--disk-mib", "64"][..],
            format!("{file} holds 4096 bytes, needs at least 67108864"),
        ),
        (
            &[][..],
            "the disk holds 4096 bytes, the jobs need at least".to_string(),
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_softiommu"))
            .args(["lab", "fio-aging", "--backend", "file", "--file", &file])
            .args(["--seconds", "0.5", "--no-dma"])
            .args(extra)
            .output()
            .expect("the binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&want), "{err:?} lacks {want:?}");
        assert!(out.stdout.is_empty());
    }
    let _ = std::fs::remove_file(&path);
}

/// Runs the binary with `args`, which must fail with exit code 2, one line
/// on stderr and nothing on stdout; returns that line.
fn fails_in_one_line(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args(args)
        .output()
        .expect("the binary runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
    err
}

#[test]
fn lab_fio_aging_reports_a_missing_file_in_one_line() {
    let err = fails_in_one_line(&[
        "lab",
        "fio-aging",
        "--backend",
        "file",
        "--file",
        "/nonexistent/softiommu-disk",
        "--seconds",
        "0.5",
        "--no-dma",
    ]);
    assert!(err.contains("/nonexistent/softiommu-disk"), "{err}");
}

#[test]
fn lab_fio_aging_refuses_more_slots_than_a_virtqueue_holds() {
    let err = fails_in_one_line(&[
        "lab",
        "fio-aging",
        "--iodepth",
        "1000",
        "--slow-depth",
        "10000",
        "--seconds",
        "0.5",
    ]);
    assert!(err.contains("iodepth + slow_depth"), "{err}");
    assert!(err.contains("10922"), "{err}");
}

#[test]
fn bench_iova_on_two_threads_reports_scaling() {
    let v = bench_iova_on("2");
    assert_eq!(v["threads"], 2);
    let s = &v["softiommu_scaling"];
    assert!(number(s, "per_thread_throughput_ratio") > 0.0);
    assert!(number(s, "cpu_cost_ratio") > 0.0);
    assert!(number(s, "cpu_ns_per_pair_n_threads") > 0.0);
    assert!(
        s.get("harness_cpu_cost_ratio").is_none(),
        "no harness run, no harness ratio: {s}"
    );
}

#[test]
fn bench_iova_on_two_threads_with_the_harness_reports_its_own_ratio() {
    let v = bench_iova_with("2", "harness");
    let s = &v["softiommu_scaling"];
    assert!(number(s, "harness_cpu_cost_ratio") > 0.0, "{s}");
    assert_eq!(
        row_names(&v),
        ["softiommu", "harness"],
        "the 1-thread runs are not rows"
    );
    assert!(
        s.get("contract_floor_cpu_cost_ratio").is_none(),
        "no contract floor run, no floor ratio: {s}"
    );
}

#[test]
fn bench_iova_on_two_threads_with_the_contract_floor_reports_its_ratio() {
    let v = bench_iova_with("2", "contract-floor");
    let s = &v["softiommu_scaling"];
    assert!(number(s, "contract_floor_cpu_cost_ratio") > 0.0, "{s}");
    assert_eq!(
        row_names(&v),
        ["softiommu", "contract-floor"],
        "the floor runs at N threads, and its 1-thread run is not a row"
    );
}

/// The `impl` of each row of a `bench iova` report, in order.
fn row_names(v: &Value) -> Vec<&str> {
    v["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["impl"].as_str().expect("an impl name"))
        .collect()
}

#[test]
fn bench_pgtable() {
    let v = run(&[
        "bench",
        "pgtable",
        "--json",
        "--seconds",
        "0.05",
        "--rounds",
        "2",
    ]);
    assert_eq!(v["bench"], "pgtable");
    assert!(v["flush_method"].is_string());
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 6);
    for r in results {
        assert!(number(r, "ns_per_map_unmap") > 0.0);
        let s = &r["ns_per_map_unmap_spread"];
        assert!(
            number(s, "min") <= number(s, "median") && number(s, "median") <= number(s, "max"),
            "{s}"
        );
        assert!(r["valid"].is_boolean(), "{r}");
        for k in [
            "size",
            "lines_flushed_per_op",
            "lines_written_per_op",
            "fences_per_op",
        ] {
            number(r, k);
        }
        assert!(r["coherent"].is_boolean());
    }
}

#[test]
fn bench_translate() {
    let v = run(&[
        "bench",
        "translate",
        "--json",
        "--hit-pages",
        "256",
        "--walk-pages",
        "1024",
        "--seconds",
        "0.05",
        "--rounds",
        "1",
    ]);
    assert_eq!(v["bench"], "translate");
    assert_eq!(v["hit_pages"], 256);
    assert_eq!(v["walk_pages"], 1024);
    assert_eq!(v["softiommu_hit_rate"].as_array().map(Vec::len), Some(2));
    let floor_rate = number(&v, "seqlock_floor_hit_rate");
    assert!((0.9..=1.0).contains(&floor_rate), "{floor_rate}");
    let cases: Vec<(String, String)> = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            assert!(number(r, "ns_per_lookup") > 0.0);
            assert!(r["ns_per_lookup_spread"].is_null(), "one round: no spread");
            (
                r["impl"].as_str().unwrap().into(),
                r["case"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(cases.len(), 4);
    assert!(cases.contains(&("vm-memory".into(), "hit".into())));
    assert!(cases.contains(&("seqlock-floor".into(), "hit".into())));
}

#[test]
fn bench_access() {
    let v = run(&[
        "bench",
        "access",
        "--json",
        "--seconds",
        "0.05",
        "--rounds",
        "1",
    ]);
    assert_eq!(v["bench"], "access");
    assert_eq!(v["ring"], 256);
    assert_eq!(v["buf_bytes"], 64);
    assert_eq!(v["measured"], "all");
    let modes: Vec<&str> = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            for k in [
                "ns_per_op",
                "min_ns_per_op",
                "max_ns_per_op",
                "vs_relaxed",
                "wall_ns_per_op",
                "vs_relaxed_wall",
                "full_fences_per_op",
            ] {
                number(r, k);
            }
            assert!(r["ns_per_op_spread"].is_null() && r["vs_relaxed_spread"].is_null());
            assert!(r["vs_relaxed_wall_spread"].is_null());
            assert!(r["valid"].is_boolean(), "{r}");
            r["mode"].as_str().unwrap()
        })
        .collect();
    assert_eq!(modes, ["relaxed", "ordered", "full", "vm-memory"]);
}

#[test]
fn lab_litmus() {
    let v = run(&["lab", "litmus", "--json", "--runs", "4096"]);
    assert_eq!(v["lab"], "litmus");
    assert!(v["ok"].is_boolean());
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 9);
    for r in rows {
        assert!(number(r, "runs") >= 4096.0);
        number(r, "forbidden");
        assert_eq!(r["outcomes"].as_array().map(Vec::len), Some(4));
    }
}

/// The fields of `lab stress`: a short run of every phase, with a
/// flush timeout long enough that no machine's scheduler can overrun it.
#[test]
fn lab_stress() {
    // Not `run`: the deferred phases can report violations (exit 1; see
    // docs/LAB.md, "lab stress"), and the shape must hold then too.
    let out = Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args([
            "lab",
            "stress",
            "--json",
            "--seconds",
            "0.3",
            "--slots",
            "16",
            "--flush-timeout-ms",
            "1000",
            "--hogs",
            "0",
        ])
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        out.status.code() == Some(1),
        v["violations"].as_u64() != Some(0),
        "exit 1 exactly when there are violations: {stderr}"
    );
    assert_eq!(v["lab"], "stress");
    const FIELDS: [&str; 6] = [
        "ops",
        "device_accesses",
        "faults",
        "stale_accesses",
        "max_stale_age_us",
        "violations",
    ];
    for k in FIELDS {
        assert!(number(&v, k) >= 0.0, "{k}");
    }
    assert_eq!(v["flush_timeout_us"], 1_000_000);
    // The promised bound: the flush timeout + 1 ms; stale ages are taken
    // at the access's start and stay below it.
    assert_eq!(v["bound_us"], 1_001_000);
    assert!(number(&v, "device_accesses") > 0.0);
    assert!(number(&v, "max_stale_age_us") < number(&v, "bound_us"));
    // The bound phase runs three bounds at least: probes past it exist.
    assert!(number(&v, "bound_probes") > 0.0, "{v}");
    assert!(number(&v, "bound_probe_max_age_us") >= 1_001_000.0, "{v}");
    assert_eq!(v["hogs"], 0);
    let rows = v["policies"].as_array().expect("policies");
    let names: Vec<_> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "passthrough",
            "strict",
            "deferred",
            "bounce",
            "switching",
            "virtio-blk",
            "iopf-reclaim",
            "deferred-bound"
        ]
    );
    for r in rows {
        for k in FIELDS {
            assert!(number(r, k) >= 0.0, "{k} in {r}");
        }
        assert!(number(r, "device_accesses") > 0.0, "{r}");
        // Stale accesses only where unmaps can be deferred. (Violations
        // are not asserted away here: the lab has found some, see
        // docs/LAB.md; this checks the contract's shape.)
        if !matches!(
            r["policy"].as_str(),
            Some("deferred" | "switching" | "deferred-bound")
        ) {
            assert_eq!(r["stale_accesses"], 0, "{r}");
            assert_eq!(r["max_stale_age_us"], 0, "{r}");
        }
    }
}

#[test]
fn lab_iopf() {
    // Short: 64 KiB messages (16 pages), 1 and 3 sends, premap 1 and 16.
    let v = run(&[
        "lab",
        "iopf",
        "--json",
        "--msg-len",
        "65536",
        "--times",
        "1,3",
        "--premap-pages",
        "1,16",
        "--repeats",
        "1",
    ]);
    assert_eq!(v["lab"], "iopf");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4);
    for r in rows {
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 7, "exactly the seed's columns: {keys:?}");
        assert_eq!(number(r, "msg_len"), 65536.0);
        assert!(number(r, "kbps_without") > 0.0);
        assert!(number(r, "kbps_with") > 0.0);
        assert!(number(r, "ratio") > 0.0);
        // Faults happen on the first send only: 16 pages, one per fault
        // with premap 1, one fault for the whole message with 16.
        let want = if number(r, "premap_pages") == 1.0 {
            16.0
        } else {
            1.0
        };
        assert_eq!(number(r, "faults"), want, "{r}");
        number(r, "times");
    }
    let lat = &v["fault_latency_us"];
    assert!(number(lat, "p50") > 0.0);
    assert!(number(lat, "p99") >= number(lat, "p50"));
    assert!(number(lat, "max") >= number(lat, "p99"));
    assert_eq!(number(&v, "overflows"), 0.0);
    // Promotion (on by default): beside the rows, one entry per row; a
    // 64 KiB message has no 2 MiB block to promote.
    assert_eq!(v["promote"], true);
    let promotions = v["promotions"].as_array().expect("promotions");
    assert_eq!(promotions.len(), rows.len());
    for (p, r) in promotions.iter().zip(rows) {
        for k in ["msg_len", "times", "premap_pages"] {
            assert_eq!(p[k], r[k]);
        }
        assert_eq!(number(p, "promotions"), 0.0);
    }
    // The figures on CPU time: beside the rows, one entry per row. Even
    // with one repeat a row takes enough timed runs for 25 sends (25 of
    // one send, 9 of three), so each has a spread.
    let cpu = v["cpu"].as_array().expect("cpu");
    assert_eq!(cpu.len(), rows.len());
    for (c, r) in cpu.iter().zip(rows) {
        for k in ["msg_len", "times", "premap_pages"] {
            assert_eq!(c[k], r[k]);
        }
        assert!(number(c, "kbps_per_cpu_s_without") > 0.0, "{c}");
        assert!(number(c, "kbps_per_cpu_s_with") > 0.0, "{c}");
        assert!(number(c, "ratio") > 0.0, "{c}");
        let s = &c["ratio_spread"];
        assert!(
            number(s, "min") <= number(s, "median") && number(s, "median") <= number(s, "max"),
            "{c}"
        );
        assert_eq!(number(s, "median"), number(c, "ratio"), "{c}");
    }
}

#[test]
fn lab_iopf_promotes_a_2m_message_faulted_page_by_page_unless_told_not_to() {
    for (flag, promote, want) in [("on", true, 1.0), ("off", false, 0.0)] {
        let v = run(&[
            "lab",
            "iopf",
            "--json",
            "--msg-len",
            "2097152",
            "--times",
            "2",
            "--premap-pages",
            "1",
            "--repeats",
            "1",
            "--promote",
            flag,
        ]);
        assert_eq!(v["promote"], promote);
        assert_eq!(number(&v["rows"][0], "faults"), 512.0);
        assert_eq!(number(&v["promotions"][0], "promotions"), want, "{flag}");
    }
}
