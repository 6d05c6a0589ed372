//! The DMA API's contract as the Linux documentation states it
//! (Documentation/core-api/dma-api.rst) and DMA-API debug checks it: a
//! free or unmap must name exactly what was allocated or mapped (length,
//! device, direction, every scatter-list entry), a refused call changes
//! nothing, and a sync must lie inside a live mapping (it may start at an
//! offset in it) and, when bounced, copies exactly its range.

use softiommu::dma::SgEntry;
use softiommu::{
    DeviceSpec, DmaAccessor, DmaAttrs, DmaDirection, DmaError, DmaPolicy, Platform, SourceId,
};

const NIC: SourceId = SourceId(0x0100);
const DISK: SourceId = SourceId(0x0101);

fn platform(policy: DmaPolicy) -> Platform {
    Platform::builder()
        .memory(64 << 20)
        .policy(policy)
        .device(NIC)
        .device(DISK)
        .build()
        .unwrap()
}

/// A scatter list of two fresh frames: the first `first` bytes long, the
/// second 100 (a short tail entry).
fn two_entries(p: &Platform, first: u64) -> [SgEntry; 2] {
    let frame = || p.mem.alloc_zeroed_frames(0).unwrap();
    [
        SgEntry {
            phys: frame(),
            len: first,
        },
        SgEntry {
            phys: frame(),
            len: 100,
        },
    ]
}

#[test]
fn free_coherent_with_another_length_in_the_same_order_is_refused() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let (phys, dma) = cpu.alloc_coherent(dev, 100).unwrap();
        let r = cpu.free_coherent(dev, phys, dma, 200);
        assert!(
            matches!(r, Err(DmaError::WrongLength { addr, len: 200 }) if addr == dma),
            "{policy}: {r:?}"
        );
        // Nothing changed: the right free still works, once.
        assert_eq!(cpu.free_coherent(dev, phys, dma, 100), Ok(()), "{policy}");
        assert_eq!(p.domain.stats().live(), 0, "{policy}");
    }
}

#[test]
fn unmap_sg_with_another_entry_length_is_refused_and_changes_nothing() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let sg = two_entries(&p, 4096);
        let [SgEntry { phys: a, .. }, SgEntry { phys: b, .. }] = sg;
        let mut out = [0u64; 2];
        let m = cpu
            .map_sg(dev, &sg, DmaDirection::ToDevice, &mut out)
            .unwrap();
        let live = p.domain.stats().live();
        let bad = [
            SgEntry { phys: a, len: 4096 },
            SgEntry { phys: b, len: 300 },
        ];
        let r = cpu.unmap_sg(dev, &m, &bad, &out, DmaDirection::ToDevice);
        assert!(
            matches!(r, Err(DmaError::WrongLength { addr, .. }) if addr == out[0]),
            "{policy}: {r:?}"
        );
        // A shorter first entry, other addresses: refused too.
        let short = [
            SgEntry { phys: a, len: 4000 },
            SgEntry { phys: b, len: 100 },
        ];
        let r = cpu.unmap_sg(dev, &m, &short, &out, DmaDirection::ToDevice);
        assert!(
            matches!(r, Err(DmaError::WrongLength { .. })),
            "{policy}: {r:?}"
        );
        let other = [out[0], out[1] + 8];
        let r = cpu.unmap_sg(dev, &m, &sg, &other, DmaDirection::ToDevice);
        assert!(
            matches!(r, Err(DmaError::NotMapped { .. })),
            "{policy}: {r:?}"
        );
        assert_eq!(p.domain.stats().live(), live, "{policy}: nothing changed");
        assert_eq!(
            cpu.unmap_sg(dev, &m, &sg, &out, DmaDirection::ToDevice),
            Ok(()),
            "{policy}: the right unmap_sg after the refused ones"
        );
        assert_eq!(p.domain.stats().live(), 0, "{policy}: nothing left live");
    }
}

#[test]
fn unmap_sg_by_another_device_or_direction_is_refused() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let a = p.mem.alloc_zeroed_frames(0).unwrap();
        let sg = [SgEntry { phys: a, len: 512 }];
        let mut out = [0u64; 1];
        let m = cpu
            .map_sg(&p.devices[0], &sg, DmaDirection::FromDevice, &mut out)
            .unwrap();
        let r = cpu.unmap_sg(&p.devices[1], &m, &sg, &out, DmaDirection::FromDevice);
        assert!(
            matches!(r, Err(DmaError::WrongDevice { .. })),
            "{policy}: {r:?}"
        );
        let r = cpu.unmap_sg(&p.devices[0], &m, &sg, &out, DmaDirection::ToDevice);
        assert!(
            matches!(
                r,
                Err(DmaError::WrongDirection {
                    mapped: DmaDirection::FromDevice,
                    asked: DmaDirection::ToDevice,
                    ..
                })
            ),
            "{policy}: {r:?}"
        );
        assert_eq!(
            cpu.unmap_sg(&p.devices[0], &m, &sg, &out, DmaDirection::FromDevice),
            Ok(()),
            "{policy}"
        );
        assert_eq!(p.domain.stats().live(), 0, "{policy}");
    }
}

/// A stale `SgMapping` (it is `Copy`) replayed after its list was unmapped
/// and the IOVA handed to another device's list, or to a list of the same
/// device in another direction: the translated `unmap_sg` checks the
/// block's own device and direction, so the live list is not torn down.
#[test]
fn a_stale_unmap_sg_never_tears_down_another_live_list() {
    for policy in [DmaPolicy::Strict, DmaPolicy::Deferred] {
        for other_device in [true, false] {
            let p = platform(policy);
            // No timer flush: this CPU's own flush frees the IOVA into
            // its own cache, where the next list finds it.
            p.domain
                .set_timeout(std::time::Duration::from_secs(60))
                .unwrap();
            let mut cpu = p.domain.cpu();
            let (nic, disk) = (&p.devices[0], &p.devices[1]);
            let (second, dir2) = if other_device {
                (disk, DmaDirection::ToDevice)
            } else {
                (nic, DmaDirection::FromDevice)
            };
            let f = p.mem.alloc_zeroed_frames(0).unwrap();
            let sg = [SgEntry { phys: f, len: 4096 }];
            let mut out1 = [0u64; 1];
            let m1 = cpu
                .map_sg(nic, &sg, DmaDirection::ToDevice, &mut out1)
                .unwrap();
            cpu.unmap_sg(nic, &m1, &sg, &out1, DmaDirection::ToDevice)
                .unwrap();
            cpu.flush_own().unwrap();
            // Lists of the second kind until one reuses the IOVA (under
            // deferred the flush may have freed it into another cache).
            let mut extra = Vec::new();
            let (m2, out2) = loop {
                let mut out2 = [0u64; 1];
                let m2 = cpu.map_sg(second, &sg, dir2, &mut out2).unwrap();
                if out2 == out1 {
                    break (m2, out2);
                }
                assert!(extra.len() < 4096, "{policy}: the IOVA is never reused");
                extra.push((m2, out2));
            };
            for (m, o) in extra {
                cpu.unmap_sg(second, &m, &sg, &o, dir2).unwrap();
            }
            let r = cpu.unmap_sg(nic, &m1, &sg, &out1, DmaDirection::ToDevice);
            if other_device {
                assert!(
                    matches!(r, Err(DmaError::WrongDevice { .. })),
                    "{policy}: {r:?}"
                );
            } else {
                assert!(
                    matches!(
                        r,
                        Err(DmaError::WrongDirection {
                            mapped: DmaDirection::FromDevice,
                            asked: DmaDirection::ToDevice,
                            ..
                        })
                    ),
                    "{policy}: {r:?}"
                );
            }
            // The live list is intact: still translated, and its own
            // unmap succeeds.
            assert!(
                p.domain.iova_to_phys(out2[0]).unwrap().is_some(),
                "{policy}"
            );
            assert_eq!(
                cpu.unmap_sg(second, &m2, &sg, &out2, dir2),
                Ok(()),
                "{policy}"
            );
            assert_eq!(p.domain.stats().live(), 0, "{policy}");
        }
    }
}

/// A stale `SgMapping` replayed without pause over another device's live
/// list at the same IOVA, on another CPU, while that list's owner unmaps
/// it: the replay is refused before it takes anything, so the owner's
/// `unmap_sg` always finds its block (it was refused `NotMapped` when the
/// replay retired the block, compared its tag, and put it back).
#[test]
fn a_stale_unmap_sg_replayed_without_pause_never_refuses_the_owners_unmap() {
    let p = platform(DmaPolicy::Strict);
    let (nic, disk) = (&p.devices[0], &p.devices[1]);
    let f = p.mem.alloc_zeroed_frames(0).unwrap();
    let sg = [SgEntry { phys: f, len: 4096 }];
    let mut cpu = p.domain.cpu();
    for round in 0..200 {
        let mut out1 = [0u64; 1];
        let m1 = cpu
            .map_sg(nic, &sg, DmaDirection::ToDevice, &mut out1)
            .unwrap();
        cpu.unmap_sg(nic, &m1, &sg, &out1, DmaDirection::ToDevice)
            .unwrap();
        // Strict: the block is back in this CPU's cache, the next list
        // gets it.
        let mut out2 = [0u64; 1];
        let m2 = cpu
            .map_sg(disk, &sg, DmaDirection::ToDevice, &mut out2)
            .unwrap();
        assert_eq!(out2, out1, "round {round}: the IOVA is reused");
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        /// Stops the replaying thread however the owner's side ends (a
        /// panic included), so the scope's join never waits forever.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let (stop, started) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|s| {
            let replays = s.spawn(|| {
                let mut other = p.domain.cpu();
                let mut refused_live = 0u32;
                while !stop.load(Relaxed) {
                    let r = other.unmap_sg(nic, &m1, &sg, &out1, DmaDirection::ToDevice);
                    match r {
                        Err(DmaError::WrongDevice { .. }) => refused_live += 1,
                        Err(DmaError::NotMapped { .. }) => {}
                        r => panic!("round {round}: {r:?}"),
                    }
                    started.store(true, Relaxed);
                }
                refused_live
            });
            let _stop = Stop(&stop);
            // The replays have begun against the live list before its
            // owner unmaps it (or the replaying thread ended: a panic there,
            // reported by the join below, not a wait forever here).
            while !started.load(Relaxed) && !replays.is_finished() {
                std::hint::spin_loop();
            }
            let r = cpu.unmap_sg(disk, &m2, &sg, &out2, DmaDirection::ToDevice);
            drop(_stop);
            assert_eq!(r, Ok(()), "round {round}");
            assert!(
                replays.join().unwrap() > 0,
                "round {round}: a replay met the live list"
            );
        });
    }
    assert_eq!(p.domain.stats().live(), 0);
}

#[test]
fn unmap_in_another_direction_is_refused_and_changes_nothing() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        let iova = cpu.map(dev, buf, 100, DmaDirection::ToDevice).unwrap();
        let r = cpu.unmap(dev, iova, 100, DmaDirection::FromDevice);
        assert!(
            matches!(
                r,
                Err(DmaError::WrongDirection {
                    addr,
                    mapped: DmaDirection::ToDevice,
                    asked: DmaDirection::FromDevice,
                }) if addr == iova
            ),
            "{policy}: {r:?}"
        );
        assert_eq!(p.domain.stats().live(), 1, "{policy}");
        assert_eq!(
            cpu.unmap(dev, iova, 100, DmaDirection::ToDevice),
            Ok(()),
            "{policy}"
        );
    }
}

#[test]
fn unmap_through_another_device_of_the_domain_is_refused() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        let iova = cpu
            .map(&p.devices[0], buf, 100, DmaDirection::ToDevice)
            .unwrap();
        let r = cpu.unmap(&p.devices[1], iova, 100, DmaDirection::ToDevice);
        assert!(
            matches!(&r, Err(DmaError::WrongDevice { sid }) if *sid == DISK.to_string()),
            "{policy}: {r:?}"
        );
        assert_eq!(p.domain.stats().live(), 1, "{policy}");
        assert_eq!(
            cpu.unmap(&p.devices[0], iova, 100, DmaDirection::ToDevice),
            Ok(()),
            "{policy}"
        );
    }
}

#[test]
fn a_buffer_mapped_by_two_devices_is_unmapped_by_each_its_own() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        let a = cpu
            .map(&p.devices[0], buf, 64, DmaDirection::ToDevice)
            .unwrap();
        let b = cpu
            .map(&p.devices[1], buf, 64, DmaDirection::FromDevice)
            .unwrap();
        assert_eq!(
            cpu.unmap(&p.devices[1], b, 64, DmaDirection::FromDevice),
            Ok(()),
            "{policy}"
        );
        assert_eq!(
            cpu.unmap(&p.devices[0], a, 64, DmaDirection::ToDevice),
            Ok(()),
            "{policy}"
        );
        assert_eq!(p.domain.stats().live(), 0, "{policy}");
    }
}

#[test]
fn a_partial_bounce_sync_at_an_offset_copies_exactly_its_range() {
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
    let mut cpu = p.domain.cpu();
    let dev = &p.devices[0];
    let mut acc = DmaAccessor::for_device(dev).unwrap();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    // Bidirectional: both syncs copy (a FromDevice mapping's
    // sync_for_device is a no-op, see `tests/dma_bounce_isolation.rs`).
    let iova = cpu.map(dev, buf, 256, DmaDirection::Bidirectional).unwrap();
    acc.write(iova + 120, &[0xab; 32], DmaAttrs::ORDERED)
        .unwrap();
    assert_eq!(cpu.sync_for_cpu(iova + 128, 16), Ok(()));
    let mut got = [0u8; 32];
    p.mem.read(buf + 120, &mut got).unwrap();
    let mut want = [0u8; 32];
    want[8..24].fill(0xab);
    assert_eq!(got, want, "exactly [iova + 128, iova + 144) was copied");
    // sync_for_device copies exactly the CPU's bytes of the sub-range in:
    // the CPU's buffer is zero at 120..128, the device wrote 0xab there,
    // and the copy back at unmap keeps what the device wrote.
    p.mem.write(buf + 124, &[0x5a; 4]).unwrap();
    assert_eq!(cpu.sync_for_device(iova + 124, 4), Ok(()));
    assert_eq!(cpu.sync_for_cpu(iova + 120, 8), Ok(()));
    let mut head = [0u8; 8];
    p.mem.read(buf + 120, &mut head).unwrap();
    assert_eq!(head, [0xab, 0xab, 0xab, 0xab, 0x5a, 0x5a, 0x5a, 0x5a]);
    // Past the mapping's end: refused, nothing copied.
    let r = cpu.sync_for_cpu(iova + 250, 16);
    assert!(
        matches!(r, Err(DmaError::WrongLength { addr, len: 16 }) if addr == iova + 250),
        "{r:?}"
    );
    // Never mapped (past the slot, inside the pool).
    let r = cpu.sync_for_cpu(iova + 0x10_0000, 16);
    assert!(matches!(r, Err(DmaError::NotMapped { .. })), "{r:?}");
    assert_eq!(
        cpu.unmap(dev, iova, 256, DmaDirection::Bidirectional),
        Ok(())
    );
    // Unmapped now: refused.
    let r = cpu.sync_for_cpu(iova, 16);
    assert!(matches!(r, Err(DmaError::NotMapped { .. })), "{r:?}");
}

/// A sync must stay inside one scatter-list entry, or inside a coherent
/// buffer's exact length, in every policy (strict and deferred read the
/// list's page tags and the coherent record; pass-through and bounce
/// their per-entry records).
#[test]
fn a_sync_past_a_scatter_list_entry_or_a_coherent_buffer_is_refused() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let f0 = p.mem.alloc_zeroed_frames(0).unwrap();
        let f1 = p.mem.alloc_zeroed_frames(0).unwrap();
        let f2 = p.mem.alloc_zeroed_frames(0).unwrap();
        let sg = [
            SgEntry {
                phys: f0,
                len: 4096,
            },
            SgEntry { phys: f1, len: 100 },
            SgEntry {
                phys: f2 + 0x80,
                len: 100,
            },
        ];
        let mut out = [0u64; 3];
        let m = cpu
            .map_sg(dev, &sg, DmaDirection::FromDevice, &mut out)
            .unwrap();
        let wrong = |r: Result<(), DmaError>| matches!(r, Err(DmaError::WrongLength { .. }));
        let unmapped = |r: Result<(), DmaError>| matches!(r, Err(DmaError::NotMapped { .. }));
        // Inside an entry: accepted.
        assert_eq!(cpu.sync_for_cpu(out[1], 100), Ok(()), "{policy}");
        assert_eq!(cpu.sync_for_cpu(out[0] + 10, 4086), Ok(()), "{policy}");
        assert_eq!(cpu.sync_for_cpu(out[2] + 99, 1), Ok(()), "{policy}");
        // Past an entry's end, across two entries: WrongLength.
        assert!(wrong(cpu.sync_for_cpu(out[1], 200)), "{policy}");
        assert!(wrong(cpu.sync_for_cpu(out[0], 4196)), "{policy}");
        assert!(wrong(cpu.sync_for_cpu(out[2], 101)), "{policy}");
        // In the gap after an entry, or before an entry's first byte:
        // NotMapped.
        assert!(unmapped(cpu.sync_for_cpu(out[1] + 100, 1)), "{policy}");
        assert!(unmapped(cpu.sync_for_cpu(out[2] - 1, 1)), "{policy}");
        // A coherent buffer of 100 bytes (its page is mapped whole).
        // Pass-through keeps no record of one: every sync of it is
        // `NotMapped` there (coherent memory needs no sync).
        let (ph, cd) = cpu.alloc_coherent(dev, 100).unwrap();
        if policy.is_translated() {
            assert_eq!(cpu.sync_for_cpu(cd, 100), Ok(()), "{policy}");
            assert!(wrong(cpu.sync_for_cpu(cd + 50, 100)), "{policy}");
        }
        assert!(unmapped(cpu.sync_for_cpu(cd + 100, 1000)), "{policy}");
        cpu.unmap_sg(dev, &m, &sg, &out, DmaDirection::FromDevice)
            .unwrap();
        cpu.free_coherent(dev, ph, cd, 100).unwrap();
    }
}

#[test]
fn a_sync_of_an_address_never_mapped_is_refused() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        for r in [
            cpu.sync_for_cpu(0xdead_0000, 64),
            cpu.sync_for_device(0xdead_0000, 64),
        ] {
            assert!(
                matches!(r, Err(DmaError::NotMapped { addr: 0xdead_0000 })),
                "{policy}: {r:?}"
            );
        }
        let r = cpu.sync_for_cpu(0x1000, 0);
        assert!(matches!(r, Err(DmaError::ZeroLength)), "{policy}: {r:?}");
    }
}

#[test]
fn a_sync_longer_than_its_mapping_is_refused_and_one_inside_it_accepted() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let buf = p.mem.alloc_zeroed_frames(2).unwrap();
        // 100 bytes at offset 0x40 of a page.
        let iova = cpu
            .map(dev, buf + 0x40, 100, DmaDirection::FromDevice)
            .unwrap();
        let r = cpu.sync_for_cpu(iova, 5000);
        assert!(
            matches!(r, Err(DmaError::WrongLength { addr, len: 5000 }) if addr == iova),
            "{policy}: {r:?}"
        );
        let r = cpu.sync_for_cpu(iova, 101);
        assert!(
            matches!(r, Err(DmaError::WrongLength { .. })),
            "{policy}: {r:?}"
        );
        assert_eq!(cpu.sync_for_cpu(iova, 100), Ok(()), "{policy}");
        assert_eq!(cpu.sync_for_cpu(iova + 10, 90), Ok(()), "{policy}");
        assert_eq!(cpu.sync_for_device(iova + 99, 1), Ok(()), "{policy}");
        // Before the mapping's first byte, in its page: never mapped.
        if policy != DmaPolicy::Passthrough {
            let r = cpu.sync_for_cpu(iova - 1, 1);
            assert!(
                matches!(r, Err(DmaError::NotMapped { .. })),
                "{policy}: {r:?}"
            );
        }
        // A mapping of three pages and a bit: a sync of its whole, and one
        // running past the end of its last page's bytes.
        let big = cpu
            .map(dev, buf, 3 * 4096 + 10, DmaDirection::Bidirectional)
            .unwrap();
        assert_eq!(cpu.sync_for_cpu(big, 3 * 4096 + 10), Ok(()), "{policy}");
        assert_eq!(cpu.sync_for_cpu(big + 4096, 8192), Ok(()), "{policy}");
        let r = cpu.sync_for_cpu(big + 4096, 8192 + 11);
        assert!(
            matches!(r, Err(DmaError::WrongLength { .. })),
            "{policy}: {r:?}"
        );
        assert_eq!(
            cpu.unmap(dev, big, 3 * 4096 + 10, DmaDirection::Bidirectional),
            Ok(())
        );
        assert_eq!(cpu.unmap(dev, iova, 100, DmaDirection::FromDevice), Ok(()));
        // Unmapped (under deferred: retired until its flush): refused.
        let r = cpu.sync_for_cpu(iova, 10);
        assert!(
            matches!(r, Err(DmaError::NotMapped { .. })),
            "{policy}: {r:?}"
        );
    }
}

#[test]
fn a_sync_of_a_scatter_list_entry_is_accepted() {
    for policy in DmaPolicy::ALL {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let sg = two_entries(&p, 4096);
        let mut out = [0u64; 2];
        let m = cpu
            .map_sg(dev, &sg, DmaDirection::FromDevice, &mut out)
            .unwrap();
        assert_eq!(cpu.sync_for_cpu(out[0], 4096), Ok(()), "{policy}");
        assert_eq!(cpu.sync_for_cpu(out[1], 100), Ok(()), "{policy}");
        cpu.unmap_sg(dev, &m, &sg, &out, DmaDirection::FromDevice)
            .unwrap();
    }
}

#[test]
fn a_per_entry_unmap_sg_checks_every_entry_before_the_first_goes() {
    // Bounce maps a list entry by entry: an `unmap_sg` naming one entry
    // wrongly (here the second entry's DMA address; the list's fingerprint
    // of its addresses refuses it before any entry's record is asked) is
    // refused with every entry still mapped, and the right `unmap_sg`
    // then succeeds.
    let p = platform(DmaPolicy::Bounce);
    let mut cpu = p.domain.cpu();
    let dev = &p.devices[0];
    let sg = two_entries(&p, 512);
    let mut out = [0u64; 2];
    let m = cpu
        .map_sg(dev, &sg, DmaDirection::ToDevice, &mut out)
        .unwrap();
    let live = p.domain.stats().live();
    let wrong = [out[0], out[1] + 4096];
    let r = cpu.unmap_sg(dev, &m, &sg, &wrong, DmaDirection::ToDevice);
    assert!(matches!(r, Err(DmaError::NotMapped { .. })), "{r:?}");
    assert_eq!(p.domain.stats().live(), live, "entry 0 kept");
    assert_eq!(
        cpu.unmap_sg(dev, &m, &sg, &out, DmaDirection::ToDevice),
        Ok(())
    );
    assert_eq!(p.domain.stats().live(), 0);
}

/// Bounce maps a scatter list entry by entry, each entry in a slot of its
/// own, so a list's entry and a single mapping look alike at the slot. An
/// unmap takes only a mapping of its own kind, as DMA-API debug checks the
/// unmap function against the map: a single unmap naming a list's entry
/// is refused (the list stays whole), and so is an `unmap_sg` naming a
/// single mapping (the mapping stays).
#[test]
fn in_bounce_an_unmap_never_takes_a_mapping_of_the_other_kind() {
    let p = platform(DmaPolicy::Bounce);
    let mut cpu = p.domain.cpu();
    let dev = &p.devices[0];
    let sg = two_entries(&p, 512);
    let mut out = [0u64; 2];
    let m = cpu
        .map_sg(dev, &sg, DmaDirection::ToDevice, &mut out)
        .unwrap();
    let live = p.domain.stats().live();
    let r = cpu.unmap(dev, out[1], 100, DmaDirection::ToDevice);
    assert!(
        matches!(r, Err(DmaError::NotMapped { addr }) if addr == out[1]),
        "{r:?}"
    );
    assert_eq!(p.domain.stats().live(), live, "the list stays whole");
    // A single mapping, and an `unmap_sg` of a one-entry list naming it.
    let f = p.mem.alloc_zeroed_frames(0).unwrap();
    let one = [SgEntry { phys: f, len: 64 }];
    let a = cpu.map(dev, f, 64, DmaDirection::ToDevice).unwrap();
    let mut o1 = [0u64; 1];
    let m1 = cpu
        .map_sg(dev, &one, DmaDirection::ToDevice, &mut o1)
        .unwrap();
    let r = cpu.unmap_sg(dev, &m1, &one, &[a], DmaDirection::ToDevice);
    assert!(
        matches!(r, Err(DmaError::NotMapped { addr }) if addr == a),
        "{r:?}"
    );
    // Every mapping is still live (the two lists' and the single one),
    // and each goes by its own kind's unmap.
    assert_eq!(p.domain.stats().live(), live + 2);
    assert_eq!(cpu.unmap(dev, a, 64, DmaDirection::ToDevice), Ok(()));
    assert_eq!(
        cpu.unmap_sg(dev, &m1, &one, &o1, DmaDirection::ToDevice),
        Ok(())
    );
    assert_eq!(
        cpu.unmap_sg(dev, &m, &sg, &out, DmaDirection::ToDevice),
        Ok(())
    );
    assert_eq!(p.domain.stats().live(), 0);
}

/// In pass-through a scatter list is mapped entry by entry, each entry's
/// DMA address its physical one, so a single mapping and a list's entry
/// can share an address and length. An unmap takes only a mapping of its
/// own kind, as DMA-API debug checks the unmap function against the map:
/// a single unmap naming a list's entry is refused (the list stays whole)
/// and, beside another device's single mapping of those bytes, names
/// that device.
#[test]
fn in_pass_through_a_single_unmap_never_takes_a_scatter_list_entry() {
    let p = platform(DmaPolicy::Passthrough);
    let mut cpu = p.domain.cpu();
    let (nic, disk) = (&p.devices[0], &p.devices[1]);
    let f = p.mem.alloc_zeroed_frames(0).unwrap();
    let sg = [
        SgEntry { phys: f, len: 1 },
        SgEntry {
            phys: f + 100,
            len: 8,
        },
    ];
    let mut out = [0u64; 2];
    let m = cpu
        .map_sg(nic, &sg, DmaDirection::FromDevice, &mut out)
        .unwrap();
    assert_eq!(out, [f, f + 100]);
    // The list's own device and direction, as a single unmap: refused.
    let r = cpu.unmap(nic, f, 1, DmaDirection::FromDevice);
    assert!(
        matches!(r, Err(DmaError::NotMapped { addr }) if addr == f),
        "{r:?}"
    );
    // Another device's single mapping of the same byte.
    let a = cpu.map(disk, f, 1, DmaDirection::Bidirectional).unwrap();
    assert_eq!(a, f);
    let r = cpu.unmap(nic, f, 1, DmaDirection::ToDevice);
    assert!(matches!(r, Err(DmaError::WrongDevice { .. })), "{r:?}");
    let r = cpu.unmap(disk, f, 1, DmaDirection::ToDevice);
    assert!(
        matches!(
            r,
            Err(DmaError::WrongDirection {
                mapped: DmaDirection::Bidirectional,
                ..
            })
        ),
        "{r:?}"
    );
    // Each goes by its own kind of unmap, whole.
    cpu.unmap(disk, f, 1, DmaDirection::Bidirectional).unwrap();
    cpu.unmap_sg(nic, &m, &sg, &out, DmaDirection::FromDevice)
        .unwrap();
    let r = cpu.unmap_sg(nic, &m, &sg, &out, DmaDirection::FromDevice);
    assert!(matches!(r, Err(DmaError::NotMapped { .. })), "{r:?}");
}
