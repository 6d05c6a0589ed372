//! The lab's engines run end to end (short windows; no timing is
//! asserted, only that traffic flowed, nothing faulted, and the TCP
//! stream's checksum matched).

use std::time::Duration;

use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu_virtio::workload::{tcp_stream, udp_stream, TcpStreamConfig, UdpStreamConfig};

#[test]
fn a_udp_stream_moves_datagrams_and_reports_cpu_apart() {
    for (policy, ordering, msg) in [
        (DmaPolicy::Deferred, OrderMode::Ordered, 32),
        (DmaPolicy::Bounce, OrderMode::Full, 4000),
    ] {
        let r = udp_stream(&UdpStreamConfig {
            policy,
            ordering,
            msg_size: msg,
            duration: Duration::from_millis(200),
            warmup: Duration::from_millis(100),
            ..UdpStreamConfig::default()
        })
        .unwrap();
        assert!(r.tx_packets > 0 && r.rx_packets > 0, "{r:?}");
        // The window's edges are not a barrier: datagrams sent before it
        // (queued in A's socket and ring, the wire, B's ring and socket)
        // may be received in it, more of them on a loaded machine.
        let in_flight = 64 + 256 + 1024 + 256 + 4096;
        assert!(r.rx_packets <= r.tx_packets + in_flight, "{r:?}");
        assert!(
            r.driver_cpu_us_per_pkt > 0.0 && r.device_cpu_us_per_pkt > 0.0,
            "{r:?}"
        );
        assert_eq!((r.policy, r.ordering, r.msg_size), (policy, ordering, msg));
        if msg > 1472 {
            assert!(r.frames_per_packet >= 2.0, "fragmented: {r:?}");
        }
    }
}

#[test]
fn a_tcp_stream_arrives_whole_and_counts_flushed_lines_when_not_coherent() {
    for coherent in [true, false] {
        let r = tcp_stream(&TcpStreamConfig {
            policy: DmaPolicy::Strict,
            coherent,
            duration: Duration::from_millis(300),
            warmup: Duration::from_millis(100),
            ..TcpStreamConfig::default()
        })
        .unwrap();
        assert!(r.checksum_ok, "{r:?}");
        assert!(r.bytes > 0 && r.total_received == r.total_sent, "{r:?}");
        if coherent {
            assert_eq!(r.lines_flushed_per_gb, 0.0);
            assert_eq!(r.flush_cpu_share, 0.0);
        } else {
            assert!(r.lines_flushed_per_gb > 0.0, "{r:?}");
        }
    }
}

/// A window shorter than the handshake: the conductor waits for the
/// stream's first bytes before the warm-up and the window, so what the
/// window measures is a stream that has started, and it closes cleanly.
/// (Before: the window began when the drivers were up; one that ended
/// with the sender still connecting closed it from `SynSent` and the
/// receiver timed out after 15 s waiting for its FIN, as a loaded
/// machine did to `lab iperf-tcp`.)
#[test]
fn a_window_shorter_than_the_handshake_measures_a_started_stream() {
    for policy in [DmaPolicy::Strict, DmaPolicy::Deferred] {
        let r = tcp_stream(&TcpStreamConfig {
            policy,
            duration: Duration::from_millis(1),
            warmup: Duration::ZERO,
            ..TcpStreamConfig::default()
        })
        .unwrap();
        assert!(r.checksum_ok, "{r:?}");
        assert!(
            r.total_received > 0 && r.total_received == r.total_sent,
            "{r:?}"
        );
    }
}

#[test]
fn a_deferred_tcp_stream_counts_its_flush_timers_in_the_driver_cpu() {
    let r = tcp_stream(&TcpStreamConfig {
        policy: DmaPolicy::Deferred,
        duration: Duration::from_millis(300),
        warmup: Duration::from_millis(100),
        ..TcpStreamConfig::default()
    })
    .unwrap();
    assert!(r.checksum_ok, "{r:?}");
    // The timers flush and free on the drivers' behalf: their CPU is
    // reported and is part of the driver side's.
    assert!(r.flush_timer_cpu_s_per_gb > 0.0, "{r:?}");
    assert!(r.flush_timer_cpu_s_per_gb < r.cpu_s_per_gb, "{r:?}");
    // The drivers waited for their devices (the receiver whenever the
    // stream ran dry): that CPU is measured, and apart from the work's.
    assert!(r.wait_cpu_s_per_gb > 0.0, "{r:?}");
}

#[test]
fn a_paced_udp_stream_offers_its_rate_and_counts_the_flush_timers() {
    let r = udp_stream(&UdpStreamConfig {
        policy: DmaPolicy::Deferred,
        duration: Duration::from_millis(300),
        warmup: Duration::from_millis(100),
        // Low enough for a debug build on a loaded machine.
        offered_pps: Some(2_000.0),
        ..UdpStreamConfig::default()
    })
    .unwrap();
    assert_eq!(r.offered_pps, Some(2_000.0));
    // A low rate: every datagram of the run arrives once the receiver has
    // drained what was in flight.
    assert_eq!(r.drops, 0, "{r:?}");
    // Paced, not flooding: within a batch or two of the rate (a loaded
    // machine may delay a thread's window edge by a period).
    assert!(r.tx_pps > 1_000.0 && r.tx_pps < 3_000.0, "{r:?}");
    // Service demand counts the flush timers beside the driver threads.
    assert!(r.flush_cpu_us_per_pkt >= 0.0, "{r:?}");
    let parts = (r.tx_driver_cpu_us_per_pkt * r.tx_packets as f64
        + r.rx_driver_cpu_us_per_pkt * r.rx_packets as f64)
        / r.rx_packets as f64
        + r.flush_cpu_us_per_pkt;
    assert!(
        (r.service_demand_us_per_pkt - parts).abs() < 1e-6 * parts.max(1.0),
        "{r:?}"
    );
}
