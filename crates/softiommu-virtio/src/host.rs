//! [`Host`]: one machine of the lab — physical memory, one IOMMU unit, a
//! DMA domain with a policy, a virtio-net device on its thread behind the
//! unit — and [`pair`], two of them on the two ends of a wire. Each host
//! has its own memory, system and unit, so a frame is mapped `ToDevice` on
//! the sender's side and `FromDevice` on the receiver's. Either host's NIC
//! can run in IOPF mode ([`HostConfig::iopf`]): nothing is mapped up
//! front and its first touch of each page faults.

use std::sync::Arc;

use smoltcp::wire::Ipv4Cidr;
use softiommu::dma::{DmaDevice, DmaDomain, DmaDomainConfig, DmaError, DmaPolicy};
use softiommu::hw::{FaultRecord, HwError, LatencyModel, SourceId, System, UnitId};
use softiommu::iopf::IopfError;
use softiommu::mem::{MemError, PhysMemory};

use crate::host_platform::{HostPlatform, HostPlatformSpec};
use crate::iopf_mode::{IopfMode, IopfModeConfig};

use crate::net::{
    wire, DriverError, NetDevice, NetDeviceConfig, NetDeviceError, NetDriver, NetDriverConfig,
    NetStack, WireConfig, WirePort, WireStats,
};

/// How to build a [`Host`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostConfig {
    /// The DMA policy of the host's domain.
    pub policy: DmaPolicy,
    /// Whether the unit's page walk is cache-coherent (seed `003`).
    pub coherent: bool,
    /// What the unit models (invalidation wait, walk latency).
    pub latency: LatencyModel,
    /// Bytes of physical memory (reserved sparse; touched pages only).
    pub mem_bytes: u64,
    /// The NIC's PCI requester id.
    pub sid: SourceId,
    /// The device.
    pub device: NetDeviceConfig,
    /// Bytes of bounce pool (the bounce policy's copies go through it).
    pub bounce_bytes: u64,
    /// IOPF mode, asked for as for a disk host
    /// ([`BlkHostConfig::iopf`](crate::blk::BlkHostConfig::iopf)). The
    /// driver maps through a pass-through domain (its maps hand
    /// out physical addresses and map nothing; `policy` is ignored), and
    /// the NIC is attached instead, fault-capable, to an `IopfDomain` over
    /// the guest's RAM, identity-mapped and empty, whose handler maps each
    /// page — rings, receive and transmit buffers — on the NIC's first
    /// touch.
    pub iopf: Option<IopfModeConfig>,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            policy: DmaPolicy::Strict,
            coherent: true,
            latency: LatencyModel::zero(),
            mem_bytes: 1 << 30,
            sid: SourceId(0x0300),
            device: NetDeviceConfig::default(),
            bounce_bytes: 16 << 20,
            iopf: None,
        }
    }
}

/// Why a host could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Memory could not be reserved.
    #[error(transparent)]
    Memory(#[from] MemError),
    /// The unit or the device's assignment failed.
    #[error(transparent)]
    Hw(#[from] HwError),
    /// The DMA domain or the attach failed.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// The device thread did not start.
    #[error(transparent)]
    Device(#[from] NetDeviceError),
    /// The page-fault domain or its handler refused (IOPF mode).
    #[error(transparent)]
    Iopf(#[from] IopfError),
    /// Another layer refused while the platform was built (no layer but
    /// the four above does today).
    #[error(transparent)]
    Platform(softiommu::Error),
}

impl HostError {
    /// Files a platform build's error under its layer.
    pub(crate) fn from_platform(e: softiommu::Error) -> Self {
        match e {
            softiommu::Error::Mem(e) => Self::Memory(e),
            softiommu::Error::Hw(e) => Self::Hw(e),
            softiommu::Error::Dma(e) => Self::Dma(e),
            softiommu::Error::Iopf(e) => Self::Iopf(e),
            other => Self::Platform(other),
        }
    }
}

/// One host: memory, unit, domain, device.
#[derive(Debug)]
pub struct Host {
    /// Physical memory.
    pub mem: Arc<PhysMemory>,
    /// The system holding the unit.
    pub system: Arc<System>,
    /// The unit the NIC sits behind.
    pub unit: UnitId,
    /// The DMA domain the driver maps in.
    pub domain: Arc<DmaDomain>,
    /// The NIC, attached to the domain with a 64-bit mask (in IOPF mode
    /// the driver's handle only: the NIC itself is in `iopf`'s domain).
    pub dev: DmaDevice,
    /// The device model, running.
    pub device: NetDevice,
    /// In IOPF mode, the address space the NIC faults into and its
    /// handler (dropped after the device has stopped).
    pub iopf: Option<IopfMode>,
}

impl Host {
    /// Builds a host whose NIC is on wire port `port` (in IOPF mode if
    /// `cfg.iopf` says so).
    pub fn new(cfg: &HostConfig, port: WirePort) -> Result<Self, HostError> {
        let HostPlatform {
            mem,
            system,
            unit,
            domain,
            dev,
            iopf,
        } = HostPlatform::build(HostPlatformSpec {
            mem_bytes: cfg.mem_bytes,
            latency: cfg.latency,
            sid: cfg.sid,
            domain: DmaDomainConfig {
                policy: cfg.policy,
                coherent: cfg.coherent,
                bounce_bytes: cfg.bounce_bytes,
                ..Default::default()
            },
            iopf: cfg.iopf,
        })
        .map_err(HostError::from_platform)?;
        // Only now, its attachment final, does the device start.
        let device = NetDevice::spawn(cfg.device, system.clone(), cfg.sid, port)?;
        Ok(Self {
            mem,
            system,
            unit,
            domain,
            dev,
            device,
            iopf,
        })
    }

    /// Probes the NIC with a driver on the calling thread (which receives
    /// its interrupts), on a DMA handle of its own.
    pub fn driver(&self, cfg: NetDriverConfig) -> Result<NetDriver, DriverError> {
        NetDriver::probe(
            self.device.transport().clone(),
            self.domain.cpu(),
            self.dev.clone(),
            cfg,
        )
    }

    /// A driver and smoltcp over it, with address `addr`.
    pub fn stack(&self, cfg: NetDriverConfig, addr: Ipv4Cidr) -> Result<NetStack, DriverError> {
        Ok(NetStack::new(self.driver(cfg)?, addr))
    }

    /// Takes the faults the unit recorded.
    pub fn take_faults(&self) -> Vec<FaultRecord> {
        self.system
            .unit(self.unit)
            .map(|u| u.faults().drain().records)
            .unwrap_or_default()
    }
}

/// Two hosts on a wire.
#[derive(Debug)]
pub struct HostPair {
    /// Host A (port A of the wire).
    pub a: Host,
    /// Host B.
    pub b: Host,
    /// The wire's counters.
    pub wire: WireStats,
}

/// Builds hosts `a` and `b` and wires them together. The wire's slots are
/// made large enough for either device's largest frame with two VLAN tags.
pub fn pair(a: &HostConfig, b: &HostConfig, mut w: WireConfig) -> Result<HostPair, HostError> {
    let tags = crate::spec::net::TAGS_HLEN;
    w.max_frame = w
        .max_frame
        .max(a.device.net.max_frame() + tags)
        .max(b.device.net.max_frame() + tags);
    let (pa, pb, stats) = wire(w);
    let mut bcfg = *b;
    if bcfg.device.net.mac == a.device.net.mac {
        bcfg.device.net.mac[5] ^= 0x01;
    }
    Ok(HostPair {
        a: Host::new(a, pa)?,
        b: Host::new(&bcfg, pb)?,
        wire: stats,
    })
}
