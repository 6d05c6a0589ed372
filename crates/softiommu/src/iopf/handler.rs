//! The page request handler: threads (or, inline, the caller) that drain
//! a unit's page request queue, serve each request from its domain's
//! memory map, answer the group, and measure how long each request
//! waited.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::domain::IopfDomain;
use super::error::IopfError;
use super::groups::{worst, Assembled};
use super::histogram::{LatencyHistogram, LatencySummary};
use crate::hw::{HwError, PageRequest, ResponseCode, Taken, UnitId};

/// The most handler threads per unit.
pub const MAX_HANDLER_THREADS: usize = 16;
/// Empty polls before a handler thread started with [`IopfHandler::start`]
/// sleeps on the queue's doorbell: a few microseconds of spinning, so a
/// request that arrives while the handler is awake is answered in about a
/// microsecond, and an idle handler costs nothing.
pub const DEFAULT_SPIN_POLLS: u32 = 2048;
/// Of a handler's empty polls, the first this many only pause; the rest
/// yield the core between polls (a device spinning for the answer on the
/// same core would otherwise wait for the scheduler's next tick, ~4 ms).
const PAUSE_POLLS: u32 = 16384;
/// The most empty polls [`IopfHandler::start_spinning`] accepts (about a
/// second of spinning).
pub const MAX_SPIN_POLLS: u32 = 1 << 26;

/// Counts and latencies of a handler.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HandlerStats {
    /// Requests taken from the queue.
    pub requests: u64,
    /// Groups answered `Success` (counted as the answer is sent).
    pub answered_success: u64,
    /// Groups answered `Invalid` (counted as the answer is sent).
    pub answered_invalid: u64,
    /// Requests from devices not attached to the domain (answered
    /// `Invalid`): only a request routed here before its device was
    /// detached; requests of other domains' devices go to their own
    /// handlers.
    pub foreign: u64,
    /// Descriptors that did not decode (dropped; they name no group).
    pub malformed: u64,
    /// Answers the invalidation queue refused (their devices time out).
    pub respond_errors: u64,
    /// From the request's raise to its answer being carried out, per
    /// answered group.
    pub latency: LatencySummary,
    /// Of that, the handler's own part: from taking the request off the
    /// queue to its answer being carried out (the rest is the request's
    /// wait in the queue, for a handler thread to look or to be woken).
    pub service: LatencySummary,
}

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    requests: AtomicU64,
    success: AtomicU64,
    invalid: AtomicU64,
    foreign: AtomicU64,
    malformed: AtomicU64,
    respond_errors: AtomicU64,
    latency: LatencyHistogram,
    service: LatencyHistogram,
    /// Whether each request's service is timed on the thread's CPU clock.
    time_service: AtomicBool,
    /// CPU ns the threads spent serving requests, when timed.
    service_cpu_ns: AtomicU64,
}

/// Adds the calling thread's CPU time from its start to its drop to a
/// counter: a request's service, over every way out of it.
struct CpuSpan<'a> {
    start: Duration,
    into: &'a AtomicU64,
}

impl<'a> CpuSpan<'a> {
    fn start(into: &'a AtomicU64) -> Self {
        Self {
            start: crate::cpu_clock::thread(),
            into,
        }
    }
}

impl Drop for CpuSpan<'_> {
    fn drop(&mut self) {
        let spent = crate::cpu_clock::thread().saturating_sub(self.start);
        self.into
            .fetch_add(u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }
}

/// Serves the page requests of one unit for one [`IopfDomain`], on
/// threads of its own ([`start`](Self::start)) or on whoever calls
/// [`serve_pending`](Self::serve_pending) ([`inline`](Self::inline)),
/// until stopped or dropped. It takes only the
/// requests of the domain's own devices (the unit routes each request by
/// its stamped requester id to the domain that owns the device), so
/// several domains on one unit, each with a handler, never see or answer
/// each other's requests. Stopping answers every
/// outstanding group of the domain's devices `Invalid`.
#[derive(Debug)]
pub struct IopfHandler {
    domain: Arc<IopfDomain>,
    unit: UnitId,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Counted among the domain's handlers of `unit` (a handler that
    /// failed to start never was): only the last one to stop answers the
    /// outstanding groups `Invalid`.
    counted: bool,
}

impl IopfHandler {
    /// Starts `threads` (1 to [`MAX_HANDLER_THREADS`]) threads serving
    /// `unit`'s queue for `domain`.
    pub fn start(domain: Arc<IopfDomain>, unit: UnitId, threads: usize) -> Result<Self, IopfError> {
        Self::start_spinning(domain, unit, threads, DEFAULT_SPIN_POLLS)
    }

    /// As [`start`](Self::start), with the threads polling the empty queue
    /// `spin_polls` times (0 to [`MAX_SPIN_POLLS`]) before they sleep on
    /// its doorbell: 0 parks at once (every request pays a wake-up), more
    /// keeps the thread awake for a while after each request so the next
    /// one is seen at once (the first 16,384 polls pause, the rest yield
    /// the core between polls).
    pub fn start_spinning(
        domain: Arc<IopfDomain>,
        unit: UnitId,
        threads: usize,
        spin_polls: u32,
    ) -> Result<Self, IopfError> {
        if spin_polls > MAX_SPIN_POLLS {
            return Err(IopfError::InvalidConfig {
                name: "handler spin polls",
                value: u64::from(spin_polls),
                max: u64::from(MAX_SPIN_POLLS),
            });
        }
        if !(1..=MAX_HANDLER_THREADS).contains(&threads) {
            return Err(IopfError::InvalidConfig {
                name: "handler threads",
                value: threads as u64,
                max: MAX_HANDLER_THREADS as u64,
            });
        }
        if domain.system().unit(unit).is_none() {
            return Err(HwError::UnknownUnit(unit).into());
        }
        let shared = Arc::new(Shared::default());
        let mut handler = Self {
            domain,
            unit,
            shared,
            threads: Vec::with_capacity(threads),
            counted: false,
        };
        for i in 0..threads {
            let (d, s) = (handler.domain.clone(), handler.shared.clone());
            let t = std::thread::Builder::new()
                .name(format!("iopf-{}-{i}", unit.0))
                .spawn(move || serve_loop(&d, unit, &s, spin_polls))
                .map_err(|_| IopfError::Spawn)?;
            handler.threads.push(t);
        }
        handler.domain.handler_started(unit);
        handler.counted = true;
        Ok(handler)
    }

    /// A handler with no threads of its own: the requests are served by
    /// whoever calls [`serve_pending`](Self::serve_pending), typically the
    /// faulting device's own thread between raising a request and waiting
    /// for its answer ([`DmaAccessor::on_page_request`]). The fault path's
    /// whole work then runs on one thread, one step after the other, with
    /// no other thread spinning beside it: how a lab measures that work
    /// apart from the cost of two cores talking to each other. Stopping
    /// answers every outstanding group `Invalid`, as for threads.
    ///
    /// [`DmaAccessor::on_page_request`]: crate::access::DmaAccessor::on_page_request
    pub fn inline(domain: Arc<IopfDomain>, unit: UnitId) -> Result<Self, IopfError> {
        if domain.system().unit(unit).is_none() {
            return Err(HwError::UnknownUnit(unit).into());
        }
        domain.handler_started(unit);
        Ok(Self {
            domain,
            unit,
            shared: Arc::new(Shared::default()),
            threads: Vec::new(),
            counted: true,
        })
    }

    /// Serves, on the calling thread, the requests of the domain's devices
    /// waiting in the unit's queue, at most `limit` of them (a device that
    /// keeps faulting cannot hold the caller for ever); returns how many
    /// it took. Works beside the handler's threads too (each request is
    /// taken once), and does nothing once the handler is stopping. A
    /// request past `limit` (another device's, or a group of several
    /// requests) waits for the next call, a handler thread, or its
    /// device's response timeout: an inline handler serves a domain whose
    /// every device calls it as it faults.
    pub fn serve_pending(&self, limit: usize) -> usize {
        let Some(unit) = self.domain.system().unit(self.unit) else {
            return 0;
        };
        let owner = self.domain.owner_id();
        let mut n = 0;
        while n < limit && !self.shared.stop.load(Relaxed) {
            let Some(next) = take_next(&self.domain, self.unit, unit, owner) else {
                break;
            };
            serve_taken(&self.domain, unit, &self.shared, next);
            n += 1;
        }
        n
    }

    /// The counts and latencies so far.
    pub fn stats(&self) -> HandlerStats {
        let s = &self.shared;
        HandlerStats {
            requests: s.requests.load(Relaxed),
            answered_success: s.success.load(Relaxed),
            answered_invalid: s.invalid.load(Relaxed),
            foreign: s.foreign.load(Relaxed),
            malformed: s.malformed.load(Relaxed),
            respond_errors: s.respond_errors.load(Relaxed),
            latency: s.latency.summary(),
            service: s.service.summary(),
        }
    }

    /// Times each request's service (from taking it off the queue to its
    /// answer carried out) on the serving thread's CPU clock, into
    /// [`service_cpu`](Self::service_cpu); off by default (two clock
    /// reads, a system call each, per request). The polls of an empty
    /// queue, the spinning and the sleeping are not service.
    pub fn time_service(&self, on: bool) {
        self.shared.time_service.store(on, Relaxed);
    }

    /// CPU time the threads spent serving requests while timed
    /// ([`time_service`](Self::time_service)).
    pub fn service_cpu(&self) -> Duration {
        Duration::from_nanos(self.shared.service_cpu_ns.load(Relaxed))
    }

    /// The handler's own part of each answer (take to answer carried
    /// out), whole.
    pub fn service(&self) -> &LatencyHistogram {
        &self.shared.service
    }

    /// The raise-to-answer latencies recorded so far, whole (to merge
    /// several handlers' with [`LatencyHistogram::merge`]).
    pub fn latency(&self) -> &LatencyHistogram {
        &self.shared.latency
    }

    /// Forgets the latencies recorded so far (between runs of a lab).
    pub fn reset_latency(&self) {
        self.shared.latency.reset();
        self.shared.service.reset();
    }

    /// Stops the threads; the domain's last handler of the unit to stop
    /// answers every outstanding group of the domain's devices behind the
    /// unit `Invalid` (another handler still serving them keeps them).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Relaxed);
        let system = self.domain.system().clone();
        if let Some(unit) = system.unit(self.unit) {
            unit.kick_page_requests();
        }
        for t in self.threads.drain(..) {
            // A panic on a handler thread was reported; nothing to add.
            let _ = t.join();
        }
        // A handler that never started changes nothing; one of several
        // leaves the others' requests to them (before: any handler's stop,
        // or a failed start, answered every group of the domain `Invalid`).
        let last = std::mem::take(&mut self.counted) && self.domain.handler_stopped(self.unit);
        if !last {
            return;
        }
        if let Some(unit) = system.unit(self.unit) {
            for (sid, u) in self.domain.devices() {
                if u == self.unit {
                    unit.cancel_page_requests(sid);
                }
            }
        }
    }
}

impl Drop for IopfHandler {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve_loop(domain: &IopfDomain, unit_id: UnitId, s: &Shared, spin_polls: u32) {
    let system = domain.system().clone();
    let Some(unit) = system.unit(unit_id) else {
        return;
    };
    let owner = domain.owner_id();
    // A thread spins after serving a request (the device's next fault may
    // follow at once), not before the first: it starts asleep.
    let mut idle = spin_polls;
    while !s.stop.load(Relaxed) {
        // Only the requests of devices the domain owns: others are handed
        // to their own domain's handler (see `hw::prq_route`).
        let Some(next) = take_next(domain, unit_id, unit, owner) else {
            idle = idle.saturating_add(1);
            if idle < spin_polls.min(PAUSE_POLLS) {
                std::hint::spin_loop();
            } else if idle < spin_polls {
                // Past the pure spin, each poll gives the core away: a
                // device waiting for this thread's answer on the same
                // core runs at once instead of at the next tick.
                std::thread::yield_now();
            } else {
                unit.wait_routed_page_request(owner, Duration::from_millis(2));
            }
            continue;
        };
        idle = 0;
        serve_taken(domain, unit, s, next);
    }
}

/// A request taken off the queue, its group assembled.
enum Next {
    /// Held until its group's last request (`groups`).
    Held,
    /// A group complete: its requests before the last, and the last.
    Group {
        earlier: Vec<PageRequest>,
        last: PageRequest,
        /// A request of it was dropped past the bound: `Invalid`.
        dropped: bool,
    },
    /// A request of a device not attached to the domain.
    Foreign(PageRequest),
    /// A descriptor that did not decode, or could not be read.
    Malformed,
}

/// Takes the next request of the domain's devices off `unit`'s queue and
/// adds it to its group, under the domain's group lock (so the requests
/// of a group reach the store in queue order whichever thread took each,
/// and none after its last).
fn take_next(
    domain: &IopfDomain,
    unit_id: UnitId,
    unit: &crate::hw::Unit,
    owner: u64,
) -> Option<Next> {
    let mut groups = domain.partial_groups();
    let r = match unit.take_routed_page_request(owner)? {
        Ok(Taken::Request(r)) => r,
        Ok(Taken::Malformed { .. }) | Err(_) => return Some(Next::Malformed),
    };
    if !domain.is_attached(r.sid) {
        return Some(Next::Foreign(r));
    }
    Some(match groups.add(unit_id, &r) {
        Assembled::Held => Next::Held,
        Assembled::Complete { earlier, dropped } => Next::Group {
            earlier,
            last: r,
            dropped,
        },
    })
}

/// Serves one request taken off the queue: holds it, or, for a group's
/// last request, serves the whole group (maps what each request asks for,
/// or refuses it) and answers it with the worst of its pages' codes.
fn serve_taken(domain: &IopfDomain, unit: &crate::hw::Unit, s: &Shared, next: Next) {
    let _span = s
        .time_service
        .load(Relaxed)
        .then(|| CpuSpan::start(&s.service_cpu_ns));
    let took = unit.page_request_clock_ns();
    let (r, code) = match next {
        Next::Malformed => {
            s.malformed.fetch_add(1, Relaxed);
            return;
        }
        Next::Held => {
            s.requests.fetch_add(1, Relaxed);
            return;
        }
        Next::Foreign(r) => {
            s.requests.fetch_add(1, Relaxed);
            s.foreign.fetch_add(1, Relaxed);
            if !r.last {
                // Only the group's last request is answered (LPIG).
                return;
            }
            (r, ResponseCode::Invalid)
        }
        Next::Group {
            earlier,
            last,
            dropped,
        } => {
            s.requests.fetch_add(1, Relaxed);
            let code = if dropped {
                ResponseCode::Invalid
            } else {
                // Every page served before the answer goes out: Success
                // only if each was.
                worst(earlier.iter().chain([&last]).map(|p| domain.serve(p)))
            };
            (last, code)
        }
    };
    // Counted before the answer goes out: a device that sees it finds
    // the handler's counts already there.
    match code {
        ResponseCode::Success => s.success.fetch_add(1, Relaxed),
        _ => s.invalid.fetch_add(1, Relaxed),
    };
    // A raw request's answer releases only its own reservation.
    if unit.answer_page_request(&r, code).is_err() {
        s.respond_errors.fetch_add(1, Relaxed);
        return;
    }
    let now = unit.page_request_clock_ns();
    // A raw request's private words are the device's own: its raise time
    // is not the unit's, and a latency from it would be whatever the
    // device wrote (0 read as the unit's uptime).
    if !r.is_raw() {
        s.latency.record(now.saturating_sub(r.private[0]));
    }
    s.service.record(now.saturating_sub(took));
}
