//! `softiommu bench ring`: seed `000`'s UDP stream with no network stack —
//! hand-built frames on a bare descriptor ring, per DMA policy. This was
//! `lab netperf-udp` before that ran on smoltcp and virtio-net; it stays
//! as the floor of a policy's per-packet cost with nothing around it (a
//! floor, never the headline: pass-through costs ~0.1–0.2 µs per packet
//! here, so every protection looks many times dearer than beside a real
//! stack).
//!
//! CPU side (`--streams` sender threads): for every message, build a real
//! Ethernet/IPv4/UDP frame into a fresh buffer (headers, the payload copied
//! from the sender's source buffer as `sendmsg` does, the IPv4 and UDP
//! checksums), map it `ToDevice`, write a descriptor into the transmit ring
//! (a coherent DMA buffer) and ring the doorbell; reclaim completed
//! descriptors and unmap their buffers. Nothing else: no filler work.
//!
//! Device side (one thread per ring, standing for the NIC): read each
//! descriptor and frame through the IOMMU unit's translation (IOTLB, page
//! walks), verify both checksums, write the descriptor's status back
//! through the translation.
//!
//! Reported per policy, as the seed's table: packets per second, CPU % and
//! CPU-µs per packet (service demand) of the CPU side, from the kernel's
//! CPU clocks (the process's, less the device threads'); the device
//! threads' busy share apart; the stale window for deferred. The time the
//! hardware takes to complete an invalidation is modelled (`--latency`,
//! default `vtd-2015`); everything else is measured. A 16 KiB message is one
//! descriptor (as with segmentation offload), not eleven IP fragments.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiommu::dma::{DmaCpu, DmaDevice, DmaDirection, DmaError, DmaPolicy};
use softiommu::hw::{Access, LatencyModel, SourceId, Translator};
use softiommu::mem::{PhysAddr, PhysMemory};

use super::packet::{self, Flow, HEADERS};
use crate::args::{dma_policies, DmaPolicyName, Latency, Placement, Ranged, Seconds};
use crate::dma_rig::{modelled, modelled_figures, DmaRig};
use crate::error::{join, LabError, LabResult};
use crate::lab::policy_physics::{self, PolicyCost};
use crate::metrics::cpu_clock;
use crate::report::{
    contract, Axis, Cell, Column, Param, Plot, PlotKind, Report, Series, Spread, Table, Unit,
};
use softiommu_virtio::affinity;

/// Options of `bench ring` (and of a `[bench-ring]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RingArgs {
    /// UDP payload bytes per message (1..=61440; the seed: 32 and 16384).
    #[arg(long, default_value = "32")]
    pub msg_size: Ranged<1, 61440>,
    /// Seconds per policy, split over the rounds (0.01..=86400; default 2
    /// with --quick, else 10).
    #[arg(long)]
    pub seconds: Option<Seconds>,
    /// Rounds: every policy runs once per round, rounds interleaved, and
    /// each policy's median round (by µs per packet) is reported, so that a
    /// burst of noise on a shared machine hits one round of one policy
    /// (1..=100; default 3 with --quick, else 5).
    #[arg(long)]
    pub rounds: Option<Ranged<1, 100>>,
    /// Short runs, same shape.
    #[arg(long)]
    pub quick: bool,
    /// Sender threads, each with its own ring and device thread (1..=16).
    #[arg(long, default_value = "1")]
    pub streams: Ranged<1, 16>,
    /// Descriptors per transmit ring (2..=4096).
    #[arg(long, default_value = "256")]
    pub ring: Ranged<2, 4096>,
    /// Where threads run: `split` pins each sender and each device thread
    /// to a CPU of its own (a device is separate hardware), `shared` pins a
    /// sender and its device thread to one CPU, `os` leaves it to the
    /// scheduler (which may switch between the two mid-run).
    #[arg(long, value_enum, default_value_t = Placement::Split)]
    pub placement: Placement,
    /// Deferred policy: flush-queue high-water mark, entries (1..=65536;
    /// default the library's, 256).
    #[arg(long)]
    pub flush_high_water: Option<Ranged<1, 65536>>,
    /// Deferred policy: flush timeout, milliseconds (1..=10000; default
    /// the library's, 10).
    #[arg(long)]
    pub flush_timeout_ms: Option<Ranged<1, 10_000>>,
    /// Latency model.
    #[arg(long, value_enum, default_value_t = Latency::Vtd2015)]
    pub latency: Latency,
    /// Policies to run (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<DmaPolicyName>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for RingArgs {
    fn default() -> Self {
        Self {
            msg_size: Ranged::new(32),
            seconds: None,
            rounds: None,
            quick: false,
            streams: Ranged::new(1),
            ring: Ranged::new(256),
            placement: Placement::Split,
            flush_high_water: None,
            flush_timeout_ms: None,
            latency: Latency::Vtd2015,
            policies: Vec::new(),
            json: false,
        }
    }
}

/// One policy's row.
#[derive(Debug, Clone, Serialize)]
pub struct RingRow {
    /// Policy name.
    pub policy: String,
    /// Million packets per second.
    pub mpps: f64,
    /// CPU-side CPU time over wall time, percent of one CPU.
    pub cpu_pct: f64,
    /// CPU-side CPU microseconds per packet (service demand).
    pub us_per_pkt: f64,
    /// Device threads' busy time over wall time, percent of one CPU.
    pub device_busy_pct: f64,
    /// Packets sent.
    pub packets: u64,
    /// Frames the device refused (bad checksum or translation fault); zero
    /// unless something is broken.
    pub device_errors: u64,
    /// Deferred only: the longest time an unmapped buffer stayed reachable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_window_ms_max: Option<f64>,
    /// Deferred only: flushes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flushes: Option<u64>,
    /// Host steal time over the measured window, percent of all CPUs'
    /// time (`/proc/stat`): on a shared VM, the time the hypervisor ran
    /// something else. High steal stretches any latency, a flush's too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_steal_pct: Option<f64>,
    /// `us_per_pkt` over the rounds (min, median, max); `null` with one
    /// round.
    pub us_per_pkt_spread: Option<Spread>,
    /// Whether the row's service demand is physically possible: deferred
    /// must not cost less than pass-through, nor strict less than
    /// deferred, beyond the spread (a single round compared as a point).
    pub valid: bool,
    /// Why not, when `valid` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The JSON object of `bench ring --json`.
#[derive(Debug, Clone, Serialize)]
pub struct RingReport {
    /// Always "ring".
    pub bench: &'static str,
    /// Payload bytes.
    pub msg_size: usize,
    /// Seconds per policy.
    pub seconds: f64,
    /// Where the threads ran.
    pub placement: Placement,
    /// Interleaved rounds; each row is its policy's median round, except
    /// `stale_window_ms_max` and `flushes`, which cover every round.
    pub rounds: usize,
    /// What is modelled, nanoseconds.
    pub modelled: Vec<(String, u64)>,
    /// One row per policy.
    pub rows: Vec<RingRow>,
}

const DESC: u64 = 16; // buffer address (8), length (4), status (4)
const DONE: u32 = 1;

struct Ring {
    desc_phys: PhysAddr,
    desc_dma: u64,
    size: u64,
    tail: AtomicU64,
    stop: AtomicBool,
    /// Set when the warm-up ends: the device counts its time from then.
    measuring: AtomicBool,
    /// The sender sleeps on a full ring; the device wakes it (an
    /// interrupt, in effect), so the sender's CPU time is only its work.
    sender_waiting: AtomicBool,
    sender: std::sync::OnceLock<std::thread::Thread>,
}

impl Ring {
    fn wake_sender(&self) {
        if self.sender_waiting.load(Ordering::SeqCst) {
            self.sender_waiting.store(false, Ordering::SeqCst);
            if let Some(t) = self.sender.get() {
                t.unpark();
            }
        }
    }
}

/// The device loop; returns its thread's CPU time since the warm-up ended.
fn device(
    ring: &Ring,
    mem: &PhysMemory,
    mut tr: Translator,
    sid: SourceId,
    busy: &AtomicU64,
    errors: &AtomicU64,
) -> Duration {
    let mut cpu0: Option<Duration> = None;
    let mut head = 0u64;
    let mut woken_at = 0u64;
    let mut frame = vec![0u8; 64 << 10];
    let mut busy_ns = 0u128;
    let mut idle = 0u32;
    loop {
        if cpu0.is_none() && ring.measuring.load(Ordering::Acquire) {
            cpu0 = Some(cpu_clock::thread());
            busy_ns = 0;
        }
        let tail = ring.tail.load(Ordering::Acquire);
        if head == tail {
            if ring.stop.load(Ordering::Acquire) {
                break;
            }
            idle += 1;
            if idle > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        idle = 0;
        let t0 = Instant::now();
        while head != tail {
            let at = ring.desc_dma + (head % ring.size) * DESC;
            let ok = tr.section(|g| -> Option<()> {
                let d = g.translate_page(sid, at, Access::Read).ok()?;
                let mut raw = [0u8; 12];
                mem.read(d.phys, &mut raw).ok()?;
                let buf = u64::from_le_bytes(raw[0..8].try_into().ok()?);
                let len = u32::from_le_bytes(raw[8..12].try_into().ok()?) as usize;
                let ranges = g.translate(sid, buf, len as u64, Access::Read).ok()?;
                let mut off = 0;
                for r in ranges.iter() {
                    mem.read(r.phys, &mut frame[off..off + r.len as usize])
                        .ok()?;
                    off += r.len as usize;
                }
                packet::verify(&frame[..len]).ok()?;
                let st = g.translate_page(sid, at + 12, Access::Write).ok()?;
                mem.write(st.phys, &DONE.to_le_bytes()).ok()?;
                Some(())
            });
            if ok.is_none() {
                errors.fetch_add(1, Ordering::Relaxed);
                // Complete it anyway so the sender can reclaim: a real NIC
                // reports the error in the status.
                let _ = mem.write(
                    ring.desc_phys + (head % ring.size) * DESC + 12,
                    &3u32.to_le_bytes(),
                );
            }
            head += 1;
        }
        busy_ns += t0.elapsed().as_nanos();
        // Interrupt moderation: wake a sleeping sender once a quarter of the
        // ring is done, or when there is nothing left to do.
        if head - woken_at >= ring.size / 4 || head == ring.tail.load(Ordering::Acquire) {
            ring.wake_sender();
            woken_at = head;
        }
    }
    busy.fetch_add(busy_ns as u64, Ordering::Relaxed);
    cpu0.map_or(Duration::ZERO, |t0| cpu_clock::thread().saturating_sub(t0))
}

/// The end of a sender's warm-up: the barrier every sender and the main
/// thread meet at, met at the latest when this is dropped.
struct Start<'a> {
    go: &'a Barrier,
    met: bool,
}

impl Start<'_> {
    fn meet(&mut self) {
        if !self.met {
            self.met = true;
            self.go.wait();
        }
    }
}

impl Drop for Start<'_> {
    fn drop(&mut self) {
        self.meet();
    }
}

struct Sender {
    pin: Option<usize>,
    cpu: DmaCpu,
    dev: DmaDevice,
    ring: Arc<Ring>,
    mem: Arc<PhysMemory>,
    bufs: Vec<PhysAddr>,
    inflight: Vec<(u64, u64)>,
    payload: Vec<u8>,
    scratch: Vec<u8>,
}

impl Sender {
    /// Reclaims completed descriptors from `clean` on; returns the new clean.
    fn reclaim(&mut self, mut clean: u64, tail: u64) -> LabResult<u64> {
        while clean != tail {
            let slot = clean % self.ring.size;
            let mut st = [0u8; 4];
            self.mem
                .read(self.ring.desc_phys + slot * DESC + 12, &mut st)?;
            if u32::from_le_bytes(st) == 0 {
                break;
            }
            let (dma, len) = self.inflight[slot as usize];
            self.cpu
                .unmap(&self.dev, dma, len, DmaDirection::ToDevice)?;
            clean += 1;
        }
        Ok(clean)
    }

    /// Sends until `warm_until` uncounted, meets the others at `go`, then
    /// sends until `until`; returns the packets sent after `go`. Meets them
    /// at `go` even when it fails or panics first, so nobody waits forever.
    fn run(
        &mut self,
        warm_until: Instant,
        go: &Barrier,
        until: Instant,
        msg: usize,
    ) -> LabResult<u64> {
        let mut start = Start { go, met: false };
        self.send(warm_until, &mut start, until, msg)
    }

    fn send(
        &mut self,
        warm_until: Instant,
        start: &mut Start<'_>,
        until: Instant,
        msg: usize,
    ) -> LabResult<u64> {
        let flow = Flow::default();
        let (mut tail, mut clean, mut sent) = (0u64, 0u64, 0u64);
        let len = HEADERS + msg;
        loop {
            let now = Instant::now();
            if !start.met && now >= warm_until {
                sent = 0;
                start.meet();
            } else if start.met && now >= until && (sent > 0 || now >= until + LATE_START) {
                // A window never closes on a sender that has not yet been
                // scheduled in it (a busy machine): it runs on until it
                // has counted work, for at most `LATE_START` more; a row
                // that still counted nothing is marked invalid.
                break;
            }
            for _ in 0..32 {
                if tail - clean == self.ring.size {
                    clean = self.reclaim(clean, tail)?;
                    if tail - clean == self.ring.size {
                        // Full: sleep until the device completes something.
                        self.ring.sender_waiting.store(true, Ordering::SeqCst);
                        clean = self.reclaim(clean, tail)?;
                        if tail - clean == self.ring.size {
                            std::thread::park_timeout(Duration::from_millis(1));
                        }
                        self.ring.sender_waiting.store(false, Ordering::SeqCst);
                        continue;
                    }
                }
                let slot = tail % self.ring.size;
                let buf = self.bufs[slot as usize];
                // The stack builds the frame (copying the payload in).
                let n = packet::build(&mut self.scratch, &flow, tail as u16, &self.payload[..msg]);
                self.mem.write(buf, &self.scratch[..n])?;
                let dma = match self
                    .cpu
                    .map(&self.dev, buf, len as u64, DmaDirection::ToDevice)
                {
                    Ok(dma) => dma,
                    // The bounce pool full of frames in flight: as a
                    // driver's busy transmit queue, wait for completions
                    // to give slots back, then try again.
                    Err(DmaError::BounceFull { .. }) => {
                        self.ring.sender_waiting.store(true, Ordering::SeqCst);
                        clean = self.reclaim(clean, tail)?;
                        std::thread::park_timeout(Duration::from_millis(1));
                        self.ring.sender_waiting.store(false, Ordering::SeqCst);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                self.inflight[slot as usize] = (dma, len as u64);
                let mut d = [0u8; 16];
                d[0..8].copy_from_slice(&dma.to_le_bytes());
                d[8..12].copy_from_slice(&(len as u32).to_le_bytes());
                self.mem.write(self.ring.desc_phys + slot * DESC, &d)?;
                tail += 1;
                self.ring.tail.store(tail, Ordering::Release);
                sent += 1;
                if tail - clean >= self.ring.size / 2 {
                    clean = self.reclaim(clean, tail)?;
                }
            }
        }
        // Drain: wait for the device, unmap everything.
        let t0 = Instant::now();
        while clean != tail && t0.elapsed() < Duration::from_secs(5) {
            clean = self.reclaim(clean, tail)?;
            std::thread::yield_now();
        }
        Ok(sent)
    }
}

/// How long past its window's end a sender that has counted no packet yet
/// keeps sending before its row is given up as invalid.
const LATE_START: Duration = Duration::from_secs(10);

fn run_policy(
    policy: DmaPolicy,
    args: &RingArgs,
    seconds: f64,
    model: LatencyModel,
) -> LabResult<RingRow> {
    let streams = args.streams.us();
    let ring_size = args.ring.get();
    let msg = args.msg_size.us();
    // Memory for every stream's ring of buffers (each a power of two of
    // pages), the bounce pool and a GiB for the rest: 8 streams of 4,096
    // 60 KiB buffers took 2 GiB, and a fixed 2 GiB ran out. Under bounce
    // the pool holds them all in flight (up to the domain's 1 GiB; past
    // it a full pool holds the sender back). Sparse: only what is touched
    // is backed.
    let frame = ((HEADERS + msg) as u64).div_ceil(4096).next_power_of_two() * 4096;
    let buffers = streams as u64 * ring_size * frame;
    let bounce = if policy == DmaPolicy::Bounce {
        buffers.clamp(16 << 20, 1 << 30)
    } else {
        16 << 20
    };
    let memory = (1 << 30) + buffers + DmaRig::bounce_memory(bounce);
    let rig = DmaRig::new(policy, model, SourceId(0x0200), memory, bounce)?;
    if let Some(hw) = args.flush_high_water {
        // The mark is clamped to the queues' size: make room for it first
        // (queues are made with each CPU handle, below).
        rig.domain.set_queue_size(hw.us().max(256))?;
        rig.domain.set_high_water(hw.us())?;
    }
    if let Some(ms) = args.flush_timeout_ms {
        rig.domain.set_timeout(Duration::from_millis(ms.get()))?;
    }
    let (mem, sys, unit, sid, domain, dev) = (
        rig.mem.clone(),
        rig.sys.clone(),
        rig.unit,
        rig.sid,
        rig.domain.clone(),
        rig.dev.clone(),
    );
    let busy = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    let mut devices = Vec::new();
    let mut rings = Vec::new();
    let frame_bytes = (HEADERS + msg) as u64;
    let buf_order = frame_bytes.div_ceil(4096).next_power_of_two().ilog2();
    let allowed = affinity::allowed_cpus();
    for s in 0..streams {
        let pins = args.placement.stream_cpus(s, &allowed);
        let mut cpu = domain.cpu();
        let (desc_phys, desc_dma) = cpu.alloc_coherent(&dev, ring_size * DESC)?;
        let ring = Arc::new(Ring {
            desc_phys,
            desc_dma,
            size: ring_size,
            tail: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            measuring: AtomicBool::new(false),
            sender_waiting: AtomicBool::new(false),
            sender: std::sync::OnceLock::new(),
        });
        let bufs = if frame_bytes <= 2048 {
            // Two small buffers a page, as a driver's page-split receive
            // buffers or skb heads would share pages.
            let pages = ring_size.div_ceil(2);
            let base = mem.alloc_zeroed_frames(pages.next_power_of_two().ilog2())?;
            (0..ring_size)
                .map(|i| base + (i / 2) * 4096 + (i % 2) * 2048)
                .collect()
        } else {
            (0..ring_size)
                .map(|_| mem.alloc_zeroed_frames(buf_order))
                .collect::<Result<Vec<_>, _>>()?
        };
        let payload: Vec<u8> = (0..msg)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(s as u8))
            .collect();
        senders.push(Sender {
            pin: pins.map(|p| p.0),
            cpu,
            dev: dev.clone(),
            ring: ring.clone(),
            mem: mem.clone(),
            bufs,
            inflight: vec![(0, 0); ring_size as usize],
            payload,
            scratch: vec![0u8; HEADERS + msg],
        });
        let (r, m, b, e, sys) = (
            ring.clone(),
            mem.clone(),
            busy.clone(),
            errors.clone(),
            sys.clone(),
        );
        devices.push(std::thread::spawn(move || -> LabResult<Duration> {
            if let Some((_, c)) = pins {
                affinity::pin_current(c);
            }
            // A translator belongs to the thread that made it.
            let tr = sys
                .unit(unit)
                .ok_or(LabError::Setup("the rig's unit is missing"))?
                .translator()?;
            Ok(device(&r, &m, tr, sid, &b, &e))
        }));
        rings.push(ring);
    }
    // A warm-up, not measured, lets the page tables, the IOVA caches and
    // the IOTLB reach their steady state first (a short round would
    // otherwise charge a translated policy for building them).
    let warm = Duration::from_secs_f64((seconds * 0.15).clamp(0.05, 0.5));
    let warm_until = Instant::now() + warm;
    let until = warm_until + Duration::from_secs_f64(seconds);
    let go = Arc::new(Barrier::new(streams + 1));
    let handles: Vec<_> = senders
        .into_iter()
        .map(|mut s| {
            let go = go.clone();
            std::thread::spawn(move || {
                if let Some(c) = s.pin {
                    affinity::pin_current(c);
                }
                let _ = s.ring.sender.set(std::thread::current());
                s.run(warm_until, &go, until, msg).map(|n| (n, s))
            })
        })
        .collect();
    go.wait();
    let wall0 = Instant::now();
    let cpu0 = cpu_clock::process();
    let steal = crate::lab::steal::StealWindow::start();
    for r in &rings {
        r.measuring.store(true, Ordering::Release);
    }
    let mut packets = 0;
    let mut done = Vec::new();
    for h in handles {
        let (n, s) = join(h, "sender")??;
        packets += n;
        done.push(s);
    }
    let wall = wall0.elapsed();
    let host_steal_pct = steal.pct();
    for r in &rings {
        r.stop.store(true, Ordering::Release);
    }
    let mut device_cpu = Duration::ZERO;
    for d in devices {
        device_cpu += join(d, "device")??;
    }
    let cpu_side = cpu_clock::process()
        .saturating_sub(cpu0)
        .saturating_sub(device_cpu);
    let deferred = policy == DmaPolicy::Deferred;
    let stale = domain.stale_window();
    let stats = domain.stats();
    drop(done);
    Ok(RingRow {
        policy: policy.name().to_string(),
        mpps: packets as f64 / wall.as_secs_f64() / 1e6,
        cpu_pct: cpu_side.as_secs_f64() / wall.as_secs_f64() * 100.0,
        us_per_pkt: cpu_side.as_secs_f64() * 1e6 / packets.max(1) as f64,
        device_busy_pct: busy.load(Ordering::Relaxed) as f64 / 1e9 / wall.as_secs_f64() * 100.0,
        packets,
        device_errors: errors.load(Ordering::Relaxed),
        stale_window_ms_max: deferred.then_some(stale.max.as_secs_f64() * 1e3),
        flushes: deferred.then_some(stats.flushes),
        host_steal_pct,
        us_per_pkt_spread: None,
        valid: packets > 0,
        why: (packets == 0).then(|| "no packet was sent in the measured window".to_string()),
    })
}

/// Runs the bench.
pub fn run(args: &RingArgs) -> LabResult<Report> {
    let model = args.latency.model();
    let seconds = args
        .seconds
        .map_or(if args.quick { 2.0 } else { 10.0 }, Seconds::get);
    let policies = dma_policies(&args.policies);
    let rounds = args
        .rounds
        .map_or(if args.quick { 3 } else { 5 }, Ranged::us);
    let mut runs: Vec<Vec<RingRow>> = vec![Vec::new(); policies.len()];
    for _ in 0..rounds {
        for (i, &p) in policies.iter().enumerate() {
            runs[i].push(run_policy(p, args, seconds / rounds as f64, model)?);
        }
    }
    let mut rows: Vec<RingRow> = runs.into_iter().map(median_round).collect();
    check_policies(&mut rows);
    let r = RingReport {
        bench: "ring",
        msg_size: args.msg_size.us(),
        seconds,
        placement: args.placement,
        rounds,
        modelled: modelled(model),
        rows,
    };
    Ok(report(&r, args))
}

/// A policy's median round by µs per packet; the stale window and the host
/// steal are the worst of every round and the flushes their sum (bounds and
/// a count, not typical values).
fn median_round(mut runs: Vec<RingRow>) -> RingRow {
    let stale = runs
        .iter()
        .filter_map(|r| r.stale_window_ms_max)
        .reduce(f64::max);
    let flushes = runs.iter().filter_map(|r| r.flushes).reduce(|a, b| a + b);
    let steal = runs
        .iter()
        .filter_map(|r| r.host_steal_pct)
        .reduce(f64::max);
    // A round that sent nothing has no figure: the row is invalid with it.
    let empty = runs.iter().find(|r| !r.valid).and_then(|r| r.why.clone());
    let spread = Spread::of_rounds(&runs.iter().map(|r| r.us_per_pkt).collect::<Vec<_>>());
    runs.sort_by(|a, b| a.us_per_pkt.total_cmp(&b.us_per_pkt));
    let mut row = runs.swap_remove(runs.len() / 2);
    row.us_per_pkt_spread = spread;
    row.stale_window_ms_max = stale;
    row.flushes = flushes;
    row.host_steal_pct = steal;
    if let Some(why) = empty {
        row.valid = false;
        row.why = Some(why);
    }
    row
}

/// Marks the rows whose service demand contradicts what the policy must
/// cost, beyond the spread.
fn check_policies(rows: &mut [RingRow]) {
    let costs: Vec<PolicyCost<'_>> = rows
        .iter()
        .map(|x| PolicyCost {
            policy: &x.policy,
            group: "",
            cost: x
                .us_per_pkt_spread
                .unwrap_or_else(|| Spread::of(&[x.us_per_pkt])),
        })
        .collect();
    let why = policy_physics::check(&costs, "service demand");
    for (x, w) in rows.iter_mut().zip(why) {
        if let Some(w) = w {
            x.valid = false;
            x.why = Some(w);
        }
    }
}

/// The typed report, seed-style: per policy, throughput, CPU and service
/// demand beside pass-through's.
fn report(r: &RingReport, args: &RingArgs) -> Report {
    let base_row = r.rows.iter().find(|x| x.policy == "passthrough");
    let base = base_row.map(|x| x.us_per_pkt);
    let modelled = modelled_figures(&r.modelled);
    let m = !modelled.is_empty();
    let mut t = Table::new(
        "results",
        format!(
            "hand-built UDP frames, {} byte messages, {:.1} s per policy in {} interleaved rounds ({}), placement {}",
            r.msg_size,
            r.seconds,
            r.rounds,
            if r.rounds > 1 {
                "median round shown, [lowest–highest round] beside it"
            } else {
                "one round, so no spread"
            },
            r.placement.name()
        ),
        vec![
            Column::label("policy"),
            Column::metric("mpps", "throughput", Unit::Mpps, 3).modelled_if(m),
            Column::metric("cpu_pct", "CPU", Unit::PercentCpu, 0).modelled_if(m),
            Column::metric("us_per_pkt", "service demand", Unit::UsPerPkt, 3).modelled_if(m),
            Column::metric("vs_passthrough", "vs passthrough", Unit::Ratio, 2).modelled_if(m),
            Column::metric("device_busy_pct", "device busy", Unit::PercentCpu, 0),
            Column::metric("stale_window_ms_max", "stale max", Unit::Ms, 2).modelled_if(m),
            Column::metric("flushes", "flushes", Unit::Count, 0),
            Column::metric("host_steal_pct", "host steal", Unit::Percent, 1),
            Column::text("valid"),
        ],
    );
    for x in &r.rows {
        // The base over itself is 1 exactly: no spread.
        let vs_spread = base_row
            .filter(|b| b.policy != x.policy)
            .and_then(|b| x.us_per_pkt_spread?.ratio(&b.us_per_pkt_spread?));
        t.row(vec![
            x.policy.clone().into(),
            x.mpps.into(),
            x.cpu_pct.into(),
            Cell::figure(x.us_per_pkt, x.us_per_pkt_spread),
            base.map_or(Cell::Missing, |b| Cell::figure(x.us_per_pkt / b, vs_spread)),
            x.device_busy_pct.into(),
            x.stale_window_ms_max.into(),
            x.flushes.map(|f| f as f64).into(),
            x.host_steal_pct.into(),
            if x.valid { "yes" } else { "NO" }.into(),
        ]);
        if let Some(why) = &x.why {
            t.mark_invalid(x.policy.clone(), why.clone());
        }
    }
    let mut rep = Report::new(
        "bench ring",
        "hand-built UDP frames through a bare NIC ring per DMA policy, no stack: the floor of seed 000's service demand",
        contract(r),
    )
    .seed("000");
    rep.params = vec![
        Param::new("msg_size", r.msg_size, Unit::Bytes),
        Param::new("seconds", format!("{:.2}", r.seconds), Unit::S),
        Param::new("rounds", r.rounds, Unit::Count),
        Param::new("streams", args.streams, Unit::Threads),
        Param::new("ring", args.ring, Unit::Entries),
        Param::text("placement", r.placement.name()),
        Param::text("latency", args.latency.name()),
    ];
    if let Some(hw) = args.flush_high_water {
        rep.params
            .push(Param::new("flush_high_water", hw, Unit::Entries));
    }
    if let Some(ms) = args.flush_timeout_ms {
        rep.params
            .push(Param::new("flush_timeout_ms", ms, Unit::Ms));
    }
    rep.modelled = modelled;
    rep.tables.push(t);
    if r.rows.len() < 2 {
        return rep;
    }
    rep.plots.push(Plot {
        name: "service_demand".into(),
        title: format!(
            "service demand per policy, {} byte messages (CPU µs per packet; lower is better)",
            r.msg_size
        ),
        kind: PlotKind::Bars,
        x: Axis::new("policy", Unit::Count),
        y: Axis::new("service demand", Unit::UsPerPkt),
        categories: r.rows.iter().map(|x| x.policy.clone()).collect(),
        series: vec![Series {
            spreads: r
                .rows
                .iter()
                .map(|x| x.us_per_pkt_spread.map(|s| (s.min, s.max)))
                .collect(),
            ..Series::new(
                "median round",
                r.rows
                    .iter()
                    .enumerate()
                    .map(|(i, x)| (i as f64, x.us_per_pkt))
                    .collect(),
            )
        }],
        modelled: m,
    });
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &str, rounds: &[f64]) -> RingRow {
        let s = Spread::of(rounds);
        RingRow {
            policy: policy.into(),
            mpps: 1.0,
            cpu_pct: 100.0,
            us_per_pkt: s.median,
            device_busy_pct: 50.0,
            packets: 1000,
            device_errors: 0,
            stale_window_ms_max: None,
            flushes: None,
            host_steal_pct: None,
            us_per_pkt_spread: Spread::of_rounds(rounds),
            valid: true,
            why: None,
        }
    }

    #[test]
    fn deferred_below_passthrough_on_the_ring_is_invalid() {
        let mut rows = vec![
            row("passthrough", &[0.50, 0.52, 0.54]),
            row("strict", &[1.9, 2.0, 2.1]),
            row("deferred", &[0.40, 0.42, 0.44]),
        ];
        check_policies(&mut rows);
        assert!(rows[0].valid && rows[1].valid);
        assert!(
            matches!(&rows[2].why, Some(w) if w.starts_with("measurement invalid: deferred's service demand") && w.contains("below passthrough's")),
            "{:?}",
            rows[2].why
        );
        let r = RingReport {
            bench: "ring",
            msg_size: 32,
            seconds: 1.0,
            placement: Placement::Split,
            rounds: 3,
            modelled: Vec::new(),
            rows,
        };
        let rep = report(&r, &RingArgs::default());
        assert_eq!(rep.contract["rows"][2]["valid"], false);
        let t = &rep.tables[0];
        assert!(t.invalid_why("deferred").is_some() && t.invalid_why("strict").is_none());
        let vs = t.spread("deferred", "vs_passthrough").unwrap();
        assert_eq!((vs.min, vs.max), (0.40 / 0.54, 0.44 / 0.50));
    }

    #[test]
    fn one_round_compares_points_and_carries_no_spread() {
        let mut rows = vec![row("passthrough", &[0.5]), row("deferred", &[0.6])];
        check_policies(&mut rows);
        assert!(rows.iter().all(|x| x.valid));
        assert_eq!(rows[1].us_per_pkt_spread, None);
        rows[1].us_per_pkt = 0.4;
        check_policies(&mut rows);
        assert!(!rows[1].valid);
    }

    /// A round that sent no packet (its sender never ran in the window)
    /// leaves its policy's row invalid with the reason, whichever round
    /// the median picks.
    #[test]
    fn a_round_that_sent_nothing_leaves_the_row_invalid() {
        let ok = |us: f64| RingRow {
            us_per_pkt: us,
            ..row("deferred", &[us])
        };
        let mut empty = ok(4583.0);
        empty.packets = 0;
        empty.valid = false;
        empty.why = Some("no packet was sent in the measured window".into());
        let r = median_round(vec![ok(1.0), empty, ok(1.1)]);
        assert_eq!(r.us_per_pkt, 1.1);
        assert!(!r.valid);
        assert_eq!(
            r.why.as_deref(),
            Some("no packet was sent in the measured window")
        );
        let r = median_round(vec![ok(1.0), ok(1.2), ok(1.1)]);
        assert!(r.valid && r.why.is_none());
    }
}
