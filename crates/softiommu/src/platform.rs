//! One builder for the setup every user repeats: physical memory, IOMMU
//! units, devices assigned to them, a DMA domain with a policy, the
//! devices attached to it.
//!
//! ```
//! use softiommu::{DmaDirection, DmaPolicy, Platform, SourceId};
//!
//! # fn main() -> Result<(), softiommu::Error> {
//! let p = Platform::builder()
//!     .memory(64 << 20)
//!     .policy(DmaPolicy::Deferred)
//!     .device(SourceId::new(1, 0, 0).unwrap_or_default())
//!     .build()?;
//! let mut cpu = p.domain.cpu();
//! let buf = p.mem.alloc_zeroed_frames(0)?;
//! let nic = &p.devices[0];
//! let iova = cpu.map(nic, buf, 64, DmaDirection::ToDevice)?;
//! cpu.unmap(nic, iova, 64, DmaDirection::ToDevice)?;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use crate::access::DmaAccessor;
use crate::dma::{DmaDevice, DmaDomain, DmaDomainConfig, DmaPolicy};
use crate::error::Error;
use crate::hw::{HwError, SourceId, System, Unit, UnitConfig, UnitId};
use crate::mem::PhysMemory;

/// A device to attach: its source id, the unit it sits behind (an index
/// into the units added), its DMA mask and whether it is untrusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The device's PCI requester id.
    pub sid: SourceId,
    /// Which unit (in the order [`PlatformBuilder::unit`] added them).
    pub unit: usize,
    /// Its DMA mask.
    pub mask: u64,
    /// Whether every buffer of it is bounced.
    pub untrusted: bool,
}

/// Builds a [`Platform`]. Made by [`Platform::builder`].
#[derive(Debug, Clone)]
pub struct PlatformBuilder {
    memory: u64,
    units: Vec<UnitConfig>,
    devices: Vec<DeviceSpec>,
    domain: DmaDomainConfig,
}

/// Memory, units, one DMA domain and its attached devices, ready to map.
#[derive(Debug)]
pub struct Platform {
    /// Physical memory.
    pub mem: Arc<PhysMemory>,
    /// The units and which device sits behind which.
    pub system: Arc<System>,
    /// The DMA domain every device is attached to.
    pub domain: Arc<DmaDomain>,
    /// The attached devices, in the order they were added.
    pub devices: Vec<DmaDevice>,
    units: Vec<UnitId>,
}

impl Default for PlatformBuilder {
    fn default() -> Self {
        Self {
            memory: 256 << 20,
            units: Vec::new(),
            devices: Vec::new(),
            domain: DmaDomainConfig::default(),
        }
    }
}

impl PlatformBuilder {
    /// Bytes of physical memory (default 256 MiB).
    pub fn memory(mut self, bytes: u64) -> Self {
        self.memory = bytes;
        self
    }

    /// Adds a unit (one with the default configuration is added for the
    /// devices if none is).
    pub fn unit(mut self, config: UnitConfig) -> Self {
        self.units.push(config);
        self
    }

    /// Adds a trusted device behind the last unit added, with a 64-bit
    /// DMA mask.
    pub fn device(self, sid: SourceId) -> Self {
        let unit = self.units.len().saturating_sub(1);
        self.device_spec(DeviceSpec {
            sid,
            unit,
            mask: u64::MAX,
            untrusted: false,
        })
    }

    /// Adds a device as `spec` says.
    pub fn device_spec(mut self, spec: DeviceSpec) -> Self {
        self.devices.push(spec);
        self
    }

    /// The policy the domain starts with (default: strict).
    pub fn policy(mut self, policy: DmaPolicy) -> Self {
        self.domain.policy = policy;
        self
    }

    /// The whole domain configuration.
    pub fn domain(mut self, config: DmaDomainConfig) -> Self {
        self.domain = config;
        self
    }

    /// Builds it.
    pub fn build(mut self) -> Result<Platform, Error> {
        if self.units.is_empty() {
            self.units.push(UnitConfig::default());
        }
        let mem = Arc::new(PhysMemory::new(self.memory)?);
        let mut system = System::new(mem.clone());
        let mut units = Vec::with_capacity(self.units.len());
        for cfg in &self.units {
            units.push(system.add_unit(*cfg)?);
        }
        for d in &self.devices {
            let unit = *units.get(d.unit).ok_or(HwError::UnknownUnit(UnitId(
                u16::try_from(d.unit).unwrap_or(u16::MAX),
            )))?;
            system.assign(d.sid, unit)?;
        }
        let system = Arc::new(system);
        let domain = DmaDomain::new(system.clone(), self.domain)?;
        let devices = self
            .devices
            .iter()
            .map(|d| domain.attach(d.sid, d.mask, d.untrusted))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Platform {
            mem,
            system,
            domain,
            devices,
            units,
        })
    }
}

impl Platform {
    /// A builder with 256 MiB of memory, no unit or device yet, and a
    /// strict domain.
    pub fn builder() -> PlatformBuilder {
        PlatformBuilder::default()
    }

    /// Device `i` (in the order added).
    pub fn device(&self, i: usize) -> Option<&DmaDevice> {
        self.devices.get(i)
    }

    /// Unit `i` (in the order added).
    pub fn unit(&self, i: usize) -> Option<&Unit> {
        self.system.unit(*self.units.get(i)?)
    }

    /// A device-side accessor for device `i`, for the calling thread
    /// (`None` if there is no device `i`).
    pub fn accessor(&self, i: usize) -> Option<Result<DmaAccessor, Error>> {
        let dev = self.device(i)?;
        Some(DmaAccessor::for_device(dev).map_err(Error::from))
    }
}
