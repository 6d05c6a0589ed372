//! The guest runs (ours strict and lazy, blk and net, and the anchor), their JSON rows and medians.

use serde_json::{json, Value};
use softiommu_vhost::guest::{
    run_blk, run_net, GuestDevice, GuestError, GuestKit, GuestRun, IommuMode,
};

use crate::error::LabResult;
use crate::report::Report;

use super::args::*;
use super::render::*;
use super::*;

/// The JSON row of one of our runs.
pub(super) fn row_json(r: &GuestRun) -> Value {
    let ios = r.ios();
    let per_io = |v: u64| v as f64 / ios.max(1) as f64;
    let s = r.report.as_ref().map(|r| r.iotlb).unwrap_or_default();
    let (queue_ns, messages_ns) = r.device_cpu_ns();
    json!({
        "mode": r.mode.name(),
        "device": r.device,
        "ios": ios,
        "io": if r.device == "virtio-net" { "frame (tx + rx)" } else { "request" },
        "iotlb_updates": s.updates,
        "iotlb_invalidations": s.invalidations,
        "iotlb_misses": s.misses,
        "iotlb_evictions": s.evictions,
        "invalidations_per_io": per_io(s.invalidations),
        "updates_per_io": per_io(s.updates),
        "misses_per_io": per_io(s.misses),
        "device_cpu_us_per_io": per_io(queue_ns + messages_ns) / 1000.0,
        "queue_cpu_us_per_io": per_io(queue_ns) / 1000.0,
        "messages_cpu_us_per_io": per_io(messages_ns) / 1000.0,
        "miss_rtt_us": s.miss_rtt_ns as f64 / s.answered.max(1) as f64 / 1000.0,
        "miss_wakeups_per_io": per_io(s.miss_wakeups),
        "miss_wait_us_per_io": per_io(s.miss_wait_ns) / 1000.0,
        "guest_seconds": r.guest_seconds(),
        "guest_seconds_basis": "tcg",
        "checksum_ok": r.checksum_ok(),
    })
}

/// The run of `runs` with the median guest time (a run without one sorts last).
pub(super) fn median_run(mut runs: Vec<GuestRun>) -> GuestRun {
    runs.sort_by(|a, b| {
        let k = |r: &GuestRun| r.guest_seconds().unwrap_or(f64::INFINITY);
        k(a).total_cmp(&k(b))
    });
    let mid = (runs.len() - 1) / 2;
    runs.swap_remove(mid)
}

/// The median (the mean of the middle two for an even count).
pub(super) fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// `a / b` for two guest times.
pub(super) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Runs the lab: finds the kit, else reports the skip.
pub fn run(a: &GuestArgs, progress: &mut dyn FnMut(&str)) -> LabResult<Report> {
    run_with(a, GuestKit::find(), progress)
}

/// The skipped report: one line (its note, and `skipped` in the
/// contract, which `run` prints as the scenario's one progress line)
/// saying why and how to get the kit.
pub(super) fn skipped(e: &GuestError) -> Report {
    let why = e.to_string();
    let mut rep = Report::new(
        "lab guest",
        "a real Linux guest on our vhost-user back-ends: skipped",
        json!({"lab": "guest", "skipped": why}),
    )
    .seed("000");
    rep.notes.push(format!("lab guest skipped: {why}"));
    rep
}

/// Runs the lab with `kit` (or reports why it cannot).
pub(crate) fn run_with(
    a: &GuestArgs,
    kit: Result<GuestKit, GuestError>,
    progress: &mut dyn FnMut(&str),
) -> LabResult<Report> {
    let kit = match kit {
        Ok(k) => k,
        Err(e) => return Ok(skipped(&e)),
    };
    let (mib, net_mib) = if a.quick {
        (16, 1)
    } else {
        (a.mib.get(), a.net_mib.get())
    };
    let rounds = a.rounds() as usize;
    let modes = [IommuMode::Strict, IommuMode::Lazy];
    let mut blk: [Vec<GuestRun>; 2] = Default::default();
    let mut net: [Vec<GuestRun>; 2] = Default::default();
    let mut anchors = Vec::new();
    let (mut strict_ratios, mut lazy_ratios) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        for (i, mode) in modes.into_iter().enumerate() {
            progress(&format!(
                "round {round}/{rounds}: {} on our vhost-user-blk ({mib} MiB)",
                mode.name()
            ));
            blk[i].push(run_blk(&kit, GuestDevice::VhostBlk, mode, mib, DEADLINE)?);
        }
        progress(&format!(
            "round {round}/{rounds}: anchor, QEMU's own virtio-blk (strict)"
        ));
        let anchor = run_blk(&kit, GuestDevice::QemuBlk, IommuMode::Strict, mib, DEADLINE)?;
        let t = anchor.guest_seconds();
        strict_ratios.extend(ratio(blk[0][round - 1].guest_seconds(), t));
        lazy_ratios.extend(ratio(blk[1][round - 1].guest_seconds(), t));
        anchors.push(anchor);
        for (i, mode) in modes.into_iter().enumerate() {
            progress(&format!(
                "round {round}/{rounds}: {} on our vhost-user-net ({net_mib} MiB each way)",
                mode.name()
            ));
            net[i].push(run_net(&kit, mode, net_mib, DEADLINE)?);
        }
    }
    let blk_inv = per_round_lazy_over_strict(&blk, "virtio-blk");
    let net_inv = per_round_lazy_over_strict(&net, "virtio-net");
    // A checksum is judged on every round's run, not only the median ones.
    let bad = checksum_failures(blk.iter().chain(&net).flatten().chain(&anchors));
    let rows: Vec<GuestRun> = blk.into_iter().chain(net).map(median_run).collect();
    let anchor = median_run(anchors);
    let medians = Medians {
        strict_time: median(&strict_ratios),
        lazy_time: median(&lazy_ratios),
        blk_invalidations: median(&blk_inv),
        net_invalidations: median(&net_inv),
    };
    let mut rep = report(&kit, &rows, &anchor, medians, bad, (mib, net_mib, rounds));
    rep.contract["strict_read_time_over_anchor_per_round"] = json!(strict_ratios);
    rep.contract["lazy_read_time_over_anchor_per_round"] = json!(lazy_ratios);
    rep.contract["lazy_over_strict_invalidations_per_io_per_round"] = json!(blk_inv);
    rep.contract["net_lazy_over_strict_invalidations_per_io_per_round"] = json!(net_inv);
    Ok(rep)
}

/// The medians over rounds the report states: read time over the
/// anchor's, and lazy's invalidations per I/O over strict's, each the
/// median of the rounds' own ratios (a round's lazy and strict runs ran
/// side by side).
pub(super) struct Medians {
    /// Our blk strict read time over the anchor's.
    pub(super) strict_time: Option<f64>,
    /// Our blk lazy read time over the anchor's.
    pub(super) lazy_time: Option<f64>,
    /// blk: lazy invalidations per I/O over strict's.
    pub(super) blk_invalidations: Option<f64>,
    /// net: lazy invalidations per I/O over strict's.
    pub(super) net_invalidations: Option<f64>,
}

/// Each round's lazy invalidations per I/O over strict's, for a device's
/// `[strict, lazy]` runs (a round missing either gives none).
pub(super) fn per_round_lazy_over_strict(runs: &[Vec<GuestRun>; 2], device: &str) -> Vec<f64> {
    runs[0]
        .iter()
        .zip(&runs[1])
        .filter_map(|(s, l)| lazy_over_strict(&[row_json(s), row_json(l)], device))
        .collect()
}

/// One line per run whose checksums do not match.
pub(super) fn checksum_failures<'a>(runs: impl Iterator<Item = &'a GuestRun>) -> Vec<String> {
    runs.filter(|r| !r.checksum_ok())
        .map(|r| {
            format!(
                "{} {}: checksum mismatch ({})",
                r.device,
                r.mode.name(),
                r.result
            )
        })
        .collect()
}

/// Lazy's invalidations per I/O over strict's, for `device`'s rows.
pub(super) fn lazy_over_strict(rows: &[Value], device: &str) -> Option<f64> {
    let inv = |mode: &str| {
        rows.iter()
            .find(|r| r["device"] == device && r["mode"] == mode)
            .and_then(|r| r["invalidations_per_io"].as_f64())
    };
    match (inv("strict"), inv("lazy")) {
        (Some(s), Some(l)) if s > 0.0 => Some(l / s),
        _ => None,
    }
}
