//! A real Linux guest under QEMU (TCG) for our vhost-user-blk back-end, or
//! for QEMU's own virtio-blk as the anchor: the guest kit
//! (`scripts/guest-kit.sh`) located, QEMU started with the topology a
//! vhost back-end needs behind an intel-iommu (device behind a
//! `pcie-root-port`, `ats=on`, `device-iotlb=on`, memfd-backed shared
//! memory), the guest's one result line read from the serial console, all
//! within a bound.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use softiommu_virtio::net::{wire, WireConfig, WireStats};

use crate::net::{NetBackend, NetBackendConfig};
use crate::peer::{run_peer, PeerConfig, PeerReport};
use crate::sched::{
    load_average, process_threads, set_thread_nice, set_threads_nice, thread_nice, Sched,
    IO_THREAD_NICE_DELTA,
};

/// The nice value for the threads a miss round trip waits on.
fn io_nice() -> i32 {
    (thread_nice() + IO_THREAD_NICE_DELTA).max(-20)
}
use crate::session::{BlkBackend, BlkBackendConfig, SessionReport};

/// The prefix of the guest's result line.
pub const RESULT_PREFIX: &str = "SOFTIOMMU-GUEST-RESULT";
/// The prefix of the guest's timing marks, which the host timestamps as
/// they arrive (`read-start`, `read-end` around a disk run's read).
pub const MARK_PREFIX: &str = "guest-mark:";
/// The prefix of the guest's echoed kernel log lines (version, DMAR, policy).
pub const DMESG_PREFIX: &str = "guest-dmesg:";

/// Why a guest run did not happen or gave no result.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// No kit at the place looked.
    #[error("no guest kit at {dir} (run scripts/guest-kit.sh as root to install QEMU, a Debian kernel and busybox)")]
    NotInstalled {
        /// Where it was looked for.
        dir: String,
    },
    /// QEMU, the back-end or the disk could not be set up.
    #[error("guest set-up failed: {0}")]
    Setup(String),
    /// The guest printed no result line within the bound.
    #[error("no result line from the guest within {seconds} s; console tail:\n{console}\nqemu stderr:\n{stderr}")]
    NoResult {
        /// The bound.
        seconds: u64,
        /// The last console lines.
        console: String,
        /// QEMU's standard error.
        stderr: String,
    },
}

/// The guest kit: a kernel and an initramfs built by `scripts/guest-kit.sh`.
#[derive(Debug, Clone)]
pub struct GuestKit {
    /// Its directory.
    pub dir: PathBuf,
}

impl GuestKit {
    /// The kit at `$SOFTIOMMU_GUEST_KIT`, else `target/guest-kit` of this
    /// checkout, if its files are there and `qemu-system-x86_64` runs.
    pub fn find() -> Result<Self, GuestError> {
        let dir = std::env::var_os("SOFTIOMMU_GUEST_KIT")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/guest-kit")
            });
        let have = dir.join("vmlinuz").is_file()
            && dir.join("initramfs.cpio.gz").is_file()
            && Command::new("qemu-system-x86_64")
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        if have {
            Ok(Self { dir })
        } else {
            Err(GuestError::NotInstalled {
                dir: dir.display().to_string(),
            })
        }
    }

    /// The kernel release the kit was built with.
    pub fn kernel_release(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("kernel-release"))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

/// Which device serves the guest's disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestDevice {
    /// Our vhost-user-blk back-end, in this process.
    VhostBlk,
    /// QEMU's own virtio-blk (the anchor).
    QemuBlk,
}

/// The guest IOMMU driver's invalidation mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IommuMode {
    /// `iommu.strict=1`: an invalidation per unmap.
    Strict,
    /// `iommu.strict=0`: flush queues, batched invalidations.
    Lazy,
}

impl IommuMode {
    /// `"strict"` or `"lazy"`, as the guest kernel names it.
    pub fn name(self) -> &'static str {
        match self {
            IommuMode::Strict => "strict",
            IommuMode::Lazy => "lazy",
        }
    }
}

/// What the host checks a guest run against.
#[derive(Debug)]
pub enum HostSide {
    /// A disk run: SHA-256 of the backing file after the run.
    Disk {
        /// Hex digest.
        sha256: String,
    },
    /// A network run: what the host's TCP peer saw, and the wire's counters.
    Net {
        /// The peer's report.
        peer: PeerReport,
        /// The wire's counters (A: the back-end, B: the peer).
        wire: WireStats,
    },
}

/// One guest run's outcome, disk or network.
#[derive(Debug)]
pub struct GuestRun {
    /// The device that served the guest: `virtio-blk`, `virtio-net`
    /// (ours) or `qemu-virtio-blk` (QEMU's own, the anchor).
    pub device: &'static str,
    /// The guest IOMMU driver's mode.
    pub mode: IommuMode,
    /// The guest's result line.
    pub result: String,
    /// Its `key=value` fields.
    pub fields: BTreeMap<String, String>,
    /// The kernel log lines the guest echoed (version, DMAR, policy).
    pub dmesg: Vec<String>,
    /// The back-end's session report (our devices only).
    pub report: Option<SessionReport>,
    /// What the host saw.
    pub host: HostSide,
    /// Wall time of the whole run (boot to power-off), seconds.
    pub wall_seconds: f64,
    /// The host around the run: its load and QEMU's threads.
    pub sched: RunSched,
}

/// The host around one guest run: the load average when QEMU started and
/// when the result line came, and what the scheduler did to QEMU's
/// threads from boot to the result line (summed by thread name).
#[derive(Debug, Clone, Default)]
pub struct RunSched {
    /// One-minute load average at boot.
    pub load_start: Option<f64>,
    /// One-minute load average at the result line.
    pub load_end: Option<f64>,
    /// The guest's read of a disk run timed by the host, seconds: from its
    /// `read-start` mark line to its `read-end` (console lines, so a
    /// few milliseconds late each; `None` without both marks).
    pub host_read_seconds: Option<f64>,
    /// The nice value QEMU's main thread (and our back-end's message
    /// thread) ran at, [`IO_THREAD_NICE_DELTA`] below the harness's own;
    /// `None` if not permitted (they ran at the harness's).
    pub io_nice: Option<i32>,
    /// QEMU's threads by name: `qemu-system-x86` (the main loop, which
    /// answers a vhost back-end's misses), `CPU 0/TCG` (the guest), `worker`
    /// (its block thread pool, the anchor's I/O).
    pub qemu_threads: Vec<(String, Sched)>,
}

impl GuestRun {
    /// A field of the result line.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// Whether the data went through intact: a disk run's guest read back
    /// what it wrote and the backing file holds it; a network run's peer
    /// received exactly what the guest sent and the guest exactly what
    /// the peer sent (SHA-256 each way).
    pub fn checksum_ok(&self) -> bool {
        if self.field("ok") != Some("1") {
            return false;
        }
        match &self.host {
            HostSide::Disk { sha256 } => {
                let w = self.field("written");
                w.is_some() && self.field("read") == w && w == Some(sha256.as_str())
            }
            HostSide::Net { peer, .. } => {
                let (sent, got) = (self.field("sent"), self.field("got"));
                sent.is_some()
                    && sent == peer.received_sha256.as_deref()
                    && got.is_some()
                    && got == peer.sent_sha256.as_deref()
            }
        }
    }

    /// The guest's timed phase, in TCG guest time (an emulated CPU, only
    /// ratios mean anything), seconds: a disk run's read back, a network
    /// run's send plus receive.
    pub fn guest_seconds(&self) -> Option<f64> {
        let ms = |k: &str| self.field(k)?.parse::<f64>().ok();
        let total = match self.host {
            HostSide::Disk { .. } => ms("read_ms")?,
            HostSide::Net { .. } => ms("send_ms")? + ms("recv_ms")?,
        };
        Some(total / 1000.0)
    }

    /// The I/Os our back-end served: a disk run's completed requests, a
    /// network run's frames (each one descriptor chain: a TCP segment,
    /// an acknowledgement or an ARP frame), transmitted plus received.
    /// Zero without a session report (the anchor).
    pub fn ios(&self) -> u64 {
        self.report.as_ref().map_or(0, |r| match self.host {
            HostSide::Disk { .. } => r.blk.requests,
            HostSide::Net { .. } => r.net.tx_frames + r.net.rx_frames,
        })
    }

    /// CPU time of the back-end's queue threads and of its message
    /// handling, nanoseconds (zero without a session report).
    pub fn device_cpu_ns(&self) -> (u64, u64) {
        self.report.as_ref().map_or((0, 0), |r| {
            (r.blk.worker_cpu_ns + r.net.worker_cpu_ns, r.session_cpu_ns)
        })
    }

    /// The backing file's digest (a disk run).
    pub fn disk_sha256(&self) -> Option<&str> {
        match &self.host {
            HostSide::Disk { sha256 } => Some(sha256),
            HostSide::Net { .. } => None,
        }
    }

    /// What the TCP peer saw (a network run).
    pub fn peer(&self) -> Option<&PeerReport> {
        match &self.host {
            HostSide::Net { peer, .. } => Some(peer),
            HostSide::Disk { .. } => None,
        }
    }
}

fn sha256_file(p: &Path) -> Result<String, GuestError> {
    let out = Command::new("sha256sum")
        .arg(p)
        .output()
        .map_err(|e| GuestError::Setup(format!("sha256sum: {e}")))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string())
}

/// Boots the kit's guest with a `disk_mib` MiB disk on `device`, the guest
/// IOMMU driver in `mode`; the guest writes a random pattern, drops its
/// caches and reads it back. Bounded by `deadline`.
pub fn run_blk(
    kit: &GuestKit,
    device: GuestDevice,
    mode: IommuMode,
    disk_mib: u64,
    deadline: Duration,
) -> Result<GuestRun, GuestError> {
    let setup = |e: std::io::Error| GuestError::Setup(e.to_string());
    let dir = std::env::temp_dir().join(format!(
        "softiommu-guest-{}-{:?}-{}",
        std::process::id(),
        device,
        mode.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(setup)?;
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(disk_mib << 20))
        .map_err(setup)?;
    let sock = dir.join("vhost.sock");
    let mut session = None;
    let mut qemu = machine();
    match device {
        GuestDevice::VhostBlk => {
            let backend = BlkBackend::open(BlkBackendConfig::new(&disk))
                .map_err(|e| GuestError::Setup(e.to_string()))?;
            let listener = UnixListener::bind(&sock).map_err(setup)?;
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                if let Ok((s, _)) = listener.accept() {
                    // Our side of a miss round trip, as QEMU's main loop.
                    let _ = set_thread_nice(0, io_nice());
                    let _ = tx.send(backend.serve(s));
                }
            });
            session = Some(rx);
            qemu.arg("-chardev")
                .arg(format!("socket,id=vu0,path={}", sock.display()))
                .args([
                    "-device",
                    "vhost-user-blk-pci,chardev=vu0,bus=rp1,num-queues=1,iommu_platform=on,ats=on,disable-legacy=on",
                ]);
        }
        GuestDevice::QemuBlk => {
            qemu.arg("-drive").arg(anchor_drive(&disk));
            qemu                .args([
                    "-device",
                    "virtio-blk-pci,drive=d0,bus=rp1,num-queues=1,iommu_platform=on,ats=on,disable-legacy=on",
                ]);
        }
    }
    let b = boot(
        kit,
        qemu,
        mode,
        &format!("softiommu.test=blk softiommu.mib={disk_mib}"),
        deadline,
    )?;
    let report = session.and_then(|rx| rx.recv_timeout(Duration::from_secs(30)).ok());
    let disk_sha256 = sha256_file(&disk)?;
    let _ = std::fs::remove_dir_all(&dir);
    let (result, fields, dmesg, wall_seconds, sched) = b.into_result(deadline)?;
    Ok(GuestRun {
        device: match device {
            GuestDevice::VhostBlk => "virtio-blk",
            GuestDevice::QemuBlk => "qemu-virtio-blk",
        },
        mode,
        result,
        fields,
        dmesg,
        report,
        host: HostSide::Disk {
            sha256: disk_sha256,
        },
        wall_seconds,
        sched,
    })
}

/// The anchor's `-drive`: the host page cache serves both devices. Our
/// back-end reads and writes its file with pread/pwrite, so the anchor
/// does too (`cache=writeback`, QEMU's default; a flush is an fdatasync
/// either way). With `cache=none` the anchor's reads went to the host's
/// disk, shared with the machine's other work, and its time followed that
/// disk's load rather than the device's.
fn anchor_drive(disk: &Path) -> String {
    format!(
        "file={},if=none,id=d0,format=raw,cache=writeback,aio=threads",
        disk.display()
    )
}

/// QEMU's machine: TCG, 512 MiB of memfd-backed shared memory, an
/// intel-iommu with device IOTLBs, and a `pcie-root-port` `rp1` for the
/// device under test (on `pcie.0` it would be conventional PCI, without ATS).
fn machine() -> Command {
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-accel",
        "tcg",
        "-m",
        "512M",
        "-smp",
        "1",
        "-nodefaults",
        "-no-user-config",
        // Threads named by role (`CPU 0/TCG`, `worker`), for the host's
        // per-thread figures.
        "-name",
        "guest,debug-threads=on",
    ])
    .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
    .args(["-M", "q35,memory-backend=mem"])
    .args(["-device", "intel-iommu,intremap=off,device-iotlb=on"])
    .args(["-device", "pcie-root-port,id=rp1,bus=pcie.0,chassis=1"]);
    qemu
}

/// The console of one finished guest run.
struct Booted {
    result: Option<String>,
    console: Vec<String>,
    dmesg: Vec<String>,
    wall_seconds: f64,
    stderr: String,
    sched: RunSched,
}

impl Booted {
    /// The result line and its fields, or why there is none.
    #[allow(clippy::type_complexity)]
    fn into_result(
        self,
        deadline: Duration,
    ) -> Result<(String, BTreeMap<String, String>, Vec<String>, f64, RunSched), GuestError> {
        let Some(result) = self.result else {
            return Err(GuestError::NoResult {
                seconds: deadline.as_secs(),
                console: self.console[self.console.len().saturating_sub(40)..].join("\n"),
                stderr: self.stderr,
            });
        };
        let fields = result
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok((result, fields, self.dmesg, self.wall_seconds, self.sched))
    }
}

/// Starts `qemu` (its machine and device arguments given) with the kit's
/// kernel and `test_args` on the command line, and reads the console until
/// the result line or `deadline`; the guest is killed if it does not power off.
fn boot(
    kit: &GuestKit,
    mut qemu: Command,
    mode: IommuMode,
    test_args: &str,
    deadline: Duration,
) -> Result<Booted, GuestError> {
    let strict = match mode {
        IommuMode::Strict => "iommu.strict=1",
        IommuMode::Lazy => "iommu.strict=0",
    };
    let append = format!("console=ttyS0 quiet intel_iommu=on {strict} {test_args} panic=-1");
    qemu.arg("-kernel")
        .arg(kit.dir.join("vmlinuz"))
        .arg("-initrd")
        .arg(kit.dir.join("initramfs.cpio.gz"))
        .args(["-append", &append])
        .args([
            "-display",
            "none",
            "-serial",
            "stdio",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // QEMU dies with the thread that starts it (which kills and reaps it
    // before it returns): a lab killed outright leaves no guest running.
    // SAFETY: prctl(PR_SET_PDEATHSIG) between fork and exec is async-
    // signal-safe and allocates nothing.
    unsafe {
        use std::os::unix::process::CommandExt;
        qemu.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let mut sched = RunSched {
        load_start: load_average(),
        ..RunSched::default()
    };
    let mut child = qemu
        .spawn()
        .map_err(|e| GuestError::Setup(format!("qemu-system-x86_64: {e}")))?;
    // QEMU's main loop (its thread id is the process id) answers a vhost
    // back-end's misses and injects every device's interrupts under TCG:
    // above its vCPU thread, for either device alike. Threads it creates
    // inherit its value: the vCPU's is put back once the guest prints
    // (its thread exists by then).
    let base_nice = thread_nice();
    sched.io_nice = set_thread_nice(child.id(), io_nice())
        .ok()
        .map(|()| io_nice());
    let mut vcpu_reset = sched.io_nice.is_none();
    let (line_tx, line_rx) = mpsc::channel::<String>();
    let out = child.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = line_tx.send(l);
        }
    });
    let err = child.stderr.take().expect("piped");
    let errs = std::thread::spawn(move || {
        BufReader::new(err)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut result = None;
    let mut read_start = None;
    let mut console = Vec::new();
    let mut dmesg = Vec::new();
    while result.is_none() {
        let left = deadline.saturating_sub(started.elapsed());
        let Ok(l) = line_rx.recv_timeout(left) else {
            break;
        };
        if l.starts_with(DMESG_PREFIX) {
            dmesg.push(l.clone());
        }
        if !vcpu_reset {
            vcpu_reset = set_threads_nice(child.id(), "CPU ", base_nice) > 0;
        }
        if let Some(mark) = l.strip_prefix(MARK_PREFIX).map(str::trim) {
            match mark {
                "read-start" => read_start = Some(Instant::now()),
                "read-end" => {
                    sched.host_read_seconds = read_start.map(|t| t.elapsed().as_secs_f64())
                }
                _ => {}
            }
        }
        if l.starts_with(RESULT_PREFIX) {
            result = Some(l.clone());
            sched.load_end = load_average();
            sched.qemu_threads = process_threads(child.id());
        }
        console.push(l);
    }
    // The guest powers off after its line; a guest that does not is killed.
    let exit_by = Instant::now() + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < exit_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let wall_seconds = started.elapsed().as_secs_f64();
    let stderr = errs.join().unwrap_or_default().join("\n");
    Ok(Booted {
        result,
        console,
        dmesg,
        wall_seconds,
        stderr,
        sched,
    })
}

/// Boots the kit's guest with our vhost-user-net back-end on a wire whose
/// other end is a smoltcp TCP peer (10.0.2.2); the guest (10.0.2.15) sends
/// `mib` MiB of a random pattern to the peer's sink and receives `mib` MiB
/// of the peer's pattern, checksumming both. Bounded by `deadline`.
pub fn run_net(
    kit: &GuestKit,
    mode: IommuMode,
    mib: u64,
    deadline: Duration,
) -> Result<GuestRun, GuestError> {
    let setup = |e: std::io::Error| GuestError::Setup(e.to_string());
    let dir = std::env::temp_dir().join(format!(
        "softiommu-guest-{}-net-{}",
        std::process::id(),
        mode.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(setup)?;
    let sock = dir.join("vhost-net.sock");
    let (a, b, wire_stats) = wire(WireConfig::default());
    let ncfg = NetBackendConfig::default();
    let mac = ncfg.mac;
    let backend = NetBackend::new(ncfg, a).map_err(|e| GuestError::Setup(e.to_string()))?;
    let listener = UnixListener::bind(&sock).map_err(setup)?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((s, _)) = listener.accept() {
            let _ = tx.send(backend.serve(s));
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let pcfg = PeerConfig::new(mib << 20, deadline);
    let peer = {
        let stop = stop.clone();
        std::thread::spawn(move || run_peer(&pcfg, b, stop))
    };
    let mut qemu = machine();
    let m = mac;
    qemu.arg("-chardev")
        .arg(format!("socket,id=vu0,path={}", sock.display()))
        .args(["-netdev", "vhost-user,id=n0,chardev=vu0"])
        .arg("-device")
        .arg(format!(
            "virtio-net-pci,netdev=n0,bus=rp1,iommu_platform=on,ats=on,disable-legacy=on,vectors=0,mac={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        ));
    let booted = boot(
        kit,
        qemu,
        mode,
        &format!("softiommu.test=net softiommu.mib={mib}"),
        deadline,
    );
    stop.store(true, Ordering::Release);
    let peer = peer
        .join()
        .map_err(|_| GuestError::Setup("the TCP peer panicked".into()))?
        .map_err(setup)?;
    let report = rx.recv_timeout(Duration::from_secs(30)).ok();
    let _ = std::fs::remove_dir_all(&dir);
    let (result, fields, dmesg, wall_seconds, sched) = booted?.into_result(deadline)?;
    Ok(GuestRun {
        device: "virtio-net",
        mode,
        result,
        fields,
        dmesg,
        report,
        host: HostSide::Net {
            peer,
            wire: wire_stats,
        },
        wall_seconds,
        sched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionEnd;
    use crate::space::IotlbStats;

    fn run(host: HostSide, line: &str, report: Option<SessionReport>) -> GuestRun {
        GuestRun {
            device: "virtio-blk",
            mode: IommuMode::Strict,
            result: line.to_string(),
            fields: line
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            dmesg: Vec::new(),
            report,
            host,
            wall_seconds: 1.0,
            sched: RunSched::default(),
        }
    }

    fn report() -> SessionReport {
        SessionReport {
            end: SessionEnd::Disconnected,
            iotlb: IotlbStats::default(),
            blk: crate::blk::BlkStats {
                requests: 7,
                worker_cpu_ns: 3,
                ..Default::default()
            },
            net: crate::net::NetStats {
                tx_frames: 5,
                rx_frames: 6,
                worker_cpu_ns: 4,
                ..Default::default()
            },
            rejected_messages: 0,
            last_rejection: None,
            acked_features: 0,
            session_cpu_ns: 10,
            fds: Default::default(),
            timing: Default::default(),
        }
    }

    /// The anchor reads through the host page cache as our back-end does,
    /// not past it to the shared disk.
    #[test]
    fn the_anchor_reads_through_the_host_page_cache_like_ours() {
        let d = anchor_drive(Path::new("/t/disk.img"));
        assert!(d.contains("cache=writeback"), "{d}");
        assert!(!d.contains("cache=none"), "{d}");
        assert!(d.starts_with("file=/t/disk.img,"), "{d}");
    }

    /// One result type serves both devices: each is checked against its
    /// own host side, times its own phase and counts its own I/Os.
    #[test]
    fn one_run_type_checks_disk_and_net_against_their_host_side() {
        let disk = |sha: &str| HostSide::Disk { sha256: sha.into() };
        let line = "ok=1 written=aa read=aa read_ms=1500";
        let d = run(disk("aa"), line, Some(report()));
        assert!(d.checksum_ok());
        assert_eq!(d.guest_seconds(), Some(1.5));
        assert_eq!(d.ios(), 7);
        assert_eq!(d.device_cpu_ns(), (7, 10));
        assert_eq!(d.disk_sha256(), Some("aa"));
        assert!(d.peer().is_none());
        assert!(!run(disk("bb"), line, None).checksum_ok());
        assert!(!run(disk("aa"), "ok=0 written=aa read=aa", None).checksum_ok());

        let (_, _, wire) = wire(WireConfig::default());
        let peer = |rx: &str, tx: &str| PeerReport {
            received: 1,
            received_sha256: Some(rx.into()),
            sent: 1,
            sent_sha256: Some(tx.into()),
            timed_out: false,
        };
        let line = "ok=1 sent=s1 got=g1 send_ms=250 recv_ms=750";
        let net = |rx: &str, tx: &str| HostSide::Net {
            peer: peer(rx, tx),
            wire: wire.clone(),
        };
        let n = run(net("s1", "g1"), line, Some(report()));
        assert!(n.checksum_ok());
        assert_eq!(n.guest_seconds(), Some(1.0));
        assert_eq!(n.ios(), 11);
        assert_eq!(n.peer().map(|p| p.received), Some(1));
        assert!(n.disk_sha256().is_none());
        assert!(!run(net("s1", "other"), line, None).checksum_ok());
        assert!(!run(net("other", "g1"), line, None).checksum_ok());
        assert_eq!(run(net("s1", "g1"), line, None).ios(), 0);
    }
}
