use std::time::Duration;

use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu_virtio::affinity::allowed_cpus;
use softiommu_virtio::workload::{pace_period, udp_stream, UdpStreamConfig};

use crate::args::{dma_policies, Ranged, Seconds};
use crate::dma_rig::modelled;
use crate::error::{LabError, LabResult};
use crate::lab::policy_physics::{self, PairedCost, Spread};
use crate::report::Report;

use super::args::{orderings, NetperfArgs};
use super::out::{row, NetperfReport, NetperfRow};
use super::render::report;

/// Rounds a row runs when none are asked for: short rounds, many, so the
/// rows a ratio pairs run a fraction of a second apart. In `--quick`
/// runs on a shared 2-vCPU VM, 15 rounds of 0.1 s gave deferred ÷
/// pass-through medians of 1.45-1.64 over five runs, quiet and beside two
/// busy loops; 5 rounds of 0.6 s read 1.02-1.53 over three quiet ones.
pub const DEFAULT_ROUNDS: usize = 15;

/// Runs the lab.
pub fn run(args: &NetperfArgs) -> LabResult<Report> {
    let latency = args.latency.model();
    let policies = dma_policies(&args.policies);
    let orderings = orderings(&args.ordering);
    let seconds = args
        .seconds
        .map_or(if args.quick { 1.5 } else { 6.0 }, Seconds::get);
    let rounds = args.rounds.map_or(DEFAULT_ROUNDS, Ranged::us);
    let per_round = seconds / rounds as f64;
    let cpus = args.placement.pair_cpus(&allowed_cpus());
    let cells: Vec<(DmaPolicy, OrderMode)> = orderings
        .iter()
        .flat_map(|&o| policies.iter().map(move |&p| (p, o)))
        .collect();
    let one = |policy: DmaPolicy, ordering: OrderMode, offered: Option<f64>| {
        udp_stream(&UdpStreamConfig {
            policy,
            ordering,
            msg_size: args.msg_size.us(),
            duration: Duration::from_secs_f64(per_round),
            warmup: Duration::from_secs_f64((per_round * 0.4).clamp(0.1, 0.5)),
            latency,
            mtu: args.mtu.get() as u16,
            line_rate_bps: args.line_rate_mbit.get().saturating_mul(1_000_000),
            cpus,
            flush_high_water: args.flush_high_water.map(Ranged::us),
            flush_timeout: args
                .flush_timeout_ms
                .map(|ms| Duration::from_millis(ms.get())),
            offered_pps: offered,
            ..UdpStreamConfig::default()
        })
        .map_err(|source| LabError::Workload {
            run: format!("netperf-udp {policy} {ordering}"),
            source,
        })
    };
    let pass = |offered: Option<f64>| -> LabResult<Vec<NetperfRow>> {
        let mut runs: Vec<Vec<NetperfRow>> = vec![Vec::new(); cells.len()];
        // One unmeasured row first, its result discarded: the first row of
        // a pass ran 1.30-1.40x its own median in four quick runs (the
        // pass before it, or the process, still settling), and the first
        // row of round 0 is always pass-through, so that round's pair to
        // pass-through read low.
        if let Some(&(policy, ordering)) = cells.first() {
            one(policy, ordering, offered)?;
        }
        for round in 0..rounds {
            // Each round starts one row later than the one before, so no
            // policy always runs first (a position effect would fall on
            // every round of a row, which the paired comparison would
            // take for the policy's cost).
            for i in rotated(cells.len(), round) {
                let (policy, ordering) = cells[i];
                let r = one(policy, ordering, offered)?;
                runs[i].push(row(&r));
            }
        }
        let mut rows: Vec<NetperfRow> = runs.into_iter().map(median_round).collect();
        compare(&mut rows);
        Ok(rows)
    };
    let full_speed = pass(None)?;
    let pace_percent = args.pace_percent.map_or(40, |p| p.get());
    let offered = common_rate(&full_speed, pace_percent);
    let mut rows = pass(Some(offered))?;
    mark_unequal(&mut rows, offered);
    let r = NetperfReport {
        lab: "netperf-udp",
        stack: "smoltcp",
        msg_size: args.msg_size.us(),
        seconds,
        rounds,
        placement: args.placement,
        modelled: modelled(latency),
        offered_pps: offered,
        pace_percent,
        pace_period_ms: pace_period(offered).as_secs_f64() * 1e3,
        rows,
        full_speed,
    };
    Ok(report(&r, args, &args.placement.describe(&cpus)))
}

/// The row indices of a round in the order they run: `0..n`, rotated to
/// start at `round % n`.
pub(super) fn rotated(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |j| (j + round) % n.max(1))
}

/// The paced pass's rate: `percent` of the slowest policy's maximum
/// delivered rate at full speed, its best round (at least 1 datagram per
/// second).
pub fn common_rate(full_speed: &[NetperfRow], percent: u64) -> f64 {
    let slowest = full_speed
        .iter()
        .map(|r| r.rx_pps_max)
        .fold(f64::INFINITY, f64::min);
    if slowest.is_finite() {
        (slowest * percent as f64 / 100.0).max(1.0).round()
    } else {
        1.0
    }
}

/// Fills each row's ratio to pass-through (same ordering), round by
/// round, and marks the rows whose service demand contradicts what the
/// policy must cost (in every round below the policy it must cost more
/// than, in that round).
pub fn compare(rows: &mut [NetperfRow]) {
    let base: Vec<(String, Vec<f64>)> = rows
        .iter()
        .filter(|r| r.policy == "passthrough")
        .map(|r| (r.ordering.clone(), r.service_demand_rounds.clone()))
        .collect();
    for r in rows.iter_mut() {
        let paired = base
            .iter()
            .find(|(o, _)| *o == r.ordering)
            .and_then(|(_, b)| policy_physics::paired(&r.service_demand_rounds, b));
        r.service_demand_vs_passthrough = paired.map(|p| p.spread.median);
        r.vs_passthrough_spread = paired.map(|p| p.spread);
        r.vs_passthrough_interval = paired.and_then(|p| p.interval);
    }
    let costs: Vec<PairedCost<'_>> = rows
        .iter()
        .map(|r| PairedCost {
            policy: &r.policy,
            group: &r.ordering,
            rounds: &r.service_demand_rounds,
        })
        .collect();
    let why = policy_physics::check_paired(&costs, "service demand");
    for (r, w) in rows.iter_mut().zip(why) {
        if let Some(w) = w {
            r.valid = false;
            r.why = Some(w);
        }
    }
}

/// How far a paced row's delivered rate may fall below the offered one
/// and still count as equal load (a stalled thread loses the tokens past
/// its bucket).
pub const EQUAL_LOAD_TOLERANCE: f64 = 0.10;

/// Marks the paced rows that lost datagrams or delivered less than the
/// common rate over their rounds (`rx_pps_mean`: one round's short
/// window is not the row's rate): they are not compared at equal
/// throughput.
pub(super) fn mark_unequal(rows: &mut [NetperfRow], offered: f64) {
    for r in rows.iter_mut().filter(|r| r.valid) {
        if r.drops > 0 {
            r.valid = false;
            r.why = Some(format!(
                "measurement invalid: {} datagrams lost at the common rate, so this policy did not deliver the throughput the others did",
                r.drops
            ));
        } else if r.rx_pps_mean < offered * (1.0 - EQUAL_LOAD_TOLERANCE) {
            r.valid = false;
            r.why = Some(format!(
                "measurement invalid: delivered {:.1} kpps of the {:.1} offered to every policy, averaged over its rounds (the machine did not give this row's threads the CPU), so it is not at equal load",
                r.rx_pps_mean / 1e3,
                offered / 1e3
            ));
        }
    }
}

/// A row's median round by service demand, with the spread of every
/// round; the stale window (and its completion) is the worst of every round, and the flushes
/// and drops their sums (a bound and counts, not typical values).
pub(super) fn median_round(mut runs: Vec<NetperfRow>) -> NetperfRow {
    let stale = runs
        .iter()
        .filter_map(|r| r.stale_window_ms_max)
        .reduce(f64::max);
    let completion = runs
        .iter()
        .filter_map(|r| r.stale_completion_ms_max)
        .reduce(f64::max);
    let flushes = runs.iter().filter_map(|r| r.flushes).reduce(|a, b| a + b);
    let drops = runs.iter().map(|r| r.drops).sum();
    let rx_max = runs.iter().map(|r| r.rx_pps).fold(0.0, f64::max);
    let rx_mean = runs.iter().map(|r| r.rx_pps).sum::<f64>() / runs.len().max(1) as f64;
    let per_round: Vec<f64> = runs.iter().map(|r| r.service_demand_us_per_pkt).collect();
    let spread = Spread::of(&per_round);
    runs.sort_by(|a, b| {
        a.service_demand_us_per_pkt
            .total_cmp(&b.service_demand_us_per_pkt)
    });
    let mut row = runs.swap_remove((runs.len() - 1) / 2);
    row.stale_window_ms_max = stale;
    row.stale_completion_ms_max = completion;
    row.flushes = flushes;
    row.service_demand_spread = spread;
    row.service_demand_rounds = per_round;
    row.rx_pps_max = rx_max;
    row.rx_pps_mean = rx_mean;
    if row.offered_pps.is_some() {
        row.drops = drops;
    }
    row
}
