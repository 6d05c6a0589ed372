//! Hostile bytes in page-table pages a table owner controls.
//!
//! Device A's context points at a table whose every page is a frame of
//! the IOMMU reserve (tables live nowhere else) that the fuzzer writes at
//! will; device B's at a real `VtdPageTable` whose pages it also
//! scribbles on. Entries point anywhere: at each other (loops), into RAM
//! (where no table may be followed), past memory, at the unit's own
//! frames, with reserved bits. Every walk must end (four levels at most),
//! every translation must land inside RAM (never in the reserve), device
//! accesses and the table's software walk must answer with errors, never
//! panic.

#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softiommu::hw::{Access, ContextEntry, SourceId, Unit, UnitConfig};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, Perm, VtdConfig, VtdPageTable};
use softiommu::{DmaAccessor, DmaAttrs};

const A: SourceId = SourceId(0x0100);
const B: SourceId = SourceId(0x0200);
const GUEST_FRAMES: u64 = 8;
const MEM: u64 = 8 << 20;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Value {
    Raw(u64),
    /// An entry pointing at table frame `frame`, with the low 12 bits and
    /// the bits above the address as given.
    Guest {
        frame: u8,
        low: u16,
        high: u16,
    },
    /// An entry pointing at the real table's root (an IOMMU frame: as a
    /// leaf it is refused, since leaves must lie in RAM; as a table it
    /// feeds walks odd tables).
    TableRoot {
        low: u16,
    },
    /// An entry pointing at the invalidation ring.
    Ring {
        low: u16,
    },
    /// An entry pointing near the end of RAM, or past it.
    End {
        pages: i8,
        low: u16,
    },
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Store `value` at entry `index` of guest frame `frame`.
    Guest {
        frame: u8,
        index: u16,
        value: Value,
    },
    /// Store `value` at entry `index` of the real table's root page.
    Table {
        index: u16,
        value: Value,
    },
    /// Map a page into the real table (so its lower levels exist).
    Map {
        iova: u32,
        frame: u8,
        write: bool,
    },
    /// Invalidate the IOTLB (the guest's writes show up on the next walk).
    Flush,
    Translate {
        b: bool,
        iova: u64,
        len: u32,
        write: bool,
    },
    Read {
        b: bool,
        iova: u64,
        len: u16,
    },
    Write {
        b: bool,
        iova: u64,
        len: u16,
    },
    /// The table's own software walk of its (scribbled) bytes.
    SoftWalk {
        iova: u64,
    },
}

fuzz_target!(|ops: Vec<Op>| {
    let mem = Arc::new(PhysMemory::new(MEM).expect("memory"));
    let unit = Unit::new(mem.clone(), UnitConfig::default()).expect("unit");
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).expect("table");
    // Eight consecutive frames of the reserve (its allocator hands out the
    // lowest first); the rest go back, for the real table to grow into.
    let mut held = mem.hold_iommu_frames();
    let rest = held.split_off(GUEST_FRAMES as usize);
    mem.release_iommu_frames(rest).expect("release");
    let guest = held[0];
    assert!(held.windows(2).all(|w| w[1] == w[0] + 4096), "consecutive");
    let data = mem.alloc_zeroed_frames(3).expect("data frames");
    unit.attach(
        A,
        ContextEntry::Translated {
            did: 1,
            root: guest,
        },
    )
    .expect("attach A");
    unit.attach(
        B,
        ContextEntry::Translated {
            did: 2,
            root: table.root(),
        },
    )
    .expect("attach B");
    let ring = unit.queue_registers().base;
    let mut t = unit.translator().expect("translator");
    let mut acc = [
        DmaAccessor::new(&unit, A).expect("accessor A"),
        DmaAccessor::new(&unit, B).expect("accessor B"),
    ];
    let value = |v: Value| -> u64 {
        match v {
            Value::Raw(x) => x,
            Value::Guest { frame, low, high } => {
                (u64::from(high) << 52)
                    | (guest + u64::from(frame) % GUEST_FRAMES * 4096)
                    | u64::from(low & 0xfff)
            }
            Value::TableRoot { low } => table.root() | u64::from(low & 0xfff),
            Value::Ring { low } => ring | u64::from(low & 0xfff),
            Value::End { pages, low } => {
                ((MEM as i64 + i64::from(pages) * 4096) as u64 & !0xfff) | u64::from(low & 0xfff)
            }
        }
    };
    let mut buf = vec![0u8; 1 << 16];
    for op in ops.into_iter().take(128) {
        match op {
            Op::Guest {
                frame,
                index,
                value: v,
            } => {
                let at =
                    guest + u64::from(frame) % GUEST_FRAMES * 4096 + u64::from(index % 512) * 8;
                mem.write(at, &value(v).to_le_bytes()).expect("guest write");
            }
            Op::Table { index, value: v } => {
                let at = table.root() + u64::from(index % 512) * 8;
                mem.write(at, &value(v).to_le_bytes()).expect("table write");
            }
            Op::Map { iova, frame, write } => {
                let perm = if write { Perm::RW } else { Perm::READ };
                let phys = data + u64::from(frame % 8) * 4096;
                // The scribbled table may refuse; it must not panic.
                let _ = table.map(u64::from(iova) << 12 & ((1 << 48) - 1), phys, 4096, perm);
            }
            Op::Flush => {
                let _ = unit.invalidate_all();
                let _ = unit.wait();
            }
            Op::Translate {
                b,
                iova,
                len,
                write,
            } => {
                let sid = if b { B } else { A };
                let access = if write { Access::Write } else { Access::Read };
                let len = u64::from(len % (1 << 20));
                if let Ok(x) = t.translate(sid, iova, len, access) {
                    assert_eq!(x.total_len(), len);
                    for r in x.iter() {
                        assert!(
                            r.phys.checked_add(r.len).is_some_and(|e| e <= MEM),
                            "{sid} {iova:#x}+{len:#x}: {r:?} outside memory"
                        );
                    }
                }
            }
            Op::Read { b, iova, len } => {
                let n = usize::from(len).max(1);
                let _ = acc[usize::from(b)].read(iova, &mut buf[..n], DmaAttrs::ORDERED);
            }
            Op::Write { b, iova, len } => {
                let n = usize::from(len).max(1);
                let _ = acc[usize::from(b)].write(iova, &buf[..n], DmaAttrs::ORDERED);
            }
            Op::SoftWalk { iova } => {
                if let Ok(Some(tr)) = table.iova_to_phys(iova) {
                    let _ = tr.leaf_phys();
                }
            }
        }
    }
});
