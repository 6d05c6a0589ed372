//! The driver never lends the stack memory a device can reach: a received
//! frame is copied out of its DMA buffer before the stack sees it, and a
//! frame to send is built in driver-owned memory and copied into the DMA
//! buffer afterwards. A device write into the buffer while the stack holds
//! the frame changes nothing it sees (under pass-through a device reaches
//! every buffer at any time, so a borrow of the buffer would be raced).

use std::time::{Duration, Instant};

use softiommu::dma::DmaPolicy;
use softiommu::mem::{PhysAddr, PhysMemory};
use softiommu_virtio::host::{Host, HostConfig};
use softiommu_virtio::net::{wire, NetDriverConfig, WireConfig};

const MEM: u64 = 64 << 20;

/// A broadcast IPv4 frame of 60 bytes carrying `tag` after its header.
fn frame(tag: &[u8; 32]) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14..46].copy_from_slice(tag);
    f
}

/// Every physical address in the arena where `pat` starts.
fn find(mem: &PhysMemory, pat: &[u8]) -> Vec<PhysAddr> {
    let mut hits = Vec::new();
    let mut page = vec![0u8; 4096 + pat.len()];
    let mut at = 0;
    while at < mem.size() {
        let n = (mem.size() - at).min(page.len() as u64) as usize;
        mem.read(at, &mut page[..n]).unwrap();
        for i in 0..n.saturating_sub(pat.len() - 1).min(4096) {
            if page[i..i + pat.len()] == *pat {
                hits.push(at + i as u64);
            }
        }
        at += 4096;
    }
    hits
}

fn host() -> (Host, softiommu_virtio::net::WirePort) {
    let (pa, peer, _) = wire(WireConfig::default());
    let h = Host::new(
        &HostConfig {
            policy: DmaPolicy::Passthrough,
            mem_bytes: MEM,
            ..HostConfig::default()
        },
        pa,
    )
    .unwrap();
    (h, peer)
}

#[test]
fn a_device_write_into_a_received_buffer_does_not_change_the_frame_the_stack_holds() {
    let (h, mut peer) = host();
    let mut d = h.driver(NetDriverConfig::default()).unwrap();
    let tag = *b"rx-copy-tag-0123456789abcdefghij";
    let f = frame(&tag);
    let mut s = peer.tx.reserve().expect("room on the wire");
    s.buf()[..f.len()].copy_from_slice(&f);
    s.commit(f.len());
    let t0 = Instant::now();
    let seen = loop {
        let got = d
            .receive_with(|frame| {
                // The device (pass-through: it reaches the buffer at any
                // time) overwrites the DMA buffer the frame arrived in.
                let bufs = find(&h.mem, &tag);
                assert_eq!(bufs.len(), 1, "one DMA buffer holds the frame");
                h.mem.write(bufs[0], &[0xee; 32]).unwrap();
                frame.to_vec()
            })
            .unwrap();
        if let Some(g) = got {
            break g;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "nothing received");
        d.wait(Duration::from_millis(5)).expect("the device works");
    };
    assert_eq!(seen, f, "the stack's frame is the one that arrived");
}

#[test]
fn the_stack_builds_a_frame_in_driver_memory_no_device_reaches() {
    let (h, mut peer) = host();
    let mut d = h.driver(NetDriverConfig::default()).unwrap();
    let tag = *b"tx-copy-tag-0123456789abcdefghij";
    let f = frame(&tag);
    let mut in_arena = None;
    assert!(d
        .transmit_with(f.len(), |buf| {
            buf.copy_from_slice(&f);
            in_arena = Some(find(&h.mem, &tag).len());
        })
        .unwrap());
    assert_eq!(
        in_arena,
        Some(0),
        "the frame being built is not in DMA memory"
    );
    let t0 = Instant::now();
    let sent = loop {
        if let Ok(s) = peer.rx.peek() {
            break s.to_vec();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "nothing sent");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(sent, f);
}
