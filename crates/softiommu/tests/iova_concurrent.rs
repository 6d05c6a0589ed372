//! Many threads allocate and free (often through another thread's cache)
//! while a checker verifies that no page is ever held by two owners.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use softiommu::iova::{IovaDomain, IovaPolicy};

const END: u64 = (1 << 16) - 1;

fn hammer(policy: IovaPolicy) {
    let d = IovaDomain::new(1, END, policy).unwrap();
    let owners: Arc<Vec<AtomicU32>> = Arc::new((0..=END).map(|_| AtomicU32::new(0)).collect());
    let threads = 6;
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..threads).map(|_| crossbeam_channel()).unzip();
    let handles: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(id, rx)| {
            let d = d.clone();
            let owners = owners.clone();
            let txs = txs.clone();
            std::thread::spawn(move || {
                let me = id as u32 + 1;
                let mut cache = d.cpu_cache();
                let mut seed = 0x1234_5678u64 * me as u64 + 1;
                let mut rng = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                let mut held = Vec::new();
                for i in 0..20_000u64 {
                    let pages = [1, 1, 1, 2, 4, 8, 32, 64][(rng() % 8) as usize];
                    if let Ok(pfn) = cache.alloc(pages, END) {
                        for p in pfn..pfn + pages {
                            let prev = owners[p as usize].swap(me, Ordering::AcqRel);
                            assert_eq!(
                                prev, 0,
                                "{policy}: page {p:#x} handed to {me} while {prev} held it"
                            );
                        }
                        held.push((pfn, pages));
                    }
                    if held.len() > 64 || i % 7 == 0 {
                        let k = (rng() as usize) % held.len().max(1);
                        if k < held.len() {
                            let (pfn, pages) = held.swap_remove(k);
                            for p in pfn..pfn + pages {
                                owners[p as usize].store(0, Ordering::Release);
                            }
                            // Half the frees happen on another thread's cache.
                            if rng() % 2 == 0 {
                                let _ = txs[(rng() as usize) % txs.len()].send((pfn, pages));
                            } else {
                                cache.free(pfn, pages).unwrap();
                            }
                        }
                    }
                    while let Ok((pfn, pages)) = rx.try_recv() {
                        cache.free(pfn, pages).unwrap();
                    }
                }
                for (pfn, pages) in held {
                    for p in pfn..pfn + pages {
                        owners[p as usize].store(0, Ordering::Release);
                    }
                    cache.free(pfn, pages).unwrap();
                }
                (cache, rx)
            })
        })
        .collect();
    drop(txs);
    let mut done: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (cache, rx) in &mut done {
        while let Ok((pfn, pages)) = rx.try_recv() {
            cache.free(pfn, pages).unwrap();
        }
    }
    drop(done);
    d.flush_caches(); // the depots outlive the caches; give them back too
    let s = d.stats();
    assert_eq!(s.tree_blocks, 0, "{policy}: all blocks returned: {s:?}");
    if let Some(ext) = d.free_extents() {
        assert_eq!(ext, vec![(1, END)]);
    }
}

type Chan = (
    std::sync::mpsc::Sender<(u64, u64)>,
    std::sync::mpsc::Receiver<(u64, u64)>,
);
fn crossbeam_channel() -> Chan {
    std::sync::mpsc::channel()
}

#[test]
fn no_iova_is_held_twice_softiommu() {
    hammer(IovaPolicy::Softiommu);
}

#[test]
fn no_iova_is_held_twice_linux_2016() {
    hammer(IovaPolicy::Linux2016);
}

#[test]
fn no_iova_is_held_twice_linux_2020() {
    hammer(IovaPolicy::Linux2020);
}

#[test]
fn no_iova_is_held_twice_linux_2023() {
    hammer(IovaPolicy::Linux2023);
}
