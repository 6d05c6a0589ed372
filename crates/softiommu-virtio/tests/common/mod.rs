//! Helpers the integration tests share: two hosts on a wire, a stack on
//! each, and a bounded loop that runs both on the test's thread.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use smoltcp::wire::{IpAddress, Ipv4Address, Ipv4Cidr};
use softiommu::dma::DmaPolicy;
use softiommu_virtio::host::{pair, HostConfig, HostPair};
use softiommu_virtio::net::{NetDriverConfig, NetStack, WireConfig};

pub const A_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
pub const B_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

pub fn ip(a: Ipv4Address) -> IpAddress {
    IpAddress::Ipv4(a)
}

/// Two hosts with `policy`, small memories.
pub fn hosts(policy: DmaPolicy) -> HostPair {
    let cfg = HostConfig {
        policy,
        mem_bytes: 256 << 20,
        ..HostConfig::default()
    };
    pair(&cfg, &cfg, WireConfig::default()).expect("hosts")
}

/// A stack on each host (drivers probed on this thread).
pub fn stacks(p: &HostPair) -> (NetStack, NetStack) {
    let a =
        p.a.stack(NetDriverConfig::default(), Ipv4Cidr::new(A_IP, 24))
            .expect("stack a");
    let b =
        p.b.stack(NetDriverConfig::default(), Ipv4Cidr::new(B_IP, 24))
            .expect("stack b");
    (a, b)
}

/// Polls both stacks until `step` says done, for at most `limit`. `step`
/// runs after every poll of both and returns `Ok(true)` when finished.
pub fn run_both(
    a: &mut NetStack,
    b: &mut NetStack,
    limit: Duration,
    mut step: impl FnMut(&mut NetStack, &mut NetStack) -> Result<bool, String>,
) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        let ca = a.poll().map_err(|e| format!("host a: {e}"))?;
        let cb = b.poll().map_err(|e| format!("host b: {e}"))?;
        if step(a, b)? {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(format!("not done within {limit:?}"));
        }
        if !ca && !cb {
            // Both idle: a short nap (either device's interrupt wakes it).
            std::thread::park_timeout(Duration::from_micros(200));
        }
    }
}

/// FNV-1a over `data`, continued from `h` (start with `FNV_START`).
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;
pub fn fnv(mut h: u64, data: &[u8]) -> u64 {
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
