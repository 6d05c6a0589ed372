//! `softiommu bench iova`: alloc+free pairs on a DMA-like size mix, ours
//! beside `vm-allocator`, `range-alloc`, `offset-allocator`, our
//! `linux-2016` baseline, `magazine-floor` (the floor of our design, a
//! bare model: see `iova_floor`), `owner-store-floor` (the floor of a
//! design whose owner frees without a locked instruction) and
//! `contract-floor` (that floor with the checks our contract makes on
//! every pair: see `iova_contract_floor`), in one run.
//!
//! Each thread holds `--live` allocations; each step frees the one in a
//! random slot and allocates a new size into it, so frees come in a
//! different order than allocations. Sizes and slots are drawn before the
//! clock starts. Every figure is measured, the floor row's too (its
//! allocator is stripped down; its work is real); no latency is modelled.

use std::num::NonZeroU64;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiommu::iova::IovaPolicy;

use super::iova_contract_floor::ContractFloor;
use super::iova_floor::{BlockModel, Blocks, MagazineFloor};
use super::iova_peers::{
    Harness, Iova, OffsetAlloc, Owned, PairAlloc, Peer, RangeAlloc, Shared, VmAllocator,
};
use crate::args::{Ranged, Seconds};
use crate::error::LabResult;
use crate::report::{contract, Cell, Column, Param, Report, Spread, Table, Unit};
use crate::workload::{Rng, DMA_MIX};

/// Options of `bench iova` (and of a `[bench-iova]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IovaBenchArgs {
    /// Threads allocating at once (1..=256).
    #[arg(long, default_value = "1")]
    pub threads: Ranged<1, 256>,
    /// Live allocations each thread holds (1..=1000000).
    #[arg(long, default_value = "4096")]
    pub live: Ranged<1, 1_000_000>,
    /// Seconds of measurement per implementation, split over the rounds
    /// (0.01..=86400).
    #[arg(long, default_value = "1.5")]
    pub seconds: Seconds,
    /// Rounds: each implementation runs once per round, interleaved; the
    /// median round is reported (1..=1000).
    #[arg(long, default_value = "5")]
    pub rounds: Ranged<1, 1000>,
    /// Implementations to run beside ours (default: all; ours always runs
    /// first).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub impls: Vec<Impl>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for IovaBenchArgs {
    fn default() -> Self {
        Self {
            threads: Ranged::new(1),
            live: Ranged::new(4096),
            seconds: Seconds::new(1.5),
            rounds: Ranged::new(5),
            impls: Vec::new(),
            json: false,
        }
    }
}

/// The implementations `bench iova` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Impl {
    /// Ours (always runs).
    Softiommu,
    /// The loop alone, no allocator.
    Harness,
    /// Ours through its batch calls (`free_all`, `alloc_all`), 16 pairs a
    /// call: a different measurement from a single pair (see
    /// `ImplResult::pairs_per_call`).
    #[value(name = "softiommu-batch16")]
    #[serde(rename = "softiommu-batch16")]
    SoftiommuBatch16,
    /// Our Linux 2016 baseline.
    #[value(name = "linux-2016")]
    #[serde(rename = "linux-2016")]
    Linux2016,
    /// The `offset-allocator` crate.
    OffsetAllocator,
    /// The `range-alloc` crate.
    RangeAlloc,
    /// The `vm-allocator` crate.
    VmAllocator,
    /// The floor of our earlier design: a bare magazine allocator whose
    /// free claims the block with one compare-exchange (see
    /// `iova_floor`); at one thread only.
    MagazineFloor,
    /// The floor of the design we ship: the same model, its owner's free
    /// by a load, a check and a plain store inside an asymmetric fence
    /// pair instead of a compare-exchange (see `iova_floor`); at one
    /// thread only.
    OwnerStoreFloor,
    /// `owner-store-floor` with the checks the allocator's contract makes
    /// on every pair, each in its least form: the caller's limit, the
    /// flush epoch, the slot's revocation, 64-bit state words (see
    /// `iova_contract_floor`); at N threads, one model each, sharing
    /// nothing (its own cost ratio then goes beside ours).
    ContractFloor,
}

impl Impl {
    /// The name printed.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Softiommu => "softiommu",
            Impl::Harness => "harness",
            Impl::SoftiommuBatch16 => "softiommu-batch16",
            Impl::Linux2016 => "linux-2016",
            Impl::OffsetAllocator => "offset-allocator",
            Impl::RangeAlloc => "range-alloc",
            Impl::VmAllocator => "vm-allocator",
            Impl::MagazineFloor => "magazine-floor",
            Impl::OwnerStoreFloor => "owner-store-floor",
            Impl::ContractFloor => "contract-floor",
        }
    }
}

/// One implementation's result.
#[derive(Debug, Clone, Serialize)]
pub struct ImplResult {
    /// Implementation name.
    #[serde(rename = "impl")]
    pub name: String,
    /// Wall-clock nanoseconds per alloc+free pair, per thread (median round).
    pub ns_per_pair: f64,
    /// CPU nanoseconds per pair, per thread (each thread's own CPU clock,
    /// `CLOCK_THREAD_CPUTIME_ID`; median round): the pair's cost without
    /// the time its thread was not running, whether the machine's other
    /// load took the core or (a shared peer) it slept on the peer's lock.
    pub cpu_ns_per_pair: f64,
    /// Pairs done in all threads and rounds.
    pub pairs: u64,
    /// `ns_per_pair` over the rounds (min, median, max); `null` with one
    /// round.
    pub ns_per_pair_spread: Option<Spread>,
    /// Alloc+free pairs per call into the allocator: 1 for every row but a
    /// batch row (`softiommu-batch16`: 16 frees in one `free_all`, then 16
    /// allocs in one `alloc_all`), whose per-pair figure is a batch's cost
    /// divided by its pairs, not the cost of one pair on its own.
    pub pairs_per_call: usize,
}

/// The JSON object `bench iova --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct IovaBenchReport {
    /// Always "iova".
    pub bench: &'static str,
    /// Threads used.
    pub threads: usize,
    /// Live allocations per thread.
    pub live: usize,
    /// Interleaved rounds; each figure is its implementation's median round.
    pub rounds: usize,
    /// Results, ours first.
    pub results: Vec<ImplResult>,
    /// For `--threads` > 1: ours measured at 1 thread in the same run, and
    /// per-thread throughput at N threads over that at 1 (1.0 = perfect).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softiommu_scaling: Option<Scaling>,
}

/// Per-thread scaling of our allocator.
#[derive(Debug, Clone, Serialize)]
pub struct Scaling {
    /// ns per pair on one thread.
    pub ns_per_pair_1_thread: f64,
    /// ns per pair per thread at `threads`.
    pub ns_per_pair_n_threads: f64,
    /// Per-thread throughput at N threads / at 1 thread.
    pub per_thread_throughput_ratio: f64,
    /// CPU ns per pair on one thread (see `ImplResult::cpu_ns_per_pair`).
    pub cpu_ns_per_pair_1_thread: f64,
    /// CPU ns per pair per thread at `threads`.
    pub cpu_ns_per_pair_n_threads: f64,
    /// Per-thread cost at N threads over at 1 thread, in CPU time (1.0 =
    /// perfect; above 1, what sharing the allocator costs a thread while
    /// it runs, not while the machine's other load holds its core).
    pub cpu_cost_ratio: f64,
    /// The same ratio for the empty harness loop (when it runs): the
    /// machine's own share of `cpu_cost_ratio` (two busy threads on
    /// cores that share caches or a host core), which no allocator can
    /// remove.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harness_cpu_cost_ratio: Option<f64>,
    /// The same ratio for the `contract-floor` model (when it runs), one
    /// model per thread sharing nothing: what threads doing the
    /// contract's per-pair work on a footprint like ours cost each other
    /// through the machine alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contract_floor_cpu_cost_ratio: Option<f64>,
}

const SEQ: usize = 1 << 16;

/// Pairs per call of the batch row.
const BATCH: usize = 16;

/// A thread's pre-drawn sizes and slots, as arrays of `SEQ` entries so
/// that the loop's masked indices need no bounds check (the harness's own
/// instructions, the same for every row).
#[allow(clippy::type_complexity)]
fn sequences(seed: u64, live: usize) -> (Box<[u64; SEQ]>, Box<[u32; SEQ]>) {
    let sizes = DMA_MIX.sequence(seed, SEQ);
    let mut rng = Rng::new(seed ^ 0xabcdef);
    let slots: Vec<u32> = (0..SEQ).map(|_| rng.below(live as u64) as u32).collect();
    (
        sizes.into_boxed_slice().try_into().expect("SEQ sizes"),
        slots.into_boxed_slice().try_into().expect("SEQ slots"),
    )
}

/// What one thread's loop returns: pairs, wall time, CPU time.
type LoopResult = (u64, Duration, Duration);

fn thread_loop<A: PairAlloc>(
    mut a: A,
    seed: u64,
    live: usize,
    budget: Duration,
    go: &Barrier,
) -> LoopResult {
    let (sizes, slots) = sequences(seed, live);
    let mut held: Vec<Option<A::Handle>> = (0..live).map(|i| a.alloc(sizes[i % SEQ])).collect();
    go.wait();
    // The loop's own sequences and handles were built by this thread (no
    // line shared with another thread's loop); what an allocator shares
    // between threads is its own design (ours: one domain; the floor
    // models: nothing, their state padded). The barrier and the clocks
    // sit outside the timed region.
    let cpu_start = softiommu::cpu_clock::thread();
    let start = Instant::now();
    let (mut i, mut pairs) = (0usize, 0u64);
    loop {
        for _ in 0..1024 {
            let s = slots[i & (SEQ - 1)] as usize;
            if let Some(h) = held[s].take() {
                a.free(h);
            }
            held[s] = a.alloc(sizes[(i + live) & (SEQ - 1)]);
            i += 1;
        }
        pairs += 1024;
        if start.elapsed() >= budget {
            break;
        }
    }
    let took = start.elapsed();
    let cpu = softiommu::cpu_clock::thread().saturating_sub(cpu_start);
    for h in held.into_iter().flatten() {
        a.free(h);
    }
    (pairs, took, cpu)
}

/// [`thread_loop`] in batches: each step takes the handles of `BATCH`
/// random slots (the same slot and size sequences), frees them in one
/// `free_all` and allocates as many new sizes in one `alloc_all`.
fn thread_loop_batch(
    mut a: Iova,
    seed: u64,
    live: usize,
    budget: Duration,
    go: &Barrier,
) -> LoopResult {
    let (sizes, slots) = sequences(seed, live);
    // Handles packed as the per-pair loop's (`pfn << 12 | pages`), so
    // that the slots the loop reads at random take the same 8 bytes each.
    let pack = |(pfn, pages): (u64, u64)| NonZeroU64::new(pfn << 12 | pages);
    let unpack = |h: NonZeroU64| (h.get() >> 12, h.get() & 0xfff);
    let mut held: Vec<Option<NonZeroU64>> = (0..live)
        .map(|i| a.alloc_block(sizes[i % SEQ]).and_then(pack))
        .collect();
    let mut frees: Vec<(u64, u64)> = Vec::with_capacity(BATCH);
    let mut news: Vec<(u64, u64)> = Vec::with_capacity(BATCH);
    let mut at = [0usize; BATCH];
    go.wait();
    let cpu_start = softiommu::cpu_clock::thread();
    let start = Instant::now();
    let (mut i, mut pairs) = (0usize, 0u64);
    loop {
        for _ in 0..1024 / BATCH {
            frees.clear();
            news.clear();
            for _ in 0..BATCH {
                let s = slots[i & (SEQ - 1)] as usize;
                // A slot drawn twice in one batch is freed and refilled once.
                if let Some(h) = held[s].take() {
                    at[frees.len()] = s;
                    frees.push(unpack(h));
                    news.push((0, sizes[(i + live) & (SEQ - 1)]));
                }
                i += 1;
            }
            a.free_all(&frees);
            a.alloc_all(&mut news);
            for (&s, &b) in at.iter().zip(&news) {
                held[s] = pack(b);
            }
            pairs += frees.len() as u64;
        }
        if start.elapsed() >= budget {
            break;
        }
    }
    let took = start.elapsed();
    let cpu = softiommu::cpu_clock::thread().saturating_sub(cpu_start);
    let rest: Vec<(u64, u64)> = held.into_iter().flatten().map(unpack).collect();
    a.free_all(&rest);
    (pairs, took, cpu)
}

fn measure<A: PairAlloc + 'static>(
    name: &str,
    allocs: Vec<A>,
    live: usize,
    budget: Duration,
) -> ImplResult {
    measure_with(name, allocs, live, budget, 1, thread_loop::<A>)
}

fn measure_with<A: Send + 'static>(
    name: &str,
    allocs: Vec<A>,
    live: usize,
    budget: Duration,
    pairs_per_call: usize,
    lp: fn(A, u64, usize, Duration, &Barrier) -> LoopResult,
) -> ImplResult {
    let go = Arc::new(Barrier::new(allocs.len()));
    let handles: Vec<_> = allocs
        .into_iter()
        .enumerate()
        .map(|(t, a)| {
            let go = go.clone();
            std::thread::spawn(move || lp(a, 0x5eed + t as u64, live, budget, &go))
        })
        .collect();
    let res: Vec<LoopResult> = handles
        .into_iter()
        .map(|h| h.join().expect("bench thread"))
        .collect();
    let pairs: u64 = res.iter().map(|r| r.0).sum();
    let per_pair = |d: &dyn Fn(&LoopResult) -> Duration| {
        res.iter()
            .map(|r| d(r).as_nanos() as f64 / r.0 as f64)
            .sum::<f64>()
            / res.len() as f64
    };
    ImplResult {
        name: name.to_string(),
        ns_per_pair: per_pair(&|r| r.1),
        cpu_ns_per_pair: per_pair(&|r| r.2),
        pairs,
        ns_per_pair_spread: None,
        pairs_per_call,
    }
}

fn peer<P: Peer>(name: &str, threads: usize, live: usize, budget: Duration) -> ImplResult {
    if threads == 1 {
        measure(name, vec![Owned(P::create())], live, budget)
    } else {
        let shared = Arc::new(Mutex::new(P::create()));
        measure(
            name,
            (0..threads).map(|_| Shared(shared.clone())).collect(),
            live,
            budget,
        )
    }
}

type Runner = Box<dyn Fn(Duration) -> ImplResult>;

/// Runs the bench: every implementation once per round, rounds interleaved,
/// and each one's median round reported, so that a burst of noise on a
/// shared machine hits one round of one implementation, not a whole column.
pub fn run(args: &IovaBenchArgs) -> LabResult<Report> {
    Ok(report(&measure_all(args), args))
}

/// Removes the row `NAME@1` (a row's one-thread run, made beside its run
/// at N threads) and returns the per-thread CPU cost of `name`'s row at N
/// threads over it, if both ran.
fn take_cost_ratio(results: &mut Vec<ImplResult>, name: &str) -> Option<f64> {
    let one_name = format!("{name}@1");
    let i = results.iter().position(|r| r.name == one_name)?;
    let one = results.remove(i);
    let n = results.iter().find(|r| r.name == name)?;
    Some(n.cpu_ns_per_pair / one.cpu_ns_per_pair)
}

/// A floor model's row (`iova_floor`, `iova_contract_floor`) at
/// `threads`, one model per thread (nothing shared between them).
fn floor_row<A: BlockModel + Send + 'static>(
    name: &'static str,
    threads: usize,
    live: usize,
) -> (&'static str, Runner) {
    (
        name,
        Box::new(move |b| {
            let models = (0..threads).map(|_| Blocks(A::default())).collect();
            measure(name, models, live, b)
        }),
    )
}

fn measure_all(args: &IovaBenchArgs) -> IovaBenchReport {
    let threads = args.threads.us();
    let live = args.live.us();
    let rounds = args.rounds.us();
    let budget = Duration::from_secs_f64(args.seconds.get() / rounds as f64);
    let want = |n: &str| {
        n == "softiommu" || args.impls.is_empty() || args.impls.iter().any(|i| i.name() == n)
    };
    let mut runners: Vec<(&str, Runner)> = vec![(
        "softiommu",
        Box::new(move |b| {
            measure(
                "softiommu",
                Iova::per_thread(IovaPolicy::Softiommu, threads),
                live,
                b,
            )
        }),
    )];
    if threads > 1 {
        runners.push((
            "softiommu@1",
            Box::new(move |b| {
                measure(
                    "softiommu@1",
                    Iova::per_thread(IovaPolicy::Softiommu, 1),
                    live,
                    b,
                )
            }),
        ));
    }
    if want("harness") {
        runners.push((
            "harness",
            Box::new(move |b| {
                measure(
                    "harness",
                    (0..threads).map(|_| Harness::default()).collect(),
                    live,
                    b,
                )
            }),
        ));
        if threads > 1 {
            // The empty loop at one thread too: what the machine alone
            // does to a per-thread figure at N threads.
            runners.push((
                "harness@1",
                Box::new(move |b| measure("harness@1", vec![Harness::default()], live, b)),
            ));
        }
    }
    // The bare floors price one thread's work: run at one thread only
    // (the contract floor, below, is the one run at N threads too).
    if threads == 1 {
        if want("magazine-floor") {
            runners.push(floor_row::<MagazineFloor<false>>("magazine-floor", 1, live));
        }
        if want("owner-store-floor") {
            runners.push(floor_row::<MagazineFloor<true>>(
                "owner-store-floor",
                1,
                live,
            ));
        }
    }
    // The contract floor at N threads too, one model each, sharing
    // nothing: its cost ratio is what N threads doing the contract's work
    // on a footprint like ours cost each other through the machine alone
    // (shared caches, memory, a host core), beyond the empty harness's.
    if want("contract-floor") {
        runners.push(floor_row::<ContractFloor>("contract-floor", threads, live));
        if threads > 1 {
            runners.push(floor_row::<ContractFloor>("contract-floor@1", 1, live));
        }
    }
    if want("softiommu-batch16") {
        runners.push((
            "softiommu-batch16",
            Box::new(move |b| {
                measure_with(
                    "softiommu-batch16",
                    Iova::per_thread(IovaPolicy::Softiommu, threads),
                    live,
                    b,
                    BATCH,
                    thread_loop_batch,
                )
            }),
        ));
    }
    if want("linux-2016") {
        runners.push((
            "linux-2016",
            Box::new(move |b| {
                measure(
                    "linux-2016",
                    Iova::per_thread(IovaPolicy::Linux2016, threads),
                    live,
                    b,
                )
            }),
        ));
    }
    if want("offset-allocator") {
        runners.push((
            "offset-allocator",
            Box::new(move |b| peer::<OffsetAlloc>("offset-allocator", threads, live, b)),
        ));
    }
    if want("range-alloc") {
        runners.push((
            "range-alloc",
            Box::new(move |b| peer::<RangeAlloc>("range-alloc", threads, live, b)),
        ));
    }
    if want("vm-allocator") {
        // ~20 µs a pair at 4,096 live: a tenth of the time still gives
        // thousands of pairs.
        runners.push((
            "vm-allocator",
            Box::new(move |b| peer::<VmAllocator>("vm-allocator", threads, live, b / 10)),
        ));
    }
    let mut rounds_of: Vec<Vec<ImplResult>> = runners.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (i, (_, r)) in runners.iter().enumerate() {
            rounds_of[i].push(r(budget));
        }
    }
    let mut results: Vec<ImplResult> = rounds_of
        .into_iter()
        .map(|mut v| {
            let mut cpu: Vec<f64> = v.iter().map(|r| r.cpu_ns_per_pair).collect();
            cpu.sort_by(f64::total_cmp);
            v.sort_by(|a, b| a.ns_per_pair.total_cmp(&b.ns_per_pair));
            let pairs = v.iter().map(|r| r.pairs).sum();
            ImplResult {
                pairs,
                ns_per_pair_spread: Spread::of_rounds(
                    &v.iter().map(|r| r.ns_per_pair).collect::<Vec<_>>(),
                ),
                cpu_ns_per_pair: cpu[cpu.len() / 2],
                ..v[v.len() / 2].clone()
            }
        })
        .collect();
    // The one-thread runs of the harness and the floor are not rows.
    let harness_cpu_cost_ratio = take_cost_ratio(&mut results, "harness");
    let contract_floor_cpu_cost_ratio = take_cost_ratio(&mut results, "contract-floor");
    let softiommu_scaling = (threads > 1).then(|| {
        let one = results.remove(1);
        Scaling {
            ns_per_pair_1_thread: one.ns_per_pair,
            ns_per_pair_n_threads: results[0].ns_per_pair,
            per_thread_throughput_ratio: one.ns_per_pair / results[0].ns_per_pair,
            cpu_ns_per_pair_1_thread: one.cpu_ns_per_pair,
            cpu_ns_per_pair_n_threads: results[0].cpu_ns_per_pair,
            cpu_cost_ratio: results[0].cpu_ns_per_pair / one.cpu_ns_per_pair,
            harness_cpu_cost_ratio,
            contract_floor_cpu_cost_ratio,
        }
    });
    IovaBenchReport {
        bench: "iova",
        threads,
        live,
        rounds,
        results,
        softiommu_scaling,
    }
}

/// The typed report.
fn report(r: &IovaBenchReport, args: &IovaBenchArgs) -> Report {
    let ours = r.results[0].ns_per_pair;
    let ours_spread = r.results[0].ns_per_pair_spread;
    let mut t = Table::new(
        "results",
        format!(
            "alloc+free pairs, DMA size mix, {} live per thread, {} thread(s), median of {} rounds [lowest–highest round]",
            r.live, r.threads, r.rounds
        ),
        vec![
            Column::label("impl"),
            Column::metric("ns_per_pair", "per pair", Unit::Ns, 1),
            Column::metric("cpu_ns_per_pair", "CPU per pair", Unit::Ns, 1),
            Column::metric("vs_softiommu", "vs softiommu", Unit::Ratio, 1),
            Column::metric("pairs", "pairs", Unit::Count, 0),
        ],
    );
    for (i, x) in r.results.iter().enumerate() {
        t.row(vec![
            x.name.clone().into(),
            Cell::figure(x.ns_per_pair, x.ns_per_pair_spread),
            x.cpu_ns_per_pair.into(),
            Cell::figure(
                x.ns_per_pair / ours,
                // Ours over itself is 1 exactly: no spread.
                x.ns_per_pair_spread
                    .zip(ours_spread)
                    .filter(|_| i > 0)
                    .and_then(|(a, b)| a.ratio(&b)),
            ),
            x.pairs.into(),
        ]);
    }
    let mut rep = Report::new(
        "bench iova",
        "IOVA alloc+free pairs: ours beside vm-allocator, range-alloc, offset-allocator and the Linux 2016 design",
        contract(r),
    );
    rep.params = vec![
        Param::new("threads", r.threads, Unit::Threads),
        Param::new("live", r.live, Unit::Count),
        Param::new("seconds", args.seconds, Unit::S),
        Param::new("rounds", r.rounds, Unit::Count),
    ];
    rep.tables.push(t);
    if let Some(sc) = &r.softiommu_scaling {
        let mut s = Table::new(
            "scaling",
            "softiommu per-thread throughput at N threads / at 1 thread",
            vec![
                Column::label("impl"),
                Column::metric("ns_per_pair_1_thread", "1 thread", Unit::Ns, 1),
                Column::metric("ns_per_pair_n_threads", "N threads", Unit::Ns, 1),
                Column::metric("per_thread_throughput_ratio", "ratio", Unit::Ratio, 2),
                Column::metric("cpu_ns_per_pair_1_thread", "CPU, 1 thread", Unit::Ns, 1),
                Column::metric("cpu_ns_per_pair_n_threads", "CPU, N threads", Unit::Ns, 1),
                Column::metric("cpu_cost_ratio", "CPU cost N/1", Unit::Ratio, 2),
                Column::metric("harness_cpu_cost_ratio", "harness CPU N/1", Unit::Ratio, 2),
                Column::metric(
                    "contract_floor_cpu_cost_ratio",
                    "contract floor CPU N/1",
                    Unit::Ratio,
                    2,
                ),
            ],
        );
        s.row(vec![
            "softiommu".into(),
            sc.ns_per_pair_1_thread.into(),
            sc.ns_per_pair_n_threads.into(),
            sc.per_thread_throughput_ratio.into(),
            sc.cpu_ns_per_pair_1_thread.into(),
            sc.cpu_ns_per_pair_n_threads.into(),
            sc.cpu_cost_ratio.into(),
            sc.harness_cpu_cost_ratio.map_or(Cell::Missing, Cell::from),
            sc.contract_floor_cpu_cost_ratio
                .map_or(Cell::Missing, Cell::from),
        ]);
        rep.tables.push(s);
    }
    rep
}
