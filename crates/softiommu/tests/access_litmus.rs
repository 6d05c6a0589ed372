//! The litmus tests of `access::litmus`, short form: a device thread
//! accessing through the ordered (and the full-fence) accessors and a guest
//! CPU thread never produce an outcome the guest must not see.
//! (`softiommu lab litmus` runs millions, and `relaxed` beside them.)

use softiommu::access::litmus::{run, LitmusTest};
use softiommu::access::OrderMode;

/// Per test and mode; a few batches, seconds in a debug build.
const RUNS: u64 = 64 * 1024;

#[test]
fn ordered_and_full_never_show_a_forbidden_outcome() {
    for test in LitmusTest::ALL {
        for mode in [OrderMode::Ordered, OrderMode::Full] {
            let r = run(test, mode, RUNS).unwrap();
            assert_eq!(r.runs, RUNS);
            assert_eq!(r.outcomes.iter().sum::<u64>(), r.runs);
            assert_eq!(
                r.forbidden,
                0,
                "{} {}: forbidden outcome {:?} seen; outcomes {:?}",
                test.name(),
                mode,
                test.forbidden(),
                r.outcomes
            );
        }
    }
}

#[test]
fn relaxed_runs_and_counts_every_outcome() {
    // Whether relaxed shows a forbidden outcome depends on the CPU and on
    // timing; that it runs and accounts for every iteration does not.
    let r = run(LitmusTest::Sb, OrderMode::Relaxed, 4096).unwrap();
    assert_eq!(r.outcomes.iter().sum::<u64>(), 4096);
    assert!(r.forbidden <= r.runs);
    assert!(!r.drain_barrier.is_empty());
}
