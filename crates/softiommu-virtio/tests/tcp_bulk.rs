//! A TCP transfer of 64 MiB from host A to host B through both IOMMUs
//! (strict on the sender, deferred on the receiver, so both unmap paths
//! carry it), with the received bytes checksummed against the sent ones.

mod common;

use std::time::Duration;

use common::*;
use smoltcp::socket::tcp;
use smoltcp::wire::Ipv4Cidr;
use softiommu::dma::DmaPolicy;
use softiommu_virtio::host::{pair, HostConfig};
use softiommu_virtio::net::{NetDriverConfig, WireConfig};

const TOTAL: usize = 64 << 20;

#[test]
fn a_64_mib_tcp_transfer_arrives_with_a_matching_checksum() {
    let a_cfg = HostConfig {
        policy: DmaPolicy::Strict,
        mem_bytes: 256 << 20,
        ..HostConfig::default()
    };
    let b_cfg = HostConfig {
        policy: DmaPolicy::Deferred,
        ..a_cfg
    };
    let p = pair(&a_cfg, &b_cfg, WireConfig::default()).unwrap();
    let mut a =
        p.a.stack(NetDriverConfig::default(), Ipv4Cidr::new(A_IP, 24))
            .unwrap();
    let mut b =
        p.b.stack(NetDriverConfig::default(), Ipv4Cidr::new(B_IP, 24))
            .unwrap();
    let buf = || tcp::SocketBuffer::new(vec![0; 256 << 10]);
    let mut sa = tcp::Socket::new(buf(), buf());
    let mut sb = tcp::Socket::new(buf(), buf());
    sa.set_ack_delay(None);
    sb.set_ack_delay(None);
    sb.listen(5001).unwrap();
    let hb = b.sockets.add(sb);
    sa.connect(a.iface.context(), (ip(B_IP), 5001), 40001)
        .unwrap();
    let ha = a.sockets.add(sa);

    // 64 KiB writes of a pattern that differs per chunk.
    let chunk: Vec<u8> = (0..65536u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let (mut sent, mut received) = (0usize, 0usize);
    let (mut h_sent, mut h_recv) = (FNV_START, FNV_START);
    let mut off = 0usize;
    run_both(&mut a, &mut b, Duration::from_secs(600), |a, b| {
        let sa = a.sockets.get_mut::<tcp::Socket>(ha);
        while sent < TOTAL && sa.can_send() {
            let round = (sent / chunk.len()) as u8;
            let n = sa
                .send(|w| {
                    let n = w.len().min(chunk.len() - off).min(TOTAL - sent);
                    for (d, s) in w[..n].iter_mut().zip(&chunk[off..off + n]) {
                        *d = s ^ round;
                    }
                    (n, n)
                })
                .map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            h_sent = fnv(
                h_sent,
                &chunk[off..off + n]
                    .iter()
                    .map(|s| s ^ round)
                    .collect::<Vec<_>>(),
            );
            sent += n;
            off = (off + n) % chunk.len();
        }
        let sb = b.sockets.get_mut::<tcp::Socket>(hb);
        while sb.can_recv() {
            sb.recv(|d| {
                h_recv = fnv(h_recv, d);
                received += d.len();
                (d.len(), ())
            })
            .map_err(|e| e.to_string())?;
        }
        Ok(received >= TOTAL)
    })
    .unwrap();
    assert_eq!(received, TOTAL);
    assert_eq!(h_recv, h_sent, "checksum of received == checksum of sent");
    assert!(p.a.take_faults().is_empty() && p.b.take_faults().is_empty());
    let st = b.driver.stats();
    assert!(st.rx_packets >= (TOTAL / 1460) as u64);
}
