//! The aging figure of seed `004`'s experiment, defined so that a cold
//! start cannot fool it (both aging labs, `lab iova-aging` on the
//! allocator alone and `lab fio-aging` on the storage path, use it).
//!
//! Input: a run's throughput window by window (any rate: IOPS, Mops/s,
//! GB/s), all windows of the same length.
//!
//! 1. **Warm-up.** The run's start is discarded until throughput stops
//!    rising. Window `i` *has settled* when none of the next
//!    [`AgingParams::settle_windows`] windows is more than
//!    [`AgingParams::tolerance`] above it: `max(w[i+1..=i+K]) <= (1 + tol)
//!    × w[i]`, *and* its level (the median of `w[i..=i+K]`) is within
//!    [`AgingParams::level_tolerance`] of the median of the whole rest of
//!    the run, `w[i..]`. The second test catches a slow ramp: caches that
//!    fill over seconds raise throughput 1-2 % a window, which never rises
//!    10 % within three windows, yet ends 25 % above where it began
//!    (`lab iova-aging` on our allocator does this in some runs and not in
//!    others; without it two runs of one build disagreed by 0.09 on
//!    retained). The warm-up is the smallest `i` that has settled, but at
//!    least the floor (`ceil(floor_s / window_s)` windows, and never less
//!    than one: the first window holds the set-up and cold caches) and at
//!    most half the run (past that the run is reported as not settled and
//!    half is discarded). Only a *rise* is warm-up: a run that falls off
//!    a cliff, or ages slowly, has settled before it (its level is at or
//!    above the rest's median), so the fall stays in the figure.
//! 2. **Retained** = median of the last quarter of the post-warm-up
//!    windows ÷ median of their first quarter (a quarter is
//!    `max(1, n / 4)` windows). Medians, not single windows: one noisy
//!    window on a shared machine moves neither.
//! 3. **Stability** = the 5th-percentile window ÷ the median window over
//!    the post-warm-up run (nearest rank: the `ceil(0.05 n)`-th smallest).
//!
//! Pure arithmetic, no clock: the tests feed it synthetic series.
//!
//! # On CPU time
//!
//! Both labs feed it two series. The headline one is **work per
//! CPU-second** ([`cpu_rates`]): in each window, the operations the
//! measured threads completed ÷ the CPU time those threads used (their
//! thread CPU clocks), summed over the threads, so that a co-runner
//! taking a core away for part of a window lowers both and leaves the
//! rate, and only a real slowdown of the work (a tree walk, a cache
//! miss) lowers it. The other is the wall-clock rate (operations ÷ wall
//! seconds), kept beside it, which a shared machine's other load moves.
//!
//! A window in which the threads hardly ran has too little CPU time for
//! a rate (a few operations over a few microseconds): a window whose CPU
//! time is below [`CPU_FLOOR_FRACTION`] of the run's median window CPU
//! time is merged with the windows after it (with the one before, at the
//! run's end) until the group's CPU time reaches that floor, and every
//! window of the group carries the group's rate, so the series keeps one
//! value per wall-clock window and the warm-up floor and quarters stay in
//! wall seconds.

/// How the warm-up is found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgingParams {
    /// Seconds always discarded at the start (the floor).
    pub floor_s: f64,
    /// Windows after a candidate that must not rise above it.
    pub settle_windows: usize,
    /// How far above a candidate a later window may be and still count as
    /// settled (0.10: 10 %).
    pub tolerance: f64,
    /// How far a candidate's level (the median of it and the next
    /// `settle_windows` windows) may lie below the median of the rest of
    /// the run and still count as settled (0.03: 3 %).
    pub level_tolerance: f64,
}

impl Default for AgingParams {
    fn default() -> Self {
        Self {
            floor_s: 1.0,
            settle_windows: 3,
            tolerance: 0.10,
            level_tolerance: 0.03,
        }
    }
}

/// The aging figure of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgingFigure {
    /// Windows discarded as warm-up.
    pub warmup_windows: usize,
    /// Their length in seconds.
    pub warmup_s: f64,
    /// Whether throughput settled within the first half of the run.
    pub settled: bool,
    /// Windows after the warm-up.
    pub windows: usize,
    /// Median of the first quarter of those.
    pub first: f64,
    /// Median of their last quarter.
    pub last: f64,
    /// `last / first`.
    pub retained: f64,
    /// Median window after the warm-up.
    pub median: f64,
    /// 5th-percentile window after the warm-up.
    pub p5: f64,
    /// `p5 / median`.
    pub stability: f64,
}

/// Why a series has no figure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgingError {
    /// Fewer than four windows are left after the warm-up floor.
    #[error("{windows} windows, need at least {needed} (4 after a warm-up floor of {floor})")]
    TooFewWindows {
        /// Windows in the series.
        windows: usize,
        /// Windows needed.
        needed: usize,
        /// The floor in windows.
        floor: usize,
    },
    /// A window's throughput is negative or not a number, or the window
    /// length is not positive.
    #[error("window {index} is {value}: throughput must be a finite non-negative number")]
    BadValue {
        /// The window (or `usize::MAX` for the window length).
        index: usize,
        /// Its value.
        value: f64,
    },
    /// The first quarter's median (or the median) is zero: nothing ran.
    #[error("no throughput after the warm-up")]
    NoThroughput,
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The figure of `series` (throughput per window of `window_s` seconds).
pub fn aging_figure(
    series: &[f64],
    window_s: f64,
    p: &AgingParams,
) -> Result<AgingFigure, AgingError> {
    if !(window_s.is_finite() && window_s > 0.0) {
        return Err(AgingError::BadValue {
            index: usize::MAX,
            value: window_s,
        });
    }
    if let Some((index, &value)) = series
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
    {
        return Err(AgingError::BadValue { index, value });
    }
    let n = series.len();
    let floor = ((p.floor_s.max(0.0) / window_s).ceil() as usize).max(1);
    if n < floor + 4 {
        return Err(AgingError::TooFewWindows {
            windows: n,
            needed: floor + 4,
            floor,
        });
    }
    let cap = (n / 2).max(floor).min(n - 4);
    let k = p.settle_windows.max(1);
    // The rest of the run, `series[i..]`, kept sorted as `i` advances (one
    // sort and a removal per candidate: 10,000 windows take milliseconds).
    let mut rest = sorted(&series[floor..]);
    let mut found = None;
    for i in floor..=cap {
        let next = &series[i + 1..(i + 1 + k).min(n)];
        if next.iter().all(|&x| x <= (1.0 + p.tolerance) * series[i]) {
            let level = median(&sorted(&series[i..(i + 1 + k).min(n)]));
            if level >= (1.0 - p.level_tolerance) * median(&rest) {
                found = Some(i);
                break;
            }
        }
        if let Ok(at) = rest.binary_search_by(|x| x.total_cmp(&series[i])) {
            rest.remove(at);
        }
    }
    let warmup = found.unwrap_or(cap);
    let post = &series[warmup..];
    let q = (post.len() / 4).max(1);
    let first = median(&sorted(&post[..q]));
    let last = median(&sorted(&post[post.len() - q..]));
    let all = sorted(post);
    let med = median(&all);
    let rank = ((0.05 * all.len() as f64).ceil() as usize).clamp(1, all.len());
    let p5 = all[rank - 1];
    if first <= 0.0 || med <= 0.0 {
        return Err(AgingError::NoThroughput);
    }
    Ok(AgingFigure {
        warmup_windows: warmup,
        warmup_s: warmup as f64 * window_s,
        settled: found.is_some(),
        windows: post.len(),
        first,
        last,
        retained: last / first,
        median: med,
        p5,
        stability: p5 / med,
    })
}

/// The share of the run's median per-window CPU time below which a
/// window is merged with its neighbours (see the module docs): a quarter,
/// so a window in which the threads got a quarter of their usual CPU still
/// stands alone (a co-runner on every core leaves them a half or more),
/// and one in which they were off the CPU nearly the whole window does
/// not.
pub const CPU_FLOOR_FRACTION: f64 = 0.25;

/// One window of work as the CPU-time figure sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkWindow {
    /// Operations the measured threads completed in the window.
    pub ops: f64,
    /// CPU seconds those threads used in the window, summed.
    pub cpu_s: f64,
}

/// Work per CPU-second, window by window, with the windows below the CPU
/// floor merged.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuRates {
    /// Operations per CPU-second, one value per input window.
    pub rates: Vec<f64>,
    /// Windows whose CPU time was below the floor (merged with others).
    pub merged: usize,
    /// The floor, in CPU seconds.
    pub floor_s: f64,
}

/// Operations per CPU-second of `windows` (see the module docs), windows
/// with less than `floor_fraction` of the median window CPU time merged.
pub fn cpu_rates(windows: &[WorkWindow], floor_fraction: f64) -> Result<CpuRates, AgingError> {
    for (index, w) in windows.iter().enumerate() {
        for value in [w.ops, w.cpu_s] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(AgingError::BadValue { index, value });
            }
        }
    }
    if !(floor_fraction.is_finite() && (0.0..=1.0).contains(&floor_fraction)) {
        return Err(AgingError::BadValue {
            index: usize::MAX,
            value: floor_fraction,
        });
    }
    let cpu: Vec<f64> = windows.iter().map(|w| w.cpu_s).collect();
    let floor = floor_fraction * median(&sorted(&cpu));
    if windows.is_empty() || median(&sorted(&cpu)) <= 0.0 {
        return Err(AgingError::NoThroughput);
    }
    // Groups of consecutive windows, each reaching the floor (but a
    // trailing one, folded into the group before it).
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut start = 0;
    let mut acc = 0.0;
    for (i, w) in windows.iter().enumerate() {
        acc += w.cpu_s;
        if acc >= floor && acc > 0.0 {
            groups.push((start, i + 1));
            start = i + 1;
            acc = 0.0;
        }
    }
    if start < windows.len() {
        match groups.last_mut() {
            Some(last) => last.1 = windows.len(),
            None => groups.push((0, windows.len())),
        }
    }
    let mut rates = vec![0.0; windows.len()];
    let mut merged = 0;
    for &(a, b) in &groups {
        let g = &windows[a..b];
        let ops: f64 = g.iter().map(|w| w.ops).sum();
        let cpu_s: f64 = g.iter().map(|w| w.cpu_s).sum();
        let rate = if cpu_s > 0.0 { ops / cpu_s } else { 0.0 };
        rates[a..b].fill(rate);
        merged += g.iter().filter(|w| w.cpu_s < floor).count();
    }
    Ok(CpuRates {
        rates,
        merged,
        floor_s: floor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: AgingParams = AgingParams {
        floor_s: 1.0,
        settle_windows: 3,
        tolerance: 0.10,
        level_tolerance: 0.03,
    };

    /// A deterministic ±`amp` noise around 1.
    fn noise(n: usize, amp: f64) -> Vec<f64> {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                1.0 + amp * ((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
            })
            .collect()
    }

    #[test]
    fn a_cold_start_is_discarded_and_does_not_inflate_retained() {
        // Last ÷ first window would say 3.3: the old figure's swing.
        let mut s = vec![0.3, 0.55, 0.8, 0.95];
        s.extend(noise(28, 0.03));
        let f = aging_figure(&s, 1.0, &P).unwrap();
        assert!(f.settled);
        assert_eq!(f.warmup_windows, 3, "0.95 is within 10 % of what follows");
        assert_eq!(f.warmup_s, 3.0);
        assert!((f.retained - 1.0).abs() < 0.05, "{f:?}");
        assert!(f.stability > 0.9, "{f:?}");
    }

    #[test]
    fn a_cliff_stays_in_the_figure() {
        let mut s = vec![1.0; 14];
        s.extend(vec![0.25; 6]);
        let f = aging_figure(&s, 0.5, &P).unwrap();
        assert_eq!(f.warmup_windows, 2, "the floor: 1 s of 0.5 s windows");
        assert!(f.settled);
        assert!((f.retained - 0.25).abs() < 1e-9, "{f:?}");
        assert!((f.first, f.last) == (1.0, 0.25));
        // Most windows are fast: the slow tail is what stability sees.
        assert!(f.stability < 0.3, "{f:?}");
        // A cliff right after the floor is not taken for warm-up.
        let mut s = vec![1.0; 3];
        s.extend(vec![0.3; 17]);
        let f = aging_figure(&s, 1.0, &P).unwrap();
        assert_eq!(f.warmup_windows, 1);
        // The first quarter straddles the cliff; still under the seed's 0.5.
        assert!(f.retained < 0.5, "{f:?}");
    }

    #[test]
    fn a_slow_ramp_is_warm_up_too() {
        // Caches filling over seconds: +1.5 % a window for 16 windows, then
        // flat with noise. No three windows rise 10 %, so the first test
        // alone took the floor as settled and said retained 1.1.
        let mut s: Vec<f64> = (0..16).map(|i| 55.0 * 1.015f64.powi(i)).collect();
        let top = s[15];
        s.extend(noise(16, 0.03).into_iter().map(|x| x * top));
        let local_only = AgingParams {
            level_tolerance: f64::INFINITY,
            ..P
        };
        let fooled = aging_figure(&s, 0.25, &local_only).unwrap();
        assert_eq!(fooled.warmup_windows, 4, "{fooled:?}");
        assert!(fooled.retained > 1.08, "{fooled:?}");
        let f = aging_figure(&s, 0.25, &P).unwrap();
        assert!(f.settled);
        assert!(
            (9..16).contains(&f.warmup_windows),
            "ends on the ramp's last 5 %: {f:?}"
        );
        assert!((f.retained - 1.0).abs() < 0.05, "{f:?}");
        // A slow fall is aging, never warm-up: the floor only.
        let fall: Vec<f64> = (0..32).map(|i| 1.0 - 0.015 * i as f64).collect();
        let g = aging_figure(&fall, 0.25, &P).unwrap();
        assert_eq!(g.warmup_windows, 4);
        assert!(g.retained < 0.75, "{g:?}");
    }

    #[test]
    fn flat_noise_is_retained_and_stable() {
        let s = noise(40, 0.05);
        let f = aging_figure(&s, 0.25, &P).unwrap();
        // The floor, or a window or two past it where four windows' median
        // happens to dip 3 % under the rest: the price of catching ramps.
        assert!((4..=6).contains(&f.warmup_windows), "{f:?}");
        assert!(f.settled);
        assert!((f.retained - 1.0).abs() < 0.08, "{f:?}");
        assert!(f.stability > 0.9 && f.stability <= 1.0, "{f:?}");
        // The same series cut differently gives nearly the same figure:
        // medians, not single windows.
        let g = aging_figure(&s[1..], 0.25, &P).unwrap();
        assert!((f.retained - g.retained).abs() < 0.05);
    }

    #[test]
    fn a_run_that_never_settles_discards_half_and_says_so() {
        let s: Vec<f64> = (1..=20).map(|i| i as f64 * i as f64).collect();
        let f = aging_figure(&s, 1.0, &P).unwrap();
        assert!(!f.settled);
        assert_eq!(f.warmup_windows, 10);
        // The worst case for the search, at the labs' largest window count:
        // a slow climb that passes the local test and fails the level test
        // at every candidate.
        let s: Vec<f64> = (0..10_000).map(|i| 1.0 + i as f64 * 1e-3).collect();
        let f = aging_figure(&s, 0.01, &P).unwrap();
        assert!(!f.settled);
        assert_eq!(f.warmup_windows, 5_000);
    }

    #[test]
    fn bad_series_are_refused() {
        assert!(matches!(
            aging_figure(&[1.0; 4], 1.0, &P),
            Err(AgingError::TooFewWindows {
                windows: 4,
                needed: 5,
                floor: 1
            })
        ));
        assert!(matches!(
            aging_figure(&[1.0, 1.0, f64::NAN, 1.0, 1.0, 1.0], 1.0, &P),
            Err(AgingError::BadValue { index: 2, .. })
        ));
        assert!(matches!(
            aging_figure(&[1.0; 8], 0.0, &P),
            Err(AgingError::BadValue { .. })
        ));
        assert!(matches!(
            aging_figure(&[0.0; 8], 1.0, &P),
            Err(AgingError::NoThroughput)
        ));
    }

    /// `n` windows of `wall_s` each in which the threads did `rate` ops per
    /// CPU-second while on the CPU a `share` of the time.
    fn windows(n: usize, wall_s: f64, rate: f64, share: f64) -> Vec<WorkWindow> {
        (0..n)
            .map(|_| WorkWindow {
                ops: rate * wall_s * share,
                cpu_s: wall_s * share,
            })
            .collect()
    }

    fn wall(ws: &[WorkWindow], wall_s: f64) -> Vec<f64> {
        ws.iter().map(|w| w.ops / wall_s).collect()
    }

    #[test]
    fn a_descheduled_window_keeps_its_rate_per_cpu_second_and_is_not_aging() {
        // 32 windows of 0.25 s at 1 M ops per CPU-second; from window 16 a
        // co-runner takes half the core (the threads run half of each
        // window, at the same speed while they run).
        let mut ws = windows(16, 0.25, 1e6, 1.0);
        ws.extend(windows(16, 0.25, 1e6, 0.5));
        // The wall-clock figure (the old one) calls that aging: 0.5.
        let old = aging_figure(&wall(&ws, 0.25), 0.25, &P).unwrap();
        assert!((old.retained - 0.5).abs() < 1e-9, "{old:?}");
        // Per CPU-second nothing changed.
        let r = cpu_rates(&ws, CPU_FLOOR_FRACTION).unwrap();
        assert_eq!(r.merged, 0, "half a window is above the floor");
        assert!(r.rates.iter().all(|&x| (x - 1e6).abs() < 1e-3), "{r:?}");
        let f = aging_figure(&r.rates, 0.25, &P).unwrap();
        assert!((f.retained - 1.0).abs() < 1e-9, "{f:?}");
        assert!((f.stability - 1.0).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn a_slowdown_per_cpu_second_is_aging() {
        // The threads keep the whole core, but from window 16 each
        // operation costs twice the CPU (a tree walk): that is aging.
        let mut ws = windows(16, 0.25, 1e6, 1.0);
        ws.extend(windows(16, 0.25, 0.5e6, 1.0));
        let f = aging_figure(&cpu_rates(&ws, CPU_FLOOR_FRACTION).unwrap().rates, 0.25, &P).unwrap();
        assert!((f.retained - 0.5).abs() < 1e-9, "{f:?}");
        // And a co-runner on top of it does not hide it or deepen it.
        let mut ws = windows(16, 0.25, 1e6, 0.6);
        ws.extend(windows(16, 0.25, 0.5e6, 0.45));
        let f = aging_figure(&cpu_rates(&ws, CPU_FLOOR_FRACTION).unwrap().rates, 0.25, &P).unwrap();
        assert!((f.retained - 0.5).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn windows_below_the_cpu_floor_are_merged_not_noise() {
        // Two windows in which the threads hardly ran, and whose few
        // operations, counted a moment apart from the clocks, make a wild
        // rate (10x and 0) on their own.
        let mut ws = windows(32, 0.25, 1e6, 1.0);
        ws[20] = WorkWindow {
            ops: 2_000.0,
            cpu_s: 0.0002,
        };
        ws[21] = WorkWindow {
            ops: 0.0,
            cpu_s: 0.0001,
        };
        let r = cpu_rates(&ws, CPU_FLOOR_FRACTION).unwrap();
        assert_eq!(r.merged, 2);
        assert!((r.floor_s - 0.0625).abs() < 1e-12);
        // Windows 20 and 21 merge with 22: one group, one rate, close to
        // the run's own.
        assert_eq!(r.rates[20], r.rates[22]);
        assert_eq!(r.rates[21], r.rates[22]);
        assert!((r.rates[22] / 1e6 - 1.0).abs() < 0.01, "{r:?}");
        let f = aging_figure(&r.rates, 0.25, &P).unwrap();
        assert!(f.stability > 0.99, "{f:?}");
        // Without the floor window 21 alone would read 0 and window 20 10x.
        let raw = cpu_rates(&ws, 0.0).unwrap();
        assert_eq!(raw.rates[21], 0.0);
        assert!(raw.rates[20] > 9e6);
        // A trailing window below the floor joins the group before it.
        let mut ws = windows(8, 0.25, 1e6, 1.0);
        ws.push(WorkWindow {
            ops: 1.0,
            cpu_s: 1e-6,
        });
        let r = cpu_rates(&ws, CPU_FLOOR_FRACTION).unwrap();
        assert_eq!(r.merged, 1);
        assert_eq!(r.rates[8], r.rates[7]);
    }

    #[test]
    fn bad_work_windows_are_refused() {
        let w = |ops, cpu_s| WorkWindow { ops, cpu_s };
        assert!(matches!(
            cpu_rates(&[w(1.0, 1.0), w(f64::NAN, 1.0)], 0.25),
            Err(AgingError::BadValue { index: 1, .. })
        ));
        assert!(matches!(
            cpu_rates(&[w(1.0, -1.0)], 0.25),
            Err(AgingError::BadValue { index: 0, .. })
        ));
        assert!(matches!(
            cpu_rates(&[w(1.0, 1.0)], 2.0),
            Err(AgingError::BadValue {
                index: usize::MAX,
                ..
            })
        ));
        assert!(matches!(
            cpu_rates(&[w(0.0, 0.0); 4], 0.25),
            Err(AgingError::NoThroughput)
        ));
        assert!(matches!(
            cpu_rates(&[], 0.25),
            Err(AgingError::NoThroughput)
        ));
    }
}
