//! A real Linux guest under QEMU (TCG) drives our vhost-user-blk back-end
//! through its own intel-iommu driver: the guest writes a random pattern,
//! drops its caches, reads it back and checksums; the host compares with
//! the backing file. Strict and lazy invalidation both.
//!
//! Needs the guest kit (`scripts/guest-kit.sh`); without it each test
//! prints one line saying how to get it and is skipped — unless
//! `SOFTIOMMU_GUEST_REQUIRED=1` (as CI sets), which makes a missing kit fail.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use softiommu_vhost::{BlkBackend, BlkBackendConfig, SessionEnd, SessionReport};

/// One guest at a time: the machine has few cores and TCG is CPU-bound.
static ONE_GUEST: Mutex<()> = Mutex::new(());
const DISK_MIB: u64 = 32;
const GUEST_DEADLINE: Duration = Duration::from_secs(600);

/// Writes past the test harness's capture, so a skip shows in the log.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn kit() -> Option<PathBuf> {
    let dir = std::env::var_os("SOFTIOMMU_GUEST_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/guest-kit"));
    let have = dir.join("vmlinuz").is_file()
        && dir.join("initramfs.cpio.gz").is_file()
        && Command::new("qemu-system-x86_64")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if have {
        return Some(dir);
    }
    let msg = format!(
        "SKIPPED guest test: no guest kit at {} (run scripts/guest-kit.sh as root to install QEMU, a Debian kernel and busybox)",
        dir.display()
    );
    if std::env::var("SOFTIOMMU_GUEST_REQUIRED").is_ok_and(|v| v == "1") {
        panic!("{msg} — and SOFTIOMMU_GUEST_REQUIRED=1");
    }
    say(&msg);
    None
}

/// The fields of the guest's result line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

fn sha256_file(p: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(p)
        .output()
        .expect("sha256sum runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

struct Run {
    result: String,
    report: SessionReport,
    disk_sha: String,
    seconds: f64,
}

fn run_guest(kit: &Path, strict: bool) -> Run {
    let dir =
        std::env::temp_dir().join(format!("softiommu-guest-{}-{}", std::process::id(), strict));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(DISK_MIB << 20)
        .unwrap();
    let sock = dir.join("vhost.sock");
    let backend = BlkBackend::open(BlkBackendConfig::new(&disk)).expect("backend opens");
    let listener = UnixListener::bind(&sock).unwrap();
    let (rep_tx, rep_rx) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((s, _)) = listener.accept() {
            let _ = rep_tx.send(backend.serve(s));
        }
    });
    let mode = if strict {
        "iommu.strict=1"
    } else {
        "iommu.strict=0"
    };
    let append = format!(
        "console=ttyS0 quiet intel_iommu=on {mode} softiommu.test=blk softiommu.mib={DISK_MIB} panic=-1"
    );
    let started = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-m", "512M", "-smp", "1", "-nodefaults", "-no-user-config"])
        .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
        .args(["-M", "q35,memory-backend=mem"])
        .args(["-device", "intel-iommu,intremap=off,device-iotlb=on"])
        .args(["-device", "pcie-root-port,id=rp1,bus=pcie.0,chassis=1"])
        .arg("-chardev")
        .arg(format!("socket,id=vu0,path={}", sock.display()))
        .args([
            "-device",
            "vhost-user-blk-pci,chardev=vu0,bus=rp1,num-queues=1,iommu_platform=on,ats=on,disable-legacy=on",
        ])
        .arg("-kernel")
        .arg(kit.join("vmlinuz"))
        .arg("-initrd")
        .arg(kit.join("initramfs.cpio.gz"))
        .args(["-append", &append])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64 starts");
    let (line_tx, line_rx) = mpsc::channel::<String>();
    let out = qemu.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = line_tx.send(l);
        }
    });
    let err = qemu.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        BufReader::new(err)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut result = None;
    let mut console = Vec::new();
    while result.is_none() {
        let left = GUEST_DEADLINE.saturating_sub(started.elapsed());
        match line_rx.recv_timeout(left) {
            Ok(l) => {
                if l.contains("guest-dmesg:") {
                    say(&l);
                }
                if l.starts_with("SOFTIOMMU-GUEST-RESULT") {
                    result = Some(l.clone());
                }
                console.push(l);
            }
            Err(_) => break,
        }
    }
    // The guest powers off after its line; don't wait forever if it does not.
    let exit_by = Instant::now() + Duration::from_secs(30);
    while qemu.try_wait().ok().flatten().is_none() && Instant::now() < exit_by {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = qemu.kill();
    let _ = qemu.wait();
    let seconds = started.elapsed().as_secs_f64();
    let qemu_err = errs.join().unwrap_or_default();
    let Some(result) = result else {
        panic!(
            "no result line from the guest within {GUEST_DEADLINE:?}; console tail:\n{}\nqemu stderr:\n{}",
            console[console.len().saturating_sub(40)..].join("\n"),
            qemu_err.join("\n")
        );
    };
    let report = rep_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the back-end's session ends when QEMU exits");
    let disk_sha = sha256_file(&disk);
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        result,
        report,
        disk_sha,
        seconds,
    }
}

fn check(strict: bool) {
    let _one = ONE_GUEST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(kit) = kit() else { return };
    let r = run_guest(&kit, strict);
    let mode = if strict { "strict" } else { "lazy" };
    let s = &r.report.iotlb;
    say(&r.result);
    say(&format!(
        "guest-blk {mode}: {:.1} s; back-end requests={} iotlb updates={} invalidations={} misses={} miss_timeouts={} refused={} flushes={} evictions={} rejected_messages={}",
        r.seconds,
        r.report.blk.requests,
        s.updates,
        s.invalidations,
        s.misses,
        s.miss_timeouts,
        s.refused,
        s.flushes,
        s.evictions,
        r.report.rejected_messages
    ));
    assert_eq!(field(&r.result, "ok"), Some("1"), "{}", r.result);
    assert_eq!(
        field(&r.result, "dmar"),
        Some("1"),
        "DMAR: IOMMU enabled missing: {}",
        r.result
    );
    assert_eq!(field(&r.result, "policy"), Some(mode), "{}", r.result);
    let written = field(&r.result, "written").unwrap();
    assert_eq!(field(&r.result, "read"), Some(written), "{}", r.result);
    assert_eq!(
        r.disk_sha, written,
        "the backing file differs from what the guest wrote"
    );
    assert!(
        matches!(r.report.end, SessionEnd::Disconnected),
        "{:?}",
        r.report.end
    );
    assert_eq!(
        r.report.rejected_messages, 0,
        "{:?}",
        r.report.last_rejection
    );
    assert!(
        s.updates > 0 && s.misses > 0 && s.invalidations > 0,
        "{s:?}"
    );
    assert_eq!(s.miss_timeouts, 0, "{s:?}");
    assert_eq!(r.report.blk.io_errors, 0, "{:?}", r.report.blk);
}

#[test]
fn guest_blk_strict_checksums_match() {
    check(true);
}

#[test]
fn guest_blk_lazy_checksums_match() {
    check(false);
}
