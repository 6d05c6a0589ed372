//! What every host of this crate is built from, before its device starts:
//! the library's [`Platform`] (memory, one unit with a latency model, the
//! device assigned to it, a DMA domain, the device attached), and in IOPF
//! mode the device moved from that domain to its faulting one.
//!
//! The order is the contract: a host calls [`HostPlatform::build`] first
//! and spawns its device after, so the device's threads never run with an
//! attachment that is about to change (in IOPF mode they would otherwise
//! start in the pass-through domain and be moved under their feet).

use std::sync::Arc;

use softiommu::dma::{DmaDevice, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{HwError, LatencyModel, SourceId, System, UnitConfig, UnitId};
use softiommu::mem::PhysMemory;
use softiommu::{Error, Platform};

use crate::iopf_mode::{IopfMode, IopfModeConfig};

/// How to build a host's platform.
#[derive(Debug, Clone)]
pub(crate) struct HostPlatformSpec {
    /// Bytes of physical memory.
    pub(crate) mem_bytes: u64,
    /// What the unit models.
    pub(crate) latency: LatencyModel,
    /// The device's requester id.
    pub(crate) sid: SourceId,
    /// The domain the driver maps in (its policy is replaced by
    /// pass-through in IOPF mode).
    pub(crate) domain: DmaDomainConfig,
    /// IOPF mode, if wanted.
    pub(crate) iopf: Option<IopfModeConfig>,
}

/// A host's platform, its device not yet started.
#[derive(Debug)]
pub(crate) struct HostPlatform {
    pub(crate) mem: Arc<PhysMemory>,
    pub(crate) system: Arc<System>,
    pub(crate) unit: UnitId,
    pub(crate) domain: Arc<DmaDomain>,
    /// The driver's handle on the device in `domain`.
    pub(crate) dev: DmaDevice,
    pub(crate) iopf: Option<IopfMode>,
}

impl HostPlatform {
    /// Builds the platform through [`Platform`]; in IOPF mode the domain
    /// is pass-through (the driver's maps are registrations handing out
    /// physical addresses) and the device leaves it for an `IopfDomain`
    /// over the guest's RAM ([`IopfMode::over_guest_ram`]). Start the
    /// device only after this returns.
    pub(crate) fn build(spec: HostPlatformSpec) -> Result<Self, Error> {
        let mut domain = spec.domain;
        if spec.iopf.is_some() {
            domain.policy = DmaPolicy::Passthrough;
        }
        let Platform {
            mem,
            system,
            domain,
            mut devices,
            ..
        } = Platform::builder()
            .memory(spec.mem_bytes)
            .unit(UnitConfig {
                latency: spec.latency,
                ..UnitConfig::default()
            })
            .device(spec.sid)
            .domain(domain)
            .build()?;
        let not_assigned = HwError::DeviceNotAssigned { sid: spec.sid };
        let unit = system.unit_of(spec.sid).ok_or(not_assigned.clone())?.0;
        let dev = devices.pop().ok_or(not_assigned)?;
        let iopf = match spec.iopf {
            Some(cfg) => {
                // The pass-through domain keeps the driver's handle (its
                // maps stay registrations); the device leaves it for the
                // faulting domain before any thread of it runs.
                domain.detach(&dev)?;
                Some(IopfMode::over_guest_ram(&system, spec.sid, cfg)?)
            }
            None => None,
        };
        Ok(Self {
            mem,
            system,
            unit,
            domain,
            dev,
            iopf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iopf_mode::may_fault;
    use softiommu::dma::DmaError;
    use softiommu::mem::MemError;

    fn spec(iopf: Option<IopfModeConfig>) -> HostPlatformSpec {
        HostPlatformSpec {
            mem_bytes: 64 << 20,
            latency: LatencyModel::zero(),
            sid: SourceId(0x0500),
            domain: DmaDomainConfig {
                policy: DmaPolicy::Strict,
                bounce_bytes: 1 << 20,
                ..Default::default()
            },
            iopf,
        }
    }

    /// In IOPF mode the device's attachment is final when the build
    /// returns — in the faulting domain, its misses raising page
    /// requests — before any host starts a device thread; the driver's
    /// domain is pass-through. Without it the device is in the driver's
    /// domain, with the policy asked for, and does not fault.
    #[test]
    fn the_attachment_is_final_before_the_device_starts() {
        let p = HostPlatform::build(spec(Some(IopfModeConfig::default()))).unwrap();
        assert!(may_fault(&p.system, SourceId(0x0500)));
        assert_eq!(p.domain.policy(), DmaPolicy::Passthrough);
        assert!(p.iopf.is_some());
        let p = HostPlatform::build(spec(None)).unwrap();
        assert!(!may_fault(&p.system, SourceId(0x0500)));
        assert_eq!(p.domain.policy(), DmaPolicy::Strict);
        assert!(p.iopf.is_none());
        assert_eq!(
            p.system.unit_of(SourceId(0x0500)).map(|(u, _)| u),
            Some(p.unit)
        );
    }

    /// A refusal while building is the layer's typed error, filed by each
    /// host under the same variant.
    #[test]
    fn a_platform_that_cannot_be_built_is_a_typed_error_for_both_hosts() {
        // A bounce pool larger than the memory.
        let mut s = spec(None);
        s.mem_bytes = 16 << 20;
        s.domain.bounce_bytes = 64 << 20;
        let e = HostPlatform::build(s).unwrap_err();
        assert!(
            matches!(e, Error::Dma(DmaError::Mem(MemError::OutOfFrames { .. }))),
            "{e:?}"
        );
        assert!(matches!(
            crate::host::HostError::from_platform(e.clone()),
            crate::host::HostError::Dma(DmaError::Mem(MemError::OutOfFrames { .. }))
        ));
        assert!(matches!(
            crate::blk::BlkHostError::from_platform(e),
            crate::blk::BlkHostError::Dma(DmaError::Mem(MemError::OutOfFrames { .. }))
        ));
    }
}
