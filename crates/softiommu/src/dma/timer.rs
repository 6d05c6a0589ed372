//! The flush timer: one thread per domain that, while anything is queued,
//! fires once per timeout (up to every fourth timeout while the queues'
//! owners flush on their own) and flushes every queue, and sleeps while every
//! queue is empty (see [`TimerArm`] for the protocol).
//!
//! ## Shaped as Linux's
//!
//! Linux's flush-queue timer (`fq_flush_timeout` in
//! `drivers/iommu/dma-iommu.c`) is armed by the first entry queued while it
//! is off, fires a timeout later, flushes the IOTLB and every CPU's ring,
//! and is armed again only by a later entry. Here the first push into an
//! idle domain wakes the thread, which sleeps a period
//! ([`TimerWork::timer_period`], the timeout) and then runs a round that
//! takes every queue's entries, whatever their age. A round that found
//! work stays armed for the next period (the next entry is all but
//! certain under traffic, and waking the thread for it would cost a
//! second wake-up a period); a round that found nothing at all disarms
//! and sleeps. Under steady traffic that is one wake-up per period: 100 a
//! second at the default 10 ms, or 25 while the owners flush on their own
//! (below). (The timer used to be due half a timeout
//! after each queue's oldest entry, and woke 110 to 230 times a second in
//! `lab netperf-udp`.) The owners flush their own queues at half the
//! timeout as they unmap (`Tunables::flush_after`), so a busy queue
//! rarely waits for the timer at all.
//!
//! ## While the owners flush on their own
//!
//! An owner flushes its own queue at the high-water mark and once its
//! oldest entry is `flush_after` old, as it unmaps. While the owners do,
//! a round finds only what they queued since their last flush — work
//! they would do a few milliseconds later — and costs a wake-up: 20-35 µs
//! of the timer thread's CPU clock on a shared 2-vCPU VM, against a
//! round's few thousand instructions (in `lab netperf-udp` at the common
//! rate that was 0.17-0.36 µs of a deferred datagram's 1.1-1.4 µs of
//! service demand). So a round that finds the owners have issued flushes
//! of their own since the round before ([`Round::own_flushes`] changed)
//! doubles the gap to the next round, up to [`OWNER_BACKOFF_PERIODS`]
//! periods (after arming 1, 1, 2, 4, 4, ...: the first round has no count
//! to compare with): about 25 wake-ups a second under steady
//! traffic instead of 100 (with a cap of two, as this timer had first,
//! 50). The judgement is the domain's, not each queue's: one CPU flushing
//! its own queue puts the domain on the longer gap. The price: what an
//! owner queued just before it went quiet, or a lightly used CPU's queue
//! beside a busy one, waits up to four periods (40 ms at the default
//! timeout, plus a round's latency) for its IOVAs and table pages to be
//! freed and its invalidation to complete, instead of one. That is a
//! delay in giving resources back, bounded: no translation outlives the
//! deadline below. A shorter timeout set
//! meanwhile has its first round one new period away. Its stale window does
//! not move: the unmap's expiry deadline, three quarters of the timeout
//! after it, ends it in the units whatever the timer does. A round that
//! finds no flush of the owners' (light traffic: no queue reaches the
//! owners' flush age between rounds, so the timer is the flusher) goes
//! back to one period, as Linux's timer has.
//!
//! ## The stale window
//!
//! Nothing here bounds it alone: every deferred unmap arms its domain's
//! expiry deadline in the units, three quarters of the timeout after it
//! (`DmaDomain::cover_unmap`), past which every translator drops the
//! domain's cached translations itself. The timer frees the IOVAs and
//! ends the invalidation; the deadline ends the reachability.
//!
//! ## A drain met in the round
//!
//! A flush's wait completes only when a pass over the unit's queue finds
//! its drain done (the device threads' translation sections open at the
//! invalidation have closed). A round polls the flushes in flight once
//! and never waits for a drain: a flight still open (a device thread
//! inside a section, or one the host took off its CPU mid-section) is
//! left to the owners' unmaps and the next round. The device threads
//! stand for the hardware, and a round that waited for them spent the
//! timer's CPU on however long the host kept them off their CPUs: it
//! used to poll for up to 200 µs, spinning then yielding, and in `lab
//! netperf-udp` at load 12 on 2 cores that wait took 14-28 µs per
//! round that issued a flush, in rounds of 20-34 µs on the timer's
//! clock. (Looking again [`RECHECK`] later while
//! any flight was open woke the timer 270–540 times a second at full
//! speed, where some owner's flush is always in flight.)
//!
//! ## What a round costs
//!
//! A round allocates nothing (the domain copies its CPU slots into a
//! buffer it keeps; an idle round's expiry marks go into `marks` below),
//! reads the monotonic clock once (the next round is due a period after
//! this one began) and makes no system call of its own beyond the sleep
//! (the drain fence of the unit's inline pass it runs is the unit's).
//! Its cost is its wake-up: a round with work is a few thousand
//! instructions, while sleeping and waking a thread costs tens of
//! microseconds of its CPU clock on a shared VM whatever the thread does
//! (docs/ARCHITECTURE.md, the deferred unmap).
//!
//! The timer knows its domain only through [`TimerWork`], so that this
//! module depends on the flush queue's arm and nothing above it.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::flush_queue::TimerArm;
use crate::hw::UnitId;

/// What the timer asks of the domain it serves.
pub(crate) trait TimerWork: Send + Sync {
    /// Whether the domain is going away.
    fn shutting_down(&self) -> bool;
    /// The arm the domain's queues and the timer share.
    fn arm(&self) -> &Arc<TimerArm>;
    /// How long the timer waits between rounds while armed.
    fn timer_period(&self) -> Duration;
    /// The round: flushes every queue, polls the flushes in flight once
    /// (never waiting for a drain), and says what it found.
    fn round(&self, now: Instant) -> Round;
    /// Whether a failed flush waits for a retry (a kick then runs a round
    /// at once).
    fn retry_due(&self) -> bool;
    /// Whether anything waits for a flush.
    fn any_queued(&self) -> bool;
    /// Arms the device-side expiry deadline where none no later is armed.
    fn arm_expiry(&self);
    /// Marks the expiry deadlines as being cleared (still in force); puts
    /// the marks into `marks` (cleared first), which the timer reuses.
    fn begin_clear_expiry(&self, marks: &mut Vec<(UnitId, u64)>);
    /// Clears the marked deadlines if `idle` and no unmap removed a mark;
    /// else leaves them armed.
    fn finish_clear_expiry(&self, marks: &[(UnitId, u64)], idle: bool);
    /// A CPU the timer was asked to move to since it last looked, taken
    /// (the timer pins itself to it at its next wake-up).
    fn take_pin(&self) -> Option<usize> {
        None
    }
    /// The CPU the timer pinned itself to (called once the kernel took it).
    fn pinned(&self, _cpu: usize) {}
}

/// What a round found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Round {
    /// It took a batch, retried a failed flush, or left something queued
    /// or in flight: the timer stays armed for another period.
    pub(crate) worked: bool,
    /// A flush is still in flight (its drain was not done at the round's
    /// poll) or a failed one waits for a retry.
    pub(crate) open: bool,
    /// Flushes the queues' owners had issued of their own queues as they
    /// unmapped, ever, summed over the queues at the round and the handles
    /// that went away (a handle retired between the round's copy of the
    /// queues and its sum can be counted twice once, so the timer compares
    /// for a change, not an increase).
    pub(crate) own_flushes: u64,
}

/// The most periods between two rounds while the queues' owners flush on
/// their own: the gap doubles from one period with each round that finds
/// they did (1, 2, 4), so what an owner queued just before it went quiet
/// waits at most this many periods for its round.
pub(crate) const OWNER_BACKOFF_PERIODS: u32 = 4;

/// The periods to the round after one that found work: twice the gap
/// before, up to [`OWNER_BACKOFF_PERIODS`], while the owners flushed on
/// their own since the round before (`owners`); one otherwise.
fn next_periods(periods: u32, owners: bool) -> u32 {
    if owners {
        periods.saturating_mul(2).clamp(1, OWNER_BACKOFF_PERIODS)
    } else {
        1
    }
}

/// While a failed flush waits for its retry, the timer retries it this
/// often (or at its period, if that is sooner).
pub(crate) const RECHECK: Duration = Duration::from_millis(1);

/// The nice value the timer thread asks for. It stands for the kernel
/// timer that fires Linux's flush queue (`fq_flush_timeout`, a softirq
/// that preempts user threads), and the stale window's bound rests on it
/// running when due; a busy load at the default priority can hold an
/// equal thread off its CPU for tens of milliseconds on a small machine.
/// Raising a thread's priority needs `CAP_SYS_NICE`: without it the call
/// is refused and the timer runs at the process's own priority.
pub(crate) const TIMER_NICE: i32 = -10;

/// Asks for [`TIMER_NICE`] for the calling thread; whether it was granted.
fn raise_priority() -> bool {
    // SAFETY: `gettid` has no preconditions; `setpriority` with
    // `PRIO_PROCESS` and a thread id changes only that thread's nice value
    // (Linux) and reports a refusal as -1, which is all we look at.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, TIMER_NICE) == 0
    }
}

/// The timer thread's body. Holds only a weak reference: the domain's drop
/// stops it.
pub(crate) fn run<W: TimerWork + ?Sized>(domain: Weak<W>) {
    let _ = raise_priority();
    // When the next round is due; `None` while disarmed.
    let mut due: Option<Instant> = None;
    // When the last round ran.
    let mut last_round: Option<Instant> = None;
    // The expiry marks of an idle round, kept across rounds (no
    // allocation per round).
    let mut marks: Vec<(UnitId, u64)> = Vec::new();
    // The owners' own flushes as the last round counted them, and the
    // periods to the next round (doubling up to `OWNER_BACKOFF_PERIODS`
    // while the owners flush on their own).
    let mut own_flushes: Option<u64> = None;
    let mut periods = 1;
    // The period the last round's due was set with.
    let mut last_period: Option<Duration> = None;
    loop {
        let Some(d) = domain.upgrade() else { return };
        if d.shutting_down() {
            return;
        }
        if let Some(cpu) = d.take_pin() {
            // The thread pins itself: a pin from outside through its
            // handle could reach another thread once this one has exited.
            if crate::affinity::pin_current(cpu) {
                d.pinned(cpu);
            }
        }
        let arm = d.arm().clone();
        if arm.paused() {
            drop(d);
            arm.nap(Duration::from_millis(1));
            continue;
        }
        if !arm.is_armed() {
            drop(d);
            due = None;
            arm.sleep();
            continue;
        }
        let period = d.timer_period();
        let now = Instant::now();
        if last_period.is_some_and(|p| period < p) {
            // A shorter timeout: its first round is one new period away,
            // whatever the owners did (entries queued before it still
            // have the old, longer deadlines, and the round's drop of the
            // cached translations is what ends their window early).
            periods = 1;
        }
        last_period = Some(period);
        // Armed by the first push (just woken) or a round that worked: due
        // a period after (more while the owners flush on their own). A
        // shorter timeout set meanwhile takes effect at once (its kick
        // woke the timer).
        let mut at = due.map_or(now + period, |t| t.min(now + period * periods));
        if d.retry_due() {
            // A failed flush (its keeping kicked the timer): retried now,
            // and while it keeps failing, every `RECHECK`.
            at = at.min(last_round.map_or(now, |t| t + RECHECK));
        }
        due = Some(at);
        if now < at {
            drop(d);
            arm.nap(at - now);
            continue;
        }
        last_round = Some(now);
        let round = d.round(now);
        if round.worked {
            // Work waits or may come: its deadline must be armed (an
            // owner's arming can lose to the clearing below, on an earlier
            // round).
            if round.open || d.any_queued() {
                d.arm_expiry();
            }
            // A flight still open is left to the owners' unmaps and the
            // next round (looking again sooner woke the timer every
            // `RECHECK` at full speed, where some owner's flight is always
            // in flight); its stale window has ended at its deadline.
            // Due a period after the round began (one clock read a round),
            // or up to `OWNER_BACKOFF_PERIODS` while the owners flush on
            // their own (module doc).
            let owners = own_flushes.is_some_and(|n| n != round.own_flushes);
            own_flushes = Some(round.own_flushes);
            periods = next_periods(periods, owners);
            due = Some(now + period * periods);
            continue;
        }
        // Nothing queued: mark the expiry deadlines as being cleared and
        // disarm (its heavy barrier orders both before the rescan), then
        // look once more. A push that raced it is seen by the rescan (the
        // deadlines stay), or its owner saw the mark and removed it (the
        // clearing fails), or saw the deadline cleared and armed its own.
        // Taken off the CPU anywhere in between, the timer leaves the
        // deadlines in force, never an unmap uncovered.
        d.begin_clear_expiry(&mut marks);
        arm.disarm();
        let busy = d.any_queued();
        d.finish_clear_expiry(&marks, !busy);
        if busy {
            arm.rearm();
            d.arm_expiry();
            due = Some(now + period);
        } else {
            due = None;
            own_flushes = None;
            periods = 1;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

    use super::*;
    use crate::sync::barrier::Barrier;

    /// A domain whose every round finds work; `owners` says whether the
    /// owners issued flushes of their own between any two rounds.
    struct Busy {
        arm: Arc<TimerArm>,
        owners: bool,
        rounds: AtomicU64,
        stop: AtomicBool,
    }

    const PERIOD: Duration = Duration::from_millis(10);

    impl TimerWork for Busy {
        fn shutting_down(&self) -> bool {
            self.stop.load(Relaxed)
        }
        fn arm(&self) -> &Arc<TimerArm> {
            &self.arm
        }
        fn timer_period(&self) -> Duration {
            PERIOD
        }
        fn round(&self, _now: Instant) -> Round {
            let n = self.rounds.fetch_add(1, Relaxed) + 1;
            Round {
                worked: true,
                open: false,
                own_flushes: if self.owners { n } else { 7 },
            }
        }
        fn retry_due(&self) -> bool {
            false
        }
        fn any_queued(&self) -> bool {
            true
        }
        fn arm_expiry(&self) {}
        fn begin_clear_expiry(&self, marks: &mut Vec<(UnitId, u64)>) {
            marks.clear();
        }
        fn finish_clear_expiry(&self, _marks: &[(UnitId, u64)], _idle: bool) {}
    }

    /// Rounds the timer ran over about `window` of steady work, and the
    /// time that really passed.
    fn rounds(owners: bool, window: Duration) -> (u64, Duration) {
        let d = Arc::new(Busy {
            arm: Arc::new(TimerArm::new(Barrier::Fence)),
            owners,
            rounds: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&d);
        let t = std::thread::spawn(move || run(weak));
        let t0 = Instant::now();
        d.arm.on_push();
        std::thread::sleep(window);
        let n = d.rounds.load(Relaxed);
        let took = t0.elapsed();
        d.stop.store(true, Relaxed);
        d.arm.kick();
        t.join().unwrap();
        (n, took)
    }

    /// The gap rule alone: doubling from one period while the owners
    /// flush on their own, never past the cap, back to one as soon as a
    /// round finds they did not.
    #[test]
    fn the_gap_doubles_to_the_cap_and_falls_back_to_one() {
        let mut p = 1;
        let mut seen = Vec::new();
        for _ in 0..5 {
            p = next_periods(p, true);
            seen.push(p);
        }
        assert_eq!(seen, [2, 4, 4, 4, 4]);
        assert_eq!(OWNER_BACKOFF_PERIODS, 4);
        assert_eq!(next_periods(4, false), 1);
        assert_eq!(next_periods(1, false), 1);
        assert_eq!(next_periods(0, true), 1, "never a gap of no period");
        assert_eq!(next_periods(u32::MAX, true), OWNER_BACKOFF_PERIODS);
    }

    /// The timer thread follows the rule: while every round finds the
    /// owners flushed on their own since the round before, rounds space
    /// out (gaps 1, 1, 2, 4, 4, ... periods after arming); a timer that is
    /// the only flusher keeps one period. Upper bounds only, from the
    /// time that really passed (a machine that delays the timer only
    /// lowers its count).
    #[test]
    fn rounds_space_out_while_the_owners_flush_on_their_own() {
        let window = Duration::from_millis(400);
        let cap = u64::from(OWNER_BACKOFF_PERIODS);
        let (with, took) = rounds(true, window);
        let periods = (took.as_millis() / PERIOD.as_millis()) as u64;
        // Rounds at 1, 2, 4, 8 periods, then one every `cap`; one more for
        // a round due as the window closed.
        assert!(
            with <= 4 + periods.saturating_sub(8) / cap + 1,
            "{with} rounds in {periods} periods while the owners flushed"
        );
        let (without, took) = rounds(false, window);
        let periods = (took.as_millis() / PERIOD.as_millis()) as u64;
        assert!(
            without <= periods + 2,
            "{without} rounds in {periods} periods with the timer the only flusher"
        );
        assert!(
            without > with,
            "{without} rounds alone against {with} while the owners flushed"
        );
    }
}
