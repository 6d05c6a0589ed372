//! The tables and plots of `lab iova-aging`.

use crate::metrics::aging::{aging_columns, vs_fresh_columns, vs_fresh_plot};
use crate::report::{contract, Axis, Column, Param, Plot, PlotKind, Report, Series, Table, Unit};

use super::args::*;
use super::out::*;

/// The typed report: the summary, the time line (fio style) and its plot.
pub(super) fn report(rep: &AgingReport, args: &AgingArgs) -> Report {
    let mut t = Table::new(
        "summary",
        format!(
            "{} jobs, {} interrupt CPUs, {:.0} s per policy: warm-up discarded, medians of the first and last quarter; the headline retained and stability vs a fresh arm of the same policy interleaved on the same thread, then per aged-arm CPU-second alone, then wall",
            rep.jobs, rep.irq_cpus, rep.seconds
        ),
        [Column::label("policy")]
            .into_iter()
            .chain(vs_fresh_columns())
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
            Column::metric("fresh_mops_per_cpu_s", "fresh per CPU-s", Unit::MopsPerS, 3),
            Column::metric("vs_fresh", "aged/fresh", Unit::Ratio, 3),
            Column::metric("tree_nodes", "tree nodes", Unit::Count, 0),
            Column::metric("cached_iovas", "cached", Unit::Count, 0),
            Column::metric("scan_steps_per_op", "scan", Unit::StepsPerOp, 1),
        ],
    );
    let window_s = rep.seconds / rep.policies.first().map_or(1, |p| p.windows.len()) as f64;
    let mut lines = Vec::new();
    let mut cpu_lines = Vec::new();
    let mut ratio_lines = Vec::new();
    for r in &rep.policies {
        t.row(
            [r.policy.clone().into()]
                .into_iter()
                .chain(r.vs_fresh.cells())
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
                w.fresh_mops_per_cpu_s.into(),
                w.vs_fresh.into(),
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
        ratio_lines.push(Series::new(
            r.policy.clone(),
            r.windows
                .iter()
                .enumerate()
                .map(|(i, w)| ((i + 1) as f64 * window_s, w.vs_fresh))
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
    out.plots
        .push(vs_fresh_plot("I/Os per CPU-second", ratio_lines));
    out.notes.push(
        "The headline, retained_vs_fresh and stability_vs_fresh: beside the aged allocator a \
         fresh one of the same policy (renewed every 250 k I/Os or 20 ms of its CPU, its \
         first 50 k I/Os or 4 ms not counted) runs the same I/O mix in slices of ~0.1 ms, one \
         after every four of the aged one's on the same thread, each slice timed on the \
         thread's CPU clock; each window's aged ÷ fresh I/Os per CPU-second (the aged slices \
         right after a fresh one against the fresh ones) is what the aging figure is taken on, so the machine's speed, \
         which a co-runner moves, cancels and only the aged allocator's own slowdown remains. \
         Beside it, labelled: retained and stability on the aged arm's I/Os per CPU-second \
         alone (a window with under a quarter of the run's median CPU time merged with its \
         neighbours), and on the wall clock (retained_wall, stability_wall); \
         retained_fresh is the fresh arm's own retained, the machine's drift over the run."
            .into(),
    );
    out
}
