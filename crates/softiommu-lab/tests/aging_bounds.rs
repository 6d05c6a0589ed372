//! A long aging run stays within memory bounds. Our IOVA policy's
//! caches are bounded by construction (per-CPU magazines and a depot of
//! `max(capacity, per_cpu × caches)` magazines per cached order); the
//! test runs the allocator-only aging lab and the storage-path one, reads
//! the cache sizes they report, window by window, and the children's peak
//! resident memory, and checks both against bounds derived from the
//! policy's parameters, not from a previous run.

use std::process::Command;

use serde_json::Value;
use softiommu::iova::{DepotRule, IovaPolicy};

fn lab(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// The most IOVAs our policy's caches can hold with `cpus` per-CPU caches:
/// per cached order, two magazines per CPU (loaded and previous) and the
/// depot's bound.
fn cache_bound(cpus: u64) -> u64 {
    let p = IovaPolicy::Softiommu.params();
    let depot = match p.depot {
        DepotRule::Bounded {
            capacity, per_cpu, ..
        } => (capacity as u64).max(per_cpu as u64 * cpus),
        other => panic!("our policy's depot is bounded, not {other:?}"),
    };
    let orders = u64::from(p.max_cached_order) + 1;
    orders * (2 * cpus + depot) * p.magazine_size as u64
}

fn peak_rss_kib_of_children() -> i64 {
    // SAFETY: getrusage writes into the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    assert_eq!(rc, 0);
    ru.ru_maxrss
}

#[test]
fn a_long_aging_run_of_our_policy_keeps_its_caches_and_memory_bounded() {
    let v = lab(&[
        "lab",
        "iova-aging",
        "--json",
        "--seconds",
        "4",
        "--windows",
        "8",
        "--policies",
        "softiommu",
    ]);
    let p = &v["policies"][0];
    // Logical CPUs: 12 jobs and 4 interrupt CPUs (the lab's defaults), plus
    // the domain's own caches.
    let bound = cache_bound(12 + 4 + 2);
    let peak = p["peak_cached_iovas"].as_u64().expect("peak_cached_iovas");
    assert!(peak <= bound, "peak cached {peak} > bound {bound}");
    for w in p["windows"].as_array().expect("windows") {
        let c = w["cached_iovas"].as_u64().expect("cached_iovas");
        assert!(c <= bound, "a window cached {c} > bound {bound}");
    }
    // The tree holds what is in flight (12 jobs × 32 and the slow tail)
    // and what the caches hold, in free extents that coalesce: far below
    // one node per I/O.
    let ops = p["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["iops"].as_f64().unwrap())
        .sum::<f64>();
    let nodes = p["peak_tree_nodes"].as_f64().expect("peak_tree_nodes");
    assert!(nodes < ops.max(1.0), "{nodes} tree nodes for {ops} I/Os");

    let f = lab(&[
        "lab",
        "fio-aging",
        "--json",
        "--seconds",
        "3",
        "--windows",
        "12",
        "--no-dma",
        "--disk-mib",
        "256",
        "--policies",
        "softiommu",
    ]);
    let p = &f["policies"][0];
    // Job caches, interrupt CPUs' caches, the flush timer's and the
    // domain's own.
    let bound = cache_bound(12 + 4 + 4);
    let cached = p["cached_iovas"].as_u64().expect("cached_iovas");
    assert!(cached <= bound, "cached {cached} > bound {bound}");
    assert_eq!(p["verify_failures"], 0);
    // Both children together: the guest memory the storage host touched
    // (1 GiB reserved, touched on use) and the allocator's structures.
    let rss = peak_rss_kib_of_children();
    assert!(rss < 1 << 20, "peak RSS {rss} KiB ≥ 1 GiB");
}
