//! A driver for profiling the deferred policy's flush timer: one CPU
//! handle maps and unmaps a page at a steady rate for a while, so the
//! domain's timer thread (`dma-fq-timer-*`) runs a round once per flush
//! timeout. Run it under callgrind with `--separate-threads=yes` to count
//! the instructions of the timer thread's rounds:
//!
//! ```text
//! cargo build --release -p softiommu --example timer_round
//! valgrind --tool=callgrind --separate-threads=yes \
//!     target/release/examples/timer_round 300 100
//! ```
//!
//! Arguments: milliseconds to run (default 300) and map/unmap pairs per
//! millisecond (default 100; 0 runs idle, the timer disarmed).

use std::time::{Duration, Instant};

use softiommu::{DmaDirection, DmaPolicy, Platform, SourceId};

fn main() -> Result<(), softiommu::Error> {
    let mut args = std::env::args().skip(1);
    let ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let per_ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let nic = SourceId::new(1, 0, 0).unwrap_or_default();
    let p = Platform::builder()
        .memory(64 << 20)
        .policy(DmaPolicy::Deferred)
        .device(nic)
        .build()?;
    if let Some(u) = p.unit(0) {
        u.set_pass_accounting(true);
    }
    let dev = &p.devices[0];
    let mut cpu = p.domain.cpu();
    let buf = p.mem.alloc_zeroed_frames(0)?;
    let start = Instant::now();
    let mut pairs = 0u64;
    for tick in 0..ms {
        for _ in 0..per_ms {
            let iova = cpu.map(dev, buf, 1500, DmaDirection::ToDevice)?;
            cpu.unmap(dev, iova, 1500, DmaDirection::ToDevice)?;
            pairs += 1;
        }
        let next = start + Duration::from_millis(tick + 1);
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    let elapsed = start.elapsed();
    println!(
        "pairs {pairs} in {elapsed:?}; timer wake-ups {}, timer CPU {:?}",
        p.domain.timer_wakeups(),
        p.domain.timer_cpu_time()
    );
    Ok(())
}
