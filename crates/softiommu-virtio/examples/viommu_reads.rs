//! The DMA work of `lab viommu`'s storage reads alone, for counting
//! instructions: per read, the three MAPs of one virtio-blk request
//! (header to the device, `bs` bytes of data and a status byte from it)
//! made usable together, then its three UNMAPs — through `ViommuDma` over
//! a virtio-iommu served on the notifying thread, no modelled exit.
//! `depth` reads are kept mapped at once, as the lab's queue keeps them.
//!
//! `cargo run --release -p softiommu-virtio --example viommu_reads -- strict|lazy [reads] [bs] [depth]`
//!
//! Under callgrind, count only the reads (set-up and tear-down out):
//! `valgrind --tool=callgrind --toggle-collect='viommu_reads::reads' target/release/examples/viommu_reads strict 2000`

use std::sync::Arc;

use softiommu::dma::DmaDirection;
use softiommu::hw::{SourceId, System, UnitConfig};
use softiommu::mem::PhysMemory;
use softiommu_virtio::viommu::{
    ViommuConfig, ViommuDevice, ViommuDma, ViommuDriver, ViommuDriverConfig, ViommuMapping,
    ViommuMode,
};

const SID: SourceId = SourceId(0x0008);

/// `n` reads of `bs` bytes, `depth` kept mapped: each read maps its three
/// segments and unmaps the oldest read's.
#[inline(never)]
fn reads(dma: &mut ViommuDma, slots: &[(u64, u64)], bs: u64, n: u64) {
    let mut live: std::collections::VecDeque<Vec<ViommuMapping>> =
        std::collections::VecDeque::with_capacity(slots.len());
    for i in 0..n {
        if live.len() == slots.len() {
            for m in live.pop_front().expect("a read in flight") {
                dma.unmap(m).expect("unmap");
            }
        }
        let (page, data) = slots[(i % slots.len() as u64) as usize];
        let maps = dma
            .map_segments(&[
                (page, 16, DmaDirection::ToDevice),
                (data, bs, DmaDirection::FromDevice),
                (page + 64, 1, DmaDirection::FromDevice),
            ])
            .expect("map");
        live.push_back(maps);
    }
    for maps in live {
        for m in maps {
            dma.unmap(m).expect("unmap");
        }
    }
    dma.flush().expect("flush");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = match args.next().as_deref() {
        Some("lazy") => ViommuMode::Lazy { flush_queue: 256 },
        _ => ViommuMode::Strict,
    };
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let bs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(131_072);
    let depth: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(16);
    let mem = Arc::new(PhysMemory::new(64 << 20).expect("memory"));
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).expect("unit");
    sys.assign(SID, unit).expect("assign");
    let system = Arc::new(sys);
    let vcfg = ViommuConfig::default();
    let dev = ViommuDevice::spawn(
        ViommuConfig {
            endpoints: vec![SID],
            serve_in_notifier: true,
            ..vcfg
        },
        system.clone(),
        unit,
    )
    .expect("device");
    let dcfg = ViommuDriverConfig::default();
    let drv = ViommuDriver::probe(
        dev.transport().clone(),
        mem.clone(),
        ViommuDriverConfig {
            queue_size: 256,
            spin: dcfg.wait,
            ..dcfg
        },
    )
    .expect("driver");
    let mut dma = ViommuDma::new(drv, 1, &[u32::from(SID.0)], mode).expect("dma");
    let order = bs.div_ceil(4096).next_power_of_two().trailing_zeros();
    let slots: Vec<(u64, u64)> = (0..depth)
        .map(|_| {
            (
                mem.alloc_zeroed_frames(0).expect("page"),
                mem.alloc_zeroed_frames(order).expect("data"),
            )
        })
        .collect();
    // Warm the IOVA cache and the tables.
    reads(&mut dma, &slots, bs, 64);
    let t0 = std::time::Instant::now();
    reads(&mut dma, &slots, bs, n);
    let s = dev.stats();
    println!(
        "{mode:?}: {n} reads in {:?}; device requests {} invalidations {} notifications {}",
        t0.elapsed(),
        s.requests,
        s.invalidations,
        dev.transport().notifications()
    );
}
