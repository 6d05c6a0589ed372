//! A virtio-iommu rig the viommu tests share: memory, a system with one
//! unit, two endpoints in its scope, the device and its driver.
#![allow(dead_code)]

use std::sync::Arc;

use softiommu::hw::{Access, PhysRanges, SourceId, System, TranslateError, UnitConfig, UnitId};
use softiommu::mem::PhysMemory;
use softiommu_virtio::spec::iommu as s;
use softiommu_virtio::viommu::{
    RawDesc, Status, ViommuConfig, ViommuDevice, ViommuDriver, ViommuDriverConfig,
};

/// Endpoint A: requester 00:01.0.
pub const A: SourceId = SourceId(0x0008);
/// Endpoint B: requester 00:02.0.
pub const B: SourceId = SourceId(0x0010);
/// Their endpoint ids.
pub const EA: u32 = 0x0008;
pub const EB: u32 = 0x0010;
/// Read and write.
pub const RW: u32 = s::MAP_F_READ | s::MAP_F_WRITE;
/// Guest RAM of the rig.
pub const RAM: u64 = 64 << 20;

pub struct Rig {
    pub mem: Arc<PhysMemory>,
    pub system: Arc<System>,
    pub unit: UnitId,
    pub dev: ViommuDevice,
    pub drv: ViommuDriver,
}

pub fn config() -> ViommuConfig {
    ViommuConfig {
        endpoints: vec![A, B],
        ..ViommuConfig::default()
    }
}

pub fn rig() -> Rig {
    rig_with(config(), ViommuDriverConfig::default())
}

pub fn rig_with(cfg: ViommuConfig, dcfg: ViommuDriverConfig) -> Rig {
    let mem = Arc::new(PhysMemory::new(RAM).expect("memory"));
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).expect("unit");
    for sid in [A, B] {
        sys.assign(sid, unit).expect("assign");
    }
    finish(cfg, dcfg, mem, sys, unit)
}

/// Endpoint C: requester 00:03.0, on a second unit (only in [`rig_on`]).
pub const C: SourceId = SourceId(0x0018);

/// [`rig_with`] on a unit made with `ucfg`, and a second (default) unit
/// the device does not use, with endpoint [`C`] in its scope.
pub fn rig_on(cfg: ViommuConfig, dcfg: ViommuDriverConfig, ucfg: UnitConfig) -> Rig {
    let mem = Arc::new(PhysMemory::new(RAM).expect("memory"));
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(ucfg).expect("unit");
    for sid in [A, B] {
        sys.assign(sid, unit).expect("assign");
    }
    let other = sys.add_unit(UnitConfig::default()).expect("unit");
    sys.assign(C, other).expect("assign");
    finish(cfg, dcfg, mem, sys, unit)
}

fn finish(
    cfg: ViommuConfig,
    dcfg: ViommuDriverConfig,
    mem: Arc<PhysMemory>,
    sys: System,
    unit: UnitId,
) -> Rig {
    let system = Arc::new(sys);
    let dev = ViommuDevice::spawn(cfg, system.clone(), unit).expect("device");
    let drv = ViommuDriver::probe(dev.transport().clone(), mem.clone(), dcfg).expect("driver");
    Rig {
        mem,
        system,
        unit,
        dev,
        drv,
    }
}

/// What endpoint `sid` reaches at `iova` through `system`'s `unit` (a
/// device's translation of 8 bytes).
pub fn reach_in(
    system: &System,
    unit: UnitId,
    sid: SourceId,
    iova: u64,
    access: Access,
) -> Result<PhysRanges, TranslateError> {
    let unit = system.unit(unit).expect("unit");
    let mut t = unit.translator().expect("translator");
    t.translate(sid, iova, 8, access)
}

impl Rig {
    /// What endpoint `sid` reaches at `iova` (a device's translation).
    pub fn reach(
        &self,
        sid: SourceId,
        iova: u64,
        access: Access,
    ) -> Result<PhysRanges, TranslateError> {
        reach_in(&self.system, self.unit, sid, iova, access)
    }

    /// A page-aligned physical buffer of `pages` pages in guest RAM.
    pub fn ram(&self, order: u32) -> u64 {
        self.mem.alloc_zeroed_frames(order).expect("frames")
    }

    /// ATTACH that must succeed.
    pub fn attach_ok(&mut self, domain: u32, ep: u32) {
        assert_eq!(self.drv.attach(domain, ep, 0).unwrap(), Some(Status::Ok));
    }

    /// MAP that must succeed.
    pub fn map_ok(&mut self, domain: u32, start: u64, end: u64, phys: u64) {
        assert_eq!(
            self.drv.map(domain, start, end, phys, RW).unwrap(),
            Some(Status::Ok)
        );
    }

    /// The mappings of `domain` as `(start, end)`.
    pub fn ranges(&self, domain: u32) -> Vec<(u64, u64)> {
        self.dev
            .mappings(domain)
            .unwrap_or_default()
            .iter()
            .map(|m| (m.start, m.end))
            .collect()
    }
}

/// Sends a chain of two descriptors made by hand: `readable_len` bytes at
/// `readable` (a request already placed there, or memory the device must
/// not read) and a 4-byte writable tail at `tail`; returns the used length.
pub fn two_descs(r: &mut Rig, readable: u64, readable_len: u32, tail: u64) -> u32 {
    r.drv
        .raw(&[
            RawDesc {
                addr: readable,
                len: readable_len,
                writable: false,
            },
            RawDesc {
                addr: tail,
                len: 4,
                writable: true,
            },
        ])
        .unwrap()
}

/// Sends `readable` (one descriptor) and writable descriptors of
/// `wlens` bytes, pre-filled with 0xaa; returns the used length and the
/// writable bytes as the device left them.
pub fn raw(r: &mut Rig, readable: &[u8], wlens: &[u32]) -> (u32, Vec<u8>) {
    let base = r.drv.scratch();
    let wbase = base + 0x800;
    r.mem.write(base, readable).unwrap();
    let total: u32 = wlens.iter().sum();
    r.mem.fill(wbase, u64::from(total), 0xaa).unwrap();
    let mut descs = vec![RawDesc {
        addr: base,
        len: readable.len() as u32,
        writable: false,
    }];
    let mut at = wbase;
    for &l in wlens {
        descs.push(RawDesc {
            addr: at,
            len: l,
            writable: true,
        });
        at += u64::from(l);
    }
    let used = r.drv.raw(&descs).unwrap();
    let mut w = vec![0u8; total as usize];
    r.mem.read(wbase, &mut w).unwrap();
    (used, w)
}

/// Waits (bounded) for `DEVICE_NEEDS_RESET`: the device reports it right
/// after it returned the round's chains, which the driver may see first.
pub fn needs_reset(t: &softiommu_virtio::transport::MmioTransport) {
    let t0 = std::time::Instant::now();
    while t.read(softiommu_virtio::spec::reg::STATUS)
        & softiommu_virtio::spec::status::DEVICE_NEEDS_RESET
        == 0
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "no DEVICE_NEEDS_RESET"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A host DMA domain (id 4000, outside the guest's domain range) of the
/// bounce policy with a 64 KiB pool: what a host's untrusted device gets
/// on the same machine as the guest. Attach a device to make its pool.
pub fn host_bounce_domain(system: &Arc<System>) -> Arc<softiommu::dma::DmaDomain> {
    softiommu::dma::DmaDomain::new(
        system.clone(),
        softiommu::dma::DmaDomainConfig {
            did: 4000,
            bounce_bytes: 1 << 16,
            ..Default::default()
        },
    )
    .expect("host bounce domain")
}

/// The first guest RAM frame a bounce pool holds.
pub fn first_pool_frame(mem: &PhysMemory) -> u64 {
    (0..RAM)
        .step_by(4096)
        .find(|&p| mem.check_device_range(p, 4096).is_err())
        .expect("a bounce frame in RAM")
}
