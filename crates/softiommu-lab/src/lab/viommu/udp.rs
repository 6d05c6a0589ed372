//! `softiommu lab viommu`'s UDP stream rows (`virtio-net/udp-32B`): a
//! guest sends 32-byte UDP datagrams through smoltcp and our virtio-net
//! driver ([`NetDriver`] over [`UdpDma`]) to a peer host's socket, its
//! NIC's every DMA translated by the unit — with no IOMMU (the endpoint
//! in the virtio-iommu's bypass, buffers at their physical addresses),
//! guest strict (a MAP per datagram posted and an UNMAP per datagram
//! reclaimed, each sent and waited for) and guest lazy (Linux 6.8: one
//! notification per map sync, the UNMAPs on a flush queue of 256).
//!
//! An I/O is one datagram delivered to the peer's socket. The rings are
//! mapped once, when the driver starts. The guest keeps at most
//! [`WINDOW`] datagrams beyond those delivered in flight (below the
//! peer's 256 receive buffers), so none is dropped and the slice's count
//! is exact.
//!
//! One thread runs both stacks in turn (the guest's, then the peer's),
//! and the peer (another machine, with no IOMMU and no exit cost) is the
//! same in every mode: `driver_cpu_us_per_io` is the guest's part of the
//! thread's CPU only (its stack, driver, the modelled exits of its
//! notifications and the virtio-iommu's handling of its requests, served
//! on the notifying thread); the throughput is the whole loop's. As for
//! the storage rows, the three modes run on three machines built side by
//! side in interleaved slices, and the same physics checks apply.

use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::socket::udp;
use smoltcp::wire::{IpAddress, IpEndpoint, Ipv4Address, Ipv4Cidr};
use softiommu::dma::{DmaDirection, DmaMapper, DmaPolicy};
use softiommu::hw::{SourceId, System, UnitId};
use softiommu::mem::PhysAddr;
use softiommu_virtio::cpu_clock;
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::net::{
    wire, NetConfig, NetDevice, NetDeviceConfig, NetDma, NetDriver, NetDriverConfig, NetStack,
    WireConfig,
};
use softiommu_virtio::transport::TransportConfig;
use softiommu_virtio::viommu::{
    ViommuDevice, ViommuDma, ViommuDmaError, ViommuMapping, ViommuMode,
};

use super::rig::Guest;
use super::run::{interleave, median_rounds, Measured, Round, Sliced};
use super::{physics, Mode, ViommuRow};
use crate::error::{LabError, LabResult};

/// The rows' `device`.
pub(super) const DEVICE: &str = "virtio-net/udp-32B";
/// UDP payload bytes per datagram (netperf UDP_STREAM's seed size).
const MSG: usize = 32;
/// The guest NIC's requester id (00:03.0), the virtio-iommu's endpoint.
const NIC_SID: SourceId = SourceId(0x0018);
/// Datagrams per interleaved slice.
const SLICE: u64 = 500;
/// Datagrams the guest keeps in flight beyond those delivered.
const WINDOW: u64 = 64;
/// Unmaps held before a lazy flush (Linux's per-CPU flush queue).
const FLUSH_QUEUE: usize = 256;
/// Datagrams sent and delivered before the first slice (ARP, IOVA caches,
/// IOTLB): not measured.
const WARMUP: u64 = 256;
/// The longest a slice waits with nothing delivered.
const STALL: Duration = Duration::from_secs(10);
const GUEST_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);
const PEER_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
const PEER_PORT: u16 = 9;

fn err(e: impl std::fmt::Display) -> LabError {
    LabError::Measure(format!("lab viommu ({DEVICE}): {e}"))
}

/// The guest NIC's DMA API: physical addresses (no IOMMU) or the DMA API
/// over the virtio-iommu.
#[derive(Debug)]
pub(crate) enum UdpDma {
    /// No IOMMU: the device address is the physical one.
    None,
    /// Map and unmap are virtio-iommu MAP and UNMAP requests.
    Viommu(Box<ViommuDma>),
}

/// A [`UdpDma`] mapping: the device address, and the virtio-iommu's
/// mapping to give back (none without an IOMMU).
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdpMapping {
    addr: u64,
    viommu: Option<ViommuMapping>,
}

impl DmaMapper for UdpDma {
    type Error = ViommuDmaError;
    type Mapping = UdpMapping;

    fn dma_addr(m: &UdpMapping) -> u64 {
        m.addr
    }

    fn dma_map(
        &mut self,
        phys: PhysAddr,
        len: u64,
        dir: DmaDirection,
    ) -> Result<UdpMapping, ViommuDmaError> {
        match self {
            UdpDma::None => Ok(UdpMapping {
                addr: phys,
                viommu: None,
            }),
            UdpDma::Viommu(d) => {
                let m = d.map(phys, len, dir)?;
                Ok(UdpMapping {
                    addr: m.iova,
                    viommu: Some(m),
                })
            }
        }
    }

    fn dma_unmap(&mut self, m: UdpMapping) -> Result<(), ViommuDmaError> {
        match (self, m.viommu) {
            (UdpDma::Viommu(d), Some(v)) => d.unmap(v),
            _ => Ok(()),
        }
    }

    fn dma_flush(&mut self) -> Result<(), ViommuDmaError> {
        match self {
            UdpDma::None => Ok(()),
            UdpDma::Viommu(d) => d.flush(),
        }
    }
}

/// Rings: frames mapped once with the mapper (the provided methods).
impl NetDma for UdpDma {}

/// One mode's machines: the guest (memory, unit, virtio-iommu, NIC, its
/// stack) and the peer on the other end of the wire.
///
/// Fields drop in order: the guest's stack (whose driver unmaps through
/// the virtio-iommu) before its devices.
pub(crate) struct UdpRig {
    mode: Mode,
    guest: NetStack<UdpDma>,
    guest_sock: smoltcp::iface::SocketHandle,
    peer: NetStack,
    peer_sock: smoltcp::iface::SocketHandle,
    _nic: NetDevice,
    _peer_host: Host,
    viommu: ViommuDevice,
    system: Arc<System>,
    unit: UnitId,
}

fn socket(port: u16) -> LabResult<udp::Socket<'static>> {
    let rx = udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 512], vec![0; 1 << 16]);
    let tx = udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 512], vec![0; 1 << 16]);
    let mut s = udp::Socket::new(rx, tx);
    s.bind(port).map_err(err)?;
    Ok(s)
}

impl UdpRig {
    /// A fresh pair of machines in `mode`, every notification of the
    /// guest's devices costing `exit`, warmed up.
    pub(crate) fn new(mode: Mode, exit: Duration) -> LabResult<Self> {
        let max_frame = NetConfig::default().max_frame();
        let (pa, pb, _) = wire(WireConfig {
            capacity: 1024,
            line_rate_bps: 0,
            max_frame,
        });
        // The peer: another machine, its NIC with no IOMMU in the way.
        let peer_host = Host::new(
            &HostConfig {
                policy: DmaPolicy::Passthrough,
                mem_bytes: 64 << 20,
                ..HostConfig::default()
            },
            pa,
        )
        .map_err(err)?;
        let mut peer = peer_host
            .stack(NetDriverConfig::default(), Ipv4Cidr::new(PEER_IP, 24))
            .map_err(err)?;
        let peer_sock = peer.sockets.add(socket(PEER_PORT)?);
        let Guest {
            mem,
            system,
            unit,
            viommu,
            driver: vdrv,
        } = Guest::new(NIC_SID, mode, exit)?;
        let ep = u32::from(NIC_SID.0);
        let viommu_mode = match mode {
            Mode::None => None,
            Mode::Strict => Some(ViommuMode::Strict),
            Mode::Lazy => Some(ViommuMode::Lazy {
                flush_queue: FLUSH_QUEUE,
            }),
        };
        let dma = match viommu_mode {
            None => {
                drop(vdrv);
                UdpDma::None
            }
            Some(m) => UdpDma::Viommu(Box::new(ViommuDma::new(vdrv, 1, &[ep], m).map_err(err)?)),
        };
        let nic = NetDevice::spawn(
            NetDeviceConfig {
                net: NetConfig {
                    mac: [0x02, 0, 0, 0, 0, 0x02],
                    ..NetConfig::default()
                },
                transport: TransportConfig {
                    notify_exit: exit,
                    ..TransportConfig::default()
                },
                ..NetDeviceConfig::default()
            },
            system.clone(),
            NIC_SID,
            pb,
        )
        .map_err(err)?;
        let drv = NetDriver::probe_with(
            nic.transport().clone(),
            mem,
            dma,
            NetDriverConfig::default(),
        )
        .map_err(err)?;
        let mut guest = NetStack::new(drv, Ipv4Cidr::new(GUEST_IP, 24));
        let guest_sock = guest.sockets.add(socket(5000)?);
        let mut rig = Self {
            mode,
            guest,
            guest_sock,
            peer,
            peer_sock,
            _nic: nic,
            _peer_host: peer_host,
            viommu,
            system,
            unit,
        };
        rig.stream(WARMUP)?;
        // Every datagram of the warm-up has left: its buffers reclaimed
        // and lazy's UNMAPs sent, so none is counted in a slice.
        rig.drain_tx()?;
        rig.guest.driver.flush_dma().map_err(err)?;
        Ok(rig)
    }

    /// Waits (bounded by [`STALL`]) until the NIC has returned every
    /// transmit buffer, reclaiming each (strict's UNMAPs sent, lazy's
    /// queued). The peer's socket having a datagram does not mean its
    /// buffer is back: the NIC puts the frame on the wire before it
    /// returns the buffer used, so a bare `reclaim_tx` can miss the last
    /// ones and their UNMAPs land in the next slice's counts.
    fn drain_tx(&mut self) -> LabResult<()> {
        let t0 = Instant::now();
        loop {
            self.guest.driver.reclaim_tx().map_err(err)?;
            let left = self.guest.driver.tx_in_flight();
            if left == 0 {
                return Ok(());
            }
            if t0.elapsed() > STALL {
                return Err(err(format!(
                    "{left} transmit buffers not returned in {STALL:?}; mode {}",
                    self.mode.name()
                )));
            }
            std::thread::park_timeout(Duration::from_micros(50));
        }
    }

    fn counts(&self) -> [u64; 3] {
        let v = self.viommu.stats();
        [
            v.requests,
            self.viommu.transport().notifications(),
            v.invalidations,
        ]
    }

    /// Sends `n` datagrams and returns once the peer's socket has all of
    /// them: the wall time, and the CPU time of the guest's part.
    fn stream(&mut self, n: u64) -> LabResult<(Duration, Duration)> {
        let to = IpEndpoint::new(IpAddress::Ipv4(PEER_IP), PEER_PORT);
        let payload = [0x5au8; MSG];
        let (mut sent, mut got) = (0u64, 0u64);
        let mut guest_cpu = Duration::ZERO;
        let t0 = Instant::now();
        let mut last = Instant::now();
        while got < n {
            let c0 = cpu_clock::thread();
            let s = self.guest.sockets.get_mut::<udp::Socket>(self.guest_sock);
            let until = n.min(got + WINDOW);
            while sent < until && s.can_send() {
                s.send_slice(&payload, to).map_err(err)?;
                sent += 1;
            }
            let g = self.guest.poll();
            guest_cpu += cpu_clock::thread().saturating_sub(c0);
            g.map_err(|e| self.fail(e))?;
            self.peer.poll().map_err(err)?;
            let s = self.peer.sockets.get_mut::<udp::Socket>(self.peer_sock);
            let before = got;
            while let Ok((d, _)) = s.recv() {
                if d.len() != MSG {
                    return Err(err(format!("a datagram of {} bytes arrived", d.len())));
                }
                got += 1;
            }
            if got > before {
                last = Instant::now();
            } else {
                if last.elapsed() > STALL {
                    return Err(err(format!(
                        "nothing delivered for {STALL:?} ({got} of {n}, {sent} sent; mode {})",
                        self.mode.name()
                    )));
                }
                // Until either NIC's interrupt, bounded.
                std::thread::park_timeout(Duration::from_micros(50));
            }
        }
        Ok((t0.elapsed(), guest_cpu))
    }

    /// The guest's error, with what the unit recorded.
    fn fail(&self, e: impl std::fmt::Display) -> LabError {
        let f = self.system.unit(self.unit).map(|u| u.faults().drain());
        err(format!("{e}; mode {}; unit faults {f:?}", self.mode.name()))
    }
}

impl Sliced for UdpRig {
    /// `n` datagrams delivered, measured.
    fn slice(&mut self, n: u64) -> LabResult<Measured> {
        let c0 = self.counts();
        let (wall, cpu) = self.stream(n)?;
        let c1 = self.counts();
        Ok(Measured::moved(
            wall.as_secs_f64(),
            cpu.as_secs_f64(),
            c0,
            c1,
        ))
    }

    /// The transmit buffers still held reclaimed and lazy's last flush
    /// (timed and counted with the datagrams: it is their work).
    fn finish(&mut self) -> LabResult<Measured> {
        let c0 = self.counts();
        let cpu0 = cpu_clock::thread();
        let t0 = Instant::now();
        self.drain_tx()?;
        self.guest.driver.flush_dma().map_err(err)?;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_clock::thread().saturating_sub(cpu0).as_secs_f64();
        let c1 = self.counts();
        Ok(Measured::moved(secs, cpu, c0, c1))
    }
}

/// One round: the three modes on three rigs built side by side, `ios`
/// datagrams each in slices of [`SLICE`] interleaved (the order reversed
/// every other slice). Returned in [`Mode::ALL`]'s order.
fn measure_round(ios: u64, exit: Duration) -> LabResult<Round> {
    let mut rigs = Mode::ALL
        .iter()
        .map(|&m| UdpRig::new(m, exit))
        .collect::<LabResult<Vec<_>>>()?;
    interleave(&mut rigs, ios, SLICE)
}

/// The UDP stream's three rows, `ios` datagrams per row and round,
/// `rounds` rounds (the median round reported), every notification of
/// the guest's devices costing `exit`.
pub(super) fn udp_rows(ios: u64, rounds: u64, exit: Duration) -> LabResult<Vec<ViommuRow>> {
    let (secs, med, spread) = median_rounds(rounds, || measure_round(ios, exit))?;
    let none_rate = ios as f64 / med[0].secs;
    let per = |x: u64| x as f64 / ios as f64;
    Ok(Mode::ALL
        .iter()
        .zip(&med)
        .zip(&spread)
        .map(|((&mode, m), sp)| {
            let why = physics(mode, &secs);
            let rate = ios as f64 / m.secs;
            ViommuRow {
                device: DEVICE.to_string(),
                mode: mode.name(),
                bs: MSG as u64,
                depth: WINDOW,
                iops: rate,
                pct_of_none: 100.0 * rate / none_rate,
                pct_of_none_min: sp.min,
                pct_of_none_median: sp.median,
                pct_of_none_max: sp.max,
                spread_slices: sp.n,
                driver_cpu_us_per_io: m.cpu_secs * 1e6 / ios as f64,
                driver_wait_cpu_us_per_io: 0.0,
                device_us_per_io: 0.0,
                requests_per_io: per(m.requests),
                notifications_per_io: per(m.notifications),
                invalidations_per_io: per(m.invalidations),
                valid: why.is_none(),
                why,
            }
        })
        .collect())
}

/// What the UDP rows measure, for the report's notes.
pub(super) const NOTE: &str = "virtio-net/udp-32B: a guest sends 32-byte UDP datagrams through smoltcp and our virtio-net driver to a peer's socket; an I/O is one datagram delivered to the peer's socket; per datagram strict sends a MAP (posted) and an UNMAP (reclaimed), lazy the same with one notification per map sync; the rings are mapped once; the peer (no IOMMU, no exit cost) runs on the same thread and is not in driver CPU";

#[cfg(test)]
mod tests {
    use super::*;

    /// A short stream per mode: strict sends a MAP and an UNMAP per
    /// datagram, each notified, and the unit invalidates for each UNMAP;
    /// lazy sends the same requests with one notification per datagram's
    /// map sync and far fewer invalidations; none sends nothing.
    #[test]
    fn each_mode_counts_its_own_requests_per_datagram() {
        let (m, _) = measure_round(300, Duration::ZERO).unwrap();
        let per = |i: usize, x: fn(&Measured) -> u64| x(&m[i]) as f64 / 300.0;
        assert_eq!((m[0].requests, m[0].notifications), (0, 0), "{m:?}");
        // Exactly a MAP and an UNMAP per datagram in both modes (the
        // warm-up's all sent before, the last ones in the final flush).
        assert_eq!((m[1].requests, m[2].requests), (600, 600), "{m:?}");
        assert_eq!(
            (m[1].notifications, m[1].invalidations),
            (600, 300),
            "{m:?}"
        );
        assert!(
            per(2, |x| x.notifications) < per(1, |x| x.notifications)
                && per(2, |x| x.notifications) <= 1.1,
            "{m:?}"
        );
        assert!(per(2, |x| x.invalidations) < 0.1, "{m:?}");
    }

    /// The warm-up and `finish` return only once the NIC has given back
    /// every transmit buffer, so each datagram's UNMAP is counted in the
    /// slice (or finish) of its own datagram, never the next one's. The
    /// NIC puts a frame on the wire before it returns the buffer used, so
    /// a peer holding every datagram proves nothing about the buffers.
    #[test]
    fn warm_up_and_finish_leave_no_transmit_buffer_in_flight() {
        for mode in [Mode::Strict, Mode::Lazy] {
            let mut rig = UdpRig::new(mode, Duration::ZERO).unwrap();
            assert_eq!(rig.guest.driver.tx_in_flight(), 0, "{}", mode.name());
            rig.slice(100).unwrap();
            rig.finish().unwrap();
            assert_eq!(rig.guest.driver.tx_in_flight(), 0, "{}", mode.name());
        }
    }

    /// No IOMMU maps nothing: the device address is the physical one.
    #[test]
    fn no_iommu_hands_out_physical_addresses() {
        let mut d = UdpDma::None;
        let m = d
            .dma_map(0x12345, 64, DmaDirection::ToDevice)
            .expect("no IOMMU");
        assert_eq!(UdpDma::dma_addr(&m), 0x12345);
        assert_eq!(d.dma_unmap(m), Ok(()));
    }
}
