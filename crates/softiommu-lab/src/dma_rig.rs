//! What the DMA benches and labs share: a system with one unit and one
//! device in a DMA domain, the policy list from the command line, and the
//! latency model's figures as reports print them.

use std::sync::Arc;

use softiommu::dma::{DmaDevice, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{LatencyModel, SourceId, System, UnitConfig, UnitId};
use softiommu::mem::PhysMemory;

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
    ) -> Result<Self, String> {
        let mem = Arc::new(PhysMemory::new(mem_bytes).map_err(|e| e.to_string())?);
        let mut sys = System::new(mem.clone());
        let unit = sys
            .add_unit(UnitConfig {
                latency: model,
                ..UnitConfig::default()
            })
            .map_err(|e| e.to_string())?;
        sys.assign(sid, unit).map_err(|e| e.to_string())?;
        let sys = Arc::new(sys);
        let domain = DmaDomain::new(
            sys.clone(),
            DmaDomainConfig {
                policy,
                bounce_bytes,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let dev = domain
            .attach(sid, u64::MAX, false)
            .map_err(|e| e.to_string())?;
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

/// The options every DMA bench and lab takes.
#[derive(Debug, Clone, clap::Args)]
pub struct DmaRunArgs {
    /// Latency model: vtd-2015 or zero.
    #[arg(long, default_value = "vtd-2015")]
    pub latency: String,
    /// Policies to run (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
}

impl Default for DmaRunArgs {
    fn default() -> Self {
        Self {
            latency: "vtd-2015".into(),
            policies: Vec::new(),
        }
    }
}

impl DmaRunArgs {
    /// The latency model named.
    pub fn model(&self) -> Result<LatencyModel, String> {
        match self.latency.as_str() {
            "vtd-2015" => Ok(LatencyModel::vtd_2015()),
            "zero" => Ok(LatencyModel::zero()),
            s => Err(format!("unknown latency model {s:?} (vtd-2015, zero)")),
        }
    }

    /// The policies named; none named means all.
    pub fn policies(&self) -> Result<Vec<DmaPolicy>, String> {
        if self.policies.is_empty() {
            return Ok(DmaPolicy::ALL.to_vec());
        }
        self.policies
            .iter()
            .map(|p| DmaPolicy::from_name(p).ok_or_else(|| format!("unknown policy {p:?}")))
            .collect()
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

/// The non-zero figures as text, or "nothing".
pub fn modelled_text(figures: &[(String, u64)]) -> String {
    let v: Vec<String> = figures
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(n, v)| format!("{n} = {v} ns"))
        .collect();
    if v.is_empty() {
        "nothing".to_string()
    } else {
        v.join(", ")
    }
}
