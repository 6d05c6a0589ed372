//! `--set KEY=VALUE`: overrides applied to a parsed scenario. The typed
//! scenario is turned into a TOML table, the key set, and the table
//! checked again by the same schema, so an override is refused exactly as
//! the same line in the file would be.

use super::file::{ScenarioFile, LAB_TABLES};
use super::ScenarioError;

const HEADER: [&str; 3] = ["name", "seed", "about"];

/// `file` with every `KEY=VALUE` of `sets` applied; a bare key that is not
/// a header field belongs to `lab_table`.
pub(super) fn apply_sets(
    file: &ScenarioFile,
    lab_table: &str,
    sets: &[String],
) -> Result<ScenarioFile, ScenarioError> {
    let mut out = file.clone();
    for set in sets {
        let (key, value) = set
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| ScenarioError::SetSyntax { set: set.clone() })?;
        let bad = |message: String| ScenarioError::Set {
            set: set.clone(),
            message,
        };
        // The `[quick]` table is the file's, applied by `--quick` before
        // the sets: one set here would be taken and never used. (A lab's
        // own `quick` flag, a boolean, is set as any field is.)
        let quick_table =
            key == "quick" && matches!(parse_value(value, None), toml::Value::Table(_));
        if quick_table || key.starts_with("quick.") {
            return Err(bad(
                "the [quick] table cannot be set; --quick applies the file's, and --set KEY=VALUE sets a field of the lab"
                    .into(),
            ));
        }
        let mut table = toml::Table::try_from(&out).map_err(|e| bad(e.to_string()))?;
        let (section, field) = match key.split_once('.') {
            Some((t, f)) if LAB_TABLES.contains(&t) => (Some(t), f),
            Some(_) => {
                return Err(bad(format!(
                    "unknown table in {key:?} (valid: {})",
                    LAB_TABLES.join(", ")
                )))
            }
            None if HEADER.contains(&key) => (None, key),
            None => (Some(lab_table), key),
        };
        let target = match section {
            None => &mut table,
            Some(t) => table
                .entry(t.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| bad(format!("{t} is not a table")))?,
        };
        let parsed = parse_value(value, target.get(field));
        target.insert(field.to_string(), parsed);
        out = table
            .try_into()
            .map_err(|e: toml::de::Error| bad(e.message().trim().to_string()))?;
    }
    Ok(out)
}

/// A value as TOML (`16384`, `true`, `["a","b"]`, `"x"`); failing that,
/// plain text, split at commas when the field holds a list.
fn parse_value(text: &str, current: Option<&toml::Value>) -> toml::Value {
    if let Ok(t) = format!("v = {text}").parse::<toml::Table>() {
        if let Some(v) = t.get("v") {
            if !(matches!(current, Some(toml::Value::Array(_))) && v.is_str()) {
                return v.clone();
            }
        }
    }
    let unquoted = text.trim_matches('"');
    match current {
        Some(toml::Value::Array(_)) | None if unquoted.contains(',') => toml::Value::Array(
            unquoted
                .split(',')
                .map(|s| toml::Value::String(s.trim().to_string()))
                .collect(),
        ),
        Some(toml::Value::Array(_)) => {
            toml::Value::Array(vec![toml::Value::String(unquoted.to_string())])
        }
        _ => toml::Value::String(unquoted.to_string()),
    }
}
