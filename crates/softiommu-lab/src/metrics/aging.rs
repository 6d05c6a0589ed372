//! The aging figure as both aging labs report it: the statistic
//! (`softiommu_virtio::workload::aging`, one copy, where the fio engine's
//! time line is built) taken on work per CPU-second with the wall-clock
//! figure beside it, its JSON fields and its table columns.

use serde::Serialize;
pub use softiommu_virtio::workload::aging::WorkWindow;
use softiommu_virtio::workload::aging::{aging_figure, cpu_rates, AgingParams, CPU_FLOOR_FRACTION};

use crate::error::{LabError, LabResult};
use crate::report::{Cell, Column, Unit};

/// The aging figure's parameters for a run of `seconds`: the 1 s warm-up
/// floor, or a quarter of a shorter run.
fn aging_params(seconds: f64) -> AgingParams {
    let d = AgingParams::default();
    AgingParams {
        floor_s: d.floor_s.min(seconds / 4.0),
        ..d
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
