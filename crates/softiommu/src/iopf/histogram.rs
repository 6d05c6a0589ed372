//! A latency histogram with bounded memory and relative precision: values
//! fall into buckets of 1/16 of a power of two (about 6 % wide), the way
//! HdrHistogram keeps two significant bits and more. Recording is a few
//! arithmetic instructions and one relaxed increment.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Sub-buckets per power of two (as a shift).
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Powers of two covered: values up to 2^48 ns (about 3 days).
const POWERS: u32 = 48;
const BUCKETS: usize = (POWERS as usize + 1) * SUB as usize;

/// A concurrent histogram of nanosecond values.
#[derive(Debug)]
pub struct LatencyHistogram {
    counts: Box<[AtomicU64]>,
    max: AtomicU64,
    total: AtomicU64,
    sum: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
            total: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }
}

/// The bucket of `v`: values below 16 have one each; above, the power of
/// two and the 4 bits below the leading one.
fn bucket(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let p = 63 - v.leading_zeros(); // >= SUB_BITS
    let sub = (v >> (p - SUB_BITS)) & (SUB - 1);
    let i = u64::from(p - SUB_BITS + 1) * SUB + sub;
    (i as usize).min(BUCKETS - 1)
}

/// The smallest value of bucket `i` (the inverse of [`bucket`]).
fn lower(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let p = i / SUB - 1 + u64::from(SUB_BITS);
    let sub = i % SUB;
    (SUB | sub) << (p - u64::from(SUB_BITS))
}

/// Percentiles of a histogram, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// The median (the lower bound of its bucket).
    pub p50_ns: u64,
    /// The 99th percentile.
    pub p99_ns: u64,
    /// The largest value, exact.
    pub max_ns: u64,
    /// The mean, exact.
    pub mean_ns: f64,
}

impl LatencyHistogram {
    /// Records `ns`.
    pub fn record(&self, ns: u64) {
        if let Some(c) = self.counts.get(bucket(ns)) {
            c.fetch_add(1, Relaxed);
        }
        self.max.fetch_max(ns, Relaxed);
        self.total.fetch_add(1, Relaxed);
        self.sum.fetch_add(ns, Relaxed);
    }

    /// The value below which `q` (0..=1) of the recorded values fall (the
    /// lower bound of the bucket holding that rank); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.total.load(Relaxed);
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c.load(Relaxed);
            if seen >= rank {
                return lower(i).min(self.max.load(Relaxed));
            }
        }
        self.max.load(Relaxed)
    }

    /// Count, median, 99th percentile, maximum and mean.
    pub fn summary(&self) -> LatencySummary {
        let count = self.total.load(Relaxed);
        LatencySummary {
            count,
            p50_ns: self.quantile(0.5),
            p99_ns: self.quantile(0.99),
            max_ns: self.max.load(Relaxed),
            mean_ns: if count == 0 {
                0.0
            } else {
                self.sum.load(Relaxed) as f64 / count as f64
            },
        }
    }

    /// Adds every value `other` recorded to this histogram (to summarise
    /// several handlers' latencies as one).
    pub fn merge(&self, other: &LatencyHistogram) {
        for (c, o) in self.counts.iter().zip(other.counts.iter()) {
            let n = o.load(Relaxed);
            if n != 0 {
                c.fetch_add(n, Relaxed);
            }
        }
        self.max.fetch_max(other.max.load(Relaxed), Relaxed);
        self.total.fetch_add(other.total.load(Relaxed), Relaxed);
        self.sum.fetch_add(other.sum.load(Relaxed), Relaxed);
    }

    /// Empties it.
    pub fn reset(&self) {
        for c in self.counts.iter() {
            c.store(0, Relaxed);
        }
        self.max.store(0, Relaxed);
        self.total.store(0, Relaxed);
        self.sum.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_tight() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 30, (1 << 40) + 12345, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last, "{v}");
            last = b;
            let lo = lower(b);
            assert!(lo <= v, "{v}: lower {lo}");
            if v < 1 << 40 {
                assert!(v - lo <= v / 16 + 1, "{v}: lower {lo} too far");
            }
        }
    }

    #[test]
    fn quantiles_come_from_the_recorded_values() {
        let h = LatencyHistogram::default();
        assert_eq!(h.summary(), LatencySummary::default());
        for v in 1..=1000u64 {
            h.record(v * 10);
        }
        let s = h.summary();
        assert_eq!((s.count, s.max_ns), (1000, 10_000));
        assert!((4700..=5000).contains(&s.p50_ns), "{}", s.p50_ns);
        assert!((9300..=9900).contains(&s.p99_ns), "{}", s.p99_ns);
        assert!((s.mean_ns - 5005.0).abs() < 0.01);
        let all = LatencyHistogram::default();
        all.merge(&h);
        all.merge(&h);
        let m = all.summary();
        assert_eq!((m.count, m.max_ns, m.p50_ns), (2000, 10_000, s.p50_ns));
        h.reset();
        assert_eq!(h.summary().count, 0);
    }
}
