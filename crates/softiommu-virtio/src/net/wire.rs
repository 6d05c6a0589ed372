//! A wire between two network devices: one bounded frame channel per
//! direction, a line rate, and a drop counter.
//!
//! Each direction is a single-producer single-consumer ring of
//! preallocated frame slots (no allocation and no lock per frame): the
//! transmitting device copies a frame from guest memory straight into a
//! slot, the receiving device copies it from the slot into a guest receive
//! buffer. A full ring drops the frame and counts it, as a switch port
//! whose queue overflows would: never an error, never a wait. A frame
//! claimed longer than a slot is dropped and counted too, never cut.
//!
//! The line rate (bits per second, 0 for unlimited) is modelled as
//! serialisation: each frame occupies the line for its bits (Ethernet's
//! preamble, FCS and inter-frame gap included), frames leave back to
//! back, and a frame is delivered only once its last bit has arrived. The
//! transmitting device asks [`WireTx::busy_until`] and holds back while
//! the line is busy, so a fast sender is paced rather than dropped.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Per-frame overhead on an Ethernet line, bytes: preamble and start
/// delimiter (8), FCS (4), inter-frame gap (12) — IEEE 802.3.
pub const ETHERNET_OVERHEAD: u64 = 24;

/// How to build a wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireConfig {
    /// Frames each direction holds before it drops.
    pub capacity: usize,
    /// Line rate in bits per second; 0 is unlimited.
    pub line_rate_bps: u64,
    /// The largest frame a slot holds (Ethernet header included).
    pub max_frame: usize,
}

impl Default for WireConfig {
    fn default() -> Self {
        Self {
            capacity: 512,
            line_rate_bps: 0,
            // A full Ethernet frame with two VLAN tags.
            max_frame: crate::spec::net::ETH_HLEN + crate::spec::net::TAGS_HLEN + 1500,
        }
    }
}

/// Serialisation timing of one direction: when the line is next free.
/// Pure arithmetic on nanosecond timestamps, so it can be tested without a
/// clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacer {
    rate_bps: u64,
    busy_until_ns: u64,
}

impl Pacer {
    /// A pacer for `rate_bps` (0: unlimited).
    pub fn new(rate_bps: u64) -> Self {
        Self {
            rate_bps,
            busy_until_ns: 0,
        }
    }

    /// Nanoseconds a frame of `len` bytes occupies the line.
    pub fn frame_ns(&self, len: usize) -> u64 {
        if self.rate_bps == 0 {
            return 0;
        }
        let bits = (len as u64)
            .saturating_add(ETHERNET_OVERHEAD)
            .saturating_mul(8);
        // Rounded up, so a line is never faster than its rate.
        let ns = u128::from(bits) * 1_000_000_000u128;
        ns.div_ceil(u128::from(self.rate_bps))
            .min(u128::from(u64::MAX)) as u64
    }

    /// Sends a frame of `len` bytes at `now_ns`: returns when its last bit
    /// arrives (it starts when the line is free, or now).
    pub fn send(&mut self, now_ns: u64, len: usize) -> u64 {
        let start = self.busy_until_ns.max(now_ns);
        self.busy_until_ns = start.saturating_add(self.frame_ns(len));
        self.busy_until_ns
    }

    /// When the line is free again.
    pub fn busy_until_ns(&self) -> u64 {
        self.busy_until_ns
    }
}

/// One frame slot.
struct Slot {
    data: UnsafeCell<Box<[u8]>>,
    len: UnsafeCell<usize>,
    arrive_ns: UnsafeCell<u64>,
}

/// One direction.
struct Lane {
    slots: Box<[Slot]>,
    /// Next slot the consumer reads (written by the consumer only).
    head: crossbeam_utils::CachePadded<AtomicUsize>,
    /// Next slot the producer fills (written by the producer only).
    tail: crossbeam_utils::CachePadded<AtomicUsize>,
    sent: AtomicU64,
    dropped: AtomicU64,
    oversize: AtomicU64,
    delivered: AtomicU64,
    /// The receiving device's thread, woken per frame.
    receiver: OnceLock<Thread>,
    epoch: Instant,
    /// Bytes per slot.
    max_frame: usize,
}

// SAFETY: the slots' cells are shared between exactly one producer and one
// consumer (`WireTx` and `WireRx` are neither `Clone` nor `Sync`-shared),
// and the head/tail protocol gives each slot to one of them at a time: the
// producer writes slot `tail % n` only while `tail - head < n` (it is not
// in the consumer's window) and publishes it with a Release store of
// `tail`; the consumer reads slots in `[head, tail)` after an Acquire load
// of `tail` and gives them back with a Release store of `head`, which the
// producer loads with Acquire before reusing a slot.
unsafe impl Sync for Lane {}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("capacity", &self.slots.len())
            .field("sent", &self.sent.load(Ordering::Relaxed))
            .field("dropped", &self.dropped.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Lane {
    fn new(cfg: &WireConfig, epoch: Instant) -> Self {
        let slots = (0..cfg.capacity.max(1))
            .map(|_| Slot {
                data: UnsafeCell::new(vec![0u8; cfg.max_frame].into_boxed_slice()),
                len: UnsafeCell::new(0),
                arrive_ns: UnsafeCell::new(0),
            })
            .collect();
        Self {
            slots,
            head: Default::default(),
            tail: Default::default(),
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            oversize: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            receiver: OnceLock::new(),
            epoch,
            max_frame: cfg.max_frame,
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
    }
}

/// Counters of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Frames put on the line.
    pub sent: u64,
    /// Frames dropped because the line's queue was full.
    pub dropped: u64,
    /// Frames dropped because they were committed longer than a slot.
    pub oversize: u64,
    /// Frames taken off by the receiving device.
    pub delivered: u64,
}

/// The transmitting end of one direction.
#[derive(Debug)]
pub struct WireTx {
    lane: Arc<Lane>,
    pacer: Pacer,
    tail: usize,
    /// The consumer's head as last read (refreshed when the ring looks
    /// full).
    head_seen: usize,
}

/// A slot being filled; [`commit`](TxSlot::commit) puts it on the line.
#[derive(Debug)]
pub struct TxSlot<'a> {
    tx: &'a mut WireTx,
}

/// The receiving end of one direction.
#[derive(Debug)]
pub struct WireRx {
    lane: Arc<Lane>,
    head: usize,
    tail_seen: usize,
}

/// One end of a wire: what one device transmits on and receives from.
#[derive(Debug)]
pub struct WirePort {
    /// Frames this device sends.
    pub tx: WireTx,
    /// Frames this device receives.
    pub rx: WireRx,
}

/// Counters of both directions, readable while the devices run.
#[derive(Debug, Clone)]
pub struct WireStats {
    a_to_b: Arc<Lane>,
    b_to_a: Arc<Lane>,
}

fn stats(l: &Lane) -> LaneStats {
    LaneStats {
        sent: l.sent.load(Ordering::Relaxed),
        dropped: l.dropped.load(Ordering::Relaxed),
        oversize: l.oversize.load(Ordering::Relaxed),
        delivered: l.delivered.load(Ordering::Relaxed),
    }
}

impl WireStats {
    /// From port A to port B.
    pub fn a_to_b(&self) -> LaneStats {
        stats(&self.a_to_b)
    }

    /// From port B to port A.
    pub fn b_to_a(&self) -> LaneStats {
        stats(&self.b_to_a)
    }
}

/// A wire: two ports and the counters.
pub fn wire(cfg: WireConfig) -> (WirePort, WirePort, WireStats) {
    let epoch = Instant::now();
    let ab = Arc::new(Lane::new(&cfg, epoch));
    let ba = Arc::new(Lane::new(&cfg, epoch));
    let port = |out: &Arc<Lane>, inn: &Arc<Lane>| WirePort {
        tx: WireTx {
            lane: out.clone(),
            pacer: Pacer::new(cfg.line_rate_bps),
            tail: 0,
            head_seen: 0,
        },
        rx: WireRx {
            lane: inn.clone(),
            head: 0,
            tail_seen: 0,
        },
    };
    let a = port(&ab, &ba);
    let b = port(&ba, &ab);
    (
        a,
        b,
        WireStats {
            a_to_b: ab,
            b_to_a: ba,
        },
    )
}

impl WireTx {
    /// A free slot to fill, or `None` when the line's queue is full (the
    /// caller then drops the frame with [`drop_frame`](Self::drop_frame)).
    pub fn reserve(&mut self) -> Option<TxSlot<'_>> {
        let n = self.lane.slots.len();
        if self.tail.wrapping_sub(self.head_seen) >= n {
            // Acquire: the consumer is done with the slots before `head`.
            self.head_seen = self.lane.head.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head_seen) >= n {
                return None;
            }
        }
        Some(TxSlot { tx: self })
    }

    /// Counts a frame dropped because the queue was full.
    pub fn drop_frame(&self) {
        let d = &self.lane.dropped;
        d.store(d.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// When the line is free for the next frame (`None`: now).
    pub fn busy_until(&self) -> Option<Duration> {
        let busy = self.pacer.busy_until_ns();
        let now = self.lane.now_ns();
        (busy > now).then(|| Duration::from_nanos(busy - now))
    }

    /// The largest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.lane.max_frame
    }
}

impl TxSlot<'_> {
    /// The slot's buffer (`max_frame` bytes).
    pub fn buf(&mut self) -> &mut [u8] {
        let n = self.tx.lane.slots.len();
        let slot = &self.tx.lane.slots[self.tx.tail % n];
        // SAFETY: slot `tail % n` is outside the consumer's window
        // (`reserve` checked `tail - head < n`), so only this producer
        // touches it until `commit` publishes it; `&mut self` makes this
        // borrow unique.
        unsafe { &mut *slot.data.get() }
    }

    /// Puts the first `len` bytes of the buffer on the line and wakes the
    /// receiver. A `len` past the buffer's size is a frame the slot does
    /// not hold: it is dropped and counted ([`LaneStats::oversize`]),
    /// never cut to the slot.
    pub fn commit(self, len: usize) {
        let tx = self.tx;
        let lane = &*tx.lane;
        if len > lane.max_frame {
            let o = &lane.oversize;
            o.store(o.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            return;
        }
        let n = lane.slots.len();
        let slot = &lane.slots[tx.tail % n];
        let now = lane.now_ns();
        let arrive = tx.pacer.send(now, len);
        // SAFETY: as in `buf`: the slot is the producer's until the Release
        // store of `tail` below.
        unsafe {
            *slot.len.get() = len;
            *slot.arrive_ns.get() = arrive;
        }
        tx.tail = tx.tail.wrapping_add(1);
        lane.tail.store(tx.tail, Ordering::Release);
        lane.sent
            .store(lane.sent.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if let Some(t) = lane.receiver.get() {
            t.unpark();
        }
    }
}

impl WireRx {
    /// Makes the calling thread the one a new frame wakes (first call
    /// only).
    pub fn register_receiver(&self) -> bool {
        self.lane.receiver.set(std::thread::current()).is_ok()
    }

    fn refresh(&mut self) -> bool {
        if self.head == self.tail_seen {
            // Acquire: pairs with the producer's Release of `tail`.
            self.tail_seen = self.lane.tail.load(Ordering::Acquire);
        }
        self.head != self.tail_seen
    }

    /// The next frame if its last bit has arrived: `Ok(frame)`; if one is
    /// still on the line, `Err(Some(wait))`; if none, `Err(None)`.
    pub fn peek(&mut self) -> Result<&[u8], Option<Duration>> {
        if !self.refresh() {
            return Err(None);
        }
        let n = self.lane.slots.len();
        let slot = &self.lane.slots[self.head % n];
        // SAFETY: slot `head % n` is in `[head, tail)`: published by the
        // producer (Acquire above) and not reused until this consumer
        // stores a later `head`.
        let (arrive, len) = unsafe { (*slot.arrive_ns.get(), *slot.len.get()) };
        if arrive != 0 {
            let now = self.lane.now_ns();
            if arrive > now {
                return Err(Some(Duration::from_nanos(arrive - now)));
            }
        }
        // SAFETY: as above; the borrow ends before `consume` (which takes
        // `&mut self`) can release the slot.
        Ok(unsafe { &(**slot.data.get())[..len] })
    }

    /// Whether a frame is queued (arrived or not).
    pub fn pending(&mut self) -> bool {
        self.refresh()
    }

    /// Releases the frame [`peek`](Self::peek) returned.
    pub fn consume(&mut self) {
        if self.refresh() {
            self.head = self.head.wrapping_add(1);
            self.lane.head.store(self.head, Ordering::Release);
            let d = &self.lane.delivered;
            d.store(d.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_wire_drops_and_counts_never_errors() {
        let (mut a, mut b, st) = wire(WireConfig {
            capacity: 2,
            line_rate_bps: 0,
            max_frame: 64,
        });
        for i in 0..5u8 {
            match a.tx.reserve() {
                Some(mut s) => {
                    s.buf()[0] = i;
                    s.commit(1);
                }
                None => a.tx.drop_frame(),
            }
        }
        assert_eq!(
            st.a_to_b(),
            LaneStats {
                sent: 2,
                dropped: 3,
                oversize: 0,
                delivered: 0
            }
        );
        assert_eq!(b.rx.peek().unwrap(), &[0]);
        b.rx.consume();
        assert_eq!(b.rx.peek().unwrap(), &[1]);
        b.rx.consume();
        assert_eq!(b.rx.peek(), Err(None));
        assert_eq!(st.a_to_b().delivered, 2);
        // Space again after the consumer released its slots.
        assert!(a.tx.reserve().is_some());
        assert_eq!(st.b_to_a(), LaneStats::default());
    }

    #[test]
    fn a_frame_longer_than_a_slot_is_dropped_and_counted_never_cut() {
        let (mut a, mut b, st) = wire(WireConfig {
            capacity: 1,
            line_rate_bps: 0,
            max_frame: 4,
        });
        let s = a.tx.reserve().unwrap();
        s.commit(100);
        assert_eq!(b.rx.peek(), Err(None));
        assert_eq!(
            st.a_to_b(),
            LaneStats {
                oversize: 1,
                ..LaneStats::default()
            }
        );
        // The slot is still free: a frame that fits goes.
        let mut s = a.tx.reserve().unwrap();
        s.buf().copy_from_slice(&[1, 2, 3, 4]);
        s.commit(4);
        assert_eq!(b.rx.peek().unwrap(), &[1, 2, 3, 4]);
    }

    #[test]
    fn the_pacer_serialises_frames_at_the_line_rate() {
        // 1 Gbit/s: a 1514-byte frame plus 24 bytes of overhead is 12,304
        // bits, 12,304 ns.
        let mut p = Pacer::new(1_000_000_000);
        assert_eq!(p.frame_ns(1514), 12_304);
        assert_eq!(p.send(1_000, 1514), 13_304);
        // Back to back: the second starts when the first ends.
        assert_eq!(p.send(1_000, 1514), 25_608);
        // After an idle gap it starts at once.
        assert_eq!(p.send(100_000, 1514), 112_304);
        // Unlimited: arrival is now.
        let mut u = Pacer::new(0);
        assert_eq!(u.send(5, 1514), 5);
        assert_eq!(u.frame_ns(1514), 0);
    }
}
