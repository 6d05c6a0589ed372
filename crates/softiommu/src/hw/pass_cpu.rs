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
//! ## Every pass with work is timed
//!
//! Timing a pass costs two reads of `CLOCK_THREAD_CPUTIME_ID` (a system
//! call; no vDSO path), about 0.45 µs each measured on the project's
//! 2-core VM, and a strict unmap makes one pass of its own. Those reads
//! are the meter's, not the driver's: the thread's share
//! ([`thread_inline_pass_cpu`]) is the pass's interval less the spun
//! latency *plus* one more [`clock_pair_ns`] for the parts of the two
//! calls outside the interval, so taking it out of the thread's clock
//! leaves the thread's CPU as it would have been unmetered; the unit's
//! charge is the interval less the part of the calls inside it.
//!
//! (Sampling, one pass in sixteen timed and charged sixteen-fold, was
//! tried first to save the reads: a pass that met a slow `membarrier(2)`
//! — an IPI to a vCPU its host had descheduled — was then charged
//! sixteen times over, and in `lab netperf-udp` one strict round in
//! fifteen read 0.06-0.5 µs a datagram, below pass-through's, with the
//! driver's CPU taken out by passes it never ran. Timed exactly, each
//! pass takes out only its own CPU.)

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::inv_queue::Pass;
use super::unit::{Counters, ProcState, Shared, Unit};

/// What two back-to-back reads of a thread's CPU clock measure with
/// nothing between them, nanoseconds: the part of the clock's own system
/// calls that falls inside a timed interval (about one call's worth, 0.3-
/// 0.45 µs on the project's 2-core VM), and about the part outside it.
/// The unit's charge for a pass is its interval less this; the thread's
/// share is its interval plus this (the whole of the two calls), so the
/// meter's reads are charged to neither the unit nor the thread's work.
/// Measured once per process: the median of 31 pairs.
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
    /// The calling thread's inline passes' CPU with their clock reads,
    /// nanoseconds, ever.
    static THREAD_PASS_NS: Cell<u64> = const { Cell::new(0) };
}

/// The CPU the calling thread has spent running units' inline passes (with
/// accounting on), less the modelled latency they spun: the part of the
/// thread's CPU clock that was the IOMMU hardware's work, with the
/// thread's own reads of its clock around each pass (the meter's cost; see
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
    /// counted and timed when accounting is on and the queue has work, its
    /// CPU charged to the unit and (with the clock reads) to the thread (an
    /// empty pass reads no clock and counts nothing).
    pub(crate) fn run_inline(&self, p: &mut ProcState) -> Pass {
        if cfg!(loom)
            || !self.account_passes.load(Ordering::Relaxed)
            || self.queue.head() == self.queue.tail()
        {
            return self.run_queue(p);
        }
        // One shared add per pass, under the processing lock the pass
        // already holds: never per map or unmap.
        Counters::add(&self.counters.inline_passes, 1);
        let spun0 = p.spun_ns;
        let pair = clock_pair_ns();
        let t0 = crate::cpu_clock::thread();
        let pass = self.run_queue(p);
        let cpu = crate::cpu_clock::thread().saturating_sub(t0);
        let spun = p.spun_ns.wrapping_sub(spun0);
        let work = u64::try_from(cpu.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_sub(spun);
        Counters::add(&self.counters.inline_pass_cpu_ns, work.saturating_sub(pair));
        THREAD_PASS_NS.with(|c| c.set(c.get().saturating_add(work.saturating_add(pair))));
        pass
    }
}
