//! [`DeviceEnd`]: a device thread's handle on its transport — its live
//! queues, the notifications waiting for it, the interrupt line and the
//! error log.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::error::DeviceError;
use super::mmio::{lock, MmioTransport, QueueGuard, Shared};
use crate::spec::{isr, status};

/// The device side of an [`MmioTransport`]. One per device thread.
#[derive(Debug, Clone)]
pub struct DeviceEnd {
    shared: Arc<Shared>,
}

impl DeviceEnd {
    /// The device side of `transport`.
    pub fn new(transport: &MmioTransport) -> Self {
        Self {
            shared: transport.shared.clone(),
        }
    }

    /// Makes the calling thread the one a `QueueNotify` of a queue no
    /// thread registered for wakes ([`register_queues`](Self::register_queues)).
    /// Only the first call counts (a device has one such thread); returns
    /// whether this one did.
    pub fn register_thread(&self) -> bool {
        self.shared
            .device_thread
            .set(std::thread::current())
            .is_ok()
    }

    /// Makes the calling thread the one a `QueueNotify` of each queue in
    /// `mask` (bit `q` for queue `q`) wakes: a device thread serving a
    /// group of queues. A queue's first registration counts; returns the
    /// queues this call registered.
    pub fn register_queues(&self, mask: u64) -> u64 {
        let mut got = 0;
        for (q, slot) in self.shared.queue_threads.iter().enumerate().take(64) {
            if mask & 1 << q != 0 && slot.set(std::thread::current()).is_ok() {
                got |= 1 << q;
            }
        }
        got
    }

    /// Locks queue `q`'s slot for one batch of work: `None` for a queue the
    /// device does not have; inside, `None` while the queue is not live.
    /// Hold it for a bounded batch only: a reset waits for it.
    pub fn queue(&self, q: u16) -> Option<QueueGuard<'_>> {
        self.shared.engine.queues.get(usize::from(q)).map(lock)
    }

    /// The queues that are live now (bit `q` for queue `q`; a snapshot).
    pub fn live_mask(&self) -> u64 {
        let mut m = 0;
        for (q, slot) in self.shared.engine.queues.iter().enumerate().take(64) {
            if lock(slot).is_some() {
                m |= 1 << q;
            }
        }
        m
    }

    /// The features the driver negotiated (0 before `DRIVER_OK`). Acquire:
    /// pairs with the Release store at `DRIVER_OK`, before any queue is
    /// live.
    pub fn features(&self) -> u64 {
        self.shared.engine.features.load(Ordering::Acquire)
    }

    /// The features the driver has accepted and the device taken: the
    /// negotiated ones once `FEATURES_OK` is set (before `DRIVER_OK` too),
    /// 0 before. For a config field the driver may write as soon as a
    /// feature is negotiated (a virtio-iommu's `bypass`, §5.13.4.1).
    pub fn accepted_features(&self) -> u64 {
        let f = self.features();
        if f != 0 {
            return f;
        }
        let r = lock(&self.shared.regs);
        // Read under the register lock: a status write sets FEATURES_OK
        // and a reset clears the features with it held.
        if self.shared.status.load(Ordering::Acquire) & status::FEATURES_OK != 0 {
            r.driver_features
        } else {
            0
        }
    }

    /// Takes the queues notified since the last call (bit `q` for queue
    /// `q`). Acquire: pairs with the release in the `QueueNotify` write, so
    /// the rings the driver filled before notifying are visible.
    pub fn take_notified(&self) -> u64 {
        self.take_notified_in(u64::MAX)
    }

    /// Takes the notifications of the queues in `mask` only (a device
    /// thread serving those), leaving the others' for their threads.
    pub fn take_notified_in(&self, mask: u64) -> u64 {
        let n = &self.shared.notify;
        if n.load(Ordering::Relaxed) & mask == 0 {
            return 0;
        }
        n.fetch_and(!mask, Ordering::Acquire) & mask
    }

    /// Whether the driver has set `DRIVER_OK` and the device has not asked
    /// for a reset.
    pub fn is_live(&self) -> bool {
        let s = self.shared.status.load(Ordering::Acquire);
        s & status::DRIVER_OK != 0 && s & status::DEVICE_NEEDS_RESET == 0
    }

    /// Records `e`; if it breaks the device, sets `DEVICE_NEEDS_RESET` and
    /// interrupts the driver (§2.1.2). The caller stops the queue.
    pub fn report(&self, e: DeviceError) {
        self.shared.report(e);
    }

    /// Sends a used-buffer notification (§2.7.7: `InterruptStatus` bit 0
    /// and the interrupt line).
    pub fn used_interrupt(&self) {
        self.shared.interrupt(isr::USED_BUFFER);
    }

    /// Sends a used-buffer notification for queue `q`: as
    /// [`used_interrupt`](Self::used_interrupt), delivered to the thread
    /// bound to the queue ([`MmioTransport::bind_queue_interrupt`]) if
    /// there is one.
    pub fn queue_interrupt(&self, q: u16) {
        self.shared.queue_interrupt(q);
    }

    /// The transport (for its counters and error log).
    pub fn transport(&self) -> MmioTransport {
        MmioTransport {
            shared: self.shared.clone(),
        }
    }
}
