//! The error variants no other test asserts exactly: each test triggers
//! one variant (or a small group) through the public API, asserts it
//! exactly, and checks the state the failed call left. `docs/ERRORS.md`
//! names a test for every variant the library returns; the ones here fill
//! its gaps.
//!
//! Two variants can only be caused by the operating system (an address
//! space too small for an arena, a kernel without `membarrier(2)`): their
//! tests run this binary again as a child process that lowers its own
//! limit or filters the system call, so the parent's other tests are
//! untouched.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use softiommu::dma::{DmaDomainConfig, DmaError, DmaPolicy};
use softiommu::hw::{
    Access, ContextEntry, DrainBarrier, FaultReason, HwError, InvDescriptor, IotlbConfig,
    IqeReason, QiError, QueueRecovery, ResponseCode, SourceId, System, Taken, TranslateError, Unit,
    UnitConfig, UnitId,
};
use softiommu::iopf::{IopfConfig, IopfDomain, IopfError, Region, MAX_REGION_BYTES};
use softiommu::iova::{IovaDomain, IovaError, IovaPolicy};
use softiommu::mem::{MemError, PhysMemory, MAX_FRAME_ORDER, PAGE_SIZE};
use softiommu::pgtable::{FlushMethod, IoPageTable, Perm, PgtableError, VtdConfig, VtdPageTable};
use softiommu::{
    AccessError, DeviceSpec, DmaAccessor, DmaAttrs, DmaDirection, DmaDomain, Error, Platform,
};

const DEV: SourceId = SourceId(0x0100);
const DID: u16 = 1;

/// The environment variable that tells a child run which test it is.
const CHILD: &str = "SOFTIOMMU_ERRORS_CHILD";

/// Runs test `name` alone in a child process of this binary, with
/// [`CHILD`] set to `name`, and checks that it ran and passed.
fn run_as_child(name: &str) {
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, name)
        .output()
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this process is the child run of test `name`.
fn is_child(name: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|v| v == name)
}

/// A unit over a fresh arena, small where the test does not care.
fn unit_with(config: UnitConfig) -> (Arc<PhysMemory>, Unit) {
    let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
    let unit = Unit::new(mem.clone(), config).unwrap();
    (mem, unit)
}

/// A platform of 64 MiB with one device `DEV` of DMA mask `mask`.
fn platform(policy: DmaPolicy, mask: u64, bounce_bytes: u64) -> Platform {
    Platform::builder()
        .memory(64 << 20)
        .domain(DmaDomainConfig {
            policy,
            bounce_bytes,
            ..DmaDomainConfig::default()
        })
        .device_spec(DeviceSpec {
            sid: DEV,
            unit: 0,
            mask,
            untrusted: false,
        })
        .build()
        .unwrap()
}

// ----- mem -----

#[test]
fn a_frame_request_the_allocator_cannot_serve_changes_nothing() {
    let mem = PhysMemory::new(1 << 20).unwrap();
    let before = mem.frame_stats();
    assert_eq!(
        mem.alloc_frames(MAX_FRAME_ORDER + 1),
        Err(MemError::OrderTooLarge {
            order: MAX_FRAME_ORDER + 1,
            max: MAX_FRAME_ORDER
        })
    );
    // 1 MiB is 256 frames: a block of 512 is not there.
    assert_eq!(
        mem.alloc_zeroed_frames(9),
        Err(MemError::OutOfFrames { order: 9 })
    );
    assert_eq!(mem.frame_stats(), before);
    // The whole arena is still there to take.
    let all = mem.alloc_frames(8).unwrap();
    assert_eq!(mem.alloc_frames(0), Err(MemError::OutOfFrames { order: 0 }));
    mem.free_frames(all, 8).unwrap();
    assert_eq!(mem.frame_stats(), before);
}

#[test]
fn an_arena_the_os_will_not_reserve_is_a_reserve_error() {
    const NAME: &str = "an_arena_the_os_will_not_reserve_is_a_reserve_error";
    if !is_child(NAME) {
        return run_as_child(NAME);
    }
    // Only this child: 4 GiB of address space, so 1 TiB cannot be reserved.
    let limit = libc::rlimit {
        rlim_cur: 4 << 30,
        rlim_max: 4 << 30,
    };
    // SAFETY: `setrlimit` reads the struct it is given, which lives across
    // the call; it changes only this (child) process's limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
    assert!(matches!(
        PhysMemory::new(1 << 40).unwrap_err(),
        MemError::Reserve {
            len,
            errno: libc::ENOMEM
        } if len > 1 << 40
    ));
    // Nothing was kept: a smaller arena still fits.
    assert_eq!(PhysMemory::new(1 << 20).unwrap().size(), 1 << 20);
}

// ----- iova -----

#[test]
fn an_iova_space_too_large_for_its_state_map_is_a_memory_error() {
    // 2^45 frames need 2^24 chunks of the state map; it holds at most 2^20.
    let end = 1u64 << 45;
    assert_eq!(
        IovaDomain::new(1, end, IovaPolicy::Softiommu).unwrap_err(),
        IovaError::Memory(MemError::Reserve {
            len: end + 1,
            errno: libc::EOVERFLOW
        })
    );
}

// ----- pgtable -----

#[test]
fn a_flush_method_the_cpu_lacks_is_refused_before_anything_is_allocated() {
    // Exercised on CPUs that lack one of the methods (`clwb` is missing on
    // many); where every method is present, each table is made.
    let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
    for method in [
        FlushMethod::Clflushopt,
        FlushMethod::Clwb,
        FlushMethod::Clflush,
        FlushMethod::Fence,
    ] {
        let before = mem.frame_stats();
        let made = VtdPageTable::new(mem.clone(), VtdConfig::non_coherent().with_flush(method));
        if method.is_supported() {
            assert!(!made.unwrap().is_coherent());
        } else {
            assert_eq!(made.unwrap_err(), PgtableError::FlushUnsupported { method });
            assert_eq!(mem.frame_stats(), before, "no root page taken");
        }
    }
}

// ----- hw -----

#[test]
fn a_domain_id_beyond_the_units_is_refused_and_the_context_kept() {
    let (mem, unit) = unit_with(UnitConfig {
        domain_bits: 4,
        ..UnitConfig::default()
    });
    let table = VtdPageTable::new(mem, VtdConfig::default()).unwrap();
    unit.attach(DEV, ContextEntry::Blocked).unwrap();
    let ctx = ContextEntry::Translated {
        did: 16,
        root: table.root(),
    };
    let want = HwError::DomainOutOfRange {
        did: 16,
        domains: 16,
    };
    assert_eq!(unit.attach(DEV, ctx), Err(want.clone()));
    assert_eq!(unit.set_context(DEV, Some(ctx)), Err(want));
    assert_eq!(unit.context(DEV), Some(ContextEntry::Blocked));
    // The largest id is taken.
    unit.attach(
        DEV,
        ContextEntry::Translated {
            did: 15,
            root: table.root(),
        },
    )
    .unwrap();
}

/// Makes `membarrier(2)` fail with `ENOSYS` for the calling thread, as on
/// a kernel without it.
#[cfg(target_arch = "x86_64")]
fn deny_membarrier() {
    use libc::{sock_filter, sock_fprog, BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let code = |c: u32| c as u16;
    // seccomp_data.nr is the first word; membarrier gets ENOSYS, the rest run.
    let filter = [
        sock_filter {
            code: code(BPF_LD | BPF_W | BPF_ABS),
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: code(BPF_JMP | BPF_JEQ | BPF_K),
            jt: 0,
            jf: 1,
            k: libc::SYS_membarrier as u32,
        },
        sock_filter {
            code: code(BPF_RET | BPF_K),
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        sock_filter {
            code: code(BPF_RET | BPF_K),
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prctl` with these options takes plain integers, and for
    // `PR_SET_SECCOMP` a pointer to a filter program that the kernel copies
    // during the call (`prog` and `filter` outlive it). It affects only the
    // calling thread of this child process.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const sock_fprog
            ),
            0
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn membarrier_asked_for_where_the_kernel_lacks_it_is_refused() {
    const NAME: &str = "membarrier_asked_for_where_the_kernel_lacks_it_is_refused";
    if !is_child(NAME) {
        return run_as_child(NAME);
    }
    deny_membarrier();
    let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
    let before = mem.frame_stats();
    let want = |drain_barrier| UnitConfig {
        drain_barrier,
        ..UnitConfig::default()
    };
    assert_eq!(
        Unit::new(mem.clone(), want(DrainBarrier::Membarrier)).unwrap_err(),
        HwError::MembarrierUnavailable
    );
    assert_eq!(mem.frame_stats(), before, "no queue allocated");
    // `Auto` falls back to fences.
    let unit = Unit::new(mem, want(DrainBarrier::Auto)).unwrap();
    assert_eq!(unit.drain_barrier(), "fence");
}

// ----- translation -----

#[test]
fn a_miss_of_a_fault_capable_device_raises_a_page_request_not_a_fault() {
    let (mem, unit) = unit_with(UnitConfig::default());
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
    unit.attach(
        DEV,
        ContextEntry::Translated {
            did: DID,
            root: table.root(),
        },
    )
    .unwrap();
    unit.enable_page_requests(DEV);
    let mut t = unit.translator().unwrap();
    let iova = 0x4_0000;
    let Err(TranslateError::PageRequested {
        sid,
        iova: at,
        access,
        prgi,
    }) = t.translate(DEV, iova + 8, 8, Access::Write)
    else {
        panic!("a page request expected")
    };
    assert_eq!((sid, at, access), (DEV, iova + 8, Access::Write));
    assert!(unit.faults().is_empty(), "not a fault");
    // The request waits at the head of the page request queue.
    let Some(Ok(Taken::Request(r))) = unit.take_page_request() else {
        panic!("a request in the queue")
    };
    assert_eq!((r.sid, r.addr, r.prgi, r.write), (DEV, iova, prgi, true));
    // Served: the retry translates.
    let page = mem.alloc_zeroed_frames(0).unwrap();
    table.map(iova, page, PAGE_SIZE, Perm::RW).unwrap();
    unit.respond_page_group(DEV, prgi, ResponseCode::Success)
        .unwrap();
    t.wait_page_response(DEV, iova + 8, Access::Write, prgi)
        .unwrap();
    let r = t.translate(DEV, iova + 8, 8, Access::Write).unwrap();
    assert_eq!(r.as_slice()[0].phys, page + 8);
    assert!(unit.faults().is_empty());
}

#[test]
fn a_reserved_bit_in_a_table_entry_faults_with_its_level_and_bits() {
    let (mem, unit) = unit_with(UnitConfig::default());
    // A table of our own (in the IOMMU reserve, where tables live) whose
    // top entry has PS set: reserved at level 4.
    let root = reserve_frame(&mem);
    let raw = 0x2000 | 3 | 1 << 7;
    mem.store_u64(root, raw, Ordering::Release).unwrap();
    unit.attach(DEV, ContextEntry::Translated { did: DID, root })
        .unwrap();
    let mut t = unit.translator().unwrap();
    assert_eq!(
        t.translate(DEV, 0x10, 8, Access::Read),
        Err(TranslateError::ReservedEntry {
            sid: DEV,
            iova: 0x10,
            level: 4,
            raw
        })
    );
    let log = unit.faults().drain();
    assert_eq!(log.records.len(), 1);
    assert_eq!(log.records[0].reason, FaultReason::ReservedEntry);
    assert_eq!(FaultReason::ReservedEntry.vtd_code(Access::Read), 0xc);
    // The walk changed nothing.
    assert_eq!(mem.load_u64(root, Ordering::Acquire), Ok(raw));
}

#[test]
fn blocked_contexts_and_bad_table_addresses_are_recorded_with_their_reasons() {
    let (mem, unit) = unit_with(UnitConfig::default());
    let other = SourceId(0x0200);
    unit.attach(other, ContextEntry::Blocked).unwrap();
    // A top entry pointing far outside the 16 MiB arena.
    let root = reserve_frame(&mem);
    mem.store_u64(root, (1 << 40) | 3, Ordering::Release)
        .unwrap();
    unit.attach(DEV, ContextEntry::Translated { did: DID, root })
        .unwrap();
    let mut t = unit.translator().unwrap();
    assert_eq!(
        t.translate(other, 0, 8, Access::Write),
        Err(TranslateError::ContextBlocked { sid: other })
    );
    assert_eq!(
        t.translate(DEV, 0, 8, Access::Read),
        Err(TranslateError::BadTableAddress {
            sid: DEV,
            iova: 0,
            level: 3,
            table: 1 << 40
        })
    );
    let reasons: Vec<FaultReason> = unit
        .faults()
        .drain()
        .records
        .iter()
        .map(|f| f.reason)
        .collect();
    assert_eq!(
        reasons,
        [FaultReason::ContextBlocked, FaultReason::BadTableAddress]
    );
    assert_eq!(t.stats().faults, 2);
}

// ----- invalidation queue -----

#[test]
fn a_reserved_granularity_or_domain_id_stops_the_queue_at_the_descriptor() {
    let (_mem, unit) = unit_with(UnitConfig {
        domain_bits: 4,
        ..UnitConfig::default()
    });
    // An IOTLB invalidation with G = 00, then one of domain 20 of 16.
    let no_granularity = [0x2u64, 0];
    let beyond = InvDescriptor::iotlb_domain(20).encode();
    for (raw, reason) in [
        (no_granularity, IqeReason::ReservedGranularity),
        (beyond, IqeReason::DomainOutOfRange { did: 20, max: 16 }),
    ] {
        let head = unit.queue_registers().head;
        unit.submit_raw(&[raw]).unwrap();
        let f = unit.queue_error().expect("stopped");
        assert_eq!((f.head, f.raw, f.reason), (head, raw, reason));
        assert_eq!(reason.iqei(), 4);
        // The bad descriptor stays at the head; nothing is taken until
        // recovery.
        assert_eq!(unit.queue_registers().head, head);
        assert_eq!(unit.wait(), Err(QiError::Stopped(f)));
        assert_eq!(unit.invalidate_all(), Err(QiError::Stopped(f)));
        assert!(unit.recover_queue(QueueRecovery::Skip).unwrap());
        unit.wait().unwrap();
    }
    assert_eq!(unit.stats().queue_errors, 2);
}

// ----- dma -----

#[test]
fn a_pass_through_buffer_beyond_the_mask_is_refused_and_not_recorded() {
    // A 20-bit device; the buffer lies at 2 MiB or above.
    let mask = 0xf_ffff;
    let p = platform(DmaPolicy::Passthrough, mask, 0);
    let dev = &p.devices[0];
    let _low = p.mem.alloc_zeroed_frames(9).unwrap();
    let buf = p.mem.alloc_zeroed_frames(9).unwrap();
    assert!(buf > mask);
    let mut cpu = p.domain.cpu();
    assert_eq!(
        cpu.map(dev, buf, 64, DmaDirection::ToDevice),
        Err(DmaError::BeyondMask {
            addr: buf,
            len: 64,
            mask
        })
    );
    assert_eq!(p.domain.stats().live(), 0);
    // Nothing recorded: no unmap can find it, and a switch out of
    // pass-through (refused while a mapping is live) goes through.
    assert_eq!(
        cpu.unmap(dev, buf, 64, DmaDirection::ToDevice),
        Err(DmaError::NotMapped { addr: buf })
    );
    p.domain.set_policy(DmaPolicy::Strict).unwrap();
}

#[test]
fn no_iova_below_the_mask_is_no_space_and_changes_nothing() {
    // A 14-bit device reaches IOVA pages 1 to 3: no block of four.
    let p = platform(DmaPolicy::Strict, 0x3fff, 0);
    let dev = &p.devices[0];
    let buf = p.mem.alloc_zeroed_frames(2).unwrap();
    let mut cpu = p.domain.cpu();
    let blocks = p.domain.iova_stats().tree_blocks;
    assert_eq!(
        cpu.map(dev, buf, 4 * PAGE_SIZE, DmaDirection::FromDevice),
        Err(DmaError::NoSpace { len: 4 * PAGE_SIZE })
    );
    assert_eq!(p.domain.iova_stats().tree_blocks, blocks);
    assert_eq!(
        (
            p.domain.stats().live(),
            p.domain.table_stats().tables_allocated
        ),
        (0, 0)
    );
    // What fits below the mask still maps.
    let iova = cpu
        .map(dev, buf, PAGE_SIZE, DmaDirection::FromDevice)
        .unwrap();
    assert!(iova + PAGE_SIZE - 1 <= 0x3fff);
    cpu.unmap(dev, iova, PAGE_SIZE, DmaDirection::FromDevice)
        .unwrap();
}

#[test]
fn a_bounce_needing_device_without_a_pool_is_refused() {
    // No bounce pools at all (`bounce_bytes` 0).
    let p = platform(DmaPolicy::Strict, u64::MAX, 0);
    let (unit, _) = p.system.units().next().unwrap();
    let untrusted = SourceId(0x0200);
    p.system.assign(untrusted, unit).unwrap();
    assert_eq!(
        p.domain.attach(untrusted, u64::MAX, true).unwrap_err(),
        DmaError::BounceUnavailable { mask: u64::MAX }
    );
    // Not attached, not claimed: it attaches as a trusted device.
    assert_eq!(
        p.system.unit_of(untrusted).unwrap().1.context(untrusted),
        None
    );
    p.domain.attach(untrusted, u64::MAX, false).unwrap();
    // Under the bounce policy a trusted device's map is refused too.
    p.domain.set_policy(DmaPolicy::Bounce).unwrap();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let mut cpu = p.domain.cpu();
    assert_eq!(
        cpu.map(&p.devices[0], buf, 64, DmaDirection::ToDevice),
        Err(DmaError::BounceUnavailable { mask: u64::MAX })
    );
    assert_eq!(p.domain.stats().live(), 0);
}

#[test]
fn a_full_bounce_pool_refuses_the_map_and_keeps_the_others() {
    let p = platform(DmaPolicy::Bounce, u64::MAX, PAGE_SIZE);
    let dev = &p.devices[0];
    let buf = p.mem.alloc_zeroed_frames(1).unwrap();
    p.mem.write(buf, b"first").unwrap();
    let mut cpu = p.domain.cpu();
    let first = cpu
        .map(dev, buf, PAGE_SIZE, DmaDirection::ToDevice)
        .unwrap();
    assert_eq!(
        cpu.map(dev, buf + PAGE_SIZE, 1, DmaDirection::ToDevice),
        Err(DmaError::BounceFull { len: 1 })
    );
    assert_eq!(p.domain.stats().live(), 1);
    let mut nic = DmaAccessor::for_device(dev).unwrap();
    let mut got = [0u8; 5];
    nic.read(first, &mut got, DmaAttrs::ORDERED).unwrap();
    assert_eq!(&got, b"first");
    // Room again once the first slot is back.
    cpu.unmap(dev, first, PAGE_SIZE, DmaDirection::ToDevice)
        .unwrap();
    let second = cpu
        .map(dev, buf + PAGE_SIZE, 1, DmaDirection::ToDevice)
        .unwrap();
    cpu.unmap(dev, second, 1, DmaDirection::ToDevice).unwrap();
}

#[test]
fn the_65th_unit_of_a_domain_is_refused_and_the_device_left_free() {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let mut sys = System::new(mem);
    let small = UnitConfig {
        domain_bits: 4,
        iotlb: IotlbConfig { sets: 4, ways: 1 },
        prq_order: 0,
        ..UnitConfig::default()
    };
    let sids: Vec<SourceId> = (0..65u16).map(|i| SourceId(0x1000 + (i << 3))).collect();
    for &sid in &sids {
        let unit = sys.add_unit(small).unwrap();
        sys.assign(sid, unit).unwrap();
    }
    let sys = Arc::new(sys);
    let config = DmaDomainConfig {
        bounce_bytes: 0,
        ..DmaDomainConfig::default()
    };
    let domain = DmaDomain::new(sys.clone(), config.clone()).unwrap();
    let (last, first64) = sids.split_last().unwrap();
    for &sid in first64 {
        domain.attach(sid, u64::MAX, false).unwrap();
    }
    assert_eq!(
        domain.attach(*last, u64::MAX, false).unwrap_err(),
        DmaError::TooManyUnits
    );
    let (_, unit) = sys.unit_of(*last).unwrap();
    assert_eq!(unit.context(*last), None, "no context installed");
    // Not claimed by the domain: another one may take it.
    let other = DmaDomain::new(sys.clone(), DmaDomainConfig { did: 2, ..config }).unwrap();
    other.attach(*last, u64::MAX, false).unwrap();
}

#[test]
fn page_table_errors_reach_the_dma_api_typed_and_change_nothing() {
    let p = platform(DmaPolicy::Strict, u64::MAX, 0);
    let dev = &p.devices[0];
    assert_eq!(
        p.domain.iova_to_phys(1 << 48),
        Err(DmaError::Pgtable(PgtableError::AddressTooWide {
            iova: 1 << 48,
            len: 1,
            width: 48
        }))
    );
    // The first map needs three table pages; none is left.
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let taken = p.mem.hold_iommu_frames();
    let mut cpu = p.domain.cpu();
    let frames = p.mem.frame_stats();
    assert_eq!(
        cpu.map(dev, buf, 64, DmaDirection::ToDevice),
        Err(DmaError::Pgtable(PgtableError::Mem(
            MemError::OutOfFrames { order: 0 }
        )))
    );
    assert_eq!(p.domain.stats().live(), 0);
    assert_eq!(p.domain.table_stats().tables_allocated, 0);
    assert_eq!(p.mem.frame_stats(), frames, "no table page kept");
    // With frames back, the same map goes through.
    p.mem.release_iommu_frames(taken).unwrap();
    let iova = cpu.map(dev, buf, 64, DmaDirection::ToDevice).unwrap();
    cpu.unmap(dev, iova, 64, DmaDirection::ToDevice).unwrap();
}

// ----- the crate-level error -----

#[test]
fn every_layers_error_converts_into_its_crate_level_variant() {
    fn mem() -> Result<(), Error> {
        PhysMemory::new(u64::MAX)?;
        Ok(())
    }
    fn iova() -> Result<(), Error> {
        IovaDomain::new(0, 1, IovaPolicy::Softiommu)?;
        Ok(())
    }
    fn pgtable(t: &VtdPageTable) -> Result<(), Error> {
        t.map(0, 0, 0, Perm::RW)?;
        Ok(())
    }
    fn hw(sys: &System) -> Result<(), Error> {
        sys.assign(DEV, UnitId(7))?;
        Ok(())
    }
    fn queue(unit: &Unit) -> Result<(), Error> {
        unit.write_tail(u32::MAX)?;
        Ok(())
    }
    fn translate(unit: &Unit) -> Result<(), Error> {
        unit.translator()?.translate(DEV, 0, 8, Access::Read)?;
        Ok(())
    }
    fn dma(p: &Platform) -> Result<(), Error> {
        p.domain
            .cpu()
            .map(&p.devices[0], 0, 0, DmaDirection::ToDevice)?;
        Ok(())
    }
    fn access(p: &Platform) -> Result<(), Error> {
        DmaAccessor::for_device(&p.devices[0])?.read_u32(0x1000, DmaAttrs::ORDERED)?;
        Ok(())
    }
    fn iopf(d: &IopfDomain) -> Result<(), Error> {
        d.detach(DEV)?;
        Ok(())
    }
    assert!(matches!(mem(), Err(Error::Mem(MemError::TooLarge { .. }))));
    assert!(matches!(
        iova(),
        Err(Error::Iova(IovaError::InvalidRange { .. }))
    ));
    let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
    assert!(matches!(
        pgtable(&table),
        Err(Error::Pgtable(PgtableError::ZeroLength { iova: 0 }))
    ));
    let sys = System::new(mem.clone());
    assert!(matches!(hw(&sys), Err(Error::Hw(HwError::UnknownUnit(_)))));
    let unit = Unit::new(mem, UnitConfig::default()).unwrap();
    assert!(matches!(
        queue(&unit),
        Err(Error::Queue(QiError::Stopped(_)))
    ));
    assert!(matches!(
        translate(&unit),
        Err(Error::Translate(TranslateError::NoContext { sid: DEV }))
    ));
    let p = platform(DmaPolicy::Strict, u64::MAX, 0);
    assert!(matches!(dma(&p), Err(Error::Dma(DmaError::ZeroLength))));
    assert!(matches!(
        access(&p),
        Err(Error::Access(AccessError::Translate(
            TranslateError::NotPresent { .. }
        )))
    ));
    let d = IopfDomain::new(p.system.clone(), IopfConfig::default()).unwrap();
    assert!(matches!(
        iopf(&d),
        Err(Error::Iopf(IopfError::NotAttached { sid: DEV }))
    ));
}

// ----- iopf -----

/// An I/O page-fault domain over 64 MiB with `DEV` attached.
fn iopf_rig() -> (Arc<PhysMemory>, Arc<System>, Arc<IopfDomain>) {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).unwrap();
    sys.assign(DEV, unit).unwrap();
    let sys = Arc::new(sys);
    let domain = IopfDomain::new(sys.clone(), IopfConfig::default()).unwrap();
    domain.attach(DEV).unwrap();
    (mem, sys, domain)
}

#[test]
fn empty_and_oversized_regions_are_refused_and_nothing_added() {
    let (mem, _sys, d) = iopf_rig();
    let phys = mem.alloc_zeroed_frames(0).unwrap();
    let region = |len, perm| Region {
        iova: 0x1000_0000,
        phys,
        len,
        perm,
    };
    let empty = Err(IopfError::EmptyRegion { iova: 0x1000_0000 });
    assert_eq!(d.add_region(region(0, Perm::RW)), empty);
    assert_eq!(d.add_region(region(PAGE_SIZE, Perm::NONE)), empty);
    assert_eq!(
        d.add_region(region(MAX_REGION_BYTES + PAGE_SIZE, Perm::RW)),
        Err(IopfError::RegionTooLarge {
            len: MAX_REGION_BYTES + PAGE_SIZE,
            max: MAX_REGION_BYTES
        })
    );
    assert!(d.regions().is_empty());
    d.add_region(region(PAGE_SIZE, Perm::READ)).unwrap();
}

#[test]
fn detaching_a_device_not_attached_is_refused() {
    let (_mem, sys, d) = iopf_rig();
    let stranger = SourceId(0x0200);
    assert_eq!(
        d.detach(stranger),
        Err(IopfError::NotAttached { sid: stranger })
    );
    assert_eq!(d.devices().len(), 1);
    d.detach(DEV).unwrap();
    assert_eq!(d.detach(DEV), Err(IopfError::NotAttached { sid: DEV }));
    assert_eq!(sys.unit_of(DEV).unwrap().1.context(DEV), None);
}

#[test]
fn an_iopf_domain_on_full_memory_is_a_page_table_error() {
    let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
    let all = mem.hold_iommu_frames();
    let sys = Arc::new(System::new(mem.clone()));
    assert_eq!(
        IopfDomain::new(sys, IopfConfig::default()).unwrap_err(),
        IopfError::Pgtable(PgtableError::Mem(MemError::OutOfFrames { order: 0 }))
    );
    mem.release_iommu_frames(all).unwrap();
    assert_eq!(mem.frame_stats().allocated_frames, 0);
}

#[test]
fn a_reclaim_from_inside_a_section_is_refused_with_nothing_unmapped() {
    let (mem, sys, d) = iopf_rig();
    let phys = mem.alloc_zeroed_frames(1).unwrap();
    let iova = 0x1000_0000;
    d.add_region(Region {
        iova,
        phys,
        len: 2 * PAGE_SIZE,
        perm: Perm::RW,
    })
    .unwrap();
    assert_eq!(d.map_all(), Ok(2));
    let (_, unit) = sys.unit_of(DEV).unwrap();
    let mut t = unit.translator().unwrap();
    let refused = t.section(|g| {
        g.translate(DEV, iova, 8, Access::Read).unwrap();
        d.reclaim(iova, 2 * PAGE_SIZE)
    });
    assert_eq!(refused, Err(IopfError::Queue(QiError::GuardHeld)));
    assert!(d.is_mapped(iova) && d.is_mapped(iova + PAGE_SIZE));
    assert_eq!(d.stats().reclaims, 0);
    assert_eq!(
        t.translate(DEV, iova + PAGE_SIZE, 8, Access::Write)
            .unwrap()
            .as_slice()[0]
            .phys,
        phys + PAGE_SIZE
    );
    // Outside the section it goes through.
    assert_eq!(d.reclaim(iova, 2 * PAGE_SIZE), Ok(2));
}

// ----- vm-memory's `Iommu` -----

#[cfg(feature = "vm-memory")]
mod vm {
    use super::*;
    use softiommu::{PhysGuestMemory, UnitIommu};
    use vm_memory::iommu::Error as IommuError;
    use vm_memory::{
        GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryRegion, Iommu,
        MemoryRegionAddress, Permissions,
    };

    /// The error of a translation (`IotlbIterator` has no `Debug`).
    fn refused(view: &UnitIommu, iova: u64, len: usize, access: Permissions) -> IommuError {
        match view.translate(GuestAddress(iova), len, access) {
            Ok(_) => panic!("{iova:#x}+{len:#x} translated"),
            Err(e) => e,
        }
    }

    #[test]
    fn unit_iommu_refuses_what_the_device_was_not_given_with_cannot_resolve() {
        let p = platform(DmaPolicy::Strict, u64::MAX, 0);
        let dev = &p.devices[0];
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        let ro = p
            .domain
            .cpu()
            .map(dev, buf, PAGE_SIZE, DmaDirection::ToDevice)
            .unwrap();
        let view = UnitIommu::for_device(dev).unwrap();
        assert!(view
            .translate(GuestAddress(ro), 8, Permissions::Read)
            .is_ok());
        let unit = p.system.unit_of(DEV).unwrap().1;
        unit.faults().drain();
        for (iova, len, access) in [
            (ro, 8, Permissions::Write),
            (0x7000_0000_0000, 8, Permissions::Read),
            (u64::MAX - 3, 8, Permissions::Read),
        ] {
            let e = refused(&view, iova, len, access);
            assert!(
                matches!(&e, IommuError::CannotResolve { iova_range, .. }
                    if iova_range.base == GuestAddress(iova)),
                "{e:?}"
            );
        }
        // The two the unit refused are faults; the wrapping range never
        // reached it.
        let reasons: Vec<FaultReason> = unit
            .faults()
            .drain()
            .records
            .iter()
            .map(|f| f.reason)
            .collect();
        assert_eq!(
            reasons,
            [FaultReason::PermissionDenied, FaultReason::NotPresent]
        );
    }

    #[test]
    fn unit_iommu_without_a_translator_slot_is_misconfigured() {
        let p = Platform::builder()
            .memory(16 << 20)
            .unit(UnitConfig {
                max_translators: 1,
                ..UnitConfig::default()
            })
            .device(DEV)
            .build()
            .unwrap();
        let view = UnitIommu::for_device(&p.devices[0]).unwrap();
        let unit = p.system.unit_of(DEV).unwrap().1;
        // A translator of this thread holds the unit's one slot.
        let held = unit.translator().unwrap();
        let e = refused(&view, 0x1000, 8, Permissions::Read);
        assert!(matches!(e, IommuError::IommuMisconfigured { .. }), "{e:?}");
        assert_eq!(
            view.section(|| ()).unwrap_err(),
            HwError::TooManyTranslators { max: 1 }
        );
        drop(held);
        assert_eq!(view.section(|| 7), Ok(7));
        // A device no unit serves has no view at all.
        assert_eq!(
            UnitIommu::new(p.system.clone(), SourceId(0x0200)).unwrap_err(),
            HwError::DeviceNotAssigned {
                sid: SourceId(0x0200)
            }
        );
    }

    #[test]
    fn phys_guest_memory_refuses_addresses_past_the_arena() {
        let size = 1u64 << 20;
        let guest = PhysGuestMemory::new(Arc::new(PhysMemory::new(size).unwrap()));
        assert!(guest.find_region(GuestAddress(size)).is_none());
        let region = guest.find_region(GuestAddress(0)).unwrap();
        assert!(matches!(
            region.get_slice(MemoryRegionAddress(size - 1), 2),
            Err(GuestMemoryError::InvalidBackendAddress)
        ));
        assert!(matches!(
            region.get_host_address(MemoryRegionAddress(size)),
            Err(GuestMemoryError::InvalidBackendAddress)
        ));
        assert_eq!(
            region
                .get_slice(MemoryRegionAddress(size - 1), 1)
                .unwrap()
                .len(),
            1
        );
    }
}

/// One frame of `mem`'s IOMMU reserve, zeroed, for a table of the test's
/// own (tables live only there; a root in RAM is refused).
fn reserve_frame(mem: &PhysMemory) -> u64 {
    let mut held = mem.hold_iommu_frames();
    let rest = held.split_off(1);
    mem.release_iommu_frames(rest).unwrap();
    mem.fill(held[0], PAGE_SIZE, 0).unwrap();
    held[0]
}

#[test]
fn a_root_or_a_table_in_ram_is_never_followed() {
    let (mem, unit) = unit_with(UnitConfig::default());
    // A root in RAM: a table a device could be given and write.
    let ram = mem.alloc_zeroed_frames(0).unwrap();
    assert_eq!(
        unit.attach(
            DEV,
            ContextEntry::Translated {
                did: DID,
                root: ram
            }
        ),
        Err(HwError::BadRoot { root: ram })
    );
    // A root in the reserve whose entry points at a table in RAM.
    let root = reserve_frame(&mem);
    mem.store_u64(root, ram | 3, Ordering::Release).unwrap();
    unit.attach(DEV, ContextEntry::Translated { did: DID, root })
        .unwrap();
    let mut t = unit.translator().unwrap();
    assert_eq!(
        t.translate(DEV, 0, 8, Access::Read),
        Err(TranslateError::BadTableAddress {
            sid: DEV,
            iova: 0,
            level: 3,
            table: ram
        })
    );
}
