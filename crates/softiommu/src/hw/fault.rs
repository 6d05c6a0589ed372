//! The fault log: a bounded ring of fault records, like VT-d's fault
//! recording registers (§7.2.1): when it is full, new faults are dropped
//! and the overflow flag is set (`FSTS.PFO`), and here also counted, so
//! that nothing is lost silently. Recording is a slow path (a lock).

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::context::SourceId;
use crate::pgtable::Perm;

/// The direction of a device access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The device reads memory (DMA to the device).
    Read,
    /// The device writes memory (DMA from the device).
    Write,
}

impl Access {
    /// The permission the access needs.
    pub fn perm(self) -> Perm {
        match self {
            Access::Read => Perm::READ,
            Access::Write => Perm::WRITE,
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Read => "read",
            Access::Write => "write",
        })
    }
}

/// Why a request faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultReason {
    /// The device has no context in this unit.
    NoContext,
    /// The device's context blocks every request.
    ContextBlocked,
    /// The address is past the width the context translates.
    AddressTooWide,
    /// No present entry maps the address.
    NotPresent,
    /// The mapping does not allow the access.
    PermissionDenied,
    /// A table entry on the way has a reserved bit set.
    ReservedEntry,
    /// A table address lies outside physical memory.
    BadTableAddress,
    /// A request of no bytes: malformed, recorded so that the log shows
    /// every bad request a device made.
    ZeroLength,
    /// A request longer than the unit serves at once: malformed.
    TooLong,
    /// A page request for the address was refused (answered `Invalid`,
    /// the queue full, or no answer before the deadline).
    PageRequestDenied,
    /// A pass-through access named a bounce pool's frame.
    BounceFrame,
}

impl FaultReason {
    /// The VT-d legacy-mode fault reason code (§7.2.3, "Non-recoverable
    /// fault reason codes") the hardware would record.
    pub fn vtd_code(self, access: Access) -> u8 {
        match self {
            // LCT.2: context entry not present. (Blocking is done by a
            // context the driver leaves not present.)
            FaultReason::NoContext | FaultReason::ContextBlocked => 0x2,
            // LGN.1: address beyond the domain's address width.
            FaultReason::AddressTooWide => 0x4,
            // LGN.2 / LGN.3: write / read to an entry without W / R
            // (a not-present entry has neither).
            FaultReason::NotPresent | FaultReason::PermissionDenied => match access {
                Access::Write => 0x5,
                Access::Read => 0x6,
            },
            // LSL.1: the walk could not read a second-level entry.
            FaultReason::BadTableAddress => 0x7,
            // LSL.2: a reserved field is set in a second-level entry.
            FaultReason::ReservedEntry => 0xc,
            // No VT-d code: a zero-length request cannot reach the
            // hardware, and a bus bounds a request's length itself.
            FaultReason::ZeroLength | FaultReason::TooLong => 0x0,
            // No VT-d code: pass-through hardware reaches all memory; the
            // model keeps the DMA layer's bounce pools from untranslated
            // requests.
            FaultReason::BounceFrame => 0x0,
            // The request was answered; the access that caused it failed
            // as the not-present (or read-only) access it was.
            FaultReason::PageRequestDenied => match access {
                Access::Write => 0x5,
                Access::Read => 0x6,
            },
        }
    }
}

/// One recorded fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FaultRecord {
    /// The requester.
    pub sid: SourceId,
    /// The address it used.
    pub iova: u64,
    /// Read or write.
    pub access: Access,
    /// Why it failed.
    pub reason: FaultReason,
}

/// What [`FaultLog::drain`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultBatch {
    /// The records, oldest first.
    pub records: Vec<FaultRecord>,
    /// Whether the log filled since the last drain (`FSTS.PFO`).
    pub overflowed: bool,
    /// Faults dropped because it was full.
    pub dropped: u64,
}

#[derive(Debug)]
struct Ring {
    records: VecDeque<FaultRecord>,
    capacity: usize,
    overflowed: bool,
    dropped: u64,
    /// Records ever pushed (not dropped): the sequence number of the next.
    recorded: u64,
    /// Faults ever dropped for want of room (never reset by a drain).
    dropped_ever: u64,
}

/// What [`FaultLog::copy_since`] returns, read under one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultsSince {
    /// The `from` to pass next time.
    pub next: u64,
    /// Records at or after `from` that a drain took before this look.
    pub drained: u64,
    /// Faults dropped for want of room over the log's life (no sequence
    /// number, so no reader sees them; a drain does not reset this).
    pub dropped_ever: u64,
}

/// A bounded ring of fault records.
#[derive(Debug)]
pub struct FaultLog {
    ring: Mutex<Ring>,
    total: AtomicU64,
}

impl FaultLog {
    /// A log holding up to `capacity` records (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            ring: Mutex::new(Ring {
                records: VecDeque::with_capacity(capacity.min(4096)),
                capacity,
                overflowed: false,
                dropped: 0,
                recorded: 0,
                dropped_ever: 0,
            }),
            total: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        // A panic elsewhere cannot leave the ring inconsistent (each update
        // is a push or a flag), so a poisoned lock is taken over.
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a fault, or counts it as dropped if the log is full.
    pub fn record(&self, rec: FaultRecord) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut r = self.lock();
        if r.records.len() < r.capacity {
            r.records.push_back(rec);
            r.recorded += 1;
        } else {
            r.overflowed = true;
            r.dropped += 1;
            r.dropped_ever += 1;
        }
    }

    /// Takes every record, and the overflow flag and drop count (clearing
    /// them, as software writing 1 to `FSTS.PFO`).
    pub fn drain(&self) -> FaultBatch {
        let mut r = self.lock();
        let batch = FaultBatch {
            records: r.records.drain(..).collect(),
            overflowed: r.overflowed,
            dropped: r.dropped,
        };
        r.overflowed = false;
        r.dropped = 0;
        batch
    }

    /// Copies, without taking them, the records still held whose sequence
    /// numbers are at least `from` (records are numbered from 0 in the
    /// order they were recorded; dropped faults get none, and a drain does
    /// not renumber), oldest first, at most `max` of them, into `out`. For
    /// an observer (a paravirtual IOMMU reporting faults to its guest) that
    /// must leave the log to its owner; see [`FaultsSince`] for what it
    /// returns.
    pub fn copy_since(&self, from: u64, max: usize, out: &mut Vec<FaultRecord>) -> FaultsSince {
        let r = self.lock();
        let oldest = r.recorded - r.records.len() as u64;
        let start = from.clamp(oldest, r.recorded);
        let skip = usize::try_from(start - oldest).unwrap_or(usize::MAX);
        let n = r.records.iter().skip(skip).take(max).count();
        out.extend(r.records.iter().skip(skip).take(n).copied());
        FaultsSince {
            next: start + n as u64,
            drained: start.saturating_sub(from),
            dropped_ever: r.dropped_ever,
        }
    }

    /// Records waiting to be drained.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether no record is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the log overflowed since the last drain.
    pub fn overflowed(&self) -> bool {
        self.lock().overflowed
    }

    /// Faults seen over the log's life, recorded or dropped.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The most records it holds.
    pub fn capacity(&self) -> usize {
        self.lock().capacity
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn rec(i: u64) -> FaultRecord {
        FaultRecord {
            sid: SourceId(1),
            iova: i,
            access: Access::Write,
            reason: FaultReason::NotPresent,
        }
    }

    #[test]
    fn a_full_log_drops_counts_and_flags() {
        let log = FaultLog::new(3);
        for i in 0..5 {
            log.record(rec(i));
        }
        assert_eq!(log.len(), 3);
        assert!(log.overflowed());
        let b = log.drain();
        assert_eq!(
            b.records.iter().map(|r| r.iova).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert!(b.overflowed);
        assert_eq!(b.dropped, 2);
        assert!(log.is_empty() && !log.overflowed());
        assert_eq!(log.total(), 5);
        log.record(rec(9));
        let b = log.drain();
        assert_eq!((b.records.len(), b.overflowed, b.dropped), (1, false, 0));
    }

    fn since(log: &FaultLog, from: u64, max: usize, out: &mut Vec<FaultRecord>) -> (u64, u64, u64) {
        let f = log.copy_since(from, max, out);
        (f.next, f.drained, f.dropped_ever)
    }

    #[test]
    fn copy_since_reads_without_taking_and_counts_what_a_drain_took() {
        let log = FaultLog::new(3);
        let mut out = Vec::new();
        assert_eq!(since(&log, 0, 8, &mut out), (0, 0, 0));
        for i in 0..2 {
            log.record(rec(i));
        }
        assert_eq!(since(&log, 0, 1, &mut out), (1, 0, 0));
        assert_eq!(since(&log, 1, 8, &mut out), (2, 0, 0));
        assert_eq!(out.iter().map(|r| r.iova).collect::<Vec<_>>(), [0, 1]);
        // The records stay for the log's owner.
        assert_eq!(log.len(), 2);
        log.record(rec(2));
        assert_eq!(log.drain().records.len(), 3);
        log.record(rec(3));
        out.clear();
        // Record 2 was drained before this look: missed, and counted.
        assert_eq!(since(&log, 2, 8, &mut out), (4, 1, 0));
        assert_eq!(out.iter().map(|r| r.iova).collect::<Vec<_>>(), [3]);
        // Dropped faults get no sequence number.
        for i in 4..9 {
            log.record(rec(i));
        }
        out.clear();
        assert_eq!(since(&log, 4, 8, &mut out), (6, 0, 3));
        // A drain resets the drop count it reports, not the lifetime one.
        assert_eq!(log.drain().dropped, 3);
        assert_eq!(since(&log, 6, 8, &mut out).2, 3);
        assert_eq!(out.iter().map(|r| r.iova).collect::<Vec<_>>(), [4, 5]);
    }

    #[test]
    fn reason_codes_follow_vtd() {
        assert_eq!(FaultReason::NotPresent.vtd_code(Access::Write), 5);
        assert_eq!(FaultReason::PermissionDenied.vtd_code(Access::Read), 6);
        assert_eq!(FaultReason::NoContext.vtd_code(Access::Read), 2);
        assert_eq!(FaultReason::ReservedEntry.vtd_code(Access::Read), 0xc);
        assert_eq!(Access::Write.perm(), Perm::WRITE);
    }
}
