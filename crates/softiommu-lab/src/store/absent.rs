//! Figures the lab leaves absent on purpose, as stored. A lab marks a
//! figure it could not measure with a value that is not finite (NaN: an
//! aging figure without throughput, a paired figure whose fresh arm ran in
//! too few windows, a ratio without its pass-through row). SQLite cannot
//! hold NaN in `metrics.value` (it binds as NULL, which the column
//! refuses) and JSON has no NaN (it becomes `null`, which a figure or a
//! plot point cannot be read back from). The rule: a figure that is not
//! finite (NaN, ±∞) is absent. It gets no `metrics` row, its cell is
//! stored as an empty one, a spread with such a bound is dropped (the
//! figure stays), and a plot point with such a coordinate is left out of
//! its series. Everything else is stored as it is.

use crate::report::{Cell, Report, Series};

/// `r` as stored: every figure that is not finite made absent.
pub(super) fn without_absent(r: &Report) -> Report {
    let mut r = r.clone();
    r.modelled.retain(|m| m.value.is_finite());
    for t in &mut r.tables {
        for row in &mut t.rows {
            for c in row.iter_mut() {
                *c = finite_cell(c);
            }
        }
    }
    for p in &mut r.plots {
        for s in &mut p.series {
            finite_points(s);
        }
    }
    r
}

/// A cell whose figure is not finite becomes [`Cell::Missing`]; a spread
/// with a bound that is not finite is dropped.
fn finite_cell(c: &Cell) -> Cell {
    match c {
        Cell::Num(v) if !v.is_finite() => Cell::Missing,
        Cell::Spread(f) if !f.value.is_finite() => Cell::Missing,
        Cell::Spread(f)
            if ![f.spread.min, f.spread.median, f.spread.max]
                .iter()
                .all(|x| x.is_finite()) =>
        {
            Cell::Num(f.value)
        }
        c => c.clone(),
    }
}

/// Leaves out the points of `s` with a coordinate that is not finite,
/// with their labels and spreads; a spread with such a bound becomes
/// none.
fn finite_points(s: &mut Series) {
    let keep: Vec<bool> = s
        .points
        .iter()
        .map(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let mut k = keep.iter();
    s.points.retain(|_| *k.next().unwrap_or(&true));
    if s.point_labels.len() == keep.len() {
        let mut k = keep.iter();
        s.point_labels.retain(|_| *k.next().unwrap_or(&true));
    }
    if s.spreads.len() == keep.len() {
        let mut k = keep.iter();
        s.spreads.retain(|_| *k.next().unwrap_or(&true));
    }
    for sp in &mut s.spreads {
        if sp.is_some_and(|(lo, hi)| !lo.is_finite() || !hi.is_finite()) {
            *sp = None;
        }
    }
}
