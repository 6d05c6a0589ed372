//! The options of `lab iopf`: message lengths, sends, pre-map windows,
//! the handler's threads and spin, placement and promotion.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use softiommu::PAGE_SIZE;

use crate::args::{ArgError, Placement, Ranged};

use super::{LAB_SPIN_POLLS, MAX_MSG_LEN, MAX_PREMAP};

/// A message length in bytes: a whole number of 4 KiB pages, 4 KiB to
/// [`MAX_MSG_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct MsgLen(u64);

impl MsgLen {
    /// The bytes.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for MsgLen {
    type Error = ArgError;
    fn try_from(v: u64) -> Result<Self, ArgError> {
        let r: Ranged<PAGE_SIZE, MAX_MSG_LEN> = Ranged::try_from(v)?;
        if !r.get().is_multiple_of(PAGE_SIZE) {
            return Err(ArgError::NotAMultiple {
                value: v.to_string(),
                of: PAGE_SIZE,
            });
        }
        Ok(Self(v))
    }
}

impl From<MsgLen> for u64 {
    fn from(v: MsgLen) -> u64 {
        v.0
    }
}

impl FromStr for MsgLen {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        let r: Ranged<PAGE_SIZE, MAX_MSG_LEN> = s.parse()?;
        Self::try_from(r.get())
    }
}

impl fmt::Display for MsgLen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Whether the faulting domains promote completed 2 MiB blocks to 2 MiB
/// leaves ([`IopfConfig::promote`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Promote {
    /// Promote (the library's default).
    #[default]
    On,
    /// Keep the 4 KiB leaves each fault mapped.
    Off,
}

impl Promote {
    /// Whether it is on.
    pub fn on(self) -> bool {
        self == Promote::On
    }
}

/// Options of `lab iopf` (and of a `[lab-iopf]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IopfArgs {
    /// Message lengths in bytes, whole 4 KiB pages (4096..=268435456;
    /// default 1048576,10485760, the seed's 1 MB and 10 MB).
    #[arg(long, value_delimiter = ',')]
    pub msg_len: Vec<MsgLen>,
    /// Sends over the same buffer per row (1..=1000000; default
    /// 1,100,1000,5000 as the seed; with --quick 1,100,1000,5000 for
    /// messages up to 1 MiB and 1,100 above).
    #[arg(long, value_delimiter = ',')]
    pub times: Vec<Ranged<1, 1_000_000>>,
    /// Pre-map windows, pages mapped per fault (1..=262144; default 1,512,
    /// the seed's PREMAP_LEN values).
    #[arg(long, value_delimiter = ',')]
    pub premap_pages: Vec<Ranged<1, MAX_PREMAP>>,
    /// Page request handler threads (1..=16).
    #[arg(long, default_value = "1")]
    pub handler_threads: Ranged<1, 16>,
    /// Empty polls of the page request queue before a handler thread
    /// sleeps on its doorbell (0..=67108864). The default, 32768 (16,384
    /// pausing polls, then 16,384 that yield the core), keeps the handler spinning across a
    /// device's burst of faults (the spinning design); the library's
    /// default 2048 (a few µs) parks between faults, so each pays a
    /// wake-up (the parking design); 0 parks at once.
    #[arg(long, default_value = "32768")]
    pub handler_spin: Ranged<0, { softiommu::iopf::MAX_SPIN_POLLS as u64 }>,
    /// Where the device thread and the handler threads run: `split` (the
    /// default) pins them to two different CPUs, `shared` both to one,
    /// `os` pins nothing (a spinning party may then share a core with the
    /// one it waits for, at a scheduler tick's cost).
    #[arg(long, value_enum, default_value = "split")]
    pub placement: Placement,
    /// Whether a fault that completes a 2 MiB block of the message
    /// collapses its 4 KiB leaves into one 2 MiB leaf: `on` (the default)
    /// or `off` (4 KiB leaves only, as before promotion existed).
    #[arg(long, value_enum, default_value = "on")]
    pub promote: Promote,
    /// Runs per configuration, interleaved; the fastest is kept (1..=100;
    /// default 3, with --quick 2).
    #[arg(long)]
    pub repeats: Option<Ranged<1, 100>>,
    /// The short form (about 10 s of CPU on 2 cores): messages above 1 MiB
    /// stop at 100 sends (1 MiB keeps 1 to 5,000) and every configuration
    /// runs twice.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for IopfArgs {
    fn default() -> Self {
        Self {
            msg_len: Vec::new(),
            times: Vec::new(),
            premap_pages: Vec::new(),
            handler_threads: Ranged::new(1),
            handler_spin: Ranged::new(LAB_SPIN_POLLS),
            placement: Placement::Split,
            promote: Promote::On,
            repeats: None,
            quick: false,
            json: false,
        }
    }
}
