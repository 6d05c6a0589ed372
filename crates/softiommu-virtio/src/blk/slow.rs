//! A slow region: the latency tail that ages an IOVA allocator in minutes.
//!
//! Seed `004`'s cliff took 16 hours of fio. What ages the caches is IOVAs
//! that stay allocated for a long time among many short-lived ones: they
//! pin holes in the allocator's tree, the caches fill around them, and a
//! design that frees whole magazines back to the tree (Linux 2016) finds it
//! ever more fragmented. The allocator-only lab (`lab iova-aging`) makes 2 %
//! of its I/Os hold their IOVA for a million I/Os. On the storage path a
//! request holds its IOVA from `map_sg` to completion, so the device
//! provides the tail: a request whose first sector lies in the slow region
//! completes [`SlowRegion::hold`] after it arrives (its data and status are
//! written at once; only its return on the used ring waits), like a slow
//! tier of a hybrid disk. A load generator sends a share of its I/Os there
//! on a budget of their own (see the fio engine's `slow_pct`), so the fast
//! I/Os keep their queue depth.
//!
//! The held chains of a queue are bounded by its size (a driver cannot
//! have more outstanding); past that, a request is not held.
//!
//! The hold is a deadline per request, not a sleep per request: a chain
//! taken at `t` is due at `t + hold` whatever else is held, so held
//! requests overlap like the commands of an SSD with queue depth. The
//! worker sleeps to just before the earliest deadline with a timer slack
//! of 1 ns (Linux stretches a sleep by the thread's slack, 50 µs by
//! default) and polls the rest of the way ([`DUE_SPIN`]), so a request
//! comes back within a few µs of its deadline; it runs at nice -20 where
//! the system allows, so the host's other work does not move the
//! deadlines (hardware keeps its time whatever the CPUs do). The device
//! counts the time each one achieved ([`BlkDeviceStats::held_ns`]).
//!
//! A region may also carry a bandwidth ([`SlowRegion::bytes_per_sec`]):
//! the data of its requests then crosses one link in turn, so a request
//! falls due at its arrival plus the hold or at the previous one's due
//! time plus its own transfer time (`len / bytes_per_sec`), whichever is
//! later — latency overlapped across the requests in flight, bandwidth
//! shared. Due times stay in arrival order.
//!
//! [`BlkDeviceStats::held_ns`]: super::BlkDeviceStats::held_ns

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Requests starting at or past `from_sector` complete `hold` after they
/// arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowRegion {
    /// The first slow sector.
    pub from_sector: u64,
    /// How long a slow request is held (at most [`MAX_HOLD`]).
    pub hold: Duration,
    /// The region's bandwidth, bytes per second, shared by its requests
    /// in arrival order (0: none, only the hold).
    pub bytes_per_sec: u64,
}

/// The longest hold: an hour.
pub const MAX_HOLD: Duration = Duration::from_secs(3600);

/// How long before a deadline the worker stops sleeping and polls: past
/// the wake-up latency of a sleep with 1 ns of timer slack.
pub const DUE_SPIN: Duration = Duration::from_micros(5);

/// When a chain taken at `arrived` falls due: `arrived + hold`, or
/// `None` if that instant cannot be represented (the chain is then not
/// held).
pub(crate) fn due_at(arrived: Instant, hold: Duration) -> Option<Instant> {
    arrived.checked_add(hold)
}

/// When a chain of `len` data bytes taken at `arrived` falls due on a
/// region of `hold` and `bytes_per_sec` (0: no bandwidth limit), the
/// previous chain of its queue having fallen due at `prev`: the later of
/// `arrived + hold` and `prev + len / bytes_per_sec`. `None` if that
/// instant cannot be represented (the chain is then not held).
pub(crate) fn due_with_bandwidth(
    arrived: Instant,
    hold: Duration,
    len: u64,
    bytes_per_sec: u64,
    prev: Option<Instant>,
) -> Option<Instant> {
    let latency = due_at(arrived, hold)?;
    let (Some(prev), true) = (prev, bytes_per_sec > 0) else {
        return Some(latency);
    };
    // `len * 1e9` in u128 cannot overflow; a quotient past u64 ns is
    // centuries: no deadline.
    let ns = u128::from(len) * 1_000_000_000 / u128::from(bytes_per_sec);
    let transfer = Duration::from_nanos(u64::try_from(ns).ok()?);
    Some(latency.max(prev.checked_add(transfer)?))
}

/// Gives the calling thread nice -20 (`setpriority` on its thread id),
/// if the system allows: a device that models hardware time must wake at
/// its deadlines whatever else the host runs, as hardware would. Returns
/// whether it was given.
pub(crate) fn device_priority() -> bool {
    // SAFETY: gettid takes nothing; setpriority on our own thread id
    // changes only its scheduling weight.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, -20) == 0
    }
}

pub(crate) use softiommu::affinity::precise_timers;

/// A chain served but not yet returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) head: u16,
    pub(crate) len: u32,
    /// When the worker took the chain off the available ring.
    pub(crate) arrived: Instant,
    pub(crate) due: Instant,
}

/// One queue's held chains, oldest first (the hold is the same for all,
/// so they fall due in order).
#[derive(Debug)]
pub(crate) struct HeldQueue {
    /// The generation of the queue they belong to.
    pub(crate) generation: u64,
    pub(crate) items: VecDeque<Held>,
    cap: usize,
    /// The due time of the last chain released.
    released_due: Option<Instant>,
}

impl HeldQueue {
    /// Room for `cap` chains, allocated once.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            generation: 0,
            items: VecDeque::with_capacity(cap),
            cap,
            released_due: None,
        }
    }

    /// Forgets the chains of an older queue (a reset replaced it).
    pub(crate) fn adopt(&mut self, generation: u64) {
        if self.generation != generation {
            self.items.clear();
            self.released_due = None;
            self.generation = generation;
        }
    }

    /// Holds a chain; `false` (not held) when full.
    pub(crate) fn push(&mut self, h: Held) -> bool {
        if self.items.len() >= self.cap {
            return false;
        }
        self.items.push_back(h);
        true
    }

    /// The oldest chain, if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Held> {
        if self.items.front().is_some_and(|h| h.due <= now) {
            let h = self.items.pop_front();
            self.released_due = h.map(|h| h.due);
            h
        } else {
            None
        }
    }

    /// When the oldest chain falls due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.items.front().map(|h| h.due)
    }

    /// When the newest chain falls due (a bandwidth's link is busy until
    /// then), or the last one released if it is later.
    pub(crate) fn last_due(&self) -> Option<Instant> {
        match (self.items.back().map(|h| h.due), self.released_due) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_chains_fall_due_in_order_and_a_new_queue_drops_them() {
        let t0 = Instant::now();
        let mut q = HeldQueue::new(2);
        q.adopt(7);
        let h = |head, ms| Held {
            head,
            len: 1,
            arrived: t0,
            due: t0 + Duration::from_millis(ms),
        };
        assert!(q.push(h(1, 10)));
        assert!(q.push(h(2, 20)));
        assert!(!q.push(h(3, 30)), "bounded");
        assert_eq!(q.pop_due(t0), None);
        assert_eq!(
            q.pop_due(t0 + Duration::from_millis(15)).map(|h| h.head),
            Some(1)
        );
        assert_eq!(q.next_due(), Some(t0 + Duration::from_millis(20)));
        q.adopt(8);
        assert_eq!(q.next_due(), None);
    }

    /// The model is a deadline from arrival: 80 µs after the chain was
    /// taken, not after whatever the worker did since; an instant past
    /// the clock's range is no deadline (not a panic).
    #[test]
    fn a_chain_falls_due_at_its_arrival_plus_the_hold() {
        let t0 = Instant::now();
        let hold = Duration::from_micros(80);
        assert_eq!(due_at(t0, hold), Some(t0 + Duration::from_micros(80)));
        assert_eq!(due_at(t0, Duration::MAX), None);
        assert!(precise_timers());
        // SAFETY: PR_GET_TIMERSLACK returns the slack and reads nothing.
        let slack = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        assert_eq!(slack, 1);
    }

    /// With a bandwidth, requests share one link: 4 KiB at 4.096e9 B/s
    /// is 1 µs, so a burst of requests taken at once falls due 80 µs
    /// after arrival, then 1 µs apart; one arriving after the link went
    /// idle waits only its hold. No bandwidth (0): the hold alone.
    #[test]
    fn a_bandwidth_spaces_the_due_times_of_a_burst() {
        let t0 = Instant::now();
        let hold = Duration::from_micros(80);
        let us = Duration::from_micros;
        let first = due_with_bandwidth(t0, hold, 4096, 4_096_000_000, None);
        assert_eq!(first, Some(t0 + us(80)));
        let second = due_with_bandwidth(t0, hold, 4096, 4_096_000_000, first);
        assert_eq!(second, Some(t0 + us(81)));
        let later = t0 + us(500);
        assert_eq!(
            due_with_bandwidth(later, hold, 4096, 4_096_000_000, second),
            Some(later + us(80))
        );
        assert_eq!(
            due_with_bandwidth(t0, hold, 4096, 0, second),
            Some(t0 + us(80))
        );
        assert_eq!(due_with_bandwidth(t0, hold, u64::MAX, 1, first), None);
        // The queue remembers the link's last due time past a release.
        let mut q = HeldQueue::new(2);
        q.adopt(1);
        assert!(q.push(Held {
            head: 0,
            len: 1,
            arrived: t0,
            due: t0 + us(80),
        }));
        assert_eq!(q.pop_due(t0 + us(90)).map(|h| h.head), Some(0));
        assert_eq!(q.last_due(), Some(t0 + us(80)));
        q.adopt(2);
        assert_eq!(q.last_due(), None);
    }
}
