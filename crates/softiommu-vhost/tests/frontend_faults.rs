//! What a front-end can get wrong, driven by a fake front-end over socket
//! pairs: each case ends in a typed refusal, a bounded wait, or a clean
//! stop — never a panic, a hang, or guest memory reached that should not be.

mod common;

use std::time::{Duration, Instant};

use common::*;
use softiommu_vhost::proto::{iotlb as m, req};
use softiommu_vhost::{testing, IotlbError, MsgError, SessionEnd, SessionError};

const RW: u8 = m::ACCESS_RW;

#[test]
fn a_read_through_mapped_buffers_completes_ok() {
    let mut fe = FrontEnd::start("ok", Duration::from_secs(2));
    fe.map(RING_IOVA, 0x10000);
    fe.map(DATA_IOVA, 0x1000);
    fe.start_ring();
    fe.submit_read(4096);
    assert!(fe.wait_used(1, Duration::from_secs(10)));
    assert_eq!(fe.peek(STATUS_IOVA, 1), [0]);
    assert_eq!(fe.peek(DATA_IOVA, 4096), vec![0x5c; 4096]);
    drop(fe.sock);
    let r = fe.report.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(matches!(r.end, SessionEnd::Disconnected));
    assert_eq!(r.blk.requests, 1);
    assert_eq!(r.blk.bytes_read, 4096);
}

#[test]
fn zero_length_wrapping_and_malformed_iotlb_messages_are_refused_and_serving_goes_on() {
    let fe = FrontEnd::start("iotlb", Duration::from_secs(2));
    // A global device-IOTLB flush as QEMU sends it: the second range ends at 2^64.
    assert_eq!(fe.iotlb(m::INVALIDATE, 0, 0xfef0_0000, 0, 0), 0);
    assert_eq!(
        fe.iotlb(m::INVALIDATE, 0xfef0_0000, 0xffff_ffff_0110_0000, 0, 0),
        0
    );
    // An invalidation of size 0 is the whole space (QEMU's mask of all
    // ones plus one): accepted.
    assert_eq!(fe.iotlb(m::INVALIDATE, 0x1000, 0, 0, 0), 0);
    // An invalidation wrapping past 2^64: taken for the whole space,
    // accepted (refused, it would leave translations the front-end takes
    // for gone).
    assert_eq!(fe.iotlb(m::INVALIDATE, 2, u64::MAX, 0, 0), 0);
    // A zero-length update, a wrapping range, a bad perm, a type only a
    // back-end sends, a short payload: each acked with failure.
    assert_eq!(fe.iotlb(m::UPDATE, 0x1000, 0, UA, RW), 1);
    assert_eq!(fe.iotlb(m::UPDATE, u64::MAX - 0xfff, 0x2000, UA, RW), 1);
    assert_eq!(fe.iotlb(m::UPDATE, 0x1000, 0x1000, UA, 9), 1);
    assert_eq!(fe.iotlb(m::MISS, 0x1000, 0x1000, UA, RW), 1);
    assert_eq!(fe.ack(req::IOTLB_MSG, &[0u8; 31], &[]), 1);
    // The session still serves.
    testing::send(&fe.sock, req::GET_FEATURES, &[], &[], false).unwrap();
    assert_eq!(testing::recv(&fe.sock).unwrap().0, req::GET_FEATURES);
    drop(fe.sock);
    let r = fe.report.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(matches!(r.end, SessionEnd::Disconnected));
    assert_eq!(r.rejected_messages, 5);
    assert_eq!(r.iotlb.rejected, 4);
    assert_eq!(r.iotlb.invalidations, 4);
    assert!(matches!(
        r.last_rejection,
        Some(MsgError::BadSize {
            name: "IOTLB_MSG",
            size: 31,
            ..
        })
    ));
    // Each refusal's exact variant, one session per message.
    let cases: [(u8, u64, u64, u8, IotlbError); 2] = [
        (
            m::UPDATE,
            0x1000,
            0,
            RW,
            IotlbError::ZeroLength {
                op: "update",
                iova: 0x1000,
            },
        ),
        (
            m::MISS,
            0x1000,
            0x1000,
            RW,
            IotlbError::BadType { kind: m::MISS },
        ),
    ];
    for (kind, iova, size, perm, want) in cases {
        let fe = FrontEnd::start("iotlb-one", Duration::from_secs(2));
        assert_eq!(fe.iotlb(kind, iova, size, UA, perm), 1);
        drop(fe.sock);
        let r = fe.report.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(r.last_rejection, Some(MsgError::Iotlb(want)));
    }
}

#[test]
fn access_to_an_iova_whose_invalidation_was_acknowledged_is_refused_counted_and_memory_untouched() {
    let mut fe = FrontEnd::start("inval", Duration::from_millis(300));
    fe.map(RING_IOVA, 0x10000);
    fe.map(DATA_IOVA, 0x1000);
    fe.poke(DATA_IOVA, &[0xaa; 4096]);
    // The front-end withdraws the data page; the ack means the device is done with it.
    assert_eq!(fe.iotlb(m::INVALIDATE, DATA_IOVA, 0x1000, 0, 0), 0);
    fe.start_ring();
    fe.submit_read(4096);
    // The device asks for the page (and never gets it)...
    let (code, iova, perm, kind) = fe.read_miss();
    assert_eq!(
        (code, iova, perm, kind),
        (1, DATA_IOVA, m::ACCESS_WO, m::MISS)
    );
    // ...gives up within its bound and completes the request with IOERR.
    assert!(fe.wait_used(1, Duration::from_secs(10)));
    assert_eq!(fe.peek(STATUS_IOVA, 1), [1], "VIRTIO_BLK_S_IOERR");
    assert_eq!(
        fe.peek(DATA_IOVA, 4096),
        vec![0xaa; 4096],
        "the invalidated page was written"
    );
    drop(fe.sock);
    let r = fe.report.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(r.iotlb.miss_timeouts, 1);
    assert_eq!(r.iotlb.refused, 1);
    assert_eq!(r.blk.io_errors, 1);
    assert_eq!(r.blk.bytes_read, 0);
}

#[test]
fn an_unanswered_miss_is_a_bounded_wait_and_the_next_request_is_served() {
    let mut fe = FrontEnd::start("miss", Duration::from_millis(200));
    fe.map(RING_IOVA, 0x10000);
    fe.start_ring();
    let t = Instant::now();
    fe.submit_read(8192);
    assert!(fe.wait_used(1, Duration::from_secs(10)));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "bounded: {:?}",
        t.elapsed()
    );
    assert_eq!(fe.peek(STATUS_IOVA, 1), [1]);
    // Two pages asked in one go, each once.
    assert_eq!(fe.read_miss().1, DATA_IOVA);
    assert_eq!(fe.read_miss().1, DATA_IOVA + 0x1000);
    // Answered now: the same request shape succeeds.
    fe.map(DATA_IOVA, 0x2000);
    fe.submit_read(8192);
    assert!(fe.wait_used(2, Duration::from_secs(10)));
    assert_eq!(fe.peek(STATUS_IOVA, 1), [0]);
    assert_eq!(fe.peek(DATA_IOVA, 8192), vec![0x5c; 8192]);
}

#[test]
fn a_miss_answered_by_an_update_completes_the_request() {
    let mut fe = FrontEnd::start("answer", Duration::from_secs(5));
    fe.map(RING_IOVA, 0x10000);
    fe.start_ring();
    fe.submit_read(4096);
    let (_, iova, _, _) = fe.read_miss();
    assert_eq!(fe.iotlb(m::UPDATE, iova, 0x1000, UA + iova, RW), 0);
    assert!(fe.wait_used(1, Duration::from_secs(10)));
    assert_eq!(fe.peek(STATUS_IOVA, 1), [0]);
    assert_eq!(fe.peek(DATA_IOVA, 4096), vec![0x5c; 4096]);
}

#[test]
fn the_front_end_disconnecting_mid_request_stops_the_back_end_cleanly() {
    let mut fe = FrontEnd::start("disconnect", Duration::from_secs(30));
    fe.map(RING_IOVA, 0x10000);
    fe.poke(DATA_IOVA, &[0xaa; 4096]);
    fe.start_ring();
    fe.submit_read(4096);
    // The device is now waiting for a miss it will not get within 30 s.
    assert_eq!(fe.read_miss().1, DATA_IOVA);
    let t = Instant::now();
    let FrontEnd { sock, report, .. } = &fe;
    sock.shutdown(std::net::Shutdown::Both).unwrap();
    let r = report
        .recv_timeout(Duration::from_secs(10))
        .expect("session ends");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(matches!(r.end, SessionEnd::Disconnected));
    assert_eq!(r.iotlb.cancelled, 1);
    assert_eq!(r.blk.bytes_read, 0);
    assert_eq!(fe.peek(DATA_IOVA, 4096), vec![0xaa; 4096]);
}

#[test]
fn unreadable_headers_end_the_session_with_a_framing_error() {
    for bytes in [
        // Version 2.
        [1u32.to_le_bytes(), 2u32.to_le_bytes(), 0u32.to_le_bytes()].concat(),
        // A payload larger than any message.
        [
            1u32.to_le_bytes(),
            1u32.to_le_bytes(),
            1_000_000u32.to_le_bytes(),
        ]
        .concat(),
    ] {
        let fe = FrontEnd::start("framing", Duration::from_secs(1));
        testing::send_raw(&fe.sock, &bytes).unwrap();
        let r = fe.report.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(
            matches!(r.end, SessionEnd::Failed(SessionError::Framing(_))),
            "{:?}",
            r.end
        );
    }
}

#[test]
fn bad_ring_and_table_messages_are_refused_with_their_reason() {
    let fe = FrontEnd::start("ring", Duration::from_secs(1));
    let state = |i: u32, v: u32| (u64::from(i) | (u64::from(v) << 32)).to_le_bytes();
    assert_eq!(fe.ack(req::SET_VRING_NUM, &state(0, 3), &[]), 1);
    assert_eq!(fe.ack(req::SET_VRING_NUM, &state(1, 8), &[]), 1);
    assert_eq!(fe.ack(req::SET_MEM_TABLE, &[0u8; 8], &[]), 1);
    assert_eq!(fe.ack(99, &[], &[]), 1);
    drop(fe.sock);
    let r = fe.report.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(r.rejected_messages, 4);
    assert!(matches!(
        r.last_rejection,
        Some(MsgError::Unsupported { code: 99 })
    ));
    // Each refusal's exact variant, one session per message.
    type Check = fn(&MsgError) -> bool;
    let cases: [(u32, Vec<u8>, Check); 4] = [
        (req::SET_VRING_NUM, state(0, 3).to_vec(), |e| {
            matches!(
                e,
                MsgError::Invalid {
                    name: "SET_VRING_NUM",
                    ..
                }
            )
        }),
        (req::SET_VRING_NUM, state(1, 8).to_vec(), |e| {
            matches!(
                e,
                MsgError::BadQueue {
                    index: 1,
                    queues: 1,
                    ..
                }
            )
        }),
        (
            req::SET_MEM_TABLE,
            [1u32.to_le_bytes(), [0; 4]]
                .concat()
                .into_iter()
                .chain([0u8; 32])
                .collect(),
            |e| {
                matches!(
                    e,
                    MsgError::BadFds {
                        name: "SET_MEM_TABLE",
                        got: 0,
                        want: 1
                    }
                )
            },
        ),
        (req::SET_VRING_KICK, 0u64.to_le_bytes().to_vec(), |e| {
            matches!(
                e,
                MsgError::BadFds {
                    name: "SET_VRING_KICK",
                    got: 0,
                    want: 1
                }
            )
        }),
    ];
    for (code, payload, check) in cases {
        let fe = FrontEnd::start("ring-one", Duration::from_secs(1));
        assert_eq!(fe.ack(code, &payload, &[]), 1);
        drop(fe.sock);
        let r = fe.report.recv_timeout(Duration::from_secs(10)).unwrap();
        let e = r.last_rejection.expect("refused");
        assert!(check(&e), "{e:?}");
    }
}

#[test]
fn an_invalidation_acknowledged_mid_request_is_never_reached_through_after() {
    let mut fe = FrontEnd::start("midrequest", Duration::from_millis(300));
    fe.map(RING_IOVA, 0x10000);
    let (first, second) = (DATA_IOVA, DATA_IOVA + 0x4000);
    // The second segment is mapped, the first is not: the device stops on
    // the first's miss with the request under way.
    fe.map(second, 0x1000);
    fe.poke(first, &[0xaa; 4096]);
    fe.poke(second, &[0xbb; 4096]);
    fe.start_ring();
    fe.submit_read_segs(&[(first, 4096), (second, 4096)]);
    assert_eq!(fe.read_miss().1, first);
    // Mid-request, the front-end withdraws the second segment (acked),
    // then answers the first's miss.
    assert_eq!(fe.iotlb(m::INVALIDATE, second, 0x1000, 0, 0), 0);
    assert_eq!(fe.iotlb(m::UPDATE, first, 0x1000, UA + first, RW), 0);
    // The device fills the first segment, misses on the second, is never
    // answered, and fails the request without touching the second.
    assert_eq!(fe.read_miss().1, second);
    assert!(fe.wait_used(1, Duration::from_secs(10)));
    assert_eq!(fe.peek(STATUS_IOVA, 1), [1], "VIRTIO_BLK_S_IOERR");
    assert_eq!(fe.peek(first, 4096), vec![0x5c; 4096]);
    assert_eq!(
        fe.peek(second, 4096),
        vec![0xbb; 4096],
        "written after the invalidation was acked"
    );
    drop(fe.sock);
    let r = fe.report.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (r.iotlb.miss_timeouts, r.iotlb.refused, r.blk.io_errors),
        (1, 1, 1)
    );
}

#[test]
fn racing_invalidations_nothing_is_written_after_the_ack() {
    let mut fe = FrontEnd::start("race", Duration::from_millis(50));
    fe.map(RING_IOVA, 0x10000);
    fe.start_ring();
    let mut done = 0u16;
    let (mut before, mut after) = (0, 0);
    for round in 0..40u32 {
        fe.map(DATA_IOVA, 0x1000);
        fe.poke(DATA_IOVA, &[0xaa; 4096]);
        fe.submit_read(4096);
        // Let the device get a head start on some rounds, none on others.
        if round % 2 == 1 {
            std::thread::sleep(Duration::from_micros(u64::from(round) * 20));
        }
        assert_eq!(fe.iotlb(m::INVALIDATE, DATA_IOVA, 0x1000, 0, 0), 0);
        let at_ack = fe.peek(DATA_IOVA, 4096);
        done += 1;
        assert!(fe.wait_used(done, Duration::from_secs(10)));
        // Whatever the device did before the ack stays; nothing after it.
        assert_eq!(
            fe.peek(DATA_IOVA, 4096),
            at_ack,
            "round {round}: written after the ack"
        );
        match fe.peek(STATUS_IOVA, 1)[0] {
            0 => {
                assert_eq!(
                    at_ack,
                    vec![0x5c; 4096],
                    "round {round}: OK status without the data"
                );
                before += 1;
            }
            1 => {
                assert_eq!(
                    at_ack,
                    vec![0xaa; 4096],
                    "round {round}: IOERR after a partial write"
                );
                after += 1;
            }
            s => panic!("round {round}: status {s}"),
        }
    }
    eprintln!("served before the ack: {before}, refused after it: {after}");
    assert_eq!(before + after, 40);
}

/// A request's missing pages are asked in one burst before any answer,
/// and the device sleeps until the last of them is answered: answered one
/// page at a time (as QEMU does), a 32-page request wakes the device once
/// or twice, not once per page — the CPU the front-end needs to answer
/// is not taken by a device that wakes to find its page still missing.
#[test]
fn a_request_s_misses_go_out_in_one_burst_and_wake_the_device_once() {
    const PAGES: u64 = 32;
    let mut fe = FrontEnd::start("burst", Duration::from_secs(10));
    fe.map(RING_IOVA, 0x1000);
    fe.start_ring();
    fe.submit_read_segs(&[(DATA_IOVA, (PAGES * 4096) as u32)]);
    // Every page is asked before anything is answered: header, data, status.
    fe.chan
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut asked: Vec<u64> = (0..PAGES + 2).map(|_| fe.read_miss().1).collect();
    asked.sort_unstable();
    let mut want: Vec<u64> = (0..PAGES).map(|k| DATA_IOVA + k * 4096).collect();
    want.extend([HDR_IOVA, STATUS_IOVA]);
    want.sort_unstable();
    assert_eq!(asked, want);
    // Answered one page at a time, in the order asked, with a pause
    // between answers: a device woken by every update would wake each time.
    let order = [HDR_IOVA]
        .into_iter()
        .chain((0..PAGES).map(|k| DATA_IOVA + k * 4096))
        .chain([STATUS_IOVA]);
    for iova in order {
        assert_eq!(fe.iotlb(m::UPDATE, iova, 0x1000, UA + iova, RW), 0);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(fe.wait_used(1, Duration::from_secs(10)));
    assert_eq!(fe.peek(STATUS_IOVA, 1), [0]);
    assert_eq!(
        fe.peek(DATA_IOVA, (PAGES * 4096) as usize),
        vec![0x5c; (PAGES * 4096) as usize]
    );
    fe.sock.shutdown(std::net::Shutdown::Both).unwrap();
    let r = fe
        .report
        .recv_timeout(Duration::from_secs(10))
        .expect("session ends");
    assert_eq!(r.iotlb.misses, PAGES + 2, "{:?}", r.iotlb);
    assert_eq!(r.iotlb.answered, PAGES + 2, "{:?}", r.iotlb);
    assert!(r.iotlb.miss_wakeups <= 2, "{:?}", r.iotlb);
    assert_eq!(r.blk.io_errors, 0);
}

/// Two requests available at once: the second one's missing pages are
/// asked right after the first one's, before any answer — the front-end
/// answers them while the first is served — and both complete.
#[test]
fn the_next_available_request_s_misses_are_asked_before_the_first_completes() {
    const B_HDR: u64 = 0x13000;
    const B_STATUS: u64 = 0x14000;
    const B_DATA: u64 = 0x40000;
    let fe = FrontEnd::start("ahead", Duration::from_secs(10));
    fe.map(RING_IOVA, 0x1000);
    fe.start_ring();
    let d = |addr: u64, len: u32, flags: u16, next: u16| {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..16].copy_from_slice(&next.to_le_bytes());
        b
    };
    // Request A at descriptors 0-2, B at 3-5: reads of 2 and 4 pages.
    let reqs = [
        (HDR_IOVA, DATA_IOVA, 2u64, STATUS_IOVA, 0u16),
        (B_HDR, B_DATA, 4, B_STATUS, 3),
    ];
    for &(hdr, data, pages, status, first) in &reqs {
        fe.poke(hdr, &[0u8; 16]); // VIRTIO_BLK_T_IN, sector 0
        fe.poke(status, &[0xee]);
        fe.poke(DESC + 16 * u64::from(first), &d(hdr, 16, 1, first + 1));
        fe.poke(
            DESC + 16 * u64::from(first + 1),
            &d(data, (pages * 4096) as u32, 1 | 2, first + 2),
        );
        fe.poke(DESC + 16 * u64::from(first + 2), &d(status, 1, 2, 0));
    }
    fe.poke(AVAIL + 4, &0u16.to_le_bytes());
    fe.poke(AVAIL + 6, &3u16.to_le_bytes());
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    fe.poke(AVAIL + 2, &2u16.to_le_bytes());
    let one = 1u64;
    // SAFETY: 8 bytes to an eventfd.
    unsafe {
        libc::write(
            std::os::fd::AsRawFd::as_raw_fd(&fe.kick),
            (&one as *const u64).cast(),
            8,
        )
    };
    fe.chan
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // A's 4 pages, then B's 6, before anything is answered.
    let asked: Vec<u64> = (0..10).map(|_| fe.read_miss().1).collect();
    let mut a: Vec<u64> = asked[..4].to_vec();
    let mut b: Vec<u64> = asked[4..].to_vec();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(
        a,
        vec![HDR_IOVA, STATUS_IOVA, DATA_IOVA, DATA_IOVA + 0x1000]
    );
    let mut want_b = vec![B_HDR, B_STATUS];
    want_b.extend((0..4).map(|k| B_DATA + k * 0x1000));
    want_b.sort_unstable();
    assert_eq!(b, want_b);
    for iova in asked {
        assert_eq!(fe.iotlb(m::UPDATE, iova, 0x1000, UA + iova, RW), 0);
    }
    assert!(fe.wait_used(2, Duration::from_secs(10)));
    assert_eq!(fe.peek(STATUS_IOVA, 1), [0]);
    assert_eq!(fe.peek(B_STATUS, 1), [0]);
    assert_eq!(fe.peek(DATA_IOVA, 2 * 4096), vec![0x5c; 2 * 4096]);
    assert_eq!(fe.peek(B_DATA, 4 * 4096), vec![0x5c; 4 * 4096]);
    fe.sock.shutdown(std::net::Shutdown::Both).unwrap();
    let r = fe
        .report
        .recv_timeout(Duration::from_secs(10))
        .expect("session ends");
    assert_eq!(r.iotlb.misses, 10, "{:?}", r.iotlb);
    assert_eq!(r.blk.requests, 2);
    assert_eq!(r.blk.io_errors, 0);
}

/// The session times the miss round trips: each IOTLB message's handling
/// (read to ack) and, while a miss waits, the front-end's turn from our
/// ack to its next message. A front-end that answers each of a request's
/// three misses (header, data page, status) 20 ms after the last shows
/// two turns of at least 20 ms each (the first answer follows the ring's
/// map, acked when no miss waited).
#[test]
fn the_session_times_the_front_end_s_turn_of_each_miss_round_trip() {
    const DELAY: Duration = Duration::from_millis(20);
    let mut fe = FrontEnd::start("turns", Duration::from_secs(10));
    fe.map(RING_IOVA, 0x1000);
    fe.start_ring();
    fe.submit_read(4096);
    fe.chan
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let asked: Vec<u64> = (0..3).map(|_| fe.read_miss().1).collect();
    for iova in asked {
        std::thread::sleep(DELAY);
        assert_eq!(fe.iotlb(m::UPDATE, iova, 0x1000, UA + iova, RW), 0);
    }
    assert!(fe.wait_used(1, Duration::from_secs(10)));
    fe.sock.shutdown(std::net::Shutdown::Both).unwrap();
    let r = fe
        .report
        .recv_timeout(Duration::from_secs(10))
        .expect("session ends");
    let t = &r.timing;
    // The ring's map and the three answers.
    assert_eq!(t.iotlb_messages, 4, "{t:?}");
    assert!(t.iotlb_handle_ns > 0, "{t:?}");
    assert_eq!(t.frontend_turns, 2, "{t:?}");
    assert_eq!(t.frontend_turns_over_1ms, 2, "{t:?}");
    assert!(t.frontend_turn_ns >= 2 * DELAY.as_nanos() as u64, "{t:?}");
    assert_eq!(t.frontend_turn_over_1ms_ns, t.frontend_turn_ns, "{t:?}");
    assert_eq!(r.blk.requests, 1);
    assert_eq!(r.blk.io_errors, 0);
}
