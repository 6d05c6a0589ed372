//! The report rendered from a fixture database (two runs of hand-made
//! reports shaped like the suite's), checked for its structure.

use std::path::PathBuf;

use serde_json::json;

use super::{render, PageData};
use crate::host::Host;
use crate::report::{
    Axis, Cell, Column, Modelled, Param, Plot, PlotKind, Report, Series, Table, Unit,
};
use crate::store::{RunStatus, Store};

fn netperf(name: &str, hw: Option<u64>, deferred_us: f64, stale_ms: f64) -> Report {
    let mut t = Table::new(
        "results",
        "UDP_STREAM through smoltcp, 32 byte datagrams",
        vec![
            Column::label("policy"),
            Column::label("ordering"),
            Column::metric("driver_us_per_pkt", "service demand", Unit::UsPerPkt, 3)
                .modelled_if(true),
            Column::metric("vs_passthrough", "vs passthrough", Unit::Ratio, 2).modelled_if(true),
            Column::metric("stale_window_ms_max", "stale max", Unit::Ms, 2).modelled_if(true),
        ],
    );
    for (p, us, stale) in [
        ("passthrough", 0.2, None),
        ("strict", 1.9, None),
        ("deferred", deferred_us, Some(stale_ms)),
        ("bounce", 0.5, None),
    ] {
        t.row(vec![
            p.into(),
            "ordered".into(),
            us.into(),
            (us / 0.2).into(),
            stale.into(),
        ]);
    }
    let mut r = Report::new(
        "lab netperf-udp",
        "UDP <stream> & friends",
        json!({"lab": "netperf-udp", "stack": "smoltcp", "msg_size": 32}),
    )
    .seed("000");
    r.scenario = name.into();
    r.params = vec![Param::new("msg_size", 32, Unit::Bytes)];
    if let Some(hw) = hw {
        r.params
            .push(Param::new("flush_high_water", hw, Unit::Entries));
    }
    r.modelled = vec![Modelled {
        name: "wait_completion".into(),
        value: 700.0,
        unit: Unit::Ns,
    }];
    r.tables.push(t);
    r.plots.push(Plot {
        name: "service_demand".into(),
        title: "service demand per policy".into(),
        kind: PlotKind::Bars,
        x: Axis::new("policy", Unit::Count),
        y: Axis::new("service demand", Unit::UsPerPkt),
        categories: vec!["passthrough".into(), "deferred".into()],
        series: vec![Series::new("median", vec![(0.0, 0.2), (1.0, deferred_us)])],
        modelled: true,
    });
    r
}

fn aging(retained: f64) -> Report {
    let mut t = Table::new(
        "summary",
        "aging",
        vec![
            Column::label("policy"),
            Column::metric("retained", "retained", Unit::Ratio, 2),
        ],
    );
    t.row(vec!["linux-2016".into(), Cell::Num(0.4)]);
    t.row(vec!["softiommu".into(), Cell::Num(retained)]);
    let mut r = Report::new("lab iova-aging", "aging", json!({"lab": "iova-aging"})).seed("004");
    r.scenario = "aging".into();
    r.tables.push(t);
    r.plots.push(Plot {
        name: "throughput".into(),
        title: "throughput over time".into(),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("throughput", Unit::MopsPerS),
        categories: Vec::new(),
        series: vec![
            Series::new("linux-2016", vec![(1.0, 5.0), (2.0, 3.0), (3.0, 2.0)]),
            Series::new("softiommu", vec![(1.0, 6.0), (2.0, 6.1), (3.0, 6.0)]),
        ],
        modelled: false,
    });
    r
}

fn other() -> Report {
    let mut t = Table::new(
        "results",
        "pairs",
        vec![
            Column::label("impl"),
            Column::metric("ns_per_pair", "per pair", Unit::Ns, 1),
        ],
    );
    t.row(vec!["softiommu".into(), Cell::Num(20.0)]);
    let mut r = Report::new("bench iova", "alloc", json!({"bench": "iova"}));
    r.scenario = "iova-alloc".into();
    r.tables.push(t);
    r.plots.push(Plot {
        name: "unmap_latency".into(),
        title: "unmap latency".into(),
        kind: PlotKind::Histogram,
        x: Axis::new("unmap latency", Unit::Ns),
        y: Axis::new("calls", Unit::Percent),
        categories: Vec::new(),
        series: vec![Series::new("strict", vec![(512.0, 10.0), (1024.0, 90.0)])],
        modelled: true,
    });
    r
}

fn fixture(name: &str) -> (Store, PathBuf, Vec<i64>) {
    let dir = std::env::temp_dir().join(format!("softiommu-html-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("fixture.db");
    let mut store = Store::create(&path).unwrap();
    let host = Host {
        hostname: "fixture".into(),
        cpu_model: "Test CPU".into(),
        cores: 2,
        kernel: "6.0".into(),
    };
    let mut ids = Vec::new();
    for (k, status) in [(0, RunStatus::Complete), (1, RunStatus::Partial)] {
        let id = store
            .begin_run("softiommu run --quick", true, &host, "abc123")
            .unwrap();
        let reports = [
            netperf("udp-32", None, 0.30 + 0.05 * k as f64, 3.0),
            netperf("flush-hw-16", Some(16), 0.45, 0.2),
            netperf("flush-hw-1024", Some(1024), 0.25, 9.0),
            aging(0.98 - 0.02 * k as f64),
            other(),
        ];
        for (i, r) in reports.iter().enumerate() {
            store.add_scenario(id, i, r, 1.5).unwrap();
        }
        store.finish_run(id, status).unwrap();
        ids.push(id);
    }
    (store, dir, ids)
}

fn count(h: &str, s: &str) -> usize {
    h.matches(s).count()
}

#[test]
fn the_report_of_a_fixture_database_has_its_structure() {
    let (store, dir, ids) = fixture("structure");
    let d = PageData::load(&store, ids[1]).unwrap();
    let h = render(&d);
    assert!(h.starts_with("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"));
    assert!(h.ends_with("</html>\n"));
    // Self-contained: nothing fetched, nothing run.
    for bad in ["http://", "https://", "<script", "<link", "src="] {
        assert!(!h.contains(bad), "{bad}");
    }
    // Balanced elements.
    for (open, close) in [
        ("<table", "</table>"),
        ("<svg", "</svg>"),
        ("<figure", "</figure>"),
        ("<div", "</div>"),
        ("<tr", "</tr>"),
    ] {
        assert_eq!(count(&h, open), count(&h, close), "{open}");
    }
    // A section per seed, each with their table beside ours.
    for seed in ["000", "001", "002", "003", "004"] {
        assert!(h.contains(&format!("<h2 id=\"seed-{seed}\">")), "{seed}");
    }
    assert_eq!(count(&h, "<h4>Theirs</h4>"), 5);
    assert!(
        h.contains("array batched (deferred)"),
        "seed 000's own table"
    );
    // Units in headers, modelled figures marked.
    assert!(h.contains("<th class=\"n\">service demand (µs/pkt)†</th>"));
    assert!(h.contains("wait_completion = 700 ns"));
    // The plots: bars, a time line, a histogram, the trade-off, sparklines.
    assert!(h.contains("aria-label=\"service demand per policy\""));
    assert!(h.contains("aria-label=\"throughput over time\""));
    assert!(h.contains("aria-label=\"unmap latency\""));
    assert!(h.contains("aria-label=\"deferred policy: the stale window bought"));
    assert!(
        h.contains(">hw 16</text>")
            && h.contains(">hw 1024</text>")
            && h.contains(">hw 256</text>")
    );
    assert!(
        h.contains("class=\"spark\" role=\"img\" aria-label=\"2 runs, from 1.50 to 1.75\""),
        "udp-32 deferred/passthrough across runs"
    );
    // Escaped text, the partial run said, both runs listed.
    assert!(h.contains("UDP &lt;stream&gt; &amp; friends"));
    assert!(h.contains("This run is <b>partial</b>"));
    assert_eq!(count(&h, "<td>abc123</td>"), 2);
    // Seeds without a scenario say so.
    assert!(h.contains("scenario page-faults did not run"));
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_report_is_written_to_a_file() {
    let (store, dir, ids) = fixture("file");
    let out = dir.join("out/report.html");
    super::write(&store, ids[0], &out, "--out").unwrap();
    let h = std::fs::read_to_string(&out).unwrap();
    assert!(h.contains("softiommu lab report — run 1"));
    assert!(!h.contains("This run is"), "run 1 is complete");
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Seed 000's scenario as netperf-udp makes it now: figures with their
/// spread over rounds, and deferred's row marked invalid.
fn netperf_invalid() -> Report {
    use crate::report::Spread;
    let mut t = Table::new(
        "results",
        "UDP_STREAM through smoltcp, 32 byte datagrams",
        vec![
            Column::label("policy"),
            Column::label("ordering"),
            Column::metric(
                "service_demand_us_per_pkt",
                "service demand",
                Unit::UsPerPkt,
                3,
            ),
            Column::metric("vs_passthrough", "vs passthrough", Unit::Ratio, 2),
            Column::text("valid"),
        ],
    );
    let pt = Spread::of(&[2.4, 2.5, 2.6]);
    let def = Spread::of(&[2.0, 2.1, 2.2]);
    t.row(vec![
        "passthrough".into(),
        "ordered".into(),
        Cell::median(pt),
        Cell::median(pt.ratio(&pt).unwrap()),
        "yes".into(),
    ]);
    t.row(vec![
        "deferred".into(),
        "ordered".into(),
        Cell::median(def),
        Cell::median(def.ratio(&pt).unwrap()),
        "NO".into(),
    ]);
    t.mark_invalid(
        "deferred/ordered",
        "measurement invalid: deferred's service demand (at most 2.200 over the rounds) is below passthrough's (at least 2.400)",
    );
    let mut r = Report::new("lab netperf-udp", "udp", json!({"lab": "netperf-udp"})).seed("000");
    r.scenario = "udp-32".into();
    r.tables.push(t);
    r.plots.push(Plot {
        name: "service_demand".into(),
        title: "service demand per policy with spreads".into(),
        kind: PlotKind::Bars,
        x: Axis::new("policy", Unit::Count),
        y: Axis::new("service demand", Unit::UsPerPkt),
        categories: vec!["passthrough".into(), "deferred".into()],
        series: vec![Series::with_spreads("ordered", vec![(0.0, pt), (1.0, def)])],
        modelled: false,
    });
    r
}

#[test]
fn an_invalid_row_is_set_apart_and_spreads_are_drawn() {
    let dir = std::env::temp_dir().join(format!("softiommu-html-{}-invalid", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut store = Store::create(&dir.join("r.db")).unwrap();
    let host = Host {
        hostname: "fixture".into(),
        cpu_model: "Test CPU".into(),
        cores: 2,
        kernel: "6.0".into(),
    };
    let id = store
        .begin_run("softiommu run", true, &host, "abc")
        .unwrap();
    store.add_scenario(id, 0, &netperf_invalid(), 1.0).unwrap();
    store.finish_run(id, RunStatus::Complete).unwrap();
    let h = render(&PageData::load(&store, id).unwrap());
    // The invalid row: tinted, badged, explained; the valid one is not.
    assert_eq!(
        count(&h, "<tr class=\"invalid\">"),
        2,
        "ours (headline) and the scenario's table"
    );
    assert!(h.contains(
        "<tr class=\"invalid\"><td><span class=\"badge\">measurement invalid</span> deferred</td>"
    ));
    assert!(h.contains("<p class=\"invalid\"><b>Measurement invalid: deferred/ordered</b> — measurement invalid: deferred&#39;s service demand"));
    assert!(!h.contains("<span class=\"badge\">measurement invalid</span> passthrough"));
    // The seed summary draws no verdict from it.
    assert!(
        h.contains("no verdict: deferred: measurement invalid: deferred&#39;s service demand"),
        "seed 000's verdict"
    );
    // Figures carry their spread in the tables and the summary, and the
    // bars their whiskers.
    assert!(h.contains("<td class=\"n\">2.100 [2.000–2.200]</td>"));
    assert!(
        h.contains("0.84 × [0.77–0.92]"),
        "ours in the summary with its spread"
    );
    assert_eq!(count(&h, "<g class=\"whisker\">"), 2);
    assert!(h.contains("<title>ordered: rounds 2.00 to 2.20</title>"));
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}
