//! Page request groups in assembly.
//!
//! A device may ask for several pages in one group: requests sharing a
//! page request group index, the last flagged "last page in group"
//! (PCIe PRI; VT-d §7.5.1). The group gets one response, which speaks for
//! every page of it: `Success` tells the device to retry each page, so it
//! must come only once every page was served, and only if each was. The
//! unit raises one-request groups for its own faults; a multi-request
//! group comes only as raw requests a device sends
//! (`Unit::inject_page_request_from`). So a domain holds a raw group's
//! requests before its last, in queue order, and its handler serves the
//! group whole when the raw last request arrives, on that one thread
//! ([`PartialGroups::add`] runs under the lock that also takes the request
//! off the queue, so no request of a group can reach the store after its
//! last). The answer is the worst of the pages'. A group the unit raised
//! never takes in held raw requests, whatever index they name: a device
//! cannot fail the unit's faults by leaving requests without a last.
//!
//! Bounded: a device holds at most [`MAX_HELD_PER_DEVICE`] requests; a
//! request past that is dropped and its group (PASID and index) marked,
//! so its group is answered `Invalid` with nothing more served; past as
//! many marks, every raw group of the device is answered so until it has
//! nothing held or marked. Only attached devices' requests are held, and
//! a device's go when it is detached ([`PartialGroups::forget`]). (A raw
//! group whose requests a unit routed to two domains, the device having
//! moved between them, is assembled in each apart: its answer may then
//! speak for part of it. Raw answers reach no device: the unit only
//! releases their reservations.)

use std::collections::{HashMap, HashSet};

use crate::hw::{PageRequest, ResponseCode, SourceId, UnitId};

/// The most requests of one device held before their groups' last
/// requests: two full page request queues' worth.
pub const MAX_HELD_PER_DEVICE: usize = 1024;

/// The held requests of every device of a domain, by unit and requester.
#[derive(Debug, Default)]
pub(crate) struct PartialGroups {
    devices: HashMap<(UnitId, SourceId), Device>,
}

/// A group: PASID and group index.
type GroupKey = (Option<u32>, u16);

#[derive(Debug, Default)]
struct Device {
    /// Held requests by group, in queue order.
    groups: HashMap<GroupKey, Vec<PageRequest>>,
    held: usize,
    /// Groups with a request dropped past the bound (at most
    /// `MAX_HELD_PER_DEVICE` of them).
    dropped: HashSet<GroupKey>,
    /// A request was dropped with no room left to mark its group: every
    /// raw group of the device is answered `Invalid` until it has nothing
    /// held or marked.
    saturated: bool,
}

/// What [`PartialGroups::add`] made of a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Assembled {
    /// Held until its group's last request (or dropped past the bound).
    Held,
    /// The request was its group's last: serve `earlier` (the group's
    /// requests before it, in queue order) and it, and answer the group —
    /// `Invalid` with nothing served if a request of the group was
    /// dropped.
    Complete {
        /// The group's requests before the last.
        earlier: Vec<PageRequest>,
        /// Whether one of them was dropped past the bound.
        dropped: bool,
    },
}

impl PartialGroups {
    /// Adds `r`, taken from `unit`'s queue, of an attached device.
    pub(crate) fn add(&mut self, unit: UnitId, r: &PageRequest) -> Assembled {
        let complete = |earlier, dropped| Assembled::Complete { earlier, dropped };
        if !r.is_raw() {
            // The unit's own fault: a one-request group, always.
            return complete(Vec::new(), false);
        }
        let key = (unit, r.sid);
        let group = (r.pasid, r.prgi);
        if r.last {
            let Some(d) = self.devices.get_mut(&key) else {
                return complete(Vec::new(), false);
            };
            let earlier = d.groups.remove(&group).unwrap_or_default();
            d.held = d.held.saturating_sub(earlier.len());
            let dropped = d.dropped.remove(&group) || d.saturated;
            // Nothing held or marked: the device's entry (and with it any
            // saturation) goes.
            if d.groups.is_empty() && d.dropped.is_empty() {
                self.devices.remove(&key);
            }
            return complete(earlier, dropped);
        }
        let d = self.devices.entry(key).or_default();
        if d.held < MAX_HELD_PER_DEVICE {
            d.groups.entry(group).or_default().push(*r);
            d.held += 1;
        } else if d.dropped.len() < MAX_HELD_PER_DEVICE {
            d.dropped.insert(group);
        } else {
            d.saturated = true;
        }
        Assembled::Held
    }

    /// Drops everything `sid` holds (it was detached: its groups were
    /// answered `Invalid` by its unit).
    pub(crate) fn forget(&mut self, sid: SourceId) {
        self.devices.retain(|&(_, s), _| s != sid);
    }

    /// Requests held now, every device.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.devices.values().map(|d| d.held).sum()
    }
}

/// The answer for a group whose pages were served with `codes`: `Success`
/// only if every page's was; otherwise the worst (`Failure` over
/// `Invalid`).
pub(crate) fn worst(codes: impl IntoIterator<Item = ResponseCode>) -> ResponseCode {
    codes
        .into_iter()
        .fold(ResponseCode::Success, |acc, c| match (acc, c) {
            (ResponseCode::Failure, _) | (_, ResponseCode::Failure) => ResponseCode::Failure,
            (ResponseCode::Invalid, _) | (_, ResponseCode::Invalid) => ResponseCode::Invalid,
            _ => ResponseCode::Success,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw request (as a device sends one): the unit's mark in its
    /// private words.
    fn req(prgi: u16, page: u64, last: bool) -> PageRequest {
        let mut r = PageRequest {
            sid: SourceId(7),
            pasid: None,
            read: true,
            write: false,
            exec: false,
            privileged: false,
            last,
            prgi,
            addr: page << 12,
            private: [0, 0],
        };
        r.private[1] = crate::hw::RAW_MARK;
        assert!(r.is_raw());
        r
    }

    #[test]
    fn a_group_is_complete_at_its_last_request_with_the_earlier_ones_in_order() {
        let mut g = PartialGroups::default();
        let u = UnitId(0);
        assert_eq!(g.add(u, &req(3, 1, false)), Assembled::Held);
        assert_eq!(g.add(u, &req(4, 9, false)), Assembled::Held);
        assert_eq!(g.add(u, &req(3, 2, false)), Assembled::Held);
        assert_eq!(g.held(), 3);
        assert_eq!(
            g.add(u, &req(3, 5, true)),
            Assembled::Complete {
                earlier: vec![req(3, 1, false), req(3, 2, false)],
                dropped: false
            }
        );
        assert_eq!(g.held(), 1);
        // A single-request group.
        assert_eq!(
            g.add(u, &req(8, 5, true)),
            Assembled::Complete {
                earlier: Vec::new(),
                dropped: false
            }
        );
        g.forget(SourceId(7));
        assert_eq!(g.held(), 0);
        assert!(g.devices.is_empty());
    }

    #[test]
    fn past_the_bound_a_request_is_dropped_and_its_group_marked() {
        let mut g = PartialGroups::default();
        let u = UnitId(0);
        for i in 0..MAX_HELD_PER_DEVICE as u64 {
            assert_eq!(g.add(u, &req(1, i, false)), Assembled::Held);
        }
        assert_eq!(g.add(u, &req(2, 0, false)), Assembled::Held);
        assert_eq!(g.held(), MAX_HELD_PER_DEVICE);
        assert_eq!(
            g.add(u, &req(2, 1, true)),
            Assembled::Complete {
                earlier: Vec::new(),
                dropped: true
            }
        );
        // The mark goes with the answer.
        assert!(matches!(
            g.add(u, &req(2, 1, true)),
            Assembled::Complete { dropped: false, .. }
        ));
    }

    /// A fault the unit raised under a group index a device left raw
    /// requests in takes none of them in, and leaves them held.
    #[test]
    fn the_units_own_fault_takes_in_no_held_raw_request() {
        let mut g = PartialGroups::default();
        let u = UnitId(0);
        assert_eq!(g.add(u, &req(3, 1, false)), Assembled::Held);
        let own = PageRequest {
            private: [0, 0],
            ..req(3, 2, true)
        };
        assert!(!own.is_raw());
        assert_eq!(
            g.add(u, &own),
            Assembled::Complete {
                earlier: Vec::new(),
                dropped: false
            }
        );
        assert_eq!(g.held(), 1);
    }

    /// A drop marks its own group only: the same index under another
    /// PASID completes unmarked, and the marked one still reads dropped.
    #[test]
    fn a_drop_marks_its_pasid_and_index_only() {
        let mut g = PartialGroups::default();
        let u = UnitId(0);
        for i in 0..MAX_HELD_PER_DEVICE as u64 {
            assert_eq!(g.add(u, &req(1, i, false)), Assembled::Held);
        }
        let with = |pasid, last| PageRequest {
            pasid,
            ..req(2, 0, last)
        };
        assert_eq!(g.add(u, &with(Some(1), false)), Assembled::Held);
        assert!(matches!(
            g.add(u, &with(Some(2), true)),
            Assembled::Complete { dropped: false, .. }
        ));
        assert!(matches!(
            g.add(u, &with(Some(1), true)),
            Assembled::Complete { dropped: true, .. }
        ));
    }

    #[test]
    fn the_group_answer_is_the_worst_of_its_pages() {
        use ResponseCode::*;
        assert_eq!(worst([Success, Success]), Success);
        assert_eq!(worst([Success, Invalid, Success]), Invalid);
        assert_eq!(worst([Invalid, Failure]), Failure);
        assert_eq!(worst([]), Success);
    }
}
