//! Property test: random sequences of allocations and frees (valid and not)
//! through caches and the domain, checked against a simple model.

use std::collections::BTreeMap;

use proptest::prelude::*;
use softiommu::iova::{BlockState, IovaDomain, IovaError, IovaPolicy};

const START: u64 = 0x100;
const END: u64 = 0x3fff;
const RESERVED: (u64, u64) = (0x2000, 0x20ff);

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        cache: usize,
        pages: u64,
        limit: u64,
    },
    Free {
        cache: Option<usize>,
        pick: usize,
    },
    BadFree {
        pick: usize,
        delta: u64,
    },
    DoubleFree {
        pick: usize,
    },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, prop_oneof![Just(1u64), 1..=40u64, 100..=300u64], START..=END + 10)
            .prop_map(|(cache, pages, limit)| Op::Alloc { cache, pages, limit }),
        5 => (proptest::option::of(0..3usize), any::<usize>()).prop_map(|(cache, pick)| Op::Free { cache, pick }),
        1 => (any::<usize>(), 1..4u64).prop_map(|(pick, delta)| Op::BadFree { pick, delta }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
        1 => Just(Op::Flush),
    ]
}

fn run(policy: IovaPolicy, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let d = IovaDomain::new(START, END, policy).unwrap();
    d.reserve(RESERVED.0, RESERVED.1).unwrap();
    let mut caches: Vec<_> = (0..3).map(|_| d.cpu_cache()).collect();
    // The model: live blocks, start -> pages.
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut freed: Vec<(u64, u64)> = Vec::new();
    for op in ops {
        match op {
            Op::Alloc {
                cache,
                pages,
                limit,
            } => match caches[cache].alloc(pages, limit) {
                Ok(pfn) => {
                    let size = pages.next_power_of_two();
                    let end = pfn + size - 1;
                    prop_assert_eq!(pfn % size, 0, "aligned to its size");
                    prop_assert!(pfn >= START && end <= limit.min(END), "inside the limit");
                    prop_assert!(end < RESERVED.0 || pfn > RESERVED.1, "not reserved");
                    if let Some((&s, &n)) = live.range(..=end).next_back() {
                        prop_assert!(s + n <= pfn, "overlaps live block {s:#x}+{n}");
                    }
                    let f = d.find(pfn + size / 2).unwrap();
                    prop_assert_eq!((f.pfn, f.pages, f.state), (pfn, size, BlockState::Live));
                    live.insert(pfn, size);
                }
                Err(IovaError::NoSpace { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected {e:?}"),
            },
            Op::Free { cache, pick } if !live.is_empty() => {
                let (&pfn, &pages) = live.iter().nth(pick % live.len()).unwrap();
                match cache {
                    Some(c) => caches[c].free(pfn, pages).unwrap(),
                    None => d.free(pfn, pages).unwrap(),
                }
                live.remove(&pfn);
                freed.push((pfn, pages));
                let f = d.find(pfn);
                prop_assert!(f.is_none_or(|b| b.state != BlockState::Live || b.pfn != pfn));
            }
            Op::BadFree { pick, delta } if !live.is_empty() => {
                let (&pfn, &pages) = live.iter().nth(pick % live.len()).unwrap();
                let before = d.stats();
                prop_assert!(
                    matches!(
                        caches[0].free(pfn, pages * 2 * delta),
                        Err(IovaError::WrongSize { .. } | IovaError::TooLarge { .. })
                    ),
                    "wrong size"
                );
                if pages > 1 {
                    prop_assert!(
                        matches!(
                            caches[1].free(pfn + delta.min(pages - 1), 1),
                            Err(IovaError::NotAllocated { .. })
                        ),
                        "interior"
                    );
                }
                prop_assert_eq!(d.stats().tree_blocks, before.tree_blocks);
            }
            Op::DoubleFree { pick } if !freed.is_empty() => {
                let (pfn, pages) = freed[pick % freed.len()];
                if !live.contains_key(&pfn) {
                    prop_assert!(
                        matches!(
                            caches[2].free(pfn, pages),
                            Err(IovaError::NotAllocated { .. } | IovaError::WrongSize { .. })
                        ),
                        "double free accepted"
                    );
                }
            }
            Op::Flush => d.flush_caches(),
            _ => {}
        }
    }
    for (pfn, pages) in std::mem::take(&mut live) {
        caches[0].free(pfn, pages).unwrap();
    }
    drop(caches);
    d.flush_caches(); // the depots outlive the caches
    let s = d.stats();
    prop_assert_eq!(s.tree_blocks, 0, "every block came back");
    prop_assert_eq!(s.cached_iovas, 0);
    if let Some(ext) = d.free_extents() {
        prop_assert_eq!(
            ext,
            vec![(START, RESERVED.0 - 1), (RESERVED.1 + 1, END)],
            "fully coalesced"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn softiommu_matches_the_model(ops in proptest::collection::vec(op(), 1..400)) {
        run(IovaPolicy::Softiommu, ops)?;
    }

    #[test]
    fn linux_baselines_match_the_model(ops in proptest::collection::vec(op(), 1..400), which in 0..3usize) {
        run([IovaPolicy::Linux2016, IovaPolicy::Linux2020, IovaPolicy::Linux2023][which], ops)?;
    }
}
