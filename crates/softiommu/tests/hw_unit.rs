//! The emulated IOMMU unit through its public API: translation over real
//! tables, faults for every kind of bad request, the invalidation queue in
//! both processing modes, malformed descriptors and recovery.

use std::sync::Arc;
use std::time::Duration;

use softiommu::hw::{
    Access, ContextEntry, FaultReason, HwError, InvDescriptor, IotlbConfig, IqeReason,
    LatencyModel, PhysRange, QiError, QueueMode, QueueRecovery, SourceId, TranslateError, Unit,
    UnitConfig, DESCRIPTOR_BYTES,
};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, IotlbGather, Perm, VtdConfig, VtdPageTable};

const K4: u64 = 1 << 12;
const M2: u64 = 1 << 21;
const DEV: SourceId = SourceId(0x0810);
const DID: u16 = 3;

struct Rig {
    mem: Arc<PhysMemory>,
    unit: Unit,
    table: VtdPageTable,
}

fn rig(mode: QueueMode) -> Rig {
    let mem = Arc::new(PhysMemory::new(256 << 20).unwrap());
    let unit = Unit::new(
        mem.clone(),
        UnitConfig {
            queue_mode: mode,
            iotlb: IotlbConfig { sets: 64, ways: 4 },
            ..UnitConfig::default()
        },
    )
    .unwrap();
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
    unit.attach(
        DEV,
        ContextEntry::Translated {
            did: DID,
            root: table.root(),
        },
    )
    .unwrap();
    Rig { mem, unit, table }
}

fn unmap(r: &Rig, iova: u64, len: u64) {
    let mut g = IotlbGather::new();
    r.table.unmap(iova, len, &mut g).unwrap();
    let (s, e) = g.range().unwrap();
    let mut b = r.unit.batch();
    b.range(DID, s, e - s + 1);
    b.wait().unwrap();
    g.complete().unwrap();
}

#[test]
fn translation_hits_after_a_miss_and_splits_at_pages() {
    let r = rig(QueueMode::Inline);
    r.table
        .map(0x10_0000, 0x800_0000, 2 * K4, Perm::RW)
        .unwrap();
    r.table.map(0x10_2000, 0x900_0000, K4, Perm::READ).unwrap();
    r.table.map(4 * M2, 16 * M2, M2, Perm::RW).unwrap();
    let mut t = r.unit.translator().unwrap();
    // Within one page.
    let x = t.translate(DEV, 0x10_0010, 64, Access::Write).unwrap();
    assert_eq!(
        x.as_slice(),
        &[PhysRange {
            phys: 0x800_0010,
            len: 64
        }]
    );
    assert_eq!((t.stats().walks, t.stats().hits), (1, 0));
    t.translate(DEV, 0x10_0020, 64, Access::Read).unwrap();
    assert_eq!(t.stats().hits, 1, "the second access hits");
    // Across pages: contiguous pieces merge, others split.
    let x = t.translate(DEV, 0x10_0ff0, 2 * K4, Access::Read).unwrap();
    assert_eq!(
        x.as_slice(),
        &[
            PhysRange {
                phys: 0x800_0ff0,
                len: K4 + 0x10
            },
            PhysRange {
                phys: 0x900_0000,
                len: K4 - 0x10
            },
        ]
    );
    // A 2 MiB leaf: one entry covers every page in it.
    let before = t.stats().walks;
    for off in [0, 5 * K4, M2 - 64] {
        let s = t.translate_page(DEV, 4 * M2 + off, Access::Write).unwrap();
        assert_eq!(s.phys, 16 * M2 + off);
        assert_eq!(s.len, M2 - off);
    }
    assert_eq!(t.stats().walks, before + 1);
    assert!(r.unit.stats().iotlb_entries >= 3);
}

#[test]
fn every_bad_request_is_a_typed_error_and_a_fault() {
    let r = rig(QueueMode::Inline);
    r.table.map(0x1000, 0x5000, K4, Perm::READ).unwrap();
    let mut t = r.unit.translator().unwrap();
    let cases: Vec<(SourceId, u64, u64, Access, TranslateError)> = vec![
        (
            SourceId(7),
            0x1000,
            8,
            Access::Read,
            TranslateError::NoContext { sid: SourceId(7) },
        ),
        (
            DEV,
            0x2000,
            8,
            Access::Read,
            TranslateError::NotPresent {
                sid: DEV,
                iova: 0x2000,
                access: Access::Read,
            },
        ),
        (
            DEV,
            0x1ff0,
            0x20,
            Access::Read,
            TranslateError::NotPresent {
                sid: DEV,
                iova: 0x2000,
                access: Access::Read,
            },
        ),
        (
            DEV,
            0x1000,
            8,
            Access::Write,
            TranslateError::PermissionDenied {
                sid: DEV,
                iova: 0x1000,
                access: Access::Write,
                allowed: Perm::READ,
            },
        ),
        (
            DEV,
            1 << 48,
            8,
            Access::Read,
            TranslateError::AddressTooWide {
                sid: DEV,
                iova: 1 << 48,
                width: 48,
            },
        ),
        (
            DEV,
            u64::MAX - 3,
            8,
            Access::Read,
            TranslateError::AddressTooWide {
                sid: DEV,
                iova: u64::MAX - 3,
                width: 48,
            },
        ),
    ];
    for (sid, iova, len, access, want) in &cases {
        assert_eq!(t.translate(*sid, *iova, *len, *access).unwrap_err(), *want);
    }
    // The read hit a cached read-only entry; the write is still refused.
    assert!(t.translate(DEV, 0x1000, 8, Access::Read).is_ok());
    assert!(matches!(
        t.translate(DEV, 0x1000, 8, Access::Write),
        Err(TranslateError::PermissionDenied { .. })
    ));
    assert_eq!(
        t.translate(DEV, 0x1000, 0, Access::Read),
        Err(TranslateError::ZeroLength {
            sid: DEV,
            iova: 0x1000
        })
    );
    let log = r.unit.faults().drain();
    let reasons: Vec<FaultReason> = log.records.iter().map(|f| f.reason).collect();
    assert_eq!(
        reasons,
        [
            FaultReason::NoContext,
            FaultReason::NotPresent,
            FaultReason::NotPresent,
            FaultReason::PermissionDenied,
            FaultReason::AddressTooWide,
            FaultReason::AddressTooWide,
            FaultReason::PermissionDenied,
            FaultReason::ZeroLength,
        ]
    );
    assert_eq!(log.records[2].iova, 0x2000, "the first unmapped byte");
    assert!(!log.overflowed);
}

#[test]
fn a_corrupt_table_faults_instead_of_being_followed() {
    let r = rig(QueueMode::Inline);
    r.table.map(0, 0x5000, K4, Perm::RW).unwrap();
    // Point the root's first entry far outside memory.
    let orig = r
        .mem
        .load_u64(r.table.root(), std::sync::atomic::Ordering::Acquire)
        .unwrap();
    r.mem
        .store_u64(
            r.table.root(),
            (1 << 45) | 3,
            std::sync::atomic::Ordering::Release,
        )
        .unwrap();
    let mut t = r.unit.translator().unwrap();
    assert!(matches!(
        t.translate(DEV, 0, 8, Access::Read),
        Err(TranslateError::BadTableAddress { level: 3, .. })
    ));
    // Put it back so the table can be dropped cleanly.
    r.mem
        .store_u64(r.table.root(), orig, std::sync::atomic::Ordering::Release)
        .unwrap();
}

#[test]
fn the_fault_log_overflows_loudly() {
    let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
    let unit = Unit::new(
        mem,
        UnitConfig {
            fault_log_capacity: 4,
            ..UnitConfig::default()
        },
    )
    .unwrap();
    let mut t = unit.translator().unwrap();
    for i in 0..10 {
        let _ = t.translate(SourceId(1), i * K4, 8, Access::Read);
    }
    let b = unit.faults().drain();
    assert_eq!((b.records.len(), b.overflowed, b.dropped), (4, true, 6));
    assert_eq!(unit.stats().faults, 10);
}

fn unmap_invalidates(mode: QueueMode) {
    let r = rig(mode);
    r.table.map(0x4000, 0x7000, 4 * K4, Perm::RW).unwrap();
    let mut t = r.unit.translator().unwrap();
    for p in 0..4 {
        t.translate(DEV, 0x4000 + p * K4, 8, Access::Read).unwrap();
    }
    unmap(&r, 0x5000, K4);
    assert!(matches!(
        t.translate(DEV, 0x5000, 8, Access::Read),
        Err(TranslateError::NotPresent { iova: 0x5000, .. })
    ));
    // The neighbours are still cached.
    let hits = t.stats().hits;
    t.translate(DEV, 0x4000, 8, Access::Read).unwrap();
    t.translate(DEV, 0x6000, 8, Access::Read).unwrap();
    assert_eq!(t.stats().hits, hits + 2);
    // Remap to elsewhere: the new translation is seen.
    r.table.map(0x5000, 0xa000, K4, Perm::RW).unwrap();
    assert_eq!(
        t.translate_page(DEV, 0x5000, Access::Read).unwrap().phys,
        0xa000
    );
    // Domain and global invalidations drop everything of the domain.
    r.unit.invalidate_domain(DID).unwrap();
    r.unit.wait().unwrap();
    let walks = t.stats().walks;
    t.translate(DEV, 0x4000, 8, Access::Read).unwrap();
    assert_eq!(t.stats().walks, walks + 1);
    r.unit.invalidate_all().unwrap();
    r.unit.wait().unwrap();
    t.translate(DEV, 0x4000, 8, Access::Read).unwrap();
    assert_eq!(t.stats().walks, walks + 2);
    let s = r.unit.stats();
    assert!(s.iotlb_pages >= 1 && s.iotlb_domain == 1 && s.iotlb_global == 1);
    assert!(s.waits >= 3 && s.drains >= 3);
}

#[test]
fn unmap_invalidates_inline() {
    unmap_invalidates(QueueMode::Inline);
}

#[test]
fn unmap_invalidates_on_the_unit_thread() {
    unmap_invalidates(QueueMode::Thread);
}

fn batches_larger_than_the_queue(mode: QueueMode) {
    let r = rig(mode);
    let len = r.unit.queue_registers().len;
    let mut b = r.unit.batch();
    for i in 0..(3 * len as u64 + 17) {
        b.pages(DID, i * K4, 0, false);
    }
    b.wait().unwrap();
    let s = r.unit.stats();
    assert_eq!(s.iotlb_pages, 3 * u64::from(len) + 17);
    let regs = r.unit.queue_registers();
    assert_eq!(regs.head, regs.tail);
}

#[test]
fn batches_larger_than_the_queue_inline() {
    batches_larger_than_the_queue(QueueMode::Inline);
}

#[test]
fn batches_larger_than_the_queue_on_the_unit_thread() {
    batches_larger_than_the_queue(QueueMode::Thread);
}

fn malformed_descriptors_stop_the_queue(mode: QueueMode) {
    let r = rig(mode);
    r.unit.invalidate_domain(DID).unwrap();
    let good = InvDescriptor::iotlb_global().encode();
    // A device-TLB invalidation (type 3): not supported here.
    r.unit.submit_raw(&[good, [0x3, 0], good]).unwrap();
    let err = r.unit.wait().unwrap_err();
    let QiError::Stopped(f) = err else {
        panic!("{err:?}")
    };
    assert_eq!(f.reason, IqeReason::InvalidType { ty: 3 });
    assert_eq!(f.raw, [0x3, 0]);
    let regs = r.unit.queue_registers();
    assert_eq!(regs.head, f.head, "the head stays on the bad descriptor");
    assert_eq!(r.unit.queue_error(), Some(f));
    // Nothing is accepted until recovery.
    assert!(matches!(r.unit.invalidate_all(), Err(QiError::Stopped(_))));
    // Retrying the same bytes fails the same way.
    assert!(r.unit.recover_queue(QueueRecovery::Retry).unwrap());
    // Bounded by time, not by a count of naps (the unit's thread may run
    // late on a loaded machine).
    let t0 = std::time::Instant::now();
    while r.unit.queue_error().is_none() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(r.unit.queue_error().is_some());
    // Skip it: the rest runs and the queue works again.
    assert!(r.unit.recover_queue(QueueRecovery::Skip).unwrap());
    r.unit.wait().unwrap();
    assert!(r.unit.queue_error().is_none());
    assert_eq!(r.unit.stats().queue_errors, 2);
    // Reserved bits, then discard.
    r.unit
        .submit_raw(&[[InvDescriptor::iotlb_domain(DID).encode()[0] | 1 << 40, 0]])
        .unwrap();
    assert!(matches!(
        r.unit.wait(),
        Err(QiError::Stopped(f)) if matches!(f.reason, IqeReason::ReservedBits { qword: 0, .. })
    ));
    assert!(r.unit.recover_queue(QueueRecovery::Discard).unwrap());
    r.unit.wait().unwrap();
    // A domain id beyond the unit's, a mask beyond MAMV, a bad status address.
    for (raw, want) in [
        (
            [
                InvDescriptor::iotlb_domain(DID).encode()[0] | 0xffff << 16,
                0,
            ],
            None,
        ),
        (
            InvDescriptor::iotlb_pages(DID, 0, 40, false).encode(),
            Some(IqeReason::MaskTooLarge { am: 40, max: 18 }),
        ),
        (
            InvDescriptor::wait_status(1 << 40, 1).encode(),
            Some(IqeReason::StatusAddress { addr: 1 << 40 }),
        ),
    ] {
        r.unit.submit_raw(&[raw]).unwrap();
        match (r.unit.wait(), want) {
            (Ok(()), None) => {} // 0xffff is in range for a 16-bit unit
            (Err(QiError::Stopped(f)), Some(w)) => {
                assert_eq!(f.reason, w);
                r.unit.recover_queue(QueueRecovery::Skip).unwrap();
            }
            (got, w) => panic!("{got:?} for {w:?}"),
        }
    }
    r.unit.wait().unwrap();
}

#[test]
fn malformed_descriptors_stop_the_queue_inline() {
    malformed_descriptors_stop_the_queue(QueueMode::Inline);
}

#[test]
fn malformed_descriptors_stop_the_queue_on_the_unit_thread() {
    malformed_descriptors_stop_the_queue(QueueMode::Thread);
}

#[test]
fn register_level_queueing_with_a_status_word_of_ones_own() {
    let r = rig(QueueMode::Thread);
    let regs = r.unit.queue_registers();
    let status = r.mem.alloc_zeroed_frames(0).unwrap();
    let descs = [
        InvDescriptor::iotlb_pages(DID, 0x1000, 0, true).encode(),
        InvDescriptor::wait_status(status + 8, 0xfeed).encode(),
    ];
    let mut tail = regs.tail;
    for d in descs {
        let at = regs.base + u64::from(tail) * DESCRIPTOR_BYTES;
        r.mem
            .store_u64(at, d[0], std::sync::atomic::Ordering::Relaxed)
            .unwrap();
        r.mem
            .store_u64(at + 8, d[1], std::sync::atomic::Ordering::Relaxed)
            .unwrap();
        tail = (tail + 1) % regs.len;
    }
    r.unit.write_tail(tail).unwrap();
    // Poll the status word as a driver would.
    // Bounded by time, not by a count of naps: a loaded machine may run
    // the unit's thread late.
    let mut word = [0u8; 4];
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        r.mem.read(status + 8, &mut word).unwrap();
        if u32::from_le_bytes(word) == 0xfeed {
            break;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    assert_eq!(u32::from_le_bytes(word), 0xfeed);
    assert_eq!(regs.iqa() & 0x7, 0);
    // A tail past the ring is a queue error.
    assert!(matches!(
        r.unit.write_tail(regs.len + 1),
        Err(QiError::Stopped(f)) if f.reason == IqeReason::TailOutOfRange { tail: regs.len + 1, len: regs.len }
    ));
    r.unit.recover_queue(QueueRecovery::Retry).unwrap();
    r.unit.wait().unwrap();
    r.mem.free_frames(status, 0).unwrap();
}

#[test]
fn a_thread_holding_a_guard_may_not_wait() {
    let r = rig(QueueMode::Inline);
    r.table.map(0, 0x5000, K4, Perm::RW).unwrap();
    let mut t = r.unit.translator().unwrap();
    t.section(|g| {
        g.translate(DEV, 0, 8, Access::Read).unwrap();
        assert_eq!(r.unit.wait(), Err(QiError::GuardHeld));
        assert!(matches!(
            r.unit.attach(DEV, ContextEntry::Blocked),
            Err(HwError::Queue(QiError::GuardHeld))
        ));
    });
    r.unit.wait().unwrap();
}

#[test]
fn the_latency_model_is_charged_and_reported() {
    let r = rig(QueueMode::Inline);
    r.table.map(0, 0x5000, K4, Perm::RW).unwrap();
    let m = LatencyModel {
        wait_completion: Duration::from_micros(50),
        walk_level: Duration::from_micros(5),
        ..LatencyModel::zero()
    };
    r.unit.set_latency(m);
    assert_eq!(r.unit.latency(), m);
    let mut t = r.unit.translator().unwrap();
    t.translate(DEV, 0, 8, Access::Read).unwrap();
    assert_eq!(t.stats().modelled_ns, 4 * 5_000, "four levels walked");
    let before = r.unit.stats().modelled_ns;
    let start = std::time::Instant::now();
    r.unit.invalidate_pages(DID, 0, 0, false).unwrap();
    r.unit.wait().unwrap();
    assert!(start.elapsed() >= Duration::from_micros(50));
    assert_eq!(r.unit.stats().modelled_ns - before, 50_000);
    // A wait with nothing to complete costs nothing.
    r.unit.wait().unwrap();
    assert_eq!(r.unit.stats().modelled_ns - before, 50_000);
}

#[test]
fn dropping_a_unit_with_live_translators_is_safe() {
    let r = rig(QueueMode::Thread);
    r.table.map(0, 0x5000, K4, Perm::RW).unwrap();
    let mut t = r.unit.translator().unwrap();
    let Rig { unit, table, mem } = r;
    drop(unit);
    // The translator keeps the unit's state alive; translation still works.
    assert!(t.translate(DEV, 0, 8, Access::Read).is_ok());
    drop(t);
    drop(table);
    assert_eq!(
        mem.frame_stats().allocated_frames,
        0,
        "queue and status freed"
    );
}
