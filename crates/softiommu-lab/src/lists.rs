//! The list options of a bench or lab (`--policies`, `--times`, ...; the
//! same fields of a scenario table): each value at most once, and at most
//! [`MAX_LIST_VALUES`] of them. A list repeats its work per value, so a
//! value named twice would run (and report, under one name) twice, and a
//! list from a scenario file of up to 1 MiB could name a value tens of
//! thousands of times: an hours-long run from a typo. Checked once,
//! before any work starts, for every entry of the registry alike.

use serde::Serialize;

use crate::error::{LabError, LabResult};

/// The most values one list option takes: more than any list's distinct
/// values (the policies, the orderings) or any sweep a lab is run with.
pub const MAX_LIST_VALUES: usize = 64;

/// Refuses a list field of `args` (an options struct: its list options
/// are its top-level arrays) that repeats a value or holds more than
/// [`MAX_LIST_VALUES`].
pub fn check_lists(args: &impl Serialize) -> LabResult<()> {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(args) else {
        return Ok(());
    };
    for (field, value) in &fields {
        let serde_json::Value::Array(values) = value else {
            continue;
        };
        let option = format!("--{}", field.replace('_', "-"));
        if values.len() > MAX_LIST_VALUES {
            return Err(LabError::ListTooLong {
                option,
                len: values.len(),
                max: MAX_LIST_VALUES,
            });
        }
        for (i, v) in values.iter().enumerate() {
            if values[..i].contains(v) {
                return Err(LabError::ListRepeats {
                    option,
                    value: match v {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Opts {
        policies: Vec<&'static str>,
        msg_len: Vec<u64>,
        seconds: f64,
    }

    #[test]
    fn a_repeated_value_is_refused_naming_option_and_value() {
        let o = Opts {
            policies: vec!["strict", "deferred", "strict"],
            msg_len: vec![],
            seconds: 1.0,
        };
        let e = check_lists(&o).unwrap_err();
        assert!(
            matches!(&e, LabError::ListRepeats { option, value } if option == "--policies" && value == "strict"),
            "{e}"
        );
    }

    #[test]
    fn a_list_past_the_cap_is_refused_and_distinct_lists_pass() {
        let o = Opts {
            policies: vec!["strict"],
            msg_len: (0..=MAX_LIST_VALUES as u64).collect(),
            seconds: 1.0,
        };
        let e = check_lists(&o).unwrap_err();
        assert!(
            matches!(&e, LabError::ListTooLong { option, len, max } if option == "--msg-len" && *len == MAX_LIST_VALUES + 1 && *max == MAX_LIST_VALUES),
            "{e}"
        );
        let ok = Opts {
            policies: vec!["strict", "deferred"],
            msg_len: (0..MAX_LIST_VALUES as u64).collect(),
            seconds: 1.0,
        };
        assert!(matches!(check_lists(&ok), Ok(())));
    }
}
