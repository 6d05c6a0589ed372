//! Tests of the accessors through a real unit and DMA domain: data lands
//! where the page tables say, bad input fails whole with a fault record,
//! fences are issued only where the mode needs them, and a mapping holds
//! off an unmap's wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::dma::{DmaCpu, DmaDevice, DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy, SgEntry};
use crate::hw::{FaultReason, SourceId, System, TranslateError};
use crate::mem::{PhysMemory, PAGE_SIZE};

const SID: SourceId = SourceId(0x0200);

struct Rig {
    sys: Arc<System>,
    domain: Arc<DmaDomain>,
    dev: DmaDevice,
    cpu: DmaCpu,
    mem: Arc<PhysMemory>,
}

fn rig() -> Rig {
    let p = crate::Platform::builder()
        .memory(64 << 20)
        .domain(DmaDomainConfig {
            policy: DmaPolicy::Strict,
            bounce_bytes: 0,
            ..Default::default()
        })
        .device(SID)
        .build()
        .unwrap();
    let cpu = p.domain.cpu();
    Rig {
        sys: p.system,
        domain: p.domain,
        dev: p.devices.into_iter().next().unwrap(),
        cpu,
        mem: p.mem,
    }
}

impl Rig {
    fn faults(&self) -> Vec<crate::hw::FaultRecord> {
        let (_, unit) = self.sys.unit_of(SID).unwrap();
        unit.faults().drain().records
    }

    fn peek(&self, phys: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.mem.read(phys, &mut b).unwrap();
        b
    }
}

const O: DmaAttrs = DmaAttrs::ORDERED;

#[test]
fn bytes_and_words_land_where_the_tables_say_across_discontiguous_pages() {
    let mut r = rig();
    let a = r.mem.alloc_zeroed_frames(0).unwrap();
    let b = r.mem.alloc_zeroed_frames(2).unwrap() + 2 * PAGE_SIZE; // not after `a`
    let sg = [
        SgEntry {
            phys: a,
            len: PAGE_SIZE,
        },
        SgEntry {
            phys: b,
            len: PAGE_SIZE,
        },
    ];
    let mut dma = [0u64; 2];
    let m = r
        .cpu
        .map_sg(&r.dev, &sg, DmaDirection::Bidirectional, &mut dma)
        .unwrap();
    assert!(m.contiguous);
    let iova = m.dma;
    let mut acc = DmaAccessor::for_device(&r.dev).unwrap();
    let msg: Vec<u8> = (0..64u8).collect();
    // 64 bytes straddling the two pages.
    acc.write(iova + PAGE_SIZE - 32, &msg, O).unwrap();
    assert_eq!(r.peek(a + PAGE_SIZE - 32, 32), msg[..32]);
    assert_eq!(r.peek(b, 32), msg[32..]);
    let mut back = [0u8; 64];
    acc.read(iova + PAGE_SIZE - 32, &mut back, DmaAttrs::RELAXED)
        .unwrap();
    assert_eq!(back[..], msg[..]);
    acc.fill(iova + PAGE_SIZE - 2, 4, 0xee, DmaAttrs::FULL_BARRIER)
        .unwrap();
    assert_eq!(r.peek(a + PAGE_SIZE - 2, 2), [0xee, 0xee]);
    assert_eq!(r.peek(b, 2), [0xee, 0xee]);
    // Words: little-endian, aligned (atomic) and not (split over pages).
    acc.write_u64(iova + 8, 0x0102_0304_0506_0708, O).unwrap();
    assert_eq!(r.peek(a + 8, 8), [8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(acc.read_u64(iova + 8, O).unwrap(), 0x0102_0304_0506_0708);
    acc.write_u32(iova + PAGE_SIZE - 2, 0xaabb_ccdd, O).unwrap();
    assert_eq!(r.peek(a + PAGE_SIZE - 2, 2), [0xdd, 0xcc]);
    assert_eq!(r.peek(b, 2), [0xbb, 0xaa]);
    assert_eq!(acc.read_u32(iova + PAGE_SIZE - 2, O).unwrap(), 0xaabb_ccdd);
    acc.write_u16(iova + 3, 0xbeef, O).unwrap();
    assert_eq!(acc.read_u16(iova + 3, O).unwrap(), 0xbeef);
    assert_eq!(r.peek(a + 3, 2), [0xef, 0xbe]);
    let s = acc.stats();
    assert_eq!(s.errors, 0);
    assert!(s.reads >= 4 && s.writes >= 4);
    assert!(r.faults().is_empty());
}

#[test]
fn bad_input_fails_whole_with_a_fault_record_and_nothing_half_written() {
    let mut r = rig();
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let ro = r.mem.alloc_zeroed_frames(0).unwrap();
    // The only mapping so far: the pages around it are holes.
    let rw = r
        .cpu
        .map(&r.dev, buf, PAGE_SIZE, DmaDirection::Bidirectional)
        .unwrap();
    let mut acc = DmaAccessor::for_device(&r.dev).unwrap();

    // Unmapped IOVA.
    let hole = 0x7000_0000_0000;
    let mut got = [0x55u8; 8];
    let e = acc.read(hole, &mut got, O).unwrap_err();
    assert!(matches!(
        e,
        AccessError::Translate(TranslateError::NotPresent { iova, .. }) if iova == hole
    ));
    assert!(e.is_fault());
    assert_eq!(got, [0x55; 8], "a failed read leaves the buffer alone");
    let f = r.faults();
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].iova, f[0].reason, f[0].sid),
        (hole, FaultReason::NotPresent, SID)
    );

    // Past the end of a mapping: the bytes inside it are not written. (The
    // allocator may have put it at the top of the 48-bit space, when what
    // follows it is too wide rather than unmapped.)
    let end = rw + PAGE_SIZE;
    let e = acc.write(end - 6, &[9u8; 16], O).unwrap_err();
    assert!(matches!(
        e,
        AccessError::Translate(
            TranslateError::NotPresent { iova, .. } | TranslateError::AddressTooWide { iova, .. }
        ) if iova == end
    ));
    assert_eq!(
        r.peek(buf + PAGE_SIZE - 6, 6),
        [0; 6],
        "nothing half written"
    );
    assert!(matches!(
        acc.fill(rw + 1, PAGE_SIZE, 3, O),
        Err(AccessError::Translate(
            TranslateError::NotPresent { .. } | TranslateError::AddressTooWide { .. }
        ))
    ));
    // A write from the hole below into the mapping.
    assert!(matches!(
        acc.write(rw - 6, &[7u8; 16], O),
        Err(AccessError::Translate(TranslateError::NotPresent { .. }))
    ));
    assert_eq!(r.peek(buf, PAGE_SIZE as usize), vec![0; PAGE_SIZE as usize]);
    // A read straddling the mapping and the hole after it.
    let mut big = vec![0x11u8; 2 * PAGE_SIZE as usize];
    assert!(matches!(
        acc.read(rw, &mut big, O),
        Err(AccessError::Translate(
            TranslateError::NotPresent { .. } | TranslateError::AddressTooWide { .. }
        ))
    ));
    assert!(big.iter().all(|&b| b == 0x11));
    // An unaligned word across the end.
    assert!(matches!(
        acc.read_u64(end - 4, O),
        Err(AccessError::Translate(
            TranslateError::NotPresent { .. } | TranslateError::AddressTooWide { .. }
        ))
    ));
    let f = r.faults();
    assert_eq!(f.len(), 5);
    assert_eq!(f[2].iova, rw - 6);
    assert!(f.iter().all(|f| f.iova == end || f.iova == rw - 6));

    // A write to a read-only mapping, bulk and typed.
    let rd = r
        .cpu
        .map(&r.dev, ro, PAGE_SIZE, DmaDirection::ToDevice)
        .unwrap();
    assert!(matches!(
        acc.write(rd, b"nope", O),
        Err(AccessError::Translate(
            TranslateError::PermissionDenied { .. }
        ))
    ));
    assert!(matches!(
        acc.write_u32(rd, 7, O),
        Err(AccessError::Translate(
            TranslateError::PermissionDenied { .. }
        ))
    ));
    assert!(matches!(
        acc.fill(rd, 16, 1, O),
        Err(AccessError::Translate(
            TranslateError::PermissionDenied { .. }
        ))
    ));
    assert_eq!(r.peek(ro, 16), [0; 16]);
    let f = r.faults();
    assert_eq!(f.len(), 3);
    assert!(f.iter().all(|f| f.reason == FaultReason::PermissionDenied));
    assert_eq!(acc.read_u32(rd, O).unwrap(), 0, "reading it is fine");

    // Zero length: refused and recorded as a malformed request.
    let e = acc.read(rw, &mut [], O).unwrap_err();
    assert!(matches!(
        e,
        AccessError::Translate(TranslateError::ZeroLength { .. })
    ));
    assert!(!e.is_fault(), "a zero-length access is a caller error");
    assert!(matches!(
        acc.write(rw, &[], O),
        Err(AccessError::Translate(TranslateError::ZeroLength { .. }))
    ));
    assert!(matches!(
        acc.fill(rw, 0, 0, O),
        Err(AccessError::Translate(TranslateError::ZeroLength { .. }))
    ));
    assert!(matches!(
        acc.with_map(rw, 0, DmaDirection::ToDevice, O, |_| ()),
        Err(AccessError::Translate(TranslateError::ZeroLength { .. }))
    ));
    let f = r.faults();
    assert!(
        !f.is_empty() && f.iter().all(|f| f.reason == FaultReason::ZeroLength),
        "{f:?}"
    );

    // Past the top of the address space.
    assert!(matches!(
        acc.read_u32(u64::MAX - 3, O),
        Err(AccessError::Translate(
            TranslateError::AddressTooWide { .. }
        ))
    ));
    assert!(acc.stats().errors >= 13);
    // The accessor still works afterwards.
    acc.write(rw, b"ok", O).unwrap();
    assert_eq!(r.peek(buf, 2), b"ok");
}

#[test]
fn a_pass_through_device_past_the_end_of_memory_gets_a_memory_error() {
    let r = rig();
    let (_, unit) = r.sys.unit_of(SID).unwrap();
    let other = SourceId(0x0201);
    r.sys.assign(other, crate::hw::UnitId(0)).unwrap();
    unit.attach(other, crate::hw::ContextEntry::PassThrough)
        .unwrap();
    let mut acc = DmaAccessor::new(unit, other).unwrap();
    let top = r.mem.size();
    acc.write(top - 4, b"ab", O).unwrap();
    assert!(matches!(
        acc.write(top - 4, b"abcdefgh", O),
        Err(AccessError::Memory { .. })
    ));
    assert_eq!(r.peek(top - 2, 2), [0, 0], "nothing half written");
    assert!(matches!(
        acc.read_u64(top, O),
        Err(AccessError::Memory { .. })
    ));
    assert!(r.faults().is_empty(), "not an IOMMU fault");
}

#[test]
fn fences_are_issued_only_where_the_mode_needs_them() {
    let mut r = rig();
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let a = r
        .cpu
        .map(&r.dev, buf, PAGE_SIZE, DmaDirection::Bidirectional)
        .unwrap();
    let mut acc = DmaAccessor::for_device(&r.dev).unwrap();
    let mut b = [0u8; 16];
    let ring = |acc: &mut DmaAccessor, m: OrderMode, b: &mut [u8; 16]| {
        // read descriptor, read buffer, write buffer, write status
        acc.read(a, b, m.attrs()).unwrap();
        acc.read(a + 64, b, m.attrs()).unwrap();
        acc.write(a + 64, b, m.attrs()).unwrap();
        acc.write_u32(a + 12, 1, m.attrs()).unwrap();
    };
    let fences = |acc: &DmaAccessor| acc.stats().full_fences;
    ring(&mut acc, OrderMode::Relaxed, &mut b);
    ring(&mut acc, OrderMode::Relaxed, &mut b);
    assert_eq!(fences(&acc), 0);
    // Ordered: the first read after the relaxed stores fences; inside one
    // round, only the descriptor read that follows the last round's
    // status store does.
    ring(&mut acc, OrderMode::Ordered, &mut b);
    assert_eq!(fences(&acc), 1);
    ring(&mut acc, OrderMode::Ordered, &mut b);
    ring(&mut acc, OrderMode::Ordered, &mut b);
    assert_eq!(fences(&acc), 3);
    // Full: one per access.
    ring(&mut acc, OrderMode::Full, &mut b);
    assert_eq!(fences(&acc), 7);
    // Explicit fences.
    acc.fence(DmaFence::Read);
    acc.fence(DmaFence::Write);
    assert_eq!(fences(&acc), 7);
    acc.fence(DmaFence::Full);
    assert_eq!(fences(&acc), 8);
    // After a full fence nothing is pending: an ordered read is free.
    acc.read(a, &mut b, O).unwrap();
    assert_eq!(fences(&acc), 8);
}

#[test]
fn a_mapping_copies_in_bulk_in_its_direction_only() {
    let mut r = rig();
    let a = r.mem.alloc_zeroed_frames(0).unwrap();
    let b = r.mem.alloc_zeroed_frames(1).unwrap() + PAGE_SIZE;
    let sg = [
        SgEntry {
            phys: a,
            len: PAGE_SIZE,
        },
        SgEntry {
            phys: b,
            len: PAGE_SIZE,
        },
    ];
    let mut dma = [0u64; 2];
    let m = r
        .cpu
        .map_sg(&r.dev, &sg, DmaDirection::Bidirectional, &mut dma)
        .unwrap();
    let mut acc = DmaAccessor::for_device(&r.dev).unwrap();
    acc.with_map(
        m.dma + 100,
        2 * PAGE_SIZE - 100,
        DmaDirection::Bidirectional,
        O,
        |map| {
            assert_eq!(map.len(), 2 * PAGE_SIZE - 100);
            assert_eq!(map.ranges().len(), 2);
            map.write_at(PAGE_SIZE - 104, b"abcdefgh").unwrap();
            let mut got = [0u8; 8];
            map.read_at(PAGE_SIZE - 104, &mut got).unwrap();
            assert_eq!(&got, b"abcdefgh");
            map.fill_at(0, 2, b'z').unwrap();
            assert!(matches!(
                map.read_at(2 * PAGE_SIZE - 104, &mut got),
                Err(AccessError::OutOfMapping { .. })
            ));
            assert!(matches!(
                map.write_at(u64::MAX, b"x"),
                Err(AccessError::OutOfMapping { .. })
            ));
            #[cfg(feature = "vm-memory")]
            {
                let slices: Vec<_> = map.volatile_slices().unwrap().collect();
                assert_eq!(slices.len(), 2);
                assert_eq!(
                    slices.iter().map(|s| s.len() as u64).sum::<u64>(),
                    map.len()
                );
            }
        },
    )
    .unwrap();
    assert_eq!(r.peek(a + PAGE_SIZE - 4, 4), b"abcd");
    assert_eq!(r.peek(b, 4), b"efgh");
    assert_eq!(r.peek(a + 100, 2), b"zz");
    acc.with_map(m.dma, 16, DmaDirection::ToDevice, O, |map| {
        assert!(matches!(
            map.write_at(0, b"x"),
            Err(AccessError::WrongDirection { .. })
        ));
        #[cfg(feature = "vm-memory")]
        assert!(matches!(
            map.volatile_slices(),
            Err(AccessError::WrongDirection { .. })
        ));
    })
    .unwrap();
    acc.with_map(m.dma, 16, DmaDirection::FromDevice, O, |map| {
        assert!(matches!(
            map.read_at(0, &mut [0u8; 1]),
            Err(AccessError::WrongDirection { .. })
        ));
    })
    .unwrap();
    // A mapping past the mapped range is refused whole, with a fault.
    let e = acc.with_map(m.dma, 3 * PAGE_SIZE, DmaDirection::ToDevice, O, |_| ());
    assert!(
        matches!(
            e,
            Err(AccessError::Translate(
                TranslateError::NotPresent { .. } | TranslateError::AddressTooWide { .. }
            ))
        ),
        "{e:?}"
    );
    assert_eq!(r.faults().len(), 1);
}

#[test]
fn a_mapping_holds_off_the_wait_of_an_unmap_that_revokes_it() {
    let mut r = rig();
    let buf = r.mem.alloc_zeroed_frames(0).unwrap();
    let a = r
        .cpu
        .map(&r.dev, buf, PAGE_SIZE, DmaDirection::FromDevice)
        .unwrap();
    let mapped = AtomicBool::new(false);
    let dropped = AtomicBool::new(false);
    // When the mapping began, taken by its own thread: this thread may
    // see `mapped` late on a loaded machine.
    let mapped_at = std::sync::OnceLock::new();
    std::thread::scope(|s| {
        let (dev, mapped, dropped, mapped_at) = (&r.dev, &mapped, &dropped, &mapped_at);
        s.spawn(move || {
            let mut acc = DmaAccessor::for_device(dev).unwrap();
            acc.with_map(a, PAGE_SIZE, DmaDirection::FromDevice, O, |map| {
                mapped_at.set(Instant::now()).unwrap();
                mapped.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
                map.write_at(0, b"late but legal").unwrap();
                dropped.store(true, Ordering::SeqCst);
            })
            .unwrap();
            // After the unmap, the device cannot reach the page.
            while acc.read_u32(a, O).is_ok() {
                std::thread::yield_now();
            }
        });
        while !mapped.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        r.cpu
            .unmap(&r.dev, a, PAGE_SIZE, DmaDirection::FromDevice)
            .unwrap();
        assert!(
            dropped.load(Ordering::SeqCst),
            "the unmap returned while the mapping was alive"
        );
        // The mapping lived 100 ms; the unmap waited all of it out.
        let lived = mapped_at.get().unwrap().elapsed();
        assert!(lived >= Duration::from_millis(100), "{lived:?}");
    });
    assert_eq!(r.peek(buf, 14), b"late but legal");
    let _ = &r.domain;
}

#[test]
fn a_device_without_a_context_faults_on_every_access() {
    let r = rig();
    let (_, unit) = r.sys.unit_of(SID).unwrap();
    let mut acc = DmaAccessor::new(unit, SourceId(0x0999)).unwrap();
    assert!(matches!(
        acc.read_u16(0x1000, O),
        Err(AccessError::Translate(TranslateError::NoContext { .. }))
    ));
    assert_eq!(r.faults().len(), 1);
    assert!(format!("{acc:?}").contains("DmaAccessor"));
}
