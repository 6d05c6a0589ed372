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
//! Cost: two reads of `CLOCK_THREAD_CPUTIME_ID` (a system call; no vDSO
//! path) per pass with work, about 0.45 µs each measured on the
//! project's 2-core VM, and one shared counter added per pass. A deferred
//! flush makes one pass per batch (256 unmaps by default); a strict unmap
//! makes one pass of its own, which is why accounting is off unless asked
//! for (the labs that report service demand turn it on).

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::inv_queue::Pass;
use super::unit::{Counters, ProcState, Shared, Unit};

std::thread_local! {
    /// The calling thread's inline passes' CPU, nanoseconds, ever.
    static THREAD_PASS_NS: Cell<u64> = const { Cell::new(0) };
}

/// The CPU the calling thread has spent running units' inline passes (with
/// accounting on), less the modelled latency they spun: the part of the
/// thread's CPU clock that was the IOMMU hardware's work. Grows
/// monotonically; take differences.
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
    /// its CPU charged to the unit when accounting is on and the queue has
    /// work (an empty pass reads no clock).
    pub(crate) fn run_inline(&self, p: &mut ProcState) -> Pass {
        if cfg!(loom)
            || !self.account_passes.load(Ordering::Relaxed)
            || self.queue.head() == self.queue.tail()
        {
            return self.run_queue(p);
        }
        let spun0 = p.spun_ns;
        let t0 = crate::cpu_clock::thread();
        let pass = self.run_queue(p);
        let cpu = crate::cpu_clock::thread().saturating_sub(t0);
        let spun = p.spun_ns.wrapping_sub(spun0);
        let ns = u64::try_from(cpu.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_sub(spun);
        // One shared add per pass, under the processing lock the pass
        // already holds: never per map or unmap.
        Counters::add(&self.counters.inline_pass_cpu_ns, ns);
        Counters::add(&self.counters.inline_passes, 1);
        THREAD_PASS_NS.with(|c| c.set(c.get().saturating_add(ns)));
        pass
    }
}
