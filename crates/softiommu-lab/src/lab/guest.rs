//! `softiommu lab guest`: seed 000 in its own code. A Debian 6.1 guest
//! under QEMU (TCG) writes and reads back a disk on our vhost-user-blk
//! back-end, then exchanges a checksummed TCP transfer over our
//! vhost-user-net back-end, its intel-iommu driver in strict then lazy
//! mode driving the back-end's device IOTLB; the back-end counts updates,
//! invalidations and misses per I/O and its own CPU per I/O. Beside it,
//! the same guest and disk on QEMU's own virtio-blk (strict) as the anchor
//! for guest read time, in the same round.
//!
//! An I/O is one descriptor chain our back-end served: a block request,
//! or a network frame (a TCP segment, an acknowledgement, an ARP frame),
//! transmitted plus received.
//!
//! Guest times are TCG times (an emulated CPU, ~10-100x slower than
//! hardware): only their ratios mean anything, and they are marked so
//! (`‡` in the table, `guest_seconds_basis: "tcg"` in JSON). Without the
//! guest kit (`scripts/guest-kit.sh`) the report says it was skipped and
//! why, in one line.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use softiommu_vhost::guest::{
    run_blk, run_net, GuestDevice, GuestError, GuestKit, GuestRun, IommuMode,
};

use crate::args::Ranged;
use crate::error::LabResult;
use crate::report::{Column, Param, Report, Table, Unit};

/// Options of `lab guest`.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuestArgs {
    /// Disk size in MiB the guest writes and reads back (8..=512).
    #[arg(long, default_value = "32")]
    pub mib: Ranged<8, 512>,
    /// MiB the guest sends, and receives, over TCP for the virtio-net rows
    /// (1..=64).
    #[arg(long, default_value = "4")]
    pub net_mib: Ranged<1, 64>,
    /// Rounds, each running every row and the anchor side by side; the
    /// median round of each row is reported, and the time ratio is the
    /// median of the rounds' ratios (1..=9).
    #[arg(long, default_value = "1")]
    pub rounds: Ranged<1, 9>,
    /// A smaller disk (16 MiB) and transfer (1 MiB).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for GuestArgs {
    fn default() -> Self {
        Self {
            mib: Ranged::new(32),
            net_mib: Ranged::new(4),
            rounds: Ranged::new(1),
            quick: false,
            json: false,
        }
    }
}

const DEADLINE: Duration = Duration::from_secs(600);
/// The mark on guest (TCG) times.
const TCG_MARK: &str = "‡";
/// What `guest_seconds` is, in the JSON.
const TIME_BASIS: &str = "guest_seconds are TCG guest time (QEMU's emulated CPU, 10-100x slower than hardware, shared with the back-end): compare ratios within one run only; device_cpu_us_per_io is host CPU time of the back-end's threads";

/// The JSON row of one of our runs.
fn row_json(r: &GuestRun) -> Value {
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
fn median_run(mut runs: Vec<GuestRun>) -> GuestRun {
    runs.sort_by(|a, b| {
        let k = |r: &GuestRun| r.guest_seconds().unwrap_or(f64::INFINITY);
        k(a).total_cmp(&k(b))
    });
    let mid = (runs.len() - 1) / 2;
    runs.swap_remove(mid)
}

/// The median (the mean of the middle two for an even count).
fn median(v: &[f64]) -> Option<f64> {
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
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
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
fn skipped(e: &GuestError) -> Report {
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
    let rounds = a.rounds.get() as usize;
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
    let rows: Vec<GuestRun> = blk.into_iter().chain(net).map(median_run).collect();
    let anchor = median_run(anchors);
    let mut rep = report(
        &kit,
        &rows,
        &anchor,
        median(&strict_ratios),
        median(&lazy_ratios),
        (mib, net_mib, rounds),
    );
    rep.contract["strict_read_time_over_anchor_per_round"] = json!(strict_ratios);
    rep.contract["lazy_read_time_over_anchor_per_round"] = json!(lazy_ratios);
    Ok(rep)
}

/// Lazy's invalidations per I/O over strict's, for `device`'s rows.
fn lazy_over_strict(rows: &[Value], device: &str) -> Option<f64> {
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

/// The typed report; its contract is the JSON object `--json` prints.
fn report(
    kit: &GuestKit,
    runs: &[GuestRun],
    anchor: &GuestRun,
    strict_ratio: Option<f64>,
    lazy_ratio: Option<f64>,
    (mib, net_mib, rounds): (u64, u64, usize),
) -> Report {
    let kernel = runs
        .iter()
        .find_map(|r| r.field("kernel"))
        .map(str::to_string)
        .or_else(|| kit.kernel_release());
    let rows: Vec<Value> = runs.iter().map(row_json).collect();
    let bad: Vec<String> = runs
        .iter()
        .chain([anchor])
        .filter(|r| !r.checksum_ok())
        .map(|r| {
            format!(
                "{} {}: checksum mismatch ({})",
                r.device,
                r.mode.name(),
                r.result
            )
        })
        .collect();
    let blk_ratio = lazy_over_strict(&rows, "virtio-blk");
    let net_ratio = lazy_over_strict(&rows, "virtio-net");
    let mut contract = json!({
        "lab": "guest",
        "kernel": kernel,
        "disk_mib": mib,
        "net_mib": net_mib,
        "rounds": rounds,
        "time_basis": TIME_BASIS,
        "rows": rows,
        "anchor": {
            "device": "qemu-virtio-blk",
            "mode": "strict",
            "guest_seconds": anchor.guest_seconds(),
            "guest_seconds_basis": "tcg",
            "checksum_ok": anchor.checksum_ok(),
        },
        "lazy_over_strict_invalidations_per_io": blk_ratio,
        "net_lazy_over_strict_invalidations_per_io": net_ratio,
        "strict_read_time_over_anchor": strict_ratio,
        "lazy_read_time_over_anchor": lazy_ratio,
    });
    if !bad.is_empty() {
        contract["valid"] = json!(false);
        contract["why"] = json!(bad.join("; "));
    }
    let mut t = Table::new(
        "results",
        format!(
            "kernel {}, {mib} MiB disk, {net_mib} MiB each way over TCP, QEMU TCG (guest times {TCG_MARK}: emulated CPU, ratios only)",
            kernel.as_deref().unwrap_or("?")
        ),
        vec![
            Column::label("device"),
            Column::label("mode"),
            Column::metric("ios", "ios", Unit::Count, 0),
            Column::metric("iotlb_updates", "updates", Unit::Count, 0),
            Column::metric("iotlb_invalidations", "invalidations", Unit::Count, 0),
            Column::metric("iotlb_misses", "misses", Unit::Count, 0),
            Column::metric("invalidations_per_io", "inv/io", Unit::Count, 2),
            Column::metric("device_cpu_us_per_io", "device CPU/io", Unit::Us, 1),
            Column::metric("miss_rtt_us", "miss round trip", Unit::Us, 0),
            Column::metric(
                "guest_seconds",
                &format!("guest time {TCG_MARK}"),
                Unit::S,
                2,
            ),
            Column::text("checksum"),
        ],
    );
    for (r, j) in runs.iter().zip(&rows) {
        let f = |k: &str| j[k].as_f64();
        t.row(vec![
            r.device.into(),
            r.mode.name().into(),
            f("ios").into(),
            f("iotlb_updates").into(),
            f("iotlb_invalidations").into(),
            f("iotlb_misses").into(),
            f("invalidations_per_io").into(),
            f("device_cpu_us_per_io").into(),
            f("miss_rtt_us").into(),
            r.guest_seconds().into(),
            if r.checksum_ok() { "ok" } else { "BAD" }.into(),
        ]);
    }
    let dash = || crate::report::Cell::Missing;
    t.row(vec![
        "qemu-virtio-blk".into(),
        "strict".into(),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
        anchor.guest_seconds().into(),
        if anchor.checksum_ok() { "ok" } else { "BAD" }.into(),
    ]);
    let mut rep = Report::new(
        "lab guest",
        "a Debian guest under QEMU drives our vhost-user back-ends' IOTLB, strict vs lazy, beside QEMU's own virtio-blk",
        contract,
    )
    .seed("000");
    rep.params = vec![
        Param::new("disk_mib", mib, Unit::Count),
        Param::new("net_mib", net_mib, Unit::Count),
        Param::new("rounds", rounds, Unit::Count),
        Param::text("kernel", kernel.as_deref().unwrap_or("?")),
    ];
    rep.tables.push(t);
    rep.notes.push(format!(
        "ios: a block request, or a network frame (tx + rx); guest time {TCG_MARK}: the guest's read of the disk, or its TCP send plus receive, in TCG time"
    ));
    if let Some(r) = strict_ratio {
        rep.notes.push(format!(
            "our blk strict read time / the anchor's: {r:.2} {TCG_MARK} (lazy: {})",
            lazy_ratio.map_or("-".into(), |l| format!("{l:.2}"))
        ));
    }
    if let Some(r) = blk_ratio {
        rep.notes
            .push(format!("blk lazy / strict invalidations per I/O: {r:.3}"));
    }
    if let Some(r) = net_ratio {
        rep.notes
            .push(format!("net lazy / strict invalidations per I/O: {r:.3}"));
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;
    use softiommu_vhost::guest::HostSide;
    use softiommu_vhost::peer::PeerReport;
    use softiommu_vhost::{IotlbStats, SessionEnd, SessionReport};

    fn net_run(mode: IommuMode, invalidations: u64) -> GuestRun {
        let line = "ok=1 sent=s got=g send_ms=1000 recv_ms=1000";
        let (_, _, wire) = softiommu_virtio::net::wire(Default::default());
        GuestRun {
            device: "virtio-net",
            mode,
            result: line.into(),
            fields: line
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            dmesg: Vec::new(),
            report: Some(SessionReport {
                end: SessionEnd::Disconnected,
                iotlb: IotlbStats {
                    updates: 400,
                    invalidations,
                    misses: 400,
                    ..Default::default()
                },
                blk: Default::default(),
                net: softiommu_vhost::NetStats {
                    tx_frames: 60,
                    rx_frames: 40,
                    worker_cpu_ns: 150_000,
                    ..Default::default()
                },
                rejected_messages: 0,
                last_rejection: None,
                acked_features: 0,
                session_cpu_ns: 50_000,
            }),
            host: HostSide::Net {
                peer: PeerReport {
                    received: 1,
                    received_sha256: Some("s".into()),
                    sent: 1,
                    sent_sha256: Some("g".into()),
                    timed_out: false,
                },
                wire,
            },
            wall_seconds: 3.0,
        }
    }

    /// A virtio-net run is a row of its own: frames as I/Os, the device's
    /// CPU per frame, its guest time marked as TCG time.
    #[test]
    fn a_net_run_is_a_row_with_frames_as_ios_and_device_cpu_per_io() {
        let j = row_json(&net_run(IommuMode::Lazy, 20));
        assert_eq!(j["device"], "virtio-net");
        assert_eq!(j["mode"], "lazy");
        assert_eq!(j["ios"], 100);
        assert_eq!(j["io"], "frame (tx + rx)");
        assert_eq!(j["iotlb_invalidations"], 20);
        assert_eq!(j["invalidations_per_io"], 0.2);
        assert_eq!(j["device_cpu_us_per_io"], 2.0);
        assert_eq!(j["guest_seconds"], 2.0);
        assert_eq!(j["guest_seconds_basis"], "tcg");
        assert_eq!(j["checksum_ok"], true);
        let rows = vec![
            row_json(&net_run(IommuMode::Strict, 200)),
            row_json(&net_run(IommuMode::Lazy, 20)),
        ];
        assert_eq!(lazy_over_strict(&rows, "virtio-net"), Some(0.1));
        assert_eq!(lazy_over_strict(&rows, "virtio-blk"), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0]), Some(1.5));
        assert_eq!(median(&[]), None);
    }

    /// Without the kit the lab still reports: one line saying it was
    /// skipped, why and how to get the kit, and a contract saying so
    /// (which `run` turns into the scenario's one progress line).
    #[test]
    fn a_missing_kit_is_one_skipped_line_not_a_silent_pass() {
        let mut lines = Vec::new();
        let rep = run_with(
            &GuestArgs::default(),
            Err(GuestError::NotInstalled {
                dir: "/nowhere".into(),
            }),
            &mut |l| lines.push(l.to_string()),
        )
        .expect("a skip is a report");
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(rep.notes.len(), 1, "{:?}", rep.notes);
        assert!(
            rep.notes[0].starts_with("lab guest skipped: no guest kit at /nowhere")
                && rep.notes[0].contains("scripts/guest-kit.sh"),
            "{:?}",
            rep.notes
        );
        let why = crate::cmd::run::skipped_why(&rep).expect("skipped");
        assert!(why.contains("scripts/guest-kit.sh"), "{why}");
        assert!(rep.tables.is_empty());
        assert!(crate::validity::invalid(&rep).is_none());
    }
}
