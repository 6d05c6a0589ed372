//! A scenario file: its schema, its parsing (with the line of any bad
//! field), and the run it describes.

use std::path::{Path, PathBuf};

use super::set::apply_sets;
use super::ScenarioError;
use crate::error::LabResult;
pub use crate::registry::LabArgs;
pub(super) use crate::registry::{ScenarioFile, LAB_TABLES};
use crate::report::Report;

/// A scenario ready to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// The seed it reproduces, if any.
    pub seed: Option<String>,
    /// What it is.
    pub about: String,
    /// Where it came from (for messages).
    pub path: PathBuf,
    file: ScenarioFile,
}

impl Scenario {
    /// Reads (at most [`super::read::MAX_SCENARIO_BYTES`]) and checks a
    /// scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = super::read::read_scenario(path)?;
        Self::parse(&text, path)
    }

    /// Checks the text of a scenario file read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Scenario, ScenarioError> {
        let file: ScenarioFile = toml::from_str(text).map_err(|e| field_error(&e, text, path))?;
        let s = Self::from_file(file, path)?;
        // The `[quick]` table is checked now, with or without `--quick`,
        // and its errors name the file and line, not a `--set`.
        if let Err(e) = s.quick() {
            return Err(quick_error(e, text, path));
        }
        Ok(s)
    }

    fn from_file(file: ScenarioFile, path: &Path) -> Result<Scenario, ScenarioError> {
        let found = file.tables();
        match found.len() {
            0 => {
                return Err(ScenarioError::NoLab {
                    path: path.to_path_buf(),
                    valid: LAB_TABLES.join(", "),
                })
            }
            1 => {}
            _ => {
                return Err(ScenarioError::TwoLabs {
                    path: path.to_path_buf(),
                    found: found.join(", "),
                })
            }
        }
        let stem = path.file_stem().map_or_else(
            || "scenario".to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        Ok(Scenario {
            name: file.name.clone().unwrap_or(stem),
            seed: file.seed.clone(),
            about: file.about.clone(),
            path: path.to_path_buf(),
            file,
        })
    }

    /// The name of the scenario's bench or lab table.
    pub fn lab_table(&self) -> &'static str {
        self.file.tables().first().copied().unwrap_or("?")
    }

    /// The scenario with `KEY=VALUE` overrides applied (a key names a
    /// header field, a field of the lab table, or `table.field`).
    pub fn with_sets(&self, sets: &[String]) -> Result<Scenario, ScenarioError> {
        if sets.is_empty() {
            return Ok(self.clone());
        }
        let file = apply_sets(&self.file, self.lab_table(), sets)?;
        // A second table is the `--set`'s doing, not the file's: the first
        // set that adds it is named (the sets applied one more at a time).
        Self::from_file(file, &self.path).map_err(|e| match e {
            ScenarioError::TwoLabs { found, .. } => {
                let culprit = (1..=sets.len())
                    .find(|&n| {
                        apply_sets(&self.file, self.lab_table(), &sets[..n])
                            .is_ok_and(|f| f.tables().len() > 1)
                    })
                    .map_or_else(|| sets.join(" --set "), |n| sets[n - 1].clone());
                ScenarioError::Set {
                    set: culprit,
                    message: format!(
                        "adds a second bench or lab table ({found}); a scenario runs one"
                    ),
                }
            }
            e => e,
        })
    }

    /// The scenario as `run --quick` runs it: its `[quick]` overrides
    /// applied.
    pub fn quick(&self) -> Result<Scenario, ScenarioError> {
        let sets: Vec<String> = self
            .file
            .quick
            .iter()
            .flatten()
            .map(|(k, v)| format!("{}.{k}={v}", self.lab_table()))
            .collect();
        let mut s = self.with_sets(&sets)?;
        s.file.quick = None;
        Ok(s)
    }

    /// The bench or lab and its options (a scenario holds exactly one
    /// table: [`Scenario::parse`] refuses any other).
    pub fn lab(&self) -> LabArgs {
        self.file
            .lab()
            .unwrap_or_else(|| LabArgs::Litmus(Default::default()))
    }

    /// Runs the scenario; the report carries its name and seed.
    pub fn run(&self, progress: &mut dyn FnMut(&str)) -> LabResult<Report> {
        let mut r = self.lab().run(progress)?;
        r.scenario = self.name.clone();
        if self.seed.is_some() {
            r.seed = self.seed.clone();
        }
        if !self.about.is_empty() {
            r.title = self.about.clone();
        }
        Ok(r)
    }
}

/// An error of the `[quick]` table's override `table.key=value` as
/// "file:line: field `quick.key`: message", the line the key's in the
/// `[quick]` table.
fn quick_error(e: ScenarioError, text: &str, path: &Path) -> ScenarioError {
    let ScenarioError::Set { set, message } = e else {
        return e;
    };
    let key = set
        .split_once('=')
        .map(|(k, _)| k.rsplit_once('.').map_or(k, |(_, f)| f).trim().to_string())
        .unwrap_or_default();
    let mut in_quick = false;
    let mut line = 1;
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if let Some(h) = t.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            in_quick = h.trim() == "quick";
            if in_quick {
                line = i + 1;
            }
            continue;
        }
        let k = t.split_once('=').map(|(k, _)| k.trim().trim_matches('"'));
        if in_quick && k == Some(key.as_str()) {
            line = i + 1;
            break;
        }
    }
    ScenarioError::Field {
        path: path.to_path_buf(),
        line,
        field: format!("field `quick.{key}`: "),
        message,
    }
}

/// A parse error as "file:line: field `table.key`: message": the line
/// from the error's span, the key from the text at that line (the
/// parser's message names a value's problem, not always its key).
fn field_error(e: &toml::de::Error, text: &str, path: &Path) -> ScenarioError {
    let at = e.span().map_or(0, |s| s.start).min(text.len());
    let line = text[..at].matches('\n').count() + 1;
    let mut table = String::new();
    for l in text[..at].lines() {
        let t = l.trim();
        if let Some(h) = t.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            table = h.trim().to_string();
        }
    }
    let line_text = text.lines().nth(line - 1).unwrap_or("");
    let key = line_text
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .filter(|k| !k.is_empty() && !k.starts_with('['));
    let field = match key {
        Some(k) if table.is_empty() => format!("field `{k}`: "),
        Some(k) => format!("field `{table}.{k}`: "),
        None => String::new(),
    };
    ScenarioError::Field {
        path: path.to_path_buf(),
        line,
        field,
        message: e.message().trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(text, Path::new("t.toml"))
    }

    #[test]
    fn an_unknown_field_names_the_field_the_file_and_the_line() {
        let e =
            parse("about = \"x\"\n[lab-netperf-udp]\nmsg_size = 32\nmsg_sise = 16\n").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Field { line: 4, field, message, .. }
                if field == "field `lab-netperf-udp.msg_sise`: " && message.contains("unknown field")),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("t.toml:4: field `lab-netperf-udp.msg_sise`"),
            "{e}"
        );
    }

    #[test]
    fn an_ill_typed_or_out_of_range_field_is_named_with_its_line() {
        let e = parse("[lab-netperf-udp]\n\nmsg_size = \"big\"\n").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Field { line: 3, field, .. } if field.contains("msg_size")),
            "{e}"
        );
        let e = parse("[bench-iova]\nthreads = 0\n").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Field { line: 2, message, .. } if message.contains("0 is not in 1..=256")),
            "{e}"
        );
        let e = parse("[bench-iova]\nseconds = inf\n").unwrap_err();
        assert!(matches!(&e, ScenarioError::Field { line: 2, .. }), "{e}");
        let e = parse("[bench-dma]\npolicies = [\"lazy\"]\n").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Field { message, .. } if message.contains("valid: passthrough")),
            "{e}"
        );
    }

    /// A `[quick]` table's mistake was blamed on a `--set` the user never
    /// gave (`--set bench-iova.threadz=2: unknown field`), without file
    /// or line, and was not looked at without `--quick`: it names the
    /// file, the line and `quick.KEY`, at parse.
    #[test]
    fn a_quick_tables_mistake_names_the_file_and_line_with_or_without_quick() {
        let e =
            parse("[bench-iova]\nthreads = 1\n[quick]\nseconds = 0.1\nthreadz = 2\n").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Field { line: 5, field, message, .. }
                if field == "field `quick.threadz`: " && message.contains("unknown field `threadz`")),
            "{e}"
        );
        assert!(
            e.to_string().starts_with("t.toml:5: field `quick.threadz`"),
            "{e}"
        );
        let e = parse("[bench-iova]\n[quick]\nthreads = 0\n").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Field { line: 3, message, .. } if message.contains("0 is not in 1..=256")),
            "{e}"
        );
    }

    /// A `--set` that adds a second table was blamed on the file ("t.toml:
    /// more than one bench or lab table"), which has one.
    #[test]
    fn a_set_that_adds_a_second_table_is_blamed_on_the_set() {
        let s = parse("[bench-iova]\n").unwrap();
        let e = s.with_sets(&["lab-litmus.runs=5".into()]).unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Set { set, message }
                if set == "lab-litmus.runs=5" && message.contains("adds a second bench or lab table")),
            "{e}"
        );
    }

    #[test]
    fn a_scenario_runs_exactly_one_lab() {
        assert!(matches!(
            parse("about = \"x\"\n"),
            Err(ScenarioError::NoLab { .. })
        ));
        assert!(matches!(
            parse("[bench-iova]\n[lab-litmus]\n"),
            Err(ScenarioError::TwoLabs { .. })
        ));
        let s = parse("[lab-litmus]\nruns = 4096\n").unwrap();
        assert_eq!(s.name, "t");
        assert_eq!(s.lab_table(), "lab-litmus");
    }

    #[test]
    fn sets_override_fields_and_refuse_unknown_or_bad_ones() {
        let s = parse("[lab-netperf-udp]\nmsg_size = 32\n").unwrap();
        let t = s
            .with_sets(&["msg_size=16384".into(), "policies=strict,deferred".into()])
            .unwrap();
        let LabArgs::NetperfUdp(a) = t.lab() else {
            panic!("not netperf")
        };
        assert_eq!(a.msg_size.get(), 16384);
        assert_eq!(a.policies.len(), 2);
        let e = s.with_sets(&["msg_sise=1".into()]).unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Set { set, message } if set == "msg_sise=1" && message.contains("unknown field `msg_sise`")),
            "{e}"
        );
        let e = s.with_sets(&["msg_size=0".into()]).unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Set { message, .. } if message.contains("not in 1..=32000")),
            "{e}"
        );
        let e = s.with_sets(&["msg_size".into()]).unwrap_err();
        assert!(matches!(e, ScenarioError::SetSyntax { .. }));
        let t = s.with_sets(&["name=renamed".into()]).unwrap();
        assert_eq!(t.name, "renamed");
    }
}
