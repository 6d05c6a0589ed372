//! [`DeviceEnd`]: the device thread's handle on its transport — its live
//! queues, the notifications waiting for it, the interrupt line and the
//! error log.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use super::error::DeviceError;
use super::mmio::{lock, Engine, MmioTransport, Shared};
use crate::spec::{isr, status};

/// The device side of an [`MmioTransport`]. One per device thread.
#[derive(Debug)]
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

    /// Makes the calling thread the one a `QueueNotify` wakes. Only the
    /// first call counts (a device has one thread); returns whether this
    /// one did.
    pub fn register_thread(&self) -> bool {
        self.shared
            .device_thread
            .set(std::thread::current())
            .is_ok()
    }

    /// Locks the live queues for one batch of work. Hold it for a bounded
    /// batch only: a reset waits for it.
    pub fn lock(&self) -> MutexGuard<'_, Engine> {
        lock(&self.shared.engine)
    }

    /// Takes the queues notified since the last call (bit `q` for queue
    /// `q`). Acquire: pairs with the release in the `QueueNotify` write, so
    /// the rings the driver filled before notifying are visible.
    pub fn take_notified(&self) -> u64 {
        if self.shared.notify.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.shared.notify.swap(0, Ordering::Acquire)
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

    /// The transport (for its counters and error log).
    pub fn transport(&self) -> MmioTransport {
        MmioTransport {
            shared: self.shared.clone(),
        }
    }
}
