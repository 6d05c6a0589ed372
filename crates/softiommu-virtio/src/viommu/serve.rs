//! One round of the request queue: at most `batch` chains taken, each
//! parsed and carried out on the [`State`], the round's invalidations
//! issued together and waited for, and only then every chain of the round
//! returned — so an UNMAP is used only after the unit's invalidation for
//! it has completed, and one notification's UNMAPs cost one wait.

use softiommu::access::PhysGuestMemory;

use super::chain::Parts;
use super::config::ViommuConfig;
use super::probe::properties;
use super::request::{ParseError, Request, MAX_REQUEST};
use super::state::{Negotiated, State};
use super::stats::{bump, Counters};
use super::status::Status;
use crate::spec::iommu as s;
use crate::transport::{ChainDir, DeviceEnd, DeviceQueue};

/// A chain taken this round, returned at its end.
#[derive(Debug, Clone, Copy)]
struct Done {
    head: u16,
    used: u32,
    /// The status written, if any.
    status: Option<Status>,
    /// Guest addresses of the tail's status byte (re-written if the
    /// round's invalidation fails), for a successful UNMAP.
    unmap_status_at: Option<u64>,
}

/// The request queue's worker state, reused across rounds.
#[derive(Debug, Default)]
pub(crate) struct Server {
    parts: Parts,
    done: Vec<Done>,
    probe: Vec<u8>,
}

impl Server {
    /// Serves one round; returns whether chains were taken (the caller
    /// goes on without sleeping).
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
        self.done.clear();
        for _ in 0..cfg.batch {
            let head = match q.pop(mem) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    q.stop();
                    end.report(e);
                    break;
                }
            };
            if let Err(e) = q.walk(
                mem,
                head,
                ChainDir::ReadableThenWritable,
                &mut self.parts.descs,
            ) {
                q.stop();
                end.report(e);
                break;
            }
            let d = self.one(head, state, cfg, neg, mem, c);
            self.done.push(d);
        }
        if self.done.is_empty() {
            return false;
        }
        bump(&c.rounds, 1);
        if !state.pending.is_empty() {
            bump(&c.invalidation_waits, 1);
            match state.flush_pending() {
                Ok(n) => bump(&c.invalidations, n),
                Err(_) => {
                    bump(&c.invalidation_errors, 1);
                    for d in &mut self.done {
                        if let Some(at) = d.unmap_status_at.take() {
                            d.status = Some(Status::DevErr);
                            let b = [Status::DevErr.code()];
                            let _ =
                                vm_memory::Bytes::write_slice(mem, &b, vm_memory::GuestAddress(at));
                        }
                    }
                }
            }
        }
        for d in &self.done {
            bump(&c.requests, 1);
            match d.status {
                Some(Status::Ok) => {}
                Some(_) => bump(&c.failed, 1),
                None => {
                    bump(&c.failed, 1);
                    bump(&c.unwritten, 1);
                }
            }
            if let Err(e) = q.add_used(mem, d.head, d.used) {
                q.stop();
                end.report(e);
                return true;
            }
        }
        match q.interrupt_wanted(mem) {
            Ok(true) => end.queue_interrupt(s::REQUEST_QUEUE),
            Ok(false) => {}
            Err(e) => {
                q.stop();
                end.report(e);
            }
        }
        true
    }

    /// Carries out the request in `self.parts` and writes its tail.
    fn one(
        &mut self,
        head: u16,
        state: &mut State,
        cfg: &ViommuConfig,
        neg: Negotiated,
        mem: &PhysGuestMemory,
        c: &Counters,
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
        let tail_at = wlen - s::TAIL_LEN as u64;
        let rlen = usize::try_from(self.parts.readable_len()).unwrap_or(usize::MAX);
        let mut buf = [0u8; MAX_REQUEST];
        let parsed = match self.parts.read(mem, &mut buf) {
            Err(()) => Err(Status::Fault),
            Ok(got) => match Request::parse(&buf[..got], rlen) {
                // §5.13.6.2: an unknown type is returned unwritten.
                Err(ParseError::UnknownType(_)) => return unwritten,
                Err(ParseError::NoHead | ParseError::Short { .. }) => Err(Status::Inval),
                Ok(req) => Ok(req),
            },
        };
        // The tail must be writable before anything is done: a request the
        // device cannot answer is not carried out either.
        let provisional = [Status::DevErr.code(), 0, 0, 0];
        if self.parts.write(mem, tail_at, &provisional).is_err() {
            return unwritten;
        }
        let status = match parsed {
            Err(st) => st,
            Ok(req) => self.execute(req, state, cfg, neg, mem, tail_at, c),
        };
        let used = u32::try_from(wlen).unwrap_or(u32::MAX);
        let tail = [status.code(), 0, 0, 0];
        if self.parts.write(mem, tail_at, &tail).is_err() {
            return unwritten;
        }
        let is_unmap = buf[0] == s::T_UNMAP && status == Status::Ok;
        Done {
            head,
            used,
            status: Some(status),
            unmap_status_at: is_unmap.then(|| self.byte_addr(tail_at)).flatten(),
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
    ) -> Status {
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
                let st = state.unmap(domain, start, end, reserved_set);
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
                match self.parts.write(mem, 0, &self.probe) {
                    Ok(()) => Status::Ok,
                    Err(()) => Status::Fault,
                }
            }
        }
    }
}
