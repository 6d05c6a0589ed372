//! The built-in scenarios: the files in `scenarios/` at the repository
//! root, compiled in so the binary runs them from anywhere. `softiommu run`
//! runs them in this order.

use std::path::Path;

use super::{Scenario, ScenarioError};

/// (file name, text) of every built-in scenario, in the suite's order.
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "udp-32.toml",
        include_str!("../../../../scenarios/udp-32.toml"),
    ),
    (
        "udp-16k.toml",
        include_str!("../../../../scenarios/udp-16k.toml"),
    ),
    (
        "flush-hw-16.toml",
        include_str!("../../../../scenarios/flush-hw-16.toml"),
    ),
    (
        "flush-hw-64.toml",
        include_str!("../../../../scenarios/flush-hw-64.toml"),
    ),
    (
        "flush-hw-1024.toml",
        include_str!("../../../../scenarios/flush-hw-1024.toml"),
    ),
    ("ring.toml", include_str!("../../../../scenarios/ring.toml")),
    (
        "dma-map.toml",
        include_str!("../../../../scenarios/dma-map.toml"),
    ),
    (
        "access-ordering.toml",
        include_str!("../../../../scenarios/access-ordering.toml"),
    ),
    (
        "litmus-ordering.toml",
        include_str!("../../../../scenarios/litmus-ordering.toml"),
    ),
    (
        "page-faults.toml",
        include_str!("../../../../scenarios/page-faults.toml"),
    ),
    (
        "tcp-64k.toml",
        include_str!("../../../../scenarios/tcp-64k.toml"),
    ),
    (
        "pgtable-flush.toml",
        include_str!("../../../../scenarios/pgtable-flush.toml"),
    ),
    (
        "aging.toml",
        include_str!("../../../../scenarios/aging.toml"),
    ),
    (
        "storage-aging.toml",
        include_str!("../../../../scenarios/storage-aging.toml"),
    ),
    (
        "iova-alloc.toml",
        include_str!("../../../../scenarios/iova-alloc.toml"),
    ),
    (
        "translate.toml",
        include_str!("../../../../scenarios/translate.toml"),
    ),
    (
        "real-guest.toml",
        include_str!("../../../../scenarios/real-guest.toml"),
    ),
];

/// The built-in names, as a list for messages.
fn valid_names() -> String {
    BUILTIN
        .iter()
        .map(|(f, _)| f.trim_end_matches(".toml"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The built-in scenario named `name` for `run --scenarios`, which takes
/// names only: a file there is refused pointing at `lab FILE`.
pub fn suite_builtin(name: &str) -> Result<Scenario, ScenarioError> {
    builtin(name).map_err(|e| match e {
        ScenarioError::UnknownBuiltin { name, valid } => {
            if Path::new(&name).is_file() {
                ScenarioError::RunTakesNames { name, valid }
            } else {
                ScenarioError::UnknownRunScenario { name, valid }
            }
        }
        e => e,
    })
}

/// The built-in scenario named `name` (with or without `.toml`).
pub fn builtin(name: &str) -> Result<Scenario, ScenarioError> {
    let want = name.strip_suffix(".toml").unwrap_or(name);
    for (file, text) in BUILTIN {
        if file.strip_suffix(".toml") == Some(want) {
            return Scenario::parse(text, Path::new(&format!("scenarios/{file}")));
        }
    }
    Err(ScenarioError::UnknownBuiltin {
        name: name.to_string(),
        valid: valid_names(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_scenario_parses_and_its_quick_overrides_apply() {
        for (file, _) in BUILTIN {
            let s = builtin(file).unwrap_or_else(|e| panic!("{file}: {e}"));
            s.quick().unwrap_or_else(|e| panic!("{file} quick: {e}"));
        }
    }

    #[test]
    fn the_suite_takes_names_and_points_a_file_at_lab() {
        let e = suite_builtin("Cargo.toml").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::RunTakesNames { name, valid } if name == "Cargo.toml" && valid.contains("udp-32")),
            "{e}"
        );
        let e = suite_builtin("nope").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::UnknownRunScenario { name, .. } if name == "nope"),
            "{e}"
        );
        assert!(suite_builtin("ring").is_ok());
        // The real guest is one of the suite's scenarios (skipped, in one
        // line, where the kit is missing).
        let g = suite_builtin("real-guest").expect("real-guest");
        assert_eq!(g.lab_table(), "lab-guest");
        assert!(
            matches!(g.quick().expect("quick").lab(), crate::registry::LabArgs::Guest(a) if a.quick && a.rounds() == 1)
        );
        // The full run takes three rounds: one boot's strict invalidation
        // count varies too much for a ratio of single boots.
        assert!(
            matches!(g.lab(), crate::registry::LabArgs::Guest(a) if !a.quick && a.rounds() == 3)
        );
    }

    #[test]
    fn an_unknown_builtin_lists_the_valid_names() {
        let e = builtin("nope").unwrap_err();
        assert!(
            matches!(&e, ScenarioError::UnknownBuiltin { valid, .. } if valid.contains("udp-32")),
            "{e}"
        );
    }
}
