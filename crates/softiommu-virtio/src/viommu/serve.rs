//! One round of the request queue: at most `batch` chains taken — and
//! none once one `invalidation_timeout` has passed since the round began,
//! the rest left for the next round — each
//! parsed and carried out on the [`State`], the round's invalidations
//! issued together and waited for, and only then every chain of the round
//! returned — so an UNMAP is used only after the unit's invalidation for
//! it has completed, and one notification's UNMAPs cost one wait.

use std::sync::mpsc;

use softiommu::access::{unit_section, PhysGuestMemory};
use softiommu::hw::Unit;

use super::chain::Parts;
use super::config::ViommuConfig;
use super::probe::properties;
use super::request::{ParseError, Request, MAX_REQUEST};
use super::state::{Negotiated, State};
use super::stats::{bump, Counters};
use super::status::Status;
use crate::spec::iommu as s;
use crate::transport::{ChainDir, DeviceEnd, DeviceError, DeviceQueue};

/// A chain taken this round, returned at its end.
#[derive(Debug, Clone, Copy)]
struct Done {
    head: u16,
    used: u32,
    /// The status written, if any.
    status: Option<Status>,
    /// For an UNMAP carried out: the guest address of its tail's status
    /// byte, which holds `DEVERR` until the round's invalidation has
    /// completed and `OK` is written there.
    unmap_status_at: Option<u64>,
}

/// The request queue's worker state, reused across rounds.
#[derive(Debug, Default)]
pub(crate) struct Server {
    parts: Parts,
    /// The readable part of the chain being served (`MAX_REQUEST` bytes
    /// once a round has run).
    buf: Vec<u8>,
    done: Vec<Done>,
    probe: Vec<u8>,
    /// Whether the last round stopped taking chains because its time ran
    /// out (chains may be waiting: serve another round at once).
    cut: bool,
    /// Fault injection: the next tail written in [`one`](Self::one)
    /// first signals the sender, then waits for the receiver, inside its
    /// section (a device thread preempted between a slice and its write).
    stall: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
}

/// Chains a round takes between two looks at the clock when none of them
/// may wait (see [`Server::round`]).
const CLOCK_EVERY: usize = 16;

/// The device's unit, when its thread has no translation section there.
const NO_SECTION: DeviceError = DeviceError::BackendFailed {
    what: "no translation section for the device thread",
};

/// Runs `f`, a piece of the device's own accesses to guest memory (made
/// through an unchecked-after-handout [`PhysGuestMemory`] view), inside
/// the thread's translation section on `unit`: a bounce pool being made
/// waits for it, so no write through a slice handed out before the
/// pool's frames were marked lands after the pool starts. Never around a
/// request's own work on the unit (a wait inside a section is refused).
/// `no_section` if the thread can get no section (made once per thread).
fn sec<T, E>(unit: &Unit, no_section: E, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    unit_section(unit, f).unwrap_or(Err(no_section))
}

impl Server {
    /// Serves one round; returns whether chains were taken (the caller
    /// goes on without sleeping).
    ///
    /// The round takes chains until the queue is empty, `batch` are taken,
    /// or one `invalidation_timeout` has passed since it began (each chain
    /// may wait up to that bound for an ATTACH's or DETACH's drain, so
    /// `batch` of them could otherwise hold the queue — and a reset or a
    /// `bypass` write waiting for it — for `batch` bounds): a round lasts
    /// at most about three bounds (chains taken for one, the last one's
    /// wait, the round's invalidation), and what is left waits for the
    /// next round ([`was_cut`](Self::was_cut)).
    pub(crate) fn round(
        &mut self,
        q: &mut DeviceQueue,
        state: &mut State,
        cfg: &ViommuConfig,
        end: &DeviceEnd,
        mem: &PhysGuestMemory,
        c: &Counters,
    ) -> bool {
        let neg = Negotiated::from_features(end.features());
        let (system, uid) = state.unit_handle();
        let Some(unit) = system.unit(uid) else {
            return false;
        };
        self.done.clear();
        self.cut = false;
        self.buf.resize(MAX_REQUEST, 0);
        let deadline = std::time::Instant::now().checked_add(cfg.invalidation_timeout);
        // Whether the clock must be read before the next chain: after a
        // chain that may have waited (an ATTACH's or DETACH's drain, up
        // to one bound) and every `CLOCK_EVERY` chains — the others
        // (MAP, UNMAP, PROBE) never wait, so between two looks the round
        // runs at most `CLOCK_EVERY` of them past its bound.
        let mut look = false;
        for i in 0..cfg.batch {
            if (look || i % CLOCK_EVERY == 0)
                && deadline.is_some_and(|d| std::time::Instant::now() >= d)
            {
                self.cut = true;
                break;
            }
            let (parts, buf) = (&mut self.parts, &mut self.buf);
            // The chain taken, walked and its readable part read in one
            // section (reads only: a fault reading the request is the
            // request's `FAULT`, not the queue's).
            let taken = sec(unit, NO_SECTION, || {
                let Some(head) = q.pop(mem)? else {
                    return Ok(None);
                };
                q.walk(mem, head, ChainDir::ReadableThenWritable, &mut parts.descs)?;
                Ok(Some((head, parts.read(mem, &mut buf[..]))))
            });
            let (head, got) = match taken {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    q.stop();
                    end.report(e);
                    break;
                }
            };
            look =
                matches!(got, Ok(n) if n > 0 && matches!(self.buf[0], s::T_ATTACH | s::T_DETACH));
            let d = self.one(head, got, state, cfg, neg, mem, c, unit);
            self.done.push(d);
        }
        if self.done.is_empty() {
            return false;
        }
        bump(&c.rounds, 1);
        let mut invalidated = true;
        if !state.pending.is_empty() {
            bump(&c.invalidation_waits, 1);
            match state.flush_pending() {
                Ok(n) => bump(&c.invalidations, n),
                Err(_) => {
                    invalidated = false;
                    // The UNMAPs keep their DEVERR; the state has blocked
                    // the endpoints that could still reach the ranges and
                    // refuses every request until the device is reset.
                    bump(&c.invalidation_errors, 1);
                }
            }
        }
        // Every chain returned in one section (guest-memory writes only,
        // no wait): each UNMAP whose invalidation completed gets its `OK`
        // first, then its used element.
        let done = &mut self.done;
        let returned = sec(unit, NO_SECTION, || {
            for d in done.iter_mut() {
                if let Some(at) = d.unmap_status_at.take().filter(|_| invalidated) {
                    let ok = [Status::Ok.code()];
                    let at = vm_memory::GuestAddress(at);
                    if vm_memory::Bytes::write_slice(mem, &ok, at).is_ok() {
                        d.status = Some(Status::Ok);
                    }
                }
                bump(&c.requests, 1);
                match d.status {
                    Some(Status::Ok) => {}
                    Some(_) => bump(&c.failed, 1),
                    None => {
                        bump(&c.failed, 1);
                        bump(&c.unwritten, 1);
                    }
                }
                q.add_used(mem, d.head, d.used)?;
            }
            Ok(q.interrupt_wanted(mem))
        });
        match returned {
            Ok(Ok(true)) => end.queue_interrupt(s::REQUEST_QUEUE),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                q.stop();
                end.report(e);
            }
            Err(e) => {
                // A used element not written: the queue stops there.
                q.stop();
                end.report(e);
                return true;
            }
        }
        if let Some(b) = state.take_broke() {
            // After the round's chains are used: the driver learns each
            // request's DEVERR, then that the device needs a reset.
            if b.timed_out {
                bump(&c.invalidation_timeouts, 1);
            }
            end.report(DeviceError::BackendFailed { what: b.what });
        }
        true
    }

    /// Carries out the request in `self.parts` and writes its tail.
    ///
    /// The tail goes where the request's structure puts it (§5.13.6):
    /// right after the writable fields — at 0, or at `probe_size` for a
    /// PROBE whose writable part holds the properties — and every byte
    /// before it is written (properties, or zeroes), so the used length,
    /// which ends with the tail, claims no byte the device did not write
    /// (§2.7.8). Bytes past the tail are left alone. A PROBE whose
    /// writable part is too short for `probe_size` has its tail at the
    /// end, its properties area zeroed (no property written).
    ///
    /// A successful UNMAP's `OK` is not written here: its tail keeps the
    /// provisional `DEVERR` until the round's invalidation has completed
    /// ([`round`](Self::round) writes `OK` then).
    ///
    /// `got`: what reading the readable part into `self.buf` gave (the
    /// bytes read, or `Err` with those read before a fault).
    #[allow(clippy::too_many_arguments)]
    fn one(
        &mut self,
        head: u16,
        got: Result<usize, usize>,
        state: &mut State,
        cfg: &ViommuConfig,
        neg: Negotiated,
        mem: &PhysGuestMemory,
        c: &Counters,
        unit: &Unit,
    ) -> Done {
        let unwritten = Done {
            head,
            used: 0,
            status: None,
            unmap_status_at: None,
        };
        let wlen = self.parts.writable_len();
        if wlen < s::TAIL_LEN as u64 {
            // No room for the tail: returned without writing (§5.13.6).
            return unwritten;
        }
        let rlen = usize::try_from(self.parts.readable_len()).unwrap_or(usize::MAX);
        // The bytes read (before a fault too) name the type: a PROBE's
        // tail goes after its properties (§5.13.6.5), where the driver
        // reads it, whatever failed.
        let read = match got {
            Ok(n) | Err(n) => n.min(MAX_REQUEST),
        };
        let ty = (read > 0).then_some(self.buf[0]);
        let parsed = match got {
            Err(_) => Err(Status::Fault),
            Ok(_) => {
                match Request::parse(&self.buf[..read], rlen) {
                    // §5.13.6.2: an unknown type is returned unwritten.
                    Err(ParseError::UnknownType(_)) => return unwritten,
                    Err(ParseError::NoHead | ParseError::Short { .. }) => Err(Status::Inval),
                    Ok(req) => Ok(req),
                }
            }
        };
        let tail_at = if ty == Some(s::T_PROBE) {
            // `wlen >= 4`; the properties area is `probe_size` bytes, or
            // all there is before a tail at the end.
            u64::from(cfg.probe_size).min(wlen - s::TAIL_LEN as u64)
        } else {
            0
        };
        // The tail (and everything before it) must be writable before
        // anything is done: a request the device cannot answer is not
        // carried out either. `tail_at <= probe_size`: bounded.
        self.probe.clear();
        self.probe.resize(tail_at as usize, 0);
        self.probe
            .extend_from_slice(&[Status::DevErr.code(), 0, 0, 0]);
        if sec(unit, (), || self.parts.write(mem, 0, &self.probe)).is_err() {
            return unwritten;
        }
        let status = match parsed {
            Err(st) => st,
            Ok(req) => self.execute(req, state, cfg, neg, mem, tail_at, c, unit),
        };
        // `tail_at <= probe_size`, which the configuration bounds far
        // below `u32::MAX - 4`.
        let used = u32::try_from(tail_at + s::TAIL_LEN as u64).unwrap_or(u32::MAX);
        let is_unmap = ty == Some(s::T_UNMAP) && status == Status::Ok;
        if is_unmap {
            // `OK` only once the invalidation has completed.
            return Done {
                head,
                used,
                status: Some(Status::DevErr),
                unmap_status_at: self.byte_addr(tail_at),
            };
        }
        let tail = [status.code(), 0, 0, 0];
        let (parts, stall) = (&self.parts, &mut self.stall);
        let w = sec(unit, (), || {
            if let Some((entered, release)) = stall.take() {
                let _ = entered.send(());
                let _ = release.recv();
            }
            parts.write(mem, tail_at, &tail)
        });
        if w.is_err() {
            return unwritten;
        }
        Done {
            head,
            used,
            status: Some(status),
            unmap_status_at: None,
        }
    }

    /// The guest address of byte `off` of the writable part.
    fn byte_addr(&self, mut off: u64) -> Option<u64> {
        for d in self.parts.descs.iter().filter(|d| d.writable) {
            let len = u64::from(d.len);
            if off < len {
                return d.addr.checked_add(off);
            }
            off -= len;
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn execute(
        &mut self,
        req: Request,
        state: &mut State,
        cfg: &ViommuConfig,
        neg: Negotiated,
        mem: &PhysGuestMemory,
        tail_at: u64,
        c: &Counters,
        unit: &Unit,
    ) -> Status {
        if state.is_broken() {
            // An invalidation the device owed did not complete: nothing
            // more is done until the driver resets the device.
            return Status::DevErr;
        }
        match req {
            Request::Attach {
                domain,
                endpoint,
                flags,
                reserved_set,
            } => state.attach(domain, endpoint, flags, reserved_set, neg),
            Request::Detach { domain, endpoint } => state.detach(domain, endpoint),
            Request::Map { .. } | Request::Unmap { .. } if !neg.map_unmap => Status::Unsupp,
            Request::Map {
                domain,
                start,
                end,
                phys,
                flags,
            } => {
                let st = state.map(domain, start, end, phys, flags, neg);
                if st == Status::Ok {
                    bump(&c.maps, 1);
                }
                st
            }
            Request::Unmap {
                domain,
                start,
                end,
                reserved_set,
            } => {
                let st = state.unmap(domain, start, end, reserved_set, c);
                if st == Status::Ok {
                    bump(&c.unmaps, 1);
                }
                st
            }
            Request::Probe { .. } if !neg.probe => Status::Unsupp,
            Request::Probe { endpoint } => {
                let st = state.probe_ok(endpoint);
                if st != Status::Ok {
                    return st;
                }
                // §5.13.6.5.2: a properties part shorter than probe_size
                // gets no property, and INVAL.
                let size = u64::from(cfg.probe_size);
                if tail_at < size {
                    return Status::Inval;
                }
                self.probe.resize(cfg.probe_size as usize, 0);
                properties(state.reserved_regions(), &mut self.probe);
                match sec(unit, (), || self.parts.write(mem, 0, &self.probe)) {
                    Ok(()) => Status::Ok,
                    Err(()) => Status::Fault,
                }
            }
        }
    }

    /// Whether the last round stopped for its time, chains maybe left.
    pub(crate) fn was_cut(&self) -> bool {
        self.cut
    }

    /// Fault injection: see `stall`.
    pub(crate) fn inject_access_stall(
        &mut self,
        entered: mpsc::Sender<()>,
        release: mpsc::Receiver<()>,
    ) {
        self.stall = Some((entered, release));
    }
}
