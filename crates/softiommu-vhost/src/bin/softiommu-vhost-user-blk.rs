//! `softiommu-vhost-user-blk --socket PATH --file DISK [--miss-timeout-ms N]
//! [--iotlb-entries N] [--once]`: a vhost-user-blk back-end with a device
//! IOTLB. Listens on PATH, serves one front-end at a time, prints one line
//! of counters per session. A bad argument exits 2 with one line.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use softiommu_vhost::{BlkBackend, BlkBackendConfig, SessionEnd};

const USAGE: &str =
    "usage: softiommu-vhost-user-blk --socket PATH --file DISK [--miss-timeout-ms 1..=60000] [--iotlb-entries 1..=1048576] [--once]";

struct Args {
    socket: PathBuf,
    cfg: BlkBackendConfig,
    once: bool,
}

fn parse() -> Result<Args, String> {
    let mut socket = None;
    let mut file = None;
    let mut miss_ms = 2000u64;
    let mut entries = 16384usize;
    let mut once = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value; {USAGE}"));
        match a.as_str() {
            "--socket" => socket = Some(PathBuf::from(val("--socket")?)),
            "--file" => file = Some(PathBuf::from(val("--file")?)),
            "--miss-timeout-ms" => {
                let v = val("--miss-timeout-ms")?;
                miss_ms = v
                    .parse()
                    .ok()
                    .filter(|n| BlkBackendConfig::MISS_TIMEOUT_MS.contains(n))
                    .ok_or(format!("--miss-timeout-ms must be in 1..=60000, got {v:?}"))?;
            }
            "--iotlb-entries" => {
                let v = val("--iotlb-entries")?;
                entries = v
                    .parse()
                    .ok()
                    .filter(|n| BlkBackendConfig::IOTLB_CAPACITY.contains(n))
                    .ok_or(format!("--iotlb-entries must be in 1..=1048576, got {v:?}"))?;
            }
            "--once" => once = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    let socket = socket.ok_or(format!("--socket is required; {USAGE}"))?;
    let file = file.ok_or(format!("--file is required; {USAGE}"))?;
    let mut cfg = BlkBackendConfig::new(file);
    cfg.miss_timeout = Duration::from_millis(miss_ms);
    cfg.iotlb_capacity = entries;
    Ok(Args { socket, cfg, once })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("softiommu-vhost-user-blk: {e}");
            return ExitCode::from(2);
        }
    };
    let backend = match BlkBackend::open(args.cfg) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("softiommu-vhost-user-blk: {e}");
            return ExitCode::from(2);
        }
    };
    if args.socket.exists() {
        eprintln!(
            "softiommu-vhost-user-blk: {} exists; remove it first",
            args.socket.display()
        );
        return ExitCode::from(2);
    }
    let listener = match UnixListener::bind(&args.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "softiommu-vhost-user-blk: cannot listen on {}: {e}",
                args.socket.display()
            );
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "softiommu-vhost-user-blk: listening on {} ({} sectors)",
        args.socket.display(),
        backend.sectors()
    );
    loop {
        let sock = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                eprintln!("softiommu-vhost-user-blk: accept failed: {e}");
                return ExitCode::FAILURE;
            }
        };
        let r = backend.serve(sock);
        let end = match &r.end {
            SessionEnd::Disconnected => "disconnected".to_string(),
            SessionEnd::Failed(e) => format!("failed: {e}"),
        };
        println!(
            "session end={end:?} requests={} updates={} invalidations={} misses={} miss_timeouts={} refused={} flushes={} rejected_messages={}",
            r.blk.requests,
            r.iotlb.updates,
            r.iotlb.invalidations,
            r.iotlb.misses,
            r.iotlb.miss_timeouts,
            r.iotlb.refused,
            r.iotlb.flushes,
            r.rejected_messages
        );
        if args.once {
            let _ = std::fs::remove_file(&args.socket);
            return ExitCode::SUCCESS;
        }
    }
}
