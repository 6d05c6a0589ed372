//! What can be wrong with a scenario file or an override.

use std::path::PathBuf;

/// A scenario that cannot be run as written.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A field is unknown, ill-typed or out of range, or the TOML is
    /// malformed.
    #[error("{path}:{line}: {field}{message}")]
    Field {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// "field `table.key`: " when one is named, else empty.
        field: String,
        /// What the parser said.
        message: String,
    },
    /// The file names no bench or lab.
    #[error("{path}: no bench or lab table (one of: {valid})")]
    NoLab {
        /// The file.
        path: PathBuf,
        /// The valid table names.
        valid: String,
    },
    /// The file names more than one bench or lab.
    #[error("{path}: more than one bench or lab table ({found}); a scenario runs one")]
    TwoLabs {
        /// The file.
        path: PathBuf,
        /// The tables found.
        found: String,
    },
    /// A `--set` without `=`.
    #[error("--set {set:?}: expected KEY=VALUE")]
    SetSyntax {
        /// The argument.
        set: String,
    },
    /// A `--set` (or a `[quick]` override) the scenario refuses.
    #[error("--set {set}: {message}")]
    Set {
        /// The override.
        set: String,
        /// What the parser said (names the field when it is unknown).
        message: String,
    },
    /// No built-in scenario has this name.
    #[error("no scenario file {name:?} and no built-in scenario of that name (built-in: {valid})")]
    UnknownBuiltin {
        /// The name asked for.
        name: String,
        /// The built-in names.
        valid: String,
    },
}
