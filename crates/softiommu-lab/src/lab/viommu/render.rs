//! The typed report of `lab viommu`.

use super::{ViommuReport, ANCHOR, SSD_DEVICE};
use crate::report::{contract, Column, Modelled, Param, Report, Table, Unit};

/// The typed report.
pub(super) fn report(r: &ViommuReport, rounds: u64) -> Report {
    // The ssd rows carry the device's modelled time, and every row
    // the modelled exits (unless --exit-us 0).
    let modelled = r.exit_us > 0.0 || r.rows.iter().any(|x| x.device_us_per_io > 0.0);
    let mut t = Table::new(
        "results",
        format!(
            "{} KiB reads on virtio-blk through a virtio-iommu, depth {} (the {SSD_DEVICE} rows: {} KiB at depth {}), {} reads per row{}",
            r.bs / 1024,
            r.depth,
            r.bw_bs / 1024,
            r.bw_depth,
            r.ios,
            if r.quick { ", quick" } else { "" }
        ),
        vec![
            Column::label("device"),
            Column::label("mode"),
            Column::metric("bs", "bytes/read", Unit::Count, 0),
            Column::metric("depth", "depth", Unit::Count, 0),
            Column::metric("iops", "reads/s", Unit::Count, 0).modelled_if(modelled),
            Column::metric("pct_of_none", "of none", Unit::Percent, 1).modelled_if(modelled),
            Column::metric("driver_cpu_us_per_io", "driver CPU/read", Unit::UsPerReq, 2)
                .modelled_if(modelled),
            Column::metric(
                "driver_wait_cpu_us_per_io",
                "driver waiting/read",
                Unit::UsPerReq,
                2,
            ),
            Column::metric("device_us_per_io", "device time/read", Unit::UsPerReq, 1)
                .modelled_if(true),
            Column::metric("requests_per_io", "requests/read", Unit::Count, 2),
            Column::metric("notifications_per_io", "notifications/read", Unit::Count, 2),
            Column::metric("invalidations_per_io", "invalidations/read", Unit::Count, 2),
        ],
    );
    for x in &r.rows {
        t.row(vec![
            x.device.clone().into(),
            x.mode.into(),
            (x.bs as f64).into(),
            (x.depth as f64).into(),
            x.iops.into(),
            x.pct_of_none.into(),
            x.driver_cpu_us_per_io.into(),
            x.driver_wait_cpu_us_per_io.into(),
            x.device_us_per_io.into(),
            x.requests_per_io.into(),
            x.notifications_per_io.into(),
            x.invalidations_per_io.into(),
        ]);
        if let Some(why) = &x.why {
            t.mark_invalid(format!("{}/{}", x.device, x.mode), why.clone());
        }
    }
    let mut rep = Report::new(
        "lab viommu",
        "the storage path through a virtio-iommu: no IOMMU, guest strict, guest lazy (Linux 6.8)",
        contract(r),
    );
    rep.params = vec![
        Param::new("ios", r.ios, Unit::Count),
        Param::new("depth", r.depth, Unit::Count),
        Param::new("rounds", rounds, Unit::Count),
        Param::text("quick", r.quick),
        Param::text("latency_model", r.latency_model),
        Param::text("device_model_us", r.device_model_us),
        Param::new("bs", r.bs, Unit::Count),
        Param::new("bw_bs", r.bw_bs, Unit::Count),
        Param::new("bw_depth", r.bw_depth, Unit::Count),
        Param::text("ssd_bytes_per_sec", r.ssd_bytes_per_sec),
        Param::text("exit_us", r.exit_us),
        Param::text("exit_model", r.exit_model),
        Param::text("load_avg_1m", r.load_avg_1m),
    ];
    rep.modelled = vec![
        Modelled {
            name: "exit_per_notification".into(),
            value: r.exit_us,
            unit: Unit::Us,
        },
        Modelled {
            name: "ssd_device_time".into(),
            value: r.device_model_us,
            unit: Unit::Us,
        },
    ];
    rep.tables.push(t);
    rep.notes.push(format!(
        "{SSD_DEVICE} ({} KiB at depth {}, bandwidth-bound): lazy >= 95 % of none and >= 1.2x strict: {}{}",
        r.bw_bs / 1024,
        r.bw_depth,
        if r.ssd_lazy_target_met { "met" } else { "NOT met" },
        if r.load_avg_1m > 2.0 {
            format!(" (load average {:.1} on this machine: the cross-thread round trips measure its scheduler too)", r.load_avg_1m)
        } else {
            String::new()
        }
    ));
    rep.notes.push(r.shapes.to_string());
    rep.notes.extend(r.notes.iter().cloned());
    rep.notes.push(format!(
        "anchor (Brucker 2023, fio on an assigned NVMe, quoted): strict {} %, lazy {} %, lazy with sync-map batching {} % of host bandwidth",
        ANCHOR[0].1, ANCHOR[1].1, ANCHOR[2].1
    ));
    rep
}
