//! A UDP stream of `msg_size`-byte datagrams from host A to host B (seed
//! `000`'s netperf UDP_STREAM), as fast as A's stack, driver and device
//! go.
//!
//! Threads: A's driver+stack (the sender), B's driver+stack (the
//! receiver), and each host's device thread. After an unmeasured warm-up
//! (ARP, page tables, IOVA caches and IOTLBs reach their steady state) the
//! conductor opens the measured window; each thread snapshots its own CPU
//! clock at the window's edges, the conductor the device threads'.
//! The sender sleeps on the transmit-completion interrupt when its ring is
//! full, the receiver on the receive interrupt when it has nothing to do,
//! so neither spins while it waits; the CPU of going to sleep and waking
//! is counted in their CPU time here (unlike `tcp_stream`, which counts
//! it apart): at full speed it is part of what each policy's maximum
//! rate costs, and paced, the drivers busy-poll instead of sleeping.
//!
//! Paced ([`UdpStreamConfig::offered_pps`]): the sender offers a fixed rate
//! in batches, one batch per pacing period (about [`PACE_BATCH`]
//! datagrams); the receiver polls its queues NAPI-style on a timer of the
//! same period, half a period later (the interrupt coalescing a NIC does),
//! draining everything that arrived, with the device's interrupts off.
//! Between batches both busy-poll: they watch the clock and yield their
//! CPU to any other runnable thread, and never sleep, so the CPU never
//! goes idle and no batch pays for waking it; that idling is left out of
//! their CPU (`Meter::idle_until`), as a CPU idling in its poll state
//! (cpuidle's `poll`, `haltpoll`) counts as idle. The CPU per datagram is then the stack's, driver's
//! and IOMMU's work. (Sleeping between batches instead, at the ~18 kpps
//! every policy can carry, pass-through's service demand read 0.84-1.6
//! µs a datagram from one round to the next, against 0.34-0.66 µs
//! busy-polling: the sleep and its wake-up cost about as much as the
//! work, and moved with the host.) Paced, each host's flush timer runs
//! beside its driver ([`Cpus`]), where Linux's fires: on the CPU that
//! unmapped.
//! At the end the receiver drains what is still in flight, so `drops`
//! counts every datagram of the run that never arrived.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use smoltcp::socket::udp;
use smoltcp::wire::{IpAddress, IpEndpoint};
use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu::hw::LatencyModel;

use super::side::{
    charge_passes, cidr, timers, us_per, wait_flowing, Common, Cpus, Meter, Phase, Window, A_IP,
    B_IP, MEASURE, STOP,
};
use super::WorkloadError;
use crate::device_thread::pin;
use crate::host::{pair, Host, HostError, HostPair};
use crate::net::{LaneStats, WireConfig};

/// How to run a UDP stream.
#[derive(Debug, Clone, Copy)]
pub struct UdpStreamConfig {
    /// Both hosts' DMA policy.
    pub policy: DmaPolicy,
    /// How the devices order their buffer copies.
    pub ordering: OrderMode,
    /// UDP payload bytes per datagram (seed `000`: 32 and 16384; above the
    /// MTU, IPv4 fragments it). At most 32,000.
    pub msg_size: usize,
    /// The measured window.
    pub duration: Duration,
    /// The unmeasured warm-up before it.
    pub warmup: Duration,
    /// What the units model.
    pub latency: LatencyModel,
    /// The MTU.
    pub mtu: u16,
    /// Entries per virtqueue.
    pub queue_size: u16,
    /// The wire's line rate (0: unlimited).
    pub line_rate_bps: u64,
    /// Whether the units' page walk is cache-coherent.
    pub coherent: bool,
    /// Where the four threads run.
    pub cpus: Cpus,
    /// The deferred policy's flush-queue high-water mark on both hosts
    /// (`None`: the library's default, 256). The queues are made at least
    /// 256 entries, and larger when the mark is.
    pub flush_high_water: Option<usize>,
    /// The deferred policy's flush timeout on both hosts (`None`: the
    /// library's default, 10 ms).
    pub flush_timeout: Option<Duration>,
    /// `None`: as fast as the sender goes. `Some(rate)`: the sender offers
    /// `rate` datagrams per second in batches, both sides poll per batch
    /// and busy-poll between batches, the idling not counted (see the
    /// module's documentation). Rates below 1 are taken
    /// as 1.
    pub offered_pps: Option<f64>,
}

/// Datagrams per batch the paced mode aims at: below the rings' 256
/// entries, so a batch fits A's transmit ring and B's receive ring whole
/// and neither side waits inside a batch.
pub const PACE_BATCH: f64 = 192.0;

/// The paced sender's token bucket, in batches: the most it sends at once
/// after it was held off its CPU.
const PACE_BUCKET: f64 = 4.0;

/// The wire's queue in paced mode, frames. The device threads stand for
/// hardware, which another load never holds off its CPU; on a shared
/// machine they are held off, and this queue (about 0.2 s at 80 kpps)
/// absorbs it, so the paced run measures the hosts' CPU per datagram
/// rather than the co-runners' scheduling (full speed keeps 1,024).
const PACED_WIRE_FRAMES: usize = 16_384;

/// The pacing period at `rate` datagrams per second: [`PACE_BATCH`]
/// datagrams' worth, between 0.25 ms and 8 ms.
pub fn pace_period(rate: f64) -> Duration {
    Duration::from_secs_f64((PACE_BATCH / rate.max(1.0)).clamp(0.000_25, 0.008))
}

impl Default for UdpStreamConfig {
    fn default() -> Self {
        Self {
            policy: DmaPolicy::Strict,
            ordering: OrderMode::Ordered,
            msg_size: 32,
            duration: Duration::from_secs(1),
            warmup: Duration::from_millis(200),
            latency: LatencyModel::zero(),
            mtu: 1500,
            queue_size: 256,
            line_rate_bps: 0,
            coherent: true,
            cpus: Cpus::default(),
            flush_high_water: None,
            flush_timeout: None,
            offered_pps: None,
        }
    }
}

/// What a UDP stream measured over its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UdpStreamResult {
    /// The policy.
    pub policy: DmaPolicy,
    /// The devices' ordering.
    pub ordering: OrderMode,
    /// Payload bytes per datagram.
    pub msg_size: usize,
    /// The window's wall time, seconds.
    pub seconds: f64,
    /// Datagrams A's stack accepted in the window.
    pub tx_packets: u64,
    /// Datagrams B's socket delivered in the window.
    pub rx_packets: u64,
    /// Datagrams sent per second.
    pub tx_pps: f64,
    /// Datagrams received per second.
    pub rx_pps: f64,
    /// Datagrams lost. Full speed: sent less received in the window (some
    /// may be in flight at its edges). Paced: every datagram of the run
    /// (warm-up included) that was sent and, after the receiver drained
    /// what was in flight, never delivered.
    pub drops: u64,
    /// Frames the wire dropped (its queue full because B was behind).
    pub wire_drops: u64,
    /// Driver+stack CPU per datagram: A's per datagram sent plus B's per
    /// datagram received, microseconds, without the units' inline passes
    /// (`unit_inline_cpu_us_per_pkt`).
    pub driver_cpu_us_per_pkt: f64,
    /// A's (the sender's) part.
    pub tx_driver_cpu_us_per_pkt: f64,
    /// B's (the receiver's) part.
    pub rx_driver_cpu_us_per_pkt: f64,
    /// Device threads' CPU per datagram, microseconds (A's per sent, B's
    /// per received): the hardware's share, apart.
    pub device_cpu_us_per_pkt: f64,
    /// Ethernet frames per datagram (more than 1 when fragmented).
    pub frames_per_packet: f64,
    /// The longest an unmapped buffer stayed reachable through a stale
    /// IOTLB entry in the window (deferred; the worse host), milliseconds:
    /// from its unmap to the earlier of its flush's completion and its
    /// expiry deadline (three quarters of the flush timeout after it, past
    /// which every translator drops the domain's cached translations).
    pub stale_window_ms_max: f64,
    /// The longest from an unmap to its flush's completion in the window
    /// (deferred; the worse host), milliseconds, whatever the deadline
    /// did: the end of the window for a translation a device thread held
    /// inside an open section.
    pub stale_completion_ms_max: f64,
    /// Both domains' flush timer threads' wake-ups per second of the
    /// window.
    pub timer_wakeups_per_s: f64,
    /// Deferred flushes in the window, both hosts.
    pub flushes: u64,
    /// The rate offered (paced), datagrams per second; `None` at full
    /// speed.
    pub offered_pps: Option<f64>,
    /// Service demand as netperf defines it: the CPU of every software
    /// thread the traffic makes work — both hosts' driver+stack threads
    /// and both domains' flush timer threads — per datagram delivered,
    /// microseconds. The device threads (hardware) are not in it.
    pub service_demand_us_per_pkt: f64,
    /// The flush timer threads' part of `service_demand_us_per_pkt`.
    pub flush_cpu_us_per_pkt: f64,
    /// The CPU the drivers' and timers' threads spent running their units'
    /// invalidation-queue passes inline, per datagram delivered,
    /// microseconds: the modelled IOMMU's work (carrying out descriptors,
    /// draining the translations in flight), taken out of those threads'
    /// figures and *not* in `service_demand_us_per_pkt`, as the device
    /// threads are not. The modelled wait latency those passes spun (a
    /// driver spins on the status word for it) stays in service demand.
    pub unit_inline_cpu_us_per_pkt: f64,
}

/// Runs a UDP stream.
pub fn udp_stream(cfg: &UdpStreamConfig) -> Result<UdpStreamResult, WorkloadError> {
    let common = Common {
        policy: cfg.policy,
        coherent: cfg.coherent,
        ordering: cfg.ordering,
        latency: cfg.latency,
        mtu: cfg.mtu,
        queue_size: cfg.queue_size,
        cpus: cfg.cpus,
    };
    let msg = cfg.msg_size.clamp(1, 32_000);
    let hosts = pair(
        &common.host(1),
        &common.host(2),
        WireConfig {
            capacity: if cfg.offered_pps.is_some() {
                PACED_WIRE_FRAMES
            } else {
                1024
            },
            line_rate_bps: cfg.line_rate_bps,
            max_frame: 0,
        },
    )?;
    for h in [&hosts.a, &hosts.b] {
        // Before the drivers make their DMA handles (and so their queues).
        if let Some(hw) = cfg.flush_high_water {
            h.domain.set_queue_size(hw.max(256)).map_err(tunable)?;
            h.domain.set_high_water(hw).map_err(tunable)?;
        }
        if let Some(t) = cfg.flush_timeout {
            h.domain.set_timeout(t).map_err(tunable)?;
        }
    }
    charge_passes(&hosts);
    // Paced, each host's flush timer beside its driver, where Linux's
    // fires (on the CPU that unmapped) and where the busy-polling driver
    // keeps the CPU awake. At full speed the timers stay where the
    // scheduler puts them: there the drivers' CPU is saturated, and the
    // maxima (and so the common rate) were measured that way.
    if cfg.offered_pps.is_some() {
        if let Some(c) = common.cpus.sender {
            hosts.a.domain.pin_timer(c);
        }
        if let Some(c) = common.cpus.receiver {
            hosts.b.domain.pin_timer(c);
        }
    }
    let flushes = || hosts.a.domain.stats().flushes + hosts.b.domain.stats().flushes;
    let pace = cfg.offered_pps.map(|r| r.max(1.0));
    let tally = Tally::default();
    let phase = Phase::default();
    let (ready_tx, ready_rx) = mpsc::channel::<&'static str>();
    let (flowing_tx, flowing_rx) = mpsc::channel::<()>();
    let out = std::thread::scope(|s| {
        let rx_ready = ready_tx.clone();
        let receiver = s.spawn(|| {
            pin(common.cpus.receiver);
            let reassembly = reassembly_timeout(msg, common.mtu, cfg.line_rate_bps);
            receive(
                &hosts.b, &common, &phase, pace, reassembly, &tally, rx_ready, flowing_tx,
            )
        });
        let sender = s.spawn(|| {
            pin(common.cpus.sender);
            send(&hosts.a, &common, msg, &phase, pace, &tally, ready_tx)
        });
        let conduct =
            || -> Result<(Duration, Duration, Duration, LaneStats, Deferred), WorkloadError> {
                for _ in 0..2 {
                    ready_rx
                        .recv_timeout(Duration::from_secs(10))
                        .map_err(|_| WorkloadError::Timeout {
                            side: "a",
                            what: "driver probe",
                            secs: 10,
                        })?;
                }
                // The warm-up starts once datagrams arrive, not when the
                // drivers are up: on a loaded machine ARP and the first
                // datagrams can take longer than the warm-up.
                wait_flowing(
                    &flowing_rx,
                    || sender.is_finished() || receiver.is_finished(),
                    "the first datagram",
                )?;
                std::thread::sleep(cfg.warmup);
                let dev0 = (hosts.a.device.cpu_time(), hosts.b.device.cpu_time());
                let timer0 = timers(&hosts);
                let wakeups0 = wakeups(&hosts);
                let w0 = hosts.wire.a_to_b();
                hosts.a.domain.reset_stale_window();
                hosts.b.domain.reset_stale_window();
                let f0 = flushes();
                phase.set(MEASURE);
                let t0 = Instant::now();
                std::thread::sleep(cfg.duration);
                phase.set(STOP);
                let wall = t0.elapsed();
                let dev1 = (hosts.a.device.cpu_time(), hosts.b.device.cpu_time());
                let timer1 = timers(&hosts);
                let wakeups1 = wakeups(&hosts);
                let w1 = hosts.wire.a_to_b();
                let deferred = Deferred {
                    stale_max: hosts
                        .a
                        .domain
                        .stale_window()
                        .max
                        .max(hosts.b.domain.stale_window().max),
                    completion_max: hosts
                        .a
                        .domain
                        .stale_window()
                        .completion_max
                        .max(hosts.b.domain.stale_window().completion_max),
                    wakeups: wakeups1.saturating_sub(wakeups0),
                    flushes: flushes().saturating_sub(f0),
                    timer_cpu: timer1.0.saturating_sub(timer0.0),
                    timer_unit: timer1.1.saturating_sub(timer0.1),
                };
                Ok((
                    wall,
                    dev1.0.saturating_sub(dev0.0),
                    dev1.1.saturating_sub(dev0.1),
                    LaneStats {
                        sent: w1.sent - w0.sent,
                        dropped: w1.dropped - w0.dropped,
                        oversize: w1.oversize - w0.oversize,
                        delivered: w1.delivered - w0.delivered,
                    },
                    deferred,
                ))
            };
        let c = conduct();
        // Whatever happened, the sides stop.
        phase.set(STOP);
        let a = sender.join().map_err(|_| WorkloadError::Panicked)?;
        let b = receiver.join().map_err(|_| WorkloadError::Panicked)?;
        // A side's own error first (see the TCP stream).
        let (a, b) = (a?, b?);
        let (wall, dev_a, dev_b, wire, deferred) = c?;
        Ok::<_, WorkloadError>((a, b, wall, dev_a, dev_b, wire, deferred))
    });
    let (a, b, wall, dev_a, dev_b, wire, deferred) = out?;
    let secs = wall.as_secs_f64().max(1e-9);
    let tx_us = us_per(a.cpu, a.count);
    let rx_us = us_per(b.cpu, b.count);
    let drops = match pace {
        None => a.count.saturating_sub(b.count),
        Some(_) => tally
            .sent
            .load(Ordering::Acquire)
            .saturating_sub(tally.received.load(Ordering::Acquire)),
    };
    Ok(UdpStreamResult {
        policy: cfg.policy,
        ordering: cfg.ordering,
        msg_size: msg,
        seconds: secs,
        tx_packets: a.count,
        rx_packets: b.count,
        tx_pps: a.count as f64 / secs,
        rx_pps: b.count as f64 / secs,
        drops,
        wire_drops: wire.dropped,
        driver_cpu_us_per_pkt: tx_us + rx_us,
        tx_driver_cpu_us_per_pkt: tx_us,
        rx_driver_cpu_us_per_pkt: rx_us,
        device_cpu_us_per_pkt: us_per(dev_a, a.count) + us_per(dev_b, b.count),
        frames_per_packet: if a.count == 0 {
            0.0
        } else {
            (wire.sent + wire.dropped) as f64 / a.count as f64
        },
        stale_window_ms_max: deferred.stale_max.as_secs_f64() * 1e3,
        stale_completion_ms_max: deferred.completion_max.as_secs_f64() * 1e3,
        timer_wakeups_per_s: deferred.wakeups as f64 / secs,
        flushes: deferred.flushes,
        offered_pps: pace,
        service_demand_us_per_pkt: us_per(a.cpu + b.cpu + deferred.timer_cpu, b.count),
        flush_cpu_us_per_pkt: us_per(deferred.timer_cpu, b.count),
        unit_inline_cpu_us_per_pkt: us_per(a.unit + b.unit + deferred.timer_unit, b.count),
    })
}

/// The deferred policy's figures over the window.
struct Deferred {
    stale_max: Duration,
    completion_max: Duration,
    /// Both flush timers' wake-ups.
    wakeups: u64,
    flushes: u64,
    /// Both flush timer threads' CPU, without their units' inline passes.
    timer_cpu: Duration,
    /// Those passes' CPU.
    timer_unit: Duration,
}

/// Both hosts' flush timers' wake-ups, ever.
fn wakeups(hosts: &HostPair) -> u64 {
    hosts.a.domain.timer_wakeups() + hosts.b.domain.timer_wakeups()
}

/// The paced run's totals, warm-up included: what the sender sent, and
/// what the receiver got once it drained the rest.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    sender_done: AtomicBool,
    received: AtomicU64,
}

/// How long the receiver waits, after the run, for datagrams still in
/// flight: a quiet spell ends it, and a hard cap bounds it.
const DRAIN_QUIET: Duration = Duration::from_millis(50);
const DRAIN_MAX: Duration = Duration::from_secs(2);
/// Empty polls a quiet spell must hold.
const DRAIN_EMPTY_POLLS: u32 = 20;

/// A tunable a domain refused (out of the library's range).
fn tunable(e: softiommu::dma::DmaError) -> WorkloadError {
    WorkloadError::Host(HostError::Dma(e))
}

fn socket(packets: usize, bytes: usize) -> udp::Socket<'static> {
    udp::Socket::new(
        udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; packets], vec![0; bytes]),
        udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; packets], vec![0; bytes]),
    )
}

fn send(
    host: &Host,
    common: &Common,
    msg: usize,
    phase: &Phase,
    pace: Option<f64>,
    tally: &Tally,
    ready: mpsc::Sender<&'static str>,
) -> Result<Window, WorkloadError> {
    let side = "a";
    let drv = |source| WorkloadError::Driver { side, source };
    let mut st = host.stack(common.driver(), cidr(A_IP)).map_err(drv)?;
    let mut sock = socket(64, 64 * (msg + 64));
    sock.bind(9000).map_err(|e| WorkloadError::Socket {
        side,
        what: e.to_string(),
    })?;
    let h = st.sockets.add(sock);
    let _ = ready.send(side);
    let to = IpEndpoint::new(IpAddress::Ipv4(B_IP), 9);
    let payload: Vec<u8> = (0..msg).map(|i| (i as u8).wrapping_mul(31)).collect();
    // IPv4 header (20) + UDP header (8) past the MTU: IPv4 fragments it.
    let fragmented = msg + 28 > usize::from(common.mtu);
    let (mut sent, mut meter) = (0u64, Meter::default());
    let period = pace.map(pace_period);
    let mut next_batch = Instant::now();
    // Paced: a token bucket of at most `PACE_BUCKET` batches, so a sender
    // held off its CPU resumes at the rate instead of bursting its debt
    // into the receiver.
    let (mut tokens, mut filled) = (0.0f64, Instant::now());
    loop {
        if meter.observe(phase, sent, sent * msg as u64) {
            if pace.is_some() {
                // Everything counted as sent goes out before the count is
                // published: what is in the socket and A's ring.
                let t0 = Instant::now();
                while t0.elapsed() < DRAIN_MAX {
                    st.poll().map_err(drv)?;
                    st.driver.reclaim_tx().map_err(drv)?;
                    let queued = st.sockets.get_mut::<udp::Socket>(h).send_queue() > 0;
                    if !queued && st.driver.tx_in_flight() == 0 {
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            tally.sent.store(sent, Ordering::Release);
            tally.sender_done.store(true, Ordering::Release);
            return Ok(meter.window);
        }
        // Paced: what the rate allows by now; at full speed, no bound.
        let due = match pace {
            None => u64::MAX,
            Some(r) => {
                let now = Instant::now();
                tokens = (tokens + r * (now - filled).as_secs_f64()).min(PACE_BUCKET * PACE_BATCH);
                filled = now;
                sent + tokens as u64
            }
        };
        let before = sent;
        if fragmented && sent < due {
            // smoltcp 0.14 fragments one datagram at a time and does not
            // hold a socket back while its fragmenter is busy (a second
            // datagram overwrites the first's remaining fragments), so a
            // fragmented datagram is queued only once the previous one is
            // wholly out: the socket empty and nothing due now.
            let now = st.now();
            let busy = matches!(st.iface.poll_at(now, &st.sockets), Some(t) if t <= now);
            let s = st.sockets.get_mut::<udp::Socket>(h);
            if s.send_queue() == 0 && !busy && s.send_slice(&payload, to).is_ok() {
                sent += 1;
            }
        } else {
            let s = st.sockets.get_mut::<udp::Socket>(h);
            while sent < due && s.can_send() {
                if s.send_slice(&payload, to).is_err() {
                    break;
                }
                sent += 1;
            }
        }
        tokens -= (sent - before) as f64;
        st.poll().map_err(drv)?;
        if let Some(p) = period {
            let queued = st.sockets.get_mut::<udp::Socket>(h).send_queue() > 0;
            // A fragmented datagram leaves the socket for the fragmenter
            // before its last fragment is out: idling a period then
            // (8 ms at a low rate) spread its fragments past the
            // receiver's 50 ms reassembly timeout, and no datagram ever
            // arrived ("the first datagram did not happen within 30 s").
            let now = st.now();
            let fragmenting =
                fragmented && matches!(st.iface.poll_at(now, &st.sockets), Some(t) if t <= now);
            if sent >= due && !queued && !fragmenting {
                // The batch is with the driver: idle to the next one.
                next_batch = (next_batch + p).max(Instant::now());
                meter.idle_until(phase, next_batch);
                continue;
            }
        }
        if st.driver.tx_ring_full().map_err(drv)? {
            // Sleep until the device completes a transmission.
            st.driver.wait(Duration::from_millis(1)).map_err(drv)?;
        }
    }
}

/// How long the receiver keeps a datagram's fragments: 50 ms (a datagram
/// that lost a fragment frees its reassembly buffer soon), or where the
/// line is slower four times the line time of one datagram's fragments,
/// so that a whole one can arrive (at 1 Mbit/s a 16,000-byte datagram is
/// 131 ms on the wire, and none was ever reassembled); at most 30 s,
/// Linux's `ipfrag_time`.
fn reassembly_timeout(msg: usize, mtu: u16, line_rate_bps: u64) -> Duration {
    let floor = Duration::from_millis(50);
    if line_rate_bps == 0 {
        return floor;
    }
    // Each fragment carries a multiple of 8 bytes of the UDP datagram
    // (header included) under its own IPv4 and Ethernet headers.
    let per = (u64::from(mtu).saturating_sub(20) & !7).max(8);
    let ip_payload = msg as u64 + 8;
    let frags = ip_payload.div_ceil(per);
    let wire_bytes = ip_payload + frags * (20 + 14 + crate::net::ETHERNET_OVERHEAD);
    let ns = u128::from(wire_bytes) * 8 * 1_000_000_000 / u128::from(line_rate_bps);
    let line = Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX));
    (line * 4).clamp(floor, Duration::from_secs(30))
}

#[allow(clippy::too_many_arguments)]
fn receive(
    host: &Host,
    common: &Common,
    phase: &Phase,
    pace: Option<f64>,
    reassembly: Duration,
    tally: &Tally,
    ready: mpsc::Sender<&'static str>,
    flowing: mpsc::Sender<()>,
) -> Result<Window, WorkloadError> {
    let side = "b";
    let mut flowing = Some(flowing);
    let drv = |source| WorkloadError::Driver { side, source };
    let mut st = host.stack(common.driver(), cidr(B_IP)).map_err(drv)?;
    st.iface
        .set_reassembly_timeout(smoltcp::time::Duration::from_micros(
            u64::try_from(reassembly.as_micros()).unwrap_or(u64::MAX),
        ));
    let mut sock = socket(4096, 8 << 20);
    sock.bind(9).map_err(|e| WorkloadError::Socket {
        side,
        what: e.to_string(),
    })?;
    let h = st.sockets.add(sock);
    let _ = ready.send(side);
    let (mut got, mut bytes, mut meter) = (0u64, 0u64, Meter::default());
    let period = pace.map(pace_period);
    // Half a period behind the sender's batches.
    let mut next_poll = Instant::now() + period.unwrap_or_default() / 2;
    loop {
        if meter.observe(phase, got, bytes) {
            if period.is_some() {
                got += drain(&mut st, h, tally, got).map_err(drv)?;
                tally.received.store(got, Ordering::Release);
            }
            return Ok(meter.window);
        }
        let changed = st.poll().map_err(drv)?;
        let s = st.sockets.get_mut::<udp::Socket>(h);
        let mut n = 0;
        while let Ok((d, _)) = s.recv() {
            bytes += d.len() as u64;
            n += 1;
        }
        got += n;
        if got > 0 {
            if let Some(f) = flowing.take() {
                let _ = f.send(());
            }
        }
        if n == 0 && !changed {
            match period {
                // The queues are empty: idle to the next poll, the
                // device's interrupts off.
                Some(p) => {
                    next_poll = (next_poll + p).max(Instant::now());
                    meter.idle_until(phase, next_poll);
                }
                None => st.wait(Duration::from_millis(1)).map_err(drv)?,
            }
        }
    }
}

/// After the run: receives what is still in flight until the sender has
/// stopped and everything it sent has arrived, or the sender has stopped
/// and a quiet spell of [`DRAIN_QUIET`] passes, or [`DRAIN_MAX`]. Returns
/// the datagrams received.
fn drain(
    st: &mut crate::net::NetStack,
    h: smoltcp::iface::SocketHandle,
    tally: &Tally,
    got: u64,
) -> Result<u64, crate::net::DriverError> {
    let t0 = Instant::now();
    let (mut n, mut last, mut empty) = (0u64, Instant::now(), 0u32);
    loop {
        let done = tally.sender_done.load(Ordering::Acquire);
        // Quiet means polled and found empty, not merely off the CPU.
        let quiet = last.elapsed() >= DRAIN_QUIET && empty >= DRAIN_EMPTY_POLLS;
        if t0.elapsed() >= DRAIN_MAX || (done && quiet) {
            break;
        }
        if done && got + n >= tally.sent.load(Ordering::Acquire) {
            break;
        }
        st.poll()?;
        let s = st.sockets.get_mut::<udp::Socket>(h);
        let before = n;
        while s.recv().is_ok() {
            n += 1;
        }
        if n > before {
            last = Instant::now();
            empty = 0;
        } else {
            empty = empty.saturating_add(1);
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reassembly timeout covers a whole datagram's line time four
    /// times over on a slow line (at 1 Mbit/s a 16,000-byte datagram in
    /// 11 fragments is 131 ms on the wire, longer than the 50 ms floor, and
    /// none was ever reassembled), keeps 50 ms on an unlimited or fast
    /// line, and never passes 30 s.
    #[test]
    fn the_reassembly_timeout_covers_a_datagrams_line_time() {
        assert_eq!(
            reassembly_timeout(16_000, 1500, 0),
            Duration::from_millis(50)
        );
        assert_eq!(
            reassembly_timeout(16_000, 1500, 10_000_000_000),
            Duration::from_millis(50)
        );
        let t = reassembly_timeout(16_000, 1500, 1_000_000);
        // 16,008 bytes in 11 fragments of 1,480, each with 58 bytes of
        // headers and Ethernet overhead: 16,646 bytes, 133.2 ms.
        assert_eq!(t, Duration::from_nanos(4 * 133_168_000));
        assert_eq!(reassembly_timeout(32_000, 576, 1), Duration::from_secs(30));
    }
}
