//! Helpers the block tests share: a host with a back-end and a policy, and
//! a bounded loop that drives one queue until its requests complete.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use softiommu::dma::DmaPolicy;
use softiommu_virtio::blk::{
    BackendConfig, BlkCompletion, BlkConfig, BlkDeviceConfig, BlkHost, BlkHostConfig, BlkQueue,
};

/// A host with `policy` over `backend`, `queues` request queues, small
/// memory.
pub fn host(policy: DmaPolicy, backend: BackendConfig, queues: u16) -> BlkHost {
    BlkHost::new(&BlkHostConfig {
        policy,
        mem_bytes: 256 << 20,
        bounce_bytes: 8 << 20,
        device: BlkDeviceConfig {
            blk: BlkConfig {
                num_queues: queues,
                ..BlkConfig::default()
            },
            backend,
            workers: 2,
            ..BlkDeviceConfig::default()
        },
        ..BlkHostConfig::default()
    })
    .expect("host")
}

/// Reaps `q` until `n` completions have come, for at most 10 s; returns
/// them with a copy of each one's data.
pub fn complete(q: &mut BlkQueue, n: usize) -> Vec<(BlkCompletion, Vec<u8>)> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    q.commit();
    while out.len() < n {
        q.reap(None, |c, d| {
            let mut buf = vec![0u8; d.len() as usize];
            d.read(&mut buf).expect("data");
            out.push((*c, buf));
        })
        .expect("reap");
        if out.len() >= n {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "only {} of {n} completions",
            out.len()
        );
        q.wait(Duration::from_millis(5)).expect("device works");
    }
    out
}

/// The bytes of a test write: a function of the sector and the place.
pub fn data(sector: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (sector as usize * 131 + i * 7 + i / 4096) as u8)
        .collect()
}
