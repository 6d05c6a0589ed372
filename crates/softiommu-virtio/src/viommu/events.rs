//! Fault reporting (§5.13.6.7): the unit's fault records of managed
//! endpoints, read without taking them (the log keeps them for its
//! owner), each written to one event-queue buffer in the
//! `virtio_iommu_fault` layout. An event queue with no buffer drops the
//! event and counts it: the device never waits for the driver.

use softiommu::access::PhysGuestMemory;
use softiommu::hw::{Access, FaultReason, FaultRecord, Unit};

use super::chain::Parts;
use super::state::State;
use super::stats::{bump, Counters};
use crate::spec::iommu as s;
use crate::transport::{ChainDir, DeviceEnd, DeviceError};

/// The `virtio_iommu_fault` bytes for `rec` of `endpoint`: reason DOMAIN
/// for an endpoint with no usable context, MAPPING for an address not
/// mapped or not with this access, UNKNOWN otherwise; READ or WRITE, and
/// ADDRESS with the address.
pub fn fault_bytes(rec: &FaultRecord, endpoint: u32) -> [u8; s::FAULT_LEN] {
    let reason = match rec.reason {
        FaultReason::NoContext | FaultReason::ContextBlocked => s::FAULT_R_DOMAIN,
        FaultReason::NotPresent | FaultReason::PermissionDenied | FaultReason::AddressTooWide => {
            s::FAULT_R_MAPPING
        }
        _ => s::FAULT_R_UNKNOWN,
    };
    let dir = match rec.access {
        Access::Read => s::FAULT_F_READ,
        Access::Write => s::FAULT_F_WRITE,
    };
    let flags = dir | s::FAULT_F_ADDRESS;
    let mut b = [0u8; s::FAULT_LEN];
    b[0] = reason;
    b[4..8].copy_from_slice(&flags.to_le_bytes());
    b[8..12].copy_from_slice(&endpoint.to_le_bytes());
    b[16..24].copy_from_slice(&rec.iova.to_le_bytes());
    b
}

/// Reads the unit's fault log from where it last stopped.
#[derive(Debug)]
pub(crate) struct Reporter {
    next: u64,
    /// The log's lifetime drop count at the last look.
    dropped_ever: u64,
    seen_total: u64,
    buf: Vec<FaultRecord>,
    parts: Parts,
}

impl Reporter {
    /// Starts after every fault recorded so far.
    pub(crate) fn new(unit: &Unit) -> Self {
        let mut buf = Vec::new();
        let at = unit.faults().copy_since(u64::MAX, 0, &mut buf);
        Self {
            next: at.next,
            dropped_ever: at.dropped_ever,
            seen_total: unit.faults().total(),
            buf,
            parts: Parts::default(),
        }
    }

    /// Reports up to `max` new faults; returns whether more may wait.
    pub(crate) fn poll(
        &mut self,
        state: &State,
        end: &DeviceEnd,
        mem: &PhysGuestMemory,
        c: &Counters,
        max: usize,
    ) -> bool {
        let unit = state.unit();
        let total = unit.faults().total();
        if total == self.seen_total {
            return false;
        }
        self.buf.clear();
        let at = unit.faults().copy_since(self.next, max, &mut self.buf);
        self.next = at.next;
        // Drained before this look, or dropped by a full log: the device
        // never sees them (of any endpoint: the log keeps no record).
        let dropped = at.dropped_ever.saturating_sub(self.dropped_ever);
        self.dropped_ever = at.dropped_ever;
        bump(&c.faults_missed, at.drained.saturating_add(dropped));
        let more = self.buf.len() == max;
        if !more {
            self.seen_total = total;
        }
        let mut sent = false;
        let recs = std::mem::take(&mut self.buf);
        for rec in &recs {
            if let Some(ep) = state.endpoint_of(rec.sid) {
                if self.send(end, mem, &fault_bytes(rec, ep), c) {
                    bump(&c.events, 1);
                    sent = true;
                } else {
                    bump(&c.events_dropped, 1);
                }
            }
        }
        self.buf = recs;
        if sent {
            self.interrupt_after_send(end, mem);
        }
        more
    }

    /// Writes one event into the next event buffer that can hold it;
    /// `false` if none could (the event is dropped). A buffer too short
    /// for an event, or not device-writable, is returned with used length 0 (the driver gets it
    /// back, and is interrupted for it) and the next one is tried: at
    /// most the queue's size of them, so the work is bounded.
    fn send(&mut self, end: &DeviceEnd, mem: &PhysGuestMemory, ev: &[u8], c: &Counters) -> bool {
        let Some(mut g) = end.queue(s::EVENT_QUEUE) else {
            return false;
        };
        let Some(q) = g.as_mut() else {
            return false;
        };
        let mut returned = false;
        let mut wrote = false;
        for _ in 0..q.layout().size {
            let head = match q.pop(mem) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    q.stop();
                    end.report(e);
                    return false;
                }
            };
            match q.walk(mem, head, ChainDir::Writable, &mut self.parts.descs) {
                Ok(_) => {}
                // A buffer the device may not write (a read-only
                // descriptor, §2.7.4): returned unwritten as a too-short
                // one is, not a reason to stop the queue and break the
                // device (§2.7 permits either; this keeps the request
                // queue usable for a driver that posted one bad buffer).
                Err(DeviceError::WrongDirection { .. }) => self.parts.descs.clear(),
                Err(e) => {
                    q.stop();
                    end.report(e);
                    return false;
                }
            }
            let fits = self.parts.writable_len() >= ev.len() as u64;
            wrote = fits && self.parts.write(mem, 0, ev).is_ok();
            let len = if wrote { ev.len() as u32 } else { 0 };
            if let Err(e) = q.add_used(mem, head, len) {
                q.stop();
                end.report(e);
                return false;
            }
            if wrote {
                break;
            }
            bump(&c.event_buffers_refused, 1);
            returned = true;
        }
        if returned && !wrote {
            // The driver's buffers came back without an event: tell it,
            // as a sent event would.
            Self::interrupt(q, end, mem);
        }
        wrote
    }

    /// Interrupts the driver for the event queue if it wants one, with
    /// the queue's guard held: a reset (which waits for the guard) cannot
    /// slip between the used entries and their interrupt.
    fn interrupt(q: &mut crate::transport::DeviceQueue, end: &DeviceEnd, mem: &PhysGuestMemory) {
        if q.interrupt_wanted(mem).unwrap_or(true) {
            end.queue_interrupt(s::EVENT_QUEUE);
        }
    }

    fn interrupt_after_send(&self, end: &DeviceEnd, mem: &PhysGuestMemory) {
        let Some(mut g) = end.queue(s::EVENT_QUEUE) else {
            return;
        };
        if let Some(q) = g.as_mut() {
            Self::interrupt(q, end, mem);
        }
    }
}
