//! The engines' knobs: where the threads run (pinned) and the deferred
//! policy's flush tunables, applied on both hosts. Its own test binary, so
//! its threads do not share the CPUs with the other workload tests'.

use std::time::Duration;

use softiommu::dma::DmaPolicy;
use softiommu_virtio::affinity::allowed_cpus;
use softiommu_virtio::workload::{udp_stream, Cpus, UdpStreamConfig};
#[test]
fn a_pinned_deferred_stream_takes_the_flush_tunables_and_reports_its_stale_window() {
    let cpus = allowed_cpus();
    let at = |i: usize| cpus.get(i % cpus.len().max(1)).copied();
    let r = udp_stream(&UdpStreamConfig {
        policy: DmaPolicy::Deferred,
        duration: Duration::from_millis(200),
        warmup: Duration::from_millis(100),
        cpus: Cpus {
            sender: at(0),
            receiver: at(0),
            device_a: at(1),
            device_b: at(1),
        },
        flush_high_water: Some(16),
        flush_timeout: Some(Duration::from_millis(5)),
        ..UdpStreamConfig::default()
    })
    .unwrap();
    assert!(r.tx_packets > 0 && r.rx_packets > 0, "{r:?}");
    // A mark of 16 flushes every 16 unmaps on each host.
    assert!(r.flushes * 16 >= r.tx_packets / 2, "{r:?}");
    assert!(r.stale_window_ms_max > 0.0, "{r:?}");
    // A mark the library refuses is an error, not a silent default.
    let e = udp_stream(&UdpStreamConfig {
        policy: DmaPolicy::Deferred,
        flush_high_water: Some(0),
        ..UdpStreamConfig::default()
    });
    assert!(e.is_err());
}
