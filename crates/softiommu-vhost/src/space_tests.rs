//! The hit path's contract under races: nothing reaches a range once its
//! invalidation returned, a hit needs no lock, the cache stays bounded and
//! never outlives the IOTLB, and an old memory table is unmapped only once
//! no access uses it.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::space_bench::{table, IOVA, MEM, UA};

const RW: u8 = m::ACCESS_RW;

fn space(capacity: usize) -> (Arc<DmaSpace>, *mut u8) {
    space_with(capacity, Duration::from_millis(1))
}

fn space_with(capacity: usize, miss_timeout: Duration) -> (Arc<DmaSpace>, *mut u8) {
    let (mem, _, host) = table(c"space-tests");
    let s = DmaSpace::new(capacity, miss_timeout);
    s.set_memory(mem);
    s.set_iommu(true);
    (Arc::new(s), host)
}

/// Host pointers cross threads in these tests only as addresses.
fn snapshot(host: usize, off: u64, len: usize) -> Vec<u8> {
    // SAFETY: inside the test's shared mapping, which is never unmapped.
    unsafe { std::slice::from_raw_parts((host + off as usize) as *const u8, len).to_vec() }
}

/// Device threads write stamps into a page, half, then a pause, then the
/// other half, while the main thread maps the page, lets them run and
/// invalidates it. From the moment `invalidate` returns, the page's bytes
/// must not change: a write in flight finished before, and none starts
/// after. (Without the drain, the second half of a write in flight lands
/// after the return; without the cache clear, a write that starts after it
/// still hits.)
#[test]
fn an_access_racing_an_invalidation_never_touches_the_range_after_it_returned() {
    const PAGES: u64 = 4;
    const ROUNDS: u64 = 300;
    let (s, host) = space(64);
    let host = host as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (s, stop, ok) = (s.clone(), stop.clone(), ok.clone());
            std::thread::spawn(move || {
                let mut stamp = w << 56;
                while !stop.load(Ordering::Relaxed) {
                    for pg in 0..PAGES {
                        stamp += 1;
                        let bytes = stamp.to_le_bytes().repeat(512);
                        let r = s.access(
                            AddrKind::Buffer,
                            IOVA + pg * PAGE,
                            PAGE,
                            true,
                            &mut |p, n, off| {
                                let half = n / 2;
                                // SAFETY: p is valid for n bytes (the access's contract).
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        bytes[off as usize..].as_ptr(),
                                        p,
                                        half,
                                    );
                                }
                                for _ in 0..(stamp % 4) {
                                    std::thread::yield_now();
                                }
                                // SAFETY: as above.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        bytes[off as usize + half..].as_ptr(),
                                        p.add(half),
                                        n - half,
                                    );
                                }
                                Ok(())
                            },
                        );
                        if r.is_ok() {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let mut changed = Vec::new();
    for round in 0..ROUNDS {
        let pg = round % PAGES;
        let iova = IOVA + pg * PAGE;
        s.update(iova, PAGE, UA + pg * PAGE, RW).unwrap();
        std::thread::sleep(Duration::from_micros(round % 7 * 30));
        assert!(matches!(
            s.invalidate(iova, PAGE),
            Ok(IotlbOutcome::Invalidated {
                removed: 1,
                evicted: false
            })
        ));
        let at_ack = snapshot(host, pg * PAGE, PAGE as usize);
        // The writers keep trying for a while; the page must not move.
        std::thread::sleep(Duration::from_micros(300));
        if snapshot(host, pg * PAGE, PAGE as usize) != at_ack {
            changed.push(round);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    assert!(
        changed.is_empty(),
        "written after the invalidation returned in rounds {changed:?}"
    );
    assert!(
        ok.load(Ordering::Relaxed) > ROUNDS,
        "the writers hit often enough to race"
    );
}

/// A hit takes no lock: an access to a cached page completes while another
/// thread holds the table lock (a locked table would block it).
#[test]
fn a_hit_completes_while_the_table_lock_is_held() {
    let (s, _) = space(64);
    s.update(IOVA, PAGE, UA, RW).unwrap();
    let held = s.lock();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = {
        let s = s.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 8];
            tx.send(s.read_bytes(AddrKind::Buffer, IOVA + 8, &mut b))
                .unwrap();
        })
    };
    let r = rx.recv_timeout(Duration::from_secs(5));
    drop(held);
    t.join().unwrap();
    assert!(matches!(r, Ok(Ok(()))), "{r:?}");
}

/// Past its capacity the IOTLB is emptied and the eviction counted; the
/// page cache is bounded too and never serves a page the IOTLB dropped.
#[test]
fn evictions_are_bounded_counted_and_the_cache_follows_the_iotlb() {
    let (s, _) = space(8);
    let mut b = [0u8; 8];
    for k in 0..100u64 {
        s.update(IOVA + k * PAGE, PAGE, UA + k * PAGE, RW).unwrap();
        s.read_bytes(AddrKind::Buffer, IOVA + k * PAGE, &mut b)
            .unwrap();
        assert!(s.iotlb_len() <= 8);
    }
    assert_eq!(s.stats().evictions, 12, "{:?}", s.stats());
    assert!(s.cache.capacity() <= CACHE_MAX);
    // Page 0 was evicted: no channel to ask it on, so the access fails.
    assert!(matches!(
        s.read_bytes(AddrKind::Buffer, IOVA, &mut b),
        Err(AccessError::NoChannel { iova: IOVA, .. })
    ));
    // The last one is held.
    s.read_bytes(AddrKind::Buffer, IOVA + 99 * PAGE, &mut b)
        .unwrap();
}

/// Zero-length and wrapping ranges: as before the cache, typed and
/// harmless, and an invalidation wrapping past 2^64 taken for the whole
/// space; the global flush's range ending at 2^64 clears the cache too.
#[test]
fn zero_length_wrapping_and_2_pow_64_ranges_with_the_cache() {
    let (s, _) = space(64);
    let top = u64::MAX - (PAGE - 1);
    s.update(top, PAGE, UA, RW).unwrap();
    s.update(IOVA, PAGE, UA + PAGE, RW).unwrap();
    let mut b = [0u8; 8];
    s.read_bytes(AddrKind::Buffer, u64::MAX - 7, &mut b)
        .unwrap();
    assert!(s
        .access(
            AddrKind::Buffer,
            IOVA,
            0,
            false,
            &mut |_, _, _| unreachable!()
        )
        .is_ok());
    assert!(matches!(
        s.read_bytes(AddrKind::Buffer, u64::MAX - 3, &mut b),
        Err(AccessError::Wraps { len: 8, .. })
    ));
    // An invalidation wrapping past 2^64 is the whole space: both pages,
    // cached by the reads above, stop hitting.
    s.read_bytes(AddrKind::Buffer, IOVA, &mut b).unwrap();
    s.invalidate(top, 2 * PAGE).unwrap();
    let r = s.read_bytes(AddrKind::Buffer, u64::MAX - 7, &mut b);
    assert!(matches!(r, Err(AccessError::NoChannel { .. })), "{r:?}");
    let r = s.read_bytes(AddrKind::Buffer, IOVA, &mut b);
    assert!(matches!(r, Err(AccessError::NoChannel { .. })), "{r:?}");
    s.update(top, PAGE, UA, RW).unwrap();
    s.update(IOVA, PAGE, UA + PAGE, RW).unwrap();
    s.read_bytes(AddrKind::Buffer, IOVA, &mut b).unwrap();
    // QEMU's global flush, in two.
    s.invalidate(0, 0xfef0_0000).unwrap();
    s.invalidate(0xfef0_0000, 0xffff_ffff_0110_0000).unwrap();
    assert!(matches!(
        s.read_bytes(AddrKind::Buffer, u64::MAX - 7, &mut b),
        Err(AccessError::NoChannel { .. })
    ));
    assert!(matches!(
        s.read_bytes(AddrKind::Buffer, IOVA, &mut b),
        Err(AccessError::NoChannel { .. })
    ));
    assert_eq!(s.iotlb_len(), 0);
    // An invalidation of size 0 (QEMU's mask of all ones plus one) is the
    // whole space: a cached page stops hitting.
    s.update(IOVA, PAGE, UA + PAGE, RW).unwrap();
    s.read_bytes(AddrKind::Buffer, IOVA, &mut b).unwrap();
    s.invalidate(IOVA + 0x10_0000, 0).unwrap();
    assert!(matches!(
        s.read_bytes(AddrKind::Buffer, IOVA, &mut b),
        Err(AccessError::NoChannel { .. })
    ));
    assert_eq!(s.iotlb_len(), 0);
}

/// A new memory table while device threads hit: the old mapping is
/// unmapped only after the drain, so no access ever reads freed memory
/// (which would crash the test), and every access after the swap goes
/// through the new table.
#[test]
fn a_new_memory_table_under_load_unmaps_the_old_only_when_unused() {
    let (s, _) = space(64);
    s.update(IOVA, MEM, UA, RW).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut b = vec![0u8; PAGE as usize];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += u64::from(
                        s.read_bytes(AddrKind::Buffer, IOVA + (n % 16) * PAGE, &mut b)
                            .is_ok(),
                    );
                }
                n
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut swaps = 0;
    // Each table is a fresh 1 MiB mapping that the test helper never
    // unmaps: a few dozen swaps, not a time budget.
    while swaps < 40 && t0.elapsed() < Duration::from_secs(5) {
        let (mem, _, host) = table(c"space-swap");
        // SAFETY: a fresh mapping of MEM bytes.
        unsafe { std::ptr::write_bytes(host, swaps as u8, MEM as usize) };
        s.set_memory(mem);
        let mut b = [0u8; 4];
        s.read_bytes(AddrKind::Buffer, IOVA + 5 * PAGE, &mut b)
            .unwrap();
        assert_eq!(b, [swaps as u8; 4], "the new table is used at once");
        swaps += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let hits: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(swaps > 5 && hits > 0, "{swaps} swaps, {hits} hits");
}

/// More device threads than slots: those past the 64th enter through the
/// overflow lock, and an invalidation waits for every one of them —
/// slotted or not — that was inside its access when it began.
#[test]
fn an_invalidation_waits_for_accesses_of_threads_past_the_slots() {
    const THREADS: usize = SLOTS + 6;
    let (s, _) = space(64);
    s.update(IOVA, 2 * PAGE, UA, RW).unwrap();
    let inside = Arc::new(std::sync::Barrier::new(THREADS + 1));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (s, inside, done) = (s.clone(), inside.clone(), done.clone());
            std::thread::spawn(move || {
                let nested = s.clone();
                s.access(AddrKind::Buffer, IOVA, 8, false, &mut |_, _, _| {
                    inside.wait();
                    // Threads on the overflow lock nest once the drain
                    // waits for that lock (the slotted ones are done by
                    // then): they must not take its read side again.
                    let overflow = crate::seat::in_overflow(nested.id);
                    eprintln!("overflow {overflow}");
                    std::thread::sleep(Duration::from_millis(if overflow { 200 } else { 50 }));
                    let mut b = [0u8; 8];
                    nested.read_bytes(AddrKind::Buffer, IOVA + PAGE, &mut b)?;
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
            })
        })
        .collect();
    inside.wait();
    assert!(matches!(
        s.invalidate(IOVA, PAGE),
        Ok(IotlbOutcome::Invalidated {
            removed: 1,
            evicted: false
        })
    ));
    assert_eq!(done.load(Ordering::SeqCst), THREADS as u64);
    for t in threads {
        assert!(matches!(t.join().unwrap(), Ok(())));
    }
}

/// An access inside another access's callback (same thread, same space)
/// nests: the inner one leaves the slot to the outer, and once both are
/// done an invalidation does not wait for anything.
#[test]
fn a_nested_access_keeps_the_outer_section() {
    let (s, _) = space(64);
    s.update(IOVA, 2 * PAGE, UA, RW).unwrap();
    let inner = s.clone();
    s.access(AddrKind::Buffer, IOVA, 8, true, &mut |_, _, _| {
        let mut b = [0u8; 8];
        inner.read_bytes(AddrKind::Buffer, IOVA + PAGE, &mut b)
    })
    .unwrap();
    assert_eq!(s.readers.drain(), 0, "no section left open");
    assert!(matches!(
        s.invalidate(IOVA, 2 * PAGE),
        Ok(IotlbOutcome::Invalidated {
            removed: 1,
            evicted: false
        })
    ));
}

/// An IOVA the tests never map.
const UNMAPPED: u64 = 0x4000_0000;

/// A space whose misses go out on a socket; the other end is returned.
fn space_with_channel(miss_timeout: Duration) -> (Arc<DmaSpace>, UnixStream) {
    let (s, _) = space_with(64, miss_timeout);
    let (a, b) = UnixStream::pair().unwrap();
    s.set_channel(Some(a));
    (s, b)
}

/// The pages of the `BACKEND_IOTLB_MSG` misses waiting on `peer`.
fn misses_sent(peer: &UnixStream) -> Vec<u64> {
    use std::io::Read;
    peer.set_nonblocking(true).unwrap();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = (&*peer).read(&mut buf) {
        all.extend_from_slice(&buf[..n]);
    }
    let one = crate::proto::HEADER_LEN + m::MSG_LEN;
    assert_eq!(all.len() % one, 0);
    all.chunks(one)
        .map(|c| {
            let p = &c[crate::proto::HEADER_LEN..];
            assert_eq!(p[25], m::MISS);
            u64::from_le_bytes(p[0..8].try_into().unwrap())
        })
        .collect()
}

/// A miss whose access saw the generation move (an update for another
/// page) still asks for its page and waits for it within the bound; with
/// the bound already passed it ends at once. (Before: it returned to retry
/// without asking and without looking at the bound.)
#[test]
fn a_miss_after_an_update_for_another_page_is_still_asked_and_bounded() {
    let (s, peer) = space_with_channel(Duration::from_millis(30));
    let gen = s.generation.load(Ordering::Acquire);
    s.update(IOVA, PAGE, UA, RW).unwrap();
    let t0 = Instant::now();
    let r = s.wait_miss(UNMAPPED, 8, false, gen, &mut None);
    assert!(
        matches!(
            r,
            Err(AccessError::MissTimeout {
                iova: UNMAPPED,
                waited_ms: 30
            })
        ),
        "{r:?}"
    );
    assert!(t0.elapsed() >= Duration::from_millis(30));
    assert_eq!(misses_sent(&peer), vec![UNMAPPED]);
    // The access's deadline passed: no retry, whatever the generation.
    let mut past = Some(Instant::now());
    let r = s.wait_miss(UNMAPPED, 8, false, gen, &mut past);
    assert!(
        matches!(r, Err(AccessError::MissTimeout { iova: UNMAPPED, .. })),
        "{r:?}"
    );
    assert_eq!(s.stats().miss_timeouts, 2);
    // An update since the miss that brought the page: retry at once.
    s.update(UNMAPPED, PAGE, UA, RW).unwrap();
    let r = s.wait_miss(UNMAPPED, 8, false, gen, &mut None);
    assert!(matches!(r, Ok(())), "{r:?}");
}

/// A front-end that keeps sending updates for other pages and never
/// answers ours: the access ends with `MissTimeout` within its bound.
#[test]
fn updates_for_other_pages_never_keep_an_access_past_its_bound() {
    let (s, peer) = space_with_channel(Duration::from_millis(50));
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                s.update(IOVA + (k % 16) * PAGE, PAGE, UA + (k % 16) * PAGE, RW)
                    .unwrap();
                k += 1;
            }
        })
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    {
        let s = s.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 8];
            let _ = tx.send(s.read_bytes(AddrKind::Buffer, UNMAPPED, &mut b));
        });
    }
    let r = rx.recv_timeout(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    hammer.join().unwrap();
    assert!(
        matches!(r, Ok(Err(AccessError::MissTimeout { iova: UNMAPPED, .. }))),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(misses_sent(&peer).contains(&UNMAPPED));
}

/// Chains pointing at distinct IOVAs the front-end never maps: the set of
/// outstanding pages stays within its cap, and a page dropped from it is
/// asked again. (Before: it grew by every page asked, for the ring's life.)
#[test]
fn outstanding_misses_are_capped() {
    let (s, peer) = space_with_channel(Duration::from_secs(60));
    // A front-end that reads every miss and answers none.
    std::thread::spawn(move || {
        use std::io::Read;
        let mut b = [0u8; 4096];
        while let Ok(1..) = (&peer).read(&mut b) {}
    });
    let per = REQUEST_PREFETCH_PAGES as u64;
    for k in 0..20u64 {
        let at = UNMAPPED + k * per * PAGE;
        let r = s.prefetch(&mut std::iter::once((at, per * PAGE)), false);
        assert!(matches!(r, Some(p) if p == at + (per - 1) * PAGE), "{r:?}");
        assert!(s.miss_state().outstanding.len() <= MISS_OUTSTANDING_MAX);
    }
    assert!(s.miss_state().outstanding.len() >= MISS_OUTSTANDING_MAX / 2);
    // The first pages went; asked again, the first is outstanding again.
    assert!(!s.miss_state().outstanding.contains_key(&UNMAPPED));
    let r = s.prefetch(&mut std::iter::once((UNMAPPED, PAGE)), false);
    assert!(matches!(r, Some(UNMAPPED)), "{r:?}");
    assert!(s.miss_state().outstanding.contains_key(&UNMAPPED));
    // An update longer than 64 pages walks a capped set.
    s.update(IOVA, 128 * PAGE, UA, RW).unwrap();
    assert!(s.miss_state().outstanding.len() <= MISS_OUTSTANDING_MAX);
}

/// Entries older than the bound are dropped as new ones come.
#[test]
fn outstanding_misses_older_than_the_bound_are_dropped() {
    let (s, _peer) = space_with_channel(Duration::from_millis(5));
    s.prefetch(&mut std::iter::once((UNMAPPED, 10 * PAGE)), false);
    assert_eq!(s.miss_state().outstanding.len(), 10);
    std::thread::sleep(Duration::from_millis(20));
    let other = UNMAPPED + 100 * PAGE;
    s.prefetch(&mut std::iter::once((other, PAGE)), false);
    let st = s.miss_state();
    assert_eq!(st.outstanding.len(), 1, "{:?}", st.outstanding);
    assert!(st.outstanding.contains_key(&other));
}

/// Fills the send buffer of `a` (its `SO_SNDBUF` at the minimum) until a
/// one-byte send would block; returns the bytes written.
fn fill(a: &UnixStream) -> usize {
    let one: libc::c_int = 1;
    // SAFETY: sets one int option on our socket.
    unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let mut n = 0;
    for chunk in [4096usize, 1] {
        let b = vec![0u8; chunk];
        loop {
            // SAFETY: sends from a live buffer.
            let r =
                unsafe { libc::send(a.as_raw_fd(), b.as_ptr().cast(), chunk, libc::MSG_DONTWAIT) };
            if r <= 0 {
                break;
            }
            n += r as usize;
        }
    }
    n
}

/// A front-end that does not read the back-end channel: the miss is not
/// sent (nothing of it), the access fails within its bound with
/// `ChannelFull` and its page is no longer outstanding; once the
/// front-end reads again, the next miss goes out whole.
/// (Before: `write_all` under `SO_SNDTIMEO`, `NoChannel`.)
#[test]
fn a_channel_the_front_end_does_not_read_fails_the_miss_whole_and_stays_usable() {
    let (s, _) = space_with(64, Duration::from_millis(100));
    let (a, b) = UnixStream::pair().unwrap();
    let junk = fill(&a);
    s.set_channel(Some(a));
    let t = Instant::now();
    let mut buf = [0u8; 8];
    let e = s
        .read_bytes(AddrKind::Buffer, UNMAPPED, &mut buf)
        .unwrap_err();
    assert!(
        matches!(
            e,
            AccessError::ChannelFull {
                iova: UNMAPPED,
                waited_ms: 100
            }
        ),
        "{e:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(!s.miss_state().outstanding.contains_key(&UNMAPPED));
    assert_eq!((s.stats().channel_full, s.stats().channel_broken), (1, 0));
    assert_eq!(s.stats().misses, 0);
    // The front-end reads the stream: exactly the junk, no part of a miss.
    {
        use std::io::Read;
        let mut got = vec![0u8; junk];
        (&b).read_exact(&mut got).unwrap();
        assert_eq!(got, vec![0u8; junk]);
    }
    // Now the miss goes out whole (and is not answered).
    let e = s
        .read_bytes(AddrKind::Buffer, UNMAPPED, &mut buf)
        .unwrap_err();
    assert!(
        matches!(e, AccessError::MissTimeout { iova: UNMAPPED, .. }),
        "{e:?}"
    );
    assert_eq!(misses_sent(&b), vec![UNMAPPED]);
}

/// A burst of misses the front-end reads none of: it cannot all go out
/// within the bound, and the part that did ends inside a message — the
/// channel is given up (the front-end would read the rest as garbage),
/// the failure is `ChannelBroken`, every later miss fails so at once,
/// and what the stream holds is whole messages and one partial one,
/// never followed by another. A new channel serves again.
/// (Before: a partial `write_all` left half a message and the next burst
/// wrote after it.)
#[test]
fn a_miss_sent_in_part_gives_the_channel_up_and_later_misses_fail_at_once() {
    // A miss that waited would take the whole miss timeout: a second,
    // far above what a loaded machine adds to an answer given at once.
    let miss_timeout = Duration::from_secs(1);
    let (s, _) = space_with(64, miss_timeout);
    let (a, b) = UnixStream::pair().unwrap();
    let one: libc::c_int = 1;
    // SAFETY: sets one int option on our socket.
    unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    s.set_channel(Some(a));
    let pages = REQUEST_PREFETCH_PAGES as u64;
    let r = s.prefetch(&mut std::iter::once((UNMAPPED, pages * PAGE)), false);
    assert_eq!(r, None, "nothing to wait for: the burst failed");
    let st = s.stats();
    assert_eq!((st.channel_broken, st.channel_full), (1, 0), "{st:?}");
    // Later misses fail at once, typed.
    let t = Instant::now();
    let mut buf = [0u8; 8];
    let e = s
        .read_bytes(AddrKind::Buffer, UNMAPPED, &mut buf)
        .unwrap_err();
    assert!(
        matches!(e, AccessError::ChannelBroken { iova: UNMAPPED, .. }),
        "{e:?}"
    );
    assert!(t.elapsed() < miss_timeout / 2, "{:?}", t.elapsed());
    // The stream: whole messages, then part of one, and nothing after it.
    let msg = crate::proto::HEADER_LEN + m::MSG_LEN;
    let mut got = Vec::new();
    {
        use std::io::Read;
        b.set_nonblocking(true).unwrap();
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = (&b).read(&mut chunk) {
            got.extend_from_slice(&chunk[..n]);
        }
    }
    assert_ne!(got.len() % msg, 0, "{} bytes", got.len());
    assert_eq!(st.misses, (got.len() / msg) as u64);
    // No page the burst did not send whole is left outstanding.
    let sent: Vec<u64> = (0..got.len() / msg)
        .map(|k| UNMAPPED + k as u64 * PAGE)
        .collect();
    let st = s.miss_state();
    assert!(st.outstanding.keys().all(|pg| sent.contains(pg)));
    drop(st);
    // A new channel: misses go out again.
    let (a2, b2) = UnixStream::pair().unwrap();
    s.set_channel(Some(a2));
    let other = UNMAPPED + 4 * pages * PAGE;
    let e = s.read_bytes(AddrKind::Buffer, other, &mut buf).unwrap_err();
    assert!(matches!(e, AccessError::MissTimeout { .. }), "{e:?}");
    assert_eq!(misses_sent(&b2), vec![other]);
}

/// A prefetch over segments whose pages are all cached never meets the
/// 512 missing pages that ended its scan: it looks at a bounded number of
/// pages however many segments a chain names, in short sections, so a
/// concurrent invalidation is acknowledged without waiting for the scan.
/// (Before: every page of every segment was looked at, inside one
/// section: for this chain, 2^26 lookups.)
#[test]
fn a_prefetch_over_cached_pages_looks_at_a_bounded_number_of_them() {
    let (s, _) = space_with(64, Duration::from_millis(50));
    s.update(IOVA, PAGE, UA, RW).unwrap();
    assert!(s.cache.lookup(IOVA, false).is_some());
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let s = s.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = s.prefetch(&mut std::iter::repeat_n((IOVA, PAGE), 1 << 26), false);
            let _ = tx.send((r, t.elapsed()));
        });
    }
    let (r, took) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the scan is bounded");
    assert_eq!(r, None);
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// Without a back-end channel a request's look-ahead asks nothing and
/// leaves nothing outstanding, so the request does not wait for an
/// answer that cannot come; its access fails at once with `NoChannel`.
/// (Before: the pages stayed outstanding and the request slept out the
/// whole miss bound first.)
#[test]
fn without_a_channel_nothing_is_left_outstanding_and_the_access_fails_at_once() {
    let (s, _) = space_with(64, Duration::from_secs(2));
    let r = s.prefetch(&mut std::iter::once((UNMAPPED, 4 * PAGE)), false);
    assert_eq!(r, None);
    assert!(s.miss_state().outstanding.is_empty());
    let t = Instant::now();
    let mut buf = [0u8; 8];
    let e = s
        .read_bytes(AddrKind::Buffer, UNMAPPED, &mut buf)
        .unwrap_err();
    assert!(
        matches!(e, AccessError::NoChannel { iova: UNMAPPED, .. }),
        "{e:?}"
    );
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert!(s.miss_state().outstanding.is_empty());
}
