//! The table of `lab litmus`.

use crate::report::{contract, Column, Param, Report, Table, Unit};

use super::out::*;
use super::run::*;

/// The typed report.
pub(super) fn report(r: &LitmusReport) -> Report {
    let mut t = Table::new(
        "results",
        format!(
            "device thread (accessors, at IOVAs) vs guest CPU thread, {} ({} drain barrier){}",
            r.arch,
            r.drain_barrier,
            if r.quick { ", quick" } else { "" }
        ),
        vec![
            Column::label("test"),
            Column::label("mode"),
            Column::metric("runs", "runs", Unit::Count, 0),
            Column::metric("forbidden", "forbidden", Unit::Count, 0),
            Column::text("forbidden_outcome"),
            Column::metric("outcome_00", "(0,0)", Unit::Count, 0),
            Column::metric("outcome_01", "(0,1)", Unit::Count, 0),
            Column::metric("outcome_10", "(1,0)", Unit::Count, 0),
            Column::metric("outcome_11", "(1,1)", Unit::Count, 0),
            Column::metric("ns_per_run", "per run", Unit::Ns, 0),
            Column::text("verdict"),
        ],
    );
    for x in &r.rows {
        t.row(vec![
            x.test.into(),
            x.mode.into(),
            x.runs.into(),
            x.forbidden.into(),
            x.forbidden_outcome.clone().into(),
            x.outcomes[0].into(),
            x.outcomes[1].into(),
            x.outcomes[2].into(),
            x.outcomes[3].into(),
            x.ns_per_run.into(),
            verdict(x.mode, x.forbidden).into(),
        ]);
    }
    let mut rep = Report::new(
        "lab litmus",
        "ordering the accessors promise, tested on this CPU: message passing and store buffering, device vs CPU (seed 001)",
        contract(r),
    )
    .seed("001");
    rep.params = vec![
        Param::new("runs", r.rows.first().map_or(0, |x| x.runs), Unit::Count),
        Param::text("quick", r.quick),
        Param::text("arch", r.arch),
        Param::text("drain_barrier", r.drain_barrier),
    ];
    rep.tables.push(t);
    rep.notes.push(
        if r.ok {
            "ordered and full: no forbidden outcome"
        } else {
            "ordered or full showed a forbidden outcome"
        }
        .to_string(),
    );
    rep
}
