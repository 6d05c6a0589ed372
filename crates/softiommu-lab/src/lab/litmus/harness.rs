//! Litmus tests of the accessors on the real CPU: a device thread (through
//! a [`DmaAccessor`], typed `u32` accesses at IOVAs) and a guest CPU thread
//! (plain atomics at the physical addresses, with the barriers a guest
//! driver would use) run a classic two-thread pattern in lock step, over
//! and over, and count the outcomes the guest must never see.
//!
//! | test     | device (IOVAs)              | CPU (physical)                         | forbidden       |
//! |----------|-----------------------------|----------------------------------------|-----------------|
//! | `MP`     | `data = 1; flag = 1`        | `r1 = flag (acquire); r2 = data`       | `r1 = 1, r2 = 0` |
//! | `MP-rev` | `r1 = flag; r2 = data`      | `data = 1; flag = 1 (release)`         | `r1 = 1, r2 = 0` |
//! | `SB`     | `x = 1; r1 = y`             | `y = 1; fence(SeqCst); r2 = x`         | `r1 = 0, r2 = 0` |
//!
//! On x86 only `SB` can go wrong (a store waits in the store buffer while
//! the next load runs): `relaxed` shows it, `ordered` and `full` must not.
//! On weaker CPUs `relaxed` can fail every test. The tests below run a
//! short form; `softiommu lab litmus` runs millions. (The harness lives in
//! the lab, not the library: it is an experiment on the library, through
//! its public API.)
//!
//! Each iteration uses a fresh pair of cache lines (a batch of 4,096
//! iterations spans 512 KiB, mapped once), so nothing is reset between the
//! two threads' steps; the threads meet before every iteration.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use softiommu::access::{AccessError, DmaAccessor, OrderMode};
use softiommu::dma::{DmaDevice, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{SourceId, System, UnitConfig};
use softiommu::mem::PhysMemory;

/// Iterations per batch.
const BATCH: u64 = 4096;
/// Bytes per iteration: two cache lines, `x`/`data` then `y`/`flag`.
const STRIDE: u64 = 128;
/// The device's requester id.
const SID: SourceId = SourceId(0x0300);
/// Spins of a meeting before it yields its core.
const SPINS: u32 = 64;
/// Yields of a meeting before it sleeps between looks.
const YIELDS: u32 = 16;
/// A meeting's sleep between looks once spinning and yielding failed: the
/// thread it waits for is off its CPU (another process holds the core),
/// and a sleeper is woken ahead of a busy process where a yielder is not.
const NAP: Duration = Duration::from_micros(20);

/// A two-thread pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LitmusTest {
    /// Message passing, device to CPU (a NIC writes a buffer, then its
    /// status).
    Mp,
    /// Message passing, CPU to device (the guest posts a descriptor).
    MpRev,
    /// Store buffering (the device writes the used index, then reads the
    /// guest's event index; the guest the other way round).
    Sb,
}

impl LitmusTest {
    /// Every test, in the order reports list them.
    pub const ALL: [LitmusTest; 3] = [LitmusTest::Mp, LitmusTest::MpRev, LitmusTest::Sb];

    /// The name reports use.
    pub const fn name(self) -> &'static str {
        match self {
            LitmusTest::Mp => "MP",
            LitmusTest::MpRev => "MP-rev",
            LitmusTest::Sb => "SB",
        }
    }

    /// The outcome `(r1, r2)` the guest must never see.
    pub const fn forbidden(self) -> (u32, u32) {
        match self {
            LitmusTest::Mp | LitmusTest::MpRev => (1, 0),
            LitmusTest::Sb => (0, 0),
        }
    }
}

/// What one test in one mode saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LitmusResult {
    /// The test.
    pub test: LitmusTest,
    /// The device's ordering.
    pub mode: OrderMode,
    /// Iterations run.
    pub runs: u64,
    /// Whether the time budget stopped the run before `runs` asked for.
    pub cut_short: bool,
    /// Iterations whose outcome was the forbidden one.
    pub forbidden: u64,
    /// How often each `(r1, r2)` was seen: index `r1 * 2 + r2`.
    pub outcomes: [u64; 4],
    /// The unit's drain barrier (`"membarrier"` or `"fence"`). With
    /// `"fence"` every translation issues a full fence of its own, so even
    /// `relaxed` cannot show store buffering.
    pub drain_barrier: &'static str,
}

/// Why a litmus run could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LitmusError {
    /// Building the system, the domain or the buffers failed.
    #[error("litmus setup: {0}")]
    Setup(String),
    /// A device access failed (it never should: the memory is mapped).
    #[error("litmus device access: {0}")]
    Access(String),
}

fn setup<E: std::fmt::Display>(e: E) -> LitmusError {
    LitmusError::Setup(e.to_string())
}

/// Two threads meeting at numbered rounds; either can abort the other.
#[derive(Debug, Default)]
struct Rendezvous {
    dev: CachePadded<AtomicU64>,
    cpu: CachePadded<AtomicU64>,
    abort: AtomicBool,
}

impl Rendezvous {
    /// Announces `round` for this side and waits for the other side to
    /// reach it; `false` if the other side aborted.
    #[inline]
    fn meet(&self, device: bool, round: u64) -> bool {
        let (mine, theirs) = if device {
            (&self.dev, &self.cpu)
        } else {
            (&self.cpu, &self.dev)
        };
        // Release/Acquire: what each side did before a meeting (results,
        // resets) happens before what the other does after it.
        mine.store(round, Ordering::Release);
        let mut spins = 0u32;
        while theirs.load(Ordering::Acquire) < round {
            if self.abort.load(Ordering::Relaxed) {
                return false;
            }
            // Spin briefly (the other side is a core away), then give the
            // core up: on two cores shared with other work, the thread we
            // wait for may need this one. Past a few yields, sleep: a
            // process busy at the same priority keeps a yielder off its
            // core for a whole time slice, every meeting.
            spins = spins.saturating_add(1);
            if spins < SPINS {
                std::hint::spin_loop();
            } else if spins < SPINS + YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
        true
    }
}

/// A guest word at a physical address.
///
/// # Safety
///
/// `mem.as_ptr(phys, 4)` is checked; `phys` must be 4-byte aligned. The
/// word is shared with the device, which accesses it atomically too.
fn word(mem: &PhysMemory, phys: u64) -> Result<&AtomicU32, LitmusError> {
    if !phys.is_multiple_of(4) {
        return Err(LitmusError::Setup(format!("unaligned word {phys:#x}")));
    }
    let p = mem.as_ptr(phys, 4).map_err(setup)?;
    // SAFETY: in bounds (checked), 4-byte aligned (the arena is page
    // aligned and `phys` is a multiple of 4), living as long as `mem`;
    // every access to it, device or CPU, is atomic.
    Ok(unsafe { AtomicU32::from_ptr(p.cast()) })
}

struct Rig {
    mem: Arc<PhysMemory>,
    dev: DmaDevice,
    phys: u64,
    iova: u64,
    drain_barrier: &'static str,
    // Kept alive for the run.
    _domain: Arc<DmaDomain>,
}

fn rig() -> Result<Rig, LitmusError> {
    let mem = Arc::new(PhysMemory::new(64 << 20).map_err(setup)?);
    let mut sys = System::new(mem.clone());
    let u = sys.add_unit(UnitConfig::default()).map_err(setup)?;
    sys.assign(SID, u).map_err(setup)?;
    let drain_barrier = sys.unit(u).map_or("fence", |u| u.drain_barrier());
    let domain = DmaDomain::new(
        Arc::new(sys),
        DmaDomainConfig {
            policy: DmaPolicy::Strict,
            bounce_bytes: 0,
            ..DmaDomainConfig::default()
        },
    )
    .map_err(setup)?;
    let dev = domain.attach(SID, u64::MAX, false).map_err(setup)?;
    let mut cpu = domain.cpu();
    let (phys, iova) = cpu.alloc_coherent(&dev, BATCH * STRIDE).map_err(setup)?;
    Ok(Rig {
        mem,
        dev,
        phys,
        iova,
        drain_barrier,
        _domain: domain,
    })
}

/// The device's side of one iteration; returns `(r1, r2)` where it reads.
#[inline(always)]
fn device_step(
    acc: &mut DmaAccessor,
    test: LitmusTest,
    mode: OrderMode,
    x: u64,
    y: u64,
) -> Result<(u32, u32), AccessError> {
    let a = mode.attrs();
    Ok(match test {
        LitmusTest::Mp => {
            acc.write_u32(x, 1, a)?;
            acc.write_u32(y, 1, a)?;
            (0, 0)
        }
        LitmusTest::MpRev => {
            let r1 = acc.read_u32(y, a)?;
            let r2 = acc.read_u32(x, a)?;
            (r1, r2)
        }
        LitmusTest::Sb => {
            acc.write_u32(x, 1, a)?;
            (acc.read_u32(y, a)?, 0)
        }
    })
}

/// The CPU's side of one iteration; returns what it reads.
#[inline(always)]
fn cpu_step(test: LitmusTest, x: &AtomicU32, y: &AtomicU32) -> (u32, u32) {
    match test {
        LitmusTest::Mp => {
            let r1 = y.load(Ordering::Acquire);
            let r2 = x.load(Ordering::Relaxed);
            (r1, r2)
        }
        LitmusTest::MpRev => {
            x.store(1, Ordering::Relaxed);
            y.store(1, Ordering::Release);
            (0, 0)
        }
        LitmusTest::Sb => {
            y.store(1, Ordering::Relaxed);
            // The guest's smp_mb().
            std::sync::atomic::fence(Ordering::SeqCst);
            (0, x.load(Ordering::Relaxed))
        }
    }
}

/// Runs `test` with the device accessing in `mode`, `runs` times (rounded
/// up to a whole batch of 4,096), or fewer whole batches once `budget` has
/// passed (at least one batch runs): a machine whose cores other work
/// holds makes every meeting wait, and the run stops rather than take
/// hours; the result says how many ran and whether it was cut.
pub fn run(
    test: LitmusTest,
    mode: OrderMode,
    runs: u64,
    budget: Option<Duration>,
) -> Result<LitmusResult, LitmusError> {
    let start = Instant::now();
    let rig = rig()?;
    let batches = runs.div_ceil(BATCH).max(1);
    let meet = Rendezvous::default();
    let dev_r: Vec<AtomicU8> = (0..BATCH).map(|_| AtomicU8::new(0)).collect();
    let mut outcomes = [0u64; 4];
    let mut done = 0u64;
    let mem = &*rig.mem;
    let region = BATCH * STRIDE;
    std::thread::scope(|s| -> Result<(), LitmusError> {
        let (meet, dev_r, dev, iova) = (&meet, &dev_r, &rig.dev, rig.iova);
        let device = s.spawn(move || -> Result<(), LitmusError> {
            let fail = |e: String| {
                meet.abort.store(true, Ordering::Relaxed);
                LitmusError::Access(e)
            };
            let mut acc = DmaAccessor::for_device(dev).map_err(|e| fail(e.to_string()))?;
            let mut round = 0u64;
            for _ in 0..batches {
                for i in 0..BATCH {
                    round += 1;
                    if !meet.meet(true, round) {
                        return Ok(());
                    }
                    let x = iova + i * STRIDE;
                    let (r1, r2) = device_step(&mut acc, test, mode, x, x + 64)
                        .map_err(|e| fail(e.to_string()))?;
                    dev_r[i as usize].store((r1 * 2 + r2) as u8, Ordering::Relaxed);
                }
                // The CPU reads the results and resets the lines.
                round += 1;
                if !meet.meet(true, round) {
                    return Ok(());
                }
                round += 1;
                if !meet.meet(true, round) {
                    return Ok(());
                }
            }
            Ok(())
        });
        let mut cpu = || -> Result<(), LitmusError> {
            let mut round = 0u64;
            let mut cpu_r = vec![(0u32, 0u32); BATCH as usize];
            for _ in 0..batches {
                for (i, r) in cpu_r.iter_mut().enumerate() {
                    round += 1;
                    if !meet.meet(false, round) {
                        return Err(LitmusError::Access("the device thread stopped".into()));
                    }
                    let x = rig.phys + i as u64 * STRIDE;
                    *r = cpu_step(test, word(mem, x)?, word(mem, x + 64)?);
                }
                round += 1;
                if !meet.meet(false, round) {
                    return Err(LitmusError::Access("the device thread stopped".into()));
                }
                for (i, c) in cpu_r.iter().enumerate() {
                    let d = dev_r[i].load(Ordering::Relaxed);
                    let (r1, r2) = match test {
                        LitmusTest::Mp => *c,
                        LitmusTest::MpRev => (u32::from(d >> 1), u32::from(d & 1)),
                        LitmusTest::Sb => (u32::from(d >> 1), c.1),
                    };
                    outcomes[(r1.min(1) * 2 + r2.min(1)) as usize] += 1;
                }
                mem.fill(rig.phys, region, 0).map_err(setup)?;
                round += 1;
                if !meet.meet(false, round) {
                    return Err(LitmusError::Access("the device thread stopped".into()));
                }
                done += 1;
                if budget.is_some_and(|b| start.elapsed() >= b) {
                    // The device thread waits at the next batch's first
                    // meeting, or finished: either way the abort ends it
                    // cleanly (its meeting returns `false`, it returns Ok).
                    meet.abort.store(true, Ordering::Relaxed);
                    break;
                }
            }
            Ok(())
        };
        let c = cpu();
        if c.is_err() {
            meet.abort.store(true, Ordering::Relaxed);
        }
        let d = device
            .join()
            .map_err(|_| LitmusError::Access("the device thread panicked".into()))?;
        d.and(c)
    })?;
    let (f1, f2) = test.forbidden();
    Ok(LitmusResult {
        test,
        mode,
        runs: done * BATCH,
        cut_short: done < batches,
        forbidden: outcomes[(f1 * 2 + f2) as usize],
        outcomes,
        drain_barrier: rig.drain_barrier,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per test and mode; a few batches, seconds in a debug build.
    const RUNS: u64 = 64 * 1024;

    #[test]
    fn ordered_and_full_never_show_a_forbidden_outcome() {
        for test in LitmusTest::ALL {
            for mode in [OrderMode::Ordered, OrderMode::Full] {
                let r = run(test, mode, RUNS, None).unwrap();
                assert_eq!(r.runs, RUNS);
                assert_eq!(r.outcomes.iter().sum::<u64>(), r.runs);
                assert_eq!(
                    r.forbidden,
                    0,
                    "{} {}: forbidden outcome {:?} seen; outcomes {:?}",
                    test.name(),
                    mode,
                    test.forbidden(),
                    r.outcomes
                );
            }
        }
    }

    #[test]
    fn relaxed_runs_and_counts_every_outcome() {
        // Whether relaxed shows a forbidden outcome depends on the CPU and
        // on timing; that it runs and accounts for every iteration does not.
        let r = run(LitmusTest::Sb, OrderMode::Relaxed, 4096, None).unwrap();
        assert_eq!(r.runs, 4096);
        assert!(!r.cut_short);
        assert_eq!(r.outcomes.iter().sum::<u64>(), 4096);
        assert!(!r.drain_barrier.is_empty());
    }

    #[test]
    fn a_spent_budget_stops_at_a_whole_batch_and_says_so() {
        // A zero budget is spent at the first batch's end: one batch runs,
        // every one of its iterations counted, and the run is marked cut.
        let r = run(
            LitmusTest::Mp,
            OrderMode::Ordered,
            64 * BATCH,
            Some(Duration::ZERO),
        )
        .unwrap();
        assert_eq!(r.runs, BATCH);
        assert!(r.cut_short);
        assert_eq!(r.outcomes.iter().sum::<u64>(), BATCH);
        assert_eq!(r.forbidden, 0);
    }
}
