//! Random map/unmap sequences on a VT-d page table, checked against a
//! simple model of intervals two ways: through `iova_to_phys`, and through
//! an independent decoder that reads the raw table bytes out of
//! `PhysMemory` by the VT-d specification's bit layout (§9.8, "Second-Level
//! Paging Entries") without using any of the `pgtable` module's code.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{
    IoPageTable, IotlbGather, PageSize, Perm, PgtableError, VtdConfig, VtdPageTable,
};

const K4: u64 = 1 << 12;
const M2: u64 = 1 << 21;
const G1: u64 = 1 << 30;

// ---------------------------------------------------------------------------
// The independent decoder: VT-d §9.8, written from the specification.
// ---------------------------------------------------------------------------

/// Bit 0: read; bit 1: write; an entry with both clear is not present.
const R: u64 = 1;
const W: u64 = 2;
/// Bit 7: page size; a leaf at levels 3 (1 GiB) and 2 (2 MiB).
const PS: u64 = 1 << 7;
/// Bits 51:12: address.
const ADDR: u64 = 0x000f_ffff_ffff_f000;
/// Bits this implementation promises never to set: X (2), EMT/IPAT (6:3),
/// A/D and ignored bits (11:8), and 63:52 (ignored, TM, reserved).
const NEVER_SET: u64 = !(ADDR | PS | R | W);

/// A leaf as the decoder found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    iova: u64,
    len: u64,
    phys: u64,
    /// bit 0 read, bit 1 write, as the AND of every level.
    perm: u64,
}

/// Everything reachable from the root.
#[derive(Debug, Default)]
struct Decoded {
    leaves: Vec<Run>,
    tables: BTreeSet<u64>,
}

fn read_table(mem: &PhysMemory, page: u64) -> [u64; 512] {
    let mut bytes = vec![0u8; 4096];
    mem.read(page, &mut bytes)
        .expect("table page inside the arena");
    let mut out = [0u64; 512];
    for (i, e) in out.iter_mut().enumerate() {
        *e = u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    }
    out
}

fn decode_level(mem: &PhysMemory, page: u64, level: u32, base: u64, perm: u64, d: &mut Decoded) {
    assert_eq!(page % 4096, 0);
    assert!(d.tables.insert(page), "table {page:#x} is linked twice");
    let shift = 12 + 9 * (level - 1);
    for (i, &e) in read_table(mem, page).iter().enumerate() {
        let iova = base + ((i as u64) << shift);
        if e & (R | W) == 0 {
            assert_eq!(e, 0, "a non-present entry is all zero");
            continue;
        }
        assert_eq!(
            e & NEVER_SET,
            0,
            "unexpected bits in {e:#x} at level {level}"
        );
        let p = perm & e & (R | W);
        let leaf = level == 1 || (e & PS != 0);
        if leaf {
            assert!(level <= 3, "PS is reserved at level 4");
            let size = 1u64 << shift;
            let phys = e & ADDR;
            assert_eq!(phys % size, 0, "reserved low address bits of a large leaf");
            d.leaves.push(Run {
                iova,
                len: size,
                phys,
                perm: p,
            });
        } else {
            assert_eq!(e & (R | W), R | W, "table entries allow everything");
            decode_level(mem, e & ADDR, level - 1, iova, p, d);
        }
    }
}

fn decode(mem: &PhysMemory, root: u64) -> Decoded {
    let mut d = Decoded::default();
    decode_level(mem, root, 4, 0, R | W, &mut d);
    d
}

/// Merges runs that continue one another in IOVA and physical address with
/// the same permissions.
fn coalesce(runs: impl IntoIterator<Item = Run>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for r in runs {
        match out.last_mut() {
            Some(l) if l.iova + l.len == r.iova && l.phys + l.len == r.phys && l.perm == r.perm => {
                l.len += r.len
            }
            _ => out.push(r),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The model: disjoint intervals.
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Model {
    /// start → (len, phys, perm bits)
    map: BTreeMap<u64, (u64, u64, u64)>,
}

impl Model {
    /// The interval holding `x`.
    fn find(&self, x: u64) -> Option<(u64, u64, u64, u64)> {
        let (&s, &(l, p, perm)) = self.map.range(..=x).next_back()?;
        (x < s + l).then_some((s, l, p, perm))
    }

    /// The first mapped address in `[iova, end)`.
    fn first_mapped(&self, iova: u64, end: u64) -> Option<u64> {
        if let Some((s, ..)) = self.find(iova) {
            return Some(s.max(iova));
        }
        self.map.range(iova..end).next().map(|(&s, _)| s)
    }

    /// The first unmapped address in `[iova, end)`.
    fn first_unmapped(&self, iova: u64, end: u64) -> Option<u64> {
        let mut cur = iova;
        while cur < end {
            match self.find(cur) {
                Some((s, l, ..)) => cur = s + l,
                None => return Some(cur),
            }
        }
        None
    }

    fn insert(&mut self, iova: u64, len: u64, phys: u64, perm: u64) {
        self.map.insert(iova, (len, phys, perm));
    }

    fn remove(&mut self, iova: u64, end: u64) {
        let hit: Vec<u64> = self
            .map
            .range(..end)
            .filter(|(&s, &(l, ..))| s + l > iova)
            .map(|(&s, _)| s)
            .collect();
        for s in hit {
            let (l, p, perm) = self.map.remove(&s).unwrap();
            if s < iova {
                self.map.insert(s, (iova - s, p, perm));
            }
            if s + l > end {
                self.map.insert(end, (s + l - end, p + (end - s), perm));
            }
        }
    }

    fn runs(&self) -> Vec<Run> {
        coalesce(self.map.iter().map(|(&iova, &(len, phys, perm))| Run {
            iova,
            len,
            phys,
            perm,
        }))
    }
}

fn perm_bits(p: Perm) -> u64 {
    u64::from(p.read()) | (u64::from(p.write()) << 1)
}

// ---------------------------------------------------------------------------
// Operations.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Map {
        iova: u64,
        len: u64,
        /// 0: phys congruent to the IOVA modulo 1 GiB, 1: modulo 2 MiB,
        /// 2: any page.
        phys_mode: u8,
        seed: u64,
        perm: u8,
    },
    /// Unmap part of an existing interval (`pick` chooses it), or, with no
    /// interval, the range given.
    Unmap {
        pick: usize,
        mode: u8,
        a: u64,
        b: u64,
        iova: u64,
        len: u64,
    },
    /// Input that must be refused.
    Bad { kind: u8, iova: u64 },
}

fn iova_strategy() -> impl Strategy<Value = u64> {
    (
        0u64..4,
        prop_oneof![Just(0u64), Just(1), Just(2), Just(511)],
        0u64..512,
        any::<bool>(),
    )
        .prop_map(|(g, m, p, on_2m)| g * G1 + m * M2 + if on_2m { 0 } else { p * K4 })
}

fn len_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (1u64..=40).prop_map(|n| n * K4),
        2 => (1u64..=600).prop_map(|n| n * K4),
        2 => (1u64..=3).prop_map(|n| n * M2),
        1 => Just(G1),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (iova_strategy(), len_strategy(), 0u8..3, any::<u64>(), 1u8..4).prop_map(
            |(iova, len, phys_mode, seed, perm)| Op::Map { iova, len, phys_mode, seed, perm }
        ),
        4 => (any::<usize>(), 0u8..6, any::<u64>(), any::<u64>(), iova_strategy(), len_strategy())
            .prop_map(|(pick, mode, a, b, iova, len)| Op::Unmap { pick, mode, a, b, iova, len }),
        1 => (0u8..6, iova_strategy()).prop_map(|(kind, iova)| Op::Bad { kind, iova }),
    ]
}

fn perm_of(p: u8) -> Perm {
    match p {
        1 => Perm::READ,
        2 => Perm::WRITE,
        _ => Perm::RW,
    }
}

struct World {
    mem: Arc<PhysMemory>,
    table: VtdPageTable,
    model: Model,
    coherent: bool,
}

impl World {
    fn new(coherent: bool) -> Self {
        let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
        let config = if coherent {
            VtdConfig::coherent()
        } else {
            VtdConfig::non_coherent()
        };
        let table = VtdPageTable::new(Arc::clone(&mem), config).unwrap();
        Self {
            mem,
            table,
            model: Model::default(),
            coherent,
        }
    }

    fn check_stats(&self, st: &softiommu::pgtable::OpStats) {
        if self.coherent {
            assert_eq!((st.lines_flushed, st.flush_batches), (0, 0));
        } else {
            assert_eq!(st.lines_flushed, st.lines_written);
            assert!(st.lines_flushed >= 1 && st.flush_batches >= 1);
        }
    }

    fn map(&mut self, iova: u64, len: u64, phys_mode: u8, seed: u64, perm: Perm) {
        let end = iova + len;
        let mut phys = match phys_mode {
            0 => (seed % 64) * G1 + iova % G1,
            1 => (seed % 64) * G1 + iova % M2,
            _ => (seed % (1 << 28)) * K4,
        };
        if len > 4 * M2 && phys % M2 != iova % M2 {
            phys = (seed % 64) * G1 + iova % M2; // keep 4 KiB leaf counts small
        }
        let r = self.table.map(iova, phys, len, perm);
        match self.model.first_mapped(iova, end) {
            Some(at) => {
                assert_eq!(r, Err(PgtableError::AlreadyMapped { iova, len, at }));
            }
            None => {
                let st = r.expect("map of a free range");
                self.check_stats(&st);
                self.model.insert(iova, len, phys, perm_bits(perm));
            }
        }
    }

    fn unmap(&mut self, iova: u64, len: u64) {
        let end = iova + len;
        let mut g = IotlbGather::new();
        let r = self.table.unmap(iova, len, &mut g);
        match self.model.first_unmapped(iova, end) {
            Some(at) => {
                assert_eq!(r, Err(PgtableError::NotMapped { iova, len, at }));
                assert!(g.is_empty());
            }
            None => {
                let st = r.expect("unmap of a mapped range");
                self.check_stats(&st);
                self.model.remove(iova, end);
                assert_eq!(g.range(), Some((iova, end - 1)));
                assert_eq!(g.freed_tables().len() as u64, st.tables_freed);
                // Freed pages are unreachable, but still allocated until the
                // invalidation completes.
                let live = decode(&self.mem, self.table.root()).tables;
                for p in g.freed_tables() {
                    assert!(!live.contains(p), "freed table {p:#x} still linked");
                }
                let frames = self.mem.frame_stats().allocated_frames;
                assert_eq!(frames, live.len() as u64 + st.tables_freed);
                assert_eq!(g.complete(), Ok(st.tables_freed as usize));
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Map {
                iova,
                len,
                phys_mode,
                seed,
                perm,
            } => self.map(iova, len, phys_mode, seed, perm_of(perm)),
            Op::Unmap {
                pick,
                mode,
                a,
                b,
                iova,
                len,
            } => {
                if self.model.map.is_empty() || mode == 5 {
                    return self.unmap(iova, len);
                }
                let (&s, &(l, ..)) = self
                    .model
                    .map
                    .iter()
                    .nth(pick % self.model.map.len())
                    .unwrap();
                let pages = l / K4;
                let (first, n) = match mode {
                    0 => (0, pages),
                    1 => (0, 1 + b % pages),
                    2 => {
                        let n = 1 + b % pages;
                        (pages - n, n)
                    }
                    3 => {
                        let first = a % pages;
                        (first, 1 + b % (pages - first))
                    }
                    // Past the interval's end by a page: mapped only if a
                    // neighbour continues it.
                    _ => (a % pages, pages - a % pages + 1),
                };
                self.unmap(s + first * K4, n * K4)
            }
            Op::Bad { kind, iova } => {
                let mut g = IotlbGather::new();
                let r = match kind {
                    0 => self.table.map(iova, 0, 0, Perm::RW),
                    1 => self.table.map(iova + 8, 0, K4, Perm::RW),
                    2 => self.table.map(iova, 0x123, K4, Perm::RW),
                    3 => self.table.map((1 << 48) - K4, 0, 2 * K4, Perm::RW),
                    4 => self.table.unmap(iova, 0x10, &mut g),
                    _ => self.table.map(iova, 0, K4, Perm::NONE),
                };
                let ok = match (kind, r) {
                    (0, Err(PgtableError::ZeroLength { .. })) => true,
                    (1 | 4, Err(PgtableError::Unaligned { .. })) => true,
                    (2, Err(PgtableError::UnalignedPhys { .. })) => true,
                    (3, Err(PgtableError::AddressTooWide { .. })) => true,
                    (5, Err(PgtableError::NoPermission { .. })) => true,
                    (_, r) => panic!("kind {kind}: unexpected {r:?}"),
                };
                assert!(ok && g.is_empty());
            }
        }
    }

    /// The table, read two ways, says what the model says.
    fn check(&self) {
        let d = decode(&self.mem, self.table.root());
        assert_eq!(coalesce(d.leaves.iter().copied()), self.model.runs());
        assert_eq!(self.table.stats().table_pages, d.tables.len() as u64);
        assert_eq!(
            self.mem.frame_stats().allocated_frames,
            d.tables.len() as u64
        );

        let leaf_size = |x: u64| {
            d.leaves
                .iter()
                .find(|r| r.iova <= x && x < r.iova + r.len)
                .map(|r| r.len)
        };
        let probe = |x: u64| {
            let t = self.table.iova_to_phys(x).unwrap();
            match self.model.find(x) {
                Some((s, _, p, perm)) => {
                    let t = t.unwrap_or_else(|| panic!("{x:#x} should be mapped"));
                    assert_eq!(t.phys, p + (x - s));
                    assert_eq!(perm_bits(t.perm), perm);
                    assert_eq!(Some(t.size.bytes()), leaf_size(x));
                }
                None => assert_eq!(t, None, "{x:#x} should not be mapped"),
            }
        };
        for (&s, &(l, ..)) in &self.model.map {
            probe(s);
            probe(s + l - 1);
            probe(s + l / 2 + 0x123);
            probe(s + l);
            if s > 0 {
                probe(s - 1);
            }
        }
    }

    /// Unmaps everything; checks no table page leaked, then drops.
    fn tear_down(mut self) {
        let all: Vec<(u64, u64)> = self.model.map.iter().map(|(&s, &(l, ..))| (s, l)).collect();
        for (s, l) in all {
            self.unmap(s, l);
        }
        self.check();
        let Self { mem, table, .. } = self;
        drop(table);
        assert_eq!(mem.frame_stats().allocated_frames, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn pgtable_random_maps_and_unmaps_agree_with_the_model(
        coherent in any::<bool>(),
        ops in prop::collection::vec(op_strategy(), 1..40),
    ) {
        let mut w = World::new(coherent);
        for op in &ops {
            w.apply(op);
            w.check();
        }
        w.tear_down();
    }
}

#[test]
fn pgtable_leaf_sizes_seen_by_the_decoder_are_the_largest_possible() {
    let mut w = World::new(true);
    // [1G - 4K, 2G + 2M + 4K) congruent modulo 1 GiB: 4K, 1G, 2M, 4K.
    w.map(G1 - K4, G1 + M2 + 2 * K4, 0, 3, Perm::RW);
    w.check();
    let d = decode(&w.mem, w.table.root());
    let sizes: Vec<u64> = d.leaves.iter().map(|r| r.len).collect();
    assert_eq!(sizes, vec![K4, G1, M2, K4]);
    assert_eq!(
        w.table.iova_to_phys(G1).unwrap().unwrap().size,
        PageSize::Size1G
    );
    w.tear_down();
}
