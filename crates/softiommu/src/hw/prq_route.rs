//! Which software owns which requester's page requests, and the requests
//! taken off the queue for an owner other than the one that took them.
//!
//! A unit has one page request queue, but its devices may belong to
//! several address spaces, each served by its own handler (Linux reports a
//! fault to the domain its requester is attached to, found by requester
//! id). So a request reaches only the owner of its requester: an owner
//! that takes a request for another owner's device parks it in that
//! owner's inbox (and wakes it) instead of answering it, and a request
//! whose requester no owner has claimed is answered `Invalid` by the unit
//! at once (counted), since no software will. The requester id here is
//! always the one the unit stamped (see `prq`), never one a device wrote.
//!
//! Each inbox holds at most as many requests as the ring does, so what a
//! device can make an owner that is not taking requests hold is bounded:
//! past that, its requests are answered `Invalid` at once, like a full
//! queue.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::context::SourceId;
use crate::sync::lock_std as lock;

/// Where a request taken by one owner goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Its requester belongs to the owner that took it.
    Mine,
    /// Parked in its own owner's inbox.
    Parked,
    /// Its owner's inbox is full: to be answered `Invalid` at once.
    Full,
    /// No owner claims its requester: to be answered `Invalid` at once.
    Unrouted,
}

/// The requester → owner table and the owners' inboxes.
#[derive(Debug)]
pub(crate) struct Routes {
    owners: Mutex<HashMap<SourceId, u64>>,
    inboxes: Mutex<HashMap<u64, VecDeque<[u64; 4]>>>,
    /// Requests in all inboxes: a hint, so that an owner polling an empty
    /// queue takes no lock. It is never trusted for sleeping: a thread
    /// about to sleep looks at its inbox under the locks (`has`).
    parked: AtomicUsize,
    /// The most requests one inbox holds (the ring's length).
    cap: usize,
}

/// The requester id of a descriptor the unit stamped (bits 31:16).
pub(crate) fn requester(raw: &[u64; 4]) -> SourceId {
    SourceId((raw[0] >> 16) as u16)
}

impl Routes {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            owners: Mutex::new(HashMap::new()),
            inboxes: Mutex::new(HashMap::new()),
            parked: AtomicUsize::new(0),
            cap,
        }
    }

    /// Makes `owner` the owner of `sid`'s requests; `None` removes the
    /// route and drops `sid`'s parked requests (its groups are cancelled
    /// by whoever removes it).
    pub(crate) fn set(&self, sid: SourceId, owner: Option<u64>) {
        let mut owners = lock(&self.owners);
        match owner {
            Some(o) => {
                owners.insert(sid, o);
            }
            None => {
                owners.remove(&sid);
                let mut inboxes = lock(&self.inboxes);
                let mut dropped = 0;
                for q in inboxes.values_mut() {
                    let before = q.len();
                    q.retain(|raw| requester(raw) != sid);
                    dropped += before - q.len();
                }
                self.parked.fetch_sub(dropped, Ordering::Relaxed);
            }
        }
    }

    /// The owner of `sid`'s requests.
    pub(crate) fn owner(&self, sid: SourceId) -> Option<u64> {
        lock(&self.owners).get(&sid).copied()
    }

    /// Takes the oldest request parked for `owner`.
    pub(crate) fn pop(&self, owner: u64) -> Option<[u64; 4]> {
        if self.parked.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let raw = lock(&self.inboxes).get_mut(&owner)?.pop_front()?;
        self.parked.fetch_sub(1, Ordering::Relaxed);
        Some(raw)
    }

    /// Whether a request is parked for `owner` (under the inbox lock).
    pub(crate) fn has(&self, owner: u64) -> bool {
        lock(&self.inboxes)
            .get(&owner)
            .is_some_and(|q| !q.is_empty())
    }

    /// Sorts a request `taker` took off the queue.
    pub(crate) fn sort(&self, taker: u64, raw: [u64; 4]) -> Route {
        match self.owner(requester(&raw)) {
            Some(o) if o == taker => Route::Mine,
            Some(o) => {
                let mut inboxes = lock(&self.inboxes);
                let q = inboxes.entry(o).or_default();
                if q.len() >= self.cap {
                    return Route::Full;
                }
                q.push_back(raw);
                self.parked.fetch_add(1, Ordering::Relaxed);
                Route::Parked
            }
            None => Route::Unrouted,
        }
    }
}
