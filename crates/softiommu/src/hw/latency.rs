//! The costs a CPU cannot make real: the time IOMMU hardware takes for work
//! that, emulated, costs next to nothing.
//!
//! Everything else the unit does is real work (its page walks read real
//! table bytes, its IOTLB is a real cache, its drain really waits for
//! translators); only these figures are modelled, each applied as a
//! busy-wait on the thread doing the work (a spin on the monotonic clock,
//! so that the time shows as CPU time where the hardware would have kept a
//! CPU spinning on a status word). All are zero by default: a unit models
//! nothing unless asked. Reports should print [`LatencyModel::figures`]
//! beside any number they affect.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Cycles per strict-mode IOTLB invalidation (an invalidation descriptor and
/// the wait for its completion) on Intel VT-d, as reported by Malka, Amit,
/// Ben-Yehuda and Tsafrir, "rIOMMU: Efficient IOMMU for I/O Devices that
/// Employ Ring Buffers", ASPLOS 2015: about 2,100 cycles.
pub const VTD_2015_INVALIDATION_CYCLES: u64 = 2_100;

/// The clock at which [`LatencyModel::vtd_2015`] turns cycles into time.
/// **Our assumption**, not the paper's figure: a server core of that era.
pub const VTD_2015_NOMINAL_GHZ: f64 = 3.0;

/// Time per paging-structure read on an IOTLB miss in
/// [`LatencyModel::vtd_2015`]: one DRAM access, ~90 ns. **Our assumption**
/// (a typical idle DRAM latency on servers of that era), not a measured
/// IOMMU figure; real units also cache upper levels, which this one does
/// not model, so a miss here is charged every level it reads.
pub const VTD_2015_WALK_LEVEL_NS: u64 = 90;

/// Modelled hardware latencies of one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LatencyModel {
    /// Charged once per wait descriptor that completes at least one
    /// invalidation: the time from the descriptors being fetched to the
    /// hardware writing the status word (where a strict-mode unmap spends
    /// most of its IOMMU time).
    pub wait_completion: Duration,
    /// Charged per IOTLB invalidation descriptor processed.
    pub iotlb_invalidation: Duration,
    /// Charged per context-cache invalidation descriptor processed.
    pub context_invalidation: Duration,
    /// Charged per table entry read by a page walk (1 to 4 per IOTLB miss).
    pub walk_level: Duration,
}

impl LatencyModel {
    /// Nothing modelled (the default).
    pub fn zero() -> Self {
        Self::default()
    }

    /// VT-d as measured around 2015: [`VTD_2015_INVALIDATION_CYCLES`] at
    /// [`VTD_2015_NOMINAL_GHZ`] (700 ns) per completed wait, and
    /// [`VTD_2015_WALK_LEVEL_NS`] per walk level. See those constants for
    /// which figure is sourced and which is assumed.
    pub fn vtd_2015() -> Self {
        Self {
            wait_completion: cycles(VTD_2015_INVALIDATION_CYCLES, VTD_2015_NOMINAL_GHZ),
            iotlb_invalidation: Duration::ZERO,
            context_invalidation: Duration::ZERO,
            walk_level: Duration::from_nanos(VTD_2015_WALK_LEVEL_NS),
        }
    }

    /// Whether nothing is modelled.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// The figures as data: (name, value), for reports.
    pub fn figures(&self) -> [(&'static str, Duration); 4] {
        [
            ("wait_completion", self.wait_completion),
            ("iotlb_invalidation", self.iotlb_invalidation),
            ("context_invalidation", self.context_invalidation),
            ("walk_level", self.walk_level),
        ]
    }
}

/// `n` cycles of a `ghz` clock as time.
pub fn cycles(n: u64, ghz: f64) -> Duration {
    if ghz > 0.0 && ghz.is_finite() {
        Duration::from_nanos((n as f64 / ghz).round() as u64)
    } else {
        Duration::ZERO
    }
}

/// A [`LatencyModel`] that can be changed while the unit runs, in
/// nanoseconds. Read on slow paths only.
#[derive(Debug, Default)]
pub(crate) struct LiveLatency {
    wait_completion: AtomicU64,
    iotlb_invalidation: AtomicU64,
    context_invalidation: AtomicU64,
    walk_level: AtomicU64,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl LiveLatency {
    pub(crate) fn new(m: LatencyModel) -> Self {
        let l = Self::default();
        l.set(m);
        l
    }

    pub(crate) fn set(&self, m: LatencyModel) {
        // Relaxed: each figure is independent; a change takes effect at the
        // next charge.
        self.wait_completion
            .store(ns(m.wait_completion), Ordering::Relaxed);
        self.iotlb_invalidation
            .store(ns(m.iotlb_invalidation), Ordering::Relaxed);
        self.context_invalidation
            .store(ns(m.context_invalidation), Ordering::Relaxed);
        self.walk_level.store(ns(m.walk_level), Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> LatencyModel {
        LatencyModel {
            wait_completion: Duration::from_nanos(self.wait_completion.load(Ordering::Relaxed)),
            iotlb_invalidation: Duration::from_nanos(
                self.iotlb_invalidation.load(Ordering::Relaxed),
            ),
            context_invalidation: Duration::from_nanos(
                self.context_invalidation.load(Ordering::Relaxed),
            ),
            walk_level: Duration::from_nanos(self.walk_level.load(Ordering::Relaxed)),
        }
    }

    pub(crate) fn wait_completion_ns(&self) -> u64 {
        self.wait_completion.load(Ordering::Relaxed)
    }

    pub(crate) fn iotlb_invalidation_ns(&self) -> u64 {
        self.iotlb_invalidation.load(Ordering::Relaxed)
    }

    pub(crate) fn context_invalidation_ns(&self) -> u64 {
        self.context_invalidation.load(Ordering::Relaxed)
    }

    pub(crate) fn walk_level_ns(&self) -> u64 {
        self.walk_level.load(Ordering::Relaxed)
    }
}

/// Busy-waits `ns` nanoseconds (nothing for zero); returns `ns`.
pub(crate) fn spin_ns(ns: u64) -> u64 {
    if ns == 0 {
        return 0;
    }
    let until = Duration::from_nanos(ns);
    let start = Instant::now();
    while start.elapsed() < until {
        std::hint::spin_loop();
    }
    ns
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_default_models_nothing_and_vtd_2015_is_documented() {
        assert!(LatencyModel::default().is_zero());
        let m = LatencyModel::vtd_2015();
        assert!(!m.is_zero());
        assert_eq!(m.wait_completion, Duration::from_nanos(700));
        assert_eq!(m.figures()[3], ("walk_level", Duration::from_nanos(90)));
        assert_eq!(cycles(3000, 0.0), Duration::ZERO);
    }

    #[test]
    fn live_figures_round_trip_and_spins_take_their_time() {
        let l = LiveLatency::new(LatencyModel::vtd_2015());
        assert_eq!(l.get(), LatencyModel::vtd_2015());
        l.set(LatencyModel::zero());
        assert_eq!(l.wait_completion_ns(), 0);
        let t = Instant::now();
        assert_eq!(spin_ns(200_000), 200_000);
        assert!(t.elapsed() >= Duration::from_micros(200));
        assert_eq!(spin_ns(0), 0);
    }
}
