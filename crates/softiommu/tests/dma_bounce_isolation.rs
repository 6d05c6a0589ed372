//! The bounce policy's promise (and untrusted devices' under strict and
//! deferred): the device reaches only the pages of its live mappings, and
//! in them only the caller's bytes and zeroes. After an unmap returns the
//! device faults at the address, its late writes never land in another
//! caller's buffer, a small mapping's padding reads zero, a device never
//! reaches another device's live slot, and the DMA address keeps the
//! buffer's offset within its page.

use softiommu::{
    AccessError, DeviceSpec, DmaAccessor, DmaAttrs, DmaDirection as D, DmaPolicy, Platform,
    SourceId, TranslateError, PAGE_SIZE,
};

const NIC: SourceId = SourceId(0x0100);
const DISK: SourceId = SourceId(0x0101);
const O: DmaAttrs = DmaAttrs::ORDERED;

/// Two devices on one unit, both `untrusted` or both trusted.
fn plat(policy: DmaPolicy, untrusted: bool) -> Platform {
    let spec = |sid| DeviceSpec {
        sid,
        unit: 0,
        mask: u64::MAX,
        untrusted,
    };
    Platform::builder()
        .memory(64 << 20)
        .policy(policy)
        .device_spec(spec(NIC))
        .device_spec(spec(DISK))
        .build()
        .unwrap()
}

/// Every configuration that bounces: the bounce policy, and untrusted
/// devices under strict and deferred.
const BOUNCING: [(DmaPolicy, bool); 3] = [
    (DmaPolicy::Bounce, false),
    (DmaPolicy::Strict, true),
    (DmaPolicy::Deferred, true),
];

fn not_present(r: &Result<(), AccessError>) -> bool {
    matches!(
        r,
        Err(AccessError::Translate(TranslateError::NotPresent { .. }))
    )
}

#[test]
fn a_device_read_after_a_bounce_unmap_faults() {
    for (policy, untrusted) in BOUNCING {
        let p = plat(policy, untrusted);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let mut acc = DmaAccessor::for_device(dev).unwrap();
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        p.mem.write(buf, b"SECRET-KEY-MATERIAL").unwrap();
        let dma = cpu.map(dev, buf, 19, D::ToDevice).unwrap();
        let mut got = [0u8; 19];
        acc.read(dma, &mut got, O).unwrap();
        assert_eq!(&got, b"SECRET-KEY-MATERIAL");
        cpu.unmap(dev, dma, 19, D::ToDevice).unwrap();
        // No flush: a bounce unmap is strict whatever the policy.
        let mut got = [0u8; 19];
        let r = acc.read(dma, &mut got, O);
        assert!(not_present(&r), "{policy} untrusted={untrusted}: {r:?}");
        assert_eq!(got, [0; 19], "{policy}: nothing read");
    }
}

#[test]
fn a_device_write_after_unmap_never_lands_in_the_next_callers_buffer() {
    for (policy, untrusted) in BOUNCING {
        let p = plat(policy, untrusted);
        let mut cpu = p.domain.cpu();
        let (nic, disk) = (&p.devices[0], &p.devices[1]);
        let mut nic_acc = DmaAccessor::for_device(nic).unwrap();
        let a = p.mem.alloc_zeroed_frames(0).unwrap();
        let s = cpu.map(nic, a, 64, D::FromDevice).unwrap();
        cpu.unmap(nic, s, 64, D::FromDevice).unwrap();
        // DISK's receive buffer is mapped next: never in the slot just
        // given back (its pages are the last the lane reuses).
        let b = p.mem.alloc_zeroed_frames(0).unwrap();
        let t = cpu.map(disk, b, 64, D::FromDevice).unwrap();
        assert_ne!(s & !(PAGE_SIZE - 1), t & !(PAGE_SIZE - 1), "{policy}");
        // NIC, unmapped, still writes its old address: a fault.
        let w = nic_acc.write(s, b"INJECTED-BY-NIC-AFTER-UNMAP", O);
        assert!(not_present(&w), "{policy}: {w:?}");
        cpu.unmap(disk, t, 64, D::FromDevice).unwrap();
        let mut got = [0u8; 64];
        p.mem.read(b, &mut got).unwrap();
        assert_eq!(got, [0; 64], "{policy}: no byte of the late write");
    }
}

#[test]
fn a_small_bounce_mappings_padding_reads_zero() {
    for (policy, untrusted) in BOUNCING {
        let p = plat(policy, untrusted);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let mut acc = DmaAccessor::for_device(dev).unwrap();
        // Previous users fill every page of the lane (1 MiB: 256 pages),
        // the CPU's bytes and the device's.
        let s = p.mem.alloc_zeroed_frames(0).unwrap();
        p.mem.write(s, &[0x5e; PAGE_SIZE as usize]).unwrap();
        for _ in 0..(1 << 20) / PAGE_SIZE {
            let a = cpu.map(dev, s, PAGE_SIZE, D::Bidirectional).unwrap();
            acc.write(a + 8, &[0x77; 8], O).unwrap();
            cpu.unmap(dev, a, PAGE_SIZE, D::Bidirectional).unwrap();
        }
        // Then an 8-byte buffer at offset 0x100 of its page.
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        p.mem.write(buf + 0x100, b"8 bytes!").unwrap();
        let b = cpu.map(dev, buf + 0x100, 8, D::Bidirectional).unwrap();
        // The device reads the whole page around its 8 bytes: zeroes.
        let mut page = vec![0xffu8; PAGE_SIZE as usize];
        acc.read(b & !(PAGE_SIZE - 1), &mut page, O).unwrap();
        assert_eq!(&page[0x100..0x108], b"8 bytes!");
        let stale = page
            .iter()
            .enumerate()
            .filter(|&(i, &x)| !(0x100..0x108).contains(&i) && x != 0)
            .count();
        assert_eq!(stale, 0, "{policy}: stale bytes in the padding");
        // And not a byte past the page.
        let r = acc.read(b - 0x100 + PAGE_SIZE, &mut [0u8; 1], O);
        assert!(not_present(&r), "{policy}: {r:?}");
        cpu.unmap(dev, b, 8, D::Bidirectional).unwrap();
    }
}

#[test]
fn a_device_cannot_reach_another_devices_live_slot() {
    for (policy, untrusted) in BOUNCING {
        let p = plat(policy, untrusted);
        let mut cpu = p.domain.cpu();
        let (nic, disk) = (&p.devices[0], &p.devices[1]);
        let mut acc = DmaAccessor::for_device(nic).unwrap();
        let mine = p.mem.alloc_zeroed_frames(0).unwrap();
        let theirs = p.mem.alloc_zeroed_frames(0).unwrap();
        p.mem.write(theirs, b"DISK-PRIVATE-DATA").unwrap();
        let a = cpu.map(nic, mine, 64, D::ToDevice).unwrap();
        let b = cpu.map(disk, theirs, 17, D::ToDevice).unwrap();
        // Its own slot's page holds nothing of DISK's; the page past it is
        // not mapped unless it is DISK's own mapping (devices of one
        // domain share its IOVAs, as in Linux), and then it is DISK's
        // buffer's page, never stale data.
        assert_ne!(a & !(PAGE_SIZE - 1), b & !(PAGE_SIZE - 1), "{policy}");
        let mut page = vec![0u8; PAGE_SIZE as usize];
        acc.read(a & !(PAGE_SIZE - 1), &mut page, O).unwrap();
        assert!(
            !page.windows(17).any(|w| w == b"DISK-PRIVATE-DATA"),
            "{policy}: DISK's bytes in NIC's page"
        );
        // Once DISK unmaps, NIC faults there.
        cpu.unmap(disk, b, 17, D::ToDevice).unwrap();
        let mut got = [0u8; 17];
        let r = acc.read(b, &mut got, O);
        assert!(not_present(&r), "{policy}: {r:?}");
        // A slot not live in the pool is never reachable: the pages after
        // NIC's slot hold nothing mapped.
        let r = acc.read((a & !(PAGE_SIZE - 1)) + PAGE_SIZE, &mut got, O);
        assert!(not_present(&r), "{policy}: {r:?}");
        cpu.unmap(nic, a, 64, D::ToDevice).unwrap();
    }
}

#[test]
fn a_from_device_slot_of_another_mapping_is_not_written_through_mine() {
    for (policy, untrusted) in BOUNCING {
        let p = plat(policy, untrusted);
        let mut cpu = p.domain.cpu();
        let (nic, disk) = (&p.devices[0], &p.devices[1]);
        let mut acc = DmaAccessor::for_device(nic).unwrap();
        let nbuf = p.mem.alloc_zeroed_frames(0).unwrap();
        let dbuf = p.mem.alloc_zeroed_frames(0).unwrap();
        p.mem.write(dbuf + 0x11, &[0x11; 64]).unwrap();
        let a = cpu.map(nic, nbuf, 64, D::FromDevice).unwrap();
        let b = cpu.map(disk, dbuf + 0x11, 64, D::FromDevice).unwrap();
        // NIC writes past its own 64 bytes, to the end of its page, and
        // one byte beyond: the page is its own, the byte beyond is not.
        acc.write(a + 64, &[0xee; (PAGE_SIZE - 64) as usize], O)
            .unwrap();
        let r = acc.write(a - (a % PAGE_SIZE) + PAGE_SIZE, &[0xee], O);
        if a - (a % PAGE_SIZE) + PAGE_SIZE != b - (b % PAGE_SIZE) {
            assert!(not_present(&r), "{policy}: {r:?}");
        }
        cpu.unmap(disk, b, 64, D::FromDevice).unwrap();
        cpu.unmap(nic, a, 64, D::FromDevice).unwrap();
        let mut got = [0u8; 64];
        p.mem.read(dbuf + 0x11, &mut got).unwrap();
        assert_eq!(got, [0x11; 64], "{policy}: DISK's buffer as it was");
    }
}

#[test]
fn a_bounce_dma_address_keeps_the_buffers_page_offset() {
    for (policy, untrusted) in BOUNCING {
        let p = plat(policy, untrusted);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let mut acc = DmaAccessor::for_device(dev).unwrap();
        let buf = p.mem.alloc_zeroed_frames(1).unwrap();
        for off in [0u64, 0x40, 0x123, 0x7ff, 0xfff] {
            p.mem.write(buf + off, b"xy").unwrap();
            for dir in [D::ToDevice, D::FromDevice, D::Bidirectional] {
                let dma = cpu.map(dev, buf + off, 2, dir).unwrap();
                assert_eq!(dma % PAGE_SIZE, off, "{policy} {dir:?}");
                if dir != D::FromDevice {
                    // Both bytes reachable, across the page boundary at 0xfff.
                    let mut got = [0u8; 2];
                    acc.read(dma, &mut got, O).unwrap();
                    assert_eq!(&got, b"xy", "{policy} {dir:?} {off:#x}");
                }
                cpu.unmap(dev, dma, 2, dir).unwrap();
            }
        }
    }
}

#[test]
fn a_sync_for_device_of_a_from_device_bounce_keeps_what_the_device_wrote() {
    for (policy, untrusted) in BOUNCING {
        let p = plat(policy, untrusted);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let mut acc = DmaAccessor::for_device(dev).unwrap();
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        let dma = cpu.map(dev, buf, 256, D::FromDevice).unwrap();
        acc.write(dma, &[0xab; 256], O).unwrap();
        // Linux's swiotlb copies toward the device only for ToDevice and
        // Bidirectional: here a checked no-op.
        cpu.sync_for_device(dma, 256).unwrap();
        cpu.unmap(dev, dma, 256, D::FromDevice).unwrap();
        let mut got = [0u8; 256];
        p.mem.read(buf, &mut got).unwrap();
        assert_eq!(got, [0xab; 256], "{policy}: the device's data kept");
    }
}

#[test]
fn a_sync_for_cpu_of_a_to_device_bounce_leaves_the_cpus_buffer() {
    for (policy, untrusted) in BOUNCING {
        let p = plat(policy, untrusted);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        p.mem.write(buf, b"AAAA").unwrap();
        let dma = cpu.map(dev, buf, 4, D::ToDevice).unwrap();
        cpu.sync_for_cpu(dma, 4).unwrap();
        p.mem.write(buf, b"BBBB").unwrap();
        cpu.sync_for_cpu(dma, 4).unwrap();
        let mut got = [0u8; 4];
        p.mem.read(buf, &mut got).unwrap();
        assert_eq!(&got, b"BBBB", "{policy}: not overwritten from the slot");
        // A ToDevice sync for the device still copies the CPU's update.
        cpu.sync_for_device(dma, 4).unwrap();
        let mut acc = DmaAccessor::for_device(dev).unwrap();
        acc.read(dma, &mut got, O).unwrap();
        assert_eq!(&got, b"BBBB", "{policy}");
        // Still checked: past the end is refused.
        assert!(matches!(
            cpu.sync_for_cpu(dma, 5),
            Err(softiommu::DmaError::WrongLength { .. })
        ));
        cpu.unmap(dev, dma, 4, D::ToDevice).unwrap();
    }
}

#[test]
fn an_untrusted_device_is_never_in_pass_through() {
    // Attached to a pass-through domain: refused, the device not claimed.
    let r = Platform::builder()
        .memory(64 << 20)
        .policy(DmaPolicy::Passthrough)
        .device_spec(DeviceSpec {
            sid: NIC,
            unit: 0,
            mask: u64::MAX,
            untrusted: true,
        })
        .build();
    assert!(
        matches!(
            r,
            Err(softiommu::Error::Dma(
                softiommu::DmaError::UntrustedPassthrough { .. }
            ))
        ),
        "{r:?}"
    );
    // A translating domain with untrusted devices attached: no switch to
    // pass-through, even with nothing live; the policy stays.
    let p = plat(DmaPolicy::Strict, true);
    assert!(matches!(
        p.domain.set_policy(DmaPolicy::Passthrough),
        Err(softiommu::DmaError::UntrustedPassthrough { .. })
    ));
    assert_eq!(p.domain.policy(), DmaPolicy::Strict);
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let dma = cpu.map(&p.devices[0], buf, 8, D::ToDevice).unwrap();
    assert_ne!(dma, buf, "still bounced");
    cpu.unmap(&p.devices[0], dma, 8, D::ToDevice).unwrap();
    // Once they are detached, the switch goes through.
    for d in &p.devices {
        p.domain.detach(d).unwrap();
    }
    assert_eq!(p.domain.set_policy(DmaPolicy::Passthrough), Ok(()));
    // And then an untrusted attach is refused, the device left free.
    assert!(matches!(
        p.domain.attach(NIC, u64::MAX, true),
        Err(softiommu::DmaError::UntrustedPassthrough { .. })
    ));
    assert!(p.domain.attach(NIC, u64::MAX, false).is_ok());
}

/// Two `unmap_sg` calls of one bounced scatter list racing (caller
/// misuse): the list is all or nothing. One wins and unmaps every entry;
/// the other is refused — never a list half unmapped by either. (A single
/// `unmap` of an entry is refused outright: the slot's record keeps its
/// kind, `dma_contract::in_bounce_an_unmap_never_takes_a_mapping_of_the_other_kind`.)
#[test]
fn two_racing_unmap_sg_of_one_bounced_list_are_all_or_nothing() {
    use softiommu::dma::{SgEntry, SgMapping};
    use std::sync::mpsc::channel;
    use std::sync::{Arc, Barrier};
    let p = Arc::new(plat(DmaPolicy::Bounce, false));
    let f0 = p.mem.alloc_zeroed_frames(0).unwrap();
    let f1 = p.mem.alloc_zeroed_frames(0).unwrap();
    let sg = [
        SgEntry { phys: f0, len: 512 },
        SgEntry { phys: f1, len: 300 },
    ];
    let bar = Arc::new(Barrier::new(2));
    let (tx, rx) = channel::<(SgMapping, [u64; 2])>();
    let (txr, rxr) = channel::<bool>();
    let h = {
        let (p, bar) = (p.clone(), bar.clone());
        std::thread::spawn(move || {
            let mut cpu = p.domain.cpu();
            while let Ok((m, out)) = rx.recv() {
                bar.wait();
                let ok = cpu
                    .unmap_sg(&p.devices[0], &m, &sg, &out, D::ToDevice)
                    .is_ok();
                txr.send(ok).unwrap();
            }
        })
    };
    let mut cpu = p.domain.cpu();
    let dev = &p.devices[0];
    let (mut mine, mut theirs) = (0, 0);
    for _ in 0..3000 {
        let mut out = [0u64; 2];
        let m = cpu.map_sg(dev, &sg, D::ToDevice, &mut out).unwrap();
        tx.send((m, out)).unwrap();
        bar.wait();
        let r = cpu.unmap_sg(dev, &m, &sg, &out, D::ToDevice);
        let other = rxr.recv().unwrap();
        match (r, other) {
            (Ok(()), false) => mine += 1,
            (Err(softiommu::DmaError::NotMapped { .. }), true) => theirs += 1,
            (r, other) => panic!("unmap_sg {r:?}, the other's ok: {other}"),
        }
        // Whoever won, nothing of the list is left.
        assert_eq!(p.domain.stats().live(), 0);
    }
    drop(tx);
    h.join().unwrap();
    assert_eq!(mine + theirs, 3000);
}

/// Devices of one domain share its IOVAs (as in Linux, where an untrusted
/// device gets a group, and so a domain, of its own): a device never
/// reaches a live slot of a device in another domain, at the slot's own
/// address or anywhere else, and the bytes it reaches in its own domain
/// are its own mappings' (checked above). Each domain has its own pools.
#[test]
fn a_device_never_reaches_a_live_slot_of_another_domains_device() {
    use softiommu::{DmaDomain, DmaDomainConfig};
    let p = Platform::builder()
        .memory(64 << 20)
        .policy(DmaPolicy::Bounce)
        .device_spec(DeviceSpec {
            sid: NIC,
            unit: 0,
            mask: u64::MAX,
            untrusted: true,
        })
        .build()
        .unwrap();
    let (unit, _) = p.system.units().next().unwrap();
    p.system.assign(DISK, unit).unwrap();
    let other = DmaDomain::new(
        p.system.clone(),
        DmaDomainConfig {
            did: 2,
            policy: DmaPolicy::Bounce,
            ..Default::default()
        },
    )
    .unwrap();
    let disk = other.attach(DISK, u64::MAX, true).unwrap();
    let nic = &p.devices[0];
    let mut nic_acc = DmaAccessor::for_device(nic).unwrap();
    let (mut cpu_a, mut cpu_b) = (p.domain.cpu(), other.cpu());
    let theirs = p.mem.alloc_zeroed_frames(0).unwrap();
    p.mem.write(theirs, b"DISK-PRIVATE-DATA").unwrap();
    let b = cpu_b.map(&disk, theirs, 17, D::Bidirectional).unwrap();
    let mine = p.mem.alloc_zeroed_frames(0).unwrap();
    // NIC's own live slot elsewhere (its domain's pools may sit at the
    // same IOVAs as DISK's: its own slot must not be the one probed).
    let a = cpu_a.map(nic, mine, 64, D::ToDevice).unwrap();
    assert_ne!(a & !(PAGE_SIZE - 1), b & !(PAGE_SIZE - 1));
    let mut got = [0u8; 17];
    let r = nic_acc.read(b, &mut got, O);
    assert!(not_present(&r), "{r:?}");
    let r = nic_acc.write(b, b"forged", O);
    assert!(not_present(&r), "{r:?}");
    assert_eq!(got, [0; 17]);
    cpu_b.unmap(&disk, b, 17, D::Bidirectional).unwrap();
    p.mem.read(theirs, &mut got).unwrap();
    assert_eq!(&got, b"DISK-PRIVATE-DATA");
    cpu_a.unmap(nic, a, 64, D::ToDevice).unwrap();
}
