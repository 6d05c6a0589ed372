//! The deferred policy's flush queue: one fixed array ring per CPU (seed
//! `000`'s review asked for an array, not a list), filled by unmaps and
//! emptied as one batch when it reaches its high-water mark or when its
//! oldest entry has waited long enough.
//!
//! ## One producer, serialised takers, no lock on the push
//!
//! Only the queue's owner (the CPU that unmaps) pushes. Batches are taken
//! out by the owner (high-water mark, its own expiry check, `flush_own`) or
//! by the flush timer, and takers hold the queue's [`Taker`] lock from the
//! take to the end of the flush, so a flush of a queue is a barrier for
//! everything queued before it. A push is a few plain stores: the entry's
//! words, then `tail` with `Release`; it reads `head` with `Acquire` to
//! know the fill level. A taker reads `tail` with `Acquire`, copies the
//! entries out, and publishes the new `head` with `Release`, after which
//! the owner may reuse their slots. No read-modify-write and no lock on the
//! per-unmap path; the taker lock is taken once per batch.
//!
//! Page-table pages an unmap unlinked (rare: only when a table empties) go
//! to a side list under a mutex, before the entry is published; a taker
//! takes the whole list, so a page is freed by the first flush that starts
//! after its unlink, never earlier.
//!
//! ## Ages without a clock read per push
//!
//! The owner reads the clock only when it pushes into a queue it sees empty
//! and stamps that entry. A taker reads the clock before it reads `tail`
//! and leaves that instant in `carry`: an entry the owner pushed after the
//! taker's `tail` read, but while it still saw the old `head` (so
//! unstamped), was queued after that instant, give or take the push itself.
//! The oldest entry's time is its stamp, or `carry` when it has none.
//!
//! ## The timer costs nothing while queues are empty
//!
//! [`TimerArm`] says whether the timer has work. The timer sleeps on a
//! condition variable while nothing is queued anywhere; the first push into
//! an idle system flips `armed` and wakes it (once per idle-to-busy
//! transition; later pushes do one relaxed load). When the timer finds every
//! queue empty it disarms, then scans the queues once more. The owner
//! stores `tail`, then loads `armed`; the timer stores `armed = false`, then
//! loads `tail`: a store-then-load on each side (Dekker), so each side
//! needs a full fence between the two, or a push could be missed by the
//! scan while its owner sees the timer still armed. The fences are
//! asymmetric ([`Barrier`]): a compiler fence on the push, `membarrier(2)`
//! on the timer's disarm, which happens once per busy-to-idle transition.
//! The loom model `loom_no_entry_is_stranded` checks exactly this.

#![deny(clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::mem::PhysAddr;
use crate::sync::barrier::Barrier;
use crate::sync::{
    lock, try_lock, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
};

/// One deferred unmap: an IOVA block to free once its invalidation is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FqEntry {
    /// First page frame of the IOVA block.
    pub pfn: u64,
    /// Pages of the block (as allocated).
    pub pages: u64,
}

/// What a flush takes out of a queue.
#[derive(Debug, Default)]
pub struct Batch {
    /// The IOVA blocks to free after the flush.
    pub entries: Vec<FqEntry>,
    /// Page-table pages unlinked by those unmaps, to free after the flush.
    pub tables: Vec<PhysAddr>,
    /// Bit `i` set: IOMMU unit `i` of the domain must be invalidated. A
    /// queue does not record units per entry: a take leaves this 0, and
    /// the flush sets every unit the domain spans when it issues the
    /// batch (a domain's units only grow, so that covers every unit each
    /// unmap saw).
    pub units: u64,
    /// When the oldest entry was queued.
    pub oldest: Option<Instant>,
}

/// One array slot: the entry's words, written by the owner before it
/// publishes `tail`, read by a taker after it reads `tail`. Aligned to 32
/// bytes: a slot's offset is a shift of its index.
#[derive(Debug, Default)]
#[repr(align(32))]
struct Slot {
    pfn: AtomicU64,
    pages: AtomicU64,
    /// Nanoseconds since the queue's `base`, plus one; 0: not stamped.
    stamp: AtomicU64,
}

/// One CPU's flush queue.
#[derive(Debug)]
pub struct FlushQueue {
    /// A power of two of slots, at least `capacity`: a cursor's slot is
    /// its low bits (a mask, not a division, on every push and take).
    slots: Box<[Slot]>,
    /// `slots.len() - 1`.
    mask: usize,
    /// The most entries queued at once.
    capacity: usize,
    /// Entries pushed, ever (the owner's cursor).
    tail: CachePadded<AtomicUsize>,
    /// Entries taken, ever (the takers' cursor).
    head: CachePadded<AtomicUsize>,
    /// See the module doc: the stamp of unstamped entries at `head`.
    carry: AtomicU64,
    /// The stamp of the oldest entry of a batch taken and not yet flushed
    /// (its taker still holds the queue); 0: none. Lets
    /// [`oldest`](Self::oldest) see entries a descheduled taker holds.
    inflight: AtomicU64,
    tables: Mutex<Vec<PhysAddr>>,
    taker: Mutex<()>,
    base: Instant,
}

/// A queue's slot array and its mask (`slots.len() - 1`, a power-of-two
/// length): made only by [`FlushQueue::ring`], which keeps that so.
#[derive(Clone, Copy)]
struct Ring<'a> {
    slots: &'a [Slot],
    mask: usize,
}

impl<'a> Ring<'a> {
    /// The slot of entry `i` (a cursor: entries pushed or taken, ever).
    #[inline(always)]
    fn slot(self, i: usize) -> &'a Slot {
        let k = i & self.mask;
        debug_assert!(k < self.slots.len());
        // SAFETY: `mask` is `slots.len() - 1` for a power-of-two length
        // (`FlushQueue::new`; neither changes after, and `ring` copies
        // both), so `k < slots.len()`. Unchecked: the push and the take's
        // per-entry copy are hot (callgrind counted the bounds check at a
        // few instructions a pair).
        unsafe { self.slots.get_unchecked(k) }
    }
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; `was_empty` says the queue had nothing before, `pushed`
    /// how many entries the queue has taken ever.
    Queued {
        /// The queue was empty before this push.
        was_empty: bool,
        /// Entries pushed into this queue ever, this one included (wraps):
        /// the owner's own count, for work it does every so many pushes.
        pushed: usize,
    },
    /// Queued, and the queue reached its high-water mark: the caller must
    /// take a batch out and flush it.
    Full,
    /// Not queued: the array has no free slot (a taker is behind). The
    /// caller must take a batch out, flush it, and push again.
    NoRoom,
}

/// The right to take batches out of one queue, held from the take to the
/// end of the flush. See [`FlushQueue::taker`].
#[derive(Debug)]
pub struct Taker<'q> {
    q: &'q FlushQueue,
    _held: MutexGuard<'q, ()>,
}

impl FlushQueue {
    /// A queue of `capacity` entries (its array is allocated once, here).
    pub fn new(capacity: usize) -> Self {
        // (The tunables cap a queue far lower: `MAX_FQ_SIZE`.)
        let capacity = capacity.clamp(1, 1 << 30);
        let size = capacity.next_power_of_two();
        Self {
            slots: (0..size).map(|_| Slot::default()).collect(),
            mask: size - 1,
            capacity,
            tail: CachePadded::new(AtomicUsize::new(0)),
            head: CachePadded::new(AtomicUsize::new(0)),
            carry: AtomicU64::new(1),
            inflight: AtomicU64::new(0),
            tables: Mutex::new(Vec::new()),
            taker: Mutex::new(()),
            base: Instant::now(),
        }
    }

    /// The slot of entry `i` (a cursor: entries pushed or taken, ever).
    #[inline(always)]
    fn slot(&self, i: usize) -> &Slot {
        self.ring().slot(i)
    }

    /// The array and its mask, for a caller that reads many slots (held
    /// in locals, not read again through `self` for each).
    #[inline(always)]
    fn ring(&self) -> Ring<'_> {
        Ring {
            slots: &self.slots,
            mask: self.mask,
        }
    }

    /// The array's size: the most entries the queue can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn stamp_now(&self) -> u64 {
        (self.base.elapsed().as_nanos() as u64).saturating_add(1)
    }

    fn instant(&self, stamp: u64) -> Instant {
        self.base + Duration::from_nanos(stamp.saturating_sub(1))
    }

    /// Queues a deferred unmap of `entry` which unlinked `tables`.
    /// `high_water` (clamped to the capacity) is the fill level that asks
    /// for a flush. Only the queue's owner may push (one producer).
    // Always inlined into the deferred unmap, its one hot caller (an
    // outlined push cost ~20 instructions a pair of call and frame).
    #[inline(always)]
    pub fn push(&self, entry: FqEntry, tables: &[PhysAddr], high_water: usize) -> Pushed {
        let t = self.tail.load(Ordering::Relaxed);
        let h = self.head.load(Ordering::Acquire);
        let len = t.wrapping_sub(h);
        if len >= self.capacity {
            return Pushed::NoRoom;
        }
        let was_empty = len == 0;
        if !tables.is_empty() {
            self.keep_tables(tables);
        }
        let slot = self.slot(t);
        slot.pfn.store(entry.pfn, Ordering::Relaxed);
        slot.pages.store(entry.pages, Ordering::Relaxed);
        let stamp = if was_empty { self.stamp_now() } else { 0 };
        slot.stamp.store(stamp, Ordering::Relaxed);
        let pushed = t.wrapping_add(1);
        self.tail.store(pushed, Ordering::Release);
        // Full at `high_water.clamp(1, capacity)` entries: as two compares
        // (`len + 1 >= 1` always holds, so a high water of 0 is 1's).
        let queued = len + 1;
        if queued >= high_water || queued >= self.capacity {
            Pushed::Full
        } else {
            Pushed::Queued { was_empty, pushed }
        }
    }

    /// Keeps page-table pages an unmap unlinked until the queue's flush
    /// (out of line: few unmaps unlink a table).
    #[cold]
    #[inline(never)]
    fn keep_tables(&self, tables: &[PhysAddr]) {
        lock(&self.tables).extend_from_slice(tables);
    }

    /// Locks the queue for taking (blocks while another taker flushes).
    pub fn taker(&self) -> Taker<'_> {
        Taker {
            q: self,
            _held: lock(&self.taker),
        }
    }

    /// The right to take, if no other taker holds it (one is flushing this
    /// queue then, which is what the caller wanted done).
    pub fn try_taker(&self) -> Option<Taker<'_>> {
        Some(Taker {
            q: self,
            _held: try_lock(&self.taker)?,
        })
    }

    /// When the oldest entry still queued was pushed, if any is. Anyone may
    /// ask; the answer may be stale by the time it returns.
    /// A batch a taker took out and has not finished flushing counts (it
    /// is still reachable by its devices).
    pub fn oldest(&self) -> Option<Instant> {
        // `head` before `inflight`: a taker stores `inflight` and then
        // `head` (both Release), so a `head` that shows its take makes its
        // `inflight` visible here; the other order could see the batch
        // neither queued nor in flight.
        let h = self.head.load(Ordering::Acquire);
        let inflight = match self.inflight.load(Ordering::Acquire) {
            0 => None,
            s => Some(self.instant(s)),
        };
        let t = self.tail.load(Ordering::Acquire);
        if h == t {
            return inflight;
        }
        // A taker may have moved `head` on since: then this is an older
        // time than the truth, which errs towards flushing early.
        let queued = self.queued_at(self.slot(h));
        Some(inflight.map_or(queued, |i| i.min(queued)))
    }

    /// When the entry in `slot`, the oldest queued, was pushed: its stamp,
    /// or `carry` if it has none (module doc).
    fn queued_at(&self, slot: &Slot) -> Instant {
        self.instant(self.queued_stamp(slot))
    }

    /// [`queued_at`](Self::queued_at) as a stamp.
    fn queued_stamp(&self, slot: &Slot) -> u64 {
        match slot.stamp.load(Ordering::Relaxed) {
            0 => self.carry.load(Ordering::Relaxed),
            s => s,
        }
    }

    /// Entries queued now (a snapshot).
    pub fn len(&self) -> usize {
        let h = self.head.load(Ordering::Acquire);
        self.tail.load(Ordering::Acquire).wrapping_sub(h)
    }

    /// Whether nothing is queued (a snapshot).
    #[cfg(any(test, loom))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Taker<'_> {
    fn drop(&mut self) {
        // The taker's flush is over (done, or its batch kept for a retry,
        // which the domain's pending list reports): nothing in flight.
        self.q.inflight.store(0, Ordering::Release);
    }
}

impl Taker<'_> {
    /// Takes everything queued, if anything is.
    pub fn take_all(&mut self) -> Option<Batch> {
        let q = self.q;
        // Read before `tail`: entries published after the read below were
        // pushed after this instant (see the module doc on `carry`).
        let now = q.stamp_now();
        let h = q.head.load(Ordering::Relaxed);
        let t = q.tail.load(Ordering::Acquire);
        let tables = std::mem::take(&mut *lock(&q.tables));
        if h == t && tables.is_empty() {
            return None;
        }
        let n = t.wrapping_sub(h);
        // The oldest entry stamps the batch.
        let oldest = (n != 0).then(|| {
            let stamp = q.queued_stamp(q.slot(h));
            // Release: pairs with `oldest`'s Acquire; cleared when the
            // taker is dropped, after its flush. (Never 0, which means
            // none.)
            q.inflight.store(stamp.max(1), Ordering::Release);
            q.instant(stamp)
        });
        let mut entries = Vec::with_capacity(n);
        // The array and its mask in locals: read once, not per entry (the
        // copy's stores could otherwise alias them).
        let ring = q.ring();
        // An exact-size copy: no capacity check per entry.
        entries.extend((0..n).map(|k| {
            let s = ring.slot(h.wrapping_add(k));
            FqEntry {
                pfn: s.pfn.load(Ordering::Relaxed),
                pages: s.pages.load(Ordering::Relaxed),
            }
        }));
        let batch = Batch {
            entries,
            tables,
            units: 0,
            oldest,
        };
        q.carry.store(now, Ordering::Relaxed);
        // Release: the slots were read before the owner may overwrite them.
        q.head.store(t, Ordering::Release);
        Some(batch)
    }

    /// Takes everything if the oldest entry has waited `age` or more at
    /// `now`.
    pub fn take_if_older(&mut self, now: Instant, age: Duration) -> Option<Batch> {
        let oldest = self.q.oldest()?;
        (now.saturating_duration_since(oldest) >= age)
            .then(|| self.take_all())
            .flatten()
    }
}

/// Whether the flush timer has work, and how to wake it.
#[derive(Debug)]
pub struct TimerArm {
    armed: AtomicBool,
    /// Times the timer returned from a nap or a sleep (its wake-ups).
    wakeups: AtomicU64,
    /// Tests only: the timer does nothing while set (a timer thread the
    /// scheduler keeps off its CPU).
    #[cfg(test)]
    paused: AtomicBool,
    barrier: Barrier,
    wake: Mutex<bool>,
    cv: Condvar,
}

impl Default for TimerArm {
    fn default() -> Self {
        Self::new(Barrier::default_for_process())
    }
}

impl TimerArm {
    /// An arm whose owners and timer agree on `barrier`.
    pub(crate) fn new(barrier: Barrier) -> Self {
        Self {
            armed: AtomicBool::new(false),
            wakeups: AtomicU64::new(0),
            #[cfg(test)]
            paused: AtomicBool::new(false),
            barrier,
            wake: Mutex::new(false),
            cv: Condvar::new(),
        }
    }

    /// Called by a queue's owner after a push (tests; the deferred unmap
    /// calls [`on_push_with`](Self::on_push_with)).
    #[cfg(test)]
    pub fn on_push(&self) {
        self.on_push_with(self.barrier);
    }

    /// Called by a queue's owner after a push, with the arm's barrier mode
    /// as the caller read it (the domain's, which the arm was made with):
    /// an unmap that fenced with it a moment before tests the mode once,
    /// not twice. Costs a compiler fence and a relaxed load while the
    /// timer is armed.
    #[inline(always)]
    pub(crate) fn on_push_with(&self, barrier: Barrier) {
        debug_assert_eq!(barrier, self.barrier);
        // Orders the push's `tail` store before the load (module doc).
        barrier.light();
        // Acquire on the swap: one that finds the timer disarmed sees what
        // the timer did before (it cleared the expiry deadline), so the
        // owner's arming after this call is not undone by it.
        if !self.armed.load(Ordering::Relaxed) && !self.armed.swap(true, Ordering::Acquire) {
            *lock(&self.wake) = true;
            self.cv.notify_one();
        }
    }

    /// Tests only: stops (or resumes) the timer's rounds, standing for a
    /// timer thread starved of CPU.
    #[cfg(test)]
    pub(crate) fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Whether the timer is paused (always `false` outside tests).
    pub(crate) fn paused(&self) -> bool {
        #[cfg(test)]
        {
            self.paused.load(Ordering::Relaxed)
        }
        #[cfg(not(test))]
        {
            false
        }
    }

    /// Whether the timer has (or may have) work.
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    /// The timer found every queue empty: disarm. The caller must then scan
    /// every queue once more and [`rearm`](Self::rearm) if any holds work.
    pub fn disarm(&self) {
        // Release: pairs with `on_push`'s Acquire swap.
        self.armed.store(false, Ordering::Release);
        // Orders the store before the rescan's loads (module doc).
        self.barrier.heavy();
    }

    /// The timer's rescan found work after a disarm.
    pub fn rearm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// How many times the timer thread has woken (returned from a nap or a
    /// sleep), ever.
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// Wakes the timer whatever its state (shutdown, tunable change).
    pub fn kick(&self) {
        *lock(&self.wake) = true;
        self.cv.notify_one();
    }

    /// The timer, waiting for its next deadline: sleeps for `dur` or until
    /// [`kick`](Self::kick) (or an owner's arming) wakes it.
    #[cfg(not(loom))]
    pub fn nap(&self, dur: Duration) {
        let w = lock(&self.wake);
        let (mut w, _) = self
            .cv
            .wait_timeout_while(w, dur, |w| !*w)
            .unwrap_or_else(|e| e.into_inner());
        *w = false;
        self.wakeups.fetch_add(1, Ordering::Relaxed);
    }

    /// Under loom the timer thread never runs (the models drive the queue
    /// and the arm directly); this keeps the crate compiling.
    #[cfg(loom)]
    pub fn nap(&self, _dur: Duration) {}

    /// The timer, disarmed and with nothing found: sleeps until an owner
    /// arms it or [`kick`](Self::kick) is called.
    pub fn sleep(&self) {
        let mut w = lock(&self.wake);
        while !*w {
            #[cfg(loom)]
            {
                w = self.cv.wait(w).unwrap();
            }
            #[cfg(not(loom))]
            {
                w = self.cv.wait(w).unwrap_or_else(|e| e.into_inner());
            }
        }
        *w = false;
        self.wakeups.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn e(pfn: u64) -> FqEntry {
        FqEntry { pfn, pages: 1 }
    }

    #[test]
    fn a_taken_batch_counts_as_queued_until_its_taker_is_dropped() {
        let q = FlushQueue::new(8);
        assert_eq!(q.oldest(), None);
        q.push(e(1), &[], 8);
        let t0 = q.oldest().expect("queued");
        let mut taker = q.taker();
        let b = taker.take_all().expect("one entry");
        assert_eq!(b.oldest, Some(t0));
        assert!(q.is_empty());
        let seen = q.oldest().expect("in flight");
        // Stamps are nanoseconds: the round trip through one loses nothing
        // coarser.
        assert!(seen <= t0 + Duration::from_micros(1) && t0 <= seen + Duration::from_micros(1));
        drop(taker);
        assert_eq!(q.oldest(), None);
    }

    #[test]
    fn the_high_water_mark_asks_for_one_batch() {
        let q = FlushQueue::new(4);
        let t0 = Instant::now();
        assert_eq!(
            q.push(e(1), &[], 3),
            Pushed::Queued {
                was_empty: true,
                pushed: 1
            }
        );
        assert_eq!(
            q.push(e(2), &[0x1000], 3),
            Pushed::Queued {
                was_empty: false,
                pushed: 2
            }
        );
        assert_eq!(q.push(e(3), &[], 3), Pushed::Full);
        let b = q.taker().take_all().expect("three entries");
        assert_eq!(b.entries, vec![e(1), e(2), e(3)]);
        assert_eq!(b.tables, vec![0x1000]);
        assert_eq!(b.units, 0, "the flush sets the units");
        assert!(b.oldest.is_some_and(|t| t >= t0 - Duration::from_micros(1)));
        assert!(q.is_empty() && q.oldest().is_none());
        assert_eq!(q.capacity(), 4);
    }

    #[test]
    fn the_high_water_mark_is_clamped_to_the_array_and_a_full_array_refuses() {
        let q = FlushQueue::new(2);
        assert!(matches!(q.push(e(1), &[], 1000), Pushed::Queued { .. }));
        assert_eq!(q.push(e(2), &[], 1000), Pushed::Full);
        assert_eq!(q.push(e(3), &[], 1000), Pushed::NoRoom);
        assert_eq!(q.len(), 2, "a refused entry is not queued");
        assert_eq!(q.taker().take_all().unwrap().entries, vec![e(1), e(2)]);
        assert!(matches!(q.push(e(3), &[], 1000), Pushed::Queued { .. }));
    }

    #[test]
    fn the_ring_wraps_and_keeps_order() {
        let q = FlushQueue::new(3);
        let mut next = 0;
        for round in 0..10 {
            for _ in 0..2 {
                q.push(e(next), &[], 3);
                next += 1;
            }
            let b = q.taker().take_all().unwrap();
            assert_eq!(b.entries, vec![e(next - 2), e(next - 1)], "round {round}");
        }
    }

    #[test]
    fn expiry_takes_only_old_queues() {
        let q = FlushQueue::new(8);
        q.push(e(1), &[], 8);
        let t0 = q.oldest().unwrap();
        let ms = Duration::from_millis(1);
        assert!(q.taker().take_if_older(t0 + ms, 2 * ms).is_none());
        let b = q.taker().take_if_older(t0 + 2 * ms, 2 * ms).unwrap();
        assert_eq!(b.entries.len(), 1);
        assert!(q.taker().take_all().is_none());
    }

    #[test]
    fn an_entry_pushed_while_a_batch_is_out_carries_the_takers_time() {
        let q = FlushQueue::new(8);
        q.push(e(1), &[], 8);
        // The owner pushes again before the taker publishes `head`: from
        // the queue's point of view that is a push into a non-empty queue.
        // Simulate it: take, then push; the push sees an empty queue and
        // stamps. The unstamped case is forced by hand below.
        let before = Instant::now();
        let b = q.taker().take_all().unwrap();
        assert_eq!(b.entries.len(), 1);
        let t = q.tail.load(Ordering::Relaxed);
        let slot = &q.slots[t % 8];
        slot.stamp.store(0, Ordering::Relaxed);
        q.tail.store(t + 1, Ordering::Release);
        let oldest = q.oldest().expect("one entry");
        assert!(oldest >= before - Duration::from_micros(1));
        assert!(oldest <= Instant::now());
    }

    #[test]
    fn a_push_into_an_idle_system_wakes_the_timer_once() {
        let arm = TimerArm::new(Barrier::Fence);
        assert!(!arm.is_armed());
        arm.on_push();
        assert!(arm.is_armed());
        arm.sleep(); // returns at once: the wake was recorded
        arm.on_push(); // armed already: no second wake
        assert!(!*lock(&arm.wake));
    }
}

#[cfg(all(test, loom))]
#[allow(clippy::indexing_slicing)]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// An owner pushes into an empty queue while the timer disarms and
    /// rescans: afterwards the entry is either taken by the timer or the
    /// timer is armed (and was woken), never stranded in an idle system.
    #[test]
    fn loom_no_entry_is_stranded() {
        loom::model(|| {
            let q = Arc::new(FlushQueue::new(4));
            let arm = Arc::new(TimerArm::new(Barrier::Fence));
            arm.rearm(); // the timer is running, about to find nothing
            let owner = {
                let (q, arm) = (q.clone(), arm.clone());
                loom::thread::spawn(move || {
                    q.push(FqEntry { pfn: 7, pages: 1 }, &[], 4);
                    arm.on_push();
                })
            };
            // The timer's idle step.
            arm.disarm();
            let taken = q.oldest().is_some() && q.taker().take_all().is_some();
            if taken {
                arm.rearm();
            }
            owner.join().unwrap();
            let stranded = !taken && !q.is_empty() && !arm.is_armed();
            assert!(
                !stranded,
                "an entry sits in a queue and nobody will flush it"
            );
        });
    }

    /// The expiry deadline across the timer's disarm: the owner pushes into
    /// an empty queue, announces it (`on_push`, its light fence) and makes
    /// sure a deadline covers it, while the timer, having found nothing,
    /// marks the deadline as being cleared, disarms (its heavy barrier),
    /// looks once more and clears it only if it found nothing. However
    /// they interleave, an entry left queued has a deadline armed: a
    /// translator would otherwise have nothing to expire its stale
    /// translations by. (Fails if the timer clears in one step, or if the
    /// owner only arms when it finds the deadline cleared.)
    #[test]
    fn loom_an_unmap_queued_across_the_timers_disarm_keeps_its_deadline() {
        loom::model(|| {
            use crate::hw::iotlb::{Iotlb, IotlbConfig};
            let q = Arc::new(FlushQueue::new(4));
            let arm = Arc::new(TimerArm::new(Barrier::Fence));
            let tlb = Arc::new(Iotlb::new(IotlbConfig { sets: 1, ways: 1 }, 1));
            let period = Duration::from_millis(1);
            // An earlier unmap's deadline, flushed since.
            tlb.arm_deadline_at(0, 5, 7);
            arm.rearm(); // the timer is running, about to find nothing
            let owner = {
                let (q, arm, tlb) = (q.clone(), arm.clone(), tlb.clone());
                loom::thread::spawn(move || {
                    q.push(FqEntry { pfn: 7, pages: 1 }, &[], 4);
                    arm.on_push();
                    tlb.cover_unmap(0, || period);
                })
            };
            // The timer's idle step.
            let marked = tlb.begin_clear(0);
            arm.disarm();
            let busy = q.oldest().is_some();
            if let Some(m) = marked {
                tlb.finish_clear(0, m, !busy);
            }
            if busy {
                arm.rearm();
            }
            owner.join().unwrap();
            assert!(
                q.is_empty() || tlb.deadline(0) != 0,
                "an unmap is queued and no deadline would expire it"
            );
        });
    }

    /// The owner pushes while a taker takes: every entry comes out exactly
    /// once, with the words the owner wrote (the slots are reused only
    /// after a taker published `head`).
    #[test]
    fn loom_entries_come_out_once_and_whole() {
        loom::model(|| {
            let q = Arc::new(FlushQueue::new(2));
            let owner = {
                let q = q.clone();
                loom::thread::spawn(move || {
                    let mut pushed = 0u64;
                    let mut next = 1u64;
                    while next <= 3 {
                        match q.push(
                            FqEntry {
                                pfn: next,
                                pages: next,
                            },
                            &[],
                            2,
                        ) {
                            Pushed::NoRoom => loom::thread::yield_now(),
                            _ => {
                                pushed += 1;
                                next += 1;
                            }
                        }
                    }
                    pushed
                })
            };
            let mut seen = Vec::new();
            while seen.len() < 3 {
                if let Some(b) = q.taker().take_all() {
                    for e in b.entries {
                        assert_eq!(e.pfn, e.pages, "a torn entry");
                        seen.push(e.pfn);
                    }
                } else {
                    loom::thread::yield_now();
                }
            }
            assert_eq!(owner.join().unwrap(), 3);
            assert_eq!(seen, vec![1, 2, 3], "in order, each once");
        });
    }
}
