//! The deadline clock: what a translator reads, on every IOTLB hit while
//! its domain has an expiry deadline armed, to compare against it.
//!
//! Two sources, one chosen per process at first use and never changed (so
//! every deadline and every reading share one unit):
//!
//! - **TSC** (`rdtsc`), counted in ticks, with ticks per nanosecond
//!   calibrated against `CLOCK_MONOTONIC` over about 2 ms. Used only where
//!   it is trustworthy as a clock across CPUs: the CPU reports an invariant
//!   TSC (CPUID leaf `0x8000_0007`, EDX bit 8, Intel SDM vol. 3B §17.17.1)
//!   *and* the kernel itself keeps time with it (its clocksource is `tsc`,
//!   which Linux selects only after checking the TSC synchronized).
//! - **`CLOCK_MONOTONIC`** through `Instant::now` (the vDSO on Linux), in
//!   nanoseconds since the process's first reading, plus one.
//!
//! Where both qualify, the cheaper per read (measured at calibration) is
//! taken: under some hypervisors `rdtsc` traps and costs more than the
//! vDSO call. Readings are never 0 (0 means "no deadline" to the IOTLB).
//!
//! Converting a duration to ticks rounds *down* by 1/256 on the TSC: a
//! deadline computed from it is never later than asked.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Fixed-point shift of the TSC's ticks per nanosecond.
const FP: u32 = 24;

/// The chosen source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadlineClock {
    /// `rdtsc`; ticks per nanosecond << [`FP`].
    Tsc {
        /// Ticks per nanosecond, fixed point.
        per_ns: u64,
    },
    /// `CLOCK_MONOTONIC`, nanoseconds since [`origin`], plus one.
    Mono,
}

static CHOSEN: OnceLock<DeadlineClock> = OnceLock::new();
static ORIGIN: OnceLock<Instant> = OnceLock::new();

fn origin() -> Instant {
    *ORIGIN.get_or_init(Instant::now)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` has no preconditions and touches no memory.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Whether the TSC can serve as a clock across CPUs (module doc).
#[cfg(target_arch = "x86_64")]
fn tsc_trustworthy() -> bool {
    // Leaf 0x8000_0000 says how far the extended leaves go before we ask
    // for 0x8000_0007.
    let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
    let invariant =
        max >= 0x8000_0007 && core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0;
    let kernel_uses_it =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| s.trim() == "tsc");
    invariant && kernel_uses_it
}

/// Calibrates the TSC against `CLOCK_MONOTONIC`, and times a read of each;
/// the TSC's rate if it is the cheaper.
#[cfg(target_arch = "x86_64")]
fn calibrate() -> Option<u64> {
    if cfg!(loom) || !tsc_trustworthy() {
        return None;
    }
    const READS: u32 = 2_000;
    let t = Instant::now();
    let mut acc = 0u64;
    for _ in 0..READS {
        acc = acc.wrapping_add(rdtsc());
    }
    let tsc_cost = t.elapsed();
    let t = Instant::now();
    for _ in 0..READS {
        acc = acc.wrapping_add(origin().elapsed().as_nanos() as u64);
    }
    let mono_cost = t.elapsed();
    std::hint::black_box(acc);
    let (i0, c0) = (Instant::now(), rdtsc());
    while i0.elapsed() < Duration::from_millis(2) {
        std::hint::spin_loop();
    }
    let (c1, ns) = (rdtsc(), i0.elapsed().as_nanos());
    let ticks = u128::from(c1.checked_sub(c0)?);
    let per_ns = u64::try_from((ticks << FP) / ns.max(1)).ok()?;
    // Down by 1/256: a deadline is never later than asked.
    let per_ns = per_ns - per_ns / 256;
    (per_ns > 0 && tsc_cost < mono_cost).then_some(per_ns)
}

#[cfg(not(target_arch = "x86_64"))]
fn calibrate() -> Option<u64> {
    None
}

impl DeadlineClock {
    /// The process's clock (calibrated on first use).
    pub(crate) fn get() -> Self {
        *CHOSEN.get_or_init(|| {
            let _ = origin();
            match calibrate() {
                Some(per_ns) => DeadlineClock::Tsc { per_ns },
                None => DeadlineClock::Mono,
            }
        })
    }

    /// A reading now (never 0).
    #[inline(always)]
    pub(crate) fn now(self) -> u64 {
        match self {
            #[cfg(target_arch = "x86_64")]
            DeadlineClock::Tsc { .. } => rdtsc() | 1,
            #[cfg(not(target_arch = "x86_64"))]
            DeadlineClock::Tsc { .. } => 1,
            DeadlineClock::Mono => (origin().elapsed().as_nanos() as u64).saturating_add(1),
        }
    }

    /// `d` in this clock's units (rounded down).
    pub(crate) fn ticks(self, d: Duration) -> u64 {
        let ns = d.as_nanos();
        let t = match self {
            DeadlineClock::Tsc { per_ns } => ns.saturating_mul(u128::from(per_ns)) >> FP,
            DeadlineClock::Mono => ns,
        };
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    /// `ticks` of this clock as a duration (rounded up).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn duration(self, ticks: u64) -> Duration {
        match self {
            DeadlineClock::Tsc { per_ns } => {
                let ns = (u128::from(ticks) << FP).div_ceil(u128::from(per_ns.max(1)));
                Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
            }
            DeadlineClock::Mono => Duration::from_nanos(ticks),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn readings_advance_and_durations_round_trip_within_a_tick() {
        let c = DeadlineClock::get();
        let t = Instant::now();
        let mut acc = 0u64;
        for _ in 0..10_000 {
            acc = acc.wrapping_add(c.now());
        }
        // Shown with `--nocapture`: which clock, and what a read costs.
        println!(
            "deadline clock {c:?}: {:.1} ns a read ({acc})",
            t.elapsed().as_nanos() as f64 / 10_000.0
        );
        let a = c.now();
        std::thread::sleep(Duration::from_millis(3));
        let b = c.now();
        assert!(a != 0 && b > a);
        let gap = c.duration(b - a);
        assert!(gap >= Duration::from_millis(2), "{gap:?} for a 3 ms sleep");
        let d = Duration::from_millis(10);
        let back = c.duration(c.ticks(d));
        assert!(back <= d + Duration::from_nanos(2), "{back:?}");
        assert!(back >= d - d / 100, "{back:?}");
    }
}
