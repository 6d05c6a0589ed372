//! The vhost-user-net back-end's queues under a fake front-end (socket
//! pairs, a memfd as guest memory, IOVA == offset): frames go both ways
//! through the device IOTLB; every bad chain is dropped and counted and
//! the queue goes on; a frame whose buffer's translation was invalidated
//! is never sent.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softiommu_vhost::proto::{iotlb as m, pf, req, vf};
use softiommu_vhost::testing;
use softiommu_vhost::{
    MsgError, NetBackend, NetBackendConfig, NetStats, SessionEnd, SessionReport,
};
use softiommu_virtio::net::{wire, WireConfig, WirePort, WireStats};

const MEM_BYTES: usize = 1 << 20;
const UA: u64 = 0x7f00_0000_0000;
const NUM: u16 = 8;
/// Ring bases: queue 0 receives, queue 1 transmits.
const RING: [u64; 2] = [0x10000, 0x11000];
const BUF: u64 = 0x20000;
const HDR: usize = 12;

fn eventfd() -> OwnedFd {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

struct Fe {
    sock: UnixStream,
    _chan: UnixStream,
    mem: *mut u8,
    kick: [OwnedFd; 2],
    call: [OwnedFd; 2],
    next_avail: [u16; 2],
    report: mpsc::Receiver<SessionReport>,
    peer: WirePort,
    wire: WireStats,
}

use testing::desc;

/// A `vhost_vring_state` payload: ring `i`, value `v`.
fn state(i: u32, v: u32) -> [u8; 8] {
    (u64::from(i) | (u64::from(v) << 32)).to_le_bytes()
}

/// A frame of `len` bytes: broadcast destination, a source, IPv4 type, a pattern.
fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    for (i, b) in f[14..].iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
    f
}

impl Fe {
    fn start(miss_timeout: Duration) -> Self {
        Self::start_on(miss_timeout, WireConfig::default())
    }

    /// [`Fe::start`] over a wire of shape `wire_cfg`.
    fn start_on(miss_timeout: Duration, wire_cfg: WireConfig) -> Self {
        let (a, b, st) = wire(wire_cfg);
        let cfg = NetBackendConfig {
            miss_timeout,
            ..NetBackendConfig::default()
        };
        let backend = NetBackend::new(cfg, a).unwrap();
        let (sock, be) = UnixStream::pair().unwrap();
        let (tx, report) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(backend.serve(be));
        });
        let (memfd, mem) = testing::shared_memory(c"softiommu-net-test", MEM_BYTES).unwrap();
        let (chan, be_chan) = UnixStream::pair().unwrap();
        let fe = Fe {
            sock,
            _chan: chan,
            mem,
            kick: [eventfd(), eventfd()],
            call: [eventfd(), eventfd()],
            next_avail: [0, 0],
            report,
            peer: b,
            wire: st,
        };
        testing::send(&fe.sock, req::GET_QUEUE_NUM, &[], &[], false).unwrap();
        let (_, _, q) = testing::recv(&fe.sock).unwrap();
        assert_eq!(u64::from_le_bytes(q.try_into().unwrap()), 2);
        let want = vf::VERSION_1 | vf::ACCESS_PLATFORM | vf::PROTOCOL_FEATURES;
        assert_eq!(fe.ack(req::SET_FEATURES, &want.to_le_bytes(), &[]), 0);
        let p = pf::REPLY_ACK | pf::BACKEND_REQ;
        assert_eq!(fe.ack(req::SET_PROTOCOL_FEATURES, &p.to_le_bytes(), &[]), 0);
        assert_eq!(
            fe.ack(req::SET_BACKEND_REQ_FD, &[], &[be_chan.as_raw_fd()]),
            0
        );
        drop(be_chan);
        let mut t = Vec::new();
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(&0u32.to_le_bytes());
        for v in [0u64, MEM_BYTES as u64, UA, 0] {
            t.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(fe.ack(req::SET_MEM_TABLE, &t, &[memfd.as_raw_fd()]), 0);
        fe.iotlb(m::UPDATE, 0, MEM_BYTES as u64, UA);
        for q in 0..2 {
            fe.start_ring(q);
        }
        fe
    }

    fn ack(&self, request: u32, payload: &[u8], fds: &[i32]) -> u64 {
        testing::send(&self.sock, request, payload, fds, true).unwrap();
        let (code, _, p) = testing::recv(&self.sock).unwrap();
        assert_eq!(code, request);
        u64::from_le_bytes(p.try_into().unwrap())
    }

    fn iotlb(&self, kind: u8, iova: u64, size: u64, uaddr: u64) {
        let mut p = [0u8; m::MSG_LEN];
        p[0..8].copy_from_slice(&iova.to_le_bytes());
        p[8..16].copy_from_slice(&size.to_le_bytes());
        p[16..24].copy_from_slice(&uaddr.to_le_bytes());
        p[24] = m::ACCESS_RW;
        p[25] = kind;
        assert_eq!(self.ack(req::IOTLB_MSG, &p, &[]), 0);
    }

    fn start_ring(&self, q: usize) {
        let i = q as u32;
        let state = |v: u32| (u64::from(i) | (u64::from(v) << 32)).to_le_bytes();
        assert_eq!(self.ack(req::SET_VRING_NUM, &state(NUM.into()), &[]), 0);
        assert_eq!(self.ack(req::SET_VRING_BASE, &state(0), &[]), 0);
        let mut a = Vec::new();
        a.extend_from_slice(&i.to_le_bytes());
        a.extend_from_slice(&0u32.to_le_bytes());
        for v in [RING[q], RING[q] + 0x200, RING[q] + 0x100, 0] {
            a.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(self.ack(req::SET_VRING_ADDR, &a, &[]), 0);
        let idx = u64::from(i).to_le_bytes();
        assert_eq!(
            self.ack(req::SET_VRING_CALL, &idx, &[self.call[q].as_raw_fd()]),
            0
        );
        assert_eq!(
            self.ack(req::SET_VRING_KICK, &idx, &[self.kick[q].as_raw_fd()]),
            0
        );
        assert_eq!(self.ack(req::SET_VRING_ENABLE, &state(1), &[]), 0);
    }

    /// Stops ring `q` (`GET_VRING_BASE`, as QEMU does before changing it).
    fn stop_ring(&self, q: u32) {
        testing::send(&self.sock, req::GET_VRING_BASE, &state(q, 0), &[], false).unwrap();
        let (code, _, _) = testing::recv(&self.sock).unwrap();
        assert_eq!(code, req::GET_VRING_BASE);
    }

    /// Starts ring `q` again after [`Fe::stop_ring`] (its kick, enabled)
    /// and maps the memory again (the stop dropped the IOTLB).
    fn restart_ring(&self, q: usize) {
        let idx = (q as u64).to_le_bytes();
        assert_eq!(
            self.ack(req::SET_VRING_KICK, &idx, &[self.kick[q].as_raw_fd()]),
            0
        );
        assert_eq!(self.ack(req::SET_VRING_ENABLE, &state(q as u32, 1), &[]), 0);
        self.iotlb(m::UPDATE, 0, MEM_BYTES as u64, UA);
    }

    fn poke(&self, off: u64, bytes: &[u8]) {
        assert!(off as usize + bytes.len() <= MEM_BYTES);
        // SAFETY: inside the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.add(off as usize), bytes.len())
        };
    }

    fn peek(&self, off: u64, len: usize) -> Vec<u8> {
        assert!(off as usize + len <= MEM_BYTES);
        let mut v = vec![0u8; len];
        // SAFETY: inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.add(off as usize), v.as_mut_ptr(), len) };
        v
    }

    /// Puts descriptors `descs` at slots 0.. of queue `q`'s table, offers
    /// head 0 and kicks.
    fn offer(&mut self, q: usize, descs: &[[u8; 16]]) {
        for (i, d) in descs.iter().enumerate() {
            self.poke(RING[q] + 16 * i as u64, d);
        }
        let slot = u64::from(self.next_avail[q] % NUM);
        self.poke(RING[q] + 0x100 + 4 + 2 * slot, &0u16.to_le_bytes());
        self.next_avail[q] = self.next_avail[q].wrapping_add(1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.poke(RING[q] + 0x100 + 2, &self.next_avail[q].to_le_bytes());
        let one = 1u64;
        // SAFETY: 8 bytes to an eventfd.
        unsafe { libc::write(self.kick[q].as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Offers each of `bufs` (header and frame) as a one-descriptor
    /// transmit chain, all at once (table slots and buffers 0..), with one
    /// kick.
    fn offer_frames(&mut self, bufs: &[Vec<u8>]) {
        assert!(bufs.len() <= usize::from(NUM));
        for (i, b) in bufs.iter().enumerate() {
            let at = BUF + 0x800 * i as u64;
            self.poke(at, b);
            self.poke(RING[1] + 16 * i as u64, &desc(at, b.len() as u32, 0, 0));
            let slot = u64::from(self.next_avail[1].wrapping_add(i as u16) % NUM);
            self.poke(RING[1] + 0x100 + 4 + 2 * slot, &(i as u16).to_le_bytes());
        }
        self.next_avail[1] = self.next_avail[1].wrapping_add(bufs.len() as u16);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.poke(RING[1] + 0x100 + 2, &self.next_avail[1].to_le_bytes());
        let one = 1u64;
        // SAFETY: 8 bytes to an eventfd.
        unsafe { libc::write(self.kick[1].as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Waits (bounded) until queue `q`'s used index is `n`; returns the
    /// last used entry's length.
    fn wait_used(&self, q: usize, n: u16) -> u32 {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let v = self.peek(RING[q] + 0x200 + 2, 2);
            if u16::from_le_bytes([v[0], v[1]]) == n {
                let slot = u64::from(n.wrapping_sub(1) % NUM);
                let e = self.peek(RING[q] + 0x200 + 4 + 8 * slot + 4, 4);
                return u32::from_le_bytes(e.try_into().unwrap());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("queue {q}: used index never reached {n}");
    }

    /// Offers a transmit chain of a header and `f` split in two, waits for it.
    fn send_frame(&mut self, f: &[u8]) {
        let mut b = vec![0u8; HDR];
        b[3] = 0; // gso_type NONE
        b.extend_from_slice(f);
        self.poke(BUF, &b);
        let cut = 20u32;
        let n = self.next_avail[1].wrapping_add(1);
        self.offer(
            1,
            &[
                desc(BUF, cut, 1, 1),
                desc(BUF + u64::from(cut), b.len() as u32 - cut, 0, 0),
            ],
        );
        assert_eq!(self.wait_used(1, n), 0);
    }

    /// The frames the peer has (waits a little for the first).
    fn peer_frames(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            while let Ok(f) = self.peer.rx.peek() {
                out.push(f.to_vec());
                self.peer.rx.consume();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        out
    }

    fn peer_send(&mut self, f: &[u8]) {
        let mut s = self.peer.tx.reserve().expect("a free slot");
        s.buf()[..f.len()].copy_from_slice(f);
        s.commit(f.len());
    }

    fn finish(self) -> SessionReport {
        drop(self.sock);
        let r = self
            .report
            .recv_timeout(Duration::from_secs(10))
            .expect("the session ends");
        assert!(matches!(r.end, SessionEnd::Disconnected), "{:?}", r.end);
        r
    }
}

#[test]
fn frames_cross_both_ways_through_the_device_iotlb() {
    let mut fe = Fe::start(Duration::from_millis(500));
    let out = frame(100, 7);
    fe.send_frame(&out);
    assert_eq!(fe.peer_frames(), vec![out.clone()]);
    // Receive: a buffer in two writable pieces, then a frame from the peer.
    let inn = frame(300, 9);
    fe.poke(BUF + 0x1000, &[0xaa; 2048]);
    fe.offer(
        0,
        &[
            desc(BUF + 0x1000, 8, 2 | 1, 1),
            desc(BUF + 0x1008, 1518, 2, 0),
        ],
    );
    fe.peer_send(&inn);
    assert_eq!(fe.wait_used(0, 1), (HDR + inn.len()) as u32);
    let got = fe.peek(BUF + 0x1000, HDR + inn.len());
    assert_eq!(&got[HDR..], &inn[..]);
    assert_eq!(&got[10..12], &1u16.to_le_bytes(), "num_buffers 1");
    assert_eq!(&got[..10], &[0u8; 10]);
    let r = fe.finish();
    let n = r.net;
    assert_eq!(
        (n.tx_frames, n.tx_bytes, n.rx_frames, n.rx_bytes),
        (1, 100, 1, 300),
        "{n:?}"
    );
    assert_eq!(
        NetStats {
            worker_cpu_ns: 0,
            ..n
        },
        NetStats {
            tx_frames: 1,
            tx_bytes: 100,
            rx_frames: 1,
            rx_bytes: 300,
            ..NetStats::default()
        }
    );
}

#[test]
fn bad_transmit_chains_are_dropped_counted_and_the_queue_goes_on() {
    let mut fe = Fe::start(Duration::from_millis(500));
    let mut hdr_gso = vec![0u8; HDR];
    hdr_gso[1] = 1; // gso_type TCPV4: an offload not offered
    hdr_gso.extend_from_slice(&frame(60, 1));
    fe.poke(BUF + 0x2000, &hdr_gso);
    let bad: [&[[u8; 16]]; 6] = [
        // A writable descriptor in a transmit chain.
        &[desc(BUF, 12 + 60, 2, 0)],
        // Shorter than header plus Ethernet header.
        &[desc(BUF, 12 + 13, 0, 0)],
        // Longer than a doubly tagged header and an IP packet's 16-bit
        // length (the most a driver told no MTU may send) plus header.
        &[desc(BUF, 12 + 14 + 8 + 65_535 + 1, 0, 0)],
        // An offload in the header.
        &[desc(BUF + 0x2000, hdr_gso.len() as u32, 0, 0)],
        // A loop: 0 -> 1 -> 0.
        &[desc(BUF, 40, 1, 1), desc(BUF + 40, 40, 1, 0)],
        // A next index past the ring.
        &[desc(BUF, 40, 1, NUM), desc(BUF + 40, 40, 0, 0)],
    ];
    for (i, d) in bad.iter().enumerate() {
        fe.offer(1, d);
        assert_eq!(fe.wait_used(1, i as u16 + 1), 0);
    }
    // A frame a driver may send but longer than the wire's slots (1,522
    // bytes): dropped unread and counted apart, not as the driver's fault.
    fe.offer(1, &[desc(BUF, 12 + 4000, 0, 0)]);
    assert_eq!(fe.wait_used(1, bad.len() as u16 + 1), 0);
    // A full frame with an 802.1Q tag fits the slots and goes.
    let tagged = frame(1518, 4);
    fe.send_frame(&tagged);
    let good = frame(64, 3);
    fe.send_frame(&good);
    assert_eq!(fe.peer_frames(), vec![tagged, good]);
    let n = fe.finish().net;
    assert_eq!(
        (n.tx_bad, n.tx_oversize, n.tx_frames, n.ring_faults),
        (6, 1, 2, 0),
        "{n:?}"
    );
}

#[test]
fn bad_and_small_receive_buffers_are_counted_and_the_next_buffer_gets_the_frame() {
    let mut fe = Fe::start(Duration::from_millis(500));
    let f1 = frame(200, 5);
    let f2 = frame(60, 6);
    fe.peer_send(&f1);
    fe.peer_send(&f2);
    // A device-readable buffer: bad, completed with 0, f1 kept.
    fe.offer(0, &[desc(BUF, 1526, 0, 0)]);
    assert_eq!(fe.wait_used(0, 1), 0);
    // Too small for f1 (200 + 12 > 100): f1 dropped and the buffer given
    // back unused, so the next frame, f2 (60 + 12), lands in it: its used
    // entry is the next one, with f2's length, not a 0 for f1.
    fe.offer(0, &[desc(BUF, 100, 2, 0)]);
    assert_eq!(fe.wait_used(0, 2), (HDR + f2.len()) as u32);
    assert_eq!(fe.peek(BUF + HDR as u64, f2.len()), f2);
    let n = fe.finish().net;
    assert_eq!(
        (n.rx_bad, n.rx_dropped, n.rx_frames, n.rx_bytes),
        (1, 1, 1, 60),
        "{n:?}"
    );
}

#[test]
fn a_paced_wire_keeps_the_drivers_frames_in_the_ring_and_drops_none() {
    // 20 kbit/s: a 64-byte frame (88 bytes on the line with preamble,
    // FCS and gap) holds it 35.2 ms; the wire queues two. Six frames
    // offered at once must all go, in order, the back-end waiting for the
    // line rather than dropping at the wire (the reader below has a whole
    // frame time to take each).
    let cfg = WireConfig {
        capacity: 2,
        line_rate_bps: 20_000,
        ..WireConfig::default()
    };
    let mut fe = Fe::start_on(Duration::from_millis(500), cfg);
    let frames: Vec<Vec<u8>> = (0..6).map(|i| frame(64, i)).collect();
    let bufs: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let mut b = vec![0u8; HDR];
            b.extend_from_slice(f);
            b
        })
        .collect();
    fe.offer_frames(&bufs);
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < frames.len() && t.elapsed() < Duration::from_secs(10) {
        while let Ok(f) = fe.peer.rx.peek() {
            got.push(f.to_vec());
            fe.peer.rx.consume();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(got, frames);
    assert_eq!(fe.wait_used(1, 6), 0);
    let wire = fe.wire.a_to_b();
    let r = fe.finish();
    assert_eq!((r.net.tx_frames, r.net.tx_wire_full), (6, 0), "{:?}", r.net);
    assert_eq!((wire.sent, wire.dropped), (6, 0));
}

#[test]
fn runts_from_the_peer_are_dropped_before_any_buffer_and_a_bare_header_arrives() {
    let mut fe = Fe::start(Duration::from_millis(500));
    fe.peer_send(&[]);
    fe.peer_send(&[0x11]);
    fe.peer_send(&[0x22; 13]);
    let bare = frame(14, 7);
    fe.peer_send(&bare);
    fe.offer(0, &[desc(BUF, 1526, 2, 0)]);
    assert_eq!(fe.wait_used(0, 1), (HDR + 14) as u32);
    assert_eq!(fe.peek(BUF + HDR as u64, 14), bare);
    let n = fe.finish().net;
    assert_eq!(
        (n.rx_runts, n.rx_bad, n.rx_dropped, n.rx_frames, n.rx_bytes),
        (3, 0, 0, 1, 14),
        "{n:?}"
    );
}

#[test]
fn a_frame_whose_buffer_invalidation_was_acknowledged_is_never_sent() {
    let mut fe = Fe::start(Duration::from_millis(100));
    let secret = frame(80, 0x42);
    let mut b = vec![0u8; HDR];
    b.extend_from_slice(&secret);
    fe.poke(BUF, &b);
    // Acknowledged: from here on the back-end must not read the page.
    fe.iotlb(m::INVALIDATE, BUF, 0x1000, 0);
    fe.offer(1, &[desc(BUF, b.len() as u32, 0, 0)]);
    assert_eq!(fe.wait_used(1, 1), 0);
    assert!(fe.peer_frames().is_empty());
    // The queue goes on: a frame from a mapped page is sent.
    let ok = frame(70, 1);
    let mut b2 = vec![0u8; HDR];
    b2.extend_from_slice(&ok);
    fe.poke(BUF + 0x1000, &b2);
    fe.offer(1, &[desc(BUF + 0x1000, b2.len() as u32, 0, 0)]);
    assert_eq!(fe.wait_used(1, 2), 0);
    assert_eq!(fe.peer_frames(), vec![ok]);
    let wire = fe.wire.a_to_b();
    let r = fe.finish();
    assert_eq!((r.net.tx_faults, r.net.tx_frames), (1, 1), "{:?}", r.net);
    assert_eq!(r.iotlb.miss_timeouts, 1, "{:?}", r.iotlb);
    assert_eq!(wire.sent, 1);
}

#[test]
fn a_descriptor_table_wrapping_past_2_pow_64_is_refused_when_the_ring_starts_and_the_session_goes_on(
) {
    let mut fe = Fe::start(Duration::from_millis(100));
    // Stop the transmit ring and move its descriptor table to the top of
    // the address space (16-byte aligned, so SET_VRING_ADDR takes it).
    fe.stop_ring(1);
    let addr = |d: u64| {
        let mut a = Vec::new();
        a.extend_from_slice(&1u32.to_le_bytes());
        a.extend_from_slice(&0u32.to_le_bytes());
        for v in [d, RING[1] + 0x200, RING[1] + 0x100, 0] {
            a.extend_from_slice(&v.to_le_bytes());
        }
        a
    };
    assert_eq!(fe.ack(req::SET_VRING_ADDR, &addr(u64::MAX - 15), &[]), 0);
    // The ring's table (NUM descriptors) would run past 2^64: the shared
    // ring code refuses the layout before the worker computes an address.
    let idx = 1u64.to_le_bytes();
    assert_eq!(
        fe.ack(req::SET_VRING_KICK, &idx, &[fe.kick[1].as_raw_fd()]),
        1
    );
    // Corrected, the ring starts and serves.
    assert_eq!(fe.ack(req::SET_VRING_ADDR, &addr(RING[1]), &[]), 0);
    fe.restart_ring(1);
    let good = frame(64, 9);
    fe.send_frame(&good);
    assert_eq!(fe.peer_frames(), vec![good]);
    let r = fe.finish();
    assert_eq!((r.net.tx_faults, r.net.tx_frames), (0, 1), "{:?}", r.net);
    assert_eq!(r.rejected_messages, 1);
    assert!(
        matches!(
            &r.last_rejection,
            Some(MsgError::Invalid { name: "SET_VRING_KICK", what })
                if what.contains("descriptor table at 0xfffffffffffffff0")
                    && what.contains("runs past the end of the 64-bit address space")
        ),
        "{:?}",
        r.last_rejection
    );
}

/// A driver without `VERSION_1` (a legacy one: a 10-byte header) cannot
/// start a ring: its frames would be read two bytes short and delivered
/// behind two stray bytes. Refused at `SET_VRING_KICK`, the exact reason
/// kept; acknowledged again with it, the ring starts and serves.
#[test]
fn a_ring_without_version_1_is_refused_when_it_starts() {
    let mut fe = Fe::start(Duration::from_millis(100));
    fe.stop_ring(1);
    let legacy = vf::ACCESS_PLATFORM | vf::PROTOCOL_FEATURES;
    assert_eq!(fe.ack(req::SET_FEATURES, &legacy.to_le_bytes(), &[]), 0);
    let idx = 1u64.to_le_bytes();
    assert_eq!(
        fe.ack(req::SET_VRING_KICK, &idx, &[fe.kick[1].as_raw_fd()]),
        1
    );
    let modern = legacy | vf::VERSION_1;
    assert_eq!(fe.ack(req::SET_FEATURES, &modern.to_le_bytes(), &[]), 0);
    fe.restart_ring(1);
    let good = frame(64, 3);
    fe.send_frame(&good);
    assert_eq!(fe.peer_frames(), vec![good]);
    let r = fe.finish();
    assert_eq!(r.rejected_messages, 1);
    assert!(
        matches!(
            &r.last_rejection,
            Some(MsgError::Invalid { name: "SET_VRING_KICK", what })
                if what == &format!("ring started without required features {:#x}", vf::VERSION_1)
        ),
        "{:?}",
        r.last_rejection
    );
}

/// A started but disabled transmit ring takes the driver's frames and
/// discards them unread (vhost-user "Ring states"), so the driver's queue
/// does not stall; enabled again, frames go onto the wire.
#[test]
fn a_disabled_transmit_ring_completes_frames_without_sending_them() {
    let mut fe = Fe::start(Duration::from_millis(100));
    assert_eq!(fe.ack(req::SET_VRING_ENABLE, &state(1, 0), &[]), 0);
    fe.send_frame(&frame(90, 1));
    assert_eq!(fe.peer_frames(), Vec::<Vec<u8>>::new());
    assert_eq!(fe.ack(req::SET_VRING_ENABLE, &state(1, 1), &[]), 0);
    let good = frame(90, 2);
    fe.send_frame(&good);
    assert_eq!(fe.peer_frames(), vec![good]);
    let r = fe.finish();
    assert_eq!(
        (r.net.tx_discarded, r.net.tx_frames, r.net.tx_bad),
        (1, 1, 0),
        "{:?}",
        r.net
    );
}

/// A head past the descriptor table: the transmit ring stops serving at
/// its entry (a used entry could never return it), counted once; the
/// session goes on and the other ring still serves.
#[test]
fn a_head_past_the_table_stops_its_ring_and_the_other_ring_serves() {
    let mut fe = Fe::start(Duration::from_millis(100));
    let slot = u64::from(fe.next_avail[1] % NUM);
    fe.poke(RING[1] + 0x100 + 4 + 2 * slot, &0xffffu16.to_le_bytes());
    fe.next_avail[1] = fe.next_avail[1].wrapping_add(1);
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    fe.poke(RING[1] + 0x100 + 2, &fe.next_avail[1].to_le_bytes());
    let one = 1u64;
    // SAFETY: 8 bytes to an eventfd.
    unsafe { libc::write(fe.kick[1].as_raw_fd(), (&one as *const u64).cast(), 8) };
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(fe.peek(RING[1] + 0x200 + 2, 2), 0u16.to_le_bytes());
    // Receive still works.
    let f = frame(70, 4);
    fe.poke(BUF, &[0u8; 256]);
    fe.offer(0, &[desc(BUF, 256, 2, 0)]);
    fe.peer_send(&f);
    assert_eq!(fe.wait_used(0, 1), (HDR + f.len()) as u32);
    assert_eq!(fe.peek(BUF + HDR as u64, f.len()), f);
    let r = fe.finish();
    assert_eq!(r.fds.bad_heads, 1, "{:?}", r.fds);
    assert_eq!(r.net.tx_bad, 0);
}

/// A semaphore-mode eventfd as a kick (each read takes one of a count
/// the front-end sets: one write of 2^64 - 2 would wake the worker that
/// many times) is refused, where the kernel names the mode.
#[test]
fn a_semaphore_mode_kick_is_refused() {
    let fe = Fe::start(Duration::from_millis(100));
    // SAFETY: plain syscall; the result is checked.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor we own.
    let sem = unsafe { OwnedFd::from_raw_fd(raw) };
    let named = std::fs::read_to_string(format!("/proc/self/fdinfo/{raw}"))
        .unwrap()
        .contains("eventfd-semaphore:");
    if !named {
        eprintln!("skipped: this kernel does not name an eventfd's mode");
        return;
    }
    let idx = 1u64.to_le_bytes();
    assert_eq!(fe.ack(req::SET_VRING_KICK, &idx, &[sem.as_raw_fd()]), 1);
    let r = fe.finish();
    assert!(
        matches!(
            &r.last_rejection,
            Some(MsgError::BadFdKind { name: "SET_VRING_KICK", reason })
                if reason.starts_with("a semaphore-mode eventfd")
        ),
        "{:?}",
        r.last_rejection
    );
}
