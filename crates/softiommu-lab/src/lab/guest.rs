//! `softiommu lab guest`: seed 000 in its own code. A Debian 6.1 guest
//! under QEMU (TCG) writes and reads back a disk on our vhost-user-blk
//! back-end, its intel-iommu driver in strict then lazy mode driving the
//! back-end's device IOTLB; the back-end counts updates, invalidations and
//! misses per I/O and its own CPU per I/O. Beside it, the same guest and
//! disk on QEMU's own virtio-blk (strict) as the anchor for guest read time.
//!
//! Guest times are TCG times (an emulated CPU, ~10-100x slower than
//! hardware): only their ratios mean anything, and they are marked so.
//! Without the guest kit (`scripts/guest-kit.sh`) it prints one line saying
//! it was skipped and why.

use std::time::Duration;

use serde_json::json;
use softiommu_vhost::guest::{run_blk, GuestBlkRun, GuestDevice, GuestKit, IommuMode};

use crate::args::Ranged;
use crate::error::LabResult;

/// Options of `lab guest`.
#[derive(Debug, Clone, clap::Args)]
pub struct GuestArgs {
    /// Disk size in MiB the guest writes and reads back (8..=512).
    #[arg(long, default_value = "32")]
    pub mib: Ranged<8, 512>,
    /// A smaller disk (16 MiB).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

const DEADLINE: Duration = Duration::from_secs(600);

struct Row {
    mode: IommuMode,
    run: GuestBlkRun,
}

impl Row {
    fn ios(&self) -> u64 {
        self.run.report.as_ref().map_or(0, |r| r.blk.requests)
    }
    fn per_io(&self, v: u64) -> f64 {
        v as f64 / self.ios().max(1) as f64
    }
    fn json(&self) -> serde_json::Value {
        let r = self.run.report.as_ref();
        let s = r.map(|r| r.iotlb).unwrap_or_default();
        let cpu_ns = r.map_or(0, |r| r.blk.worker_cpu_ns + r.session_cpu_ns);
        json!({
            "mode": self.mode.name(),
            "device": "virtio-blk",
            "ios": self.ios(),
            "iotlb_updates": s.updates,
            "iotlb_invalidations": s.invalidations,
            "iotlb_misses": s.misses,
            "invalidations_per_io": self.per_io(s.invalidations),
            "updates_per_io": self.per_io(s.updates),
            "misses_per_io": self.per_io(s.misses),
            "device_cpu_us_per_io": self.per_io(cpu_ns) / 1000.0,
            "queue_cpu_us_per_io": self.per_io(r.map_or(0, |r| r.blk.worker_cpu_ns)) / 1000.0,
            "messages_cpu_us_per_io": self.per_io(r.map_or(0, |r| r.session_cpu_ns)) / 1000.0,
            "guest_seconds": self.run.read_seconds(),
            "checksum_ok": self.run.checksum_ok(),
        })
    }
}

/// Runs the lab; prints a table or one JSON object.
pub fn run(a: &GuestArgs) -> LabResult<()> {
    let kit = match GuestKit::find() {
        Ok(k) => k,
        Err(e) => {
            if a.json {
                println!("{}", json!({"lab": "guest", "skipped": e.to_string()}));
            } else {
                println!("lab guest skipped: {e}");
            }
            return Ok(());
        }
    };
    let mib = if a.quick { 16 } else { a.mib.get() };
    let mut rows = Vec::new();
    for mode in [IommuMode::Strict, IommuMode::Lazy] {
        eprintln!(
            "lab guest: {} on our vhost-user-blk ({mib} MiB)...",
            mode.name()
        );
        let run = run_blk(&kit, GuestDevice::VhostBlk, mode, mib, DEADLINE)?;
        rows.push(Row { mode, run });
    }
    eprintln!("lab guest: anchor, QEMU's own virtio-blk (strict)...");
    let anchor = run_blk(&kit, GuestDevice::QemuBlk, IommuMode::Strict, mib, DEADLINE)?;
    let kernel = rows[0]
        .run
        .field("kernel")
        .map(str::to_string)
        .or_else(|| kit.kernel_release());
    let strict_inv = rows[0].json()["invalidations_per_io"]
        .as_f64()
        .unwrap_or(0.0);
    let lazy_inv = rows[1].json()["invalidations_per_io"]
        .as_f64()
        .unwrap_or(0.0);
    let ours = rows[0].run.read_seconds();
    let anchor_s = anchor.read_seconds();
    let ratio = match (ours, anchor_s) {
        (Some(o), Some(a)) if a > 0.0 => Some(o / a),
        _ => None,
    };
    let out = json!({
        "lab": "guest",
        "kernel": kernel,
        "disk_mib": mib,
        "time_basis": "guest_seconds are the guest's read time under TCG (emulated CPU): compare ratios only",
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "anchor": {
            "device": "qemu-virtio-blk",
            "mode": "strict",
            "guest_seconds": anchor_s,
            "checksum_ok": anchor.checksum_ok(),
        },
        "lazy_over_strict_invalidations_per_io": if strict_inv > 0.0 { Some(lazy_inv / strict_inv) } else { None },
        "strict_read_time_over_anchor": ratio,
    });
    if a.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "lab guest: kernel {}, {mib} MiB disk, QEMU TCG (guest times ‡: emulated CPU, ratios only)",
        kernel.as_deref().unwrap_or("?")
    );
    println!(
        "{:<7} {:<16} {:>6} {:>9} {:>9} {:>9} {:>8} {:>10} {:>11} {:>8}",
        "mode",
        "device",
        "ios",
        "updates",
        "invals",
        "misses",
        "inv/io",
        "cpu us/io",
        "read s ‡",
        "checksum"
    );
    for r in &rows {
        let j = r.json();
        println!(
            "{:<7} {:<16} {:>6} {:>9} {:>9} {:>9} {:>8.2} {:>10.1} {:>11} {:>8}",
            r.mode.name(),
            "virtio-blk",
            j["ios"].as_u64().unwrap_or(0),
            j["iotlb_updates"].as_u64().unwrap_or(0),
            j["iotlb_invalidations"].as_u64().unwrap_or(0),
            j["iotlb_misses"].as_u64().unwrap_or(0),
            j["invalidations_per_io"].as_f64().unwrap_or(0.0),
            j["device_cpu_us_per_io"].as_f64().unwrap_or(0.0),
            r.run
                .read_seconds()
                .map_or("-".into(), |s| format!("{s:.2}")),
            if r.run.checksum_ok() { "ok" } else { "BAD" }
        );
    }
    println!(
        "{:<7} {:<16} {:>6} {:>9} {:>9} {:>9} {:>8} {:>10} {:>11} {:>8}",
        "strict",
        "qemu-virtio-blk",
        "-",
        "-",
        "-",
        "-",
        "-",
        "-",
        anchor_s.map_or("-".into(), |s| format!("{s:.2}")),
        if anchor.checksum_ok() { "ok" } else { "BAD" }
    );
    if let Some(r) = ratio {
        println!("our strict read time / anchor's: {r:.2} ‡");
    }
    if strict_inv > 0.0 {
        println!(
            "lazy / strict invalidations per I/O: {:.3}",
            lazy_inv / strict_inv
        );
    }
    Ok(())
}
