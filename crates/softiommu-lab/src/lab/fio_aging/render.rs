use crate::metrics::aging::{aging_columns, vs_fresh_columns, vs_fresh_plot};
use crate::report::{contract, Axis, Column, Param, Plot, PlotKind, Report, Series, Table, Unit};

use super::args::FioAgingArgs;
use super::out::FioAgingReport;

/// The typed report: the cost table, the aging summary, the time line and
/// its plot.
pub(super) fn report(rep: &FioAgingReport, args: &FioAgingArgs) -> Report {
    let mut cost = Table::new(
        "dma",
        format!(
            "{} jobs of {} {} at depth {}, {} back-end: cost per DMA policy",
            rep.jobs, args.dma_bs.text, rep.rw, rep.iodepth, rep.backend
        ),
        vec![
            Column::label("policy"),
            Column::metric("iops", "IOPS", Unit::Kiops, 1),
            Column::metric("gbps", "throughput", Unit::GbPerS, 3),
            Column::metric("driver_cpu_us_per_req", "driver CPU", Unit::UsPerReq, 2),
            Column::metric(
                "flush_timer_cpu_us_per_req",
                "of it flush timer",
                Unit::UsPerReq,
                2,
            ),
            Column::metric("device_cpu_us_per_req", "device CPU", Unit::UsPerReq, 2),
            Column::metric(
                "cpu_ratio_to_passthrough",
                "vs pass-through",
                Unit::Ratio,
                2,
            ),
            Column::metric("io_errors", "I/O errors", Unit::Count, 0),
        ],
    );
    for c in &rep.dma {
        cost.row(vec![
            c.policy.clone().into(),
            (c.iops / 1e3).into(),
            c.gbps.into(),
            c.driver_cpu_us_per_req.into(),
            c.flush_timer_cpu_us_per_req.into(),
            c.device_cpu_us_per_req.into(),
            c.cpu_ratio_to_passthrough.unwrap_or(f64::NAN).into(),
            c.io_errors.into(),
        ]);
    }
    let mut t = Table::new(
        "summary",
        format!(
            "aging, deferred: {} jobs, {} interrupt CPUs, bs {}, slow tail {} held {:.1} s, {:.0} s per policy; the headline retained and stability vs a fresh device of the same policies driven by the same job threads, then per driver CPU-second alone, then wall",
            rep.jobs,
            rep.irq_cpus,
            rep.bs,
            match (rep.slow_pct, rep.slow_per_s) {
                (Some(p), _) => format!("{p}%"),
                (None, Some(r)) => format!("{r:.0}/s per job"),
                (None, None) => "none".to_string(),
            },
            rep.slow_hold_s,
            rep.seconds
        ),
        [Column::label("policy")]
            .into_iter()
            .chain(vs_fresh_columns())
            .chain(aging_columns(Unit::Kiops, 1))
        .chain([
            Column::metric("driver_cpu_us_per_req", "driver CPU", Unit::UsPerReq, 2),
            Column::metric(
                "flush_timer_cpu_us_per_req",
                "of it flush timer",
                Unit::UsPerReq,
                2,
            ),
            Column::metric("work_cpu_us_per_req", "sampled work", Unit::UsPerReq, 2),
            Column::metric("peak_tree_nodes", "peak tree nodes", Unit::Count, 0),
            Column::metric("cached_iovas", "cached", Unit::Count, 0),
            Column::metric("scan_steps", "scan steps", Unit::Count, 0),
            Column::metric("io_errors", "I/O errors", Unit::Count, 0),
        ])
        .collect(),
    );
    let mut tl = Table::new(
        "timeline",
        "the time line, window by window (fio's status line)",
        vec![
            Column::label("policy"),
            Column::metric("t_s", "t", Unit::S, 2),
            Column::metric("iops", "IOPS (wall)", Unit::Kiops, 1),
            Column::metric("driver_cpu_s", "driver CPU", Unit::S, 3),
            Column::metric(
                "work_cpu_us_per_req",
                "per req (sampled)",
                Unit::UsPerReq,
                2,
            ),
            Column::metric("submit_cpu_us_per_req", "submit", Unit::UsPerReq, 2),
            Column::metric("reap_cpu_us_per_req", "reap", Unit::UsPerReq, 2),
            Column::metric("iops_per_cpu_s", "per CPU-s", Unit::Kiops, 1),
            Column::metric("fresh_iops_per_cpu_s", "fresh per CPU-s", Unit::Kiops, 1),
            Column::metric("vs_fresh", "aged/fresh", Unit::Ratio, 3),
            Column::metric("gbps", "throughput", Unit::GbPerS, 3),
            Column::metric("errors", "errors", Unit::Count, 0),
        ],
    );
    let mut lines = Vec::new();
    let mut cpu_lines = Vec::new();
    let mut ratio_lines = Vec::new();
    for r in &rep.policies {
        t.row(
            [r.policy.clone().into()]
                .into_iter()
                .chain(r.vs_fresh.cells())
                .chain(r.aging.cells(1e3))
                .chain([
                    r.driver_cpu_us_per_req.into(),
                    r.flush_timer_cpu_us_per_req.into(),
                    r.work_cpu_us_per_req.into(),
                    r.peak_tree_nodes.into(),
                    r.cached_iovas.into(),
                    r.scan_steps.into(),
                    r.io_errors.into(),
                ])
                .collect(),
        );
        for w in &r.windows {
            tl.row(vec![
                r.policy.clone().into(),
                w.t_s.into(),
                (w.iops / 1e3).into(),
                w.driver_cpu_s.into(),
                w.work_cpu_us_per_req.into(),
                w.submit_cpu_us_per_req.into(),
                w.reap_cpu_us_per_req.into(),
                (w.iops_per_cpu_s / 1e3).into(),
                (w.fresh_iops_per_cpu_s / 1e3).into(),
                w.vs_fresh.into(),
                w.gbps.into(),
                w.errors.into(),
            ]);
        }
        lines.push(Series::new(
            r.policy.clone(),
            r.windows.iter().map(|w| (w.t_s, w.iops / 1e3)).collect(),
        ));
        cpu_lines.push(Series::new(
            r.policy.clone(),
            r.windows
                .iter()
                .map(|w| (w.t_s, w.iops_per_cpu_s / 1e3))
                .collect(),
        ));
        ratio_lines.push(Series::new(
            r.policy.clone(),
            r.windows.iter().map(|w| (w.t_s, w.vs_fresh)).collect(),
        ));
    }
    let mut out = Report::new(
        "lab fio-aging",
        "seed 004's twelve fio jobs on virtio-blk through the IOMMU: cost per DMA policy, aging per IOVA policy",
        contract(rep),
    )
    .seed("004");
    out.params = vec![
        Param::new("jobs", rep.jobs, Unit::Threads),
        Param::new("iodepth", rep.iodepth, Unit::Count),
        Param::new("irq_cpus", rep.irq_cpus, Unit::Threads),
        Param::new("seconds", rep.seconds, Unit::S),
        Param::new("window_s", rep.window_s, Unit::S),
        match rep.rate_iops {
            Some(r) => Param::new("rate_iops_per_job", r, Unit::Count),
            None => Param::text("rate_iops_per_job", "unpaced"),
        },
        match (rep.slow_pct, rep.slow_per_s) {
            (Some(p), _) => Param::new("slow_pct", p, Unit::Percent),
            (None, Some(r)) => Param::new("slow_per_s", format!("{r:.0}"), Unit::Count),
            (None, None) => Param::text("slow_tail", "none"),
        },
        Param::new("slow_depth", rep.slow_depth, Unit::Count),
        Param::new("slow_hold_s", rep.slow_hold_s, Unit::S),
        Param::new("low_window_mib", rep.low_window_mib, Unit::Count),
    ];
    out.notes.push(
        "Aging is accelerated by sizing, not by a model: completions on fewer interrupt CPUs \
         than jobs; a slow tail whose requests pin their IOVAs for the whole run while the \
         rest cycle; and a low window (the range Linux gives a PCI device first, 4 GiB there) \
         shrunk so that what is pinned and cached fills it in seconds, not the hours a \
         many-CPU box takes. Warm-up (until throughput stops rising, at least 1 s) is \
         discarded; retained = median of the last quarter of windows ÷ median of the first \
         quarter."
            .into(),
    );
    out.notes.push(
        "The headline, retained_vs_fresh and stability_vs_fresh: beside the aged device each job \
         thread drives a fresh one (a second device on a DMA domain of the same DMA and IOVA \
         policies and low window, one queue per job of the thread, the same block-size mix at \
         the same pace and depth, no slow tail, completed on interrupt CPUs of its own), \
         replaced every 400 requests per job (1 s at the default pace), its first 40 per \
         job not counted. Both \
         arms' submitting and reaping calls run in the same loop on the same thread and are \
         timed alike on its CPU clock; each window's aged ÷ fresh requests per CPU-second \
         (vs_fresh in the time line) is what the aging figure is taken on, so the machine's \
         speed, which a co-runner moves, cancels and only the aged device's own slowdown \
         remains. Beside it, labelled: the figures on the aged arm alone (below) and on the \
         wall clock."
            .into(),
    );
    out.notes.push(
        "retained and stability (aged arm alone) are taken on requests per CPU-second of the driver side: each \
         window's requests × the job threads' CPU per request, measured on every submitting or \
         reaping call (thread CPU clock; polls, waits and doorbells between the calls \
         left out, as their number per request follows the device's pace), plus the flush \
         timer's CPU clock and the allocator's background work; the device threads stand for \
         hardware and are not counted. So a co-runner taking a core is not aging; a window with under a quarter of the run's median CPU \
         time is merged with its neighbours. The wall-clock figures stand beside them \
         (retained_wall, stability_wall). But the CPU a job thread that sleeps between \
         requests spends on the same work drifts with the host over seconds: retained_fresh, \
         the same statistic on the fresh arm (rebuilt every second, it cannot age), reads that \
         drift, and retained alone is about retained_vs_fresh × retained_fresh (measured on a \
         quiet 2-vCPU machine: retained 0.61-1.35, retained_fresh 0.77-1.63, \
         retained_vs_fresh 0.90-1.05 in the same 14 runs)."
            .into(),
    );
    out.notes.push(match rep.rate_iops {
        Some(r) => format!(
            "the aging part is paced at {r:.0} fast requests per second per job (fio's rate_iops): the driver's CPU per request follows the pace (measured unpaced: 1.5 µs at 80 k IOPS, 2.2-2.7 µs at 17 k, 2.5-5.9 µs at 9 k, with the allocator's operations per request unchanged), so the first and last quarters are compared at one pace; the wall-clock IOPS then show only a cliff the pace cannot absorb"
        ),
        None => "the aging part is unpaced (--rate-iops 0): the driver's CPU per request follows the device's pace, which a co-runner sets".to_string(),
    });
    out.notes.push(format!(
        "low window {} MiB, {}",
        rep.low_window_mib,
        if rep.low_window_first {
            "IOVAs there first (Linux's default for PCI devices)"
        } else {
            "not preferred (--forcedac)"
        }
    ));
    if let Some(why) = &rep.why {
        out.notes.insert(0, format!("INVALID figures: {why}"));
    }
    if !rep.dma.is_empty() {
        out.tables.push(cost);
    }
    out.tables.push(t);
    tl.detail = true;
    out.tables.push(tl);
    out.plots.push(Plot {
        name: "iops".into(),
        title: "wall-clock IOPS over time per IOVA policy (a cliff is the seed's bug)".into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("IOPS", Unit::Kiops),
        categories: Vec::new(),
        series: lines,
        modelled: false,
    });
    out.plots.push(Plot {
        name: "iops_per_cpu_s".into(),
        title:
            "requests per driver CPU-second over time per IOVA policy (the aging figure's input)"
                .into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("k requests per CPU-second", Unit::Kiops),
        categories: Vec::new(),
        series: cpu_lines,
        modelled: false,
    });
    out.plots
        .push(vs_fresh_plot("requests per driver CPU-second", ratio_lines));
    out
}
