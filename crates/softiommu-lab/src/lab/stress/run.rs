//! The soak's phases: the CPU threads that map and unmap, the switcher,
//! and the run that ties them to the device threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::dma::{DmaDevice, DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{SourceId, System, UnitConfig};
use softiommu::mem::PhysMemory;

use super::args::*;
use super::bound;
use super::check::{DomainShadow, Entry, Life, Tag, TagKind, PAGE};
use super::device::*;
use super::extra;
use super::out::*;
use super::render::*;
use super::*;
use crate::args::dma_policies;
use crate::error::{join, LabError, LabResult};
use crate::report::Report;
use crate::workload::Rng;

/// Runs the lab.
pub fn run(args: &StressArgs) -> LabResult<Report> {
    let r = measure(args)?;
    Ok(report(&r))
}

pub(super) fn measure(args: &StressArgs) -> LabResult<StressReport> {
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
        rows.push(extra::virtio_phase(seconds, timeout, seed)?);
        rows.push(extra::reclaim_phase(seconds, seed ^ 0x5eed)?);
    }
    let bound = bound::bound(timeout);
    let (mut bound_probes, mut bound_probe_max_age_us) = (0, 0);
    if args.bound.get() == 1 {
        // Long enough for probes well past the bound whatever `seconds`.
        let secs = seconds.max(3.0 * bound.as_secs_f64());
        let seed = args.seed.get().wrapping_add((n + 1) * 0x1_0000);
        let b = bound::bound_phase(secs, timeout, seed, args.hogs.get(), args.load_nice.get())?;
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
pub(super) struct Clock(Instant);

impl Clock {
    pub(super) fn ns(self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// What every thread of a phase shares.
pub(super) struct Shared {
    pub(super) mem: Arc<PhysMemory>,
    pub(super) shadows: Vec<DomainShadow>,
    pub(super) clock: Clock,
    pub(super) stop: AtomicBool,
    /// The promised bound (flush timeout + 1 ms), nanoseconds.
    pub(super) bound_ns: u64,
    /// The policy of a fixed phase (None: switching).
    pub(super) policy: Option<DmaPolicy>,
}

pub(super) fn run_phase(
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
        bound_ns: bound::bound(timeout).as_nanos() as u64,
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
pub(super) fn learn_pool(
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
pub(super) struct Zombie {
    pub(super) iova: u64,
    pub(super) len: u64,
    pub(super) due: u64,
}

/// A domain's CPU thread: maps and unmaps its slots until told to stop;
/// returns its operation count.
pub(super) fn cpu_thread(
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
pub(super) fn write_page(
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
pub(super) fn switch_thread(sh: &Shared, doms: &[Arc<DmaDomain>]) -> LabResult<u64> {
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
