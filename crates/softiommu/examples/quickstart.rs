//! softiommu in one screen: a NIC behind an emulated IOMMU unit; the driver
//! maps a buffer (deferred invalidation), the device reads it through the
//! unit, the unmap revokes it, and the device's next access is a recorded
//! fault.
//!
//! Run with `cargo run -p softiommu --example quickstart`.

use softiommu::{
    AccessError, DmaAccessor, DmaAttrs, DmaDirection, DmaPolicy, Platform, SourceId, TranslateError,
};

fn main() -> Result<(), softiommu::Error> {
    // 64 MiB of physical memory, one unit, a NIC at PCI 01:00.0, and a DMA
    // domain that batches its invalidations (Linux's "lazy" mode).
    let nic = SourceId::new(1, 0, 0).unwrap_or_default();
    let p = Platform::builder()
        .memory(64 << 20)
        .policy(DmaPolicy::Deferred)
        .device(nic)
        .build()?;
    let dev = &p.devices[0];

    // The driver: a buffer in physical memory, mapped for the device.
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0)?;
    p.mem.write(buf, b"hello, device")?;
    let iova = cpu.map(dev, buf, 13, DmaDirection::ToDevice)?;
    println!("mapped physical {buf:#x} at IOVA {iova:#x}");

    // The device (on its own thread in a VMM): ordered DMA through the unit.
    let mut dma = DmaAccessor::for_device(dev)?;
    let mut got = [0u8; 13];
    dma.read(iova, &mut got, DmaAttrs::ORDERED)?;
    println!("the device read {:?}", String::from_utf8_lossy(&got));

    // Mapped to the device only: a write is refused, and logged.
    let denied = dma.write(iova, b"x", DmaAttrs::ORDERED);
    assert!(matches!(
        denied,
        Err(AccessError::Translate(
            TranslateError::PermissionDenied { .. }
        ))
    ));

    // Unmap. Deferred: the IOVA stays reachable until this CPU's queue is
    // flushed (at 256 entries or after 10 ms, or now).
    cpu.unmap(dev, iova, 13, DmaDirection::ToDevice)?;
    cpu.flush_own()?;
    let gone = dma.read(iova, &mut got, DmaAttrs::ORDERED);
    assert!(matches!(
        gone,
        Err(AccessError::Translate(TranslateError::NotPresent { .. }))
    ));

    let faults = p
        .unit(0)
        .map(|u| u.faults().drain().records)
        .unwrap_or_default();
    for f in &faults {
        println!(
            "fault: {} {} at {:#x}: {:?}",
            f.sid, f.access, f.iova, f.reason
        );
    }
    println!(
        "stale window of the deferred policy: {:?} at most",
        p.domain.stale_window().max
    );
    Ok(())
}
