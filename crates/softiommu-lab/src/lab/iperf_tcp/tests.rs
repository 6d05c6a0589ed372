//! Tests of `lab iperf-tcp`.

use crate::args::{Placement, Walk};
use crate::lab::policy_physics::Spread;
use crate::report::Report;

use super::args::*;
use super::out::*;
use super::render::*;
use super::run::*;
use super::*;

use crate::seeds::summarise;

/// One round of a row: `mbit_s` moved at `cpu` s/GB.
fn round(walk: Walk, policy: &str, mbit_s: f64, cpu: f64) -> IperfTcpRow {
    IperfTcpRow {
        walk: walk.name(),
        policy: policy.into(),
        mbit_s,
        cpu_s_per_gb: cpu,
        lines_flushed_per_gb: if walk == Walk::Coherent { 0.0 } else { 1e7 },
        flush_cpu_share: 0.01,
        checksum_ok: true,
        device_cpu_s_per_gb: 1.0,
        flush_ns_per_line: 0.0,
        vs_coherent: None,
        cpu_above_coherent_share: None,
        flush_timer_cpu_s_per_gb: 0.05,
        wait_cpu_s_per_gb: 0.2,
        unit_inline_cpu_s_per_gb: 0.0,
        cpu_s_per_gb_spread: Spread::of(&[cpu]),
        mbit_s_spread: Spread::of(&[mbit_s]),
        saturated_vs_coherent: None,
        saturated_vs_coherent_spread: None,
        saturated_vs_coherent_interval: None,
        saturated_vs_coherent_with_waits: None,
        cpu_s_per_gb_rounds: vec![cpu],
        wait_cpu_s_per_gb_rounds: vec![0.2],
        valid: true,
        why: None,
    }
}

/// The report of rows measured in rounds (`cpu` per round, Mbit/s
/// equal), under seed 003's scenario.
fn seed_report(cells: &[(Walk, &str, &[f64])]) -> Report {
    let mut rows: Vec<IperfTcpRow> = cells
        .iter()
        .map(|&(w, p, cpu)| {
            median_round(
                cpu.iter()
                    .enumerate()
                    .map(|(i, &c)| round(w, p, 1430.0 + i as f64, c))
                    .collect(),
            )
        })
        .collect();
    compare(&mut rows);
    let r = IperfTcpReport {
        lab: "iperf-tcp",
        stack: "smoltcp",
        seconds: 0.8,
        rounds: 3,
        runs_per_round: RUNS_PER_ROUND,
        placement: Placement::Split,
        flush_share_method: FLUSH_SHARE_METHOD,
        modelled: Vec::new(),
        rows,
        seed: Seed003 {
            coherent_mbit_s: 7908.0,
            non_coherent_mbit_s: 4380.0,
            ratio: 4380.0 / 7908.0,
            clflush_share: 0.0586,
        },
    };
    let mut rep = report(&r, &IperfTcpArgs::default(), "split");
    rep.scenario = "tcp-64k".into();
    rep
}

#[test]
fn a_non_coherent_walk_cheaper_than_coherent_is_invalid_and_gets_no_verdict() {
    let rep = seed_report(&[
        (Walk::Coherent, "deferred", &[1.60, 1.64, 1.70]),
        (Walk::NonCoherent, "deferred", &[1.40, 1.45, 1.50]),
    ]);
    let rows = rep.contract["rows"].as_array().unwrap();
    assert_eq!(rows[0]["valid"], true);
    assert_eq!(rows[1]["valid"], false);
    assert!(
        rows[1]["why"].as_str().is_some_and(|w| w.starts_with(
            "measurement invalid: the non-coherent walk's driver CPU per GB under deferred"
        )),
        "{}",
        rows[1]
    );
    assert!(rep
        .notes
        .iter()
        .any(|n| n.starts_with("INVALID row non-coherent/deferred: ")));
    let seed = summarise(&[rep]).remove(3);
    assert_eq!(seed.seed, "003");
    assert!(
        seed.verdict
            .starts_with("no verdict: non-coherent/deferred: measurement invalid"),
        "{}",
        seed.verdict
    );
}

#[test]
fn seed_003_compares_cpu_per_gb_not_throughput_below_saturation() {
    // The fresh-clone run of the issue: equal Mbit/s, CPU per GB up
    // 29 % (1.64 -> 2.12 s/GB).
    let rep = seed_report(&[
        (Walk::Coherent, "deferred", &[1.60, 1.64, 1.68]),
        (Walk::NonCoherent, "deferred", &[2.08, 2.12, 2.16]),
    ]);
    let rows = rep.contract["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["valid"] == true), "{rows:?}");
    let sat = rows[1]["saturated_vs_coherent"].as_f64().unwrap();
    assert!((sat - 1.64 / 2.12).abs() < 1e-9, "{sat}");
    // Beside it, for the reader, the same paired median with each
    // round's waits (0.2 s/GB here) counted in.
    let with = rows[1]["saturated_vs_coherent_with_waits"]
        .as_f64()
        .unwrap();
    assert!((with - 1.84 / 2.32).abs() < 1e-9, "{with}");
    // The spread is over the rounds' paired ratios (coherent's round over
    // non-coherent's same round), not the widest cross of the two rows.
    let spread = &rows[1]["saturated_vs_coherent_spread"];
    assert!((spread["min"].as_f64().unwrap() - 1.60 / 2.08).abs() < 1e-9);
    assert!((spread["max"].as_f64().unwrap() - 1.68 / 2.16).abs() < 1e-9);
    // The measured Mbit/s ratio says 1.00x; the seed line does not.
    assert!((rows[1]["vs_coherent"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    let seed = summarise(&[rep]).remove(3);
    assert!((seed.ours.unwrap() - 1.64 / 2.12).abs() < 1e-9);
    assert!(
        seed.claim.contains("CPU per unit of work"),
        "{}",
        seed.claim
    );
    assert!(
        seed.detail.contains("stated as CPU per unit of work"),
        "{}",
        seed.detail
    );
    assert_eq!(
        seed.verdict,
        "a non-coherent walk costs more driver CPU per GB than a coherent one, beyond the spread; flushing exactly the lines written costs less CPU per GB than the seed's flushing cost throughput, beyond the spread by more than a factor of 1.15"
    );
}

#[test]
fn seed_003_pairs_each_rounds_rows_so_a_machine_that_slows_between_rounds_keeps_its_verdict() {
    // A co-runner slows the machine by up to 40 % from round to round;
    // within each round non-coherent costs ~1.5 times coherent. The
    // widest cross of the two rows' rounds (1.70 / 3.60 = 0.47) would
    // straddle the seed's 0.554; each round's own ratio does not.
    let rep = seed_report(&[
        (Walk::Coherent, "deferred", &[1.70, 2.00, 2.40, 1.80, 2.20]),
        (
            Walk::NonCoherent,
            "deferred",
            &[2.60, 3.05, 3.60, 2.75, 3.35],
        ),
    ]);
    let rows = rep.contract["rows"].as_array().unwrap();
    let spread = &rows[1]["saturated_vs_coherent_spread"];
    assert!((spread["min"].as_f64().unwrap() - 1.70 / 2.60).abs() < 1e-9);
    assert!((spread["max"].as_f64().unwrap() - 2.40 / 3.60).abs() < 1e-9);
    let seed = summarise(&[rep]).remove(3);
    assert_eq!(
        seed.verdict,
        "a non-coherent walk costs more driver CPU per GB than a coherent one, beyond the spread; flushing exactly the lines written costs less CPU per GB than the seed's flushing cost throughput, beyond the spread by more than a factor of 1.15"
    );
    assert!(
        seed.ours_spread
            .is_some_and(|s| s.min > 0.65 && s.max < 0.67),
        "{:?}",
        seed.ours_spread
    );
}

#[test]
fn seed_003_gives_no_verdict_on_the_size_where_the_rounds_straddle_the_seeds_figure() {
    // Paired ratios 0.50 .. 0.62 hold the seed's 0.554.
    let rep = seed_report(&[
        (Walk::Coherent, "deferred", &[1.00, 1.00, 1.00, 1.00, 1.00]),
        (
            Walk::NonCoherent,
            "deferred",
            &[2.00, 1.90, 1.80, 1.70, 1.61],
        ),
    ]);
    let seed = summarise(&[rep]).remove(3);
    assert_eq!(
        seed.verdict,
        "a non-coherent walk costs more driver CPU per GB than a coherent one, beyond the spread; flushing against the seed's: the spread meets the seed's figure within a factor of 1.15, so no verdict on the size"
    );
    // Nine rounds, ratios 0.40 .. 0.80: the median's interval (the 2nd to
    // the 8th round, 0.45 .. 0.75) still holds 0.554, and is named.
    let c = [1.0; 9];
    let n: Vec<f64> = (0..9).map(|i| 1.0 / (0.40 + 0.05 * i as f64)).collect();
    let rep = seed_report(&[
        (Walk::Coherent, "deferred", &c),
        (Walk::NonCoherent, "deferred", &n),
    ]);
    let seed = summarise(&[rep]).remove(3);
    assert_eq!(
        seed.verdict,
        "a non-coherent walk costs more driver CPU per GB than a coherent one, beyond the median's interval; flushing against the seed's: the median's interval meets the seed's figure within a factor of 1.15, so no verdict on the size"
    );
}

/// A round that moved nothing (no CPU per GB on one side: a starved round
/// on a loaded machine) is left out of the paired ratios instead of
/// taking the whole figure with it; rounds that do not pair give none.
#[test]
fn a_round_that_moved_nothing_is_left_out_of_the_paired_ratios() {
    let compared = |c: &[f64], n: &[f64]| -> IperfTcpRow {
        let rows = |w: Walk, cpu: &[f64]| {
            median_round(
                cpu.iter()
                    .map(|&x| round(w, "deferred", 1430.0, x))
                    .collect(),
            )
        };
        let mut rows = vec![rows(Walk::Coherent, c), rows(Walk::NonCoherent, n)];
        compare(&mut rows);
        rows.remove(1)
    };
    let r = compared(&[2.0, 0.0, 2.2, 2.0], &[4.0, 3.0, 4.0, 0.0]);
    let s = r.saturated_vs_coherent_spread.expect("two rounds pair");
    assert_eq!((s.min, s.max), (0.5, 0.55));
    // Two pairs: a figure with a spread, too few for the median's interval.
    assert_eq!(r.saturated_vs_coherent, Some(s.median));
    assert_eq!(r.saturated_vs_coherent_interval, None);
    // Rounds that do not pair up, or no round that pairs: no figure.
    assert_eq!(compared(&[2.0, 2.0], &[4.0]).saturated_vs_coherent, None);
    assert_eq!(compared(&[0.0], &[4.0]).saturated_vs_coherent, None);
}

/// One paired round is seed 003's figure but not a spread: the verdict
/// rule gives no verdict from it (before, a one-round "spread" was judged
/// as if the rounds bounded the median).
#[test]
fn one_round_gives_seed_003_a_figure_but_no_verdict() {
    let mut rows = vec![
        round(Walk::Coherent, "deferred", 1000.0, 2.0),
        round(Walk::NonCoherent, "deferred", 1000.0, 4.0),
    ];
    compare(&mut rows);
    let nc = &rows[1];
    assert_eq!(nc.saturated_vs_coherent, Some(0.5));
    assert!(nc.saturated_vs_coherent_spread.is_none());
}

/// A co-runner that lands on one round of nine (here the non-coherent
/// figure of round 4 reads 1.2 s/GB where the others read 2.4-2.5): its
/// paired ratio (1.5) is an extreme round, which the median's interval
/// (the 2nd to the 8th round) leaves out, so both halves of seed 003's
/// verdict stand and name that interval. Judged on the lowest to highest
/// round instead (five rounds, no interval narrower than the spread), the
/// same disturbed round held both 1.0 and the seed's 0.554, and the
/// direction got no verdict.
#[test]
fn a_co_runner_on_one_round_does_not_move_seed_003s_verdict() {
    let c: Vec<f64> = (0..9).map(|i| 1.78 + 0.003 * i as f64).collect();
    let mut n: Vec<f64> = (0..9).map(|i| 2.42 + 0.01 * i as f64).collect();
    n[4] = 1.20;
    let rep = seed_report(&[
        (Walk::Coherent, "deferred", &c),
        (Walk::NonCoherent, "deferred", &n),
    ]);
    let row = &rep.contract["rows"][1];
    let i = row["saturated_vs_coherent_interval"]
        .as_array()
        .expect("nine rounds give an interval");
    let (lo, hi) = (i[0].as_f64().unwrap(), i[1].as_f64().unwrap());
    assert!(lo > 0.554 && hi < 1.0, "{lo} {hi}");
    assert!(row["saturated_vs_coherent_spread"]["max"].as_f64().unwrap() > 1.0);
    let seed = summarise(&[rep]).remove(3);
    assert_eq!(
        seed.verdict,
        "a non-coherent walk costs more driver CPU per GB than a coherent one, beyond the median's interval; flushing exactly the lines written costs less CPU per GB than the seed's flushing cost throughput, beyond the median's interval by more than a factor of 1.15"
    );
    assert!(
        seed.detail.contains("the median's interval"),
        "{}",
        seed.detail
    );
    // Five rounds, the disturbed one among them: the interval is the
    // lowest to the highest round, which holds 1.0.
    let rep = seed_report(&[
        (Walk::Coherent, "deferred", &c[..5]),
        (
            Walk::NonCoherent,
            "deferred",
            &[2.45, 2.50, 1.20, 2.48, 2.46],
        ),
    ]);
    let seed = summarise(&[rep]).remove(3);
    assert!(
        seed.verdict
            .starts_with("a non-coherent walk's extra driver CPU per GB is within the spread"),
        "{}",
        seed.verdict
    );
}

#[test]
fn a_row_that_moved_nothing_in_its_window_is_invalid() {
    let mut rows = vec![
        round(Walk::Coherent, "deferred", 1430.0, 1.6),
        round(Walk::Coherent, "strict", 0.0, f64::INFINITY),
    ];
    mark_physics(&mut rows);
    assert!(rows[0].valid, "{rows:?}");
    assert!(!rows[1].valid);
    assert!(
        rows[1].why.as_deref().is_some_and(|w| w.starts_with(
            "measurement invalid: strict (coherent) moved 0.0 Mbit/s in a round's window"
        )),
        "{:?}",
        rows[1].why
    );
}

#[test]
fn a_run_or_round_that_moved_nothing_is_no_figure() {
    // A round's figure is never a run that moved nothing while another
    // moved data.
    let r = round_row(vec![
        round(Walk::Coherent, "deferred", 0.0, 0.0),
        round(Walk::Coherent, "deferred", 1400.0, 1.7),
        round(Walk::Coherent, "deferred", 1420.0, 1.9),
    ]);
    assert_eq!(r.cpu_s_per_gb, 1.7);
    // A row one of whose rounds moved nothing is invalid, its median
    // round's figures whatever they are.
    let mut rows = vec![median_round(vec![
        round(Walk::Coherent, "deferred", 0.0, 0.0),
        round(Walk::Coherent, "deferred", 900.0, 1.2),
        round(Walk::Coherent, "deferred", 950.0, 1.3),
    ])];
    mark_physics(&mut rows);
    assert!(!rows[0].valid, "{rows:?}");
    assert!(
        rows[0].why.as_deref().is_some_and(|w| w.starts_with(
            "measurement invalid: deferred (coherent) moved 0.0 Mbit/s in a round's window"
        )),
        "{:?}",
        rows[0].why
    );
}

/// Seed 003's size is judged against the seed's 0.554 taken to reach a
/// factor of 1.15 either way: rounds of 0.57-0.62 lie wholly above the
/// point but meet the band, so no verdict on the size; rounds of
/// 0.45-0.47 lie below the band, so flushing costs as much as the seed's
/// or more.
#[test]
fn seed_003_judges_the_size_against_the_seeds_figure_with_its_margin() {
    let verdict = |c: &[f64]| {
        let rep = seed_report(&[
            (Walk::Coherent, "deferred", c),
            (Walk::NonCoherent, "deferred", &[2.0, 2.0, 2.0]),
        ]);
        summarise(&[rep]).remove(3).verdict
    };
    assert_eq!(
        verdict(&[1.14, 1.18, 1.24]),
        "a non-coherent walk costs more driver CPU per GB than a coherent one, beyond the spread; flushing against the seed's: the spread meets the seed's figure within a factor of 1.15, so no verdict on the size"
    );
    assert_eq!(
        verdict(&[0.90, 0.92, 0.94]),
        "a non-coherent walk costs more driver CPU per GB than a coherent one, beyond the spread; flushing costs as much CPU per GB as the seed's or more, beyond the spread by more than a factor of 1.15"
    );
}
