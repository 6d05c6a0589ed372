//! A virtio-blk controller in IOPF mode. Its memory is not
//! pre-mapped: the driver's maps are registrations (a pass-through DMA
//! domain hands it physical addresses), the controller sits in an
//! `IopfDomain` over the guest's RAM that starts empty, and its first
//! touch of every page — rings, headers, data, status — raises a page
//! request that the handler serves. Read-after-write round trips must
//! come back intact, with faults counted, none refused, no DMA fault.

mod blk_common;

use blk_common::{complete, data};
use softiommu::dma::DmaPolicy;
use softiommu_virtio::blk::{
    BackendConfig, BlkConfig, BlkDeviceConfig, BlkDriverConfig, BlkHost, BlkHostConfig, BlkOp,
};
use softiommu_virtio::iopf_mode::IopfModeConfig;
use softiommu_virtio::spec::blk::S_OK;

fn iopf_host(premap_pages: u64) -> BlkHost {
    BlkHost::new(&BlkHostConfig {
        policy: DmaPolicy::Strict, // ignored: IOPF mode maps nothing up front
        mem_bytes: 256 << 20,
        bounce_bytes: 8 << 20,
        device: BlkDeviceConfig {
            blk: BlkConfig {
                num_queues: 1,
                ..BlkConfig::default()
            },
            backend: BackendConfig::Memory { capacity: 64 << 20 },
            workers: 2,
            ..BlkDeviceConfig::default()
        },
        iopf: Some(IopfModeConfig {
            premap_pages,
            handler_threads: 1,
        }),
        ..BlkHostConfig::default()
    })
    .expect("host in IOPF mode")
}

/// Two rounds of writes then reads of 512 B to 128 KiB at scattered
/// sectors; every read must return what was written. Returns the page
/// requests the domain served after each round.
fn round_trips(h: &BlkHost) -> [u64; 2] {
    let iopf = h.iopf.as_ref().expect("IOPF mode");
    assert_eq!(iopf.domain.stats().pages_mapped, 0, "nothing pre-mapped");
    let mut d = h.driver(BlkDriverConfig::default()).expect("probe");
    let mut q = d.take_queue(0).expect("queue 0");
    q.bind_interrupt();
    let reqs: [(u64, usize); 6] = [
        (0, 512),
        (8, 4096),
        (100, 8192),
        (1000, 65536),
        (4096, 131072),
        (777, 12288),
    ];
    let mut served = [0; 2];
    for (round, s) in served.iter_mut().enumerate() {
        for &(sector, len) in &reqs {
            let w = data(sector + round as u64, len);
            q.submit(BlkOp::Write, sector, len as u64, Some(&w))
                .expect("submit write")
                .expect("a free slot");
        }
        for (c, _) in complete(&mut q, reqs.len()) {
            assert_eq!(c.status, S_OK, "write {c:?}");
        }
        for &(sector, len) in &reqs {
            q.submit(BlkOp::Read, sector, len as u64, None)
                .expect("submit read")
                .expect("a free slot");
        }
        let mut got = complete(&mut q, reqs.len());
        got.sort_by_key(|(c, _)| c.sector);
        let mut want = reqs.to_vec();
        want.sort();
        for ((c, buf), (sector, len)) in got.iter().zip(want) {
            assert_eq!((c.status, c.sector, c.len), (S_OK, sector, len as u64));
            assert!(
                buf == &data(sector + round as u64, len),
                "round {round}: sector {sector} came back different"
            );
        }
        *s = iopf.domain.stats().served;
    }
    let st = h.device.stats();
    assert_eq!((st.writes, st.reads, st.request_errors), (12, 12, 0));
    d.reset();
    q.release().expect("release");
    served
}

#[test]
fn blk_round_trips_fault_their_memory_in_and_keep_the_data() {
    let h = iopf_host(1);
    let served = round_trips(&h);
    let iopf = h.iopf.as_ref().unwrap();
    let s = iopf.domain.stats();
    assert!(served[0] > 0, "the first touches faulted");
    assert!(matches!(s.refused, 0), "no request refused: {s:?}");
    assert_eq!(s.pages_premapped, 0, "premap 1 maps the faulting page only");
    assert_eq!(s.pages_mapped, s.served, "one page per fault");
    let hs = iopf.handler.stats();
    assert!(matches!(hs.answered_invalid, 0), "{hs:?}");
    assert!(hs.answered_success >= served[0]);
    assert!(h.take_faults().is_empty(), "no DMA fault recorded");
}

#[test]
fn a_premap_window_cuts_the_faults() {
    let one = iopf_host(1);
    let f1 = round_trips(&one)[1];
    let wide = iopf_host(512);
    let f512 = round_trips(&wide)[1];
    assert!(f512 > 0);
    assert!(f512 < f1, "premap 512: {f512} faults, premap 1: {f1}");
    assert!(wide.take_faults().is_empty());
}
