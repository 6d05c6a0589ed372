//! The options of `lab litmus`.

use serde::{Deserialize, Serialize};

use crate::args::Ranged;

/// Options of `lab litmus` (and of a `[lab-litmus]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LitmusArgs {
    /// Iterations per test and mode, rounded up to whole batches of 4,096
    /// (1..=10000000000).
    #[arg(long, default_value = "4000000")]
    pub runs: Ranged<1, 10_000_000_000>,
    /// A short run (1,000,000 iterations per test and mode; seconds).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for LitmusArgs {
    fn default() -> Self {
        Self {
            runs: Ranged::new(4_000_000),
            quick: false,
            json: false,
        }
    }
}
