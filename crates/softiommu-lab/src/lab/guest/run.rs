//! The guest runs (ours strict and lazy, blk and net, and the anchor), their JSON rows and medians.

use serde_json::{json, Value};
use softiommu_vhost::guest::{
    run_blk, run_net, GuestDevice, GuestError, GuestKit, GuestRun, IommuMode,
};

use crate::error::LabResult;
use crate::report::Report;

use super::args::*;
use super::priority::{Priority, RAISED_NICE};
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
        "miss_timeouts": s.miss_timeouts,
        "guest_seconds": r.guest_seconds(),
        "guest_seconds_basis": "tcg",
        "checksum_ok": r.checksum_ok(),
        "wall_seconds": r.wall_seconds,
        "host": host_json(r),
    })
}

/// Where a run's time went on the host: the load around it, QEMU's
/// threads and (our runs) the back-end's socket and queue threads and the
/// IOTLB round trips, per I/O where an I/O count is known.
pub(super) fn host_json(r: &GuestRun) -> Value {
    let ios = r.ios().max(1) as f64;
    let ms = |ns: u64| ns as f64 / 1e6;
    let thread = |name: &str| {
        r.sched
            .qemu_threads
            .iter()
            .find(|(n, _)| n == name || (name == "main" && n.starts_with("qemu-system")))
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    };
    let (main, vcpu, worker) = (thread("main"), thread("CPU 0/TCG"), thread("worker"));
    let mut v = json!({
        "host_read_seconds": r.sched.host_read_seconds,
        "io_thread_nice": r.sched.io_nice,
        "load_start": r.sched.load_start,
        "load_end": r.sched.load_end,
        "qemu_main_cpu_ms": ms(main.run_ns),
        "qemu_main_wait_ms": ms(main.wait_ns),
        "qemu_main_slices": main.slices,
        "qemu_vcpu_cpu_ms": ms(vcpu.run_ns),
        "qemu_vcpu_wait_ms": ms(vcpu.wait_ns),
        "qemu_pool_cpu_ms": ms(worker.run_ns),
    });
    if let Some(rep) = &r.report {
        let t = &rep.timing;
        let per = |ns: u64, n: u64| ns as f64 / n.max(1) as f64 / 1000.0;
        v["qemu_main_cpu_us_per_io"] = json!(main.run_ns as f64 / ios / 1000.0);
        v["iotlb_messages"] = json!(t.iotlb_messages);
        v["iotlb_handle_us"] = json!(per(t.iotlb_handle_ns, t.iotlb_messages));
        v["frontend_turns"] = json!(t.frontend_turns);
        v["frontend_turn_us"] = json!(per(t.frontend_turn_ns, t.frontend_turns));
        v["frontend_turns_over_1ms"] = json!(t.frontend_turns_over_1ms);
        v["frontend_turn_over_1ms_ms"] = json!(ms(t.frontend_turn_over_1ms_ns));
        v["socket_cpu_ms"] = json!(ms(t.socket.run_ns));
        v["socket_wait_ms"] = json!(ms(t.socket.wait_ns));
        v["socket_slices"] = json!(t.socket.slices);
        v["worker_cpu_ms"] = json!(ms(rep.blk.worker_cpu_ns + rep.net.worker_cpu_ns));
        v["worker_wait_ms"] = json!(ms(rep.blk.worker_wait_ns));
        v["worker_slices"] = json!(rep.blk.worker_slices);
    }
    v
}

const VHOST: GuestDevice = GuestDevice::VhostBlk;
const QEMU: GuestDevice = GuestDevice::QemuBlk;

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

/// `[min, max]` of `v` (empty without values).
pub(super) fn spread(v: &[f64]) -> Vec<f64> {
    let lo = v.iter().copied().reduce(f64::min);
    let hi = v.iter().copied().reduce(f64::max);
    lo.into_iter().chain(hi).collect()
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
    // Ours and the anchor alike, put back when the lab ends.
    let priority = (!a.no_raise_priority).then(|| Priority::raise(RAISED_NICE));
    let modes = [IommuMode::Strict, IommuMode::Lazy];
    let mut blk: [Vec<GuestRun>; 2] = Default::default();
    let mut net: [Vec<GuestRun>; 2] = Default::default();
    // anchors[0]: QEMU's virtio-blk under strict, [1]: under lazy.
    let mut anchors: [Vec<GuestRun>; 2] = Default::default();
    let (mut strict_ratios, mut lazy_ratios) = (Vec::new(), Vec::new());
    let mut lazy_lazy_ratios = Vec::new();
    // One boot first, discarded: the first QEMU start reads the binary,
    // the kernel and the initramfs from disk.
    progress("warm-up: anchor, QEMU's own virtio-blk (discarded)");
    let _ = run_blk(&kit, GuestDevice::QemuBlk, IommuMode::Strict, mib, DEADLINE)?;
    let mut per_round = Vec::new();
    for round in 1..=rounds {
        // Each of our blk runs next to the anchor in the same guest mode;
        // odd rounds run strict's pair first (ours, then the anchor) and
        // lazy's after (the anchor, then ours), even rounds the mirror
        // image, so no run always comes first and each ratio compares
        // neighbours.
        let order: [(usize, GuestDevice); 4] = if round % 2 == 1 {
            [(0, VHOST), (0, QEMU), (1, QEMU), (1, VHOST)]
        } else {
            [(1, VHOST), (1, QEMU), (0, QEMU), (0, VHOST)]
        };
        for (i, device) in order {
            let mode = modes[i];
            let what = match device {
                GuestDevice::VhostBlk => "our vhost-user-blk",
                GuestDevice::QemuBlk => "the anchor, QEMU's own virtio-blk",
            };
            progress(&format!(
                "round {round}/{rounds}: {} on {what} ({mib} MiB)",
                mode.name()
            ));
            let r = run_blk(&kit, device, mode, mib, DEADLINE)?;
            match device {
                GuestDevice::VhostBlk => blk[i].push(r),
                GuestDevice::QemuBlk => anchors[i].push(r),
            }
        }
        let (s, l) = (&blk[0][round - 1], &blk[1][round - 1]);
        let (a_s, a_l) = (&anchors[0][round - 1], &anchors[1][round - 1]);
        let (ts, tl) = (a_s.guest_seconds(), a_l.guest_seconds());
        let (sr, lr) = (ratio(s.guest_seconds(), ts), ratio(l.guest_seconds(), ts));
        let llr = ratio(l.guest_seconds(), tl);
        strict_ratios.extend(sr);
        lazy_ratios.extend(lr);
        lazy_lazy_ratios.extend(llr);
        let host = |r: &GuestRun| r.sched.host_read_seconds;
        let load = |r: &GuestRun| r.sched.load_start;
        per_round.push(json!({
            "round": round,
            "order": order.map(|(i, d)| format!("{} {}", if d == VHOST { "ours" } else { "anchor" }, modes[i].name())),
            "strict_seconds": s.guest_seconds(),
            "lazy_seconds": l.guest_seconds(),
            "anchor_seconds": ts,
            "lazy_anchor_seconds": tl,
            "strict_over_anchor": sr,
            "lazy_over_anchor": lr,
            "lazy_over_lazy_anchor": llr,
            "host_read_seconds": [host(s), host(l), host(a_s), host(a_l)],
            "load": [load(s), load(l), load(a_s), load(a_l)],
        }));
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
    let bad = checksum_failures(blk.iter().chain(&net).chain(&anchors).flatten());
    let rows: Vec<GuestRun> = blk.into_iter().chain(net).map(median_run).collect();
    let secs = |v: &[GuestRun]| v.iter().map(GuestRun::guest_seconds).collect::<Vec<_>>();
    let (anchor_seconds, lazy_anchor_seconds) = (secs(&anchors[0]), secs(&anchors[1]));
    let [anchor, lazy_anchor] = anchors.map(median_run);
    let medians = Medians {
        strict_time: median(&strict_ratios),
        lazy_time: median(&lazy_ratios),
        blk_invalidations: median(&blk_inv),
        net_invalidations: median(&net_inv),
    };
    let mut rep = report(&kit, &rows, &anchor, medians, bad, (mib, net_mib, rounds));
    rep.contract["strict_read_time_over_anchor_per_round"] = json!(strict_ratios);
    rep.contract["lazy_read_time_over_anchor_per_round"] = json!(lazy_ratios);
    rep.contract["strict_read_time_over_anchor_spread"] = json!(spread(&strict_ratios));
    rep.contract["lazy_read_time_over_anchor_spread"] = json!(spread(&lazy_ratios));
    rep.contract["anchor_guest_seconds_per_round"] = json!(anchor_seconds);
    rep.contract["anchor_host"] = host_json(&anchor);
    rep.contract["lazy_anchor"] = json!({
        "device": "qemu-virtio-blk",
        "mode": "lazy",
        "guest_seconds": lazy_anchor.guest_seconds(),
        "guest_seconds_basis": "tcg",
        "checksum_ok": lazy_anchor.checksum_ok(),
        "guest_seconds_per_round": lazy_anchor_seconds,
        "host": host_json(&lazy_anchor),
    });
    if let Some(r) = median(&lazy_lazy_ratios) {
        rep.notes.push(format!(
            "our blk lazy read time / the anchor's under lazy: {r:.2} {TCG_MARK} (anchor lazy {} s)",
            lazy_anchor.guest_seconds().map_or("-".into(), |t| format!("{t:.2}"))
        ));
    }
    rep.contract["lazy_read_time_over_lazy_anchor"] = json!(median(&lazy_lazy_ratios));
    rep.contract["lazy_read_time_over_lazy_anchor_per_round"] = json!(lazy_lazy_ratios);
    rep.contract["lazy_read_time_over_lazy_anchor_spread"] = json!(spread(&lazy_lazy_ratios));
    rep.contract["blk_rounds"] = json!(per_round);
    rep.contract["warmup_discarded"] = json!(true);
    rep.contract["priority"] = match &priority {
        None => json!({"raised": null, "why_not": "--no-raise-priority"}),
        Some(p) => json!({"raised": p.how, "nice": p.how.map(|_| RAISED_NICE), "why_not": p.why}),
    };
    drop(priority);
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
