//! IOPF mode is asked for one way for both devices — the `iopf` field of
//! their host's configuration, the same `IopfModeConfig` — and both hosts
//! move the device to its faulting domain before its threads start: a disk
//! and a NIC so built each serve a request whose memory faults in, none
//! refused, no DMA fault.

mod blk_common;

use std::time::{Duration, Instant};

use blk_common::{complete, data};
use softiommu::dma::DmaPolicy;
use softiommu::iopf::IopfDomain;
use softiommu_virtio::blk::{
    BackendConfig, BlkDeviceConfig, BlkDriverConfig, BlkHost, BlkHostConfig, BlkOp,
};
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::iopf_mode::IopfModeConfig;
use softiommu_virtio::net::{wire, NetDriverConfig, WireConfig};
use softiommu_virtio::spec::blk::S_OK;

/// The one way to ask for IOPF mode, for either device.
const IOPF: Option<IopfModeConfig> = Some(IopfModeConfig {
    premap_pages: 1,
    handler_threads: 1,
});

fn assert_faulted_in(domain: &IopfDomain) {
    let s = domain.stats();
    assert!(s.served > 0, "the first touches faulted: {s:?}");
    assert!(matches!(s.refused, 0), "none refused: {s:?}");
    assert_eq!(s.pages_mapped, s.served, "one page per fault: {s:?}");
}

#[test]
fn a_disk_and_a_nic_in_iopf_mode_fault_their_requests_in_through_one_config_field() {
    // The disk: one write and its read-back.
    let disk = BlkHost::new(&BlkHostConfig {
        policy: DmaPolicy::Strict,
        mem_bytes: 128 << 20,
        bounce_bytes: 1 << 20,
        device: BlkDeviceConfig {
            backend: BackendConfig::Memory { capacity: 1 << 20 },
            ..BlkDeviceConfig::default()
        },
        iopf: IOPF,
        ..BlkHostConfig::default()
    })
    .expect("disk host");
    let di = disk.iopf.as_ref().expect("IOPF mode");
    assert_eq!(di.domain.stats().pages_mapped, 0, "nothing pre-mapped");
    let mut d = disk.driver(BlkDriverConfig::default()).expect("probe");
    let mut q = d.take_queue(0).expect("queue 0");
    q.bind_interrupt();
    let w = data(8, 8192);
    q.submit(BlkOp::Write, 8, 8192, Some(&w)).unwrap().unwrap();
    assert_eq!(complete(&mut q, 1)[0].0.status, S_OK);
    q.submit(BlkOp::Read, 8, 8192, None).unwrap().unwrap();
    let (c, got) = complete(&mut q, 1).remove(0);
    assert_eq!(c.status, S_OK);
    assert!(got == w, "the read-back differs");
    assert_faulted_in(&di.domain);
    assert!(disk.take_faults().is_empty(), "no DMA fault");
    d.reset();
    q.release().expect("release");

    // The NIC: one frame out onto the wire.
    let (pa, mut peer, _) = wire(WireConfig::default());
    let nic = Host::new(
        &HostConfig {
            policy: DmaPolicy::Strict,
            mem_bytes: 128 << 20,
            bounce_bytes: 1 << 20,
            iopf: IOPF,
            ..HostConfig::default()
        },
        pa,
    )
    .expect("nic host");
    let ni = nic.iopf.as_ref().expect("IOPF mode");
    assert_eq!(ni.domain.stats().pages_mapped, 0, "nothing pre-mapped");
    let mut n = nic.driver(NetDriverConfig::default()).expect("probe");
    let frame: Vec<u8> = (0..100u8).map(|i| if i < 6 { 0xff } else { i }).collect();
    assert!(n
        .transmit_with(frame.len(), |b| b.copy_from_slice(&frame))
        .expect("transmit"));
    let t0 = Instant::now();
    let sent = loop {
        match peer.rx.peek() {
            Ok(f) => break f.to_vec(),
            Err(_) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "no frame on the wire"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    peer.rx.consume();
    assert_eq!(sent, frame);
    assert_faulted_in(&ni.domain);
    assert!(nic.take_faults().is_empty(), "no DMA fault");
    n.shutdown().expect("shutdown");
}
