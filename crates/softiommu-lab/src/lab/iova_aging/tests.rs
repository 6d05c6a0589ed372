//! Tests of `lab iova-aging`'s windows.

use std::time::Duration;

use super::run::{window_cpu_ns, window_done};

#[test]
fn a_window_ends_on_the_workers_cpu_time_not_the_wall_clock() {
    // 0.25 s windows, two worker threads: 0.5 s of their CPU per window.
    let budget = window_cpu_ns(Duration::from_millis(250), 2);
    assert_eq!(budget, 500_000_000);
    // Counters: aged ops, aged CPU ns, fresh ops, fresh CPU ns, paired.
    let from = [10, 1_000, 5, 2_000, 1, 100];
    // A co-runner held the workers off: whatever wall time passed, the
    // window goes on while their CPU time has not reached the budget.
    let held = [20, 1_000 + 300_000_000, 6, 2_000 + 100_000_000, 2, 200];
    assert!(!window_done(&from, &held, budget));
    // Both arms' CPU counts toward it.
    let done = [40, 1_000 + 400_000_000, 9, 2_000 + 100_000_000, 3, 300];
    assert!(window_done(&from, &done, budget));
    // Operations alone do not end it.
    let ops = [u64::MAX, 1_000, u64::MAX, 2_000, 0, 0];
    assert!(!window_done(&from, &ops, budget));
}
