//! Device threads translate while driver threads unmap, invalidate, wait,
//! free and remap: no device may ever hold a translation to a frame that
//! was freed, i.e. no stale translation survives a completed wait.
//!
//! Frames carry an owner word: the IOVA page they are mapped at, or 0 once
//! the driver has freed them (which it does only after its wait returned).
//! A device opens a guard, translates, and checks — right after translating
//! and again just before closing the guard, as a device finishing its copy —
//! that the frame is still owned by the page it translated. A stale
//! translation after a completed wait, or a wait that returned while a guard
//! from before it was open, shows up as a frame owned by nobody or by
//! another page.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use softiommu::hw::{
    Access, ContextEntry, DrainBarrier, IotlbConfig, LatencyModel, QueueMode, SourceId, Unit,
    UnitConfig,
};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, IotlbGather, Perm, VtdConfig, VtdPageTable};

const DEV: SourceId = SourceId(0x0300);
const DID: u16 = 1;
/// IOVA pages in play, split between the drivers.
const PAGES: u64 = 64;
/// Frames (a pool larger than the pages, so frames are reused at other
/// pages).
const FRAMES: u64 = 96;
const FRAME_BASE: u64 = 32 << 20;
const DRIVERS: u64 = 2;
const DEVICES: usize = 2;

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Counts a device thread out when it ends, panicking or not.
struct Alive(Arc<AtomicU64>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn stress(mode: QueueMode, barrier: DrainBarrier, walk_level_ns: u64, remaps_per_driver: u64) {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let unit = Arc::new(
        Unit::new(
            mem.clone(),
            UnitConfig {
                queue_mode: mode,
                drain_barrier: barrier,
                // Small enough that fills and evictions race invalidations.
                iotlb: IotlbConfig { sets: 16, ways: 2 },
                // A slow walk widens the window between a miss's walk and
                // its fill, where a racing unmap must not be missed.
                latency: LatencyModel {
                    walk_level: std::time::Duration::from_nanos(walk_level_ns),
                    ..LatencyModel::zero()
                },
                ..UnitConfig::default()
            },
        )
        .unwrap(),
    );
    let table = Arc::new(VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap());
    unit.attach(
        DEV,
        ContextEntry::Translated {
            did: DID,
            root: table.root(),
        },
    )
    .unwrap();
    // owner[f] = IOVA page + 1 while frame f is mapped (or unmapped and
    // not yet invalidated), 0 once freed.
    let owner: Arc<Vec<AtomicU64>> = Arc::new((0..FRAMES).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(DEVICES + DRIVERS as usize));
    // Translations attempted by the devices: drivers pace themselves on it
    // so that the two sides interleave even on a busy machine.
    let progress = Arc::new(AtomicU64::new(0));
    // Devices still running (a failed check ends one: stop pacing then).
    let alive = Arc::new(AtomicU64::new(DEVICES as u64));

    let devices: Vec<_> = (0..DEVICES)
        .map(|d| {
            let (unit, owner, stop, start, progress, alive) = (
                unit.clone(),
                owner.clone(),
                stop.clone(),
                start.clone(),
                progress.clone(),
                alive.clone(),
            );
            std::thread::spawn(move || {
                let _alive = Alive(alive);
                let mut t = unit.translator().unwrap();
                let mut rng = 0x1234_5678_9abc_def1u64 ^ ((d as u64 + 1) * 0x9E37_79B9);
                let (mut ok, mut checked) = (0u64, 0u64);
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    let page = xorshift(&mut rng) % PAGES;
                    let access = if page & 1 == 0 { Access::Write } else { Access::Read };
                    t.section(|g| {
                    if let Ok(r) = g.translate(DEV, page << 12 | 0x40, 64, access) {
                        let phys = r.as_slice()[0].phys;
                        let f = (phys - FRAME_BASE) >> 12;
                        assert!(f < FRAMES, "translated outside the pool: {phys:#x}");
                        let check = |when: &str| {
                            // Acquire: pairs with the driver's Release stores.
                            let o = owner[f as usize].load(Ordering::Acquire);
                            assert_eq!(
                                o,
                                page + 1,
                                "{when}: page {page} -> frame {f}, which is owned by {o} (0 = freed)"
                            );
                        };
                        check("after translating");
                        // The device's "copy".
                        for _ in 0..(rng & 31) {
                            std::hint::spin_loop();
                        }
                        check("before closing the guard");
                        ok += 1;
                        checked += 2;
                    }
                    });
                    progress.fetch_add(1, Ordering::Relaxed);
                    // Let the drivers (and the other tests) run: on two
                    // cores a device preempted inside its guard holds up
                    // every drain until the OS runs it again.
                    if rng & 15 == 0 {
                        std::thread::yield_now();
                    }
                }
                let st = t.stats();
                (ok, checked, st.hits, st.lookups)
            })
        })
        .collect();

    let drivers: Vec<_> = (0..DRIVERS)
        .map(|k| {
            let (unit, table, owner, start, progress, alive) = (
                unit.clone(),
                table.clone(),
                owner.clone(),
                start.clone(),
                progress.clone(),
                alive.clone(),
            );
            std::thread::spawn(move || {
                // Driver k owns pages ≡ k (mod DRIVERS) and frames ≡ k too.
                let mut free: Vec<u64> = (0..FRAMES).filter(|f| f & (DRIVERS - 1) == k).collect();
                let mut mapped: Vec<Option<u64>> = vec![None; PAGES as usize];
                let mut rng = 0xfeed_f00d_u64 + k;
                // Deferred unmaps: (page, frame, gather) awaiting one wait.
                let mut deferred: Vec<(u64, u64, IotlbGather)> = Vec::new();
                start.wait();
                let mut seen = 0;
                for i in 0..remaps_per_driver {
                    if i & 15 == 0 {
                        while progress.load(Ordering::Relaxed) < seen + 8
                            && alive.load(Ordering::Relaxed) == DEVICES as u64
                        {
                            std::thread::yield_now();
                        }
                        seen = progress.load(Ordering::Relaxed);
                    }
                    let page = (xorshift(&mut rng) % (PAGES / DRIVERS)) * DRIVERS + k;
                    let deferred_mode = i % 3 == 2;
                    match mapped[page as usize] {
                        Some(f) => {
                            let mut g = IotlbGather::new();
                            table.unmap(page << 12, 1 << 12, &mut g).unwrap();
                            mapped[page as usize] = None;
                            if deferred_mode {
                                deferred.push((page, f, g));
                            } else {
                                let mut b = unit.batch();
                                b.range(DID, page << 12, 1 << 12);
                                b.wait().unwrap();
                                g.complete().unwrap();
                                // Release: pairs with the devices' Acquire.
                                owner[f as usize].store(0, Ordering::Release);
                                free.push(f);
                            }
                        }
                        None => {
                            // Never reuse an IOVA page still awaiting its
                            // invalidation.
                            if deferred.iter().any(|&(p, _, _)| p == page) {
                                continue;
                            }
                            let Some(f) = free.pop() else { continue };
                            owner[f as usize].store(page + 1, Ordering::Release);
                            let perm = if page & 1 == 0 { Perm::RW } else { Perm::READ };
                            table
                                .map(page << 12, FRAME_BASE + (f << 12), 1 << 12, perm)
                                .unwrap();
                            mapped[page as usize] = Some(f);
                        }
                    }
                    if deferred.len() >= 8 || (i + 1 == remaps_per_driver && !deferred.is_empty()) {
                        // One batch, one wait (deferred flushing).
                        let mut b = unit.batch();
                        for (p, _, _) in &deferred {
                            b.range(DID, p << 12, 1 << 12);
                        }
                        b.wait().unwrap();
                        for (_, f, mut g) in deferred.drain(..) {
                            g.complete().unwrap();
                            owner[f as usize].store(0, Ordering::Release);
                            free.push(f);
                        }
                    }
                }
            })
        })
        .collect();

    for d in drivers {
        d.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = (0, 0, 0, 0);
    for d in devices {
        let (ok, checked, hits, lookups) = d.join().unwrap();
        total = (
            total.0 + ok,
            total.1 + checked,
            total.2 + hits,
            total.3 + lookups,
        );
    }
    let s = unit.stats();
    assert!(total.0 > 500, "devices translated too little: {total:?}");
    assert!(total.2 > 0, "no IOTLB hit: {total:?}");
    assert!(s.drains > 0 && s.queue_errors == 0, "{s:?}");
    eprintln!(
        "{mode:?}/{} ok={} checks={} hits={}/{} drains={} waited={} drain_ns/drain={}",
        unit.drain_barrier(),
        total.0,
        total.1,
        total.2,
        total.3,
        s.drains,
        s.drain_waited,
        s.drain_ns / s.drains.max(1)
    );
}

/// The four variants in one test, one after the other, so that their
/// threads do not compete for the cores with each other.
#[test]
fn no_stale_translation_after_a_wait() {
    stress(QueueMode::Inline, DrainBarrier::Auto, 0, 2000);
    stress(QueueMode::Thread, DrainBarrier::Auto, 0, 2000);
    stress(QueueMode::Inline, DrainBarrier::Fence, 0, 2000);
    // A slow walk widens the window between a miss's walk and its fill.
    stress(QueueMode::Inline, DrainBarrier::Auto, 500, 2000);
}

/// After `attach(.., Blocked)` returns, no translation of the old context
/// is in flight, and none starts.
#[test]
fn blocking_a_device_drains_its_translations() {
    let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
    let unit = Arc::new(Unit::new(mem.clone(), UnitConfig::default()).unwrap());
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
    table.map(0, 1 << 20, 1 << 12, Perm::RW).unwrap();
    let ctx = ContextEntry::Translated {
        did: DID,
        root: table.root(),
    };
    for round in 0..50 {
        unit.attach(DEV, ctx).unwrap();
        let blocked = Arc::new(AtomicBool::new(false));
        let go = Arc::new(Barrier::new(2));
        let dev = {
            let (unit, blocked, go) = (unit.clone(), blocked.clone(), go.clone());
            std::thread::spawn(move || {
                let mut t = unit.translator().unwrap();
                go.wait();
                loop {
                    let done = t.section(|g| match g.translate(DEV, 0x10, 8, Access::Write) {
                        Ok(_) => {
                            assert!(
                                !blocked.load(Ordering::Acquire),
                                "round {round}: translated after the block completed"
                            );
                            false
                        }
                        Err(_) => true,
                    });
                    if done {
                        return;
                    }
                }
            })
        };
        go.wait();
        std::thread::yield_now();
        unit.attach(DEV, ContextEntry::Blocked).unwrap();
        blocked.store(true, Ordering::Release);
        dev.join().unwrap();
    }
    unit.faults().drain();
}
