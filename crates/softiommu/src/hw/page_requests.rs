//! A unit's page requests through its API: enabling them for a device,
//! software's side of the queue (take, read registers, move the head),
//! answers, and the counts. The model is in `prq`.

use std::time::Duration;

use super::context::SourceId;
use super::descriptor::InvDescriptor;
use super::error::QiError;
use super::prq::{
    PageRequest, PageRequestError, PrqRegisters, PrqStats, ResponseCode, PRG_INDICES,
};
use super::unit::Unit;
use crate::mem::MemError;

/// What software took from the page request queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A well-formed request, to be served and answered.
    Request(PageRequest),
    /// A descriptor that does not decode (a device wrote garbage): to be
    /// counted and dropped; it names no group that can be answered.
    Malformed {
        /// Its 256 bits as read.
        raw: [u64; 4],
        /// Why it was refused.
        error: PageRequestError,
    },
}

impl Unit {
    /// Makes `sid`'s translation misses raise page requests (the device is
    /// fault-capable: PCIe PRI enabled) instead of failing.
    pub fn enable_page_requests(&self, sid: SourceId) {
        self.shared.prq.set_enabled(sid, true);
    }

    /// Makes `sid`'s misses fail again; its outstanding groups are answered
    /// `Invalid`.
    pub fn disable_page_requests(&self, sid: SourceId) {
        self.shared.prq.set_enabled(sid, false);
    }

    /// Whether `sid`'s misses raise page requests.
    pub fn page_requests_enabled(&self, sid: SourceId) -> bool {
        self.shared.prq.enabled(sid)
    }

    /// The page request queue's registers.
    pub fn page_request_registers(&self) -> PrqRegisters {
        self.shared.prq.registers()
    }

    /// Takes the request at the head of the queue, if any, and moves the
    /// head past it: the descriptor as the unit wrote it (its requester id
    /// the unit's stamp), whatever a device wrote into the ring since.
    /// This is software reading the whole queue itself; handlers of an
    /// [`IopfDomain`](crate::iopf::IopfDomain) take only their own
    /// devices' requests, and a unit's requests are taken one way or the
    /// other, not both.
    pub fn take_page_request(&self) -> Option<Result<Taken, MemError>> {
        Some(self.shared.prq.take()?.map(decode))
    }

    /// Makes `owner` (a domain's owner id, as [`System`](super::System)
    /// records it) the one owner that takes `sid`'s requests; `None`: no
    /// owner, and the unit answers its requests `Invalid`.
    pub(crate) fn route_page_requests(&self, sid: SourceId, owner: Option<u64>) {
        self.shared.prq.route(sid, owner);
    }

    /// Takes the next request of a device `owner` owns (see `prq_route`):
    /// requests of other owners' devices met on the way are handed to
    /// them, those of devices nobody owns answered `Invalid`.
    pub(crate) fn take_routed_page_request(&self, owner: u64) -> Option<Result<Taken, MemError>> {
        Some(self.shared.prq.take_for(owner)?.map(decode))
    }

    /// As [`wait_page_request`](Self::wait_page_request), also woken by a
    /// request handed to `owner`.
    pub(crate) fn wait_routed_page_request(&self, owner: u64, timeout: Duration) -> bool {
        self.shared.prq.wait_request_for(owner, timeout)
    }

    /// Waits until the queue holds a request or `timeout` passes; returns
    /// whether one is there.
    pub fn wait_page_request(&self, timeout: Duration) -> bool {
        self.shared.prq.wait_request(timeout)
    }

    /// Wakes every thread in [`wait_page_request`](Self::wait_page_request)
    /// (a handler shutting down).
    pub fn kick_page_requests(&self) {
        self.shared.prq.kick();
    }

    /// Writes `PQH_REG`, as software that reads the ring itself does. A
    /// head past the ring is refused (`false`).
    pub fn set_page_request_head(&self, head: u32) -> bool {
        self.shared.prq.set_head(head)
    }

    /// Reads the raw descriptor at ring index `index`.
    pub fn read_page_request(&self, index: u32) -> Result<[u64; 4], MemError> {
        self.shared.prq.read(index)
    }

    /// Clears the overflow flag (`PRS_REG.PRO`).
    pub fn clear_page_request_overflow(&self) {
        self.shared.prq.clear_overflow();
    }

    /// Answers group `prgi` of `sid` with `code`: a page group response
    /// descriptor on the invalidation queue (no wait; the device sees the
    /// answer when the queue carries it out). A `prgi` of
    /// [`PRG_INDICES`] (512) or more does not fit VT-d's 9-bit field: it
    /// is refused with [`QiError::GroupIndexTooLarge`] and nothing is
    /// queued.
    pub fn respond_page_group(
        &self,
        sid: SourceId,
        prgi: u16,
        code: ResponseCode,
    ) -> Result<(), QiError> {
        if prgi >= PRG_INDICES {
            return Err(QiError::GroupIndexTooLarge { prgi });
        }
        self.submit(&[InvDescriptor::page_group_response(sid, prgi, code)])
    }

    /// Answers request `r` as software took it: a request the unit raised
    /// is answered as [`respond_page_group`](Self::respond_page_group)
    /// does; one the unit marked raw ([`PageRequest::is_raw`]) only
    /// releases the group its own raw request reserved, at once, and
    /// answers no group the unit raised (counted in
    /// [`PrqStats::raw_answers`]). Handlers answer this way.
    pub fn answer_page_request(&self, r: &PageRequest, code: ResponseCode) -> Result<(), QiError> {
        if r.is_raw() {
            if r.prgi >= PRG_INDICES {
                return Err(QiError::GroupIndexTooLarge { prgi: r.prgi });
            }
            self.shared.prq.answer_raw(r.sid, r.prgi);
            return Ok(());
        }
        self.respond_page_group(r.sid, r.prgi, code)
    }

    /// Writes a raw page request descriptor into the queue as a device
    /// would send it (for tests and fuzzing of handlers: a hostile or
    /// broken device), its requester id as written — the sender is not
    /// known; [`inject_page_request_from`](Self::inject_page_request_from)
    /// stamps it. Either way a raw request cannot answer a group the unit
    /// raised: one naming an outstanding group is refused (`Ok(false)`,
    /// counted in [`PrqStats::forged`]), and one naming a free group
    /// reserves it until it is answered, so no fault is given it. Nothing
    /// else is checked. Returns whether it was queued (when the queue is
    /// full, the overflow flag is set and counted).
    pub fn inject_page_request(&self, raw: [u64; 4]) -> Result<bool, MemError> {
        self.shared.prq.inject(None, raw)
    }

    /// As [`inject_page_request`](Self::inject_page_request), sent by
    /// device `from`: the requester id is the unit's to stamp, as a root
    /// port stamps it from the link, so the descriptor's requester id
    /// field is overwritten with `from` (counted in
    /// [`PrqStats::restamped`] when it named another).
    pub fn inject_page_request_from(
        &self,
        from: SourceId,
        raw: [u64; 4],
    ) -> Result<bool, MemError> {
        self.shared.prq.inject(Some(from), raw)
    }

    /// Answers every outstanding group of `sid` `Invalid` (its handler is
    /// going away).
    pub fn cancel_page_requests(&self, sid: SourceId) {
        self.shared.prq.cancel(sid);
    }

    /// The clock page requests are stamped with (their private data, qword
    /// 0): nanoseconds since the unit was made. A handler subtracts the
    /// stamp from this to know how long a request waited.
    pub fn page_request_clock_ns(&self) -> u64 {
        self.shared.prq.now_ns()
    }

    /// The page request counts.
    pub fn page_request_stats(&self) -> PrqStats {
        self.shared.prq.stats()
    }
}

fn decode(raw: [u64; 4]) -> Taken {
    match PageRequest::decode(raw) {
        Ok(r) => Taken::Request(r),
        Err(error) => Taken::Malformed { raw, error },
    }
}
