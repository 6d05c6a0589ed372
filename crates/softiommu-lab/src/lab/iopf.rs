//! `softiommu lab iopf`: seed `002`'s experiment. An accelerator-like
//! device processes messages of `msg_len` bytes that the CPU wrote, `times`
//! sends over the same buffer, either with the buffer pinned and mapped
//! before the device runs (without IOPF) or left unmapped so that the
//! device's first touch of each page faults and the page request handler
//! maps it on demand with a pre-map window of `premap_pages` (with IOPF).
//!
//! Every send is real work by our code: the device reads the whole message
//! through the unit's translation (IOTLB, page walks, and with IOPF the page
//! requests, the handler's mapping and the group responses) into a
//! device-local buffer of [`CHUNK`] bytes and folds it into a checksum,
//! which must equal the CPU's (the data arrived intact). Nothing is
//! modelled: the unit's latency model is zero and the handler's time is
//! what its thread takes.
//!
//! The configurations run side by side: each has its own device on its
//! own unit over the same backing (the pinned one, and one per pre-map
//! window), and a run sends on each device in turn, `times` rounds, timing
//! every send; a burst of load from elsewhere on a shared machine falls on
//! all of them alike. A run is repeated `repeats` times on fresh address
//! spaces and each configuration's fastest run is kept.
//!
//! A configuration's time is the sum of its sends' times, with one robust
//! step: the sends during which its device raised no page request do
//! exactly the same work in every configuration, and on a machine shared
//! with other processes their wall times carry whatever preemption
//! happened to land on them; they count as their median each. The sends
//! that faulted (the first, and any later one that did) count as measured.
//!
//! # On CPU time
//!
//! Beside each configuration's wall-clock time (the seed's kB/s), the lab
//! takes the CPU time of its work: per send, the device thread's CPU
//! clock less what it spent waiting for page responses
//! (`DmaAccessor::time_page_waits`), plus, with IOPF, the CPU its page
//! request handler threads spent serving the send's requests, from taking
//! each off the queue to its answer carried out
//! (`IopfHandler::time_service`). The fault path needs both threads' work:
//! the device misses, raises and retries, the handler maps and answers.
//! Their waiting — the device's spin for an answer, the handler's polls
//! of an empty queue, its sleep and wake-up — is not counted: how much of
//! it a send takes follows who else has the cores (a handler woken late
//! by a co-runner keeps the device spinning), not the work. The timing
//! costs each page request four clock reads (system calls), so each
//! repeat runs twice: untimed for the wall-clock figures and the
//! latencies, then timed for the CPU figures. The same robust step
//! applies (fault-free sends count as their median). The headline ratio, `cpu_ratio_pct`, is kB per
//! CPU-second with IOPF over pinned's, the median over the repeats of
//! each repeat's paired ratio with its spread; a co-runner that delays
//! the handler's wake-up or takes a core mid-send moves the wall figure
//! (`ratio_pct`, the seed's own column, kept beside it) but not the work.
//!
//! With `--promote on` (the default, the library's default) the faulting
//! domains promote: a fault that completes a 2 MiB block of the message
//! collapses its 4 KiB leaves into one 2 MiB leaf, so after the first send
//! the device needs the pinned side's 5 IOTLB entries for 10 MiB, not
//! 2,560. `--promote off` shows the 4 KiB-only behaviour.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiommu::hw::UnitId;
use softiommu::iopf::{IopfConfig, IopfDomain, IopfHandler, LatencyHistogram, Region};
use softiommu::{
    DmaAccessor, DmaAttrs, Perm, PhysAddr, PhysMemory, SourceId, System, UnitConfig, PAGE_SIZE,
};

use crate::args::{ArgError, Placement, Ranged};
use crate::error::{LabError, LabResult};
use crate::metrics::cpu_clock;
use crate::metrics::pinning as affinity;
use crate::report::{
    contract, Axis, Cell, Column, Param, Plot, PlotKind, Report, Series, Spread, Table, Unit,
};

/// The device-local buffer a send reads the message into, chunk by chunk:
/// 64 KiB, an accelerator's on-chip SRAM order of magnitude.
const CHUNK: usize = 64 << 10;
/// The message's IOVA (1 GiB aligned, so that a 2 MiB-aligned backing is
/// mapped with 2 MiB leaves when the window or the pinning covers them).
const MSG_IOVA: u64 = 1 << 30;
/// The accelerator's requester id.
const DEV: SourceId = SourceId(0x0a00);
/// The largest message: 256 MiB.
pub const MAX_MSG_LEN: u64 = 256 << 20;
/// The lab's handler spin: 2^15 empty polls (16,384 pausing, then 16,384
/// yielding the core), so the handler is awake for the next fault of a
/// burst without starving a device that shares its core.
const LAB_SPIN_POLLS: u64 = 1 << 15;
/// The largest pre-map window, the library's.
const MAX_PREMAP: u64 = softiommu::iopf::MAX_PREMAP_PAGES;

/// A message length in bytes: a whole number of 4 KiB pages, 4 KiB to
/// [`MAX_MSG_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct MsgLen(u64);

impl MsgLen {
    /// The bytes.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for MsgLen {
    type Error = ArgError;
    fn try_from(v: u64) -> Result<Self, ArgError> {
        let r: Ranged<PAGE_SIZE, MAX_MSG_LEN> = Ranged::try_from(v)?;
        if !r.get().is_multiple_of(PAGE_SIZE) {
            return Err(ArgError::NotAMultiple {
                value: v.to_string(),
                of: PAGE_SIZE,
            });
        }
        Ok(Self(v))
    }
}

impl From<MsgLen> for u64 {
    fn from(v: MsgLen) -> u64 {
        v.0
    }
}

impl FromStr for MsgLen {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        let r: Ranged<PAGE_SIZE, MAX_MSG_LEN> = s.parse()?;
        Self::try_from(r.get())
    }
}

impl fmt::Display for MsgLen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Whether the faulting domains promote completed 2 MiB blocks to 2 MiB
/// leaves ([`IopfConfig::promote`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Promote {
    /// Promote (the library's default).
    #[default]
    On,
    /// Keep the 4 KiB leaves each fault mapped.
    Off,
}

impl Promote {
    /// Whether it is on.
    pub fn on(self) -> bool {
        self == Promote::On
    }
}

/// Options of `lab iopf` (and of a `[lab-iopf]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IopfArgs {
    /// Message lengths in bytes, whole 4 KiB pages (4096..=268435456;
    /// default 1048576,10485760, the seed's 1 MB and 10 MB).
    #[arg(long, value_delimiter = ',')]
    pub msg_len: Vec<MsgLen>,
    /// Sends over the same buffer per row (1..=1000000; default
    /// 1,100,1000,5000 as the seed; with --quick 1,100,1000,5000 for
    /// messages up to 1 MiB and 1,100 above).
    #[arg(long, value_delimiter = ',')]
    pub times: Vec<Ranged<1, 1_000_000>>,
    /// Pre-map windows, pages mapped per fault (1..=262144; default 1,512,
    /// the seed's PREMAP_LEN values).
    #[arg(long, value_delimiter = ',')]
    pub premap_pages: Vec<Ranged<1, MAX_PREMAP>>,
    /// Page request handler threads (1..=16).
    #[arg(long, default_value = "1")]
    pub handler_threads: Ranged<1, 16>,
    /// Empty polls of the page request queue before a handler thread
    /// sleeps on its doorbell (0..=67108864). The default, 32768 (16,384
    /// pausing polls, then 16,384 that yield the core), keeps the handler spinning across a
    /// device's burst of faults (the spinning design); the library's
    /// default 2048 (a few µs) parks between faults, so each pays a
    /// wake-up (the parking design); 0 parks at once.
    #[arg(long, default_value = "32768")]
    pub handler_spin: Ranged<0, { softiommu::iopf::MAX_SPIN_POLLS as u64 }>,
    /// Where the device thread and the handler threads run: `split` (the
    /// default) pins them to two different CPUs, `shared` both to one,
    /// `os` pins nothing (a spinning party may then share a core with the
    /// one it waits for, at a scheduler tick's cost).
    #[arg(long, value_enum, default_value = "split")]
    pub placement: Placement,
    /// Whether a fault that completes a 2 MiB block of the message
    /// collapses its 4 KiB leaves into one 2 MiB leaf: `on` (the default)
    /// or `off` (4 KiB leaves only, as before promotion existed).
    #[arg(long, value_enum, default_value = "on")]
    pub promote: Promote,
    /// Runs per configuration, interleaved; the fastest is kept (1..=100;
    /// default 3, with --quick 2).
    #[arg(long)]
    pub repeats: Option<Ranged<1, 100>>,
    /// The short form (about 10 s of CPU on 2 cores): messages above 1 MiB
    /// stop at 100 sends (1 MiB keeps 1 to 5,000) and every configuration
    /// runs twice.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for IopfArgs {
    fn default() -> Self {
        Self {
            msg_len: Vec::new(),
            times: Vec::new(),
            premap_pages: Vec::new(),
            handler_threads: Ranged::new(1),
            handler_spin: Ranged::new(LAB_SPIN_POLLS),
            placement: Placement::Split,
            promote: Promote::On,
            repeats: None,
            quick: false,
            json: false,
        }
    }
}

/// One (msg_len, times, premap_pages) row, the seed's columns.
#[derive(Debug, Clone, Serialize)]
pub struct IopfRow {
    /// Message length, bytes.
    pub msg_len: u64,
    /// Sends over the same buffer.
    pub times: u64,
    /// Pages mapped per fault.
    pub premap_pages: u64,
    /// Pinned and pre-mapped: kB/s (10^3 bytes) of message processed.
    pub kbps_without: f64,
    /// Mapped on demand: kB/s.
    pub kbps_with: f64,
    /// Page requests the device raised (in the fastest run with IOPF).
    pub faults: u64,
    /// `kbps_with / kbps_without`.
    pub ratio: f64,
}

/// One row's figures on CPU time (kept beside the rows, which hold
/// exactly the seed's columns): kB of message per CPU-second of the
/// threads the fault path needs.
#[derive(Debug, Clone, Serialize)]
pub struct IopfCpu {
    /// Message length, bytes.
    pub msg_len: u64,
    /// Sends over the same buffer.
    pub times: u64,
    /// Pages mapped per fault.
    pub premap_pages: u64,
    /// Pinned: kB (10^3 bytes) per CPU-second of the device thread's work
    /// (median over the repeats).
    pub kbps_per_cpu_s_without: f64,
    /// With IOPF: kB per CPU-second of the device thread's work (less its
    /// waits for page responses) and the handler threads' service of the
    /// requests together (median over the repeats).
    pub kbps_per_cpu_s_with: f64,
    /// With / without per CPU-second: the median over the repeats of each
    /// repeat's paired ratio.
    pub ratio: f64,
    /// `ratio` over the repeats (lowest, median, highest); `null` with
    /// one repeat.
    pub ratio_spread: Option<Spread>,
}

/// Raise-to-answer latency percentiles, microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FaultLatency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// 2 MiB blocks promoted in one row's configuration (kept beside the rows,
/// which hold exactly the seed's columns).
#[derive(Debug, Clone, Serialize)]
pub struct IopfPromotions {
    /// Message length, bytes.
    pub msg_len: u64,
    /// Sends over the same buffer.
    pub times: u64,
    /// Pages mapped per fault.
    pub premap_pages: u64,
    /// Blocks whose 4 KiB leaves were collapsed into a 2 MiB leaf, in the
    /// fastest run with IOPF (0 with `--promote off`, and for blocks a
    /// window mapped whole with a 2 MiB leaf at once).
    pub promotions: u64,
}

/// The JSON object `lab iopf --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct IopfReport {
    /// Always "iopf".
    pub lab: &'static str,
    /// One row per (msg_len, times, premap_pages).
    pub rows: Vec<IopfRow>,
    /// Whether the faulting domains promoted (`--promote`).
    pub promote: bool,
    /// Per row, in the same order: the 2 MiB blocks promoted.
    pub promotions: Vec<IopfPromotions>,
    /// Per row, in the same order: the figures on CPU time.
    pub cpu: Vec<IopfCpu>,
    /// Every page request of every run with IOPF, from its raise (the
    /// unit's stamp) to its group response being carried out, as the
    /// handler measures it.
    pub fault_latency_us: FaultLatency,
    /// The handler's own part of that: from taking the request off the
    /// queue to its answer carried out (the rest is the wait for a handler
    /// thread to look, or to get a CPU).
    pub fault_service_us: FaultLatency,
    /// Page requests that found the queue full, over every run.
    pub overflows: u64,
}

/// The handlers' histograms, merged over every run with IOPF.
#[derive(Default)]
struct Latencies {
    raise_to_answer: LatencyHistogram,
    service: LatencyHistogram,
}

/// What the lab ran with, for the report's parameters.
struct Plan {
    msg_lens: Vec<u64>,
    times: Vec<u64>,
    premaps: Vec<u64>,
    repeats: usize,
    threads: usize,
    spin: u32,
    /// (device CPU, handlers' CPU), when the process may use two.
    cpus: Option<(usize, usize)>,
    quick: bool,
    promote: bool,
}

/// Sends per row in the quick form, for messages up to 1 MiB and above.
const QUICK_TIMES_SMALL: [u64; 4] = [1, 100, 1000, 5000];
const QUICK_TIMES_LARGE: [u64; 2] = [1, 100];

impl Plan {
    fn of(a: &IopfArgs) -> Self {
        let list = |v: Vec<u64>, d: &[u64]| if v.is_empty() { d.to_vec() } else { v };
        Self {
            msg_lens: list(
                a.msg_len.iter().map(|m| m.get()).collect(),
                &[1 << 20, 10 << 20],
            ),
            times: a.times.iter().map(|t| t.get()).collect(),
            premaps: list(a.premap_pages.iter().map(|p| p.get()).collect(), &[1, 512]),
            repeats: a.repeats.map_or(if a.quick { 2 } else { 3 }, Ranged::us),
            threads: a.handler_threads.us(),
            spin: a.handler_spin.get() as u32,
            cpus: match (a.placement, &affinity::allowed_cpus()[..]) {
                (Placement::Split, [d, h, ..]) => Some((*d, *h)),
                (Placement::Shared, [c, ..]) => Some((*c, *c)),
                _ => None,
            },
            quick: a.quick,
            promote: a.promote.on(),
        }
    }

    /// The sends of the rows of `msg_len`.
    fn times_of(&self, msg_len: u64) -> Vec<u64> {
        if !self.times.is_empty() {
            self.times.clone()
        } else if self.quick && msg_len > 1 << 20 {
            QUICK_TIMES_LARGE.to_vec()
        } else {
            QUICK_TIMES_SMALL.to_vec()
        }
    }
}

/// The machine: an arena with the message's backing, and one unit per
/// configuration (the pinned device's, then one per pre-map window), each
/// with its own device, so the configurations' IOTLBs and page request
/// queues never meet.
struct Rig {
    mem: Arc<PhysMemory>,
    sys: Arc<System>,
    msg: PhysAddr,
}

/// Configuration `i`'s device (0: pinned; 1..: the pre-map windows).
fn dev(i: usize) -> SourceId {
    SourceId(DEV.0 + i as u16)
}

impl Rig {
    fn new(largest: u64, configs: usize) -> LabResult<Self> {
        let pages = largest.div_ceil(PAGE_SIZE).next_power_of_two();
        // The message's frames, and room for page tables and the queues.
        let mem = Arc::new(PhysMemory::new(pages * PAGE_SIZE + (64 << 20))?);
        let mut sys = System::new(mem.clone());
        for i in 0..configs {
            let unit = sys.add_unit(UnitConfig {
                // A handler that is descheduled on a loaded machine is
                // late, not dead: the device waits for it this long.
                page_response_timeout: Duration::from_secs(30),
                ..UnitConfig::default()
            })?;
            sys.assign(dev(i), unit)?;
        }
        let msg = mem.alloc_zeroed_frames(pages.ilog2())?;
        Ok(Self {
            mem,
            sys: Arc::new(sys),
            msg,
        })
    }

    /// A fresh address space for configuration `i` with the message's
    /// region, its device attached.
    fn domain(
        &self,
        i: usize,
        msg_len: u64,
        premap_pages: u64,
        promote: bool,
    ) -> LabResult<Arc<IopfDomain>> {
        let d = IopfDomain::new(
            self.sys.clone(),
            IopfConfig {
                premap_pages,
                promote,
                ..IopfConfig::default()
            },
        )?;
        d.add_region(Region {
            iova: MSG_IOVA,
            phys: self.msg,
            len: msg_len,
            perm: Perm::RW,
        })?;
        d.attach(dev(i))?;
        Ok(d)
    }

    fn unit_of(&self, i: usize) -> LabResult<(UnitId, &softiommu::Unit)> {
        self.sys
            .unit_of(dev(i))
            .ok_or(LabError::Setup("a device without its unit"))
    }
}

/// The CPU's message: a pattern that differs in every 8 bytes, and its
/// checksum.
fn write_message(rig: &Rig, msg_len: u64) -> LabResult<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut sum = 0u64;
    let mut off = 0u64;
    while off < msg_len {
        let n = (msg_len - off).min(CHUNK as u64) as usize;
        for (i, w) in buf[..n].chunks_exact_mut(8).enumerate() {
            let x = (off / 8 + i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            w.copy_from_slice(&x.to_le_bytes());
        }
        rig.mem.write(rig.msg + off, &buf[..n])?;
        sum = fold(sum, &buf[..n]);
        off += n as u64;
    }
    Ok(sum)
}

/// The device's processing: a checksum of 8-byte words.
fn fold(mut sum: u64, bytes: &[u8]) -> u64 {
    for w in bytes.chunks_exact(8) {
        let x = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        sum = sum.rotate_left(5) ^ x;
    }
    sum
}

/// One send: the device reads the whole message through its unit into
/// its buffer, chunk by chunk, and checks it. Returns the seconds taken.
fn send(acc: &mut DmaAccessor, msg_len: u64, expect: u64, buf: &mut [u8]) -> LabResult<f64> {
    let t0 = Instant::now();
    let mut sum = 0u64;
    let mut off = 0u64;
    while off < msg_len {
        let n = (msg_len - off).min(buf.len() as u64) as usize;
        acc.read(MSG_IOVA + off, &mut buf[..n], DmaAttrs::ORDERED)?;
        sum = fold(sum, &buf[..n]);
        off += n as u64;
    }
    let secs = t0.elapsed().as_secs_f64();
    if sum != expect {
        return Err(LabError::Setup(
            "the device read a message that differs from the CPU's",
        ));
    }
    Ok(secs)
}

/// One run of every configuration at once: fresh address spaces (the
/// pinned one mapped whole first, the others empty with a handler each),
/// then `times` rounds in which each device sends once, in turn, so a
/// burst of load from elsewhere on the machine falls on all of them
/// alike. Returns each configuration's seconds and CPU seconds (summed
/// over its sends), page requests and promotions. With `timed`, the
/// device's waits and the handlers' service are timed on CPU clocks (the
/// CPU figures; the clock reads slow each fault), and no latency is
/// merged into `latency`; without, the CPU seconds include the waiting
/// and are not used.
#[allow(clippy::too_many_arguments)]
fn run_once(
    rig: &Rig,
    plan: &Plan,
    msg_len: u64,
    times: u64,
    expect: u64,
    buf: &mut [u8],
    latency: &Latencies,
    timed: bool,
) -> LabResult<Vec<RunOut>> {
    // The handler threads inherit the CPU of the thread that starts them:
    // theirs, then the device's (this thread's) own, so the two never
    // take turns on one core (a spinning party on the core the other
    // waits for costs it a scheduler tick, milliseconds).
    if let Some((_, handlers_cpu)) = plan.cpus {
        affinity::pin_current(handlers_cpu);
    }
    let pinned = rig.domain(0, msg_len, 1, plan.promote)?;
    pinned.map_all()?;
    let mut domains = vec![pinned];
    let mut handlers = Vec::new();
    for (k, &p) in plan.premaps.iter().enumerate() {
        let d = rig.domain(k + 1, msg_len, p, plan.promote)?;
        let (unit, _) = rig.unit_of(k + 1)?;
        handlers.push(IopfHandler::start_spinning(
            d.clone(),
            unit,
            plan.threads,
            plan.spin,
        )?);
        domains.push(d);
    }
    if let Some((device_cpu, _)) = plan.cpus {
        affinity::pin_current(device_cpu);
    }
    let mut accs = Vec::with_capacity(domains.len());
    for i in 0..domains.len() {
        accs.push(DmaAccessor::new(rig.unit_of(i)?.1, dev(i))?);
    }
    // The device's waits for page responses and the handlers' service
    // are timed on their threads' CPU clocks: the work apart from the
    // waiting.
    for a in &mut accs {
        a.time_page_waits(timed);
    }
    for h in &handlers {
        h.time_service(timed);
    }
    // Configuration `i`'s handler CPU so far (none for the pinned one).
    let handler_cpu = |i: usize| -> Duration {
        i.checked_sub(1)
            .and_then(|k| handlers.get(k))
            .map_or(Duration::ZERO, IopfHandler::service_cpu)
    };
    // Per configuration: the (wall, CPU) seconds of the sends that
    // faulted, and each fault-free send's.
    let mut faulting = vec![(0.0f64, 0.0f64); accs.len()];
    let mut clean: Vec<(Vec<f64>, Vec<f64>)> = (0..accs.len())
        .map(|_| {
            (
                Vec::with_capacity(times as usize),
                Vec::with_capacity(times as usize),
            )
        })
        .collect();
    for round in 0..times {
        // Rotate who goes first, so no configuration always follows
        // another.
        for j in 0..accs.len() {
            let i = (j + round as usize) % accs.len();
            let before = accs[i].stats().page_requests;
            let w0 = accs[i].stats().page_wait_cpu_ns;
            let (h0, c0) = (handler_cpu(i), cpu_clock::thread());
            let t = send(&mut accs[i], msg_len, expect, buf)?;
            let waited = Duration::from_nanos(accs[i].stats().page_wait_cpu_ns - w0);
            let cpu = (cpu_clock::thread()
                .saturating_sub(c0)
                .saturating_sub(waited)
                + handler_cpu(i).saturating_sub(h0))
            .as_secs_f64();
            if accs[i].stats().page_requests != before {
                faulting[i].0 += t;
                faulting[i].1 += cpu;
            } else {
                clean[i].0.push(t);
                clean[i].1.push(cpu);
            }
        }
    }
    let secs: Vec<(f64, f64)> = faulting
        .iter()
        .zip(clean.iter_mut())
        .map(|(f, (w, c))| {
            (
                f.0 + median(w) * w.len() as f64,
                f.1 + median(c) * c.len() as f64,
            )
        })
        .collect();
    let faults: Vec<u64> = accs.iter().map(|a| a.stats().page_requests).collect();
    if faults[0] != 0 {
        return Err(LabError::Setup("the pinned device faulted"));
    }
    drop(accs);
    for (k, h) in handlers.into_iter().enumerate() {
        // Every answer was carried out before its device saw it; the
        // handler records the latency just after: wait for the last.
        let t0 = Instant::now();
        while h.stats().latency.count < faults[k + 1] && t0.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        if !timed {
            latency.raise_to_answer.merge(h.latency());
            latency.service.merge(h.service());
        }
        h.stop();
    }
    let mut promotions = Vec::with_capacity(domains.len());
    for (i, d) in domains.iter().enumerate() {
        d.detach(dev(i))?;
        promotions.push(d.stats().promotions);
    }
    Ok(secs
        .into_iter()
        .zip(faults)
        .zip(promotions)
        .map(|(((wall_s, cpu_s), faults), promotions)| RunOut {
            wall_s,
            cpu_s,
            faults,
            promotions,
        })
        .collect())
}

/// One configuration's run.
#[derive(Debug, Clone, Copy)]
struct RunOut {
    /// Wall-clock seconds of its sends.
    wall_s: f64,
    /// CPU seconds of its sends: the device thread's and its handler
    /// threads'.
    cpu_s: f64,
    /// Page requests raised.
    faults: u64,
    /// 2 MiB blocks promoted.
    promotions: u64,
}

/// The median of `v` (0 when empty).
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Runs the lab.
pub fn run(args: &IopfArgs) -> LabResult<Report> {
    let plan = Plan::of(args);
    let r = measure(&plan)?;
    Ok(report(&r, &plan))
}

fn kbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e3 / secs.max(1e-9)
}

fn measure(plan: &Plan) -> LabResult<IopfReport> {
    let largest = plan.msg_lens.iter().copied().max().unwrap_or(PAGE_SIZE);
    let rig = Rig::new(largest, 1 + plan.premaps.len())?;
    let latency = Latencies::default();
    let mut buf = vec![0u8; CHUNK];
    let mut rows = Vec::new();
    let mut promotions = Vec::new();
    let mut cpu = Vec::new();
    for &msg_len in &plan.msg_lens {
        let expect = write_message(&rig, msg_len)?;
        for times in plan.times_of(msg_len) {
            // Each configuration's fastest run (wall clock), and every
            // run's CPU seconds.
            let empty = RunOut {
                wall_s: f64::INFINITY,
                cpu_s: 0.0,
                faults: 0,
                promotions: 0,
            };
            let mut best = vec![empty; 1 + plan.premaps.len()];
            let mut runs: Vec<Vec<RunOut>> = Vec::with_capacity(plan.repeats);
            for _ in 0..plan.repeats {
                // Untimed, for the wall-clock figures and the latencies
                // (the CPU clock reads would slow every fault)...
                let r = run_once(
                    &rig, plan, msg_len, times, expect, &mut buf, &latency, false,
                )?;
                for (b, x) in best.iter_mut().zip(&r) {
                    if x.wall_s < b.wall_s {
                        *b = *x;
                    }
                }
                // ... then timed, for the CPU figures.
                runs.push(run_once(
                    &rig, plan, msg_len, times, expect, &mut buf, &latency, true,
                )?);
            }
            let bytes = msg_len * times;
            let without = kbps(bytes, best[0].wall_s);
            let cpu_without = median(
                &mut runs
                    .iter()
                    .map(|r| kbps(bytes, r[0].cpu_s))
                    .collect::<Vec<_>>(),
            );
            for (k, &p) in plan.premaps.iter().enumerate() {
                let with = kbps(bytes, best[k + 1].wall_s);
                rows.push(IopfRow {
                    msg_len,
                    times,
                    premap_pages: p,
                    kbps_without: without,
                    kbps_with: with,
                    faults: best[k + 1].faults,
                    ratio: with / without,
                });
                promotions.push(IopfPromotions {
                    msg_len,
                    times,
                    premap_pages: p,
                    promotions: best[k + 1].promotions,
                });
                // Each repeat's paired ratio: pinned's CPU over this
                // configuration's in the same run.
                let ratios: Vec<f64> = runs
                    .iter()
                    .map(|r| r[0].cpu_s / r[k + 1].cpu_s.max(1e-12))
                    .collect();
                cpu.push(IopfCpu {
                    msg_len,
                    times,
                    premap_pages: p,
                    kbps_per_cpu_s_without: cpu_without,
                    kbps_per_cpu_s_with: median(
                        &mut runs
                            .iter()
                            .map(|r| kbps(bytes, r[k + 1].cpu_s))
                            .collect::<Vec<_>>(),
                    ),
                    ratio: Spread::of(&ratios).median,
                    ratio_spread: Spread::of_rounds(&ratios),
                });
            }
        }
    }
    let s = latency.raise_to_answer.summary();
    let sv = latency.service.summary();
    let overflows = rig
        .sys
        .units()
        .map(|(_, u)| u.page_request_stats().overflows)
        .sum();
    Ok(IopfReport {
        lab: "iopf",
        rows,
        promote: plan.promote,
        promotions,
        cpu,
        fault_latency_us: FaultLatency {
            p50: s.p50_ns as f64 / 1e3,
            p99: s.p99_ns as f64 / 1e3,
            max: s.max_ns as f64 / 1e3,
        },
        fault_service_us: FaultLatency {
            p50: sv.p50_ns as f64 / 1e3,
            p99: sv.p99_ns as f64 / 1e3,
            max: sv.max_ns as f64 / 1e3,
        },
        overflows,
    })
}

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// The typed report.
fn report(r: &IopfReport, plan: &Plan) -> Report {
    let mut t = Table::new(
        "results",
        "speed without IOPF (pinned, pre-mapped) and with (mapped on demand), per message length, sends and pre-map window (seed 002's table): kB per CPU-second of the work (the device thread's, less its waits for answers, and with IOPF the handler's service of the requests), and wall-clock kB/s beside",
        vec![
            Column::label("msg_len"),
            Column::label("premap_pages"),
            Column::label("times"),
            Column::metric("kbps_cpu_without", "w/o IOPF per CPU-s", Unit::KbPerS, 0),
            Column::metric("kbps_cpu_with", "with IOPF per CPU-s", Unit::KbPerS, 0),
            Column::metric("cpu_ratio_pct", "with / without (CPU)", Unit::Percent, 1),
            Column::metric("kbps_without", "w/o IOPF (wall)", Unit::KbPerS, 0),
            Column::metric("kbps_with", "with IOPF (wall)", Unit::KbPerS, 0),
            Column::metric("ratio_pct", "with / without (wall)", Unit::Percent, 1),
            Column::metric("faults", "faults", Unit::Count, 0),
            Column::metric("promotions", "2 MiB promotions", Unit::Count, 0),
        ],
    );
    for ((x, pr), c) in r.rows.iter().zip(&r.promotions).zip(&r.cpu) {
        let pct = |s: Spread| Spread {
            min: s.min * 100.0,
            median: s.median * 100.0,
            max: s.max * 100.0,
        };
        t.row(vec![
            mib(x.msg_len).into(),
            x.premap_pages.to_string().into(),
            x.times.to_string().into(),
            c.kbps_per_cpu_s_without.into(),
            c.kbps_per_cpu_s_with.into(),
            Cell::figure(c.ratio * 100.0, c.ratio_spread.map(pct)),
            x.kbps_without.into(),
            x.kbps_with.into(),
            (x.ratio * 100.0).into(),
            x.faults.into(),
            pr.promotions.into(),
        ]);
    }
    let mut lat = Table::new(
        "fault_latency",
        "page request raise -> group response carried out, every run with IOPF (the handler's measurement; seed 002's handler: about 1.6 µs)",
        vec![
            Column::label("figure"),
            Column::metric("us", "raise -> answer", Unit::Us, 2),
            Column::metric("service_us", "of which handler", Unit::Us, 2),
        ],
    );
    for (k, v, s) in [
        ("p50", r.fault_latency_us.p50, r.fault_service_us.p50),
        ("p99", r.fault_latency_us.p99, r.fault_service_us.p99),
        ("max", r.fault_latency_us.max, r.fault_service_us.max),
    ] {
        lat.row(vec![k.into(), v.into(), s.into()]);
    }
    let mut rep = Report::new(
        "lab iopf",
        "I/O page faults: an accelerator's messages pinned vs mapped on demand, with a pre-map window (seed 002)",
        contract(r),
    )
    .seed("002");
    rep.params = vec![
        Param::text(
            "msg_len",
            plan.msg_lens
                .iter()
                .map(|&m| mib(m))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Param::text(
            "premap_pages",
            plan.premaps
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Param::new("repeats", plan.repeats, Unit::Count),
        Param::new("handler_threads", plan.threads, Unit::Threads),
        Param::new("handler_spin_polls", plan.spin, Unit::Count),
        Param::text(
            "placement",
            plan.cpus.map_or("os".to_string(), |(d, h)| {
                format!("device on CPU {d}, handlers on CPU {h}")
            }),
        ),
        Param::new("chunk", CHUNK, Unit::Bytes),
        Param::text("quick", plan.quick),
        Param::text("promote", if plan.promote { "on" } else { "off" }),
        Param::new("overflows", r.overflows, Unit::Count),
    ];
    rep.tables.push(t);
    rep.tables.push(lat);
    let mut series = Vec::new();
    for &m in &plan.msg_lens {
        for &p in &plan.premaps {
            let pts: Vec<(f64, f64)> = r
                .cpu
                .iter()
                .filter(|x| x.msg_len == m && x.premap_pages == p)
                .map(|x| ((x.times as f64).log10(), x.ratio * 100.0))
                .collect();
            series.push(Series::new(format!("{}, premap {p}", mib(m)), pts));
        }
    }
    rep.plots.push(Plot {
        name: "ratio".into(),
        title: "kB per CPU-second with IOPF / without, by sends over the same buffer".into(),
        kind: PlotKind::Lines,
        x: Axis::new("log10(sends)", Unit::Count),
        y: Axis::new("with / without (CPU)", Unit::Percent),
        categories: Vec::new(),
        series,
        modelled: false,
    });
    rep.notes.push(format!(
        "fault latency p50 {:.2} µs, p99 {:.2} µs, max {:.1} µs; {} overflow(s); every figure measured, none modelled",
        r.fault_latency_us.p50, r.fault_latency_us.p99, r.fault_latency_us.max, r.overflows
    ));
    rep
}
