//! The invalidation queue: a ring of 128-bit descriptors in physical memory
//! with a head the unit advances and a tail the driver writes (the
//! doorbell), as VT-d's queued invalidation (§6.5.2; registers `IQA_REG`,
//! `IQH_REG`, `IQT_REG`, §11.4.9).
//!
//! The ring is 2^QS pages of 256 descriptors. The driver writes descriptors
//! at the tail and then moves the tail past them; the queue is full when the
//! tail is one behind the head. The unit fetches the descriptor at the head,
//! checks it, carries it out and only then moves the head past it. A
//! descriptor that fails the check sets the invalidation-queue error
//! (`FSTS.IQE`): processing stops *at* it (the head still points to it, and
//! nothing after it is touched), and resumes only when the driver recovers
//! ([`QueueRecovery`]).
//!
//! Ordering: descriptors are written with plain 64-bit stores, then the tail
//! with a Release store; the processor loads the tail with Acquire, so it
//! reads the descriptors as written. The head is stored with Release after
//! each descriptor's work, so a driver that sees the head past a descriptor
//! sees its effects.
//!
//! ## What the unit keeps to itself
//!
//! The ring lives in physical memory, where anything with a pass-through
//! context or a raw descriptor's status write could change it. So every
//! descriptor queued through the unit's own API ([`Unit::submit`],
//! [`Unit::submit_raw`], the waits of [`Unit::wait`]) is also kept in a
//! private *shadow* of its slot, and the processor carries out the shadow,
//! not the bytes it reads back (a difference is counted as tampering).
//! Which wait completes which ticket is in the shadow too: the unit's
//! completion word never lies in memory a descriptor or a device can
//! write. Only descriptors a driver wrote into the ring itself (then
//! [`Unit::write_tail`]) are read from memory.
//!
//! [`Unit::submit`]: super::Unit::submit
//! [`Unit::submit_raw`]: super::Unit::submit_raw
//! [`Unit::wait`]: super::Unit::wait
//! [`Unit::write_tail`]: super::Unit::write_tail

#![deny(clippy::indexing_slicing)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::descriptor::{InvDescriptor, IqeReason, Limits, WaitDescriptor, DESCRIPTOR_BYTES};
use crate::mem::{FrameOwner, MemError, PhysAddr, PhysMemory, PAGE_SIZE};

/// Descriptors per 4 KiB page.
const PER_PAGE: u32 = (PAGE_SIZE / DESCRIPTOR_BYTES) as u32;
/// The largest queue size exponent (`IQA_REG.QS` is 3 bits).
pub const MAX_QUEUE_ORDER: u32 = 7;

/// The queue's registers, as a driver would read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRegisters {
    /// Physical address of the ring (4 KiB aligned).
    pub base: PhysAddr,
    /// QS: the ring is 2^QS pages.
    pub order: u32,
    /// Descriptors in the ring (256 << QS).
    pub len: u32,
    /// Index of the next descriptor the unit will fetch.
    pub head: u32,
    /// Index of the next descriptor the driver will write.
    pub tail: u32,
}

impl QueueRegisters {
    /// `IQA_REG`: base | DW (0, 128-bit) | QS.
    pub fn iqa(&self) -> u64 {
        self.base | u64::from(self.order)
    }

    /// `IQH_REG`: the head as a byte offset (bits 18:4).
    pub fn iqh(&self) -> u64 {
        u64::from(self.head) << 4
    }

    /// `IQT_REG`: the tail as a byte offset (bits 18:4).
    pub fn iqt(&self) -> u64 {
        u64::from(self.tail) << 4
    }
}

/// A recorded invalidation-queue error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFault {
    /// The head when the queue stopped: the index of the bad descriptor.
    pub head: u32,
    /// The bad descriptor's bits as fetched (zero for a bad tail).
    pub raw: [u64; 2],
    /// Why.
    pub reason: IqeReason,
}

/// How to restart a stopped queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueRecovery {
    /// Resume at the head, reading the descriptor there again (the driver
    /// rewrote it).
    Retry,
    /// Replace the bad descriptor with a wait that writes nothing, then
    /// resume (Linux's `qi_check_fault` does the like).
    Skip,
    /// Drop every pending descriptor: the head jumps to the tail.
    Discard,
}

/// The unit's private copy of one ring slot (module doc).
#[derive(Debug, Default)]
struct Shadow {
    raw: [AtomicU64; 2],
    /// 0: the slot's bytes in memory are the descriptor; `OWN`: `raw` is;
    /// `OWN | TICKETED`: and it is the unit's wait for `ticket`.
    tag: AtomicU32,
    ticket: AtomicU32,
}

const OWN: u32 = 1;
const TICKETED: u32 = 2;

/// What one processing pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Descriptors carried out.
    pub(crate) done: u32,
    /// Whether the queue is stopped on an error after the pass.
    pub(crate) stopped: bool,
    /// Whether this pass raised that error.
    pub(crate) raised: bool,
    /// Whether the pass ended at a wait whose drain has not finished: the
    /// head stays on it, and a later pass looks again.
    pub(crate) stalled: bool,
}

/// What carrying out one descriptor came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Done: the head moves past it.
    Done,
    /// Not yet (a wait whose drain still has translations to wait for):
    /// the head stays on it and the pass ends.
    Stall,
}

/// The ring and its registers.
#[derive(Debug)]
pub(crate) struct InvQueue {
    mem: Arc<PhysMemory>,
    base: PhysAddr,
    order: u32,
    len: u32,
    head: AtomicU32,
    tail: AtomicU32,
    /// `FSTS.IQE`, for a lock-free check; the details are in `fault`.
    iqe: AtomicBool,
    fault: Mutex<Option<QueueFault>>,
    shadow: Box<[Shadow]>,
    /// Own slots whose bytes in memory differed from the shadow.
    tampered: AtomicU64,
}

impl InvQueue {
    /// A zeroed ring of 2^`order` pages in `mem`.
    pub(crate) fn new(mem: Arc<PhysMemory>, order: u32) -> Result<Self, MemError> {
        let base = mem.alloc_zeroed_owned(order, FrameOwner::Iommu)?;
        let len = PER_PAGE << order;
        Ok(Self {
            mem,
            base,
            order,
            len,
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            iqe: AtomicBool::new(false),
            fault: Mutex::new(None),
            shadow: (0..len).map(|_| Shadow::default()).collect(),
            tampered: AtomicU64::new(0),
        })
    }

    /// The registers now.
    pub(crate) fn registers(&self) -> QueueRegisters {
        QueueRegisters {
            base: self.base,
            order: self.order,
            len: self.len,
            head: self.head.load(Ordering::Acquire),
            tail: self.tail.load(Ordering::Acquire),
        }
    }

    /// Descriptors in the ring.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Slots the driver may fill at `cursor` (its next slot, at or past the
    /// tail register) before the ring is full. Call with the submission
    /// lock held.
    pub(crate) fn free(&self, cursor: u32) -> u32 {
        // Acquire: pairs with the processor's Release store of the head, so
        // the slots it freed are no longer read.
        let head = self.head.load(Ordering::Acquire);
        self.len - 1 - (cursor + self.len - head) % self.len
    }

    /// The tail (the driver's next slot).
    pub(crate) fn tail(&self) -> u32 {
        self.tail.load(Ordering::Acquire)
    }

    /// The head (the unit's next descriptor).
    pub(crate) fn head(&self) -> u32 {
        self.head.load(Ordering::Acquire)
    }

    fn slot(&self, index: u32) -> PhysAddr {
        self.base + u64::from(index % self.len) * DESCRIPTOR_BYTES
    }

    fn shadow(&self, index: u32) -> &Shadow {
        #[allow(clippy::indexing_slicing)] // `len` shadows, `index % len < len`.
        &self.shadow[(index % self.len) as usize]
    }

    /// Writes `raw` at `index`, in memory and in the slot's shadow, as the
    /// unit's own (under the submission lock, before `ring`); `ticket`:
    /// the slot is the unit's wait for that ticket.
    pub(crate) fn write(
        &self,
        index: u32,
        raw: [u64; 2],
        ticket: Option<u32>,
    ) -> Result<(), MemError> {
        let at = self.slot(index);
        // Relaxed: published by the Release store of the tail in `ring`.
        self.mem.store_u64(at, raw[0], Ordering::Relaxed)?;
        self.mem.store_u64(at + 8, raw[1], Ordering::Relaxed)?;
        let sh = self.shadow(index);
        sh.raw[0].store(raw[0], Ordering::Relaxed);
        sh.raw[1].store(raw[1], Ordering::Relaxed);
        sh.ticket.store(ticket.unwrap_or(0), Ordering::Relaxed);
        let tag = if ticket.is_some() {
            OWN | TICKETED
        } else {
            OWN
        };
        sh.tag.store(tag, Ordering::Relaxed);
        Ok(())
    }

    /// Own slots found changed in memory before they ran.
    pub(crate) fn tampered(&self) -> u64 {
        self.tampered.load(Ordering::Relaxed)
    }

    fn read(&self, index: u32) -> Result<[u64; 2], MemError> {
        let at = self.slot(index);
        // Relaxed: ordered after the tail's Acquire load in `process`.
        Ok([
            self.mem.load_u64(at, Ordering::Relaxed)?,
            self.mem.load_u64(at + 8, Ordering::Relaxed)?,
        ])
    }

    /// Writes the tail register (the doorbell) for the unit's own
    /// submissions, which move it forward over the slots they filled
    /// (`make_room` keeps them within the free ones); call with the
    /// submission lock held. A tail past the ring is an invalidation-queue
    /// error (IQEI 1) and is not taken.
    pub(crate) fn ring(&self, tail: u32) -> Result<(), IqeReason> {
        if tail >= self.len {
            return Err(self.refuse_tail(IqeReason::TailOutOfRange {
                tail,
                len: self.len,
            }));
        }
        // Release: publishes the descriptors written before it.
        self.tail.store(tail, Ordering::Release);
        Ok(())
    }

    /// The tail register written by a driver (`Unit::write_tail`); call
    /// with the submission lock held. Besides a tail past the ring, one in
    /// `[head, current tail)` (a move that would cross the head: queued
    /// descriptors would be dropped, or old slots run again) is an
    /// invalidation-queue error (IQEI 1) and is not taken.
    pub(crate) fn ring_from_driver(&self, tail: u32) -> Result<(), IqeReason> {
        if tail < self.len {
            // The head only moves on, so the free slots only grow: a move
            // within them now stays within them. (One read of the head
            // decides and is reported.)
            let current = self.tail.load(Ordering::Acquire);
            let head = self.head();
            let moved = (tail + self.len - current) % self.len;
            let free = self.len - 1 - (current + self.len - head) % self.len;
            if moved > free {
                return Err(self.refuse_tail(IqeReason::TailNotForward {
                    tail,
                    current,
                    head,
                }));
            }
        }
        self.ring(tail)
    }

    /// Stops the queue on a tail write it does not take (the head as it
    /// was, no descriptor at fault); returns `reason`.
    fn refuse_tail(&self, reason: IqeReason) -> IqeReason {
        let head = match reason {
            IqeReason::TailNotForward { head, .. } => head,
            _ => self.head(),
        };
        self.stop(QueueFault {
            head,
            raw: [0, 0],
            reason,
        });
        reason
    }

    /// Whether the queue is stopped on an error.
    pub(crate) fn stopped(&self) -> bool {
        self.iqe.load(Ordering::Acquire)
    }

    /// The error that stopped the queue, if it is stopped.
    pub(crate) fn fault(&self) -> Option<QueueFault> {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stop(&self, f: QueueFault) {
        let mut slot = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(f);
        }
        self.iqe.store(true, Ordering::Release);
    }

    /// The descriptor at `index` as the processor must take it: the
    /// shadow's for an own slot (and its ticket), else memory's.
    fn fetch(&self, index: u32) -> Result<([u64; 2], Option<u32>), MemError> {
        let sh = self.shadow(index);
        let tag = sh.tag.load(Ordering::Relaxed);
        let mem = self.read(index)?;
        if tag == 0 {
            return Ok((mem, None));
        }
        let raw = [
            sh.raw[0].load(Ordering::Relaxed),
            sh.raw[1].load(Ordering::Relaxed),
        ];
        if raw != mem {
            self.tampered.fetch_add(1, Ordering::Relaxed);
        }
        let ticket = (tag & TICKETED != 0).then(|| sh.ticket.load(Ordering::Relaxed));
        Ok((raw, ticket))
    }

    /// Carries out descriptors from the head to the tail with `exec` (the
    /// descriptor, and the ticket it completes if it is one of the unit's
    /// own waits), stopping at the first that fails to decode or that
    /// `exec` refuses, or before the first that `exec` stalls on. Call
    /// with the processing lock held: the head is this caller's.
    ///
    /// Always inlined into the unit's one caller (with its `exec` and the
    /// descriptor decode): left to the optimiser, it was kept out of line
    /// in some builds, about 90 instructions more per strict unmap.
    #[inline(always)]
    pub(crate) fn process(
        &self,
        limits: &Limits,
        mut exec: impl FnMut(&InvDescriptor, Option<u32>) -> Result<Step, IqeReason>,
    ) -> Pass {
        let mut pass = Pass::default();
        if self.stopped() {
            pass.stopped = true;
            return pass;
        }
        let mut head = self.head.load(Ordering::Relaxed);
        // Acquire: pairs with `ring`'s Release store.
        let tail = self.tail.load(Ordering::Acquire);
        while head != tail {
            let (raw, ticket) = match self.fetch(head) {
                Ok(got) => got,
                Err(_) => {
                    self.stop(QueueFault {
                        head,
                        raw: [0, 0],
                        reason: IqeReason::Fetch,
                    });
                    pass.stopped = true;
                    pass.raised = true;
                    return pass;
                }
            };
            match InvDescriptor::decode(raw, limits).and_then(|d| exec(&d, ticket)) {
                Ok(Step::Done) => {}
                Ok(Step::Stall) => {
                    // The head stays on it: fetched again (from the shadow,
                    // as given) by the next pass.
                    pass.stalled = true;
                    return pass;
                }
                Err(reason) => {
                    self.stop(QueueFault { head, raw, reason });
                    pass.stopped = true;
                    pass.raised = true;
                    return pass;
                }
            }
            // Relaxed: ordered before the head's Release store below, after
            // which a submitter may reuse the slot.
            self.shadow(head).tag.store(0, Ordering::Relaxed);
            head = (head + 1) % self.len;
            // Release: the descriptor's work happens before a driver sees
            // the head past it.
            self.head.store(head, Ordering::Release);
            pass.done += 1;
        }
        pass
    }

    /// Restarts a stopped queue (with the processing lock held). Returns
    /// whether it was stopped.
    pub(crate) fn recover(&self, how: QueueRecovery) -> Result<bool, MemError> {
        let mut slot = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = *slot else {
            return Ok(false);
        };
        match how {
            QueueRecovery::Retry => {}
            QueueRecovery::Skip => {
                if !matches!(
                    f.reason,
                    IqeReason::TailOutOfRange { .. } | IqeReason::TailNotForward { .. }
                ) {
                    let nop = InvDescriptor::Wait(WaitDescriptor::default()).encode();
                    self.write(self.head(), nop, None)?;
                }
            }
            QueueRecovery::Discard => {
                let tail = self.tail.load(Ordering::Acquire);
                let mut i = self.head();
                while i != tail {
                    self.shadow(i).tag.store(0, Ordering::Relaxed);
                    i = (i + 1) % self.len;
                }
                self.head.store(tail, Ordering::Release);
            }
        }
        *slot = None;
        self.iqe.store(false, Ordering::Release);
        Ok(true)
    }
}

impl Drop for InvQueue {
    fn drop(&mut self) {
        // Cannot fail: the ring was allocated with this order.
        let _ = self
            .mem
            .free_owned(self.base, self.order, FrameOwner::Iommu);
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        domains: 16,
        mamv: 9,
    };

    fn queue() -> InvQueue {
        InvQueue::new(Arc::new(PhysMemory::new(1 << 20).unwrap()), 0).unwrap()
    }

    #[test]
    fn descriptors_flow_from_tail_to_head() {
        let q = queue();
        assert_eq!(q.len(), 256);
        assert_eq!(q.free(0), 255);
        q.write(0, InvDescriptor::iotlb_domain(3).encode(), None)
            .unwrap();
        q.write(1, InvDescriptor::iotlb_global().encode(), None)
            .unwrap();
        q.ring(2).unwrap();
        assert_eq!(q.free(2), 253);
        let mut seen = Vec::new();
        let pass = q.process(&L, |d, _| {
            seen.push(*d);
            Ok(Step::Done)
        });
        assert_eq!(
            pass,
            Pass {
                done: 2,
                ..Pass::default()
            }
        );
        assert_eq!(
            seen,
            [
                InvDescriptor::iotlb_domain(3),
                InvDescriptor::iotlb_global()
            ]
        );
        let r = q.registers();
        assert_eq!((r.head, r.tail, r.iqh(), r.iqt()), (2, 2, 0x20, 0x20));
        assert_eq!(r.iqa(), r.base);
    }

    #[test]
    fn a_stalled_descriptor_keeps_the_head_and_runs_again_as_given() {
        let q = queue();
        q.write(0, InvDescriptor::iotlb_domain(3).encode(), None)
            .unwrap();
        q.write(1, InvDescriptor::wait_event().encode(), Some(7))
            .unwrap();
        q.ring(2).unwrap();
        let mut seen = Vec::new();
        let pass = q.process(&L, |d, t| {
            seen.push((*d, t));
            Ok(match d {
                InvDescriptor::Wait(_) => Step::Stall,
                _ => Step::Done,
            })
        });
        assert_eq!(
            pass,
            Pass {
                done: 1,
                stalled: true,
                ..Pass::default()
            }
        );
        assert_eq!(q.head(), 1, "the head stays on the stalled wait");
        assert!(!q.stopped());
        let pass = q.process(&L, |d, t| {
            seen.push((*d, t));
            Ok(Step::Done)
        });
        assert_eq!(pass.done, 1);
        assert!(!pass.stalled);
        assert_eq!(q.head(), 2);
        assert_eq!(
            seen,
            [
                (InvDescriptor::iotlb_domain(3), None),
                (InvDescriptor::wait_event(), Some(7)),
                (InvDescriptor::wait_event(), Some(7)),
            ]
        );
    }

    #[test]
    fn a_bad_descriptor_stops_the_queue_at_itself() {
        let q = queue();
        q.write(0, InvDescriptor::iotlb_global().encode(), None)
            .unwrap();
        q.write(1, [0x3, 0], None).unwrap(); // device-TLB: unsupported
        q.write(2, InvDescriptor::iotlb_global().encode(), None)
            .unwrap();
        q.ring(3).unwrap();
        let mut n = 0;
        let pass = q.process(&L, |_, _| {
            n += 1;
            Ok(Step::Done)
        });
        assert_eq!(
            pass,
            Pass {
                done: 1,
                stopped: true,
                raised: true,
                stalled: false,
            }
        );
        assert_eq!(n, 1, "nothing after the bad descriptor ran");
        let f = q.fault().unwrap();
        assert_eq!(
            (f.head, f.raw, f.reason),
            (1, [3, 0], IqeReason::InvalidType { ty: 3 })
        );
        assert_eq!(q.head(), 1);
        // Stopped: nothing runs until recovery.
        let again = q.process(&L, |_, _| Ok(Step::Done));
        assert!(again.stopped && !again.raised);
        // Retry without fixing: stops again at the same place.
        assert!(q.recover(QueueRecovery::Retry).unwrap());
        assert!(q.process(&L, |_, _| Ok(Step::Done)).stopped);
        assert_eq!(q.head(), 1);
        // Skip: the rest runs.
        assert!(q.recover(QueueRecovery::Skip).unwrap());
        assert_eq!(q.process(&L, |_, _| Ok(Step::Done)).done, 2);
        assert!(
            !q.recover(QueueRecovery::Skip).unwrap(),
            "nothing to recover"
        );
    }

    #[test]
    fn a_bad_tail_is_refused_and_discard_empties_the_queue() {
        let q = queue();
        assert_eq!(
            q.ring(256),
            Err(IqeReason::TailOutOfRange {
                tail: 256,
                len: 256
            })
        );
        assert!(q.stopped());
        assert_eq!(q.tail(), 0, "not taken");
        q.recover(QueueRecovery::Retry).unwrap();
        q.write(0, [0x7f, 0], None).unwrap();
        q.ring(1).unwrap();
        assert!(q.process(&L, |_, _| Ok(Step::Done)).stopped);
        q.recover(QueueRecovery::Discard).unwrap();
        assert_eq!(q.head(), 1);
        assert_eq!(q.process(&L, |_, _| Ok(Step::Done)), Pass::default());
    }

    #[test]
    fn a_tail_that_moves_back_or_past_the_head_is_refused_and_drops_nothing() {
        let q = queue();
        for i in 0..4 {
            q.write(i, [0x7f, 0], None).unwrap();
        }
        q.ring_from_driver(4).unwrap();
        // Behind the tail: the four queued slots would be dropped.
        assert_eq!(
            q.ring_from_driver(2),
            Err(IqeReason::TailNotForward {
                tail: 2,
                current: 4,
                head: 0
            })
        );
        assert!(q.stopped());
        assert_eq!(q.tail(), 4, "not taken");
        q.recover(QueueRecovery::Retry).unwrap();
        // Onto the head (the whole ring: past the free slots).
        assert!(matches!(
            q.ring_from_driver(0),
            Err(IqeReason::TailNotForward { tail: 0, .. })
        ));
        q.recover(QueueRecovery::Skip).unwrap();
        assert_eq!(q.tail(), 4);
        // The same tail again, and a forward move, are taken.
        q.ring_from_driver(4).unwrap();
        q.ring_from_driver(6).unwrap();
        assert_eq!(q.tail(), 6);
        assert!(!q.stopped());
    }

    #[test]
    fn the_queue_wraps() {
        let q = queue();
        for round in 0..3u32 {
            let n = 200;
            let t0 = q.tail();
            for i in 0..n {
                q.write(
                    t0 + i,
                    InvDescriptor::iotlb_domain((i % 16) as u16).encode(),
                    None,
                )
                .unwrap();
            }
            q.ring((t0 + n) % q.len()).unwrap();
            assert_eq!(
                q.process(&L, |_, _| Ok(Step::Done)).done,
                n,
                "round {round}"
            );
        }
        assert_eq!(q.head(), 600 % 256);
    }
}
