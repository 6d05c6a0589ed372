//! `bench dma --instructions`: the instructions one map+unmap pair costs,
//! counted by callgrind (valgrind's instruction-level simulator), the way
//! the lab measures the deferred hot path against pass-through.
//!
//! For each policy the bench runs itself twice under
//! `valgrind --tool=callgrind`, one thread, `--latency zero` (the latency
//! model spins; its loop is not our code's work), `N` and `2N` pairs; the
//! difference of the two totals divided by `N` is the instructions of one
//! pair, set-up and tear-down cancelled out. The runs are `--untimed`:
//! the loop reads no clock per call, so the figure is the pair's own work
//! plus a loop counter (before, four clock reads per pair, about 310
//! instructions under valgrind, were part of every policy's figure).
//!
//! Caveat, reported with the figure: under valgrind the IOVA allocator's
//! live map cannot reserve its flat 64 GiB table (valgrind caps the address
//! space) and uses its chunked form. The hot paths reach it through a
//! per-CPU cursor (the chunk last used), so a lookup costs what a native
//! run's does except when a buffer's IOVA lies in another chunk.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use softiommu::dma::DmaPolicy;

use super::dma::{Dir, DmaBenchArgs};
use crate::error::{LabError, LabResult};

/// Pairs of the shorter of the two runs when `--iters` is not given.
pub const DEFAULT_PAIRS: u64 = 20_000;

/// Whether `valgrind` can be run.
pub fn callgrind_available() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Instructions per map+unmap pair of `policy`, counted by callgrind.
pub fn instructions_per_pair(policy: DmaPolicy, args: &DmaBenchArgs) -> LabResult<f64> {
    let n = args.iters.map_or(DEFAULT_PAIRS, |i| i.get());
    let short = total_instructions(policy, args, n)?;
    let long = total_instructions(policy, args, n * 2)?;
    if long <= short {
        return Err(LabError::Measure(format!(
            "callgrind counted {long} instructions for {} pairs and {short} for {n}: \
             no per-pair figure",
            n * 2
        )));
    }
    Ok((long - short) as f64 / n as f64)
}

/// The whole-program instruction count of the bench doing `pairs` pairs of
/// `policy`, under callgrind.
fn total_instructions(policy: DmaPolicy, args: &DmaBenchArgs, pairs: u64) -> LabResult<u64> {
    let exe = std::env::current_exe()
        .map_err(|e| LabError::Measure(format!("cannot find the lab's own binary: {e}")))?;
    let out = out_file(policy, pairs);
    let dir = match args.dir {
        Dir::ToDevice => "to-device",
        Dir::FromDevice => "from-device",
        Dir::Bidirectional => "bidirectional",
    };
    // Counted in this process's session: a child started in a session of
    // its own would be a process valgrind does not follow.
    let status = Command::new("valgrind")
        .env(crate::session::ENV, "caller")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .args([
            "bench",
            "dma",
            "--threads",
            "1",
            "--latency",
            "zero",
            "--untimed",
        ])
        .args(["--iters", &pairs.to_string()])
        .args(["--granule", &args.granule.get().to_string()])
        .args(["--dir", dir])
        .args(["--policies", policy.name(), "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| LabError::Measure(format!("cannot run valgrind: {e}")))?;
    let total = read_total(&out);
    let _ = std::fs::remove_file(&out);
    if !status.success() {
        return Err(LabError::Measure(format!(
            "valgrind --tool=callgrind exited with {status} on {} pairs of {}",
            pairs,
            policy.name()
        )));
    }
    total
}

fn out_file(policy: DmaPolicy, pairs: u64) -> PathBuf {
    std::env::temp_dir().join(format!(
        "softiommu-callgrind-{}-{}-{pairs}.out",
        std::process::id(),
        policy.name()
    ))
}

/// The `totals:` (or `summary:`) line of a callgrind output file.
fn read_total(path: &Path) -> LabResult<u64> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        LabError::Measure(format!(
            "cannot read callgrind's output {}: {e}",
            path.display()
        ))
    })?;
    parse_total(&text).ok_or_else(|| {
        LabError::Measure(format!(
            "no instruction total in callgrind's output {}",
            path.display()
        ))
    })
}

/// The event total of a callgrind output file's text.
fn parse_total(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_is_read_from_either_line() {
        assert_eq!(parse_total("events: Ir\nsummary: 1234\n"), Some(1234));
        assert_eq!(
            parse_total("events: Ir\nfn=x\n1 2\ntotals: 99 7\n"),
            Some(99)
        );
        assert_eq!(parse_total("events: Ir\n"), None);
        assert_eq!(parse_total("totals: lots\n"), None);
    }
}
