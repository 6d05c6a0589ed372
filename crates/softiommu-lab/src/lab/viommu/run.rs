//! One round of one back-end: the three modes interleaved.

use std::time::Duration;

use super::rig::Rig;
use super::{Mode, SLICE};
use crate::error::LabResult;

/// What one run (or slice of it) measured.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Measured {
    pub(super) secs: f64,
    pub(super) cpu_secs: f64,
    pub(super) wait_cpu_secs: f64,
    pub(super) requests: u64,
    pub(super) notifications: u64,
    pub(super) invalidations: u64,
    pub(super) held_ns: u64,
    pub(super) released: u64,
}

impl Measured {
    /// A slice that took `secs` of wall time and `cpu_secs` of the
    /// driver's CPU while the virtio-iommu's requests, notifications and
    /// invalidations counters went from `c0` to `c1`.
    pub(super) fn moved(secs: f64, cpu_secs: f64, c0: [u64; 3], c1: [u64; 3]) -> Self {
        Self {
            secs,
            cpu_secs,
            requests: c1[0] - c0[0],
            notifications: c1[1] - c0[1],
            invalidations: c1[2] - c0[2],
            ..Self::default()
        }
    }

    pub(super) fn add(&mut self, o: &Measured) {
        self.secs += o.secs;
        self.cpu_secs += o.cpu_secs;
        self.wait_cpu_secs += o.wait_cpu_secs;
        self.requests += o.requests;
        self.notifications += o.notifications;
        self.invalidations += o.invalidations;
        self.held_ns += o.held_ns;
        self.released += o.released;
    }
}

/// One round: each mode's total ([`Mode::ALL`]'s order) and the seconds
/// of each of its slices, in the order run (slice `j` of every mode ran
/// side by side, so their ratio is taken under one machine's conditions).
pub(super) type Round = (Vec<Measured>, Vec<Vec<f64>>);

/// One round of one back-end: the three modes on three machines built
/// side by side, `ios` reads each in slices of [`SLICE`] interleaved
/// (the order reversed every other slice), so what the machine's other
/// work does to one mode it does to the others. Returned in
/// [`Mode::ALL`]'s order.
pub(super) fn measure_round(
    hold: Option<Duration>,
    ios: u64,
    depth: usize,
    exit: Duration,
    bs: u64,
) -> LabResult<Round> {
    // The driver's waits for interrupts end when the interrupt comes,
    // not up to 50 us (Linux's default timer slack) later.
    softiommu_virtio::affinity::precise_timers();
    let mut rigs = Mode::ALL
        .iter()
        .map(|&m| Rig::new(m, hold, depth, exit, bs))
        .collect::<LabResult<Vec<_>>>()?;
    interleave(&mut rigs, ios, SLICE)
}

/// A machine of one mode that runs its workload in slices.
pub(super) trait Sliced {
    /// `n` I/Os, measured.
    fn slice(&mut self, n: u64) -> LabResult<Measured>;
    /// What is still held given back (lazy's last flush), measured: part
    /// of the work.
    fn finish(&mut self) -> LabResult<Measured>;
}

/// The modes' machines `rigs`, `ios` I/Os each in slices of `slice`
/// interleaved (the order reversed every other slice), so what the
/// machine's other work does to one mode it does to the others; each
/// one's total, its `finish` included, in `rigs`' order, and the seconds
/// of each of its slices (`finish` not included).
pub(super) fn interleave<R: Sliced>(rigs: &mut [R], ios: u64, slice: u64) -> LabResult<Round> {
    let mut out = vec![Measured::default(); rigs.len()];
    let mut slices: Vec<Vec<f64>> = vec![Vec::new(); rigs.len()];
    let (mut left, mut flip) = (ios, false);
    while left > 0 {
        let n = left.min(slice);
        let order: Vec<usize> = if flip {
            (0..rigs.len()).rev().collect()
        } else {
            (0..rigs.len()).collect()
        };
        for i in order {
            let m = rigs[i].slice(n)?;
            slices[i].push(m.secs);
            out[i].add(&m);
        }
        left -= n;
        flip = !flip;
    }
    for (rig, m) in rigs.iter_mut().zip(&mut out) {
        m.add(&rig.finish()?);
    }
    Ok((out, slices))
}

/// Min, median and max of one mode's throughput as % of none's over the
/// slices of every round, each slice against none's slice of the same
/// index and round (run beside it): how steady the row's `pct_of_none`
/// was within the run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct SliceSpread {
    pub(super) min: f64,
    pub(super) median: f64,
    pub(super) max: f64,
    /// Slices paired.
    pub(super) n: u64,
}

impl SliceSpread {
    /// The spread of `100 * none[j] / mode[j]` (seconds per slice of the
    /// same reads: the throughput ratio) over the pairs with both
    /// positive.
    pub(super) fn of(none: &[f64], mode: &[f64]) -> Self {
        let mut pct: Vec<f64> = none
            .iter()
            .zip(mode)
            .filter(|(n, m)| **n > 0.0 && **m > 0.0)
            .map(|(n, m)| 100.0 * n / m)
            .collect();
        if pct.is_empty() {
            return Self::default();
        }
        pct.sort_by(f64::total_cmp);
        let k = pct.len();
        let median = if k % 2 == 1 {
            pct[k / 2]
        } else {
            (pct[k / 2 - 1] + pct[k / 2]) / 2.0
        };
        Self {
            min: pct[0],
            median,
            max: pct[k - 1],
            n: k as u64,
        }
    }
}

/// What [`median_rounds`] gives: each mode's seconds per round, its
/// median round, its slice spread against none.
pub(super) type Medians = (Vec<Vec<f64>>, Vec<Measured>, Vec<SliceSpread>);

/// Every mode's rounds and their medians: `round` measures one round of
/// every mode (in [`Mode::ALL`]'s order), `rounds` times. Returns each
/// mode's seconds per round (for the spread and the physics checks),
/// each mode's median round by seconds, and each mode's slice spread
/// against none ([`SliceSpread`], over every round's slices).
pub(super) fn median_rounds(
    rounds: u64,
    mut round: impl FnMut() -> LabResult<Round>,
) -> LabResult<Medians> {
    let mut per_mode: Vec<Vec<Measured>> = vec![Vec::new(); Mode::ALL.len()];
    // Per mode, its slices' seconds over all rounds, and none's beside
    // them (a round's slices pair by index within the round).
    let mut paired: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); Mode::ALL.len()];
    for _ in 0..rounds {
        let (totals, slices) = round()?;
        for (i, m) in totals.into_iter().enumerate() {
            per_mode[i].push(m);
        }
        if let Some(none) = slices.first() {
            for (i, s) in slices.iter().enumerate() {
                let k = none.len().min(s.len());
                paired[i].0.extend_from_slice(&none[..k]);
                paired[i].1.extend_from_slice(&s[..k]);
            }
        }
    }
    let spread = paired
        .iter()
        .map(|(none, mode)| SliceSpread::of(none, mode))
        .collect();
    let secs = per_mode
        .iter()
        .map(|v| v.iter().map(|m| m.secs).collect())
        .collect();
    let med = per_mode
        .iter_mut()
        .map(|v| {
            v.sort_by(|a, b| a.secs.total_cmp(&b.secs));
            v[(v.len() - 1) / 2]
        })
        .collect();
    Ok((secs, med, spread))
}
