//! [`NetStack`]: smoltcp above a [`NetDriver`] — the interface, its
//! sockets and a monotonic clock — with a poll that surfaces the driver's
//! and the device's errors, and a wait that sleeps on the device's
//! interrupt for as long as smoltcp has nothing to do.

use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, PollResult, SocketSet};
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Cidr};

use softiommu::dma::BoundDma;

use super::dma::NetDma;
use super::driver::{DriverError, NetDriver};

/// One host's network stack over its virtio-net driver (on DMA API `D`).
pub struct NetStack<D: NetDma = BoundDma> {
    /// The driver (smoltcp's `phy::Device`).
    pub driver: NetDriver<D>,
    /// The interface.
    pub iface: Interface,
    /// The sockets.
    pub sockets: SocketSet<'static>,
    epoch: Instant,
}

impl<D: NetDma> std::fmt::Debug for NetStack<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetStack")
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

impl<D: NetDma> NetStack<D> {
    /// A stack with address `addr` over `driver`.
    pub fn new(mut driver: NetDriver<D>, addr: Ipv4Cidr) -> Self {
        let mac = driver.mac();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        // Deterministic per host: the MAC.
        config.random_seed = mac.iter().fold(0x5eed, |a, &b| a << 8 ^ u64::from(b));
        let epoch = Instant::now();
        let mut iface = Interface::new(config, &mut driver, SmolInstant::from_micros(0));
        iface.update_ip_addrs(|a| {
            // Capacity is at least 1 (smoltcp's IFACE_MAX_ADDR_COUNT).
            let _ = a.push(IpCidr::Ipv4(addr));
        });
        Self {
            driver,
            iface,
            sockets: SocketSet::new(Vec::new()),
            epoch,
        }
    }

    /// The stack's monotonic clock.
    pub fn now(&self) -> SmolInstant {
        SmolInstant::from_micros(self.epoch.elapsed().as_micros().min(i64::MAX as u128) as i64)
    }

    /// Runs the stack once: receives, sends, reposts receive buffers.
    /// Returns whether a socket's state may have changed; an error if the
    /// driver met one or the device asked for a reset.
    pub fn poll(&mut self) -> Result<bool, DriverError> {
        let now = self.now();
        self.driver.reset_rx_budget();
        let r = self.iface.poll(now, &mut self.driver, &mut self.sockets);
        self.driver.refill_rx()?;
        if let Some(e) = self.driver.take_error() {
            return Err(e);
        }
        self.driver.check_device()?;
        Ok(r == PollResult::SocketStateChanged)
    }

    /// Sleeps on the device's interrupt until smoltcp next has timed work
    /// or `max` passes.
    pub fn wait(&mut self, max: Duration) -> Result<(), DriverError> {
        let now = self.now();
        let d = self
            .iface
            .poll_delay(now, &self.sockets)
            .map_or(max, |d| Duration::from_micros(d.total_micros()).min(max));
        if d.is_zero() {
            return Ok(());
        }
        self.driver.wait(d)
    }
}
