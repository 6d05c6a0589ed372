//! Promotion in the IOPF domain (seed 002's huge-page case): a 2 MiB block that
//! faults complete is collapsed into one 2 MiB leaf, with no translation
//! changing for a device that keeps reading it meanwhile; a block with a
//! hole, a misaligned backing or a region end in it is left alone; a
//! partial reclaim splits the leaf and the data survives; `promote: false`
//! keeps today's 4 KiB leaves. Every test body runs under the watchdog.

mod watchdog;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use softiommu::hw::{IotlbConfig, UnitId};
use softiommu::iopf::{IopfConfig, IopfDomain, IopfError, IopfHandler, Region};
use softiommu::pgtable::PageSize;
use softiommu::{
    DmaAccessor, DmaAttrs, Perm, PgtableError, PhysMemory, SourceId, System, UnitConfig, PAGE_SIZE,
};
use watchdog::timed;

const DEV: SourceId = SourceId(0x0700);
const READER: SourceId = SourceId(0x0701);
/// 1 GiB aligned, as the lab's message.
const BASE: u64 = 1 << 30;
const M2: u64 = 2 << 20;
const BLOCK_PAGES: u64 = M2 / PAGE_SIZE;
const O: DmaAttrs = DmaAttrs::ORDERED;

struct Rig {
    mem: Arc<PhysMemory>,
    sys: Arc<System>,
    unit: UnitId,
    domain: Arc<IopfDomain>,
}

impl Rig {
    fn new(premap_pages: u64, promote: bool) -> Self {
        Self::with_iotlb(premap_pages, promote, IotlbConfig::default())
    }

    fn with_iotlb(premap_pages: u64, promote: bool, iotlb: IotlbConfig) -> Self {
        let mem = Arc::new(PhysMemory::new(256 << 20).unwrap());
        let mut sys = System::new(mem.clone());
        let unit = sys
            .add_unit(UnitConfig {
                page_response_timeout: std::time::Duration::from_secs(60),
                iotlb,
                ..UnitConfig::default()
            })
            .unwrap();
        sys.assign(DEV, unit).unwrap();
        sys.assign(READER, unit).unwrap();
        let sys = Arc::new(sys);
        let domain = IopfDomain::new(
            sys.clone(),
            IopfConfig {
                premap_pages,
                promote,
                ..IopfConfig::default()
            },
        )
        .unwrap();
        domain.attach(DEV).unwrap();
        Rig {
            mem,
            sys,
            unit,
            domain,
        }
    }

    /// A region of `len` bytes at `iova`, backed by fresh frames at their
    /// (2 MiB or better aligned) start plus `skew`; pattern written.
    fn region(&self, iova: u64, len: u64, skew: u64) -> u64 {
        let order = (len + skew).div_ceil(PAGE_SIZE).next_power_of_two().ilog2();
        let phys = self.mem.alloc_zeroed_frames(order).unwrap() + skew;
        self.domain
            .add_region(Region {
                iova,
                phys,
                len,
                perm: Perm::RW,
            })
            .unwrap();
        for p in 0..len / PAGE_SIZE {
            self.mem
                .store_u64(
                    phys + p * PAGE_SIZE,
                    pattern(iova + p * PAGE_SIZE),
                    Ordering::Relaxed,
                )
                .unwrap();
        }
        phys
    }

    fn accessor(&self, sid: SourceId) -> DmaAccessor {
        DmaAccessor::new(self.sys.unit(self.unit).unwrap(), sid).unwrap()
    }

    fn size_at(&self, iova: u64) -> Option<PageSize> {
        self.domain.translation(iova).unwrap().map(|t| t.size)
    }
}

/// What the CPU wrote at the start of the page at `iova`.
fn pattern(iova: u64) -> u64 {
    iova.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// The device reads the first word of every page of `[iova, iova + pages)`
/// in order, checking each.
fn read_pages(acc: &mut DmaAccessor, iova: u64, pages: u64) {
    for p in 0..pages {
        let at = iova + p * PAGE_SIZE;
        assert_eq!(acc.read_u64(at, O).unwrap(), pattern(at), "at {at:#x}");
    }
}

#[test]
fn faulting_a_2m_block_in_page_by_page_ends_in_one_2m_leaf() {
    timed(|| {
        let r = Rig::new(1, true);
        let phys = r.region(BASE, 2 * M2, 0);
        let _h = IopfHandler::start(r.domain.clone(), r.unit, 1).unwrap();
        let mut acc = r.accessor(DEV);
        // The first block whole, then half of the second.
        read_pages(&mut acc, BASE, BLOCK_PAGES + BLOCK_PAGES / 2);
        assert_eq!(acc.stats().page_requests, BLOCK_PAGES + BLOCK_PAGES / 2);
        let s = r.domain.stats();
        assert_eq!((s.promotions, s.pages_mapped), (1, 768));
        let t = r
            .domain
            .translation(BASE + 77 * PAGE_SIZE + 5)
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.phys, t.size, t.perm),
            (phys + 77 * PAGE_SIZE + 5, PageSize::Size2M, Perm::RW)
        );
        assert_eq!(r.size_at(BASE + M2), Some(PageSize::Size4K), "half done");
        // The promotion's invalidation dropped the block's 4 KiB entries,
        // and the retry of the access that completed it cached the 2 MiB
        // leaf: one IOTLB entry for the block, 256 for the half block.
        let unit = r.sys.unit(r.unit).unwrap();
        assert_eq!(unit.stats().iotlb_entries, 1 + 256);
        // Reading the block again: no fault, no walk.
        let walks = acc.translator_stats().walks;
        read_pages(&mut acc, BASE, BLOCK_PAGES);
        assert_eq!(acc.stats().page_requests, 768, "no new fault");
        assert_eq!(acc.translator_stats().walks, walks, "every page hit");
        // The second block completes: promoted too.
        read_pages(&mut acc, BASE + M2, BLOCK_PAGES);
        assert_eq!(r.domain.stats().promotions, 2);
        assert_eq!(r.size_at(BASE + 2 * M2 - 1), Some(PageSize::Size2M));
    });
}

#[test]
fn a_device_reading_the_block_throughout_its_collapse_never_misses() {
    timed(|| {
        const BLOCKS: u64 = 6;
        // A one-entry IOTLB: the reader walks the table on nearly every
        // read instead of hitting what it cached before the collapse.
        let r = Rig::with_iotlb(1, true, IotlbConfig { sets: 1, ways: 1 });
        r.domain.attach(READER).unwrap();
        r.region(BASE, BLOCKS * M2, 0);
        let _h = IopfHandler::start(r.domain.clone(), r.unit, 1).unwrap();
        // Pages below `done` are mapped; the reader reads only those, so it
        // must never raise a page request: a collapse that left the block
        // unmapped for an instant would show as one.
        let done = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let reads = AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut acc = r.accessor(READER);
                let mut x = 0x2545_f491_4f6c_dd1d_u64;
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let k = done.load(Ordering::Acquire);
                    if k == 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly the block being completed (and collapsed).
                    let from = if x & 7 == 0 {
                        0
                    } else {
                        (k - 1) / BLOCK_PAGES * BLOCK_PAGES
                    };
                    let at = BASE + (from + (x >> 3) % (k - from)) * PAGE_SIZE;
                    assert_eq!(acc.read_u64(at, O).unwrap(), pattern(at), "at {at:#x}");
                    n += 1;
                }
                let st = acc.stats();
                assert_eq!((st.page_requests, st.errors), (0, 0), "{st:?}");
                reads.store(n, Ordering::Relaxed);
            });
            let mut acc = r.accessor(DEV);
            for p in 0..BLOCKS * BLOCK_PAGES {
                let at = BASE + p * PAGE_SIZE;
                assert_eq!(acc.read_u64(at, O).unwrap(), pattern(at));
                done.store(p + 1, Ordering::Release);
            }
            // And a while after the last collapse.
            let seen = reads.load(Ordering::Relaxed);
            let t0 = std::time::Instant::now();
            while reads.load(Ordering::Relaxed) == seen
                && t0.elapsed() < std::time::Duration::from_millis(20)
            {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Release);
        });
        assert!(reads.load(Ordering::Relaxed) > 1000, "{reads:?}");
        assert_eq!(r.domain.stats().promotions, BLOCKS);
        for b in 0..BLOCKS {
            assert_eq!(r.size_at(BASE + b * M2), Some(PageSize::Size2M));
        }
    });
}

#[test]
fn a_hole_a_misaligned_backing_or_a_region_end_prevents_promotion() {
    timed(|| {
        let r = Rig::new(1, true);
        let _h = IopfHandler::start(r.domain.clone(), r.unit, 1).unwrap();
        let mut acc = r.accessor(DEV);
        // A hole: all but page 300.
        r.region(BASE, M2, 0);
        read_pages(&mut acc, BASE, 300);
        read_pages(&mut acc, BASE + 301 * PAGE_SIZE, BLOCK_PAGES - 301);
        assert_eq!(r.domain.stats().promotions, 0);
        assert_eq!(r.size_at(BASE), Some(PageSize::Size4K));
        // ...filled: promoted.
        read_pages(&mut acc, BASE + 300 * PAGE_SIZE, 1);
        assert_eq!(r.domain.stats().promotions, 1);
        // Backing 4 KiB past a 2 MiB boundary: no 2 MiB leaf can map it.
        let skewed = BASE + 4 * M2;
        r.region(skewed, M2, PAGE_SIZE);
        read_pages(&mut acc, skewed, BLOCK_PAGES);
        // A block split between two regions: contiguous backing, same
        // rights, but the second region's end is the block's end...
        let split = BASE + 8 * M2;
        let phys = r.mem.alloc_zeroed_frames(9).unwrap();
        for (i, half) in [split, split + M2 / 2].into_iter().enumerate() {
            r.domain
                .add_region(Region {
                    iova: half,
                    phys: phys + i as u64 * M2 / 2,
                    len: M2 / 2,
                    perm: Perm::RW,
                })
                .unwrap();
        }
        // ...and one whose two halves are backed apart.
        let apart = BASE + 12 * M2;
        let (p1, p2) = (
            r.mem.alloc_zeroed_frames(9).unwrap(),
            r.mem.alloc_zeroed_frames(9).unwrap(),
        );
        for (half, p) in [(apart, p1), (apart + M2 / 2, p2)] {
            r.domain
                .add_region(Region {
                    iova: half,
                    phys: p,
                    len: M2 / 2,
                    perm: Perm::RW,
                })
                .unwrap();
        }
        for block in [split, apart] {
            for p in 0..BLOCK_PAGES {
                acc.read_u64(block + p * PAGE_SIZE, O).unwrap();
            }
        }
        assert_eq!(r.domain.stats().promotions, 1, "none of the three");
        for iova in [skewed, split, split + M2 - 1, apart, apart + M2 - 1] {
            assert_eq!(r.size_at(iova), Some(PageSize::Size4K), "{iova:#x}");
        }
        assert!(matches!(
            r.domain.translation(1 << 48),
            Err(IopfError::Pgtable(PgtableError::AddressTooWide { .. }))
        ));
    });
}

#[test]
fn reclaiming_part_of_a_promoted_block_splits_it_and_the_data_comes_back() {
    timed(|| {
        let r = Rig::new(1, true);
        let phys = r.region(BASE, M2, 0);
        let _h = IopfHandler::start(r.domain.clone(), r.unit, 1).unwrap();
        let mut acc = r.accessor(DEV);
        read_pages(&mut acc, BASE, BLOCK_PAGES);
        assert_eq!(r.domain.stats().promotions, 1);
        // The device writes every page (through the 2 MiB leaf).
        for p in 0..BLOCK_PAGES {
            acc.write_u64(BASE + p * PAGE_SIZE + 8, p ^ 0xabcd, O)
                .unwrap();
        }
        // Four pages in the middle taken back: the leaf is split, the rest
        // stays mapped with 4 KiB leaves, translating as before.
        let hole = BASE + 200 * PAGE_SIZE;
        assert_eq!(r.domain.reclaim(hole, 4 * PAGE_SIZE), Ok(4));
        for p in 200..204 {
            assert_eq!(r.domain.translation(BASE + p * PAGE_SIZE).unwrap(), None);
            assert!(!r.domain.is_mapped(BASE + p * PAGE_SIZE));
        }
        let t = r
            .domain
            .translation(BASE + 204 * PAGE_SIZE)
            .unwrap()
            .unwrap();
        assert_eq!((t.phys, t.size), (phys + 204 * PAGE_SIZE, PageSize::Size4K));
        let faults = acc.stats().page_requests;
        for p in (0..200).chain(204..BLOCK_PAGES) {
            assert_eq!(
                acc.read_u64(BASE + p * PAGE_SIZE + 8, O).unwrap(),
                p ^ 0xabcd
            );
        }
        assert_eq!(acc.stats().page_requests, faults, "the rest still mapped");
        // Touched again: faulted back in, data intact, promoted again.
        for p in 200..204 {
            assert_eq!(
                acc.read_u64(BASE + p * PAGE_SIZE + 8, O).unwrap(),
                p ^ 0xabcd
            );
        }
        assert_eq!(acc.stats().page_requests, faults + 4);
        assert_eq!(r.domain.stats().promotions, 2);
        assert_eq!(r.size_at(hole), Some(PageSize::Size2M));
        // The whole block taken back: nothing left to split.
        assert_eq!(r.domain.reclaim(BASE, M2), Ok(BLOCK_PAGES));
        assert_eq!(r.domain.translation(BASE + M2 - 1).unwrap(), None);
        assert_eq!(
            acc.read_u64(BASE + 511 * PAGE_SIZE + 8, O).unwrap(),
            511 ^ 0xabcd
        );
        assert_eq!(
            r.domain.reclaim(BASE + 3 * PAGE_SIZE, PAGE_SIZE),
            Err(IopfError::NotMapped {
                iova: BASE + 3 * PAGE_SIZE,
                len: PAGE_SIZE
            })
        );
        let s = r.domain.stats();
        assert_eq!((s.reclaims, s.pages_reclaimed), (2, 4 + BLOCK_PAGES));
    });
}

#[test]
fn a_window_completing_a_block_promotes_it_and_one_covering_it_maps_it_whole() {
    timed(|| {
        let r = Rig::new(BLOCK_PAGES, true);
        r.region(BASE, 2 * M2, 0);
        let _h = IopfHandler::start(r.domain.clone(), r.unit, 1).unwrap();
        let mut acc = r.accessor(DEV);
        // Page 100's window: pages 100..612, over both blocks, in part.
        read_pages(&mut acc, BASE + 100 * PAGE_SIZE, 1);
        assert_eq!(r.size_at(BASE + 100 * PAGE_SIZE), Some(PageSize::Size4K));
        // Page 0's window maps 0..100 (the rest is mapped): block 0 is
        // complete and promoted.
        read_pages(&mut acc, BASE, 1);
        assert_eq!(r.domain.stats().promotions, 1);
        assert_eq!(r.size_at(BASE), Some(PageSize::Size2M));
        // Page 612's window completes block 1.
        read_pages(&mut acc, BASE + 612 * PAGE_SIZE, 1);
        assert_eq!(r.domain.stats().promotions, 2);
        assert_eq!(acc.stats().page_requests, 3);
        read_pages(&mut acc, BASE, 2 * BLOCK_PAGES);
        // A window that starts on a block maps it with a 2 MiB leaf at
        // once: nothing to promote.
        let r = Rig::new(BLOCK_PAGES, true);
        r.region(BASE, M2, 0);
        let _h = IopfHandler::start(r.domain.clone(), r.unit, 1).unwrap();
        let mut acc = r.accessor(DEV);
        read_pages(&mut acc, BASE, BLOCK_PAGES);
        assert_eq!(acc.stats().page_requests, 1);
        assert_eq!(r.domain.stats().promotions, 0);
        assert_eq!(r.size_at(BASE), Some(PageSize::Size2M));
    });
}

#[test]
fn with_promote_off_4k_leaves_stay() {
    timed(|| {
        let r = Rig::new(1, false);
        assert!(!r.domain.config().promote);
        assert!(IopfConfig::default().promote, "on by default");
        r.region(BASE, M2, 0);
        let _h = IopfHandler::start(r.domain.clone(), r.unit, 1).unwrap();
        let mut acc = r.accessor(DEV);
        read_pages(&mut acc, BASE, BLOCK_PAGES);
        let s = r.domain.stats();
        assert_eq!((s.promotions, s.pages_mapped, s.served), (0, 512, 512));
        for p in [0, 255, 511] {
            assert_eq!(r.size_at(BASE + p * PAGE_SIZE), Some(PageSize::Size4K));
        }
        // One IOTLB entry per page, as before promotion existed.
        read_pages(&mut acc, BASE, BLOCK_PAGES);
        let entries = r.sys.unit(r.unit).unwrap().stats().iotlb_entries;
        assert!(entries > 256, "{entries}");
        // Reclaim as ever.
        assert_eq!(r.domain.reclaim(BASE + PAGE_SIZE, PAGE_SIZE), Ok(1));
        read_pages(&mut acc, BASE + PAGE_SIZE, 1);
        assert_eq!(r.domain.stats().promotions, 0);
    });
}
