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
    /// At most this many seconds per test and mode (1..=86400): past it
    /// the run stops at a whole batch and its row says `cut_short` (two
    /// threads meet before every iteration, and on cores other work holds
    /// each meeting can wait a time slice). `--quick` caps it at 10.
    #[arg(long, default_value = "120")]
    pub max_seconds: Ranged<1, 86_400>,
    /// A short run (1,000,000 iterations per test and mode, at most 10 s
    /// each).
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
            max_seconds: Ranged::new(120),
            quick: false,
            json: false,
        }
    }
}
