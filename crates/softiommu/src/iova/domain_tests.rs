//! Unit tests of the domain, the caches and each policy's depot behaviour.

use std::time::Duration;

use super::*;

const END: u64 = (1 << 20) - 1; // a 4 GiB domain

fn snapshot(d: &IovaDomain) -> (IovaStats, Option<Vec<(u64, u64)>>) {
    (d.stats(), d.free_extents())
}

#[test]
fn bad_input_is_a_typed_error_and_changes_nothing() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut c = d.cpu_cache();
        let a = c.alloc(4, END).unwrap();
        let before = snapshot(&d);
        assert_eq!(c.alloc(0, END), Err(IovaError::ZeroSize));
        assert!(matches!(
            c.alloc(1 << 21, END),
            Err(IovaError::TooLarge { .. })
        ));
        assert!(matches!(
            d.alloc(1, 0),
            Err(IovaError::LimitBelowStart { .. })
        ));
        assert_eq!(
            c.free(a + 1, 1),
            Err(IovaError::NotAllocated { pfn: a + 1 })
        );
        assert_eq!(
            c.free(a, 2),
            Err(IovaError::WrongSize {
                pfn: a,
                pages: 2,
                allocated_pages: 4
            })
        );
        assert_eq!(
            d.free(a, 8),
            Err(IovaError::WrongSize {
                pfn: a,
                pages: 8,
                allocated_pages: 4
            })
        );
        assert!(matches!(
            c.free(END + 10, 1),
            Err(IovaError::OutsideDomain { .. })
        ));
        assert_eq!(c.free(a, 0), Err(IovaError::ZeroSize));
        assert_eq!(
            snapshot(&d),
            before,
            "{policy}: a failed call changed the state"
        );
        c.free(a, 4).unwrap();
        let before = snapshot(&d);
        assert_eq!(
            c.free(a, 4),
            Err(IovaError::NotAllocated { pfn: a }),
            "{policy}: double free"
        );
        assert_eq!(d.free(a, 4), Err(IovaError::NotAllocated { pfn: a }));
        assert_eq!(snapshot(&d), before);
    }
}

#[test]
fn invalid_domains_and_reservations_are_refused() {
    assert!(matches!(
        IovaDomain::new(0, 10, IovaPolicy::Softiommu),
        Err(IovaError::InvalidRange { lo: 0, hi: 10 })
    ));
    assert!(matches!(
        IovaDomain::new(10, 5, IovaPolicy::Softiommu),
        Err(IovaError::InvalidRange { lo: 10, hi: 5 })
    ));
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        d.reserve(MSI_WINDOW_PFNS.0, MSI_WINDOW_PFNS.1).unwrap();
        let before = snapshot(&d);
        assert!(matches!(
            d.reserve(0xFEE80, 0xFEF10),
            Err(IovaError::ReservedOverlap { .. })
        ));
        assert!(matches!(
            d.reserve(0xFED00, 0xFEE00),
            Err(IovaError::ReservedOverlap { .. })
        ));
        assert!(matches!(
            d.reserve(5, 4),
            Err(IovaError::InvalidRange { .. })
        ));
        assert!(matches!(
            d.reserve(END, END + 1),
            Err(IovaError::OutsideDomain { .. })
        ));
        assert_eq!(snapshot(&d), before);
        let got = d.find(0xFEE42).unwrap();
        assert_eq!(
            (got.pfn, got.pages, got.state),
            (0xFEE00, 256, BlockState::Reserved)
        );
    }
}

#[test]
fn masks_are_honoured_and_large_masks_go_top_down() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, (1 << 36) - 1, policy).unwrap();
        let mut c = d.cpu_cache();
        let low = c.alloc(1, d.limit_for_mask(u32::MAX as u64)).unwrap();
        assert!(low <= 0xFFFFF, "{policy}: 32-bit mask gave {low:#x}");
        assert_eq!(low, 0xFFFFF, "{policy}: top-down from the 32-bit limit");
        let high = c.alloc(8, d.limit_for_mask(u64::MAX)).unwrap();
        assert_eq!(
            high,
            (1 << 36) - 8,
            "{policy}: top-down from the domain's end"
        );
        assert_eq!(high % 8, 0);
    }
}

#[test]
fn the_msi_window_is_never_handed_out() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(0xFE000, 0xFFFFF, policy).unwrap();
        d.reserve(MSI_WINDOW_PFNS.0, MSI_WINDOW_PFNS.1).unwrap();
        let mut c = d.cpu_cache();
        let mut got = Vec::new();
        while let Ok(p) = c.alloc(1, 0xFFFFF) {
            assert!(
                !(MSI_WINDOW_PFNS.0..=MSI_WINDOW_PFNS.1).contains(&p),
                "{policy}: {p:#x}"
            );
            got.push(p);
        }
        assert_eq!(
            got.len(),
            0x2000 - 0x100,
            "{policy}: every other page was handed out"
        );
        assert!(matches!(
            c.alloc(1, 0xFFFFF),
            Err(IovaError::NoSpace { .. })
        ));
    }
}

#[test]
fn find_tells_live_from_cached() {
    let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
    let mut c = d.cpu_cache();
    let a = c.alloc(16, END).unwrap();
    let b = d.find(a + 9).unwrap();
    assert_eq!((b.pfn, b.pages, b.state), (a, 16, BlockState::Live));
    c.free(a, 16).unwrap();
    assert_eq!(d.find(a + 9).unwrap().state, BlockState::Cached);
    drop(c);
    assert_eq!(d.find(a + 9), None, "a dropped cache gives its IOVAs back");
    assert_eq!(d.stats().tree_blocks, 0);
}

#[test]
fn a_block_is_retired_only_as_the_kind_that_holds_it() {
    let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
    let mut c = d.cpu_cache();
    let a = c.alloc(4, END).unwrap();
    d.set_kind(a, 4, BlockKind::Plain, BlockKind::ScatterList)
        .unwrap();
    assert_eq!(
        d.set_kind(a, 4, BlockKind::Plain, BlockKind::Coherent),
        Err(IovaError::NotAllocated { pfn: a }),
        "marked already"
    );
    // A streaming unmap's retire, a coherent free's, and a plain free of
    // the allocator's own: all refused, the block untouched.
    for wrong in [
        d.retire_block(a, 4),
        d.retire_block_of(a, 4, BlockKind::Coherent),
        c.free(a, 4),
        d.free(a, 4),
    ] {
        assert_eq!(wrong, Err(IovaError::NotAllocated { pfn: a }));
    }
    assert_eq!(d.find(a).unwrap().state, BlockState::Live);
    // The size is still checked first.
    assert!(matches!(
        d.retire_block_of(a, 2, BlockKind::ScatterList),
        Err(IovaError::WrongSize { .. })
    ));
    d.retire_block_of(a, 4, BlockKind::ScatterList).unwrap();
    d.unretire_block(a, 4, BlockKind::ScatterList, 0).unwrap();
    assert_eq!(
        d.retire_block(a, 4),
        Err(IovaError::NotAllocated { pfn: a }),
        "the undo gives the kind back"
    );
    d.retire_block_of(a, 4, BlockKind::ScatterList).unwrap();
    c.free_retired(a, 4).unwrap();
    // Reused, the block starts plain again.
    let b = c.alloc(4, END).unwrap();
    assert_eq!(b, a);
    d.retire_block(b, 4).unwrap();
    c.free_retired(b, 4).unwrap();
}

#[test]
fn a_tagged_retire_checks_block_size_and_tag_in_one_step_and_changes_nothing_when_refused() {
    let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
    let mut c = d.cpu_cache();
    let a = c.alloc(4, END).unwrap();
    // Every allocation starts untagged; a tag keeps the block's state.
    assert_eq!(d.tag(a), 0);
    c.set_tag(a, 0x8000_0123).unwrap();
    assert_eq!(d.tag(a), 0x8000_0123);
    assert_eq!(d.find(a).unwrap().state, BlockState::Live);
    // Another tag: refused with the tag the block carries, nothing changed.
    assert_eq!(
        c.retire_tagged(a, 4, 0x8000_0124),
        Err(RetireRefused::Tag(0x8000_0123))
    );
    // Another size, or no block there: the allocator's reason.
    assert!(matches!(
        c.retire_tagged(a, 2, 0x8000_0123),
        Err(RetireRefused::Block(IovaError::WrongSize { .. }))
    ));
    assert_eq!(
        c.retire_tagged(a + 1, 1, 0x8000_0123),
        Err(RetireRefused::Block(IovaError::NotAllocated { pfn: a + 1 }))
    );
    assert_eq!(d.find(a).unwrap().state, BlockState::Live);
    assert_eq!(d.tag(a), 0x8000_0123, "a refused retire keeps the tag");
    // The exact tag retires it, and the tag goes with the retire.
    c.retire_tagged(a, 4, 0x8000_0123).unwrap();
    assert_eq!(d.find(a).unwrap().state, BlockState::Retired);
    assert_eq!(d.tag(a), 0);
    assert_eq!(
        c.retire_tagged(a, 4, 0x8000_0123),
        Err(RetireRefused::Block(IovaError::NotAllocated { pfn: a })),
        "a second retire is refused"
    );
    // Undone with its tag (an unmap that could not go on), then retired
    // again and freed: reused, the block is untagged.
    d.unretire_block(a, 4, BlockKind::Plain, 0x8000_0123)
        .unwrap();
    assert_eq!(d.tag(a), 0x8000_0123);
    c.retire_tagged(a, 4, 0x8000_0123).unwrap();
    c.free_retired(a, 4).unwrap();
    let b = c.alloc(4, END).unwrap();
    assert_eq!((b, d.tag(b)), (a, 0));
    // A tagged live block is still freed by its holder, untagged after.
    c.set_tag(b, 0x8000_0555).unwrap();
    c.free(b, 4).unwrap();
    assert_eq!(d.find(b).unwrap().state, BlockState::Cached);
    assert_eq!(d.tag(b), 0);
    // The kind of a retire that reads the tag: returned, and restored by
    // the undo.
    let s = c.alloc(2, END).unwrap();
    d.set_kind(s, 2, BlockKind::Plain, BlockKind::ScatterList)
        .unwrap();
    c.set_tag(s, 0x8000_0777).unwrap();
    assert_eq!(
        c.retire_block_of(s, 2, BlockKind::ScatterList, 0, 0),
        Ok(0x8000_0777)
    );
    d.unretire_block(s, 2, BlockKind::ScatterList, 0x8000_0777)
        .unwrap();
    assert_eq!(d.tag(s), 0x8000_0777);
    // A tag that does not hold what is asked in the bits asked: refused
    // before anything changes, with the tag seen.
    assert_eq!(
        c.retire_block_of(s, 2, BlockKind::ScatterList, 0xff00_0000, 0x8100_0000),
        Err(RetireRefused::Tag(0x8000_0777))
    );
    assert_eq!(
        (d.find(s).unwrap().state, d.tag(s)),
        (BlockState::Live, 0x8000_0777)
    );
    // Taking the kind off (a block given back unused) clears the tag: a
    // plain block never carries a scatter list's tag.
    d.set_kind(s, 2, BlockKind::ScatterList, BlockKind::Plain)
        .unwrap();
    assert_eq!(d.tag(s), 0);
    // Marked and tagged in one step, only from plain and untagged: a block
    // retired meanwhile (or marked already) is refused, nothing changed.
    let m = c.alloc(2, END).unwrap();
    c.mark_tagged(m, 2, BlockKind::ScatterList, 0x8000_0888)
        .unwrap();
    assert_eq!(d.tag(m), 0x8000_0888);
    assert_eq!(
        c.mark_tagged(m, 2, BlockKind::ScatterList, 0x8000_0999),
        Err(IovaError::NotAllocated { pfn: m })
    );
    assert_eq!(
        c.retire_block_of(m, 2, BlockKind::ScatterList, 0, 0),
        Ok(0x8000_0888)
    );
    assert_eq!(
        c.mark_tagged(m, 2, BlockKind::ScatterList, 0x8000_0999),
        Err(IovaError::NotAllocated { pfn: m })
    );
    assert_eq!(
        (d.find(m).unwrap().state, d.tag(m)),
        (BlockState::Retired, 0)
    );
}

#[test]
fn a_retired_block_is_freed_only_by_free_retired() {
    let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
    let mut c = d.cpu_cache();
    let a = c.alloc(4, END).unwrap();
    assert!(matches!(
        d.retire_block(a, 2),
        Err(IovaError::WrongSize { .. })
    ));
    assert_eq!(c.free_retired(a, 4), Err(IovaError::NotRetired { pfn: a }));
    d.retire_block(a, 4).unwrap();
    assert_eq!(d.find(a + 3).unwrap().state, BlockState::Retired);
    for again in [d.retire_block(a, 4), c.free(a, 4), d.free(a, 4)] {
        assert_eq!(
            again,
            Err(IovaError::NotAllocated { pfn: a }),
            "released already"
        );
    }
    c.free_retired(a, 4).unwrap();
    assert_eq!(d.find(a).unwrap().state, BlockState::Cached);
    assert_eq!(
        c.free_retired(a, 4),
        Err(IovaError::NotAllocated { pfn: a })
    );
}

/// A domain over `[64, 127]` whose every page sits in the returned
/// cache's 1-page class.
fn all_cached(policy: IovaPolicy) -> (std::sync::Arc<IovaDomain>, IovaCpuCache) {
    let d = IovaDomain::new(64, 127, policy).unwrap();
    let mut c = d.cpu_cache();
    let ones: Vec<u64> = (0..64).map(|_| c.alloc(1, 127).unwrap()).collect();
    for p in ones {
        c.free(p, 1).unwrap();
    }
    (d, c)
}

#[test]
fn exhaustion_recovers_what_the_caches_hold() {
    for policy in IovaPolicy::ALL {
        let (_d, mut c) = all_cached(policy);
        // Every page sits in the 1-page cache; a 64-page request must still work.
        assert_eq!(c.alloc(64, 127), Ok(64), "{policy}");
    }
}

/// Pushes `n` full magazines of one class through a cache into the depot.
fn churn_frees(d: &std::sync::Arc<IovaDomain>, n_iovas: usize) {
    let mut a = d.cpu_cache();
    let mut b = d.cpu_cache();
    let pfns: Vec<u64> = (0..n_iovas).map(|_| a.alloc(1, END).unwrap()).collect();
    for p in pfns {
        b.free(p, 1).unwrap();
    }
    std::mem::forget(a); // keep both caches' contents where they are
    std::mem::forget(b);
}

#[test]
fn linux_2016_frees_a_magazine_when_the_depot_is_full() {
    let d = IovaDomain::new(1, END, IovaPolicy::Linux2016).unwrap();
    churn_frees(&d, 128 * 40);
    let s = d.stats();
    assert_eq!(s.depot_magazines, 32);
    assert!(s.magazines_freed >= 5, "{s:?}");
    assert_eq!(s.cache_flushes, 0);
}

#[test]
fn linux_2020_flushes_every_cache_when_the_depot_is_full() {
    let d = IovaDomain::new(1, END, IovaPolicy::Linux2020).unwrap();
    churn_frees(&d, 128 * 40);
    let s = d.stats();
    assert_eq!(s.depot_magazines, 32);
    assert!(s.cache_flushes >= 1, "{s:?}");
}

#[test]
fn linux_2023_grows_its_depot_then_trims_it_to_the_cpu_count() {
    let d = IovaDomain::new(1, END, IovaPolicy::Linux2023).unwrap();
    churn_frees(&d, 127 * 50);
    let grown = d.stats().depot_magazines;
    assert!(grown > 40, "unbounded depot: {grown}");
    std::thread::sleep(Duration::from_millis(120));
    d.maintain();
    assert_eq!(
        d.stats().depot_magazines,
        grown - 1,
        "one magazine per period"
    );
}

#[test]
fn softiommu_bounds_its_depot_and_gives_idle_magazines_back() {
    let mut p = IovaPolicy::Softiommu.params();
    p.idle_trim = Some(Duration::from_millis(50));
    let d = IovaDomain::with_params(1, END, p).unwrap();
    // Far more full magazines than the depot's bound of 8.
    churn_frees(&d, p.magazine_size * 30);
    let s = d.stats();
    assert_eq!(s.depot_magazines, 8);
    assert!(s.magazines_freed > 0);
    std::thread::sleep(Duration::from_millis(60));
    d.maintain();
    assert_eq!(d.stats().depot_magazines, 0);
}

#[test]
fn flush_requests_reach_other_caches_at_their_next_free() {
    let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
    let mut a = d.cpu_cache();
    let q = d.alloc(4, END).unwrap();
    let p = a.alloc(1, END).unwrap();
    a.free(p, 1).unwrap();
    // A refill brought a whole 128-page chunk into the cache.
    assert_eq!(d.stats().cached_iovas, 128);
    d.flush_caches();
    assert_eq!(
        d.stats().cached_iovas,
        128,
        "not before the owner's next call"
    );
    // An allocation the loaded magazine serves does not look.
    let r = a.alloc(1, END).unwrap();
    assert_eq!(d.stats().cached_iovas, 127, "served, not flushed");
    a.free(q, 4).unwrap();
    assert_eq!(d.stats().cached_iovas, 1, "flushed, then q cached");
    a.free(r, 1).unwrap();
    assert_eq!(d.stats().cached_iovas, 2);
    assert_eq!(d.stats().owner_revocations, 0, "a ring is no revocation");
}

/// A flush reaches a cache's own plain free (through its owner slot's
/// ring), and a cache that holds no slot (whose every free is an
/// exchange), each before the freed block is placed.
#[test]
fn a_flush_reaches_a_plain_free_and_an_unbiased_caches_free() {
    let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
    let mut a = d.cpu_cache();
    let mut b = d.cpu_cache_unbiased();
    let pa = a.alloc(1, END).unwrap();
    let pb = b.alloc(1, END).unwrap();
    let before = d.stats().cached_iovas;
    assert_eq!(before, 2 * 127, "each cache refilled one chunk");
    d.flush_caches();
    a.free(pa, 1).unwrap();
    assert_eq!(d.stats().cached_iovas, 127 + 1, "a's flushed, then pa");
    b.free(pb, 1).unwrap();
    assert_eq!(d.stats().cached_iovas, 2, "b's flushed, then pb");
    // The ring was lowered: a second flush rings again, and is seen again.
    let pa2 = a.alloc(1, END).unwrap();
    d.flush_caches();
    a.free(pa2, 1).unwrap();
    assert_eq!(d.stats().cached_iovas, 1 + 1, "a flushed again, then pa2");
    assert_eq!(d.stats().owner_revocations, 0);
    assert_eq!(d.stats().cache_flushes, 2);
}

#[test]
fn a_cached_block_must_end_within_the_limit() {
    // Regression: a cached block was checked by its start only, so a limit
    // inside it let its tail pass the DMA mask.
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut c = d.cpu_cache();
        let p = c.alloc(4, END).unwrap();
        c.free(p, 4).unwrap();
        let q = c.alloc(4, p + 2).unwrap();
        assert!(
            q + 3 <= p + 2,
            "{policy}: block {q:#x}+4 passes limit {:#x}",
            p + 2
        );
    }
}

#[test]
fn a_batch_free_frees_every_good_block_and_reports_the_first_bad_one() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut c = d.cpu_cache();
        let blocks: Vec<(u64, u64)> = (0..40)
            .map(|i| (c.alloc(1 << (i % 3), END).unwrap(), 1 << (i % 3)))
            .collect();
        let (a, pa) = blocks[5];
        c.free(a, pa).unwrap();
        // A double free in the middle, a wrong size near the end.
        let mut batch = blocks.clone();
        let (b, _) = batch[30];
        batch[30] = (b, 8);
        assert_eq!(
            c.free_all(&batch),
            Err(IovaError::NotAllocated { pfn: a }),
            "{policy}: the first error is reported"
        );
        // Every other block was freed: each refuses a second free, and the
        // wrong-size one is still live and frees with its own size.
        for (i, &(p, n)) in blocks.iter().enumerate() {
            if i == 30 {
                continue;
            }
            assert_eq!(
                c.free(p, n),
                Err(IovaError::NotAllocated { pfn: p }),
                "{policy}"
            );
        }
        let (p, n) = blocks[30];
        c.free(p, n).unwrap();
    }
}

#[test]
fn a_first_try_gives_nothing_back_and_the_second_does() {
    for policy in IovaPolicy::ALL {
        let (d, mut c) = all_cached(policy);
        // Every page is cached: a 64-page first try finds no room and
        // leaves the caches as they are...
        let cached = d.stats().cached_iovas;
        assert!(
            matches!(c.try_alloc(64, 127), Err(IovaError::NoSpace { .. })),
            "{policy}"
        );
        assert_eq!(d.stats().cached_iovas, cached, "{policy}");
        assert_eq!(d.stats().cache_flushes, 0, "{policy}");
        // ...and the second try gives them back.
        assert_eq!(c.alloc(64, 127), Ok(64), "{policy}");
    }
}

#[test]
fn low_first_fills_the_window_then_goes_above_it() {
    for policy in IovaPolicy::ALL {
        // A window of 64 pages, [1, 64], below a domain of 2^20.
        let d = IovaDomain::with_low_window(1, END, 65, policy).unwrap();
        assert_eq!(d.low_window_end(), 65);
        let mut c = d.cpu_cache();
        let mut got = Vec::new();
        for _ in 0..64 {
            got.push(c.alloc_low_first(1, 64, END).unwrap());
        }
        assert!(got.iter().all(|&p| p <= 64), "{policy}: {got:?}");
        // The window is full: the next ones come from above it.
        for _ in 0..8 {
            let p = c.alloc_low_first(1, 64, END).unwrap();
            assert!(p > 64, "{policy}: {p:#x}");
            got.push(p);
        }
        // A 4-page block does not fit either: above, whole.
        let big = c.alloc_low_first(4, 64, END).unwrap();
        assert!(big > 64 && big.is_multiple_of(4), "{policy}: {big:#x}");
        // `low >= limit` is a plain first try at the limit.
        assert!(
            matches!(
                c.alloc_low_first(1, END, 64),
                Err(IovaError::NoSpace { .. })
            ),
            "{policy}"
        );
        for p in got {
            c.free(p, 1).unwrap();
        }
        c.free(big, 4).unwrap();
    }
}

#[test]
fn only_the_2016_design_flushes_every_cache_for_a_low_window_miss() {
    for policy in IovaPolicy::ALL {
        // A window of 64 pages, [1, 64], every page of it cached.
        let d = IovaDomain::with_low_window(1, END, 65, policy).unwrap();
        let mut c = d.cpu_cache();
        let ones: Vec<u64> = (0..64)
            .map(|_| c.alloc_low_first(1, 64, END).unwrap())
            .collect();
        assert!(ones.iter().all(|&p| p <= 64), "{policy}: {ones:?}");
        for p in ones {
            c.free(p, 1).unwrap();
        }
        // A 4-page block finds no room in the window. Linux before v4.15
        // gives the caches back and finds it there; the others keep their
        // caches and go above the window.
        let p = c.alloc_low_first(4, 64, END).unwrap();
        let flushes = d.stats().cache_flushes;
        let linux_2016 = policy == IovaPolicy::Linux2016;
        assert_eq!(policy.params().flush_on_low_miss, linux_2016);
        if linux_2016 {
            assert!(p <= 61 && p.is_multiple_of(4), "{policy}: {p:#x}");
            assert!(flushes >= 1, "{policy}");
        } else {
            assert!(p > 64 && p.is_multiple_of(4), "{policy}: {p:#x}");
            assert_eq!(flushes, 0, "{policy}");
        }
        c.free(p, 4).unwrap();
    }
}

#[test]
fn ours_skips_a_window_it_knows_is_full_until_room_is_freed() {
    let d = IovaDomain::with_low_window(1, END, 65, IovaPolicy::Softiommu).unwrap();
    let mut c = d.cpu_cache();
    let low: Vec<u64> = (0..64).map(|_| d.alloc(1, 64).unwrap()).collect();
    assert!(!d.low_window_full(0, 64));
    // The first failed search of the whole window is remembered...
    assert!(matches!(c.try_alloc(1, 64), Err(IovaError::NoSpace { .. })));
    assert!(d.low_window_full(0, 64));
    assert!(d.low_window_full(3, 10), "a smaller limit lies inside");
    assert!(!d.low_window_full(0, END), "above the window is not");
    let high = c.alloc_low_first(1, 64, END).unwrap();
    assert!(high > 64);
    // A free to the tree below its end clears it: a cache with nothing
    // cached finds the hole (`c` would hand out its magazine's top, from
    // above: ours prefers the window only where it chooses space).
    d.free(low[0], 1).unwrap();
    assert!(!d.low_window_full(0, 64));
    let mut fresh = d.cpu_cache();
    assert_eq!(fresh.alloc_low_first(1, 64, END), Ok(low[0]));
    fresh.free(low[0], 1).unwrap();
    c.free(high, 1).unwrap();
}

#[test]
fn a_linux_cache_with_only_high_blocks_searches_the_tree_not_the_depot() {
    for policy in [IovaPolicy::Linux2016, IovaPolicy::Linux2020] {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut c = d.cpu_cache();
        // Three high blocks in the loaded magazine, a full one in the depot.
        churn_frees(&d, 128);
        let high: Vec<u64> = (0..3).map(|_| c.alloc(1, END).unwrap()).collect();
        for &p in &high {
            c.free(p, 1).unwrap();
        }
        let depot = d.stats().depot_magazines;
        let tree_allocs = d.stats().tree_allocs;
        // A request below all of them goes to the tree (as Linux's
        // `__iova_rcache_get` with a loaded magazine that has none).
        let low = c.alloc(1, 1000).unwrap();
        assert!(low <= 1000, "{policy}");
        assert_eq!(d.stats().depot_magazines, depot, "{policy}");
        assert_eq!(d.stats().tree_allocs, tree_allocs + 1, "{policy}");
        c.free(low, 1).unwrap();
    }
}

#[test]
fn a_single_try_searches_its_caches_even_when_the_window_is_full() {
    for policy in IovaPolicy::ALL {
        // The whole space is two magazines: one live, one in `b`'s `prev`.
        let m = policy.params().magazine_size as u64;
        let n = 2 * m;
        let d = IovaDomain::new(1, n, policy).unwrap();
        let mut a = d.cpu_cache();
        let mut b = d.cpu_cache();
        let all: Vec<u64> = (0..n).map(|_| b.alloc(1, n).unwrap()).collect();
        for &p in &all {
            b.free(p, 1).unwrap();
        }
        let live: Vec<u64> = (0..m).map(|_| b.alloc(1, n).unwrap()).collect();
        // An empty cache's try finds no room: ours remembers the window
        // (here the whole space) as full.
        assert!(
            matches!(a.try_alloc(1, n), Err(IovaError::NoSpace { .. })),
            "{policy}"
        );
        // A device with no higher limit has one try, which the memo never
        // fails: `b` finds its other magazine.
        let p = b.alloc_low_first(1, n, n).unwrap();
        assert!((1..=n).contains(&p) && !live.contains(&p), "{policy}: {p}");
        b.free(p, 1).unwrap();
        for p in live {
            b.free(p, 1).unwrap();
        }
    }
}

#[test]
fn a_low_limit_below_the_space_means_no_preference() {
    let d = IovaDomain::new(16, END, IovaPolicy::Softiommu).unwrap();
    let mut c = d.cpu_cache();
    let p = c.alloc_low_first(1, 3, END).unwrap();
    assert!((16..=END).contains(&p));
    c.free(p, 1).unwrap();
    // The limit itself still must reach the space.
    assert!(matches!(
        c.alloc_low_first(1, 3, 5),
        Err(IovaError::LimitBelowStart { .. })
    ));
}

#[test]
fn a_space_above_4_gib_builds_with_the_default_window() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1 << 20, 1 << 30, policy).unwrap();
        assert_eq!(d.low_window_end(), (1 << 20) + 1, "{policy}");
        let mut c = d.cpu_cache();
        let p = c.alloc(4, 1 << 30).unwrap();
        assert!(p >= 1 << 20 && p.is_multiple_of(4), "{policy}: {p:#x}");
        c.free(p, 4).unwrap();
    }
    // A window that leaves no room above the start is still refused.
    assert!(matches!(
        IovaDomain::with_low_window(1 << 20, 1 << 30, 1 << 20, IovaPolicy::Softiommu),
        Err(IovaError::InvalidRange { .. })
    ));
}

/// A flush's batch free: runs of one order go straight into the loaded
/// magazine, and everything else (another order, a full magazine, a block
/// not retired, a block freed twice in one batch) the block-by-block way,
/// with the same errors and the same end state as `free_retired` one by
/// one.
#[test]
fn a_batch_free_frees_every_retired_block_and_refuses_the_rest() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut c = d.cpu_cache();
        // More one-page blocks than a magazine holds, with four-page ones
        // (asked as 3 and 4 pages) in among them.
        let mut batch = Vec::new();
        for i in 0..300u64 {
            let pages = match i % 50 {
                7 => 3,
                8 => 4,
                _ => 1,
            };
            let pfn = c.alloc(pages, END).unwrap();
            d.retire_block(pfn, pages).unwrap();
            batch.push((pfn, pages));
        }
        // One block still live, and one block twice.
        let live = c.alloc(1, END).unwrap();
        batch.insert(150, (live, 1));
        let twice = batch[20];
        batch.push(twice);
        assert_eq!(
            c.free_retired_all(&batch, |&b| b),
            Err(IovaError::NotRetired { pfn: live }),
            "{policy:?}: the first error"
        );
        for &(pfn, _) in &batch {
            let state = d.find(pfn).map(|b| b.state);
            if pfn == live {
                assert_eq!(state, Some(BlockState::Live), "{policy:?}");
            } else {
                // In a cache, the depot or the tree: free either way.
                assert!(
                    !matches!(state, Some(BlockState::Live | BlockState::Retired)),
                    "{policy:?}: {pfn:#x} is {state:?}"
                );
            }
        }
        // Freed once each: the live block still frees, nothing else does.
        c.free(live, 1).unwrap();
        assert_eq!(
            c.free_retired(twice.0, twice.1),
            Err(IovaError::NotAllocated { pfn: twice.0 })
        );
    }
}

/// Every bad free through a cache's inlined fast path (a cached order, a
/// loaded magazine with room, no flush asked) is refused with its exact
/// error, and changes nothing: the state word is read before anything is
/// written, whatever the fast path's layout.
#[test]
fn every_bad_free_through_the_fast_path_is_refused_exactly() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut c = d.cpu_cache();
        // Warm the classes, so each free below meets a magazine with room.
        let a = c.alloc(4, END).unwrap();
        let one = c.alloc(1, END).unwrap();
        c.free(one, 1).unwrap();
        let before = snapshot(&d);
        // Never allocated: a frame inside the domain no block starts at.
        let never = if a > 1 << 12 {
            a - (1 << 12)
        } else {
            a + (1 << 12)
        };
        assert_eq!(
            c.free(never, 1),
            Err(IovaError::NotAllocated { pfn: never }),
            "{policy}: never allocated"
        );
        // Inside a live block, not at its start.
        assert_eq!(
            c.free(a + 2, 2),
            Err(IovaError::NotAllocated { pfn: a + 2 }),
            "{policy}: interior frame"
        );
        // Wrong size, smaller and larger.
        for pages in [1, 2, 8, 256] {
            assert_eq!(
                c.free(a, pages),
                Err(IovaError::WrongSize {
                    pfn: a,
                    pages,
                    allocated_pages: 4
                }),
                "{policy}: freed with {pages} pages"
            );
        }
        // Double free of a block sitting in this cache's loaded magazine.
        assert_eq!(
            c.free(one, 1),
            Err(IovaError::NotAllocated { pfn: one }),
            "{policy}: double free into the same magazine"
        );
        // A foreign allocator's block: another domain over the same frames
        // handed it out; this domain never did.
        let other = IovaDomain::new(1, END, policy).unwrap();
        let mut oc = other.cpu_cache();
        let f = (0..512)
            .map(|_| oc.alloc(4, END).unwrap())
            .find(|&p| d.find(p).is_none())
            .expect("a block this domain does not hold");
        assert_eq!(
            c.free(f, 4),
            Err(IovaError::NotAllocated { pfn: f }),
            "{policy}: a foreign allocator's IOVA"
        );
        assert_eq!(
            snapshot(&d),
            before,
            "{policy}: a refused free changed state"
        );
        oc.free(f, 4).expect("still live in its own domain");
        // A retired block is freed only by `free_retired`.
        d.retire_block(a, 4).unwrap();
        assert_eq!(
            c.free(a, 4),
            Err(IovaError::NotAllocated { pfn: a }),
            "{policy}: a retired block"
        );
        c.free_retired(a, 4).unwrap();
        // A freed block, now cached: a second free is refused as well.
        assert_eq!(
            c.free(a, 4),
            Err(IovaError::NotAllocated { pfn: a }),
            "{policy}: double free of a cached block"
        );
        // The good frees still go through.
        let b = c.alloc(4, END).unwrap();
        assert_eq!(d.find(b).map(|x| x.state), Some(BlockState::Live));
        c.free(b, 4).unwrap();
        assert_eq!(d.find(b).map(|x| x.state), Some(BlockState::Cached));
    }
}

#[test]
fn two_threads_freeing_the_same_blocks_free_each_exactly_once() {
    // Two threads, each through its own cache, free the same live blocks
    // in the same order, started together so that their frees of one block
    // meet: each block is freed by exactly one, the other refused as a
    // double free, and no block is later handed out twice.
    const BLOCKS: usize = 256;
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut main = d.cpu_cache();
        let mut caches = [d.cpu_cache(), d.cpu_cache()];
        for round in 0..40 {
            let pages = [1u64, 1, 2, 8][round % 4];
            let blocks: Vec<u64> = (0..BLOCKS)
                .map(|_| main.alloc(pages, END).unwrap())
                .collect();
            let go = std::sync::Barrier::new(2);
            let results: Vec<Vec<Result<(), IovaError>>> = std::thread::scope(|s| {
                let handles: Vec<_> = caches
                    .iter_mut()
                    .map(|c| {
                        let (blocks, go) = (&blocks, &go);
                        s.spawn(move || {
                            go.wait();
                            blocks.iter().map(|&b| c.free(b, pages)).collect()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (i, &b) in blocks.iter().enumerate() {
                let (x, y) = (&results[0][i], &results[1][i]);
                let refused = Err(IovaError::NotAllocated { pfn: b });
                assert!(
                    (x.is_ok() && *y == refused) || (y.is_ok() && *x == refused),
                    "{policy}: block {b:#x} freed as {x:?} and {y:?}"
                );
            }
        }
        // Every block sits in one place only: allocating through all three
        // caches never hands one out twice.
        let mut seen = std::collections::HashSet::new();
        for c in std::iter::once(&mut main).chain(caches.iter_mut()) {
            for _ in 0..4 * BLOCKS {
                let b = c.alloc(1, END).unwrap();
                assert!(seen.insert(b), "{policy}: {b:#x} handed out twice");
            }
        }
    }
}

#[test]
fn a_batch_alloc_is_all_or_nothing_and_a_batch_publishes_exactly() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut c = d.cpu_cache();
        // A batch of mixed sizes: each block live, aligned, distinct.
        let mut blocks: Vec<(u64, u64)> = [1u64, 4, 1, 32, 2, 1].iter().map(|&p| (0, p)).collect();
        c.alloc_all(&mut blocks, END).unwrap();
        for &(pfn, pages) in &blocks {
            let b = d.find(pfn).expect("allocated");
            assert_eq!((b.state, b.pfn % pages), (BlockState::Live, 0), "{policy}");
        }
        let mut pfns: Vec<u64> = blocks.iter().map(|b| b.0).collect();
        pfns.sort_unstable();
        pfns.dedup();
        assert_eq!(pfns.len(), blocks.len(), "{policy}: distinct blocks");
        // Freed as a batch: every block cached, and the published count
        // exact once the call returns.
        let cached_before = d.stats().cached_iovas;
        c.free_all(&blocks).unwrap();
        assert_eq!(
            d.stats().cached_iovas,
            cached_before + blocks.len() as u64,
            "{policy}"
        );
        for &(pfn, _) in &blocks {
            assert_eq!(
                d.find(pfn).map(|b| b.state),
                Some(BlockState::Cached),
                "{policy}"
            );
        }
        // A batch that fails part way (the third request is too large)
        // allocates nothing: the two blocks it took are cached again.
        let mut bad = vec![(0, 1), (0, 2), (0, 1 << 21), (0, 1)];
        assert!(matches!(
            c.alloc_all(&mut bad, END),
            Err(IovaError::TooLarge { pages, .. }) if pages == 1 << 21
        ));
        for &(pfn, _) in &bad[..2] {
            assert_eq!(
                d.find(pfn).map(|b| b.state),
                Some(BlockState::Cached),
                "{policy}: given back"
            );
        }
        // A zero-sized request first: refused before anything is taken.
        let before = snapshot(&d);
        assert_eq!(
            c.alloc_all(&mut [(0, 0), (0, 1)], END),
            Err(IovaError::ZeroSize)
        );
        assert_eq!(
            snapshot(&d),
            before,
            "{policy}: a refused batch changed state"
        );
        // A batch free refuses each bad block exactly and frees the rest.
        let a = c.alloc(1, END).unwrap();
        assert_eq!(
            c.free_all(&[(a, 1), (a, 1)]),
            Err(IovaError::NotAllocated { pfn: a }),
            "{policy}: a double free inside one batch"
        );
        assert_eq!(
            d.find(a).map(|b| b.state),
            Some(BlockState::Cached),
            "{policy}"
        );
    }
}

/// The owner slot a block's word names (0: none).
fn owner_of(d: &IovaDomain, pfn: u64) -> u64 {
    (d.live.get(pfn) & owner::OWNER_MASK) >> owner::OWNER_SHIFT
}

/// Whether this process hands out owner slots (it has `membarrier`).
fn biasing() -> bool {
    crate::sync::barrier::Barrier::default_for_process()
        == crate::sync::barrier::Barrier::Membarrier
}

/// A domain whose caches take owner slots; `None` where this process
/// hands none out (the tests of biasing then have nothing to check).
fn biased_domain() -> Option<std::sync::Arc<IovaDomain>> {
    biasing().then(|| IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap())
}

#[test]
fn a_cache_names_itself_in_its_blocks_and_frees_them_without_revoking() {
    let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
    let mut c = d.cpu_cache();
    let blocks: Vec<u64> = (0..64).map(|_| c.alloc(2, END).unwrap()).collect();
    let slot = owner_of(&d, blocks[1]);
    assert_eq!(slot != 0, biasing(), "a magazine's block names its cache");
    // A tagged block of its own is freed plainly too, and every free
    // leaves the block cached with no owner and no tag.
    c.set_tag(blocks[2], 0x8000_0042).unwrap();
    for &b in &blocks {
        c.free(b, 2).unwrap();
        assert_eq!(
            d.live.get(b),
            u64::from(live_map::state(live_map::CACHED, 1))
        );
    }
    // A double free by the owner, and a wrong size, are refused exactly.
    assert_eq!(
        c.free(blocks[0], 2),
        Err(IovaError::NotAllocated { pfn: blocks[0] })
    );
    let a = c.alloc(4, END).unwrap();
    assert_eq!(
        c.free(a, 2),
        Err(IovaError::WrongSize {
            pfn: a,
            pages: 2,
            allocated_pages: 4
        })
    );
    c.free(a, 4).unwrap();
    assert_eq!(d.stats().owner_revocations, 0);
}

#[test]
fn another_threads_free_or_retire_revokes_the_owner_once_and_both_stay_exact() {
    let Some(d) = biased_domain() else {
        return;
    };
    let mut owner = d.cpu_cache();
    let mut other = d.cpu_cache();
    let blocks: Vec<u64> = (0..16).map(|_| owner.alloc(1, END).unwrap()).collect();
    assert!(blocks.iter().all(|&b| owner_of(&d, b) != 0));
    // Another cache frees one: the owner's slot is revoked, once.
    other.free(blocks[0], 1).unwrap();
    assert_eq!(d.stats().owner_revocations, 1);
    assert_eq!(
        owner.free(blocks[0], 1),
        Err(IovaError::NotAllocated { pfn: blocks[0] })
    );
    // The domain's own calls (a retire, a free) on the owner's blocks.
    d.retire_block(blocks[1], 1).unwrap();
    other.free_retired(blocks[1], 1).unwrap();
    d.free(blocks[2], 1).unwrap();
    assert_eq!(
        owner.free(blocks[2], 1),
        Err(IovaError::NotAllocated { pfn: blocks[2] })
    );
    // The owner, revoked, still frees the rest, by exchange.
    for &b in &blocks[3..] {
        owner.free(b, 1).unwrap();
        assert_eq!(other.free(b, 1), Err(IovaError::NotAllocated { pfn: b }));
    }
    assert_eq!(d.stats().owner_revocations, 1, "one revocation per slot");
}

/// A block and the two frees' results.
type BothFrees = (u64, Result<(), IovaError>, Result<(), IovaError>);

/// `owner` and `other` free every block of `blocks` (of `pages`) at the
/// same time, `other` in the order `order` gives; returns each block's two
/// results.
fn free_together(
    owner: &mut IovaCpuCache,
    other: &mut IovaCpuCache,
    blocks: &[u64],
    pages: u64,
    order: fn(&[u64]) -> Vec<u64>,
) -> Vec<BothFrees> {
    let go = std::sync::Barrier::new(2);
    let (mine, theirs) = std::thread::scope(|s| {
        let go = &go;
        let theirs_order = order(blocks);
        let h = s.spawn(move || {
            go.wait();
            theirs_order
                .iter()
                .map(|&b| (b, other.free(b, pages)))
                .collect::<std::collections::HashMap<_, _>>()
        });
        go.wait();
        let mine: Vec<_> = blocks.iter().map(|&b| owner.free(b, pages)).collect();
        (mine, h.join().unwrap())
    });
    blocks
        .iter()
        .zip(mine)
        .map(|(&b, x)| (b, x, theirs[&b].clone()))
        .collect()
}

#[test]
fn an_owner_and_another_thread_freeing_the_same_blocks_free_each_exactly_once() {
    // The owner frees its own blocks (plainly, until the other thread's
    // first free of one revokes its slot) while another cache frees the
    // same blocks from the other end, so that they meet; then, revoked,
    // another set in the same order, in step. Each block is freed by
    // exactly one, the other refused as a double free, and no block is
    // later handed out twice. A fresh domain each round, so that every
    // round starts with the owner biased.
    const BLOCKS: usize = 2048;
    for round in 0..12 {
        let pages = [1u64, 2, 8][round % 3];
        let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
        let mut owner = d.cpu_cache();
        let mut other = d.cpu_cache();
        let mut results = Vec::new();
        for order in [
            (|b: &[u64]| b.iter().rev().copied().collect()) as fn(&[u64]) -> Vec<u64>,
            |b: &[u64]| b.to_vec(),
        ] {
            let blocks: Vec<u64> = (0..BLOCKS)
                .map(|_| owner.alloc(pages, END).unwrap())
                .collect();
            results.extend(free_together(&mut owner, &mut other, &blocks, pages, order));
        }
        for (b, x, y) in &results {
            let refused = Err(IovaError::NotAllocated { pfn: *b });
            assert!(
                (x.is_ok() && *y == refused) || (y.is_ok() && *x == refused),
                "round {round}: block {b:#x} freed as {x:?} and {y:?}"
            );
        }
        // At most once (none if the owner freed every block first).
        assert!(d.stats().owner_revocations <= u64::from(biasing()));
        let mut seen = std::collections::HashSet::new();
        for c in [&mut owner, &mut other] {
            for _ in 0..2 * BLOCKS {
                let b = c.alloc(pages, END).unwrap();
                assert!(seen.insert(b), "round {round}: {b:#x} handed out twice");
            }
        }
    }
}

#[test]
fn owner_slots_are_bounded_given_back_and_never_reused_once_revoked() {
    let Some(d) = biased_domain() else {
        return;
    };
    let mut caches: Vec<IovaCpuCache> = (0..owner::SLOTS).map(|_| d.cpu_cache()).collect();
    let slot_of = |c: &mut IovaCpuCache| {
        let b = c.alloc(1, END).unwrap();
        let s = owner_of(&d, b);
        c.free(b, 1).unwrap();
        s
    };
    let slots: Vec<u64> = caches.iter_mut().map(slot_of).collect();
    // Slots 1..SLOTS, each once; the cache past them holds none, and
    // works by exchange.
    let mut named: Vec<u64> = slots[..owner::SLOTS - 1].to_vec();
    named.sort_unstable();
    assert_eq!(named, (1..owner::SLOTS as u64).collect::<Vec<_>>());
    assert_eq!(slots[owner::SLOTS - 1], 0);
    // A dropped cache's slot goes to the next cache.
    let gone = slots[5];
    caches.remove(5);
    let mut next = d.cpu_cache();
    assert_eq!(slot_of(&mut next), gone);
    // A revoked slot is spent: its cache dropped, no new cache takes it.
    let b = next.alloc(1, END).unwrap();
    caches[0].free(b, 1).unwrap();
    drop(next);
    let mut last = d.cpu_cache();
    assert_eq!(slot_of(&mut last), 0);
}

#[test]
fn the_dma_layers_caches_name_no_owner_and_revoke_nothing() {
    let d = IovaDomain::new(1, END, IovaPolicy::Softiommu).unwrap();
    let mut c = d.cpu_cache_unbiased();
    let mut other = d.cpu_cache();
    let blocks: Vec<u64> = (0..8).map(|_| c.alloc(1, END).unwrap()).collect();
    assert!(blocks.iter().all(|&b| owner_of(&d, b) == 0));
    for &b in &blocks {
        other.free(b, 1).unwrap();
    }
    assert_eq!(d.stats().owner_revocations, 0);
}

#[test]
fn a_revoked_cache_stops_naming_itself_within_a_refill() {
    let Some(d) = biased_domain() else {
        return;
    };
    let mut owner = d.cpu_cache();
    let mut other = d.cpu_cache();
    let b = owner.alloc(1, END).unwrap();
    other.free(b, 1).unwrap();
    assert_eq!(d.stats().owner_revocations, 1);
    // Its magazines hold at most two refills' worth stamped beforehand;
    // past them every block is unowned, and freed by anyone without
    // another revocation.
    let blocks: Vec<u64> = (0..1024).map(|_| owner.alloc(1, END).unwrap()).collect();
    assert!(blocks[512..].iter().all(|&b| owner_of(&d, b) == 0));
    for &b in &blocks {
        other.free(b, 1).unwrap();
    }
    assert_eq!(d.stats().owner_revocations, 1);
}

#[test]
fn a_revoked_cache_stops_naming_itself_at_its_next_own_free() {
    // A cache whose frees and allocations balance never reaches a slow
    // path: its first free after the revocation drops the bias.
    let Some(d) = biased_domain() else {
        return;
    };
    let mut owner = d.cpu_cache();
    let mut other = d.cpu_cache();
    let (a, b) = (owner.alloc(1, END).unwrap(), owner.alloc(1, END).unwrap());
    other.free(a, 1).unwrap();
    owner.free(b, 1).unwrap();
    let c = owner.alloc(1, END).unwrap();
    assert_eq!(owner_of(&d, c), 0);
    other.free(c, 1).unwrap();
    assert_eq!(d.stats().owner_revocations, 1);
}

#[test]
fn a_block_whose_cache_is_gone_is_freed_and_its_slot_spent() {
    let Some(d) = biased_domain() else {
        return;
    };
    let mut gone = d.cpu_cache();
    let b = gone.alloc(2, END).unwrap();
    let slot = owner_of(&d, b);
    drop(gone);
    // The slot has no holder: the exchange wins at once, the slot is
    // spent, and no later cache names it.
    d.free(b, 2).unwrap();
    assert_eq!(d.stats().owner_revocations, 1);
    let mut next = d.cpu_cache();
    let c = next.alloc(1, END).unwrap();
    assert_ne!(owner_of(&d, c), slot);
    assert_ne!(owner_of(&d, c), 0);
}

/// The fast paths take a block's order without the zero check (a count
/// of 0, or past 2^63, maps to an order no class serves): every such
/// count must still reach the slow path and its exact error, with
/// nothing changed.
#[test]
fn counts_no_class_serves_get_their_exact_error_through_every_call() {
    for policy in IovaPolicy::ALL {
        let d = IovaDomain::new(1, END, policy).unwrap();
        let mut c = d.cpu_cache();
        let a = c.alloc(1, END).unwrap();
        // A block of each cached order in the magazines, so that a wrong
        // order taken as a cached one would find something to hand out.
        for pages in [1, 2, 4] {
            let b = c.alloc(pages, END).unwrap();
            c.free(b, pages).unwrap();
        }
        // A flush asked for and not yet seen: a refused call must not
        // run it (it changes nothing), so the snapshot below holds.
        d.flush_caches();
        let mut dma = d.cpu_cache_unbiased();
        let before = snapshot(&d);
        for pages in [0, 1 << 63, (1 << 63) + 1, u64::MAX] {
            let want_alloc = if pages == 0 {
                IovaError::ZeroSize
            } else {
                IovaError::TooLarge {
                    pages,
                    domain_pages: END,
                }
            };
            assert_eq!(c.alloc(pages, END), Err(want_alloc.clone()), "{policy}");
            assert_eq!(c.try_alloc(pages, END), Err(want_alloc.clone()));
            assert_eq!(
                c.alloc_low_first(pages, END / 2, END),
                Err(want_alloc.clone())
            );
            // The DMA layer's path (limits already clamped, no owner bits).
            assert_eq!(dma.alloc_within(pages, END / 2, END), Err(want_alloc));
            let freed = c.free(a, pages);
            if pages == 0 {
                assert_eq!(freed, Err(IovaError::ZeroSize), "{policy}");
            } else {
                assert_eq!(freed, d.free(a, pages), "{policy}: as the domain's");
                // The count rounded up to a power of two: 2^63 as it is,
                // past it 2^64 pages, which the error names as 0 (it fits
                // no `u64`).
                let rounded = if pages == 1 << 63 { pages } else { 0 };
                let want = IovaError::WrongSize {
                    pfn: a,
                    pages: rounded,
                    allocated_pages: 1,
                };
                assert_eq!(freed, Err(want), "{policy}");
            }
        }
        assert_eq!(
            snapshot(&d),
            before,
            "{policy}: a refused call changed state"
        );
        c.free(a, 1).unwrap();
        drop(dma);
    }
}
