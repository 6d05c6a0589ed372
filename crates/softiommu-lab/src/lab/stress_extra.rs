//! The stress lab's two phases beyond the raw accessors: a virtio-blk
//! device doing its DMA through the unit while its domain's policy is
//! switched under it, and a device faulting pages of an IOPF domain in
//! while a CPU thread reclaims them.
//!
//! Their checkers are independent of the library's bookkeeping too: the
//! virtio phase checks every read against the sector pattern the `null`
//! back-end derives (wrong data, an I/O error or a DMA fault of the device
//! is a violation); the reclaim phase tags every page of the region with
//! its index before the run, and a successful device read that returns
//! another page's tag, or a failed read inside the region, is a violation
//! (an access outside the region must fail).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::hw::{System, UnitConfig};
use softiommu::iopf::{IopfConfig, IopfDomain, IopfHandler, Region};
use softiommu::mem::{PhysMemory, PAGE_SIZE};
use softiommu::pgtable::Perm;
use softiommu::{DmaAccessor, DmaAttrs, DmaPolicy, SourceId};
use softiommu_virtio::blk::{BlkHost, BlkHostConfig};
use softiommu_virtio::workload::fio::{fio, sized_for, BlockSizes, FioConfig, FioError, RwMode};

use super::stress::PhaseResult;
use crate::error::{join, LabError, LabResult};
use crate::workload::Rng;

/// The virtio phase's row name.
pub const VIRTIO: &str = "virtio-blk";
/// The reclaim phase's row name.
pub const RECLAIM: &str = "iopf-reclaim";

/// How often the virtio phase's switcher changes the policy.
const SWITCH_EVERY: Duration = Duration::from_millis(2);

/// A virtio-blk device (null back-end, two jobs of random reads and
/// writes of 4–64 KiB, every read checked) while a switcher moves its
/// domain between strict, deferred and bounce every 2 ms.
pub fn virtio_phase(seconds: f64, timeout: Duration, seed: u64) -> LabResult<PhaseResult> {
    let fio_err = |source: FioError| LabError::Fio {
        run: format!("lab stress, phase {VIRTIO}"),
        source,
    };
    let bs = BlockSizes::parse("4k:50,16k:30,64k:20").map_err(fio_err)?;
    let runtime = Duration::from_secs_f64(seconds);
    let cfg = FioConfig {
        jobs: 2,
        iodepth: 8,
        rw: RwMode::RandRw { read_pct: 70 },
        bs,
        runtime,
        window: runtime,
        threads: Some(1),
        irq_cpus: None,
        verify_every: 1,
        slow: None,
        seed,
    };
    // The device sized for the jobs, as `run_fio` sizes it.
    let hc = sized_for(
        &BlkHostConfig {
            policy: DmaPolicy::Strict,
            ..BlkHostConfig::default()
        },
        &cfg,
    );
    let host = BlkHost::new(&hc).map_err(|e| fio_err(e.into()))?;
    host.domain.set_timeout(timeout)?;
    let stop = Arc::new(AtomicBool::new(false));
    let switches = Arc::new(AtomicU64::new(0));
    let switcher = {
        let (d, stop, switches) = (host.domain.clone(), stop.clone(), switches.clone());
        std::thread::spawn(move || {
            const CYCLE: [DmaPolicy; 3] =
                [DmaPolicy::Deferred, DmaPolicy::Bounce, DmaPolicy::Strict];
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                if d.set_policy(CYCLE[n % CYCLE.len()]).is_ok() {
                    switches.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
                std::thread::sleep(SWITCH_EVERY);
            }
        })
    };
    let t0 = Instant::now();
    let r = fio(&host, &cfg);
    stop.store(true, Ordering::Relaxed);
    join(switcher, "stress virtio-blk switcher")?;
    let r = r.map_err(fio_err)?;
    let faults = host
        .system
        .unit(host.unit)
        .map_or(0, |u| u.faults().total());
    let violations = r.verify_failures + r.io_errors + faults;
    Ok(PhaseResult {
        policy: VIRTIO.into(),
        ops: r.ops + switches.load(Ordering::Relaxed),
        device_accesses: r.ops,
        faults,
        legal: r.ops.saturating_sub(r.io_errors),
        violations,
        seconds: t0.elapsed().as_secs_f64(),
        first_violation: (violations > 0).then(|| {
            format!(
                "phase {VIRTIO}: {} reads with wrong data of {} checked, {} I/O errors, {} DMA faults of the device",
                r.verify_failures, r.verified, r.io_errors, faults
            )
        }),
        ..PhaseResult::default()
    })
}

const REGION_IOVA: u64 = 1 << 30;
const REGION_PAGES: u64 = 256;
const NIC: SourceId = SourceId(0x0500);

/// The word the reclaim phase writes at the start of page `i`.
fn page_tag(i: u64) -> u64 {
    0x5EC1_A100_0000_0000 | i
}

/// A device reading random pages of a 1 MiB IOPF region (faulting them
/// in) and probing past it, while a CPU thread reclaims random ranges of
/// it.
pub fn reclaim_phase(seconds: f64, seed: u64) -> LabResult<PhaseResult> {
    let mem = Arc::new(PhysMemory::new(64 << 20)?);
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig {
        page_response_timeout: Duration::from_secs(30),
        ..UnitConfig::default()
    })?;
    sys.assign(NIC, unit)?;
    let sys = Arc::new(sys);
    let domain = IopfDomain::new(
        sys.clone(),
        IopfConfig {
            premap_pages: 4,
            ..IopfConfig::default()
        },
    )?;
    let phys = mem.alloc_zeroed_frames(REGION_PAGES.ilog2())?;
    for i in 0..REGION_PAGES {
        mem.store_u64(phys + i * PAGE_SIZE, page_tag(i), Ordering::Relaxed)?;
    }
    domain.add_region(Region {
        iova: REGION_IOVA,
        phys,
        len: REGION_PAGES * PAGE_SIZE,
        perm: Perm::RW,
    })?;
    domain.attach(NIC)?;
    let handler = IopfHandler::start(domain.clone(), unit, 1)?;
    let stop = Arc::new(AtomicBool::new(false));
    let reclaimer = {
        let (d, stop) = (domain.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0x7ec1);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let first = rng.below(REGION_PAGES);
                let pages = 1 + rng.below(8).min(REGION_PAGES - first - 1);
                // A range with nothing mapped is refused (`NotMapped`):
                // counted as an operation all the same.
                let _ = d.reclaim(REGION_IOVA + first * PAGE_SIZE, pages * PAGE_SIZE);
                n += 1;
                std::thread::yield_now();
            }
            n
        })
    };
    let u = sys
        .unit(unit)
        .ok_or(LabError::Setup("the reclaim phase's unit is gone"))?;
    let mut acc = DmaAccessor::new(u, NIC)?;
    let mut rng = Rng::new(seed);
    let (mut accesses, mut legal, mut faults, mut violations) = (0u64, 0u64, 0u64, 0u64);
    let mut first_violation = None;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        accesses += 1;
        // One probe in 16 past the region: must fail.
        let outside = rng.below(16) == 0;
        let page = if outside {
            REGION_PAGES + rng.below(64)
        } else {
            rng.below(REGION_PAGES)
        };
        let r = acc.read_u64(REGION_IOVA + page * PAGE_SIZE, DmaAttrs::ORDERED);
        let bad = match (outside, r) {
            (true, Err(_)) => {
                faults += 1;
                None
            }
            (true, Ok(v)) => Some(format!(
                "a read past the region at page {page} returned {v:#x}"
            )),
            (false, Ok(v)) if v == page_tag(page) => {
                legal += 1;
                None
            }
            (false, Ok(v)) => Some(format!("page {page} read {v:#x}, not its tag")),
            (false, Err(e)) => Some(format!("a read of region page {page} failed: {e}")),
        };
        if let Some(why) = bad {
            violations += 1;
            first_violation.get_or_insert(format!("phase {RECLAIM}: {why}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reclaims = join(reclaimer, "stress reclaimer")?;
    drop(handler);
    Ok(PhaseResult {
        policy: RECLAIM.into(),
        ops: reclaims,
        device_accesses: accesses,
        faults,
        legal,
        violations,
        seconds: t0.elapsed().as_secs_f64(),
        first_violation,
        ..PhaseResult::default()
    })
}
