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

use softiommu_virtio::transport::{
    ChainDesc, ChainDir, DeviceError, DeviceQueue, QueueLayout, RingMemory,
};

use crate::error::AccessError;
use crate::space::{AddrKind, DmaSpace};

/// Where a ring is (validated by the session).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingAddrs {
    pub(crate) num: u16,
    pub(crate) desc: u64,
    pub(crate) avail: u64,
    pub(crate) used: u64,
}

/// What a queue's worker shares with the session.
#[derive(Debug)]
pub(crate) struct WorkerShared {
    pub(crate) stop: AtomicBool,
    pub(crate) enabled: AtomicBool,
    pub(crate) call: Mutex<Option<OwnedFd>>,
}

/// The space's ring addresses as the [`RingMemory`] the shared ring code
/// reads and writes through: `SET_VRING_ADDR`'s addresses, IOVAs under
/// `ACCESS_PLATFORM` ([`AddrKind::Ring`]); a miss is asked of the
/// front-end and waited for within the space's bound, and a wait
/// cancelled because the rings stop is an abort.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rings<'a>(pub(crate) &'a DmaSpace);

impl RingMemory for Rings<'_> {
    type Fault = AccessError;

    #[inline]
    fn read_ring(&self, addr: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        self.0.read_bytes(AddrKind::Ring, addr, buf)
    }

    #[inline]
    fn write_ring(&self, addr: u64, buf: &[u8]) -> Result<(), AccessError> {
        self.0.write_bytes(AddrKind::Ring, addr, buf)
    }

    #[inline]
    fn load_u16(&self, addr: u64, _order: Ordering) -> Result<u16, AccessError> {
        // Acquire whatever was asked: never weaker.
        self.0.load_u16_acquire(AddrKind::Ring, addr)
    }

    #[inline]
    fn store_u16(&self, addr: u64, v: u16, _order: Ordering) -> Result<(), AccessError> {
        // Release whatever was asked: never weaker.
        self.0.store_u16_release(AddrKind::Ring, addr, v)
    }

    fn is_abort(fault: &AccessError) -> bool {
        matches!(fault, AccessError::Cancelled { .. })
    }
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
    pub(crate) space: Arc<DmaSpace>,
    ring: DeviceQueue,
    kick: Option<OwnedFd>,
    shared: Arc<WorkerShared>,
    /// Used entries published since the last signal.
    pending_signal: u32,
}

impl Queue {
    /// Ring `index` at `addrs` with the acknowledged `features`, resuming
    /// at `base`, woken by the kick it takes out of `kick`. Refused (the
    /// typed error, `kick` left in place) if a ring runs past the end of
    /// the address space or the layout is one a split ring cannot have.
    pub(crate) fn new(
        space: Arc<DmaSpace>,
        index: u16,
        addrs: RingAddrs,
        features: u64,
        kick: &mut Option<OwnedFd>,
        shared: Arc<WorkerShared>,
        base: u16,
    ) -> Result<Self, DeviceError> {
        let layout = QueueLayout {
            index,
            size: addrs.num,
            desc: addrs.desc,
            avail: addrs.avail,
            used: addrs.used,
        };
        let mut ring = DeviceQueue::new(layout, features)?;
        ring.set_base(base);
        Ok(Self {
            space,
            ring,
            kick: kick.take(),
            shared,
            pending_signal: 0,
        })
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
        self.ring.avail_idx(&Rings(&self.space))
    }

    /// The head in avail entry `idx`, without taking it.
    pub(crate) fn head_at(&self, idx: u16) -> Result<u16, DeviceError> {
        self.ring.head_at(&Rings(&self.space), idx)
    }

    /// The next available head, if any.
    pub(crate) fn pop(&mut self) -> Result<Option<u16>, DeviceError> {
        self.ring.pop(&Rings(&self.space))
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
        self.ring.walk(&Rings(&self.space), head, dir, out)
    }

    /// Publishes `(head, len)` as the next used entry.
    pub(crate) fn push_used(&mut self, head: u16, len: u32) -> Result<(), DeviceError> {
        self.ring.add_used(&Rings(&self.space), head, len)?;
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
        if self.ring.interrupt_wanted(&Rings(&self.space))? {
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
