//! Plots as inline SVG: time lines, grouped bars, histograms, labelled
//! scatter, and sparklines. Each scales to its container (a `viewBox`),
//! so one drawing serves a desktop and a phone.

use std::fmt::Write;

use super::escape::esc;
use crate::report::{Plot, PlotKind, Series, Unit, MODELLED_MARK};

/// Series colours (distinguishable in colour-blind palettes).
pub const COLOURS: [&str; 6] = [
    "#0b6fa4", "#d1495b", "#2e933c", "#edae49", "#6a4c93", "#555555",
];

const W: f64 = 600.0;
const H: f64 = 300.0;
const L: f64 = 72.0;
const R: f64 = 16.0;
const T: f64 = 14.0;
const B: f64 = 52.0;

/// A number for an axis or a label: three significant digits.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Round tick positions covering `0..=max`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut v = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while v <= hi + step * 1e-9 && out.len() < 12 {
        out.push(v);
        v += step;
    }
    out
}

fn axis_label(label: &str, unit: Unit) -> String {
    if unit == Unit::Count {
        esc(label)
    } else {
        format!("{} ({})", esc(label), esc(unit.symbol()))
    }
}

struct Frame {
    x0: f64,
    x1: f64,
    y1: f64,
}

impl Frame {
    fn x(&self, v: f64) -> f64 {
        L + (v - self.x0) / (self.x1 - self.x0).max(f64::MIN_POSITIVE) * (W - L - R)
    }
    fn y(&self, v: f64) -> f64 {
        H - B - v / self.y1.max(f64::MIN_POSITIVE) * (H - T - B)
    }
}

fn open(p: &Plot, out: &mut String) {
    let _ = write!(
        out,
        "<svg viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{}\" class=\"plot\">",
        esc(&p.title)
    );
}

fn y_axis(p: &Plot, f: &Frame, out: &mut String) {
    for t in ticks(0.0, f.y1) {
        let y = f.y(t);
        let _ = write!(
            out,
            "<line x1=\"{L}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" class=\"grid\"/><text x=\"{}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"end\">{}</text>",
            W - R,
            L - 6.0,
            y + 4.0,
            num(t)
        );
    }
    let mark = if p.modelled { MODELLED_MARK } else { "" };
    let _ = write!(
        out,
        "<text transform=\"translate(16,{:.1}) rotate(-90)\" class=\"axis\" text-anchor=\"middle\">{}{mark}</text>",
        (H - B + T) / 2.0,
        axis_label(&p.y.label, p.y.unit)
    );
}

fn x_title(p: &Plot, out: &mut String) {
    let _ = write!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" class=\"axis\" text-anchor=\"middle\">{}</text>",
        (L + W - R) / 2.0,
        H - 6.0,
        axis_label(&p.x.label, p.x.unit)
    );
}

/// The smallest round tick at or above `m` (1 when there is no data).
fn nice_ceiling(m: f64) -> f64 {
    if !(m > 0.0 && m.is_finite()) {
        return 1.0;
    }
    let t = ticks(0.0, m * 2.0);
    t.iter().copied().find(|&v| v >= m).unwrap_or(m)
}

fn y_max(p: &Plot) -> f64 {
    let m = p
        .series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(|q| q.1)
                .chain(s.spreads.iter().flatten().map(|w| w.1))
        })
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    nice_ceiling(m * 1.08)
}

/// A whisker at `x` from `lo` to `hi` (a figure's spread over rounds),
/// capped at both ends.
fn whisker(f: &Frame, x: f64, (lo, hi): (f64, f64), label: &str, out: &mut String) {
    let (y0, y1) = (f.y(lo), f.y(hi));
    let _ = write!(
        out,
        "<g class=\"whisker\"><title>{}: rounds {} to {}</title><line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{y0:.1}\" y2=\"{y1:.1}\"/><line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y0:.1}\" y2=\"{y0:.1}\"/><line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y1:.1}\" y2=\"{y1:.1}\"/></g>",
        esc(label),
        num(lo),
        num(hi),
        x - 4.0,
        x + 4.0,
        x - 4.0,
        x + 4.0
    );
}

fn lines(p: &Plot, out: &mut String) {
    let xs = p.series.iter().flat_map(|s| s.points.iter().map(|q| q.0));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0 < x1 {
        (x0.min(0.0), x1)
    } else {
        (0.0, x0.max(1.0))
    };
    let f = Frame {
        x0,
        x1,
        y1: y_max(p),
    };
    y_axis(p, &f, out);
    for t in ticks(x0, x1) {
        let x = f.x(t);
        let _ = write!(
            out,
            "<text x=\"{x:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
            H - B + 20.0,
            num(t)
        );
    }
    x_title(p, out);
    for (i, s) in p.series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", f.x(x), f.y(y)))
            .collect();
        let _ = write!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2.2\"><title>{}</title></polyline>",
            pts.join(" "),
            esc(&s.label)
        );
        for (j, &(x, y)) in s.points.iter().enumerate() {
            let _ = write!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.6\" fill=\"{c}\"><title>{}: {}</title></circle>",
                f.x(x),
                f.y(y),
                esc(&s.label),
                num(y)
            );
            if let Some(w) = s.spreads.get(j).copied().flatten() {
                whisker(&f, f.x(x), w, &s.label, out);
            }
        }
    }
}

/// A bar's value and, when measured in rounds, its spread.
type Bar = Option<(f64, Option<(f64, f64)>)>;

fn bars(p: &Plot, categories: &[String], values: &[Vec<Bar>], out: &mut String) {
    let f = Frame {
        x0: 0.0,
        x1: 1.0,
        y1: y_max(p),
    };
    y_axis(p, &f, out);
    x_title(p, out);
    let n = categories.len().max(1) as f64;
    let group = (W - L - R) / n;
    let k = values.len().max(1) as f64;
    let bar = (group * 0.8 / k).min(60.0);
    for (ci, cat) in categories.iter().enumerate() {
        let gx = L + group * ci as f64 + (group - bar * k) / 2.0;
        for (si, vals) in values.iter().enumerate() {
            let Some((v, spread)) = vals.get(ci).copied().flatten() else {
                continue;
            };
            let x = gx + bar * si as f64;
            let y = f.y(v);
            let c = COLOURS[si % COLOURS.len()];
            let _ = write!(
                out,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{c}\"><title>{} {}: {}</title></rect>",
                bar - 1.0,
                (H - B - y).max(0.0),
                esc(&p.series[si].label),
                esc(cat),
                num(v)
            );
            let top = match spread {
                Some(w) => {
                    whisker(&f, x + bar / 2.0, w, &p.series[si].label, out);
                    f.y(w.1).min(y)
                }
                None => y,
            };
            if k <= 2.0 || bar >= 22.0 {
                let _ = write!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\" class=\"val\" text-anchor=\"middle\">{}</text>",
                    x + bar / 2.0,
                    top - 3.0,
                    num(v)
                );
            }
        }
        // At most eight labels fit under the axis.
        if ci % categories.len().div_ceil(8).max(1) == 0 {
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
                L + group * (ci as f64 + 0.5),
                H - B + 20.0,
                esc(cat)
            );
        }
    }
}

/// A duration in ns as a short label.
fn ns_label(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{} ms", num(ns / 1e6))
    } else if ns >= 1e3 {
        format!("{} µs", num(ns / 1e3))
    } else {
        format!("{} ns", num(ns))
    }
}

fn histogram(p: &Plot, out: &mut String) {
    let mut edges: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| q.0))
        .collect();
    edges.sort_by(f64::total_cmp);
    edges.dedup();
    let cats: Vec<String> = edges
        .iter()
        .map(|&e| {
            if p.x.unit == Unit::Ns {
                ns_label(e)
            } else {
                num(e)
            }
        })
        .collect();
    let values: Vec<Vec<Bar>> = p
        .series
        .iter()
        .map(|s| {
            let idx = BarIndex::new(s);
            edges.iter().map(|e| idx.bar_at(*e)).collect()
        })
        .collect();
    bars(p, &cats, &values, out);
}

fn scatter(p: &Plot, out: &mut String) {
    let xs = p.series.iter().flat_map(|s| s.points.iter().map(|q| q.0));
    let x1 = nice_ceiling(xs.fold(0.0f64, f64::max) * 1.08);
    let f = Frame {
        x0: 0.0,
        x1: x1.max(1e-9),
        y1: y_max(p),
    };
    y_axis(p, &f, out);
    for t in ticks(0.0, f.x1) {
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
            f.x(t),
            H - B + 20.0,
            num(t)
        );
    }
    x_title(p, out);
    for (i, s) in p.series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", f.x(x), f.y(y)))
            .collect();
        let _ = write!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"1.2\" stroke-dasharray=\"4 3\"/>",
            pts.join(" ")
        );
        for (j, &(x, y)) in s.points.iter().enumerate() {
            let label = s.point_labels.get(j).map_or("", String::as_str);
            let _ = write!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{c}\"><title>{}: {} , {}</title></circle><text x=\"{:.1}\" y=\"{:.1}\" class=\"val\">{}</text>",
                f.x(x),
                f.y(y),
                esc(label),
                num(x),
                num(y),
                f.x(x) + 6.0,
                f.y(y) - 6.0,
                esc(label)
            );
        }
    }
}

/// A series' points by x (the first point at each x; NaN never matches,
/// and -0 is 0, as `==` compares them): one pass, so that a plot's bars
/// cost the points plus the categories, not their product (a stored
/// report of 500,000 bars took minutes by a search per bar).
struct BarIndex<'a> {
    s: &'a Series,
    at: std::collections::HashMap<u64, usize>,
}

impl<'a> BarIndex<'a> {
    fn new(s: &'a Series) -> Self {
        let mut at = std::collections::HashMap::with_capacity(s.points.len());
        for (j, q) in s.points.iter().enumerate() {
            if !q.0.is_nan() {
                at.entry((q.0 + 0.0).to_bits()).or_insert(j);
            }
        }
        Self { s, at }
    }

    /// The series' bar at `x`: its value and spread.
    fn bar_at(&self, x: f64) -> Bar {
        let &j = self.at.get(&(x + 0.0).to_bits())?;
        Some((self.s.points[j].1, self.s.spreads.get(j).copied().flatten()))
    }
}

/// A plot as an SVG element; a point measured in rounds carries a
/// whisker from its lowest to its highest round.
pub fn plot(p: &Plot) -> String {
    let mut out = String::new();
    open(p, &mut out);
    let _ = write!(
        out,
        "<line x1=\"{L}\" x2=\"{L}\" y1=\"{T}\" y2=\"{}\" class=\"frame\"/><line x1=\"{L}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" class=\"frame\"/>",
        H - B,
        W - R,
        H - B,
        H - B
    );
    match p.kind {
        PlotKind::Lines => lines(p, &mut out),
        PlotKind::Bars => {
            let values: Vec<Vec<Bar>> = p
                .series
                .iter()
                .map(|s| {
                    let idx = BarIndex::new(s);
                    (0..p.categories.len())
                        .map(|i| idx.bar_at(i as f64))
                        .collect()
                })
                .collect();
            bars(p, &p.categories, &values, &mut out)
        }
        PlotKind::Histogram => histogram(p, &mut out),
        PlotKind::Scatter => scatter(p, &mut out),
    }
    out.push_str("</svg>");
    out
}

/// A sparkline of `values` (oldest first), the last point marked.
pub fn sparkline(values: &[f64]) -> String {
    let (w, h) = (120.0, 28.0);
    if values.is_empty() {
        return String::new();
    }
    let lo = values.iter().copied().fold(f64::MAX, f64::min);
    let hi = values.iter().copied().fold(f64::MIN, f64::max);
    let span = if hi > lo { hi - lo } else { 1.0 };
    let n = values.len();
    let pt = |i: usize, v: f64| {
        let x = if n > 1 {
            3.0 + (w - 6.0) * i as f64 / (n - 1) as f64
        } else {
            w / 2.0
        };
        let y = h - 3.0 - (h - 6.0) * (v - lo) / span;
        (x, if hi > lo { y } else { h / 2.0 })
    };
    let pts: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let (x, y) = pt(i, v);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let (lx, ly) = pt(n - 1, values[n - 1]);
    format!(
        "<svg viewBox=\"0 0 {w} {h}\" class=\"spark\" role=\"img\" aria-label=\"{n} runs, from {} to {}\"><polyline points=\"{}\" fill=\"none\" stroke=\"#0b6fa4\" stroke-width=\"1.5\"/><circle cx=\"{lx:.1}\" cy=\"{ly:.1}\" r=\"2.5\" fill=\"#d1495b\"/></svg>",
        num(values[0]),
        num(values[n - 1]),
        pts.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(0.0, 0.37);
        assert_eq!(t.first(), Some(&0.0));
        assert!(*t.last().unwrap() <= 0.37 + 1e-9 && t.len() >= 3);
    }

    #[test]
    fn a_sparkline_of_one_run_is_a_point() {
        assert!(sparkline(&[1.0]).contains("<circle"));
        assert_eq!(sparkline(&[]), "");
    }
}
