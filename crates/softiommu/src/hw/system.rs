//! Several units in one system, each with a scope of devices, as VT-d's
//! DMA-remapping hardware unit definitions (ACPI DMAR, `DRHD` with its
//! device scope): every device belongs to exactly one unit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use super::context::{ContextEntry, SourceId, UnitId};
use super::error::HwError;
use super::unit::{Unit, UnitConfig};
use crate::mem::PhysMemory;

/// IOMMU units sharing one physical memory, and which device each serves.
#[derive(Debug)]
pub struct System {
    mem: Arc<PhysMemory>,
    units: Vec<Unit>,
    scope: RwLock<HashMap<SourceId, UnitId>>,
    /// Which DMA domain (by its id) owns each attached device: a device
    /// is in one domain at a time, and moves only once detached.
    owners: Mutex<HashMap<SourceId, u64>>,
}

impl System {
    /// A system with no unit yet.
    pub fn new(mem: Arc<PhysMemory>) -> Self {
        Self {
            mem,
            units: Vec::new(),
            owners: Mutex::new(HashMap::new()),
            scope: RwLock::new(HashMap::new()),
        }
    }

    /// Adds a unit; returns its id.
    pub fn add_unit(&mut self, config: UnitConfig) -> Result<UnitId, HwError> {
        let id = u16::try_from(self.units.len()).map_err(|_| HwError::InvalidConfig {
            field: "units",
            value: self.units.len() as u64,
        })?;
        self.units.push(Unit::new(Arc::clone(&self.mem), config)?);
        Ok(UnitId(id))
    }

    /// The physical memory the units translate into.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.mem
    }

    /// A unit by id.
    pub fn unit(&self, id: UnitId) -> Option<&Unit> {
        self.units.get(usize::from(id.0))
    }

    /// Every unit with its id.
    pub fn units(&self) -> impl Iterator<Item = (UnitId, &Unit)> {
        self.units
            .iter()
            .enumerate()
            .map(|(i, u)| (UnitId(i as u16), u))
    }

    /// The number of units.
    pub fn len(&self) -> usize {
        self.units.len()
    }

    /// Whether there is no unit.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Puts `sid` in `unit`'s scope. A device already in another unit's
    /// scope is refused; assigning it to its own unit again is a no-op.
    pub fn assign(&self, sid: SourceId, unit: UnitId) -> Result<(), HwError> {
        if self.unit(unit).is_none() {
            return Err(HwError::UnknownUnit(unit));
        }
        let mut scope = self.scope.write().unwrap_or_else(|e| e.into_inner());
        match scope.get(&sid) {
            Some(&u) if u != unit => Err(HwError::DeviceInOtherUnit { sid, unit: u }),
            _ => {
                scope.insert(sid, unit);
                Ok(())
            }
        }
    }

    /// Takes `sid` out of its unit's scope, detaching it there first.
    pub fn unassign(&self, sid: SourceId) -> Result<(), HwError> {
        let (_, unit) = self
            .unit_of(sid)
            .ok_or(HwError::DeviceNotAssigned { sid })?;
        if unit.context(sid).is_some() {
            unit.detach(sid)?;
        }
        self.scope
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&sid);
        Ok(())
    }

    /// The unit `sid` belongs to.
    pub fn unit_of(&self, sid: SourceId) -> Option<(UnitId, &Unit)> {
        let id = *self
            .scope
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&sid)?;
        Some((id, self.unit(id)?))
    }

    /// Makes `owner` (a DMA domain's id) the owner of `sid`; refused with
    /// [`HwError::DeviceOwned`] while another owner holds it.
    pub(crate) fn claim(&self, sid: SourceId, owner: u64) -> Result<(), HwError> {
        let mut owners = crate::sync::lock_std(&self.owners);
        match owners.get(&sid) {
            Some(&o) if o != owner => Err(HwError::DeviceOwned { sid }),
            _ => {
                owners.insert(sid, owner);
                Ok(())
            }
        }
    }

    /// Gives `sid` up if `owner` holds it.
    pub(crate) fn release(&self, sid: SourceId, owner: u64) {
        let mut owners = crate::sync::lock_std(&self.owners);
        if owners.get(&sid) == Some(&owner) {
            owners.remove(&sid);
        }
    }

    /// Attaches `sid` in its unit (see [`Unit::attach`]); returns the unit.
    pub fn attach(&self, sid: SourceId, ctx: ContextEntry) -> Result<UnitId, HwError> {
        let (id, unit) = self
            .unit_of(sid)
            .ok_or(HwError::DeviceNotAssigned { sid })?;
        unit.attach(sid, ctx)?;
        Ok(id)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::hw::Access;

    #[test]
    fn a_device_belongs_to_one_unit() {
        let mut sys = System::new(Arc::new(PhysMemory::new(16 << 20).unwrap()));
        let a = sys.add_unit(UnitConfig::default()).unwrap();
        let b = sys.add_unit(UnitConfig::default()).unwrap();
        assert_eq!(sys.len(), 2);
        let dev = SourceId::new(0, 3, 0).unwrap();
        assert_eq!(
            sys.attach(dev, ContextEntry::PassThrough),
            Err(HwError::DeviceNotAssigned { sid: dev })
        );
        sys.assign(dev, a).unwrap();
        sys.assign(dev, a).unwrap();
        assert_eq!(
            sys.assign(dev, b),
            Err(HwError::DeviceInOtherUnit { sid: dev, unit: a })
        );
        assert_eq!(
            sys.assign(dev, UnitId(9)),
            Err(HwError::UnknownUnit(UnitId(9)))
        );
        assert_eq!(sys.attach(dev, ContextEntry::PassThrough), Ok(a));
        let (id, unit) = sys.unit_of(dev).unwrap();
        assert_eq!(id, a);
        let mut t = unit.translator().unwrap();
        assert!(t.translate(dev, 0x1000, 8, Access::Read).is_ok());
        // The other unit does not know the device.
        let mut tb = sys.unit(b).unwrap().translator().unwrap();
        assert_eq!(
            tb.translate(dev, 0x1000, 8, Access::Read),
            Err(crate::hw::TranslateError::NoContext { sid: dev })
        );
        drop(t);
        sys.unassign(dev).unwrap();
        assert!(sys.unit_of(dev).is_none());
        assert_eq!(sys.unit(a).unwrap().context(dev), None);
        sys.assign(dev, b).unwrap();
        assert_eq!(sys.units().count(), 2);
    }
}
