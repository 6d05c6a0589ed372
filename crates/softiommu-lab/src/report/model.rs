//! The typed result every bench and lab returns.

use serde::{Deserialize, Serialize};

use super::{Spread, Unit};

/// One experiment's result: what ran, with which parameters, and what it
/// measured, as data. The terminal table, the JSON printer, the database
/// and the HTML report all read this; none of them formats figures of its
/// own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The scenario's name (a built-in scenario or a file's `name`; the
    /// command for a bench run from the command line).
    pub scenario: String,
    /// The bench or lab that ran, e.g. `lab netperf-udp`.
    pub kind: String,
    /// The seed whose experiment this reproduces (`"000"`..), if any.
    pub seed: Option<String>,
    /// One line saying what ran.
    pub title: String,
    /// Every parameter in force.
    pub params: Vec<Param>,
    /// The latency model's figures in force (empty: nothing modelled).
    pub modelled: Vec<Modelled>,
    /// The tables, seed-shaped.
    pub tables: Vec<Table>,
    /// Plots (time lines, histograms, bars, trade-offs).
    pub plots: Vec<Plot>,
    /// Remarks printed under the tables (verdicts, caveats).
    pub notes: Vec<String>,
    /// The object `--json` prints: the field names the issues fixed.
    pub contract: serde_json::Value,
}

/// A parameter: a name, its value, and its unit when it is a quantity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Param {
    /// Name, as in the scenario file.
    pub name: String,
    /// Value, as text.
    pub value: String,
    /// Unit, if it has one.
    pub unit: Option<Unit>,
}

impl Param {
    /// A parameter with a unit.
    pub fn new(name: &str, value: impl ToString, unit: Unit) -> Self {
        Self {
            name: name.to_string(),
            value: value.to_string(),
            unit: Some(unit),
        }
    }

    /// A parameter without a unit (a name, a flag).
    pub fn text(name: &str, value: impl ToString) -> Self {
        Self {
            name: name.to_string(),
            value: value.to_string(),
            unit: None,
        }
    }
}

/// A figure of the latency model in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Modelled {
    /// The model's name for it (`wait_completion`, ...).
    pub name: String,
    /// Its value.
    pub value: f64,
    /// Its unit.
    pub unit: Unit,
}

/// Where a column's figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provenance {
    /// Measured by the code, nothing modelled.
    Measured,
    /// Measured, but includes time charged by the latency model: marked
    /// with [`MODELLED_MARK`] everywhere it is shown.
    IncludesModelled,
    /// A figure a seed printed (their hardware, their kernel).
    Theirs,
}

/// The mark every renderer puts on figures that include modelled time.
pub const MODELLED_MARK: &str = "†";

/// A column: a label column (text) or a metric column (a unit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Column {
    /// Metric name (stored in the database), `snake_case`.
    pub key: String,
    /// Header text, without the unit.
    pub label: String,
    /// `None` for a label column.
    pub unit: Option<Unit>,
    /// Decimals shown.
    pub decimals: u8,
    /// Where the figures come from.
    pub provenance: Provenance,
    /// Whether this label column is part of the row's key (a verdict or
    /// a remark is not).
    #[serde(default = "yes")]
    pub in_key: bool,
}

fn yes() -> bool {
    true
}

impl Column {
    /// A label column (text cells that name the row).
    pub fn label(key: &str) -> Self {
        Self {
            key: key.to_string(),
            label: key.replace('_', " "),
            unit: None,
            decimals: 0,
            provenance: Provenance::Measured,
            in_key: true,
        }
    }

    /// A text column that is not part of the row's key (a verdict).
    pub fn text(key: &str) -> Self {
        Self {
            in_key: false,
            ..Self::label(key)
        }
    }

    /// A metric column.
    pub fn metric(key: &str, label: &str, unit: Unit, decimals: u8) -> Self {
        Self {
            key: key.to_string(),
            label: label.to_string(),
            unit: Some(unit),
            decimals,
            provenance: Provenance::Measured,
            in_key: false,
        }
    }

    /// Marks the column's figures as including modelled time, when `yes`.
    pub fn modelled_if(mut self, yes: bool) -> Self {
        if yes {
            self.provenance = Provenance::IncludesModelled;
        }
        self
    }

    /// Marks the column as the seed's own figures.
    pub fn theirs(mut self) -> Self {
        self.provenance = Provenance::Theirs;
        self
    }

    /// The header: label, unit in brackets, and the modelled mark.
    pub fn header(&self) -> String {
        let mark = if self.provenance == Provenance::IncludesModelled {
            MODELLED_MARK
        } else {
            ""
        };
        match self.unit {
            None | Some(Unit::Count) => format!("{}{mark}", self.label),
            Some(u) => format!("{} ({}){mark}", self.label, u.symbol()),
        }
    }
}

/// A cell: text in label columns, a number (or nothing) in metric columns.
///
/// A figure measured in rounds is a [`Cell::Spread`]: its value (the
/// median round, or a figure taken from it) with the spread of the rounds.
/// Every renderer, the database and `compare` read the spread from there;
/// a figure measured once is a plain [`Cell::Num`] (no spread is invented
/// for it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Cell {
    /// A figure.
    Num(f64),
    /// A name or a verdict.
    Text(String),
    /// No figure (not applicable to this row).
    Missing,
    /// A figure with its spread over rounds.
    Spread(Figure),
}

/// A figure with its spread over rounds (JSON: `{"value", "spread":
/// {"min", "median", "max"}}`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// The value shown (the median round, or a figure of it).
    pub value: f64,
    /// The rounds' spread.
    pub spread: Spread,
}

impl Cell {
    /// A figure with its spread when it has one (`None`: measured once).
    pub fn figure(value: f64, spread: Option<Spread>) -> Cell {
        match spread {
            Some(spread) => Cell::Spread(Figure { value, spread }),
            None => Cell::Num(value),
        }
    }

    /// A figure of rounds whose value is the spread's median.
    pub fn median(spread: Spread) -> Cell {
        Cell::figure(spread.median, Some(spread))
    }

    /// The figure, with or without a spread.
    pub fn value(&self) -> Option<f64> {
        match self {
            Cell::Num(v) => Some(*v),
            Cell::Spread(f) => Some(f.value),
            Cell::Text(_) | Cell::Missing => None,
        }
    }

    /// The spread, for a figure that has one.
    pub fn spread(&self) -> Option<Spread> {
        match self {
            Cell::Spread(f) => Some(f.spread),
            _ => None,
        }
    }
}

impl From<Option<Spread>> for Cell {
    /// The median of the rounds with their spread, or no figure.
    fn from(v: Option<Spread>) -> Self {
        v.map_or(Cell::Missing, Cell::median)
    }
}

impl From<f64> for Cell {
    fn from(v: f64) -> Self {
        Cell::Num(v)
    }
}

impl From<u64> for Cell {
    fn from(v: u64) -> Self {
        Cell::Num(v as f64)
    }
}

impl From<Option<f64>> for Cell {
    fn from(v: Option<f64>) -> Self {
        v.map_or(Cell::Missing, Cell::Num)
    }
}

impl From<&str> for Cell {
    fn from(v: &str) -> Self {
        Cell::Text(v.to_string())
    }
}

impl From<String> for Cell {
    fn from(v: String) -> Self {
        Cell::Text(v)
    }
}

/// A table with typed columns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// Name (stored with each metric), `snake_case`.
    pub name: String,
    /// Caption.
    pub title: String,
    /// Columns, label columns first.
    pub columns: Vec<Column>,
    /// Rows, one cell per column.
    pub rows: Vec<Vec<Cell>>,
    /// A detail table (a time line): shown, stored, but left out of
    /// `compare` and the report's summaries.
    #[serde(default)]
    pub detail: bool,
    /// The rows whose figures are a measurement error (a physics check
    /// failed, or the row was not taken as the comparison needs): shown
    /// as "measurement invalid" with why everywhere, and given no verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid: Vec<InvalidRow>,
}

/// A row marked "measurement invalid", and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InvalidRow {
    /// The row's key ([`Table::row_key`]).
    pub row: String,
    /// Why its figures cannot stand.
    pub why: String,
}

/// One figure of a table, as the database stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric<'a> {
    /// The table.
    pub table: &'a str,
    /// The row's label cells joined with `/`.
    pub row: String,
    /// The column's key.
    pub name: &'a str,
    /// The unit.
    pub unit: Unit,
    /// The value.
    pub value: f64,
    /// Its spread over rounds, when it was measured in rounds.
    pub spread: Option<Spread>,
    /// Whether it includes modelled time.
    pub modelled: bool,
}

impl Table {
    /// An empty table.
    pub fn new(name: &str, title: impl Into<String>, columns: Vec<Column>) -> Self {
        Self {
            name: name.to_string(),
            title: title.into(),
            columns,
            rows: Vec::new(),
            detail: false,
            invalid: Vec::new(),
        }
    }

    /// Appends a row (one cell per column).
    pub fn row(&mut self, cells: Vec<Cell>) {
        debug_assert_eq!(cells.len(), self.columns.len(), "{}", self.name);
        self.rows.push(cells);
    }

    /// The label of row `i`: its text cells joined with `/`.
    pub fn row_key(&self, i: usize) -> String {
        self.rows
            .get(i)
            .map(|r| {
                r.iter()
                    .zip(&self.columns)
                    .filter(|(_, c)| c.unit.is_none() && c.in_key)
                    .map(|(cell, _)| match cell {
                        Cell::Text(t) => t.clone(),
                        Cell::Num(v) => format!("{v}"),
                        Cell::Spread(f) => format!("{}", f.value),
                        Cell::Missing => "-".to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_default()
    }

    /// Every figure of the table.
    pub fn metrics(&self) -> Vec<Metric<'_>> {
        let mut out = Vec::new();
        for (i, r) in self.rows.iter().enumerate() {
            let key = self.row_key(i);
            for (cell, col) in r.iter().zip(&self.columns) {
                if let (Some(v), Some(unit)) = (cell.value(), col.unit) {
                    out.push(Metric {
                        table: &self.name,
                        row: key.clone(),
                        name: &col.key,
                        unit,
                        value: v,
                        spread: cell.spread(),
                        modelled: col.provenance == Provenance::IncludesModelled,
                    });
                }
            }
        }
        out
    }

    /// The cell in the row labelled `row` and the column `key`.
    pub fn cell(&self, row: &str, key: &str) -> Option<&Cell> {
        let c = self.columns.iter().position(|c| c.key == key)?;
        let i = (0..self.rows.len()).find(|&i| self.row_key(i) == row)?;
        self.rows[i].get(c)
    }

    /// The figure in the row labelled `row` and the column `key`.
    pub fn get(&self, row: &str, key: &str) -> Option<f64> {
        self.cell(row, key).and_then(Cell::value)
    }

    /// The spread of that figure, when it was measured in rounds.
    pub fn spread(&self, row: &str, key: &str) -> Option<Spread> {
        self.cell(row, key).and_then(Cell::spread)
    }

    /// Marks the row labelled `row` "measurement invalid", with why.
    pub fn mark_invalid(&mut self, row: impl Into<String>, why: impl Into<String>) {
        self.invalid.push(InvalidRow {
            row: row.into(),
            why: why.into(),
        });
    }

    /// Why the row labelled `row` is invalid, if it is: marked so, or (a
    /// report stored before rows were marked) its `valid` column says NO.
    pub fn invalid_why(&self, row: &str) -> Option<String> {
        if let Some(x) = self.invalid.iter().find(|x| x.row == row) {
            return Some(x.why.clone());
        }
        match self.cell(row, "valid") {
            Some(Cell::Text(t)) if t == "NO" => Some("measurement invalid".to_string()),
            _ => None,
        }
    }
}

/// The kind of plot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlotKind {
    /// Lines through points in x order (time lines).
    Lines,
    /// Grouped bars: x is a category index into `categories`.
    Bars,
    /// A histogram: x is the lower edge of a log2 bucket, y the share.
    Histogram,
    /// Labelled points (a trade-off).
    Scatter,
}

/// An axis: what it shows and in which unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Axis {
    /// Label.
    pub label: String,
    /// Unit.
    pub unit: Unit,
}

impl Axis {
    /// An axis.
    pub fn new(label: &str, unit: Unit) -> Self {
        Self {
            label: label.to_string(),
            unit,
        }
    }
}

/// One line, bar group or point set of a plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points (x, y); for scatter plots each point may be labelled.
    pub points: Vec<(f64, f64)>,
    /// Per-point labels (scatter), or empty.
    #[serde(default)]
    pub point_labels: Vec<String>,
    /// Per-point spread over rounds (lowest, highest), drawn as whiskers;
    /// empty, or `None` for a point measured once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spreads: Vec<Option<(f64, f64)>>,
}

impl Series {
    /// A series of points.
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            label: label.into(),
            points,
            point_labels: Vec::new(),
            spreads: Vec::new(),
        }
    }

    /// A series of points with their spreads over rounds (x, spread): each
    /// point is the median, its whisker the lowest to the highest round.
    pub fn with_spreads(label: impl Into<String>, points: Vec<(f64, Spread)>) -> Self {
        Self {
            label: label.into(),
            spreads: points.iter().map(|(_, s)| Some((s.min, s.max))).collect(),
            points: points.iter().map(|(x, s)| (*x, s.median)).collect(),
            point_labels: Vec::new(),
        }
    }
}

/// A plot, drawn as inline SVG in the HTML report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plot {
    /// Name, `snake_case`.
    pub name: String,
    /// Caption.
    pub title: String,
    /// Kind.
    pub kind: PlotKind,
    /// X axis.
    pub x: Axis,
    /// Y axis.
    pub y: Axis,
    /// Category names for bars.
    #[serde(default)]
    pub categories: Vec<String>,
    /// The data.
    pub series: Vec<Series>,
    /// Whether the y figures include modelled time.
    #[serde(default)]
    pub modelled: bool,
}

impl Report {
    /// An empty report for `kind` (the scenario named after it) with its
    /// contract object.
    pub fn new(kind: &str, title: impl Into<String>, contract: serde_json::Value) -> Self {
        Self {
            scenario: kind.to_string(),
            kind: kind.to_string(),
            seed: None,
            title: title.into(),
            params: Vec::new(),
            modelled: Vec::new(),
            tables: Vec::new(),
            plots: Vec::new(),
            notes: Vec::new(),
            contract,
        }
    }

    /// The report with this seed.
    pub fn seed(mut self, seed: &str) -> Self {
        self.seed = Some(seed.to_string());
        self
    }

    /// The table named `name`.
    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// A short line on what is modelled: "nothing" or the figures.
    pub fn modelled_text(&self) -> String {
        let v: Vec<String> = self
            .modelled
            .iter()
            .filter(|m| m.value > 0.0)
            .map(|m| format!("{} = {} {}", m.name, m.value, m.unit.symbol()))
            .collect();
        if v.is_empty() {
            "nothing modelled; every figure measured".to_string()
        } else {
            format!(
                "modelled ({MODELLED_MARK}): {}; everything else measured",
                v.join(", ")
            )
        }
    }
}

/// Serialises a contract struct; the structs are plain data, so this
/// cannot fail, and a failure would be a bug shown as `null`.
pub fn contract<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}
