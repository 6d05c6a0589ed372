//! `softiommu bench pgtable`: map+unmap of 4 KiB, 64 KiB and 2 MiB ranges in
//! a VT-d second-level table, with a coherent walker and with one that is
//! not (every line written flushed from the CPU cache, seed `003`).
//!
//! Each operation maps a range at one of 64 IOVA slots, unmaps it and
//! completes the gather (the invalidation itself is not part of this bench).
//! Times and line counts are measured; nothing is modelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, IotlbGather, OpStats, Perm, VtdConfig, VtdPageTable};

use crate::args::{Ranged, Seconds};
use crate::error::LabResult;
use crate::lab::policy_physics::{self, PolicyCost, WALKS};
use crate::report::Axis;
use crate::report::{
    contract, Cell, Column, Param, Plot, PlotKind, Report, Series, Spread, Table, Unit,
};

/// Options of `bench pgtable` (and of a `[bench-pgtable]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgtableBenchArgs {
    /// Seconds of measurement per case, split over the rounds (0.01..=86400).
    #[arg(long, default_value = "0.5")]
    pub seconds: Seconds,
    /// Interleaved rounds; the median round is reported (1..=1000).
    #[arg(long, default_value = "5")]
    pub rounds: Ranged<1, 1000>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for PgtableBenchArgs {
    fn default() -> Self {
        Self {
            seconds: Seconds::new(0.5),
            rounds: Ranged::new(5),
            json: false,
        }
    }
}

/// One case's result.
#[derive(Debug, Clone, Serialize)]
pub struct PgtableResult {
    /// Bytes mapped and unmapped per operation.
    pub size: u64,
    /// Whether the walker is cache-coherent.
    pub coherent: bool,
    /// Nanoseconds per map+unmap (median round).
    pub ns_per_map_unmap: f64,
    /// Cache lines flushed per map+unmap.
    pub lines_flushed_per_op: f64,
    /// Distinct cache lines written per map+unmap (counted when not coherent).
    pub lines_written_per_op: f64,
    /// Flush batches (one fence each) per map+unmap.
    pub fences_per_op: f64,
    /// `ns_per_map_unmap` over the rounds (min, median, max); `null` with
    /// one round.
    pub ns_per_map_unmap_spread: Option<Spread>,
    /// Whether the time is physically possible: a non-coherent walker's
    /// map+unmap must not take less than a coherent one's of the same
    /// size beyond the spread.
    pub valid: bool,
    /// Why not, when `valid` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Marks the cases whose time contradicts [`WALKS`] beyond the spread.
fn check_walks(results: &mut [PgtableResult]) {
    let groups: Vec<String> = results.iter().map(|x| x.size.to_string()).collect();
    let costs: Vec<PolicyCost<'_>> = results
        .iter()
        .zip(&groups)
        .map(|(x, g)| PolicyCost {
            policy: walker(x.coherent),
            group: g,
            cost: x
                .ns_per_map_unmap_spread
                .unwrap_or_else(|| Spread::of(&[x.ns_per_map_unmap])),
        })
        .collect();
    let why = policy_physics::check_by(&costs, &WALKS, "time per map+unmap");
    for (x, w) in results.iter_mut().zip(why) {
        if let Some(w) = w {
            x.valid = false;
            x.why = Some(w);
        }
    }
}

/// The JSON object `bench pgtable --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct PgtableBenchReport {
    /// Always "pgtable".
    pub bench: &'static str,
    /// The flush instruction used for the non-coherent cases.
    pub flush_method: String,
    /// Rounds per case.
    pub rounds: usize,
    /// One entry per (size, coherent).
    pub results: Vec<PgtableResult>,
}

const SIZES: [u64; 3] = [4 << 10, 64 << 10, 2 << 20];
const SLOTS: u64 = 64;

struct Case {
    size: u64,
    coherent: bool,
    table: VtdPageTable,
}

fn round(c: &Case, budget: Duration) -> (f64, u64, OpStats) {
    let base = 1u64 << 40;
    let mut stats = OpStats::default();
    let mut gather = IotlbGather::new();
    let (mut ops, mut i) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < budget {
        for _ in 0..64 {
            let slot = i % SLOTS;
            let iova = base + slot * c.size.max(2 << 20);
            let phys = (1 << 30) + slot * c.size;
            stats += c
                .table
                .map(iova, phys, c.size, Perm::RW)
                .expect("map a free slot");
            stats += c
                .table
                .unmap(iova, c.size, &mut gather)
                .expect("unmap what was mapped");
            gather.complete().expect("free gathered tables");
            i += 1;
        }
        ops += 64;
    }
    (start.elapsed().as_nanos() as f64 / ops as f64, ops, stats)
}

/// Runs the bench.
pub fn run(args: &PgtableBenchArgs) -> LabResult<Report> {
    let r = measure(args)?;
    Ok(report(&r, args))
}

fn measure(args: &PgtableBenchArgs) -> LabResult<PgtableBenchReport> {
    let mem = Arc::new(PhysMemory::new(4 << 30)?);
    let mut cases = Vec::new();
    for size in SIZES {
        for coherent in [true, false] {
            let cfg = if coherent {
                VtdConfig::coherent()
            } else {
                VtdConfig::non_coherent()
            };
            let table = VtdPageTable::new(mem.clone(), cfg)?;
            cases.push(Case {
                size,
                coherent,
                table,
            });
        }
    }
    let flush_method = VtdPageTable::new(mem.clone(), VtdConfig::non_coherent())?
        .flush_method()
        .map_or("none", |m| m.name())
        .to_string();
    let rounds = args.rounds.us();
    let budget = Duration::from_secs_f64(args.seconds.get() / rounds as f64);
    let mut per_case: Vec<Vec<(f64, u64, OpStats)>> = cases.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (c, out) in cases.iter().zip(per_case.iter_mut()) {
            out.push(round(c, budget));
        }
    }
    let results = cases
        .iter()
        .zip(per_case)
        .map(|(c, mut v)| {
            let ops: u64 = v.iter().map(|r| r.1).sum();
            let mut total = OpStats::default();
            for r in &v {
                total += r.2;
            }
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let per = |x: u64| x as f64 / ops as f64;
            PgtableResult {
                size: c.size,
                coherent: c.coherent,
                ns_per_map_unmap: v[v.len() / 2].0,
                lines_flushed_per_op: per(total.lines_flushed),
                lines_written_per_op: per(total.lines_written),
                fences_per_op: per(total.flush_batches),
                ns_per_map_unmap_spread: Spread::of_rounds(
                    &v.iter().map(|r| r.0).collect::<Vec<_>>(),
                ),
                valid: true,
                why: None,
            }
        })
        .collect::<Vec<_>>();
    let mut results = results;
    check_walks(&mut results);
    Ok(PgtableBenchReport {
        bench: "pgtable",
        flush_method,
        rounds,
        results,
    })
}

fn walker(coherent: bool) -> &'static str {
    if coherent {
        "coherent"
    } else {
        "non-coherent"
    }
}

/// The typed report.
fn report(r: &PgtableBenchReport, args: &PgtableBenchArgs) -> Report {
    let mut t = Table::new(
        "results",
        format!(
            "VT-d second-level map+unmap, flush instruction {} (non-coherent), median of {} rounds [lowest–highest round]",
            r.flush_method, r.rounds
        ),
        vec![
            Column::label("size"),
            Column::label("walker"),
            Column::metric("ns_per_map_unmap", "map+unmap", Unit::Ns, 0),
            Column::metric("rate_vs_coherent", "rate vs coherent", Unit::Ratio, 2),
            Column::metric("lines_flushed_per_op", "flushed", Unit::LinesPerOp, 2),
            Column::metric("lines_written_per_op", "written", Unit::LinesPerOp, 2),
            Column::metric("fences_per_op", "fences", Unit::FencesPerOp, 2),
            Column::text("valid"),
        ],
    );
    for x in &r.results {
        let coherent = r.results.iter().find(|c| c.coherent && c.size == x.size);
        // The rate over the coherent walker's: its spread the widest the
        // two allow.
        let rate_spread = coherent.filter(|_| !x.coherent).and_then(|c| {
            c.ns_per_map_unmap_spread?
                .ratio(&x.ns_per_map_unmap_spread?)
        });
        t.row(vec![
            format!("{} KiB", x.size >> 10).into(),
            walker(x.coherent).into(),
            Cell::figure(x.ns_per_map_unmap, x.ns_per_map_unmap_spread),
            coherent.map_or(Cell::Missing, |c| {
                Cell::figure(c.ns_per_map_unmap / x.ns_per_map_unmap, rate_spread)
            }),
            x.lines_flushed_per_op.into(),
            x.lines_written_per_op.into(),
            x.fences_per_op.into(),
            if x.valid { "yes" } else { "NO" }.into(),
        ]);
        if let Some(why) = &x.why {
            t.mark_invalid(t.row_key(t.rows.len() - 1), why.clone());
        }
    }
    let bars = [true, false]
        .into_iter()
        .map(|coherent| {
            let of = r.results.iter().filter(|x| x.coherent == coherent);
            Series {
                spreads: of
                    .clone()
                    .map(|x| x.ns_per_map_unmap_spread.map(|s| (s.min, s.max)))
                    .collect(),
                ..Series::new(
                    walker(coherent),
                    of.enumerate()
                        .map(|(i, x)| (i as f64, x.ns_per_map_unmap))
                        .collect(),
                )
            }
        })
        .collect();
    let mut rep = Report::new(
        "bench pgtable",
        "VT-d page-table map+unmap with a coherent and a non-coherent walker (cache lines flushed, seed 003)",
        contract(r),
    )
    .seed("003");
    rep.params = vec![
        Param::new("seconds", args.seconds, Unit::S),
        Param::new("rounds", r.rounds, Unit::Count),
        Param::text("flush_method", &r.flush_method),
    ];
    rep.tables.push(t);
    rep.plots.push(Plot {
        name: "map_unmap".into(),
        title: "map+unmap time per range size, coherent vs non-coherent walker".into(),
        kind: PlotKind::Bars,
        x: Axis::new("range size", Unit::Bytes),
        y: Axis::new("map+unmap", Unit::Ns),
        categories: SIZES.iter().map(|s| format!("{} KiB", s >> 10)).collect(),
        series: bars,
        modelled: false,
    });
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(coherent: bool, rounds: &[f64]) -> PgtableResult {
        let s = Spread::of(rounds);
        PgtableResult {
            size: 4096,
            coherent,
            ns_per_map_unmap: s.median,
            lines_flushed_per_op: 0.0,
            lines_written_per_op: 0.0,
            fences_per_op: 0.0,
            ns_per_map_unmap_spread: Some(s),
            valid: true,
            why: None,
        }
    }

    #[test]
    fn a_non_coherent_walk_faster_than_a_coherent_one_is_invalid() {
        let mut results = vec![
            case(true, &[100.0, 102.0, 104.0]),
            case(false, &[80.0, 82.0, 84.0]),
        ];
        check_walks(&mut results);
        assert!(results[0].valid);
        assert!(
            matches!(&results[1].why, Some(w) if w.starts_with("measurement invalid: non-coherent's time per map+unmap") && w.contains("below coherent's")),
            "{:?}",
            results[1].why
        );
        let r = PgtableBenchReport {
            bench: "pgtable",
            flush_method: "clflushopt".into(),
            rounds: 3,
            results,
        };
        let rep = report(&r, &PgtableBenchArgs::default());
        assert_eq!(rep.contract["results"][1]["valid"], false);
        let t = &rep.tables[0];
        assert!(t.invalid_why("4 KiB/non-coherent").is_some());
        assert!(t.invalid_why("4 KiB/coherent").is_none());
        let rate = t.spread("4 KiB/non-coherent", "rate_vs_coherent").unwrap();
        assert_eq!((rate.min, rate.max), (100.0 / 84.0, 104.0 / 80.0));
    }

    #[test]
    fn a_non_coherent_walk_within_the_spread_of_a_coherent_one_stands() {
        let mut results = vec![
            case(true, &[100.0, 102.0, 104.0]),
            case(false, &[99.0, 110.0, 120.0]),
        ];
        check_walks(&mut results);
        assert!(results.iter().all(|x| x.valid));
    }
}
