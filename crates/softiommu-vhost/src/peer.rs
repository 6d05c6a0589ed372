//! A host-side TCP peer on the other end of the net back-end's wire:
//! smoltcp over a [`WirePort`], a sink that takes an expected number of
//! bytes on one port and checksums them, and a source that sends a
//! deterministic pattern of the same size on another and checksums what it
//! sent. Checksums are SHA-256 by the system's `sha256sum`, the same tool
//! the guest uses. Bounded by a deadline and a stop flag.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address, Ipv4Cidr};

use softiommu_virtio::net::{WirePort, WireRx, WireTx};

/// smoltcp's device on one end of a wire.
struct WireDev {
    port: WirePort,
}

struct RxTok<'a> {
    rx: &'a mut WireRx,
}

struct TxTok<'a> {
    tx: &'a mut WireTx,
}

impl phy::RxToken for RxTok<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        // `receive` saw this frame arrived; only this thread consumes.
        let r = match self.rx.peek() {
            Ok(frame) => f(frame),
            Err(_) => f(&[]),
        };
        self.rx.consume();
        r
    }
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let max = self.tx.max_frame();
        if len <= max {
            if let Some(mut slot) = self.tx.reserve() {
                let r = f(&mut slot.buf()[..len]);
                slot.commit(len);
                return r;
            }
        }
        // Full wire (or a frame past the slot): dropped and counted, as a
        // switch port would.
        self.tx.drop_frame();
        let mut scratch = vec![0u8; len];
        f(&mut scratch)
    }
}

impl phy::Device for WireDev {
    type RxToken<'a> = RxTok<'a>;
    type TxToken<'a> = TxTok<'a>;

    fn receive(&mut self, _t: SmolInstant) -> Option<(RxTok<'_>, TxTok<'_>)> {
        if self.port.rx.peek().is_err() {
            return None;
        }
        Some((
            RxTok {
                rx: &mut self.port.rx,
            },
            TxTok {
                tx: &mut self.port.tx,
            },
        ))
    }

    fn transmit(&mut self, _t: SmolInstant) -> Option<TxTok<'_>> {
        Some(TxTok {
            tx: &mut self.port.tx,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.port.tx.max_frame();
        caps
    }
}

/// How the peer is set up.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The peer's MAC.
    pub mac: [u8; 6],
    /// The peer's address and prefix.
    pub addr: Ipv4Cidr,
    /// The port the sink listens on (the guest sends).
    pub sink_port: u16,
    /// The port the source listens on (the guest receives).
    pub source_port: u16,
    /// Bytes each direction carries.
    pub bytes: u64,
    /// The bound on the whole exchange.
    pub deadline: Duration,
}

impl PeerConfig {
    /// 10.0.2.2/24 at 02:00:00:00:00:02, sink 5555, source 5556.
    pub fn new(bytes: u64, deadline: Duration) -> Self {
        Self {
            mac: [0x02, 0, 0, 0, 0, 0x02],
            addr: Ipv4Cidr::new(Ipv4Address::new(10, 0, 2, 2), 24),
            sink_port: 5555,
            source_port: 5556,
            bytes,
            deadline,
        }
    }
}

/// What the peer saw.
#[derive(Debug, Clone, Default)]
pub struct PeerReport {
    /// Bytes the sink received.
    pub received: u64,
    /// SHA-256 of what the sink received (hex), if it got them all.
    pub received_sha256: Option<String>,
    /// Bytes the source sent (acknowledged or not).
    pub sent: u64,
    /// SHA-256 of the pattern the source sent (hex), if it sent it all.
    pub sent_sha256: Option<String>,
    /// Whether the deadline passed before both directions finished.
    pub timed_out: bool,
}

/// A running `sha256sum` fed through its standard input.
struct Hasher(Child);

impl Hasher {
    fn new() -> std::io::Result<Self> {
        Command::new("sha256sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map(Self)
    }

    fn feed(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self.0.stdin.as_mut() {
            Some(i) => i.write_all(b),
            None => Err(std::io::Error::other("sha256sum's stdin is closed")),
        }
    }

    fn finish(mut self) -> std::io::Result<String> {
        drop(self.0.stdin.take());
        let out = self.0.wait_with_output()?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string())
    }
}

/// The source's pattern: a xorshift64 stream, 8 bytes per step.
struct Pattern(u64);

impl Pattern {
    fn fill(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            c.copy_from_slice(&self.0.to_le_bytes()[..c.len()]);
        }
    }
}

/// Runs the peer on `port` until both directions are done (each socket
/// closed after its `bytes`), `stop` is set, or the deadline passes.
pub fn run_peer(
    cfg: &PeerConfig,
    port: WirePort,
    stop: Arc<AtomicBool>,
) -> std::io::Result<PeerReport> {
    let mut dev = WireDev { port };
    dev.port.rx.register_receiver();
    let mut icfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(cfg.mac)));
    icfg.random_seed = 0x5eed_0002;
    let epoch = Instant::now();
    let now = || SmolInstant::from_micros(epoch.elapsed().as_micros().min(i64::MAX as u128) as i64);
    let mut iface = Interface::new(icfg, &mut dev, now());
    iface.update_ip_addrs(|a| {
        let _ = a.push(IpCidr::Ipv4(cfg.addr));
    });
    let mut sockets = SocketSet::new(Vec::new());
    let mk = || {
        tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; 256 << 10]),
            tcp::SocketBuffer::new(vec![0u8; 256 << 10]),
        )
    };
    let sink = sockets.add(mk());
    let source = sockets.add(mk());
    sockets
        .get_mut::<tcp::Socket>(sink)
        .listen(cfg.sink_port)
        .map_err(|e| std::io::Error::other(format!("listen: {e}")))?;
    sockets
        .get_mut::<tcp::Socket>(source)
        .listen(cfg.source_port)
        .map_err(|e| std::io::Error::other(format!("listen: {e}")))?;
    let mut rep = PeerReport::default();
    let mut sink_hash = Some(Hasher::new()?);
    let mut source_hash = Some(Hasher::new()?);
    let mut pattern = Pattern(0x9e37_79b9_7f4a_7c15);
    let mut chunk = vec![0u8; 16 << 10];
    let mut chunk_at = chunk.len();
    let (mut sink_done, mut source_done) = (false, false);
    while !(sink_done && source_done) {
        if stop.load(Ordering::Acquire) {
            break;
        }
        if epoch.elapsed() > cfg.deadline {
            rep.timed_out = true;
            break;
        }
        iface.poll(now(), &mut dev, &mut sockets);
        let s = sockets.get_mut::<tcp::Socket>(sink);
        while s.can_recv() {
            let mut err = None;
            let h = sink_hash.as_mut();
            let n = s
                .recv(|b| {
                    if let Some(h) = h {
                        if let Err(e) = h.feed(b) {
                            err = Some(e);
                        }
                    }
                    (b.len(), b.len())
                })
                .unwrap_or(0);
            if let Some(e) = err {
                return Err(e);
            }
            rep.received += n as u64;
            if n == 0 {
                break;
            }
        }
        if rep.received >= cfg.bytes && rep.received_sha256.is_none() {
            if let Some(h) = sink_hash.take() {
                rep.received_sha256 = Some(h.finish()?);
            }
            s.close();
        }
        if rep.received_sha256.is_some() && !s.is_active() {
            sink_done = true;
        }
        let s = sockets.get_mut::<tcp::Socket>(source);
        while s.may_send() && rep.sent < cfg.bytes {
            if chunk_at == chunk.len() {
                pattern.fill(&mut chunk);
                chunk_at = 0;
            }
            let left = (cfg.bytes - rep.sent).min((chunk.len() - chunk_at) as u64) as usize;
            let n = s.send_slice(&chunk[chunk_at..chunk_at + left]).unwrap_or(0);
            if n == 0 {
                break;
            }
            if let Some(h) = source_hash.as_mut() {
                h.feed(&chunk[chunk_at..chunk_at + n])?;
            }
            chunk_at += n;
            rep.sent += n as u64;
        }
        if rep.sent >= cfg.bytes && rep.sent_sha256.is_none() {
            if let Some(h) = source_hash.take() {
                rep.sent_sha256 = Some(h.finish()?);
            }
            s.close();
        }
        if rep.sent_sha256.is_some() && !s.is_active() {
            source_done = true;
        }
        let d = iface
            .poll_delay(now(), &sockets)
            .map(|d| Duration::from_micros(d.total_micros()))
            .unwrap_or(Duration::from_millis(5))
            .min(Duration::from_millis(5));
        if !dev.port.rx.pending() {
            std::thread::park_timeout(d);
        }
    }
    Ok(rep)
}
