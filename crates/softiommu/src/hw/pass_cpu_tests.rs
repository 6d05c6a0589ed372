//! Inline passes charged to the unit: counted and timed once per pass with
//! work, only with accounting on, on the unit and (with the clock reads
//! around it) on the thread, with the modelled latency spun left to the
//! thread.

use std::sync::Arc;
use std::time::Duration;

use super::{thread_inline_pass_cpu, LatencyModel, QueueMode, Unit, UnitConfig};
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
    // The thread's share is the unit's plus its two clock reads.
    let pair = Duration::from_nanos(super::pass_cpu::clock_pair_ns());
    assert_eq!(
        thread_inline_pass_cpu() - mine0,
        Duration::from_nanos(s.inline_pass_cpu_ns) + 2 * pair
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

/// Every pass with work is timed and charged once: a thread's passes'
/// share is the unit's charge for them plus two clock reads per pass,
/// whatever pass it was (sampling one in sixteen and charging it sixteen
/// times over let one slow pass take out CPU the thread never spent on
/// passes).
#[test]
fn every_pass_is_timed_and_charged_once() {
    let u = unit(QueueMode::Inline);
    u.set_pass_accounting(true);
    let pair = Duration::from_nanos(super::pass_cpu::clock_pair_ns());
    let mine0 = thread_inline_pass_cpu();
    let mut last = mine0;
    for i in 1..=5u32 {
        flush(&u);
        let now = thread_inline_pass_cpu();
        assert!(now - last > pair, "pass {i} is timed");
        last = now;
    }
    let s = u.stats();
    assert_eq!(s.inline_passes, 5, "every pass is counted");
    assert_eq!(
        thread_inline_pass_cpu() - mine0,
        Duration::from_nanos(s.inline_pass_cpu_ns) + 10 * pair
    );
}

/// The part of the clock calls inside a timed interval is measured (two
/// back-to-back reads of the thread's CPU clock) and is never charged to
/// the unit: a pass's charge is its interval less that.
#[test]
fn the_clock_calls_inside_a_timed_pass_are_not_charged_to_the_unit() {
    let pair = super::pass_cpu::clock_pair_ns();
    // Two reads of a CPU clock measure something (the calls take time)
    // and far less than a millisecond.
    assert!(pair > 0 && pair < 1_000_000, "{pair} ns");
    // Stable: measured once per process.
    assert_eq!(super::pass_cpu::clock_pair_ns(), pair);
}
