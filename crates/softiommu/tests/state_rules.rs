//! The state rule of `docs/ERRORS.md`: a failed call leaves the old state
//! or the finished new one, never half; a cleared or changed entry is never
//! left with a live cached translation; every error is typed. Each test
//! here reproduces a case the table once marked **violation**, asserts the
//! exact error, and checks the state the failed call left.
//!
//! Every test runs its body on a thread of its own and fails if the body
//! takes longer than [`watchdog::LIMIT`]: a regression that hangs fails instead.

mod watchdog;
use watchdog::timed;

use std::sync::Arc;

use softiommu::dma::{DmaDomainConfig, DmaError, DmaPolicy};
use softiommu::hw::{
    Access, ContextEntry, HwError, InvDescriptor, IqeReason, QiError, QueueRecovery, ResponseCode,
    SourceId, System, TranslateError, Unit, UnitConfig, UnitId,
};
use softiommu::iopf::{IopfConfig, IopfDomain, IopfError, Region};
use softiommu::mem::{MemError, PhysMemory, PAGE_SIZE};
use softiommu::pgtable::{IoPageTable, Perm, PgtableError, VtdConfig, VtdPageTable};
use softiommu::{AccessError, DmaDomain};

const DEV: SourceId = SourceId(0x0100);
const DEV2: SourceId = SourceId(0x0200);
const DEV3: SourceId = SourceId(0x0300);
/// A device no context names: translating it in a section only faults.
const NOBODY: SourceId = SourceId(0x0fff);

/// A system of `units` units over 64 MiB; `DEV` in unit 0, `DEV2` in the
/// last, `DEV3` in unit 0.
fn system(units: usize) -> (Arc<PhysMemory>, Arc<System>) {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    for _ in 0..units {
        sys.add_unit(UnitConfig::default()).unwrap();
    }
    sys.assign(DEV, UnitId(0)).unwrap();
    sys.assign(DEV3, UnitId(0)).unwrap();
    sys.assign(DEV2, UnitId((units - 1) as u16)).unwrap();
    (mem, Arc::new(sys))
}

/// Stops `unit`'s queue with a descriptor of a type it lacks.
fn stop(unit: &Unit) {
    unit.submit_raw(&[[0x3, 0]]).unwrap();
    let _ = unit.process_queue();
    assert!(
        matches!(unit.queue_error(), Some(f) if f.reason == IqeReason::InvalidType { ty: 3 }),
        "{:?}",
        unit.queue_error()
    );
}

fn recover(unit: &Unit) {
    assert!(unit.recover_queue(QueueRecovery::Skip).unwrap());
}

fn stopped<T: std::fmt::Debug>(r: Result<T, HwError>) -> bool {
    matches!(r, Err(HwError::Queue(QiError::Stopped(_))))
}

// ----- 1. `DmaDomain::attach` -----

#[test]
fn dma_attach_on_a_stopped_queue_leaves_no_context_and_the_device_free() {
    timed(|| {
        let (_mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let a = DmaDomain::new(sys.clone(), DmaDomainConfig::default()).unwrap();
        let b = DmaDomain::new(
            sys.clone(),
            DmaDomainConfig {
                did: 2,
                ..DmaDomainConfig::default()
            },
        )
        .unwrap();
        stop(unit);
        let e = a.attach(DEV, u64::MAX, false).unwrap_err();
        assert!(
            matches!(e, DmaError::Hw(HwError::Queue(QiError::Stopped(_)))),
            "{e:?}"
        );
        assert_eq!(unit.context(DEV), None, "no context left behind");
        recover(unit);
        // The device is free: another domain takes it.
        b.attach(DEV, u64::MAX, false).unwrap();
        assert!(matches!(
            unit.context(DEV),
            Some(ContextEntry::Translated { did: 2, .. })
        ));
    });
}

// ----- 2. `DmaDomain::set_policy` -----

#[test]
fn a_policy_switch_with_a_stopped_queue_switches_no_device() {
    timed(|| {
        let (_mem, sys) = system(2);
        let (u0, u1) = (sys.unit(UnitId(0)).unwrap(), sys.unit(UnitId(1)).unwrap());
        let d = DmaDomain::new(sys.clone(), DmaDomainConfig::default()).unwrap();
        d.attach(DEV, u64::MAX, false).unwrap();
        d.attach(DEV2, u64::MAX, false).unwrap();
        let translated = u0.context(DEV);
        assert!(matches!(translated, Some(ContextEntry::Translated { .. })));
        stop(u1);
        let e = d.set_policy(DmaPolicy::Passthrough).unwrap_err();
        assert!(
            matches!(e, DmaError::Hw(HwError::Queue(QiError::Stopped(_)))),
            "{e:?}"
        );
        assert_eq!(d.policy(), DmaPolicy::Strict);
        assert_eq!(u0.context(DEV), translated, "the first device kept");
        assert_eq!(u1.context(DEV2), translated, "the second device kept");
        recover(u1);
        d.set_policy(DmaPolicy::Passthrough).unwrap();
        assert_eq!(u0.context(DEV), Some(ContextEntry::PassThrough));
        assert_eq!(u1.context(DEV2), Some(ContextEntry::PassThrough));
    });
}

#[test]
fn a_policy_switch_a_unit_refuses_midway_sends_the_switched_devices_back() {
    timed(|| {
        let (mem, sys) = system(2);
        let (u0, u1) = (sys.unit(UnitId(0)).unwrap(), sys.unit(UnitId(1)).unwrap());
        let d = DmaDomain::new(
            sys.clone(),
            DmaDomainConfig {
                did: 7,
                policy: DmaPolicy::Passthrough,
                ..DmaDomainConfig::default()
            },
        )
        .unwrap();
        d.attach(DEV, u64::MAX, false).unwrap();
        d.attach(DEV2, u64::MAX, false).unwrap();
        // Another table holds domain id 7 in unit 1: the switch of DEV2 to
        // translated is refused there, after DEV (unit 0) switched.
        let other = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        sys.assign(SourceId(0x0400), UnitId(1)).unwrap();
        u1.attach(
            SourceId(0x0400),
            ContextEntry::Translated {
                did: 7,
                root: other.root(),
            },
        )
        .unwrap();
        let e = d.set_policy(DmaPolicy::Strict).unwrap_err();
        assert!(
            matches!(e, DmaError::Hw(HwError::DomainRootMismatch { did: 7, .. })),
            "{e:?}"
        );
        assert_eq!(d.policy(), DmaPolicy::Passthrough);
        assert_eq!(u0.context(DEV), Some(ContextEntry::PassThrough));
        assert_eq!(u1.context(DEV2), Some(ContextEntry::PassThrough));
    });
}

// ----- 3. `Unit::attach`/`detach`, `System::attach`/`unassign` -----

#[test]
fn unit_and_system_context_changes_on_a_stopped_queue_change_nothing() {
    timed(|| {
        let (mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        table.map(0, 0x10_0000, PAGE_SIZE, Perm::RW).unwrap();
        let ctx = ContextEntry::Translated {
            did: 1,
            root: table.root(),
        };
        unit.attach(DEV3, ctx).unwrap();
        stop(unit);
        // A first attach: nothing written.
        assert!(stopped(unit.attach(DEV, ctx)));
        assert!(stopped(sys.attach(DEV, ctx).map(|_| ())));
        assert_eq!(unit.context(DEV), None);
        // A change and a removal: the old context stays in force.
        assert!(stopped(unit.attach(DEV3, ContextEntry::PassThrough)));
        assert!(stopped(unit.detach(DEV3)));
        assert!(stopped(sys.unassign(DEV3)));
        assert_eq!(unit.context(DEV3), Some(ctx));
        assert!(sys.unit_of(DEV3).is_some(), "still in the unit's scope");
        let mut t = unit.translator().unwrap();
        assert_eq!(
            t.translate(DEV3, 0, 8, Access::Read).unwrap().as_slice()[0].phys,
            0x10_0000
        );
        // A caller holding a section: refused first, nothing changed.
        t.section(|g| {
            let _ = g.translate(NOBODY, 0, 8, Access::Read);
            assert!(matches!(
                unit.detach(DEV3),
                Err(HwError::Queue(QiError::GuardHeld))
            ));
        });
        assert_eq!(unit.context(DEV3), Some(ctx));
        recover(unit);
        sys.unassign(DEV3).unwrap();
        assert_eq!(unit.context(DEV3), None);
        unit.attach(DEV, ctx).unwrap();
        assert_eq!(unit.context(DEV), Some(ctx));
    });
}

// ----- 4. `IopfDomain::attach` -----

fn iopf(sys: &Arc<System>, did: u16) -> Arc<IopfDomain> {
    IopfDomain::new(
        sys.clone(),
        IopfConfig {
            did,
            ..IopfConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn attaching_an_iopf_device_again_from_a_section_keeps_it_owned() {
    timed(|| {
        let (_mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let d = iopf(&sys, 2);
        let other = iopf(&sys, 3);
        assert_eq!(d.attach(DEV), Ok(UnitId(0)));
        let mut t = unit.translator().unwrap();
        let again = t.section(|g| {
            let _ = g.translate(NOBODY, 0, 8, Access::Read);
            d.attach(DEV)
        });
        assert_eq!(again, Ok(UnitId(0)), "already attached here: nothing to do");
        assert!(d.is_attached(DEV));
        assert_eq!(
            other.attach(DEV),
            Err(IopfError::Hw(HwError::DeviceOwned { sid: DEV }))
        );
        assert!(matches!(
            unit.context(DEV),
            Some(ContextEntry::Translated { did: 2, .. })
        ));
    });
}

#[test]
fn a_first_iopf_attach_on_a_stopped_queue_leaves_no_context() {
    timed(|| {
        let (_mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let d = iopf(&sys, 2);
        let other = iopf(&sys, 3);
        stop(unit);
        let e = d.attach(DEV).unwrap_err();
        assert!(
            matches!(e, IopfError::Hw(HwError::Queue(QiError::Stopped(_)))),
            "{e:?}"
        );
        assert_eq!(unit.context(DEV), None);
        assert!(!d.is_attached(DEV));
        assert!(!unit.page_requests_enabled(DEV));
        recover(unit);
        assert_eq!(other.attach(DEV), Ok(UnitId(0)), "the device is free");
    });
}

// ----- 5. `IopfDomain::detach` -----

#[test]
fn an_iopf_detach_refused_for_a_section_leaves_page_requests_on() {
    timed(|| {
        let (_mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let d = iopf(&sys, 2);
        d.attach(DEV).unwrap();
        let ctx = unit.context(DEV);
        let mut t = unit.translator().unwrap();
        let refused = t.section(|g| {
            let _ = g.translate(NOBODY, 0, 8, Access::Read);
            d.detach(DEV)
        });
        assert_eq!(
            refused,
            Err(IopfError::Hw(HwError::Queue(QiError::GuardHeld)))
        );
        assert!(d.is_attached(DEV));
        assert!(unit.page_requests_enabled(DEV), "still fault-capable");
        assert_eq!(unit.context(DEV), ctx);
        d.detach(DEV).unwrap();
        assert!(!unit.page_requests_enabled(DEV));
    });
}

#[test]
fn an_iopf_detach_with_a_stopped_queue_completes() {
    timed(|| {
        let (_mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let d = iopf(&sys, 2);
        let other = iopf(&sys, 3);
        d.attach(DEV).unwrap();
        stop(unit);
        assert_eq!(d.detach(DEV), Ok(()));
        assert_eq!(unit.context(DEV), None);
        assert!(!d.is_attached(DEV));
        assert!(!unit.page_requests_enabled(DEV));
        recover(unit);
        assert_eq!(other.attach(DEV), Ok(UnitId(0)));
    });
}

// ----- 6. `IopfDomain::reclaim` -----

#[test]
fn a_reclaim_the_table_refuses_midway_finishes_what_it_cleared() {
    timed(|| {
        let (mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let d = iopf(&sys, 2);
        d.attach(DEV).unwrap();
        const M2: u64 = 2 << 20;
        let (a, b) = (0x4000_0000u64, 0x4000_0000u64 + 2 * M2);
        let (pa, pb) = (
            mem.alloc_zeroed_frames(9).unwrap(),
            mem.alloc_zeroed_frames(9).unwrap(),
        );
        assert_eq!((pa % M2, pb % M2), (0, 0));
        for (iova, phys) in [(a, pa), (b, pb)] {
            d.add_region(Region {
                iova,
                phys,
                len: M2,
                perm: Perm::RW,
            })
            .unwrap();
        }
        assert_eq!(d.map_all(), Ok(1024));
        let mut t = unit.translator().unwrap();
        for (iova, phys) in [(a, pa), (b, pb)] {
            assert_eq!(
                t.translate(DEV, iova, 8, Access::Read).unwrap().as_slice()[0].phys,
                phys
            );
        }
        // No frame left: region a's whole 2 MiB leaf unmaps, but the first
        // page of b needs its leaf split.
        let hog = mem.hold_iommu_frames();
        let e = d.reclaim(a, b + PAGE_SIZE - a).unwrap_err();
        assert_eq!(
            e,
            IopfError::Pgtable(PgtableError::Mem(MemError::OutOfFrames { order: 0 }))
        );
        // Region a: reclaimed whole — marked unmapped and not served from a
        // cached translation.
        assert!(!d.is_mapped(a) && !d.is_mapped(a + M2 - PAGE_SIZE));
        assert!(
            matches!(
                t.translate(DEV, a, 8, Access::Read),
                Err(TranslateError::PageRequested { .. })
            ),
            "a cleared page is not translated"
        );
        // Region b: untouched.
        assert!(d.is_mapped(b));
        assert_eq!(
            t.translate(DEV, b, 8, Access::Read).unwrap().as_slice()[0].phys,
            pb
        );
        assert_eq!(d.stats().pages_reclaimed, 512);
        mem.release_iommu_frames(hog).unwrap();
        assert_eq!(d.reclaim(b, PAGE_SIZE), Ok(1));
    });
}

// ----- 7. `Unit::respond_page_group` -----

#[test]
fn a_page_group_index_past_nine_bits_is_refused_not_truncated() {
    timed(|| {
        let (_mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let before = unit.stats().descriptors;
        for prgi in [512u16, 513, u16::MAX] {
            assert_eq!(
                unit.respond_page_group(DEV, prgi, ResponseCode::Success),
                Err(QiError::GroupIndexTooLarge { prgi })
            );
        }
        assert_eq!(unit.stats().descriptors, before, "nothing queued");
        assert_eq!(
            unit.respond_page_group(DEV, 511, ResponseCode::Success),
            Ok(())
        );
    });
}

// ----- 8. `AccessError::is_fault`, an unaligned status address -----

#[test]
fn a_zero_length_access_is_a_caller_error_not_a_fault() {
    let zero = AccessError::Translate(TranslateError::ZeroLength { sid: DEV, iova: 0 });
    assert!(!zero.is_fault());
    let missing = AccessError::Translate(TranslateError::NotPresent {
        sid: DEV,
        iova: 0,
        access: Access::Read,
    });
    assert!(missing.is_fault());
}

#[test]
fn an_unaligned_status_address_stops_the_queue_and_writes_nothing() {
    timed(|| {
        let (mem, sys) = system(1);
        let unit = sys.unit(UnitId(0)).unwrap();
        let word = mem.alloc_zeroed_frames(0).unwrap();
        unit.submit(&[InvDescriptor::wait_status(word + 2, 0xbeef)])
            .unwrap();
        let _ = unit.process_queue();
        let f = unit.queue_error().expect("the queue stopped");
        assert_eq!(f.reason, IqeReason::ReservedBits { qword: 1, bits: 2 });
        let mut buf = [0u8; 8];
        mem.read(word, &mut buf).unwrap();
        assert_eq!(buf, [0; 8], "no word written, rounded or not");
        recover(unit);
        // An aligned one is written as asked.
        unit.submit(&[InvDescriptor::wait_status(word + 4, 0xbeef)])
            .unwrap();
        unit.wait().unwrap();
        mem.read(word + 4, &mut buf[..4]).unwrap();
        assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), 0xbeef);
    });
}
