//! One front-end session: the vhost-user messages QEMU sends a block
//! back-end, each checked, answered (with a reply-ack where asked), and
//! turned into the ring's lifecycle: the worker starts when the ring has
//! its size, addresses and kick; `GET_VRING_BASE`, a reset or the
//! front-end going away stops it (waiting misses cancelled, worker joined)
//! and drops the device IOTLB — the firmware's identity entries from
//! before the guest enabled its IOMMU must not outlive the rings.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use softiommu_virtio::spec::blk as sb;
use softiommu_virtio::transport::QueueLayout;

use crate::blk::{BlkCounters, BlkStats, Worker};
use crate::disk::Disk;
use crate::error::{ConfigError, MsgError, SessionError};
use crate::memtable::MemTable;
use crate::net::NetStats;
use crate::proto::{self, iotlb as m, pf, req, vf, FLAG_NEED_REPLY};
use crate::queue::{FdFaults, Queue, WorkerShared};
use crate::sched::Sched;
use crate::space::{DmaSpace, IotlbStats};
use crate::wire::{self, Msg};

/// Largest ring this back-end takes (virtio 1.2 §2.7: at most 32768).
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// The virtio features offered.
pub const FEATURES: u64 = vf::VERSION_1
    | vf::ACCESS_PLATFORM
    | vf::PROTOCOL_FEATURES
    | (1 << sb::F_SEG_MAX)
    | (1 << sb::F_SIZE_MAX)
    | (1 << sb::F_BLK_SIZE)
    | (1 << sb::F_FLUSH);
/// The protocol features offered (an IOMMU needs reply-ack and the back-end channel).
pub const PROTOCOL_FEATURES: u64 = pf::REPLY_ACK | pf::BACKEND_REQ | pf::CONFIG | pf::RESET_DEVICE;
/// Segments per request announced in `seg_max`.
pub(crate) const SEG_MAX: u32 = 126;
/// Bytes per segment announced in `size_max`: 64 KiB (Linux's default
/// segment size), so `seg_max` full segments (8,064 KiB) fit the largest
/// request the back-end serves (`blk::MAX_REQUEST_BYTES`, 8 MiB).
pub(crate) const SIZE_MAX: u32 = 64 << 10;
/// Largest config space read answered.
pub(crate) const CONFIG_MAX: usize = 256;

/// What a session needs of the device behind it.
pub(crate) trait VhostDevice: Sync {
    /// The virtio features offered.
    fn features(&self) -> u64;
    /// The protocol features offered (QEMU refuses `CONFIG` from a net back-end).
    fn protocol_features(&self) -> u64 {
        PROTOCOL_FEATURES
    }
    /// Features a ring may not start without (the driver's layout of
    /// what the rings carry depends on them).
    fn required_features(&self) -> u64 {
        0
    }
    /// The number of queues.
    fn queues(&self) -> u32;
    /// The config space (at most [`CONFIG_MAX`] bytes; the rest reads 0).
    fn config(&self, cfg: &mut [u8; CONFIG_MAX]);
    /// Starts the worker of queue `index` on `q`; it returns its next avail index.
    fn spawn(&self, index: u32, q: Queue) -> std::io::Result<JoinHandle<u16>>;
}

/// How a block back-end is set up.
#[derive(Debug, Clone)]
pub struct BlkBackendConfig {
    /// The backing file (read-write, a positive multiple of 512 bytes).
    pub disk: PathBuf,
    /// How long a device access waits for the front-end to answer a miss.
    pub miss_timeout: Duration,
    /// Entries the device IOTLB holds before it is emptied.
    pub iotlb_capacity: usize,
}

impl BlkBackendConfig {
    /// Bounds of `miss_timeout`, in milliseconds.
    pub const MISS_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 1..=60_000;
    /// Bounds of `iotlb_capacity`.
    pub const IOTLB_CAPACITY: std::ops::RangeInclusive<usize> = 1..=1 << 20;

    /// Defaults for `disk`: a 2 s miss bound, 16,384 entries.
    pub fn new(disk: impl Into<PathBuf>) -> Self {
        Self {
            disk: disk.into(),
            miss_timeout: Duration::from_secs(2),
            iotlb_capacity: 16384,
        }
    }
}

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The front-end closed the socket.
    Disconnected,
    /// The stream became unreadable or the socket failed.
    Failed(SessionError),
}

/// What a session did.
#[derive(Debug)]
pub struct SessionReport {
    /// How it ended (the rings are stopped and the worker joined either way).
    pub end: SessionEnd,
    /// The device IOTLB's counters.
    pub iotlb: IotlbStats,
    /// The block device's counters (zero for a net back-end).
    pub blk: BlkStats,
    /// The net device's counters (zero for a block back-end).
    pub net: NetStats,
    /// Messages refused (answered with a failure ack where one was asked).
    pub rejected_messages: u64,
    /// The last refusal, for the log.
    pub last_rejection: Option<MsgError>,
    /// The virtio features the front-end acknowledged.
    pub acked_features: u64,
    /// CPU time of the session's message handling, nanoseconds (the
    /// queue threads' is in `blk.worker_cpu_ns`).
    pub session_cpu_ns: u64,
    /// What the front-end's descriptors did that the back-end would not wait for.
    pub fds: FdStats,
    /// Where the socket thread's time went.
    pub timing: SessionTiming,
}

/// Where the socket thread's time went: the IOTLB round trips a miss
/// costs (the front-end's answer, our ack) and what the host's scheduler
/// did to the thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionTiming {
    /// IOTLB messages handled (update or invalidation, acked where asked).
    pub iotlb_messages: u64,
    /// Their time from read whole to ack sent, summed, nanoseconds.
    pub iotlb_handle_ns: u64,
    /// IOTLB messages read while misses were outstanding at the ack of
    /// the IOTLB message before them: the front-end's side of a round
    /// trip (its main loop, translation and send, and its scheduling).
    pub frontend_turns: u64,
    /// Their time from the previous ack sent to this message read,
    /// summed, nanoseconds.
    pub frontend_turn_ns: u64,
    /// Of them, those that took over a millisecond.
    pub frontend_turns_over_1ms: u64,
    /// Their time, summed, nanoseconds.
    pub frontend_turn_over_1ms_ns: u64,
    /// The socket thread's scheduler figures over the session.
    pub socket: Sched,
}

/// What a front-end's kick and call descriptors did that the back-end
/// would not wait for, and what a stop could not finish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FdStats {
    /// Signals the back-end could not deliver without waiting: the call
    /// eventfd's counter was full (the driver was signalled already).
    pub call_dropped: u64,
    /// Kick descriptors dropped because they reported hang-up or an
    /// error (the ring then polled at the kick bound, never spun).
    pub kick_hangups: u64,
    /// Rings that stopped serving because the driver made a head past the
    /// descriptor table available (served again once started again).
    pub bad_heads: u64,
    /// Queue threads that did not end within their bound when stopped,
    /// even interrupted: left behind, their ring never started again in
    /// the session.
    pub wedged_rings: u64,
}

/// A vhost-user-blk back-end over one disk; serves sessions one at a time.
#[derive(Debug)]
pub struct BlkBackend {
    cfg: BlkBackendConfig,
    disk: Arc<Disk>,
}

impl BlkBackend {
    /// Checks the configuration and opens the disk.
    pub fn open(cfg: BlkBackendConfig) -> Result<Self, ConfigError> {
        let ms = u64::try_from(cfg.miss_timeout.as_millis()).unwrap_or(u64::MAX);
        if !BlkBackendConfig::MISS_TIMEOUT_MS.contains(&ms) {
            return Err(ConfigError::Range {
                option: "miss timeout (ms)",
                range: "1..=60000",
                value: ms,
            });
        }
        if !BlkBackendConfig::IOTLB_CAPACITY.contains(&cfg.iotlb_capacity) {
            return Err(ConfigError::Range {
                option: "IOTLB capacity",
                range: "1..=1048576",
                value: cfg.iotlb_capacity as u64,
            });
        }
        let disk = Arc::new(Disk::open(&cfg.disk)?);
        Ok(Self { cfg, disk })
    }

    /// The disk's capacity in sectors.
    pub fn sectors(&self) -> u64 {
        self.disk.sectors()
    }

    /// Serves one front-end until it goes away; the back-end is reusable after.
    pub fn serve(&self, sock: UnixStream) -> SessionReport {
        let counters = Arc::new(BlkCounters::default());
        let dev = BlkDevice {
            disk: self.disk.clone(),
            counters: counters.clone(),
        };
        let mut r = serve_device(&dev, sock, self.cfg.iotlb_capacity, self.cfg.miss_timeout);
        r.blk = counters.snapshot();
        r
    }
}

struct BlkDevice {
    disk: Arc<Disk>,
    counters: Arc<BlkCounters>,
}

impl VhostDevice for BlkDevice {
    fn features(&self) -> u64 {
        FEATURES
    }

    fn queues(&self) -> u32 {
        1
    }

    fn config(&self, cfg: &mut [u8; CONFIG_MAX]) {
        cfg[sb::CFG_CAPACITY..sb::CFG_CAPACITY + 8]
            .copy_from_slice(&self.disk.sectors().to_le_bytes());
        cfg[sb::CFG_SIZE_MAX..sb::CFG_SIZE_MAX + 4].copy_from_slice(&SIZE_MAX.to_le_bytes());
        cfg[sb::CFG_SEG_MAX..sb::CFG_SEG_MAX + 4].copy_from_slice(&SEG_MAX.to_le_bytes());
        cfg[sb::CFG_BLK_SIZE..sb::CFG_BLK_SIZE + 4].copy_from_slice(&512u32.to_le_bytes());
        cfg[sb::CFG_NUM_QUEUES..sb::CFG_NUM_QUEUES + 2].copy_from_slice(&1u16.to_le_bytes());
    }

    fn spawn(&self, _index: u32, q: Queue) -> std::io::Result<JoinHandle<u16>> {
        let w = Worker::new(q, self.disk.clone(), self.counters.clone());
        std::thread::Builder::new()
            .name("vhost-blk-queue0".into())
            .spawn(move || w.run())
    }
}

/// How long a front-end may take to finish a message it began, or to take
/// a reply (one socket buffer's worth), before the session ends with
/// [`SessionError::Stalled`]. A policy bound, not a model of anything:
/// QEMU writes a message whole and reads each reply it asked for at once,
/// so only a stuck or hostile front-end comes near it.
pub(crate) const MESSAGE_BOUND: Duration = Duration::from_secs(10);

/// Serves one front-end session for `dev` until it goes away; the device
/// counters are the caller's to add.
pub(crate) fn serve_device(
    dev: &dyn VhostDevice,
    sock: UnixStream,
    iotlb_capacity: usize,
    miss_timeout: Duration,
) -> SessionReport {
    let space = Arc::new(DmaSpace::new(iotlb_capacity, miss_timeout));
    serve_space(dev, sock, space, miss_timeout, MESSAGE_BOUND)
}

/// [`serve_device`] over a given space, with a message bound (see
/// [`MESSAGE_BOUND`]).
fn serve_space(
    dev: &dyn VhostDevice,
    sock: UnixStream,
    space: Arc<DmaSpace>,
    miss_timeout: Duration,
    message_bound: Duration,
) -> SessionReport {
    let message_bound = message_bound.max(Duration::from_millis(1));
    let cpu0 = crate::blk::thread_cpu_ns();
    let sched0 = Sched::this_thread();
    let mut s = Session {
        dev,
        sock: &sock,
        space,
        acked: 0,
        protocol: 0,
        rings: (0..dev.queues()).map(|_| Ring::default()).collect(),
        rejected: 0,
        last_rejection: None,
        faults: Arc::new(FdFaults::default()),
        ran: false,
        wedged: 0,
        left_behind: Vec::new(),
        join_bound: miss_timeout + Duration::from_secs(1),
        timing: SessionTiming::default(),
        acked_iotlb_at: None,
        message_bound,
    };
    // A reply the front-end does not take within the bound ends the
    // session (see `Session::run`), as a message it does not finish does.
    let end = match sock.set_write_timeout(Some(message_bound)) {
        Ok(()) => s.run(),
        Err(e) => SessionEnd::Failed(SessionError::Io(e)),
    };
    s.stop_all();
    SessionReport {
        end,
        iotlb: s.space.stats(),
        blk: BlkStats::default(),
        net: NetStats::default(),
        rejected_messages: s.rejected,
        last_rejection: s.last_rejection,
        acked_features: s.acked,
        session_cpu_ns: crate::blk::thread_cpu_ns().saturating_sub(cpu0),
        fds: FdStats {
            call_dropped: s.faults.call_dropped.load(Ordering::Relaxed),
            kick_hangups: s.faults.kick_hangups.load(Ordering::Relaxed),
            bad_heads: s.faults.bad_heads.load(Ordering::Relaxed),
            wedged_rings: s.wedged,
        },
        timing: SessionTiming {
            socket: Sched::this_thread().since(&sched0),
            ..s.timing
        },
    }
}

#[derive(Debug, Default)]
struct Ring {
    num: u16,
    addrs: Option<(u64, u64, u64)>,
    base: u16,
    kick: Option<Option<OwnedFd>>,
    call: Option<Arc<OwnedFd>>,
    enabled: bool,
    running: Option<(JoinHandle<u16>, Arc<WorkerShared>)>,
    /// Its worker did not end when stopped (see [`FdStats::wedged_rings`]).
    wedged: bool,
}

struct Session<'a> {
    dev: &'a dyn VhostDevice,
    sock: &'a UnixStream,
    space: Arc<DmaSpace>,
    acked: u64,
    protocol: u64,
    rings: Vec<Ring>,
    rejected: u64,
    last_rejection: Option<MsgError>,
    faults: Arc<FdFaults>,
    /// A ring has run since the session began (a later start after every
    /// ring stopped drops what the IOTLB took meanwhile).
    ran: bool,
    wedged: u64,
    /// Workers that did not end when stopped and still run: while one
    /// does, nothing it may still reach changes under it (memory table,
    /// whether rings translate through the IOTLB, a device reset).
    left_behind: Vec<JoinHandle<u16>>,
    /// How long a stopped worker has to end before it is interrupted.
    join_bound: Duration,
    timing: SessionTiming,
    /// When the last IOTLB message was acked while misses were outstanding.
    acked_iotlb_at: Option<Instant>,
    /// The bound on a begun message's rest and on a reply's write.
    message_bound: Duration,
}

/// Checks that a front-end's descriptor is of the kind `name` needs.
fn fd_kind(
    name: &'static str,
    fd: &OwnedFd,
    check: fn(&OwnedFd) -> Result<(), String>,
) -> Result<(), MsgError> {
    check(fd).map_err(|reason| MsgError::BadFdKind { name, reason })
}

fn u64_of(name: &'static str, p: &[u8]) -> Result<u64, MsgError> {
    let b: [u8; 8] = p.try_into().map_err(|_| MsgError::BadSize {
        name,
        size: p.len(),
        want: "8".into(),
    })?;
    Ok(u64::from_le_bytes(b))
}

/// The `(offset, size)` of a `GET_CONFIG` or `SET_CONFIG` payload
/// (`offset`, `size`, `flags` as le32, then `size` bytes), checked against
/// the payload's length and the configuration space.
fn config_range(name: &'static str, p: &[u8]) -> Result<(usize, usize), MsgError> {
    if p.len() < 12 {
        return Err(MsgError::BadSize {
            name,
            size: p.len(),
            want: "12 + size".into(),
        });
    }
    let off = u32::from_le_bytes(p[0..4].try_into().expect("4")) as usize;
    let size = u32::from_le_bytes(p[4..8].try_into().expect("4")) as usize;
    if p.len() != 12 + size || off.checked_add(size).is_none_or(|e| e > CONFIG_MAX) {
        return Err(MsgError::Invalid {
            name,
            what: format!(
                "offset {off} size {size} (payload {}, space {CONFIG_MAX})",
                p.len()
            ),
        });
    }
    Ok((off, size))
}

fn state_of(name: &'static str, p: &[u8]) -> Result<(u32, u32), MsgError> {
    let v = u64_of(name, p)?;
    Ok((v as u32, (v >> 32) as u32))
}

impl Session<'_> {
    /// The ring `index` names, if the device has it.
    fn queue(&self, name: &'static str, index: u32) -> Result<usize, MsgError> {
        let queues = self.rings.len() as u32;
        if index >= queues {
            return Err(MsgError::BadQueue {
                name,
                index,
                queues,
            });
        }
        Ok(index as usize)
    }

    fn run(&mut self) -> SessionEnd {
        loop {
            let msg = match wire::recv(self.sock, self.message_bound) {
                Ok(Some(m)) => m,
                Ok(None) => return SessionEnd::Disconnected,
                Err(SessionError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return SessionEnd::Disconnected
                }
                Err(SessionError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return SessionEnd::Disconnected
                }
                Err(e) => return SessionEnd::Failed(e),
            };
            let read_at = Instant::now();
            let (code, need) = (msg.request, msg.flags & FLAG_NEED_REPLY != 0);
            let iotlb = code == req::IOTLB_MSG;
            if let Some(acked) = self.acked_iotlb_at.take().filter(|_| iotlb) {
                let t = &mut self.timing;
                let ns = read_at.saturating_duration_since(acked).as_nanos() as u64;
                t.frontend_turns += 1;
                t.frontend_turn_ns = t.frontend_turn_ns.saturating_add(ns);
                if ns > 1_000_000 {
                    t.frontend_turns_over_1ms += 1;
                    t.frontend_turn_over_1ms_ns = t.frontend_turn_over_1ms_ns.saturating_add(ns);
                }
            }
            // Every ack follows its work: a front-end that sends an
            // update, waits for its ack and then kicks a queue must find
            // the translation in place (the kick reaches a worker thread,
            // not this one, so an ack sent before the update is taken
            // would race it into a miss).
            let r = self.handle(msg);
            let sent = match &r {
                Ok(Some(payload)) => wire::reply(self.sock, code, payload),
                Ok(None) if need => wire::ack(self.sock, code, 0),
                Ok(None) => Ok(()),
                // A refused GET_* is answered with an empty payload: QEMU
                // checks each reply's size and reports the request failed
                // (a u64 1 would read as features 1 or vring base 0).
                Err(_) if is_get(code) => wire::reply(self.sock, code, &[]),
                Err(_) if need => wire::ack(self.sock, code, 1),
                Err(_) => Ok(()),
            };
            if let Err(e) = r {
                self.rejected += 1;
                eprintln!(
                    "softiommu-vhost: refused {}: {e}",
                    proto::request_name(code)
                );
                self.last_rejection = Some(e);
            }
            if let Err(e) = sent {
                return SessionEnd::Failed(if wire::is_timeout(&e) {
                    SessionError::Stalled {
                        what: "a reply",
                        bound_ms: self.message_bound.as_millis() as u64,
                    }
                } else {
                    SessionError::Io(e)
                });
            }
            if iotlb {
                let now = Instant::now();
                let t = &mut self.timing;
                t.iotlb_messages += 1;
                let ns = now.saturating_duration_since(read_at).as_nanos() as u64;
                t.iotlb_handle_ns = t.iotlb_handle_ns.saturating_add(ns);
                // The next IOTLB message is the front-end's turn of a
                // round trip only while a miss waits for it.
                if self.space.misses_outstanding() {
                    self.acked_iotlb_at = Some(now);
                }
            }
        }
    }

    fn handle(&mut self, msg: Msg) -> Result<Option<Vec<u8>>, MsgError> {
        let Msg {
            request,
            payload: p,
            mut fds,
            ..
        } = msg;
        let name = proto::request_name(request);
        let reply = |v: u64| Ok(Some(v.to_le_bytes().to_vec()));
        let no_fds = |fds: &Vec<OwnedFd>| -> Result<(), MsgError> {
            if fds.is_empty() {
                Ok(())
            } else {
                Err(MsgError::BadFds {
                    name,
                    got: fds.len(),
                    want: 0,
                })
            }
        };
        if !matches!(
            request,
            req::SET_MEM_TABLE
                | req::SET_BACKEND_REQ_FD
                | req::SET_VRING_KICK
                | req::SET_VRING_CALL
                | req::SET_VRING_ERR
        ) {
            no_fds(&fds)?;
        }
        // Requests that carry no payload (vhost-user.rst: "Back-end
        // payload: N/A" ... the front-end's likewise): a body is a framing
        // error of the front-end, refused as such.
        if matches!(
            request,
            req::GET_FEATURES
                | req::SET_OWNER
                | req::RESET_OWNER
                | req::RESET_DEVICE
                | req::GET_PROTOCOL_FEATURES
                | req::GET_QUEUE_NUM
        ) && !p.is_empty()
        {
            return Err(MsgError::BadSize {
                name,
                size: p.len(),
                want: "0".into(),
            });
        }
        match request {
            req::GET_FEATURES => reply(self.dev.features()),
            req::SET_FEATURES => {
                let f = u64_of(name, &p)?;
                self.refuse_while_left_behind(name)?;
                let offered = self.dev.features();
                if f & !offered != 0 {
                    return Err(MsgError::Invalid {
                        name,
                        what: format!("features {:#x} not offered", f & !offered),
                    });
                }
                let running = self.rings.iter().any(|r| r.running.is_some());
                if running && (f ^ self.acked) & vf::ACCESS_PLATFORM != 0 {
                    // The rings translate through the IOTLB or not: that
                    // cannot change under a running worker.
                    return Err(MsgError::Invalid {
                        name,
                        what: "ACCESS_PLATFORM changed while a ring runs".into(),
                    });
                }
                self.acked = f;
                self.space.set_iommu(f & vf::ACCESS_PLATFORM != 0);
                Ok(None)
            }
            req::SET_OWNER => Ok(None),
            req::RESET_OWNER | req::RESET_DEVICE => {
                // Refused before anything stops: a refused reset leaves
                // the running rings running.
                self.refuse_while_left_behind(name)?;
                self.stop_all();
                for r in &mut self.rings {
                    *r = Ring {
                        wedged: r.wedged,
                        ..Ring::default()
                    };
                }
                self.acked = 0;
                self.space.set_iommu(false);
                Ok(None)
            }
            req::GET_PROTOCOL_FEATURES => reply(self.dev.protocol_features()),
            req::SET_PROTOCOL_FEATURES => {
                let f = u64_of(name, &p)?;
                let offered = self.dev.protocol_features();
                if f & !offered != 0 {
                    return Err(MsgError::Invalid {
                        name,
                        what: format!("protocol features {:#x} not offered", f & !offered),
                    });
                }
                self.protocol = f;
                Ok(None)
            }
            req::GET_QUEUE_NUM => reply(u64::from(self.dev.queues())),
            req::SET_BACKEND_REQ_FD => {
                if fds.len() != 1 {
                    return Err(MsgError::BadFds {
                        name,
                        got: fds.len(),
                        want: 1,
                    });
                }
                let fd = fds.remove(0);
                fd_kind(name, &fd, crate::peerfd::check_unix_stream)?;
                self.space.set_channel(Some(UnixStream::from(fd)));
                Ok(None)
            }
            req::SET_MEM_TABLE => {
                self.refuse_while_left_behind(name)?;
                let t = MemTable::map(&p, &fds)?;
                self.space.set_memory(t);
                Ok(None)
            }
            req::SET_VRING_NUM => {
                let (i, num) = state_of(name, &p)?;
                let q = self.queue(name, i)?;
                self.refuse_while_running(name, q)?;
                if num == 0 || num > u32::from(MAX_QUEUE_SIZE) || !num.is_power_of_two() {
                    return Err(MsgError::Invalid {
                        name,
                        what: format!("ring size {num} (a power of two in 1..={MAX_QUEUE_SIZE})"),
                    });
                }
                self.rings[q].num = num as u16;
                Ok(None)
            }
            req::SET_VRING_ADDR => {
                if p.len() != 40 {
                    return Err(MsgError::BadSize {
                        name,
                        size: p.len(),
                        want: "40".into(),
                    });
                }
                let i = u32::from_le_bytes(p[0..4].try_into().expect("4"));
                let q = self.queue(name, i)?;
                self.refuse_while_running(name, q)?;
                let f = |k: usize| u64::from_le_bytes(p[k..k + 8].try_into().expect("8"));
                let (d, u, a) = (f(8), f(16), f(24));
                if d % 16 != 0 || a % 2 != 0 || u % 4 != 0 {
                    return Err(MsgError::Invalid {
                        name,
                        what: format!("misaligned ring: desc {d:#x}, avail {a:#x}, used {u:#x}"),
                    });
                }
                self.rings[q].addrs = Some((d, a, u));
                Ok(None)
            }
            req::SET_VRING_BASE => {
                let (i, base) = state_of(name, &p)?;
                let q = self.queue(name, i)?;
                self.refuse_while_running(name, q)?;
                if base > 0xffff {
                    return Err(MsgError::Invalid {
                        name,
                        what: format!("base {base} > 65535"),
                    });
                }
                self.rings[q].base = base as u16;
                Ok(None)
            }
            req::GET_VRING_BASE => {
                let (i, _) = state_of(name, &p)?;
                let q = self.queue(name, i)?;
                self.stop_ring(q);
                self.rings[q].kick = None;
                self.rings[q].enabled = false;
                if self.rings[q].wedged {
                    // Its worker never said where it stopped: a base would
                    // be a guess (a front-end resuming from it could serve
                    // completed chains again).
                    return Err(MsgError::Invalid {
                        name,
                        what: format!("queue {q}'s thread did not end when stopped"),
                    });
                }
                let v = u64::from(i) | u64::from(self.rings[q].base) << 32;
                Ok(Some(v.to_le_bytes().to_vec()))
            }
            req::SET_VRING_KICK | req::SET_VRING_CALL | req::SET_VRING_ERR => {
                let v = u64_of(name, &p)?;
                let q = self.queue(name, (v & 0xff) as u32)?;
                let nofd = v & 0x100 != 0;
                let want = usize::from(!nofd);
                if fds.len() != want {
                    return Err(MsgError::BadFds {
                        name,
                        got: fds.len(),
                        want,
                    });
                }
                let fd = fds.pop();
                match (&fd, request) {
                    (Some(fd), req::SET_VRING_KICK) => {
                        fd_kind(name, fd, crate::peerfd::check_kick_eventfd)?
                    }
                    (Some(fd), req::SET_VRING_CALL) => {
                        fd_kind(name, fd, crate::peerfd::check_eventfd)?
                    }
                    _ => {}
                }
                match request {
                    req::SET_VRING_KICK => {
                        // Everything checked before the running ring is
                        // touched: a refusal leaves it running as it was.
                        self.check_start(q)?;
                        self.stop_ring(q);
                        self.rings[q].kick = Some(fd);
                        self.start_ring(q)?;
                    }
                    req::SET_VRING_CALL => {
                        let fd = fd.map(Arc::new);
                        match &self.rings[q].running {
                            Some((_, sh)) => {
                                *sh.call.lock().unwrap_or_else(|p| p.into_inner()) = fd
                            }
                            None => self.rings[q].call = fd,
                        }
                    }
                    _ => {}
                }
                Ok(None)
            }
            req::SET_VRING_ENABLE => {
                let (i, on) = state_of(name, &p)?;
                let q = self.queue(name, i)?;
                if on > 1 {
                    return Err(MsgError::Invalid {
                        name,
                        what: format!("enable value {on}"),
                    });
                }
                self.rings[q].enabled = on == 1;
                if let Some((_, sh)) = &self.rings[q].running {
                    sh.enabled.store(on == 1, Ordering::Release);
                }
                Ok(None)
            }
            req::IOTLB_MSG => {
                let b: &[u8; m::MSG_LEN] =
                    p.as_slice().try_into().map_err(|_| MsgError::BadSize {
                        name,
                        size: p.len(),
                        want: m::MSG_LEN.to_string(),
                    })?;
                self.space.iotlb_message(b)?;
                Ok(None)
            }
            req::GET_CONFIG => self.get_config(&p),
            req::SET_CONFIG => self.set_config(&p),
            code => Err(MsgError::Unsupported { code }),
        }
    }

    /// A `SET_CONFIG`: checked as `GET_CONFIG` is, then refused — no
    /// field of the devices' configuration is writable (virtio-blk's
    /// `writeback` exists only with `VIRTIO_BLK_F_CONFIG_WCE`, not
    /// offered), and acknowledging a write that changes nothing would
    /// tell the front-end it took effect.
    fn set_config(&self, p: &[u8]) -> Result<Option<Vec<u8>>, MsgError> {
        let name = "SET_CONFIG";
        let (off, size) = config_range(name, p)?;
        Err(MsgError::Invalid {
            name,
            what: format!("offset {off} size {size}: the configuration has no writable field"),
        })
    }

    /// Refuses `name`, a change of ring `q`'s set-up, while its worker
    /// runs: the worker holds the ring as it started, so the change would
    /// be acknowledged and then lost at the next stop (vhost-user.rst
    /// sets a ring up before its `SET_VRING_KICK`, after a
    /// `GET_VRING_BASE` stopped it).
    fn refuse_while_running(&self, name: &'static str, q: usize) -> Result<(), MsgError> {
        if self.rings[q].running.is_some() {
            return Err(MsgError::Invalid {
                name,
                what: format!("queue {q} is running (stop it with GET_VRING_BASE first)"),
            });
        }
        Ok(())
    }

    fn get_config(&self, p: &[u8]) -> Result<Option<Vec<u8>>, MsgError> {
        let name = "GET_CONFIG";
        let (off, size) = config_range(name, p)?;
        let mut cfg = [0u8; CONFIG_MAX];
        self.dev.config(&mut cfg);
        let mut out = p[..12].to_vec();
        out.extend_from_slice(&cfg[off..off + size]);
        Ok(Some(out))
    }

    /// Refuses, before anything changes, a `SET_VRING_KICK` that would
    /// start ring `q` with what it cannot run on: no size, no memory, a
    /// layout the split ring refuses, or a ring whose worker never ended.
    fn check_start(&self, q: usize) -> Result<(), MsgError> {
        let name = "SET_VRING_KICK";
        let r = &self.rings[q];
        if r.wedged {
            return Err(MsgError::Invalid {
                name,
                what: format!("queue {q}'s thread did not end when stopped"),
            });
        }
        let Some((desc, avail, used)) = r.addrs else {
            return Ok(());
        };
        if r.num == 0 {
            return Err(MsgError::Invalid {
                name,
                what: "ring started before SET_VRING_NUM".into(),
            });
        }
        if !self.space.has_memory() {
            return Err(MsgError::Invalid {
                name,
                what: "ring started before SET_MEM_TABLE".into(),
            });
        }
        let missing = self.dev.required_features() & !self.acked;
        if missing != 0 {
            return Err(MsgError::Invalid {
                name,
                what: format!("ring started without required features {missing:#x}"),
            });
        }
        let layout = QueueLayout {
            index: q as u16,
            size: r.num,
            desc,
            avail,
            used,
        };
        softiommu_virtio::transport::DeviceQueue::new(layout, self.acked).map_err(|e| {
            MsgError::Invalid {
                name,
                what: format!("the ring cannot start: {e}"),
            }
        })?;
        // Without ACCESS_PLATFORM the areas are the front-end's virtual
        // addresses, known now: one outside the shared memory is refused
        // here, not acknowledged and then faulted on every poll. (Under
        // it they are IOVAs, translated through the IOTLB on access.)
        if self.acked & vf::ACCESS_PLATFORM == 0 {
            for (what, addr, len) in layout.areas() {
                if !self.space.covers_uaddr(addr, len) {
                    return Err(MsgError::Invalid {
                        name,
                        what: format!(
                            "queue {q}'s {what} at {addr:#x} (+{len:#x}) is outside the shared memory"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Starts ring `q`'s worker once the ring has everything it needs
    /// ([`Session::check_start`] passed). The first start after every
    /// ring stopped drops what the IOTLB took while none ran (a late
    /// answer to a miss the stop cancelled — an identity entry QEMU gave
    /// the firmware — must not outlive the stop).
    fn start_ring(&mut self, q: usize) -> Result<(), MsgError> {
        let r = &self.rings[q];
        let (Some((desc, avail, used)), Some(_)) = (r.addrs, r.kick.as_ref()) else {
            return Ok(());
        };
        if self.ran && self.rings.iter().all(|r| r.running.is_none()) {
            self.space.flush();
        }
        let r = &mut self.rings[q];
        let kick = r.kick.as_mut().expect("checked above");
        // Without protocol features a ring starts enabled (vhost-user.rst, "Ring states").
        let enabled = r.enabled || self.acked & vf::PROTOCOL_FEATURES == 0;
        let shared = Arc::new(WorkerShared {
            stop: AtomicBool::new(false),
            enabled: AtomicBool::new(enabled),
            call: Mutex::new(r.call.take()),
            faults: self.faults.clone(),
        });
        // A copy of the kick, to give the ring back if the thread cannot start.
        let kick_copy = kick.as_ref().and_then(|k| k.try_clone().ok());
        let queue = Queue::new(
            self.space.clone(),
            QueueLayout {
                index: q as u16,
                size: r.num,
                desc,
                avail,
                used,
            },
            self.acked,
            kick,
            shared.clone(),
            r.base,
        );
        let queue = match queue {
            Ok(queue) => queue,
            Err(e) => {
                // Refused before anything started (check_start makes the
                // same check): the ring keeps its call.
                r.call = shared.call.lock().unwrap_or_else(|p| p.into_inner()).take();
                return Err(MsgError::Invalid {
                    name: "SET_VRING_KICK",
                    what: format!("the ring cannot start: {e}"),
                });
            }
        };
        self.space.resume();
        match self.dev.spawn(q as u32, queue) {
            Ok(h) => {
                self.rings[q].running = Some((h, shared));
                self.ran = true;
                Ok(())
            }
            Err(e) => {
                // The ring keeps its call and kick for a later SET_VRING_KICK.
                let r = &mut self.rings[q];
                r.call = shared.call.lock().unwrap_or_else(|p| p.into_inner()).take();
                r.kick = Some(kick_copy);
                Err(MsgError::Invalid {
                    name: "SET_VRING_KICK",
                    what: format!("cannot start the queue thread: {e}"),
                })
            }
        }
    }

    /// Stops ring `q`'s worker (waiting misses cancelled), keeps its avail
    /// index as the ring's base, and drops the device IOTLB. Another ring's
    /// worker whose miss was cancelled meanwhile retries it. The join is
    /// bounded ([`crate::peerfd::join_bounded`]): a worker that does not
    /// end even interrupted is left behind, its ring wedged (its base kept
    /// as it was, never started again in this session).
    fn stop_ring(&mut self, q: usize) {
        if let Some((h, shared)) = self.rings[q].running.take() {
            shared.stop.store(true, Ordering::Release);
            self.space.cancel();
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::peerfd::join_bounded(h, self.join_bound)
            })) {
                Ok(Ok(last)) => self.rings[q].base = last,
                Ok(Err(left)) => {
                    eprintln!("softiommu-vhost: queue {q}'s thread did not stop; left behind");
                    self.rings[q].wedged = true;
                    self.wedged += 1;
                    self.left_behind.push(left);
                }
                Err(_) => {
                    // It never said where it stopped: as a thread left
                    // behind, no base is answered (an old one would make
                    // the front-end serve completed chains again).
                    eprintln!("softiommu-vhost: queue {q}'s thread panicked");
                    self.rings[q].wedged = true;
                    self.wedged += 1;
                }
            }
            self.rings[q].call = shared.call.lock().unwrap_or_else(|p| p.into_inner()).take();
            self.space.flush();
            if self.rings.iter().any(|r| r.running.is_some()) {
                self.space.resume();
            }
        }
    }

    /// Refuses `name` while a worker left behind still runs: it may
    /// still reach guest memory through the space, so the memory table,
    /// the IOMMU switch and a device reset must not change under it (an
    /// access of a worker that wakes after `set_iommu(false)` would take
    /// an IOVA for an address). Workers that ended meanwhile are joined.
    fn refuse_while_left_behind(&mut self, name: &'static str) -> Result<(), MsgError> {
        let (ended, alive): (Vec<_>, Vec<_>) = std::mem::take(&mut self.left_behind)
            .into_iter()
            .partition(|h| h.is_finished());
        for h in ended {
            let _ = h.join();
        }
        self.left_behind = alive;
        if self.left_behind.is_empty() {
            Ok(())
        } else {
            Err(MsgError::Invalid {
                name,
                what: format!(
                    "{} queue thread(s) left behind still run",
                    self.left_behind.len()
                ),
            })
        }
    }

    /// Stops every ring.
    fn stop_all(&mut self) {
        for q in 0..self.rings.len() {
            self.stop_ring(q);
        }
    }
}

fn is_get(code: u32) -> bool {
    matches!(
        code,
        req::GET_FEATURES
            | req::GET_PROTOCOL_FEATURES
            | req::GET_QUEUE_NUM
            | req::GET_VRING_BASE
            | req::GET_CONFIG
    )
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::testing;

    /// A device whose next queue thread fails to start when asked to; it
    /// records whether each queue it was given had a call descriptor.
    struct Flaky {
        fail_next: AtomicBool,
        had_call: Mutex<Vec<bool>>,
    }

    impl VhostDevice for Flaky {
        fn features(&self) -> u64 {
            vf::VERSION_1
        }

        fn queues(&self) -> u32 {
            1
        }

        fn config(&self, _: &mut [u8; CONFIG_MAX]) {}

        fn spawn(&self, _: u32, q: Queue) -> std::io::Result<JoinHandle<u16>> {
            let call = q.worker_shared().call.lock().unwrap().is_some();
            self.had_call.lock().unwrap().push(call);
            if self.fail_next.swap(false, Ordering::Relaxed) {
                return Err(std::io::Error::other("no thread for you"));
            }
            let base = q.last_avail();
            std::thread::Builder::new().spawn(move || {
                drop(q);
                base
            })
        }
    }

    fn eventfd() -> OwnedFd {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// A miss bound past what fits in 64 bits of milliseconds is refused,
    /// not truncated into the range (2^64 + 616 ms read as 616 ms, and the
    /// first miss's deadline overflowed `Instant`).
    #[test]
    fn a_miss_timeout_too_long_for_u64_milliseconds_is_refused() {
        for secs in [18_428_297_329_635_842_065u64, 18_446_744_073_709_552] {
            let mut cfg = BlkBackendConfig::new("/nonexistent-disk");
            cfg.miss_timeout = Duration::from_secs(secs);
            assert!(matches!(
                BlkBackend::open(cfg),
                Err(ConfigError::Range {
                    option: "miss timeout (ms)",
                    ..
                })
            ));
        }
    }

    /// A queue thread that cannot be started leaves the ring its call
    /// descriptor: the next SET_VRING_KICK starts the worker with it.
    /// (Before: the call was dropped with the failed start, and the ring
    /// ran without ever signalling the driver.)
    #[test]
    fn a_queue_thread_that_cannot_start_leaves_the_ring_its_call() {
        let dev = Flaky {
            fail_next: AtomicBool::new(true),
            had_call: Mutex::new(Vec::new()),
        };
        let (fe, be) = UnixStream::pair().unwrap();
        fe.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let ack = |code: u32, payload: &[u8], fds: &[i32]| -> u64 {
            testing::send(&fe, code, payload, fds, true).unwrap();
            let (c, _, p) = testing::recv(&fe).unwrap();
            assert_eq!(c, code);
            u64::from_le_bytes(p.try_into().unwrap())
        };
        std::thread::scope(|s| {
            let session = s.spawn(|| serve_device(&dev, be, 64, Duration::from_millis(100)));
            const UA: u64 = 0x7f00_0000_0000;
            let (mem, _) = testing::shared_memory(c"flaky", 64 << 10).unwrap();
            let mut t = vec![0u8; 8 + 32];
            t[0..4].copy_from_slice(&1u32.to_le_bytes());
            t[16..24].copy_from_slice(&(64u64 << 10).to_le_bytes());
            t[24..32].copy_from_slice(&UA.to_le_bytes());
            assert_eq!(ack(req::SET_MEM_TABLE, &t, &[mem.as_raw_fd()]), 0);
            assert_eq!(ack(req::SET_VRING_NUM, &(8u64 << 32).to_le_bytes(), &[]), 0);
            let mut a = vec![0u8; 8];
            for v in [UA, UA + 0x200, UA + 0x100, 0] {
                a.extend_from_slice(&v.to_le_bytes());
            }
            assert_eq!(ack(req::SET_VRING_ADDR, &a, &[]), 0);
            let (call, kick1, kick2) = (eventfd(), eventfd(), eventfd());
            let zero = 0u64.to_le_bytes();
            assert_eq!(ack(req::SET_VRING_CALL, &zero, &[call.as_raw_fd()]), 0);
            assert_eq!(ack(req::SET_VRING_KICK, &zero, &[kick1.as_raw_fd()]), 1);
            assert_eq!(ack(req::SET_VRING_KICK, &zero, &[kick2.as_raw_fd()]), 0);
            fe.shutdown(std::net::Shutdown::Both).unwrap();
            let r = session.join().unwrap();
            assert_eq!(r.rejected_messages, 1);
            assert!(matches!(
                r.last_rejection,
                Some(MsgError::Invalid {
                    name: "SET_VRING_KICK",
                    ref what
                }) if what.contains("cannot start the queue thread")
            ));
        });
        assert_eq!(*dev.had_call.lock().unwrap(), [true, true]);
    }

    /// A device whose queue thread ignores its stop flag until `release`
    /// (asleep in a call the interrupt does not end: `thread::sleep`
    /// retries on `EINTR`).
    struct Stuck {
        release: Arc<AtomicBool>,
    }

    impl VhostDevice for Stuck {
        fn features(&self) -> u64 {
            vf::VERSION_1 | vf::ACCESS_PLATFORM
        }

        fn queues(&self) -> u32 {
            1
        }

        fn config(&self, _: &mut [u8; CONFIG_MAX]) {}

        fn spawn(&self, _: u32, q: Queue) -> std::io::Result<JoinHandle<u16>> {
            let release = self.release.clone();
            std::thread::Builder::new().spawn(move || {
                while !release.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                q.last_avail()
            })
        }
    }

    /// A queue thread that does not end when its ring stops is left
    /// behind, and while it runs nothing it may still reach changes under
    /// it: `GET_VRING_BASE` is refused (its base would be a guess), and so
    /// are `SET_MEM_TABLE`, `SET_FEATURES` (the IOMMU switch) and
    /// `RESET_OWNER`; once it has ended they are taken again. (Before: the
    /// base was answered, and `RESET_OWNER` switched the space to
    /// untranslated addresses under the still-running thread.)
    #[test]
    fn while_a_left_behind_thread_runs_nothing_it_reaches_changes() {
        let release = Arc::new(AtomicBool::new(false));
        let dev = Stuck {
            release: release.clone(),
        };
        let (fe, be) = UnixStream::pair().unwrap();
        fe.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let call = |code: u32, payload: &[u8], fds: &[i32]| -> Vec<u8> {
            testing::send(&fe, code, payload, fds, true).unwrap();
            let (c, _, p) = testing::recv(&fe).unwrap();
            assert_eq!(c, code);
            p
        };
        let ack = |code: u32, payload: &[u8], fds: &[i32]| -> u64 {
            u64::from_le_bytes(call(code, payload, fds).try_into().unwrap())
        };
        /// Shuts the front-end's socket when dropped, so a failed assertion
        /// ends the session (and the scope) instead of hanging on it.
        struct Hangup<'a>(&'a UnixStream);
        impl Drop for Hangup<'_> {
            fn drop(&mut self) {
                let _ = self.0.shutdown(std::net::Shutdown::Both);
            }
        }
        std::thread::scope(|s| {
            let session = s.spawn(|| serve_device(&dev, be, 64, Duration::from_millis(100)));
            let _hangup = Hangup(&fe);
            const UA: u64 = 0x7f00_0000_0000;
            let (mem, _) = testing::shared_memory(c"stuck", 64 << 10).unwrap();
            let mut t = vec![0u8; 8 + 32];
            t[0..4].copy_from_slice(&1u32.to_le_bytes());
            t[16..24].copy_from_slice(&(64u64 << 10).to_le_bytes());
            t[24..32].copy_from_slice(&UA.to_le_bytes());
            assert_eq!(ack(req::SET_MEM_TABLE, &t, &[mem.as_raw_fd()]), 0);
            let features = (vf::VERSION_1 | vf::ACCESS_PLATFORM).to_le_bytes();
            assert_eq!(ack(req::SET_FEATURES, &features, &[]), 0);
            assert_eq!(ack(req::SET_VRING_NUM, &(8u64 << 32).to_le_bytes(), &[]), 0);
            let mut a = vec![0u8; 8];
            for v in [0x1000u64, 0x1200, 0x1100, 0] {
                a.extend_from_slice(&v.to_le_bytes());
            }
            assert_eq!(ack(req::SET_VRING_ADDR, &a, &[]), 0);
            let kick = eventfd();
            let zero = 0u64.to_le_bytes();
            assert_eq!(ack(req::SET_VRING_KICK, &zero, &[kick.as_raw_fd()]), 0);
            // The stop cannot end the thread: no base.
            assert!(call(req::GET_VRING_BASE, &zero, &[]).is_empty());
            assert_ne!(ack(req::SET_MEM_TABLE, &t, &[mem.as_raw_fd()]), 0);
            assert_ne!(ack(req::SET_FEATURES, &vf::VERSION_1.to_le_bytes(), &[]), 0);
            assert_ne!(ack(req::RESET_OWNER, &[], &[]), 0);
            // It ends: the session takes them again.
            release.store(true, Ordering::Release);
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(ack(req::SET_MEM_TABLE, &t, &[mem.as_raw_fd()]), 0);
            assert_eq!(ack(req::RESET_OWNER, &[], &[]), 0);
            fe.shutdown(std::net::Shutdown::Both).unwrap();
            let r = session.join().unwrap();
            assert_eq!(r.rejected_messages, 4);
            assert_eq!(r.fds.wedged_rings, 1);
        });
    }

    /// Two rings: queue 0's thread ignores its stop until `release` (as
    /// [`Stuck`]'s), queue 1's ends when stopped and says so in `ended`.
    struct OneStuck {
        release: Arc<AtomicBool>,
        ended: Arc<AtomicBool>,
    }

    impl VhostDevice for OneStuck {
        fn features(&self) -> u64 {
            vf::VERSION_1 | vf::ACCESS_PLATFORM
        }

        fn queues(&self) -> u32 {
            2
        }

        fn config(&self, _: &mut [u8; CONFIG_MAX]) {}

        fn spawn(&self, index: u32, q: Queue) -> std::io::Result<JoinHandle<u16>> {
            let (release, ended) = (self.release.clone(), self.ended.clone());
            std::thread::Builder::new().spawn(move || {
                let shared = q.worker_shared().clone();
                while !(if index == 0 {
                    release.load(Ordering::Acquire)
                } else {
                    shared.stop.load(Ordering::Acquire)
                }) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if index == 1 {
                    ended.store(true, Ordering::Release);
                }
                q.last_avail()
            })
        }
    }

    /// A reset refused because a thread left behind still runs changes
    /// nothing: the other ring keeps running. (Before: every ring was
    /// stopped, and the IOTLB flushed, before the refusal.)
    #[test]
    fn a_refused_reset_leaves_the_running_rings_running() {
        let release = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let dev = OneStuck {
            release: release.clone(),
            ended: ended.clone(),
        };
        let (fe, be) = UnixStream::pair().unwrap();
        fe.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let call = |code: u32, payload: &[u8], fds: &[i32]| -> Vec<u8> {
            testing::send(&fe, code, payload, fds, true).unwrap();
            let (c, _, p) = testing::recv(&fe).unwrap();
            assert_eq!(c, code);
            p
        };
        let ack = |code: u32, payload: &[u8], fds: &[i32]| -> u64 {
            u64::from_le_bytes(call(code, payload, fds).try_into().unwrap())
        };
        std::thread::scope(|s| {
            let session = s.spawn(|| serve_device(&dev, be, 64, Duration::from_millis(100)));
            let (mem, _) = testing::shared_memory(c"onestuck", 64 << 10).unwrap();
            let mut t = vec![0u8; 8 + 32];
            t[0..4].copy_from_slice(&1u32.to_le_bytes());
            t[16..24].copy_from_slice(&(64u64 << 10).to_le_bytes());
            t[24..32].copy_from_slice(&0x7f00_0000_0000u64.to_le_bytes());
            assert_eq!(ack(req::SET_MEM_TABLE, &t, &[mem.as_raw_fd()]), 0);
            let features = (vf::VERSION_1 | vf::ACCESS_PLATFORM).to_le_bytes();
            assert_eq!(ack(req::SET_FEATURES, &features, &[]), 0);
            let kicks = [eventfd(), eventfd()];
            for q in 0..2u64 {
                assert_eq!(
                    ack(req::SET_VRING_NUM, &(q | 8 << 32).to_le_bytes(), &[]),
                    0
                );
                let mut a = q.to_le_bytes().to_vec();
                for v in [0x1000u64, 0x1200, 0x1100, 0] {
                    a.extend_from_slice(&(v + q * 0x1000).to_le_bytes());
                }
                assert_eq!(ack(req::SET_VRING_ADDR, &a, &[]), 0);
                let k = kicks[q as usize].as_raw_fd();
                assert_eq!(ack(req::SET_VRING_KICK, &q.to_le_bytes(), &[k]), 0);
            }
            // Queue 0's thread is left behind; queue 1 runs.
            assert!(call(req::GET_VRING_BASE, &0u64.to_le_bytes(), &[]).is_empty());
            assert_ne!(ack(req::RESET_OWNER, &[], &[]), 0);
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                !ended.load(Ordering::Acquire),
                "the refused reset stopped queue 1"
            );
            // Stopped on its own request, it ends and reports its base.
            assert_eq!(
                call(req::GET_VRING_BASE, &1u64.to_le_bytes(), &[]),
                1u64.to_le_bytes()
            );
            assert!(ended.load(Ordering::Acquire));
            release.store(true, Ordering::Release);
            fe.shutdown(std::net::Shutdown::Both).unwrap();
            let r = session.join().unwrap();
            assert!(matches!(
                r.last_rejection,
                Some(MsgError::Invalid {
                    name: "RESET_OWNER",
                    ..
                })
            ));
        });
    }

    /// An update's ack, like an invalidation's, follows its work: while
    /// the table is held no ack arrives, and once one arrives the
    /// translation is in place (a front-end may kick a queue right after
    /// it and expect no miss). A refused update, or one that came with a
    /// descriptor, is acked 1.
    #[test]
    fn an_update_or_invalidation_is_acked_only_once_it_is_taken() {
        let dev = Flaky {
            fail_next: AtomicBool::new(false),
            had_call: Mutex::new(Vec::new()),
        };
        let space = Arc::new(DmaSpace::new(64, Duration::from_millis(100)));
        let (fe, be) = UnixStream::pair().unwrap();
        let iotlb_with = |kind: u8, iova: u64, size: u64, fds: &[i32]| {
            let mut p = [0u8; 32];
            p[0..8].copy_from_slice(&iova.to_le_bytes());
            p[8..16].copy_from_slice(&size.to_le_bytes());
            p[16..24].copy_from_slice(&0x7f00_0000_0000u64.to_le_bytes());
            p[24] = crate::proto::iotlb::ACCESS_RW;
            p[25] = kind;
            testing::send(&fe, req::IOTLB_MSG, &p, fds, true).unwrap();
        };
        let iotlb = |kind: u8, iova: u64, size: u64| iotlb_with(kind, iova, size, &[]);
        let acked = || {
            let (c, _, p) = testing::recv(&fe).unwrap();
            assert_eq!(c, req::IOTLB_MSG);
            u64::from_le_bytes(p.try_into().unwrap())
        };
        let quiet = Some(Duration::from_millis(300));
        let long = Some(Duration::from_secs(5));
        std::thread::scope(|s| {
            let sp = space.clone();
            let session =
                s.spawn(|| serve_space(&dev, be, sp, Duration::from_millis(100), MESSAGE_BOUND));
            // An update while the table is held: no ack until it is taken.
            let held = space.hold_table();
            fe.set_read_timeout(quiet).unwrap();
            iotlb(m::UPDATE, 0x1000, 0x1000);
            assert!(testing::recv(&fe).is_err(), "acked before it was taken");
            drop(held);
            fe.set_read_timeout(long).unwrap();
            assert_eq!(acked(), 0);
            assert_eq!(space.iotlb_len(), 1, "acked, so in place");
            // A refused update, and a valid one with a descriptor: 1.
            iotlb(m::UPDATE, 0x3000, 0);
            assert_eq!(acked(), 1);
            let fd = eventfd();
            iotlb_with(m::UPDATE, 0x5000, 0x1000, &[fd.as_raw_fd()]);
            assert_eq!(acked(), 1);
            assert_eq!(space.iotlb_len(), 1);
            // An invalidation while the table is held: no ack until it is free.
            let held = space.hold_table();
            fe.set_read_timeout(quiet).unwrap();
            iotlb(m::INVALIDATE, 0x1000, 0x1000);
            assert!(testing::recv(&fe).is_err(), "acked before it was taken");
            drop(held);
            fe.set_read_timeout(long).unwrap();
            assert_eq!(acked(), 0);
            assert_eq!(space.iotlb_len(), 0);
            fe.shutdown(std::net::Shutdown::Both).unwrap();
            let r = session.join().unwrap();
            assert_eq!(r.rejected_messages, 2);
            assert_eq!((r.iotlb.updates, r.iotlb.invalidations), (1, 1));
        });
    }

    fn quiet_device() -> Flaky {
        Flaky {
            fail_next: AtomicBool::new(false),
            had_call: Mutex::new(Vec::new()),
        }
    }

    /// A front-end that stops partway through a header, or after a header
    /// that announces a payload, ends its session within the message bound
    /// (before: the session's thread waited until the front-end went
    /// away). An idle front-end between messages is not bounded.
    #[test]
    fn a_front_end_that_stops_mid_message_ends_its_session_within_the_bound() {
        let bound = Duration::from_millis(200);
        let mut header = wire::encode(req::GET_FEATURES, crate::proto::VERSION, &[0; 8]);
        header.truncate(crate::proto::HEADER_LEN);
        for (sent, what) in [
            (5usize, "a header"),
            (crate::proto::HEADER_LEN, "a payload"),
        ] {
            let dev = quiet_device();
            let space = Arc::new(DmaSpace::new(64, Duration::from_millis(100)));
            let (fe, be) = UnixStream::pair().unwrap();
            // First a whole message, after an idle gap longer than the
            // bound: it is served.
            std::thread::scope(|s| {
                let session = s.spawn(|| serve_space(&dev, be, space, bound, bound));
                std::thread::sleep(bound * 2);
                testing::send(&fe, req::GET_FEATURES, &[], &[], true).unwrap();
                fe.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let (code, _, _) = testing::recv(&fe).unwrap();
                assert_eq!(code, req::GET_FEATURES);
                testing::send_raw(&fe, &header[..sent]).unwrap();
                let t = Instant::now();
                let r = session.join().unwrap();
                let took = t.elapsed();
                assert!(
                    matches!(
                        r.end,
                        SessionEnd::Failed(SessionError::Stalled { what: w, bound_ms: 200 }) if w == what
                    ),
                    "{:?}",
                    r.end
                );
                assert!(took < Duration::from_secs(5), "{took:?}");
                drop(fe);
            });
        }
    }

    /// A front-end that asks for replies and never reads them ends its
    /// session once a reply cannot be written within the bound (before:
    /// the session's thread blocked in the write for good).
    #[test]
    fn a_front_end_that_takes_no_replies_ends_its_session_within_the_bound() {
        let bound = Duration::from_millis(200);
        let dev = quiet_device();
        let space = Arc::new(DmaSpace::new(64, Duration::from_millis(100)));
        let (fe, be) = UnixStream::pair().unwrap();
        let ask = wire::encode(
            req::GET_FEATURES,
            crate::proto::VERSION | crate::proto::FLAG_NEED_REPLY,
            &[],
        );
        std::thread::scope(|s| {
            let session = s.spawn(|| serve_space(&dev, be, space, bound, bound));
            // Ask until the session stops reading (its replies fill the
            // socket's buffer and it blocks in a write); the asking side's
            // own write then times out.
            fe.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut asked = 0u64;
            while testing::send_raw(&fe, &ask).is_ok() {
                asked += 1;
                assert!(asked < 10_000_000, "the session never stopped reading");
            }
            let r = session.join().unwrap();
            assert!(
                matches!(
                    r.end,
                    SessionEnd::Failed(SessionError::Stalled {
                        what: "a reply",
                        bound_ms: 200
                    })
                ),
                "{:?} after {asked} requests",
                r.end
            );
        });
    }
}
