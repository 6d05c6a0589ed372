//! UDP and TCP echo between two hosts, under every DMA policy: each frame
//! is mapped `ToDevice` by one host's driver, fetched by its device through
//! its unit, carried on the wire, written by the other host's device
//! through the other unit into a buffer mapped `FromDevice`, and handed to
//! smoltcp. Nothing faults, nothing is lost, every byte comes back.

mod common;

use std::time::Duration;

use common::*;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::IpEndpoint;
use softiommu::dma::DmaPolicy;

fn udp_socket(st: &mut softiommu_virtio::net::NetStack, port: u16) -> SocketHandle {
    let rx = udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 64], vec![0; 256 << 10]);
    let tx = udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 64], vec![0; 256 << 10]);
    let mut s = udp::Socket::new(rx, tx);
    s.bind(port).expect("bind");
    st.sockets.add(s)
}

fn udp_echo(policy: DmaPolicy) {
    let p = hosts(policy);
    let (mut a, mut b) = stacks(&p);
    let ha = udp_socket(&mut a, 5000);
    let hb = udp_socket(&mut b, 7);
    // Sizes from a minimal frame to one that IPv4 fragments (MTU 1500).
    let sizes = [1usize, 32, 512, 1472, 1473, 4000, 16384];
    let mut next = 0usize;
    let mut in_flight: Option<Vec<u8>> = None;
    let peer = IpEndpoint::new(ip(B_IP), 7);
    run_both(&mut a, &mut b, Duration::from_secs(30), |a, b| {
        // B echoes whatever arrives.
        let sb = b.sockets.get_mut::<udp::Socket>(hb);
        while let Ok((data, meta)) = sb.recv() {
            let (data, from) = (data.to_vec(), meta.endpoint);
            sb.send_slice(&data, from).map_err(|e| e.to_string())?;
        }
        let sa = a.sockets.get_mut::<udp::Socket>(ha);
        if let Some(sent) = &in_flight {
            if let Ok((data, _)) = sa.recv() {
                assert_eq!(data, &sent[..], "echo of {} bytes", sent.len());
                in_flight = None;
                next += 1;
            }
        }
        if in_flight.is_none() {
            if next == sizes.len() {
                return Ok(true);
            }
            let msg: Vec<u8> = (0..sizes[next]).map(|i| (i * 7 + next) as u8).collect();
            sa.send_slice(&msg, peer).map_err(|e| e.to_string())?;
            in_flight = Some(msg);
        }
        Ok(false)
    })
    .unwrap();
    assert!(p.a.take_faults().is_empty() && p.b.take_faults().is_empty());
    assert_eq!(p.a.device.transport().errors().total(), 0);
    assert_eq!(p.b.device.transport().errors().total(), 0);
    assert_eq!(p.wire.a_to_b().dropped + p.wire.b_to_a().dropped, 0);
    let st = a.driver.stats();
    assert!(st.tx_packets >= sizes.len() as u64 && st.rx_packets >= sizes.len() as u64);
}

fn tcp_echo(policy: DmaPolicy) {
    let p = hosts(policy);
    let (mut a, mut b) = stacks(&p);
    let buf = || tcp::SocketBuffer::new(vec![0; 128 << 10]);
    let mut sa = tcp::Socket::new(buf(), buf());
    let mut sb = tcp::Socket::new(buf(), buf());
    sa.set_ack_delay(None);
    sb.set_ack_delay(None);
    sb.listen(7).unwrap();
    let hb = b.sockets.add(sb);
    let local = 40000;
    sa.connect(a.iface.context(), (ip(B_IP), 7), local).unwrap();
    let ha = a.sockets.add(sa);
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i % 251) as u8 ^ (i >> 8) as u8)
        .collect();
    let (mut sent, mut back) = (0usize, Vec::with_capacity(data.len()));
    run_both(&mut a, &mut b, Duration::from_secs(60), |a, b| {
        let sb = b.sockets.get_mut::<tcp::Socket>(hb);
        if sb.can_recv() && sb.can_send() {
            let mut tmp = [0u8; 8192];
            let room = sb.send_capacity() - sb.send_queue();
            let n = sb
                .recv_slice(&mut tmp[..room.min(8192)])
                .map_err(|e| e.to_string())?;
            let m = sb.send_slice(&tmp[..n]).map_err(|e| e.to_string())?;
            assert_eq!(m, n, "room was checked");
        }
        let sa = a.sockets.get_mut::<tcp::Socket>(ha);
        if sa.may_send() && sent < data.len() {
            sent += sa.send_slice(&data[sent..]).map_err(|e| e.to_string())?;
        }
        while sa.can_recv() {
            sa.recv(|d| {
                back.extend_from_slice(d);
                (d.len(), ())
            })
            .map_err(|e| e.to_string())?;
        }
        Ok(back.len() == data.len())
    })
    .unwrap();
    assert!(back == data, "the echo matches byte for byte");
    assert!(p.a.take_faults().is_empty() && p.b.take_faults().is_empty());
    assert_eq!(p.a.device.transport().errors().total(), 0);
    assert_eq!(p.b.device.transport().errors().total(), 0);
}

#[test]
fn udp_echo_passthrough() {
    udp_echo(DmaPolicy::Passthrough);
}

#[test]
fn udp_echo_strict() {
    udp_echo(DmaPolicy::Strict);
}

#[test]
fn udp_echo_deferred() {
    udp_echo(DmaPolicy::Deferred);
}

#[test]
fn udp_echo_bounce() {
    udp_echo(DmaPolicy::Bounce);
}

#[test]
fn tcp_echo_passthrough() {
    tcp_echo(DmaPolicy::Passthrough);
}

#[test]
fn tcp_echo_strict() {
    tcp_echo(DmaPolicy::Strict);
}

#[test]
fn tcp_echo_deferred() {
    tcp_echo(DmaPolicy::Deferred);
}

#[test]
fn tcp_echo_bounce() {
    tcp_echo(DmaPolicy::Bounce);
}
