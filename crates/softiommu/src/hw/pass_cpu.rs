//! Whose CPU an inline pass is: the unit's.
//!
//! In [`QueueMode::Inline`](super::QueueMode::Inline) the unit's pass over
//! its invalidation queue runs on whichever thread rang the doorbell or
//! polled a ticket: a driver, a flush timer. What the pass does is the
//! IOMMU hardware's work — carrying out the descriptors, draining the
//! translations in flight (a heavy fence: `membarrier(2)`, whose cost
//! depends on what else the machine runs), writing the status — so a
//! figure of the *driver's* CPU per unit of work must not count it, as it
//! does not count the device threads. With accounting on
//! ([`Unit::set_pass_accounting`]), each inline pass that has work reads
//! the running thread's CPU clock before and after and charges the
//! difference, less the modelled latency it spun (below), to the unit
//! ([`UnitStats::inline_pass_cpu_ns`](super::UnitStats::inline_pass_cpu_ns))
//! and to the thread ([`thread_inline_pass_cpu`]), so a thread can take
//! its own share out of its CPU clock.
//!
//! What stays with the thread: the modelled latencies of the queue
//! (`LatencyModel::wait_completion` and the invalidations' own), spun on
//! the thread that runs the pass. They stand for the time the hardware
//! takes before it writes a wait's status, which a driver spends spinning
//! on that status word (Linux's `qi_submit_sync` does), so it is driver
//! CPU and stays in a service demand.
//!
//! ## Sampled: one pass in [`PASS_SAMPLE`] is timed
//!
//! Timing a pass costs two reads of `CLOCK_THREAD_CPUTIME_ID` (a system
//! call; no vDSO path), about 0.45 µs each measured on the project's
//! 2-core VM. A strict unmap makes one pass of its own, so timing every
//! pass cost strict about 0.9 µs per datagram in `lab netperf-udp` and
//! lowered its maximum rate (and with it the rate every policy is
//! compared at). So each thread times one of every [`PASS_SAMPLE`] of
//! its passes with work (its first, then every `PASS_SAMPLE`-th) and
//! charges that pass's CPU times `PASS_SAMPLE`, to the unit and to itself:
//! an estimate of its passes' CPU whose expected value is the exact sum
//! over whole groups of `PASS_SAMPLE` passes, at one sixteenth of the
//! clock reads. A thread's counter is its own (a thread-local), so each
//! thread's share is an estimate of its own passes, never of another's.
//! Every pass with work is still counted
//! ([`UnitStats::inline_passes`](super::UnitStats::inline_passes)) with
//! one shared counter added per pass, under the processing lock. Off
//! unless asked for (the labs that report service demand turn it on).
//!
//! A timed interval holds part of the two clock calls themselves; that
//! part, measured once per process as two back-to-back reads
//! ([`clock_pair_ns`]), is taken out of each timed pass before it is
//! multiplied, so the thread's own cost of timing stays the thread's.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::inv_queue::Pass;
use super::unit::{Counters, ProcState, Shared, Unit};

/// One pass with work in this many is timed, per thread, and charged this
/// many times over (module documentation). 16: the clock reads then cost
/// strict about 0.06 µs per datagram instead of 0.9, and a second of
/// traffic at tens of thousands of passes still times thousands.
pub const PASS_SAMPLE: u64 = 16;

/// What two back-to-back reads of a thread's CPU clock measure with
/// nothing between them, nanoseconds: the part of the clock's own system
/// calls that falls inside a timed interval (about one call's worth, 0.3-
/// 0.45 µs on the project's 2-core VM). A timed pass takes it out before
/// it is charged `PASS_SAMPLE` times over: left in, the thread's own cost
/// of timing went to the unit sixteen-fold, and a strict unmap's driver
/// CPU read ~0.3-0.4 µs per pass low (below deferred's in `lab
/// netperf-udp`). Measured once per process: the median of 31 pairs.
pub(crate) fn clock_pair_ns() -> u64 {
    static PAIR: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAIR.get_or_init(|| {
        let mut v: Vec<u64> = (0..31)
            .map(|_| {
                let a = crate::cpu_clock::thread();
                let b = crate::cpu_clock::thread();
                u64::try_from(b.saturating_sub(a).as_nanos()).unwrap_or(u64::MAX)
            })
            .collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    })
}

std::thread_local! {
    /// The calling thread's inline passes' CPU, nanoseconds, ever (an
    /// estimate: sampled, see the module documentation).
    static THREAD_PASS_NS: Cell<u64> = const { Cell::new(0) };
    /// The calling thread's passes with work, ever, with accounting on.
    static THREAD_PASSES: Cell<u64> = const { Cell::new(0) };
}

/// The CPU the calling thread has spent running units' inline passes (with
/// accounting on), less the modelled latency they spun: the part of the
/// thread's CPU clock that was the IOMMU hardware's work. Sampled: one
/// pass in [`PASS_SAMPLE`] is timed and counts [`PASS_SAMPLE`] times (see
/// the module documentation of `hw::pass_cpu`). Grows monotonically; take
/// differences.
pub fn thread_inline_pass_cpu() -> Duration {
    Duration::from_nanos(THREAD_PASS_NS.with(Cell::get))
}

impl Unit {
    /// Turns the charging of inline passes to the unit on or off (off when
    /// made; see the module documentation of `hw::pass_cpu` for the cost).
    /// Takes effect at the next pass.
    pub fn set_pass_accounting(&self, on: bool) {
        self.shared.account_passes.store(on, Ordering::Relaxed);
    }
}

impl Shared {
    /// A pass on the calling thread (inline mode): [`Shared::run_queue`],
    /// counted when accounting is on and the queue has work, and, one such
    /// pass in [`PASS_SAMPLE`] of the thread's, timed and its CPU charged
    /// [`PASS_SAMPLE`] times over to the unit and the thread (an empty
    /// pass reads no clock and counts nothing).
    pub(crate) fn run_inline(&self, p: &mut ProcState) -> Pass {
        if cfg!(loom)
            || !self.account_passes.load(Ordering::Relaxed)
            || self.queue.head() == self.queue.tail()
        {
            return self.run_queue(p);
        }
        let n = THREAD_PASSES.with(|c| {
            let n = c.get();
            c.set(n.wrapping_add(1));
            n
        });
        // One shared add per pass, under the processing lock the pass
        // already holds: never per map or unmap.
        Counters::add(&self.counters.inline_passes, 1);
        if !n.is_multiple_of(PASS_SAMPLE) {
            return self.run_queue(p);
        }
        let spun0 = p.spun_ns;
        let pair = clock_pair_ns();
        let t0 = crate::cpu_clock::thread();
        let pass = self.run_queue(p);
        let cpu = crate::cpu_clock::thread().saturating_sub(t0);
        let spun = p.spun_ns.wrapping_sub(spun0);
        let ns = u64::try_from(cpu.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_sub(pair)
            .saturating_sub(spun)
            .saturating_mul(PASS_SAMPLE);
        Counters::add(&self.counters.inline_pass_cpu_ns, ns);
        THREAD_PASS_NS.with(|c| c.set(c.get().saturating_add(ns)));
        pass
    }
}
