use super::run::failed_work;
use crate::metrics::aging::AgingSummary;

#[test]
fn a_run_with_failed_or_wrong_io_is_invalid_and_says_why() {
    assert_eq!(failed_work(0, 0), None);
    let why = failed_work(976_096, 0).unwrap();
    assert!(why.starts_with("976096 I/O error(s): "), "{why}");
    let why = failed_work(1, 2).unwrap();
    assert!(why.ends_with("; 2 read(s) returned wrong data"), "{why}");
    let a = AgingSummary::absent();
    assert!(a.retained.is_nan() && !a.settled);
    assert_eq!(
        serde_json::to_value(a).unwrap()["retained"],
        serde_json::Value::Null
    );
}

/// A run of 32 windows of 0.25 s at 2,400 aged and 600 fresh requests a
/// window, the aged requests costing `aged_us(i)` µs of driver CPU each in
/// window `i`, the fresh ones `fresh_us(i)`.
fn paired_run(
    aged_us: impl Fn(usize) -> f64,
    fresh_us: impl Fn(usize) -> f64,
) -> softiommu_virtio::workload::fio::FioResult {
    use softiommu_virtio::workload::fio::{FioResult, FioWindow};
    let windows = (0..32)
        .map(|i| FioWindow {
            t_s: (i + 1) as f64 * 0.25,
            ops: 2_400,
            iops: 9_600.0,
            driver_cpu_s: 2_400.0 * aged_us(i) * 1e-6,
            fresh_ops: 600,
            fresh_cpu_s: 600.0 * fresh_us(i) * 1e-6,
            ..FioWindow::default()
        })
        .collect();
    FioResult {
        windows,
        window_s: 0.25,
        runtime_s: 8.0,
        ..FioResult::default()
    }
}

/// How much slower the machine runs a request in window `i`: not at all
/// for the first half, then a co-runner's pressure that comes and goes.
fn machine(i: usize) -> f64 {
    if i < 16 {
        1.0
    } else {
        [1.6, 1.35, 1.8, 1.4][i % 4]
    }
}

#[test]
fn a_machine_slowdown_on_both_arms_does_not_move_the_storage_figure() {
    use super::run::{paired_figure, windows_out};
    let r = paired_run(|i| 4.0 * machine(i), |i| 5.0 * machine(i));
    // The aged arm alone calls the slowdown aging.
    let work = r.work_windows();
    let (alone, rates) = AgingSummary::of("t", &r.iops_series(), &work, 0.25, 8.0).unwrap();
    assert!(alone.retained < 0.75, "{alone:?}");
    // Against the fresh arm on the same threads it cancels.
    let (v, paired) = paired_figure(&r);
    assert!((v.retained_vs_fresh - 1.0).abs() < 1e-9, "{v:?}");
    assert!((v.stability_vs_fresh - 1.0).abs() < 1e-9, "{v:?}");
    assert!((v.vs_fresh_last - 5.0 / 4.0).abs() < 1e-9, "{v:?}");
    // The time line carries each window's fresh rate and the ratio.
    let out = windows_out(&r, &rates, &paired);
    assert_eq!(out.len(), 32);
    assert!(out.iter().all(|w| (w.vs_fresh - 1.25).abs() < 1e-9));
    assert!((out[0].fresh_iops_per_cpu_s - 200_000.0).abs() < 1e-6);
    assert_eq!(out[0].fresh_ops, 600);
}

#[test]
fn a_slowdown_of_the_aged_device_alone_lowers_the_storage_figure() {
    use super::run::paired_figure;
    // From window 16 each aged request costs twice the CPU (a tree walk),
    // while the machine also slows under both arms.
    let aged = |i: usize| if i < 16 { 4.0 } else { 8.0 } * machine(i);
    let (v, _) = paired_figure(&paired_run(aged, |i| 5.0 * machine(i)));
    assert!((v.retained_vs_fresh - 0.5).abs() < 1e-9, "{v:?}");
    // A run without a fresh arm (every fresh window empty) has no paired
    // figure: null in JSON, not an error.
    let mut none = paired_run(aged, |_| 0.0);
    for w in &mut none.windows {
        w.fresh_ops = 0;
    }
    let (v, s) = paired_figure(&none);
    assert!(v.retained_vs_fresh.is_nan(), "{v:?}");
    assert!(s.ratio.iter().all(|r| r.is_nan()));
}
