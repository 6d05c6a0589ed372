//! Loom models of the IOTLB's hit path, fills and invalidations, and of the
//! drain that makes a wait's promise hold. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p softiommu --release --lib hw::`.
//!
//! The models compose the same `Iotlb` and `Slots` calls, in the same
//! order, as `Translator::lookup`/`walk` and the processor's wait; the page
//! table is one atomic entry (the walk's Acquire load of it stands for the
//! walker's), and the fences are the `Barrier::Fence` pair (loom cannot
//! model `membarrier(2)`; see `barrier` for why it is equivalent).

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use super::epoch::Slots;
use super::iotlb::{binding_of, Iotlb, IotlbConfig, Leaf};
use crate::pgtable::{PageSize, Perm};
use crate::sync::barrier::Barrier;

const IOVA: u64 = 0x5000;
const PHYS: u64 = 0x9000;
const DID: u16 = 0;

/// Runs `f` under loom and prints how many executions it explored (shown
/// with `--nocapture`).
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let mut b = loom::model::Builder::new();
    // Three preemptions: about 100,000 executions in all, a few seconds in
    // release mode. (Two already catch every seeded bug we tried: a Relaxed
    // `enter`, no `psi` re-check, no kill bit, no sequence re-check, no
    // generation check, a drain that does not wait, no light fence, a
    // Relaxed ticket or generation load.)
    b.preemption_bound = Some(3);
    // The drain's and the scan's spin loops add a branch per turn.
    b.max_branches = 20_000;
    let counter = runs.clone();
    b.check(move || {
        counter.fetch_add(1, StdOrdering::Relaxed);
        f()
    });
    println!("{name}: {} executions", runs.load(StdOrdering::Relaxed));
}

/// `loom::thread::spawn`, but the new thread's first atomic operation is a
/// store to a private atomic: loom 0.7 does not explore a thread whose first
/// operation is a load (tokio-rs/loom#392).
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::spawn(move || {
        AtomicU64::new(0).store(1, Ordering::Relaxed);
        f()
    })
}

fn leaf(phys: u64) -> Leaf {
    Leaf {
        phys,
        size: PageSize::Size4K,
        perm: Perm::RW,
    }
}

/// The world one model runs in.
struct World {
    tlb: Iotlb,
    slots: Slots,
    /// The table entry for `IOVA`: `PHYS`, or 0 once unmapped.
    pte: AtomicU64,
    /// 1 while a translator uses a mapped result (a guard's copy).
    in_use: AtomicU64,
    /// 1 once the driver's wait has completed.
    waited: AtomicU64,
}

impl World {
    fn new() -> Arc<Self> {
        let slots = Slots::new(2);
        assert_eq!(slots.claim(1), Some((0, 0)));
        assert_eq!(slots.claim(2), Some((1, 0)));
        Arc::new(World {
            tlb: Iotlb::new(IotlbConfig { sets: 1, ways: 1 }, 1),
            slots,
            pte: AtomicU64::new(PHYS),
            in_use: AtomicU64::new(0),
            waited: AtomicU64::new(0),
        })
    }

    /// One translation section of `slot`, as `Translator::lookup` + `walk`
    /// (state is the slot's last even value; returns the new one).
    /// Returns the physical address found, if any.
    fn translate(&self, slot: usize, state: &mut u64) -> Option<u64> {
        *state += 1;
        self.slots.enter(slot, *state, Barrier::Fence);
        let began_after_wait = self.waited.load(Ordering::Acquire) == 1;
        let gen = self.tlb.gen(DID);
        let found = match self.tlb.lookup(DID, IOVA, gen) {
            Some(l) => Some(l.phys),
            None => {
                let ticket = self.tlb.ticket(DID, gen);
                match self.pte.load(Ordering::Acquire) {
                    0 => None,
                    phys => {
                        self.tlb.fill(DID, IOVA, leaf(phys), ticket, 0);
                        Some(phys)
                    }
                }
            }
        };
        if found.is_some() {
            assert!(!began_after_wait, "stale translation after the wait");
            // The guard's holder uses the page, then lets go.
            self.in_use.store(1, Ordering::Relaxed);
            self.in_use.store(0, Ordering::Relaxed);
        }
        *state += 1;
        self.slots.exit(slot, *state);
        found
    }

    /// The driver: unmap, invalidate with `inv`, wait (drain), then check.
    ///
    /// The drain is `Slots::drain` with its spin bounded: loom keeps
    /// rescheduling a thread that spins on another's progress (as
    /// tokio-rs/loom#53 describes), so the model polls at most `POLLS`
    /// times and drops the execution if the sections it waits for are still
    /// active. Polls are loads with no effect, so a longer wait has no
    /// behaviour a shorter one lacks; what is dropped is only the same
    /// execution with more idle polls.
    fn unmap_and_wait(&self, state: &mut u64, inv: impl Fn(&Iotlb)) {
        const POLLS: usize = 3;
        self.pte.store(0, Ordering::Relaxed);
        inv(&self.tlb);
        let mut pending = self.slots.drain_start(Barrier::Fence);
        let mut polls = 0;
        while !self.slots.drain_poll(&mut pending) {
            polls += 1;
            if polls == POLLS {
                return;
            }
            thread::yield_now();
        }
        assert_eq!(
            self.in_use.load(Ordering::Relaxed),
            0,
            "a guard holding the old page outlived the wait"
        );
        self.waited.store(1, Ordering::Release);
        assert_eq!(self.translate(1, state), None, "stale after the wait");
    }
}

/// A device thread of slot 0 making two translations of `IOVA`, racing
/// the driver.
fn device_translating_twice(w: &Arc<World>) -> thread::JoinHandle<()> {
    let w = w.clone();
    spawn(move || {
        let mut state = 0;
        w.translate(0, &mut state);
        w.translate(0, &mut state);
    })
}

/// A reader racing a writer that fills, invalidates and refills one entry
/// with a different tag never sees one fill's tag with another's value.
#[test]
fn seqlock_readers_never_see_a_torn_entry() {
    model("seqlock_readers_never_see_a_torn_entry", || {
        let t = Arc::new(Iotlb::new(IotlbConfig { sets: 1, ways: 1 }, 1));
        let w = {
            let t = t.clone();
            spawn(move || {
                let tk = t.ticket(DID, t.gen(DID));
                t.fill(DID, 0x1000, leaf(0xa000), tk, 0);
                let tk = t.ticket(DID, t.gen(DID));
                t.fill(DID, 0x2000, leaf(0xb000), tk, 0);
            })
        };
        for _ in 0..2 {
            let g = t.gen(DID);
            if let Some(l) = t.lookup(DID, 0x1000, g) {
                assert_eq!(l.phys, 0xa000);
            }
            if let Some(l) = t.lookup(DID, 0x2000, g) {
                assert_eq!(l.phys, 0xb000);
            }
        }
        w.join().unwrap();
    });
}

/// Page-selective invalidation: a translation racing the unmap may fill an
/// entry from the old table, but after the wait nothing stale is returned
/// and no section that used the old page is still open.
#[test]
fn page_invalidation_and_wait_leave_nothing_stale() {
    model("page_invalidation_and_wait_leave_nothing_stale", || {
        let w = World::new();
        let dev = device_translating_twice(&w);
        w.unmap_and_wait(&mut 0, |t| {
            t.invalidate_pages(DID, IOVA, 0);
        });
        dev.join().unwrap();
    });
}

/// The same with a domain-selective invalidation (a generation bump: the
/// racing fill must be dead on arrival).
#[test]
fn domain_invalidation_and_wait_leave_nothing_stale() {
    model("domain_invalidation_and_wait_leave_nothing_stale", || {
        let w = World::new();
        let dev = device_translating_twice(&w);
        w.unmap_and_wait(&mut 0, |t| t.invalidate_domain(DID));
        dev.join().unwrap();
    });
}

/// A translation that hits an entry cached before the unmap, racing the
/// invalidation and the drain.
#[test]
fn a_cached_hit_racing_the_wait() {
    model("a_cached_hit_racing_the_wait", || {
        let w = World::new();
        // Cached before anything runs.
        let mut state = 0;
        assert_eq!(w.translate(1, &mut state), Some(PHYS));
        let dev = {
            let w = w.clone();
            spawn(move || {
                let mut state = 0;
                w.translate(0, &mut state);
            })
        };
        w.unmap_and_wait(&mut state, |t| {
            t.invalidate_pages(DID, IOVA, 0);
        });
        dev.join().unwrap();
    });
}

/// A stalled wait (see `processor`): the drain's snapshot is taken by the
/// thread whose pass first reached the wait, and polled, and the
/// completion published, by whichever thread runs a later pass (the
/// snapshot handed over under the processing lock). A waiter that sees the
/// completion finds no stale translation and no section still using the
/// old page.
#[test]
fn a_drain_begun_by_one_pass_and_finished_by_another() {
    model("a_drain_begun_by_one_pass_and_finished_by_another", || {
        const POLLS: usize = 3;
        let w = World::new();
        let proc: Arc<loom::sync::Mutex<Option<Vec<(usize, u64)>>>> =
            Arc::new(loom::sync::Mutex::new(None));
        let completed = Arc::new(AtomicU64::new(0));
        let dev = device_translating_twice(&w);
        // The submitter: unmap, invalidate, and the pass that stalls.
        w.pte.store(0, Ordering::Relaxed);
        w.tlb.invalidate_domain(DID);
        *proc.lock().unwrap() = Some(w.slots.drain_start(Barrier::Fence));
        // Another thread's pass looks again.
        let runner = {
            let (w, proc, completed) = (w.clone(), proc.clone(), completed.clone());
            spawn(move || {
                for _ in 0..POLLS {
                    let mut g = proc.lock().unwrap();
                    if let Some(p) = g.as_mut() {
                        if w.slots.drain_poll(p) {
                            *g = None;
                            // As the processor's store of the ticket.
                            completed.store(1, Ordering::Release);
                            return;
                        }
                    }
                    drop(g);
                    thread::yield_now();
                }
            })
        };
        // The waiter polls the completion only (as `poll_ticket` does when
        // another pass holds the lock).
        for _ in 0..POLLS {
            if completed.load(Ordering::Acquire) == 1 {
                assert_eq!(
                    w.in_use.load(Ordering::Relaxed),
                    0,
                    "a guard holding the old page outlived the wait"
                );
                w.waited.store(1, Ordering::Release);
                assert_eq!(w.translate(1, &mut 0), None, "stale after the wait");
                break;
            }
            thread::yield_now();
        }
        dev.join().unwrap();
        runner.join().unwrap();
    });
}

/// A page scan locks only the ways whose fingerprint byte matches the
/// page's. A fill of the page from the old table (its ticket taken before
/// the unmap) races the scan, into a way never filled, whose byte the fill
/// writes: after the scan, and after the fill, no lookup finds the page.
/// Fails if the scan reads the fingerprint words with plain loads (it may
/// then skip the way while the fill, not seeing the scan's `psi` bump,
/// publishes), or if the fill writes its byte with a plain store.
#[test]
fn loom_a_page_scan_skips_only_ways_that_cannot_hold_the_page() {
    model("fill vs fingerprint-filtered page scan", || {
        let t = Arc::new(Iotlb::new(IotlbConfig { sets: 1, ways: 2 }, 1));
        // Way 0 holds another page, so the fill goes to way 1.
        let tk = t.ticket(DID, t.gen(DID));
        t.fill(DID, IOVA + 0x1000, leaf(PHYS + 0x1000), tk, 0);
        let ticket = t.ticket(DID, t.gen(DID));
        let dev = {
            let t = t.clone();
            spawn(move || {
                t.fill(DID, IOVA, leaf(PHYS), ticket, 0);
            })
        };
        t.invalidate_pages(DID, IOVA, 0);
        assert_eq!(
            t.lookup(DID, IOVA, t.gen(DID)),
            None,
            "a page filled from the old table seen after the scan"
        );
        dev.join().unwrap();
        assert_eq!(
            t.lookup(DID, IOVA, t.gen(DID)),
            None,
            "a page filled from the old table outlived the scan"
        );
        assert!(
            t.lookup(DID, IOVA + 0x1000, t.gen(DID)).is_some(),
            "the scan cleared another page"
        );
    });
}

/// The other side of the same scan: the page is cached, and a fill of
/// another page replaces its way (the set's one), rewriting the way's
/// byte, while the page's scan runs. The scan may skip the way on the new
/// byte, but the page is gone either way.
#[test]
fn loom_a_page_scan_racing_a_replacement_of_its_way_leaves_nothing_stale() {
    model("replacement vs fingerprint-filtered page scan", || {
        let t = Arc::new(Iotlb::new(IotlbConfig { sets: 1, ways: 1 }, 1));
        let tk = t.ticket(DID, t.gen(DID));
        t.fill(DID, IOVA, leaf(PHYS), tk, 0);
        let dev = {
            let t = t.clone();
            spawn(move || {
                let tk = t.ticket(DID, t.gen(DID));
                t.fill(DID, IOVA + 0x1000, leaf(PHYS + 0x1000), tk, 0);
            })
        };
        t.invalidate_pages(DID, IOVA, 0);
        assert_eq!(
            t.lookup(DID, IOVA, t.gen(DID)),
            None,
            "the page seen after its scan"
        );
        dev.join().unwrap();
        assert_eq!(
            t.lookup(DID, IOVA, t.gen(DID)),
            None,
            "the page outlived its scan"
        );
    });
}

/// Two page scans meeting on an entry: one over a range that holds no
/// cached page (on the whole-cache path, which locks every entry) and one
/// of a cached page. After both, the page is gone. Fails without the
/// IOTLB's scan mutex: the page's scan finds the entry held, takes the
/// holder for a fill and kills it, and the other scan unlocks over the
/// kill, leaving the page cached.
#[test]
fn loom_two_page_scans_meeting_on_an_entry_both_take_effect() {
    model("page scan vs page scan", || {
        let t = Arc::new(Iotlb::new(IotlbConfig { sets: 1, ways: 1 }, 1));
        let tk = t.ticket(DID, t.gen(DID));
        t.fill(DID, IOVA, leaf(PHYS), tk, 0);
        let other = {
            let t = t.clone();
            // Two pages elsewhere: more sets than the IOTLB has, so the
            // whole cache is scanned.
            spawn(move || t.invalidate_pages(DID, IOVA + 0x10000, 1))
        };
        assert_eq!(
            t.invalidate_pages(DID, IOVA, 0),
            1,
            "the page's scan clears it"
        );
        assert_eq!(
            t.lookup(DID, IOVA, t.gen(DID)),
            None,
            "the page outlived its own scan"
        );
        assert_eq!(other.join().unwrap(), 0, "the other scan cleared the page");
        assert_eq!(
            t.lookup(DID, IOVA, t.gen(DID)),
            None,
            "the page came back once the other scan was over"
        );
    });
}

/// A domain id that loses its last device and is bound again, to other
/// tables, while a translator of the old device runs; with `aba`, unbound
/// again and the old device attached again with its old word. The
/// translator first keeps the context (its word, the binding part of the
/// domain's counter, the word again, as `Translator::hit_other`), makes
/// the keep's own hit (the generation, served only if its binding part is
/// the kept one, as `hit_translated`), then a later hit (the word, the
/// generation, the same check), and never hits the other binding's entry.
/// Fails without the keep's second word load (the first hit), or without
/// the binding check. The driver side is `Unit::set_context`'s order: a
/// device's word changed, then a new binding's `rebind_domain`, then the
/// new device's word; the new device's fill follows. (The slow path's
/// check, the word and the counter read again, rests on the same
/// ordering; a model of it written like this one never reached the race,
/// so it is not kept as a test.)
fn translator_never_hits_another_binding(aba: bool) {
    const OLD: u64 = 1;
    const BLOCKED: u64 = 2;
    const NEW_PHYS: u64 = 0xb000;
    model("context change vs domain id rebinding", move || {
        let t = Arc::new(Iotlb::new(IotlbConfig { sets: 1, ways: 2 }, 1));
        let ctx = Arc::new(AtomicU64::new(OLD));
        let dev = {
            let (t, ctx) = (t.clone(), ctx.clone());
            spawn(move || {
                let dom = t.domain_of(DID);
                let served = |gen: u64| {
                    if let Some(l) = t.lookup(DID, IOVA, gen) {
                        assert_ne!(
                            l.phys, NEW_PHYS,
                            "the old device hit another binding's entry"
                        );
                    }
                };
                // The keep (`hit_other`): the word, the binding part, the
                // word again.
                let kept = ctx.load(Ordering::Acquire);
                let bind = binding_of(t.domain_gen_at(dom));
                if kept != OLD || ctx.load(Ordering::Acquire) != kept {
                    return;
                }
                // Its first hit, with no word load of its own.
                let (_, gen, own) = t.deadline_then_gen_at(dom);
                if binding_of(own) != bind {
                    return;
                }
                served(gen);
                // A later hit: the word, the generation.
                let word = ctx.load(Ordering::Acquire);
                let (_, gen, own) = t.deadline_then_gen_at(dom);
                if word != kept || binding_of(own) != bind {
                    return;
                }
                served(gen);
            })
        };
        // The old device detached (its word changed), then the id bound
        // again: the bump, the new device's word, its fill.
        ctx.store(BLOCKED, Ordering::Release);
        t.rebind_domain(DID);
        let tk = t.ticket(DID, t.gen(DID));
        t.fill(DID, IOVA, leaf(NEW_PHYS), tk, 0);
        if aba {
            // The new device detached, the old one attached again: a new
            // binding, then the old word.
            t.rebind_domain(DID);
            ctx.store(OLD, Ordering::Release);
        }
        dev.join().unwrap();
    });
}

#[test]
fn loom_a_translator_never_hits_its_domain_ids_next_binding() {
    translator_never_hits_another_binding(false);
}

#[test]
fn loom_a_translator_never_hits_a_binding_that_came_and_went() {
    translator_never_hits_another_binding(true);
}

/// A 2 MiB leaf filled for the first time (no large leaf cached yet, so
/// a page-selective invalidation that reads no `large` bit skips the large
/// sets) races the unmap and page-selective invalidation of a 4 KiB page
/// inside it: after the invalidation, no lookup finds the leaf. Fails if
/// the invalidation reads `large` with a plain load, or the fill sets its
/// bit only when a plain load finds it clear.
#[test]
fn loom_a_large_fill_racing_a_page_invalidation_is_caught() {
    model("large fill vs page invalidation", || {
        let t = Arc::new(Iotlb::new(IotlbConfig { sets: 1, ways: 1 }, 1));
        let pte = Arc::new(AtomicU64::new(PHYS));
        let dev = {
            let (t, pte) = (t.clone(), pte.clone());
            spawn(move || {
                let gen = t.gen(DID);
                let ticket = t.ticket(DID, gen);
                let phys = pte.load(Ordering::Acquire);
                if phys != 0 {
                    let l = Leaf {
                        phys,
                        size: PageSize::Size2M,
                        perm: Perm::RW,
                    };
                    t.fill(DID, IOVA, l, ticket, 0);
                }
            })
        };
        pte.store(0, Ordering::Relaxed);
        t.invalidate_pages(DID, IOVA, 0);
        // From the invalidation's return on, whether the fill is still
        // running or over.
        assert_eq!(
            t.lookup(DID, IOVA, t.gen(DID)),
            None,
            "a 2 MiB leaf filled from the old table seen after the invalidation"
        );
        dev.join().unwrap();
        assert_eq!(
            t.lookup(DID, IOVA, t.gen(DID)),
            None,
            "a 2 MiB leaf filled from the old table outlived the invalidation"
        );
    });
}

/// The expiry deadline's world: the IOTLB holding a cached translation of
/// `IOVA`, its table entry, the deferred queue (one entry or none) and a
/// clock.
///
/// Time is a counter read and moved only by read-modify-writes (AcqRel):
/// that stands for real time carrying causality, as it does at the scale
/// of the bound (milliseconds, against cache coherence's nanoseconds). An
/// access that began at a reading later than an unmap's return reading
/// then happens after that return, which is what "began later than the
/// bound after the unmap returned" means in the memory model.
struct Timed {
    tlb: Iotlb,
    pte: AtomicU64,
    queued: AtomicU64,
    clock: AtomicU64,
}

/// The deadline's period in the models' clock.
const PERIOD: u64 = 10;

impl Timed {
    fn new(armed_at: Option<u64>) -> Arc<Self> {
        let tlb = Iotlb::new(IotlbConfig { sets: 1, ways: 1 }, 1);
        let gen = tlb.gen(DID);
        let ticket = tlb.ticket(DID, gen);
        tlb.fill(DID, IOVA, leaf(PHYS), ticket, 0);
        if let Some(at) = armed_at {
            tlb.arm_deadline_at(DID, at, PERIOD);
        }
        Arc::new(Timed {
            tlb,
            pte: AtomicU64::new(PHYS),
            queued: AtomicU64::new(0),
            clock: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.clock.fetch_add(0, Ordering::AcqRel)
    }

    /// A deferred unmap, as `DmaCpu::unmap_pages` + `DmaDomain::cover_unmap`:
    /// clear the entry, queue it, the light fence (`TimerArm::on_push`),
    /// cover it; returns the reading at its return.
    fn unmap(&self) -> u64 {
        self.pte.store(0, Ordering::Relaxed);
        self.queued.store(1, Ordering::Release);
        Barrier::Fence.light();
        self.tlb
            .cover_unmap_with(DID, || (self.now() + PERIOD, PERIOD));
        self.now()
    }

    /// A device access that begins `after` clock units on: as
    /// `Translator::hit` + `walk`. Returns whether it was served.
    fn access(&self, after: u64) -> bool {
        let now = self.clock.fetch_add(after, Ordering::AcqRel) + after;
        let dl = self.tlb.deadline(DID);
        if dl != 0 && Iotlb::due(dl, now) {
            self.tlb.expire(DID, dl, now, Barrier::Fence);
        } else if self.tlb.lookup(DID, IOVA, self.tlb.gen(DID)).is_some() {
            return true;
        }
        self.pte.load(Ordering::Acquire) != 0
    }
}

/// A deferred unmap arming the deadline (none armed before) races a
/// device's hit that begins more than the bound later by the clock: if
/// the unmap had returned by then, the hit is not served (the deadline it
/// armed is seen, found due, and the domain's cached translations go
/// first). Fails if the unmap arms only after it returns, or with a
/// Relaxed deadline load on the hit path... and on the old design, whose
/// hit path looked at the deadline only every 64 hits.
#[test]
fn loom_a_deadline_armed_by_an_unmap_stops_a_racing_hit() {
    model("deadline armed by an unmap vs a hit", || {
        let w = Timed::new(None);
        let u = {
            let w = w.clone();
            spawn(move || w.unmap())
        };
        let served = w.access(2 * PERIOD + 1);
        let returned_at = u.join().unwrap();
        assert!(
            !(served && returned_at == 0),
            "served past the bound after the unmap returned"
        );
    });
}

/// The flush timer clears an idle domain's deadline (in two steps, around
/// its heavy barrier and rescan) while an unmap relies on the deadline
/// armed and a device comes back past the bound: however they interleave,
/// a hit that begins past the bound after the unmap returned is not
/// served. Fails with a one-step clear (the unmap saw the deadline armed,
/// the timer then cleared it, and the hit found none).
#[test]
fn loom_the_timers_clear_never_uncovers_an_unmap() {
    model("timer clear vs unmap vs hit", || {
        let w = Timed::new(Some(PERIOD));
        let u = {
            let w = w.clone();
            spawn(move || w.unmap())
        };
        let t = {
            let w = w.clone();
            spawn(move || {
                let marked = w.tlb.begin_clear(DID);
                Barrier::Fence.heavy();
                let idle = w.queued.load(Ordering::Acquire) == 0;
                if let Some(m) = marked {
                    w.tlb.finish_clear(DID, m, idle);
                }
            })
        };
        let served = w.access(3 * PERIOD);
        let returned_at = u.join().unwrap();
        t.join().unwrap();
        assert!(
            !(served && returned_at == 0),
            "served past the bound after the unmap returned"
        );
    });
}

/// Two device threads find one deadline due: the first moves it on, the
/// second may read the moved (not yet due) deadline or lose the race to
/// move it; neither is served the unmapped page. Fails if the expirer
/// moves the deadline before its generation bump, or if a loser of the
/// race uses the cache.
#[test]
fn loom_two_hits_at_a_due_deadline_both_miss() {
    model("two hits at a due deadline", || {
        let w = Timed::new(Some(1));
        // Unmapped (and covered by the deadline at 1) before either began.
        w.pte.store(0, Ordering::Relaxed);
        w.queued.store(1, Ordering::Relaxed);
        let a = {
            let w = w.clone();
            spawn(move || w.access(2))
        };
        let b = w.access(2);
        assert!(!b && !a.join().unwrap(), "a stale hit past the deadline");
    });
}
