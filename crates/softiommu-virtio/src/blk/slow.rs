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
}

/// The longest hold: an hour.
pub const MAX_HOLD: Duration = Duration::from_secs(3600);

/// A chain served but not yet returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) head: u16,
    pub(crate) len: u32,
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
}

impl HeldQueue {
    /// Room for `cap` chains, allocated once.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            generation: 0,
            items: VecDeque::with_capacity(cap),
            cap,
        }
    }

    /// Forgets the chains of an older queue (a reset replaced it).
    pub(crate) fn adopt(&mut self, generation: u64) {
        if self.generation != generation {
            self.items.clear();
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
            self.items.pop_front()
        } else {
            None
        }
    }

    /// When the oldest chain falls due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.items.front().map(|h| h.due)
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
}
