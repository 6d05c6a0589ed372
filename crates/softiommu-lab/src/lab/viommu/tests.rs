//! Tests of `lab viommu`.

use super::args::{parse_bs, parse_exit_us};
use super::*;

fn row(mode: &'static str, why: Option<String>) -> ViommuRow {
    ViommuRow {
        device: "virtio-blk/ssd-80us".into(),
        mode,
        bs: 4096,
        depth: 4,
        iops: 1.0,
        pct_of_none: 100.0,
        pct_of_none_min: 100.0,
        pct_of_none_median: 100.0,
        pct_of_none_max: 100.0,
        spread_slices: 1,
        driver_cpu_us_per_io: 1.0,
        driver_wait_cpu_us_per_io: 0.0,
        device_us_per_io: 80.0,
        requests_per_io: 0.0,
        notifications_per_io: 0.0,
        invalidations_per_io: 0.0,
        valid: why.is_none(),
        why,
    }
}

fn report_of(rows: Vec<ViommuRow>) -> ViommuReport {
    ViommuReport {
        lab: "viommu",
        quick: true,
        ios: 1,
        depth: 1,
        latency_model: "",
        device_model_us: 80.0,
        bs: 4096,
        bw_bs: BW_BS,
        bw_depth: BW_DEPTH,
        shapes: SHAPES,
        ssd_bytes_per_sec: SSD_BYTES_PER_SEC,
        exit_us: 0.0,
        exit_model: "",
        anchor: Vec::new(),
        measured: "",
        load_avg_1m: 0.0,
        ssd_lazy_target_met: false,
        rows,
        notes: Vec::new(),
    }
}

/// A mode faster than no IOMMU in every round is a measurement bug:
/// marked invalid in JSON and in the table; within the spread it
/// stands, and none itself is never judged.
#[test]
fn a_mode_faster_than_no_iommu_in_every_round_is_invalid() {
    let secs = vec![vec![1.0, 1.1], vec![1.2, 1.3], vec![0.8, 0.9]];
    let why = physics(Mode::Lazy, &secs);
    assert!(
        matches!(&why, Some(w) if w.starts_with("measurement invalid: lazy ran faster than none")),
        "{why:?}"
    );
    // Within the spread (strict's slowest round above none's fastest)
    // it stands.
    let within = vec![vec![1.0, 1.1], vec![0.9, 1.05], vec![0.5, 0.6]];
    assert_eq!(physics(Mode::Strict, &within), None);
    assert_eq!(physics(Mode::None, &secs), None);
    let rep = report(&report_of(vec![row("none", None), row("lazy", why)]), 2);
    let rows = rep.contract["rows"].as_array().unwrap();
    assert_eq!(
        (&rows[0]["valid"], &rows[1]["valid"]),
        (&true.into(), &false.into())
    );
    assert!(rep.tables[0]
        .invalid_why("virtio-blk/ssd-80us/lazy")
        .is_some());
    assert!(rep.tables[0]
        .invalid_why("virtio-blk/ssd-80us/none")
        .is_none());
}

/// Strict does all of lazy's work and more: strict faster than lazy
/// in every round is invalid too (none >= lazy >= strict, or the row
/// says why); lazy faster than strict is what lazy is for.
#[test]
fn strict_faster_than_lazy_in_every_round_is_invalid() {
    // [none, strict, lazy] seconds per round.
    let secs = vec![vec![1.0, 1.0], vec![1.1, 1.15], vec![1.2, 1.3]];
    let why = physics(Mode::Strict, &secs);
    assert!(
        matches!(&why, Some(w) if w.starts_with("measurement invalid: strict ran faster than lazy in every round")),
        "{why:?}"
    );
    assert_eq!(physics(Mode::Lazy, &secs), None);
    let ok = vec![vec![1.0, 1.0], vec![1.6, 1.7], vec![1.05, 1.1]];
    assert_eq!(Mode::ALL.map(|m| physics(m, &ok)), [None, None, None]);
}

/// The device time achieved is checked against the model's deadline
/// (arrival + 80 us): within a tenth it stands, past it the report
/// says the machine could not keep the deadlines; `null` has no model.
#[test]
fn device_time_off_the_model_is_reported() {
    assert_eq!(device_time_note("d", 80.0, 80.0, 84.0), None);
    assert!(matches!(
        device_time_note("virtio-blk/ssd-80us/none", 80.0, 80.0, 160.0),
        Some(n) if n.starts_with("virtio-blk/ssd-80us/none: the device time achieved (160.0 us")
    ));
    assert_eq!(
        device_time_note("virtio-blk/null/none", 0.0, 0.0, 0.0),
        None
    );
    // A bandwidth that binds widens the model: depth 4 x 37 us queued.
    assert_eq!(device_time_note("d", 80.0, 150.0, 149.0), None);
    assert!(matches!(
        device_time_note("d", 80.0, 150.0, 200.0),
        Some(n) if n.contains("the model's 80-150 us")
    ));
}

/// `--exit-us` takes 0..=1000 µs; anything else is refused with one
/// line (the CLI exits 2).
#[test]
fn exit_us_is_bounded() {
    assert_eq!(parse_exit_us("0"), Ok(0.0));
    assert_eq!(parse_exit_us("2.5"), Ok(2.5));
    assert!(matches!(parse_exit_us("-1"), Err(e) if e.contains("0..=1000")));
    assert!(matches!(parse_exit_us("nan"), Err(e) if e.contains("0..=1000")));
}

/// `[lab-viommu]` in a scenario file, or `--set`, passes the command
/// line's checks: `exit_us` NaN, negative or 1e9 (a hang: 1000 s busy-
/// waited per notification) and `bs`/`bw_bs` 0 or 1 are one typed error
/// naming the file, line and field, before any work (they were accepted,
/// and failed or hung only while running).
#[test]
fn a_scenario_file_or_set_is_checked_like_the_command_line() {
    use crate::scenario::{Scenario, ScenarioError};
    use std::path::Path;
    let head = "[lab-viommu]\nquick = true\nrounds = 1\n";
    for (line, want) in [
        ("exit_us = nan", "0..=1000"),
        ("exit_us = -1.0", "0..=1000"),
        ("exit_us = 1e9", "0..=1000"),
        ("bs = 0", "4096..=131072"),
        ("bs = 1", "4096..=131072"),
        ("bw_bs = 1", "4096..=131072"),
        ("bs = \"3k\"", "4096..=131072"),
    ] {
        let e = Scenario::parse(&format!("{head}{line}\n"), Path::new("v.toml")).unwrap_err();
        let key = line.split(' ').next().unwrap();
        assert!(
            matches!(&e, ScenarioError::Field { line: 4, field, message, .. }
                if field.contains(key) && message.contains(want)),
            "{line}: {e}"
        );
    }
    let s = Scenario::parse(
        &format!("{head}bs = \"8k\"\nexit_us = 2.5\n"),
        Path::new("v.toml"),
    )
    .unwrap();
    let crate::registry::LabArgs::Viommu(a) = s.lab() else {
        panic!("not viommu")
    };
    assert_eq!((a.bs, a.exit_us), (8192, 2.5));
    for set in ["exit_us=nan", "exit_us=1e9", "bs=0", "bw_bs=1"] {
        let e = s.with_sets(&[set.to_string()]).unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Set { set: x, message } if x == set && (message.contains("0..=1000") || message.contains("4096..=131072"))),
            "{set}: {e}"
        );
    }
}

/// A short ssd-80us round: every read is held to its deadline and
/// never returned before it (the achieved device time is at least
/// the model's 80 us; an upper bound would measure the machine's
/// load), the achieved time is counted per read, and each mode's
/// notifications are its own: strict six per read, lazy at most one
/// (one per submission of one or more reads), none none to the
/// virtio-iommu.
#[test]
fn an_ssd_round_keeps_the_deadline_and_counts_the_work() {
    let (m, slices) = measure_round(Some(SSD_HOLD), 300, 4, Duration::ZERO, 4096).unwrap();
    // 300 reads in slices of 250: two slices per mode, each timed.
    for s in &slices {
        assert_eq!(s.len(), 2, "{slices:?}");
        assert!(s.iter().all(|&x| x > 0.0), "{slices:?}");
    }
    for x in &m {
        assert_eq!(x.released, 300);
        let us = x.held_ns as f64 / x.released as f64 / 1e3;
        assert!((80.0..2_000.0).contains(&us), "device time {us} us");
    }
    let per = |i: usize| m[i].notifications as f64 / 300.0;
    assert_eq!(
        (m[0].requests, m[1].requests, m[2].requests),
        (0, 1800, 1800)
    );
    // Lazy: one map sync per read (its own mapping call), and the
    // flushes' few on top.
    assert!(per(1) >= 6.0 && (1.0..1.1).contains(&per(2)), "{m:?}");
}

/// `--bs` takes a multiple of 4096 in 4096..=131072 bytes (or KiB with
/// `k`); anything else is refused with one line (the CLI exits 2).
#[test]
fn bs_is_a_page_multiple_up_to_the_disks_segment() {
    assert_eq!(parse_bs("4096"), Ok(4096));
    assert_eq!(parse_bs("128k"), Ok(131_072));
    for bad in ["0", "1000", "6000", "256k", "x", "18446744073709551615k"] {
        assert!(
            matches!(parse_bs(bad), Err(e) if e.contains("4096..=131072")),
            "{bad}"
        );
    }
}

/// The block size and the bandwidth are in the JSON and the parameters
/// line, beside the latency model.
#[test]
fn bs_and_bandwidth_are_reported() {
    let mut r = report_of(vec![row("none", None)]);
    r.bs = 131_072;
    let rep = report(&r, 1);
    assert_eq!(rep.contract["bs"], 131_072);
    assert_eq!(rep.contract["ssd_bytes_per_sec"], 3_500_000_000u64);
    assert!(rep.params.iter().any(|p| p.name == "bs"));
    assert!(
        rep.tables[0].title.starts_with("128 KiB reads"),
        "{}",
        rep.tables[0].title
    );
}

/// The target's job is bandwidth-bound by the model's own numbers: its
/// reads in flight cover a read's latency and transfer (the link never
/// idles for want of a read), and its defaults are what the CLI and the
/// JSON say; the default IOPS job is latency-bound (its reads in flight
/// carry less than one latency of link time).
#[test]
fn the_target_job_is_bandwidth_bound_and_the_iops_job_latency_bound() {
    let transfer_us = |bs: u64| bs as f64 / SSD_BYTES_PER_SEC as f64 * 1e6;
    let hold_us = SSD_HOLD.as_secs_f64() * 1e6;
    let a = ViommuArgs::default();
    assert_eq!((a.bw_bs, a.bw_depth.get()), (BW_BS, BW_DEPTH));
    assert_eq!((BW_BS, BW_DEPTH), (131_072, 16));
    let t = transfer_us(a.bw_bs);
    assert!(a.bw_depth.get() as f64 * t >= 3.0 * (hold_us + t), "{t}");
    let t4 = transfer_us(a.bs);
    assert!(a.depth.get() as f64 * t4 < hold_us, "{t4}");
    let rep = report(&report_of(vec![row("none", None)]), 1);
    assert_eq!(rep.contract["bw_bs"], 131_072);
    assert_eq!(rep.contract["bw_depth"], 16);
    assert!(rep.notes.iter().any(|n| n.contains("bandwidth-bound")));
}

/// The slice spread pairs each slice with none's of the same index: a
/// mode twice as slow in one slice and as fast in another spans 50-100 %,
/// its median between; an odd count takes the middle one; unpaired or
/// zero-second slices are left out.
#[test]
fn the_slice_spread_pairs_each_slice_with_nones() {
    use super::run::SliceSpread;
    let s = SliceSpread::of(&[1.0, 1.0, 2.0, 1.0], &[2.0, 1.0, 2.0, 1.25]);
    assert_eq!(
        s,
        SliceSpread {
            min: 50.0,
            median: 90.0,
            max: 100.0,
            n: 4
        }
    );
    let odd = SliceSpread::of(&[1.0, 1.0, 1.0, 5.0], &[4.0, 2.0, 1.0]);
    assert_eq!(
        (odd.min, odd.median, odd.max, odd.n),
        (25.0, 50.0, 100.0, 3)
    );
    let none = SliceSpread::of(&[0.0], &[1.0]);
    assert_eq!(none, SliceSpread::default());
}

/// The median round carries the spread of all rounds' slices: each
/// round's slices pair with none's of the same round, never across
/// rounds.
#[test]
fn median_rounds_spreads_over_every_rounds_slices() {
    use super::run::{median_rounds, Measured};
    let mut k = 0.0;
    let (_, _, spread) = median_rounds(2, || {
        k += 1.0;
        let m = Measured {
            secs: k,
            ..Measured::default()
        };
        // Round 1: lazy 2x none's time; round 2: the same as none's.
        let lazy = if k == 1.0 { 2.0 * k } else { k };
        Ok((vec![m; 3], vec![vec![k], vec![k], vec![lazy]]))
    })
    .unwrap();
    assert_eq!(
        (spread[0].min, spread[0].max, spread[0].n),
        (100.0, 100.0, 2)
    );
    assert_eq!(
        (spread[2].min, spread[2].max, spread[2].n),
        (50.0, 100.0, 2)
    );
}
