//! The typed result of `lab stress`, its JSON contract.

use serde::Serialize;

use super::device::*;

/// One phase's counters (a row of `policies`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseResult {
    /// The policy, or "switching".
    pub policy: String,
    /// Maps, unmaps and policy switches.
    pub ops: u64,
    /// Device accesses attempted (reads and writes of 8 bytes).
    pub device_accesses: u64,
    /// Accesses the unit refused.
    pub faults: u64,
    /// Successful accesses after the unmap returned that the deferred
    /// policy permits (before the covering flush, within the timeout).
    pub stale_accesses: u64,
    /// The oldest permitted stale access, microseconds after its unmap
    /// returned.
    pub max_stale_age_us: u64,
    /// Successful accesses the checker refused.
    pub violations: u64,
    /// Successful accesses through live mappings (or the domain's own
    /// bounce pool).
    pub legal: u64,
    /// Successful accesses not judged: the shadow's history no longer
    /// reached back far enough, or a deferred-stale access began inside the
    /// window and ended past it (its device thread off its CPU mid-access,
    /// so the checker cannot place the translation).
    pub unjudged: u64,
    /// The stale window the library itself measured (its longest flush
    /// wait, from queueing to the end of the invalidation), microseconds:
    /// the library's own bookkeeping, shown beside the checker's figure
    /// and never used by it.
    pub library_stale_window_us: u64,
    /// Seconds the phase ran.
    pub seconds: f64,
    /// The first violation, in full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_violation: Option<String>,
}

impl PhaseResult {
    pub(super) fn add(&mut self, o: &DeviceCounts) {
        self.device_accesses += o.accesses;
        self.faults += o.faults;
        self.stale_accesses += o.stale;
        self.max_stale_age_us = self.max_stale_age_us.max(o.max_stale_age_us);
        self.violations += o.violations;
        self.legal += o.legal;
        self.unjudged += o.unjudged;
        if self.first_violation.is_none() {
            self.first_violation.clone_from(&o.first_violation);
        }
    }
}

/// The JSON object `lab stress --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct StressReport {
    /// Always "stress".
    pub lab: &'static str,
    /// Every phase's operations.
    pub ops: u64,
    /// Every phase's device accesses.
    pub device_accesses: u64,
    /// Every phase's faults.
    pub faults: u64,
    /// Every phase's permitted stale accesses.
    pub stale_accesses: u64,
    /// The oldest permitted stale access of any phase, microseconds.
    pub max_stale_age_us: u64,
    /// Every phase's violations.
    pub violations: u64,
    /// Accesses not judged (history too short, or begun inside the stale
    /// window and ended past it).
    pub unjudged: u64,
    /// The deferred flush timeout in force, microseconds.
    pub flush_timeout_us: u64,
    /// The promised bound on a deferred unmap's stale window (flush
    /// timeout + 1 ms), microseconds: no access that begins later may
    /// succeed through the unmapped translation.
    pub bound_us: u64,
    /// Probes of the bound phase that began at least `bound_us` after
    /// their buffer's deferred unmap returned (0 without the phase).
    pub bound_probes: u64,
    /// The oldest probe of the bound phase, microseconds after its
    /// buffer's unmap returned, at the probe's start.
    pub bound_probe_max_age_us: u64,
    /// Busy processes run beside the bound phase.
    pub hogs: u64,
    /// The nice value the load threads ran at (`--load-nice`).
    pub load_nice: u64,
    /// Whether this was the quick form.
    pub quick: bool,
    /// The first violation of the run, in full (none: null).
    pub first_violation: Option<String>,
    /// One object per phase.
    pub policies: Vec<PhaseResult>,
}
