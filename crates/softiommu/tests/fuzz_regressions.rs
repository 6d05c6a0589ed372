//! Inputs the `fuzz/` targets stopped on, replayed as the same API calls
//! under plain `cargo test`. Each names its target and what the stop
//! turned out to be; the contract it pins is asserted exactly.

use softiommu::{
    DeviceSpec, DmaAccessor, DmaAttrs, DmaDirection, DmaError, DmaPolicy, Platform, SourceId,
    PAGE_SIZE,
};

fn platform(policy: DmaPolicy) -> Platform {
    let spec = |bus| DeviceSpec {
        sid: SourceId::new(bus, 0, 0).unwrap_or_default(),
        unit: 0,
        mask: u64::MAX,
        untrusted: false,
    };
    Platform::builder()
        .memory(32 << 20)
        .policy(policy)
        .device_spec(spec(1))
        .device_spec(spec(2))
        .build()
        .unwrap()
}

/// `dma_api_model`, `crash-ff4944a4…`: a coherent buffer of 27,499 bytes,
/// then a device write far past it succeeded under strict. The write
/// landed in the domain's bounce pool, which is mapped when a device
/// attaches (whatever the policy) and lives in IOMMU frames; and the
/// coherent buffer itself is mapped in a whole power-of-two run of pages.
/// Neither is a hole: the model learnt both.
#[test]
fn coherent_buffers_are_mapped_in_whole_runs_and_the_bounce_pool_from_attach() {
    let p = platform(DmaPolicy::Strict);
    let dev = &p.devices[1];
    let mut cpu = p.domain.cpu();
    let mut acc = DmaAccessor::for_device(dev).unwrap();
    let (_, dma) = cpu.alloc_coherent(dev, 27_499).unwrap();
    // 7 pages asked for, 8 mapped: the last page is the buffer's too.
    acc.write(dma + 7 * PAGE_SIZE + 100, &[1], DmaAttrs::ORDERED)
        .unwrap();
    // The replayed probe: 27,499 + 107 pages + 50,442 bytes past the start.
    let at = dma + 27_499 + 107 * PAGE_SIZE + 50_442;
    let r = acc.write(at, &[1], DmaAttrs::ORDERED);
    if r.is_ok() {
        let t = p.domain.iova_to_phys(at).unwrap().unwrap();
        assert!(
            p.mem.is_iommu_frame(t.leaf_phys()),
            "a device write at {at:#x} reached {:#x}, not a bounce pool frame",
            t.leaf_phys()
        );
    }
    // Below the run (IOVAs are handed out downwards): a fault.
    let r = acc.write(dma - 1, &[1], DmaAttrs::ORDERED);
    assert!(
        matches!(r, Err(softiommu::AccessError::Translate(_))),
        "{r:?}"
    );
}

/// `dma_api_model`, `crash-b59a1960…`: an unmap at another offset in the
/// same first page, with the same length. Unmaps are exact, as DMA-API
/// debug checks them: another start is refused (`NotMapped`) with nothing
/// changed; the mapping's own address and length unmap exactly its pages,
/// and a second unmap is refused.
#[test]
fn an_unmap_naming_the_same_pages_at_another_start_is_refused() {
    let p = platform(DmaPolicy::Strict);
    let dev = &p.devices[1];
    let mut cpu = p.domain.cpu();
    let mut acc = DmaAccessor::for_device(dev).unwrap();
    let buf = p.mem.alloc_zeroed_frames(4).unwrap();
    let (len, dir) = (58_634, DmaDirection::Bidirectional);
    let iova = cpu.map(dev, buf + 67, len, dir).unwrap();
    assert_eq!(iova % PAGE_SIZE, 67);
    acc.read(iova, &mut [0; 8], DmaAttrs::ORDERED).unwrap();
    // Another offset in the first page, the same page count: refused,
    // still mapped.
    assert_eq!(
        cpu.unmap(dev, iova + 2560, len, dir),
        Err(DmaError::NotMapped { addr: iova + 2560 })
    );
    acc.read(iova + len - 8, &mut [0; 8], DmaAttrs::ORDERED)
        .unwrap();
    cpu.unmap(dev, iova, len, dir).unwrap();
    for page in 0..(67 + len).div_ceil(PAGE_SIZE) {
        let at = (iova & !(PAGE_SIZE - 1)) + page * PAGE_SIZE;
        assert!(matches!(
            acc.read(at, &mut [0; 1], DmaAttrs::ORDERED),
            Err(softiommu::AccessError::Translate(_))
        ));
    }
    assert!(matches!(
        cpu.unmap(dev, iova, len, dir),
        Err(DmaError::NotMapped { .. })
    ));
    // One page more: the IOVA block is a power-of-two run (16 pages for
    // these 15), so the allocator knows no better, but the table finds the
    // 16th page unmapped. Refused, and nothing changed.
    let iova = cpu.map(dev, buf + 67, len, dir).unwrap();
    let r = cpu.unmap(dev, iova, len + PAGE_SIZE, dir);
    assert!(matches!(r, Err(DmaError::NotMapped { .. })), "{r:?}");
    acc.read(iova + len - 8, &mut [0; 8], DmaAttrs::ORDERED)
        .unwrap();
    cpu.unmap(dev, iova, len, dir).unwrap();
}

/// `dma_api_model`, `crash-a5ab66f7…` (deferred): an unmap built from one
/// mapping's address plus 3 landed in the page of the mapping above it.
/// Unmaps are exact: it names no mapping, so it is refused and both stay.
#[test]
fn an_unmap_at_another_offset_in_a_mappings_page_is_refused() {
    let p = platform(DmaPolicy::Deferred);
    let dev = &p.devices[0];
    let mut cpu = p.domain.cpu();
    let mut acc = DmaAccessor::for_device(dev).unwrap();
    let buf = p.mem.alloc_zeroed_frames(4).unwrap();
    let dir = DmaDirection::Bidirectional;
    let c = cpu.map(dev, buf + 0xfff, 1, dir).unwrap();
    let d = cpu.map(dev, buf + 0xfff, 1, dir).unwrap();
    let off = (c & !(PAGE_SIZE - 1)) + 2;
    assert_eq!(
        cpu.unmap(dev, off, 0xbe, dir),
        Err(DmaError::NotMapped { addr: off })
    );
    p.domain.flush_all().unwrap();
    acc.read(c, &mut [0; 1], DmaAttrs::ORDERED).unwrap();
    acc.read(d, &mut [0; 1], DmaAttrs::ORDERED).unwrap();
    cpu.unmap(dev, c, 1, dir).unwrap();
    cpu.unmap(dev, d, 1, dir).unwrap();
}

/// `dma_api_model`, `crash-32a79558…` (deferred, 2026-11-23): a one-page
/// `map_sg` list of device 0, then `unmap` of an address in its page from
/// device 1 (one domain), was taken; and its twin, found earlier: a
/// streaming unmap naming a coherent buffer's first page. Each left the
/// `SgMapping` or the coherent record to retire whatever block later
/// reused the IOVA. Blocks now carry their kind (`iova::BlockKind`) and an
/// unmap retires only its own kind: refused (`NotMapped`), nothing changed.
#[test]
fn an_unmap_of_one_kind_cannot_take_a_scatter_list_or_a_coherent_block() {
    for policy in [DmaPolicy::Strict, DmaPolicy::Deferred] {
        let p = platform(policy);
        let (d0, d1) = (&p.devices[0], &p.devices[1]);
        let mut cpu = p.domain.cpu();
        let mut acc = DmaAccessor::for_device(d0).unwrap();
        let buf = p.mem.alloc_zeroed_frames(1).unwrap();
        let dir = DmaDirection::ToDevice;
        let sg = [softiommu::SgEntry {
            phys: buf + 0x13f,
            len: 1,
        }];
        let mut out = [0u64; 1];
        let m = cpu.map_sg(d0, &sg, dir, &mut out).unwrap();
        let (ca, cd) = cpu.alloc_coherent(d1, 3 * PAGE_SIZE).unwrap();
        for (dev, at, len) in [
            (d1, out[0] + 0x2d, 0x2bc),
            (d0, out[0], 1),
            (d1, cd, 3 * PAGE_SIZE),
            (d1, cd + 0x22c, 3 * PAGE_SIZE - 0x22c),
        ] {
            let r = cpu.unmap(dev, at, len, dir);
            assert!(
                matches!(r, Err(DmaError::NotMapped { .. })),
                "{policy:?}: unmap of {at:#x}+{len:#x}: {r:?}"
            );
        }
        // A scatter-list unmap aimed at a one-page coherent block (the
        // handle's public address changed): refused too.
        let (pa, pd) = cpu.alloc_coherent(d1, PAGE_SIZE).unwrap();
        let mut forged = m;
        forged.dma = pd;
        let r = cpu.unmap_sg(d1, &forged, &sg, &[pd], dir);
        assert!(
            matches!(r, Err(DmaError::NotMapped { .. })),
            "{policy:?}: {r:?}"
        );
        cpu.free_coherent(d1, pa, pd, PAGE_SIZE).unwrap();
        // Nothing changed: both still reachable, and each goes its own way.
        acc.read(out[0], &mut [0; 1], DmaAttrs::ORDERED).unwrap();
        cpu.unmap_sg(d0, &m, &sg, &out, dir).unwrap();
        cpu.free_coherent(d1, ca, cd, 3 * PAGE_SIZE).unwrap();
        assert_eq!(p.domain.stats().live(), 0);
    }
}

/// `dma_api_model`, `crash-c5075eb5…`: in pass-through, device 1 mapped a
/// byte single and device 0 mapped the same byte as entries of a scatter
/// list; a single unmap of it through device 0 in another direction was
/// answered `WrongDirection` from the list's entry, which a single unmap
/// must not name (and with the list's direction it would have taken the
/// entry). Entries are now recorded as a list's.
#[test]
fn a_pass_through_single_unmap_is_judged_against_single_mappings_only() {
    let p = platform(DmaPolicy::Passthrough);
    let mut cpu = p.domain.cpu();
    let (d0, d1) = (&p.devices[0], &p.devices[1]);
    let f = p.mem.alloc_zeroed_frames(0).unwrap() + PAGE_SIZE - 1;
    cpu.map(d1, f, 1, DmaDirection::Bidirectional).unwrap();
    let sg = [softiommu::dma::SgEntry { phys: f, len: 1 }; 3];
    let mut out = [0u64; 3];
    let m = cpu
        .map_sg(d0, &sg, DmaDirection::FromDevice, &mut out)
        .unwrap();
    let r = cpu.unmap(d0, f, 1, DmaDirection::ToDevice);
    assert!(matches!(r, Err(DmaError::WrongDevice { .. })), "{r:?}");
    let r = cpu.unmap(d0, f, 1, DmaDirection::FromDevice);
    assert!(matches!(r, Err(DmaError::WrongDevice { .. })), "{r:?}");
    cpu.unmap_sg(d0, &m, &sg, &out, DmaDirection::FromDevice)
        .unwrap();
    cpu.unmap(d1, f, 1, DmaDirection::Bidirectional).unwrap();
}

/// `dma_api_model`, `crash-8a221371…` (pass-through): both devices mapped
/// the same 257 bytes to the device, then device 0 unmapped device 1's
/// mapping as bidirectional. The answer depended on which record was
/// searched first: `WrongDirection` from device 0's own mapping, where the
/// model expected `WrongDevice`. The asking device's own mapping now
/// decides (it names the direction it should have asked), whichever
/// device mapped first; only when it has none is the device the reason.
#[test]
fn a_devices_own_mapping_of_the_same_bytes_names_the_direction() {
    for d1_first in [true, false] {
        let p = platform(DmaPolicy::Passthrough);
        let mut cpu = p.domain.cpu();
        let (d0, d1) = (&p.devices[0], &p.devices[1]);
        let f = p.mem.alloc_zeroed_frames(0).unwrap() + 257;
        let order = if d1_first { [d1, d0] } else { [d0, d1] };
        for d in order {
            cpu.map(d, f, 257, DmaDirection::ToDevice).unwrap();
        }
        let r = cpu.unmap(d0, f, 257, DmaDirection::Bidirectional);
        assert!(
            matches!(
                r,
                Err(DmaError::WrongDirection {
                    mapped: DmaDirection::ToDevice,
                    asked: DmaDirection::Bidirectional,
                    ..
                })
            ),
            "{r:?}"
        );
        assert_eq!(p.domain.stats().live(), 2);
        // Device 1 asking in a direction neither device mapped: its own
        // mapping, too, names the direction.
        let r = cpu.unmap(d1, f, 257, DmaDirection::FromDevice);
        assert!(
            matches!(
                r,
                Err(DmaError::WrongDirection {
                    mapped: DmaDirection::ToDevice,
                    asked: DmaDirection::FromDevice,
                    ..
                })
            ),
            "{r:?}"
        );
        cpu.unmap(d0, f, 257, DmaDirection::ToDevice).unwrap();
        // Device 0's mapping gone, device 1's remains: device 0 asking is
        // now refused for the device.
        let r = cpu.unmap(d0, f, 257, DmaDirection::ToDevice);
        assert!(
            matches!(&r, Err(DmaError::WrongDevice { sid }) if *sid == d0.source_id().to_string()),
            "{r:?}"
        );
        cpu.unmap(d1, f, 257, DmaDirection::ToDevice).unwrap();
        assert_eq!(p.domain.stats().live(), 0);
    }
}
