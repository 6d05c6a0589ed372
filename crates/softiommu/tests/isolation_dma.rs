//! Protection through the DMA API, one test per hole: a failed operation
//! leaves the old state or the finished new one, every free checks
//! ownership, every caller-supplied size is checked, and a device never
//! reaches what it was not given.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use softiommu::dma::{DmaStats, SgEntry};
use softiommu::iova::{CacheParams, IovaDomain, IovaPolicy};
use softiommu::{
    Access, AccessError, DeviceSpec, DmaAccessor, DmaAttrs, DmaDirection, DmaDomainConfig,
    DmaError, DmaPolicy, HwError, IovaError, MemError, Platform, QiError, SourceId, TranslateError,
    Translator, PAGE_SIZE,
};

const NIC: SourceId = SourceId(0x0100);
const O: DmaAttrs = DmaAttrs::ORDERED;

fn platform(policy: DmaPolicy) -> Platform {
    Platform::builder()
        .memory(128 << 20)
        .policy(policy)
        .device(NIC)
        .build()
        .unwrap()
}

/// A device translator on this thread, for probing what the device reaches.
fn translator(p: &Platform) -> Translator {
    p.unit(0).unwrap().translator().unwrap()
}

fn reaches(t: &mut Translator, iova: u64) -> bool {
    t.translate(NIC, iova, 8, Access::Read).is_ok()
}

/// Stops the unit's queue with a descriptor of a type it does not know.
fn stop_queue(p: &Platform) {
    let unit = p.unit(0).unwrap();
    unit.submit_raw(&[[0x3, 0]]).unwrap();
    assert!(unit.queue_error().is_some(), "the queue is stopped");
}

fn stats(p: &Platform) -> DmaStats {
    p.domain.stats()
}

// ----- 2. A strict unmap is atomic on failure -----

#[test]
fn a_strict_unmap_with_a_stopped_queue_still_revokes() {
    let p = platform(DmaPolicy::Strict);
    let mut cpu = p.domain.cpu();
    let mut t = translator(&p);
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let iova = cpu
        .map(&p.devices[0], buf, 64, DmaDirection::ToDevice)
        .unwrap();
    assert!(reaches(&mut t, iova) && reaches(&mut t, iova), "cached");
    stop_queue(&p);
    cpu.unmap(&p.devices[0], iova, 64, DmaDirection::ToDevice)
        .unwrap();
    assert!(
        !reaches(&mut t, iova),
        "revoked although the queue is stopped"
    );
    assert_eq!(p.unit(0).unwrap().stats().queue_bypass_revocations, 1);
    assert_eq!(stats(&p).live(), 0);
}

#[test]
fn a_strict_unmap_refused_for_a_held_section_leaves_the_mapping_intact() {
    let p = platform(DmaPolicy::Strict);
    let mut cpu = p.domain.cpu();
    let mut t = translator(&p);
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let iova = cpu
        .map(&p.devices[0], buf, 64, DmaDirection::ToDevice)
        .unwrap();
    t.section(|g| {
        g.translate(NIC, iova, 8, Access::Read).unwrap();
        assert!(matches!(
            cpu.unmap(&p.devices[0], iova, 64, DmaDirection::ToDevice),
            Err(DmaError::Queue(QiError::GuardHeld))
        ));
        // Nothing changed: the device still reaches it...
        g.translate(NIC, iova, 8, Access::Read).unwrap();
    });
    assert!(reaches(&mut t, iova));
    // ...and the caller may retry.
    cpu.unmap(&p.devices[0], iova, 64, DmaDirection::ToDevice)
        .unwrap();
    assert!(!reaches(&mut t, iova));
}

// ----- 3. A failed deferred flush keeps its batch -----

#[test]
fn a_deferred_flush_with_a_stopped_queue_still_revokes() {
    let p = platform(DmaPolicy::Deferred);
    p.domain.set_timeout(Duration::from_secs(60)).unwrap();
    let mut cpu = p.domain.cpu();
    let mut t = translator(&p);
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let iova = cpu
        .map(&p.devices[0], buf, 64, DmaDirection::ToDevice)
        .unwrap();
    assert!(reaches(&mut t, iova) && reaches(&mut t, iova));
    cpu.unmap(&p.devices[0], iova, 64, DmaDirection::ToDevice)
        .unwrap();
    stop_queue(&p);
    cpu.flush_own().unwrap();
    assert!(!reaches(&mut t, iova));
}

#[test]
fn a_failed_deferred_flush_keeps_its_batch_until_a_retry_revokes_it() {
    let p = platform(DmaPolicy::Deferred);
    p.domain.set_timeout(Duration::from_secs(60)).unwrap();
    p.domain.set_high_water(1).unwrap();
    let mut cpu = p.domain.cpu();
    let mut t = translator(&p);
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let iova = cpu
        .map(&p.devices[0], buf, 64, DmaDirection::ToDevice)
        .unwrap();
    t.section(|g| {
        g.translate(NIC, iova, 8, Access::Read).unwrap();
        // The queue reaches its high-water mark and is taken for a flush,
        // which cannot wait while this thread holds a section: it fails,
        // and the batch is kept. The unmap itself is done.
        cpu.unmap(&p.devices[0], iova, 64, DmaDirection::ToDevice)
            .unwrap();
        assert_eq!(stats(&p).flush_failures, 1);
        assert!(matches!(
            p.domain.last_flush_error(),
            Some(DmaError::Queue(QiError::GuardHeld))
        ));
        assert!(matches!(
            cpu.flush_own(),
            Err(DmaError::Queue(QiError::GuardHeld))
        ));
        // Kept, not lost: until an invalidation that covers it completes
        // (none can while this section is open) the IOVA is not free, so
        // a new map cannot get it.
        let again = cpu
            .map(&p.devices[0], buf, 64, DmaDirection::ToDevice)
            .unwrap();
        assert_ne!(again >> 12, iova >> 12, "reused before its invalidation");
        assert!(matches!(
            cpu.unmap(&p.devices[0], again, 2 * PAGE_SIZE, DmaDirection::ToDevice),
            Err(DmaError::WrongLength { .. })
        ));
    });
    // A retry (ours, or the timer's that ours waits for) revokes it.
    cpu.flush_own().unwrap();
    assert_eq!(stats(&p).pending_batches, 0);
    assert!(!reaches(&mut t, iova), "the retry revoked it");
}

// ----- 4. free_coherent checks what it frees -----

#[test]
fn free_coherent_frees_only_live_coherent_memory_of_its_device() {
    let p = Platform::builder()
        .memory(64 << 20)
        .device(NIC)
        .device(SourceId(0x0200))
        .build()
        .unwrap();
    let (nic, other) = (&p.devices[0], &p.devices[1]);
    let mut cpu = p.domain.cpu();
    let (phys, dma) = cpu.alloc_coherent(nic, 3000).unwrap();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let mapped = cpu.map(nic, buf, 4096, DmaDirection::FromDevice).unwrap();
    let ring = p.unit(0).unwrap().queue_registers().base;
    let before = p.mem.frame_stats();
    for bad in [buf, ring, phys + 4096] {
        assert_eq!(
            cpu.free_coherent(nic, bad, dma, 3000),
            Err(DmaError::NotCoherent { phys: bad })
        );
    }
    assert_eq!(
        cpu.free_coherent(nic, phys, mapped, 3000),
        Err(DmaError::NotMapped { addr: mapped })
    );
    assert_eq!(
        cpu.free_coherent(nic, phys, dma, 3 * 4096),
        Err(DmaError::WrongLength {
            addr: dma,
            len: 3 * 4096
        })
    );
    assert!(matches!(
        cpu.free_coherent(other, phys, dma, 3000),
        Err(DmaError::WrongDevice { .. })
    ));
    // Nor can the frames be freed behind the DMA API's back.
    assert!(matches!(
        p.mem.free_frames(phys, 0),
        Err(MemError::NotOwner { .. })
    ));
    assert_eq!(p.mem.frame_stats(), before, "nothing was freed");
    let mut acc = DmaAccessor::for_device(nic).unwrap();
    acc.write(mapped, b"still mapped", O).unwrap();
    acc.write(dma, b"still coherent", O).unwrap();
    cpu.free_coherent(nic, phys, dma, 3000).unwrap();
    assert!(matches!(
        cpu.free_coherent(nic, phys, dma, 3000),
        Err(DmaError::NotCoherent { .. })
    ));
    assert!(matches!(
        acc.write(dma, b"gone", O),
        Err(AccessError::Translate(TranslateError::NotPresent { .. }))
    ));
    cpu.unmap(nic, mapped, 4096, DmaDirection::FromDevice)
        .unwrap();
}

// ----- 5. Leaking what can be leaked breaks nothing -----

#[test]
fn leaked_accessors_and_translators_never_hold_off_a_wait() {
    let p = platform(DmaPolicy::Strict);
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let iova = cpu
        .map(&p.devices[0], buf, 64, DmaDirection::ToDevice)
        .unwrap();
    let mut acc = DmaAccessor::for_device(&p.devices[0]).unwrap();
    acc.with_map(iova, 64, DmaDirection::ToDevice, O, |m| {
        let mut b = [0u8; 4];
        m.read_at(0, &mut b).unwrap();
    })
    .unwrap();
    std::mem::forget(acc);
    std::mem::forget(translator(&p));
    let t0 = Instant::now();
    cpu.unmap(&p.devices[0], iova, 64, DmaDirection::ToDevice)
        .unwrap();
    p.unit(0).unwrap().wait().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10), "no hang");
}

// ----- 6. Pass-through unmaps are checked -----

#[test]
fn pass_through_unmaps_are_checked_and_a_switch_never_strands_a_mapping() {
    let p = platform(DmaPolicy::Passthrough);
    let mut cpu = p.domain.cpu();
    let dev = &p.devices[0];
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    assert_eq!(
        cpu.unmap(dev, buf, 64, DmaDirection::ToDevice),
        Err(DmaError::NotMapped { addr: buf })
    );
    let a = cpu.map(dev, buf, 64, DmaDirection::ToDevice).unwrap();
    assert_eq!(
        cpu.unmap(dev, a, 65, DmaDirection::ToDevice),
        Err(DmaError::WrongLength { addr: a, len: 65 })
    );
    assert_eq!(stats(&p).live(), 1);
    assert_eq!(
        p.domain.set_policy(DmaPolicy::Strict),
        Err(DmaError::PolicySwitchBusy { live: 1 })
    );
    // Unmapped from another CPU than the one that mapped it.
    let mut other = p.domain.cpu();
    other.unmap(dev, a, 64, DmaDirection::ToDevice).unwrap();
    assert_eq!(
        other.unmap(dev, a, 64, DmaDirection::ToDevice),
        Err(DmaError::NotMapped { addr: a })
    );
    p.domain.set_policy(DmaPolicy::Strict).unwrap();
}

// ----- 7. Bounce buffers -----

#[test]
fn a_bounce_slot_lies_below_the_device_mask() {
    let p = Platform::builder()
        .memory(64 << 20)
        .device_spec(DeviceSpec {
            sid: NIC,
            unit: 0,
            mask: 0xff_ffff,
            untrusted: true,
        })
        .build()
        .unwrap();
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let iova = cpu
        .map(&p.devices[0], buf, 512, DmaDirection::ToDevice)
        .unwrap();
    assert!(
        iova + 511 <= 0xff_ffff,
        "bounce IOVA {iova:#x} beyond a 24-bit mask"
    );
    cpu.unmap(&p.devices[0], iova, 512, DmaDirection::ToDevice)
        .unwrap();
}

#[test]
fn a_from_device_bounce_returns_the_callers_bytes_where_the_device_wrote_none() {
    let p = platform(DmaPolicy::Bounce);
    let mut cpu = p.domain.cpu();
    let dev = &p.devices[0];
    let mut acc = DmaAccessor::for_device(dev).unwrap();
    // Previous users' devices leave a secret in every slot of the lane
    // (1 MiB: 256 one-page slots; a slot given back is reused last).
    let secret = p.mem.alloc_zeroed_frames(0).unwrap();
    for _ in 0..256 {
        let s = cpu.map(dev, secret, 256, DmaDirection::FromDevice).unwrap();
        acc.write(s, &[0x5e; 256], O).unwrap();
        cpu.unmap(dev, s, 256, DmaDirection::FromDevice).unwrap();
    }
    // The next user's buffer: the device writes 4 of its 256 bytes.
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    p.mem.write(buf, &[0xaa; 256]).unwrap();
    let iova = cpu.map(dev, buf, 256, DmaDirection::FromDevice).unwrap();
    acc.write(iova, b"dev!", O).unwrap();
    cpu.unmap(dev, iova, 256, DmaDirection::FromDevice).unwrap();
    let mut got = [0u8; 256];
    p.mem.read(buf, &mut got).unwrap();
    assert_eq!(&got[..4], b"dev!");
    assert!(got[4..].iter().all(|&b| b == 0xaa), "stale bytes leaked in");
}

// ----- 8. Devices are not stolen; memory outside the arena is refused -----

#[test]
fn a_device_of_one_domain_cannot_be_attached_to_another_until_detached() {
    let p = platform(DmaPolicy::Strict);
    let other = softiommu::DmaDomain::new(
        p.system.clone(),
        DmaDomainConfig {
            did: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        other.attach(NIC, u64::MAX, false),
        Err(DmaError::Hw(HwError::DeviceOwned { sid: NIC }))
    ));
    // Still in the first domain: its mappings work.
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let iova = cpu
        .map(&p.devices[0], buf, 8, DmaDirection::ToDevice)
        .unwrap();
    let mut t = translator(&p);
    assert!(reaches(&mut t, iova));
    cpu.unmap(&p.devices[0], iova, 8, DmaDirection::ToDevice)
        .unwrap();
    p.domain.detach(&p.devices[0]).unwrap();
    assert!(matches!(
        p.domain.detach(&p.devices[0]),
        Err(DmaError::NotAttached { .. })
    ));
    let moved = other.attach(NIC, u64::MAX, false).unwrap();
    assert_eq!(moved.source_id(), NIC);
}

#[test]
fn mapping_memory_outside_the_arena_or_the_iommus_own_is_refused() {
    for policy in [
        DmaPolicy::Passthrough,
        DmaPolicy::Strict,
        DmaPolicy::Deferred,
    ] {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let size = p.mem.size();
        assert!(matches!(
            cpu.map(dev, size - 16, 64, DmaDirection::ToDevice),
            Err(DmaError::Mem(MemError::OutOfRange { .. }))
        ));
        assert!(matches!(
            cpu.map(dev, 1 << 50, 64, DmaDirection::ToDevice),
            Err(DmaError::Mem(MemError::OutOfRange { .. }))
        ));
        let ring = p.unit(0).unwrap().queue_registers().base;
        assert_eq!(
            cpu.map(dev, ring, 64, DmaDirection::FromDevice),
            Err(DmaError::Mem(MemError::IommuFrame { addr: ring }))
        );
        assert_eq!(stats(&p).live(), 0, "{policy}");
    }
}

// ----- 9 and 10. Sizes and lengths from the caller are checked -----

#[test]
fn absurd_cache_parameters_are_refused() {
    let good = IovaPolicy::Softiommu.params();
    for bad in [
        CacheParams {
            magazine_size: usize::MAX,
            ..good
        },
        CacheParams {
            magazine_size: 0,
            ..good
        },
        CacheParams {
            max_cached_order: u32::MAX,
            ..good
        },
    ] {
        assert!(matches!(
            IovaDomain::with_params(1, 1 << 20, bad),
            Err(IovaError::InvalidParams { .. })
        ));
    }
}

#[test]
fn lengths_near_the_top_of_u64_are_errors_not_panics() {
    let p = platform(DmaPolicy::Strict);
    let mut cpu = p.domain.cpu();
    let dev = &p.devices[0];
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    for len in [u64::MAX, u64::MAX - 4095, 1 << 63] {
        assert!(matches!(
            cpu.map(dev, buf, len, DmaDirection::ToDevice),
            Err(DmaError::Mem(MemError::OutOfRange { .. }))
        ));
        assert!(matches!(
            cpu.unmap(dev, 0x1000, len, DmaDirection::ToDevice),
            Err(DmaError::NotMapped { .. } | DmaError::WrongLength { .. })
        ));
    }
    // Not page aligned: the page-rounding of `buf + len` must not overflow.
    for len in [u64::MAX, u64::MAX - 8] {
        assert!(matches!(
            cpu.map(dev, buf + 8, len, DmaDirection::ToDevice),
            Err(DmaError::Mem(MemError::OutOfRange { .. }))
        ));
    }
    assert!(matches!(
        cpu.alloc_coherent(dev, u64::MAX),
        Err(DmaError::InvalidConfig { .. })
    ));
    assert!(matches!(
        p.domain.set_queue_size(usize::MAX),
        Err(DmaError::InvalidTunable {
            name: "queue_size",
            ..
        })
    ));
    assert!(matches!(
        p.domain.set_high_water(0),
        Err(DmaError::InvalidTunable { .. })
    ));
    assert!(matches!(
        p.domain.set_timeout(Duration::MAX),
        Err(DmaError::InvalidTunable { .. })
    ));
    assert!(matches!(
        p.domain.set_timeout(Duration::ZERO),
        Err(DmaError::InvalidTunable { .. })
    ));
    assert_eq!(stats(&p).live(), 0);
}

#[test]
fn a_scatter_list_in_descending_order_maps_without_underflow() {
    for policy in [DmaPolicy::Passthrough, DmaPolicy::Strict, DmaPolicy::Bounce] {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let buf = p.mem.alloc_zeroed_frames(1).unwrap();
        let sg = [
            SgEntry {
                phys: buf + PAGE_SIZE,
                len: 512,
            },
            SgEntry {
                phys: buf,
                len: 512,
            },
        ];
        let mut out = [0u64; 2];
        let m = cpu
            .map_sg(dev, &sg, DmaDirection::ToDevice, &mut out)
            .unwrap();
        assert!(m.span <= 2 * PAGE_SIZE, "{policy}: span {:#x}", m.span);
        assert_eq!(
            cpu.map_sg(dev, &sg, DmaDirection::ToDevice, &mut [0u64; 1]),
            Err(DmaError::OutputTooShort {
                needed: 2,
                given: 1
            })
        );
        cpu.unmap_sg(dev, &m, &sg, &out, DmaDirection::ToDevice)
            .unwrap();
        assert_eq!(stats(&p).live(), 0, "{policy}");
    }
}

// ----- 11. The work one device access causes is bounded -----

#[test]
fn an_access_of_unbounded_length_faults_at_once() {
    let p = platform(DmaPolicy::Passthrough);
    let mut acc = DmaAccessor::for_device(&p.devices[0]).unwrap();
    let mut t = translator(&p);
    let t0 = Instant::now();
    assert!(matches!(
        t.translate(NIC, 0, 1 << 40, Access::Read),
        Err(TranslateError::TooLong { .. })
    ));
    assert!(matches!(
        acc.fill(0x1000, 16 << 20, 0, O),
        Err(AccessError::Translate(TranslateError::TooLong { .. }))
    ));
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(p
        .unit(0)
        .unwrap()
        .faults()
        .drain()
        .records
        .iter()
        .any(|f| f.reason == softiommu::FaultReason::TooLong));
}

// ----- 12. A double unmap is an error under concurrency too -----

#[test]
fn of_two_racing_unmaps_of_one_mapping_exactly_one_succeeds() {
    // Failures are recorded and asserted after every round, never panicked
    // on inside a worker: a worker that panicked would leave the others
    // stuck at the barrier and turn a regression into a hang.
    const THREADS: usize = 4;
    const ROUNDS: usize = 400;
    for policy in [DmaPolicy::Deferred, DmaPolicy::Strict] {
        let p = platform(policy);
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        let go = Barrier::new(THREADS + 1);
        let done = Barrier::new(THREADS + 1);
        let wins = AtomicUsize::new(0);
        let others = std::sync::Mutex::new(Vec::<String>::new());
        let iova = std::sync::atomic::AtomicU64::new(0);
        let mut bad = Vec::new();
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let mut cpu = p.domain.cpu();
                    for _ in 0..ROUNDS {
                        go.wait();
                        let a = iova.load(Ordering::Acquire);
                        match cpu.unmap(&p.devices[0], a, 64, DmaDirection::ToDevice) {
                            Ok(()) => {
                                wins.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(DmaError::NotMapped { .. }) => {}
                            Err(e) => others.lock().unwrap().push(format!("{e:?}")),
                        }
                        done.wait();
                    }
                });
            }
            let mut cpu = p.domain.cpu();
            for round in 0..ROUNDS {
                let a = match cpu.map(&p.devices[0], buf, 64, DmaDirection::ToDevice) {
                    Ok(a) => a,
                    Err(e) => {
                        bad.push(format!("round {round}: map {e:?}"));
                        0
                    }
                };
                iova.store(a, Ordering::Release);
                go.wait();
                done.wait();
                let w = wins.swap(0, Ordering::Relaxed);
                let o = std::mem::take(&mut *others.lock().unwrap());
                if w != 1 || !o.is_empty() {
                    bad.push(format!("round {round}: {w} succeeded, other errors {o:?}"));
                }
            }
        });
        assert!(
            bad.is_empty(),
            "{policy}: {} bad rounds: {:?}",
            bad.len(),
            &bad[..bad.len().min(3)]
        );
        assert_eq!(stats(&p).live(), 0);
    }
}

// ----- 13. More device threads than the first chunk of slots -----

#[cfg(feature = "vm-memory")]
#[test]
fn a_hundred_threads_use_one_iommu_memory_at_once() {
    use softiommu::{PhysGuestMemory, UnitIommu};
    use vm_memory::{Bytes, GuestAddress, IommuMemory};
    const THREADS: u64 = 100;
    let p = platform(DmaPolicy::Strict);
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let iova = cpu
        .map(&p.devices[0], buf, 4096, DmaDirection::Bidirectional)
        .unwrap();
    let view = UnitIommu::for_device(&p.devices[0]).unwrap();
    let m = Arc::new(IommuMemory::new(
        PhysGuestMemory::behind_iommu(p.mem.clone()),
        view,
        true,
        (),
    ));
    let all = Barrier::new(THREADS as usize);
    std::thread::scope(|s| {
        for i in 0..THREADS {
            let (m, all) = (m.clone(), &all);
            s.spawn(move || {
                let at = GuestAddress(iova + i * 8);
                m.write_obj(i, at).unwrap();
                // Every thread holds its translator until all have one.
                all.wait();
                assert_eq!(m.read_obj::<u64>(at).unwrap(), i);
            });
        }
    });
}

#[test]
fn a_bounce_slot_has_its_directions_permission_only() {
    for policy in [DmaPolicy::Bounce, DmaPolicy::Strict] {
        let p = Platform::builder()
            .memory(64 << 20)
            .policy(policy)
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
        p.mem.write(buf, b"to the device").unwrap();
        // ToDevice: the device reads it, and cannot write the slot.
        let tx = cpu.map(dev, buf, 13, DmaDirection::ToDevice).unwrap();
        let mut got = [0u8; 13];
        acc.read(tx, &mut got, O).unwrap();
        assert_eq!(&got, b"to the device");
        assert!(matches!(
            acc.write(tx, b"forged", O),
            Err(AccessError::Translate(TranslateError::PermissionDenied {
                access: Access::Write,
                ..
            }))
        ));
        cpu.unmap(dev, tx, 13, DmaDirection::ToDevice).unwrap();
        assert_eq!(
            {
                let mut b = [0u8; 13];
                p.mem.read(buf, &mut b).unwrap();
                b
            },
            *b"to the device"
        );
        // FromDevice: the device writes it, and cannot read the slot (the
        // caller's bytes were copied in).
        let rx = cpu.map(dev, buf, 13, DmaDirection::FromDevice).unwrap();
        assert!(matches!(
            acc.read(rx, &mut got, O),
            Err(AccessError::Translate(TranslateError::PermissionDenied {
                access: Access::Read,
                ..
            }))
        ));
        acc.write(rx, b"from the dev!", O).unwrap();
        cpu.unmap(dev, rx, 13, DmaDirection::FromDevice).unwrap();
        p.mem.read(buf, &mut got).unwrap();
        assert_eq!(&got, b"from the dev!", "{policy}");
        // Bidirectional: both.
        let bi = cpu.map(dev, buf, 13, DmaDirection::Bidirectional).unwrap();
        acc.read(bi, &mut got, O).unwrap();
        acc.write(bi, b"both ways ok!", O).unwrap();
        cpu.unmap(dev, bi, 13, DmaDirection::Bidirectional).unwrap();
    }
}

#[test]
fn an_unmap_must_name_the_maps_exact_bytes_not_just_its_pages() {
    for policy in [
        DmaPolicy::Strict,
        DmaPolicy::Deferred,
        DmaPolicy::Passthrough,
    ] {
        let p = platform(policy);
        let mut cpu = p.domain.cpu();
        let dev = &p.devices[0];
        let buf = p.mem.alloc_zeroed_frames(1).unwrap() + 0x10;
        let iova = cpu.map(dev, buf, 100, DmaDirection::ToDevice).unwrap();
        // Same pages, other lengths: the wrong length.
        for (addr, len) in [(iova, 64), (iova, 101), (iova, 4000)] {
            assert_eq!(
                cpu.unmap(dev, addr, len, DmaDirection::ToDevice),
                Err(DmaError::WrongLength { addr, len }),
                "{policy}: {addr:#x}+{len}"
            );
        }
        // Another start in the same page: never mapped.
        assert_eq!(
            cpu.unmap(dev, iova + 8, 92, DmaDirection::ToDevice),
            Err(DmaError::NotMapped { addr: iova + 8 }),
            "{policy}"
        );
        // Nothing changed: still mapped, and the right unmap goes through.
        assert_eq!(stats(&p).live(), 1, "{policy}");
        let mut t = translator(&p);
        assert!(policy == DmaPolicy::Passthrough || reaches(&mut t, iova));
        cpu.unmap(dev, iova, 100, DmaDirection::ToDevice).unwrap();
        // A two-page mapping: a length within the same two pages is refused.
        let iova = cpu.map(dev, buf, 5000, DmaDirection::ToDevice).unwrap();
        assert_eq!(
            cpu.unmap(dev, iova, 4200, DmaDirection::ToDevice),
            Err(DmaError::WrongLength {
                addr: iova,
                len: 4200
            }),
            "{policy}"
        );
        cpu.unmap(dev, iova, 5000, DmaDirection::ToDevice).unwrap();
    }
}
