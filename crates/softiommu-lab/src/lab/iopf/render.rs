//! The tables and plots of `lab iopf`.

use crate::report::{
    contract, Axis, Cell, Column, Param, Plot, PlotKind, Report, Series, Spread, Table, Unit,
};

use super::out::IopfReport;
use super::run::Plan;
use super::CHUNK;

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// The typed report.
pub(super) fn report(r: &IopfReport, plan: &Plan) -> Report {
    let mut t = Table::new(
        "results",
        "speed without IOPF (pinned, pre-mapped) and with (mapped on demand), per message length, sends and pre-map window (seed 002's table): kB per CPU-second of the work (the device thread's, which with IOPF served its own page requests inline: the miss, the request through the unit's queue, the handler's map and answer, the retry, on one core one after the other), and wall-clock kB/s beside (handler threads of their own)",
        vec![
            Column::label("msg_len"),
            Column::label("premap_pages"),
            Column::label("times"),
            Column::metric("kbps_cpu_without", "w/o IOPF per CPU-s", Unit::KbPerS, 0),
            Column::metric("kbps_cpu_with", "with IOPF per CPU-s", Unit::KbPerS, 0),
            Column::metric("cpu_ratio_pct", "with / without (CPU)", Unit::Percent, 1),
            Column::metric("kbps_without", "w/o IOPF (wall)", Unit::KbPerS, 0),
            Column::metric("kbps_with", "with IOPF (wall)", Unit::KbPerS, 0),
            Column::metric("ratio_pct", "with / without (wall)", Unit::Percent, 1),
            Column::metric("faults", "faults", Unit::Count, 0),
            Column::metric("promotions", "2 MiB promotions", Unit::Count, 0),
        ],
    );
    for ((x, pr), c) in r.rows.iter().zip(&r.promotions).zip(&r.cpu) {
        let pct = |s: Spread| Spread {
            min: s.min * 100.0,
            median: s.median * 100.0,
            max: s.max * 100.0,
        };
        t.row(vec![
            mib(x.msg_len).into(),
            x.premap_pages.to_string().into(),
            x.times.to_string().into(),
            c.kbps_per_cpu_s_without.into(),
            c.kbps_per_cpu_s_with.into(),
            Cell::figure(c.ratio * 100.0, c.ratio_spread.map(pct)),
            x.kbps_without.into(),
            x.kbps_with.into(),
            (x.ratio * 100.0).into(),
            x.faults.into(),
            pr.promotions.into(),
        ]);
    }
    let mut lat = Table::new(
        "fault_latency",
        "page request raise -> group response carried out, every run with IOPF (the handler's measurement; seed 002's handler: about 1.6 µs)",
        vec![
            Column::label("figure"),
            Column::metric("us", "raise -> answer", Unit::Us, 2),
            Column::metric("service_us", "of which handler", Unit::Us, 2),
        ],
    );
    for (k, v, s) in [
        ("p50", r.fault_latency_us.p50, r.fault_service_us.p50),
        ("p99", r.fault_latency_us.p99, r.fault_service_us.p99),
        ("max", r.fault_latency_us.max, r.fault_service_us.max),
    ] {
        lat.row(vec![k.into(), v.into(), s.into()]);
    }
    let mut rep = Report::new(
        "lab iopf",
        "I/O page faults: an accelerator's messages pinned vs mapped on demand, with a pre-map window (seed 002)",
        contract(r),
    )
    .seed("002");
    rep.params = vec![
        Param::text(
            "msg_len",
            plan.msg_lens
                .iter()
                .map(|&m| mib(m))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Param::text(
            "premap_pages",
            plan.premaps
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Param::new("repeats", plan.repeats, Unit::Count),
        Param::new("timed_sends_min", super::run::TIMED_SENDS, Unit::Count),
        Param::new("handler_threads", plan.threads, Unit::Threads),
        Param::new("handler_spin_polls", plan.spin, Unit::Count),
        Param::text(
            "placement",
            plan.cpus.map_or("os".to_string(), |(d, h)| {
                format!("device on CPU {d}, handlers on CPU {h}")
            }),
        ),
        Param::new("chunk", CHUNK, Unit::Bytes),
        Param::text("quick", plan.quick),
        Param::text("promote", if plan.promote { "on" } else { "off" }),
        Param::new("overflows", r.overflows, Unit::Count),
    ];
    rep.tables.push(t);
    rep.tables.push(lat);
    let mut series = Vec::new();
    for &m in &plan.msg_lens {
        for &p in &plan.premaps {
            let pts: Vec<(f64, f64)> = r
                .cpu
                .iter()
                .filter(|x| x.msg_len == m && x.premap_pages == p)
                .map(|x| ((x.times as f64).log10(), x.ratio * 100.0))
                .collect();
            series.push(Series::new(format!("{}, premap {p}", mib(m)), pts));
        }
    }
    rep.plots.push(Plot {
        name: "ratio".into(),
        title: "kB per CPU-second with IOPF / without, by sends over the same buffer".into(),
        kind: PlotKind::Lines,
        x: Axis::new("log10(sends)", Unit::Count),
        y: Axis::new("with / without (CPU)", Unit::Percent),
        categories: Vec::new(),
        series,
        modelled: false,
    });
    rep.notes.push(format!(
        "fault latency p50 {:.2} µs, p99 {:.2} µs, max {:.1} µs; {} overflow(s); every figure measured, none modelled",
        r.fault_latency_us.p50, r.fault_latency_us.p99, r.fault_latency_us.max, r.overflows
    ));
    rep
}
