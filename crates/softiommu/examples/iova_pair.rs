//! A driver of the IOVA allocator's pair for instruction counting: the
//! loop of `softiommu bench iova` at one thread (a held set of live
//! blocks; each step frees a random one through the cache and allocates
//! a block of the next size in its place), run a fixed number of times.
//! Sizes are 1, 2, 4 or 8 pages with weights 8:4:2:1 (the bench draws
//! its DMA-like mix; this is a fixed stand-in for counting).
//!
//! `cargo run --release -p softiommu --example iova_pair -- [PAIRS] [LIVE]`;
//! under callgrind, collect only `pairs` for the per-pair count:
//! `valgrind --tool=callgrind --toggle-collect='*iova_pair*pairs*' ...`.

use softiommu::iova::{IovaCpuCache, IovaDomain, IovaPolicy};

const SEQ: usize = 1 << 16;
const SPACE_PAGES: u64 = 1 << 32;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// The measured loop: `n` pairs, each freeing the block in a random slot
/// of `held` and allocating the next size in its place.
#[inline(never)]
fn pairs(c: &mut IovaCpuCache, held: &mut [(u64, u64)], sizes: &[u64], slots: &[u32], n: usize) {
    let limit = SPACE_PAGES - 1;
    for i in 0..n {
        let s = slots[i & (SEQ - 1)] as usize % held.len();
        let (pfn, pages) = held[s];
        c.free(pfn, pages).expect("a live block");
        let pages = sizes[i & (SEQ - 1)];
        held[s] = (c.alloc(pages, limit).expect("room"), pages);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1 << 20);
    let live: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(4096);
    if !(1..=1_000_000).contains(&live) {
        return Err("usage: iova_pair [PAIRS] [LIVE]; LIVE is 1..=1000000".into());
    }
    let d = IovaDomain::new(1, SPACE_PAGES - 1, IovaPolicy::Softiommu)?;
    let mut c = d.cpu_cache();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let sizes: Vec<u64> = (0..SEQ)
        .map(|_| match rng.below(15) {
            0..=7 => 1,
            8..=11 => 2,
            12..=13 => 4,
            _ => 8,
        })
        .collect();
    let slots: Vec<u32> = (0..SEQ).map(|_| rng.below(live as u64) as u32).collect();
    let mut held: Vec<(u64, u64)> = (0..live)
        .map(|i| {
            let pages = sizes[i & (SEQ - 1)];
            Ok((c.alloc(pages, SPACE_PAGES - 1)?, pages))
        })
        .collect::<Result<_, softiommu::iova::IovaError>>()?;
    pairs(&mut c, &mut held, &sizes, &slots, n);
    println!("{} pairs, {} live", n, live);
    Ok(())
}
