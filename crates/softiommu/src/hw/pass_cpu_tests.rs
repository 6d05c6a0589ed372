//! Inline passes charged to the unit: counted once per pass with work,
//! only with accounting on, one in `PASS_SAMPLE` timed (each thread's
//! first, then every `PASS_SAMPLE`-th), on the unit and on the thread
//! alike, with the modelled latency spun left to the thread. (The test
//! harness runs each test on a thread of its own: its first pass is
//! timed.)

use std::sync::Arc;
use std::time::Duration;

use super::{thread_inline_pass_cpu, LatencyModel, QueueMode, Unit, UnitConfig, PASS_SAMPLE};
use crate::mem::PhysMemory;

fn unit(mode: QueueMode) -> Unit {
    let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
    let cfg = UnitConfig {
        queue_mode: mode,
        ..UnitConfig::default()
    };
    Unit::new(mem, cfg).unwrap()
}

fn flush(u: &Unit) {
    let mut b = u.batch();
    b.domain(1);
    b.wait().unwrap();
}

#[test]
fn an_inline_pass_is_charged_to_the_unit_and_to_the_thread_that_ran_it() {
    let u = unit(QueueMode::Inline);
    // Off (the default): nothing is charged.
    flush(&u);
    assert_eq!(u.stats().inline_passes, 0);
    assert_eq!(u.stats().inline_pass_cpu_ns, 0);
    u.set_pass_accounting(true);
    let mine0 = thread_inline_pass_cpu();
    // One submission of an invalidation and its wait: one pass, which
    // drains (a heavy fence) and completes the wait.
    flush(&u);
    let s = u.stats();
    assert_eq!(s.inline_passes, 1);
    assert!(s.inline_pass_cpu_ns > 0, "{s:?}");
    assert_eq!(
        thread_inline_pass_cpu() - mine0,
        Duration::from_nanos(s.inline_pass_cpu_ns)
    );
    // A pass with nothing queued reads no clock and charges nothing.
    u.process_queue().unwrap();
    assert_eq!(u.stats().inline_passes, 1);
    // Another thread's pass is the unit's too, and not this thread's.
    let mine = thread_inline_pass_cpu();
    std::thread::scope(|s| {
        s.spawn(|| flush(&u));
    });
    assert_eq!(u.stats().inline_passes, 2);
    assert!(u.stats().inline_pass_cpu_ns > s.inline_pass_cpu_ns);
    assert_eq!(thread_inline_pass_cpu(), mine);
}

#[test]
fn the_modelled_wait_spun_in_a_pass_stays_with_the_thread() {
    let u = unit(QueueMode::Inline);
    u.set_pass_accounting(true);
    let wait = Duration::from_millis(20);
    u.set_latency(LatencyModel {
        wait_completion: wait,
        ..LatencyModel::zero()
    });
    let cpu0 = crate::cpu_clock::thread();
    flush(&u);
    let cpu = crate::cpu_clock::thread() - cpu0;
    let s = u.stats();
    assert_eq!(s.inline_passes, 1);
    assert_eq!(s.modelled_ns, 20_000_000);
    // The spin is on the monotonic clock: the thread's CPU holds it (but
    // for time the host took the CPU away), the unit's charge does not.
    let charged = Duration::from_nanos(s.inline_pass_cpu_ns);
    assert!(charged < Duration::from_millis(5), "{charged:?} of {cpu:?}");
    assert!(cpu >= charged);
}

#[test]
fn a_unit_threads_pass_is_not_an_inline_one() {
    let u = unit(QueueMode::Thread);
    u.set_pass_accounting(true);
    let mine = thread_inline_pass_cpu();
    flush(&u);
    assert_eq!(u.stats().waits, 1);
    assert_eq!(u.stats().inline_passes, 0);
    assert_eq!(u.stats().inline_pass_cpu_ns, 0);
    assert_eq!(thread_inline_pass_cpu(), mine);
}

/// Timing a pass costs two clock system calls, which a strict unmap paid
/// on every pass: a thread times only one pass with work in
/// `PASS_SAMPLE` and charges it `PASS_SAMPLE` times over, while every
/// pass is still counted.
#[test]
fn one_pass_in_pass_sample_is_timed_and_stands_for_its_group() {
    let u = unit(QueueMode::Inline);
    u.set_pass_accounting(true);
    let mine0 = thread_inline_pass_cpu();
    flush(&u);
    let first = thread_inline_pass_cpu() - mine0;
    assert!(first > Duration::ZERO, "the thread's first pass is timed");
    assert_eq!(
        first.as_nanos() % u128::from(PASS_SAMPLE),
        0,
        "and counts for its group"
    );
    for _ in 1..PASS_SAMPLE {
        flush(&u);
    }
    let s = u.stats();
    assert_eq!(s.inline_passes, PASS_SAMPLE, "every pass is counted");
    assert_eq!(
        thread_inline_pass_cpu() - mine0,
        first,
        "the rest of the group is not timed"
    );
    assert_eq!(Duration::from_nanos(s.inline_pass_cpu_ns), first);
    flush(&u);
    assert!(
        thread_inline_pass_cpu() - mine0 > first,
        "the next group's first is timed"
    );
    assert_eq!(u.stats().inline_passes, PASS_SAMPLE + 1);
}

/// The part of the clock calls inside a timed interval is measured (two
/// back-to-back reads of the thread's CPU clock) and is never charged to
/// the unit: a pass's charge is its interval less that, times
/// `PASS_SAMPLE`.
#[test]
fn the_clock_calls_inside_a_timed_pass_are_not_charged_to_the_unit() {
    let pair = super::pass_cpu::clock_pair_ns();
    // Two reads of a CPU clock measure something (the calls take time)
    // and far less than a millisecond.
    assert!(pair > 0 && pair < 1_000_000, "{pair} ns");
    // Stable: measured once per process.
    assert_eq!(super::pass_cpu::clock_pair_ns(), pair);
}
