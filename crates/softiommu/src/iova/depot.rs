//! The depots: full magazines between the per-CPU caches and the tree, one
//! depot per size class, each split into per-core shards for ours.
//!
//! Why shards: with magazines of 64 (before they took Linux's 128), every
//! 64th allocation and every 64th free of a cache traded a magazine with
//! its class's depot, i.e. ~3 M depot operations per second in `lab
//! iova-aging` (~100 M IOVA operations per second on 2 cores). With
//! one depot per class, each operation moved the depot's lock, its vector
//! and a shared IOVA counter between the cores: three line transfers. Where
//! the two cores share a last-level cache these are cheap; on a shared VM
//! they sometimes do not (a pointer chase over 4 MB measured 15 ns per load
//! for seconds, then 110-140 ns), and then a quarter of the samples sat on
//! the depot's lock and the run fell from ~105 to ~55 M ops/s for seconds.
//! A shard is touched by the threads of one core: trading stays local, and
//! only a cache that finds its own shard empty (or full) looks at the
//! others. The Linux baselines keep one shard per class, as Linux has one
//! depot per `iova_rcache`.

use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::magazine::Magazine;
use std::sync::Mutex;

use crate::sync::lock_std as lock;

/// One shard of one class's depot.
#[derive(Debug)]
struct Shard {
    /// Full magazines with the id of the cache that filled them, oldest
    /// first.
    mags: Vec<(u32, Magazine)>,
    /// IOVAs in `mags`.
    iovas: u64,
    last_touch: Instant,
    next_trim: Instant,
}

/// Every class's depot, as `classes × shards` shards.
#[derive(Debug)]
pub(super) struct Depots {
    shards: usize,
    slots: Box<[CachePadded<Mutex<Shard>>]>,
}

/// The most shards a depot is split into.
const MAX_SHARDS: usize = 64;

impl Depots {
    /// Depots for `classes` size classes, each in `shards` shards (1 to
    /// [`MAX_SHARDS`]).
    pub(super) fn new(classes: usize, shards: usize, now: Instant) -> Self {
        let shards = shards.clamp(1, MAX_SHARDS);
        let slots = (0..classes * shards)
            .map(|_| {
                CachePadded::new(Mutex::new(Shard {
                    mags: Vec::new(),
                    iovas: 0,
                    last_touch: now,
                    next_trim: now,
                }))
            })
            .collect();
        Self { shards, slots }
    }

    /// Shards per class.
    pub(super) fn shards(&self) -> usize {
        self.shards
    }

    /// Size classes.
    pub(super) fn classes(&self) -> usize {
        self.slots.len() / self.shards
    }

    /// Shard `i`'s part of a bound of `bound` magazines over all shards.
    fn share(&self, bound: usize, i: usize) -> usize {
        bound / self.shards + usize::from(i < bound % self.shards)
    }

    fn shard(&self, order: u32, i: usize) -> &Mutex<Shard> {
        &self.slots[order as usize * self.shards + i % self.shards]
    }

    /// Puts `mag` (filled by cache `owner` on `core`) in class `order`'s
    /// depot: the core's shard, or, if that one holds its share of `bound`
    /// magazines, any other shard below its share. `None` bounds nothing.
    /// Returns the magazine if every shard is full.
    ///
    /// The shares add up to `bound` exactly, whatever the shard (core)
    /// count: shard `i` holds `bound / shards` magazines, one more for
    /// the first `bound % shards` shards.
    pub(super) fn push(
        &self,
        order: u32,
        core: usize,
        owner: u32,
        mag: Magazine,
        bound: Option<usize>,
        now: Instant,
    ) -> Result<(), Magazine> {
        for k in 0..self.shards {
            let i = (core + k) % self.shards;
            let mut s = lock(self.shard(order, i));
            s.last_touch = now;
            if bound.is_some_and(|b| s.mags.len() >= self.share(b, i)) {
                continue;
            }
            s.iovas += mag.len() as u64;
            s.mags.push((owner, mag));
            return Ok(());
        }
        Err(mag)
    }

    /// Takes a full magazine of class `order` for cache `owner` on `core`:
    /// from the core's shard (the cache's own magazine first, else the
    /// newest), else the newest of the first other shard that has one.
    pub(super) fn pop(
        &self,
        order: u32,
        core: usize,
        owner: u32,
        now: Instant,
    ) -> Option<Magazine> {
        for k in 0..self.shards {
            let mut s = lock(self.shard(order, core + k));
            if s.mags.is_empty() {
                continue;
            }
            s.last_touch = now;
            let own = if k == 0 {
                s.mags.iter().rposition(|(o, _)| *o == owner)
            } else {
                None
            };
            let (_, mag) = match own {
                Some(i) => s.mags.remove(i),
                None => s.mags.pop()?,
            };
            s.iovas -= mag.len() as u64;
            return Some(mag);
        }
        None
    }

    /// Empties class `order`'s depot.
    pub(super) fn take_all(&self, order: u32) -> Vec<Magazine> {
        let mut out = Vec::new();
        for i in 0..self.shards {
            let mut s = lock(self.shard(order, i));
            s.iovas = 0;
            out.extend(s.mags.drain(..).map(|(_, m)| m));
        }
        out
    }

    /// The magazines class `order`'s depot gives back under the trim rules:
    /// one every `every` from a shard holding more than `keep` (Linux
    /// 2023's periodic trim), or all of a shard untouched for `idle`.
    pub(super) fn trim(
        &self,
        order: u32,
        periodic: Option<(std::time::Duration, usize)>,
        idle: Option<std::time::Duration>,
        now: Instant,
    ) -> Vec<Magazine> {
        let mut out = Vec::new();
        for i in 0..self.shards {
            let mut s = lock(self.shard(order, i));
            let before = out.len();
            if let Some((every, keep)) = periodic {
                if now >= s.next_trim && s.mags.len() > keep {
                    if let Some((_, m)) = s.mags.pop() {
                        out.push(m);
                    }
                    s.next_trim = now + every;
                }
            }
            if let Some(idle) = idle {
                if out.len() == before
                    && !s.mags.is_empty()
                    && now.duration_since(s.last_touch) >= idle
                {
                    out.extend(s.mags.drain(..).map(|(_, m)| m));
                }
            }
            let gone: u64 = out[before..].iter().map(|m| m.len() as u64).sum();
            s.iovas -= gone;
        }
        out
    }

    /// Magazines and IOVAs in every depot.
    pub(super) fn totals(&self) -> (u64, u64) {
        self.slots.iter().fold((0, 0), |(m, n), s| {
            let s = lock(s);
            (m + s.mags.len() as u64, n + s.iovas)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(n: usize, first: u64) -> Magazine {
        let mut m = Magazine::new(n);
        for i in 0..n as u64 {
            m.push(first + i);
        }
        m
    }

    #[test]
    fn a_full_shard_spills_to_another_and_the_bound_holds_over_all() {
        let now = Instant::now();
        let d = Depots::new(1, 2, now);
        // A bound of 3 over 2 shards: 2 in shard 0, 1 in shard 1 (not 2
        // each: the bound is over all shards, whatever the core count).
        for i in 0..3 {
            d.push(0, 0, 7, full(4, i * 10), Some(3), now).unwrap();
        }
        assert!(matches!(d.push(0, 0, 7, full(4, 99), Some(3), now), Err(m) if m.len() == 4));
        assert_eq!(d.totals(), (3, 12));
        // Core 1 takes its own shard's magazines first, then core 0's.
        for _ in 0..3 {
            assert!(d.pop(0, 1, 9, now).is_some());
        }
        assert!(d.pop(0, 1, 9, now).is_none());
        assert_eq!(d.totals(), (0, 0));
    }

    /// Any shard count holds exactly the bound (a 3-core machine's
    /// depot of bound 8 held 9: 3 shards of 3).
    #[test]
    fn the_bound_holds_over_all_shards_whatever_their_count() {
        let now = Instant::now();
        for shards in 1..=9 {
            for bound in [1, 2, 3, 7, 8, 9, 32] {
                let d = Depots::new(1, shards, now);
                let mut n = 0;
                while d
                    .push(0, n % 3, 7, full(1, n as u64), Some(bound), now)
                    .is_ok()
                {
                    n += 1;
                    assert!(n <= bound, "{shards} shards, bound {bound}");
                }
                assert_eq!(d.totals(), (bound as u64, bound as u64), "{shards} shards");
            }
        }
    }

    #[test]
    fn a_pop_prefers_the_callers_own_magazine_in_its_shard() {
        let now = Instant::now();
        let d = Depots::new(1, 1, now);
        d.push(0, 0, 1, full(2, 100), None, now).unwrap();
        d.push(0, 0, 2, full(2, 200), None, now).unwrap();
        let m = d.pop(0, 0, 1, now).unwrap();
        assert_eq!(m.peek_below(0), Some(101));
        assert_eq!(m.peek_below(1), Some(100));
        assert_eq!(m.peek_below(2), None);
        assert_eq!(d.totals(), (1, 2));
    }

    #[test]
    fn trims_give_back_what_the_rules_say() {
        let t0 = Instant::now();
        let d = Depots::new(1, 2, t0);
        for i in 0..3 {
            d.push(0, 0, 1, full(2, i * 10), None, t0).unwrap();
        }
        let later = t0 + std::time::Duration::from_millis(50);
        let every = std::time::Duration::from_millis(10);
        assert_eq!(d.trim(0, Some((every, 1)), None, later).len(), 1);
        assert_eq!(
            d.trim(0, Some((every, 1)), None, later).len(),
            0,
            "not due yet"
        );
        let idle = d.trim(0, None, Some(std::time::Duration::from_millis(40)), later);
        assert_eq!(idle.len(), 2);
        assert_eq!(d.totals(), (0, 0));
    }
}
