//! The stress lab's independent checker: a shadow of every mapping's
//! lifetime, written by the lab's own CPU threads around their calls into
//! the DMA API (never read from the library's bookkeeping), and the
//! classifier that judges each successful device access against it.
//!
//! **Tags.** Every buffer a CPU thread maps lives in a page of its own (a
//! slot's page). Before each map the thread writes the whole page, one
//! atomic 64-bit word at a time: the mapped bytes with a *buffer* tag, the
//! rest with a *neighbour* tag, both naming (domain, slot, generation). A
//! device's 8-byte read therefore says which page it reached, so the
//! checker needs no translation of its own to know where an access landed.
//!
//! **Shadow.** Each slot keeps a ring of its last [`HISTORY`] generations:
//! IOVA, length, map and unmap-return times, and whether the mapping was
//! bounced and whether its unmap ran under the deferred policy. Each entry
//! is a seqlock of atomics, written only by the slot's CPU thread, so a
//! device thread reads it without a lock and without tearing.
//!
//! **Verdicts.** A successful access is [`Verdict::Legal`] when a mapping
//! of the reached page at that IOVA was live at some time during the
//! access (or, under bounce, when it reached the domain's own bounced data
//! in the pool, which stays mapped by design, at bytes that buffer's bounce
//! slot covered); [`Verdict::Stale`] when the only such mapping was
//! unmapped before the access began, possibly under the deferred policy,
//! less than the promised bound (flush timeout + 1 ms) earlier, and no
//! flush or switch away from deferred that covers it had completed;
//! anything else is a [`Verdict::Violation`].

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Generations each slot remembers: far more than a slot goes through in
/// a flush timeout (a slot changes state once every `slots` operations of
/// its CPU thread).
pub const HISTORY: usize = 1024;

/// Bytes of a slot's page.
pub const PAGE: u64 = 4096;

const MAGIC: u64 = 0xA5;

/// What a tagged word of a slot's page is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagKind {
    /// A byte of the buffer that was mapped.
    Buffer,
    /// A byte of the page around the buffer, never handed to the device.
    Neighbour,
}

/// A decoded tag: which page, which generation's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    /// Buffer or neighbour word.
    pub kind: TagKind,
    /// The domain whose CPU thread wrote it.
    pub domain: u8,
    /// The slot (page) within that domain.
    pub slot: u16,
    /// The generation (map count of the slot) that wrote it.
    pub gen: u32,
}

impl Tag {
    /// The 64-bit word: magic (8 bits), kind (4), domain (4), slot (16),
    /// generation (32).
    pub fn encode(self) -> u64 {
        let kind = match self.kind {
            TagKind::Buffer => 1,
            TagKind::Neighbour => 2,
        };
        MAGIC << 56
            | kind << 52
            | u64::from(self.domain & 0xf) << 48
            | u64::from(self.slot) << 32
            | u64::from(self.gen)
    }

    /// The tag a word holds, if it is one.
    pub fn decode(v: u64) -> Option<Tag> {
        if v >> 56 != MAGIC {
            return None;
        }
        let kind = match (v >> 52) & 0xf {
            1 => TagKind::Buffer,
            2 => TagKind::Neighbour,
            _ => return None,
        };
        Some(Tag {
            kind,
            domain: ((v >> 48) & 0xf) as u8,
            slot: ((v >> 32) & 0xffff) as u16,
            gen: v as u32,
        })
    }
}

/// Where a mapping is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// The CPU thread wrote the page and is inside `map`: the IOVA is not
    /// known yet.
    Mapping,
    /// Mapped: `map` returned.
    Mapped,
    /// The CPU thread is inside `unmap`.
    Unmapping,
    /// `unmap` returned at `t_unmap_ns`.
    Unmapped,
}

/// One generation of a slot, as a device thread reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The slot's generation.
    pub gen: u32,
    /// The address the device was given.
    pub iova: u64,
    /// Bytes mapped.
    pub len: u64,
    /// Nanoseconds (lab clock) just before `map` was called.
    pub t_map_ns: u64,
    /// Nanoseconds when `unmap` returned (0 before).
    pub t_unmap_ns: u64,
    /// Nanoseconds just before `unmap` was called (0 before).
    pub t_unmap_call_ns: u64,
    /// Where it is in its life.
    pub life: Life,
    /// The mapping may have been bounced (the policy was bounce before or
    /// after the map call).
    pub bounced: bool,
    /// The unmap may have run under the deferred policy.
    pub deferred: bool,
}

impl Entry {
    /// Whether `x` lies in the pages the mapping made reachable.
    fn pages_contain(&self, x: u64) -> bool {
        let lo = self.iova & !(PAGE - 1);
        let hi = (self.iova + self.len).div_ceil(PAGE) * PAGE;
        (lo..hi).contains(&x)
    }
}

/// One ring entry: a seqlock over atomics (odd while being written).
#[derive(Debug, Default)]
struct Cell {
    seq: AtomicU64,
    iova: AtomicU64,
    len: AtomicU64,
    t_map: AtomicU64,
    t_unmap: AtomicU64,
    t_call: AtomicU64,
    /// gen (32 bits) | life (2 bits) << 32 | bounced << 34 | deferred << 35.
    meta: AtomicU64,
}

impl Cell {
    fn write(&self, e: &Entry) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let life = match e.life {
            Life::Mapped => 0,
            Life::Unmapping => 1,
            Life::Unmapped => 2,
            Life::Mapping => 3,
        };
        self.iova.store(e.iova, Ordering::Relaxed);
        self.len.store(e.len, Ordering::Relaxed);
        self.t_map.store(e.t_map_ns, Ordering::Relaxed);
        self.t_unmap.store(e.t_unmap_ns, Ordering::Relaxed);
        self.t_call.store(e.t_unmap_call_ns, Ordering::Relaxed);
        self.meta.store(
            u64::from(e.gen)
                | life << 32
                | u64::from(e.bounced) << 34
                | u64::from(e.deferred) << 35,
            Ordering::Relaxed,
        );
        self.seq.store(s + 2, Ordering::Release);
    }

    /// A consistent snapshot. A writer preempted inside `write` leaves the
    /// sequence odd for as long as it is off its CPU: the reader waits it
    /// out (spinning, then yielding) rather than skip the entry, which
    /// could hide the very mapping that makes an access legal.
    fn read(&self) -> Option<Entry> {
        for i in 0..1_000_000u32 {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 == 0 {
                return None;
            }
            if s1 & 1 == 1 {
                if i < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            let iova = self.iova.load(Ordering::Relaxed);
            let len = self.len.load(Ordering::Relaxed);
            let t_map_ns = self.t_map.load(Ordering::Relaxed);
            let t_unmap_ns = self.t_unmap.load(Ordering::Relaxed);
            let t_unmap_call_ns = self.t_call.load(Ordering::Relaxed);
            let meta = self.meta.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            let life = match (meta >> 32) & 3 {
                0 => Life::Mapped,
                1 => Life::Unmapping,
                2 => Life::Unmapped,
                _ => Life::Mapping,
            };
            return Some(Entry {
                gen: meta as u32,
                iova,
                len,
                t_map_ns,
                t_unmap_ns,
                t_unmap_call_ns,
                life,
                bounced: meta >> 34 & 1 == 1,
                deferred: meta >> 35 & 1 == 1,
            });
        }
        None
    }
}

/// One slot's shadow: its newest generation and a ring of the last
/// [`HISTORY`].
#[derive(Debug)]
pub struct SlotShadow {
    /// The newest generation with an entry (0: none yet).
    newest: AtomicU64,
    ring: Box<[Cell]>,
}

impl Default for SlotShadow {
    fn default() -> Self {
        Self {
            newest: AtomicU64::new(0),
            ring: (0..HISTORY).map(|_| Cell::default()).collect(),
        }
    }
}

impl SlotShadow {
    /// Records generation `e.gen`'s state (only the slot's CPU thread
    /// calls this; generations start at 1 and grow by one).
    pub fn record(&self, e: &Entry) {
        self.ring[e.gen as usize % HISTORY].write(e);
        self.newest.store(u64::from(e.gen), Ordering::Release);
    }

    /// The newest generation's entry.
    pub fn newest(&self) -> Option<Entry> {
        let g = self.newest.load(Ordering::Acquire);
        if g == 0 {
            return None;
        }
        self.get(g as u32)
    }

    /// Generation `gen`'s entry, if still remembered.
    pub fn get(&self, gen: u32) -> Option<Entry> {
        self.ring[gen as usize % HISTORY]
            .read()
            .filter(|e| e.gen == gen)
    }

    /// Waits (yielding, at most about `spins` times) while generation
    /// `gen` is being mapped: a device may reach a page through the IOVA
    /// being mapped before `map` returns and the shadow learns it.
    pub fn wait_mapped(&self, gen: u32, spins: u32) {
        for _ in 0..spins {
            match self.get(gen) {
                Some(e) if e.life == Life::Mapping => std::thread::yield_now(),
                _ => return,
            }
        }
    }

    /// Every remembered entry.
    fn all(&self) -> impl Iterator<Item = Entry> + '_ {
        self.ring.iter().filter_map(Cell::read)
    }

    /// Whether the ring has wrapped since generation `HISTORY` back from
    /// the newest: older generations are forgotten.
    fn forgot_any(&self) -> bool {
        self.newest.load(Ordering::Acquire) as usize >= HISTORY
    }
}

/// One domain's shadow: its slots, its bounce pool's IOVA range (learnt
/// from the first bounced mapping and the pool's size), and the newest
/// flush its CPU thread saw complete.
#[derive(Debug)]
pub struct DomainShadow {
    /// Its slots.
    pub slots: Vec<SlotShadow>,
    /// First IOVA of the bounce pool (`u64::MAX`: not known yet).
    pub pool_lo: AtomicU64,
    /// One past the pool's last IOVA.
    pub pool_hi: AtomicU64,
    /// Lab-clock time at which the CPU thread last *called* `flush_own`,
    /// stored after that call returned `Ok`: every unmap that returned
    /// before it had been invalidated by then.
    pub flushed_upto_ns: AtomicU64,
    /// Lab-clock time at which the newest switch *away from* deferred
    /// returned (0: none): it flushed every deferred queue, so no unmap
    /// called before it keeps a deferred allowance after it.
    pub left_deferred_ns: AtomicU64,
}

impl DomainShadow {
    /// A shadow of `slots` slots.
    pub fn new(slots: usize) -> Self {
        Self {
            slots: (0..slots).map(|_| SlotShadow::default()).collect(),
            pool_lo: AtomicU64::new(u64::MAX),
            pool_hi: AtomicU64::new(0),
            flushed_upto_ns: AtomicU64::new(0),
            left_deferred_ns: AtomicU64::new(0),
        }
    }

    /// Whether `x` lies in the bounce pool's IOVA range (once learnt).
    pub fn in_pool(&self, x: u64) -> bool {
        let lo = self.pool_lo.load(Ordering::Acquire);
        let hi = self.pool_hi.load(Ordering::Acquire);
        lo <= x && x < hi
    }
}

/// A device access that succeeded, as the device thread saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The device's domain.
    pub domain: u8,
    /// The IOVA of the 8-byte access.
    pub iova: u64,
    /// The word read (for a write: the word written).
    pub value: u64,
    /// Whether it was a write.
    pub write: bool,
    /// Lab clock before the access.
    pub t_before_ns: u64,
    /// Lab clock after it.
    pub t_after_ns: u64,
    /// The domain's `flushed_upto_ns`, read before the access.
    pub flushed_upto_ns: u64,
    /// The domain's `left_deferred_ns`, read before the access.
    pub left_deferred_ns: u64,
}

/// Why an access is a violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The word is no tag: memory no mapping of any domain holds.
    Untagged,
    /// The word belongs to another domain's page.
    OtherDomain {
        /// The page's domain.
        owner: u8,
    },
    /// A neighbour word of a sub-page buffer reached through the bounce
    /// pool, or a page word reached through an IOVA that never mapped it.
    NeverMapped,
    /// Reached after the unmap returned, outside what the policy permits
    /// (not made under deferred, begun at or past the bound, or after a
    /// flush or a switch away from deferred that covered it).
    AfterUnmap {
        /// The mapping it reached through.
        entry: Entry,
        /// Microseconds from the unmap's return to the start of the access.
        age_us: u64,
    },
    /// A write through a mapping the device was given read-only.
    WriteThroughReadOnly,
    /// A live mapping of this device returned another page's word.
    WrongData {
        /// What the device should have read.
        expected: u64,
    },
    /// A live mapping of this device faulted.
    LiveFault,
    /// A bounce-pool address returned the bytes of a buffer whose bounce
    /// slot never covered it.
    BounceNotOwner {
        /// The buffer whose word was read.
        entry: Entry,
    },
    /// A successful access landed in a frame that holds IOMMU state.
    IommuFrame {
        /// The physical address it reached.
        phys: u64,
    },
}

/// The checker's judgement of one successful access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Through a live mapping (or the domain's own bounce pool).
    Legal,
    /// A permitted stale access: deferred, before the covering flush,
    /// begun less than the bound after the unmap returned.
    Stale {
        /// Microseconds from the unmap's return to the start of the access.
        age_us: u64,
    },
    /// Not permitted.
    Violation(Why),
    /// The slot's history no longer reaches back far enough to judge
    /// (the device thread was descheduled for many generations).
    Unknown,
}

/// Judges one successful access by `acc.domain`'s device against the
/// shadows (`domains[i]` is domain `i`), with the deferred policy's
/// promised bound `bound_ns` (flush timeout + 1 ms). Writes are never
/// legal: every mapping the lab makes is read-only for the device.
///
/// A deferred allowance is given only to an unmap that may have run
/// under deferred (the policy was deferred before or after the call) and
/// that no switch away from deferred has flushed since it was called, to
/// an access that began less than the bound after the unmap returned,
/// before a flush the CPU thread saw complete.
pub fn classify(acc: &Access, domains: &[DomainShadow], bound_ns: u64) -> Verdict {
    if acc.write {
        return Verdict::Violation(Why::WriteThroughReadOnly);
    }
    let Some(me) = domains.get(usize::from(acc.domain)) else {
        return Verdict::Violation(Why::Untagged);
    };
    let x = acc.iova;
    let Some(tag) = Tag::decode(acc.value) else {
        // The pool holds zeros where nothing was bounced yet.
        return if acc.value == 0 && me.in_pool(x) {
            Verdict::Legal
        } else {
            Verdict::Violation(Why::Untagged)
        };
    };
    if tag.domain != acc.domain {
        return Verdict::Violation(Why::OtherDomain { owner: tag.domain });
    }
    let Some(slot) = me.slots.get(usize::from(tag.slot)) else {
        return Verdict::Violation(Why::Untagged);
    };
    if me.in_pool(x) {
        return judge_pool(acc, slot, tag);
    }
    // The page was reached through `x`: find the generations of this
    // slot that mapped `x` to it, and take the kindest verdict.
    let judge = |e: &Entry| -> Verdict {
        if e.life == Life::Mapping {
            // Its IOVA is not known yet (the caller waits this out).
            return Verdict::Unknown;
        }
        // Outside the pool (handled above) every mapping was translated,
        // whatever the policy was said to be: the pages rule holds.
        if !e.pages_contain(x) || e.t_map_ns > acc.t_after_ns {
            return Verdict::Violation(Why::NeverMapped);
        }
        if e.life != Life::Unmapped || acc.t_before_ns <= e.t_unmap_ns {
            return Verdict::Legal;
        }
        // The age at the access's start: a translation made later than
        // the bound after the unmap must fail, whatever the access's end.
        let age_ns = acc.t_before_ns - e.t_unmap_ns;
        let age_us = age_ns / 1000;
        let flushed = e.t_unmap_ns < acc.flushed_upto_ns;
        // A switch away from deferred recorded after the unmap returned
        // either flushed its entry (queued before the switch closed the
        // gate) or the unmap ran under the new policy: no allowance. One
        // recorded between the call and the return may have ended before
        // the unmap ran at all (an unmap held at the gate, or off its CPU,
        // across a switch away and back to deferred), so it proves nothing.
        let switched_away = acc.left_deferred_ns > e.t_unmap_ns;
        if e.deferred && !flushed && !switched_away && age_ns < bound_ns {
            Verdict::Stale { age_us }
        } else {
            Verdict::Violation(Why::AfterUnmap { entry: *e, age_us })
        }
    };
    if let Some(e) = slot.get(tag.gen) {
        if judge(&e) == Verdict::Legal {
            return Verdict::Legal;
        }
    }
    let mut best = Verdict::Violation(Why::NeverMapped);
    for e in slot.all() {
        best = kinder(best, judge(&e));
        if best == Verdict::Legal {
            return best;
        }
    }
    if matches!(best, Verdict::Violation(Why::NeverMapped)) && slot.forgot_any() {
        // Maybe a forgotten generation mapped `x`: judge it only if the
        // oldest one remembered is older than the bound.
        let oldest_map = slot.all().map(|e| e.t_map_ns).min().unwrap_or(0);
        if oldest_map + bound_ns > acc.t_before_ns {
            return Verdict::Unknown;
        }
    }
    best
}

/// A read inside the domain's bounce pool that returned `tag`'s word: the
/// pool stays mapped by design, so a slot holds its current owner's bytes
/// or, once freed, a past owner's. Legal only if generation `tag.gen` of
/// that slot was bounced to bytes that cover `x`, mapped before the
/// access ended; a neighbour word (never bounced) or a buffer's bytes at
/// an address its bounce slot never covered is a violation. (The live
/// owner's own reads are checked for its exact word by the device thread.)
fn judge_pool(acc: &Access, slot: &SlotShadow, tag: Tag) -> Verdict {
    let x = acc.iova;
    if tag.kind == TagKind::Neighbour {
        return Verdict::Violation(Why::NeverMapped);
    }
    let Some(e) = slot.get(tag.gen) else {
        return Verdict::Unknown;
    };
    if e.life == Life::Mapping {
        return Verdict::Unknown;
    }
    let covered = e.bounced && e.iova <= x && x < e.iova.saturating_add(e.len);
    if covered && e.t_map_ns <= acc.t_after_ns {
        Verdict::Legal
    } else {
        Verdict::Violation(Why::BounceNotOwner { entry: e })
    }
}

fn kinder(a: Verdict, b: Verdict) -> Verdict {
    fn rank(v: &Verdict) -> u8 {
        match v {
            Verdict::Legal => 3,
            Verdict::Stale { .. } => 2,
            Verdict::Unknown => 1,
            Verdict::Violation(Why::AfterUnmap { .. }) => 0,
            Verdict::Violation(_) => 0,
        }
    }
    match (rank(&a), rank(&b)) {
        (ra, rb) if rb > ra => b,
        // Of two violations, the one naming a mapping says more, and of
        // two naming one, the youngest.
        (0, 0) => match (a, b) {
            (
                Verdict::Violation(Why::AfterUnmap { age_us: x, .. }),
                Verdict::Violation(Why::AfterUnmap { age_us: y, .. }),
            ) if y < x => b,
            (Verdict::Violation(Why::AfterUnmap { .. }), _) => a,
            (_, Verdict::Violation(Why::AfterUnmap { .. })) => b,
            _ => a,
        },
        // Of two stale ones, the youngest.
        (2, 2) => match (a, b) {
            (Verdict::Stale { age_us: x }, Verdict::Stale { age_us: y }) if y < x => b,
            _ => a,
        },
        _ => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The promised bound: a 10 ms flush timeout + 1 ms.
    const TIMEOUT: u64 = 11_000_000;

    fn tag(kind: TagKind, domain: u8, slot: u16, gen: u32) -> u64 {
        Tag {
            kind,
            domain,
            slot,
            gen,
        }
        .encode()
    }

    fn entry(gen: u32, iova: u64, life: Life, t_unmap_ns: u64, deferred: bool) -> Entry {
        Entry {
            gen,
            iova,
            len: 64,
            t_map_ns: 1_000,
            t_unmap_ns,
            t_unmap_call_ns: t_unmap_ns.saturating_sub(500),
            life,
            bounced: false,
            deferred,
        }
    }

    fn shadows() -> Vec<DomainShadow> {
        vec![DomainShadow::new(4), DomainShadow::new(4)]
    }

    fn read(domain: u8, iova: u64, value: u64, t: u64) -> Access {
        Access {
            domain,
            iova,
            value,
            write: false,
            t_before_ns: t,
            t_after_ns: t + 100,
            flushed_upto_ns: 0,
            left_deferred_ns: 0,
        }
    }

    #[test]
    fn tags_round_trip_and_reject_other_words() {
        let t = Tag {
            kind: TagKind::Neighbour,
            domain: 1,
            slot: 513,
            gen: 0xdead_beef,
        };
        assert_eq!(Tag::decode(t.encode()), Some(t));
        assert_eq!(Tag::decode(0), None);
        assert_eq!(Tag::decode(u64::MAX), None);
    }

    #[test]
    fn a_read_through_a_live_mapping_is_legal_anywhere_in_its_page() {
        let d = shadows();
        d[0].slots[2].record(&entry(7, 0x10_0040, Life::Mapped, 0, false));
        let v = tag(TagKind::Buffer, 0, 2, 7);
        assert!(matches!(
            classify(&read(0, 0x10_0040, v, 5_000), &d, TIMEOUT),
            Verdict::Legal
        ));
        let n = tag(TagKind::Neighbour, 0, 2, 7);
        assert!(matches!(
            classify(&read(0, 0x10_0ff8, n, 5_000), &d, TIMEOUT),
            Verdict::Legal
        ));
    }

    #[test]
    fn a_read_after_a_strict_unmap_returned_is_a_violation() {
        let d = shadows();
        d[0].slots[0].record(&entry(3, 0x20_0000, Life::Unmapped, 9_000, false));
        let v = tag(TagKind::Buffer, 0, 0, 3);
        assert!(matches!(
            classify(&read(0, 0x20_0000, v, 10_000), &d, TIMEOUT),
            Verdict::Violation(Why::AfterUnmap { age_us: 1, .. })
        ));
        // Begun before the unmap returned: it may have raced it.
        assert!(matches!(
            classify(&read(0, 0x20_0000, v, 8_000), &d, TIMEOUT),
            Verdict::Legal
        ));
    }

    #[test]
    fn deferred_stale_reads_are_permitted_until_the_timeout_or_a_flush() {
        let d = shadows();
        d[1].slots[1].record(&entry(5, 0x30_0000, Life::Unmapped, 1_000_000, true));
        let v = tag(TagKind::Buffer, 1, 1, 5);
        let young = read(1, 0x30_0008, v, 3_000_000);
        assert!(matches!(
            classify(&young, &d, TIMEOUT),
            Verdict::Stale { age_us: 2_000 }
        ));
        let old = read(1, 0x30_0008, v, 1_000_000 + TIMEOUT);
        assert!(matches!(
            classify(&old, &d, TIMEOUT),
            Verdict::Violation(Why::AfterUnmap { .. })
        ));
        // Begun inside the window, ended past it (the device thread was
        // descheduled mid-access): it began inside the bound, which is
        // what the promise is about; its age is taken at its start.
        let straddling = Access {
            t_after_ns: 1_000_000 + TIMEOUT + 5_000_000,
            ..young
        };
        assert!(matches!(
            classify(&straddling, &d, TIMEOUT),
            Verdict::Stale { age_us: 2_000 }
        ));
        // Begun exactly at the bound: a violation.
        let at_bound = read(1, 0x30_0008, v, 1_000_000 + TIMEOUT);
        assert!(matches!(
            classify(&at_bound, &d, TIMEOUT),
            Verdict::Violation(Why::AfterUnmap { age_us: 11_000, .. })
        ));
        let flushed = Access {
            flushed_upto_ns: 2_000_000,
            ..young
        };
        assert!(matches!(
            classify(&flushed, &d, TIMEOUT),
            Verdict::Violation(Why::AfterUnmap { .. })
        ));
    }

    #[test]
    fn a_stale_entry_into_a_remapped_page_is_judged_by_the_old_mapping() {
        let d = shadows();
        let s = &d[0].slots[3];
        s.record(&entry(1, 0x40_0000, Life::Unmapped, 2_000, true));
        s.record(&entry(2, 0x50_0000, Life::Mapped, 0, false));
        // The page now holds generation 2; reached through gen 1's IOVA.
        let v = tag(TagKind::Buffer, 0, 3, 2);
        assert!(matches!(
            classify(&read(0, 0x40_0000, v, 5_000), &d, TIMEOUT),
            Verdict::Stale { age_us: 3 }
        ));
        // Through an IOVA neither generation had.
        assert!(matches!(
            classify(&read(0, 0x60_0000, v, 5_000), &d, TIMEOUT),
            Verdict::Violation(Why::NeverMapped)
        ));
    }

    #[test]
    fn other_domains_words_and_untagged_memory_are_violations() {
        let d = shadows();
        d[1].slots[0].record(&entry(1, 0x10_0000, Life::Mapped, 0, false));
        let theirs = tag(TagKind::Buffer, 1, 0, 1);
        assert!(matches!(
            classify(&read(0, 0x10_0000, theirs, 5_000), &d, TIMEOUT),
            Verdict::Violation(Why::OtherDomain { owner: 1 })
        ));
        assert!(matches!(
            classify(&read(0, 0x10_0000, 0, 5_000), &d, TIMEOUT),
            Verdict::Violation(Why::Untagged)
        ));
    }

    #[test]
    fn the_bounce_pool_may_hold_own_buffers_but_never_neighbours() {
        let d = shadows();
        d[0].pool_lo.store(0x100_0000, Ordering::Release);
        d[0].pool_hi.store(0x110_0000, Ordering::Release);
        let mut bounced = entry(9, 0x100_0100, Life::Mapped, 0, false);
        bounced.bounced = true;
        d[0].slots[1].record(&bounced);
        let own = tag(TagKind::Buffer, 0, 1, 9);
        assert!(matches!(
            classify(&read(0, 0x100_0100, own, 5_000), &d, TIMEOUT),
            Verdict::Legal
        ));
        assert!(matches!(
            classify(&read(0, 0x100_0100, 0, 5_000), &d, TIMEOUT),
            Verdict::Legal
        ));
        let nb = tag(TagKind::Neighbour, 0, 1, 9);
        assert!(matches!(
            classify(&read(0, 0x100_0100, nb, 5_000), &d, TIMEOUT),
            Verdict::Violation(Why::NeverMapped)
        ));
        let theirs = tag(TagKind::Buffer, 1, 1, 9);
        assert!(matches!(
            classify(&read(0, 0x100_0100, theirs, 5_000), &d, TIMEOUT),
            Verdict::Violation(Why::OtherDomain { owner: 1 })
        ));
    }

    /// A bounce slot is judged by whose bytes it may hold: a buffer's word
    /// read at a pool address its slot never covered (another owner's
    /// slot, say) is a violation. (The old checker took any own buffer
    /// word anywhere in the pool as legal.)
    #[test]
    fn a_buffers_word_outside_its_bounce_slot_is_a_violation() {
        let d = shadows();
        d[0].pool_lo.store(0x100_0000, Ordering::Release);
        d[0].pool_hi.store(0x110_0000, Ordering::Release);
        let mut e = entry(4, 0x100_0200, Life::Mapped, 0, false);
        e.bounced = true;
        d[0].slots[2].record(&e);
        let w = tag(TagKind::Buffer, 0, 2, 4);
        assert!(matches!(
            classify(&read(0, 0x100_0200 + 56, w, 5_000), &d, TIMEOUT),
            Verdict::Legal
        ));
        assert!(matches!(
            classify(&read(0, 0x100_0100, w, 5_000), &d, TIMEOUT),
            Verdict::Violation(Why::BounceNotOwner { .. })
        ));
        // A translated mapping's word can never be in the pool.
        d[0].slots[3].record(&entry(1, 0x100_0300, Life::Mapped, 0, false));
        let t = tag(TagKind::Buffer, 0, 3, 1);
        assert!(matches!(
            classify(&read(0, 0x100_0300, t, 5_000), &d, TIMEOUT),
            Verdict::Violation(Why::BounceNotOwner { .. })
        ));
    }

    /// Switching: an unmap keeps a deferred allowance only if no switch
    /// away from deferred is recorded after it returned (that switch
    /// flushed it, or the unmap ran under the new policy). The old
    /// checker gave it the allowance whenever the policy read before or
    /// after the call was deferred.
    #[test]
    fn a_switch_away_from_deferred_ends_the_allowance() {
        let d = shadows();
        d[0].slots[0].record(&entry(2, 0x30_0000, Life::Unmapped, 1_000_000, true));
        let v = tag(TagKind::Buffer, 0, 0, 2);
        let a = read(0, 0x30_0000, v, 3_000_000);
        assert!(matches!(
            classify(&a, &d, TIMEOUT),
            Verdict::Stale { age_us: 2_000 }
        ));
        let after_switch = Access {
            left_deferred_ns: 2_000_000,
            ..a
        };
        assert!(matches!(
            classify(&after_switch, &d, TIMEOUT),
            Verdict::Violation(Why::AfterUnmap { .. })
        ));
        // A switch that returned before the unmap was called says nothing,
        // nor one recorded while the call was under way: the unmap may
        // have run after it, once the policy was deferred again.
        for left in [100_000, 999_800] {
            let before = Access {
                left_deferred_ns: left,
                ..a
            };
            assert!(matches!(
                classify(&before, &d, TIMEOUT),
                Verdict::Stale { .. }
            ));
        }
    }

    #[test]
    fn a_page_reached_while_its_map_is_in_progress_is_not_judged_yet() {
        let d = shadows();
        let s = &d[0].slots[1];
        s.record(&entry(1, 0x40_0000, Life::Unmapped, 2_000, false));
        let mut e = entry(2, 0, Life::Mapping, 0, false);
        e.t_map_ns = 4_000;
        s.record(&e);
        // The new mapping reuses gen 1's IOVA: until `map` returns the
        // checker cannot tell, and says so rather than crying wolf.
        let v = tag(TagKind::Buffer, 0, 1, 2);
        assert!(matches!(
            classify(&read(0, 0x40_0000, v, 5_000), &d, TIMEOUT),
            Verdict::Unknown
        ));
        e.iova = 0x40_0000;
        e.life = Life::Mapped;
        s.record(&e);
        assert!(matches!(
            classify(&read(0, 0x40_0000, v, 5_000), &d, TIMEOUT),
            Verdict::Legal
        ));
    }

    #[test]
    fn writes_are_violations() {
        let d = shadows();
        let w = Access {
            write: true,
            ..read(0, 0x10_0000, 0, 5_000)
        };
        assert!(matches!(
            classify(&w, &d, TIMEOUT),
            Verdict::Violation(Why::WriteThroughReadOnly)
        ));
    }
}
