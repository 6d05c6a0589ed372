//! Raw invalidation descriptors and queue register writes against one unit.
//!
//! The unit must answer with typed errors or a queue error (IQE), never
//! panic or hang; and what it keeps to itself must hold: a wait of its own
//! that returns `Ok` means every invalidation queued before it is done (so
//! an unmapped page faults), whatever raw descriptors, forged status
//! writes and ring bytes came before; and no status write reaches the
//! page table (mapped pages keep translating to their frames).

#![no_main]

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softiommu::hw::{
    Access, ContextEntry, InvDescriptor, QiError, QueueMode, QueueRecovery, SourceId,
    TranslateError, Unit, UnitConfig, DESCRIPTOR_BYTES,
};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, IotlbGather, Perm, VtdConfig, VtdPageTable};

const DEV: SourceId = SourceId(0x0810);
const DID: u16 = 3;
const PAGES: u64 = 8;
const IOVA: u64 = 0x10_0000;

/// Where a forged status write aims.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Target {
    /// Into the invalidation ring.
    Ring(u16),
    /// Into the page table's root page.
    TableRoot(u16),
    /// Into an ordinary frame.
    Data(u16),
    /// Anywhere at all.
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// `submit_raw` of up to 8 descriptors, as given.
    SubmitRaw(Vec<[u64; 2]>),
    /// A wait descriptor with a status write aimed at `target`.
    StatusWrite {
        target: Target,
        data: u32,
        flags: u8,
    },
    /// Driver-written bytes into a ring slot (at or after the tail, or
    /// over one the unit still owns).
    RingStore {
        slot: u16,
        raw: [u64; 2],
    },
    /// `IQT_REG`: `in_ring` keeps it inside the ring.
    WriteTail {
        tail: u32,
        in_ring: bool,
    },
    Recover(u8),
    Process,
    Wait,
    /// Unmap page `n`, invalidate it and wait.
    Unmap(u8),
    /// Map page `n` again (when no stale entry may remain).
    Remap(u8),
    Translate {
        page: u8,
        write: bool,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    thread: bool,
    ops: Vec<Op>,
}

struct Rig {
    mem: Arc<PhysMemory>,
    unit: Unit,
    table: VtdPageTable,
    frames: u64,
    data: u64,
}

fn frame_of(r: &Rig, page: u64) -> u64 {
    r.frames + page * 4096
}

fuzz_target!(|input: Input| {
    let mem = Arc::new(PhysMemory::new(16 << 20).expect("memory"));
    let unit = Unit::new(
        mem.clone(),
        UnitConfig {
            queue_mode: if input.thread {
                QueueMode::Thread
            } else {
                QueueMode::Inline
            },
            domain_bits: 8,
            ..UnitConfig::default()
        },
    )
    .expect("unit");
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).expect("table");
    unit.attach(
        DEV,
        ContextEntry::Translated {
            did: DID,
            root: table.root(),
        },
    )
    .expect("attach");
    let frames = mem.alloc_zeroed_frames(3).expect("frames");
    let data = mem.alloc_zeroed_frames(0).expect("data");
    let r = Rig {
        mem,
        unit,
        table,
        frames,
        data,
    };
    r.table
        .map(IOVA, r.frames, PAGES * 4096, Perm::RW)
        .expect("map");
    let mut t = r.unit.translator().expect("translator");
    // Unmapped pages whose invalidation's wait failed: the invalidation
    // may never have been queued, or was discarded, so the IOTLB may hold
    // them until they are unmapped again.
    let mut stale: BTreeSet<u64> = BTreeSet::new();
    let mut unmapped: BTreeSet<u64> = BTreeSet::new();
    let regs = r.unit.queue_registers();
    for op in input.ops.into_iter().take(64) {
        match op {
            Op::SubmitRaw(v) => {
                let v: Vec<_> = v.into_iter().take(8).collect();
                check_qi(r.unit.submit_raw(&v));
            }
            Op::StatusWrite {
                target,
                data,
                flags,
            } => {
                let addr = match target {
                    Target::Ring(o) => regs.base + u64::from(o) % (4096 << regs.order),
                    Target::TableRoot(o) => r.table.root() + u64::from(o) % 4096,
                    Target::Data(o) => r.data + u64::from(o) % 4096,
                    Target::Raw(a) => a,
                };
                let mut d = InvDescriptor::wait_status(addr & !3, data).encode();
                if flags & 1 != 0 {
                    d[0] ^= u64::from(flags) << 40;
                }
                if flags & 2 != 0 {
                    d[1] = addr;
                }
                check_qi(r.unit.submit_raw(&[d]));
            }
            Op::RingStore { slot, raw } => {
                let at = regs.base + u64::from(slot) % u64::from(regs.len) * DESCRIPTOR_BYTES;
                r.mem
                    .store_u64(at, raw[0], Ordering::Relaxed)
                    .expect("ring");
                r.mem
                    .store_u64(at + 8, raw[1], Ordering::Relaxed)
                    .expect("ring");
            }
            Op::WriteTail { tail, in_ring } => {
                let tail = if in_ring { tail % regs.len } else { tail };
                let res = r.unit.write_tail(tail);
                if tail >= regs.len {
                    assert!(matches!(res, Err(QiError::Stopped(_))), "{res:?}");
                } else {
                    check_qi(res);
                }
            }
            Op::Recover(how) => {
                let how = match how % 3 {
                    0 => QueueRecovery::Retry,
                    1 => QueueRecovery::Skip,
                    _ => QueueRecovery::Discard,
                };
                let res = r.unit.recover_queue(how);
                assert!(res.is_ok(), "{res:?}");
            }
            Op::Process => check_qi(r.unit.process_queue()),
            Op::Wait => {
                let res = r.unit.wait();
                check_qi(res);
            }
            Op::Unmap(n) => {
                let page = u64::from(n) % PAGES;
                if unmapped.contains(&page) {
                    continue;
                }
                let mut g = IotlbGather::new();
                r.table
                    .unmap(IOVA + page * 4096, 4096, &mut g)
                    .expect("unmap");
                unmapped.insert(page);
                let mut b = r.unit.batch();
                b.range(DID, IOVA + page * 4096, 4096);
                let res = b.wait();
                if res.is_ok() {
                    stale.remove(&page);
                } else {
                    check_qi(res);
                    stale.insert(page);
                }
                // The table pages freed by an unmap are only queued in the
                // gather; freeing them waits for a completed wait (the
                // unit's queue may be stopped), so they are dropped here
                // without being freed: 4 KiB unmaps free no table pages.
                drop(g);
            }
            Op::Remap(n) => {
                let page = u64::from(n) % PAGES;
                if !unmapped.contains(&page) {
                    continue;
                }
                // The same frame and rights: a stale entry, if any, agrees.
                r.table
                    .map(IOVA + page * 4096, frame_of(&r, page), 4096, Perm::RW)
                    .expect("remap");
                unmapped.remove(&page);
                stale.remove(&page);
            }
            Op::Translate { page, write } => {
                let page = u64::from(page) % PAGES;
                let access = if write { Access::Write } else { Access::Read };
                let res = t.translate(DEV, IOVA + page * 4096 + 8, 8, access);
                if !unmapped.contains(&page) {
                    let x = res.expect("a mapped page translates");
                    assert_eq!(x.as_slice().len(), 1);
                    assert_eq!(x.as_slice()[0].phys, frame_of(&r, page) + 8);
                } else if !stale.contains(&page) {
                    assert!(
                        matches!(res, Err(TranslateError::NotPresent { .. })),
                        "page {page} unmapped and invalidated, yet {res:?}"
                    );
                }
            }
        }
    }
    // Every mapped page still translates to its frame.
    for page in 0..PAGES {
        if !unmapped.contains(&page) {
            let x = t
                .translate(DEV, IOVA + page * 4096, 4096, Access::Read)
                .expect("a mapped page translates");
            assert_eq!(x.as_slice()[0].phys, frame_of(&r, page));
        }
    }
    drop(t);
});

/// The queue's answers are `Ok` or a stopped queue, nothing else.
fn check_qi(res: Result<(), QiError>) {
    assert!(matches!(res, Ok(()) | Err(QiError::Stopped(_))), "{res:?}");
}
