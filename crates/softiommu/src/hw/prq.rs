//! Page requests: a device that may fault (PCIe PRI, or a stall-capable
//! SMMU master) asks for a page instead of failing, and waits for the
//! answer (seed `002`).
//!
//! # The model (VT-d §7.5, "Page Request Services")
//!
//! - A device's translation misses (not present, or present without the
//!   right it needs). If the device has page requests enabled
//!   ([`Unit::enable_page_requests`](super::Unit::enable_page_requests)),
//!   the unit writes a **page request descriptor** into its **page request
//!   queue** — a ring of 32-byte descriptors in physical memory, with head
//!   and tail registers (`PQH_REG`, `PQT_REG`, `PQA_REG`) and an overflow
//!   flag (`PRS_REG.PRO`) — and the translation returns
//!   [`TranslateError::PageRequested`](super::TranslateError::PageRequested)
//!   with the request's group index. The device leaves its section and
//!   waits ([`Translator::wait_page_response`](super::Translator::wait_page_response)).
//! - Software (the `iopf` handler) takes requests from the head, serves
//!   them (maps the page, or not), and answers each group with a **page
//!   group response descriptor** on the invalidation queue (type 9):
//!   `Success` (retry the translation) or `Invalid` (the access fails and
//!   is recorded as a fault) — the two codes Linux's iommufd uAPI keeps —
//!   or `Failure`, handled as `Invalid`.
//! - **Overflow.** A full queue sets the overflow flag, and the request is
//!   answered `Invalid` at once (counted): a device must never wait for
//!   room that a dead handler will never make, and nothing vanishes without
//!   a trace. (QEMU's VT-d model drops with the flag set; Linux's handler
//!   drains the queue before it clears the flag. A device here gets a
//!   failed access and a fault record it can see.)
//! - **Deadlines.** A device waits at most its deadline; a group still
//!   unanswered then is answered `Invalid` by the unit and counted as timed
//!   out. Detaching a device, changing its context or disabling its page
//!   requests answers its outstanding groups `Invalid`.
//!
//! Descriptor layout (VT-d §7.5.1.1, "Page Request Descriptor", 256-bit):
//!
//! | qword | bits | field |
//! |---|---|---|
//! | 0 | 7:0 | type = 01h |
//! | 0 | 8 | PASID present |
//! | 0 | 31:16 | requester id |
//! | 0 | 51:32 | PASID |
//! | 0 | 52, 53 | execute requested, privileged mode requested |
//! | 1 | 0, 1, 2 | read requested, write requested, last page in group (LPIG) |
//! | 1 | 11:3 | page request group index (PRGI) |
//! | 1 | 63:12 | page address |
//! | 2, 3 | | private data (here: the raise time, for the handler's latency figure) |
//!
//! Every other bit is reserved, and a descriptor with one set is refused by
//! [`PageRequest::decode`].
//!
//! # What software may trust
//!
//! - **The requester id is the unit's.** As a PCIe root port stamps the
//!   requester id of a page request message from the link it arrived on,
//!   the unit writes the requester id of the device that raised the
//!   request (the source id of the translation that missed); a raw request
//!   a known device sends ([`Unit::inject_page_request_from`](super::Unit::inject_page_request_from))
//!   has its requester id field overwritten with the sender's (counted in
//!   [`PrqStats::restamped`] when it named another). Groups are matched on
//!   (requester, group index), so a device can name, answer, fail or
//!   cancel only its own groups.
//! - **A raw request never answers a group the unit raised.** A raw
//!   request (from either injection call; the unattributed
//!   [`Unit::inject_page_request`](super::Unit::inject_page_request)
//!   keeps the requester id it names) that names an outstanding group is
//!   refused and counted ([`PrqStats::forged`]); one that names a free
//!   group *reserves* it until it is answered (or for the unit's
//!   `page_response_timeout`), and the unit gives none of its own faults a
//!   reserved group. So the answer to a raw request can only ever be an
//!   answer to that request.
//! - **A late answer completes no new group.** A group the unit answers
//!   itself before software did (its device's wait timed out, or its
//!   requests were cancelled) is reserved the same way until software's
//!   late answer releases it (or for `page_response_timeout`): the index
//!   is not given to a new fault meanwhile, so that answer cannot read as
//!   the new group's.
//! - **The ring's bytes are not.** The unit keeps a private copy of every
//!   descriptor it writes; taking a request returns that copy, so bytes a
//!   device wrote into the ring (a device that reached the IOMMU's frames)
//!   change nothing (counted in [`PrqStats::ring_tampered`]). Only
//!   [`Unit::read_page_request`](super::Unit::read_page_request), software
//!   reading the ring itself, sees the raw bytes.
//! - **Requests reach their requester's owner** (`prq_route`): a handler
//!   takes only the requests of devices its domain owns; a request of a
//!   device nobody owns is answered `Invalid` by the unit at once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::context::SourceId;
use super::prq_route::{Route, Routes};
use crate::mem::{FrameOwner, MemError, PhysAddr, PhysMemory, PAGE_SIZE};
use crate::sync::lock_std as lock;

/// Bytes per page request descriptor (VT-d 3.0 and later: 256 bits).
pub const PRQ_DESCRIPTOR_BYTES: u64 = 32;
/// The default size exponent: 2^4 pages of 128 descriptors, 2,048 in all,
/// as Linux sizes its queue (`drivers/iommu/intel/prq.c`, `PRQ_ORDER` 4).
pub const DEFAULT_PRQ_ORDER: u32 = 4;
/// The largest size exponent (`PQA_REG.PQS` is 3 bits).
pub const MAX_PRQ_ORDER: u32 = 7;
/// Page request group indices are 9 bits (PCIe PRI).
pub const PRG_INDICES: u16 = 512;

const TYPE_PAGE_REQUEST: u64 = 0x01;
const PASID_PRESENT: u64 = 1 << 8;
const RID_SHIFT: u32 = 16;
const PASID_SHIFT: u32 = 32;
const PASID_MASK: u64 = (1 << 20) - 1;
const EXEC: u64 = 1 << 52;
const PRIV: u64 = 1 << 53;
const QW0_RESERVED: u64 = 0x7f << 9 | 0x3ff << 54;
const READ: u64 = 1 << 0;
const WRITE: u64 = 1 << 1;
const LPIG: u64 = 1 << 2;
const PRGI_SHIFT: u32 = 3;
const PAGE_MASK: u64 = !(PAGE_SIZE - 1);

/// How software answers a page request group (the response code of a page
/// group response descriptor, VT-d §6.5.2.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseCode {
    /// 0h: the pages are there; retry the translation.
    Success,
    /// 1h: the request was invalid; the access fails.
    Invalid,
    /// Fh: the request could not be served; the access fails (handled as
    /// `Invalid`).
    Failure,
}

impl ResponseCode {
    /// The 4-bit code.
    pub fn bits(self) -> u8 {
        match self {
            ResponseCode::Success => 0x0,
            ResponseCode::Invalid => 0x1,
            ResponseCode::Failure => 0xf,
        }
    }

    /// The code of 4 bits, if it is one.
    pub fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            0x0 => Some(ResponseCode::Success),
            0x1 => Some(ResponseCode::Invalid),
            0xf => Some(ResponseCode::Failure),
            _ => None,
        }
    }
}

/// One page request, as the unit writes it and software reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageRequest {
    /// The requester.
    pub sid: SourceId,
    /// The PASID, when the request carried one.
    pub pasid: Option<u32>,
    /// Read access requested.
    pub read: bool,
    /// Write access requested.
    pub write: bool,
    /// Execute access requested.
    pub exec: bool,
    /// Privileged-mode access requested.
    pub privileged: bool,
    /// The last request of its group: the group is to be answered.
    pub last: bool,
    /// The page request group index (9 bits).
    pub prgi: u16,
    /// The page's address (4 KiB aligned).
    pub addr: u64,
    /// The private data (here qword 2 holds the raise time, in nanoseconds
    /// since the unit was made; software returns nothing of it).
    pub private: [u64; 2],
}

/// Why a page request descriptor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum PageRequestError {
    /// The type field is not 01h (page request).
    #[error("descriptor type {ty:#x} is not a page request")]
    NotAPageRequest {
        /// The type field.
        ty: u8,
    },
    /// A reserved bit is set.
    #[error("reserved bits {bits:#x} set in qword {qword} of a page request")]
    ReservedBits {
        /// 0 or 1.
        qword: u8,
        /// The offending bits.
        bits: u64,
    },
    /// A request that asks for no access at all (PCIe's stop marker needs a
    /// PASID; without one, R = W = 0 asks for nothing).
    #[error("page request asks for no access")]
    NoAccess,
    /// The group index is out of range (only from [`PageRequest::encode`]
    /// callers that built one by hand).
    #[error("page request group index {prgi} is not below 512")]
    BadGroup {
        /// The index.
        prgi: u16,
    },
}

impl PageRequest {
    /// The descriptor's 256 bits.
    pub fn encode(&self) -> [u64; 4] {
        let mut q0 = TYPE_PAGE_REQUEST | u64::from(self.sid.0) << RID_SHIFT;
        if let Some(p) = self.pasid {
            q0 |= PASID_PRESENT | (u64::from(p) & PASID_MASK) << PASID_SHIFT;
        }
        if self.exec {
            q0 |= EXEC;
        }
        if self.privileged {
            q0 |= PRIV;
        }
        let q1 = u64::from(self.read)
            | u64::from(self.write) << 1
            | if self.last { LPIG } else { 0 }
            | (u64::from(self.prgi) & 0x1ff) << PRGI_SHIFT
            | self.addr & PAGE_MASK;
        [q0, q1, self.private[0], self.private[1]]
    }

    /// Decodes and checks a descriptor read from the queue.
    pub fn decode(raw: [u64; 4]) -> Result<Self, PageRequestError> {
        let [q0, q1, p0, p1] = raw;
        let ty = (q0 & 0xff) as u8;
        if u64::from(ty) != TYPE_PAGE_REQUEST {
            return Err(PageRequestError::NotAPageRequest { ty });
        }
        if q0 & QW0_RESERVED != 0 {
            return Err(PageRequestError::ReservedBits {
                qword: 0,
                bits: q0 & QW0_RESERVED,
            });
        }
        let pasid_present = q0 & PASID_PRESENT != 0;
        let pasid_bits = q0 >> PASID_SHIFT & PASID_MASK;
        if !pasid_present && pasid_bits != 0 {
            return Err(PageRequestError::ReservedBits {
                qword: 0,
                bits: pasid_bits << PASID_SHIFT,
            });
        }
        let (read, write) = (q1 & READ != 0, q1 & WRITE != 0);
        if !read && !write {
            return Err(PageRequestError::NoAccess);
        }
        Ok(PageRequest {
            sid: SourceId((q0 >> RID_SHIFT) as u16),
            pasid: pasid_present.then_some(pasid_bits as u32),
            read,
            write,
            exec: q0 & EXEC != 0,
            privileged: q0 & PRIV != 0,
            last: q1 & LPIG != 0,
            prgi: (q1 >> PRGI_SHIFT & 0x1ff) as u16,
            addr: q1 & PAGE_MASK,
            private: [p0, p1],
        })
    }
}

/// The page request queue's registers, as software reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrqRegisters {
    /// `PQA_REG`: the ring's physical address (4 KiB aligned).
    pub base: PhysAddr,
    /// `PQA_REG.PQS`: the ring is 2^order pages.
    pub order: u32,
    /// Descriptors in the ring (128 << order).
    pub len: u32,
    /// `PQH_REG`: the next descriptor software takes.
    pub head: u32,
    /// `PQT_REG`: the next descriptor the unit writes.
    pub tail: u32,
    /// `PRS_REG.PRO`: a request found the queue full.
    pub overflow: bool,
}

/// Counts of a unit's page requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrqStats {
    /// Requests written into the queue.
    pub raised: u64,
    /// Requests answered `Invalid` at once because the queue was full.
    pub overflows: u64,
    /// Group responses that answered an outstanding group.
    pub responses: u64,
    /// Group responses for no outstanding group (unknown group, wrong
    /// requester, answered already): ignored, counted.
    pub unknown_responses: u64,
    /// Groups the unit answered `Invalid` itself: the device's deadline
    /// passed.
    pub timed_out: u64,
    /// Groups answered `Invalid` because their device was detached or its
    /// page requests disabled.
    pub cancelled: u64,
    /// Raw requests a device sent naming a requester id other than its
    /// own: the unit wrote the sender's id instead.
    pub restamped: u64,
    /// Requests taken whose bytes in the ring differed from what the unit
    /// wrote (a device wrote the ring): the unit's copy was used.
    pub ring_tampered: u64,
    /// Requests a handler took for another owner's device and handed on
    /// to that owner.
    pub rerouted: u64,
    /// Requests of a device no handler owns (or whose owner's inbox was
    /// full), answered `Invalid` by the unit.
    pub unrouted: u64,
    /// Raw requests refused because they named a group the unit had
    /// raised and not yet retired (an answer to them would have answered
    /// that group).
    pub forged: u64,
    /// Answers to raw requests (marked by the unit, see
    /// [`PageRequest::is_raw`]): each released its own reservation and
    /// answered no group (counted in `unknown_responses` too).
    pub raw_answers: u64,
}

/// Where an outstanding group stands: 0 waiting, else a response code + 1.
#[derive(Debug)]
pub(crate) struct Group {
    state: AtomicU8,
    /// The waiter went to sleep on `cv` (set under `lock`): only then does
    /// an answer take the lock and wake it, so an answer to a device that
    /// is still spinning costs no system call.
    sleeping: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

const WAITING: u8 = 0;
/// Polls of its group's answer a waiting device spins before it yields
/// (tens of microseconds on a 2020s x86 core): on a loaded machine a
/// yield can hand the core to another process until the next tick, which
/// costs milliseconds for an answer that came in one (`lab iopf`).
const WAIT_SPINS: u32 = 16384;

impl Group {
    fn new() -> Self {
        Self {
            state: AtomicU8::new(WAITING),
            sleeping: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    fn code(&self) -> Option<ResponseCode> {
        // Acquire (SeqCst, for `wait`'s store of `sleeping`; a plain load
        // on x86): pairs with `answer`'s store, so whatever the handler
        // mapped before answering is seen by the retried translation.
        match self.state.load(Ordering::SeqCst) {
            WAITING => None,
            s => ResponseCode::from_bits(s - 1),
        }
    }

    /// Sets the answer if none is set; returns whether this call set it.
    fn answer(&self, code: ResponseCode) -> bool {
        let set = self
            .state
            .compare_exchange(
                WAITING,
                code.bits() + 1,
                // SeqCst (and SeqCst on `sleeping` below and in `wait`):
                // of this store and the waiter's store of `sleeping`, one
                // sees the other, so a sleeping waiter is always woken.
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok();
        if set && self.sleeping.load(Ordering::SeqCst) {
            let _g = lock(&self.lock);
            self.cv.notify_all();
        }
        set
    }

    /// Waits for the answer until `deadline`: spins (a handler on another
    /// core answers within a microsecond or two), yields, then sleeps.
    fn wait(&self, deadline: Instant) -> Option<ResponseCode> {
        for i in 0..WAIT_SPINS + 3840 {
            if let Some(c) = self.code() {
                return Some(c);
            }
            if i < WAIT_SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let mut g = lock(&self.lock);
        // Under `lock`: an answer that sees this waits for the lock, which
        // is given up only as this thread sleeps on `cv`.
        self.sleeping.store(true, Ordering::SeqCst);
        loop {
            if let Some(c) = self.code() {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            g = self
                .cv
                .wait_timeout(g, (deadline - now).min(Duration::from_millis(10)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[derive(Debug, Default)]
struct PrqState {
    /// Devices whose misses raise page requests.
    enabled: HashSet<SourceId>,
    /// Outstanding groups by requester and index.
    groups: HashMap<(SourceId, u16), Arc<Group>>,
    /// Each requester's next group index to try.
    next: HashMap<SourceId, u16>,
    /// Groups named by raw requests not yet answered, and groups the
    /// unit answered before software did: the unit raises none of its own
    /// in them.
    reserved: HashMap<(SourceId, u16), Reservation>,
}

/// The raw requests naming one group: a group stays reserved while any
/// is still in the queue, and after the last left it until it is
/// answered or `until` (the unit's `page_response_timeout` after it left)
/// — never while one is queued, so the answer to a raw request a handler
/// was slow to take cannot land on a group the unit raised meanwhile.
#[derive(Debug, Clone, Copy)]
struct Reservation {
    /// Still in the queue.
    queued: u32,
    /// Taken by software and not answered.
    taken: u32,
    /// Groups the unit raised under this index and answered itself
    /// (timed out, cancelled) before software did: their late answers
    /// are still to come. A cancel leaves them (the handler that holds
    /// the request may answer after it).
    late: u32,
    /// When the taken and late ones stop reserving the group.
    until: Instant,
}

impl Reservation {
    /// Reserves nothing any more: nothing queued, taken or late.
    fn idle(&self) -> bool {
        self.queued == 0 && self.taken == 0 && self.late == 0
    }
}

impl PrqState {
    /// Whether `key` may be given to a fault the unit raises.
    fn free(&self, key: (SourceId, u16), now: Instant) -> bool {
        !self.groups.contains_key(&key)
            && self
                .reserved
                .get(&key)
                .is_none_or(|r| r.queued == 0 && (r.taken == 0 && r.late == 0 || r.until <= now))
    }

    /// A group the unit answered itself (timed out, or cancelled) while
    /// software may still hold its request: its index stays out of use
    /// until that late answer comes ([`release_late`](Self::release_late))
    /// or `until`, so the answer cannot complete a new group raised under
    /// the same index.
    fn reserve_late(&mut self, key: (SourceId, u16), until: Instant) {
        let r = self.reserved.entry(key).or_insert(Reservation {
            queued: 0,
            taken: 0,
            late: 0,
            until,
        });
        r.late += 1;
        r.until = r.until.max(until);
    }

    /// An answer for `key` that found no group: a late answer to a group
    /// the unit answered itself (or, with none reserved so, a raw
    /// request's, as [`release`](Self::release)).
    fn release_late(&mut self, key: (SourceId, u16)) {
        match self.reserved.get_mut(&key) {
            Some(r) if r.late > 0 => {
                r.late -= 1;
                if r.idle() {
                    self.reserved.remove(&key);
                }
            }
            _ => self.release(key),
        }
    }

    /// One raw request naming `key` was answered (or its device's
    /// requests cancelled): it reserves the group no longer.
    fn release(&mut self, key: (SourceId, u16)) {
        if let Some(r) = self.reserved.get_mut(&key) {
            r.taken = r.taken.saturating_sub(1);
            if r.idle() {
                self.reserved.remove(&key);
            }
        }
    }
}

/// The unit's mark on a raw request in the copy software takes (bit 63 of
/// private qword 3; a request the unit raised has that qword 0): its
/// answer goes to [`Prq::answer_raw`], which releases its reservation and
/// answers no group.
pub(crate) const RAW_MARK: u64 = 1 << 63;

impl PageRequest {
    /// Whether the unit marked this request raw: sent as bytes by a device
    /// ([`Unit::inject_page_request`](super::Unit::inject_page_request)),
    /// not raised by the unit for a miss. Its answer
    /// ([`Unit::answer_page_request`](super::Unit::answer_page_request))
    /// answers no group.
    pub fn is_raw(&self) -> bool {
        self.private[1] & RAW_MARK != 0
    }
}

#[derive(Debug, Default)]
struct Counters {
    raised: AtomicU64,
    overflows: AtomicU64,
    responses: AtomicU64,
    unknown: AtomicU64,
    timed_out: AtomicU64,
    cancelled: AtomicU64,
    restamped: AtomicU64,
    tampered: AtomicU64,
    rerouted: AtomicU64,
    unrouted: AtomicU64,
    forged: AtomicU64,
    raw_answers: AtomicU64,
}

/// A unit's page request queue and its outstanding groups.
#[derive(Debug)]
pub(crate) struct Prq {
    mem: Arc<PhysMemory>,
    base: PhysAddr,
    order: u32,
    len: u32,
    /// Written by software (`PQH_REG`): the index in the low 32 bits, and
    /// above it a count of the head's moves, so that a taker's claim (a
    /// compare-exchange) fails if the head went round the ring and came
    /// back to the index it read meanwhile (an index alone let a stalled
    /// taker claim a slot refilled since, and take a stale request).
    head: AtomicU64,
    /// Written by the unit, under `state`.
    tail: AtomicU32,
    /// The unit's own copy of each slot, written with the ring and the
    /// only copy software's `take` trusts.
    shadow: Box<[[AtomicU64; 4]]>,
    /// Whether each slot holds a raw request (written with the shadow).
    raw: Box<[AtomicBool]>,
    /// Which owner takes which requester's requests.
    routes: Routes,
    overflow: AtomicBool,
    state: Mutex<PrqState>,
    /// Rung when a request is written (software waits on it with `state`).
    doorbell: Condvar,
    /// Threads asleep on `doorbell` (changed under `state`): a request
    /// rings it only when one is, so raising a request to a handler that
    /// is polling costs no system call.
    sleepers: AtomicU32,
    counters: Counters,
    epoch: Instant,
    /// How long a raw request's group stays reserved unanswered (the
    /// unit's `page_response_timeout`).
    reserve_for: Duration,
}

/// What raising a request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Raised {
    /// Written, as group `prgi`.
    Queued { prgi: u16 },
    /// The queue was full (overflow set): answered `Invalid` at once.
    Overflow,
    /// Every group index of the device is outstanding: answered `Invalid`.
    NoGroup,
}

impl Prq {
    /// A zeroed ring of 2^`order` pages in `mem` (frames of the IOMMU).
    pub(crate) fn new(
        mem: Arc<PhysMemory>,
        order: u32,
        reserve_for: Duration,
    ) -> Result<Self, MemError> {
        let base = mem.alloc_zeroed_owned(order, FrameOwner::Iommu)?;
        let len = ((PAGE_SIZE / PRQ_DESCRIPTOR_BYTES) as u32) << order;
        Ok(Self {
            mem,
            base,
            order,
            len,
            head: AtomicU64::new(0),
            tail: AtomicU32::new(0),
            shadow: (0..len).map(|_| Default::default()).collect(),
            raw: (0..len).map(|_| AtomicBool::new(false)).collect(),
            routes: Routes::new(len as usize),
            overflow: AtomicBool::new(false),
            state: Mutex::new(PrqState::default()),
            doorbell: Condvar::new(),
            sleepers: AtomicU32::new(0),
            counters: Counters::default(),
            epoch: Instant::now(),
            reserve_for,
        })
    }

    /// Nanoseconds since the unit was made (the raise stamp).
    pub(crate) fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Enables or disables page requests for `sid`; disabling answers its
    /// outstanding groups `Invalid`.
    pub(crate) fn set_enabled(&self, sid: SourceId, on: bool) {
        let mut st = lock(&self.state);
        if on {
            st.enabled.insert(sid);
        } else {
            st.enabled.remove(&sid);
            drop(st);
            self.routes.set(sid, None);
            self.cancel(sid);
        }
    }

    /// Whether `sid`'s misses raise page requests.
    pub(crate) fn enabled(&self, sid: SourceId) -> bool {
        lock(&self.state).enabled.contains(&sid)
    }

    /// Answers every outstanding group of `sid` `Invalid`.
    pub(crate) fn cancel(&self, sid: SourceId) {
        let groups: Vec<Arc<Group>> = {
            let mut st = lock(&self.state);
            // Its taken raw requests reserve nothing any more; queued ones
            // still do, until they leave the queue.
            st.reserved.retain(|k, r| {
                if k.0 == sid {
                    r.taken = 0;
                }
                !r.idle()
            });
            let keys: Vec<_> = st.groups.keys().filter(|k| k.0 == sid).copied().collect();
            let until = Instant::now() + self.reserve_for;
            let mut groups = Vec::with_capacity(keys.len());
            for k in keys {
                if let Some(g) = st.groups.remove(&k) {
                    // Not answered yet: software may answer it late.
                    if g.code().is_none() {
                        st.reserve_late(k, until);
                    }
                    groups.push(g);
                }
            }
            groups
        };
        for g in groups {
            if g.answer(ResponseCode::Invalid) {
                self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn slot(&self, index: u32) -> PhysAddr {
        self.base + u64::from(index % self.len) * PRQ_DESCRIPTOR_BYTES
    }

    /// Writes `raw` at the tail, if there is room (a raw request if
    /// `is_raw`); under `state`.
    fn push(&self, raw: [u64; 4], is_raw: bool) -> Result<bool, MemError> {
        // Acquire: pairs with software's Release store of the head, so the
        // slots it freed are no longer read.
        let head = self.head_index();
        let tail = self.tail.load(Ordering::Relaxed);
        if (tail + 1) % self.len == head % self.len {
            self.overflow.store(true, Ordering::Release);
            return Ok(false);
        }
        let at = self.slot(tail);
        for (i, w) in raw.iter().enumerate() {
            // Relaxed: published by the tail's Release store below.
            self.mem
                .store_u64(at + 8 * i as u64, *w, Ordering::Relaxed)?;
        }
        if let Some(copy) = self.shadow.get((tail % self.len) as usize) {
            for (c, w) in copy.iter().zip(raw) {
                // Relaxed: published by the tail's Release store below.
                c.store(w, Ordering::Relaxed);
            }
        }
        if let Some(f) = self.raw.get((tail % self.len) as usize) {
            // Relaxed: published by the tail's Release store below.
            f.store(is_raw, Ordering::Relaxed);
        }
        self.tail.store((tail + 1) % self.len, Ordering::Release);
        Ok(true)
    }

    /// Raises a request for the page holding `iova` on behalf of `sid`,
    /// one page per group (LPIG set).
    pub(crate) fn raise(
        &self,
        sid: SourceId,
        iova: u64,
        read: bool,
        write: bool,
    ) -> Result<Raised, MemError> {
        let mut st = lock(&self.state);
        let start = st.next.get(&sid).copied().unwrap_or(0);
        let now = Instant::now();
        let Some(prgi) = (0..PRG_INDICES)
            .map(|i| (start + i) % PRG_INDICES)
            .find(|p| st.free((sid, *p), now))
        else {
            return Ok(Raised::NoGroup);
        };
        let req = PageRequest {
            sid,
            pasid: None,
            read,
            write,
            exec: false,
            privileged: false,
            last: true,
            prgi,
            addr: iova & PAGE_MASK,
            private: [self.now_ns(), 0],
        };
        if !self.push(req.encode(), false)? {
            self.counters.overflows.fetch_add(1, Ordering::Relaxed);
            return Ok(Raised::Overflow);
        }
        st.groups.insert((sid, prgi), Arc::new(Group::new()));
        st.next.insert(sid, (prgi + 1) % PRG_INDICES);
        self.counters.raised.fetch_add(1, Ordering::Relaxed);
        // Read under `state`: a handler counted itself and went to sleep
        // under it, or has yet to look at the tail written above.
        let wake = self.sleepers.load(Ordering::Relaxed) != 0;
        drop(st);
        if wake {
            self.doorbell.notify_all();
        }
        Ok(Raised::Queued { prgi })
    }

    /// Writes a raw descriptor a device sent at the tail. With `from`, its
    /// requester id field is overwritten with `from` (the unit stamps the
    /// requester, as a root port does). A well-formed request that names
    /// a group the unit raised and has not retired is refused (counted
    /// `forged`, `Ok(false)`); one that names a free group, and will be
    /// answered (LPIG), reserves it until answered. Nothing else is
    /// checked and no group is registered. Returns whether it was queued
    /// (`false` also for a full queue).
    pub(crate) fn inject(
        &self,
        from: Option<SourceId>,
        mut raw: [u64; 4],
    ) -> Result<bool, MemError> {
        if let Some(from) = from {
            const RID: u64 = 0xffff << RID_SHIFT;
            let stamped = raw[0] & !RID | u64::from(from.0) << RID_SHIFT;
            if stamped != raw[0] {
                self.counters.restamped.fetch_add(1, Ordering::Relaxed);
            }
            raw[0] = stamped;
        }
        let mut st = lock(&self.state);
        let key = PageRequest::decode(raw)
            .ok()
            .filter(|r| r.last)
            .map(|r| (r.sid, r.prgi));
        if let Some(k) = key {
            if st.groups.contains_key(&k) {
                self.counters.forged.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
        }
        let queued = self.push(raw, true)?;
        if let (true, Some(k)) = (queued, key) {
            let now = Instant::now();
            st.reserved
                .entry(k)
                .or_insert(Reservation {
                    queued: 0,
                    taken: 0,
                    late: 0,
                    until: now,
                })
                .queued += 1;
        }
        drop(st);
        if queued {
            self.doorbell.notify_all();
        } else {
            self.counters.overflows.fetch_add(1, Ordering::Relaxed);
        }
        Ok(queued)
    }

    /// Answers group `prgi` of `sid` (the work of a page group response
    /// descriptor). The group stays registered until its device collects
    /// the answer ([`wait`](Self::wait)). A response for no outstanding
    /// group (unknown, another requester's index, answered already) is
    /// ignored and counted.
    pub(crate) fn respond(&self, sid: SourceId, prgi: u16, code: ResponseCode) {
        let g = {
            let mut st = lock(&self.state);
            let g = st.groups.get(&(sid, prgi)).cloned();
            if g.is_none() {
                // A late answer to a group the unit answered itself, or
                // an unknown one: it frees what it reserved, and answers
                // nothing.
                st.release_late((sid, prgi));
            }
            g
        };
        match g {
            Some(g) if g.answer(code) => {
                self.counters.responses.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                self.counters.unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The answer to a request the unit marked raw ([`RAW_MARK`]): its
    /// reservation is released and nothing else happens; no group the
    /// unit raised is answered, whatever it names.
    pub(crate) fn answer_raw(&self, sid: SourceId, prgi: u16) {
        lock(&self.state).release((sid, prgi));
        // It answered no outstanding group, as an unknown response does.
        self.counters.unknown.fetch_add(1, Ordering::Relaxed);
        self.counters.raw_answers.fetch_add(1, Ordering::Relaxed);
    }

    /// A raw request (the unit's copy `raw`) left the queue: the group it
    /// names stays reserved for `reserve_for` from now, or until answered.
    #[cold]
    fn raw_left(&self, raw: [u64; 4]) {
        let Some(key) = PageRequest::decode(raw)
            .ok()
            .filter(|r| r.last)
            .map(|r| (r.sid, r.prgi))
        else {
            return;
        };
        let until = Instant::now() + self.reserve_for;
        if let Some(r) = lock(&self.state).reserved.get_mut(&key) {
            r.queued = r.queued.saturating_sub(1);
            r.taken += 1;
            r.until = until;
        }
    }

    /// Waits for the answer to `sid`'s group `prgi` until `deadline`, then
    /// retires the group. On timeout the group is answered `Invalid` here
    /// and counted; a group no longer registered (cancelled by a detach)
    /// counts as `Invalid` too.
    pub(crate) fn wait(&self, sid: SourceId, prgi: u16, deadline: Instant) -> ResponseCode {
        let Some(g) = lock(&self.state).groups.get(&(sid, prgi)).cloned() else {
            return ResponseCode::Invalid;
        };
        let mut timed_out = false;
        let code = match g.wait(deadline) {
            Some(c) => c,
            None => {
                if g.answer(ResponseCode::Invalid) {
                    timed_out = true;
                    self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                }
                g.code().unwrap_or(ResponseCode::Invalid)
            }
        };
        let mut st = lock(&self.state);
        if st
            .groups
            .get(&(sid, prgi))
            .is_some_and(|cur| Arc::ptr_eq(cur, &g))
        {
            st.groups.remove(&(sid, prgi));
        }
        // Software holds (or will take) the request and may answer it
        // late: the index waits for that answer, or `reserve_for` (also
        // when a cancel removed the group meanwhile: it saw it answered
        // and reserved nothing).
        if timed_out {
            st.reserve_late((sid, prgi), Instant::now() + self.reserve_for);
        }
        code
    }

    /// The registers now.
    pub(crate) fn registers(&self) -> PrqRegisters {
        PrqRegisters {
            base: self.base,
            order: self.order,
            len: self.len,
            head: self.head_index(),
            tail: self.tail.load(Ordering::Acquire),
            overflow: self.overflow.load(Ordering::Acquire),
        }
    }

    /// Reads the descriptor at `index` (software's read of the ring).
    pub(crate) fn read(&self, index: u32) -> Result<[u64; 4], MemError> {
        let at = self.slot(index);
        let mut raw = [0u64; 4];
        for (i, w) in raw.iter_mut().enumerate() {
            // Relaxed: after the tail's Acquire load in `take`.
            *w = self.mem.load_u64(at + 8 * i as u64, Ordering::Relaxed)?;
        }
        Ok(raw)
    }

    /// The head's index (`PQH_REG`).
    #[inline]
    fn head_index(&self) -> u32 {
        // Acquire: pairs with the Release moves of the head (the slots
        // before it were read).
        self.head.load(Ordering::Acquire) as u32
    }

    /// `head` as the next value of the head word `cur` (one move more).
    fn next_head(cur: u64, head: u32) -> u64 {
        ((cur >> 32).wrapping_add(1) << 32) | u64::from(head)
    }

    /// Software's `PQH_REG` write: the head moves forward over requests
    /// software has read, from the head up to the tail. A head past the
    /// ring, behind the head or past the tail is refused, nothing changed
    /// (before: any index was taken, so old slots were handed out again
    /// and reservations of requests still queued were aged). Raw requests
    /// the head moves past have left the queue (their groups'
    /// reservations start to age).
    pub(crate) fn set_head(&self, head: u32) -> bool {
        if head >= self.len {
            return false;
        }
        loop {
            let cur = self.head.load(Ordering::Acquire);
            let old = cur as u32;
            // The tail only moves on (a push never passes the head), so a
            // head within the queued slots now stays within them.
            let tail = self.tail.load(Ordering::Acquire);
            let queued = (tail + self.len - old) % self.len;
            if (head + self.len - old) % self.len > queued {
                return false;
            }
            // Release: the slots before `head` were read.
            if self
                .head
                .compare_exchange(
                    cur,
                    Self::next_head(cur, head),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                let mut i = old;
                while i != head {
                    self.left_queue(i);
                    i = (i + 1) % self.len;
                }
                return true;
            }
        }
    }

    /// The slot at `index` left the queue: if it held a raw request, its
    /// reservation starts to age. Returns the unit's copy, marked
    /// ([`RAW_MARK`]) if raw.
    fn left_queue(&self, index: u32) -> [u64; 4] {
        let i = (index % self.len) as usize;
        let mut raw = [0u64; 4];
        if let Some(copy) = self.shadow.get(i) {
            for (w, c) in raw.iter_mut().zip(copy) {
                *w = c.load(Ordering::Relaxed);
            }
        }
        if self.raw.get(i).is_some_and(|f| f.load(Ordering::Relaxed)) {
            self.raw_left(raw);
            raw[3] |= RAW_MARK;
        }
        raw
    }

    /// Clears `PRS_REG.PRO`.
    pub(crate) fn clear_overflow(&self) {
        self.overflow.store(false, Ordering::Release);
    }

    /// Takes the descriptor at the head, if any, moving the head past it:
    /// the unit's own copy of it (a ring slot whose bytes differ is
    /// counted as tampered with). Several takers may run at once (handler
    /// threads): each descriptor is taken once. A taker reads the slot,
    /// then claims it by moving the head with a compare-exchange; the unit
    /// cannot overwrite the slot before the head has moved past it, so a
    /// successful claim read it whole.
    pub(crate) fn take(&self) -> Option<Result<[u64; 4], MemError>> {
        loop {
            let cur = self.head.load(Ordering::Acquire);
            let head = cur as u32;
            // Acquire: pairs with `push`'s Release store of the tail.
            if head == self.tail.load(Ordering::Acquire) {
                return None;
            }
            let ring = self.read(head);
            let mut raw = [0u64; 4];
            if let Some(copy) = self.shadow.get((head % self.len) as usize) {
                for (w, c) in raw.iter_mut().zip(copy) {
                    // Relaxed: after the tail's Acquire load above.
                    *w = c.load(Ordering::Relaxed);
                }
            }
            let is_raw = self
                .raw
                .get((head % self.len) as usize)
                // Relaxed: after the tail's Acquire load above.
                .is_some_and(|f| f.load(Ordering::Relaxed));
            // Release: the slot was read before the unit may reuse it.
            if self
                .head
                .compare_exchange(
                    cur,
                    Self::next_head(cur, (head + 1) % self.len),
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                if ring.is_ok_and(|r| r != raw) {
                    self.counters.tampered.fetch_add(1, Ordering::Relaxed);
                }
                if is_raw {
                    self.raw_left(raw);
                    raw[3] |= RAW_MARK;
                }
                return Some(Ok(raw));
            }
        }
    }

    /// Makes `owner` the one software owner that takes `sid`'s requests
    /// (`None`: nobody; its parked requests are dropped).
    pub(crate) fn route(&self, sid: SourceId, owner: Option<u64>) {
        self.routes.set(sid, owner);
    }

    /// Takes the next request for a device `owner` owns: one another owner
    /// parked for it, or else from the head of the queue, where requests
    /// of other owners' devices are parked for them (and they are woken)
    /// and requests of devices nobody owns are answered `Invalid` at once.
    pub(crate) fn take_for(&self, owner: u64) -> Option<Result<[u64; 4], MemError>> {
        if let Some(raw) = self.routes.pop(owner) {
            return Some(Ok(raw));
        }
        loop {
            let raw = match self.take()? {
                Ok(raw) => raw,
                Err(e) => return Some(Err(e)),
            };
            match self.routes.sort(owner, raw) {
                Route::Mine => return Some(Ok(raw)),
                Route::Parked => {
                    self.counters.rerouted.fetch_add(1, Ordering::Relaxed);
                    self.kick();
                }
                Route::Full | Route::Unrouted => {
                    self.counters.unrouted.fetch_add(1, Ordering::Relaxed);
                    // A descriptor that does not decode names no group;
                    // a raw one answers only itself.
                    if let Ok(r) = PageRequest::decode(raw) {
                        if r.last && r.is_raw() {
                            self.answer_raw(r.sid, r.prgi);
                        } else if r.last {
                            self.respond(r.sid, r.prgi, ResponseCode::Invalid);
                        }
                    }
                }
            }
        }
    }

    /// As [`wait_request`](Self::wait_request), also woken by a request
    /// parked for `owner`.
    pub(crate) fn wait_request_for(&self, owner: u64, timeout: Duration) -> bool {
        let st = lock(&self.state);
        // Under `state`: a request parked after this look rings the
        // doorbell under `state`, so after this thread sleeps.
        if self.head_index() != self.tail.load(Ordering::Acquire) || self.routes.has(owner) {
            return true;
        }
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        let (_st, _) = self
            .doorbell
            .wait_timeout(st, timeout)
            .unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        self.head_index() != self.tail.load(Ordering::Acquire) || self.routes.has(owner)
    }

    /// Waits until a request is in the queue or `timeout` passes.
    pub(crate) fn wait_request(&self, timeout: Duration) -> bool {
        let st = lock(&self.state);
        if self.head_index() != self.tail.load(Ordering::Acquire) {
            return true;
        }
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        let (_st, _) = self
            .doorbell
            .wait_timeout(st, timeout)
            .unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        self.head_index() != self.tail.load(Ordering::Acquire)
    }

    /// Wakes every thread waiting for a request (a handler shutting down).
    pub(crate) fn kick(&self) {
        let _st = lock(&self.state);
        self.doorbell.notify_all();
    }

    /// The counts now.
    pub(crate) fn stats(&self) -> PrqStats {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        PrqStats {
            raised: r(&c.raised),
            overflows: r(&c.overflows),
            responses: r(&c.responses),
            unknown_responses: r(&c.unknown),
            timed_out: r(&c.timed_out),
            cancelled: r(&c.cancelled),
            restamped: r(&c.restamped),
            ring_tampered: r(&c.tampered),
            rerouted: r(&c.rerouted),
            unrouted: r(&c.unrouted),
            forged: r(&c.forged),
            raw_answers: r(&c.raw_answers),
        }
    }
}

impl Drop for Prq {
    fn drop(&mut self) {
        // Cannot fail: the ring was allocated with this order.
        let _ = self
            .mem
            .free_owned(self.base, self.order, FrameOwner::Iommu);
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn req() -> PageRequest {
        PageRequest {
            sid: SourceId(0x1234),
            pasid: Some(0xabcde),
            read: true,
            write: false,
            exec: true,
            privileged: false,
            last: true,
            prgi: 0x1a5,
            addr: 0x7654_3000,
            private: [42, 7],
        }
    }

    #[test]
    fn descriptors_round_trip_and_reserved_bits_are_refused() {
        let r = req();
        let raw = r.encode();
        assert_eq!(raw[0] & 0xff, 1);
        assert_eq!(raw[1] >> 3 & 0x1ff, 0x1a5);
        assert_eq!(PageRequest::decode(raw), Ok(r));
        let mut bad = raw;
        bad[0] |= 1 << 12;
        assert_eq!(
            PageRequest::decode(bad),
            Err(PageRequestError::ReservedBits {
                qword: 0,
                bits: 1 << 12
            })
        );
        bad = raw;
        bad[0] = bad[0] & !0xff | 0x05;
        assert_eq!(
            PageRequest::decode(bad),
            Err(PageRequestError::NotAPageRequest { ty: 5 })
        );
        bad = raw;
        bad[1] &= !3;
        assert_eq!(PageRequest::decode(bad), Err(PageRequestError::NoAccess));
        let no_pasid = PageRequest { pasid: None, ..r };
        let mut raw = no_pasid.encode();
        assert_eq!(PageRequest::decode(raw), Ok(no_pasid));
        raw[0] |= 5 << 32;
        assert!(matches!(
            PageRequest::decode(raw),
            Err(PageRequestError::ReservedBits { qword: 0, .. })
        ));
    }

    /// Software's head moves only forward over queued requests: past the
    /// ring, behind the head or past the tail is refused with nothing
    /// changed (before: any index was taken, and old slots were handed
    /// out again). A claim read before the head went round the ring and
    /// came back to the same index fails (the head word counts its moves).
    #[test]
    fn the_head_moves_only_forward_over_queued_requests() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let q = Prq::new(mem, 0, Duration::from_secs(60)).unwrap();
        let sid = SourceId(9);
        for i in 0..3 {
            assert!(matches!(
                q.raise(sid, i << 12, true, false),
                Ok(Raised::Queued { .. })
            ));
        }
        // head 0, tail 3.
        assert!(!q.set_head(128), "past the ring");
        assert!(!q.set_head(4), "past the tail");
        assert!(!q.set_head(127), "behind the head");
        assert_eq!(q.registers().head, 0);
        assert!(q.set_head(2));
        assert!(!q.set_head(1), "behind the head");
        assert_eq!((q.registers().head, q.registers().tail), (2, 3));
        assert!(q.set_head(3));
        assert!(q.take().is_none());
        // The same index, one move later: a stale claim's word differs.
        let before = q.head.load(Ordering::Acquire);
        assert!(q.set_head(3));
        assert_ne!(q.head.load(Ordering::Acquire), before);
        assert_eq!(q.head.load(Ordering::Acquire) as u32, before as u32);
    }

    #[test]
    fn requests_flow_and_a_full_queue_overflows_at_once() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let q = Prq::new(mem.clone(), 0, Duration::from_secs(1)).unwrap();
        assert_eq!(q.registers().len, 128);
        let sid = SourceId(9);
        for i in 0..127 {
            assert!(matches!(
                q.raise(sid, i << 12, true, false),
                Ok(Raised::Queued { .. })
            ));
        }
        assert_eq!(q.raise(sid, 0, true, false), Ok(Raised::Overflow));
        assert!(q.registers().overflow);
        assert_eq!(q.stats().overflows, 1);
        let first = PageRequest::decode(q.take().unwrap().unwrap()).unwrap();
        assert_eq!((first.sid, first.addr, first.prgi), (sid, 0, 0));
        q.respond(sid, first.prgi, ResponseCode::Success);
        q.respond(sid, first.prgi, ResponseCode::Invalid);
        assert_eq!(q.stats().unknown_responses, 1, "answered already");
        assert_eq!(q.wait(sid, 0, Instant::now()), ResponseCode::Success);
        q.respond(sid, 0, ResponseCode::Success);
        q.respond(SourceId(10), 1, ResponseCode::Success);
        assert_eq!(
            q.stats().unknown_responses,
            3,
            "collected; another requester"
        );
        q.clear_overflow();
        assert!(!q.registers().overflow);
        // A deadline that passes answers the group Invalid, counted.
        let second = PageRequest::decode(q.take().unwrap().unwrap()).unwrap();
        assert_eq!(
            q.wait(sid, second.prgi, Instant::now()),
            ResponseCode::Invalid
        );
        assert_eq!(q.stats().timed_out, 1);
        // Disabling cancels what is outstanding.
        q.set_enabled(sid, true);
        assert!(q.enabled(sid));
        q.set_enabled(sid, false);
        assert_eq!(q.stats().cancelled, 125);
    }

    /// A group the unit timed out keeps its index until software's late
    /// answer comes: that answer cannot complete a new group raised under
    /// the same index after the cursor went round (before: the new group
    /// read Success for a page never served).
    #[test]
    fn a_late_answer_to_a_timed_out_group_completes_no_new_group() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let q = Prq::new(mem, 0, Duration::from_secs(60)).unwrap();
        let sid = SourceId(9);
        assert_eq!(
            q.raise(sid, 0x1000, true, false),
            Ok(Raised::Queued { prgi: 0 })
        );
        // Software takes it, and is slow to answer: the device gives up.
        let old = PageRequest::decode(q.take().unwrap().unwrap()).unwrap();
        assert_eq!(q.wait(sid, 0, Instant::now()), ResponseCode::Invalid);
        // A cancel of the device's requests (a detach, a context change)
        // leaves the late answer's reservation: the handler still holds
        // the request.
        q.cancel(sid);
        assert!(!lock(&q.state).free((sid, 0), Instant::now()));
        // The device's next groups take every other index, answered.
        for p in 1..PRG_INDICES {
            assert_eq!(
                q.raise(sid, 0x2000, true, false),
                Ok(Raised::Queued { prgi: p })
            );
            q.take().unwrap().unwrap();
            q.respond(sid, p, ResponseCode::Success);
            assert_eq!(q.wait(sid, p, Instant::now()), ResponseCode::Success);
        }
        // Index 0 is still reserved for the late answer.
        let Ok(Raised::Queued { prgi: new }) = q.raise(sid, 0x5000, true, false) else {
            panic!("no group raised");
        };
        assert_ne!(new, 0);
        let unknown = q.stats().unknown_responses;
        q.respond(old.sid, old.prgi, ResponseCode::Success);
        assert_eq!(q.stats().unknown_responses, unknown + 1);
        // The new group was never answered: it times out Invalid.
        assert_eq!(q.wait(sid, new, Instant::now()), ResponseCode::Invalid);
        // The late answer freed index 0; the new group's stays reserved
        // for its own late answer.
        let st = lock(&q.state);
        assert!(st.free((sid, 0), Instant::now()));
        assert!(!st.free((sid, new), Instant::now()));
    }

    #[test]
    fn requests_reach_their_owner_and_unowned_ones_are_answered_by_the_unit() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let q = Prq::new(mem, 0, Duration::from_secs(1)).unwrap();
        let (a, b, nobody) = (SourceId(1), SourceId(2), SourceId(3));
        q.route(a, Some(10));
        q.route(b, Some(20));
        for (i, sid) in [a, b, nobody, b, a].into_iter().enumerate() {
            assert!(matches!(
                q.raise(sid, (i as u64) << 12, true, false),
                Ok(Raised::Queued { .. })
            ));
        }
        let sid = |raw: [u64; 4]| PageRequest::decode(raw).unwrap().sid;
        // Owner 10 takes its two; b's are parked for 20 on the way; the
        // unowned one is answered `Invalid` by the unit.
        assert_eq!(sid(q.take_for(10).unwrap().unwrap()), a);
        assert_eq!(sid(q.take_for(10).unwrap().unwrap()), a);
        assert!(q.take_for(10).is_none());
        let s = q.stats();
        assert_eq!((s.rerouted, s.unrouted, s.responses), (2, 1, 1));
        assert_eq!(q.wait(nobody, 0, Instant::now()), ResponseCode::Invalid);
        assert!(q.wait_request_for(20, Duration::ZERO), "20 has mail");
        assert!(!q.wait_request_for(10, Duration::ZERO));
        assert_eq!(sid(q.take_for(20).unwrap().unwrap()), b);
        // Removing a route drops what was parked for that device.
        q.route(b, None);
        assert!(q.take_for(20).is_none());
        assert!(!q.wait_request_for(20, Duration::ZERO));
    }

    #[test]
    fn a_raw_request_reserves_its_group_and_cannot_take_a_raised_one() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let q = Prq::new(mem, 0, Duration::from_secs(60)).unwrap();
        let (v, x) = (SourceId(7), SourceId(8));
        let mut forged = req();
        forged.pasid = None;
        forged.sid = v;
        forged.prgi = 0;
        // Reserves v's group 0: v's fault gets group 1.
        assert_eq!(q.inject(None, forged.encode()), Ok(true));
        assert_eq!(q.raise(v, 0, true, false), Ok(Raised::Queued { prgi: 1 }));
        // Naming the outstanding group 1: refused.
        forged.prgi = 1;
        assert_eq!(q.inject(None, forged.encode()), Ok(false));
        assert_eq!(q.stats().forged, 1);
        // Sent by x: stamped x, whatever it names.
        assert_eq!(q.inject(Some(x), forged.encode()), Ok(true));
        assert_eq!(q.stats().restamped, 1);
        let taken: Vec<_> = (0..3)
            .map(|_| PageRequest::decode(q.take().unwrap().unwrap()).unwrap())
            .map(|r| (r.sid, r.prgi))
            .collect();
        assert_eq!(taken, vec![(v, 0), (v, 1), (x, 1)]);
        // The raw request's answer frees its reservation, answering nothing.
        q.respond(v, 0, ResponseCode::Invalid);
        assert_eq!(q.stats().unknown_responses, 1);
        q.respond(v, 1, ResponseCode::Success);
        assert_eq!(q.wait(v, 1, Instant::now()), ResponseCode::Success);
        assert_eq!(q.raise(v, 0, true, false), Ok(Raised::Queued { prgi: 2 }));
    }
}
