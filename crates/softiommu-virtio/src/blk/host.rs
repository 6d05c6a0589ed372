//! [`BlkHost`]: one machine of the storage lab — physical memory, one
//! IOMMU unit, a DMA domain with a DMA policy *and an IOVA allocator
//! design* (seed `004` compares those), and a virtio-blk device on its
//! threads behind the unit — built in one call, with its driver a call
//! away.

use std::sync::Arc;

use softiommu::dma::{DmaDevice, DmaDomain, DmaDomainConfig, DmaError, DmaPolicy};
use softiommu::hw::{FaultRecord, HwError, LatencyModel, SourceId, System, UnitId};
use softiommu::iopf::IopfError;
use softiommu::iova::IovaPolicy;
use softiommu::mem::{MemError, PhysMemory};

use super::device::{BlkDevice, BlkDeviceConfig, BlkDeviceError};
use super::driver::{BlkDriver, BlkDriverConfig, BlkDriverError};
use crate::host_platform::{HostPlatform, HostPlatformSpec};
use crate::iopf_mode::{IopfMode, IopfModeConfig};

/// How to build a [`BlkHost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlkHostConfig {
    /// The DMA policy of the host's domain.
    pub policy: DmaPolicy,
    /// The IOVA allocator design of the domain (`DmaDomainConfig::iova_policy`).
    pub iova_policy: IovaPolicy,
    /// Whether the unit's page walk is cache-coherent (seed `003`).
    pub coherent: bool,
    /// What the unit models (invalidation wait, walk latency).
    pub latency: LatencyModel,
    /// Bytes of physical memory (reserved sparse; touched pages only).
    pub mem_bytes: u64,
    /// The disk controller's PCI requester id.
    pub sid: SourceId,
    /// The device.
    pub device: BlkDeviceConfig,
    /// Bytes of bounce pool (the bounce policy's copies go through it).
    pub bounce_bytes: u64,
    /// The domain's low window (`DmaDomainConfig::low_window_bytes`).
    pub low_window_bytes: u64,
    /// Whether the controller gets IOVAs in the low window first, as Linux
    /// gives a PCI device (`DmaDomainConfig::low_window_first`).
    pub low_window_first: bool,
    /// IOPF mode, asked for as for a network host
    /// ([`HostConfig::iopf`](crate::host::HostConfig::iopf)): the driver
    /// maps through a pass-through DMA domain, so its "map" is a
    /// registration that hands the device physical addresses and maps
    /// nothing (`policy` is ignored); the controller is attached instead
    /// to an [`IopfDomain`](softiommu::iopf::IopfDomain) whose memory map
    /// is the guest's RAM, identity-mapped (IOVA = physical address) and
    /// empty at first, and a handler serves its page requests
    /// ([`IopfMode::over_guest_ram`]). The first touch of every page —
    /// rings, headers, data — faults and is served; later touches hit.
    pub iopf: Option<IopfModeConfig>,
}

impl Default for BlkHostConfig {
    fn default() -> Self {
        Self {
            policy: DmaPolicy::Deferred,
            iova_policy: IovaPolicy::Softiommu,
            coherent: true,
            latency: LatencyModel::zero(),
            mem_bytes: 1 << 30,
            sid: SourceId(0x0400),
            device: BlkDeviceConfig::default(),
            bounce_bytes: 64 << 20,
            low_window_bytes: 1 << 32,
            low_window_first: false,
            iopf: None,
        }
    }
}

/// Why a host could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlkHostError {
    /// Memory could not be reserved.
    #[error(transparent)]
    Memory(#[from] MemError),
    /// The unit or the device's assignment failed.
    #[error(transparent)]
    Hw(#[from] HwError),
    /// The DMA domain or the attach failed.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// The device did not start (or its back-end did not open).
    #[error(transparent)]
    Device(#[from] BlkDeviceError),
    /// The page-fault domain or its handler refused (IOPF mode).
    #[error(transparent)]
    Iopf(#[from] IopfError),
    /// Another layer refused while the platform was built (no layer but
    /// the four above does today).
    #[error(transparent)]
    Platform(softiommu::Error),
}

impl BlkHostError {
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
pub struct BlkHost {
    /// Physical memory.
    pub mem: Arc<PhysMemory>,
    /// The system holding the unit.
    pub system: Arc<System>,
    /// The unit the disk controller sits behind.
    pub unit: UnitId,
    /// The DMA domain the driver maps in.
    pub domain: Arc<DmaDomain>,
    /// The controller, attached to the domain with a 64-bit mask.
    pub dev: DmaDevice,
    /// The device model, running.
    pub device: BlkDevice,
    /// In IOPF mode, the address space the controller faults into and
    /// its handler (dropped after the device has stopped).
    pub iopf: Option<IopfMode>,
}

impl BlkHost {
    /// Builds the host (in IOPF mode if `cfg.iopf` says so) and starts
    /// its device.
    pub fn new(cfg: &BlkHostConfig) -> Result<Self, BlkHostError> {
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
                iova_policy: cfg.iova_policy,
                coherent: cfg.coherent,
                bounce_bytes: cfg.bounce_bytes,
                low_window_bytes: cfg.low_window_bytes,
                low_window_first: cfg.low_window_first,
                ..Default::default()
            },
            iopf: cfg.iopf,
        })
        .map_err(BlkHostError::from_platform)?;
        // Only now, its attachment final, does the device start.
        let device = BlkDevice::spawn(&cfg.device, system.clone(), cfg.sid)?;
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

    /// Probes the disk with a driver (each queue with a DMA handle of its
    /// own).
    pub fn driver(&self, cfg: BlkDriverConfig) -> Result<BlkDriver, BlkDriverError> {
        BlkDriver::probe(
            self.device.transport().clone(),
            &self.domain,
            self.dev.clone(),
            cfg,
        )
    }

    /// Takes the faults the unit recorded.
    pub fn take_faults(&self) -> Vec<FaultRecord> {
        self.system
            .unit(self.unit)
            .map(|u| u.faults().drain().records)
            .unwrap_or_default()
    }
}
