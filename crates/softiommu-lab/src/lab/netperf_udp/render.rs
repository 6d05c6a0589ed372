use crate::dma_rig::modelled_figures;
use crate::lab::policy_physics::{paired_ratios, Spread};
use crate::report::{
    contract, Axis, Cell, Column, Param, Plot, PlotKind, Report, Series, Table, Unit,
};

use super::args::{orderings, NetperfArgs};
use super::out::{NetperfReport, NetperfRow};

/// The closing note: deferred over pass-through and strict over deferred
/// (ordered DMA, the paced pass), each the median of the rounds' paired
/// ratios with their spread.
pub(super) fn closing_note(rows: &[NetperfRow]) -> Option<String> {
    let find = |p: &str| {
        rows.iter()
            .find(|x| x.policy == p && x.ordering == "ordered")
            .map(|x| x.service_demand_rounds.as_slice())
    };
    let ratio = |a: &str, b: &str| -> Option<String> {
        let s = Spread::of(&paired_ratios(find(a)?, find(b)?)?);
        Some(format!(
            "{a}/{b} {:.2}× (rounds {:.2}× to {:.2}×)",
            s.median, s.min, s.max
        ))
    };
    let parts: Vec<String> = [
        ratio("deferred", "passthrough"),
        ratio("strict", "deferred"),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "At the common rate, service demand (ordered DMA): {}.",
            parts.join(", ")
        )
    })
}

/// The typed report, seed-style: per policy and ordering, at the common
/// rate, datagrams each way, drops, service demand with its spread beside
/// pass-through's, the flush timer's share, the device's CPU apart, the
/// deferred policy's stale window, the modelled IOMMU's inline work apart,
/// and whether the row stands; then the full-speed table.
pub(super) fn report(r: &NetperfReport, args: &NetperfArgs, pinning: &str) -> Report {
    let modelled = modelled_figures(&r.modelled);
    let m = !modelled.is_empty();
    let mut t = Table::new(
        "results",
        format!(
            "UDP_STREAM through smoltcp, virtio-net and two IOMMUs, {} byte datagrams, every policy offered {:.1} kpps ({} % of the slowest policy's maximum) in batches every {:.2} ms, {:.1} s per row in {} interleaved rounds (median round shown, [lowest–highest round] beside it); service demand = CPU of both hosts' driver+stack threads and both flush timers per datagram delivered, without the modelled IOMMU's queue passes run on them (apart)",
            r.msg_size,
            r.offered_pps / 1e3,
            r.pace_percent,
            r.pace_period_ms,
            r.seconds,
            r.rounds
        ),
        vec![
            Column::label("policy"),
            Column::label("ordering"),
            Column::metric("tx_kpps", "sent", Unit::Kpps, 1).modelled_if(m),
            Column::metric("rx_kpps", "received", Unit::Kpps, 1).modelled_if(m),
            Column::metric("drops", "drops", Unit::Count, 0),
            Column::metric("service_demand_us_per_pkt", "service demand", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric("vs_passthrough", "vs passthrough", Unit::Ratio, 2).modelled_if(m),
            Column::metric("flush_us_per_pkt", "flush timer", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("tx_us_per_pkt", "sender", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("rx_us_per_pkt", "receiver", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("device_us_per_pkt", "device (apart)", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric(
                "unit_inline_us_per_pkt",
                "IOMMU unit inline (apart, not in service demand)",
                Unit::UsPerPkt,
                3,
            )
            .modelled_if(m),
            Column::metric(
                "stale_window_ms_max",
                "stale max (to flush or expiry)",
                Unit::Ms,
                2,
            )
            .modelled_if(m),
            Column::metric("stale_completion_ms_max", "flush done max", Unit::Ms, 2)
                .modelled_if(m),
            Column::metric("timer_wakeups_per_s", "timer wake-ups/s", Unit::Count, 0)
                .modelled_if(m),
            Column::metric("flushes", "flushes", Unit::Count, 0),
            Column::text("valid"),
        ],
    );
    let rounds = |s: Spread| (r.rounds > 1).then_some(s);
    // Pass-through over itself is 1 exactly: no spread in the table.
    let vs_cell = |x: &NetperfRow| {
        let spread = x
            .vs_passthrough_spread
            .filter(|_| x.policy != "passthrough")
            .and_then(rounds);
        x.service_demand_vs_passthrough
            .map_or(Cell::Missing, |v| Cell::figure(v, spread))
    };
    for x in &r.rows {
        t.row(vec![
            x.policy.clone().into(),
            x.ordering.clone().into(),
            (x.tx_pps / 1e3).into(),
            (x.rx_pps / 1e3).into(),
            x.drops.into(),
            Cell::figure(x.service_demand_us_per_pkt, rounds(x.service_demand_spread)),
            vs_cell(x),
            x.flush_cpu_us_per_pkt.into(),
            x.tx_driver_cpu_us_per_pkt.into(),
            x.rx_driver_cpu_us_per_pkt.into(),
            x.device_cpu_us_per_pkt.into(),
            x.unit_inline_cpu_us_per_pkt.into(),
            x.stale_window_ms_max.into(),
            x.stale_completion_ms_max.into(),
            x.timer_wakeups_per_s.into(),
            x.flushes.map(|f| f as f64).into(),
            if x.valid { "yes" } else { "NO" }.into(),
        ]);
    }
    let mut full = Table::new(
        "full_speed",
        format!(
            "the same at full speed, each policy's maximum ({} interleaved rounds, median shown): the slowest policy's best round sets the common rate above; a policy that floods its receiver pays for the overload, so its service demand here is not the IOMMU's cost",
            r.rounds
        ),
        vec![
            Column::label("policy"),
            Column::label("ordering"),
            Column::metric("tx_kpps", "sent", Unit::Kpps, 1).modelled_if(m),
            Column::metric("rx_kpps", "received", Unit::Kpps, 1).modelled_if(m),
            Column::metric("rx_kpps_max", "best round", Unit::Kpps, 1).modelled_if(m),
            Column::metric("drops", "drops", Unit::Count, 0),
            Column::metric("service_demand_us_per_pkt", "service demand", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric("vs_passthrough", "vs passthrough", Unit::Ratio, 2).modelled_if(m),
            Column::metric("flush_us_per_pkt", "flush timer", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("device_us_per_pkt", "device (apart)", Unit::UsPerPkt, 3)
                .modelled_if(m),
            Column::metric(
                "unit_inline_us_per_pkt",
                "IOMMU unit inline (apart, not in service demand)",
                Unit::UsPerPkt,
                3,
            )
            .modelled_if(m),
            Column::metric("flushes", "flushes", Unit::Count, 0),
            Column::text("valid"),
        ],
    );
    for x in &r.full_speed {
        full.row(vec![
            x.policy.clone().into(),
            x.ordering.clone().into(),
            (x.tx_pps / 1e3).into(),
            (x.rx_pps / 1e3).into(),
            (x.rx_pps_max / 1e3).into(),
            x.drops.into(),
            Cell::figure(x.service_demand_us_per_pkt, rounds(x.service_demand_spread)),
            vs_cell(x),
            x.flush_cpu_us_per_pkt.into(),
            x.device_cpu_us_per_pkt.into(),
            x.unit_inline_cpu_us_per_pkt.into(),
            x.flushes.map(|f| f as f64).into(),
            if x.valid { "yes" } else { "NO" }.into(),
        ]);
    }
    let mut rep = Report::new(
        "lab netperf-udp",
        "UDP stream through smoltcp, virtio-net and two IOMMUs per DMA policy: datagrams, drops and service demand (seed 000)",
        contract(r),
    )
    .seed("000");
    rep.params = vec![
        Param::text("stack", r.stack),
        Param::new("msg_size", r.msg_size, Unit::Bytes),
        Param::text(
            "ordering",
            orderings(&args.ordering)
                .iter()
                .map(|o| o.name())
                .collect::<Vec<_>>()
                .join(","),
        ),
        Param::new("seconds", format!("{:.2}", r.seconds), Unit::S),
        Param::new("rounds", r.rounds, Unit::Count),
        Param::new("offered", format!("{:.1}", r.offered_pps / 1e3), Unit::Kpps),
        Param::new("pace_period", format!("{:.2}", r.pace_period_ms), Unit::Ms),
        Param::text("placement", pinning),
        Param::new("mtu", args.mtu, Unit::Bytes),
        Param::text(
            "line_rate",
            if args.line_rate_mbit.get() == 0 {
                "unlimited".to_string()
            } else {
                format!("{} Mbit/s", args.line_rate_mbit)
            },
        ),
        Param::text("latency", args.latency.name()),
    ];
    if let Some(hw) = args.flush_high_water {
        rep.params
            .push(Param::new("flush_high_water", hw, Unit::Entries));
    }
    if let Some(ms) = args.flush_timeout_ms {
        rep.params
            .push(Param::new("flush_timeout_ms", ms, Unit::Ms));
    }
    rep.modelled = modelled;
    rep.notes.push(
        "Service demand as netperf defines it, from thread CPU clocks: the CPU of every software thread the traffic makes work (both hosts' driver+stack threads and both DMA domains' flush timer threads; the timers' share is the flush timer column) per datagram delivered. The device threads stand for NIC hardware and are reported apart. So does the modelled IOMMU's own work when our model runs it on a driver's or a timer's thread (the unit's invalidation-queue pass, run inline by whoever submits or polls: carrying out the descriptors and draining the translations in flight, a membarrier(2) whose cost depends on what else the machine runs): every such pass is timed on that thread's CPU clock and taken out of its figures with the two clock reads that timed it (the meter's cost, not the driver's), shown apart as the IOMMU unit inline column and NOT in service demand. The modelled hardware wait latency those passes spin (the latency model's wait_completion, which a Linux driver spends spinning on the wait descriptor's status word) stays in service demand. Every policy is compared at one offered rate below each one's maximum, with no drops: the sender offers a batch per period and the receiver polls its queues once per period, NAPI-style with interrupts off, so a wake-up is paid per batch, not per datagram. Drops = datagrams of the run sent and never delivered (the receiver drains what is in flight at the end). The deferred policy's flush timer fires once per flush timeout while anything is queued (as Linux's flush-queue timer), and, while the queues' owners flush on their own (the high-water mark, or half the timeout's age, as they unmap), at twice then four times that gap, so under steady traffic it wakes about 25 times a second per host at the default 10 ms (the timer wake-ups column, both hosts); vs passthrough is the median of the rounds' paired ratios (each round's service demand over pass-through's in that round; each round starts one row later), so it need not equal the two medians shown divided; stale max runs from an unmap to the earlier of its flush's completion and its expiry deadline (three quarters of the timeout, past which the translators drop the domain's cached translations), and flush done max to the completion itself."
            .into(),
    );
    for x in r.rows.iter().filter(|x| !x.valid) {
        if let Some(why) = &x.why {
            t.mark_invalid(format!("{}/{}", x.policy, x.ordering), why.clone());
        }
    }
    for x in r.full_speed.iter().filter(|x| !x.valid) {
        if let Some(why) = &x.why {
            full.mark_invalid(
                format!("{}/{}", x.policy, x.ordering),
                format!("{why} (at full speed the policies deliver different rates and one that outruns its receiver pays for the overload; the paced table compares them)"),
            );
        }
    }
    if let Some(n) = closing_note(&r.rows) {
        rep.notes.push(n);
    }
    rep.tables.push(t);
    rep.tables.push(full);
    if r.rows.len() < 2 {
        return rep;
    }
    let mut categories: Vec<String> = Vec::new();
    for x in &r.rows {
        if !categories.contains(&x.policy) {
            categories.push(x.policy.clone());
        }
    }
    let mut series: Vec<Series> = Vec::new();
    for o in orderings(&args.ordering) {
        let points = r
            .rows
            .iter()
            .filter(|x| x.ordering == o.name())
            .filter_map(|x| {
                let i = categories.iter().position(|c| *c == x.policy)?;
                Some((i as f64, x.service_demand_spread))
            })
            .collect();
        series.push(Series::with_spreads(o.name(), points));
    }
    rep.plots.push(Plot {
        name: "service_demand".into(),
        title: format!(
            "service demand per policy at {:.1} kpps each, {} byte datagrams through smoltcp (driver+stack and flush timer CPU µs per datagram delivered, median round, whiskers from the lowest to the highest round; lower is better)",
            r.offered_pps / 1e3,
            r.msg_size
        ),
        kind: PlotKind::Bars,
        x: Axis::new("policy", Unit::Count),
        y: Axis::new("service demand", Unit::UsPerPkt),
        categories,
        series,
        modelled: m,
    });
    rep
}
