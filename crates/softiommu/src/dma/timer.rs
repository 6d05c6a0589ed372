//! The flush timer: one thread per domain that flushes queues whose oldest
//! entry has waited the timeout, and sleeps while every queue is empty (see
//! [`TimerArm`](super::TimerArm) for the protocol).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Weak;
use std::time::{Duration, Instant};

use super::domain::DmaDomain;

/// The timer thread's body. Holds only a weak reference: the domain's drop
/// stops it.
pub(crate) fn run(domain: Weak<DmaDomain>) {
    loop {
        let Some(d) = domain.upgrade() else { return };
        if d.shutdown.load(Relaxed) {
            return;
        }
        let arm = d.arm.clone();
        if !arm.is_armed() {
            drop(d);
            arm.sleep();
            continue;
        }
        let after = d.tunables.flush_after();
        let now = Instant::now();
        let next = d.flush_expired(now, after);
        match next {
            Some(oldest) => {
                drop(d);
                let due = oldest + after;
                let nap = due
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_micros(100));
                arm.nap(nap.min(after));
            }
            None => {
                // Nothing queued: disarm, then look once more (a push may
                // have raced the disarm; its owner or this scan catches it).
                arm.disarm();
                if d.any_queued() {
                    arm.rearm();
                }
            }
        }
    }
}
