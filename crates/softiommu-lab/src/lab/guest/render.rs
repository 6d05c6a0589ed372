//! The tables of `lab guest`.

use serde_json::{json, Value};
use softiommu_vhost::guest::{GuestKit, GuestRun};

use crate::report::{Column, Param, Report, Table, Unit};

use super::run::*;
use super::*;

/// The typed report; its contract is the JSON object `--json` prints.
pub(super) fn report(
    kit: &GuestKit,
    runs: &[GuestRun],
    anchor: &GuestRun,
    medians: Medians,
    bad: Vec<String>,
    (mib, net_mib, rounds): (u64, u64, usize),
) -> Report {
    let Medians {
        strict_time: strict_ratio,
        lazy_time: lazy_ratio,
        blk_invalidations,
        net_invalidations,
    } = medians;
    let kernel = runs
        .iter()
        .find_map(|r| r.field("kernel"))
        .map(str::to_string)
        .or_else(|| kit.kernel_release());
    let rows: Vec<Value> = runs.iter().map(row_json).collect();
    let blk_ratio = blk_invalidations.or_else(|| lazy_over_strict(&rows, "virtio-blk"));
    let net_ratio = net_invalidations.or_else(|| lazy_over_strict(&rows, "virtio-net"));
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
        rep.notes.push(format!(
            "blk lazy / strict invalidations per I/O: {r:.3} (median of the rounds' ratios)"
        ));
    }
    if let Some(r) = net_ratio {
        rep.notes.push(format!(
            "net lazy / strict invalidations per I/O: {r:.3} (median of the rounds' ratios)"
        ));
    }
    rep
}
