//! Tests of the DMA API through a real unit: what the device can reach
//! after each policy's unmap, the switch rules, and bad input.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::hw::{Access, SourceId, System, Translator};
use crate::mem::{PhysMemory, PAGE_SIZE};
use crate::pgtable::IoPageTable;

const SID: SourceId = SourceId(0x0100);

struct Rig {
    domain: Arc<DmaDomain>,
    dev: DmaDevice,
    cpu: DmaCpu,
    tr: Translator,
    mem: Arc<PhysMemory>,
}

/// Maps the page at `buf` for the rig's device (to the device) and
/// unmaps it at once; the policy decides when the unmap takes effect.
/// Returns the address it had.
fn map_and_unmap(r: &mut Rig, buf: crate::mem::PhysAddr) -> u64 {
    let a = r
        .cpu
        .map(&r.dev, buf, 4096, DmaDirection::ToDevice)
        .unwrap();
    r.cpu
        .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
        .unwrap();
    a
}

fn rig(policy: DmaPolicy, untrusted: bool) -> Rig {
    let p = crate::Platform::builder()
        .policy(policy)
        .device_spec(crate::DeviceSpec {
            sid: SID,
            unit: 0,
            mask: u64::MAX,
            untrusted,
        })
        .build()
        .unwrap();
    let cpu = p.domain.cpu();
    let tr = p.unit(0).unwrap().translator().unwrap();
    Rig {
        domain: p.domain,
        dev: p.devices.into_iter().next().unwrap(),
        cpu,
        tr,
        mem: p.mem,
    }
}

fn reachable(r: &mut Rig, addr: u64) -> bool {
    r.tr.translate(SID, addr, 1, Access::Read).is_ok()
}

#[test]
fn strict_unmap_revokes_before_returning() {
    let mut r = rig(DmaPolicy::Strict, false);
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    r.mem.write(buf + 10, b"hello").unwrap();
    let a = r
        .cpu
        .map(&r.dev, buf + 10, 5, DmaDirection::ToDevice)
        .unwrap();
    assert_ne!(a, buf + 10, "translated");
    let ranges = r.tr.translate(SID, a, 5, Access::Read).unwrap();
    let mut got = [0u8; 5];
    r.mem.read(ranges.as_slice()[0].phys, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    assert!(
        matches!(
            r.tr.translate(SID, a, 5, Access::Write),
            Err(crate::hw::TranslateError::PermissionDenied { .. })
        ),
        "read-only mapping"
    );
    r.cpu.unmap(&r.dev, a, 5, DmaDirection::ToDevice).unwrap();
    assert!(
        !reachable(&mut r, a),
        "no access after a strict unmap returns"
    );
    assert_eq!(r.domain.stats().live(), 0);
}

#[test]
fn deferred_unmap_stays_reachable_until_the_flush_and_the_window_is_measured() {
    let mut r = rig(DmaPolicy::Deferred, false);
    r.domain.set_timeout(Duration::from_secs(60)).unwrap();
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let a = r
        .cpu
        .map(&r.dev, buf, 4096, DmaDirection::Bidirectional)
        .unwrap();
    assert!(reachable(&mut r, a));
    r.cpu
        .unmap(&r.dev, a, 4096, DmaDirection::Bidirectional)
        .unwrap();
    // The PTE is gone but the IOTLB may still hold it: that is the window.
    r.cpu.flush_own().unwrap();
    assert!(
        !reachable(&mut r, a),
        "no access after the flush that covers it"
    );
    let s = r.domain.stats();
    assert_eq!((s.flushes, s.flushed_entries), (1, 1));
    assert!(r.domain.stale_window().max_entries == 1);
}

/// The stale window does not wait for a descheduled flusher: a batch
/// taken out of its queue by a thread that then stops (here: the test
/// holds the queue's taker, as a preempted owner would, and the timer
/// blocks on it) still has its cached translations dropped by the timer
/// once it is past its age. Before, the timer waited on the taker and the
/// device kept reaching the unmapped buffer for as long as the holder
/// was off its CPU.
#[test]
fn a_batch_held_by_a_stalled_taker_is_still_dropped_from_the_iotlb_at_its_age() {
    let mut r = rig(DmaPolicy::Deferred, false);
    r.domain.set_timeout(Duration::from_millis(200)).unwrap();
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let a = r
        .cpu
        .map(&r.dev, buf, 4096, DmaDirection::ToDevice)
        .unwrap();
    assert!(reachable(&mut r, a), "cached by the device's first access");
    // Before the unmap: its expiry deadline (3/4 of the timeout, 150 ms)
    // is at least that long after `t0`.
    let t0 = std::time::Instant::now();
    r.cpu
        .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
        .unwrap();
    let slot = r.cpu.slot.clone();
    let mut taker = slot.fq.taker();
    let batch = taker.take_all().expect("the unmap is queued");
    assert!(
        slot.fq.oldest().is_some(),
        "a batch in flight still counts as queued"
    );
    let still = reachable(&mut r, a);
    // Judged only when this thread got here well inside the window: on a
    // loaded machine it may have lost its CPU past the deadline, and then
    // the translation is rightly gone.
    if t0.elapsed() < Duration::from_millis(100) {
        assert!(
            still,
            "inside its window the device may still reach it (from the IOTLB)"
        );
    }
    // At 3/4 of the timeout the unmap's expiry deadline falls due, and a
    // timeout after the unmap the timer runs and meets the taker this
    // thread holds (never waiting for it); the drop must wait for
    // neither the taker nor the flush.
    while reachable(&mut r, a) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the stale translation outlived its age by seconds"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Gone no earlier than its deadline, measured from before the unmap
    // (a margin below the 150 ms for the unit's deadline clock).
    assert!(
        t0.elapsed() >= Duration::from_millis(100),
        "not before its age"
    );
    // Finish the flush the stalled taker owed, then let the timer go.
    drop(taker);
    let mut cache = crate::sync::lock(&r.domain.timer_cache);
    r.domain
        .flush_batch(batch, cache.as_mut().unwrap(), &r.domain.completed_stats)
        .unwrap();
    drop(cache);
    assert!(slot.fq.oldest().is_none());
    assert_eq!(r.domain.stats().live(), 0);
}

/// The owner's flush does not wait for the device: a full queue's batch is
/// issued (its cached translations dropped, an invalidation and a wait
/// queued) and the unmap returns while a device thread holds a translation
/// section open. Nothing of the batch is freed until that section ends;
/// then the owner's next flush frees it.
#[test]
fn an_owners_flush_behind_an_open_section_returns_and_frees_nothing_until_it_ends() {
    let mut r = rig(DmaPolicy::Deferred, false);
    r.domain.set_timeout(Duration::from_secs(60)).unwrap();
    r.domain.set_high_water(4).unwrap();
    let buf = r.mem.alloc_zeroed_frames(3).unwrap();
    let map4 = |r: &mut Rig, base: u64| -> Vec<u64> {
        (0..4)
            .map(|i| {
                r.cpu
                    .map(&r.dev, base + i * 4096, 4096, DmaDirection::ToDevice)
                    .unwrap()
            })
            .collect()
    };
    let addrs = map4(&mut r, buf);
    for &a in &addrs {
        assert!(reachable(&mut r, a), "cached by the device");
    }
    let (device, release_tx) = hold_section(r.domain.system());
    for &a in &addrs {
        r.cpu
            .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
            .unwrap();
    }
    // Had the unmap waited for the section, it would have returned only
    // when the holder gave up (10 s), with the batch complete.
    assert_eq!(r.domain.in_flight.len(), 1, "issued, with the section open");
    assert_eq!(
        r.domain.stats().flushes,
        0,
        "and is not complete: a translation that began before it is open"
    );
    for &a in &addrs {
        assert!(
            !reachable(&mut r, a),
            "no new translation reaches an issued batch's pages"
        );
    }
    assert_eq!(r.domain.stats().flushed_entries, 0, "nothing freed");
    // A freed IOVA would come back first (the CPU's cache is LIFO): none
    // of the batch's may be handed out while the section is open.
    let during = map4(&mut r, buf + 4 * 4096);
    assert!(
        during.iter().all(|a| !addrs.contains(a)),
        "an IOVA of the issued batch was reused: {addrs:x?} / {during:x?}"
    );
    release_tx.send(()).unwrap();
    device.join().unwrap();
    // The next batch's flush finds the first complete and frees both.
    for &a in &during {
        r.cpu
            .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
            .unwrap();
    }
    assert_eq!(r.domain.in_flight.len(), 0);
    let st = r.domain.stats();
    assert_eq!((st.flushes, st.flushed_entries, st.live()), (2, 8, 0));
}

/// The timer's round does not wait for a flush whose drain is stalled on
/// a device's open section: it frees what completed and returns, due again
/// (the flight still counts), and a later round frees the rest once the
/// section has ended. Before, the round waited for the drain, polling it
/// every 50 µs (a wake-up each), for as long as the section stayed open.
#[test]
fn a_timer_round_does_not_wait_for_a_flush_stalled_on_an_open_section() {
    let mut r = rig(DmaPolicy::Deferred, false);
    r.domain.set_timeout(Duration::from_secs(60)).unwrap();
    r.domain.set_high_water(2).unwrap();
    let buf = r.mem.alloc_zeroed_frames(1).unwrap();
    let addrs: Vec<u64> = (0..2)
        .map(|i| {
            r.cpu
                .map(&r.dev, buf + i * 4096, 4096, DmaDirection::ToDevice)
                .unwrap()
        })
        .collect();
    let (device, release_tx) = hold_section(r.domain.system());
    for &a in &addrs {
        r.cpu
            .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
            .unwrap();
    }
    assert_eq!(r.domain.in_flight.len(), 1, "issued, its drain stalled");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let domain = r.domain.clone();
    let round = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        let next = domain.flush_expired(t0, Duration::from_secs(30));
        done_tx.send((next, t0)).unwrap();
    });
    let got = done_rx.recv_timeout(Duration::from_secs(3));
    release_tx.send(()).unwrap();
    device.join().unwrap();
    round.join().unwrap();
    let (next, t0) = got.expect("the round returned while the section was open");
    assert_eq!(next, Some(t0), "due again: a flight is still waiting");
    assert_eq!(r.domain.stats().flushes, 0, "nothing completed");
    // The section has ended: the next round completes and frees it.
    let next = r
        .domain
        .flush_expired(std::time::Instant::now(), Duration::from_secs(30));
    assert_eq!(next, None, "nothing queued or in flight");
    assert_eq!(r.domain.in_flight.len(), 0);
    let st = r.domain.stats();
    assert_eq!((st.flushes, st.flushed_entries, st.live()), (1, 2, 0));
}

/// A flush the timer issues while a device thread holds a translation
/// section open stalls on its drain, and completes only once the section
/// ends, well past the timeout here. The stale window still ends inside
/// the timeout: at the unmap's expiry deadline (three quarters of it),
/// past which no translator uses the domain's cached translations; the
/// completion itself is reported beside it. (The window used to run to
/// the completion, and read above the timeout.)
#[test]
fn a_drain_held_open_across_timer_rounds_keeps_the_stale_window_inside_the_timeout() {
    let mut r = rig(DmaPolicy::Deferred, false);
    let timeout = Duration::from_millis(20);
    r.domain.set_timeout(timeout).unwrap();
    let buf = r.mem.alloc_zeroed_frames(1).unwrap();
    let addrs: Vec<u64> = (0..2)
        .map(|i| {
            r.cpu
                .map(&r.dev, buf + i * 4096, 4096, DmaDirection::ToDevice)
                .unwrap()
        })
        .collect();
    let (device, release_tx) = hold_section(r.domain.system());
    // Below the high-water mark: only the timer flushes them.
    for &a in &addrs {
        r.cpu
            .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
            .unwrap();
    }
    // After both unmaps: no entry is younger than `t0`.
    let t0 = std::time::Instant::now();
    // The timer's round issues the flush and leaves its stalled drain
    // (waited for: a loaded machine may run the timer late), then looks
    // again for several periods while the section stays open.
    while r.domain.in_flight.len() == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the timer issued no flush"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(4 * timeout);
    assert_eq!(r.domain.stats().flushes, 0, "stalled on the open section");
    assert_eq!(r.domain.in_flight.len(), 1, "issued by the timer");
    // Before the release: the completion cannot come before this.
    let held = t0.elapsed();
    release_tx.send(()).unwrap();
    device.join().unwrap();
    let t = std::time::Instant::now();
    while r.domain.stats().flushes == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(r.domain.stats().flushes, 1, "the timer completed it");
    let w = r.domain.stale_window();
    assert!(
        w.max <= timeout * 3 / 4,
        "the window ends at the expiry deadline, inside the timeout: {w:?}"
    );
    assert!(
        w.completion_max >= held - Duration::from_millis(1),
        "the completion came after the section ended ({held:?}): {w:?}"
    );
    assert!(w.mean <= w.max);
}

/// A timer round never waits for a drain: with a device thread's
/// translation section held open, each round issues its flush, polls it
/// once and returns, leaving it in flight; the first round after the
/// section ends completes them all. A round used to poll a stalled drain
/// for up to 200 µs, spinning and yielding on the timer's CPU while the
/// device thread (the hardware) was held — CPU inside the deferred
/// policy's service demand that followed the machine's load — so on the
/// old code every round here took at least 200 µs.
#[test]
fn a_timer_round_leaves_a_stalled_drain_in_flight_without_waiting_for_it() {
    use super::timer::TimerWork;
    let mut r = rig(DmaPolicy::Deferred, false);
    // Only these rounds flush: the timer thread is paused, and the owner
    // never reaches its own flush (high-water mark, half the timeout).
    r.domain.arm.pause(true);
    r.domain.set_timeout(MAX_TIMEOUT).unwrap();
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let (device, release_tx) = hold_section(r.domain.system());
    let rounds = 5;
    let mut fastest = Duration::MAX;
    for i in 0..rounds {
        map_and_unmap(&mut r, buf);
        let t = std::time::Instant::now();
        let round = TimerWork::round(&*r.domain, std::time::Instant::now());
        fastest = fastest.min(t.elapsed());
        assert!(round.worked && round.open, "{round:?}");
        assert_eq!(r.domain.in_flight.len(), i + 1, "left in flight");
    }
    assert_eq!(r.domain.stats().flushes, 0, "stalled on the open section");
    // The fastest of five rounds: a round preempted by the host in its
    // poll is not the round's waiting.
    assert!(
        fastest < Duration::from_micros(200),
        "a round waited for the drain: {fastest:?}"
    );
    release_tx.send(()).unwrap();
    device.join().unwrap();
    let round = TimerWork::round(&*r.domain, std::time::Instant::now());
    assert!(!round.open, "{round:?}");
    assert_eq!(r.domain.in_flight.len(), 0);
    let st = r.domain.stats();
    assert_eq!(
        (st.flushes, st.flushed_entries, st.live()),
        (rounds as u64, rounds as u64, 0)
    );
    r.domain.arm.pause(false);
}

/// Under a steady stream of unmaps the timer fires at most once per
/// timeout (as Linux's flush-queue timer does; less often once the owner
/// flushes its queue on its own), not once per half-timeout
/// after each queue's oldest entry: it used to wake about twice a period
/// here.
#[test]
fn under_steady_unmaps_the_timer_wakes_about_once_per_timeout() {
    let mut r = rig(DmaPolicy::Deferred, false);
    let timeout = Duration::from_millis(10);
    r.domain.set_timeout(timeout).unwrap();
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let w0 = r.domain.timer_wakeups();
    let t0 = std::time::Instant::now();
    let mut unmaps = 0u64;
    while t0.elapsed() < Duration::from_millis(300) {
        map_and_unmap(&mut r, buf);
        unmaps += 1;
        std::thread::sleep(Duration::from_micros(200));
    }
    let woke = r.domain.timer_wakeups() - w0;
    let periods = (t0.elapsed().as_secs_f64() / timeout.as_secs_f64()).ceil() as u64;
    assert!(
        woke <= periods + periods / 4 + 2,
        "{woke} wake-ups in {periods} periods ({unmaps} unmaps)"
    );
    assert!(r.domain.stats().flushes > 0);
    let w = r.domain.stale_window();
    assert!(w.max <= timeout * 3 / 4, "{w:?}");
}

/// The device-side backstop: a deferred unmap arms its domain's expiry
/// deadline in the unit before it returns, and a translator that finds it
/// due drops the domain's cached translations itself, at its next hit,
/// though no flush ran (here the timeout is a minute and the deadline is
/// made due by hand, standing for a timer and an owner kept off their
/// CPUs).
#[test]
fn a_translator_expires_a_deferred_unmap_whose_deadline_passed() {
    let mut r = rig(DmaPolicy::Deferred, false);
    r.domain.set_timeout(Duration::from_secs(60)).unwrap();
    let system = r.domain.system.clone();
    let unit = system.unit(crate::hw::UnitId(0)).unwrap();
    let did = r.domain.did();
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let a = r
        .cpu
        .map(&r.dev, buf, 4096, DmaDirection::ToDevice)
        .unwrap();
    assert!(reachable(&mut r, a));
    assert!(!unit.expiry_armed(did), "nothing queued yet");
    r.cpu
        .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
        .unwrap();
    assert!(unit.expiry_armed(did), "the queued unmap armed it");
    // Within its deadline the IOTLB keeps serving it (the window).
    for _ in 0..200 {
        assert!(reachable(&mut r, a));
    }
    assert_eq!(r.tr.stats().expiries, 0);
    // Past it (made due by hand): the very next hit looks at it, drops
    // the domain's cached translations and walks, and the device faults.
    unit.force_expiry_due(did);
    assert!(matches!(
        r.tr.translate(SID, a, 1, Access::Read),
        Err(crate::hw::TranslateError::NotPresent { .. })
    ));
    assert_eq!(r.tr.stats().expiries, 1);
    assert!(
        unit.expiry_armed(did),
        "moved on by its period while the unmap is queued"
    );
    r.cpu.flush_own().unwrap();
}

/// A bounce lane's IOVA block carries no mapping's tag, whatever a
/// previous user of that IOVA left (every allocation starts untagged): a
/// streaming unmap that reached the block past the pool check (racing the
/// pool's making) could not match it and retire the lane.
#[test]
fn a_bounce_lanes_block_carries_no_previous_users_tag() {
    let p = crate::Platform::builder()
        .policy(DmaPolicy::Deferred)
        .build()
        .unwrap();
    let d = &p.domain;
    let pages = d.bounce_bytes.div_ceil(PAGE_SIZE).next_power_of_two();
    let limit = d.iova.limit_for_mask(u64::MAX);
    // Where the first lane will go (the allocator hands the same block
    // back), tagged as a mapping's would be, then freed.
    let pfns: Vec<u64> = (0..3)
        .map(|_| d.iova.alloc(pages, limit).unwrap())
        .collect();
    for &pfn in &pfns {
        d.iova.set_tag(pfn, 0x8000_1234).unwrap();
    }
    for &pfn in pfns.iter().rev() {
        d.iova.free(pfn, pages).unwrap();
    }
    p.system.assign(SID, crate::hw::UnitId(0)).unwrap();
    let _dev = d.attach(SID, u64::MAX, true).unwrap();
    let lanes = d.bounce.iter().next().expect("a pool").lane_iovas();
    let mut reused = 0;
    for iova in lanes {
        let pfn = iova >> crate::mem::PAGE_SHIFT;
        reused += usize::from(pfns.contains(&pfn));
        assert_eq!(d.iova.tag(pfn), 0, "lane at {iova:#x}");
    }
    assert!(
        reused > 0,
        "no lane reused a tagged block: {lanes:x?} {pfns:x?}"
    );
}

/// A streaming unmap or sync naming a block no mapping tagged (live and
/// untagged: a bounce lane's, or one a map is still filling) finds nothing
/// mapped there, whatever the length, and changes nothing.
#[test]
fn an_unmap_or_sync_of_a_block_no_mapping_tagged_is_not_mapped() {
    for policy in [DmaPolicy::Strict, DmaPolicy::Deferred] {
        let mut r = rig(policy, false);
        let limit = r.domain.iova.limit_for_mask(u64::MAX);
        let pfn = r.domain.iova.alloc(1, limit).unwrap();
        let addr = pfn << crate::mem::PAGE_SHIFT;
        for len in [4096, 100] {
            assert_eq!(
                r.cpu.unmap(&r.dev, addr, len, DmaDirection::ToDevice),
                Err(DmaError::NotMapped { addr }),
                "{policy}, {len} bytes"
            );
        }
        // Mapped in the table but not yet tagged (a map between its PTE
        // write and its tag): a sync finds no mapping either.
        let buf = r.mem.alloc_zeroed_frames(0).unwrap();
        r.domain
            .table
            .map(addr, buf, 4096, DmaDirection::ToDevice.perm())
            .unwrap();
        assert!(matches!(
            r.cpu.sync_for_cpu(addr, 64),
            Err(DmaError::NotMapped { .. })
        ));
        let mut g = crate::pgtable::IotlbGather::new();
        r.domain.table.unmap(addr, 4096, &mut g).unwrap();
        assert_eq!(
            r.domain.iova.find(pfn).map(|b| b.state),
            Some(crate::iova::BlockState::Live),
            "{policy}: the block is untouched"
        );
        r.domain.iova.free(pfn, 1).unwrap();
    }
}

/// The deferred unmap's cover check finds the deadline word through the
/// CPU's cover cache: a cleared deadline is armed again by the next
/// unmap, and a unit that joins the domain later has its own armed by the
/// next unmap too (the cache follows the domain's unit mask).
#[test]
fn deferred_unmaps_arm_a_cleared_deadline_and_one_in_a_unit_that_joined_later() {
    let sid_b = SourceId(0x0200);
    let p = crate::Platform::builder()
        .policy(DmaPolicy::Deferred)
        .unit(crate::hw::UnitConfig::default())
        .unit(crate::hw::UnitConfig::default())
        .device_spec(crate::DeviceSpec {
            sid: SID,
            unit: 0,
            mask: u64::MAX,
            untrusted: false,
        })
        .build()
        .unwrap();
    p.domain.set_timeout(Duration::from_secs(60)).unwrap();
    let (u0, u1) = (p.unit(0).unwrap(), p.unit(1).unwrap());
    let did = p.domain.did();
    let dev = &p.devices[0];
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let mut pair = || {
        let a = cpu.map(dev, buf, 4096, DmaDirection::ToDevice).unwrap();
        cpu.unmap(dev, a, 4096, DmaDirection::ToDevice).unwrap();
    };
    pair();
    assert!(u0.expiry_armed(did), "the first unmap armed unit 0's");
    assert!(!u1.expiry_armed(did), "unit 1 is not the domain's yet");
    // Cleared (as the timer clears it once nothing is queued): the next
    // unmap finds it unarmed through the cache and arms it.
    u0.shared.iotlb.force_deadline(did, 0);
    pair();
    assert!(u0.expiry_armed(did));
    // A device behind unit 1 joins: the domain spans both units now.
    p.system.assign(sid_b, crate::hw::UnitId(1)).unwrap();
    let _b = p.domain.attach(sid_b, u64::MAX, false).unwrap();
    pair();
    assert!(u1.expiry_armed(did), "the next unmap covered unit 1 too");
    assert!(u0.expiry_armed(did));
    cpu.flush_own().unwrap();
}

/// The deferred bound is the device's own: a device thread translates an
/// IOVA (cached), the IOVA is deferred-unmapped, and the thread comes back
/// after `flush_timeout + 1 ms` with no flush having run (the timer paused,
/// standing for a starved timer thread; the high-water mark out of reach;
/// one push, so the owner never checks its queue): its next access faults
/// as not present, from its own hit path. (Before, the translator looked
/// at the deadline only every 64 hits, and this access was served from
/// the cache.)
#[test]
fn a_device_back_after_the_bound_faults_though_no_flush_ran() {
    let mut r = rig(DmaPolicy::Deferred, false);
    let timeout = Duration::from_millis(10);
    r.domain.set_timeout(timeout).unwrap();
    r.domain.set_high_water(super::domain::MAX_FQ_SIZE).unwrap();
    r.domain.arm.pause(true);
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let a = r
        .cpu
        .map(&r.dev, buf, 4096, DmaDirection::ToDevice)
        .unwrap();
    assert!(reachable(&mut r, a));
    assert!(reachable(&mut r, a));
    let hits = r.tr.stats().hits;
    assert!(hits >= 1, "cached");
    r.cpu
        .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
        .unwrap();
    std::thread::sleep(timeout + Duration::from_millis(2));
    let err = r.tr.translate(SID, a + 8, 8, Access::Read).unwrap_err();
    assert!(
        matches!(err, crate::hw::TranslateError::NotPresent { iova, .. } if iova == a + 8),
        "{err:?}"
    );
    assert_eq!(r.tr.stats().expiries, 1);
    assert_eq!(r.domain.stats().flushes, 0, "no flush ran");
    r.domain.arm.pause(false);
    r.cpu.flush_own().unwrap();
}

#[test]
fn the_high_water_mark_and_the_timer_flush() {
    let mut r = rig(DmaPolicy::Deferred, false);
    r.domain.set_timeout(Duration::from_secs(60)).unwrap();
    r.domain.set_high_water(4).unwrap();
    let buf = r.mem.alloc_zeroed_frames(2).unwrap();
    let addrs: Vec<u64> = (0..4)
        .map(|i| {
            r.cpu
                .map(&r.dev, buf + i * 4096, 4096, DmaDirection::ToDevice)
                .unwrap()
        })
        .collect();
    for &a in &addrs[..3] {
        r.cpu
            .unmap(&r.dev, a, 4096, DmaDirection::ToDevice)
            .unwrap();
    }
    assert_eq!(r.domain.stats().flushes, 0);
    r.cpu
        .unmap(&r.dev, addrs[3], 4096, DmaDirection::ToDevice)
        .unwrap();
    assert_eq!(
        r.domain.stats().flushes,
        1,
        "the fourth unmap reached the mark"
    );
    // The timer: a short timeout flushes a lone entry by itself, a
    // timeout after it woke the timer (the window reads the earlier
    // expiry deadline, three quarters of it, or the completion).
    r.domain.set_timeout(Duration::from_millis(5)).unwrap();
    let a = map_and_unmap(&mut r, buf);
    let t0 = std::time::Instant::now();
    while r.domain.stats().flushes < 2 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(r.domain.stats().flushes, 2, "the timer flushed");
    assert!(!reachable(&mut r, a));
    let w = r.domain.stale_window();
    assert!(
        w.max >= r.domain.tunables().flush_after() && w.max < Duration::from_secs(5),
        "{w:?}"
    );
}

#[test]
fn passthrough_and_switching_rules() {
    let mut r = rig(DmaPolicy::Passthrough, false);
    let buf = r.mem.alloc_frames(0).unwrap();
    let a = r.cpu.map(&r.dev, buf, 64, DmaDirection::ToDevice).unwrap();
    assert_eq!(a, buf);
    // Plain RAM nobody mapped, at the top of the arena.
    let plain = r.mem.size() - PAGE_SIZE + 0x345;
    assert!(!r.mem.is_iommu_frame(plain));
    assert!(reachable(&mut r, plain), "pass-through reaches all RAM");
    // But no bounce pool, not even its own domain's (it maps nothing
    // there for a pass-through device).
    let pool = (0..r.mem.size())
        .step_by(PAGE_SIZE as usize)
        .find(|&f| r.mem.is_iommu_frame(f))
        .expect("the domain's bounce pool");
    assert!(!reachable(&mut r, pool + 0x345), "a bounce pool");
    assert_eq!(
        r.domain.set_policy(DmaPolicy::Strict),
        Err(DmaError::PolicySwitchBusy { live: 1 })
    );
    r.cpu.unmap(&r.dev, a, 64, DmaDirection::ToDevice).unwrap();
    r.domain.set_policy(DmaPolicy::Strict).unwrap();
    assert!(!reachable(&mut r, plain), "translated now");
    let b = r.cpu.map(&r.dev, buf, 64, DmaDirection::ToDevice).unwrap();
    // Strict, deferred and bounce switch freely with live mappings.
    r.domain.set_policy(DmaPolicy::Deferred).unwrap();
    assert!(reachable(&mut r, b), "a live mapping survives the switch");
    r.domain.set_policy(DmaPolicy::Bounce).unwrap();
    assert!(reachable(&mut r, b));
    r.domain.set_policy(DmaPolicy::Strict).unwrap();
    r.cpu.unmap(&r.dev, b, 64, DmaDirection::ToDevice).unwrap();
    assert!(!reachable(&mut r, b));
}

#[test]
fn bounce_shows_the_device_only_the_pool() {
    let mut r = rig(DmaPolicy::Strict, true);
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    r.mem.write(buf, b"secret-neighbour").unwrap();
    r.mem.write(buf + 100, b"data").unwrap();
    let a = r
        .cpu
        .map(&r.dev, buf + 100, 4, DmaDirection::Bidirectional)
        .unwrap();
    let ranges = r.tr.translate(SID, a, 4, Access::Write).unwrap();
    let slot = ranges.as_slice()[0].phys;
    let mut got = [0u8; 4];
    r.mem.read(slot, &mut got).unwrap();
    assert_eq!(&got, b"data", "copied in");
    assert!(
        slot < buf || slot >= buf + 4096,
        "the device reaches a pool slot, not the buffer's page"
    );
    r.mem.write(slot, b"DATA").unwrap(); // the device writes
    r.cpu
        .unmap(&r.dev, a, 4, DmaDirection::Bidirectional)
        .unwrap();
    let mut back = [0u8; 20];
    r.mem.read(buf, &mut back).unwrap();
    assert_eq!(&back[..16], b"secret-neighbour");
    let mut out = [0u8; 4];
    r.mem.read(buf + 100, &mut out).unwrap();
    assert_eq!(&out, b"DATA", "copied back");
    assert_eq!(
        r.cpu.unmap(&r.dev, a, 4, DmaDirection::Bidirectional),
        Err(DmaError::NotMapped { addr: a })
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    for policy in [DmaPolicy::Strict, DmaPolicy::Deferred] {
        let mut r = rig(policy, false);
        let buf = r.mem.alloc_zeroed_frames(2).unwrap();
        let a = r
            .cpu
            .map(&r.dev, buf, 3 * 4096, DmaDirection::ToDevice)
            .unwrap();
        assert_eq!(
            r.cpu.map(&r.dev, buf, 0, DmaDirection::ToDevice),
            Err(DmaError::ZeroLength)
        );
        assert_eq!(
            r.cpu
                .unmap(&r.dev, a + (1 << 30), 4096, DmaDirection::ToDevice),
            Err(DmaError::NotMapped {
                addr: a + (1 << 30)
            })
        );
        assert_eq!(
            r.cpu.unmap(&r.dev, a, 2 * 4096, DmaDirection::ToDevice),
            Err(DmaError::WrongLength {
                addr: a,
                len: 2 * 4096
            })
        );
        assert_eq!(
            r.cpu.unmap(&r.dev, a, 4096, DmaDirection::ToDevice),
            Err(DmaError::WrongLength { addr: a, len: 4096 })
        );
        assert!(
            reachable(&mut r, a + 2 * 4096),
            "{policy}: the mapping is intact"
        );
        r.cpu
            .unmap(&r.dev, a, 3 * 4096, DmaDirection::ToDevice)
            .unwrap();
        assert_eq!(
            r.cpu.unmap(&r.dev, a, 3 * 4096, DmaDirection::ToDevice),
            Err(DmaError::NotMapped { addr: a }),
            "{policy}: double unmap"
        );
        let sg = [
            SgEntry { phys: buf, len: 10 },
            SgEntry {
                phys: buf + 4096,
                len: 0,
            },
        ];
        let mut out = [0u64; 2];
        assert_eq!(
            r.cpu
                .map_sg(&r.dev, &sg, DmaDirection::ToDevice, &mut out)
                .unwrap_err(),
            DmaError::ZeroLength
        );
        assert_eq!(r.domain.stats().live(), 0, "{policy}");
    }
    let r = rig(DmaPolicy::Strict, false);
    assert!(matches!(
        r.domain.attach(SourceId(0x0101), 0xfff, false),
        Err(DmaError::MaskTooSmall { .. })
    ));
}

#[test]
fn scatter_lists_merge_into_one_range() {
    let mut r = rig(DmaPolicy::Strict, false);
    let buf = r.mem.alloc_zeroed_frames(3).unwrap();
    r.mem.write(buf + 4096 - 2, b"ab").unwrap();
    r.mem.write(buf + 5 * 4096, b"cd").unwrap();
    let sg = [
        SgEntry {
            phys: buf + 4096 - 2,
            len: 2,
        },
        SgEntry {
            phys: buf + 5 * 4096,
            len: 2,
        },
    ];
    let mut out = [0u64; 2];
    let m = r
        .cpu
        .map_sg(&r.dev, &sg, DmaDirection::ToDevice, &mut out)
        .unwrap();
    assert!(m.contiguous);
    assert_eq!(out[1], out[0] + 2, "the device sees one run of bytes");
    let ranges = r.tr.translate(SID, out[0], 4, Access::Read).unwrap();
    let mut got = Vec::new();
    for p in ranges.iter() {
        let mut b = vec![0u8; p.len as usize];
        r.mem.read(p.phys, &mut b).unwrap();
        got.extend(b);
    }
    assert_eq!(got, b"abcd");
    r.cpu
        .unmap_sg(&r.dev, &m, &sg, &out, DmaDirection::ToDevice)
        .unwrap();
    assert!(!reachable(&mut r, out[0]));
}

#[test]
fn coherent_allocations_are_shared_and_freed() {
    let mut r = rig(DmaPolicy::Deferred, false);
    let (phys, dma) = r.cpu.alloc_coherent(&r.dev, 10_000).unwrap();
    let ranges = r.tr.translate(SID, dma + 8192, 8, Access::Write).unwrap();
    assert_eq!(ranges.as_slice()[0].phys, phys + 8192);
    r.cpu.free_coherent(&r.dev, phys, dma, 10_000).unwrap();
    assert!(
        !reachable(&mut r, dma),
        "flushed before the pages went back"
    );
}

#[test]
fn a_device_of_another_domain_is_refused() {
    let mut a = rig(DmaPolicy::Strict, false);
    let b = rig(DmaPolicy::Strict, false);
    let buf = a.mem.alloc_zeroed_frames(0).unwrap();
    assert!(matches!(
        a.cpu.map(&b.dev, buf, 64, DmaDirection::ToDevice),
        Err(DmaError::WrongDomain { .. })
    ));
    let addr = a.cpu.map(&a.dev, buf, 64, DmaDirection::ToDevice).unwrap();
    assert!(matches!(
        a.cpu.unmap(&b.dev, addr, 64, DmaDirection::ToDevice),
        Err(DmaError::WrongDomain { .. })
    ));
    a.cpu
        .unmap(&a.dev, addr, 64, DmaDirection::ToDevice)
        .unwrap();
}

/// A strict domain whose devices prefer a low window of `window` bytes.
fn low_window_rig(window: u64, mask: u64) -> Result<crate::Platform, crate::Error> {
    crate::Platform::builder()
        .domain(DmaDomainConfig {
            policy: DmaPolicy::Deferred,
            low_window_bytes: window,
            low_window_first: true,
            ..DmaDomainConfig::default()
        })
        .device_spec(crate::DeviceSpec {
            sid: SID,
            unit: 0,
            mask,
            untrusted: false,
        })
        .build()
}

#[test]
fn a_device_preferring_the_low_window_fills_it_then_goes_above() {
    let window = MIN_LOW_WINDOW_BYTES; // 256 pages
    let p = low_window_rig(window, u64::MAX).unwrap();
    let dev = &p.devices[0];
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let mut low = 0;
    let mut high = Vec::new();
    let mut maps = Vec::new();
    for _ in 0..300 {
        let iova = cpu
            .map(dev, buf, PAGE_SIZE, DmaDirection::ToDevice)
            .unwrap();
        if iova < window {
            low += 1;
        } else {
            // Only once the window has no room left.
            assert!(low >= 250, "{iova:#x} above the window after {low} below");
            high.push(iova);
        }
        maps.push(iova);
    }
    assert!(
        !high.is_empty() && low >= 250,
        "{low} below, {} above",
        high.len()
    );
    // Every one of them reaches the page, whichever side it lies on.
    let mut tr = p.unit(0).unwrap().translator().unwrap();
    for &iova in &maps {
        assert!(
            tr.translate(SID, iova, 1, Access::Read).is_ok(),
            "{iova:#x}"
        );
    }
    for iova in maps {
        cpu.unmap(dev, iova, PAGE_SIZE, DmaDirection::ToDevice)
            .unwrap();
    }
    // A device whose mask ends inside the window is held to its mask.
    let p = low_window_rig(4 * window, window / 2 - 1).unwrap();
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    for _ in 0..100 {
        let iova = cpu
            .map(&p.devices[0], buf, PAGE_SIZE, DmaDirection::ToDevice)
            .unwrap();
        assert!(iova < window / 2, "{iova:#x}");
    }
}

#[test]
fn a_low_window_out_of_range_is_refused() {
    for bad in [
        0,
        MIN_LOW_WINDOW_BYTES - PAGE_SIZE,
        MIN_LOW_WINDOW_BYTES + 1,
        1 << 49,
    ] {
        assert!(
            matches!(
                low_window_rig(bad, u64::MAX),
                Err(crate::Error::Dma(DmaError::InvalidConfig {
                    name: "low_window_bytes",
                    ..
                }))
            ),
            "{bad:#x}"
        );
    }
}

/// The timer thread's CPU clock is readable from the domain and counts
/// the timer's own work: flushing a lone deferred unmap by its age costs
/// it CPU time that no mapping thread's clock shows.
#[test]
fn the_flush_timers_cpu_time_is_read_from_its_own_clock() {
    let mut r = rig(DmaPolicy::Deferred, false);
    let t0 = r
        .domain
        .timer_cpu_time()
        .expect("a live timer thread has a CPU clock");
    r.domain.set_timeout(Duration::from_millis(2)).unwrap();
    let buf = r.mem.alloc_zeroed_frames(1).unwrap();
    for _ in 0..20 {
        map_and_unmap(&mut r, buf);
        // Below the high-water mark: only the timer flushes it.
        let t = std::time::Instant::now();
        let before = r.domain.stats().flushes;
        while r.domain.stats().flushes == before && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert!(r.domain.stats().flushes >= 20, "the timer flushed each");
    let t1 = r.domain.timer_cpu_time().expect("still running");
    assert!(
        t1 > t0,
        "the timer's flushes show on its clock: {t0:?} -> {t1:?}"
    );
}

/// The timer pins itself beside the mapping threads when asked, and keeps
/// flushing there; the asking thread stays where it was, and a CPU it may
/// not use is refused.
#[test]
fn the_flush_timer_pins_itself_to_a_cpu_and_still_flushes() {
    let mut r = rig(DmaPolicy::Deferred, false);
    let cpus = crate::affinity::allowed_cpus();
    let c = *cpus.first().expect("the kernel names at least one CPU");
    assert_eq!(r.domain.timer_cpu(), None);
    assert!(r.domain.pin_timer(c));
    assert!(!r.domain.pin_timer(usize::MAX));
    // The request wakes the sleeping timer, which pins itself.
    let t = std::time::Instant::now();
    while r.domain.timer_cpu().is_none() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(r.domain.timer_cpu(), Some(c));
    assert_eq!(crate::affinity::allowed_cpus(), cpus, "the caller moved");
    r.domain.set_timeout(Duration::from_millis(2)).unwrap();
    let buf = r.mem.alloc_zeroed_frames(1).unwrap();
    map_and_unmap(&mut r, buf);
    // Below the high-water mark: only the (pinned) timer flushes it.
    let t = std::time::Instant::now();
    while r.domain.stats().flushes == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(r.domain.stats().flushes, 1);
}

/// Pass-through never bounces, and a switch waits for every mapping to go,
/// so no bounce slot is live in pass-through: a buffer whose physical
/// address is also an IOVA of a bounce pool's lane (RAM reaching past the
/// pool of a 32-bit device) is unmapped from the record like any other.
/// The unmap once asked the pools first and refused it `NotMapped`,
/// leaving its record live.
#[test]
fn a_passthrough_buffer_at_a_bounce_pool_iova_unmaps() {
    let p = crate::Platform::builder()
        .memory(6 << 30)
        .policy(DmaPolicy::Passthrough)
        .device_spec(crate::DeviceSpec {
            sid: SID,
            unit: 0,
            mask: u32::MAX as u64,
            untrusted: false,
        })
        .build()
        .unwrap();
    let dev = p.devices.into_iter().next().unwrap();
    let mut cpu = p.domain.cpu();
    let d = &p.domain;
    let ram = p.mem.size();
    let addr = (0..ram / PAGE_SIZE)
        .map(|f| f * PAGE_SIZE)
        .find(|&a| d.bounce.find(a).is_some() && p.mem.check_device_range(a, 64).is_ok())
        .expect("a pool's IOVA lies in RAM (below 4 GiB, RAM 6 GiB)");
    let dir = DmaDirection::ToDevice;
    assert_eq!(cpu.map(&dev, addr, 64, dir).unwrap(), addr);
    assert_eq!(cpu.unmap(&dev, addr, 64, dir), Ok(()));
    assert_eq!(d.stats().live(), 0);
    assert_eq!(
        cpu.unmap(&dev, addr, 64, dir),
        Err(DmaError::NotMapped { addr })
    );
}

/// A device thread of `system`'s first unit inside a translation section
/// until the sender is sent to (or 10 s pass, so that code that waits for
/// the section fails its test rather than hanging it): every drain begun
/// meanwhile stalls on it.
fn hold_section(
    system: &Arc<System>,
) -> (std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
    let system = system.clone();
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let device = std::thread::spawn(move || {
        let (_, unit) = system.units().next().unwrap();
        let mut tr = unit.translator().unwrap();
        tr.section(|_| {
            entered_tx.send(()).unwrap();
            let _ = release_rx.recv_timeout(Duration::from_secs(10));
        });
    });
    entered_rx.recv().unwrap();
    (device, release_tx)
}
