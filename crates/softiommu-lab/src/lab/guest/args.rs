//! The options of `lab guest`.

use serde::{Deserialize, Serialize};

use crate::args::Ranged;

/// Options of `lab guest`.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuestArgs {
    /// Disk size in MiB the guest writes and reads back (8..=512).
    #[arg(long, default_value = "32")]
    pub mib: Ranged<8, 512>,
    /// MiB the guest sends, and receives, over TCP for the virtio-net rows
    /// (1..=64).
    #[arg(long, default_value = "4")]
    pub net_mib: Ranged<1, 64>,
    /// Rounds, each running every row and the anchor side by side; the
    /// median round of each row is reported, and the time ratio is the
    /// median of the rounds' ratios (1..=9). One boot's strict
    /// invalidation count varies by up to 2x with the guest's readahead, so
    /// three rounds are the default; `--quick` runs one unless told.
    #[arg(long)]
    pub rounds: Option<Ranged<1, 9>>,
    /// A smaller disk (16 MiB) and transfer (1 MiB).
    #[arg(long)]
    pub quick: bool,
    /// Leave the runs at the priority the lab was started with. By
    /// default the lab raises its guest runs (ours and the anchor alike)
    /// to nice -10 where it may (its autogroup's nice, else its own), so
    /// the machine's other work does not decide the time ratio; the JSON
    /// says whether it did (`priority`).
    #[arg(long)]
    pub no_raise_priority: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl GuestArgs {
    /// The rounds to run: as given, else 3 (1 with `--quick`).
    pub fn rounds(&self) -> u32 {
        self.rounds
            .map(|r| r.get() as u32)
            .unwrap_or(if self.quick { 1 } else { 3 })
    }
}

impl Default for GuestArgs {
    fn default() -> Self {
        Self {
            mib: Ranged::new(32),
            net_mib: Ranged::new(4),
            rounds: None,
            quick: false,
            no_raise_priority: false,
            json: false,
        }
    }
}
