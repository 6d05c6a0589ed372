//! The driver's CPU per request, measured on samples of its own work.
//!
//! A job thread's CPU clock over a window counts more than the requests'
//! work: the polls of queues that had nothing, arming interrupts, sleeping
//! and waking, doorbells that wake a device thread. How much of that there
//! is per request follows the device's pace (one completion per poll when
//! the device threads are starved, dozens when they keep up), so on a
//! shared machine it moves with the other load, and an aging figure taken
//! on it moves too (measured: ours' `retained` 0.25-0.46 with two busy
//! loops alongside, 1.0-1.5 without).
//!
//! So the driver's work is timed where it happens: every call (one in
//! [`SAMPLE_EVERY`]) that submits requests (building their chains and
//! `map_sg`, not the doorbell) or reaps completions (`unmap_sg`, the
//! flush queue's frees into the interrupt CPU's cache, the status) is
//! timed on the thread's CPU clock, less the clock's own cost (two reads
//! back to back, the median of [`CALIBRATION_PAIRS`], measured as the
//! thread starts) and less the IOMMU unit's inline passes the call ran
//! (`softiommu::hw::thread_inline_pass_cpu`, with the unit's pass
//! accounting on, [`account_passes`]: the invalidation a flush submits
//! and waits for, carried out on the calling thread, is the hardware's
//! work, and its drain's `membarrier(2)` costs what the machine's other
//! load makes it cost — measured, ours' storage-aging
//! `retained_vs_fresh` read 0.93, 0.98 and 1.07 in three quick runs
//! beside two busy loops with it in). The sums and the requests they
//! covered are published
//! per thread; the conductor divides them per window into CPU per request
//! submitted plus CPU per request reaped. Everything between the calls is
//! left out. A thread CPU clock does not advance while the thread is off
//! the CPU, so a co-runner taking the core during a timed call does not
//! lengthen it.
//!
//! One clock read is a system call (about 0.45 µs on the 2-vCPU machine
//! this was built on): the timing costs the run some throughput, and only
//! the aging part, whose figure is the CPU per request, pays it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::cpu_clock;

/// Turns on the pass accounting of `host`'s unit, so that the calls a
/// [`Sampler`] times leave out the unit's inline passes.
pub(crate) fn account_passes(host: &crate::blk::BlkHost) {
    if let Some(u) = host.system.unit(host.unit) {
        u.set_pass_accounting(true);
    }
}

/// One productive call in this many is timed: every one. A flush of an
/// interrupt CPU's queue (256 frees and an invalidation) lands in one
/// completion call in hundreds and costs as much as hundreds of requests;
/// timing one call in eight caught a few flushes per 0.25 s window, and
/// the windows' CPU per request moved 1.0-3.7 µs with which ones
/// (measured, ours, 12 jobs at 12 k-60 k IOPS).
pub(crate) const SAMPLE_EVERY: u32 = 1;

/// Back-to-back clock-read pairs whose median is the clock's own cost.
pub(crate) const CALIBRATION_PAIRS: usize = 31;

/// The sampled work of one thread so far, written by that thread only
/// (plain stores of its own totals), read by the conductor.
#[derive(Debug, Default)]
pub(crate) struct SampledWork {
    /// CPU ns of the timed submitting calls.
    pub(crate) submit_ns: AtomicU64,
    /// Requests those calls submitted.
    pub(crate) submitted: AtomicU64,
    /// CPU ns of the timed reaping calls.
    pub(crate) reap_ns: AtomicU64,
    /// Requests those calls reaped.
    pub(crate) reaped: AtomicU64,
}

/// A snapshot of [`SampledWork`] summed over threads.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct WorkTotals {
    pub(crate) submit_ns: u64,
    pub(crate) submitted: u64,
    pub(crate) reap_ns: u64,
    pub(crate) reaped: u64,
}

impl WorkTotals {
    /// The sum over `threads` now.
    pub(crate) fn read(threads: &[std::sync::Arc<CachePadded<SampledWork>>]) -> Self {
        let mut t = Self::default();
        for w in threads {
            t.submit_ns += w.submit_ns.load(Ordering::Relaxed);
            t.submitted += w.submitted.load(Ordering::Relaxed);
            t.reap_ns += w.reap_ns.load(Ordering::Relaxed);
            t.reaped += w.reaped.load(Ordering::Relaxed);
        }
        t
    }

    /// CPU seconds per request between `before` and `self`: per request
    /// submitted plus per request reaped (a side with no sample counts
    /// zero).
    pub(crate) fn per_request_s(&self, before: &Self) -> f64 {
        let (s, r) = self.per_request_parts_s(before);
        s + r
    }

    /// The two parts of [`per_request_s`](Self::per_request_s): CPU
    /// seconds per request submitted, and per request reaped.
    pub(crate) fn per_request_parts_s(&self, before: &Self) -> (f64, f64) {
        let part = |ns: u64, n: u64| {
            if n == 0 {
                0.0
            } else {
                ns as f64 / n as f64 / 1e9
            }
        };
        (
            part(
                self.submit_ns.saturating_sub(before.submit_ns),
                self.submitted.saturating_sub(before.submitted),
            ),
            part(
                self.reap_ns.saturating_sub(before.reap_ns),
                self.reaped.saturating_sub(before.reaped),
            ),
        )
    }
}

/// Which of the driver's calls is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Submit,
    Reap,
}

/// One thread's sampler.
#[derive(Debug)]
pub(crate) struct Sampler {
    tick: u32,
    overhead: Duration,
    totals: WorkTotals,
    out: std::sync::Arc<CachePadded<SampledWork>>,
}

impl Sampler {
    /// A sampler of the calling thread publishing into `out`; measures the
    /// clock's own cost now.
    pub(crate) fn new(out: std::sync::Arc<CachePadded<SampledWork>>) -> Self {
        let mut pairs: Vec<Duration> = (0..CALIBRATION_PAIRS)
            .map(|_| {
                let a = cpu_clock::thread();
                cpu_clock::thread().saturating_sub(a)
            })
            .collect();
        pairs.sort();
        Self {
            tick: 0,
            overhead: pairs[pairs.len() / 2],
            totals: WorkTotals::default(),
            out,
        }
    }

    /// Runs `f` (a call that may do driver work and returns how many
    /// requests it handled), timing one such call in [`SAMPLE_EVERY`].
    pub(crate) fn run<E>(
        &mut self,
        call: Call,
        f: impl FnOnce() -> Result<usize, E>,
    ) -> Result<usize, E> {
        self.tick = self.tick.wrapping_add(1);
        if !self.tick.is_multiple_of(SAMPLE_EVERY) {
            return f();
        }
        let (c0, u0) = (cpu_clock::thread(), softiommu::hw::thread_inline_pass_cpu());
        let n = f()?;
        let unit = softiommu::hw::thread_inline_pass_cpu().saturating_sub(u0);
        let spent = cpu_clock::thread()
            .saturating_sub(c0)
            .saturating_sub(self.overhead)
            .saturating_sub(unit);
        if n > 0 {
            self.record(call, spent, n);
        } else {
            // Nothing done: the sample goes to the next call.
            self.tick = self.tick.wrapping_sub(1);
        }
        Ok(n)
    }

    fn record(&mut self, call: Call, spent: Duration, n: usize) {
        let ns = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        let n = n as u64;
        let t = &mut self.totals;
        let o = &self.out;
        match call {
            Call::Submit => {
                t.submit_ns = t.submit_ns.saturating_add(ns);
                t.submitted += n;
                o.submit_ns.store(t.submit_ns, Ordering::Relaxed);
                o.submitted.store(t.submitted, Ordering::Relaxed);
            }
            Call::Reap => {
                t.reap_ns = t.reap_ns.saturating_add(ns);
                t.reaped += n;
                o.reap_ns.store(t.reap_ns, Ordering::Relaxed);
                o.reaped.store(t.reaped, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn burn(iters: u64) -> u64 {
        let mut x = 0u64;
        for i in 0..iters {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        x
    }

    #[test]
    fn only_calls_that_did_work_are_timed_one_in_sample_every() {
        let out = Arc::new(CachePadded::new(SampledWork::default()));
        let mut s = Sampler::new(out.clone());
        // Calls that do nothing never count, however long they take, and
        // do not use up a sample.
        for _ in 0..(4 * SAMPLE_EVERY) {
            let n = s
                .run(Call::Reap, || {
                    burn(10_000);
                    Ok::<_, ()>(0)
                })
                .unwrap();
            assert_eq!(n, 0);
        }
        assert_eq!(
            WorkTotals::read(std::slice::from_ref(&out)),
            WorkTotals::default()
        );
        // Of 8 × SAMPLE_EVERY calls submitting 3 requests each, 8 are
        // timed (the first sample is due at once: a call with nothing
        // done above passed it on).
        for _ in 0..(8 * SAMPLE_EVERY) {
            s.run(Call::Submit, || {
                burn(20_000);
                Ok::<_, ()>(3)
            })
            .unwrap();
        }
        let t = WorkTotals::read(std::slice::from_ref(&out));
        assert_eq!(t.submitted, 8 * 3);
        assert!(t.submit_ns > 0);
        assert_eq!((t.reap_ns, t.reaped), (0, 0));
        // An error passes through and records nothing.
        let mut s2 = Sampler::new(Arc::new(CachePadded::new(SampledWork::default())));
        for _ in 0..SAMPLE_EVERY {
            assert_eq!(
                s2.run(Call::Reap, || Err::<usize, _>("broken")),
                Err("broken")
            );
        }
    }

    /// A timed call that ran the unit's inline passes (a flush's
    /// invalidation and wait, on the calling thread) records its own work
    /// only: the passes are the hardware's, timed by the unit.
    #[test]
    fn a_timed_call_leaves_out_the_inline_passes_it_ran() {
        use softiommu::hw::{Unit, UnitConfig};
        use softiommu::mem::PhysMemory;
        let unit = Unit::new(
            Arc::new(PhysMemory::new(16 << 20).unwrap()),
            UnitConfig::default(),
        )
        .unwrap();
        unit.set_pass_accounting(true);
        let out = Arc::new(CachePadded::new(SampledWork::default()));
        let mut s = Sampler::new(out.clone());
        let u0 = softiommu::hw::thread_inline_pass_cpu();
        let c0 = cpu_clock::thread();
        s.run(Call::Reap, || {
            // Each flush is one pass: an invalidation, the drain's heavy
            // fence and the wait's status.
            for _ in 0..200 {
                let mut b = unit.batch();
                b.domain(1);
                b.wait().unwrap();
            }
            burn(20_000);
            Ok::<_, ()>(1)
        })
        .unwrap();
        let raw = cpu_clock::thread() - c0;
        let passes = softiommu::hw::thread_inline_pass_cpu() - u0;
        let t = WorkTotals::read(std::slice::from_ref(&out));
        assert_eq!(t.reaped, 1);
        assert!(passes > Duration::ZERO);
        // The call's own work and its passes add up to no more than the
        // thread's clock moved (with the passes in, they would count
        // twice).
        let recorded = Duration::from_nanos(t.reap_ns);
        assert!(
            recorded + passes <= raw,
            "{recorded:?} + {passes:?} > {raw:?}"
        );
    }

    #[test]
    fn cpu_per_request_is_submit_plus_reap_per_window() {
        let before = WorkTotals {
            submit_ns: 1_000,
            submitted: 10,
            reap_ns: 2_000,
            reaped: 10,
        };
        let now = WorkTotals {
            submit_ns: 1_000 + 40_000,
            submitted: 10 + 20,
            reap_ns: 2_000 + 30_000,
            reaped: 10 + 10,
        };
        // 2 µs per request submitted + 3 µs per request reaped.
        assert!((now.per_request_s(&before) - 5e-6).abs() < 1e-15);
        let (s, r) = now.per_request_parts_s(&before);
        assert!((s - 2e-6).abs() < 1e-15 && (r - 3e-6).abs() < 1e-15);
        // A side without samples in the window counts zero.
        let stalled = WorkTotals {
            reap_ns: before.reap_ns,
            reaped: before.reaped,
            ..now
        };
        assert!((stalled.per_request_s(&before) - 2e-6).abs() < 1e-15);
        assert_eq!(before.per_request_s(&before), 0.0);
    }
}
