//! The page: data gathered from the database, then one pass of markup.

use std::fmt::Write;

use super::escape::esc;
use super::svg::{plot, sparkline, COLOURS};
use crate::error::LabResult;
use crate::render::format_cell;
use crate::report::{
    Axis, Cell, Plot, PlotKind, Provenance, Report, Series, Table, Unit, MODELLED_MARK,
};
use crate::seeds::{summarise, their_table, SeedLine};
use crate::store::{RunRow, Store, StoredScenario};

/// A figure's values across the stored runs, for a sparkline.
#[derive(Debug, Clone, PartialEq)]
pub struct Spark {
    /// The seed.
    pub seed: String,
    /// Oldest first: (run id, value).
    pub values: Vec<(i64, f64)>,
}

/// Everything the page shows.
#[derive(Debug, Clone)]
pub struct PageData {
    /// The run.
    pub run: RunRow,
    /// Its scenarios.
    pub scenarios: Vec<StoredScenario>,
    /// The seed summary.
    pub seeds: Vec<SeedLine>,
    /// Each seed's figure across runs.
    pub sparks: Vec<Spark>,
    /// The most recent runs in the database (newest last).
    pub recent: Vec<RunRow>,
}

impl PageData {
    /// Gathers run `id` from `store`.
    pub fn load(store: &Store, id: i64) -> LabResult<PageData> {
        let run = store.run(id)?;
        let scenarios = store.scenarios(id)?;
        let reports: Vec<Report> = scenarios.iter().map(|s| s.report.clone()).collect();
        let seeds = summarise(&reports);
        let mut sparks = Vec::new();
        for s in &seeds {
            if let Some((sc, t, row, name)) = s.spark {
                let values = store
                    .metric_history(sc, t, row, name)?
                    .into_iter()
                    .filter(|(r, _)| *r <= id)
                    .collect();
                sparks.push(Spark {
                    seed: s.seed.to_string(),
                    values,
                });
            }
        }
        let all = store.runs()?;
        let recent = all
            .into_iter()
            .filter(|r| r.id <= id)
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Ok(PageData {
            run,
            scenarios,
            seeds,
            sparks,
            recent,
        })
    }
}

const CSS: &str = "
:root{--fg:#1d2329;--mut:#5b6670;--line:#d9dee3;--bg:#fff;--soft:#f4f6f8;--acc:#0b6fa4;--warn:#a4400b}
*{box-sizing:border-box}
body{margin:0;font:15px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1240px;margin:0 auto;padding:20px 20px 60px}
h1{font-size:1.6rem;margin:.2em 0}
h2{font-size:1.3rem;margin:2.2em 0 .4em;padding-top:.6em;border-top:2px solid var(--line)}
h3{font-size:1.05rem;margin:1.4em 0 .3em}
h4{font-size:.95rem;margin:.8em 0 .3em;color:var(--mut)}
p{margin:.4em 0}
.meta{color:var(--mut);font-size:.9rem}
.note{background:var(--soft);border-left:4px solid var(--acc);padding:.6em .9em;margin:1em 0;font-size:.92rem}
.note.modelled{border-color:var(--warn)}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;margin:.4em 0 1em}
table{border-collapse:collapse;font-size:.86rem;font-variant-numeric:tabular-nums}
.cap{color:var(--mut);font-size:.85rem;margin:.8em 0 .2em}
th,td{padding:.3em .6em;border-bottom:1px solid var(--line);white-space:nowrap;vertical-align:top}
th{background:var(--soft);text-align:left;font-weight:600;white-space:normal;min-width:4.5em;vertical-align:bottom}
td.n,th.n{text-align:right}
td.wrap{white-space:normal;min-width:14em}
tr.theirs td{color:#444}
tr.invalid td{background:#fdecea;color:#8a1c1c}
.badge{display:inline-block;background:#a4400b;color:#fff;border-radius:3px;padding:0 .35em;font-size:.75rem;font-weight:600}
p.invalid{background:#fdecea;border-left:4px solid #d1495b;padding:.4em .8em;font-size:.9rem;color:#8a1c1c}
.pair{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,460px),1fr));gap:8px 28px;align-items:start}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,520px),1fr));gap:12px 28px}
figure{margin:.4em 0 1em;max-width:660px}
figcaption{font-size:.85rem;color:var(--mut);margin-bottom:.2em}
svg.plot{width:100%;height:auto;display:block}
svg.plot text{font:14px system-ui,sans-serif;fill:#333}
svg.plot .axis{font-size:15px;fill:#222}
svg.plot .val{font-size:13px;fill:#222}
svg.plot .grid{stroke:#e7eaee}
svg.plot .frame{stroke:#999}
svg.plot .whisker line{stroke:#222;stroke-width:1.4}
svg.spark{width:120px;height:28px;vertical-align:middle}
.legend{font-size:.82rem;display:flex;flex-wrap:wrap;gap:4px 14px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}
.params{font-size:.82rem;color:var(--mut)}
.params code{background:var(--soft);padding:0 .3em;border-radius:3px;color:var(--fg)}
.verdict{font-weight:600}
.toc a{margin-right:1em}
@media (max-width:600px){main{padding:12px}body{font-size:14px}h1{font-size:1.3rem}
table.summary,table.summary tbody,table.summary tr,table.summary td{display:block;width:100%}
table.summary thead{display:none}
table.summary tr{border:1px solid var(--line);border-radius:6px;margin:0 0 10px;padding:6px 8px}
table.summary td{border:0;padding:2px 0;text-align:left;white-space:normal}
table.summary td[data-label]::before{content:attr(data-label) ': ';color:var(--mut)}
.meta code{word-break:break-all}}
";

fn cell(c: &Cell, unit: Option<Unit>, decimals: u8) -> String {
    match c {
        Cell::Missing => "–".into(),
        c => format_cell(c, unit, decimals),
    }
}

/// A table as HTML, units and modelled marks in the headers, a figure's
/// spread over rounds beside it, and each row marked invalid set apart:
/// tinted, badged "measurement invalid" and explained under the table.
pub fn table(t: &Table, out: &mut String) {
    let theirs = t.columns.iter().any(|c| c.provenance == Provenance::Theirs);
    let _ = write!(
        out,
        "<p class=\"cap\">{}</p><div class=\"scroll\"><table><thead><tr>",
        esc(&t.title)
    );
    for c in &t.columns {
        let cls = if c.unit.is_some() { " class=\"n\"" } else { "" };
        let _ = write!(out, "<th{cls}>{}</th>", esc(&c.header()));
    }
    out.push_str("</tr></thead><tbody>");
    for (i, r) in t.rows.iter().enumerate() {
        let bad = t.invalid_why(&t.row_key(i)).is_some();
        let class = match (bad, theirs) {
            (true, _) => " class=\"invalid\"",
            (false, true) => " class=\"theirs\"",
            (false, false) => "",
        };
        let _ = write!(out, "<tr{class}>");
        for (j, (c, col)) in r.iter().zip(&t.columns).enumerate() {
            let badge = if bad && j == 0 {
                "<span class=\"badge\">measurement invalid</span> "
            } else {
                ""
            };
            let cls = if col.unit.is_some() {
                " class=\"n\""
            } else if col.key == "verdict" || col.key == "claim" {
                " class=\"wrap\""
            } else {
                ""
            };
            let _ = write!(
                out,
                "<td{cls}>{badge}{}</td>",
                esc(&cell(c, col.unit, col.decimals))
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    for (i, _) in t.rows.iter().enumerate() {
        let key = t.row_key(i);
        if let Some(why) = t.invalid_why(&key) {
            let _ = write!(
                out,
                "<p class=\"invalid\"><b>Measurement invalid: {}</b> — {} (no verdict is drawn from this row)</p>",
                esc(&key),
                esc(&why)
            );
        }
    }
}

fn figure(p: &Plot, out: &mut String) {
    let _ = write!(out, "<figure><figcaption>{}", esc(&p.title));
    if p.modelled {
        let _ = write!(out, " ({MODELLED_MARK} includes modelled latency)");
    }
    out.push_str("</figcaption>");
    out.push_str(&plot(p));
    if p.series.len() > 1 || p.kind != PlotKind::Bars {
        out.push_str("<div class=\"legend\">");
        for (i, s) in p.series.iter().enumerate() {
            let _ = write!(
                out,
                "<span><i style=\"background:{}\"></i>{}</span>",
                COLOURS[i % COLOURS.len()],
                esc(&s.label)
            );
        }
        out.push_str("</div>");
    }
    out.push_str("</figure>");
}

fn params(r: &Report, out: &mut String) {
    out.push_str("<p class=\"params\">parameters: ");
    let v: Vec<String> = r
        .params
        .iter()
        .map(|p| match p.unit {
            Some(u) if u != Unit::Count => {
                format!(
                    "<code>{}={} {}</code>",
                    esc(&p.name),
                    esc(&p.value),
                    esc(u.symbol())
                )
            }
            _ => format!("<code>{}={}</code>", esc(&p.name), esc(&p.value)),
        })
        .collect();
    out.push_str(&v.join(" "));
    let _ = write!(out, "<br>{}</p>", esc(&r.modelled_text()));
}

fn scenario(s: &StoredScenario, out: &mut String) {
    let r = &s.report;
    let _ = write!(
        out,
        "<h3 id=\"sc-{}\">{} <span class=\"meta\">[{}] · {:.1} s</span></h3><p>{}</p>",
        esc(&r.scenario),
        esc(&r.scenario),
        esc(&r.kind),
        s.seconds,
        esc(&r.title)
    );
    params(r, out);
    for t in r.tables.iter().filter(|t| !t.detail) {
        table(t, out);
    }
    for n in &r.notes {
        let _ = write!(out, "<p>{}</p>", esc(n));
    }
    if !r.plots.is_empty() {
        out.push_str("<div class=\"plots\">");
        for p in &r.plots {
            figure(p, out);
        }
        out.push_str("</div>");
    }
}

/// The stale-window vs service-demand trade-off of the deferred policy,
/// from every netperf-udp scenario of the run that ran deferred (ordered
/// DMA) at 32 B.
pub fn tradeoff(scenarios: &[StoredScenario]) -> Option<Plot> {
    let mut pts: Vec<(f64, f64, String)> = Vec::new();
    let mut modelled = false;
    for s in scenarios {
        let r = &s.report;
        if r.kind != "lab netperf-udp" || r.contract["msg_size"] != 32 {
            continue;
        }
        let Some(t) = r.table("results") else {
            continue;
        };
        // Service demand; a report stored before it was named so called
        // it driver_us_per_pkt.
        let us = t
            .get("deferred/ordered", "service_demand_us_per_pkt")
            .or_else(|| t.get("deferred/ordered", "driver_us_per_pkt"));
        let (Some(stale), Some(us)) = (t.get("deferred/ordered", "stale_window_ms_max"), us) else {
            continue;
        };
        let hw = r
            .params
            .iter()
            .find(|p| p.name == "flush_high_water")
            .map_or("256".to_string(), |p| p.value.clone());
        modelled |= !r.modelled.is_empty();
        pts.push((stale, us, format!("hw {hw}")));
    }
    if pts.len() < 2 {
        return None;
    }
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some(Plot {
        name: "tradeoff".into(),
        title: "deferred policy: the stale window bought for each high-water mark (seed 000's review: 250 chosen, 16 asked about)".into(),
        kind: PlotKind::Scatter,
        x: Axis::new("longest stale window", Unit::Ms),
        y: Axis::new("service demand", Unit::UsPerPkt),
        categories: Vec::new(),
        series: vec![Series {
            label: "deferred, 32-byte UDP through smoltcp".into(),
            points: pts.iter().map(|p| (p.0, p.1)).collect(),
            point_labels: pts.into_iter().map(|p| p.2).collect(),
            spreads: Vec::new(),
        }],
        modelled,
    })
}

const SEEDS: [(&str, &str); 5] = [
    (
        "000",
        "intel-iommu IOTLB batching (2008): strict vs deferred invalidation",
    ),
    (
        "001",
        "QEMU DMA barriers (2012): ordering for emulated devices",
    ),
    ("002", "VFIO I/O page faults (2021): map on demand"),
    (
        "003",
        "IOMMU cache flushing cost (2013): non-coherent page walks",
    ),
    ("004", "IOVA rcache flush (2020): allocator aging"),
];

/// The whole page.
pub fn render(d: &PageData) -> String {
    let mut o = String::with_capacity(256 << 10);
    let run = &d.run;
    let _ = write!(
        o,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>softiommu lab report, run {}</title><style>{CSS}</style></head><body><main>",
        run.id
    );
    let _ = write!(
        o,
        "<h1>softiommu lab report — run {}</h1><p class=\"meta\">{} · status <b>{}</b>{} · git {} · {} ({})<br>{} scenario(s); command <code>{}</code></p>",
        run.id,
        esc(&run.started_at),
        esc(&run.status),
        if run.quick { " · quick" } else { "" },
        esc(&run.git_rev),
        esc(&run.host.hostname),
        esc(&run.host.line()),
        run.scenarios,
        esc(&run.command)
    );
    if run.status != "complete" {
        let _ = write!(
            o,
            "<p class=\"note modelled\">This run is <b>{}</b>: only the scenarios that finished are shown.</p>",
            esc(&run.status)
        );
    }
    o.push_str("<p class=\"toc\">");
    for (s, _) in SEEDS {
        let _ = write!(o, "<a href=\"#seed-{s}\">seed {s}</a>");
    }
    o.push_str("<a href=\"#other\">other benches</a><a href=\"#runs\">runs</a></p>");
    // The seed summary, with each seed's figure across the stored runs.
    o.push_str(&format!("<h2 id=\"summary\">Seed summary</h2><p class=\"cap\">their figure, ours (with the spread of its rounds in brackets, lowest to highest, where it was measured in rounds), and the verdict, given only where the interval it is judged on lies wholly on one side of the figure judged against — our lowest to highest round, or, where a lab gives it (nine rounds or more), the median's {:.2} % confidence interval, which leaves the extreme rounds out; a seed's own figure compared on size is taken to reach a factor of {} either way, as one measurement without a spread — and no row it rests on is marked invalid; the sparkline is ours across the stored runs (latest in red)</p><div class=\"scroll\"><table class=\"summary\"><thead><tr><th>seed</th><th>claim</th><th class=\"n\">theirs</th><th class=\"n\">ours</th><th>history</th><th>verdict</th></tr></thead><tbody>",
        crate::seeds::verdict::CONFIDENCE * 100.0,
        crate::seeds::verdict::SEED_MARGIN
    ));
    for s in &d.seeds {
        let spark = d
            .sparks
            .iter()
            .find(|k| k.seed == s.seed)
            .map(|k| sparkline(&k.values.iter().map(|v| v.1).collect::<Vec<_>>()))
            .unwrap_or_default();
        let f = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.2} {}", s.unit));
        let ours = match (s.ours, s.ours_spread) {
            (Some(v), Some(w)) => format!("{v:.2} {} [{:.2}–{:.2}]", s.unit, w.min, w.max),
            (v, _) => f(v),
        };
        let _ = write!(
            o,
            "<tr><td><a href=\"#seed-{}\">seed {}</a></td><td class=\"wrap\">{}<br><span class=\"meta\">{}</span></td><td class=\"n\" data-label=\"theirs\">{}</td><td class=\"n\" data-label=\"ours\">{}</td><td data-label=\"history\">{spark}</td><td class=\"wrap verdict\">{}</td></tr>",
            s.seed,
            s.seed,
            esc(&s.claim),
            esc(&s.detail),
            esc(&f(s.theirs)),
            esc(&ours),
            esc(&s.verdict)
        );
    }
    o.push_str("</tbody></table></div>");
    // What is modelled.
    let mut models: Vec<String> = d
        .scenarios
        .iter()
        .flat_map(|s| {
            s.report
                .modelled
                .iter()
                .map(|m| format!("{} = {} {}", m.name, m.value, m.unit.symbol()))
        })
        .collect();
    models.sort();
    models.dedup();
    let _ = write!(
        o,
        "<p class=\"note modelled\"><b>Measured and modelled.</b> Every figure is measured by the code on this host, except hardware latencies a CPU cannot make real, charged by the latency model in force: {}. Figures that include modelled time carry <b>{MODELLED_MARK}</b> in their column header or plot caption. The seeds' figures are theirs (their hardware, their kernel), shown beside ours for shape, not as a race.</p>",
        if models.is_empty() { "none in this run".to_string() } else { esc(&models.join(", ")) }
    );
    for (seed, title) in SEEDS {
        let _ = write!(
            o,
            "<h2 id=\"seed-{seed}\">Seed {seed} — {}</h2>",
            esc(title)
        );
        if let Some(line) = d.seeds.iter().find(|l| l.seed == seed) {
            let _ = write!(
                o,
                "<p><span class=\"verdict\">{}</span> — {}</p>",
                esc(&line.verdict),
                esc(&line.detail)
            );
        }
        let ours: Vec<&StoredScenario> = d
            .scenarios
            .iter()
            .filter(|s| s.report.seed.as_deref() == Some(seed))
            .collect();
        o.push_str("<div class=\"pair\"><div><h4>Theirs</h4>");
        match their_table(seed) {
            Some(t) => table(&t, &mut o),
            None => o.push_str("<p>The seed printed no table.</p>"),
        }
        o.push_str("</div><div><h4>Ours (headline)</h4>");
        match ours.first().and_then(|s| s.report.tables.first()) {
            Some(t) => table(t, &mut o),
            None => o.push_str("<p>Not measured in this run: the experiment is not built yet or was not selected.</p>"),
        }
        o.push_str("</div></div>");
        if seed == "000" {
            if let Some(p) = tradeoff(&d.scenarios) {
                o.push_str("<div class=\"plots\">");
                figure(&p, &mut o);
                o.push_str("</div>");
            }
        }
        for s in ours {
            scenario(s, &mut o);
        }
    }
    o.push_str("<h2 id=\"other\">Other benches</h2>");
    for s in d.scenarios.iter().filter(|s| s.report.seed.is_none()) {
        scenario(s, &mut o);
    }
    o.push_str("<h2 id=\"runs\">Runs in this database</h2><p class=\"cap\">the most recent runs up to this one</p><div class=\"scroll\"><table><thead><tr><th>run</th><th>started (UTC)</th><th>status</th><th>quick</th><th class=\"n\">scenarios</th><th>git</th><th>host</th></tr></thead><tbody>");
    for r in &d.recent {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            r.id,
            esc(&r.started_at),
            esc(&r.status),
            if r.quick { "yes" } else { "no" },
            r.scenarios,
            esc(&r.git_rev),
            esc(&r.host.line())
        );
    }
    o.push_str("</tbody></table></div><p class=\"meta\">Written by softiommu; self-contained: no script, no fetch.</p></main></body></html>\n");
    o
}
