//! Terminal tables with `comfy-table`: aligned, units in the headers,
//! modelled figures marked, and every table headed by its scenario, host
//! and parameters.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, ContentArrangement, Table as Comfy};

use crate::host::Host;
use crate::report::{Cell, Report, Table, Unit};

/// A figure as shown: `decimals` places, thousands unseparated, `-` for
/// none.
pub fn format_value(v: f64, unit: Option<Unit>, decimals: u8) -> String {
    match unit {
        Some(Unit::Count) if v.fract() == 0.0 => format!("{v:.0}"),
        _ => format!("{v:.prec$}", prec = decimals as usize),
    }
}

/// A cell as shown: a figure with its spread over rounds reads
/// `median [min–max]`; a figure measured once, a plain number.
pub fn format_cell(cell: &Cell, unit: Option<Unit>, decimals: u8) -> String {
    match cell {
        Cell::Num(v) => format_value(*v, unit, decimals),
        Cell::Spread(f) => format!(
            "{} [{}–{}]",
            format_value(f.value, unit, decimals),
            format_value(f.spread.min, unit, decimals),
            format_value(f.spread.max, unit, decimals)
        ),
        Cell::Text(s) => s.clone(),
        Cell::Missing => "-".to_string(),
    }
}

/// The line printed under a table for each row marked invalid.
pub fn invalid_line(row: &str, why: &str) -> String {
    format!("MEASUREMENT INVALID {row}: {why}")
}

/// One table; a figure with a spread shows it, and each row marked
/// invalid is flagged in its first cell and explained under the table.
pub fn render_table(t: &Table) -> String {
    let mut c = Comfy::new();
    c.load_style(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(t.columns.iter().map(|c| c.header()));
    for (i, row) in t.rows.iter().enumerate() {
        let bad = t.invalid_why(&t.row_key(i)).is_some();
        c.add_row(
            row.iter()
                .zip(&t.columns)
                .enumerate()
                .map(|(j, (cell, col))| {
                    // A cell's text may come from a file or a stored
                    // run (a host name, a row label): escaped, as the
                    // title and the lines under the table are.
                    let mut text = printable(&format_cell(cell, col.unit, col.decimals));
                    if bad && j == 0 {
                        text = format!("INVALID {text}");
                    }
                    let cell = comfy_table::Cell::new(text);
                    if col.unit.is_some() {
                        cell.set_alignment(CellAlignment::Right)
                    } else {
                        cell
                    }
                }),
        );
    }
    let mut out = format!("{}\n{c}\n", printable(&t.title));
    for x in &t.invalid {
        out.push_str(&printable(&invalid_line(&x.row, &x.why)));
        out.push('\n');
    }
    out
}

/// `text` with every control character escaped (`\u{1b}`, `\n`): text a
/// scenario file supplies reaches no terminal as an escape sequence.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A whole report: a heading naming scenario, host and parameters, the
/// tables, what is modelled, and the notes; a report that did not run
/// here (its contract says `skipped`) is its one line saying why.
pub fn render_report(r: &Report, host: &Host) -> String {
    if let Some(why) = r.contract.get("skipped").and_then(|v| v.as_str()) {
        return format!("{} skipped: {why}\n", r.kind);
    }
    // A scenario file's name, seed and about reach the terminal: their
    // control characters (escape sequences) are shown escaped.
    let mut s = format!("== {} [{}]", printable(&r.scenario), r.kind);
    if let Some(seed) = &r.seed {
        s.push_str(&format!(" (seed {})", printable(seed)));
    }
    s.push_str(&format!(
        "\n{}\nhost: {}{}\n",
        printable(&r.title),
        host.line(),
        crate::session::describe().map_or(String::new(), |w| format!("; measured in {w}"))
    ));
    if !r.params.is_empty() {
        let p: Vec<String> = r
            .params
            .iter()
            .map(|p| match p.unit {
                Some(u) if u != Unit::Count => format!("{}={} {}", p.name, p.value, u.symbol()),
                _ => format!("{}={}", p.name, p.value),
            })
            .collect();
        s.push_str(&format!("parameters: {}\n", p.join(", ")));
    }
    s.push_str(&format!("{}\n", r.modelled_text()));
    for t in &r.tables {
        s.push_str(&render_table(t));
    }
    for n in &r.notes {
        s.push_str(&format!("{n}\n"));
    }
    s
}

#[cfg(test)]
mod escape_tests {
    use super::*;

    /// A scenario's `name` and `about` reached the terminal raw: an
    /// `about` of `ESC ] 0 ; PWNED BEL ESC [ 2 J` retitled the terminal
    /// and cleared it. They are shown escaped.
    #[test]
    fn a_scenarios_name_and_about_reach_no_terminal_as_escapes() {
        let mut r = Report::new("lab litmus", "t", serde_json::json!({}));
        r.scenario = "x\u{1b}[31m".into();
        r.title = "\u{1b}]0;PWNED\u{7}\u{1b}[2J".into();
        r.seed = Some("0\n1".into());
        let out = render_report(&r, &Host::detect());
        assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
        assert!(out.contains("\\u{1b}]0;PWNED\\u{7}\\u{1b}[2J"), "{out:?}");
        assert!(out.contains("(seed 0\\n1)"), "{out:?}");
    }

    /// A stored run's host name or row label (`history`, `compare`)
    /// reached the terminal raw from the database: cells, titles and the
    /// lines under a table are shown escaped.
    #[test]
    fn a_tables_cells_and_title_reach_no_terminal_as_escapes() {
        use crate::report::Column;
        let mut t = Table::new(
            "runs",
            "title \u{1b}[2J",
            vec![Column::label("host"), Column::label("rev")],
        );
        t.row(vec![
            "\u{1b}[2J\nx".to_string().into(),
            "a\u{0}b".to_string().into(),
        ]);
        let out = render_table(&t);
        assert!(!out.contains('\u{1b}') && !out.contains('\u{0}'), "{out:?}");
        assert!(
            out.contains("\\u{1b}[2J\\nx") && out.contains("a\\0b"),
            "{out:?}"
        );
    }
}
