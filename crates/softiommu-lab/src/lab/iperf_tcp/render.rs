//! The tables and plots of `lab iperf-tcp`.

use crate::args::Walk;
use crate::dma_rig::modelled_figures;
use crate::report::{
    contract, Axis, Cell, Column, Param, Plot, PlotKind, Report, Series, Table, Unit,
};

use super::args::*;
use super::out::*;
use super::*;

/// The typed report, seed-style: per walk and policy, throughput beside
/// the coherent walk's, CPU per GB, lines flushed per GB and the flush
/// share.
pub(super) fn report(r: &IperfTcpReport, args: &IperfTcpArgs, pinning: &str) -> Report {
    let modelled = modelled_figures(&r.modelled);
    let m = !modelled.is_empty();
    let mut t = Table::new(
        "results",
        format!(
            "one TCP stream through smoltcp, virtio-net and two IOMMUs, {} byte writes, MTU {}, {:.1} s per row in {} interleaved rounds of {} runs each (a round keeps each row's median run by CPU per GB; median round shown); CPU = both hosts' driver+stack threads and flush timers, without the drivers' waits for their devices and the modelled IOMMU's inline work (both apart)",
            args.write_size, args.mtu, r.seconds, r.rounds, r.runs_per_round
        ),
        vec![
            Column::label("walk"),
            Column::label("policy"),
            Column::metric("mbit_s", "throughput", Unit::MbitPerS, 0).modelled_if(m),
            Column::metric("vs_coherent", "vs coherent", Unit::Ratio, 2).modelled_if(m),
            Column::metric("cpu_s_per_gb", "driver CPU", Unit::SPerGb, 3).modelled_if(m),
            Column::metric("cpu_s_per_gb_min", "min", Unit::SPerGb, 3).modelled_if(m),
            Column::metric("cpu_s_per_gb_max", "max", Unit::SPerGb, 3).modelled_if(m),
            Column::metric(
                "flush_timer_cpu_s_per_gb",
                "of it flush timer",
                Unit::SPerGb,
                3,
            )
            .modelled_if(m),
            Column::metric(
                "saturated_vs_coherent",
                "vs coherent at CPU saturation",
                Unit::Ratio,
                2,
            )
            .modelled_if(m),
            Column::metric("saturated_vs_coherent_min", "min", Unit::Ratio, 2).modelled_if(m),
            Column::metric("saturated_vs_coherent_max", "max", Unit::Ratio, 2).modelled_if(m),
            Column::metric(
                "saturated_vs_coherent_with_waits",
                "the same, waits counted in",
                Unit::Ratio,
                2,
            )
            .modelled_if(m),
            Column::metric("lines_flushed_per_gb", "lines flushed", Unit::LinesPerGb, 0),
            Column::metric("flush_cpu_share_pct", "flush share (estimated)", Unit::Percent, 2)
                .modelled_if(m),
            Column::metric("flush_ns_per_line", "per line", Unit::Ns, 1),
            Column::metric(
                "cpu_above_coherent_pct",
                "CPU above coherent (measured)",
                Unit::Percent,
                1,
            )
            .modelled_if(m),
            Column::metric(
                "wait_cpu_s_per_gb",
                "drivers' waits (apart, not in driver CPU)",
                Unit::SPerGb,
                3,
            )
            .modelled_if(m),
            Column::metric("device_cpu_s_per_gb", "device CPU (apart)", Unit::SPerGb, 3)
                .modelled_if(m),
            Column::metric(
                "unit_inline_cpu_s_per_gb",
                "IOMMU unit inline (apart, not in driver CPU)",
                Unit::SPerGb,
                3,
            )
            .modelled_if(m),
            Column::text("checksum"),
            Column::text("valid"),
        ],
    );
    for x in &r.rows {
        t.row(vec![
            x.walk.into(),
            x.policy.clone().into(),
            x.mbit_s.into(),
            x.vs_coherent.into(),
            x.cpu_s_per_gb.into(),
            x.cpu_s_per_gb_spread.min.into(),
            x.cpu_s_per_gb_spread.max.into(),
            x.flush_timer_cpu_s_per_gb.into(),
            x.saturated_vs_coherent.map_or(Cell::Missing, |v| {
                Cell::figure(v, x.saturated_vs_coherent_spread)
            }),
            x.saturated_vs_coherent_spread.map(|s| s.min).into(),
            x.saturated_vs_coherent_spread.map(|s| s.max).into(),
            x.saturated_vs_coherent_with_waits.into(),
            x.lines_flushed_per_gb.into(),
            (x.flush_cpu_share * 100.0).into(),
            (x.flush_ns_per_line > 0.0)
                .then_some(x.flush_ns_per_line)
                .into(),
            x.cpu_above_coherent_share.map(|v| v * 100.0).into(),
            x.wait_cpu_s_per_gb.into(),
            x.device_cpu_s_per_gb.into(),
            x.unit_inline_cpu_s_per_gb.into(),
            if x.checksum_ok { "ok" } else { "MISMATCH" }.into(),
            if x.valid { "yes" } else { "NO" }.into(),
        ]);
    }
    let mut rep = Report::new(
        "lab iperf-tcp",
        "one TCP stream through smoltcp, virtio-net and two IOMMUs, coherent vs non-coherent page walk: throughput, CPU per GB and the flush share (seed 003)",
        contract(r),
    )
    .seed("003");
    rep.params = vec![
        Param::text("stack", r.stack),
        Param::new("write_size", args.write_size, Unit::Bytes),
        Param::new("mtu", args.mtu, Unit::Bytes),
        Param::new("seconds", format!("{:.2}", r.seconds), Unit::S),
        Param::new("rounds", r.rounds, Unit::Count),
        Param::new("runs_per_round", r.runs_per_round, Unit::Count),
        Param::text("placement", pinning),
        Param::text("latency", args.latency.name()),
    ];
    rep.modelled = modelled;
    rep.notes.push(format!(
        "flush share: {FLUSH_SHARE_METHOD}. Beside it, measured: the share of a non-coherent row's driver CPU per GB above the coherent row's (every effect of the non-coherent walk; the difference of two runs, so noisy). Lines flushed are counted by the page tables (real cache-line flushes of exactly the lines written). Seed 003: {:.0} -> {:.0} Mbit/s ({:.2}x) on be2net, clflush_cache_range {:.2} % of CPU.",
        r.seed.coherent_mbit_s,
        r.seed.non_coherent_mbit_s,
        r.seed.ratio,
        r.seed.clflush_share * 100.0
    ));
    rep.notes.push(
        "Seed 003's figure is throughput with the CPU saturated; this stream need not saturate its driver threads, so the figure compared with it is CPU per unit of work: 'vs coherent at CPU saturation' = the coherent row's driver CPU per GB ÷ this row's (both hosts' driver+stack threads and DMA flush timers, without the CPU the drivers spent in their waits for the device, going idle and waking, which a driver saturated on CPU never does: shown apart), the throughput ratio a CPU-bound driver reaches, the median of each round's paired ratio (the rows run one after the other in a round, three times each, interleaved, and the round keeps each row's median run, so a co-runner landing on one run does not move the round); min/max over the rounds' paired ratios. The measured Mbit/s ratio ('vs coherent') stands beside it."
            .into(),
    );
    rep.notes.push(
        "Driver CPU leaves out the modelled IOMMU's own work where our model runs it on a driver's or a timer's thread (the unit's invalidation-queue pass, run inline: carrying out descriptors, draining the translations in flight): each pass is timed on that thread's CPU clock and shown apart as the IOMMU unit inline column, as the device threads are. The modelled wait latency those passes spin (which a Linux driver spends spinning on the wait's status word) stays in driver CPU."
            .into(),
    );
    for x in r.rows.iter().filter(|x| !x.valid) {
        rep.notes.insert(
            0,
            format!(
                "INVALID row {}/{}: {}",
                x.walk,
                x.policy,
                x.why.as_deref().unwrap_or("")
            ),
        );
    }
    rep.tables.push(t);
    if r.rows.len() < 2 {
        return rep;
    }
    let mut categories: Vec<String> = Vec::new();
    for x in &r.rows {
        if !categories.contains(&x.policy) {
            categories.push(x.policy.clone());
        }
    }
    let series = [Walk::Coherent, Walk::NonCoherent]
        .iter()
        .map(|w| {
            let points = r
                .rows
                .iter()
                .filter(|x| x.walk == w.name())
                .filter_map(|x| {
                    let i = categories.iter().position(|c| *c == x.policy)?;
                    Some((i as f64, x.mbit_s))
                })
                .collect();
            Series::new(format!("{} walk", w.name()), points)
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    rep.plots.push(Plot {
        name: "throughput".into(),
        title: "TCP throughput per policy, coherent vs non-coherent page walk (Mbit/s; higher is better)"
            .into(),
        kind: PlotKind::Bars,
        x: Axis::new("policy", Unit::Count),
        y: Axis::new("throughput", Unit::MbitPerS),
        categories,
        series,
        modelled: m,
    });
    rep
}
