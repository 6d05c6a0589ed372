//! Every driver brings its device up through one path: a queue that
//! cannot be set up fails the device (`FAILED` written, §3.1.1) and the
//! probe returns the typed error, for virtio-net as for virtio-blk and the
//! virtio-iommu.

use std::sync::Arc;

use softiommu::dma::{DmaError, DmaPolicy};
use softiommu::hw::{SourceId, System, UnitConfig};
use softiommu::mem::{MemError, PhysMemory};
use softiommu_virtio::blk::{BlkDriverConfig, BlkDriverError, BlkHost, BlkHostConfig};
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::net::{wire, DriverError, NetDriverConfig, WireConfig};
use softiommu_virtio::spec::status;
use softiommu_virtio::viommu::{
    ViommuConfig, ViommuDevice, ViommuDriver, ViommuDriverConfig, ViommuDriverError,
};

/// Takes every free frame of `mem`, so the next allocation fails; returns
/// them (in order of size) to give back.
fn exhaust(mem: &PhysMemory) -> Vec<(u64, u32)> {
    let mut held = Vec::new();
    for order in (0..=10).rev() {
        while let Ok(p) = mem.alloc_frames(order) {
            held.push((p, order));
        }
    }
    held
}

fn give_back(mem: &PhysMemory, held: Vec<(u64, u32)>) {
    for (p, order) in held {
        mem.free_frames(p, order).unwrap();
    }
}

#[test]
fn a_net_queue_that_cannot_be_set_up_fails_the_device() {
    let (pa, _pb, _) = wire(WireConfig::default());
    let host = Host::new(
        &HostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 32 << 20,
            bounce_bytes: 1 << 20,
            ..HostConfig::default()
        },
        pa,
    )
    .unwrap();
    let held = exhaust(&host.mem);
    let err = host.driver(NetDriverConfig::default()).unwrap_err();
    assert!(
        matches!(
            err,
            DriverError::Dma(DmaError::Mem(MemError::OutOfFrames { .. }))
        ),
        "{err:?}"
    );
    failed_before_driver_ok(host.device.transport().status());
    // The device comes up again once memory is back.
    give_back(&host.mem, held);
    let d = host.driver(NetDriverConfig::default()).unwrap();
    assert_eq!(d.transport().status() & status::FAILED, 0);
}

/// A bring-up that failed after FEATURES_OK: FAILED set, DRIVER_OK not,
/// and the bits set before the failure kept (§2.1.2: the driver never
/// clears a status bit).
fn failed_before_driver_ok(st: u32) {
    assert_ne!(st & status::FAILED, 0, "status {st:#x}");
    assert_eq!(st & status::DRIVER_OK, 0, "status {st:#x}");
    let kept = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    assert_eq!(st & kept, kept, "status {st:#x}");
}

/// RAM frames allocated now (the IOMMU reserve's page tables aside).
fn ram_allocated(mem: &PhysMemory) -> u64 {
    mem.frame_stats().allocated_frames - mem.iommu_frame_stats().allocated_frames
}

/// Memory given back one frame at a time after exhausting it: each probe
/// fails at a later step (the receive ring, its buffers, the transmit
/// ring, its buffers — after the receive queue was set up) until one
/// succeeds, and every failed one gives back every frame it took.
/// (Before: a failure after the receive ring's allocation kept it, and a
/// failure of the transmit queue kept the receive queue's ring and
/// buffers.)
#[test]
fn a_net_probe_that_fails_midway_gives_back_every_frame() {
    let (pa, _pb, _) = wire(WireConfig::default());
    let host = Host::new(
        &HostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 32 << 20,
            bounce_bytes: 1 << 20,
            ..HostConfig::default()
        },
        pa,
    )
    .unwrap();
    let cfg = NetDriverConfig {
        queue_size: 16,
        ..NetDriverConfig::default()
    };
    // Single frames, in address order: given back in that order, they
    // merge into ever larger free blocks.
    let mut held = Vec::new();
    while let Ok(p) = host.mem.alloc_frames(0) {
        held.push(p);
    }
    held.sort_unstable();
    let mut failures = 0;
    let d = loop {
        let Some(p) = held.first().copied() else {
            panic!("the probe never succeeded");
        };
        host.mem.free_frames(p, 0).unwrap();
        held.remove(0);
        let before = ram_allocated(&host.mem);
        match host.driver(cfg) {
            Ok(d) => break d,
            Err(err) => {
                assert!(
                    matches!(
                        err,
                        DriverError::Dma(DmaError::Mem(MemError::OutOfFrames { .. }))
                            | DriverError::Memory(MemError::OutOfFrames { .. })
                    ),
                    "{err:?}"
                );
                assert_eq!(
                    ram_allocated(&host.mem),
                    before,
                    "after {failures} failures: {err:?}"
                );
                let st = host.device.transport().status();
                assert_ne!(st & status::FAILED, 0, "status {st:#x}");
                failures += 1;
            }
        }
    };
    // At least: no ring, a ring without buffers, a receive queue without a
    // transmit ring, and one without transmit buffers.
    assert!(failures >= 4, "{failures}");
    assert_eq!(d.transport().status() & status::FAILED, 0);
    drop(d);
    for p in held {
        host.mem.free_frames(p, 0).unwrap();
    }
}

#[test]
fn a_blk_queue_that_cannot_be_set_up_fails_the_device() {
    let host = BlkHost::new(&BlkHostConfig {
        policy: DmaPolicy::Strict,
        mem_bytes: 32 << 20,
        bounce_bytes: 1 << 20,
        ..BlkHostConfig::default()
    })
    .unwrap();
    let held = exhaust(&host.mem);
    let err = host.driver(BlkDriverConfig::default()).unwrap_err();
    assert!(
        matches!(
            err,
            BlkDriverError::Dma(DmaError::Mem(MemError::OutOfFrames { .. }))
        ),
        "{err:?}"
    );
    failed_before_driver_ok(host.device.transport().status());
    give_back(&host.mem, held);
    let d = host.driver(BlkDriverConfig::default()).unwrap();
    assert_eq!(d.transport().status() & status::FAILED, 0);
}

#[test]
fn a_viommu_queue_that_cannot_be_set_up_fails_the_device() {
    let mem = Arc::new(PhysMemory::new(32 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).unwrap();
    let sid = SourceId(0x0008);
    sys.assign(sid, unit).unwrap();
    let dev = ViommuDevice::spawn(
        ViommuConfig {
            endpoints: vec![sid],
            ..ViommuConfig::default()
        },
        Arc::new(sys),
        unit,
    )
    .unwrap();
    let held = exhaust(&mem);
    let err = ViommuDriver::probe(
        dev.transport().clone(),
        mem.clone(),
        ViommuDriverConfig::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, ViommuDriverError::Memory(MemError::OutOfFrames { .. })),
        "{err:?}"
    );
    failed_before_driver_ok(dev.transport().status());
    give_back(&mem, held);
    let d =
        ViommuDriver::probe(dev.transport().clone(), mem, ViommuDriverConfig::default()).unwrap();
    assert_eq!(d.transport().status() & status::FAILED, 0);
}
