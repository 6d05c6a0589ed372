//! A driver of the IOTLB hit path for instruction counting: the loop of
//! `softiommu bench translate`'s hit case (64-byte reads at random offsets
//! of random pages out of 2,048 scattered 4 KiB mappings, each checked to
//! fit in what the translation returns), run a fixed number of times.
//!
//! `cargo run --release -p softiommu --example hit_path -- [LOOKUPS] [pt]`
//! (`pt`: the device in pass-through, reading random physical pages of the
//! first GiB instead); under callgrind, collect only `hits` for the per-hit count:
//! `valgrind --tool=callgrind --toggle-collect='*hit_path*hits*' ...`.

use std::sync::Arc;

use softiommu::hw::{Access, ContextEntry, SourceId, System, Translator, UnitConfig};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, Perm, VtdConfig, VtdPageTable};

const SID: SourceId = SourceId(0x0400);
const SEQ: usize = 1 << 16;
const PAGES: u64 = 2048;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// The measured loop: `n` single-page reads through `tr`.
#[inline(never)]
fn hits(tr: &mut Translator, lookups: &[u64], n: usize) -> u64 {
    let mut sink = 0u64;
    for i in 0..n {
        let span = tr
            .translate_page(SID, lookups[i & (SEQ - 1)], Access::Read)
            .expect("mapped");
        assert!(span.len >= 64);
        sink = sink.wrapping_add(span.phys);
    }
    sink
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1 << 20);
    let pt = std::env::args().nth(2).as_deref() == Some("pt");
    let mem = Arc::new(PhysMemory::new(8 << 30)?);
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default())?;
    sys.assign(SID, unit)?;
    let table = VtdPageTable::new(mem.clone(), VtdConfig::coherent())?;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut used = std::collections::HashSet::new();
    let mut iovas = Vec::new();
    while iovas.len() < PAGES as usize {
        let pfn = (1 << 20) + rng.below(1 << 26);
        if !used.insert(pfn) {
            continue;
        }
        table.map(pfn << 12, rng.below(1 << 18) << 12, 4096, Perm::RW)?;
        iovas.push(pfn << 12);
    }
    let lookups: Vec<u64> = (0..SEQ)
        .map(|_| {
            if pt {
                (rng.below(1 << 18) << 12) + 64 * rng.below(64)
            } else {
                iovas[rng.below(PAGES) as usize] + 64 * rng.below(64)
            }
        })
        .collect();
    let u = sys.unit(unit).ok_or("unit")?;
    let ctx = if pt {
        ContextEntry::PassThrough
    } else {
        ContextEntry::Translated {
            did: 1,
            root: table.root(),
        }
    };
    u.attach(SID, ctx)?;
    let mut tr = u.translator()?;
    for &iova in &iovas {
        let _ = tr.translate(SID, iova, 64, Access::Read);
    }
    let before = tr.stats();
    let sink = hits(&mut tr, &lookups, n);
    let after = tr.stats();
    println!(
        "lookups {} hits {} walks {} sink {sink:#x}",
        after.lookups - before.lookups,
        after.hits - before.hits,
        after.walks - before.walks
    );
    Ok(())
}
