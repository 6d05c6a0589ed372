//! Isolation of the unit's own state from what descriptors and devices can
//! write: the completion of the unit's waits, the ring's queued
//! descriptors, and the IOMMU's own frames.

use std::sync::Arc;
use std::time::Duration;

use softiommu::hw::{
    Access, ContextEntry, ContextScope, InvDescriptor, IqeReason, LatencyModel, QiError, QueueMode,
    QueueRecovery, SourceId, TranslateError, Unit, UnitConfig, DESCRIPTOR_BYTES,
};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, IotlbGather, Perm, VtdConfig, VtdPageTable};

const DEV: SourceId = SourceId(0x0300);
const DID: u16 = 7;
const IOVA: u64 = 0x40_0000;
/// Long enough that a thread sleeping a few milliseconds is sure to act
/// while the unit is still busy with one descriptor.
const SLOW: Duration = Duration::from_millis(60);

struct Rig {
    mem: Arc<PhysMemory>,
    unit: Unit,
    table: VtdPageTable,
}

/// A unit with its own thread, whose context-cache invalidations take
/// `SLOW` (a modelled latency): a window in which the queue holds work.
fn rig() -> Rig {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
    let unit = Unit::new(
        mem.clone(),
        UnitConfig {
            queue_mode: QueueMode::Thread,
            latency: LatencyModel {
                context_invalidation: SLOW,
                ..LatencyModel::zero()
            },
            ..UnitConfig::default()
        },
    )
    .unwrap();
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

fn slow() -> InvDescriptor {
    InvDescriptor::context(ContextScope::Global)
}

/// Maps one page at `IOVA` and has the device translate it, so the IOTLB
/// holds it.
fn map_and_cache(r: &Rig) -> softiommu::hw::Translator {
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    r.table.map(IOVA, buf, 4096, Perm::RW).unwrap();
    let mut t = r.unit.translator().unwrap();
    t.translate(DEV, IOVA, 8, Access::Read).unwrap();
    t.translate(DEV, IOVA, 8, Access::Read).unwrap();
    assert!(t.stats().hits >= 1, "cached");
    t
}

#[test]
fn a_forged_wait_cannot_complete_the_units_own_wait() {
    let r = rig();
    let mut t = map_and_cache(&r);
    // A guest-written wait whose status write names a word of RAM (the
    // unit's own words, after its ring, are in the IOMMU reserve, which
    // no status write reaches), with a ticket far ahead, queued behind
    // slow work and ahead of the driver's unmap.
    let word = r.mem.alloc_zeroed_frames(0).unwrap();
    let forged = InvDescriptor::wait_status(word, 0x4000_0000).encode();
    r.unit
        .submit_raw(&[slow().encode(), forged, slow().encode()])
        .unwrap();
    // Let the unit thread take that batch, then unmap strictly: one more
    // slow descriptor, the page invalidation, and the wait.
    std::thread::sleep(Duration::from_millis(10));
    let mut g = IotlbGather::new();
    r.table.unmap(IOVA, 4096, &mut g).unwrap();
    let mut b = r.unit.batch();
    b.push(slow()).range(DID, IOVA, 4096);
    b.wait().unwrap();
    // The wait returned: the device must not reach the page any more.
    assert!(matches!(
        t.translate(DEV, IOVA, 8, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
    g.complete().unwrap();
}

#[test]
fn descriptors_queued_by_the_unit_run_as_queued_even_if_the_ring_is_overwritten() {
    let r = rig();
    let mut t = map_and_cache(&r);
    r.table.unmap(IOVA, 4096, &mut IotlbGather::new()).unwrap();
    // Queue slow work, then the domain's invalidation; overwrite the
    // latter's bytes in the ring (as a pass-through device could) with a
    // harmless wait before the unit reaches it.
    let tail = r.unit.queue_registers().tail;
    r.unit
        .submit(&[slow(), InvDescriptor::iotlb_domain(DID)])
        .unwrap();
    let at = r.unit.queue_registers().base + u64::from(tail + 1) * DESCRIPTOR_BYTES;
    let nop = InvDescriptor::wait_event().encode();
    r.mem.write(at, &nop[0].to_le_bytes()).unwrap();
    r.mem.write(at + 8, &nop[1].to_le_bytes()).unwrap();
    r.unit.wait().unwrap();
    assert_eq!(r.unit.stats().ring_tampered, 1);
    assert!(matches!(
        t.translate(DEV, IOVA, 8, Access::Read),
        Err(TranslateError::NotPresent { .. })
    ));
}

#[test]
fn a_status_write_into_the_iommus_own_frames_stops_the_queue() {
    let r = rig();
    let ring = r.unit.queue_registers().base;
    for target in [ring + 64, r.table.root() + 8] {
        r.unit
            .submit_raw(&[InvDescriptor::wait_status(target, 0xdead).encode()])
            .unwrap();
        let err = r.unit.wait().unwrap_err();
        assert!(
            matches!(
                err,
                QiError::Stopped(f) if f.reason == IqeReason::StatusAddressProtected { addr: target }
            ),
            "{err:?}"
        );
        let mut word = [0u8; 4];
        r.mem.read(target, &mut word).unwrap();
        assert_ne!(u32::from_le_bytes(word), 0xdead, "nothing written");
        assert!(r.unit.recover_queue(QueueRecovery::Skip).unwrap());
    }
    // A status word in the driver's own memory is written as asked.
    let mine = r.mem.alloc_zeroed_frames(0).unwrap();
    r.unit
        .submit_raw(&[InvDescriptor::wait_status(mine + 4, 0xbeef).encode()])
        .unwrap();
    r.unit.wait().unwrap();
    let mut word = [0u8; 4];
    r.mem.read(mine + 4, &mut word).unwrap();
    assert_eq!(u32::from_le_bytes(word), 0xbeef);
}
