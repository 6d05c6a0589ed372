//! What the DMA benches and labs share: a system with one unit and one
//! device in a DMA domain, and the latency model's figures as reports
//! carry them.

use std::sync::Arc;

use softiommu::dma::{DmaDevice, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{HwError, LatencyModel, SourceId, System, UnitConfig, UnitId};
use softiommu::mem::PhysMemory;
use softiommu::Platform;

use crate::error::LabResult;
use crate::report::{Modelled, Unit};

/// One unit, one device, one domain.
#[derive(Debug)]
pub struct DmaRig {
    /// Physical memory.
    pub mem: Arc<PhysMemory>,
    /// The system holding the unit.
    pub sys: Arc<System>,
    /// The unit.
    pub unit: UnitId,
    /// The device's source id.
    pub sid: SourceId,
    /// The domain.
    pub domain: Arc<DmaDomain>,
    /// The device, attached with a 64-bit mask.
    pub dev: DmaDevice,
}

impl DmaRig {
    /// The physical memory a domain's bounce pool of `bounce_bytes` takes:
    /// three lanes, each rounded up to a power of two of pages.
    pub fn bounce_memory(bounce_bytes: u64) -> u64 {
        3 * bounce_bytes.div_ceil(4096).next_power_of_two() * 4096
    }

    /// Builds the rig through the library's [`Platform`]: `mem_bytes` of
    /// memory, a unit with `model`, a domain with `policy` and
    /// `bounce_bytes` of bounce pool.
    pub fn new(
        policy: DmaPolicy,
        model: LatencyModel,
        sid: SourceId,
        mem_bytes: u64,
        bounce_bytes: u64,
    ) -> LabResult<Self> {
        let Platform {
            mem,
            system: sys,
            domain,
            mut devices,
            ..
        } = Platform::builder()
            .memory(mem_bytes)
            .unit(UnitConfig {
                latency: model,
                ..UnitConfig::default()
            })
            .device(sid)
            .domain(DmaDomainConfig {
                policy,
                bounce_bytes,
                ..Default::default()
            })
            .build()?;
        let not_assigned = HwError::DeviceNotAssigned { sid };
        let unit = sys.unit_of(sid).ok_or(not_assigned.clone())?.0;
        let dev = devices.pop().ok_or(not_assigned)?;
        Ok(Self {
            mem,
            sys,
            unit,
            sid,
            domain,
            dev,
        })
    }
}

/// The model's figures as data, nanoseconds (a report's `modelled` field).
pub fn modelled(model: LatencyModel) -> Vec<(String, u64)> {
    model
        .figures()
        .iter()
        .map(|(n, d)| (n.to_string(), d.as_nanos() as u64))
        .collect()
}

/// The non-zero figures as a typed report's modelled list.
pub fn modelled_figures(figures: &[(String, u64)]) -> Vec<Modelled> {
    figures
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(n, v)| Modelled {
            name: n.clone(),
            value: *v as f64,
            unit: Unit::Ns,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LabError;
    use softiommu::dma::DmaError;
    use softiommu::mem::MemError;

    /// The rig is built through `Platform`: a refusal there reaches the lab
    /// as the layer's own variant.
    #[test]
    fn a_rig_the_platform_refuses_is_the_layers_error() {
        let e = DmaRig::new(
            DmaPolicy::Strict,
            LatencyModel::zero(),
            SourceId(0x0300),
            16 << 20,
            64 << 20,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                LabError::Dma(DmaError::Mem(MemError::OutOfFrames { .. }))
            ),
            "{e:?}"
        );
        let rig = DmaRig::new(
            DmaPolicy::Strict,
            LatencyModel::zero(),
            SourceId(0x0300),
            64 << 20,
            1 << 20,
        )
        .unwrap();
        assert_eq!(rig.sys.unit_of(rig.sid).map(|(u, _)| u), Some(rig.unit));
        assert_eq!(rig.domain.policy(), DmaPolicy::Strict);
    }
}
