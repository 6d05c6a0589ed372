//! A raw page request's answer can never answer a group the unit raised,
//! however long it waited in the queue; and a device parked inside a
//! translation section cannot hold up another device's attach or detach
//! without limit (the drain is bounded and fences, as reclaim's is).

mod page_requests;

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use softiommu::hw::{Access, ResponseCode, Taken};

use page_requests::read_request;
use softiommu::iopf::{IopfConfig, IopfDomain, IopfError, IopfHandler, Region};
use softiommu::{
    ContextEntry, DmaAccessor, DmaAttrs, Perm, PhysMemory, SourceId, System, UnitConfig, PAGE_SIZE,
};

const VICTIM: SourceId = SourceId(0x0700);
const STUCK: SourceId = SourceId(0x0900);
const OTHER: SourceId = SourceId(0x0901);
const BASE: u64 = 0x1000_0000;

fn forged(sid: SourceId, prgi: u16) -> [u64; 4] {
    read_request(sid, prgi, 0x7000_0000)
}

#[test]
fn a_raw_request_left_in_the_queue_past_the_timeout_cannot_answer_the_victim() {
    let timeout = Duration::from_millis(300);
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys
        .add_unit(UnitConfig {
            page_response_timeout: timeout,
            ..UnitConfig::default()
        })
        .unwrap();
    sys.assign(VICTIM, unit).unwrap();
    let sys = Arc::new(sys);
    let d = IopfDomain::new(
        sys.clone(),
        IopfConfig {
            did: 2,
            premap_pages: 1,
            ..IopfConfig::default()
        },
    )
    .unwrap();
    let phys = mem.alloc_zeroed_frames(2).unwrap();
    mem.store_u64(phys, 0x1234, Ordering::Relaxed).unwrap();
    d.add_region(Region {
        iova: BASE,
        phys,
        len: 4 * PAGE_SIZE,
        perm: Perm::RW,
    })
    .unwrap();
    d.attach(VICTIM).unwrap();
    let u = sys.unit(unit).unwrap();
    // An unattributed raw request naming the victim's group 0: queued.
    assert_eq!(u.inject_page_request(forged(VICTIM, 0)), Ok(true));
    // Nobody takes it for longer than the timeout.
    std::thread::sleep(timeout + Duration::from_millis(50));
    let out = std::thread::scope(|s| {
        let t = s.spawn(|| {
            DmaAccessor::new(u, VICTIM)
                .unwrap()
                .read_u64(BASE, DmaAttrs::ORDERED)
        });
        let t0 = Instant::now();
        while u.page_request_stats().raised < 1 {
            assert!(t0.elapsed() < Duration::from_secs(5));
            std::thread::yield_now();
        }
        let h = IopfHandler::start(d.clone(), unit, 1).unwrap();
        let out = t.join().unwrap();
        drop(h);
        out
    });
    assert_eq!(out, Ok(0x1234), "the victim's access was served");
    let st = u.page_request_stats();
    assert_eq!(st.raw_answers, 1, "{st:?}");
    assert_eq!(st.timed_out, 0, "{st:?}");
}

#[test]
fn a_taken_raw_request_is_marked_and_its_answer_answers_no_raised_group() {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys
        .add_unit(UnitConfig {
            page_response_timeout: Duration::from_millis(100),
            ..UnitConfig::default()
        })
        .unwrap();
    sys.assign(VICTIM, unit).unwrap();
    let sys = Arc::new(sys);
    let u = sys.unit(unit).unwrap();
    u.attach(VICTIM, ContextEntry::PassThrough).unwrap();
    assert_eq!(u.inject_page_request(forged(VICTIM, 0)), Ok(true));
    let Some(Ok(Taken::Request(r))) = u.take_page_request() else {
        panic!("the raw request is in the queue");
    };
    assert!(r.is_raw(), "{r:?}");
    assert_eq!(r.prgi, 0);
    // Its answer: released, no response on the queue for any group.
    assert_eq!(u.answer_page_request(&r, ResponseCode::Invalid), Ok(()));
    let st = u.page_request_stats();
    assert_eq!((st.raw_answers, st.responses), (1, 0), "{st:?}");
}

#[test]
fn attach_and_detach_beside_a_parked_device_are_bounded_and_say_so() {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).unwrap();
    sys.assign(STUCK, unit).unwrap();
    sys.assign(OTHER, unit).unwrap();
    let sys = Arc::new(sys);
    let d = IopfDomain::new(
        sys.clone(),
        IopfConfig {
            did: 2,
            fence_timeout: Duration::from_millis(50),
            ..IopfConfig::default()
        },
    )
    .unwrap();
    let phys = mem.alloc_zeroed_frames(2).unwrap();
    mem.store_u64(phys, 7, Ordering::Relaxed).unwrap();
    d.add_region(Region {
        iova: BASE,
        phys,
        len: 4 * PAGE_SIZE,
        perm: Perm::RW,
    })
    .unwrap();
    d.attach(STUCK).unwrap();
    assert_eq!(d.map_all(), Ok(4));
    let _h = IopfHandler::start(d.clone(), unit, 1).unwrap();
    let (parked_tx, parked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let s2 = sys.clone();
    let stuck = std::thread::spawn(move || {
        let mut t = s2.unit(unit).unwrap().translator().unwrap();
        t.section(|g| {
            g.translate_page(STUCK, BASE, Access::Read).unwrap();
            parked_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        });
    });
    parked_rx.recv().unwrap();
    let (tx, rx) = mpsc::channel();
    let d2 = d.clone();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let a = d2.attach(OTHER);
        tx.send(("attach", a.map(|_| ()), t0.elapsed())).unwrap();
        let t0 = Instant::now();
        let b = d2.detach(OTHER);
        tx.send(("detach", b, t0.elapsed())).unwrap();
    });
    let got: Vec<_> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)))
        .collect();
    release_tx.send(()).unwrap();
    stuck.join().unwrap();
    let [Ok(attach), Ok(detach)] = &got[..] else {
        panic!("attach/detach beside a parked device waited > 5 s: {got:?}");
    };
    // A device that had no context has nothing in flight to wait for.
    assert!(matches!(attach, ("attach", Ok(()), _)), "{attach:?}");
    // The detach drains, at most the fence timeout, and says it fenced.
    assert!(
        matches!(
            detach,
            (
                "detach",
                Err(IopfError::ContextFenced {
                    sid: OTHER,
                    attached: false,
                    sections: 1
                }),
                _
            )
        ),
        "{detach:?}"
    );
    assert!(detach.2 < Duration::from_secs(5), "{detach:?}");
    // The detach is complete: the device is free and has no context.
    assert!(!d.is_attached(OTHER));
    assert_eq!(sys.unit(unit).unwrap().context(OTHER), None);
    assert_eq!(d.attach(OTHER).map(|_| ()), Ok(()));
}
