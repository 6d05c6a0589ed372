//! Page request groups in assembly.
//!
//! A device may ask for several pages in one group: requests sharing a
//! page request group index, the last flagged "last page in group"
//! (PCIe PRI; VT-d §7.5.1). The group gets one response, which speaks for
//! every page of it: `Success` tells the device to retry each page, so it
//! must come only once every page was served, and only if each was. So a
//! domain holds a group's requests before its last, in queue order, and
//! its handler serves the group whole when the last request arrives, on
//! that one thread ([`PartialGroups::add`] runs under the lock that also
//! takes the request off the queue, so no request of a group can reach the
//! store after its last). The answer is the worst of the pages'.
//!
//! Bounded: a device holds at most [`MAX_HELD_PER_DEVICE`] requests; a
//! request past that is dropped and its group index marked, so its group
//! is answered `Invalid` with nothing more served. Only attached devices'
//! requests are held, and a device's held requests go when it is
//! detached ([`PartialGroups::forget`]).

use std::collections::HashMap;

use crate::hw::{PageRequest, ResponseCode, SourceId, UnitId};

/// The most requests of one device held before their groups' last
/// requests: two full page request queues' worth.
pub const MAX_HELD_PER_DEVICE: usize = 1024;

/// Group indices are 9 bits (VT-d page request descriptor, PRGI).
const PRGI_WORDS: usize = 512 / 64;

/// The held requests of every device of a domain, by unit and requester.
#[derive(Debug, Default)]
pub(crate) struct PartialGroups {
    devices: HashMap<(UnitId, SourceId), Device>,
}

#[derive(Debug, Default)]
struct Device {
    /// Held requests by (PASID, group index), in queue order.
    groups: HashMap<(Option<u32>, u16), Vec<PageRequest>>,
    held: usize,
    /// Group indices with a request dropped past the bound.
    dropped: [u64; PRGI_WORDS],
}

impl Device {
    fn bit(prgi: u16) -> (usize, u64) {
        let i = usize::from(prgi) % 512;
        (i / 64, 1 << (i % 64))
    }

    fn idle(&self) -> bool {
        self.groups.is_empty() && self.dropped.iter().all(|&w| w == 0)
    }
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
        let key = (unit, r.sid);
        let group = (r.pasid, r.prgi);
        let (w, b) = Device::bit(r.prgi);
        if r.last {
            let Some(d) = self.devices.get_mut(&key) else {
                return Assembled::Complete {
                    earlier: Vec::new(),
                    dropped: false,
                };
            };
            let earlier = d.groups.remove(&group).unwrap_or_default();
            d.held = d.held.saturating_sub(earlier.len());
            let dropped = d.dropped.get(w).is_some_and(|x| x & b != 0);
            if let Some(x) = d.dropped.get_mut(w) {
                *x &= !b;
            }
            if d.idle() {
                self.devices.remove(&key);
            }
            return Assembled::Complete { earlier, dropped };
        }
        let d = self.devices.entry(key).or_default();
        if d.held >= MAX_HELD_PER_DEVICE {
            if let Some(x) = d.dropped.get_mut(w) {
                *x |= b;
            }
        } else {
            d.groups.entry(group).or_default().push(*r);
            d.held += 1;
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

    fn req(prgi: u16, page: u64, last: bool) -> PageRequest {
        PageRequest {
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
        }
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

    #[test]
    fn the_group_answer_is_the_worst_of_its_pages() {
        use ResponseCode::*;
        assert_eq!(worst([Success, Success]), Success);
        assert_eq!(worst([Success, Invalid, Success]), Invalid);
        assert_eq!(worst([Invalid, Failure]), Failure);
        assert_eq!(worst([]), Success);
    }
}
