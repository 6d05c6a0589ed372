//! The table of `lab stress`.

use super::out::*;
use crate::report::{contract, Column, Param, Report, Table, Unit};

/// The typed report.
pub(super) fn report(r: &StressReport) -> Report {
    let mut t = Table::new(
        "results",
        format!(
            "two domains, a CPU thread and a device thread each; checker verdicts per phase (flush timeout {} us){}",
            r.flush_timeout_us,
            if r.quick { ", quick" } else { "" }
        ),
        vec![
            Column::label("policy"),
            Column::metric("ops", "ops", Unit::Count, 0),
            Column::metric("device_accesses", "device accesses", Unit::Count, 0),
            Column::metric("faults", "faults", Unit::Count, 0),
            Column::metric("legal", "legal", Unit::Count, 0),
            Column::metric("stale_accesses", "stale", Unit::Count, 0),
            Column::metric("max_stale_age_us", "max stale age", Unit::Us, 0),
            Column::metric("violations", "violations", Unit::Count, 0),
            Column::metric("unjudged", "unjudged", Unit::Count, 0),
            Column::text("verdict"),
        ],
    );
    for x in &r.policies {
        t.row(vec![
            x.policy.clone().into(),
            x.ops.into(),
            x.device_accesses.into(),
            x.faults.into(),
            x.legal.into(),
            x.stale_accesses.into(),
            x.max_stale_age_us.into(),
            x.violations.into(),
            x.unjudged.into(),
            if x.violations == 0 { "ok" } else { "VIOLATION" }.into(),
        ]);
    }
    let mut rep = Report::new(
        "lab stress",
        "a soak with an independent checker: map, unmap, switch; devices access what they own and probe what they do not",
        contract(r),
    );
    rep.params = vec![
        Param::new("flush_timeout", r.flush_timeout_us, Unit::Us),
        Param::text("load_nice", r.load_nice),
        Param::text("quick", r.quick),
    ];
    rep.tables.push(t);
    rep.notes.push(match &r.first_violation {
        None => format!(
            "no violation in {} device accesses; stale accesses at most {} us old (timeout {} us)",
            r.device_accesses, r.max_stale_age_us, r.flush_timeout_us
        ),
        Some(v) => format!("{} violation(s); the first: {v}", r.violations),
    });
    rep
}
