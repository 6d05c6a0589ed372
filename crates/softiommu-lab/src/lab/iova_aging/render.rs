//! The tables and plots of `lab iova-aging`.

use crate::metrics::aging::aging_columns;
use crate::report::{contract, Axis, Column, Param, Plot, PlotKind, Report, Series, Table, Unit};

use super::args::*;
use super::out::*;

/// The typed report: the summary, the time line (fio style) and its plot.
pub(super) fn report(rep: &AgingReport, args: &AgingArgs) -> Report {
    let mut t = Table::new(
        "summary",
        format!(
            "{} jobs, {} interrupt CPUs, {:.0} s per policy: warm-up discarded, medians of the first and last quarter; retained and stability per worker CPU-second, wall beside",
            rep.jobs, rep.irq_cpus, rep.seconds
        ),
        [Column::label("policy")]
            .into_iter()
            .chain(aging_columns(Unit::MopsPerS, 3))
            .chain([
            Column::metric("peak_tree_nodes", "peak tree nodes", Unit::Count, 0),
            Column::metric("peak_cached_iovas", "peak cached", Unit::Count, 0),
            Column::metric("scan_steps", "scan steps", Unit::Count, 0),
            Column::metric("magazines_freed", "mags freed", Unit::Count, 0),
            Column::metric("cache_flushes", "flushes", Unit::Count, 0),
            ])
            .collect(),
    );
    let mut tl = Table::new(
        "timeline",
        "the time line, window by window (fio's status line)",
        vec![
            Column::label("policy"),
            Column::label("window"),
            Column::metric("mops", "throughput (wall)", Unit::MopsPerS, 3),
            Column::metric("cpu_s", "worker CPU", Unit::S, 3),
            Column::metric("mops_per_cpu_s", "per CPU-s", Unit::MopsPerS, 3),
            Column::metric("tree_nodes", "tree nodes", Unit::Count, 0),
            Column::metric("cached_iovas", "cached", Unit::Count, 0),
            Column::metric("scan_steps_per_op", "scan", Unit::StepsPerOp, 1),
        ],
    );
    let window_s = rep.seconds / rep.policies.first().map_or(1, |p| p.windows.len()) as f64;
    let mut lines = Vec::new();
    let mut cpu_lines = Vec::new();
    for r in &rep.policies {
        t.row(
            [r.policy.clone().into()]
                .into_iter()
                .chain(r.aging.cells(1e6))
                .chain([
                    r.peak_tree_nodes.into(),
                    r.peak_cached_iovas.into(),
                    r.scan_steps.into(),
                    r.magazines_freed.into(),
                    r.cache_flushes.into(),
                ])
                .collect(),
        );
        for (i, w) in r.windows.iter().enumerate() {
            tl.row(vec![
                r.policy.clone().into(),
                (i + 1).to_string().into(),
                w.mops.into(),
                w.cpu_s.into(),
                w.mops_per_cpu_s.into(),
                w.tree_nodes.into(),
                w.cached_iovas.into(),
                w.scan_steps_per_op.into(),
            ]);
        }
        lines.push(Series::new(
            r.policy.clone(),
            r.windows
                .iter()
                .enumerate()
                .map(|(i, w)| ((i + 1) as f64 * window_s, w.mops))
                .collect(),
        ));
        cpu_lines.push(Series::new(
            r.policy.clone(),
            r.windows
                .iter()
                .enumerate()
                .map(|(i, w)| ((i + 1) as f64 * window_s, w.mops_per_cpu_s))
                .collect(),
        ));
    }
    let mut out = Report::new(
        "lab iova-aging",
        "IOVA cache growth over a long storage run, per allocator policy (seed 004)",
        contract(rep),
    )
    .seed("004");
    out.params = vec![
        Param::new("jobs", rep.jobs, Unit::Threads),
        Param::new("irq_cpus", rep.irq_cpus, Unit::Threads),
        Param::new("seconds", rep.seconds, Unit::S),
        Param::new("iodepth", args.iodepth, Unit::Count),
        Param::new("slow_pct", args.slow_pct, Unit::Percent),
        Param::new("slow_hold", args.slow_hold, Unit::Count),
    ];
    out.tables.push(t);
    tl.detail = true;
    out.tables.push(tl);
    out.plots.push(Plot {
        name: "throughput".into(),
        title: "wall-clock throughput over time per IOVA policy (a cliff is the seed's bug)".into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("throughput", Unit::MopsPerS),
        categories: Vec::new(),
        series: lines,
        modelled: false,
    });
    out.plots.push(Plot {
        name: "throughput_per_cpu_s".into(),
        title: "I/Os per worker CPU-second over time per IOVA policy (the aging figure's input)"
            .into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("M I/Os per CPU-second", Unit::MopsPerS),
        categories: Vec::new(),
        series: cpu_lines,
        modelled: false,
    });
    out.notes.push(
        "retained and stability are taken on I/Os per CPU-second of the worker threads (their \
         thread CPU clocks summed per window, with the allocator's background work), so a \
         co-runner taking the core is not aging; a window with under a quarter of the run's \
         median CPU time is merged with its neighbours. The wall-clock figures stand beside \
         them (retained_wall, stability_wall)."
            .into(),
    );
    out
}
