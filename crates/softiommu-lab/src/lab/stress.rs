//! `softiommu lab stress`: a soak with an independent checker.
//!
//! Two DMA domains, each with one device behind one unit. In each domain a
//! CPU thread maps and unmaps sub-page buffers of its slots (one page per
//! slot, tagged word by word; see [`super::stress_check`]) and records each
//! mapping's life in a shadow the library never sees; a device thread,
//! through a raw [`DmaAccessor`], reads what it owns and probes what it
//! does not: just-unmapped IOVAs, the neighbouring bytes of its sub-page
//! buffers, IOVAs near its own, the other domain's IOVAs, and writes
//! through its read-only mappings. Every access that succeeds is judged by
//! the checker: legal, a permitted stale access (deferred only, before the
//! covering flush, younger than the flush timeout), or a violation.
//!
//! One phase per policy, and a last one in which a switcher thread moves
//! both domains between strict, deferred and bounce every few
//! milliseconds. Under pass-through nothing is isolated, so its device
//! thread only reads what it owns (and checks the data).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiommu::access::{DmaAccessor, DmaAttrs};
use softiommu::dma::{DmaDevice, DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{Access as HwAccess, SourceId, System, Translator, UnitConfig};
use softiommu::mem::PhysMemory;

use super::stress_bound;
use super::stress_check::{
    classify, Access, DomainShadow, Entry, Life, Tag, TagKind, Verdict, Why, PAGE,
};
use super::stress_extra;
use crate::args::{dma_policies, DmaPolicyName, Ranged, Seconds};
use crate::error::{join, LabError, LabResult};
use crate::report::{contract, Column, Param, Report, Table, Unit};
use crate::workload::Rng;

/// Options of `lab stress` (and of a `[lab-stress]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StressArgs {
    /// Seconds per phase (one phase per policy, and the switching phase)
    /// (0.01..=86400).
    #[arg(long, default_value = "10")]
    pub seconds: Seconds,
    /// The short run: 5 seconds per phase (overrides --seconds).
    #[arg(long)]
    pub quick: bool,
    /// Slots (pages, each holding at most one mapping) per CPU thread
    /// (1..=256).
    #[arg(long, default_value = "64")]
    pub slots: Ranged<1, 256>,
    /// The deferred policy's flush timeout, milliseconds (1..=1000): the
    /// bound a permitted stale access's age is held to.
    #[arg(long, default_value = "10")]
    pub flush_timeout_ms: Ranged<1, 1000>,
    /// Policies to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<DmaPolicyName>,
    /// Whether to run the switching phase (0 or 1).
    #[arg(long, default_value = "1")]
    pub switching: Ranged<0, 1>,
    /// Whether to run the device phases (0 or 1): a virtio-blk device
    /// whose domain's policy is switched under it, every read checked, and
    /// a device faulting pages of an IOPF domain in while a CPU thread
    /// reclaims them, every read checked against the page's tag.
    #[arg(long, default_value = "1")]
    pub devices: Ranged<0, 1>,
    /// Seed of the workload's random choices (0..=4294967295).
    #[arg(long, default_value = "15")]
    pub seed: Ranged<0, 4_294_967_295>,
    /// Nice value of the lab's CPU and device threads (0..=19): they run
    /// below the library's flush timer, as a load runs below the kernel
    /// timer that fires Linux's flush queue. 0: every thread equal.
    #[arg(long, default_value = "10")]
    pub load_nice: Ranged<0, 19>,
    /// Whether to run the bound phase (0 or 1): just-unmapped IOVAs of a
    /// deferred domain probed at ages around the promised bound (flush
    /// timeout + 1 ms); any success at or past it is a violation.
    #[arg(long, default_value = "1")]
    pub bound: Ranged<0, 1>,
    /// Busy processes (`sh -c 'while :; do :; done'`, nice 0) run beside
    /// the bound phase (0..=8), killed when it ends.
    #[arg(long, default_value = "2")]
    pub hogs: Ranged<0, 8>,
    /// Test only: the CPU threads record one unmap in 16 as done before
    /// calling `unmap`, and call it 64 operations later, as a library
    /// whose unmap returned before revoking would. The checker must
    /// report violations.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub inject_late_unmap: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for StressArgs {
    fn default() -> Self {
        Self {
            seconds: Seconds::new(10.0),
            quick: false,
            slots: Ranged::new(64),
            flush_timeout_ms: Ranged::new(10),
            policies: Vec::new(),
            switching: Ranged::new(1),
            devices: Ranged::new(1),
            seed: Ranged::new(15),
            load_nice: Ranged::new(10),
            bound: Ranged::new(1),
            hogs: Ranged::new(2),
            inject_late_unmap: false,
            json: false,
        }
    }
}

/// Seconds per phase of the quick form.
const QUICK_SECONDS: f64 = 5.0;
/// Bytes of each domain's bounce pool.
const POOL_BYTES: u64 = 1 << 20;
/// The CPU threads call `flush_own` every this many operations.
const FLUSH_EVERY: u64 = 4096;
/// The switcher changes the policy every this long.
const SWITCH_EVERY: Duration = Duration::from_millis(2);
/// The name of the switching phase's row.
const SWITCHING: &str = "switching";

/// One phase's counters (a row of `policies`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseResult {
    /// The policy, or "switching".
    pub policy: String,
    /// Maps, unmaps and policy switches.
    pub ops: u64,
    /// Device accesses attempted (reads and writes of 8 bytes).
    pub device_accesses: u64,
    /// Accesses the unit refused.
    pub faults: u64,
    /// Successful accesses after the unmap returned that the deferred
    /// policy permits (before the covering flush, within the timeout).
    pub stale_accesses: u64,
    /// The oldest permitted stale access, microseconds after its unmap
    /// returned.
    pub max_stale_age_us: u64,
    /// Successful accesses the checker refused.
    pub violations: u64,
    /// Successful accesses through live mappings (or the domain's own
    /// bounce pool).
    pub legal: u64,
    /// Successful accesses not judged: the shadow's history no longer
    /// reached back far enough, or a deferred-stale access began inside the
    /// window and ended past it (its device thread off its CPU mid-access,
    /// so the checker cannot place the translation).
    pub unjudged: u64,
    /// The stale window the library itself measured (its longest flush
    /// wait, from queueing to the end of the invalidation), microseconds:
    /// the library's own bookkeeping, shown beside the checker's figure
    /// and never used by it.
    pub library_stale_window_us: u64,
    /// Seconds the phase ran.
    pub seconds: f64,
    /// The first violation, in full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_violation: Option<String>,
}

impl PhaseResult {
    fn add(&mut self, o: &DeviceCounts) {
        self.device_accesses += o.accesses;
        self.faults += o.faults;
        self.stale_accesses += o.stale;
        self.max_stale_age_us = self.max_stale_age_us.max(o.max_stale_age_us);
        self.violations += o.violations;
        self.legal += o.legal;
        self.unjudged += o.unjudged;
        if self.first_violation.is_none() {
            self.first_violation.clone_from(&o.first_violation);
        }
    }
}

/// The JSON object `lab stress --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct StressReport {
    /// Always "stress".
    pub lab: &'static str,
    /// Every phase's operations.
    pub ops: u64,
    /// Every phase's device accesses.
    pub device_accesses: u64,
    /// Every phase's faults.
    pub faults: u64,
    /// Every phase's permitted stale accesses.
    pub stale_accesses: u64,
    /// The oldest permitted stale access of any phase, microseconds.
    pub max_stale_age_us: u64,
    /// Every phase's violations.
    pub violations: u64,
    /// Accesses not judged (history too short, or begun inside the stale
    /// window and ended past it).
    pub unjudged: u64,
    /// The deferred flush timeout in force, microseconds.
    pub flush_timeout_us: u64,
    /// The promised bound on a deferred unmap's stale window (flush
    /// timeout + 1 ms), microseconds: no access that begins later may
    /// succeed through the unmapped translation.
    pub bound_us: u64,
    /// Probes of the bound phase that began at least `bound_us` after
    /// their buffer's deferred unmap returned (0 without the phase).
    pub bound_probes: u64,
    /// The oldest probe of the bound phase, microseconds after its
    /// buffer's unmap returned, at the probe's start.
    pub bound_probe_max_age_us: u64,
    /// Busy processes run beside the bound phase.
    pub hogs: u64,
    /// The nice value the load threads ran at (`--load-nice`).
    pub load_nice: u64,
    /// Whether this was the quick form.
    pub quick: bool,
    /// The first violation of the run, in full (none: null).
    pub first_violation: Option<String>,
    /// One object per phase.
    pub policies: Vec<PhaseResult>,
}

/// Runs the lab.
pub fn run(args: &StressArgs) -> LabResult<Report> {
    let r = measure(args)?;
    Ok(report(&r))
}

fn measure(args: &StressArgs) -> LabResult<StressReport> {
    let seconds = if args.quick {
        QUICK_SECONDS
    } else {
        args.seconds.get()
    };
    let timeout = Duration::from_millis(args.flush_timeout_ms.get());
    let mut phases: Vec<Option<DmaPolicy>> =
        dma_policies(&args.policies).into_iter().map(Some).collect();
    if args.switching.get() == 1 {
        phases.push(None);
    }
    let mut rows = Vec::new();
    let n = phases.len() as u64;
    for (i, p) in phases.into_iter().enumerate() {
        let seed = args.seed.get().wrapping_add(i as u64 * 0x1_0000);
        rows.push(run_phase(p, args, seconds, timeout, seed)?);
    }
    if args.devices.get() == 1 {
        let seed = args.seed.get().wrapping_add(n * 0x1_0000);
        rows.push(stress_extra::virtio_phase(seconds, timeout, seed)?);
        rows.push(stress_extra::reclaim_phase(seconds, seed ^ 0x5eed)?);
    }
    let bound = stress_bound::bound(timeout);
    let (mut bound_probes, mut bound_probe_max_age_us) = (0, 0);
    if args.bound.get() == 1 {
        // Long enough for probes well past the bound whatever `seconds`.
        let secs = seconds.max(3.0 * bound.as_secs_f64());
        let seed = args.seed.get().wrapping_add((n + 1) * 0x1_0000);
        let b =
            stress_bound::bound_phase(secs, timeout, seed, args.hogs.get(), args.load_nice.get())?;
        bound_probes = b.probes_at_bound;
        bound_probe_max_age_us = b.max_probe_age_us;
        rows.push(b.row);
    }
    let sum = |f: fn(&PhaseResult) -> u64| rows.iter().map(f).sum::<u64>();
    Ok(StressReport {
        lab: "stress",
        ops: sum(|r| r.ops),
        device_accesses: sum(|r| r.device_accesses),
        faults: sum(|r| r.faults),
        stale_accesses: sum(|r| r.stale_accesses),
        max_stale_age_us: rows.iter().map(|r| r.max_stale_age_us).max().unwrap_or(0),
        violations: sum(|r| r.violations),
        unjudged: sum(|r| r.unjudged),
        flush_timeout_us: timeout.as_micros() as u64,
        bound_us: bound.as_micros() as u64,
        bound_probes,
        bound_probe_max_age_us,
        hogs: if args.bound.get() == 1 {
            args.hogs.get()
        } else {
            0
        },
        load_nice: args.load_nice.get(),
        quick: args.quick,
        first_violation: rows.iter().find_map(|r| r.first_violation.clone()),
        policies: rows,
    })
}

/// The lab clock: nanoseconds since the phase began.
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn ns(self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// What every thread of a phase shares.
struct Shared {
    mem: Arc<PhysMemory>,
    shadows: Vec<DomainShadow>,
    clock: Clock,
    stop: AtomicBool,
    /// The promised bound (flush timeout + 1 ms), nanoseconds.
    bound_ns: u64,
    /// The policy of a fixed phase (None: switching).
    policy: Option<DmaPolicy>,
}

fn run_phase(
    policy: Option<DmaPolicy>,
    args: &StressArgs,
    seconds: f64,
    timeout: Duration,
    seed: u64,
) -> LabResult<PhaseResult> {
    let slots = args.slots.us();
    let mem = Arc::new(PhysMemory::new(64 << 20)?);
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default())?;
    let sids = [SourceId(0x0100), SourceId(0x0200)];
    for sid in sids {
        sys.assign(sid, unit)?;
    }
    let sys = Arc::new(sys);
    let start = policy.unwrap_or(DmaPolicy::Strict);
    let mut domains = Vec::new();
    let mut devs = Vec::new();
    for (i, sid) in sids.into_iter().enumerate() {
        let d = DmaDomain::new(
            sys.clone(),
            DmaDomainConfig {
                did: 1 + i as u16,
                policy: start,
                bounce_bytes: POOL_BYTES,
                ..Default::default()
            },
        )?;
        d.set_timeout(timeout)?;
        devs.push(d.attach(sid, (1 << 48) - 1, false)?);
        domains.push(d);
    }
    let shared = Arc::new(Shared {
        mem,
        shadows: (0..2).map(|_| DomainShadow::new(slots)).collect(),
        clock: Clock(Instant::now()),
        stop: AtomicBool::new(false),
        bound_ns: stress_bound::bound(timeout).as_nanos() as u64,
        policy,
    });
    // Learn each bounce pool's IOVA range before any device runs: the
    // pool is made when the device attaches and stays mapped whatever the
    // policy, so its (zeroed or bounced) bytes are reachable in every
    // translated phase.
    if policy != Some(DmaPolicy::Passthrough) {
        for (i, (d, dev)) in domains.iter().zip(&devs).enumerate() {
            learn_pool(d, dev, &shared.mem, &shared.shadows[i], start)?;
        }
    }
    let t0 = Instant::now();
    let mut cpus = Vec::new();
    let mut devices = Vec::new();
    for (i, dev) in devs.iter().enumerate() {
        let (sh, dev2, dom) = (shared.clone(), dev.clone(), domains[i].clone());
        let inject = args.inject_late_unmap;
        let nice = args.load_nice.get();
        let s = seed ^ ((i as u64 + 1) * 0x9e37);
        cpus.push(std::thread::spawn(move || {
            run_as_load(nice);
            cpu_thread(&sh, &dom, &dev2, i, slots, s, inject)
        }));
        let (sh, dev2) = (shared.clone(), dev.clone());
        let s = seed ^ ((i as u64 + 1) * 0x7f4a_0000);
        devices.push(std::thread::spawn(move || {
            run_as_load(nice);
            device_thread(&sh, &dev2, i, slots, s)
        }));
    }
    let switcher = policy.is_none().then(|| {
        let (sh, doms) = (shared.clone(), domains.clone());
        std::thread::spawn(move || switch_thread(&sh, &doms))
    });
    let deadline = t0 + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline && !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(5).min(deadline - Instant::now()));
    }
    shared.stop.store(true, Ordering::Relaxed);
    let mut row = PhaseResult {
        policy: policy.map_or(SWITCHING.to_string(), |p| p.name().to_string()),
        ..Default::default()
    };
    let mut first_err = None;
    for h in cpus {
        match join(h, "stress CPU")? {
            Ok(n) => row.ops += n,
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    if let Some(h) = switcher {
        match join(h, "stress switcher")? {
            Ok(n) => row.ops += n,
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    for h in devices {
        match join(h, "stress device")? {
            Ok(c) => row.add(&c),
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    row.seconds = t0.elapsed().as_secs_f64();
    row.library_stale_window_us = domains
        .iter()
        .map(|d| d.stale_window().max.as_micros() as u64)
        .max()
        .unwrap_or(0);
    Ok(row)
}

/// Maps one small buffer per direction under bounce and derives the
/// pool's IOVA range from them: the pool has one lane per direction, each
/// one size-aligned IOVA range of [`POOL_BYTES`], made together (so
/// adjacent; anything else is refused rather than judged wrongly).
fn learn_pool(
    d: &Arc<DmaDomain>,
    dev: &DmaDevice,
    mem: &PhysMemory,
    sh: &DomainShadow,
    back_to: DmaPolicy,
) -> LabResult<()> {
    d.set_policy(DmaPolicy::Bounce)?;
    let mut cpu = d.cpu();
    let page = mem.alloc_zeroed_frames(0)?;
    let mut lanes = Vec::new();
    for dir in [
        DmaDirection::ToDevice,
        DmaDirection::FromDevice,
        DmaDirection::Bidirectional,
    ] {
        let iova = cpu.map(dev, page, 8, dir)?;
        cpu.unmap(dev, iova, 8, dir)?;
        lanes.push(iova & !(POOL_BYTES - 1));
    }
    lanes.sort_unstable();
    let (lo, hi) = (lanes[0], lanes[lanes.len() - 1] + POOL_BYTES);
    if hi - lo != POOL_BYTES * lanes.len() as u64 {
        return Err(LabError::Measure(format!(
            "the bounce pool's lanes are not adjacent ({lanes:#x?}): its range cannot be judged"
        )));
    }
    sh.pool_lo.store(lo, Ordering::Release);
    sh.pool_hi.store(hi, Ordering::Release);
    d.set_policy(back_to)?;
    Ok(())
}

/// A mapping the injected fault keeps alive after recording it unmapped.
struct Zombie {
    iova: u64,
    len: u64,
    due: u64,
}

/// A domain's CPU thread: maps and unmaps its slots until told to stop;
/// returns its operation count.
fn cpu_thread(
    sh: &Shared,
    dom: &Arc<DmaDomain>,
    dev: &DmaDevice,
    domain: usize,
    slots: usize,
    seed: u64,
    inject: bool,
) -> LabResult<u64> {
    let shadow = &sh.shadows[domain];
    let mut cpu = dom.cpu();
    let mut rng = Rng::new(seed);
    let mut pages = Vec::with_capacity(slots);
    for _ in 0..slots {
        pages.push(sh.mem.alloc_zeroed_frames(0)?);
    }
    // The tags name a page by its slot: two slots on one frame would make
    // the checker blame the wrong mapping.
    let mut distinct = pages.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() != pages.len() {
        return Err(LabError::Setup(
            "the frame allocator handed out one page twice",
        ));
    }
    let mut live: Vec<Option<Entry>> = vec![None; slots];
    let mut gens = vec![0u32; slots];
    let mut zombies: Vec<Zombie> = Vec::new();
    let mut ops = 0u64;
    let dir = DmaDirection::ToDevice;
    while !sh.stop.load(Ordering::Relaxed) {
        let k = rng.below(slots as u64) as usize;
        let slot = &shadow.slots[k];
        match live[k].take() {
            None => {
                gens[k] += 1;
                let gen = gens[k];
                // A sub-page buffer: 8..=1024 bytes, 8-aligned, with
                // neighbour words on both sides.
                let len = 8 * (1 + rng.below(128));
                let off = 8 + 8 * rng.below((PAGE - 16 - len) / 8 + 1);
                write_page(&sh.mem, pages[k], domain as u8, k as u16, gen, off, len)?;
                let t_map_ns = sh.clock.ns();
                slot.record(&Entry {
                    gen,
                    iova: 0,
                    len,
                    t_map_ns,
                    t_unmap_ns: 0,
                    t_unmap_call_ns: 0,
                    life: Life::Mapping,
                    bounced: false,
                    deferred: false,
                });
                let before = dom.policy();
                let iova = cpu.map(dev, pages[k] + off, len, dir)?;
                let after = dom.policy();
                // The pool's IOVAs are the pool's alone: an address there
                // was bounced, whatever policy this thread saw around the
                // call (two switches may pass while it is descheduled).
                let bounced = shadow.in_pool(iova);
                if before == DmaPolicy::Bounce && after == DmaPolicy::Bounce && !bounced {
                    return Err(LabError::Setup(
                        "a bounced buffer's IOVA lies outside the pool's derived range",
                    ));
                }
                let e = Entry {
                    gen,
                    iova,
                    len,
                    t_map_ns,
                    t_unmap_ns: 0,
                    t_unmap_call_ns: 0,
                    life: Life::Mapped,
                    bounced,
                    deferred: false,
                };
                slot.record(&e);
                live[k] = Some(e);
            }
            Some(mut e) => {
                if inject && e.gen % 16 == 0 {
                    // The injected fault: recorded as unmapped, still live.
                    e.life = Life::Unmapped;
                    e.t_unmap_call_ns = sh.clock.ns();
                    e.t_unmap_ns = e.t_unmap_call_ns;
                    slot.record(&e);
                    zombies.push(Zombie {
                        iova: e.iova,
                        len: e.len,
                        due: ops + 64,
                    });
                } else {
                    e.life = Life::Unmapping;
                    e.t_unmap_call_ns = sh.clock.ns();
                    slot.record(&e);
                    let before = dom.policy();
                    cpu.unmap(dev, e.iova, e.len, dir)?;
                    e.t_unmap_ns = sh.clock.ns();
                    let after = dom.policy();
                    // Possibly made under deferred; the checker withdraws
                    // the allowance if a switch away from deferred is
                    // recorded after the return (`DomainShadow::left_deferred_ns`).
                    e.deferred = before == DmaPolicy::Deferred || after == DmaPolicy::Deferred;
                    e.life = Life::Unmapped;
                    slot.record(&e);
                }
            }
        }
        ops += 1;
        while zombies.first().is_some_and(|z| z.due <= ops) {
            let z = zombies.remove(0);
            cpu.unmap(dev, z.iova, z.len, dir)?;
            ops += 1;
        }
        if ops.is_multiple_of(FLUSH_EVERY) {
            let t_call = sh.clock.ns();
            cpu.flush_own()?;
            shadow.flushed_upto_ns.store(t_call, Ordering::Release);
        }
    }
    Ok(ops)
}

/// Lowers the calling thread's priority to `nice` (a load thread). The
/// stale window's bound rests on the flush timer running when due: in
/// Linux it is a kernel timer that preempts user threads; here it is a
/// thread of the library, and with four busy load threads on two cores
/// the scheduler can hold it off for tens of milliseconds at equal
/// priority (measured: flushes starting 23–38 ms after their oldest
/// entry). Raising a thread's own nice value needs no privilege; a
/// refusal leaves the thread as it was.
pub(crate) fn run_as_load(nice: u64) {
    if nice == 0 {
        return;
    }
    // SAFETY: `gettid` has no preconditions; `setpriority` on
    // `PRIO_PROCESS` with a thread id changes only that thread's nice
    // value (Linux), and its failure is harmless.
    unsafe {
        let tid = libc::gettid();
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice as libc::c_int);
    }
}

/// Writes a slot's page for generation `gen`: buffer tags over
/// `[off, off + len)`, neighbour tags elsewhere, word by word (atomic
/// stores: a stale reader never sees a torn word).
fn write_page(
    mem: &PhysMemory,
    page: u64,
    domain: u8,
    slot: u16,
    gen: u32,
    off: u64,
    len: u64,
) -> LabResult<()> {
    let tag = |kind| {
        Tag {
            kind,
            domain,
            slot,
            gen,
        }
        .encode()
    };
    let (buf, nb) = (tag(TagKind::Buffer), tag(TagKind::Neighbour));
    for w in (0..PAGE).step_by(8) {
        let v = if (off..off + len).contains(&w) {
            buf
        } else {
            nb
        };
        mem.store_u64(page + w, v, Ordering::Relaxed)?;
    }
    Ok(())
}

/// Moves both domains between strict, deferred and bounce until told to
/// stop; returns the switches made.
fn switch_thread(sh: &Shared, doms: &[Arc<DmaDomain>]) -> LabResult<u64> {
    const CYCLE: [DmaPolicy; 3] = [DmaPolicy::Deferred, DmaPolicy::Bounce, DmaPolicy::Strict];
    let mut n = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let p = CYCLE[(n as usize / doms.len()) % CYCLE.len()];
        let i = n as usize % doms.len();
        let was = doms[i].policy();
        doms[i].set_policy(p)?;
        if was == DmaPolicy::Deferred && p != DmaPolicy::Deferred {
            // Every deferred queue was flushed before the switch returned.
            sh.shadows[i]
                .left_deferred_ns
                .store(sh.clock.ns(), Ordering::Release);
        }
        n += 1;
        std::thread::sleep(SWITCH_EVERY / doms.len() as u32);
    }
    Ok(n)
}

/// A device thread's counters.
#[derive(Debug, Default)]
struct DeviceCounts {
    accesses: u64,
    faults: u64,
    stale: u64,
    max_stale_age_us: u64,
    violations: u64,
    legal: u64,
    unjudged: u64,
    first_violation: Option<String>,
}

/// The kinds of device access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// A read of a live mapping it owns, at a random word.
    Owned,
    /// A read of one of its mappings that was just unmapped.
    JustUnmapped,
    /// A read of the words just around one of its sub-page buffers.
    Neighbour,
    /// A read at a random word of a page near one of its IOVAs.
    Near,
    /// A read at an IOVA the other domain's device was given.
    OtherDomain,
    /// A write through one of its read-only mappings (bounced or not).
    Write,
    /// A read at a random IOVA anywhere in the domain's aperture.
    Aperture,
}

impl DeviceCounts {
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &mut self,
        sh: &Shared,
        op: Op,
        acc: &Access,
        seen: Option<&Entry>,
        device: usize,
        verdict: Verdict,
    ) {
        match verdict {
            Verdict::Legal => self.legal += 1,
            Verdict::Stale { age_us } => {
                self.stale += 1;
                self.max_stale_age_us = self.max_stale_age_us.max(age_us);
            }
            Verdict::Unknown => self.unjudged += 1,
            Verdict::Violation(why) => {
                self.violations += 1;
                if std::env::var_os("SOFTIOMMU_STRESS_TRACE").is_some() {
                    eprintln!(
                        "violation: {op:?} {why:?} {acc:?} {:?}",
                        Tag::decode(acc.value)
                    );
                }
                if self.first_violation.is_none() {
                    let what = sh
                        .policy
                        .map_or(SWITCHING.to_string(), |p| p.name().to_string());
                    self.first_violation = Some(format!(
                        "phase {what}, device {device} (domain {}), {op:?} {} at IOVA {:#x}: \
                         {why:?}; expected {}, seen {} (word {:?}); access {acc:?}; \
                         the shadow entry the device aimed at: {seen:?}",
                        acc.domain,
                        if acc.write { "write" } else { "read" },
                        acc.iova,
                        expected_of(&why, sh.bound_ns / 1000),
                        if acc.write {
                            "the write succeed".to_string()
                        } else {
                            format!("{:#x}", acc.value)
                        },
                        Tag::decode(acc.value),
                    ));
                }
            }
        }
    }
}

/// What the checker expected instead of the access `why` condemns.
fn expected_of(why: &Why, bound_us: u64) -> String {
    match why {
        Why::AfterUnmap { entry, age_us } => format!(
            "a fault: begun {age_us} us after the unmap of IOVA {:#x} returned (deferred \
             allowance: {}, bound {bound_us} us)",
            entry.iova,
            if entry.deferred { "possible" } else { "none" }
        ),
        Why::WrongData { expected } => format!("the buffer's word {expected:#x}"),
        Why::LiveFault => "a live mapping's word, not a fault".into(),
        Why::WriteThroughReadOnly => "a fault: every mapping is read-only for the device".into(),
        Why::IommuFrame { phys } => {
            format!("a fault: {phys:#x} is a frame holding IOMMU state")
        }
        Why::BounceNotOwner { entry } => format!(
            "the bytes of the bounce slot's owners; that buffer's slot covered {:#x}..{:#x}",
            entry.iova,
            entry.iova.saturating_add(entry.len)
        ),
        Why::OtherDomain { owner } => format!("a fault: the word is domain {owner}'s"),
        Why::Untagged | Why::NeverMapped => "a fault: no mapping of this device held it".into(),
    }
}

/// A domain's device thread: reads and probes until told to stop.
fn device_thread(
    sh: &Shared,
    dev: &DmaDevice,
    domain: usize,
    slots: usize,
    seed: u64,
) -> LabResult<DeviceCounts> {
    let mut acc = DmaAccessor::for_device(dev)?;
    // A second look at where each successful access landed: no device
    // may reach a frame holding IOMMU state, whatever IOVA it used.
    let system = dev.domain().system().clone();
    let (unit_id, _) = system
        .unit_of(dev.source_id())
        .ok_or(LabError::Setup("the stress device has no unit"))?;
    let mut tr = system
        .unit(unit_id)
        .ok_or(LabError::Setup("the stress device's unit is gone"))?
        .translator()?;
    let mut rng = Rng::new(seed);
    let mut c = DeviceCounts::default();
    let me = &sh.shadows[domain];
    let other = &sh.shadows[1 - domain];
    let protected = sh.policy != Some(DmaPolicy::Passthrough);
    // Every mapping is read-only for the device, bounced ones included:
    // a write that succeeds anywhere is a violation.
    let writes = protected;
    let attrs = DmaAttrs::RELAXED;
    let mut n = 0u64;
    loop {
        n += 1;
        if n.is_multiple_of(256) && sh.stop.load(Ordering::Relaxed) {
            break;
        }
        let r = rng.below(16);
        let op = match r {
            _ if !protected => Op::Owned,
            0..=6 => Op::Owned,
            7..=10 => Op::JustUnmapped,
            11 => Op::Neighbour,
            12 => Op::Near,
            13 => Op::OtherDomain,
            14 => Op::Aperture,
            _ if writes => Op::Write,
            _ => Op::JustUnmapped,
        };
        if op == Op::Aperture {
            // Anywhere below the device's 48-bit mask.
            let x = (rng.next_u64() >> 19) << 3;
            c.probe_anywhere(sh, &mut acc, &mut tr, domain, x);
            continue;
        }
        let k = rng.below(slots as u64) as usize;
        let shadow = if op == Op::OtherDomain { other } else { me };
        let Some(newest) = shadow.slots[k].newest() else {
            continue;
        };
        let e = match op {
            Op::JustUnmapped => match newest.life {
                Life::Mapped | Life::Mapping if newest.gen > 1 => {
                    match shadow.slots[k].get(newest.gen - 1) {
                        Some(e) => e,
                        None => continue,
                    }
                }
                Life::Mapped | Life::Mapping => continue,
                _ => newest,
            },
            Op::Owned | Op::Neighbour | Op::Write if newest.life != Life::Mapped => continue,
            _ if newest.life == Life::Mapping => continue,
            _ => newest,
        };
        let word = |rng: &mut Rng| e.iova + 8 * rng.below(e.len / 8);
        let x = match op {
            Op::Owned | Op::JustUnmapped | Op::OtherDomain | Op::Write | Op::Aperture => {
                word(&mut rng)
            }
            Op::Neighbour if rng.below(2) == 0 => e.iova.wrapping_sub(8),
            Op::Neighbour => e.iova + e.len,
            Op::Near => {
                let delta = rng.below(9) as i64 - 4;
                (e.iova & !(PAGE - 1)).wrapping_add_signed(delta * PAGE as i64)
                    + 8 * rng.below(PAGE / 8)
            }
        };
        let flushed_upto_ns = me.flushed_upto_ns.load(Ordering::Acquire);
        let left_deferred_ns = me.left_deferred_ns.load(Ordering::Acquire);
        let t_before_ns = sh.clock.ns();
        let res = if op == Op::Write {
            acc.write_u64(x, 0, attrs).map(|()| 0)
        } else {
            acc.read_u64(x, attrs)
        };
        let t_after_ns = sh.clock.ns();
        c.accesses += 1;
        // Whether the owned mapping stayed live across the whole access.
        let live_throughout = op == Op::Owned
            && shadow.slots[k]
                .get(e.gen)
                .is_some_and(|a| a.life == Life::Mapped);
        let access = Access {
            domain: domain as u8,
            iova: x,
            value: res.as_ref().map_or(0, |v| *v),
            write: op == Op::Write,
            t_before_ns,
            t_after_ns,
            flushed_upto_ns,
            left_deferred_ns,
        };
        if res.is_ok() && protected {
            if let Some(phys) = iommu_frame_reached(sh, &mut tr, me, dev.source_id(), x) {
                c.judge(
                    sh,
                    op,
                    &access,
                    Some(&e),
                    domain,
                    Verdict::Violation(Why::IommuFrame { phys }),
                );
                continue;
            }
        }
        match res {
            Err(_) if live_throughout => {
                c.judge(
                    sh,
                    op,
                    &access,
                    Some(&e),
                    domain,
                    Verdict::Violation(Why::LiveFault),
                );
            }
            Err(_) => c.faults += 1,
            Ok(v) => {
                let expected = Tag {
                    kind: TagKind::Buffer,
                    domain: domain as u8,
                    slot: k as u16,
                    gen: e.gen,
                }
                .encode();
                let verdict = if live_throughout && v != expected {
                    Verdict::Violation(Why::WrongData { expected })
                } else if !protected {
                    // Pass-through isolates nothing: only the data of a
                    // live mapping is checked.
                    Verdict::Legal
                } else {
                    // A page whose map is in progress: let the shadow
                    // learn the IOVA first.
                    if let Some(t) = Tag::decode(v) {
                        if let Some(s) = sh
                            .shadows
                            .get(usize::from(t.domain))
                            .and_then(|d| d.slots.get(usize::from(t.slot)))
                        {
                            s.wait_mapped(t.gen, 100_000);
                        }
                    }
                    classify(&access, &sh.shadows, sh.bound_ns)
                };
                c.judge(sh, op, &access, Some(&e), domain, verdict);
            }
        }
    }
    Ok(c)
}

/// Where a successful access at `x` landed, if that is a frame holding
/// IOMMU state (page tables, queues; the domain's bounce pool is the
/// IOMMU's too, and the device's by design, so it is left out).
fn iommu_frame_reached(
    sh: &Shared,
    tr: &mut Translator,
    me: &DomainShadow,
    sid: SourceId,
    x: u64,
) -> Option<u64> {
    if me.in_pool(x) {
        return None;
    }
    iommu_state_at(&sh.mem, tr, sid, x)
}

/// The physical address device `sid` reaches at `x`, if the frame there
/// holds IOMMU state.
fn iommu_state_at(mem: &PhysMemory, tr: &mut Translator, sid: SourceId, x: u64) -> Option<u64> {
    let span = tr.translate_page(sid, x, HwAccess::Read).ok()?;
    mem.is_iommu_frame(span.phys).then_some(span.phys)
}

impl DeviceCounts {
    /// A read at an arbitrary IOVA of the aperture: judged like any other
    /// access (what it read, and where it landed).
    fn probe_anywhere(
        &mut self,
        sh: &Shared,
        acc: &mut DmaAccessor,
        tr: &mut Translator,
        domain: usize,
        x: u64,
    ) {
        let me = &sh.shadows[domain];
        let flushed_upto_ns = me.flushed_upto_ns.load(Ordering::Acquire);
        let left_deferred_ns = me.left_deferred_ns.load(Ordering::Acquire);
        let t_before_ns = sh.clock.ns();
        let res = acc.read_u64(x, DmaAttrs::RELAXED);
        let t_after_ns = sh.clock.ns();
        self.accesses += 1;
        let Ok(value) = res else {
            self.faults += 1;
            return;
        };
        let access = Access {
            domain: domain as u8,
            iova: x,
            value,
            write: false,
            t_before_ns,
            t_after_ns,
            flushed_upto_ns,
            left_deferred_ns,
        };
        let sid = acc.source_id();
        let verdict = match iommu_frame_reached(sh, tr, me, sid, x) {
            Some(phys) => Verdict::Violation(Why::IommuFrame { phys }),
            None => classify(&access, &sh.shadows, sh.bound_ns),
        };
        self.judge(sh, Op::Aperture, &access, None, domain, verdict);
    }
}

/// The typed report.
fn report(r: &StressReport) -> Report {
    let mut t = Table::new(
        "results",
        format!(
            "two domains, a CPU thread and a device thread each; checker verdicts per phase (flush timeout {} us){}",
            r.flush_timeout_us,
            if r.quick { ", quick" } else { "" }
        ),
        vec![
            Column::label("policy"),
            Column::metric("ops", "ops", Unit::Count, 0),
            Column::metric("device_accesses", "device accesses", Unit::Count, 0),
            Column::metric("faults", "faults", Unit::Count, 0),
            Column::metric("legal", "legal", Unit::Count, 0),
            Column::metric("stale_accesses", "stale", Unit::Count, 0),
            Column::metric("max_stale_age_us", "max stale age", Unit::Us, 0),
            Column::metric("violations", "violations", Unit::Count, 0),
            Column::metric("unjudged", "unjudged", Unit::Count, 0),
            Column::text("verdict"),
        ],
    );
    for x in &r.policies {
        t.row(vec![
            x.policy.clone().into(),
            x.ops.into(),
            x.device_accesses.into(),
            x.faults.into(),
            x.legal.into(),
            x.stale_accesses.into(),
            x.max_stale_age_us.into(),
            x.violations.into(),
            x.unjudged.into(),
            if x.violations == 0 { "ok" } else { "VIOLATION" }.into(),
        ]);
    }
    let mut rep = Report::new(
        "lab stress",
        "a soak with an independent checker: map, unmap, switch; devices access what they own and probe what they do not",
        contract(r),
    );
    rep.params = vec![
        Param::new("flush_timeout", r.flush_timeout_us, Unit::Us),
        Param::text("load_nice", r.load_nice),
        Param::text("quick", r.quick),
    ];
    rep.tables.push(t);
    rep.notes.push(match &r.first_violation {
        None => format!(
            "no violation in {} device accesses; stale accesses at most {} us old (timeout {} us)",
            r.device_accesses, r.max_stale_age_us, r.flush_timeout_us
        ),
        Some(v) => format!("{} violation(s); the first: {v}", r.violations),
    });
    rep
}

#[cfg(test)]
mod tests {
    use super::*;
    use softiommu::hw::ContextEntry;
    use softiommu::pgtable::{IoPageTable, VtdConfig, VtdPageTable};

    /// The checker's frame look-up reports an access that lands in a
    /// frame of IOMMU state (here a page-table root, reached by a
    /// pass-through device, which reaches everything) and nothing for an
    /// ordinary frame.
    #[test]
    fn an_access_landing_in_a_frame_of_iommu_state_is_reported() {
        let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
        let mut sys = System::new(mem.clone());
        let unit = sys.add_unit(UnitConfig::default()).unwrap();
        let sid = SourceId(0x0100);
        sys.assign(sid, unit).unwrap();
        let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        let u = sys.unit(unit).unwrap();
        u.attach(sid, ContextEntry::PassThrough).unwrap();
        let mut tr = u.translator().unwrap();
        let root = table.root();
        assert!(mem.is_iommu_frame(root));
        assert_eq!(iommu_state_at(&mem, &mut tr, sid, root + 8), Some(root + 8));
        let plain = mem.alloc_zeroed_frames(0).unwrap();
        assert_eq!(iommu_state_at(&mem, &mut tr, sid, plain), None);
    }
}
