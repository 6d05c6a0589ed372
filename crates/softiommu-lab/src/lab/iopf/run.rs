//! The measurement of `lab iopf`: the machine, the sends on each
//! configuration side by side, and the figures per row.

use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::hw::UnitId;
use softiommu::iopf::{IopfConfig, IopfDomain, IopfHandler, LatencyHistogram, Region};
use softiommu::{
    DmaAccessor, DmaAttrs, Perm, PhysAddr, PhysMemory, SourceId, System, UnitConfig, PAGE_SIZE,
};

use crate::args::{Placement, Ranged};
use crate::error::{LabError, LabResult};
use crate::metrics::cpu_clock;
use crate::metrics::pinning as affinity;
use crate::report::{Report, Spread};

use super::args::IopfArgs;
use super::out::{FaultLatency, IopfCpu, IopfPromotions, IopfReport, IopfRow};
use super::render::report;
use super::{CHUNK, DEV, MSG_IOVA};

/// The handler threads' histograms, merged over the untimed runs (the
/// timed ones serve inline and are not merged).
#[derive(Default)]
struct Latencies {
    raise_to_answer: LatencyHistogram,
    service: LatencyHistogram,
}

/// What the lab ran with, for the report's parameters.
pub(super) struct Plan {
    pub(super) msg_lens: Vec<u64>,
    pub(super) times: Vec<u64>,
    pub(super) premaps: Vec<u64>,
    pub(super) repeats: usize,
    pub(super) threads: usize,
    pub(super) spin: u32,
    /// (device CPU, handlers' CPU), when the process may use two.
    pub(super) cpus: Option<(usize, usize)>,
    pub(super) quick: bool,
    pub(super) promote: bool,
}

/// The timed runs per row take at least this many sends in all, so a row
/// of few sends (a single 1 MiB send: ~0.2 ms of the pinned device's CPU,
/// ~1 ms with faults) is the median of many paired runs, not of the two
/// or three repeats that suit its wall-clock figure: one send's CPU time
/// moves ±30 % run to run with the caches and the page-table memory it
/// finds (measured: a premap 512 send, one fault, read 70-135 % of the
/// pinned one's in single runs).
pub const TIMED_SENDS: u64 = 25;

/// The most requests an inline handler serves per raised request: a
/// group's worth and more (one fault raises one request here).
const INLINE_BATCH: usize = 64;

/// Sends per row in the quick form, for messages up to 1 MiB and above.
const QUICK_TIMES_SMALL: [u64; 4] = [1, 100, 1000, 5000];
const QUICK_TIMES_LARGE: [u64; 2] = [1, 100];

impl Plan {
    pub(super) fn of(a: &IopfArgs) -> Self {
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

    /// The timed runs of a row of `times` sends: the repeats, and more
    /// until they hold [`TIMED_SENDS`] sends.
    pub(super) fn timed_runs(&self, times: u64) -> usize {
        let more = usize::try_from(TIMED_SENDS.div_ceil(times.max(1))).unwrap_or(1);
        self.repeats.max(more)
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
/// alike; the configuration that goes first in the first round is
/// `first` (runs pass their index, so a run of one send does not always
/// start on the pinned device, whose send then finds the caches the rig's
/// setup left). Returns each configuration's seconds and CPU seconds (summed
/// over its sends), page requests and promotions. With `timed`, the
/// faulting configurations' requests are served inline, on the device's
/// own thread between raising each and waiting for its answer
/// (`IopfHandler::inline`), so a send's CPU seconds are its thread's
/// CPU clock over the send: the whole fault path's work, one step after
/// the other, with no second thread spinning beside it and no CPU-clock
/// read per fault; no latency is merged into `latency`. Without, handler
/// threads serve them (the wall-clock figures and the latencies), and
/// the CPU seconds include the device's waiting and are not used.
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
    first: usize,
) -> LabResult<Vec<RunOut>> {
    // The handler threads inherit the CPU of the thread that starts them:
    // theirs, then the device's (this thread's) own, so the two never
    // take turns on one core (a spinning party on the core the other
    // waits for costs it a scheduler tick, milliseconds). Timed runs
    // start no threads.
    if let Some((_, handlers_cpu)) = plan.cpus.filter(|_| !timed) {
        affinity::pin_current(handlers_cpu);
    }
    let pinned = rig.domain(0, msg_len, 1, plan.promote)?;
    pinned.map_all()?;
    let mut domains = vec![pinned];
    let mut handlers = Vec::new();
    for (k, &p) in plan.premaps.iter().enumerate() {
        let d = rig.domain(k + 1, msg_len, p, plan.promote)?;
        let (unit, _) = rig.unit_of(k + 1)?;
        handlers.push(Arc::new(if timed {
            IopfHandler::inline(d.clone(), unit)?
        } else {
            IopfHandler::start_spinning(d.clone(), unit, plan.threads, plan.spin)?
        }));
        domains.push(d);
    }
    if let Some((device_cpu, _)) = plan.cpus {
        affinity::pin_current(device_cpu);
    }
    let mut accs = Vec::with_capacity(domains.len());
    for i in 0..domains.len() {
        accs.push(DmaAccessor::new(rig.unit_of(i)?.1, dev(i))?);
    }
    // Timed, each faulting device serves its own requests as it raises
    // them (at most a group's worth a call, so a call stays bounded).
    if timed {
        for (a, h) in accs.iter_mut().skip(1).zip(&handlers) {
            let h = h.clone();
            a.on_page_request(Some(Box::new(move || {
                h.serve_pending(INLINE_BATCH);
            })));
        }
    }
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
            let i = turn(j, first, round, accs.len());
            let before = accs[i].stats().page_requests;
            let c0 = cpu_clock::thread();
            let t = send(&mut accs[i], msg_len, expect, buf)?;
            let cpu = cpu_clock::thread().saturating_sub(c0).as_secs_f64();
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
    // The hooks hold the inline handlers: dropped with the accessors.
    drop(accs);
    for (k, h) in handlers.into_iter().enumerate() {
        let h = Arc::into_inner(h).ok_or(LabError::Setup("a page request handler still shared"))?;
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

/// Which configuration sends `j`-th in round `round` of a run whose
/// first round starts with configuration `first`, of `n`.
pub(super) fn turn(j: usize, first: usize, round: u64, n: usize) -> usize {
    let round = usize::try_from(round % n as u64).unwrap_or(0);
    (j + first + round) % n
}

/// One configuration's run.
#[derive(Debug, Clone, Copy)]
struct RunOut {
    /// Wall-clock seconds of its sends.
    wall_s: f64,
    /// CPU seconds of its sends (timed runs): the device thread's, which
    /// served its own page requests inline.
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
            let mut runs: Vec<Vec<RunOut>> = Vec::with_capacity(plan.timed_runs(times));
            for rep in 0..plan.repeats {
                // Untimed, for the wall-clock figures and the latencies
                // (the CPU clock reads would slow every fault)...
                let r = run_once(
                    &rig, plan, msg_len, times, expect, &mut buf, &latency, false, rep,
                )?;
                for (b, x) in best.iter_mut().zip(&r) {
                    if x.wall_s < b.wall_s {
                        *b = *x;
                    }
                }
            }
            // ... then timed, for the CPU figures.
            for rep in 0..plan.timed_runs(times) {
                runs.push(run_once(
                    &rig, plan, msg_len, times, expect, &mut buf, &latency, true, rep,
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
