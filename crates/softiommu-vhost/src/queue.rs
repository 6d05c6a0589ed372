//! One split virtqueue of a vhost-user back-end: `softiommu-virtio`'s
//! [`DeviceQueue`] — the same ring code the devices behind a softiommu
//! unit use, with every check it makes (an avail index more than the
//! ring's size ahead, a descriptor index past the ring, a chain longer than
//! the ring, an indirect descriptor not offered, each a typed
//! [`DeviceError`]) — over the [`DmaSpace`]'s ring translation, plus what
//! is vhost-user's own: the kick (an eventfd the worker polls), the call
//! (an eventfd it writes), and the stop and enable flags the session sets.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softiommu_virtio::transport::{ChainDesc, ChainDir, DeviceError, DeviceQueue, QueueLayout};

use crate::side::SpaceRings;
use crate::space::DmaSpace;

/// What a queue's worker shares with the session.
#[derive(Debug)]
pub(crate) struct WorkerShared {
    pub(crate) stop: AtomicBool,
    pub(crate) enabled: AtomicBool,
    pub(crate) call: Mutex<Option<OwnedFd>>,
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
    kick: Option<OwnedFd>,
    shared: Arc<WorkerShared>,
    /// Used entries published since the last signal.
    pending_signal: u32,
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
            rings: SpaceRings(space),
            ring,
            kick: kick.take(),
            shared,
            pending_signal: 0,
        })
    }

    /// The space the ring and its buffers translate through.
    pub(crate) fn space(&self) -> &Arc<DmaSpace> {
        &self.rings.0
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

    /// The next available head, if any.
    pub(crate) fn pop(&mut self) -> Result<Option<u16>, DeviceError> {
        self.ring.pop(&self.rings)
    }

    /// Gives back the head [`Queue::pop`] just took (its request was
    /// cancelled before it completed), so the ring's base stays on it.
    pub(crate) fn unpop(&mut self) {
        self.ring.unpop();
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

    /// Publishes `(head, len)` as the next used entry.
    pub(crate) fn push_used(&mut self, head: u16, len: u32) -> Result<(), DeviceError> {
        self.ring.add_used(&self.rings, head, len)?;
        self.pending_signal += 1;
        Ok(())
    }

    /// Signals the driver once for everything published since the last
    /// signal, unless it asked for no interrupts.
    pub(crate) fn signal_if_wanted(&mut self) -> Result<(), DeviceError> {
        if self.pending_signal == 0 {
            return Ok(());
        }
        self.pending_signal = 0;
        if self.ring.interrupt_wanted(&self.rings)? {
            let call = self.shared.call.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = call.as_ref() {
                let v = 1u64;
                // SAFETY: writes 8 bytes to the eventfd.
                unsafe { libc::write(c.as_raw_fd(), (&v as *const u64).cast(), 8) };
            }
        }
        Ok(())
    }

    /// Waits up to `max` for a kick; returns whether one came.
    pub(crate) fn wait_kick(&self, max: Duration) -> bool {
        let Some(k) = &self.kick else {
            std::thread::sleep(max.min(Duration::from_millis(1)));
            return false;
        };
        let mut p = libc::pollfd {
            fd: k.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = max.as_millis().clamp(0, 1000) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 && p.revents & libc::POLLIN != 0 {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into v from the eventfd.
            unsafe { libc::read(k.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            return true;
        }
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! The ring checks the back-ends had in their own ring code, on the
    //! shared one over the front-end's IOTLB: each bad index or chain is
    //! its typed error, nothing taken or written past it.

    use std::time::Duration;

    use softiommu_virtio::spec::desc as d;

    use super::*;
    use crate::proto::iotlb as m;

    const UA: u64 = 0x7f00_0000_0000;
    const SHARED: usize = 64 << 10;
    /// The rings' IOVA page, mapped read-write at the shared memory's start.
    const RINGS: u64 = 0x10000;
    const DESC: u64 = RINGS;
    const AVAIL: u64 = RINGS + 0x100;
    const USED: u64 = RINGS + 0x200;
    const NUM: u16 = 8;

    struct Rig {
        q: Queue,
        shared: *mut u8,
    }

    fn rig(base: u16) -> Rig {
        let (space, shared) =
            crate::testing::shared_space(c"ring-test", SHARED, UA, Duration::from_millis(20));
        let space = Arc::new(space);
        space.update(RINGS, 0x1000, UA, m::ACCESS_RW).unwrap();
        let shared_flags = Arc::new(WorkerShared {
            stop: AtomicBool::new(false),
            enabled: AtomicBool::new(true),
            call: Mutex::new(None),
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
        fn poke(&self, iova: u64, bytes: &[u8]) {
            let off = (iova - RINGS) as usize;
            assert!(off + bytes.len() <= SHARED);
            // SAFETY: within the shared mapping (checked above).
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.shared.add(off), bytes.len())
            };
        }

        fn peek(&self, iova: u64, len: usize) -> Vec<u8> {
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

        fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
            let b = crate::testing::desc(addr, len, flags, next);
            self.poke(DESC + 16 * u64::from(i), &b);
        }

        /// Publishes `head` in avail entry `slot` and the avail index `idx`.
        fn offer(&self, slot: u16, head: u16, idx: u16) {
            self.poke(AVAIL + 4 + 2 * u64::from(slot % NUM), &head.to_le_bytes());
            self.poke(AVAIL + 2, &idx.to_le_bytes());
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
}
