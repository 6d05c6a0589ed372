//! The bare map+unmap loop of one policy, untimed, for instruction counts
//! with callgrind (`valgrind --tool=callgrind target/release/deps/dma_pair-*
//! POLICY PAIRS`): the same rig as `softiommu bench dma` (1 GiB of memory,
//! one unit with latency zero, one device, 8 MiB of bounce pool), one page
//! per buffer, bidirectional. Run twice with N and 2N pairs: the difference
//! over N is one pair.

use std::sync::Arc;

use softiommu::dma::{DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{LatencyModel, SourceId, System, UnitConfig};
use softiommu::mem::PhysMemory;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let policy = match args.next().as_deref() {
        Some("passthrough") | None => DmaPolicy::Passthrough,
        Some("deferred") => DmaPolicy::Deferred,
        Some("strict") => DmaPolicy::Strict,
        Some("bounce") => DmaPolicy::Bounce,
        Some(p) => return Err(format!("unknown policy {p}").into()),
    };
    let pairs: u64 = args.next().map_or(Ok(100_000), |s| s.parse())?;
    let mem = Arc::new(PhysMemory::new(1 << 30)?);
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig {
        latency: LatencyModel::zero(),
        ..UnitConfig::default()
    })?;
    let sid = SourceId(0x0300);
    sys.assign(sid, unit)?;
    let domain = DmaDomain::new(
        Arc::new(sys),
        DmaDomainConfig {
            policy,
            bounce_bytes: 8 << 20,
            ..Default::default()
        },
    )?;
    let dev = domain.attach(sid, u64::MAX, false)?;
    let buf = mem.alloc_zeroed_frames(0)?;
    let mut cpu = domain.cpu();
    let dir = DmaDirection::Bidirectional;
    for _ in 0..pairs {
        let a = cpu.map(&dev, buf, 4096, dir)?;
        cpu.unmap(&dev, a, 4096, dir)?;
    }
    println!("{} pairs of {}", pairs, policy.name());
    Ok(())
}
