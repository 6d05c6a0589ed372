//! What the DMA benches and labs share: a system with one unit and one
//! device in a DMA domain, and the latency model's figures as reports
//! carry them.

use std::sync::Arc;

use softiommu::dma::{DmaDevice, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{LatencyModel, SourceId, System, UnitConfig, UnitId};
use softiommu::mem::PhysMemory;

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
    /// Builds the rig: `mem_bytes` of memory, a unit with `model`, a domain
    /// with `policy` and `bounce_bytes` of bounce pool.
    pub fn new(
        policy: DmaPolicy,
        model: LatencyModel,
        sid: SourceId,
        mem_bytes: u64,
        bounce_bytes: u64,
    ) -> LabResult<Self> {
        let mem = Arc::new(PhysMemory::new(mem_bytes)?);
        let mut sys = System::new(mem.clone());
        let unit = sys.add_unit(UnitConfig {
            latency: model,
            ..UnitConfig::default()
        })?;
        sys.assign(sid, unit)?;
        let sys = Arc::new(sys);
        let domain = DmaDomain::new(
            sys.clone(),
            DmaDomainConfig {
                policy,
                bounce_bytes,
                ..Default::default()
            },
        )?;
        let dev = domain.attach(sid, u64::MAX, false)?;
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
