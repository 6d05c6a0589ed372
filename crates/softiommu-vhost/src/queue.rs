//! One split virtqueue of a vhost-user back-end: `softiommu-virtio`'s
//! [`DeviceQueue`] — the same ring code the devices behind a softiommu
//! unit use, with every check it makes (an avail index more than the
//! ring's size ahead, a descriptor index past the ring, a chain longer than
//! the ring, an indirect descriptor not offered, each a typed
//! [`DeviceError`]) — over the [`DmaSpace`]'s ring translation, plus what
//! is vhost-user's own: the kick (an eventfd the worker polls), the call
//! (an eventfd it writes), and the stop and enable flags the session sets.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softiommu_virtio::transport::{ChainDesc, ChainDir, DeviceError, DeviceQueue, QueueLayout};

use crate::side::SpaceRings;
use crate::space::{AddrKind, DmaSpace};

/// What a queue's worker shares with the session.
#[derive(Debug)]
pub(crate) struct WorkerShared {
    pub(crate) stop: AtomicBool,
    pub(crate) enabled: AtomicBool,
    /// The call eventfd; the worker clones the `Arc` and signals without
    /// holding the lock, so `SET_VRING_CALL` never waits for a signal.
    pub(crate) call: Mutex<Option<Arc<OwnedFd>>>,
    /// The session's counts of what the front-end's descriptors did.
    pub(crate) faults: Arc<FdFaults>,
}

/// What the front-end's kick and call descriptors did that a device
/// must not wait for (counted per session).
#[derive(Debug, Default)]
pub(crate) struct FdFaults {
    /// Signals not delivered because the call eventfd's counter was full
    /// (the driver is signalled already) or the write failed.
    pub(crate) call_dropped: AtomicU64,
    /// Kick descriptors dropped because they reported hang-up or an error.
    pub(crate) kick_hangups: AtomicU64,
    /// Rings that stopped serving at an available entry whose head is past
    /// the descriptor table.
    pub(crate) bad_heads: AtomicU64,
}

/// Whether a ring error is the device's being stopped (a cancelled miss):
/// the chain in hand is left on the ring, and nothing is counted.
pub(crate) fn is_abort(e: &DeviceError) -> bool {
    matches!(e, DeviceError::DmaAborted { .. })
}

/// Whether a walk's error is a translation the space refused (the
/// descriptor table unreachable), rather than a chain of the wrong shape.
pub(crate) fn is_fault(e: &DeviceError) -> bool {
    matches!(
        e,
        DeviceError::DmaFault { .. }
            | DeviceError::AddressOverflow {
                what: "descriptor table",
                ..
            }
    )
}

/// The device side of one split ring of a vhost-user back-end.
#[derive(Debug)]
pub(crate) struct Queue {
    /// The space the rings translate through.
    rings: SpaceRings,
    ring: DeviceQueue,
    /// The features acknowledged when the ring started.
    features: u64,
    kick: Option<OwnedFd>,
    shared: Arc<WorkerShared>,
    /// Used entries published since the last signal.
    pending_signal: u32,
    /// A served chain whose used entry could not be published (the used
    /// ring's page missed and the wait timed out or was cancelled):
    /// `(head, len)`. Published before anything else is taken; given back
    /// to the ring if the worker stops with it still here (see
    /// [`Queue::finish`]).
    pending_used: Option<(u16, u32)>,
    /// The kick descriptor hung up and was dropped.
    kick_dead: bool,
    /// The driver made a head past the descriptor table available: the
    /// ring serves nothing more until it is started again.
    bad_head: bool,
}

impl Queue {
    /// The ring `layout` gives with the acknowledged `features`, resuming
    /// at `base`, woken by the kick it takes out of `kick`. Refused (the
    /// typed error, `kick` left in place) if a ring runs past the end of
    /// the address space or the layout is one a split ring cannot have.
    pub(crate) fn new(
        space: Arc<DmaSpace>,
        layout: QueueLayout,
        features: u64,
        kick: &mut Option<OwnedFd>,
        shared: Arc<WorkerShared>,
        base: u16,
    ) -> Result<Self, DeviceError> {
        let mut ring = DeviceQueue::new(layout, features)?;
        ring.set_base(base);
        Ok(Self {
            rings: SpaceRings::new(space, AddrKind::Ring),
            ring,
            features,
            kick: kick.take(),
            shared,
            pending_signal: 0,
            pending_used: None,
            kick_dead: false,
            bad_head: false,
        })
    }

    /// The features the front-end acknowledged when the ring started.
    pub(crate) fn features(&self) -> u64 {
        self.features
    }

    /// What the queue's worker shares with the session.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn worker_shared(&self) -> &Arc<WorkerShared> {
        &self.shared
    }

    /// The ring's layout.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn ring_layout(&self) -> QueueLayout {
        self.ring.layout()
    }

    /// The space the ring and its buffers translate through.
    pub(crate) fn space(&self) -> &Arc<DmaSpace> {
        self.rings.space()
    }

    /// Whether the session asked the worker to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    /// Whether the ring is enabled.
    pub(crate) fn enabled(&self) -> bool {
        self.shared.enabled.load(Ordering::Acquire)
    }

    /// The next avail entry to take (the ring's base when it stops).
    pub(crate) fn last_avail(&self) -> u16 {
        self.ring.next_avail()
    }

    /// The driver's avail index now, checked against the ring's size.
    pub(crate) fn avail_idx(&self) -> Result<u16, DeviceError> {
        self.ring.avail_idx(&self.rings)
    }

    /// The head in avail entry `idx`, without taking it.
    pub(crate) fn head_at(&self, idx: u16) -> Result<u16, DeviceError> {
        self.ring.head_at(&self.rings, idx)
    }

    /// The next available head, if any. A used entry still unpublished
    /// is published first; while that fails (its error returned), nothing
    /// more is taken, so the chain in hand stays the last one popped.
    pub(crate) fn pop(&mut self) -> Result<Option<u16>, DeviceError> {
        if self.bad_head {
            return Ok(None);
        }
        self.publish_pending()?;
        match self.ring.pop(&self.rings) {
            Err(e @ DeviceError::DescriptorIndexOutOfRange { .. }) => {
                // The driver's error, and the ring cannot go past it: its
                // chain could never be completed (no used entry returns a
                // head past the table), and every chain after it waits
                // behind it. As a device sets DEVICE_NEEDS_RESET, the ring
                // is served no more, reported once and counted, until the
                // front-end starts it again (after the driver's reset);
                // its base stays on the entry.
                self.bad_head = true;
                self.shared.faults.bad_heads.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "softiommu-vhost: {e}: the ring is served no more until it is started again"
                );
                Ok(None)
            }
            r => r,
        }
    }

    /// Gives back the head [`Queue::pop`] just took (its request was
    /// cancelled before it completed), so the ring's base stays on it.
    /// Refused ([`DeviceError::UnpopWithoutPop`], nothing moved) unless a
    /// pop took a head since the last completion or give-back.
    pub(crate) fn unpop(&mut self) -> Result<(), DeviceError> {
        self.ring.unpop()
    }

    /// Publishes the used entry a failed [`Queue::push_used`] left, if any
    /// (a worker that pops only when it has work, as the receive side,
    /// calls it first so the entry is not held back until then).
    pub(crate) fn publish_pending(&mut self) -> Result<(), DeviceError> {
        if let Some((head, len)) = self.pending_used {
            self.ring.add_used(&self.rings, head, len)?;
            self.pending_used = None;
            self.pending_signal += 1;
        }
        Ok(())
    }

    /// Ends the worker's use of the ring; returns the base the ring
    /// resumes at (what `GET_VRING_BASE` answers), always equal to the
    /// used index the ring shows: a used entry still unpublished is tried
    /// once more (a hit, or a miss the front-end answers within the bound
    /// unless the stop cancelled it) and signalled; if it still fails, its
    /// chain is given back, so the driver sees it neither completed nor
    /// skipped and the device serves it again after resuming. Serving it
    /// again re-executes it: a block read or write of the same sectors
    /// from the same buffers (the driver has not seen it complete, so its
    /// buffers are still the device's, §2.7.13), a transmitted frame sent
    /// once more (a duplicate the network tolerates), a receive buffer
    /// filled again with a later frame (the first frame lost, as a drop).
    pub(crate) fn finish(&mut self) -> u16 {
        if self.pending_used.is_some() {
            match self.publish_pending() {
                Ok(()) => {
                    // The driver learns of it now (or when it polls).
                    let _ = self.signal_if_wanted();
                }
                Err(_) => {
                    // The pending entry's chain is the last popped (nothing
                    // is popped while one is pending), so this cannot be
                    // refused.
                    if self.ring.unpop().is_ok() {
                        self.pending_used = None;
                    }
                }
            }
        }
        self.ring.next_avail()
    }

    /// Walks the chain from `head` into `out`, each descriptor in the
    /// direction `dir` asks; returns its total bytes.
    pub(crate) fn walk(
        &self,
        head: u16,
        dir: ChainDir,
        out: &mut Vec<ChainDesc>,
    ) -> Result<u64, DeviceError> {
        self.ring.walk(&self.rings, head, dir, out)
    }

    /// Publishes `(head, len)` as the next used entry. If that fails the
    /// entry is kept and published before the next [`Queue::pop`] takes
    /// anything (or, at the end, by [`Queue::finish`]): the chain is never
    /// lost, and the error is returned for the caller to stop on.
    pub(crate) fn push_used(&mut self, head: u16, len: u32) -> Result<(), DeviceError> {
        if self.pending_used.is_some() {
            // Callers complete only a head popped since their last
            // completion, and a pop publishes the pending entry first, so
            // none is pending here; were one, it goes first, in order.
            self.publish_pending()?;
        }
        self.pending_used = Some((head, len));
        self.publish_pending()
    }

    /// Signals the driver once for everything published since the last
    /// signal, unless it asked for no interrupts. If the driver's flags
    /// cannot be read, it is signalled anyway (a spurious interrupt is
    /// harmless, a lost one stalls the driver) and the read's error
    /// returned; the count is cleared only once the signal went out.
    pub(crate) fn signal_if_wanted(&mut self) -> Result<(), DeviceError> {
        if self.pending_signal == 0 {
            return Ok(());
        }
        let wanted = self.ring.interrupt_wanted(&self.rings);
        if wanted.as_ref().map_or(true, |w| *w) {
            let call = self
                .shared
                .call
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(c) = call {
                // Never waits: a counter at its maximum means the driver
                // is signalled already.
                if !matches!(crate::peerfd::signal_eventfd(c.as_raw_fd()), Ok(true)) {
                    self.shared
                        .faults
                        .call_dropped
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.pending_signal = 0;
        wanted.map(|_| ())
    }

    /// Waits up to `max` for a kick; returns whether one came. A kick
    /// descriptor that reports hang-up or an error is dropped, counted and
    /// reported once: from then on the ring is served at the pace of the
    /// bound (each wait sleeps `max`) until a new `SET_VRING_KICK`, never
    /// in a busy loop.
    pub(crate) fn wait_kick(&mut self, max: Duration) -> bool {
        let Some(k) = &self.kick else {
            let nap = if self.kick_dead {
                max
            } else {
                max.min(Duration::from_millis(1))
            };
            std::thread::sleep(nap);
            return false;
        };
        match crate::peerfd::wait_eventfd(k.as_raw_fd(), max) {
            crate::peerfd::Kick::Kicked => true,
            crate::peerfd::Kick::Quiet => false,
            crate::peerfd::Kick::Dead(revents) => {
                eprintln!(
                    "softiommu-vhost: queue {}: kick descriptor reports {revents:#x} \
                     (hang-up or error): dropped, the ring polled every {max:?}",
                    self.ring.layout().index
                );
                self.kick = None;
                self.kick_dead = true;
                self.shared
                    .faults
                    .kick_hangups
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
pub(crate) mod tests {
    //! The ring checks the back-ends had in their own ring code, on the
    //! shared one over the front-end's IOTLB: each bad index or chain is
    //! its typed error, nothing taken or written past it.

    use std::time::Duration;

    use softiommu_virtio::spec::desc as d;

    use super::*;
    use crate::proto::iotlb as m;

    pub(crate) const UA: u64 = 0x7f00_0000_0000;
    const SHARED: usize = 64 << 10;
    /// The descriptor table's and available ring's IOVA page, mapped
    /// read-write at the shared memory's start.
    pub(crate) const RINGS: u64 = 0x10000;
    const DESC: u64 = RINGS;
    const AVAIL: u64 = RINGS + 0x100;
    /// The used ring's own IOVA page, mapped read-write after it (one
    /// can be invalidated without the other).
    pub(crate) const USED_PAGE: u64 = RINGS + 0x1000;
    pub(crate) const USED: u64 = USED_PAGE;
    const NUM: u16 = 8;

    /// A queue over a test space (rings at [`RINGS`], used ring on its
    /// own page at [`USED_PAGE`]) and the host pointer of its memory.
    pub(crate) struct Rig {
        pub(crate) q: Queue,
        shared: *mut u8,
    }

    pub(crate) fn rig(base: u16) -> Rig {
        let (space, shared) =
            crate::testing::shared_space(c"ring-test", SHARED, UA, Duration::from_millis(20));
        let space = Arc::new(space);
        space.update(RINGS, 0x1000, UA, m::ACCESS_RW).unwrap();
        space
            .update(USED_PAGE, 0x1000, UA + 0x1000, m::ACCESS_RW)
            .unwrap();
        let shared_flags = Arc::new(WorkerShared {
            stop: AtomicBool::new(false),
            enabled: AtomicBool::new(true),
            call: Mutex::new(None),
            faults: Default::default(),
        });
        let layout = QueueLayout {
            index: 1,
            size: NUM,
            desc: DESC,
            avail: AVAIL,
            used: USED,
        };
        let q = Queue::new(space, layout, 0, &mut None, shared_flags, base).unwrap();
        Rig { q, shared }
    }

    impl Rig {
        pub(crate) fn poke(&self, iova: u64, bytes: &[u8]) {
            let off = (iova - RINGS) as usize;
            assert!(off + bytes.len() <= SHARED);
            // SAFETY: within the shared mapping (checked above).
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.shared.add(off), bytes.len())
            };
        }

        pub(crate) fn peek(&self, iova: u64, len: usize) -> Vec<u8> {
            let mut v = vec![0u8; len];
            // SAFETY: as in poke.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.shared.add((iova - RINGS) as usize),
                    v.as_mut_ptr(),
                    len,
                )
            };
            v
        }

        pub(crate) fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
            let b = crate::testing::desc(addr, len, flags, next);
            self.poke(DESC + 16 * u64::from(i), &b);
        }

        /// Publishes `head` in avail entry `slot` and the avail index `idx`.
        pub(crate) fn offer(&self, slot: u16, head: u16, idx: u16) {
            self.poke(AVAIL + 4 + 2 * u64::from(slot % NUM), &head.to_le_bytes());
            self.poke(AVAIL + 2, &idx.to_le_bytes());
        }

        /// Hands the rig's queue to a worker under test and keeps an idle
        /// one (disabled, no call fd) on the same rings, to look at the
        /// memory with.
        pub(crate) fn take_queue(&mut self) -> Queue {
            let space = self.q.space().clone();
            let layout = self.q.ring_layout();
            let idle = Arc::new(WorkerShared {
                stop: AtomicBool::new(false),
                enabled: AtomicBool::new(false),
                call: Mutex::new(None),
                faults: Default::default(),
            });
            let idle = Queue::new(space, layout, 0, &mut None, idle, 0).unwrap();
            std::mem::replace(&mut self.q, idle)
        }

        /// The used index the driver sees.
        pub(crate) fn used_idx(&self) -> u16 {
            let b = self.peek(USED + 2, 2);
            u16::from_le_bytes([b[0], b[1]])
        }

        /// Gives the queue a call eventfd (non-blocking); returns a copy
        /// to read the signals from.
        fn call(&self) -> OwnedFd {
            // SAFETY: eventfd returns a fresh descriptor or -1 (checked).
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: `fd` is valid and owned here only.
            let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let copy = fd.try_clone().unwrap();
            *self.q.shared.call.lock().unwrap() = Some(Arc::new(fd));
            copy
        }
    }

    /// The signals the call eventfd counted since the last read (0 if none:
    /// the read would block).
    fn signals(fd: &OwnedFd) -> u64 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v` from the eventfd.
        let n = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            v
        } else {
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EAGAIN)
            );
            0
        }
    }

    #[test]
    fn a_ring_resumed_at_its_base_pops_walks_and_publishes_through_the_iotlb() {
        let mut r = rig(13);
        r.desc(2, 0x5000, 16, d::F_NEXT, 4);
        r.desc(4, 0x6000, 512, d::F_NEXT | d::F_WRITE, 5);
        r.desc(5, 0x7000, 1, d::F_WRITE, 0);
        r.offer(13, 2, 14);
        assert_eq!(r.q.avail_idx().unwrap(), 14);
        assert_eq!(r.q.pop().unwrap(), Some(2));
        assert_eq!(r.q.pop().unwrap(), None);
        let mut chain = Vec::new();
        let total =
            r.q.walk(2, ChainDir::ReadableThenWritable, &mut chain)
                .unwrap();
        assert_eq!(total, 16 + 512 + 1);
        let got: Vec<_> = chain.iter().map(|c| (c.addr, c.len, c.writable)).collect();
        assert_eq!(
            got,
            [(0x5000, 16, false), (0x6000, 512, true), (0x7000, 1, true)]
        );
        r.q.push_used(2, 513).unwrap();
        // Used entry 13 (slot 5), then the used index 14.
        let e = r.peek(USED + 4 + 8 * 5, 8);
        assert_eq!(e, [2, 0, 0, 0, 1, 2, 0, 0]);
        assert_eq!(r.peek(USED + 2, 2), 14u16.to_le_bytes());
        assert_eq!(r.q.last_avail(), 14);
    }

    #[test]
    fn an_avail_index_more_than_the_ring_ahead_is_refused_and_nothing_is_taken() {
        let mut r = rig(0);
        r.offer(0, 0, NUM + 1);
        let e = r.q.pop().unwrap_err();
        assert_eq!(
            e,
            DeviceError::AvailIndexTooFar {
                queue: 1,
                avail: NUM + 1,
                next: 0,
                size: NUM
            }
        );
        assert_eq!(r.q.last_avail(), 0);
        assert!(matches!(
            r.q.avail_idx(),
            Err(DeviceError::AvailIndexTooFar { .. })
        ));
    }

    /// A head past the descriptor table: the entry is not taken, the ring
    /// serves nothing more (counted once; a used entry for it would be
    /// refused, and every pop after it would fail on that entry), and it
    /// stops at the entry with nothing published.
    #[test]
    fn a_head_past_the_table_stops_the_ring_at_its_entry_counted_once() {
        let mut r = rig(0);
        r.desc(1, 0x5000, 16, 0, 0);
        r.offer(0, 0xffff, 1);
        r.offer(1, 1, 2);
        assert_eq!(r.q.pop(), Ok(None));
        assert_eq!(r.q.pop(), Ok(None), "the chain after it is not served");
        let faults = &r.q.worker_shared().faults;
        assert_eq!(faults.bad_heads.load(Ordering::Relaxed), 1);
        assert_eq!(r.q.last_avail(), 0);
        assert_eq!(r.q.finish(), 0);
        assert_eq!(r.peek(USED + 2, 2), 0u16.to_le_bytes());
    }

    #[test]
    fn an_index_past_the_ring_a_loop_and_an_indirect_descriptor_are_typed_errors() {
        let r = rig(0);
        let mut chain = Vec::new();
        let dir = ChainDir::Readable;
        // A head past the ring.
        assert_eq!(
            r.q.walk(NUM, dir, &mut chain).unwrap_err(),
            DeviceError::DescriptorIndexOutOfRange {
                queue: 1,
                index: NUM,
                size: NUM
            }
        );
        // A next past the ring.
        r.desc(0, 0x5000, 16, d::F_NEXT, NUM + 3);
        assert_eq!(
            r.q.walk(0, dir, &mut chain).unwrap_err(),
            DeviceError::DescriptorIndexOutOfRange {
                queue: 1,
                index: NUM + 3,
                size: NUM
            }
        );
        // A loop: 1 -> 2 -> 1, longer than the ring.
        r.desc(1, 0x5000, 16, d::F_NEXT, 2);
        r.desc(2, 0x5000, 16, d::F_NEXT, 1);
        assert_eq!(
            r.q.walk(1, dir, &mut chain).unwrap_err(),
            DeviceError::ChainLoop {
                queue: 1,
                head: 1,
                size: NUM
            }
        );
        // An indirect descriptor (not offered).
        r.desc(3, 0x5000, 32, d::F_INDIRECT, 0);
        assert_eq!(
            r.q.walk(3, dir, &mut chain).unwrap_err(),
            DeviceError::IndirectNotNegotiated { queue: 1, index: 3 }
        );
    }

    #[test]
    fn a_readable_descriptor_after_a_writable_one_is_the_wrong_direction_for_a_request() {
        let r = rig(0);
        let mut chain = Vec::new();
        // Header, status (writable), then data the device would read.
        r.desc(0, 0x5000, 16, d::F_NEXT, 1);
        r.desc(1, 0x7000, 1, d::F_NEXT | d::F_WRITE, 2);
        r.desc(2, 0x6000, 512, 0, 0);
        assert_eq!(
            r.q.walk(0, ChainDir::ReadableThenWritable, &mut chain)
                .unwrap_err(),
            DeviceError::WrongDirection {
                queue: 1,
                head: 0,
                index: 2,
                found: "read-only after a write-only",
                needed: "writable"
            }
        );
    }

    #[test]
    fn a_ring_page_invalidated_is_a_dma_fault_and_a_cancelled_miss_an_abort() {
        let mut r = rig(0);
        r.offer(0, 0, 1);
        r.q.space().invalidate(RINGS, 0x1000).unwrap();
        // No front-end to answer the miss: refused after the bound.
        let e = r.q.pop().unwrap_err();
        assert!(
            matches!(
                &e,
                DeviceError::DmaFault { queue: 1, what: "available ring", iova, .. }
                    if *iova == AVAIL + 2
            ),
            "{e:?}"
        );
        assert!(!is_abort(&e));
        // The rings stopping: the wait is cancelled, an abort.
        r.q.space().cancel();
        let e = r.q.pop().unwrap_err();
        assert!(is_abort(&e), "{e:?}");
        assert!(matches!(
            e,
            DeviceError::DmaAborted {
                queue: 1,
                what: "available ring",
                ..
            }
        ));
        assert_eq!(r.q.last_avail(), 0);
    }

    #[test]
    fn a_used_entry_that_cannot_be_published_is_kept_and_the_stopped_base_is_the_used_index() {
        let mut r = rig(0);
        r.offer(0, 0, 1);
        assert_eq!(r.q.pop().unwrap(), Some(0));
        // The used ring's page gone and the rings stopping: the publication
        // is aborted.
        r.q.space().invalidate(USED_PAGE, 0x1000).unwrap();
        r.q.space().cancel();
        let e = r.q.push_used(0, 1).unwrap_err();
        assert!(
            matches!(
                e,
                DeviceError::DmaAborted {
                    queue: 1,
                    what: "used ring",
                    ..
                }
            ),
            "{e:?}"
        );
        // Nothing more is taken while the entry is unpublished.
        r.offer(1, 3, 2);
        assert!(matches!(
            r.q.pop().unwrap_err(),
            DeviceError::DmaAborted {
                what: "used ring",
                ..
            }
        ));
        assert_eq!(r.q.last_avail(), 1);
        // The worker stops: the base it reports is the used index the
        // driver sees, the chain given back to be served after resuming.
        assert_eq!(r.q.finish(), 0);
        assert_eq!(r.used_idx(), 0);
        // Resumed at that base, the chain is taken again.
        let mut r2 = Rig {
            q: {
                let space = r.q.space().clone();
                space.resume();
                space
                    .update(USED_PAGE, 0x1000, UA + 0x1000, m::ACCESS_RW)
                    .unwrap();
                let layout = r.q.ring.layout();
                Queue::new(space, layout, 0, &mut None, r.q.shared.clone(), 0).unwrap()
            },
            shared: r.shared,
        };
        assert_eq!(r2.q.pop().unwrap(), Some(0));
        r2.q.push_used(0, 1).unwrap();
        assert_eq!(r2.used_idx(), 1);
        assert_eq!(r2.peek(USED + 4, 8), [0, 0, 0, 0, 1, 0, 0, 0]);
    }

    #[test]
    fn a_used_entry_that_failed_is_published_before_the_next_pop_and_signalled() {
        let mut r = rig(0);
        let call = r.call();
        r.offer(0, 2, 1);
        r.offer(1, 5, 2);
        assert_eq!(r.q.pop().unwrap(), Some(2));
        r.q.space().invalidate(USED_PAGE, 0x1000).unwrap();
        // No front-end to answer the miss: refused after the bound.
        assert!(matches!(
            r.q.push_used(2, 7).unwrap_err(),
            DeviceError::DmaFault {
                what: "used ring",
                ..
            }
        ));
        assert_eq!(r.used_idx(), 0);
        // Nothing published, nothing signalled.
        r.q.signal_if_wanted().unwrap();
        assert_eq!(signals(&call), 0);
        // The page back: the next pop publishes the kept entry first.
        r.q.space()
            .update(USED_PAGE, 0x1000, UA + 0x1000, m::ACCESS_RW)
            .unwrap();
        assert_eq!(r.q.pop().unwrap(), Some(5));
        assert_eq!(r.used_idx(), 1);
        assert_eq!(r.peek(USED + 4, 8), [2, 0, 0, 0, 7, 0, 0, 0]);
        r.q.push_used(5, 0).unwrap();
        assert_eq!(r.used_idx(), 2);
        assert_eq!(r.peek(USED + 12, 8), [5, 0, 0, 0, 0, 0, 0, 0]);
        r.q.signal_if_wanted().unwrap();
        assert_eq!(signals(&call), 1);
        assert_eq!(r.q.finish(), 2);
    }

    #[test]
    fn a_stop_with_the_used_page_back_publishes_the_kept_entry_and_signals() {
        let mut r = rig(0);
        let call = r.call();
        r.offer(0, 4, 1);
        assert_eq!(r.q.pop().unwrap(), Some(4));
        r.q.space().invalidate(USED_PAGE, 0x1000).unwrap();
        r.q.space().cancel();
        assert!(matches!(
            r.q.push_used(4, 9).unwrap_err(),
            DeviceError::DmaAborted {
                what: "used ring",
                ..
            }
        ));
        r.q.space().resume();
        r.q.space()
            .update(USED_PAGE, 0x1000, UA + 0x1000, m::ACCESS_RW)
            .unwrap();
        assert_eq!(r.q.finish(), 1);
        assert_eq!(r.used_idx(), 1);
        assert_eq!(r.peek(USED + 4, 8), [4, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(signals(&call), 1);
    }

    #[test]
    fn the_driver_is_signalled_even_when_its_flags_cannot_be_read() {
        let mut r = rig(0);
        let call = r.call();
        r.offer(0, 1, 1);
        assert_eq!(r.q.pop().unwrap(), Some(1));
        r.q.push_used(1, 3).unwrap();
        assert_eq!(r.used_idx(), 1);
        // The available ring's page gone and the rings stopping: the flags
        // read is aborted, the signal goes out anyway.
        r.q.space().invalidate(RINGS, 0x1000).unwrap();
        r.q.space().cancel();
        let e = r.q.signal_if_wanted().unwrap_err();
        assert!(
            matches!(
                e,
                DeviceError::DmaAborted {
                    queue: 1,
                    what: "available ring",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(signals(&call), 1);
        // Counted once: nothing more to signal.
        r.q.signal_if_wanted().unwrap();
        assert_eq!(signals(&call), 0);
    }

    #[test]
    fn unpop_without_a_pop_is_refused_and_nothing_moves() {
        let mut r = rig(3);
        assert!(matches!(
            r.q.unpop().unwrap_err(),
            DeviceError::UnpopWithoutPop {
                queue: 1,
                next_avail: 3
            }
        ));
        assert_eq!(r.q.last_avail(), 3);
        r.offer(3, 0, 4);
        assert_eq!(r.q.pop().unwrap(), Some(0));
        r.q.push_used(0, 0).unwrap();
        assert!(matches!(
            r.q.unpop().unwrap_err(),
            DeviceError::UnpopWithoutPop { next_avail: 4, .. }
        ));
        assert_eq!(r.q.last_avail(), 4);
        assert_eq!(r.q.finish(), 4);
        assert_eq!(r.used_idx(), 4);
    }

    /// Runs a blk worker on `q` until `until` holds (or 10 s), then stops
    /// it as the session does (stop flag, then the space's waits
    /// cancelled); returns the base it reports and its counters.
    fn run_blk_worker(
        q: Queue,
        disk: &Arc<crate::disk::Disk>,
        until: impl Fn() -> bool,
    ) -> (u16, crate::blk::BlkStats) {
        let shared = q.shared.clone();
        let space = q.space().clone();
        let counters = Arc::new(crate::blk::BlkCounters::default());
        let w = crate::blk::Worker::new(q, disk.clone(), counters.clone());
        let h = std::thread::spawn(move || w.run());
        let t0 = std::time::Instant::now();
        while !until() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        shared.stop.store(true, Ordering::Release);
        space.cancel();
        let base = h.join().unwrap();
        (base, counters.snapshot())
    }

    #[test]
    fn a_blk_worker_stopped_with_a_completion_unpublished_reports_the_used_index_and_serves_it_again(
    ) {
        use softiommu_virtio::spec::blk as sb;
        const DATA: u64 = RINGS + 0x2000;
        const HDR: u64 = RINGS + 0x800;
        const STATUS: u64 = RINGS + 0x900;
        let path =
            std::env::temp_dir().join(format!("softiommu-vhost-q-{}.img", std::process::id()));
        let image: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
        std::fs::write(&path, &image).unwrap();
        let disk = Arc::new(crate::disk::Disk::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();

        let mut r = rig(0);
        r.q.space()
            .update(DATA, 0x1000, UA + 0x2000, m::ACCESS_RW)
            .unwrap();
        // A read of sector 1 into DATA.
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&sb::T_IN.to_le_bytes());
        h[8..16].copy_from_slice(&1u64.to_le_bytes());
        r.poke(HDR, &h);
        r.poke(STATUS, &[0xff]);
        r.desc(0, HDR, 16, d::F_NEXT, 1);
        r.desc(1, DATA, 512, d::F_NEXT | d::F_WRITE, 2);
        r.desc(2, STATUS, 1, d::F_WRITE, 0);
        r.offer(0, 0, 1);
        // The used ring's page gone, no front-end to answer its miss.
        r.q.space().invalidate(USED_PAGE, 0x1000).unwrap();
        let space = r.q.space().clone();
        let layout = r.q.ring_layout();
        // The worker takes the queue; the rig keeps an idle one.
        let q = r.take_queue();
        let served = || r.peek(STATUS, 1)[0] == sb::S_OK;
        // Served, its completion not publishable; stopped a little later.
        let t0 = std::time::Instant::now();
        let (base, stats) = run_blk_worker(q, &disk, || {
            served() && t0.elapsed() > Duration::from_millis(100)
        });
        assert!(served());
        assert_eq!(r.peek(DATA, 512), image[512..1024]);
        assert!(stats.ring_faults >= 1, "{stats:?}");
        assert_eq!(r.used_idx(), 0);
        assert_eq!(base, 0, "the base is the used index the driver sees");

        // Resumed at that base with the page back: the read is served
        // again and completed once, in used entry 0.
        space.resume();
        space
            .update(USED_PAGE, 0x1000, UA + 0x1000, m::ACCESS_RW)
            .unwrap();
        r.poke(STATUS, &[0xff]);
        r.poke(DATA, &[0u8; 512]);
        let flags = Arc::new(WorkerShared {
            stop: AtomicBool::new(false),
            enabled: AtomicBool::new(true),
            call: Mutex::new(None),
            faults: Default::default(),
        });
        let q = Queue::new(space, layout, 0, &mut None, flags, base).unwrap();
        let (base, stats) = run_blk_worker(q, &disk, || r.used_idx() == 1);
        assert_eq!(base, 1);
        assert_eq!(r.used_idx(), 1);
        assert_eq!(r.peek(USED + 4, 8), [0, 0, 0, 0, 1, 2, 0, 0]);
        assert!(served());
        assert_eq!(r.peek(DATA, 512), image[512..1024]);
        assert_eq!(stats.requests, 1);
        assert_eq!(stats.ring_faults, 0);
    }

    /// A kick descriptor that hangs up (a pipe whose writer closed: poll
    /// reports POLLHUP without POLLIN) is dropped and counted once; the
    /// waits after it sleep their bound instead of returning at once.
    /// (Before: every wait returned at once, a busy loop per ring.)
    #[test]
    fn a_kick_that_hangs_up_is_dropped_counted_and_never_spun_on() {
        let r = rig(0);
        let mut fds = [0; 2];
        // SAFETY: pipe fills two descriptors we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors.
        let (rd, wr) = unsafe {
            use std::os::fd::FromRawFd;
            (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
        };
        drop(wr);
        let shared = r.q.shared.clone();
        let mut q = Queue::new(
            r.q.space().clone(),
            r.q.ring_layout(),
            0,
            &mut Some(rd),
            shared.clone(),
            0,
        )
        .unwrap();
        let t = std::time::Instant::now();
        for _ in 0..5 {
            assert!(!q.wait_kick(Duration::from_millis(20)));
        }
        assert!(
            t.elapsed() >= Duration::from_millis(80),
            "spun: {:?}",
            t.elapsed()
        );
        assert_eq!(shared.faults.kick_hangups.load(Ordering::Relaxed), 1);
        assert!(q.kick.is_none());
    }

    /// A blk request whose status byte cannot be written (its page mapped
    /// read-only) is not completed — a driver would read whatever the
    /// byte held — and is served again once it can be. (Before: completed
    /// with used length 0 and the byte untouched.)
    #[test]
    fn a_blk_request_whose_status_cannot_be_written_stays_on_the_ring_until_it_can() {
        use softiommu_virtio::spec::blk as sb;
        const HDR: u64 = RINGS + 0x800;
        const DATA: u64 = RINGS + 0x2000;
        const STATUS_PAGE: u64 = RINGS + 0x3000;
        let disk = test_disk("status");
        let mut r = rig(0);
        let sp = r.q.space().clone();
        sp.update(DATA, 0x1000, UA + 0x2000, m::ACCESS_RW).unwrap();
        sp.update(STATUS_PAGE, 0x1000, UA + 0x3000, m::ACCESS_RO)
            .unwrap();
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&sb::T_IN.to_le_bytes());
        r.poke(HDR, &h);
        r.poke(STATUS_PAGE, &[0xff]);
        r.desc(0, HDR, 16, d::F_NEXT, 1);
        r.desc(1, DATA, 512, d::F_NEXT | d::F_WRITE, 2);
        r.desc(2, STATUS_PAGE, 1, d::F_WRITE, 0);
        r.offer(0, 0, 1);
        let q = r.take_queue();
        let t0 = std::time::Instant::now();
        let (base, stats) = run_blk_worker(q, &disk, || t0.elapsed() > Duration::from_millis(200));
        assert_eq!(r.used_idx(), 0, "completed without its status");
        assert_eq!(r.peek(STATUS_PAGE, 1), [0xff]);
        assert_eq!(base, 0);
        assert!(stats.ring_faults >= 1, "{stats:?}");
        assert_eq!(stats.requests, 0, "{stats:?}");
        // Writable again: served and completed once, OK.
        sp.update(STATUS_PAGE, 0x1000, UA + 0x3000, m::ACCESS_RW)
            .unwrap();
        let q = fresh_queue(&r, r.q.ring_layout(), base);
        let (base, stats) = run_blk_worker(q, &disk, || r.used_idx() == 1);
        assert_eq!((base, r.used_idx()), (1, 1));
        assert_eq!(r.peek(STATUS_PAGE, 1), [sb::S_OK]);
        assert_eq!(stats.requests, 1);
    }

    /// A chain whose descriptor table cannot be read (the page missed and
    /// the front-end did not answer) is left on the ring, not completed
    /// with length 0 as a malformed chain is, and served once the table
    /// is back. (Before: counted as a bad chain and completed, so the
    /// driver read a stale status.)
    #[test]
    fn a_chain_whose_descriptor_table_cannot_be_read_is_left_on_the_ring() {
        use softiommu_virtio::spec::blk as sb;
        const HDR: u64 = RINGS + 0x800;
        const STATUS: u64 = RINGS + 0x900;
        const DATA: u64 = RINGS + 0x2000;
        // The descriptor table on a page of its own, not mapped.
        const TABLE: u64 = RINGS + 0x4000;
        let disk = test_disk("table");
        let r = rig(0);
        let sp = r.q.space().clone();
        sp.update(DATA, 0x1000, UA + 0x2000, m::ACCESS_RW).unwrap();
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&sb::T_IN.to_le_bytes());
        r.poke(HDR, &h);
        r.poke(STATUS, &[0xff]);
        let at = |i: u64| TABLE + 16 * i;
        r.poke(at(0), &crate::testing::desc(HDR, 16, d::F_NEXT, 1));
        r.poke(
            at(1),
            &crate::testing::desc(DATA, 512, d::F_NEXT | d::F_WRITE, 2),
        );
        r.poke(at(2), &crate::testing::desc(STATUS, 1, d::F_WRITE, 0));
        r.offer(0, 0, 1);
        let layout = QueueLayout {
            desc: TABLE,
            ..r.q.ring_layout()
        };
        let q = Queue::new(sp.clone(), layout, 0, &mut None, r.q.shared.clone(), 0).unwrap();
        let t0 = std::time::Instant::now();
        let (base, stats) = run_blk_worker(q, &disk, || t0.elapsed() > Duration::from_millis(200));
        assert_eq!(r.used_idx(), 0);
        assert_eq!(base, 0);
        assert_eq!(stats.bad_chains, 0, "{stats:?}");
        assert!(stats.ring_faults >= 1, "{stats:?}");
        sp.update(TABLE, 0x1000, UA + 0x4000, m::ACCESS_RW).unwrap();
        let q = fresh_queue(&r, layout, base);
        let (base, stats) = run_blk_worker(q, &disk, || r.used_idx() == 1);
        assert_eq!((base, r.used_idx()), (1, 1));
        assert_eq!(r.peek(STATUS, 1), [sb::S_OK]);
        assert_eq!(stats.requests, 1);
    }

    /// A one-sector disk image for the blk worker tests.
    fn test_disk(tag: &str) -> Arc<crate::disk::Disk> {
        let path =
            std::env::temp_dir().join(format!("softiommu-vhost-{tag}-{}.img", std::process::id()));
        std::fs::write(&path, vec![0x3c; 4096]).unwrap();
        let disk = Arc::new(crate::disk::Disk::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        disk
    }

    /// A new enabled queue on the rig's space with `layout`, resumed at `base`.
    fn fresh_queue(r: &Rig, layout: QueueLayout, base: u16) -> Queue {
        let space = r.q.space().clone();
        space.resume();
        let flags = Arc::new(WorkerShared {
            stop: AtomicBool::new(false),
            enabled: AtomicBool::new(true),
            call: Mutex::new(None),
            faults: Default::default(),
        });
        Queue::new(space, layout, 0, &mut None, flags, base).unwrap()
    }
}
