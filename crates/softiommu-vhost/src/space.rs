//! Where the device's DMA is translated: the device IOTLB and the shared
//! memory behind it, the misses asked of the front-end, and the counters.
//!
//! # The hit path: no lock, no shared write
//! An access runs inside a *section* of its thread's reader slot
//! (`readers`, `seat`): two stores to a slot only its
//! thread writes and a fence (a compiler fence where `membarrier(2)` is
//! available). Inside it the access looks each page up in the page cache
//! (`pagecache`, a sequence lock per entry) and copies through
//! the host pointer it finds, merging pages that are contiguous in host
//! memory into one piece. Only a page the cache does not hold takes the
//! table lock: it is looked up in the device IOTLB ([`crate::iotlb`], the
//! authority, bounded), resolved through the memory table, cached, and
//! used — or it misses.
//!
//! # The invalidation contract
//! Every change (an update, an invalidation, a flush, a new memory table)
//! happens under the table lock, and clears the page-cache entries of the
//! range (or all) before the lock is released. An invalidation or a flush
//! then *drains*: the heavy fence, then it waits for every slot it finds
//! inside a section. So once [`DmaSpace::invalidate`] has returned (and the
//! back-end acknowledged it), every access that could have used a removed
//! translation has finished, and every later one — or later piece of one
//! in flight — finds the cache cleared and the table without the range: it
//! misses, and without a new update from the front-end it fails with
//! [`AccessError::MissTimeout`]. No byte of the range is read or written
//! after the acknowledgement. A new memory table is swapped in the same
//! way, and the old one is unmapped only after the drain.
//!
//! # Misses
//! A miss registers the pages of the access that are not already
//! outstanding (at most [`MISS_PREFETCH_PAGES`]) and sends one
//! `BACKEND_IOTLB_MSG` per page on the back-end channel, then waits,
//! outside its section and without the table lock, until an update answers
//! its page, the rings stop ([`AccessError::Cancelled`]), or the access's
//! bound passes ([`AccessError::MissTimeout`]). The bound is checked first
//! on every wake: updates for other pages neither extend it nor keep the
//! access from asking for its own. An outstanding page is not asked again
//! until the bound has passed since it was asked. The set of outstanding
//! pages holds at most [`MISS_OUTSTANDING_MAX`] pages: entries older than
//! the bound are dropped as new ones come, and past the cap the oldest go
//! (a page dropped is asked again by the next access that needs it).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{AccessError, IotlbError};
use crate::iotlb::{invalidation_range, DeviceIotlb, IotlbOutcome};
use crate::memtable::{MemTable, Space};
use crate::pagecache::{PageCache, Piece, PAGE};
use crate::proto::{backend_req, iotlb as m, VERSION};
use crate::readers::{Readers, SLOTS};
use crate::sync::Barrier;
use crate::{seat, wire};

/// Pages asked of the front-end for one miss, ahead of the one missed,
/// from the access's range (QEMU answers a miss with one 4 KiB page).
pub const MISS_PREFETCH_PAGES: u64 = 32;
/// Pages a whole request may ask for ahead, before its first access
/// (`DmaSpace::prefetch`): a request's segments are mostly single pages,
/// so asking them one access at a time would cost a round trip each.
pub const REQUEST_PREFETCH_PAGES: usize = 512;
/// Most pages outstanding at once (asked of the front-end, not answered):
/// twice what a look-ahead of four requests may ask
/// (4 × [`REQUEST_PREFETCH_PAGES`]), so a guest pointing its chains at
/// IOVAs the front-end never maps cannot grow the set without bound
/// (about 32 bytes a page: 128 KiB at most).
pub const MISS_OUTSTANDING_MAX: usize = 4096;
/// Most pages one [`DmaSpace::prefetch`] looks at, cached or not: the
/// pages of a request of `MAX_REQUEST_BYTES` (8 MiB, 2,048 pages) in
/// `seg_max` (126) segments, each of which may straddle one more page,
/// with room to spare; past that (a chain of many short segments, from a
/// front-end that did not acknowledge `seg_max`) the scan stops and the
/// accesses ask for the rest as they miss.
pub const PREFETCH_SCAN_PAGES: usize = 4096;
/// Pages looked at per section of a prefetch scan: an invalidation waits
/// for at most this many cache lookups, never for the whole scan.
const PREFETCH_SECTION_PAGES: usize = 64;
/// Bytes of one miss on the back-end channel (header and `vhost_iotlb_msg`).
const MISS_MSG_LEN: usize = crate::proto::HEADER_LEN + m::MSG_LEN;

/// What a ring or buffer address is, which decides how it translates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrKind {
    /// A ring address (`SET_VRING_ADDR`): an IOVA under
    /// `ACCESS_PLATFORM`, else a front-end virtual address.
    Ring,
    /// A buffer address from a descriptor: an IOVA under
    /// `ACCESS_PLATFORM`, else a guest-physical address.
    Buffer,
}

/// The counters of one [`DmaSpace`], as a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IotlbStats {
    /// Updates taken.
    pub updates: u64,
    /// Invalidations taken.
    pub invalidations: u64,
    /// IOTLB messages refused (zero-length, wrapping, bad perm or type).
    pub rejected: u64,
    /// Misses sent to the front-end (pages asked).
    pub misses: u64,
    /// Accesses that gave up waiting for a miss.
    pub miss_timeouts: u64,
    /// Accesses refused: no translation after the bound, a translation
    /// without the permission, or one outside the shared memory.
    pub refused: u64,
    /// Accesses cancelled while waiting because the rings stopped.
    pub cancelled: u64,
    /// Whole-table drops (rings stopped, reset).
    pub flushes: u64,
    /// Table emptied because it was full.
    pub evictions: u64,
    /// Asked pages an update answered (the round trips timed below).
    pub answered: u64,
    /// Sum over answered pages of the time from the ask to the update,
    /// nanoseconds (the front-end's round trip, as this side sees it).
    pub miss_rtt_ns: u64,
    /// Times an access woke while waiting for a miss.
    pub miss_wakeups: u64,
    /// Sum of the time accesses spent waiting for misses, nanoseconds.
    pub miss_wait_ns: u64,
    /// Miss batches not sent because the front-end did not read the
    /// back-end channel within the bound (nothing of them sent).
    pub channel_full: u64,
    /// Back-end channels given up: a send failed or timed out with a
    /// message sent in part (the stream would be out of step).
    pub channel_broken: u64,
}

#[derive(Debug, Default)]
struct Counters {
    updates: AtomicU64,
    invalidations: AtomicU64,
    rejected: AtomicU64,
    misses: AtomicU64,
    miss_timeouts: AtomicU64,
    refused: AtomicU64,
    cancelled: AtomicU64,
    flushes: AtomicU64,
    evictions: AtomicU64,
    answered: AtomicU64,
    miss_rtt_ns: AtomicU64,
    miss_wakeups: AtomicU64,
    miss_wait_ns: AtomicU64,
    channel_full: AtomicU64,
    channel_broken: AtomicU64,
}

/// The back-end channel misses go out on.
#[derive(Debug, Default)]
enum Channel {
    /// None received (`SET_BACKEND_REQ_FD`).
    #[default]
    None,
    /// Open and in step: every message sent whole.
    Open(UnixStream),
    /// Given up (the reason): a message went out in part or the socket
    /// failed. Misses fail at once until a new `SET_BACKEND_REQ_FD`.
    Broken(String),
}

/// Pages of an update cached at once (more are cached as accesses touch them).
const UPDATE_PREFILL_PAGES: u64 = 8;
/// Most page-cache entries a space keeps (32 bytes each).
const CACHE_MAX: usize = 8192;

#[derive(Debug, Default)]
struct MissState {
    /// Page -> when it was asked; at most [`MISS_OUTSTANDING_MAX`] entries.
    outstanding: HashMap<u64, Instant>,
    /// When `outstanding` was last rid of entries older than the bound.
    pruned: Option<Instant>,
    /// The outstanding pages waiters sleep on (one entry per waiter): an
    /// update wakes the waiters only when it answers one of them.
    watched: Vec<u64>,
    cancelled: bool,
}

impl MissState {
    /// Records page `pg` as asked at `now` unless it was asked less than
    /// `bound` ago; returns whether it is to be asked now. Entries older
    /// than `bound` are dropped (a walk at most once per `bound`, or when
    /// the set is full); a set full of fresh entries drops its oldest
    /// quarter. Amortized O(1) per call; the set never exceeds
    /// [`MISS_OUTSTANDING_MAX`].
    fn ask(&mut self, pg: u64, now: Instant, bound: Duration) -> bool {
        let fresh = |t: &Instant| now.saturating_duration_since(*t) < bound;
        if self.outstanding.get(&pg).is_some_and(fresh) {
            return false;
        }
        let full = self.outstanding.len() >= MISS_OUTSTANDING_MAX;
        let due = self
            .pruned
            .is_none_or(|t| now.saturating_duration_since(t) >= bound);
        if full || due {
            self.outstanding.retain(|_, t| fresh(t));
            self.pruned = Some(now);
        }
        if self.outstanding.len() >= MISS_OUTSTANDING_MAX {
            let mut times: Vec<Instant> = self.outstanding.values().copied().collect();
            let k = MISS_OUTSTANDING_MAX / 4;
            let (_, cut, _) = times.select_nth_unstable(k);
            let cut = *cut;
            self.outstanding.retain(|_, t| *t > cut);
        }
        self.outstanding.insert(pg, now);
        true
    }
}

/// The device's view of guest memory through the front-end's IOMMU.
#[derive(Debug)]
pub struct DmaSpace {
    /// The authority; every change of it, of `cache` and of `mem` is made
    /// holding this lock.
    tables: Mutex<DeviceIotlb>,
    /// What the hit path reads.
    cache: PageCache,
    /// The shared memory (a `Box` published here; replaced under the
    /// table lock, freed after a drain).
    mem: AtomicPtr<MemTable>,
    /// The accesses in flight, for the drain.
    readers: Arc<Readers>,
    /// This space's identity for the threads' seats.
    id: u64,
    iommu: AtomicBool,
    /// Bumped after every update: a waiter that saw it change retries.
    generation: AtomicU64,
    misses: Mutex<MissState>,
    wake: Condvar,
    channel: Mutex<Channel>,
    miss_timeout: Duration,
    counters: Counters,
}

/// How a wait for a page ended.
enum Slept {
    Answered,
    Cancelled,
    TimedOut,
}

/// Outcome of one translation attempt on the locked path.
enum Step {
    Hit(*mut u8, u64),
    Miss(u64),
}

impl Drop for DmaSpace {
    fn drop(&mut self) {
        self.readers.close();
        let p = *self.mem.get_mut();
        // SAFETY: from `Box::into_raw` in `new`/`set_memory`; `&mut self`
        // means no access is under way, and it is freed once.
        drop(unsafe { Box::from_raw(p) });
    }
}

impl DmaSpace {
    /// An empty space: no memory, an empty IOTLB of `capacity` entries,
    /// misses bounded by `miss_timeout`.
    pub fn new(capacity: usize, miss_timeout: Duration) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        Self {
            tables: Mutex::new(DeviceIotlb::new(capacity)),
            cache: PageCache::new(capacity.clamp(1, CACHE_MAX)),
            mem: AtomicPtr::new(Box::into_raw(Box::default())),
            readers: Arc::new(Readers::new(SLOTS, Barrier::get())),
            id: IDS.fetch_add(1, Ordering::Relaxed),
            iommu: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            misses: Mutex::new(MissState::default()),
            wake: Condvar::new(),
            channel: Mutex::new(Channel::None),
            miss_timeout,
            counters: Counters::default(),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> IotlbStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IotlbStats {
            updates: l(&c.updates),
            invalidations: l(&c.invalidations),
            rejected: l(&c.rejected),
            misses: l(&c.misses),
            miss_timeouts: l(&c.miss_timeouts),
            refused: l(&c.refused),
            cancelled: l(&c.cancelled),
            flushes: l(&c.flushes),
            evictions: l(&c.evictions),
            answered: l(&c.answered),
            miss_rtt_ns: l(&c.miss_rtt_ns),
            miss_wakeups: l(&c.miss_wakeups),
            miss_wait_ns: l(&c.miss_wait_ns),
            channel_full: l(&c.channel_full),
            channel_broken: l(&c.channel_broken),
        }
    }

    /// Entries in the device IOTLB now.
    pub fn iotlb_len(&self) -> usize {
        self.lock().len()
    }

    /// The table lock, held by a test to stand for a slow change.
    #[cfg(test)]
    pub(crate) fn hold_table(&self) -> std::sync::MutexGuard<'_, DeviceIotlb> {
        self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeviceIotlb> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn miss_state(&self) -> std::sync::MutexGuard<'_, MissState> {
        self.misses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a section of this thread: translations and copies inside it
    /// are waited for by every drain.
    #[inline]
    fn section(&self) -> seat::Section<'_> {
        seat::enter(self.id, &self.readers)
    }

    /// The memory table, for a caller inside a section or holding the
    /// table lock (either keeps it from being freed).
    #[inline]
    fn mem(&self) -> &MemTable {
        // SAFETY: the pointer came from `Box::into_raw` and is freed only
        // after it was replaced under the table lock and a drain waited
        // for every section; the caller is in a section or holds the lock.
        unsafe { &*self.mem.load(Ordering::Acquire) }
    }

    /// Whether addresses go through the IOTLB (`ACCESS_PLATFORM` negotiated).
    pub(crate) fn set_iommu(&self, on: bool) {
        self.iommu.store(on, Ordering::Release);
    }

    /// Replaces the shared memory; the old mappings go once no access uses them.
    pub(crate) fn set_memory(&self, mem: MemTable) {
        let new = Box::into_raw(Box::new(mem));
        let t = self.lock();
        let old = self.mem.swap(new, Ordering::AcqRel);
        self.cache.clear();
        drop(t);
        self.readers.drain();
        // SAFETY: `old` came from `Box::into_raw`; it was unpublished under
        // the lock and the drain waited for every section that could hold it.
        drop(unsafe { Box::from_raw(old) });
    }

    /// Whether every byte of `[uaddr, +len)` lies in the shared memory
    /// (in one region or in several that meet), by front-end virtual
    /// address: where a ring lies without `ACCESS_PLATFORM`. `len` is not
    /// zero and the range does not wrap (the caller checked).
    pub(crate) fn covers_uaddr(&self, uaddr: u64, len: u64) -> bool {
        let _t = self.lock();
        let mem = self.mem();
        let (mut at, end) = (uaddr, uaddr.saturating_add(len));
        // Each step ends at a region's end: at most one per region.
        for _ in 0..=crate::proto::MAX_REGIONS {
            if at >= end {
                return true;
            }
            match mem.host(Space::Uaddr, at, end - at) {
                Some((_, n)) if n > 0 => at += n,
                _ => return false,
            }
        }
        at >= end
    }

    /// Whether any memory is shared.
    pub(crate) fn has_memory(&self) -> bool {
        let _t = self.lock();
        !self.mem().is_empty()
    }

    /// Sets the back-end channel misses go out on (an `AF_UNIX` stream
    /// socket, checked by the session). A batch of misses is sent within
    /// the miss bound as a whole, never in a blocking call (a front-end
    /// that stops reading the channel — QEMU does while it waits for a
    /// reply on the main one — cannot hang the device); see
    /// [`DmaSpace::send_misses`].
    pub(crate) fn set_channel(&self, s: Option<UnixStream>) {
        *self.channel.lock().unwrap_or_else(|p| p.into_inner()) = match s {
            Some(s) => Channel::Open(s),
            None => Channel::None,
        };
    }

    /// Caches the piece of page `page` that the IOTLB entry covering
    /// `at` (a byte of the page) translates, resolved through the memory
    /// table. Holding the table lock. Nothing is cached when `at` has no
    /// translation or its memory is not shared.
    fn cache_page(&self, t: &DeviceIotlb, at: u64) {
        let page = at & !(PAGE - 1);
        let Some(e) = t.lookup(at) else {
            return;
        };
        let end = e.last.min(page + (PAGE - 1));
        let piece = |from: u64| {
            let ua = e.uaddr.wrapping_add(from - e.iova);
            let (p, n) = self.mem().host(Space::Uaddr, ua, end - from + 1)?;
            Some(Piece {
                page,
                lo: from - page,
                hi: from - page + n - 1,
                host: p as usize,
                read: e.perm.allows(false),
                write: e.perm.allows(true),
            })
        };
        // From the entry's first byte in the page if memory covers `at`
        // from there (a region may end inside a page), else from `at`.
        let p = piece(e.iova.max(page))
            .filter(|p| p.page + p.hi >= at)
            .or_else(|| piece(at));
        if let Some(p) = p {
            self.cache.fill(p);
        }
    }

    /// Takes one IOTLB message payload (`struct vhost_iotlb_msg`) from the front-end.
    pub(crate) fn iotlb_message(&self, p: &[u8; m::MSG_LEN]) -> Result<IotlbOutcome, IotlbError> {
        let f = |k: usize| u64::from_le_bytes(p[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
        let (iova, size, uaddr, perm, kind) = (f(0), f(1), f(2), p[24], p[25]);
        let r = match kind {
            m::UPDATE => self.update(iova, size, uaddr, perm),
            m::INVALIDATE => self.invalidate(iova, size),
            _ => Err(IotlbError::BadType { kind }),
        };
        if r.is_err() {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Inserts a translation and wakes the accesses waiting for one. An
    /// update that replaced translations drains as an invalidation does.
    pub fn update(
        &self,
        iova: u64,
        size: u64,
        uaddr: u64,
        perm: u8,
    ) -> Result<IotlbOutcome, IotlbError> {
        let mut t = self.lock();
        let out = t.update(iova, size, uaddr, perm)?;
        // Accepted: size >= 1 and the range does not wrap.
        let last = iova + (size - 1);
        let (replaced, evicted) = match out {
            IotlbOutcome::Updated { replaced, evicted } => (replaced, evicted),
            IotlbOutcome::Invalidated { .. } => (0, false),
        };
        if evicted {
            self.cache.clear();
        } else {
            self.cache.clear_range(iova, last);
        }
        // The first pages are cached now: a miss's answer is used at once.
        let first = iova & !(PAGE - 1);
        let pages = ((last - first) / PAGE + 1).min(UPDATE_PREFILL_PAGES);
        for k in 0..pages {
            self.cache_page(&t, (first + k * PAGE).max(iova));
        }
        drop(t);
        if replaced > 0 {
            self.readers.drain();
        }
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        if evicted {
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        let mut st = self.miss_state();
        let pages = (last - first) / PAGE + 1;
        let now = Instant::now();
        let (mut answered, mut rtt) = (0u64, 0u64);
        if pages <= (st.outstanding.len() as u64).max(64) {
            // The common answer to a miss: one page; no walk of the whole
            // set. Either way the work is at most the cap.
            for k in 0..pages {
                if let Some(t) = st.outstanding.remove(&(first + k * PAGE)) {
                    answered += 1;
                    rtt += now.duration_since(t).as_nanos() as u64;
                }
            }
        } else {
            st.outstanding.retain(|&pg, t| {
                let keep = pg < first || pg > last;
                if !keep {
                    answered += 1;
                    rtt += now.duration_since(*t).as_nanos() as u64;
                }
                keep
            });
        }
        let wake = st.watched.iter().any(|&pg| pg >= first && pg <= last);
        drop(st);
        if answered > 0 {
            self.counters
                .answered
                .fetch_add(answered, Ordering::Relaxed);
            self.counters.miss_rtt_ns.fetch_add(rtt, Ordering::Relaxed);
        }
        if wake {
            self.wake.notify_all();
        }
        Ok(out)
    }

    /// Removes the translations of a range; when it returns, no access
    /// through them is under way and none will start.
    pub fn invalidate(&self, iova: u64, size: u64) -> Result<IotlbOutcome, IotlbError> {
        let mut t = self.lock();
        let out = t.invalidate(iova, size)?;
        let evicted = matches!(out, IotlbOutcome::Invalidated { evicted: true, .. });
        // The range the IOTLB took (the whole space for size 0 or a range
        // that wraps past 2^64).
        match invalidation_range(iova, size) {
            (first, last) if !evicted && (first, last) != (0, u64::MAX) => {
                self.cache.clear_range(first, last)
            }
            _ => self.cache.clear(),
        }
        drop(t);
        self.readers.drain();
        self.counters.invalidations.fetch_add(1, Ordering::Relaxed);
        if evicted {
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }

    /// Drops the whole IOTLB (the rings stopped); when it returns, no
    /// access through it is under way.
    pub fn flush(&self) {
        let mut t = self.lock();
        t.clear();
        self.cache.clear();
        drop(t);
        self.readers.drain();
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether pages asked of the front-end are still unanswered.
    pub(crate) fn misses_outstanding(&self) -> bool {
        !self.miss_state().outstanding.is_empty()
    }

    /// Wakes every access waiting for a miss with [`AccessError::Cancelled`],
    /// and makes later misses fail so until [`DmaSpace::resume`].
    pub fn cancel(&self) {
        let mut st = self.miss_state();
        st.cancelled = true;
        st.outstanding.clear();
        drop(st);
        self.wake.notify_all();
    }

    /// Lets misses wait again (the rings start).
    pub fn resume(&self) {
        self.miss_state().cancelled = false;
    }

    /// Runs `f` over the host memory of `[addr, +len)` in pieces, inside
    /// this thread's section (`f` gets the pointer, its length and the
    /// offset into the access). Missing translations are asked of the
    /// front-end and waited for, within the bound, outside the section.
    pub(crate) fn access(
        &self,
        kind: AddrKind,
        addr: u64,
        len: u64,
        write: bool,
        f: &mut dyn FnMut(*mut u8, usize, u64) -> Result<(), AccessError>,
    ) -> Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        addr.checked_add(len - 1)
            .ok_or(AccessError::Wraps { iova: addr, len })?;
        let mut done = 0u64;
        let mut deadline: Option<Instant> = None;
        while done < len {
            let gen = self.generation.load(Ordering::Acquire);
            let missed = {
                let _s = self.section();
                self.run(kind, addr, len, write, &mut done, f)?
            };
            if let Some(iova) = missed {
                self.wait_miss(iova, len - done, write, gen, &mut deadline)?;
            }
        }
        Ok(())
    }

    /// The part of an access inside one section: pieces from `*done` on
    /// until the end (`None`) or a miss (its IOVA).
    #[inline]
    fn run(
        &self,
        kind: AddrKind,
        addr: u64,
        len: u64,
        write: bool,
        done: &mut u64,
        f: &mut dyn FnMut(*mut u8, usize, u64) -> Result<(), AccessError>,
    ) -> Result<Option<u64>, AccessError> {
        let iommu = self.iommu.load(Ordering::Acquire);
        while *done < len {
            let (a, left) = (addr + *done, len - *done);
            let (p, n) = if !iommu {
                self.untranslated(kind, a, left)?
            } else if let Some(h) = self.cache.lookup(a, write) {
                // Pages contiguous in host memory make one piece.
                let mut n = h.len.min(left);
                while n < left {
                    match self.cache.lookup(a + n, write) {
                        Some(h2) if h2.host == h.host.wrapping_add(n as usize) => {
                            n += h2.len.min(left - n)
                        }
                        _ => break,
                    }
                }
                (h.host as *mut u8, n)
            } else {
                match self.translate(a, left, write) {
                    Ok(Step::Hit(p, n)) => (p, n),
                    Ok(Step::Miss(iova)) => return Ok(Some(iova)),
                    Err(e) => {
                        self.counters.refused.fetch_add(1, Ordering::Relaxed);
                        return Err(e);
                    }
                }
            };
            f(p, n as usize, *done)?;
            *done += n;
        }
        Ok(None)
    }

    /// Without an IOMMU: a ring address is a front-end virtual address, a
    /// buffer address a guest-physical one. Inside a section.
    fn untranslated(
        &self,
        kind: AddrKind,
        a: u64,
        left: u64,
    ) -> Result<(*mut u8, u64), AccessError> {
        let space = match kind {
            AddrKind::Ring => Space::Uaddr,
            AddrKind::Buffer => Space::Gpa,
        };
        self.mem().host(space, a, left).ok_or_else(|| {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            AccessError::OutsideMemory { iova: a, uaddr: a }
        })
    }

    /// The locked path, for a page the cache does not hold: looks `a` up
    /// in the IOTLB, caches its page and returns the piece. Inside a section.
    fn translate(&self, a: u64, left: u64, write: bool) -> Result<Step, AccessError> {
        let t = self.lock();
        let Some(e) = t.lookup(a) else {
            return Ok(Step::Miss(a));
        };
        if !e.perm.allows(write) {
            return Err(AccessError::Denied {
                iova: a,
                want: if write { "write" } else { "read" },
            });
        }
        // (left - 1).min(last - a) + 1 cannot overflow, even for an entry ending at 2^64.
        let n = (left - 1).min(e.last - a) + 1;
        let target = e.uaddr.wrapping_add(a - e.iova);
        let Some((p, n)) = self.mem().host(Space::Uaddr, target, n) else {
            return Err(AccessError::OutsideMemory {
                iova: a,
                uaddr: target,
            });
        };
        self.cache_page(&t, a);
        Ok(Step::Hit(p, n))
    }

    /// Asks for the page of `iova` (and the pages after it, up to `left`
    /// bytes) unless already asked, and sleeps until an update answers it.
    /// `gen` is the generation read before the miss; `deadline` the
    /// access's bound, set at its first miss and kept across its retries.
    /// Ok means retry the access.
    fn wait_miss(
        &self,
        iova: u64,
        left: u64,
        write: bool,
        gen: u64,
        deadline: &mut Option<Instant>,
    ) -> Result<(), AccessError> {
        let now = Instant::now();
        let deadline = *deadline.get_or_insert(now + self.miss_timeout);
        let first = iova & !(PAGE - 1);
        let last = iova.saturating_add(left - 1);
        let mut st = self.miss_state();
        if st.cancelled {
            self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
            return Err(AccessError::Cancelled { iova });
        }
        // The bound first: updates for other pages must not extend it.
        if now >= deadline {
            drop(st);
            return Err(self.timed_out(iova, first));
        }
        // An update since the miss: retry only if it brought this page
        // (the table is taken under the miss lock: the order everywhere is
        // miss state, then table; an update inserts before it bumps the
        // generation and takes the miss lock after, so one that lands
        // after this look finds the page asked and watched, and wakes us).
        if self.generation.load(Ordering::Acquire) != gen && self.lock().lookup(iova).is_some() {
            return Ok(());
        }
        let mut ask = Vec::new();
        let mut pg = first;
        for _ in 0..MISS_PREFETCH_PAGES {
            if st.ask(pg, now, self.miss_timeout) {
                ask.push(pg);
            }
            match pg.checked_add(PAGE) {
                Some(n) if n <= last => pg = n,
                _ => break,
            }
        }
        if !ask.is_empty() {
            drop(st);
            if let Err(e) = self.send_misses(&ask, write) {
                // A send cut short because the rings stopped meanwhile (a
                // front-end stops reading the channel while it waits for
                // GET_VRING_BASE's reply) is the stop's: the request is
                // left on the ring for the restart, not failed.
                if self.miss_state().cancelled {
                    self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                    return Err(AccessError::Cancelled { iova });
                }
                return Err(e);
            }
            st = self.miss_state();
        }
        match self.sleep_on(st, first, deadline) {
            Slept::Answered => Ok(()),
            Slept::Cancelled => {
                self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                Err(AccessError::Cancelled { iova })
            }
            Slept::TimedOut => Err(self.timed_out(iova, first)),
        }
    }

    /// The access's bound passed with page `first` (of `iova`) unanswered.
    fn timed_out(&self, iova: u64, first: u64) -> AccessError {
        self.miss_state().outstanding.remove(&first);
        self.counters.miss_timeouts.fetch_add(1, Ordering::Relaxed);
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        AccessError::MissTimeout {
            iova,
            waited_ms: self.miss_timeout.as_millis() as u64,
        }
    }

    /// Sleeps until page `pg` is no longer outstanding (an update answered
    /// it, or it was never asked), the rings stop, or `deadline` passes.
    /// Only an update that answers `pg` wakes this waiter.
    fn sleep_on(
        &self,
        mut st: std::sync::MutexGuard<'_, MissState>,
        pg: u64,
        deadline: Instant,
    ) -> Slept {
        let t0 = Instant::now();
        st.watched.push(pg);
        let r = loop {
            if st.cancelled {
                break Slept::Cancelled;
            }
            if !st.outstanding.contains_key(&pg) {
                break Slept::Answered;
            }
            let now = Instant::now();
            if now >= deadline {
                break Slept::TimedOut;
            }
            st = self
                .wake
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            self.counters.miss_wakeups.fetch_add(1, Ordering::Relaxed);
        };
        if let Some(k) = st.watched.iter().position(|&w| w == pg) {
            st.watched.swap_remove(k);
        }
        drop(st);
        self.counters
            .miss_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// Waits, within the miss bound, until the front-end has answered page
    /// `pg` (the last page a [`DmaSpace::prefetch`] asked for: the
    /// front-end answers in order, so the pages asked before it are
    /// answered too), so that the accesses after it run without a wake-up
    /// per page. Cancellation and the bound end the wait silently: the
    /// accesses that follow meet them and report them.
    pub(crate) fn await_page(&self, pg: u64) {
        let deadline = Instant::now() + self.miss_timeout;
        let _ = self.sleep_on(self.miss_state(), pg, deadline);
    }

    /// Asks the front-end, without waiting, for the pages of `segs` that
    /// have no translation and are not already asked (at most
    /// [`REQUEST_PREFETCH_PAGES`]); the accesses that follow wait for them
    /// without asking again. Returns the last page of `segs` without a
    /// translation (asked now or before), for [`DmaSpace::await_page`].
    /// Does nothing without an IOMMU; a failure to send is left for those
    /// accesses to report.
    pub(crate) fn prefetch(
        &self,
        segs: &mut dyn Iterator<Item = (u64, u64)>,
        write: bool,
    ) -> Option<u64> {
        if !self.iommu.load(Ordering::Acquire) {
            return None;
        }
        let mut missing = Vec::new();
        // The pages the cache holds are not asked; the others are checked
        // in the IOTLB, under the lock once for the request. At most
        // PREFETCH_SCAN_PAGES pages are looked at, in sections of
        // PREFETCH_SECTION_PAGES, so no chain holds up an invalidation's
        // drain for longer than a few lookups.
        let mut looked = 0usize;
        let mut s = Some(self.section());
        'segs: for (a, len) in segs {
            let Some(last) = len.checked_sub(1).and_then(|l| a.checked_add(l)) else {
                continue;
            };
            let mut pg = a & !(PAGE - 1);
            loop {
                if looked >= PREFETCH_SCAN_PAGES {
                    break 'segs;
                }
                looked += 1;
                if looked.is_multiple_of(PREFETCH_SECTION_PAGES) {
                    drop(s.take());
                    s = Some(self.section());
                }
                if self.cache.lookup(pg.max(a), write).is_none() {
                    missing.push(pg.max(a));
                    if missing.len() >= REQUEST_PREFETCH_PAGES {
                        break 'segs;
                    }
                }
                match pg.checked_add(PAGE) {
                    Some(n) if n <= last => pg = n,
                    _ => break,
                }
            }
        }
        drop(s);
        if !missing.is_empty() {
            let t = self.lock();
            missing.retain(|&at| t.lookup(at).is_none());
        }
        for at in &mut missing {
            *at &= !(PAGE - 1);
        }
        let last = *missing.last()?;
        let now = Instant::now();
        let mut st = self.miss_state();
        if st.cancelled {
            return None;
        }
        missing.retain(|&pg| st.ask(pg, now, self.miss_timeout));
        drop(st);
        if !missing.is_empty() && self.send_misses(&missing, write).is_err() {
            // Not asked: the accesses that follow ask (or fail) themselves
            // rather than wait for an answer that cannot come.
            return None;
        }
        Some(last)
    }

    /// Sends one miss per page of `pages` (recorded as asked by the
    /// caller), all within the miss bound from the call: `MSG_DONTWAIT`
    /// sends and `poll` ([`crate::peerfd::send_all`]), never a blocking
    /// call, the channel's lock held at most that long. The bound passing
    /// on a message boundary fails the pages not sent
    /// ([`AccessError::ChannelFull`]); a message sent in part, or a
    /// socket error, gives the channel up ([`AccessError::ChannelBroken`]
    /// now and for every later miss, at once) — a stream out of step would
    /// be read by the front-end as garbage. Pages not sent are no longer
    /// outstanding.
    fn send_misses(&self, pages: &[u64], write: bool) -> Result<(), AccessError> {
        let deadline = Instant::now() + self.miss_timeout;
        let perm = if write { m::ACCESS_WO } else { m::ACCESS_RO };
        let mut buf = Vec::with_capacity(pages.len() * MISS_MSG_LEN);
        for &pg in pages {
            let mut p = [0u8; m::MSG_LEN];
            p[0..8].copy_from_slice(&pg.to_le_bytes());
            p[8..16].copy_from_slice(&PAGE.to_le_bytes());
            p[24] = perm;
            p[25] = m::MISS;
            buf.extend_from_slice(&wire::encode(backend_req::IOTLB_MSG, VERSION, &p));
        }
        let mut ch = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        let (sent, err) = match &*ch {
            Channel::None => (
                0,
                Some(AccessError::NoChannel {
                    iova: pages[0],
                    reason: "no back-end channel (SET_BACKEND_REQ_FD not received)".into(),
                }),
            ),
            Channel::Broken(reason) => (
                0,
                Some(AccessError::ChannelBroken {
                    iova: pages[0],
                    reason: reason.clone(),
                }),
            ),
            Channel::Open(s) => match crate::peerfd::send_all(s.as_raw_fd(), &buf, deadline) {
                Ok(()) => (buf.len(), None),
                Err(f) => {
                    let whole = f.sent / MISS_MSG_LEN;
                    let timed_out = f.error.kind() == std::io::ErrorKind::TimedOut;
                    if timed_out && f.sent % MISS_MSG_LEN == 0 {
                        self.counters.channel_full.fetch_add(1, Ordering::Relaxed);
                        (
                            f.sent,
                            Some(AccessError::ChannelFull {
                                iova: pages[whole],
                                waited_ms: self.miss_timeout.as_millis() as u64,
                            }),
                        )
                    } else {
                        let reason = format!(
                            "{} of a {}-byte miss sent, then: {}",
                            f.sent % MISS_MSG_LEN,
                            MISS_MSG_LEN,
                            f.error
                        );
                        eprintln!("softiommu-vhost: back-end channel given up: {reason}");
                        self.counters.channel_broken.fetch_add(1, Ordering::Relaxed);
                        *ch = Channel::Broken(reason.clone());
                        (
                            f.sent,
                            Some(AccessError::ChannelBroken {
                                iova: pages[whole],
                                reason,
                            }),
                        )
                    }
                }
            },
        };
        drop(ch);
        let whole = sent / MISS_MSG_LEN;
        self.counters
            .misses
            .fetch_add(whole as u64, Ordering::Relaxed);
        let Some(err) = err else {
            return Ok(());
        };
        let mut st = self.miss_state();
        for pg in &pages[whole..] {
            st.outstanding.remove(pg);
        }
        Err(err)
    }

    /// Reads `buf.len()` bytes at `addr` as the device (a DMA read), waiting for misses within the bound.
    pub fn read_bytes(&self, kind: AddrKind, addr: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        self.access(kind, addr, buf.len() as u64, false, &mut |p, n, off| {
            // SAFETY: p is valid for n bytes of shared memory (the translation's contract).
            unsafe { std::ptr::copy_nonoverlapping(p, buf[off as usize..].as_mut_ptr(), n) };
            Ok(())
        })
    }

    /// Writes `buf` at `addr` as the device (a DMA write), waiting for misses within the bound.
    pub fn write_bytes(&self, kind: AddrKind, addr: u64, buf: &[u8]) -> Result<(), AccessError> {
        self.access(kind, addr, buf.len() as u64, true, &mut |p, n, off| {
            // SAFETY: as in read_bytes.
            unsafe { std::ptr::copy_nonoverlapping(buf[off as usize..].as_ptr(), p, n) };
            Ok(())
        })
    }

    /// Reads a le16 ring index with one load when aligned, ordered before
    /// the reads that follow it.
    pub(crate) fn load_u16_acquire(&self, kind: AddrKind, addr: u64) -> Result<u16, AccessError> {
        let mut b = [0u8; 2];
        self.access(kind, addr, 2, false, &mut |p, n, off| {
            if n == 2 && (p as usize).is_multiple_of(2) {
                // SAFETY: aligned, valid for 2 bytes; the atomic view of shared memory.
                let v = unsafe {
                    (*(p as *const std::sync::atomic::AtomicU16)).load(Ordering::Acquire)
                };
                b = v.to_ne_bytes();
            } else {
                // SAFETY: valid for n bytes.
                unsafe { std::ptr::copy_nonoverlapping(p, b[off as usize..].as_mut_ptr(), n) };
            }
            Ok(())
        })?;
        std::sync::atomic::fence(Ordering::Acquire);
        Ok(u16::from_le_bytes(b))
    }

    /// Publishes a le16 ring index after every write before it.
    pub(crate) fn store_u16_release(
        &self,
        kind: AddrKind,
        addr: u64,
        v: u16,
    ) -> Result<(), AccessError> {
        std::sync::atomic::fence(Ordering::Release);
        let b = v.to_le_bytes();
        self.access(kind, addr, 2, true, &mut |p, n, off| {
            if n == 2 && (p as usize).is_multiple_of(2) {
                // SAFETY: aligned, valid for 2 bytes.
                unsafe {
                    (*(p as *const std::sync::atomic::AtomicU16))
                        .store(u16::from_ne_bytes(b), Ordering::Release)
                };
            } else {
                // SAFETY: valid for n bytes.
                unsafe { std::ptr::copy_nonoverlapping(b[off as usize..].as_ptr(), p, n) };
            }
            Ok(())
        })
    }
}

#[cfg(all(test, not(loom)))]
#[path = "space_tests.rs"]
mod tests;
