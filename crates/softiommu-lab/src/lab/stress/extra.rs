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

use super::out::PhaseResult;
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
        sample_work: false,
        flush_timeout: None,
        rate_iops: None,
        fresh_arm: false,
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

/// Pages the reclaim phase's domain maps around a faulting page.
const PREMAP: u64 = 4;

/// The word the reclaim phase writes at the start of page `i` for its
/// `gen`-th content (the reclaimer changes it after each reclaim).
pub fn page_tag(i: u64, gen: u64) -> u64 {
    0x5EC1_A100_0000_0000 | (gen & 0xff_ffff) << 16 | i
}

/// What the reclaim phase knows of one device read of region page `page`
/// that succeeded with `value`.
#[derive(Debug, Clone, Copy)]
pub struct ReclaimRead {
    /// The region page read.
    pub page: u64,
    /// The word read.
    pub value: u64,
    /// Whether the read raised a page request (faulted the page in).
    pub faulted: bool,
    /// Phase clock when the read began.
    pub t_before_ns: u64,
    /// When the newest read of this device that faulted a page within
    /// [`PREMAP`] of `page` in ended (0: never), as of the read's start.
    pub last_fault_end_ns: u64,
    /// When the newest completed reclaim of the page was called and
    /// returned (0: never), read before the read began.
    pub reclaim_call_ns: u64,
    /// See `reclaim_call_ns`.
    pub reclaim_ret_ns: u64,
    /// The page's content generation, read after the read.
    pub gen_after: u64,
}

/// Judges a successful read of a region page: `None` if legal, else why
/// not. A read must return one of the page's own tags, and a read that
/// began after a reclaim of the page returned must have faulted it back
/// in (this read, or one of this device's that ended after the reclaim
/// was called): otherwise it was served by a translation the reclaim
/// revoked.
pub fn judge_reclaim_read(r: &ReclaimRead) -> Option<String> {
    let own = (0..=r.gen_after).any(|g| page_tag(r.page, g) == r.value);
    if !own {
        return Some(format!(
            "page {} read {:#x}, not one of its tags (generation <= {})",
            r.page, r.value, r.gen_after
        ));
    }
    let reclaimed_before = r.reclaim_ret_ns != 0 && r.t_before_ns > r.reclaim_ret_ns;
    if reclaimed_before && !r.faulted && r.last_fault_end_ns < r.reclaim_call_ns {
        return Some(format!(
            "page {} read {:#x} without a fault {} us after its reclaim returned: \
             expected a page request (the reclaim revoked the translation)",
            r.page,
            r.value,
            (r.t_before_ns - r.reclaim_ret_ns) / 1000
        ));
    }
    None
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
            premap_pages: PREMAP,
            ..IopfConfig::default()
        },
    )?;
    let phys = mem.alloc_zeroed_frames(REGION_PAGES.ilog2())?;
    for i in 0..REGION_PAGES {
        mem.store_u64(phys + i * PAGE_SIZE, page_tag(i, 0), Ordering::Relaxed)?;
    }
    // Per page: content generation, and when its newest reclaim was
    // called and returned (the reclaimer's record, never the library's).
    let pages: Arc<Vec<[AtomicU64; 3]>> = Arc::new(
        (0..REGION_PAGES)
            .map(|_| [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)])
            .collect(),
    );
    let t0 = Instant::now();
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
        let (d, stop, mem, pg) = (domain.clone(), stop.clone(), mem.clone(), pages.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0x7ec1);
            let mut n = 0u64;
            let ns = || t0.elapsed().as_nanos() as u64;
            while !stop.load(Ordering::Relaxed) {
                let first = rng.below(REGION_PAGES);
                let count = 1 + rng.below(8).min(REGION_PAGES - first - 1);
                let t_call = ns();
                // A range with nothing mapped is refused (`NotMapped`):
                // counted as an operation all the same.
                let done = d
                    .reclaim(REGION_IOVA + first * PAGE_SIZE, count * PAGE_SIZE)
                    .is_ok();
                let t_ret = ns();
                if done {
                    for i in first..first + count {
                        let Some(p) = pg.get(i as usize) else {
                            continue;
                        };
                        // A new content: what a stale translation reads
                        // from here on differs from before the reclaim.
                        let gen = p[0].load(Ordering::Relaxed) + 1;
                        let _ = mem.store_u64(
                            phys + i * PAGE_SIZE,
                            page_tag(i, gen),
                            Ordering::Relaxed,
                        );
                        p[0].store(gen, Ordering::Release);
                        p[1].store(t_call, Ordering::Release);
                        p[2].store(t_ret, Ordering::Release);
                    }
                }
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
    let mut last_fault_end = vec![0u64; REGION_PAGES as usize];
    let ns = || t0.elapsed().as_nanos() as u64;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        accesses += 1;
        // One probe in 16 past the region: must fail.
        let outside = rng.below(16) == 0;
        let page = if outside {
            REGION_PAGES + rng.below(64)
        } else {
            rng.below(REGION_PAGES)
        };
        let rec = pages.get(page as usize);
        let (call, ret) = rec.map_or((0, 0), |p| {
            (p[1].load(Ordering::Acquire), p[2].load(Ordering::Acquire))
        });
        let last_fault = last_fault_end.get(page as usize).copied().unwrap_or(0);
        let pr = acc.stats().page_requests;
        let t_before_ns = ns();
        let r = acc.read_u64(REGION_IOVA + page * PAGE_SIZE, DmaAttrs::ORDERED);
        let faulted = acc.stats().page_requests > pr;
        if faulted && !outside {
            let end = ns();
            let lo = page.saturating_sub(PREMAP) as usize;
            let hi = (page + PREMAP).min(REGION_PAGES - 1) as usize;
            for f in last_fault_end.iter_mut().take(hi + 1).skip(lo) {
                *f = end;
            }
        }
        let bad = match (outside, r) {
            (true, Err(_)) => {
                faults += 1;
                None
            }
            (true, Ok(v)) => Some(format!(
                "a read past the region at page {page} returned {v:#x}"
            )),
            (false, Ok(v)) => {
                let gen_after = rec.map_or(0, |p| p[0].load(Ordering::Acquire));
                let why = judge_reclaim_read(&ReclaimRead {
                    page,
                    value: v,
                    faulted,
                    t_before_ns,
                    last_fault_end_ns: last_fault,
                    reclaim_call_ns: call,
                    reclaim_ret_ns: ret,
                    gen_after,
                });
                if why.is_none() {
                    legal += 1;
                }
                why
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn read(value: u64, faulted: bool, last_fault_end_ns: u64) -> ReclaimRead {
        ReclaimRead {
            page: 7,
            value,
            faulted,
            t_before_ns: 5_000,
            last_fault_end_ns,
            reclaim_call_ns: 3_000,
            reclaim_ret_ns: 4_000,
            gen_after: 1,
        }
    }

    /// A read of a reclaimed page served without a fault after the reclaim
    /// returned is caught, whichever of the page's tags it returned (the
    /// old checker accepted any read of the page's one fixed tag).
    #[test]
    fn a_stale_read_of_a_reclaimed_page_is_caught() {
        let stale = read(page_tag(7, 0), false, 1_000);
        assert!(judge_reclaim_read(&stale).is_some_and(|w| w.contains("without a fault")));
        let stale_new_tag = read(page_tag(7, 1), false, 1_000);
        assert!(judge_reclaim_read(&stale_new_tag).is_some());
        // Faulted back in by this read, or by one that ended after the
        // reclaim was called: legal, with either tag.
        assert_eq!(judge_reclaim_read(&read(page_tag(7, 1), true, 1_000)), None);
        assert_eq!(
            judge_reclaim_read(&read(page_tag(7, 0), false, 3_500)),
            None
        );
        // Another page's tag, or a generation not written yet.
        assert!(judge_reclaim_read(&read(page_tag(8, 1), true, 0)).is_some());
        assert!(judge_reclaim_read(&read(page_tag(7, 2), true, 0)).is_some());
    }
}
