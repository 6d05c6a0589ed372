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
    /// The file is longer than a scenario may be (a device such as
    /// `/dev/zero`, or not a scenario at all).
    #[error("scenario {path} is larger than {max} bytes (1 MiB, the most a scenario file may hold); is it a scenario file?")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The cap in bytes.
        max: u64,
    },
    /// A pipe or FIFO gave no end of file in time.
    #[error("scenario {path}: its writer sent no end of file within {waited:?}; nothing was run")]
    ReadTimeout {
        /// The file.
        path: PathBuf,
        /// How long the read waited.
        waited: std::time::Duration,
    },
    /// The file is not UTF-8 text.
    #[error("scenario {path} is not UTF-8 text (byte {offset}); a scenario is a TOML file")]
    NotText {
        /// The file.
        path: PathBuf,
        /// The first byte that is not.
        offset: usize,
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
    /// `run --scenarios` was given a file: it takes built-in names.
    #[error("run --scenarios takes built-in scenario names, and {name:?} is a file; run a scenario file with `softiommu lab {name}` (built-in: {valid})")]
    RunTakesNames {
        /// The file named.
        name: String,
        /// The built-in names.
        valid: String,
    },
    /// `run --scenarios` named no built-in scenario.
    #[error("run --scenarios takes built-in scenario names: no built-in scenario {name:?} (built-in: {valid}); `softiommu lab FILE` runs a scenario file")]
    UnknownRunScenario {
        /// The name asked for.
        name: String,
        /// The built-in names.
        valid: String,
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
