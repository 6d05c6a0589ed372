//! Page requests are not trusted past what the unit itself stamps:
//! a device cannot answer, cancel or fail another device's page request
//! group (by injecting a request naming it, or by rewriting the queue's
//! bytes); requests reach the handler of the domain that owns their
//! requester, so two IOPF domains on one unit never refuse each other's
//! faults; and a device parked inside a translation section cannot stall
//! reclaim or other devices' faults: it is fenced after a bounded wait.

mod page_requests;

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use softiommu::hw::{Access, UnitId};

use page_requests::read_request;
use softiommu::iopf::{IopfConfig, IopfDomain, IopfError, IopfHandler, Region};
use softiommu::{
    AccessError, DmaAccessor, DmaAttrs, Perm, PhysMemory, SourceId, System, TranslateError,
    UnitConfig, PAGE_SIZE,
};

const VICTIM: SourceId = SourceId(0x0700);
const ATTACKER: SourceId = SourceId(0x0701);
const BASE: u64 = 0x1000_0000;
const O: DmaAttrs = DmaAttrs::ORDERED;

fn patient() -> UnitConfig {
    UnitConfig {
        page_response_timeout: Duration::from_secs(60),
        ..UnitConfig::default()
    }
}

struct Rig {
    mem: Arc<PhysMemory>,
    sys: Arc<System>,
    unit: UnitId,
}

fn rig(devs: &[SourceId]) -> Rig {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(patient()).unwrap();
    for &d in devs {
        sys.assign(d, unit).unwrap();
    }
    Rig {
        mem,
        sys: Arc::new(sys),
        unit,
    }
}

/// A domain with one region of `pages` pages at `iova`, its backing
/// tagged per page, and `devs` attached.
fn domain(r: &Rig, did: u16, iova: u64, pages: u64, devs: &[SourceId]) -> (Arc<IopfDomain>, u64) {
    let d = IopfDomain::new(
        r.sys.clone(),
        IopfConfig {
            did,
            premap_pages: 1,
            ..IopfConfig::default()
        },
    )
    .unwrap();
    let phys = r
        .mem
        .alloc_zeroed_frames(pages.next_power_of_two().ilog2())
        .unwrap();
    for p in 0..pages {
        r.mem
            .store_u64(phys + p * PAGE_SIZE, tag(did, p), Ordering::Relaxed)
            .unwrap();
    }
    d.add_region(Region {
        iova,
        phys,
        len: pages * PAGE_SIZE,
        perm: Perm::RW,
    })
    .unwrap();
    for &s in devs {
        d.attach(s).unwrap();
    }
    (d, phys)
}

fn tag(did: u16, page: u64) -> u64 {
    u64::from(did) << 48 | page
}

fn accessor(r: &Rig, sid: SourceId) -> DmaAccessor {
    DmaAccessor::new(r.sys.unit(r.unit).unwrap(), sid).unwrap()
}

/// A request for `sid`'s group `prgi` at an address outside every region:
/// served, it would be answered `Invalid`.
fn forged(sid: SourceId, prgi: u16) -> [u64; 4] {
    read_request(sid, prgi, 0x7000_0000)
}

fn wait_raised(r: &Rig, n: u64) {
    let unit = r.sys.unit(r.unit).unwrap();
    let t0 = Instant::now();
    while unit.page_request_stats().raised < n {
        assert!(t0.elapsed() < Duration::from_secs(10), "never raised");
        std::thread::yield_now();
    }
}

/// How the attacker sends its forged request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Forgery {
    /// As itself (`inject_page_request_from`), before the victim faults.
    Attributed,
    /// Unattributed (`inject_page_request`), before the victim faults.
    Before,
    /// Unattributed, while the victim's group is outstanding.
    While,
}

#[test]
fn a_forged_request_cannot_answer_the_victims_group() {
    for how in [Forgery::Attributed, Forgery::Before, Forgery::While] {
        let r = rig(&[VICTIM, ATTACKER]);
        let (d, _) = domain(&r, 2, BASE, 4, &[VICTIM, ATTACKER]);
        let unit = r.sys.unit(r.unit).unwrap();
        // The attacker's request names the victim and the group its first
        // fault gets (0), and is answered `Invalid` if served.
        match how {
            Forgery::Attributed => assert_eq!(
                unit.inject_page_request_from(ATTACKER, forged(VICTIM, 0)),
                Ok(true)
            ),
            Forgery::Before => assert_eq!(unit.inject_page_request(forged(VICTIM, 0)), Ok(true)),
            Forgery::While => {}
        }
        let out = std::thread::scope(|s| {
            let t = s.spawn(|| accessor(&r, VICTIM).read_u64(BASE, O));
            wait_raised(&r, 1);
            if how == Forgery::While {
                assert_eq!(
                    unit.inject_page_request(forged(VICTIM, 0)),
                    Ok(false),
                    "refused: it names the victim's outstanding group"
                );
            }
            let h = IopfHandler::start(d.clone(), r.unit, 1).unwrap();
            let out = t.join().unwrap();
            drop(h);
            out
        });
        assert_eq!(out, Ok(tag(2, 0)), "{how:?}: the victim's access succeeds");
        let s = unit.page_request_stats();
        let want = match how {
            Forgery::Attributed => (1, 0, 1, 1),
            Forgery::Before => (0, 0, 1, 1),
            Forgery::While => (0, 1, 1, 0),
        };
        assert_eq!(
            (s.restamped, s.forged, s.responses, s.unknown_responses),
            want,
            "{how:?}: (restamped, forged, responses, unknown): only the victim's own group answered"
        );
        let refused = u64::from(how != Forgery::While);
        assert_eq!(
            (d.stats().served, d.stats().refused),
            (1, refused),
            "{how:?}"
        );
        assert!(
            unit.faults().drain().records.is_empty(),
            "{how:?}: no fault"
        );
    }
}

#[test]
fn two_iopf_domains_on_one_unit_serve_each_others_devices_never() {
    const A: SourceId = SourceId(0x0100);
    const B: SourceId = SourceId(0x0200);
    const FAULTS: u64 = 128;
    let r = rig(&[A, B]);
    let (da, _) = domain(&r, 2, BASE, FAULTS, &[A]);
    let (db, _) = domain(&r, 3, BASE, FAULTS, &[B]);
    let ha = IopfHandler::start(da.clone(), r.unit, 1).unwrap();
    let hb = IopfHandler::start(db.clone(), r.unit, 1).unwrap();
    let go = Barrier::new(2);
    let results: Vec<Vec<Result<u64, AccessError>>> = std::thread::scope(|s| {
        let ts: Vec<_> = [(A, 2u16), (B, 3u16)]
            .into_iter()
            .map(|(sid, _)| {
                let (r, go) = (&r, &go);
                s.spawn(move || {
                    let mut acc = accessor(r, sid);
                    go.wait();
                    (0..FAULTS)
                        .map(|p| acc.read_u64(BASE + p * PAGE_SIZE, O))
                        .collect()
                })
            })
            .collect();
        ts.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (i, did) in [2u16, 3].into_iter().enumerate() {
        let refused: Vec<_> = results[i].iter().filter(|r| r.is_err()).collect();
        assert_eq!(refused.len(), 0, "domain {did}: {refused:?}");
        let want: Vec<Result<u64, AccessError>> = (0..FAULTS).map(|p| Ok(tag(did, p))).collect();
        assert_eq!(results[i], want, "domain {did}: every fault served");
    }
    for (d, h) in [(&da, &ha), (&db, &hb)] {
        assert_eq!(d.stats().refused, 0);
        assert_eq!(d.stats().served, FAULTS);
        let s = h.stats();
        assert_eq!(
            (s.answered_success, s.answered_invalid, s.foreign),
            (FAULTS, 0, 0)
        );
    }
    let s = r.sys.unit(r.unit).unwrap().page_request_stats();
    assert_eq!(s.unrouted, 0);
    assert_eq!(s.responses, 2 * FAULTS);
}

#[test]
fn bytes_a_device_writes_into_the_ring_change_no_request() {
    let r = rig(&[VICTIM]);
    let (d, _) = domain(&r, 2, BASE, 4, &[VICTIM]);
    let unit = r.sys.unit(r.unit).unwrap();
    let out = std::thread::scope(|s| {
        let t = s.spawn(|| accessor(&r, VICTIM).read_u64(BASE + PAGE_SIZE, O));
        wait_raised(&r, 1);
        // A device that reached the ring rewrites the victim's request:
        // an address outside the map, which would be answered `Invalid`.
        let slot = unit.page_request_registers().base;
        let q1 = forged(VICTIM, 0)[1];
        r.mem.store_u64(slot + 8, q1, Ordering::Relaxed).unwrap();
        assert_eq!(
            unit.read_page_request(0).unwrap()[1],
            q1,
            "the ring says so"
        );
        let h = IopfHandler::start(d.clone(), r.unit, 1).unwrap();
        let out = t.join().unwrap();
        drop(h);
        out
    });
    assert_eq!(out, Ok(tag(2, 1)), "the request the unit wrote was served");
    assert_eq!(unit.page_request_stats().ring_tampered, 1);
    assert_eq!((d.stats().served, d.stats().refused), (1, 0));
}

#[test]
fn a_device_parked_in_a_section_is_fenced_and_stalls_nobody() {
    const STUCK: SourceId = SourceId(0x0900);
    const OTHER: SourceId = SourceId(0x0901);
    const FAULTS: u64 = 32;
    const TIMEOUT: Duration = Duration::from_millis(50);
    let r = Arc::new(rig(&[STUCK, OTHER]));
    let d = IopfDomain::new(
        r.sys.clone(),
        IopfConfig {
            did: 2,
            premap_pages: 1,
            fence_timeout: TIMEOUT,
            ..IopfConfig::default()
        },
    )
    .unwrap();
    let phys = r.mem.alloc_zeroed_frames(6).unwrap();
    d.add_region(Region {
        iova: BASE,
        phys,
        len: 64 * PAGE_SIZE,
        perm: Perm::RW,
    })
    .unwrap();
    d.attach(STUCK).unwrap();
    d.attach(OTHER).unwrap();
    r.mem.store_u64(phys, 0x5eed, Ordering::Relaxed).unwrap();
    let _h = IopfHandler::start(d.clone(), r.unit, 1).unwrap();
    let unit = r.sys.unit(r.unit).unwrap();

    // The stuck device maps page 0, then parks inside a section holding
    // its translation of it.
    let (parked_tx, parked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let stuck = {
        let r = r.clone();
        std::thread::spawn(move || {
            assert_eq!(accessor(&r, STUCK).read_u64(BASE, O), Ok(0x5eed));
            let mut t = r.sys.unit(r.unit).unwrap().translator().unwrap();
            t.section(|g| {
                let span = g.translate_page(STUCK, BASE, Access::Read).unwrap();
                parked_tx.send(span.phys).unwrap();
                release_rx.recv().unwrap();
            });
            // Out of the section: the reclaimed page faults (a page
            // request), it is not served from a stale translation.
            let after = t.translate_page(STUCK, BASE, Access::Read);
            let Err(TranslateError::PageRequested { prgi, .. }) = after else {
                panic!("not a fault after the section: {after:?}");
            };
            t.wait_page_response(STUCK, BASE, Access::Read, prgi)
        })
    };
    assert_eq!(
        parked_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        phys
    );

    // Reclaim page 0 while the other device faults its pages in.
    let t0 = Instant::now();
    let reclaim = {
        let d = d.clone();
        std::thread::spawn(move || (d.reclaim(BASE, PAGE_SIZE), Instant::now()))
    };
    let (other_tx, other_rx) = mpsc::channel();
    {
        let r = r.clone();
        std::thread::spawn(move || {
            let mut acc = accessor(&r, OTHER);
            for p in 1..=FAULTS {
                let t = Instant::now();
                let got = acc.read_u64(BASE + p * PAGE_SIZE, O);
                other_tx.send((got, t.elapsed())).unwrap();
            }
        });
    }
    for p in 1..=FAULTS {
        let (got, took) = other_rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("fault {p} of the other device not answered"));
        assert_eq!(got, Ok(0), "fault {p}");
        assert!(took < Duration::from_secs(5), "fault {p} took {took:?}");
    }
    let (got, done) = reclaim.join().unwrap();
    let took = done - t0;
    assert_eq!(
        got,
        Err(IopfError::SectionsFenced {
            pages: 1,
            sections: 1
        })
    );
    assert!(took >= TIMEOUT && took < Duration::from_secs(5), "{took:?}");
    assert_eq!(unit.stats().fenced_sections, 1);
    assert_eq!(d.stats().fenced_flushes, 1);
    assert_eq!(unit.fenced_sections_open(), 1);
    assert!(!d.is_mapped(BASE));
    // A later reclaim does not wait for the fenced section again (nor
    // fence it twice), and says it did not wait for it.
    assert_eq!(
        d.reclaim(BASE + PAGE_SIZE, PAGE_SIZE),
        Err(IopfError::SectionsFenced {
            pages: 1,
            sections: 1
        })
    );
    assert_eq!(unit.stats().fenced_sections, 1);

    release_tx.send(()).unwrap();
    assert_eq!(stuck.join().unwrap(), Ok(()), "faulted, then served afresh");
    assert_eq!(unit.fenced_sections_open(), 0);
    assert!(d.is_mapped(BASE));
    // Nothing fenced any more: a reclaim drains and frees as before.
    assert_eq!(d.reclaim(BASE, PAGE_SIZE), Ok(1));
    assert_eq!(d.stats().fenced_flushes, 2);
}

#[test]
fn dropping_a_domain_while_a_device_is_parked_in_a_section_is_bounded() {
    const STUCK: SourceId = SourceId(0x0a00);
    let r = Arc::new(rig(&[STUCK]));
    let d = IopfDomain::new(
        r.sys.clone(),
        IopfConfig {
            did: 2,
            fence_timeout: Duration::from_millis(50),
            ..IopfConfig::default()
        },
    )
    .unwrap();
    let phys = r.mem.alloc_zeroed_frames(0).unwrap();
    d.add_region(Region {
        iova: BASE,
        phys,
        len: PAGE_SIZE,
        perm: Perm::RW,
    })
    .unwrap();
    d.attach(STUCK).unwrap();
    assert_eq!(d.map_all(), Ok(1));
    let (parked_tx, parked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let stuck = {
        let r = r.clone();
        std::thread::spawn(move || {
            let mut t = r.sys.unit(r.unit).unwrap().translator().unwrap();
            t.section(|g| {
                g.translate_page(STUCK, BASE, Access::Read).unwrap();
                parked_tx.send(()).unwrap();
                release_rx.recv().unwrap();
            });
            t.translate_page(STUCK, BASE, Access::Read)
        })
    };
    parked_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(d);
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the domain's drop waited for the parked device without end");
    let unit = r.sys.unit(r.unit).unwrap();
    assert_eq!(unit.stats().fenced_sections, 1);
    assert_eq!(unit.fenced_sections_open(), 1);
    release_tx.send(()).unwrap();
    // Its context is gone: the next translation faults.
    assert_eq!(
        stuck.join().unwrap(),
        Err(TranslateError::NoContext { sid: STUCK })
    );
    assert_eq!(unit.fenced_sections_open(), 0);
}
