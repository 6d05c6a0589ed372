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
) -> LabResult<Vec<Measured>> {
    // The driver's waits for interrupts end when the interrupt comes,
    // not up to 50 us (Linux's default timer slack) later.
    // SAFETY: PR_SET_TIMERSLACK takes one integer and changes only the
    // calling thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
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
/// one's total, its `finish` included, in `rigs`' order.
pub(super) fn interleave<R: Sliced>(
    rigs: &mut [R],
    ios: u64,
    slice: u64,
) -> LabResult<Vec<Measured>> {
    let mut out = vec![Measured::default(); rigs.len()];
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
            out[i].add(&m);
        }
        left -= n;
        flip = !flip;
    }
    for (rig, m) in rigs.iter_mut().zip(&mut out) {
        m.add(&rig.finish()?);
    }
    Ok(out)
}

/// Every mode's rounds and their medians: `round` measures one round of
/// every mode (in [`Mode::ALL`]'s order), `rounds` times. Returns each
/// mode's seconds per round (for the spread and the physics checks) and
/// each mode's median round by seconds.
pub(super) fn median_rounds(
    rounds: u64,
    mut round: impl FnMut() -> LabResult<Vec<Measured>>,
) -> LabResult<(Vec<Vec<f64>>, Vec<Measured>)> {
    let mut per_mode: Vec<Vec<Measured>> = vec![Vec::new(); Mode::ALL.len()];
    for _ in 0..rounds {
        for (i, m) in round()?.into_iter().enumerate() {
            per_mode[i].push(m);
        }
    }
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
    Ok((secs, med))
}
