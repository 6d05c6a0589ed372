//! Fault injection (issue 15 part 3): each test injects one fault and
//! checks that the system reports it, recovers from it, or fails closed,
//! and that it never leaves a stale mapping reachable nor a thread hung.
//! `docs/ERRORS.md` ("Fault injection") names each test beside its fault.
//!
//! Every test runs its body on a thread of its own and fails if the body
//! takes longer than [`LIMIT`]: a hang fails the test instead of the run.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use softiommu::dma::SgEntry;
use softiommu::hw::{ContextScope, InvDescriptor, IqeReason, QueueRecovery};
use softiommu::{
    Access, DmaDirection, DmaError, DmaPolicy, HwError, LatencyModel, Platform, QiError, QueueMode,
    SourceId, Translator, Unit, UnitConfig, PAGE_SIZE,
};

const NIC: SourceId = SourceId(0x0100);
const NIC2: SourceId = SourceId(0x0200);
const TO: DmaDirection = DmaDirection::ToDevice;
/// Far above what any body here needs on a loaded 2-core machine: only a
/// hang reaches it.
const LIMIT: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread; fails the test if it panics or outlasts
/// [`LIMIT`].
fn timed(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(()) => h.join().expect("the test body"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test did not end within {LIMIT:?}"),
    }
}

/// 64 MiB, one unit whose queue runs on its own thread, `NIC` and `NIC2`
/// attached to a domain of `policy`.
fn threaded(policy: DmaPolicy) -> Platform {
    Platform::builder()
        .memory(64 << 20)
        .unit(UnitConfig {
            queue_mode: QueueMode::Thread,
            ..UnitConfig::default()
        })
        .policy(policy)
        .device(NIC)
        .device(NIC2)
        .build()
        .unwrap()
}

/// Whether `NIC` reaches `iova` now (a translation, as a device's access
/// begins with).
fn reaches(t: &mut Translator, iova: u64) -> bool {
    t.translate(NIC, iova, 8, Access::Read).is_ok()
}

/// Maps one page-sized buffer at `phys` and has the device use it twice,
/// so that the IOTLB holds its translation.
fn map_cached(p: &Platform, cpu: &mut softiommu::DmaCpu, t: &mut Translator, phys: u64) -> u64 {
    let iova = cpu.map(&p.devices[0], phys, 64, TO).unwrap();
    assert!(reaches(t, iova) && reaches(t, iova), "mapped and cached");
    iova
}

/// Injects an invalidation-queue error mid-batch: the unit thread is
/// busy with a slow descriptor (300 ms) and a malformed one waits behind
/// it, so whatever is queued next lands behind the error and its wait
/// fails when the thread reaches it.
fn stall_then_stop(unit: &Unit) {
    unit.set_latency(LatencyModel {
        context_invalidation: Duration::from_millis(300),
        ..LatencyModel::zero()
    });
    unit.submit_raw(&[
        InvDescriptor::context(ContextScope::Global).encode(),
        [0x3, 0],
    ])
    .unwrap();
    unit.set_latency(LatencyModel::zero());
}

fn stopped_on_bad_type(unit: &Unit) -> bool {
    matches!(unit.queue_error(), Some(f) if f.reason == IqeReason::InvalidType { ty: 3 })
}

// ----- 1. Invalidation-queue errors mid-batch -----

#[test]
fn a_queue_error_mid_batch_leaves_no_unmapped_iova_reachable_and_the_queue_recovers() {
    timed(|| {
        let p = threaded(DmaPolicy::Strict);
        let unit = p.unit(0).unwrap();
        let bypass = || unit.stats().queue_bypass_revocations;
        let mut cpu = p.domain.cpu();
        let mut t = unit.translator().unwrap();
        let buf = p.mem.alloc_zeroed_frames(3).unwrap();
        let page = |i: u64| buf + i * PAGE_SIZE;

        // Strict: the unmap's invalidation and wait queue behind the bad
        // descriptor; the wait fails there, and the unmap completes by
        // revoking around the queue.
        let a = map_cached(&p, &mut cpu, &mut t, page(0));
        stall_then_stop(unit);
        cpu.unmap(&p.devices[0], a, 64, TO).unwrap();
        assert!(!reaches(&mut t, a), "revoked before the unmap returned");
        assert!(stopped_on_bad_type(unit));
        assert_eq!((bypass(), unit.stats().queue_errors), (1, 1));
        assert_eq!(p.domain.stats().live(), 0);
        // Recovered, the thread carries out what waited behind the error
        // (the unmap's own invalidation and its failed wait).
        assert!(unit.recover_queue(QueueRecovery::Skip).unwrap());
        unit.wait().unwrap();

        // Deferred: a batch queued when the queue stops mid-batch is
        // flushed around it; nothing is kept, nothing fails.
        p.domain.set_policy(DmaPolicy::Deferred).unwrap();
        p.domain.set_timeout(Duration::from_secs(60)).unwrap();
        let b = map_cached(&p, &mut cpu, &mut t, page(1));
        cpu.unmap(&p.devices[0], b, 64, TO).unwrap();
        stall_then_stop(unit);
        cpu.flush_own().unwrap();
        assert!(!reaches(&mut t, b));
        assert!(stopped_on_bad_type(unit));
        assert_eq!(bypass(), 2);
        let s = p.domain.stats();
        assert_eq!((s.flush_failures, s.pending_batches, s.live()), (0, 0, 0));
        assert!(unit.recover_queue(QueueRecovery::Discard).unwrap());

        // The flush timer meets a stopped queue the same way.
        let c = map_cached(&p, &mut cpu, &mut t, page(2));
        unit.submit_raw(&[[0x3, 0]]).unwrap();
        let _ = unit.wait();
        assert!(stopped_on_bad_type(unit));
        let flushes = p.domain.stats().flushes;
        p.domain.set_timeout(Duration::from_millis(2)).unwrap();
        cpu.unmap(&p.devices[0], c, 64, TO).unwrap();
        let t0 = Instant::now();
        while p.domain.stats().flushes == flushes {
            assert!(t0.elapsed() < Duration::from_secs(20), "the timer flushed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!reaches(&mut t, c));
        assert_eq!((bypass(), p.domain.stats().flush_failures), (3, 0));
        assert!(unit.recover_queue(QueueRecovery::Skip).unwrap());

        // Recovered: unmaps go through the queue again, none around it.
        let d = map_cached(&p, &mut cpu, &mut t, page(3));
        cpu.unmap(&p.devices[0], d, 64, TO).unwrap();
        cpu.flush_own().unwrap();
        p.domain.set_policy(DmaPolicy::Strict).unwrap();
        let e = map_cached(&p, &mut cpu, &mut t, page(4));
        cpu.unmap(&p.devices[0], e, 64, TO).unwrap();
        assert!(!reaches(&mut t, d) && !reaches(&mut t, e));
        assert_eq!(bypass(), 3, "the queue carried them");
        assert!(unit.queue_error().is_none());
        assert_eq!(p.domain.stats().live(), 0);
    });
}

// ----- 2. A unit thread stalled by latency spikes -----

#[test]
fn a_unit_thread_stalled_by_latency_spikes_delays_revocation_but_never_skips_it() {
    timed(|| {
        const STALL: Duration = Duration::from_millis(400);
        let p = Arc::new(threaded(DmaPolicy::Strict));
        let unit = p.unit(0).unwrap();
        let buf = p.mem.alloc_zeroed_frames(2).unwrap(); // 4 pages
                                                         // What the device uses now: the IOVA, the buffer's index (bits
                                                         // 1..4) and, in bit 0, whether its unmap has returned (and its
                                                         // flush, when deferred).
        let now = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let device = {
            let (p, now, stop) = (p.clone(), now.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut t = p.unit(0).unwrap().translator().unwrap();
                let (mut hits, mut after) = (0u64, 0u64);
                while !stop.load(SeqCst) {
                    let s = now.load(SeqCst);
                    if s == 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    let (iova, idx, gone) = (s & !0xfff, (s >> 1) & 0xf, s & 1 == 1);
                    let r = t.translate(NIC, iova, 8, Access::Read);
                    if let Ok(r) = &r {
                        hits += 1;
                        let phys = r.as_slice()[0].phys;
                        assert!(
                            !(gone && phys / PAGE_SIZE == buf / PAGE_SIZE + idx),
                            "the device reached buffer {idx} through {iova:#x} after its                              unmap returned"
                        );
                    }
                    after += u64::from(gone);
                }
                (hits, after)
            })
        };
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let spikes = || {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let unit = p.unit(0).unwrap();
                let ms = [0u64, 5, 0, 30, 1, 80, 0, 15];
                let mut i = 0;
                while !stop.load(SeqCst) {
                    let spike = Duration::from_millis(ms[i % ms.len()]);
                    unit.set_latency(LatencyModel {
                        wait_completion: spike,
                        iotlb_invalidation: spike / 2,
                        ..LatencyModel::zero()
                    });
                    i += 1;
                    std::thread::sleep(Duration::from_millis(3));
                }
            })
        };
        // One long stall first: the strict unmap waits it out, and returns
        // only once revoked. Then spikes, changed every 3 ms.
        unit.set_latency(LatencyModel {
            wait_completion: STALL,
            ..LatencyModel::zero()
        });
        let mut spiking = None;
        for cycle in 0..40u64 {
            if cycle == 20 {
                p.domain.set_policy(DmaPolicy::Deferred).unwrap();
            }
            let idx = cycle % 4;
            let iova = cpu.map(dev, buf + idx * PAGE_SIZE, 64, TO).unwrap();
            now.store(iova | idx << 1, SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            let t0 = Instant::now();
            cpu.unmap(dev, iova, 64, TO).unwrap();
            if cycle >= 20 {
                cpu.flush_own().unwrap();
            }
            if cycle == 0 {
                assert!(
                    t0.elapsed() >= STALL,
                    "the unmap waited for the stalled unit"
                );
                spiking = Some(spikes());
            }
            now.store(iova | idx << 1 | 1, SeqCst);
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, SeqCst);
        let (hits, after) = device.join().unwrap();
        spiking.unwrap().join().unwrap();
        assert!(hits > 0 && after > 0, "the device kept using the IOVAs");
        let s = unit.stats();
        assert!(s.modelled_ns >= STALL.as_nanos() as u64);
        assert_eq!(s.queue_bypass_revocations, 0, "the queue did it, late");
        assert!(unit.queue_error().is_none());
        assert_eq!(p.domain.stats().live(), 0);
    });
}

// ----- 3. A dead unit thread -----

#[test]
fn a_dead_unit_thread_fails_waits_typed_and_unmaps_revoke_around_it() {
    timed(|| {
        let inline = Platform::builder().memory(16 << 20).device(NIC).build();
        assert!(
            !inline.unwrap().unit(0).unwrap().inject_queue_thread_death(),
            "no thread to end in inline mode"
        );
        let p = Arc::new(threaded(DmaPolicy::Strict));
        let unit = p.unit(0).unwrap();
        let bypass = || unit.stats().queue_bypass_revocations;
        let mut cpu = p.domain.cpu();
        let mut t = unit.translator().unwrap();
        let buf = p.mem.alloc_zeroed_frames(2).unwrap();
        let a = map_cached(&p, &mut cpu, &mut t, buf);

        // A device holds a section open: the thread's next draining wait
        // (queued now) stays in its pass until the section ends.
        let (held_tx, held_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let holder = {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut t = p.unit(0).unwrap().translator().unwrap();
                t.section(|g| {
                    g.translate(NIC, a, 8, Access::Read).unwrap();
                    held_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                });
            })
        };
        held_rx.recv().unwrap();
        unit.submit(&[InvDescriptor::iotlb_global(), InvDescriptor::wait_event()])
            .unwrap();
        // A strict unmap queues its invalidation and wait behind that pass
        // and waits for them.
        let tail = unit.queue_registers().tail;
        let unmapper = {
            let p = p.clone();
            std::thread::spawn(move || p.domain.cpu().unmap(&p.devices[0], a, 64, TO))
        };
        let len = unit.queue_registers().len;
        while (unit.queue_registers().tail + len - tail) % len < 2 {
            std::thread::yield_now();
        }
        // The thread dies at the end of its pass, with that wait pending.
        assert!(unit.inject_queue_thread_death());
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        // The pending wait failed (`ShutDown`) instead of hanging, and the
        // unmap revoked around the queue.
        unmapper.join().unwrap().unwrap();
        assert!(!reaches(&mut t, a));
        assert_eq!(bypass(), 1);
        while unit.queue_thread_alive() {
            std::thread::yield_now();
        }
        assert!(!unit.inject_queue_thread_death(), "gone already");

        // From now on: every wait and submission fails at once, typed...
        assert_eq!(unit.wait(), Err(QiError::ShutDown));
        assert_eq!(unit.submit_raw(&[[0x3, 0]]), Err(QiError::ShutDown));
        assert!(unit.queue_error().is_none(), "nothing was queued");
        // ...unmaps, strict and deferred, complete around the queue...
        let b = map_cached(&p, &mut cpu, &mut t, buf + PAGE_SIZE);
        cpu.unmap(&p.devices[0], b, 64, TO).unwrap();
        assert!(!reaches(&mut t, b));
        p.domain.set_policy(DmaPolicy::Deferred).unwrap();
        let c = map_cached(&p, &mut cpu, &mut t, buf + 2 * PAGE_SIZE);
        cpu.unmap(&p.devices[0], c, 64, TO).unwrap();
        cpu.flush_own().unwrap();
        assert!(!reaches(&mut t, c));
        assert_eq!(bypass(), 3);
        assert_eq!(p.domain.stats().pending_batches, 0);
        // ...context changes the unit could not drain are refused with
        // nothing written (fail closed)...
        assert_eq!(
            p.domain.set_policy(DmaPolicy::Passthrough),
            Err(DmaError::Hw(HwError::Queue(QiError::ShutDown)))
        );
        assert_eq!(p.domain.policy(), DmaPolicy::Deferred);
        p.domain.detach(&p.devices[1]).unwrap();
        assert_eq!(unit.context(NIC2), None);
        assert!(matches!(
            p.domain.attach(NIC2, u64::MAX, false),
            Err(DmaError::Hw(HwError::Queue(QiError::ShutDown)))
        ));
        assert_eq!(unit.context(NIC2), None, "nothing written");
        // ...and the device still reaches what is mapped: translation needs
        // no queue thread.
        let d = map_cached(&p, &mut cpu, &mut t, buf + 3 * PAGE_SIZE);
        cpu.unmap(&p.devices[0], d, 64, TO).unwrap();
        cpu.flush_own().unwrap();
        assert!(!reaches(&mut t, d));
        assert_eq!(p.domain.stats().live(), 0);
        // Dropping everything joins the dead thread: no hang.
    });
}

// ----- 7. A device that never stops issuing DMA during policy switches -----

/// The page states of the switch test: per physical page, `seq << 1 |
/// live`, where `seq` is the global revocation count at the page's last
/// completed unmap.
struct Pages {
    state: Vec<AtomicU64>,
    /// Completed revocations so far.
    revoked: AtomicU64,
    /// Odd while a coherent allocation runs: its frames are known only
    /// once it has mapped them, so they are marked live after the fact.
    coherent: AtomicU64,
}

impl Pages {
    fn new(mem_bytes: u64) -> Self {
        Self {
            state: (0..mem_bytes / PAGE_SIZE)
                .map(|_| AtomicU64::new(0))
                .collect(),
            revoked: AtomicU64::new(0),
            coherent: AtomicU64::new(0),
        }
    }

    fn pages(phys: u64, len: u64) -> std::ops::Range<usize> {
        (phys / PAGE_SIZE) as usize..(phys + len).div_ceil(PAGE_SIZE) as usize
    }

    /// Before a map: the device may reach the pages from now on.
    fn live(&self, phys: u64, len: u64) {
        for p in Self::pages(phys, len) {
            let s = self.state[p].load(SeqCst);
            self.state[p].store(s | 1, SeqCst);
        }
    }

    /// After an unmap (and its flush) returned: nothing may reach them.
    fn revoked(&self, phys: u64, len: u64) {
        let seq = self.revoked.fetch_add(1, SeqCst) + 1;
        for p in Self::pages(phys, len) {
            self.state[p].store(seq << 1, SeqCst);
        }
    }
}

/// The policy phase the switcher publishes: `seq << 8 | policy`, with
/// `SWITCHING` set while a `set_policy` runs.
const SWITCHING: u64 = 0x80;

fn policy_code(p: DmaPolicy) -> u64 {
    match p {
        DmaPolicy::Passthrough => 0,
        DmaPolicy::Strict => 1,
        DmaPolicy::Deferred => 2,
        DmaPolicy::Bounce => 3,
    }
}

#[test]
fn a_device_issuing_dma_through_policy_switches_reaches_only_live_mappings() {
    timed(|| {
        const MEM: u64 = 64 << 20;
        const RUN: Duration = Duration::from_secs(3);
        let p = Arc::new(
            Platform::builder()
                .memory(MEM)
                .policy(DmaPolicy::Strict)
                .device(NIC)
                .build()
                .unwrap(),
        );
        p.domain.set_timeout(Duration::from_millis(1)).unwrap();
        let pages = Arc::new(Pages::new(MEM));
        let phase = Arc::new(AtomicU64::new(policy_code(DmaPolicy::Strict)));
        let stop = Arc::new(AtomicBool::new(false));
        // The addresses the CPU handed out lately, live or not: what the
        // device keeps using.
        let recent: Arc<Vec<AtomicU64>> = Arc::new((0..32).map(|_| AtomicU64::new(0)).collect());
        let next = Arc::new(AtomicUsize::new(0));
        let publish = {
            let (recent, next) = (recent.clone(), next.clone());
            move |addr: u64| recent[next.fetch_add(1, SeqCst) % recent.len()].store(addr, SeqCst)
        };

        let buf = p.mem.alloc_zeroed_frames(4).unwrap(); // 16 pages
        let device = {
            let (p, pages, phase, stop, recent) = (
                p.clone(),
                pages.clone(),
                phase.clone(),
                stop.clone(),
                recent.clone(),
            );
            std::thread::spawn(move || {
                let mut t = p.unit(0).unwrap().translator().unwrap();
                let (mut hits, mut faults, mut checked) = (0u64, 0u64, 0u64);
                let mut i = 0usize;
                while !stop.load(SeqCst) {
                    i = i.wrapping_add(1);
                    let addr = recent[i % recent.len()].load(SeqCst);
                    if addr == 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    let ph0 = phase.load(SeqCst);
                    let co0 = pages.coherent.load(SeqCst);
                    let seen = pages.revoked.load(SeqCst);
                    let r = t.section(|g| {
                        g.translate(NIC, addr, 8, Access::Read)
                            .map(|r| r.as_slice()[0].phys)
                    });
                    let ph1 = phase.load(SeqCst);
                    let co1 = pages.coherent.load(SeqCst);
                    let Ok(phys) = r else {
                        faults += 1;
                        continue;
                    };
                    hits += 1;
                    // Only a translation that ran wholly under one
                    // translating policy is checked: pass-through reaches
                    // everything by design.
                    let translated = ph0 == ph1 && ph0 & SWITCHING == 0 && ph0 & 0x7f != 0;
                    if !translated || phys >= MEM || p.mem.is_iommu_frame(phys) {
                        // Outside memory (a master abort at the access), or
                        // a bounce pool: the device reaches only copies.
                        continue;
                    }
                    let in_buf = (buf..buf + 16 * PAGE_SIZE).contains(&phys);
                    if !in_buf && (co0 != co1 || co0 % 2 == 1) {
                        // A coherent allocation ran meanwhile: it may have
                        // mapped a frame (at an IOVA handed out before)
                        // not yet marked live.
                        continue;
                    }
                    checked += 1;
                    let s = pages.state[(phys / PAGE_SIZE) as usize].load(SeqCst);
                    assert!(
                        s & 1 == 1 || s >> 1 > seen,
                        "the device reached {phys:#x} through {addr:#x} after its unmap \
                         completed (page state {s:#x}, revocations seen before {seen}, \
                         phase {ph0:#x}, {})",
                        if in_buf { "streaming" } else { "coherent" }
                    );
                }
                (hits, faults, checked)
            })
        };

        let switcher = {
            let (d, phase, stop) = (p.domain.clone(), phase.clone(), stop.clone());
            std::thread::spawn(move || {
                let order = [
                    DmaPolicy::Deferred,
                    DmaPolicy::Passthrough,
                    DmaPolicy::Bounce,
                    DmaPolicy::Strict,
                    DmaPolicy::Passthrough,
                    DmaPolicy::Deferred,
                    DmaPolicy::Strict,
                    DmaPolicy::Bounce,
                ];
                let (mut ok, mut busy, mut to_pt) = (0u64, 0u64, 0u64);
                let mut seq = 1u64;
                let mut i = 0;
                while !stop.load(SeqCst) {
                    let want = order[i % order.len()];
                    let cur = phase.load(SeqCst) & 0x7f;
                    phase.store(seq << 8 | SWITCHING | cur, SeqCst);
                    let was = d.policy();
                    let r = d.set_policy(want);
                    seq += 1;
                    phase.store(seq << 8 | policy_code(d.policy()), SeqCst);
                    match r {
                        Ok(()) => {
                            ok += u64::from(was != want);
                            to_pt += u64::from(was != want && want == DmaPolicy::Passthrough);
                            i += 1;
                        }
                        Err(DmaError::PolicySwitchBusy { live }) => {
                            // Mappings are live: pass-through must wait for
                            // a moment with none. Try again at once, and
                            // move on after a while.
                            assert!(live > 0);
                            busy += 1;
                            std::thread::yield_now();
                            continue;
                        }
                        Err(e) => panic!("a switch failed with {e:?}"),
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                (ok, busy, to_pt)
            })
        };

        // The CPU: rounds of maps of every kind, then unmaps of all of
        // them, so that pass-through switches find moments with nothing
        // live.
        let dev = &p.devices[0];
        let mut cpu = p.domain.cpu();
        let t0 = Instant::now();
        let mut rounds = 0u64;
        let check_kind = |addr: u64, phys: u64, what: &str| {
            let policy = p.domain.policy();
            let passed = addr == phys;
            assert!(
                passed == (policy == DmaPolicy::Passthrough),
                "{what} returned {addr:#x} for {phys:#x} but the policy is now {policy:?}: \
                 a mapping of another policy outlived a switch"
            );
        };
        while t0.elapsed() < RUN {
            rounds += 1;
            let a = buf + (rounds % 4) * 4 * PAGE_SIZE;
            let sg = [
                SgEntry {
                    phys: a + PAGE_SIZE,
                    len: PAGE_SIZE,
                },
                SgEntry {
                    phys: a + 2 * PAGE_SIZE,
                    len: PAGE_SIZE,
                },
            ];
            let mut out = [0u64; 2];
            let (mut single, mut list, mut coherent) = (None, None, None);
            // Each kind goes first in turn: the first is made with nothing
            // live, when a switch to or from pass-through may run.
            for step in 0..3 {
                match (rounds + step) % 3 {
                    0 => {
                        pages.live(a, 64);
                        let ia = cpu.map(dev, a, 64, DmaDirection::Bidirectional).unwrap();
                        check_kind(ia, a, "map");
                        publish(ia);
                        single = Some(ia);
                    }
                    1 => {
                        pages.live(a + PAGE_SIZE, 2 * PAGE_SIZE);
                        let m = cpu
                            .map_sg(dev, &sg, DmaDirection::ToDevice, &mut out)
                            .unwrap();
                        check_kind(out[0], sg[0].phys, "map_sg");
                        publish(out[0]);
                        publish(out[1]);
                        list = Some(m);
                    }
                    _ => {
                        // Its frames come from the allocator: marked live
                        // once known.
                        pages.coherent.fetch_add(1, SeqCst);
                        let (cp, cd) = cpu.alloc_coherent(dev, PAGE_SIZE).unwrap();
                        pages.live(cp, PAGE_SIZE);
                        pages.coherent.fetch_add(1, SeqCst);
                        check_kind(cd, cp, "alloc_coherent");
                        publish(cd);
                        coherent = Some((cp, cd));
                    }
                }
            }
            std::thread::sleep(Duration::from_micros(20));
            // Unmap everything; revoked once a flush of our queue is done
            // too (the unmaps may have run deferred).
            let (ia, m, (cp, cd)) = (single.unwrap(), list.unwrap(), coherent.unwrap());
            cpu.unmap(dev, ia, 64, DmaDirection::Bidirectional).unwrap();
            cpu.unmap_sg(dev, &m, &sg, &out, DmaDirection::ToDevice)
                .unwrap();
            cpu.free_coherent(dev, cp, cd, PAGE_SIZE).unwrap();
            cpu.flush_own().unwrap();
            pages.revoked(a, 64);
            pages.revoked(a + PAGE_SIZE, 2 * PAGE_SIZE);
            pages.revoked(cp, PAGE_SIZE);
            // A moment with nothing live, for switches to and from
            // pass-through.
            std::thread::sleep(Duration::from_micros(20));
        }
        stop.store(true, SeqCst);
        let (hits, faults, checked) = device.join().unwrap();
        let (ok, busy, to_pt) = switcher.join().unwrap();
        assert_eq!(p.domain.stats().live(), 0);
        println!(
            "rounds {rounds}, device hits {hits} (checked {checked}) faults {faults}, \
             switches {ok} ({to_pt} to pass-through), busy {busy}"
        );
        assert!(hits > 0 && faults > 0 && checked > 0);
        assert!(
            ok >= 4 && to_pt >= 1,
            "the policy did switch, pass-through included"
        );
    });
}
