//! The flush timer: one thread per domain that flushes queues whose oldest
//! entry has waited the timeout, and sleeps while every queue is empty (see
//! [`TimerArm`] for the protocol).
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
    /// The age at which a queue is flushed.
    fn flush_after(&self) -> Duration;
    /// Flushes what is older than `age` at `now`; returns the oldest entry
    /// still waiting.
    fn flush_expired(&self, now: Instant, age: Duration) -> Option<Instant>;
    /// Whether anything waits for a flush.
    fn any_queued(&self) -> bool;
    /// Arms the device-side expiry deadline where none no later is armed.
    fn arm_expiry(&self);
    /// Marks the expiry deadlines as being cleared (still in force);
    /// returns the marks.
    fn begin_clear_expiry(&self) -> Vec<(UnitId, u64)>;
    /// Clears the marked deadlines if `idle` and no unmap removed a mark;
    /// else leaves them armed.
    fn finish_clear_expiry(&self, marks: &[(UnitId, u64)], idle: bool);
}

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
    loop {
        let Some(d) = domain.upgrade() else { return };
        if d.shutting_down() {
            return;
        }
        let arm = d.arm().clone();
        if arm.paused() {
            drop(d);
            arm.nap(Duration::from_millis(1));
            continue;
        }
        if !arm.is_armed() {
            drop(d);
            arm.sleep();
            continue;
        }
        let after = d.flush_after();
        let now = Instant::now();
        let next = d.flush_expired(now, after);
        match next {
            Some(oldest) => {
                // Work waits: its deadline must be armed (an owner's arming
                // can lose to the clearing below, on an earlier round).
                d.arm_expiry();
                drop(d);
                let due = oldest + after;
                let nap = due
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_micros(100));
                arm.nap(nap.min(after));
            }
            None => {
                // Nothing queued: mark the expiry deadlines as being
                // cleared and disarm (its heavy barrier orders both before
                // the rescan), then look once more. A push that raced it
                // is seen by the rescan (the deadlines stay), or its owner
                // saw the mark and removed it (the clearing fails), or saw
                // the deadline cleared and armed its own. Taken off the
                // CPU anywhere in between, the timer leaves the deadlines
                // in force, never an unmap uncovered.
                let marks = d.begin_clear_expiry();
                arm.disarm();
                let busy = d.any_queued();
                d.finish_clear_expiry(&marks, !busy);
                if busy {
                    arm.rearm();
                    d.arm_expiry();
                }
            }
        }
    }
}
