//! Policies, directions and the run-time tunables of the deferred policy.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// How a domain pays for protection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DmaPolicy {
    /// Identity: the DMA address is the physical address, the device's
    /// context is pass-through; no protection. The baseline.
    Passthrough,
    /// Every unmap invalidates and waits before its IOVA and table pages
    /// are freed.
    Strict,
    /// Unmaps clear the PTEs and queue the IOVA on this CPU's flush queue;
    /// a flush (high-water mark or timeout) invalidates each unit the domain spans
    /// once, waits once, then frees the batch. Linux's "lazy" (seed `000`).
    Deferred,
    /// For untrusted devices: data is copied through bounce slots of whole
    /// pages, mapped only while their mapping lives; the device never sees
    /// a page it was not given, and in its pages only the buffer's bytes
    /// and zeroes (sub-page isolation). Unmaps of bounce slots are strict.
    Bounce,
}

impl DmaPolicy {
    /// Every policy, in the order reports list them.
    pub const ALL: [DmaPolicy; 4] = [
        DmaPolicy::Passthrough,
        DmaPolicy::Strict,
        DmaPolicy::Deferred,
        DmaPolicy::Bounce,
    ];

    /// The name reports and the CLI use.
    pub fn name(self) -> &'static str {
        match self {
            DmaPolicy::Passthrough => "passthrough",
            DmaPolicy::Strict => "strict",
            DmaPolicy::Deferred => "deferred",
            DmaPolicy::Bounce => "bounce",
        }
    }

    /// Parses a name printed by [`name`](Self::name).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether DMA goes through the page tables.
    pub fn is_translated(self) -> bool {
        self != DmaPolicy::Passthrough
    }

    #[inline]
    pub(crate) const fn to_u8(self) -> u8 {
        self as u8
    }

    #[inline]
    pub(crate) fn from_u8(v: u8) -> Self {
        match v {
            0 => DmaPolicy::Passthrough,
            1 => DmaPolicy::Strict,
            2 => DmaPolicy::Deferred,
            _ => DmaPolicy::Bounce,
        }
    }
}

impl std::fmt::Display for DmaPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which way the data moves, as the DMA API's `dma_data_direction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DmaDirection {
    /// The device reads the buffer (transmit): mapped read-only.
    ToDevice,
    /// The device writes the buffer (receive): mapped write-only.
    FromDevice,
    /// Both.
    Bidirectional,
}

impl DmaDirection {
    /// The page-table permission the device needs.
    pub fn perm(self) -> crate::pgtable::Perm {
        use crate::pgtable::Perm;
        match self {
            DmaDirection::ToDevice => Perm::READ,
            DmaDirection::FromDevice => Perm::WRITE,
            DmaDirection::Bidirectional => Perm::RW,
        }
    }
}

/// The deferred policy's queue size (entries per CPU), fixed when a CPU's
/// queue is made: Linux's `IOVA_FQ_SIZE`, 256.
pub const DEFAULT_FQ_SIZE: usize = 256;
/// The default high-water mark: a full queue (Linux); seed `000` used 250.
pub const DEFAULT_HIGH_WATER: usize = 256;
/// The default timeout: Linux's `IOVA_FQ_TIMEOUT`, 10 ms (seed `000`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(10);

/// The tunables a domain reads at run time; every one can change while
/// mappings are live.
#[derive(Debug)]
pub struct Tunables {
    pub(crate) policy: AtomicU8,
    pub(crate) high_water: AtomicUsize,
    pub(crate) timeout_ns: AtomicU64,
    pub(crate) fq_size: AtomicUsize,
}

impl Tunables {
    pub(crate) fn new(policy: DmaPolicy) -> Self {
        Self {
            policy: AtomicU8::new(policy.to_u8()),
            high_water: AtomicUsize::new(DEFAULT_HIGH_WATER),
            timeout_ns: AtomicU64::new(DEFAULT_TIMEOUT.as_nanos() as u64),
            fq_size: AtomicUsize::new(DEFAULT_FQ_SIZE),
        }
    }

    /// The policy in force.
    #[inline]
    pub fn policy(&self) -> DmaPolicy {
        DmaPolicy::from_u8(self.policy.load(Relaxed))
    }

    /// Whether the policy in force is pass-through (one load and compare:
    /// the map and unmap fast paths ask it).
    #[inline]
    pub(crate) fn is_passthrough(&self) -> bool {
        self.policy.load(Relaxed) == DmaPolicy::Passthrough.to_u8()
    }

    /// Whether the policy in force is strict or deferred (one load and
    /// compare: the map's inline translated path asks it).
    #[inline]
    pub(crate) fn is_strict_or_deferred(&self) -> bool {
        self.policy
            .load(Relaxed)
            .wrapping_sub(DmaPolicy::Strict.to_u8())
            < 2
    }

    /// Whether the policy in force is deferred (one load and compare: the
    /// unmap's inline deferred path asks it).
    #[inline]
    pub(crate) fn is_deferred(&self) -> bool {
        self.policy.load(Relaxed) == DmaPolicy::Deferred.to_u8()
    }

    /// Entries that trigger a flush of a CPU's queue.
    pub fn high_water(&self) -> usize {
        self.high_water.load(Relaxed)
    }

    /// The longest an unmapped buffer may stay reachable in deferred mode:
    /// the bound the stale window is held to.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Relaxed))
    }

    /// The age at which a queue's owner flushes it on its own, at its next
    /// unmaps: half the [`timeout`](Self::timeout). A queue whose owner
    /// keeps unmapping never waits for the flush timer (no wake-up), and
    /// its flushes complete within the timeout, the other half absorbing
    /// a busy core's scheduling delay. Under load the high-water mark
    /// flushes long before either.
    pub fn flush_after(&self) -> Duration {
        self.timeout() / 2
    }

    /// How often the flush timer fires while anything is queued and the
    /// owners do not flush on their own (while they do, every other
    /// period; see the timer's module): once per
    /// [`timeout`](Self::timeout), as Linux's flush-queue timer does
    /// (`fq_flush_timeout`, armed for `IOVA_FQ_TIMEOUT`, 10 ms, by the
    /// first entry queued and flushing every queue when it fires), so a
    /// domain's timer wakes at most about 100 times a second under steady
    /// traffic at the default timeout (50 while the owners flush on their
    /// own). An entry queued just after a round waits for the next one, a
    /// period later (two while the owners flush on their own): its invalidation then
    /// completes past the timeout by the round's latency, but its stale
    /// window has ended before, at its expiry deadline, three quarters of
    /// the timeout after its unmap (see `DmaDomain::expiry_period`).
    pub fn timer_period(&self) -> Duration {
        self.timeout()
    }

    /// The array size of queues made from now on.
    pub fn fq_size(&self) -> usize {
        self.fq_size.load(Relaxed)
    }
}
