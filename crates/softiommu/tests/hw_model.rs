//! Random map / unmap / access sequences in two domains, checked through the
//! unit's translation against a simple model: a map of 4 KiB pages.
//!
//! Every unmap is followed by the invalidation it requires (page-selective,
//! by range, domain-selective or global, then a wait), or is deferred: its
//! pages become *stale* until a later flush, and an access to them may see
//! either the old translation or a fault, nothing else. Pages never stale
//! must translate exactly as the model says, through a small IOTLB that
//! evicts constantly, with 4 KiB and 2 MiB leaves, in both queue modes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use softiommu::hw::{
    Access, ContextEntry, FaultReason, IotlbConfig, PhysRanges, QueueMode, SourceId,
    TranslateError, Translator, Unit, UnitConfig,
};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, IotlbGather, Perm, VtdConfig, VtdPageTable};

const K4: u64 = 1 << 12;
const M2: u64 = 1 << 21;
/// Small pages live in IOVA pages 0..SMALL_PAGES.
const SMALL_PAGES: u64 = 256;
/// 2 MiB slots start here.
const HUGE_BASE: u64 = 1 << 30;
const HUGE_SLOTS: u64 = 4;

#[derive(Debug, Clone, Copy)]
enum How {
    Range,
    EachPage,
    Domain,
    Global,
    Deferred,
}

/// Which page an unmap or an access aims at, resolved against the model
/// when it runs (so that most ops touch pages that are, or were, mapped).
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The n-th mapped page.
    Mapped(usize),
    /// The n-th page unmapped lately (stale or invalidated).
    Recent(usize),
    /// Any small page.
    Small(u64),
    /// Any page of the 2 MiB area.
    Huge(u64),
}

#[derive(Debug, Clone)]
enum Op {
    Map {
        dom: usize,
        page: u64,
        pages: u64,
        phys_page: u64,
        perm: u8,
    },
    MapHuge {
        dom: usize,
        slot: u64,
        phys_slot: u64,
        perm: u8,
    },
    Unmap {
        dom: usize,
        at: usize,
        pages: u64,
        how: How,
    },
    Access {
        dom: usize,
        at: Target,
        offset: u64,
        len: u64,
        write: bool,
    },
    Flush,
}

fn perm_of(p: u8) -> Perm {
    [Perm::READ, Perm::WRITE, Perm::RW][usize::from(p % 3)]
}

fn how() -> impl Strategy<Value = How> {
    prop_oneof![
        3 => Just(How::Range),
        1 => Just(How::EachPage),
        1 => Just(How::Domain),
        1 => Just(How::Global),
        3 => Just(How::Deferred),
    ]
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        4 => any::<usize>().prop_map(Target::Mapped),
        3 => any::<usize>().prop_map(Target::Recent),
        1 => (0..SMALL_PAGES).prop_map(Target::Small),
        1 => (0..HUGE_SLOTS * 512).prop_map(Target::Huge),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..SMALL_PAGES, 1..9u64, 0..4096u64, 0..3u8).prop_map(
            |(dom, page, pages, phys_page, perm)| Op::Map { dom, page, pages, phys_page, perm }
        ),
        1 => (0..2usize, 0..HUGE_SLOTS, 0..8u64, 0..3u8)
            .prop_map(|(dom, slot, phys_slot, perm)| Op::MapHuge { dom, slot, phys_slot, perm }),
        3 => (0..2usize, any::<usize>(), 1..6u64, how())
            .prop_map(|(dom, at, pages, how)| Op::Unmap { dom, at, pages, how }),
        10 => (0..2usize, target(), 0..K4, 1..3 * K4, any::<bool>()).prop_map(
            |(dom, at, offset, len, write)| Op::Access { dom, at, offset, len, write }
        ),
        1 => Just(Op::Flush),
    ]
}

/// A domain: its device, table and model.
struct Dom {
    sid: SourceId,
    did: u16,
    table: VtdPageTable,
    /// IOVA page -> (physical page, rights).
    mapped: BTreeMap<u64, (u64, Perm)>,
    /// Unmapped, not yet invalidated.
    stale: BTreeMap<u64, (u64, Perm)>,
    /// The last pages unmapped.
    recent: Vec<u64>,
}

struct World {
    unit: Unit,
    doms: Vec<Dom>,
    /// Deferred unmaps: (domain, start, len) and their gathers.
    pending: Vec<(usize, u64, u64)>,
    gathers: Vec<IotlbGather>,
}

impl World {
    fn new(mode: QueueMode) -> Self {
        let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
        let unit = Unit::new(
            mem.clone(),
            UnitConfig {
                queue_mode: mode,
                // Tiny: constant eviction and cross-domain collisions.
                iotlb: IotlbConfig { sets: 8, ways: 2 },
                ..UnitConfig::default()
            },
        )
        .unwrap();
        let doms = (0..2u16)
            .map(|i| {
                let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
                let d = Dom {
                    sid: SourceId(0x100 + i),
                    did: 10 + i,
                    table,
                    mapped: BTreeMap::new(),
                    stale: BTreeMap::new(),
                    recent: Vec::new(),
                };
                unit.attach(
                    d.sid,
                    ContextEntry::Translated {
                        did: d.did,
                        root: d.table.root(),
                    },
                )
                .unwrap();
                d
            })
            .collect();
        World {
            unit,
            doms,
            pending: Vec::new(),
            gathers: Vec::new(),
        }
    }

    fn free(&self, dom: usize, first: u64, n: u64) -> bool {
        let d = &self.doms[dom];
        (first..first + n).all(|p| !d.mapped.contains_key(&p) && !d.stale.contains_key(&p))
    }

    fn map(&mut self, dom: usize, first: u64, n: u64, phys_page: u64, perm: Perm) {
        if !self.free(dom, first, n) {
            return;
        }
        let d = &mut self.doms[dom];
        d.table
            .map(first << 12, phys_page << 12, n << 12, perm)
            .expect("map of a free range");
        for i in 0..n {
            d.mapped.insert(first + i, (phys_page + i, perm));
        }
    }

    /// Unmaps up to `n` mapped pages from the `at`-th mapped page on.
    fn unmap(&mut self, dom: usize, at: usize, n: u64, how: How) {
        let d = &mut self.doms[dom];
        if d.mapped.is_empty() {
            return;
        }
        let first = *d.mapped.keys().nth(at % d.mapped.len()).unwrap();
        let n = (0..n)
            .take_while(|i| d.mapped.contains_key(&(first + i)))
            .count() as u64;
        d.recent.extend(first..first + n);
        let excess = d.recent.len().saturating_sub(32);
        d.recent.drain(..excess);
        let mut g = IotlbGather::new();
        d.table.unmap(first << 12, n << 12, &mut g).expect("unmap");
        let did = d.did;
        let gone: Vec<_> = (first..first + n)
            .map(|p| (p, d.mapped.remove(&p).unwrap()))
            .collect();
        let mut b = self.unit.batch();
        match how {
            How::Range => {
                b.range(did, first << 12, n << 12);
            }
            How::EachPage => {
                for p in first..first + n {
                    b.pages(did, p << 12, 0, false);
                }
            }
            How::Domain => {
                b.domain(did);
            }
            How::Global => {
                b.global();
            }
            How::Deferred => {
                d.stale.extend(gone);
                self.pending.push((dom, first << 12, n << 12));
                self.gathers.push(g);
                return;
            }
        }
        b.wait().expect("invalidation");
        g.complete().unwrap();
    }

    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut b = self.unit.batch();
        for &(dom, iova, len) in &self.pending {
            b.range(self.doms[dom].did, iova, len);
        }
        b.wait().expect("flush");
        for mut g in self.gathers.drain(..) {
            g.complete().unwrap();
        }
        self.pending.clear();
        for d in &mut self.doms {
            d.stale.clear();
        }
    }

    fn access(&mut self, t: &mut Translator, dom: usize, iova: u64, len: u64, access: Access) {
        let d = &self.doms[dom];
        let got = t.translate(d.sid, iova, len, access);
        let faults = self.unit.faults().drain().records;
        check(d, iova, len, access, &got, &faults);
        if let Ok(r) = &got {
            let s = t.translate_page(d.sid, iova, access);
            // A stale page may have been evicted and refaulted meanwhile.
            if let Ok(s) = s {
                assert_eq!(s.phys, r.as_slice()[0].phys);
            }
            self.unit.faults().drain();
        }
    }
}

/// What the model allows for one page: `Some(must)` where `must` says
/// whether it must translate, with the physical page and rights.
fn allowed(d: &Dom, page: u64) -> (Option<(u64, Perm)>, bool) {
    match (d.mapped.get(&page), d.stale.get(&page)) {
        (Some(&m), _) => (Some(m), true),
        (None, Some(&s)) => (Some(s), false),
        (None, None) => (None, false),
    }
}

fn check(
    d: &Dom,
    iova: u64,
    len: u64,
    access: Access,
    got: &Result<PhysRanges, TranslateError>,
    faults: &[softiommu::hw::FaultRecord],
) {
    let end = iova + len;
    match got {
        Ok(ranges) => {
            assert!(faults.is_empty(), "no fault on success: {faults:?}");
            assert_eq!(ranges.total_len(), len);
            // Walk the pieces byte-page by byte-page.
            let mut pieces = ranges.iter().map(|r| (r.phys, r.len)).collect::<Vec<_>>();
            pieces.reverse();
            let mut cur = iova;
            let (mut phys, mut left) = pieces.pop().unwrap();
            while cur < end {
                let page = cur >> 12;
                let chunk = (((page + 1) << 12).min(end)) - cur;
                let (m, _) = allowed(d, page);
                let (pp, perm) =
                    m.unwrap_or_else(|| panic!("page {page:#x} unmapped but translated"));
                assert!(
                    perm.contains(access.perm()),
                    "page {page:#x}: {perm} for {access}"
                );
                assert_eq!(phys, (pp << 12) + (cur & 0xfff), "page {page:#x}");
                cur += chunk;
                phys += chunk;
                left -= chunk;
                if left == 0 && cur < end {
                    (phys, left) = pieces.pop().unwrap();
                }
            }
        }
        Err(e) => {
            assert_eq!(faults.len(), 1, "one fault per failed translation");
            let f = faults[0];
            assert_eq!((f.sid, f.access), (d.sid, access));
            let at = match *e {
                TranslateError::NotPresent { iova: at, .. } => {
                    assert_eq!(f.reason, FaultReason::NotPresent);
                    at
                }
                TranslateError::PermissionDenied { iova: at, .. } => {
                    assert_eq!(f.reason, FaultReason::PermissionDenied);
                    at
                }
                ref other => panic!("unexpected {other:?}"),
            };
            assert_eq!(f.iova, at);
            assert!(at >= iova && at < end && (at == iova || at & (K4 - 1) == 0));
            // Every page before the fault may translate.
            let mut p = iova >> 12;
            while p < at >> 12 {
                let (m, _) = allowed(d, p);
                assert!(
                    m.is_some_and(|(_, perm)| perm.contains(access.perm())),
                    "faulted at {at:#x} after page {p:#x} that cannot translate"
                );
                p += 1;
            }
            // The faulting page must not be one that has to translate.
            let (m, must) = allowed(d, at >> 12);
            if let (Some((_, perm)), true) = (m, must) {
                assert!(
                    !perm.contains(access.perm()),
                    "{e:?}: page {:#x} is mapped {perm}",
                    at >> 12
                );
                assert!(
                    matches!(e, TranslateError::PermissionDenied { allowed, .. } if *allowed == perm)
                );
            }
        }
    }
}

fn run(mode: QueueMode, ops: Vec<Op>) {
    let mut w = World::new(mode);
    let mut t = w.unit.translator().unwrap();
    for op in ops {
        match op {
            Op::Map {
                dom,
                page,
                pages,
                phys_page,
                perm,
            } => w.map(
                dom,
                page,
                pages.min(SMALL_PAGES - page),
                phys_page,
                perm_of(perm),
            ),
            Op::MapHuge {
                dom,
                slot,
                phys_slot,
                perm,
            } => w.map(
                dom,
                (HUGE_BASE + slot * M2) >> 12,
                512,
                (16 * M2 + phys_slot * M2) >> 12,
                perm_of(perm),
            ),
            Op::Unmap {
                dom,
                at,
                pages,
                how,
            } => w.unmap(dom, at, pages, how),
            Op::Access {
                dom,
                at,
                offset,
                len,
                write,
            } => {
                let d = &w.doms[dom];
                let page = match at {
                    Target::Mapped(n) if !d.mapped.is_empty() => {
                        *d.mapped.keys().nth(n % d.mapped.len()).unwrap()
                    }
                    Target::Recent(n) if !d.recent.is_empty() => d.recent[n % d.recent.len()],
                    Target::Huge(p) => (HUGE_BASE >> 12) + p,
                    Target::Small(p) => p,
                    _ => 0,
                };
                let iova = (page << 12) + offset;
                let access = if write { Access::Write } else { Access::Read };
                w.access(&mut t, dom, iova, len, access);
            }
            Op::Flush => w.flush(),
        }
    }
    // After a final flush nothing may be stale: every page translates exactly.
    w.flush();
    for dom in 0..2 {
        let pages: Vec<u64> = w.doms[dom].mapped.keys().copied().take(64).collect();
        for p in pages {
            w.access(&mut t, dom, p << 12, 8, Access::Read);
        }
    }
    let unit_stats = w.unit.stats();
    assert_eq!(unit_stats.queue_errors, 0);
    TOTALS.hits.fetch_add(t.stats().hits, Ordering::Relaxed);
    TOTALS
        .lookups
        .fetch_add(t.stats().lookups, Ordering::Relaxed);
}

/// Over all cases, for a sanity check that the IOTLB was exercised.
struct Totals {
    hits: AtomicU64,
    lookups: AtomicU64,
}

static TOTALS: Totals = Totals {
    hits: AtomicU64::new(0),
    lookups: AtomicU64::new(0),
};

#[test]
fn zz_the_model_runs_exercise_the_iotlb() {
    // Runs its own cases so it does not depend on test order.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..8 {
        let ops = prop::collection::vec(op(), 100..120)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        run(QueueMode::Inline, ops);
    }
    let (h, l) = (
        TOTALS.hits.load(Ordering::Relaxed),
        TOTALS.lookups.load(Ordering::Relaxed),
    );
    assert!(l > 200 && h * 5 > l, "{h} hits of {l} lookups");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn translation_matches_the_model_inline(ops in prop::collection::vec(op(), 1..120)) {
        run(QueueMode::Inline, ops);
    }

    #[test]
    fn translation_matches_the_model_on_the_unit_thread(ops in prop::collection::vec(op(), 1..120)) {
        run(QueueMode::Thread, ops);
    }
}
