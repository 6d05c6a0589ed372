//! Tests of `lab iopf`'s plan: how many timed runs a row takes and who
//! sends first.

use crate::args::Ranged;

use super::args::IopfArgs;
use super::run::{turn, Plan, TIMED_SENDS};

#[test]
fn a_row_of_one_send_takes_enough_timed_runs_for_a_stable_median() {
    let a = IopfArgs {
        quick: true,
        repeats: Some(Ranged::try_from(3u64).unwrap()),
        ..IopfArgs::default()
    };
    let plan = Plan::of(&a);
    assert_eq!(plan.repeats, 3);
    // One send per run: runs until they hold TIMED_SENDS sends.
    assert_eq!(plan.timed_runs(1), TIMED_SENDS as usize);
    assert_eq!(plan.timed_runs(10), 3);
    // Rows of many sends keep the repeats.
    assert_eq!(plan.timed_runs(100), 3);
    assert_eq!(plan.timed_runs(5000), 3);
}

#[test]
fn a_run_of_one_round_starts_on_each_configuration_in_turn() {
    // Three configurations (pinned, premap 1, premap 512), one send each:
    // over three runs each goes first once, and within a run each sends
    // once.
    let n = 3;
    let firsts: Vec<usize> = (0..n).map(|run| turn(0, run, 0, n)).collect();
    assert_eq!(firsts, vec![0, 1, 2]);
    for run in 0..n {
        let mut order: Vec<usize> = (0..n).map(|j| turn(j, run, 0, n)).collect();
        order.sort_unstable();
        assert_eq!(order, vec![0, 1, 2]);
    }
    // Rounds still rotate within a run.
    assert_eq!(turn(0, 0, 1, n), 1);
    assert_eq!(turn(0, 2, u64::MAX, n), (2 + (u64::MAX % 3) as usize) % 3);
}
