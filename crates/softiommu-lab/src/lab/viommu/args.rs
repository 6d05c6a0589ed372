//! The options of `lab viommu`.

use serde::{Deserialize, Serialize};

use super::EXIT_US;
use crate::args::Ranged;

/// Options of `lab viommu`.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ViommuArgs {
    /// Reads per row (100..=10000000; default 4000 with --quick, else 40000).
    #[arg(long)]
    pub ios: Option<Ranged<100, 10_000_000>>,
    /// Reads in flight of the null and the ssd IOPS rows (1..=32).
    #[arg(long, default_value = "4")]
    pub depth: Ranged<1, 32>,
    /// Rounds per row, interleaved; the median round is reported (1..=20;
    /// default 3: one disturbed round is never the figure).
    #[arg(long)]
    pub rounds: Option<Ranged<1, 20>>,
    /// Short runs, same shape.
    #[arg(long)]
    pub quick: bool,
    /// The modelled cost of a notification (VM exit and entry), µs,
    /// busy-waited by the notifying thread on every `QueueNotify` of
    /// both devices in every mode (0..=1000; 0: none).
    #[arg(long, default_value_t = EXIT_US, value_parser = parse_exit_us)]
    #[serde(deserialize_with = "de_exit_us")]
    pub exit_us: f64,
    /// Bytes per read of the null and the ssd IOPS rows: a multiple of 4096 in 4096..=131072 (the disk's
    /// `size_max`: one data segment). The `ssd` back-end's bandwidth
    /// makes a large block cost its transfer time.
    #[arg(long, default_value = "4096", value_parser = parse_bs)]
    #[serde(deserialize_with = "de_bs")]
    pub bs: u64,
    /// Bytes per read of the ssd bandwidth job, the target's rows (as
    /// `--bs`; default 128 KiB: fio's bandwidth shape).
    #[arg(long, default_value = "131072", value_parser = parse_bs)]
    #[serde(deserialize_with = "de_bs")]
    pub bw_bs: u64,
    /// Reads in flight of the ssd bandwidth job (1..=32; default 16:
    /// enough for the link, not the latency, to bound it).
    #[arg(long, default_value = "16")]
    pub bw_depth: Ranged<1, 32>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for ViommuArgs {
    fn default() -> Self {
        Self {
            ios: None,
            depth: Ranged::new(4),
            rounds: None,
            quick: false,
            exit_us: EXIT_US,
            bs: 4096,
            bw_bs: super::BW_BS,
            bw_depth: Ranged::new(super::BW_DEPTH),
            json: false,
        }
    }
}

/// `--exit-us`: a number of µs in 0..=1000.
pub(super) fn parse_exit_us(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1000.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of µs in 0..=1000")),
    }
}

/// `--bs`: bytes per read, a multiple of 4096 in 4096..=131072, as a
/// number of bytes or with a `k` suffix (KiB).
pub(super) fn parse_bs(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a block size in 4096..=131072 bytes, a multiple of 4096");
    let t = s.trim();
    let v = match t.strip_suffix(['k', 'K']) {
        Some(k) => k.parse::<u64>().ok().and_then(|k| k.checked_mul(1024)),
        None => t.parse::<u64>().ok(),
    }
    .ok_or_else(bad)?;
    if (4096..=131_072).contains(&v) && v % 4096 == 0 {
        Ok(v)
    } else {
        Err(bad())
    }
}

/// A number or a string in a scenario file (`bs = 4096`, `bs = "4k"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    Int(u64),
    Float(f64),
    Text(String),
}

impl NumOrText {
    fn text(self) -> String {
        match self {
            NumOrText::Int(v) => v.to_string(),
            NumOrText::Float(v) => v.to_string(),
            NumOrText::Text(t) => t,
        }
    }
}

/// `exit_us` from a scenario file or `--set`: the command line's check
/// ([`parse_exit_us`]), so a file cannot give NaN, a negative or 1e9 µs.
fn de_exit_us<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = match NumOrText::deserialize(d)? {
        NumOrText::Int(v) => v.to_string(),
        // `{:?}` keeps `nan`, `inf` and every digit as written.
        NumOrText::Float(v) => format!("{v:?}"),
        NumOrText::Text(t) => t,
    };
    parse_exit_us(&v).map_err(serde::de::Error::custom)
}

/// `bs` and `bw_bs` from a scenario file or `--set`: the command line's
/// check ([`parse_bs`]).
fn de_bs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    parse_bs(&NumOrText::deserialize(d)?.text()).map_err(serde::de::Error::custom)
}
