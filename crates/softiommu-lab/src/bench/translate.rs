//! `softiommu bench translate`: the device's hot path. 64-byte accesses at
//! random addresses over scattered 4 KiB mappings:
//!
//! - `hit`: a working set that fits our IOTLB, warmed first; the same
//!   mappings in `vm-memory`'s `Iotlb` (the rust-vmm IOTLB, a range map),
//!   looked up with the same addresses,
//!   and in `seqlock-floor`, the floor of our IOTLB's design (a bare
//!   model with the same concurrency protocol: see `translate_floor`);
//! - `walk`: a working set far larger than the IOTLB, so that most lookups
//!   miss and walk the page table's bytes (no latency modelled).
//!
//! Every figure is measured, the floor row's too (its IOTLB is stripped
//! down; its work is real).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiommu::hw::{Access, ContextEntry, SourceId, System, Translator, UnitConfig};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, Perm, VtdConfig, VtdPageTable};
use vm_memory::iommu::Iotlb;
use vm_memory::{GuestAddress, Permissions};

use super::translate_floor::SeqlockFloor;
use crate::args::{Ranged, Seconds};
use crate::error::{LabError, LabResult};
use crate::report::{contract, Cell, Column, Param, Report, Spread, Table, Unit};
use crate::workload::Rng;

/// Options of `bench translate` (and of a `[bench-translate]` scenario
/// table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TranslateBenchArgs {
    /// Mapped pages for the hit case (1..=4096: must fit the 4,096-entry
    /// IOTLB).
    #[arg(long, default_value = "2048")]
    pub hit_pages: Ranged<1, 4096>,
    /// Mapped pages for the walk case (1..=1048576).
    #[arg(long, default_value = "65536")]
    pub walk_pages: Ranged<1, { 1 << 20 }>,
    /// Seconds per case, split over the rounds (0.01..=86400).
    #[arg(long, default_value = "1")]
    pub seconds: Seconds,
    /// Interleaved rounds; the median is reported (1..=1000).
    #[arg(long, default_value = "5")]
    pub rounds: Ranged<1, 1000>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for TranslateBenchArgs {
    fn default() -> Self {
        Self {
            hit_pages: Ranged::new(2048),
            walk_pages: Ranged::new(65536),
            seconds: Seconds::new(1.0),
            rounds: Ranged::new(5),
            json: false,
        }
    }
}

/// One (implementation, case) result.
#[derive(Debug, Clone, Serialize)]
pub struct TranslateResult {
    /// "softiommu" or "vm-memory".
    #[serde(rename = "impl")]
    pub name: String,
    /// "hit" or "walk".
    pub case: String,
    /// Nanoseconds per 64-byte lookup (median round).
    pub ns_per_lookup: f64,
    /// `ns_per_lookup` over the rounds (min, median, max); `null` with
    /// one round.
    pub ns_per_lookup_spread: Option<Spread>,
}

/// The JSON object of `bench translate --json`.
#[derive(Debug, Clone, Serialize)]
pub struct TranslateBenchReport {
    /// Always "translate".
    pub bench: &'static str,
    /// Pages mapped for the hit case.
    pub hit_pages: u64,
    /// Pages mapped for the walk case.
    pub walk_pages: u64,
    /// Our IOTLB's hit rate in the hit and walk cases.
    pub softiommu_hit_rate: [f64; 2],
    /// The floor model's hit rate in the hit case (its misses refill from
    /// a hash map, ours walk: read its figure with it).
    pub seqlock_floor_hit_rate: f64,
    /// Results.
    pub results: Vec<TranslateResult>,
}

const SID: SourceId = SourceId(0x0400);
const SEQ: usize = 1 << 16;

struct Setup {
    iovas: Vec<u64>,
    /// Each of `iovas`' physical page.
    phys: Vec<u64>,
    /// The addresses looked up in turn: an array of exactly `SEQ`, so that
    /// the loop's masked index needs no bounds check (the same in every
    /// row: the loop's cost is not what is measured).
    lookups: Box<[u64; SEQ]>,
}

/// Maps `pages` scattered pages (random IOVA page numbers, random frames)
/// in `table` and, if given, in a vm-memory `Iotlb`.
fn scatter(table: &VtdPageTable, pages: u64, seed: u64, mut iotlb: Option<&mut Iotlb>) -> Setup {
    let mut rng = Rng::new(seed);
    let mut used = std::collections::HashSet::new();
    let mut iovas = Vec::with_capacity(pages as usize);
    let mut frames = Vec::with_capacity(pages as usize);
    while iovas.len() < pages as usize {
        let pfn = (1 << 20) + rng.below(1 << 26);
        if !used.insert(pfn) {
            continue;
        }
        let iova = pfn << 12;
        let phys = (rng.below(1 << 18)) << 12; // anywhere in the first GiB
        table
            .map(iova, phys, 4096, Perm::RW)
            .expect("map a fresh page");
        if let Some(t) = iotlb.as_deref_mut() {
            t.set_mapping(
                GuestAddress(iova),
                GuestAddress(phys),
                4096,
                Permissions::ReadWrite,
            )
            .expect("vm-memory mapping");
        }
        iovas.push(iova);
        frames.push(phys);
    }
    let lookups: Box<[u64]> = (0..SEQ)
        .map(|_| iovas[rng.below(pages) as usize] + 64 * rng.below(64))
        .collect();
    let lookups: Box<[u64; SEQ]> = lookups.try_into().expect("SEQ addresses collected");
    Setup {
        iovas,
        phys: frames,
        lookups,
    }
}

/// The loop every row runs: `look` on each address of the lookup
/// sequence in turn, its result summed into a sink the optimizer must
/// keep, for `budget`. Inlined into each row with its lookup, so that
/// every row pays the same loop. Nanoseconds per lookup, and lookups.
#[inline(always)]
fn time_lookups(s: &Setup, budget: Duration, mut look: impl FnMut(u64) -> u64) -> (f64, u64) {
    let (mut n, mut i, mut sink) = (0u64, 0usize, 0u64);
    let start = Instant::now();
    while start.elapsed() < budget {
        for _ in 0..1024 {
            sink = sink.wrapping_add(look(s.lookups[i & (SEQ - 1)]));
            i += 1;
        }
        n += 1024;
    }
    std::hint::black_box(sink);
    (start.elapsed().as_nanos() as f64 / n as f64, n)
}

fn time_ours(tr: &mut Translator, s: &Setup, budget: Duration) -> f64 {
    time_lookups(s, budget, |iova| {
        // A 64-byte access inside one page: the single-page call, and
        // the check that the whole access fits in what it returns.
        let span = tr.translate_page(SID, iova, Access::Read).expect("mapped");
        assert!(span.len >= 64);
        span.phys
    })
    .0
}

/// [`time_ours`] for the floor model, warmed as ours is; the time per
/// lookup and the hit rate.
fn time_floor(f: &mut SeqlockFloor, s: &Setup, budget: Duration) -> (f64, f64) {
    let before = f.misses();
    let (ns, n) = time_lookups(s, budget, |iova| {
        let span = f.translate(iova).expect("mapped");
        assert!(span.len >= 64);
        span.phys
    });
    let misses = f.misses().saturating_sub(before) as f64;
    (ns, 1.0 - misses / n as f64)
}

fn time_vm(iotlb: &Iotlb, s: &Setup, budget: Duration) -> f64 {
    time_lookups(s, budget, |iova| {
        Iotlb::lookup(iotlb, GuestAddress(iova), 64, Permissions::Read)
            .expect("mapped")
            .fold(0u64, |sum, m| sum.wrapping_add(m.base.0))
    })
    .0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the bench.
pub fn run(args: &TranslateBenchArgs) -> LabResult<Report> {
    let r = measure(args)?;
    Ok(report(&r, args))
}

fn measure(args: &TranslateBenchArgs) -> LabResult<TranslateBenchReport> {
    let mem = Arc::new(PhysMemory::new(8 << 30)?);
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default())?;
    sys.assign(SID, unit)?;
    let hit_table = VtdPageTable::new(mem.clone(), VtdConfig::coherent())?;
    let walk_table = VtdPageTable::new(mem.clone(), VtdConfig::coherent())?;
    let mut iotlb = Iotlb::new();
    let hit = scatter(&hit_table, args.hit_pages.get(), 1, Some(&mut iotlb));
    let walk = scatter(&walk_table, args.walk_pages.get(), 2, None);
    let u = sys
        .unit(unit)
        .ok_or(LabError::Setup("the unit just added is missing"))?;
    let mut tr = u.translator()?;
    let rounds = args.rounds.us();
    let budget = Duration::from_secs_f64(args.seconds.get() / rounds as f64);
    let attach = |table: &VtdPageTable, did: u16| {
        u.attach(
            SID,
            ContextEntry::Translated {
                did,
                root: table.root(),
            },
        )
    };
    let mut floor = SeqlockFloor::new(
        hit.iovas
            .iter()
            .zip(&hit.phys)
            .map(|(&iova, &phys)| (iova >> 12, phys))
            .collect(),
    );
    for &iova in &hit.iovas {
        let _ = floor.translate(iova);
    }
    let (mut ours_hit, mut vm_hit, mut ours_walk) = (Vec::new(), Vec::new(), Vec::new());
    let (mut floor_hit, mut floor_rate) = (Vec::new(), 0.0);
    let mut rates = [0.0f64; 2];
    for _ in 0..rounds {
        attach(&hit_table, 1)?;
        for &iova in &hit.iovas {
            let _ = tr.translate(SID, iova, 64, Access::Read);
        }
        let before = tr.stats();
        ours_hit.push(time_ours(&mut tr, &hit, budget));
        rates[0] = hit_rate(before, tr.stats());
        vm_hit.push(time_vm(&iotlb, &hit, budget));
        let (ns, rate) = time_floor(&mut floor, &hit, budget);
        floor_hit.push(ns);
        floor_rate = rate;
        attach(&walk_table, 2)?;
        let before = tr.stats();
        ours_walk.push(time_ours(&mut tr, &walk, budget));
        rates[1] = hit_rate(before, tr.stats());
    }
    Ok(TranslateBenchReport {
        bench: "translate",
        hit_pages: args.hit_pages.get(),
        walk_pages: args.walk_pages.get(),
        softiommu_hit_rate: rates,
        seqlock_floor_hit_rate: floor_rate,
        results: vec![
            TranslateResult {
                name: "softiommu".into(),
                case: "hit".into(),
                ns_per_lookup_spread: Spread::of_rounds(&ours_hit),
                ns_per_lookup: median(ours_hit),
            },
            TranslateResult {
                name: "vm-memory".into(),
                case: "hit".into(),
                ns_per_lookup_spread: Spread::of_rounds(&vm_hit),
                ns_per_lookup: median(vm_hit),
            },
            TranslateResult {
                name: "seqlock-floor".into(),
                case: "hit".into(),
                ns_per_lookup_spread: Spread::of_rounds(&floor_hit),
                ns_per_lookup: median(floor_hit),
            },
            TranslateResult {
                name: "softiommu".into(),
                case: "walk".into(),
                ns_per_lookup_spread: Spread::of_rounds(&ours_walk),
                ns_per_lookup: median(ours_walk),
            },
        ],
    })
}

fn hit_rate(a: softiommu::hw::TranslatorStats, b: softiommu::hw::TranslatorStats) -> f64 {
    let hits = b.hits.saturating_sub(a.hits) as f64;
    let misses = b.walks.saturating_sub(a.walks) as f64;
    if hits + misses == 0.0 {
        0.0
    } else {
        hits / (hits + misses)
    }
}

/// The typed report.
fn report(r: &TranslateBenchReport, args: &TranslateBenchArgs) -> Report {
    let vm_row = r.results.iter().find(|x| x.name == "vm-memory");
    let vm = vm_row.map(|x| x.ns_per_lookup);
    let mut t = Table::new(
        "results",
        format!(
            "64-byte lookups at random addresses, median round [lowest–highest round]; hit: {} scattered pages (our IOTLB hit rate {:.3}, the floor model's {:.3}), walk: {} pages (hit rate {:.3})",
            r.hit_pages, r.softiommu_hit_rate[0], r.seqlock_floor_hit_rate, r.walk_pages, r.softiommu_hit_rate[1]
        ),
        vec![
            Column::label("impl"),
            Column::label("case"),
            Column::metric("ns_per_lookup", "per lookup", Unit::Ns, 1),
            Column::metric("vm_memory_over_this", "vm-memory / this", Unit::Ratio, 1),
        ],
    );
    for x in &r.results {
        t.row(vec![
            x.name.clone().into(),
            x.case.clone().into(),
            Cell::figure(x.ns_per_lookup, x.ns_per_lookup_spread),
            vm.map_or(Cell::Missing, |v| {
                let spread =
                    // vm-memory over itself is 1 exactly: no spread.
                    vm_row
                        .filter(|b| b.name != x.name || b.case != x.case)
                        .and_then(|b| b.ns_per_lookup_spread?.ratio(&x.ns_per_lookup_spread?));
                Cell::figure(v / x.ns_per_lookup, spread)
            }),
        ]);
    }
    let mut rep = Report::new(
        "bench translate",
        "device-side translation: our IOTLB hit beside vm-memory's Iotlb, and page walks",
        contract(r),
    );
    rep.params = vec![
        Param::new("hit_pages", r.hit_pages, Unit::Pages),
        Param::new("walk_pages", r.walk_pages, Unit::Pages),
        Param::new("seconds", args.seconds, Unit::S),
        Param::new("rounds", args.rounds, Unit::Count),
    ];
    rep.tables.push(t);
    rep
}
