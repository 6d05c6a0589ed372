//! One line per seed: their figure, ours, and a verdict.
//!
//! Verdicts are drawn only from figures that stand: a seed whose headline
//! row is marked "measurement invalid" gets none, and where ours was
//! measured in rounds and is compared with a line drawn by physics (1.0),
//! a verdict is given only when ours' interval lies on one side of it
//! (`verdict::judge`); compared on size with a seed's own published
//! figure (seeds 000 and 003), only when ours' interval clears that
//! figure by more than a factor of `verdict::SEED_MARGIN` either way
//! (`verdict::judge_near`). The interval is every round, or, for seeds
//! 000 and 003 measured in nine rounds or more, the median's
//! order-statistic interval (`verdict::median_interval`), whose verdict
//! then says "beyond the median's interval"; otherwise the line says the
//! interval meets the figure, so no verdict.

use serde::Serialize;

use crate::report::{Report, Spread, Table};

use super::verdict::{judge, judge_near, SEED_MARGIN};

/// A seed's line of the summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedLine {
    /// "000".."004".
    pub seed: &'static str,
    /// What is compared.
    pub claim: String,
    /// Their figure.
    pub theirs: Option<f64>,
    /// Ours, when the run has it.
    pub ours: Option<f64>,
    /// Ours' spread over rounds (lowest, median, highest round), when it
    /// was measured in rounds; absent for a figure measured once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ours_spread: Option<Spread>,
    /// The unit of both.
    pub unit: &'static str,
    /// Our figure in words, with the others it depends on.
    pub detail: String,
    /// The verdict.
    pub verdict: String,
    /// The scenario ours comes from.
    pub scenario: Option<String>,
    /// The stored figure to follow across runs: (scenario, table, row,
    /// figure).
    #[serde(skip)]
    pub spark: Option<(&'static str, &'static str, &'static str, &'static str)>,
}

fn find<'a>(reports: &'a [Report], scenario: &str, table: &str) -> Option<&'a Table> {
    reports
        .iter()
        .find(|r| r.scenario == scenario)
        .and_then(|r| r.table(table))
}

/// The summary of a run's reports; a seed whose scenario did not run says
/// so. Each line's figure carries its spread (from the stored figure it
/// follows), and a line whose headline row is marked invalid gets no
/// verdict.
pub fn summarise(reports: &[Report]) -> Vec<SeedLine> {
    let mut lines = vec![
        seed_000(reports),
        seed_001(reports),
        seed_002(reports),
        seed_003(reports),
        seed_004(reports),
    ];
    for l in &mut lines {
        let Some((sc, table, row, _)) = l.spark else {
            continue;
        };
        let Some(t) = find(reports, sc, table) else {
            continue;
        };
        if l.ours_spread.is_none() {
            l.ours_spread = spread_of(l.ours, t, row, l.spark.map_or("", |s| s.3));
        }
        if let Some(why) = t.invalid_why(row) {
            if !l.verdict.starts_with("no verdict") {
                l.verdict = format!("no verdict: {row}: {why}");
            }
        }
    }
    lines
}

/// The spread of the figure `key` of `row`, when its value is `ours` (the
/// line follows that very figure).
fn spread_of(ours: Option<f64>, t: &Table, row: &str, key: &str) -> Option<Spread> {
    let c = t.cell(row, key)?;
    (c.value() == ours).then(|| c.spread()).flatten()
}

/// Why the first of `rows` of `t` is marked invalid, as `row: why`.
pub fn invalid_among(t: &Table, rows: &[&str]) -> Option<String> {
    rows.iter()
        .find_map(|r| t.invalid_why(r).map(|w| format!("{r}: {w}")))
}

fn missing(
    seed: &'static str,
    claim: &str,
    theirs: f64,
    unit: &'static str,
    scenario: &str,
) -> SeedLine {
    SeedLine {
        seed,
        claim: claim.to_string(),
        theirs: Some(theirs),
        ours: None,
        ours_spread: None,
        unit,
        detail: format!("scenario {scenario} did not run"),
        verdict: "not measured in this run".to_string(),
        scenario: None,
        spark: None,
    }
}

/// The rows of `scenario`'s contract (its lab's JSON), when it ran and
/// has them.
fn contract_rows<'a>(reports: &'a [Report], scenario: &str) -> Option<&'a [serde_json::Value]> {
    reports
        .iter()
        .find(|r| r.scenario == scenario)?
        .contract
        .get("rows")?
        .as_array()
        .map(Vec::as_slice)
}

/// The interval a seed's verdict is judged on, and how the summary names
/// it.
struct Judged {
    /// The rounds' spread with its ends replaced by the median's
    /// confidence interval where the lab gave one (a contract row's
    /// `[low, high]` field; with nine rounds or more it leaves out the
    /// extreme rounds), else the spread as it is.
    spread: Option<Spread>,
    /// "beyond the median's interval" where that interval is narrower
    /// than the rounds' lowest to highest, else "beyond the spread".
    beyond: &'static str,
    /// "; the median's interval (…) low to high" where it is narrower,
    /// else empty.
    words: String,
    /// "the median's interval" where that interval is narrower, else "the
    /// spread": what the words call the interval judged on.
    noun: &'static str,
}

impl Judged {
    /// From `row`'s `field` (`[low, high]`) and the rounds' `spread`.
    fn of(row: Option<&serde_json::Value>, field: &str, spread: Option<Spread>) -> Self {
        let interval = row.and_then(|r| {
            let i = r.get(field)?.as_array()?;
            Some((i.first()?.as_f64()?, i.get(1)?.as_f64()?))
        });
        let judged = match (interval, spread) {
            (Some((lo, hi)), Some(s)) => Some(Spread {
                min: lo,
                median: s.median,
                max: hi,
            }),
            _ => spread,
        };
        // Named only where it is not the rounds' own lowest and highest.
        let narrower = interval.filter(|&(lo, hi)| {
            let differs = |a: f64, b: f64| (a - b).abs() > 1e-9 * a.abs().max(b.abs());
            spread.is_none_or(|s| differs(lo, s.min) || differs(hi, s.max))
        });
        Judged {
            spread: judged,
            beyond: if narrower.is_some() {
                "beyond the median's interval"
            } else {
                "beyond the spread"
            },
            noun: if narrower.is_some() {
                "the median's interval"
            } else {
                "the spread"
            },
            words: narrower.map_or_else(String::new, |(lo, hi)| {
                format!(
                    "; the median's interval (at least {:.2} % confidence) {} to {}",
                    super::verdict::CONFIDENCE * 100.0,
                    fmt(Some(lo), "×"),
                    fmt(Some(hi), "×")
                )
            }),
        }
    }
}

/// Why one of `policies`' ordered rows of `scenario`'s contract is
/// invalid, the first such; `None` when all stand (or say nothing).
fn invalid_row(reports: &[Report], scenario: &str, policies: &[&str]) -> Option<String> {
    contract_rows(reports, scenario)?
        .iter()
        .filter(|r| {
            r["ordering"] == "ordered"
                && policies.iter().any(|p| r["policy"] == *p)
                && r["valid"] == false
        })
        .find_map(|r| {
            Some(format!(
                "{}: {}",
                r["policy"].as_str()?,
                r["why"].as_str().unwrap_or("(no reason recorded)")
            ))
        })
}

fn seed_000(reports: &[Report]) -> SeedLine {
    // Their array-batched table: none 74 @ 42 %, batched 72 @ 62 %.
    let theirs = (62.0 / 72.0) / (42.0 / 74.0);
    let claim = "deferred vs no IOMMU, service demand at equal load, 32-byte UDP through a stack";
    let Some(t) = find(reports, "udp-32", "results") else {
        return missing("000", claim, theirs, "×", "udp-32");
    };
    let ours = t.get("deferred/ordered", "vs_passthrough");
    // A report stored before figures carried their spread kept it in
    // `_min` and `_max` columns.
    let spread = t.spread("deferred/ordered", "vs_passthrough").or_else(|| {
        Some(Spread {
            min: t.get("deferred/ordered", "vs_passthrough_min")?,
            median: ours?,
            max: t.get("deferred/ordered", "vs_passthrough_max")?,
        })
    });
    let row = contract_rows(reports, "udp-32").and_then(|rows| {
        rows.iter()
            .find(|r| r["policy"] == "deferred" && r["ordering"] == "ordered")
    });
    let Judged {
        spread: judged,
        beyond,
        words: interval_words,
        noun,
    } = Judged::of(row, "vs_passthrough_interval", spread);
    let strict = t.get("strict/ordered", "vs_passthrough");
    let bounce = t.get("bounce/ordered", "vs_passthrough");
    let rows = ["passthrough/ordered", "deferred/ordered", "strict/ordered"];
    let invalid = invalid_row(reports, "udp-32", &["passthrough", "deferred", "strict"])
        .or_else(|| invalid_among(t, &rows).map(|w| w.replacen("/ordered", "", 1)));
    SeedLine {
        seed: "000",
        claim: claim.into(),
        theirs: Some(theirs),
        ours,
        ours_spread: spread,
        unit: "×",
        detail: format!(
            "smoltcp over virtio-net, every policy paced to one rate with no drops; CPU of both hosts' driver+stack threads and flush timers per datagram delivered, the modelled IOMMU's own work run on them (its queue passes) apart: deferred {} pass-through's (rounds {} to {}{interval_words}); strict {} (theirs 1.81×), bounce {}",
            fmt(ours, "×"),
            fmt(spread.map(|s| s.min), "×"),
            fmt(spread.map(|s| s.max), "×"),
            fmt(strict, "×"),
            fmt(bounce, "×")
        ),
        verdict: match (&invalid, ours) {
            (None, None) => "no deferred or pass-through row".into(),
            _ => {
                // The seed's one figure is taken to reach `SEED_MARGIN`
                // either way (see `judge_near`).
                let within = format!(
                    "deferred against the seed's batching: {noun} meets the seed's figure within a factor of {SEED_MARGIN}, so no verdict"
                );
                let less = format!(
                    "deferred costs less over no-IOMMU than the seed's batching, {beyond} by more than a factor of {SEED_MARGIN}"
                );
                let more = format!(
                    "deferred costs more over no-IOMMU than the seed's batching, {beyond} by more than a factor of {SEED_MARGIN}"
                );
                match judge_near(judged, theirs, SEED_MARGIN, invalid).words(&less, &more, &within)
                {
                    Ok(w) => w.into(),
                    Err(why) => format!("no verdict: {why}"),
                }
            }
        },
        scenario: Some("udp-32".into()),
        spark: Some(("udp-32", "results", "deferred/ordered", "vs_passthrough")),
    }
}

fn seed_001(reports: &[Report]) -> SeedLine {
    let none = (880.31 + 876.73 + 880.73 + 878.63) / 4.0;
    let theirs = none / ((869.39 + 864.99 + 886.13 + 872.90) / 4.0);
    let claim = "full barrier per DMA access vs none, cost: ours the device thread's CPU time per descriptor (thread CPU clock), theirs TCP throughput";
    let Some(t) = find(reports, "access-ordering", "results") else {
        return missing("001", claim, theirs, "×", "access-ordering");
    };
    let full = t.get("full", "vs_relaxed");
    let ordered = t.get("ordered", "vs_relaxed");
    let wall = t.get("full", "vs_relaxed_wall");
    let violations = reports
        .iter()
        .find(|r| r.scenario == "litmus-ordering")
        .and_then(|r| r.contract.get("ok"))
        .and_then(|v| v.as_bool());
    SeedLine {
        seed: "001",
        claim: claim.into(),
        theirs: Some(theirs),
        ours: full,
        ours_spread: t.spread("full", "vs_relaxed"),
        unit: "×",
        detail: format!(
            "device CPU ns per descriptor over relaxed's in the same round (median of the rounds): full {}, ordered (our default) {}; on wall-clock time full {} (what a co-runner taking the core also moves); theirs is TCP throughput through a whole guest",
            fmt(full, "×"),
            fmt(ordered, "×"),
            fmt(wall, "×")
        ),
        verdict: match violations {
            Some(true) => "ordered: no forbidden litmus outcome; its cost is the device's alone".into(),
            Some(false) => "ordered or full showed a FORBIDDEN litmus outcome".into(),
            None => "litmus did not run".into(),
        },
        scenario: Some("access-ordering".into()),
        spark: Some(("access-ordering", "results", "full", "vs_relaxed")),
    }
}

fn seed_002(reports: &[Report]) -> SeedLine {
    let claim = "IOPF speed / pinned, one 1 MB send: ours kB per CPU-second of the fault path's work (device and handler, served inline on one core) over pinned's (device), theirs wall-clock speed";
    let Some(t) = find(reports, "page-faults", "results") else {
        return missing("002", claim, 36.6, "%", "page-faults");
    };
    let ours = t.get("1 MiB/1/1", "cpu_ratio_pct");
    let wall = t.get("1 MiB/1/1", "ratio_pct");
    // The longest run of 1 MiB sends the table has.
    let last = (0..t.rows.len())
        .map(|i| t.row_key(i))
        .filter(|k| k.starts_with("1 MiB/1/"))
        .max_by_key(|k| k.rsplit('/').next().and_then(|n| n.parse::<u64>().ok()));
    let long = last.as_deref().and_then(|k| t.get(k, "cpu_ratio_pct"));
    let long_wall = last.as_deref().and_then(|k| t.get(k, "ratio_pct"));
    let f1 = t.get("10 MiB/1/1", "faults");
    let f512 = t.get("10 MiB/512/1", "faults");
    let rep = reports.iter().find(|r| r.scenario == "page-faults");
    let lat = rep
        .and_then(|r| r.contract.pointer("/fault_latency_us/p50"))
        .and_then(|v| v.as_f64());
    let repeats = rep
        .and_then(|r| r.params.iter().find(|p| p.name == "repeats"))
        .map_or("1", |p| p.value.as_str());
    let rounds = if repeats == "1" {
        "each figure from one round, so it has no spread".to_string()
    } else {
        format!("CPU figures the median of the timed runs (at least {repeats}, and enough for {} sends per row) with their spread, wall figures the fastest of {repeats}", crate::lab::iopf::TIMED_SENDS)
    };
    SeedLine {
        seed: "002",
        claim: claim.into(),
        theirs: Some(36.6),
        ours,
        ours_spread: None,
        unit: "%",
        detail: format!(
            "an accelerator reading through the unit, premap 1, per CPU-second of the work (the device thread's CPU clock, the handler serving its requests inline on that thread): one send {}, {} sends {} (theirs 99.1 % at 5000); on wall-clock time {} and {}; 10 MiB faults premap 1 {} vs 512 {}; fault raise -> answer p50 {} (theirs ~1.6 µs handler time); {rounds}",
            fmt(ours, " %"),
            last.as_deref().and_then(|k| k.rsplit('/').next()).unwrap_or("?"),
            fmt(long, " %"),
            fmt(wall, " %"),
            fmt(long_wall, " %"),
            fmt(f1, ""),
            fmt(f512, ""),
            fmt(lat, " µs")
        ),
        verdict: match (ours, long) {
            (Some(o), Some(l)) if o < 100.0 && l > o => {
                "faulting costs most on the first send and fades with reuse, as in the seed".into()
            }
            (Some(_), Some(_)) => "the ratio does not rise with reuse as in the seed".into(),
            _ => "no 1 MiB, premap 1 rows".into(),
        },
        scenario: Some("page-faults".into()),
        spark: Some(("page-faults", "results", "1 MiB/1/1", "cpu_ratio_pct")),
    }
}

fn seed_003(reports: &[Report]) -> SeedLine {
    /// Why a row of `scenario`'s walks is invalid, the first such.
    fn invalid_walk(reports: &[Report], scenario: &str) -> Option<String> {
        contract_rows(reports, scenario)?
            .iter()
            .filter(|r| r["valid"] == false)
            .find_map(|r| {
                Some(format!(
                    "{}/{}: {}",
                    r["walk"].as_str()?,
                    r["policy"].as_str()?,
                    r["why"].as_str().unwrap_or("(no reason recorded)")
                ))
            })
    }
    let theirs = 4380.0 / 7908.0;
    let claim = "non-coherent walk vs coherent, throughput with the driver CPU saturated: theirs measured at saturation, ours stated as CPU per unit of work (coherent driver CPU per GB / non-coherent's)";
    let Some(t) = find(reports, "tcp-64k", "results") else {
        return missing("003", claim, theirs, "×", "tcp-64k");
    };
    let row = "non-coherent/deferred";
    let ours = t.get(row, "saturated_vs_coherent");
    // The rounds' paired ratios; a report stored before figures carried
    // their spread kept it in `_min` and `_max` columns.
    let spread = t.spread(row, "saturated_vs_coherent").or_else(|| {
        Some(Spread {
            min: t.get(row, "saturated_vs_coherent_min")?,
            median: ours?,
            max: t.get(row, "saturated_vs_coherent_max")?,
        })
    });
    let (lo, hi) = (spread.map(|s| s.min), spread.map(|s| s.max));
    let contract = contract_rows(reports, "tcp-64k").and_then(|rows| {
        rows.iter()
            .find(|r| r["walk"] == "non-coherent" && r["policy"] == "deferred")
    });
    let judged = Judged::of(contract, "saturated_vs_coherent_interval", spread);
    let measured = t.get(row, "vs_coherent");
    let strict = t.get("non-coherent/strict", "saturated_vs_coherent");
    let share = t.get(row, "flush_cpu_share_pct");
    let lines = t.get(row, "lines_flushed_per_gb");
    let (cpu_c, cpu_n) = (
        t.get("coherent/deferred", "cpu_s_per_gb"),
        t.get(row, "cpu_s_per_gb"),
    );
    let invalid = ["coherent/deferred", row]
        .iter()
        .any(|r| t.invalid_why(r).is_some())
        .then(|| {
            invalid_walk(reports, "tcp-64k")
                .or_else(|| invalid_among(t, &["coherent/deferred", row]))
                .unwrap_or_else(|| "a row is marked invalid".into())
        });
    SeedLine {
        seed: "003",
        claim: claim.into(),
        theirs: Some(theirs),
        ours,
        ours_spread: spread,
        unit: "×",
        detail: format!(
            "one smoltcp TCP stream, deferred, stated as CPU per unit of work (the stream need not saturate its driver threads): driver CPU (both hosts' driver+stack threads and flush timers, without the drivers' waits for their devices, which a saturated driver never makes) {} per GB coherent, {} non-coherent, so a CPU-saturated driver would reach {} of coherent's throughput (each round's paired ratio, rounds {} to {}{}; {} with the drivers' waits counted in); measured below saturation {} of coherent's Mbit/s; {} lines flushed per GB, flush share {} of driver CPU (estimated; theirs 5.86 %); strict {}",
            fmt(cpu_c, " s"),
            fmt(cpu_n, " s"),
            fmt(ours, "×"),
            fmt(lo, "×"),
            fmt(hi, "×"),
            judged.words,
            fmt(t.get(row, "saturated_vs_coherent_with_waits"), "×"),
            fmt(measured, "×"),
            fmt(lines.map(|l| l / 1e6), " M"),
            fmt(share, " %"),
            fmt(strict, "×")
        ),
        verdict: match ours {
            None if invalid.is_none() => "no deferred rows for both walks".into(),
            _ => seed_003_verdict(&judged, theirs, invalid),
        },
        scenario: Some("tcp-64k".into()),
        spark: Some(("tcp-64k", "results", "non-coherent/deferred", "saturated_vs_coherent")),
    }
}

/// Seed 003's verdict, twice on the same interval: the claim's direction
/// (a non-coherent walk costs more driver CPU per GB than a coherent one:
/// ours below 1.0, by `judge`) and its size against the seed's (by
/// `judge_near`).
/// `judged` names the interval ("beyond the spread", or the median's).
fn seed_003_verdict(judged: &Judged, theirs: f64, invalid: Option<String>) -> String {
    let (spread, beyond) = (judged.spread, judged.beyond);
    let noun = judged.noun;
    let extra_within = format!("a non-coherent walk's extra driver CPU per GB is within {noun}");
    let size_within = format!(
        "flushing against the seed's: {noun} meets the seed's figure within a factor of {SEED_MARGIN}, so no verdict on the size"
    );
    let direction = judge(spread, 1.0, invalid.clone());
    let more =
        format!("a non-coherent walk costs more driver CPU per GB than a coherent one, {beyond}");
    let less =
        format!("a non-coherent walk costs less driver CPU per GB than a coherent one, {beyond}");
    let direction = direction.words(&more, &less, &extra_within);
    // On size, the seed's one figure is taken to reach `SEED_MARGIN`
    // either way (see `judge_near`).
    let size = judge_near(spread, theirs, SEED_MARGIN, invalid);
    let as_much = format!(
        "flushing costs as much CPU per GB as the seed's or more, {beyond} by more than a factor of {SEED_MARGIN}"
    );
    let cheaper = format!(
        "flushing exactly the lines written costs less CPU per GB than the seed's flushing cost throughput, {beyond} by more than a factor of {SEED_MARGIN}"
    );
    let size = size.words(&as_much, &cheaper, &size_within);
    let (direction, size) = match (direction, size) {
        (Ok(d), Ok(s)) => (d, s),
        (Err(why), _) | (_, Err(why)) => return format!("no verdict: {why}"),
    };
    format!("{direction}; {size}")
}

fn seed_004(reports: &[Report]) -> SeedLine {
    let theirs = (1.3 + 2.7) / 2.0 / ((6.0 + 6.7) / 2.0);
    let claim = "throughput retained after aging: ours I/Os per CPU-second of the aged allocator over a fresh one's of the same policy interleaved on the same thread (median of the last quarter / first quarter after warm-up), theirs fio IOPS on a dedicated machine";
    let Some(t) = find(reports, "aging", "summary") else {
        return missing("004", claim, theirs, "×", "aging");
    };
    let ours = t.get("softiommu", "retained_vs_fresh");
    let alone = t.get("softiommu", "retained");
    let wall = t.get("softiommu", "retained_wall");
    let base = |p: &str| t.get(p, "retained_vs_fresh");
    // Every baseline that fell off a cliff, named in the verdict (their
    // figures are in the detail): in its worst quarter past the warm-up
    // slower than CLIFF of a fresh arm's speed (a level, not a change
    // from its first quarter), whatever it did after (a design that
    // fell and climbed back before the run ended fell all the same; its
    // last-over-first figure can read above 1 when the fall began in the
    // first quarter), or, in a report without that column, its
    // last-over-first figure below CLIFF. A baseline's gradual drift (the
    // 2016 design's worst quarter read 0.65-0.70) is no cliff. Which of
    // two that both fell went lower is noise, not a verdict.
    let fell: Vec<&str> = BASELINES
        .iter()
        .copied()
        .filter(|&p| {
            t.get(p, "lowest_quarter_vs_fresh")
                .or_else(|| base(p))
                .is_some_and(|r| r < CLIFF)
        })
        .collect();
    // The same figure on the storage path, where that scenario ran: ours
    // against a fresh device driven by the same job threads.
    let storage = find(reports, "storage-aging", "summary").map_or_else(String::new, |s| {
        format!(
            "; on the storage path (fio jobs on virtio-blk) softiommu {} against a fresh device ({} per driver CPU-second alone), linux-2016 {}",
            fmt(s.get("softiommu", "retained_vs_fresh"), "×"),
            fmt(s.get("softiommu", "retained"), "×"),
            fmt(s.get("linux-2016", "retained_vs_fresh"), "×")
        )
    });
    SeedLine {
        seed: "004",
        claim: claim.into(),
        theirs: Some(theirs),
        ours,
        ours_spread: None,
        unit: "×",
        detail: format!(
            "softiommu {} against a fresh arm (the machine's speed divided out; {} per CPU-second of the aged arm alone, {} wall clock); against their fresh arms linux-2016 {}, linux-2020 {}, linux-2023 {} (their worst quarter {}, {}, {}); theirs after 16 h, ours after a short run{}",
            fmt(ours, "×"),
            fmt(alone, "×"),
            fmt(wall, "×"),
            fmt(base("linux-2016"), "×"),
            fmt(base("linux-2020"), "×"),
            fmt(base("linux-2023"), "×"),
            fmt(t.get("linux-2016", "lowest_quarter_vs_fresh"), "×"),
            fmt(t.get("linux-2020", "lowest_quarter_vs_fresh"), "×"),
            fmt(t.get("linux-2023", "lowest_quarter_vs_fresh"), "×"),
            storage
        ),
        verdict: match (ours, &fell[..]) {
            (Some(o), []) if o >= 0.9 => {
                "ours stays flat (no baseline fell off a cliff in this run)".into()
            }
            (Some(o), [p]) if o >= 0.9 => {
                format!("ours stays flat; the {p} design falls off a cliff (below {CLIFF}×)")
            }
            (Some(o), [ps @ .., p]) if o >= 0.9 => format!(
                "ours stays flat; the {} and {p} designs fall off a cliff (below {CLIFF}×)",
                ps.join(", ")
            ),
            (Some(_), _) => "ours LOST throughput against a fresh allocator too (median of the last quarter / first, past a warm-up)".into(),
            _ => "no softiommu row".into(),
        },
        scenario: Some("aging".into()),
        spark: Some(("aging", "summary", "softiommu", "retained_vs_fresh")),
    }
}

/// The Linux designs seed 004's line reports beside ours.
const BASELINES: [&str; 3] = ["linux-2016", "linux-2020", "linux-2023"];

/// A baseline whose worst post-warm-up quarter (`lowest_quarter_vs_fresh`)
/// is below this fraction of a fresh arm fell off a cliff (the seed's own
/// fall was to 0.31 of its start).
const CLIFF: f64 = 0.5;

fn fmt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}{unit}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Cell, Column, Unit};
    use crate::seeds::verdict::Verdict;
    use std::cmp::Ordering;

    /// A report of `scenario` whose `table` has one row `row` (label
    /// cells split on `/`) with figure `key`.
    fn one(scenario: &str, table: &str, row: &str, key: &str, cell: Cell) -> Report {
        one_row(scenario, table, row, &[key], vec![cell])
    }

    /// A report of `scenario` whose table `table` has one row `row` (label
    /// cells split on `/`) with the figures `keys` valued `cells`.
    fn one_row(scenario: &str, table: &str, row: &str, keys: &[&str], cells: Vec<Cell>) -> Report {
        let labels: Vec<&str> = row.split('/').collect();
        let mut cols: Vec<Column> = (0..labels.len())
            .map(|i| Column::label(&format!("l{i}")))
            .collect();
        cols.extend(keys.iter().map(|k| Column::metric(k, k, Unit::Ratio, 2)));
        let mut t = Table::new(table, "t", cols);
        t.row(labels.iter().map(|l| (*l).into()).chain(cells).collect());
        report_with(scenario, t)
    }

    /// A report of `scenario` holding `t`.
    fn report_with(scenario: &str, t: Table) -> Report {
        let mut r = Report::new("x", "x", serde_json::json!({}));
        r.scenario = scenario.into();
        r.tables.push(t);
        r
    }

    /// Seed 004's `summary` table: one row per policy, its `metrics`.
    fn policy_table(metrics: &[&str], rows: &[(&str, &[f64])]) -> Table {
        let cols = std::iter::once(Column::label("policy"))
            .chain(metrics.iter().map(|m| Column::metric(m, m, Unit::Ratio, 2)))
            .collect();
        let mut t = Table::new("summary", "t", cols);
        for (policy, xs) in rows {
            t.row(
                std::iter::once((*policy).into())
                    .chain(xs.iter().map(|&x| Cell::Num(x)))
                    .collect(),
            );
        }
        t
    }

    #[test]
    fn ours_is_judged_only_where_every_round_lies_on_one_side() {
        let s = Spread::of(&[1.1, 1.2, 1.3]);
        assert_eq!(
            judge(Some(s), 1.0, None),
            Verdict::Beyond(Ordering::Greater)
        );
        assert_eq!(judge(Some(s), 1.5, None), Verdict::Beyond(Ordering::Less));
        assert_eq!(judge(Some(s), 1.25, None), Verdict::Within, "straddles");
        assert!(
            matches!(judge(None, 1.25, None), Verdict::None(_)),
            "one round: no interval, no verdict"
        );
    }

    #[test]
    fn seed_000_straddling_their_figure_is_within_the_spread() {
        // Theirs is 1.517: our rounds from 1.40 to 1.60 straddle it.
        let spread = Spread::of(&[1.40, 1.50, 1.60]);
        let r = one(
            "udp-32",
            "results",
            "deferred/ordered",
            "vs_passthrough",
            Cell::median(spread),
        );
        let l = summarise(&[r]).remove(0);
        assert_eq!(
            l.verdict,
            "deferred against the seed's batching: the spread meets the seed's figure within a factor of 1.15, so no verdict"
        );
        assert_eq!((l.ours, l.ours_spread), (Some(1.5), Some(spread)));
    }

    #[test]
    fn a_seed_whose_headline_row_is_marked_invalid_gets_no_verdict() {
        // Seed 003's line follows tcp-64k's non-coherent/deferred row.
        let mut r = one(
            "tcp-64k",
            "results",
            "non-coherent/deferred",
            "vs_coherent",
            Cell::Num(1.08),
        );
        r.tables[0].mark_invalid(
            "non-coherent/deferred",
            "measurement invalid: non-coherent's CPU per GB is below coherent's",
        );
        let l = summarise(&[r]).remove(3);
        assert_eq!(l.seed, "003");
        assert_eq!(
            l.verdict,
            "no verdict: non-coherent/deferred: measurement invalid: non-coherent's CPU per GB is below coherent's"
        );
    }

    /// A report of `scenario` whose `results` table has one row `row`
    /// with the CPU figure `cpu` and the wall-clock figure `wall`.
    fn cpu_and_wall(scenario: &str, row: &str, keys: [&str; 2], cpu: f64, wall: f64) -> Report {
        one_row(
            scenario,
            "results",
            row,
            &keys,
            vec![Cell::Num(cpu), Cell::Num(wall)],
        )
    }

    #[test]
    fn seeds_001_and_002_compare_cpu_time_and_show_the_wall_figure_beside() {
        // A co-runner moves the wall figure; ours is the CPU one.
        let r = cpu_and_wall(
            "access-ordering",
            "full",
            ["vs_relaxed", "vs_relaxed_wall"],
            1.10,
            1.36,
        );
        let l = summarise(&[r]).remove(1);
        assert_eq!(l.ours, Some(1.10));
        assert!(l.claim.contains("CPU time per descriptor"), "{}", l.claim);
        assert!(
            l.detail.contains("on wall-clock time full 1.36×"),
            "{}",
            l.detail
        );
        let r = cpu_and_wall(
            "page-faults",
            "1 MiB/1/1",
            ["cpu_ratio_pct", "ratio_pct"],
            20.0,
            38.6,
        );
        let l = summarise(&[r]).remove(2);
        assert_eq!(l.ours, Some(20.0));
        assert!(l.claim.contains("per CPU-second"), "{}", l.claim);
        assert!(
            l.detail.contains("on wall-clock time 38.60 %"),
            "{}",
            l.detail
        );
    }

    #[test]
    fn seed_004_judges_the_figure_against_the_fresh_arm_and_shows_the_others_beside() {
        // A co-runner moved the aged arm's CPU figure alone to 1.58; against
        // the fresh arm ours is 0.99.
        let t = policy_table(
            &["retained_vs_fresh", "retained", "retained_wall"],
            &[
                ("linux-2016", &[0.80, 0.45, 0.5]),
                ("linux-2020", &[0.13, 0.1, 0.1]),
                ("softiommu", &[0.99, 1.58, 1.2]),
            ],
        );
        let r = report_with("aging", t);
        let l = summarise(std::slice::from_ref(&r)).remove(4);
        assert_eq!(l.seed, "004");
        assert_eq!(l.ours, Some(0.99));
        assert_eq!(
            l.verdict,
            "ours stays flat; the linux-2020 design falls off a cliff (below 0.5×)"
        );
        assert!(
            l.detail.starts_with(
                "softiommu 0.99× against a fresh arm (the machine's speed divided out; 1.58× per CPU-second of the aged arm alone, 1.20× wall clock); against their fresh arms linux-2016 0.80×, linux-2020 0.13×, linux-2023 -"
            ),
            "{}",
            l.detail
        );
        assert_eq!(
            l.spark,
            Some(("aging", "summary", "softiommu", "retained_vs_fresh"))
        );
        // A baseline drifting within its noise is no cliff: the verdict
        // says so rather than reading one into it.
        let mut r2 = r.clone();
        r2.tables[0] = Table::new(
            "summary",
            "t",
            vec![
                Column::label("policy"),
                Column::metric("retained_vs_fresh", "r", Unit::Ratio, 2),
            ],
        );
        r2.tables[0].row(vec!["linux-2016".into(), Cell::Num(0.67)]);
        r2.tables[0].row(vec!["softiommu".into(), Cell::Num(1.04)]);
        assert_eq!(
            summarise(&[r2]).remove(4).verdict,
            "ours stays flat (no baseline fell off a cliff in this run)"
        );
        // The storage path's paired figure stands beside, where it ran.
        let mut s = r.clone();
        s.scenario = "storage-aging".into();
        s.tables[0].rows[2][1] = Cell::Num(0.97);
        let l = summarise(&[r, s]).remove(4);
        assert!(
            l.detail.ends_with(
                "; on the storage path (fio jobs on virtio-blk) softiommu 0.97× against a fresh device (1.58× per driver CPU-second alone), linux-2016 0.80×"
            ),
            "{}",
            l.detail
        );
    }

    #[test]
    fn seed_004_names_every_baseline_that_fell_whichever_fell_lower() {
        // Quiet, 2023 fell lower; busy, 2020 did: the same verdict.
        let aging = |r2020: f64, r2023: f64| {
            let t = policy_table(
                &["retained_vs_fresh"],
                &[
                    ("linux-2016", &[0.62]),
                    ("linux-2020", &[r2020]),
                    ("linux-2023", &[r2023]),
                    ("softiommu", &[0.99]),
                ],
            );
            let r = report_with("aging", t);
            summarise(&[r]).remove(4).verdict
        };
        let quiet = aging(0.041, 0.034);
        assert_eq!(
            quiet,
            "ours stays flat; the linux-2020 and linux-2023 designs fall off a cliff (below 0.5×)"
        );
        assert_eq!(aging(0.018, 0.021), quiet);
    }

    /// A design that fell off a cliff and climbed back before the run
    /// ended (its last quarter over its first read 1.22 in a quick run:
    /// the fall began in the first quarter) is named by its worst
    /// quarter; a gradual drift (2016's worst quarter 0.65) is not.
    #[test]
    fn seed_004_names_a_baseline_that_fell_and_climbed_back() {
        let t = policy_table(
            &["retained_vs_fresh", "lowest_quarter_vs_fresh"],
            &[
                ("linux-2016", &[0.51, 0.65]),
                ("linux-2020", &[1.22, 0.035]),
                ("linux-2023", &[0.019, 0.012]),
                ("softiommu", &[0.99, 1.08]),
            ],
        );
        let r = report_with("aging", t);
        let l = summarise(&[r]).remove(4);
        assert_eq!(
            l.verdict,
            "ours stays flat; the linux-2020 and linux-2023 designs fall off a cliff (below 0.5×)"
        );
        assert!(
            l.detail
                .contains("(their worst quarter 0.65×, 0.04×, 0.01×)"),
            "{}",
            l.detail
        );
    }

    #[test]
    fn a_figure_of_one_round_has_no_spread_and_says_so() {
        let r = one(
            "page-faults",
            "results",
            "1 MiB/1/1",
            "cpu_ratio_pct",
            Cell::Num(40.0),
        );
        let l = summarise(&[r]).remove(2);
        assert_eq!((l.ours, l.ours_spread), (Some(40.0), None));
        assert!(
            l.detail
                .ends_with("each figure from one round, so it has no spread"),
            "{}",
            l.detail
        );
    }
}
