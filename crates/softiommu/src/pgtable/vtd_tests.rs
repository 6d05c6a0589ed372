//! Unit tests of the VT-d format: layout, leaf choice, splits, gathers,
//! errors, flush counts and concurrent installs.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::vtd::{level_index, level_shift, SL_ADDR_MASK, SL_PS, SL_R, SL_W};
use super::*;
use crate::mem::{MemError, PhysMemory, PAGE_SIZE};

const K4: u64 = 4 << 10;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

fn mem() -> Arc<PhysMemory> {
    Arc::new(PhysMemory::new(64 << 20).unwrap())
}

fn table(coherent: bool) -> VtdPageTable {
    let config = if coherent {
        VtdConfig::coherent()
    } else {
        VtdConfig::non_coherent()
    };
    VtdPageTable::new(mem(), config).unwrap()
}

/// The raw entry for `iova` at `level`, following table pointers.
fn raw_entry(t: &VtdPageTable, iova: u64, level: u32) -> u64 {
    let m = t.memory();
    let mut table = t.root();
    for l in (level..=VTD_LEVELS).rev() {
        let raw = m
            .load_u64(table + level_index(iova, l) * 8, Ordering::Acquire)
            .unwrap();
        if l == level {
            return raw;
        }
        table = raw & SL_ADDR_MASK;
    }
    unreachable!()
}

fn tr(t: &VtdPageTable, iova: u64) -> Option<Translation> {
    t.iova_to_phys(iova).unwrap()
}

#[test]
fn a_4k_mapping_is_an_entry_in_the_spec_layout() {
    let t = table(true);
    let st = t.map(0x1234_5000, 0x9_8765_4000, K4, Perm::READ).unwrap();
    assert_eq!(st.tables_allocated, 3);
    assert_eq!(st.entries_written, 4, "one leaf and three table entries");
    let leaf = raw_entry(&t, 0x1234_5000, 1);
    assert_eq!(leaf, 0x9_8765_4000 | SL_R);
    for level in 2..=4 {
        let e = raw_entry(&t, 0x1234_5000, level);
        assert_eq!(e & (SL_R | SL_W | SL_PS), SL_R | SL_W, "level {level}");
    }
    assert_eq!(
        tr(&t, 0x1234_5abc),
        Some(Translation {
            phys: 0x9_8765_4abc,
            size: PageSize::Size4K,
            perm: Perm::READ
        })
    );
    assert_eq!(tr(&t, 0x1234_6000), None);
    assert_eq!(tr(&t, 0x1234_4fff), None);
    assert_eq!(t.stats().table_pages, 4);
}

#[test]
fn the_largest_leaf_alignment_allows_is_used() {
    let t = table(true);
    // 1 GiB aligned both sides: one 1 GiB leaf.
    t.map(G1, 5 * G1, G1, Perm::RW).unwrap();
    let e = raw_entry(&t, G1, 3);
    assert_eq!(e, (5 * G1) | SL_PS | SL_R | SL_W);
    assert_eq!(tr(&t, G1 + 0x12_3456).unwrap().size, PageSize::Size1G);
    assert_eq!(tr(&t, G1 + 0x12_3456).unwrap().phys, 5 * G1 + 0x12_3456);
    assert_eq!(t.stats().table_pages, 2);

    // 2 MiB congruent, 4 KiB ragged ends: 4K, 2M, 2M, 4K.
    let iova = 4 * G1 + M2 - K4;
    let phys = 7 * G1 + M2 - K4;
    let st = t.map(iova, phys, 2 * M2 + 2 * K4, Perm::WRITE).unwrap();
    assert_eq!(tr(&t, iova).unwrap().size, PageSize::Size4K);
    assert_eq!(tr(&t, iova + K4).unwrap().size, PageSize::Size2M);
    assert_eq!(tr(&t, iova + K4 + M2).unwrap().size, PageSize::Size2M);
    assert_eq!(tr(&t, iova + K4 + 2 * M2).unwrap().size, PageSize::Size4K);
    assert_eq!(tr(&t, iova + K4 + 2 * M2 + K4), None);
    assert_eq!(raw_entry(&t, iova + K4, 2) & SL_PS, SL_PS);
    assert_eq!(
        st.entries_written,
        4 + 2 + 1,
        "4 leaves, 2 PT pointers, 1 PD pointer (the PDPT exists)"
    );

    // Same length but phys not 2 MiB-congruent: 4 KiB leaves only.
    let iova = 8 * G1;
    t.map(iova, 0x1000, M2, Perm::RW).unwrap();
    assert_eq!(tr(&t, iova).unwrap().size, PageSize::Size4K);
    assert_eq!(tr(&t, iova + M2 - K4).unwrap().phys, M2);
}

#[test]
fn bad_input_is_a_typed_error_and_changes_nothing() {
    let t = table(true);
    let top = 1u64 << 48;
    assert_eq!(
        t.map(0, 0, 0, Perm::RW),
        Err(PgtableError::ZeroLength { iova: 0 })
    );
    assert!(matches!(
        t.map(0x800, 0, K4, Perm::RW),
        Err(PgtableError::Unaligned { .. })
    ));
    assert!(matches!(
        t.map(0, 0, 0x800, Perm::RW),
        Err(PgtableError::Unaligned { .. })
    ));
    assert!(matches!(
        t.map(0, 0x10, K4, Perm::RW),
        Err(PgtableError::UnalignedPhys { .. })
    ));
    assert!(matches!(
        t.map(top - K4, 0, 2 * K4, Perm::RW),
        Err(PgtableError::AddressTooWide { width: 48, .. })
    ));
    assert!(matches!(
        t.map(u64::MAX - 0xfff, 0, K4, Perm::RW),
        Err(PgtableError::AddressTooWide { .. })
    ));
    assert!(matches!(
        t.map(0, (1 << 52) - K4, 2 * K4, Perm::RW),
        Err(PgtableError::PhysTooWide { width: 52, .. })
    ));
    assert!(matches!(
        t.map(0, 0, K4, Perm::NONE),
        Err(PgtableError::NoPermission { .. })
    ));
    assert!(matches!(
        t.iova_to_phys(top),
        Err(PgtableError::AddressTooWide { .. })
    ));
    let mut g = IotlbGather::new();
    assert!(matches!(
        t.unmap(0, K4, &mut g),
        Err(PgtableError::NotMapped { at: 0, .. })
    ));
    assert!(matches!(
        t.unmap(0, 0, &mut g),
        Err(PgtableError::ZeroLength { .. })
    ));
    assert!(g.is_empty());
    assert_eq!(t.stats().table_pages, 1, "nothing was allocated");

    // The very top page is mappable.
    t.map(top - K4, 0, K4, Perm::RW).unwrap();
    assert_eq!(tr(&t, top - 1).unwrap().phys, 0xfff);
}

#[test]
fn mapping_over_a_mapping_fails_and_leaves_no_partial_mapping() {
    let t = table(true);
    t.map(M2 + 16 * K4, 0, K4, Perm::RW).unwrap();
    let pages = t.stats().table_pages;
    // Overlaps at its end: nothing of its start may be mapped afterwards.
    assert_eq!(
        t.map(M2, 0x100_0000, 17 * K4, Perm::RW),
        Err(PgtableError::AlreadyMapped {
            iova: M2,
            len: 17 * K4,
            at: M2 + 16 * K4
        })
    );
    assert_eq!(tr(&t, M2), None);
    // A large leaf in the way.
    t.map(2 * G1, 0, G1, Perm::RW).unwrap();
    assert!(matches!(
        t.map(2 * G1 - K4, 0, 2 * K4, Perm::RW),
        Err(PgtableError::AlreadyMapped { at, .. }) if at == 2 * G1
    ));
    assert_eq!(tr(&t, 2 * G1 - K4), None);
    assert_eq!(t.stats().table_pages, pages, "the 1 GiB leaf needed none");
}

#[test]
fn running_out_of_frames_fails_before_anything_is_mapped() {
    // Room for the root, three tables and two more.
    let m = Arc::new(PhysMemory::with_iommu_reserve(6 * PAGE_SIZE, 6 * PAGE_SIZE).unwrap());
    let t = VtdPageTable::new(Arc::clone(&m), VtdConfig::coherent()).unwrap();
    t.map(0, 0, K4, Perm::RW).unwrap();
    assert_eq!(m.frame_stats().allocated_frames, 4);
    // [1G - 4K, 1G + 4K) needs a PT under the existing PD, and a PD and a PT
    // under the existing PDPT: three frames, two are left.
    assert!(matches!(
        t.map(G1 - K4, 0x7000, 2 * K4, Perm::RW),
        Err(PgtableError::Mem(MemError::OutOfFrames { .. }))
    ));
    assert_eq!(tr(&t, G1 - K4), None, "no partial mapping");
    assert_eq!(tr(&t, G1), None);
    assert_eq!(m.frame_stats().allocated_frames, 4, "no frame kept");
    assert_eq!(t.stats().table_pages, 4);
    // Two new tables fit.
    t.map(G1, 0x7000, K4, Perm::RW).unwrap();
    assert_eq!(m.frame_stats().allocated_frames, 6);
    assert_eq!(tr(&t, G1).unwrap().phys, 0x7000);
}

#[test]
fn unmapping_part_of_a_2m_leaf_splits_it() {
    let t = table(true);
    let base = 4 * G1;
    t.map(base, 6 * G1, M2, Perm::READ).unwrap();
    let mut g = IotlbGather::new();
    let st = t.unmap(base + 5 * K4, K4, &mut g).unwrap();
    assert_eq!((st.splits, st.tables_allocated, st.tables_freed), (1, 1, 0));
    assert_eq!(g.range(), Some((base + 5 * K4, base + 6 * K4 - 1)));
    assert!(g.freed_tables().is_empty());
    assert_eq!(tr(&t, base + 5 * K4), None);
    for off in [0, 4 * K4, 6 * K4, M2 - K4] {
        let x = tr(&t, base + off + 8).unwrap();
        assert_eq!(
            (x.phys, x.size, x.perm),
            (6 * G1 + off + 8, PageSize::Size4K, Perm::READ)
        );
    }
    assert_eq!(raw_entry(&t, base, 2) & SL_PS, 0, "now a table pointer");
}

#[test]
fn unmapping_inside_a_1g_leaf_splits_twice() {
    let t = table(false);
    t.map(G1, 0, G1, Perm::RW).unwrap();
    let hole = G1 + M2 + K4;
    let mut g = IotlbGather::new();
    let st = t.unmap(hole, K4, &mut g).unwrap();
    assert_eq!((st.splits, st.tables_allocated), (2, 2));
    // Two new pages flushed whole before linking; then the link and the
    // cleared leaf (whose line the first batch had already flushed).
    assert_eq!((st.lines_flushed, st.flush_batches), (2 * 64 + 2, 2));
    assert_eq!(tr(&t, hole), None);
    assert_eq!(tr(&t, G1).unwrap().size, PageSize::Size2M);
    assert_eq!(tr(&t, G1 + M2).unwrap().size, PageSize::Size4K);
    assert_eq!(tr(&t, hole + K4).unwrap().phys, M2 + 2 * K4);
    assert_eq!(tr(&t, 2 * G1 - 1).unwrap().phys, G1 - 1);
    assert_eq!(tr(&t, 2 * G1 - 1).unwrap().size, PageSize::Size2M);
}

#[test]
fn a_partly_mapped_unmap_fails_and_changes_nothing() {
    let t = table(true);
    t.map(0, 0, M2, Perm::RW).unwrap();
    let mut g = IotlbGather::new();
    assert_eq!(
        t.unmap(M2 - K4, 2 * K4, &mut g),
        Err(PgtableError::NotMapped {
            iova: M2 - K4,
            len: 2 * K4,
            at: M2
        })
    );
    assert!(g.is_empty());
    assert_eq!(tr(&t, M2 - K4).unwrap().size, PageSize::Size2M, "not split");
    assert_eq!(t.stats().splits, 0);
}

#[test]
fn an_unmap_may_span_several_maps() {
    let t = table(true);
    t.map(0, 0x10_0000, 2 * K4, Perm::RW).unwrap();
    t.map(2 * K4, 0x20_0000, 2 * K4, Perm::READ).unwrap();
    let mut g = IotlbGather::new();
    t.unmap(K4, 2 * K4, &mut g).unwrap();
    assert_eq!(tr(&t, 0).unwrap().phys, 0x10_0000);
    assert_eq!(tr(&t, K4), None);
    assert_eq!(tr(&t, 2 * K4), None);
    assert_eq!(tr(&t, 3 * K4).unwrap().phys, 0x20_1000);
}

#[test]
fn tables_unlinked_by_an_unmap_are_freed_only_after_completion() {
    let m = mem();
    let t = VtdPageTable::new(Arc::clone(&m), VtdConfig::coherent()).unwrap();
    // 2 MiB of 4 KiB leaves (phys not 2 MiB aligned): one PT.
    t.map(M2, K4, M2, Perm::RW).unwrap();
    let frames = m.frame_stats().allocated_frames;
    assert_eq!(frames, 4);
    let mut g = IotlbGather::new();
    let st = t.unmap(M2, M2, &mut g).unwrap();
    assert_eq!(
        (st.tables_freed, st.entries_written),
        (1, 1),
        "one PD entry cleared"
    );
    assert_eq!(g.freed_tables().len(), 1);
    assert_eq!(raw_entry(&t, M2, 2), 0);
    assert_eq!(tr(&t, M2), None);
    assert_eq!(t.stats().table_pages, 3);
    assert_eq!(m.frame_stats().allocated_frames, frames, "not freed yet");
    assert_eq!(g.complete(), Ok(1));
    assert_eq!(m.frame_stats().allocated_frames, frames - 1);

    // A whole 1 GiB span: the PD and the PTs under it go together.
    t.map(0, K4, 3 * M2, Perm::RW).unwrap();
    t.map(3 * M2, 3 * M2, G1 - 3 * M2, Perm::RW).unwrap();
    let st = t.unmap(0, G1, &mut g).unwrap();
    assert_eq!(st.tables_freed, 1 + 3);
    assert_eq!(g.complete(), Ok(4));
    assert_eq!(t.stats().table_pages, 2);
    assert_eq!(m.frame_stats().allocated_frames, 2);
}

#[test]
fn a_smaller_unmap_keeps_an_emptied_table_linked() {
    let t = table(true);
    t.map(0, 0, K4, Perm::RW).unwrap();
    let mut g = IotlbGather::new();
    let st = t.unmap(0, K4, &mut g).unwrap();
    assert_eq!(st.tables_freed, 0);
    assert_eq!(t.stats().table_pages, 4);
    // and it is reused.
    let st = t.map(0, 0, K4, Perm::RW).unwrap();
    assert_eq!(st.tables_allocated, 0);
}

#[test]
fn a_gather_holding_pages_of_other_memory_is_refused() {
    let t1 = table(true);
    let t2 = table(true);
    t1.map(0, K4, M2, Perm::RW).unwrap();
    t2.map(0, K4, M2, Perm::RW).unwrap();
    let mut g = IotlbGather::new();
    t1.unmap(0, M2, &mut g).unwrap();
    assert_eq!(t2.unmap(0, M2, &mut g), Err(PgtableError::GatherMismatch));
    assert!(tr(&t2, 0).is_some());
    g.complete().unwrap();
    t2.unmap(0, M2, &mut g).unwrap();
    g.complete().unwrap();
}

#[test]
fn dropping_the_table_frees_every_linked_page() {
    let m = mem();
    let t = VtdPageTable::new(Arc::clone(&m), VtdConfig::coherent()).unwrap();
    t.map(0, K4, 3 * M2, Perm::RW).unwrap();
    t.map(5 * G1, 0, G1, Perm::RW).unwrap();
    t.map(200 * G1, 0, K4, Perm::RW).unwrap();
    let mut g = IotlbGather::new();
    t.unmap(0, M2, &mut g).unwrap();
    let linked = t.stats().table_pages;
    assert_eq!(m.frame_stats().allocated_frames, linked + 1);
    drop(t);
    assert_eq!(
        m.frame_stats().allocated_frames,
        1,
        "the gathered page remains"
    );
    g.complete().unwrap();
    assert_eq!(m.frame_stats().allocated_frames, 0);
}

#[test]
fn a_non_coherent_walker_gets_each_written_line_flushed_once() {
    let t = table(false);
    assert_eq!(t.stats().lines_flushed, 64, "the new root");
    // Fresh region: PDPT, PD and PT written whole (batch 1), root entry (2).
    let st = t.map(0, 0, K4, Perm::RW).unwrap();
    assert_eq!((st.lines_flushed, st.flush_batches), (3 * 64 + 1, 2));
    assert_eq!(st.lines_written, st.lines_flushed);
    // Into existing tables: one line.
    let st = t.map(K4, K4, K4, Perm::RW).unwrap();
    assert_eq!((st.lines_flushed, st.flush_batches), (1, 1));
    // 64 KiB = 16 entries from index 16: lines 2 and 3 of the PT.
    let st = t.map(16 * K4, 0, 16 * K4, Perm::RW).unwrap();
    assert_eq!((st.entries_written, st.lines_flushed), (16, 2));
    // 2 MiB of 4 KiB leaves in a new PT: the page and the PD entry.
    let st = t.map(M2, K4, M2, Perm::RW).unwrap();
    assert_eq!((st.lines_flushed, st.flush_batches), (65, 2));
    // 2 MiB leaf: one line.
    let st = t.map(2 * M2, 0, M2, Perm::RW).unwrap();
    assert_eq!(st.lines_flushed, 1);
    let mut g = IotlbGather::new();
    let st = t.unmap(K4, K4, &mut g).unwrap();
    assert_eq!((st.lines_flushed, st.flush_batches), (1, 1));
    let st = t.unmap(M2, M2, &mut g).unwrap();
    assert_eq!((st.lines_flushed, st.tables_freed), (1, 1));
    g.complete().unwrap();

    let c = table(true);
    let st = c.map(0, 0, M2 + K4, Perm::RW).unwrap();
    assert_eq!(
        (st.lines_written, st.lines_flushed, st.flush_batches),
        (0, 0, 0)
    );
    assert_eq!(c.stats().lines_flushed, 0);
    let s = t.stats();
    assert_eq!(s.lines_written, s.lines_flushed);
}

#[test]
fn disjoint_maps_race_to_install_tables_and_all_win() {
    // Several rounds: the first installs of a fresh table race most.
    for coherent in [true, false, true, false, true, false, true, false] {
        let m = mem();
        let t = Arc::new(
            VtdPageTable::new(
                Arc::clone(&m),
                VtdConfig {
                    coherent,
                    ..VtdConfig::non_coherent()
                },
            )
            .unwrap(),
        );
        const THREADS: u64 = 4;
        const PAGES: u64 = 2048; // four PTs, one PD, one PDPT
        let base = 3 * G1;
        std::thread::scope(|s| {
            for i in 0..THREADS {
                let t = Arc::clone(&t);
                s.spawn(move || {
                    for p in (i..PAGES).step_by(THREADS as usize) {
                        t.map(base + p * K4, p * 2 * K4, K4, Perm::RW).unwrap();
                    }
                });
            }
        });
        for p in 0..PAGES {
            assert_eq!(tr(&t, base + p * K4).unwrap().phys, p * 2 * K4);
        }
        assert_eq!(t.stats().table_pages, 1 + 1 + 1 + 4);
        assert_eq!(
            m.frame_stats().allocated_frames,
            7,
            "losers' pages were freed"
        );
        // Unmap in parallel, each thread its own 2 MiB: each frees its PT.
        let gathered: Vec<IotlbGather> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|i| {
                    let t = Arc::clone(&t);
                    s.spawn(move || {
                        let mut g = IotlbGather::new();
                        t.unmap(base + i * M2, M2, &mut g).unwrap();
                        g
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for mut g in gathered {
            assert_eq!(g.complete(), Ok(1));
        }
        assert_eq!(m.frame_stats().allocated_frames, 3);
    }
}

#[test]
fn entries_decode_by_the_spec() {
    assert_eq!(decode_entry(0, 4), SlEntry::NotPresent);
    assert_eq!(
        decode_entry(0x5000 | SL_PS, 2),
        SlEntry::NotPresent,
        "no R/W: not present"
    );
    assert_eq!(
        decode_entry(0x5000 | SL_R | SL_W, 4),
        SlEntry::Table {
            addr: 0x5000,
            perm: Perm::RW
        }
    );
    assert!(matches!(
        decode_entry(0x5000 | SL_R | SL_PS, 4),
        SlEntry::Reserved { .. }
    ));
    assert!(matches!(
        decode_entry((M2 + K4) | SL_R | SL_PS, 2),
        SlEntry::Reserved { .. }
    ));
    assert_eq!(
        decode_entry(M2 | SL_W | SL_PS, 2),
        SlEntry::Leaf {
            addr: M2,
            size: PageSize::Size2M,
            perm: Perm::WRITE
        }
    );
    assert_eq!(
        decode_entry(G1 | SL_R | SL_PS | (1 << 62), 3),
        SlEntry::Leaf {
            addr: G1,
            size: PageSize::Size1G,
            perm: Perm::READ
        }
    );
    assert_eq!(
        decode_entry(K4 | SL_R | SL_PS, 1),
        SlEntry::Leaf {
            addr: K4,
            size: PageSize::Size4K,
            perm: Perm::READ
        },
        "PS is ignored at level 1"
    );
    assert_eq!((level_shift(1), level_shift(4)), (12, 39));
    let iova = (3 << 39) | (5 << 30) | (7 << 21) | (9 << 12) | 0xabc;
    let idx: Vec<u64> = (1..=4).map(|l| level_index(iova, l)).collect();
    assert_eq!(idx, [9, 7, 5, 3]);
    assert!(VtdConfig::from_ecap(ECAP_C).coherent);
    assert!(!VtdConfig::from_ecap(0xf0).coherent);
}

#[test]
fn a_map_needing_more_tables_than_memory_has_fails_fast() {
    let m = Arc::new(PhysMemory::with_iommu_reserve(1 << 20, 1 << 20).unwrap());
    let t = VtdPageTable::new(Arc::clone(&m), VtdConfig::coherent()).unwrap();
    // 2^47 bytes of 4 KiB leaves would need 2^26 PTs.
    assert!(matches!(
        t.map(0, K4, 1 << 47, Perm::RW),
        Err(PgtableError::Mem(MemError::OutOfFrames { .. }))
    ));
    assert_eq!(m.frame_stats().allocated_frames, 1);
    // Within the reserve's size, but more than is free: 128 of its 256
    // frames held.
    let mut hog = m.hold_iommu_frames();
    m.release_iommu_frames(hog.split_off(128)).unwrap();
    assert!(matches!(
        t.map(0, K4, 200 * M2, Perm::RW),
        Err(PgtableError::Mem(MemError::OutOfFrames { .. }))
    ));
    assert_eq!(m.frame_stats().allocated_frames, 1 + 128);
    assert_eq!(tr(&t, 0), None);
    m.release_iommu_frames(hog).unwrap();
    t.map(0, K4, 200 * M2, Perm::RW).unwrap();
    assert_eq!(t.stats().table_pages, 1 + 1 + 1 + 200);
}

#[test]
fn map_fresh_maps_as_map_does_and_debug_builds_still_refuse_an_overlap() {
    let t = table(true);
    // A new region: the general path builds the tables.
    t.map_fresh(K4, 5 * K4, K4, Perm::RW).unwrap();
    // Into the existing last-level table: the one-walk path.
    t.map_fresh(2 * K4, 9 * K4, 2 * K4, Perm::READ).unwrap();
    for (iova, phys) in [(K4, 5 * K4), (2 * K4, 9 * K4), (3 * K4, 10 * K4)] {
        let tr = t.iova_to_phys(iova).unwrap().expect("mapped");
        assert_eq!(tr.phys, phys);
    }
    assert!(matches!(
        t.map_fresh(K4, 0, 3, Perm::RW),
        Err(PgtableError::Unaligned { .. })
    ));
    if cfg!(debug_assertions) {
        assert!(matches!(
            t.map_fresh(2 * K4, 0, K4, Perm::RW),
            Err(PgtableError::AlreadyMapped { .. })
        ));
        assert_eq!(t.iova_to_phys(2 * K4).unwrap().unwrap().phys, 9 * K4);
    }
}

// ----- collapse_2m -----

/// Maps the 2 MiB block at `iova` → `phys` one 4 KiB page at a time (as a
/// device faulting it in does).
fn map_by_pages(t: &VtdPageTable, iova: u64, phys: u64, perm: Perm) {
    for i in 0..512 {
        t.map(iova + i * K4, phys + i * K4, K4, perm).unwrap();
    }
}

#[test]
fn collapse_turns_512_contiguous_4k_leaves_into_one_2m_leaf() {
    for coherent in [true, false] {
        let m = mem();
        let cfg = if coherent {
            VtdConfig::coherent()
        } else {
            VtdConfig::non_coherent()
        };
        let t = VtdPageTable::new(Arc::clone(&m), cfg).unwrap();
        let (base, phys) = (3 * G1 + 4 * M2, 6 * M2);
        map_by_pages(&t, base, phys, Perm::RW);
        assert_eq!(tr(&t, base + 7 * K4 + 9).unwrap().size, PageSize::Size4K);
        let pages = m.frame_stats().allocated_frames;
        let pt = raw_entry(&t, base, 2) & SL_ADDR_MASK;
        let mut g = IotlbGather::new();
        let st = t.collapse_2m(base, &mut g).unwrap().expect("collapsible");
        assert_eq!(
            (st.collapses, st.tables_freed, st.entries_written),
            (1, 1, 1)
        );
        if coherent {
            assert_eq!(st.lines_flushed, 0);
        } else {
            assert_eq!((st.lines_flushed, st.flush_batches), (1, 1), "the PDE");
        }
        assert_eq!(raw_entry(&t, base, 2), phys | SL_PS | SL_R | SL_W);
        for off in [0, 8, 5 * K4 + 3, M2 - 1] {
            let x = tr(&t, base + off).unwrap();
            assert_eq!(
                (x.phys, x.size, x.perm),
                (phys + off, PageSize::Size2M, Perm::RW)
            );
        }
        // The old table waits in the gather for the caller's invalidation.
        assert_eq!(g.freed_tables(), &[pt]);
        assert_eq!(g.range(), Some((base, base + M2 - 1)));
        assert_eq!(m.frame_stats().allocated_frames, pages, "not freed yet");
        assert_eq!(g.complete(), Ok(1));
        assert_eq!(m.frame_stats().allocated_frames, pages - 1);
        let s = t.stats();
        assert_eq!((s.collapses, s.table_pages), (1, 3), "root, PDPT, PD");
        // A 2 MiB leaf has nothing to collapse.
        assert_eq!(t.collapse_2m(base, &mut g), Ok(None));
    }
}

#[test]
fn collapse_refuses_a_hole_scattered_or_misaligned_leaves_or_mixed_rights() {
    let t = table(true);
    let mut g = IotlbGather::new();
    let check_unchanged = |t: &VtdPageTable, g: &mut IotlbGather, base: u64| {
        let before: Vec<_> = (0..512).map(|i| tr(t, base + i * K4)).collect();
        assert_eq!(t.collapse_2m(base, g), Ok(None));
        assert!(g.is_empty());
        let after: Vec<_> = (0..512).map(|i| tr(t, base + i * K4)).collect();
        assert_eq!(before, after);
        assert_eq!(raw_entry(t, base, 2) & SL_PS, 0, "still a table");
    };
    // A hole (the last page).
    let b = 0;
    for i in 0..511 {
        t.map(b + i * K4, 2 * M2 + i * K4, K4, Perm::RW).unwrap();
    }
    check_unchanged(&t, &mut g, b);
    // Not contiguous: two pages swapped.
    let b = M2;
    map_by_pages(&t, b, 4 * M2, Perm::RW);
    let mut u = IotlbGather::new();
    t.unmap(b + 10 * K4, 2 * K4, &mut u).unwrap();
    t.map(b + 10 * K4, 4 * M2 + 11 * K4, K4, Perm::RW).unwrap();
    t.map(b + 11 * K4, 4 * M2 + 10 * K4, K4, Perm::RW).unwrap();
    check_unchanged(&t, &mut g, b);
    // Contiguous but not 2 MiB-aligned in physical memory.
    let b = 2 * M2;
    map_by_pages(&t, b, 8 * M2 + K4, Perm::RW);
    check_unchanged(&t, &mut g, b);
    // Mixed rights.
    let b = 3 * M2;
    for i in 0..512 {
        let p = if i == 300 { Perm::READ } else { Perm::RW };
        t.map(b + i * K4, 10 * M2 + i * K4, K4, p).unwrap();
    }
    check_unchanged(&t, &mut g, b);
    // Nothing mapped at all.
    assert_eq!(t.collapse_2m(5 * G1, &mut g), Ok(None));
    assert_eq!(t.stats().collapses, 0);
    u.complete().unwrap();
}

#[test]
fn collapse_of_bad_input_is_a_typed_error_and_changes_nothing() {
    let t = table(true);
    map_by_pages(&t, M2, 2 * M2, Perm::RW);
    let mut g = IotlbGather::new();
    assert!(matches!(
        t.collapse_2m(M2 + K4, &mut g),
        Err(PgtableError::Unaligned { iova, len: M2, align: M2 }) if iova == M2 + K4
    ));
    assert!(matches!(
        t.collapse_2m(1 << 48, &mut g),
        Err(PgtableError::AddressTooWide { width: 48, .. })
    ));
    // A gather holding another memory's pages.
    let other = table(true);
    other.map(0, K4, M2, Perm::RW).unwrap();
    other.unmap(0, M2, &mut g).unwrap();
    assert!(matches!(
        t.collapse_2m(M2, &mut g),
        Err(PgtableError::GatherMismatch)
    ));
    assert_eq!(tr(&t, M2).unwrap().size, PageSize::Size4K, "unchanged");
    g.complete().unwrap();
    assert!(t.collapse_2m(M2, &mut g).unwrap().is_some());
    g.complete().unwrap();
}

#[test]
fn a_collapsed_leaf_unmapped_in_part_splits_and_collapses_again() {
    let t = table(true);
    let (base, phys) = (G1, 12 * M2);
    map_by_pages(&t, base, phys, Perm::READ);
    let mut g = IotlbGather::new();
    t.collapse_2m(base, &mut g).unwrap().unwrap();
    g.complete().unwrap();
    // Reclaim-like: 4 pages in the middle go; the rest stays, as 4 KiB.
    let st = t.unmap(base + 100 * K4, 4 * K4, &mut g).unwrap();
    assert_eq!((st.splits, st.tables_allocated), (1, 1));
    g.complete().unwrap();
    assert_eq!(tr(&t, base + 101 * K4), None);
    let x = tr(&t, base + 104 * K4 + 5).unwrap();
    assert_eq!((x.phys, x.size), (phys + 104 * K4 + 5, PageSize::Size4K));
    assert_eq!(t.collapse_2m(base, &mut g), Ok(None), "a hole");
    // Faulted back in: one 2 MiB leaf again.
    for i in 100..104 {
        t.map(base + i * K4, phys + i * K4, K4, Perm::READ).unwrap();
    }
    assert!(t.collapse_2m(base, &mut g).unwrap().is_some());
    g.complete().unwrap();
    let x = tr(&t, base + 101 * K4).unwrap();
    assert_eq!(
        (x.phys, x.size, x.perm),
        (phys + 101 * K4, PageSize::Size2M, Perm::READ)
    );
    assert_eq!(t.stats().collapses, 2);
}

#[test]
fn a_walker_sees_the_same_translation_throughout_a_collapse() {
    const BLOCKS: u64 = 8;
    let t = Arc::new(table(true));
    let (base, phys) = (7 * G1, 32 * M2);
    for b in 0..BLOCKS {
        map_by_pages(&t, base + b * M2, phys + b * M2, Perm::RW);
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let walks = std::sync::atomic::AtomicU64::new(0);
    let mut g = IotlbGather::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut x = 0x1234_5678_u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let off = (x % (BLOCKS * M2)) & !7;
                let got = t.iova_to_phys(base + off).unwrap();
                assert_eq!(got.map(|g| g.phys), Some(phys + off), "at {off:#x}");
                walks.fetch_add(1, Ordering::Relaxed);
            }
        });
        // Waits (bounded) for the walker to walk past `n` walks: on a
        // loaded machine its thread may start late, and a sleep is no
        // proof that it ran at all.
        let walked_past = |n: u64| {
            let t0 = std::time::Instant::now();
            while walks.load(Ordering::Relaxed) <= n {
                assert!(t0.elapsed() < std::time::Duration::from_secs(30), "no walk");
                std::thread::yield_now();
            }
        };
        walked_past(0);
        for b in 0..BLOCKS {
            std::thread::yield_now();
            assert!(t.collapse_2m(base + b * M2, &mut g).unwrap().is_some());
        }
        // And walks the collapsed table before it stops.
        walked_past(walks.load(Ordering::Relaxed));
        stop.store(true, Ordering::Relaxed);
    });
    // Freed only once the walker has stopped (the caller's "wait").
    assert_eq!(g.complete(), Ok(BLOCKS as usize));
    assert!(walks.load(Ordering::Relaxed) > 0);
    assert_eq!(t.stats().collapses, BLOCKS);
}
