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
use softiommu::{
    Access, DeviceSpec, DmaDirection, DmaDomainConfig, DmaError, DmaPolicy, Platform, SourceId,
    PAGE_SIZE,
};

const NIC: SourceId = SourceId(0x0100);
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
