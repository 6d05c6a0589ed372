//! The aging figure as both aging labs report it: the statistic
//! (`softiommu_virtio::workload::aging`, one copy, where the fio engine's
//! time line is built) taken on work per CPU-second with the wall-clock
//! figure beside it, its JSON fields and its table columns; and the
//! paired figure against a fresh control arm ([`VsFresh`]), which
//! `lab iova-aging` makes its headline.
//!
//! # Against a fresh control arm
//!
//! Work per CPU-second is not the machine's constant: on a 2-vCPU virtual
//! machine shared with other processes it moves 15-60 % over seconds
//! (caches shared with a co-runner, a busy sibling hyper-thread, the
//! host's scheduling), so `retained` of one run — its last quarter's rate
//! ÷ its first quarter's — also measures how the co-runner's load moved
//! between the two (measured: ours 0.98 alone, 1.58 beside two busy
//! loops). The paired figure measures that drift and divides it out:
//! beside the aged allocator a *fresh* one of the same policy does the
//! same mix of operations in short slices interleaved with the aged one's
//! on the same thread, renewed every so many operations so that it never
//! ages. In every window both arms' rates are measured side by side, on
//! the same core, under the same load; their ratio
//! (aged ÷ fresh, [`paired_ratios`]) moves only when the aged one's work
//! per operation changes relative to a fresh one's. The figure is the
//! aging statistic on that ratio series:
//! `retained_vs_fresh` = median ratio of the last quarter ÷ median ratio
//! of the first quarter (after the ratio's own warm-up), and
//! `stability_vs_fresh` = 5th-percentile ratio ÷ median ratio. The
//! ratio at the end alone (`vs_fresh_last`) is reported but is not the
//! headline: it also holds whatever constant difference there is between
//! an allocator that has run for seconds and one that has run for
//! milliseconds (a warm cache population, a larger tree), which is not a
//! change over the run; the seed's figure is a change over the run.
//!
//! # What the aged arm's own figure measures
//!
//! `retained` alone (the aged arm's work per CPU-second, last quarter ÷
//! first) is reported beside the paired figure, and beside it
//! `retained_fresh`: the same statistic on the fresh arm's own rate. The
//! fresh arm is rebuilt every second and cannot age, so `retained_fresh`
//! is what the machine did to a CPU-second over the run, and `retained`
//! is about `retained_vs_fresh × retained_fresh`. On the storage path
//! (`lab fio-aging`, paced, its job threads sleeping between requests)
//! that drift is most of `retained`: measured on this project's 2-vCPU
//! virtual machine with nothing else running in it (14 quick runs of
//! `lab fio-aging --policies softiommu --no-dma`), ours' `retained` read
//! 0.61-1.35 (mean 0.98, sd 0.21) while the fresh arm's own figure read
//! 0.77-1.63 (sd 0.27) on the same windows (taken from the time lines on
//! the paired figure's quarters) and `retained_vs_fresh` 0.90-1.05
//! (mean 0.985, sd 0.045); run by run the two arms' log-rate slopes
//! agreed (-0.10 and -0.10 per second, +0.09 and +0.08) and their
//! ratio's slope averaged +0.0007 per second. A fixed piece of work (a
//! 3,000-step pointer chase over 256 KiB, no allocator, no device) timed
//! the same way on two threads that sleep 2 ms between pieces read
//! 0.50-1.12 on the same statistic (`scripts/cpu-drift-probe.c`): the
//! host, not the work. A `retained` alone below 0.95 with
//! `retained_fresh` as low is the machine; only `retained_vs_fresh`
//! tells aging apart.

use serde::Serialize;
pub use softiommu_virtio::workload::aging::WorkWindow;
use softiommu_virtio::workload::aging::{
    aging_figure, cpu_rates, AgingError, AgingParams, CPU_FLOOR_FRACTION,
};

use crate::error::{LabError, LabResult};
use crate::report::{Axis, Cell, Column, Plot, PlotKind, Series, Unit};

/// The aging figure's parameters for a run of `seconds`: the 1 s warm-up
/// floor, or a quarter of a shorter run.
fn aging_params(seconds: f64) -> AgingParams {
    let d = AgingParams::default();
    AgingParams {
        floor_s: d.floor_s.min(seconds / 4.0),
        ..d
    }
}

/// The plot of the headline figure's input, as both aging labs draw it:
/// each policy's aged ÷ fresh rate of `work` (e.g. "I/Os per
/// CPU-second") window by window.
pub fn vs_fresh_plot(work: &str, series: Vec<Series>) -> Plot {
    Plot {
        name: "vs_fresh".into(),
        title: format!(
            "aged ÷ fresh {work} over time per IOVA policy (the headline figure's input)"
        ),
        kind: PlotKind::Lines,
        x: Axis::new("time", Unit::S),
        y: Axis::new("aged ÷ fresh", Unit::Ratio),
        categories: Vec::new(),
        series,
        modelled: false,
    }
}

/// The aging figure's columns, as both aging labs show them: warm-up, the
/// first and last quarter's median work per CPU-second (in `rate`: ops
/// per CPU-second), retained and stability on CPU time, then on wall
/// time.
pub fn aging_columns(rate: Unit, decimals: u8) -> [Column; 7] {
    [
        Column::metric("warmup_s", "warm-up", Unit::S, 2),
        Column::metric("ops_per_cpu_s_first", "first qtr per CPU-s", rate, decimals),
        Column::metric("ops_per_cpu_s_last", "last qtr per CPU-s", rate, decimals),
        Column::metric("retained", "retained (CPU)", Unit::Ratio, 2),
        Column::metric("stability", "stability (CPU)", Unit::Ratio, 2),
        Column::metric("retained_wall", "retained (wall)", Unit::Ratio, 2),
        Column::metric("stability_wall", "stability (wall)", Unit::Ratio, 2),
    ]
}

/// The aging figure as both aging labs report it, flattened into each
/// policy's row (the JSON keys are these fields' names). The headline
/// figures (`warmup_s`, `settled`, `retained`, `stability`) are taken on
/// work per CPU-second of the measured threads
/// (`softiommu_virtio::workload::aging::cpu_rates`), so a co-runner taking
/// a core is not aging; the `_wall` ones on the wall-clock rate.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AgingSummary {
    /// Seconds discarded as warm-up (until work per CPU-second stopped
    /// rising; at least 1 s, `softiommu_virtio::workload::aging`).
    pub warmup_s: f64,
    /// Whether work per CPU-second settled within the first half of the
    /// run.
    pub settled: bool,
    /// Work per CPU-second: median of the last quarter of post-warm-up
    /// windows ÷ median of their first quarter.
    pub retained: f64,
    /// Work per CPU-second: 5th-percentile window ÷ median window after
    /// the warm-up.
    pub stability: f64,
    /// Median wall-clock I/Os per second of the first quarter after the
    /// wall figure's warm-up.
    pub iops_first: f64,
    /// Median wall-clock I/Os per second of the last quarter.
    pub iops_last: f64,
    /// Median I/Os per CPU-second of the first quarter after the warm-up.
    pub ops_per_cpu_s_first: f64,
    /// Median I/Os per CPU-second of the last quarter.
    pub ops_per_cpu_s_last: f64,
    /// `retained` on the wall-clock rate (what a co-runner also moves).
    pub retained_wall: f64,
    /// `stability` on the wall-clock rate.
    pub stability_wall: f64,
    /// The wall figure's warm-up, seconds.
    pub warmup_wall_s: f64,
    /// Whether the wall-clock rate settled within the first half.
    pub settled_wall: bool,
    /// The CPU floor: windows with less CPU time than this (a quarter of
    /// the run's median window) are merged with their neighbours.
    pub cpu_floor_s: f64,
    /// Windows below the CPU floor (merged, not counted on their own).
    pub cpu_merged_windows: usize,
}

impl AgingSummary {
    /// The figure of a run of `seconds` in windows of `window_s` seconds:
    /// `wall` is each window's wall-clock rate (I/Os per second), `work`
    /// its operations and the measured threads' CPU time; `run` names it
    /// in an error. Returns it with each window's rate per CPU-second.
    pub fn of(
        run: &str,
        wall: &[f64],
        work: &[WorkWindow],
        window_s: f64,
        seconds: f64,
    ) -> LabResult<(Self, Vec<f64>)> {
        let err = |source| LabError::Aging {
            run: run.to_string(),
            source,
        };
        let p = aging_params(seconds);
        let w = aging_figure(wall, window_s, &p).map_err(err)?;
        let r = cpu_rates(work, CPU_FLOOR_FRACTION).map_err(err)?;
        let c = aging_figure(&r.rates, window_s, &p).map_err(err)?;
        Ok((
            Self {
                warmup_s: c.warmup_s,
                settled: c.settled,
                retained: c.retained,
                stability: c.stability,
                iops_first: w.first,
                iops_last: w.last,
                ops_per_cpu_s_first: c.first,
                ops_per_cpu_s_last: c.last,
                retained_wall: w.retained,
                stability_wall: w.stability,
                warmup_wall_s: w.warmup_s,
                settled_wall: w.settled,
                cpu_floor_s: r.floor_s,
                cpu_merged_windows: r.merged,
            },
            r.rates,
        ))
    }

    /// No figure (every field NaN, null in JSON): the run failed too much
    /// of its work to have one.
    pub fn absent() -> Self {
        Self {
            warmup_s: f64::NAN,
            settled: false,
            retained: f64::NAN,
            stability: f64::NAN,
            iops_first: f64::NAN,
            iops_last: f64::NAN,
            ops_per_cpu_s_first: f64::NAN,
            ops_per_cpu_s_last: f64::NAN,
            retained_wall: f64::NAN,
            stability_wall: f64::NAN,
            warmup_wall_s: f64::NAN,
            settled_wall: false,
            cpu_floor_s: f64::NAN,
            cpu_merged_windows: 0,
        }
    }

    /// The cells under [`aging_columns`], rates divided by `scale`.
    pub fn cells(&self, scale: f64) -> [Cell; 7] {
        [
            self.warmup_s.into(),
            (self.ops_per_cpu_s_first / scale).into(),
            (self.ops_per_cpu_s_last / scale).into(),
            self.retained.into(),
            self.stability.into(),
            self.retained_wall.into(),
            self.stability_wall.into(),
        ]
    }
}

/// The paired figure's columns: retained and stability against the fresh
/// control arm (the headline of `lab iova-aging`), the ratio of the
/// arms' rates in the first and last quarter, and the fresh arm's own
/// retained (the machine's drift, which the aged arm's `retained` also
/// holds).
pub fn vs_fresh_columns() -> [Column; 6] {
    [
        Column::metric("retained_vs_fresh", "retained vs fresh", Unit::Ratio, 2),
        Column::metric("stability_vs_fresh", "stability vs fresh", Unit::Ratio, 2),
        Column::metric("vs_fresh_first", "aged/fresh first qtr", Unit::Ratio, 2),
        Column::metric("vs_fresh_last", "aged/fresh last qtr", Unit::Ratio, 2),
        Column::metric(
            "retained_fresh",
            "fresh arm retained (machine)",
            Unit::Ratio,
            2,
        ),
        Column::metric(
            "lowest_quarter_vs_fresh",
            "lowest qtr vs fresh",
            Unit::Ratio,
            2,
        ),
    ]
}

/// The aging figure against a fresh control arm (module docs), flattened
/// into a policy's row (the JSON keys are these fields' names).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct VsFresh {
    /// The headline: (aged ÷ fresh work per CPU-second), median of the
    /// last quarter ÷ median of the first quarter after the ratio's
    /// warm-up. A slowdown of the machine that hits both arms cancels; a
    /// slowdown of the aged allocator's own work lowers it.
    pub retained_vs_fresh: f64,
    /// 5th-percentile window ratio ÷ median window ratio after the warm-up.
    pub stability_vs_fresh: f64,
    /// Seconds of the ratio series discarded as warm-up.
    pub warmup_vs_fresh_s: f64,
    /// Whether the ratio settled within the first half of the run.
    pub settled_vs_fresh: bool,
    /// Median ratio (aged ÷ fresh) of the first quarter after the warm-up.
    pub vs_fresh_first: f64,
    /// Median ratio of the last quarter.
    pub vs_fresh_last: f64,
    /// The fresh arm's median operations per CPU-second in the first
    /// quarter (what the machine gave a fresh allocator then).
    pub fresh_ops_per_cpu_s_first: f64,
    /// The fresh arm's median in the last quarter.
    pub fresh_ops_per_cpu_s_last: f64,
    /// The fresh arm's own `retained`: its work per CPU-second, median of
    /// the last quarter ÷ median of the first quarter after its own
    /// warm-up, the aged arm's statistic (`AgingSummary::retained`) on a
    /// control that never ages: the machine's drift over the run, which
    /// the aged arm's `retained` also holds (module docs).
    pub retained_fresh: f64,
    /// The lowest of the four post-warm-up quarters' median aged ÷ fresh
    /// ratios: the aged arm's speed in its worst quarter as a fraction of
    /// a fresh arm's (a level, not a change from its first quarter),
    /// whatever it did after. A design that falls off a cliff and climbs back before the
    /// run ends has a last quarter near its first (so `retained_vs_fresh`
    /// near 1, or above it when the cliff began in the first quarter:
    /// `linux-2020` read 1.22 in a quick run where it spent the middle
    /// half at 0.01-0.05 of a fresh arm) but a lowest quarter far below.
    pub lowest_quarter_vs_fresh: f64,
}

/// Each window's rates and their ratio, as the paired figure takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedSeries {
    /// The aged arm's operations per CPU-second (CPU floor merged).
    pub aged: Vec<f64>,
    /// The fresh arm's.
    pub fresh: Vec<f64>,
    /// `aged / fresh`, window by window.
    pub ratio: Vec<f64>,
}

/// Both arms' work per CPU-second window by window (each with its own CPU
/// floor, [`cpu_rates`]) and their ratio. The two series must have one
/// window each per wall-clock window.
pub fn paired_ratios(
    aged: &[WorkWindow],
    fresh: &[WorkWindow],
) -> Result<PairedSeries, AgingError> {
    if aged.len() != fresh.len() {
        return Err(AgingError::BadValue {
            index: aged.len().min(fresh.len()),
            value: f64::NAN,
        });
    }
    let a = cpu_rates(aged, CPU_FLOOR_FRACTION)?.rates;
    let f = cpu_rates(fresh, CPU_FLOOR_FRACTION)?.rates;
    let mut ratio = Vec::with_capacity(a.len());
    for (i, (&x, &y)) in a.iter().zip(&f).enumerate() {
        if y <= 0.0 {
            return Err(AgingError::BadValue { index: i, value: y });
        }
        ratio.push(x / y);
    }
    Ok(PairedSeries {
        aged: a,
        fresh: f,
        ratio,
    })
}

impl PairedSeries {
    /// No series (`n` windows of NaN, null in JSON).
    pub fn absent(n: usize) -> Self {
        Self {
            aged: vec![f64::NAN; n],
            fresh: vec![f64::NAN; n],
            ratio: vec![f64::NAN; n],
        }
    }
}

/// The lowest median of the four quarters of `xs` (NaN when empty).
fn lowest_quarter_median(xs: &[f64]) -> f64 {
    let q = (xs.len() / 4).max(1);
    xs.chunks(q).take(4).map(median_of).fold(f64::NAN, f64::min)
}

fn median_of(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl VsFresh {
    /// The paired figure of a run of `seconds` in windows of `window_s`
    /// seconds: `aged` and `fresh` are each window's operations and CPU
    /// time of the two arms; `run` names it in an error. Returns it with
    /// the series it was taken on.
    pub fn of(
        run: &str,
        aged: &[WorkWindow],
        fresh: &[WorkWindow],
        window_s: f64,
        seconds: f64,
    ) -> LabResult<(Self, PairedSeries)> {
        let err = |source| LabError::Aging {
            run: run.to_string(),
            source,
        };
        let s = paired_ratios(aged, fresh).map_err(err)?;
        let p = aging_params(seconds);
        let f = aging_figure(&s.ratio, window_s, &p).map_err(err)?;
        let machine = aging_figure(&s.fresh, window_s, &p).map_err(err)?;
        let post = &s.fresh[f.warmup_windows..];
        let q = (post.len() / 4).max(1);
        let lowest_quarter = lowest_quarter_median(&s.ratio[f.warmup_windows.min(s.ratio.len())..]);
        Ok((
            Self {
                retained_vs_fresh: f.retained,
                stability_vs_fresh: f.stability,
                warmup_vs_fresh_s: f.warmup_s,
                settled_vs_fresh: f.settled,
                vs_fresh_first: f.first,
                vs_fresh_last: f.last,
                fresh_ops_per_cpu_s_first: median_of(&post[..q]),
                fresh_ops_per_cpu_s_last: median_of(&post[post.len() - q..]),
                retained_fresh: machine.retained,
                lowest_quarter_vs_fresh: lowest_quarter,
            },
            s,
        ))
    }

    /// [`of`](Self::of), or, where the series has no figure (the fresh arm
    /// ran in too few windows: a policy far slower than the windows are
    /// long), no figure ([`absent`](Self::absent), null in JSON) and `n`
    /// windows of NaN: the aged arm's own figures still stand.
    pub fn of_or_absent(
        aged: &[WorkWindow],
        fresh: &[WorkWindow],
        window_s: f64,
        seconds: f64,
    ) -> (Self, PairedSeries) {
        Self::of("", aged, fresh, window_s, seconds)
            .unwrap_or_else(|_| (Self::absent(), PairedSeries::absent(aged.len())))
    }

    /// No paired figure (every field NaN, null in JSON): the fresh arm ran
    /// in too few windows for one.
    pub fn absent() -> Self {
        Self {
            retained_vs_fresh: f64::NAN,
            stability_vs_fresh: f64::NAN,
            warmup_vs_fresh_s: f64::NAN,
            settled_vs_fresh: false,
            vs_fresh_first: f64::NAN,
            vs_fresh_last: f64::NAN,
            fresh_ops_per_cpu_s_first: f64::NAN,
            fresh_ops_per_cpu_s_last: f64::NAN,
            retained_fresh: f64::NAN,
            lowest_quarter_vs_fresh: f64::NAN,
        }
    }

    /// The cells under [`vs_fresh_columns`].
    pub fn cells(&self) -> [Cell; 6] {
        [
            self.retained_vs_fresh.into(),
            self.stability_vs_fresh.into(),
            self.vs_fresh_first.into(),
            self.vs_fresh_last.into(),
            self.retained_fresh.into(),
            self.lowest_quarter_vs_fresh.into(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_quarter_is_the_worst_quarters_median_whatever_came_after() {
        // Flat, a cliff in the second and third quarters, then back.
        let xs = [
            1.0, 1.1, 0.9, 1.0, 0.02, 0.01, 0.03, 0.02, 0.04, 0.05, 0.03, 0.04, 0.9, 1.0, 1.1, 1.0,
        ];
        assert_eq!(lowest_quarter_median(&xs), 0.02);
        assert_eq!(lowest_quarter_median(&[0.7, 0.8, 0.9, 1.0]), 0.7);
        assert!(lowest_quarter_median(&[]).is_nan());
    }

    /// `n` windows of 0.25 s of the threads' CPU each, at `rate(i)`
    /// operations per CPU-second in window `i`.
    fn arm(n: usize, rate: impl Fn(usize) -> f64) -> Vec<WorkWindow> {
        (0..n)
            .map(|i| WorkWindow {
                ops: rate(i) * 0.125,
                cpu_s: 0.125,
            })
            .collect()
    }

    /// The machine's speed per CPU-second in window `i`: full speed for
    /// the first half, then a co-runner's cache and sibling-thread
    /// pressure that comes and goes (0.55-0.75 of it), as on the shared
    /// 2-vCPU machine.
    fn machine(i: usize) -> f64 {
        if i < 16 {
            1.0
        } else {
            [0.6, 0.75, 0.55, 0.7][i % 4]
        }
    }

    #[test]
    fn a_machine_slowdown_that_hits_both_arms_does_not_move_the_figure() {
        let aged = arm(32, |i| 40e6 * machine(i));
        let fresh = arm(32, |i| 44e6 * machine(i));
        // The CPU-time figure of the aged arm alone calls the slowdown
        // aging.
        let (alone, _) = AgingSummary::of("t", &[1.0; 32], &aged, 0.25, 8.0).unwrap();
        assert!(alone.retained < 0.75, "{alone:?}");
        // Against the fresh arm it cancels.
        let (v, s) = VsFresh::of("t", &aged, &fresh, 0.25, 8.0).unwrap();
        assert!((v.retained_vs_fresh - 1.0).abs() < 1e-9, "{v:?}");
        assert!((v.stability_vs_fresh - 1.0).abs() < 1e-9, "{v:?}");
        assert!((v.vs_fresh_last - 40.0 / 44.0).abs() < 1e-9, "{v:?}");
        assert!(s.ratio.iter().all(|r| (r - 40.0 / 44.0).abs() < 1e-9));
        // And the fresh arm shows what the machine did: its own retained
        // is the aged arm's alone, 0.7 (the median of the last quarter's
        // 0.75, 0.55, 0.7, 0.6, 0.75, 0.55, 0.7 of full speed).
        assert!(
            v.fresh_ops_per_cpu_s_last < 0.8 * v.fresh_ops_per_cpu_s_first,
            "{v:?}"
        );
        assert!((v.retained_fresh - 0.7).abs() < 1e-9, "{v:?}");
        assert!((alone.retained - v.retained_fresh).abs() < 1e-9, "{v:?}");
    }

    #[test]
    fn a_slowdown_of_the_aged_arm_alone_is_aging_and_the_figure_falls() {
        // From window 16 each aged operation costs twice the CPU (a tree
        // walk); the fresh arm, renewed, does not.
        let aged_rate = |i: usize| if i < 16 { 40e6 } else { 20e6 };
        let (v, _) = VsFresh::of("t", &arm(32, aged_rate), &arm(32, |_| 44e6), 0.25, 8.0).unwrap();
        assert!((v.retained_vs_fresh - 0.5).abs() < 1e-9, "{v:?}");
        // The same with the machine slowing under both: still 0.5, not
        // the 0.3 the aged arm alone would read.
        let aged = arm(32, |i| aged_rate(i) * machine(i));
        let (alone, _) = AgingSummary::of("t", &[1.0; 32], &aged, 0.25, 8.0).unwrap();
        assert!(alone.retained < 0.4, "{alone:?}");
        let (v, _) = VsFresh::of("t", &aged, &arm(32, |i| 44e6 * machine(i)), 0.25, 8.0).unwrap();
        assert!((v.retained_vs_fresh - 0.5).abs() < 1e-9, "{v:?}");
        assert!((v.vs_fresh_last - 20.0 / 44.0).abs() < 1e-9, "{v:?}");
        // The aged arm alone: the machine's 0.7 times its own 0.5.
        assert!((v.retained_fresh - 0.7).abs() < 1e-9, "{v:?}");
        assert!((alone.retained - 0.35).abs() < 1e-9, "{alone:?}");
    }

    #[test]
    fn a_fresh_arm_too_thin_for_a_figure_gives_null_not_an_error() {
        // Two windows of eight held a fresh slice (a debug build of a slow
        // policy): the median window has no fresh CPU.
        let aged = arm(8, |_| 1e6);
        let mut fresh = vec![
            WorkWindow {
                ops: 0.0,
                cpu_s: 0.0
            };
            8
        ];
        fresh[3] = WorkWindow {
            ops: 1e4,
            cpu_s: 0.01,
        };
        assert!(matches!(
            VsFresh::of("t", &aged, &fresh, 0.15, 1.2),
            Err(LabError::Aging {
                source: AgingError::NoThroughput,
                ..
            })
        ));
        let (v, s) = VsFresh::of_or_absent(&aged, &fresh, 0.15, 1.2);
        assert!(v.retained_vs_fresh.is_nan() && !v.settled_vs_fresh);
        assert!(v.retained_fresh.is_nan());
        assert_eq!(s.ratio.len(), 8);
        assert_eq!(
            serde_json::to_value(v).unwrap()["retained_vs_fresh"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn arms_of_different_lengths_or_a_fresh_arm_that_never_ran_are_refused() {
        let a = arm(8, |_| 1.0);
        assert!(matches!(
            paired_ratios(&a, &a[..7]),
            Err(AgingError::BadValue { index: 7, .. })
        ));
        let idle = vec![
            WorkWindow {
                ops: 0.0,
                cpu_s: 0.0
            };
            8
        ];
        assert!(matches!(
            paired_ratios(&a, &idle),
            Err(AgingError::NoThroughput)
        ));
    }
}
