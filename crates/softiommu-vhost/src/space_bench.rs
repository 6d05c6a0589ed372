//! The device IOTLB's hit path, timed: `cargo test -p softiommu-vhost
//! --release --lib space_bench -- --ignored --nocapture`. Prints ns per
//! access for [`DmaSpace::read_bytes`] hits next to the same lookup done
//! under an uncontended `RwLock` read lock (the table's former design), in
//! one run.

use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::sync::RwLock;
use std::time::Duration;

use crate::iotlb::DeviceIotlb;
use crate::memtable::{MemTable, Space};
use crate::proto::iotlb as m;
use crate::space::{AddrKind, DmaSpace};

/// Bytes of guest memory the bench maps (256 pages).
pub(crate) const MEM: u64 = 1 << 20;
/// Front-end virtual address of the memory.
pub(crate) const UA: u64 = 0x7f00_0000_0000;
/// IOVA the memory is mapped at.
pub(crate) const IOVA: u64 = 0x10_0000;

/// A memory table of one region of `MEM` bytes at `UA` (gpa 0), and the
/// host pointer of its start.
pub(crate) fn table(name: &std::ffi::CStr) -> (MemTable, MemTable, *mut u8) {
    let (fd, p) = crate::testing::shared_memory(name, MEM as usize).expect("memfd");
    let mut t = Vec::new();
    t.extend_from_slice(&1u32.to_le_bytes());
    t.extend_from_slice(&0u32.to_le_bytes());
    for v in [0, MEM, UA, 0] {
        t.extend_from_slice(&v.to_le_bytes());
    }
    let dup = || {
        // SAFETY: dup of our own valid fd, owned at once.
        unsafe {
            <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(fd.as_raw_fd()))
        }
    };
    let a = MemTable::map(&t, &[dup()]).expect("map");
    let b = MemTable::map(&t, &[dup()]).expect("map");
    (a, b, p)
}

/// This thread's CPU time, nanoseconds: time slices other processes take
/// on a shared machine do not count.
fn cpu_ns() -> u64 {
    softiommu_virtio::cpu_clock::thread().as_nanos() as u64
}

/// Nanoseconds of this thread's CPU per call of `f`: the best of five
/// timed runs of `n / 5` calls after a warm-up.
fn per_op(n: u64, f: &mut dyn FnMut(u64)) -> f64 {
    for i in 0..n / 10 {
        f(i);
    }
    let runs = 5;
    (0..runs)
        .map(|r| {
            let t0 = cpu_ns();
            for i in 0..n / runs {
                f(r * n + i);
            }
            (cpu_ns() - t0) as f64 / (n / runs) as f64
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
#[ignore = "a benchmark: run with --release -- --ignored --nocapture"]
fn space_bench_hit_ns() {
    let (mem, mem2, _) = table(c"space-bench");
    let space = DmaSpace::new(16384, Duration::from_millis(10));
    space.set_memory(mem);
    space.set_iommu(true);
    // One entry per page, as a strict-mode guest maps its buffers.
    let pages = MEM / 4096;
    for k in 0..pages {
        space
            .update(IOVA + k * 4096, 4096, UA + k * 4096, m::ACCESS_RW)
            .expect("update");
    }
    let locked = RwLock::new((DeviceIotlb::new(16384), mem2));
    for k in 0..pages {
        let mut g = locked.write().expect("lock");
        g.0.update(IOVA + k * 4096, 4096, UA + k * 4096, m::ACCESS_RW)
            .expect("update");
    }
    let n = 2_000_000;
    let addr = |i: u64| IOVA + (i.wrapping_mul(0x9E37_79B9) % pages) * 4096 + 64;
    let hit_new = |len: usize, n: u64| {
        let mut buf = vec![0u8; len];
        per_op(n, &mut |i| {
            space
                .read_bytes(AddrKind::Buffer, addr(i), &mut buf)
                .expect("hit");
            black_box(&buf);
        })
    };
    let hit_old = |len: usize, n: u64| {
        let mut buf = vec![0u8; len];
        per_op(n, &mut |i| {
            let a = addr(i);
            let g = locked.read().expect("lock");
            let e = g.0.lookup(a).expect("hit");
            let (p, k) =
                g.1.host(Space::Uaddr, e.uaddr + (a - e.iova), len as u64)
                    .expect("mem");
            // SAFETY: p is valid for k bytes of the shared mapping.
            unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), k as usize) };
            drop(g);
            black_box(&buf);
        })
    };
    let barrier = crate::sync::Barrier::get();
    for len in [8usize, 4096 - 64] {
        let (new, old) = (hit_new(len, n), hit_old(len, n));
        println!(
            "vhost IOTLB hit, {len}-byte read, 1 thread: DmaSpace {new:.1} ns, RwLock+table baseline {old:.1} ns (fence pair: {barrier:?})"
        );
    }
    // Two device threads at once (a net back-end's two queues): the lock's
    // reader count is one cache line both write.
    let both = |f: &(dyn Fn(usize, u64) -> f64 + Sync)| {
        std::thread::scope(|sc| {
            let a = sc.spawn(|| f(8, n / 2));
            let b = sc.spawn(|| f(8, n / 2));
            (a.join().expect("thread") + b.join().expect("thread")) / 2.0
        })
    };
    let (new, old) = (both(&hit_new), both(&hit_old));
    println!(
        "vhost IOTLB hit, 8-byte read, 2 threads at once: DmaSpace {new:.1} ns, RwLock+table baseline {old:.1} ns (per hit per thread)"
    );
}
