//! `softiommu compare A B`: two runs side by side, figure by figure, with
//! B/A and a flag where the change is real.
//!
//! A figure both runs measured in rounds carries its spread (lowest to
//! highest round): the change is real when the two spreads do not
//! overlap, else it is flagged `within the spread`. A figure without a
//! spread in either run (measured once, or stored before spreads were)
//! falls back to the noise of its history: twice the median of
//! |ln(v_i / v_{i-1})| over the consecutive stored runs that have it, at
//! least 5 %; with fewer than three runs, 10 %. A real change is flagged
//! `better` or `worse` by its unit's direction (less time, more
//! throughput), else `changed`.

use serde_json::json;

use super::DbArgs;
use crate::error::LabResult;
use crate::render::format_cell;
use crate::report::{Better, Cell, Column, Param, Report, Spread, Table, Unit};
use crate::store::Store;

/// Options of `compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// The earlier run.
    pub a: i64,
    /// The later run.
    pub b: i64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The results database.
    #[command(flatten)]
    pub db: DbArgs,
}

/// The smallest noise band: changes under 5 % are never flagged.
const NOISE_FLOOR: f64 = 0.05;
/// The band with too little history to measure noise.
const NOISE_DEFAULT: f64 = 0.10;

/// The noise band of a figure from its history.
pub fn noise(history: &[f64]) -> f64 {
    let mut steps: Vec<f64> = history
        .windows(2)
        .filter(|w| w[0] > 0.0 && w[1] > 0.0)
        .map(|w| (w[1] / w[0]).ln().abs())
        .collect();
    if steps.len() < 2 {
        return NOISE_DEFAULT;
    }
    steps.sort_by(f64::total_cmp);
    let median = steps[steps.len() / 2];
    (2.0 * median).exp_m1().max(NOISE_FLOOR)
}

/// The flag for a change from `a` to `b` with noise band `band`.
pub fn flag(a: f64, b: f64, band: f64, unit: Unit) -> &'static str {
    if a <= 0.0 || b <= 0.0 {
        return if a == b { "" } else { "changed" };
    }
    let r = b / a;
    if (r - 1.0).abs() <= band && (1.0 / r - 1.0).abs() <= band {
        return "";
    }
    match (unit.better(), r > 1.0) {
        (Better::Higher, true) | (Better::Lower, false) => "better",
        (Better::Higher, false) | (Better::Lower, true) => "worse",
        (Better::Neither, _) => "changed",
    }
}

/// The flag a change between two runs gets, and what decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// `better`, `worse`, `changed`, `within the spread`, or empty (within
    /// the noise).
    pub flag: &'static str,
    /// `spread` (both runs' rounds) or `noise` (the history's).
    pub basis: &'static str,
}

/// The flag a change gets when both runs carry spreads: real only when
/// the spreads do not overlap (its direction by the medians).
pub fn flag_spread(a: &Spread, b: &Spread, unit: Unit) -> &'static str {
    if !a.separate(b) {
        return "within the spread";
    }
    match (unit.better(), b.median > a.median) {
        (Better::Higher, true) | (Better::Lower, false) => "better",
        (Better::Higher, false) | (Better::Lower, true) => "worse",
        (Better::Neither, _) => "changed",
    }
}

/// Calls a change from `a` to `b`: by their spreads when both have one,
/// else by the history's noise band `band`.
pub fn call(
    (a, sa): (f64, Option<Spread>),
    (b, sb): (f64, Option<Spread>),
    band: f64,
    unit: Unit,
) -> Call {
    match (sa, sb) {
        (Some(sa), Some(sb)) => Call {
            flag: flag_spread(&sa, &sb, unit),
            basis: "spread",
        },
        _ => Call {
            flag: flag(a, b, band, unit),
            basis: "noise",
        },
    }
}

/// Whether a flag calls the change real.
fn real(flag: &str) -> bool {
    matches!(flag, "better" | "worse" | "changed")
}

/// The comparison as a report.
pub fn compare(a: &CompareArgs) -> LabResult<Report> {
    let store = Store::open(&a.db.db)?;
    let (ra, rb) = (store.run(a.a)?, store.run(a.b)?);
    let (sa, sb) = (store.scenarios(a.a)?, store.scenarios(a.b)?);
    let mut t = Table::new(
        "compare",
        format!(
            "run {} ({}, {}) vs run {} ({}, {})",
            ra.id, ra.started_at, ra.git_rev, rb.id, rb.started_at, rb.git_rev
        ),
        vec![
            Column::label("scenario"),
            Column::label("row"),
            Column::label("figure"),
            Column::text("unit"),
            Column::text(&format!("run {}", ra.id)),
            Column::text(&format!("run {}", rb.id)),
            Column::metric("ratio", "B/A", Unit::Ratio, 3),
            Column::metric("noise", "noise", Unit::Percent, 0),
            Column::text("basis"),
            Column::text("flag"),
        ],
    );
    let mut rows = Vec::new();
    let mut differ = Vec::new();
    let common = sa
        .iter()
        .filter(|x| sb.iter().any(|y| y.report.scenario == x.report.scenario))
        .count();
    if common == 0 {
        let names = |v: &[crate::store::StoredScenario]| {
            let n: Vec<&str> = v.iter().map(|x| x.report.scenario.as_str()).collect();
            if n.is_empty() {
                "none".to_string()
            } else {
                n.join(", ")
            }
        };
        return Err(crate::error::LabError::NothingInCommon {
            a: ra.id,
            b: rb.id,
            a_scenarios: names(&sa),
            b_scenarios: names(&sb),
        });
    }
    for x in &sa {
        let Some(y) = sb.iter().find(|y| y.report.scenario == x.report.scenario) else {
            continue;
        };
        let changed: Vec<String> = x
            .report
            .params
            .iter()
            .filter_map(|p| {
                let q = y.report.params.iter().find(|q| q.name == p.name)?;
                (q.value != p.value).then(|| format!("{} {} -> {}", p.name, p.value, q.value))
            })
            .collect();
        if !changed.is_empty() {
            differ.push(format!("{} ({})", x.report.scenario, changed.join(", ")));
        }
        for ta in x.report.tables.iter().filter(|t| !t.detail) {
            let Some(tb) = y.report.table(&ta.name) else {
                continue;
            };
            for m in ta.metrics() {
                let Some(vb) = tb.get(&m.row, m.name) else {
                    continue;
                };
                // The figure across the stored runs, with the spread each
                // stored (none in a database older than schema 3).
                let hist =
                    store.metric_spread_history(&x.report.scenario, &ta.name, &m.row, m.name)?;
                let band = noise(&hist.iter().map(|h| h.1).collect::<Vec<_>>());
                let stored = |run: i64| hist.iter().find(|h| h.0 == run).and_then(|h| h.2);
                let sa = stored(ra.id).or(m.spread);
                let sb = stored(rb.id).or_else(|| tb.spread(&m.row, m.name));
                let c = call((m.value, sa), (vb, sb), band, m.unit);
                let f = c.flag;
                let dec = ta
                    .columns
                    .iter()
                    .find(|c| c.key == m.name)
                    .map_or(2, |c| c.decimals);
                let ratio = (m.value != 0.0).then(|| vb / m.value);
                t.row(vec![
                    x.report.scenario.clone().into(),
                    m.row.clone().into(),
                    m.name.into(),
                    m.unit.symbol().into(),
                    format_cell(&Cell::figure(m.value, sa), Some(m.unit), dec).into(),
                    format_cell(&Cell::figure(vb, sb), Some(m.unit), dec).into(),
                    ratio.into(),
                    Cell::Num(band * 100.0),
                    c.basis.into(),
                    f.into(),
                ]);
                rows.push(json!({
                    "scenario": x.report.scenario, "table": ta.name, "row": m.row,
                    "figure": m.name, "unit": m.unit, "a": m.value, "b": vb,
                    "a_spread": sa, "b_spread": sb,
                    "ratio": ratio, "noise": band, "basis": c.basis, "flag": f,
                }));
            }
        }
    }
    let flagged = rows
        .iter()
        .filter(|r| r["flag"].as_str().is_some_and(real))
        .count();
    let mut rep = Report::new(
        "compare",
        format!(
            "run {} vs run {}: {} figures, {flagged} changed beyond their spread or noise",
            ra.id,
            rb.id,
            rows.len()
        ),
        json!({
            "a": ra.id,
            "b": rb.id,
            "db": a.db.db.display().to_string(),
            "params_differ": differ,
            "rows": rows,
            "common_scenarios": common,
        }),
    );
    if !differ.is_empty() {
        rep.notes.push(format!(
            "parameters differ, so these figures are not like for like: {}",
            differ.join("; ")
        ));
    }
    rep.params = vec![
        Param::text("db", a.db.db.display()),
        Param::text("a", format!("{} ({})", ra.id, ra.host.line())),
        Param::text("b", format!("{} ({})", rb.id, rb.host.line())),
    ];
    rep.tables.push(t);
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two runs without a scenario in common (the wrong run ids, two
    /// different labs) were "0 figures, 0 changed", exit 0: as if nothing
    /// had changed. Refused, naming each run's scenarios.
    #[test]
    fn runs_without_a_common_scenario_are_refused_not_called_unchanged() {
        let d = std::env::temp_dir().join(format!("softiommu-cmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let db = d.join("c.db");
        let mut store = Store::create(&db).unwrap();
        let host = crate::host::Host::detect();
        for name in ["dma-map", "iova-alloc"] {
            let id = store.begin_run("x", true, &host, "rev").unwrap();
            let mut r = Report::new("bench dma", "t", json!({}));
            r.scenario = name.into();
            store.add_scenario(id, 0, &r, 1.0).unwrap();
        }
        drop(store);
        let args = |a, b| CompareArgs {
            a,
            b,
            json: true,
            db: DbArgs { db: db.clone() },
        };
        let e = compare(&args(1, 2)).unwrap_err();
        assert!(
            matches!(&e, crate::error::LabError::NothingInCommon { a: 1, b: 2, a_scenarios, b_scenarios }
                if a_scenarios == "dma-map" && b_scenarios == "iova-alloc"),
            "{e}"
        );
        let same = compare(&args(1, 1)).unwrap();
        assert_eq!(same.contract["common_scenarios"], 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn noise_is_the_spread_of_consecutive_runs_with_a_floor() {
        assert_eq!(noise(&[1.0, 2.0]), NOISE_DEFAULT);
        assert_eq!(noise(&[1.0, 1.0, 1.0, 1.0]), NOISE_FLOOR);
        let n = noise(&[1.0, 1.2, 1.0, 1.2]);
        assert!((n - (1.2f64.ln() * 2.0).exp_m1()).abs() < 1e-9, "{n}");
    }

    #[test]
    fn a_change_is_real_only_where_the_spreads_do_not_overlap() {
        let a = Spread::of(&[100.0, 104.0, 110.0]);
        // B/A is 1.3, far past any noise band, but B's lowest round meets
        // A's highest: within the spread.
        let b = Spread::of(&[110.0, 130.0, 140.0]);
        let c = call((104.0, Some(a)), (130.0, Some(b)), 0.05, Unit::Ns);
        assert_eq!(
            c,
            Call {
                flag: "within the spread",
                basis: "spread"
            }
        );
        // A 4 % change with spreads apart is real, though the noise rule
        // would call it nothing.
        let tight_a = Spread::of(&[100.0, 100.1, 100.2]);
        let tight_b = Spread::of(&[104.0, 104.1, 104.2]);
        let c = call(
            (100.1, Some(tight_a)),
            (104.1, Some(tight_b)),
            0.05,
            Unit::Ns,
        );
        assert_eq!(
            c,
            Call {
                flag: "worse",
                basis: "spread"
            }
        );
        assert_eq!(
            call((1.0, Some(tight_a)), (2.0, Some(tight_b)), 0.05, Unit::Mpps).flag,
            "better",
            "direction by the medians and the unit"
        );
        // An old row without a spread: today's noise rule.
        let c = call((100.0, None), (150.0, Some(b)), 0.05, Unit::Ns);
        assert_eq!(
            c,
            Call {
                flag: "worse",
                basis: "noise"
            }
        );
        assert_eq!(
            call((100.0, Some(a)), (104.0, None), 0.05, Unit::Ns).flag,
            ""
        );
    }

    #[test]
    fn flags_follow_the_unit_direction() {
        assert_eq!(flag(100.0, 104.0, 0.05, Unit::Ns), "");
        assert_eq!(flag(100.0, 150.0, 0.05, Unit::Ns), "worse");
        assert_eq!(flag(100.0, 50.0, 0.05, Unit::Ns), "better");
        assert_eq!(flag(1.0, 2.0, 0.05, Unit::Mpps), "better");
        assert_eq!(flag(10.0, 20.0, 0.05, Unit::Count), "changed");
    }

    /// A database with two runs of one scenario: `a` overlaps B's rounds,
    /// `b` moves beyond them, `c` has no spread (one round).
    fn fixture(name: &str) -> std::path::PathBuf {
        use crate::report::{Column, Table};
        let dir = std::env::temp_dir().join(format!("softiommu-cmp-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("r.db");
        let mut store = Store::create(&path).unwrap();
        let host = crate::host::Host::detect();
        for (k, rounds) in [(0.0, [100.0, 104.0, 110.0]), (1.0, [108.0, 115.0, 120.0])] {
            let id = store.begin_run("softiommu run", true, &host, "r").unwrap();
            let mut t = Table::new(
                "results",
                "x",
                vec![
                    Column::label("row"),
                    Column::metric("a", "a", Unit::Ns, 1),
                    Column::metric("b", "b", Unit::Ns, 1),
                    Column::metric("c", "c", Unit::Ns, 1),
                ],
            );
            let moved = Spread::of(&rounds.map(|v| v + 50.0 * k));
            t.row(vec![
                "r".into(),
                Cell::median(Spread::of(&rounds)),
                Cell::median(moved),
                Cell::Num(100.0 + 50.0 * k),
            ]);
            let mut r = Report::new("bench x", "x", json!({}));
            r.scenario = "sc".into();
            r.tables.push(t);
            store.add_scenario(id, 0, &r, 1.0).unwrap();
        }
        path
    }

    #[test]
    fn compare_reads_the_stored_spreads_and_falls_back_to_noise_without() {
        let db = fixture("stored");
        let rep = compare(&CompareArgs {
            a: 1,
            b: 2,
            json: true,
            db: DbArgs { db: db.clone() },
        })
        .unwrap();
        let rows = rep.contract["rows"].as_array().unwrap();
        let by = |f: &str| rows.iter().find(|r| r["figure"] == f).unwrap();
        // a: medians 104 -> 115 (+11 %, past the 10 % default band), but
        // the rounds overlap (100..110 and 108..120).
        assert_eq!(
            (&by("a")["flag"], &by("a")["basis"]),
            (&"within the spread".into(), &"spread".into())
        );
        assert_eq!(by("a")["b_spread"]["max"], 120.0);
        assert_eq!(
            (&by("b")["flag"], &by("b")["basis"]),
            (&"worse".into(), &"spread".into())
        );
        assert_eq!(
            (&by("c")["flag"], &by("c")["basis"]),
            (&"worse".into(), &"noise".into())
        );
        assert!(
            rep.title
                .ends_with("3 figures, 2 changed beyond their spread or noise"),
            "{}",
            rep.title
        );
        std::fs::remove_dir_all(db.parent().unwrap()).unwrap();
    }
}
