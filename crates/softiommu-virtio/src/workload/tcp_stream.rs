//! One TCP stream from host A to host B with 64 KiB writes (seed `003`'s
//! iperf), for a policy and a page-walk coherence.
//!
//! The sender writes 64 KiB at a time from a fixed pattern (no per-byte
//! work of its own: what it costs is smoltcp's copy, checksums and
//! segmentation, the driver, and the DMA API); the receiver hashes what
//! it reads ([`StreamHash`](super::StreamHash)); after the run the
//! conductor hashes the pattern stream for the bytes sent and compares.
//!
//! Cache lines flushed are the page tables' own count (both hosts'
//! domains). Their share of the driver side's CPU is **estimated** as
//! lines flushed × a per-line cost measured on this CPU after the run
//! ([`flush_cost_per_line`]: map+unmap pairs on a non-coherent table less
//! the same on a coherent one, per line flushed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::socket::tcp;
use smoltcp::wire::IpAddress;
use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu::hw::LatencyModel;
use softiommu::mem::PhysMemory;
use softiommu::mem::PAGE_SIZE;
use softiommu::pgtable::{IoPageTable, IotlbGather, Perm, TableStats, VtdConfig, VtdPageTable};

use super::hash::StreamHash;
use super::side::{
    charge_passes, cidr, timers, wait_flowing, Common, Cpus, Meter, Phase, Window, A_IP, B_IP,
    MEASURE, STOP,
};
use super::WorkloadError;
use crate::cpu_clock;
use crate::device_thread::pin;
use crate::host::{pair, Host};
use crate::net::WireConfig;

/// How to run a TCP stream.
#[derive(Debug, Clone, Copy)]
pub struct TcpStreamConfig {
    /// Both hosts' DMA policy.
    pub policy: DmaPolicy,
    /// Whether the units' page walk is cache-coherent (if not, every
    /// page-table line written is flushed).
    pub coherent: bool,
    /// How the devices order their buffer copies.
    pub ordering: OrderMode,
    /// What the units model.
    pub latency: LatencyModel,
    /// The MTU (seed `003`: 1500).
    pub mtu: u16,
    /// Entries per virtqueue.
    pub queue_size: u16,
    /// Bytes per application write (iperf: 64 KiB).
    pub write_size: usize,
    /// The sender's socket buffer; the receiver's is four times larger,
    /// so data in flight can never fill it (smoltcp 0.14 stops accepting
    /// even the segment that fills a hole once out-of-order data has
    /// filled its buffer: a zero window that never reopens).
    pub socket_buffer: usize,
    /// The measured window.
    pub duration: Duration,
    /// The unmeasured warm-up (connection set-up, slow start).
    pub warmup: Duration,
    /// Where the four threads run.
    pub cpus: Cpus,
}

impl Default for TcpStreamConfig {
    fn default() -> Self {
        Self {
            policy: DmaPolicy::Strict,
            coherent: true,
            ordering: OrderMode::Ordered,
            latency: LatencyModel::zero(),
            mtu: 1500,
            queue_size: 256,
            write_size: 64 << 10,
            socket_buffer: 256 << 10,
            duration: Duration::from_secs(1),
            warmup: Duration::from_millis(300),
            cpus: Cpus::default(),
        }
    }
}

/// What a TCP stream measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TcpStreamResult {
    /// The policy.
    pub policy: DmaPolicy,
    /// Whether the page walk was coherent.
    pub coherent: bool,
    /// Bytes received in the window.
    pub bytes: u64,
    /// The window's wall time, seconds.
    pub seconds: f64,
    /// Throughput, Mbit/s (10^6 bits).
    pub mbit_s: f64,
    /// Driver+stack CPU seconds (both hosts) per GB (10^9 bytes) moved,
    /// the DMA domains' flush timers included (they flush and free on the
    /// driver threads' behalf), without the units' inline passes those
    /// threads ran (`unit_inline_cpu_s_per_gb`) and without their waits
    /// (`wait_cpu_s_per_gb`): what the work costs a driver saturated on
    /// CPU.
    pub cpu_s_per_gb: f64,
    /// The flush timers' share of `cpu_s_per_gb`, CPU seconds per GB.
    pub flush_timer_cpu_s_per_gb: f64,
    /// CPU seconds per GB the driver threads spent going idle and waking
    /// (in their waits for the device: interrupts re-armed, the park, the
    /// wake-up, the status acknowledged), apart and *not* in
    /// `cpu_s_per_gb`: a driver saturated on CPU, the state seed `003`'s
    /// figure is taken in, never goes idle. Its size follows how often the
    /// stream runs dry, which a co-runner on the CPU changes.
    pub wait_cpu_s_per_gb: f64,
    /// Device threads' CPU seconds per GB, apart.
    pub device_cpu_s_per_gb: f64,
    /// The CPU the drivers' and timers' threads spent running their units'
    /// invalidation-queue passes inline, seconds per GB: the modelled
    /// IOMMU's work, apart like the device threads' and *not* in
    /// `cpu_s_per_gb` (the modelled wait latency those passes spun stays
    /// in it: a driver spins on the status word for it).
    pub unit_inline_cpu_s_per_gb: f64,
    /// Page-table cache lines flushed (both hosts) per GB.
    pub lines_flushed_per_gb: f64,
    /// The estimated share of the driver side's CPU spent flushing:
    /// lines × [`flush_ns_per_line`](Self::flush_ns_per_line) over the
    /// driver side's CPU time.
    pub flush_cpu_share: f64,
    /// The per-line flush cost measured for the estimate, nanoseconds (0
    /// for a coherent walk: nothing was flushed, nothing measured).
    pub flush_ns_per_line: f64,
    /// Bytes the sender wrote in all (warm-up and tail included).
    pub total_sent: u64,
    /// Bytes the receiver read in all.
    pub total_received: u64,
    /// Whether every byte sent arrived, in order, unchanged (same length
    /// and same [`StreamHash`]).
    pub checksum_ok: bool,
}

/// The pattern the sender writes from: 1 MiB, cycled.
const PATTERN: usize = 1 << 20;

fn pattern(extra: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..PATTERN + extra)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The hash of the first `len` bytes of the cycled pattern.
fn pattern_hash(p: &[u8], len: u64) -> StreamHash {
    let mut h = StreamHash::default();
    let mut left = len;
    while left > 0 {
        let n = left.min(PATTERN as u64) as usize;
        h.update(&p[..n]);
        left -= n as u64;
    }
    h
}

fn table_stats(h: &Host) -> TableStats {
    h.domain.table_stats()
}

/// Measures the CPU cost of one flushed page-table line on this CPU:
/// 4 KiB map+unmap pairs on a VT-d table whose walker is not coherent,
/// less the same pairs on a coherent one, over the lines the first
/// flushed (each map and unmap flushes its own line and fences, as the
/// domains' do); the median of interleaved rounds. Nanoseconds per line;
/// 0 if memory could not be had or nothing was flushed.
pub fn flush_cost_per_line() -> f64 {
    const PAIRS: u32 = 4_000;
    const ROUNDS: usize = 9;
    let Ok(mem) = PhysMemory::new(64 << 20).map(Arc::new) else {
        return 0.0;
    };
    let Ok(frame) = mem.alloc_zeroed_frames(0) else {
        return 0.0;
    };
    let tables = (
        VtdPageTable::new(mem.clone(), VtdConfig::non_coherent()),
        VtdPageTable::new(mem.clone(), VtdConfig::coherent()),
    );
    let (Ok(nc), Ok(c)) = tables else {
        return 0.0;
    };
    // `PAIRS` map+unmap pairs: CPU time and lines flushed.
    let run = |t: &VtdPageTable| -> Option<(Duration, u64)> {
        let iova = 0x10_0000u64;
        let mut lines = 0;
        let t0 = cpu_clock::thread();
        for _ in 0..PAIRS {
            let m = t.map(iova, frame, PAGE_SIZE, Perm::RW).ok()?;
            let mut g = IotlbGather::new();
            let u = t.unmap(iova, PAGE_SIZE, &mut g).ok()?;
            g.complete().ok()?;
            lines += m.lines_flushed + u.lines_flushed;
        }
        Some((cpu_clock::thread().saturating_sub(t0), lines))
    };
    // Builds both tables' paths once, unmeasured.
    if run(&nc).is_none() || run(&c).is_none() {
        return 0.0;
    }
    // Interleaved rounds, the median difference: a burst of noise on a
    // shared machine hits one round.
    let mut per_line: Vec<f64> = (0..ROUNDS)
        .filter_map(|_| {
            let (tn, lines) = run(&nc)?;
            let (tc, _) = run(&c)?;
            (lines > 0).then(|| tn.saturating_sub(tc).as_secs_f64() * 1e9 / lines as f64)
        })
        .collect();
    if per_line.is_empty() {
        return 0.0;
    }
    per_line.sort_by(f64::total_cmp);
    per_line[per_line.len() / 2]
}

/// Runs a TCP stream.
pub fn tcp_stream(cfg: &TcpStreamConfig) -> Result<TcpStreamResult, WorkloadError> {
    let common = Common {
        policy: cfg.policy,
        coherent: cfg.coherent,
        ordering: cfg.ordering,
        latency: cfg.latency,
        mtu: cfg.mtu,
        queue_size: cfg.queue_size,
        cpus: cfg.cpus,
    };
    let write = cfg.write_size.clamp(1, PATTERN);
    let pat = pattern(write);
    let hosts = pair(
        &common.host(1),
        &common.host(2),
        WireConfig {
            capacity: 1024,
            line_rate_bps: 0,
            max_frame: 0,
        },
    )?;
    charge_passes(&hosts);
    let phase = Phase::default();
    let sender_done = AtomicBool::new(false);
    let (ready_tx, ready_rx) = mpsc::channel::<&'static str>();
    let (flowing_tx, flowing_rx) = mpsc::channel::<()>();
    let out = std::thread::scope(|s| {
        let rx_ready = ready_tx.clone();
        let receiver = s.spawn(|| {
            pin(common.cpus.receiver);
            receive(
                &hosts.b,
                &common,
                cfg.socket_buffer,
                &phase,
                &sender_done,
                rx_ready,
                flowing_tx,
            )
        });
        let sender = s.spawn(|| {
            let _done = Done(&sender_done);
            pin(common.cpus.sender);
            send(
                &hosts.a,
                &common,
                cfg.socket_buffer,
                write,
                &pat,
                &phase,
                ready_tx,
            )
        });
        let conduct = || -> Result<_, WorkloadError> {
            for _ in 0..2 {
                ready_rx
                    .recv_timeout(Duration::from_secs(10))
                    .map_err(|_| WorkloadError::Timeout {
                        side: "a",
                        what: "driver probe",
                        secs: 10,
                    })?;
            }
            // The warm-up starts once the stream flows, not when the
            // drivers are up: on a loaded machine the connection can take
            // longer than the warm-up and the window, and the window then
            // measured a stream that had not started (0 bytes).
            wait_flowing(
                &flowing_rx,
                || sender.is_finished() || receiver.is_finished(),
                "the stream's first bytes",
            )?;
            std::thread::sleep(cfg.warmup);
            let dev0 = hosts.a.device.cpu_time() + hosts.b.device.cpu_time();
            let timer0 = timers(&hosts);
            let (ta0, tb0) = (table_stats(&hosts.a), table_stats(&hosts.b));
            phase.set(MEASURE);
            let t0 = Instant::now();
            std::thread::sleep(cfg.duration);
            phase.set(STOP);
            let wall = t0.elapsed();
            let timer1 = timers(&hosts);
            let timer = (
                timer1.0.saturating_sub(timer0.0),
                timer1.1.saturating_sub(timer0.1),
            );
            let dev = (hosts.a.device.cpu_time() + hosts.b.device.cpu_time()).saturating_sub(dev0);
            let (ta1, tb1) = (table_stats(&hosts.a), table_stats(&hosts.b));
            let lines =
                (ta1.lines_flushed - ta0.lines_flushed) + (tb1.lines_flushed - tb0.lines_flushed);
            Ok((wall, dev, lines, timer))
        };
        let c = conduct();
        phase.set(STOP);
        let a = sender.join().map_err(|_| WorkloadError::Panicked)?;
        let b = receiver.join().map_err(|_| WorkloadError::Panicked)?;
        // A side's own error first: the conductor's wait for the first
        // bytes ends at once when a side fails, and says only that.
        Ok::<_, WorkloadError>((a?, b?, c?))
    });
    let ((a, sent), (b, received, hash), (wall, dev, lines, timer)) = out?;
    let secs = wall.as_secs_f64().max(1e-9);
    let gb = b.bytes as f64 / 1e9;
    let per_gb = |x: f64| if gb > 0.0 { x / gb } else { 0.0 };
    let (timer, timer_unit) = timer;
    let driver_cpu = a.cpu + b.cpu + timer;
    let unit_cpu = a.unit + b.unit + timer_unit;
    let ns_per_line = if lines > 0 {
        flush_cost_per_line()
    } else {
        0.0
    };
    let expected = pattern_hash(&pat, sent);
    Ok(TcpStreamResult {
        policy: cfg.policy,
        coherent: cfg.coherent,
        bytes: b.bytes,
        seconds: secs,
        mbit_s: b.bytes as f64 * 8.0 / secs / 1e6,
        cpu_s_per_gb: per_gb(driver_cpu.as_secs_f64()),
        flush_timer_cpu_s_per_gb: per_gb(timer.as_secs_f64()),
        wait_cpu_s_per_gb: per_gb((a.waiting + b.waiting).as_secs_f64()),
        device_cpu_s_per_gb: per_gb(dev.as_secs_f64()),
        unit_inline_cpu_s_per_gb: per_gb(unit_cpu.as_secs_f64()),
        lines_flushed_per_gb: per_gb(lines as f64),
        flush_cpu_share: if driver_cpu.is_zero() {
            0.0
        } else {
            (lines as f64 * ns_per_line / 1e9 / driver_cpu.as_secs_f64()).min(1.0)
        },
        flush_ns_per_line: ns_per_line,
        total_sent: sent,
        total_received: received,
        checksum_ok: received == sent && hash == expected.finish(),
    })
}

fn tcp_socket(buf: usize) -> tcp::Socket<'static> {
    let mut s = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; buf]),
        tcp::SocketBuffer::new(vec![0; buf]),
    );
    s.set_ack_delay(None);
    s.set_nagle_enabled(false);
    s
}

/// How long the tail (close, last bytes) may take after the window.
const TAIL: Duration = Duration::from_secs(15);

#[allow(clippy::too_many_arguments)]
fn send(
    host: &Host,
    common: &Common,
    buf: usize,
    write: usize,
    pat: &[u8],
    phase: &Phase,
    ready: mpsc::Sender<&'static str>,
) -> Result<(Window, u64), WorkloadError> {
    let side = "a";
    let drv = |source| WorkloadError::Driver { side, source };
    let mut st = host.stack(common.driver(), cidr(A_IP)).map_err(drv)?;
    let mut sock = tcp_socket(buf);
    sock.connect(st.iface.context(), (IpAddress::Ipv4(B_IP), 5001), 40000)
        .map_err(|e| WorkloadError::Socket {
            side,
            what: e.to_string(),
        })?;
    let h = st.sockets.add(sock);
    let _ = ready.send(side);
    let (mut pos, mut pending, mut meter) = (0u64, 0usize, Meter::default());
    loop {
        if meter.observe(phase, 0, pos) {
            break;
        }
        let s = st.sockets.get_mut::<tcp::Socket>(h);
        let mut blocked = false;
        if s.may_send() {
            while s.can_send() {
                if pending == 0 {
                    pending = write;
                }
                let off = (pos % PATTERN as u64) as usize;
                let n =
                    s.send_slice(&pat[off..off + pending])
                        .map_err(|e| WorkloadError::Socket {
                            side,
                            what: e.to_string(),
                        })?;
                pos += n as u64;
                pending -= n;
                if n == 0 {
                    break;
                }
            }
            blocked = !s.can_send();
        }
        st.poll().map_err(drv)?;
        // A wait's CPU is the window's `waiting`, not its work (see
        // `TcpStreamResult::wait_cpu_s_per_gb`).
        if st.driver.tx_ring_full().map_err(drv)? {
            meter
                .wait(|| st.driver.wait(Duration::from_millis(1)))
                .map_err(drv)?;
        } else if blocked {
            // The window is full: sleep until ACKs arrive (or a timer).
            meter
                .wait(|| st.wait(Duration::from_millis(1)))
                .map_err(drv)?;
        }
    }
    // The tail: close and let the last bytes and the FIN go.
    st.sockets.get_mut::<tcp::Socket>(h).close();
    let t0 = Instant::now();
    loop {
        st.poll().map_err(drv)?;
        let s = st.sockets.get_mut::<tcp::Socket>(h);
        // Done once the FIN is acknowledged (so every byte before it is).
        let done = matches!(
            s.state(),
            tcp::State::FinWait2 | tcp::State::TimeWait | tcp::State::Closing
        );
        if !s.is_open() || done {
            return Ok((meter.window, pos));
        }
        if t0.elapsed() > TAIL {
            return Err(WorkloadError::Timeout {
                side,
                what: "close",
                secs: TAIL.as_secs(),
            });
        }
        st.wait(Duration::from_millis(1)).map_err(drv)?;
    }
}

/// Sets the flag when dropped: the sender has finished (or failed), so
/// the receiver may stop serving its retransmissions.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn receive(
    host: &Host,
    common: &Common,
    buf: usize,
    phase: &Phase,
    sender_done: &AtomicBool,
    ready: mpsc::Sender<&'static str>,
    flowing: mpsc::Sender<()>,
) -> Result<(Window, u64, u64), WorkloadError> {
    let side = "b";
    let mut flowing = Some(flowing);
    let drv = |source| WorkloadError::Driver { side, source };
    let mut st = host.stack(common.driver(), cidr(B_IP)).map_err(drv)?;
    let mut sock = tcp_socket(buf.saturating_mul(4));
    sock.listen(5001).map_err(|e| WorkloadError::Socket {
        side,
        what: e.to_string(),
    })?;
    let h = st.sockets.add(sock);
    let _ = ready.send(side);
    let (mut got, mut hash, mut meter) = (0u64, StreamHash::default(), Meter::default());
    let mut stopped: Option<Instant> = None;
    loop {
        if meter.observe(phase, 0, got) && stopped.is_none() {
            stopped = Some(Instant::now());
        }
        let changed = st.poll().map_err(drv)?;
        let s = st.sockets.get_mut::<tcp::Socket>(h);
        let mut n = 0;
        while s.can_recv() {
            n += s
                .recv(|d| {
                    hash.update(d);
                    (d.len(), d.len())
                })
                .map_err(|e| WorkloadError::Socket {
                    side,
                    what: e.to_string(),
                })?;
        }
        got += n as u64;
        if got > 0 {
            if let Some(f) = flowing.take() {
                let _ = f.send(());
            }
        }
        if let Some(t) = stopped {
            // After the window: read until the sender's FIN, then keep
            // the stack running (ACKs, retransmissions) until the sender
            // is done with its close.
            if !s.may_recv() && s.state() != tcp::State::Listen {
                s.close();
                while !sender_done.load(Ordering::Acquire) {
                    if t.elapsed() > TAIL {
                        break;
                    }
                    st.poll().map_err(drv)?;
                    st.wait(Duration::from_millis(1)).map_err(drv)?;
                }
                return Ok((meter.window, got, hash.finish()));
            }
            if t.elapsed() > TAIL {
                return Err(WorkloadError::Timeout {
                    side,
                    what: "the sender's FIN",
                    secs: TAIL.as_secs(),
                });
            }
        }
        if n == 0 && !changed {
            meter
                .wait(|| st.wait(Duration::from_millis(1)))
                .map_err(drv)?;
        }
    }
}
