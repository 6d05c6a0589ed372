//! One emulated IOMMU unit (a VT-d DMA-remapping hardware unit): its
//! configuration, its state, contexts, translators and statistics.
//!
//! The driver-side queue operations are in `submit`, the unit's processing
//! of the queue in `processor`, translation in `translator`.

use crate::sync::lock_std as lock;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::claims::{Claims, DomainIdClaim};
use super::context::{self, ContextEntry, ContextTable, SourceId};
use super::descriptor::{ContextScope, InvDescriptor, Limits};
use super::epoch::Slots;
use super::error::{HwError, QiError};
use super::fault::FaultLog;
use super::inv_queue::{InvQueue, QueueFault, MAX_QUEUE_ORDER};
use super::iotlb::{Iotlb, IotlbConfig};
use super::latency::{LatencyModel, LiveLatency};
use super::submit::Limit;
use crate::mem::{PhysAddr, PhysMemory, PAGE_SIZE};
use crate::sync::barrier::{Barrier, DrainBarrier};
use std::time::Duration;

/// The default longest access, 1 MiB: 256 page lookups at 4 KiB, a few
/// microseconds of section; larger than any single DMA segment Linux's
/// block and network stacks build by default (64 KiB `max_segment_size`).
pub const DEFAULT_MAX_ACCESS_BYTES: u64 = 1 << 20;

/// The most translators a unit can have at once.
pub const MAX_TRANSLATORS: usize = 1 << 16;

/// Who carries out the invalidation queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QueueMode {
    /// The submitting thread, under the unit's processing lock, right after
    /// it rings the doorbell.
    #[default]
    Inline,
    /// A thread of the unit's own, woken by the doorbell.
    Thread,
}

/// How a unit is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnitConfig {
    /// The IOTLB's shape.
    pub iotlb: IotlbConfig,
    /// log2 of the number of domain ids (VT-d `CAP.ND` gives 4 + 2·ND); at
    /// most 16.
    pub domain_bits: u32,
    /// The largest page-selective address mask (VT-d `CAP.MAMV`), at most
    /// 63. The default, 18, lets one descriptor cover a 1 GiB leaf.
    pub max_address_mask: u8,
    /// The invalidation queue holds 256 << `queue_order` descriptors
    /// (`IQA_REG.QS`, at most 7).
    pub queue_order: u32,
    /// Who processes the queue.
    pub queue_mode: QueueMode,
    /// Fault records held before the log overflows.
    pub fault_log_capacity: usize,
    /// Translators that may exist at once (their slots are allocated in
    /// chunks of 64 as threads ask for them; at most 65,536).
    pub max_translators: usize,
    /// The page request queue holds 128 << `prq_order` descriptors
    /// (`PQA_REG.PQS`, at most 7; Linux's 4 gives 2,048).
    pub prq_order: u32,
    /// How long a device waits for the answer to a page request before the
    /// unit answers it `Invalid` itself (a handler that stopped answering).
    pub page_response_timeout: std::time::Duration,
    /// The longest access one translation serves (bytes): a longer one
    /// faults with `TooLong`, so that the work a device can make the unit
    /// do inside one section — which every invalidation wait may have to
    /// wait for — is bounded. At least 4 KiB, at most 1 GiB.
    pub max_access_bytes: u64,
    /// Modelled hardware latencies.
    pub latency: LatencyModel,
    /// The fence pair of the drain protocol.
    pub drain_barrier: DrainBarrier,
}

impl Default for UnitConfig {
    fn default() -> Self {
        Self {
            iotlb: IotlbConfig::default(),
            domain_bits: 16,
            max_address_mask: 18,
            queue_order: 0,
            queue_mode: QueueMode::Inline,
            fault_log_capacity: 256,
            max_translators: 4096,
            max_access_bytes: DEFAULT_MAX_ACCESS_BYTES,
            prq_order: super::prq::DEFAULT_PRQ_ORDER,
            page_response_timeout: std::time::Duration::from_secs(1),
            latency: LatencyModel::zero(),
            drain_barrier: DrainBarrier::Auto,
        }
    }
}

impl UnitConfig {
    fn check(&self) -> Result<(), HwError> {
        let bad = |field, value: u64| Err(HwError::InvalidConfig { field, value });
        if !self.iotlb.is_valid() {
            return if self.iotlb.sets.is_power_of_two() {
                bad("iotlb.ways", self.iotlb.ways as u64)
            } else {
                bad("iotlb.sets", self.iotlb.sets as u64)
            };
        }
        if self.domain_bits > 16 {
            return bad("domain_bits", u64::from(self.domain_bits));
        }
        if self.max_address_mask > 63 {
            return bad("max_address_mask", u64::from(self.max_address_mask));
        }
        if self.queue_order > MAX_QUEUE_ORDER {
            return bad("queue_order", u64::from(self.queue_order));
        }
        if self.fault_log_capacity == 0 {
            return bad("fault_log_capacity", 0);
        }
        if !(1..=MAX_TRANSLATORS).contains(&self.max_translators) {
            return bad("max_translators", self.max_translators as u64);
        }
        if !(PAGE_SIZE..=1 << 30).contains(&self.max_access_bytes) {
            return bad("max_access_bytes", self.max_access_bytes);
        }
        if self.prq_order > super::prq::MAX_PRQ_ORDER {
            return bad("prq_order", u64::from(self.prq_order));
        }
        if self.page_response_timeout.is_zero()
            || self.page_response_timeout > std::time::Duration::from_secs(3600)
        {
            return bad(
                "page_response_timeout",
                u64::try_from(self.page_response_timeout.as_nanos()).unwrap_or(u64::MAX),
            );
        }
        Ok(())
    }
}

/// Counters of the unit's slow paths (queue, drain), Relaxed atomics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) descriptors: AtomicU64,
    pub(crate) context_invalidations: AtomicU64,
    pub(crate) iotlb_global: AtomicU64,
    pub(crate) iotlb_domain: AtomicU64,
    pub(crate) iotlb_pages: AtomicU64,
    pub(crate) entries_cleared: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) completion_events: AtomicU64,
    pub(crate) drains: AtomicU64,
    pub(crate) drain_waited: AtomicU64,
    pub(crate) drain_ns: AtomicU64,
    pub(crate) drain_stalls: AtomicU64,
    pub(crate) modelled_ns: AtomicU64,
    pub(crate) queue_errors: AtomicU64,
    pub(crate) bypass_revocations: AtomicU64,
    pub(crate) fenced_sections: AtomicU64,
    /// Inline passes' CPU charged to the unit (see `pass_cpu`).
    pub(crate) inline_pass_cpu_ns: AtomicU64,
    /// Inline passes with work run with accounting on.
    pub(crate) inline_passes: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        if n != 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// A snapshot of a unit's counters. Translation counts are per translator
/// ([`Translator::stats`](super::Translator::stats)): keeping them here would put a shared write on
/// every translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnitStats {
    /// Descriptors carried out.
    pub descriptors: u64,
    /// Context-cache invalidations carried out.
    pub context_invalidations: u64,
    /// Global IOTLB invalidations.
    pub iotlb_global: u64,
    /// Domain-selective IOTLB invalidations.
    pub iotlb_domain: u64,
    /// Page-selective IOTLB invalidations.
    pub iotlb_pages: u64,
    /// IOTLB entries cleared by page-selective invalidations.
    pub entries_cleared: u64,
    /// Wait descriptors completed.
    pub waits: u64,
    /// Waits with IF set (completion events).
    pub completion_events: u64,
    /// Drains run (waits that followed an invalidation).
    pub drains: u64,
    /// Translator sections a drain found active and waited for.
    pub drain_waited: u64,
    /// Real time spent draining, in nanoseconds (from the drain's first
    /// look to its end, stalls included).
    pub drain_ns: u64,
    /// Drains that found a section still open at their first look: the
    /// queue's head stayed on their wait, and later passes looked again,
    /// until the section ended (see `processor`).
    pub drain_stalls: u64,
    /// Modelled time charged by the queue (not walks), in nanoseconds.
    pub modelled_ns: u64,
    /// Invalidation-queue errors raised.
    pub queue_errors: u64,
    /// Faults seen (recorded or dropped).
    pub faults: u64,
    /// Valid IOTLB entries now.
    pub iotlb_entries: u64,
    /// Descriptors queued through the unit's API whose bytes in the ring
    /// were overwritten before they ran (they ran as queued).
    pub ring_tampered: u64,
    /// Revocations done without the queue, because it could not carry
    /// an unmap's invalidation (see `Unit::check_caller`).
    pub queue_bypass_revocations: u64,
    /// Translation sections a bounded revocation (an I/O page fault
    /// domain's reclaim or promotion) stopped waiting for after its
    /// timeout: *fenced*. Later bounded revocations do not wait for them
    /// again; every other wait still does. See
    /// [`Unit::fenced_sections_open`].
    pub fenced_sections: u64,
    /// CPU the unit's inline passes took on the threads that ran them
    /// (drivers, flush timers), less the modelled latency they spun, in
    /// nanoseconds: the IOMMU hardware's work, which a driver's CPU
    /// figure leaves out. Counted only with
    /// [`Unit::set_pass_accounting`] on (see `hw::pass_cpu`): every such
    /// pass is timed on its thread's CPU clock, less the clock reads.
    pub inline_pass_cpu_ns: u64,
    /// Inline passes with work run with accounting on, each counted.
    pub inline_passes: u64,
}

/// The processor's state, under the processing lock.
#[derive(Debug, Default)]
pub(crate) struct ProcState {
    /// An invalidation ran since the last drain.
    pub(crate) dirty: bool,
    /// The drain of the wait at the head, if a pass stalled on it.
    pub(crate) drain: Option<super::processor::PendingDrain>,
    /// Modelled queue latency spun by passes, nanoseconds, ever (what an
    /// inline pass's CPU charge leaves with the thread; see `pass_cpu`).
    pub(crate) spun_ns: u64,
}

/// A domain id in use and the root its devices share.
#[derive(Debug, Clone, Copy)]
struct Binding {
    root: PhysAddr,
    devices: usize,
}

/// The state a unit shares with its translators and its thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) mem: Arc<PhysMemory>,
    pub(crate) config: UnitConfig,
    pub(crate) barrier: Barrier,
    pub(crate) contexts: ContextTable,
    pub(crate) iotlb: Iotlb,
    pub(crate) slots: Slots,
    pub(crate) faults: FaultLog,
    pub(crate) latency: LiveLatency,
    pub(crate) counters: Counters,
    pub(crate) queue: InvQueue,
    /// The page request queue and its outstanding groups.
    pub(crate) prq: super::prq::Prq,
    pub(crate) limits: Limits,
    /// The submission lock: whoever holds it owns the tail.
    pub(crate) submit: Mutex<()>,
    /// The next wait ticket (written under `submit`).
    pub(crate) next_ticket: AtomicU32,
    /// The last ticket completed: the unit's own completion word, private
    /// (written by the processor at the ticket's wait; see `inv_queue` on
    /// why it is not in physical memory).
    pub(crate) completed: AtomicU32,
    /// When the last ticket completed, nanoseconds after `born`: stored
    /// before `completed` (whose Release store publishes it), so a waiter
    /// that sees its ticket done reads its completion time or a later one.
    pub(crate) completed_at: AtomicU64,
    /// The origin of `completed_at`.
    pub(crate) born: std::time::Instant,
    /// Ticket ranges (inclusive) that a queue error or a discard failed.
    pub(crate) failed: Mutex<Vec<(u32, u32, QueueFault)>>,
    /// The processing lock: whoever holds it owns the head.
    pub(crate) proc: Mutex<ProcState>,
    /// Guards the two condition variables below.
    pub(crate) signal: Mutex<()>,
    /// Rung when the tail moves or the queue recovers (thread mode).
    pub(crate) doorbell: Condvar,
    /// Rung when a processing pass ends.
    pub(crate) done: Condvar,
    /// The unit is going away, or its queue thread is gone: the queue
    /// carries nothing more (`QiError::ShutDown`).
    pub(crate) shutdown: AtomicBool,
    /// Fault injection: the queue thread is to exit as if it had crashed
    /// (`Unit::inject_queue_thread_death`). Read only by that thread.
    pub(crate) crash: AtomicBool,
    /// The queue thread has exited (set on its way out, however it ends).
    pub(crate) worker_gone: AtomicBool,
    /// Whether inline passes are charged to the unit (`pass_cpu`).
    pub(crate) account_passes: AtomicBool,
    /// Sections fenced by a bounded revocation, as (slot, state) while
    /// they may still be open (see `revoke`).
    pub(crate) fenced: Mutex<Vec<(usize, u64)>>,
    bindings: Mutex<HashMap<u16, Binding>>,
    /// Domain-id claims (locked after `bindings`).
    claims: Mutex<Claims>,
    /// One bit per domain id, set while a claim holds it (written under
    /// `claims`, read by walks without a lock).
    claimed: Box<[AtomicU64]>,
    /// One bit per domain id whose tables map guest RAM by identity (an
    /// I/O page-fault domain over RAM): as a claimed id's, its leaves are
    /// checked against the bounce pools on every walk, since a pool may
    /// take RAM the domain mapped (or will map) before.
    guest_ram: Box<[AtomicU64]>,
}

impl Shared {
    /// Forgets a dropped claim.
    pub(crate) fn release_claim(&self, token: u64) {
        let _b = lock(&self.bindings);
        let mut claims = lock(&self.claims);
        if let Some((lo, hi)) = claims.remove(token) {
            self.mark_claimed(lo, hi, false);
        }
    }

    /// Sets or clears the claimed bits of `lo..=hi` (under `claims`).
    fn mark_claimed(&self, lo: u16, hi: u16, set: bool) {
        for did in lo..=hi {
            set_did_bit(&self.claimed, did, set);
        }
    }

    /// Whether a claim holds domain id `did`: its owner is a guest's
    /// paravirtual IOMMU, whose mappings never reach a bounce pool.
    #[inline]
    pub(crate) fn is_claimed(&self, did: u16) -> bool {
        did_bit(&self.claimed, did)
    }

    /// Whether a walk of domain `did` must refuse a leaf over a bounce
    /// pool's frame: a claimed id's (a guest's paravirtual IOMMU), or one
    /// marked as mapping guest RAM ([`Unit::mark_guest_ram`]). The other
    /// domains' tables map the pools' slots themselves.
    #[inline]
    pub(crate) fn refuses_bounce_leaves(&self, did: u16) -> bool {
        self.is_claimed(did) || did_bit(&self.guest_ram, did)
    }
}

/// Sets (Release) or clears domain id `did`'s bit in a bitmap of one bit
/// per domain id; an id past the map is ignored.
fn set_did_bit(words: &[AtomicU64], did: u16, set: bool) {
    if let Some(w) = words.get(usize::from(did) / 64) {
        let bit = 1u64 << (did % 64);
        if set {
            w.fetch_or(bit, Ordering::Release);
        } else {
            w.fetch_and(!bit, Ordering::Release);
        }
    }
}

/// Domain id `did`'s bit in a bitmap of one bit per domain id (Acquire:
/// pairs with [`set_did_bit`]); false past the map.
#[inline]
fn did_bit(words: &[AtomicU64], did: u16) -> bool {
    words
        .get(usize::from(did) / 64)
        .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (did % 64)) != 0)
}

/// A token for the calling thread, unique among live threads, non-zero.
pub(crate) fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
}

/// An emulated IOMMU unit. See the [module documentation](super).
pub struct Unit {
    pub(crate) shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl fmt::Debug for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unit")
            .field("config", &self.shared.config)
            .field("barrier", &self.shared.barrier)
            .field("queue", &self.queue_registers())
            .finish_non_exhaustive()
    }
}

impl Unit {
    /// A unit translating into `mem` (where its queue is allocated, and
    /// where the page tables it walks must live).
    pub fn new(mem: Arc<PhysMemory>, config: UnitConfig) -> Result<Self, HwError> {
        config.check()?;
        let barrier =
            Barrier::resolve(config.drain_barrier).ok_or(HwError::MembarrierUnavailable)?;
        let domains = 1usize << config.domain_bits;
        let queue = InvQueue::new(mem.clone(), config.queue_order)?;
        let prq =
            super::prq::Prq::new(mem.clone(), config.prq_order, config.page_response_timeout)?;
        let shared = Arc::new(Shared {
            config,
            barrier,
            contexts: ContextTable::new(),
            iotlb: Iotlb::new(config.iotlb, domains),
            slots: Slots::new(config.max_translators),
            faults: FaultLog::new(config.fault_log_capacity),
            latency: LiveLatency::new(config.latency),
            counters: Counters::default(),
            queue,
            prq,
            limits: Limits {
                domains: domains as u32,
                mamv: config.max_address_mask,
            },
            submit: Mutex::new(()),
            next_ticket: AtomicU32::new(1),
            completed: AtomicU32::new(0),
            completed_at: AtomicU64::new(0),
            born: std::time::Instant::now(),
            failed: Mutex::new(Vec::new()),
            proc: Mutex::new(ProcState::default()),
            signal: Mutex::new(()),
            doorbell: Condvar::new(),
            done: Condvar::new(),
            shutdown: AtomicBool::new(false),
            crash: AtomicBool::new(false),
            worker_gone: AtomicBool::new(false),
            account_passes: AtomicBool::new(false),
            fenced: Mutex::new(Vec::new()),
            bindings: Mutex::new(HashMap::new()),
            claims: Mutex::new(Claims::default()),
            claimed: (0..domains.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            guest_ram: (0..domains.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            mem,
        });
        let worker = match config.queue_mode {
            QueueMode::Inline => None,
            QueueMode::Thread => {
                let s = Arc::clone(&shared);
                Some(
                    std::thread::Builder::new()
                        .name("softiommu-unit".into())
                        .spawn(move || s.worker())
                        .map_err(|e| HwError::InvalidConfig {
                            field: "queue_mode (thread spawn failed)",
                            value: e.raw_os_error().unwrap_or(0) as u64,
                        })?,
                )
            }
        };
        Ok(Self { shared, worker })
    }

    /// The configuration it was built with (the latency model may have
    /// changed since: see [`latency`](Self::latency)).
    pub fn config(&self) -> &UnitConfig {
        &self.shared.config
    }

    /// The physical memory it translates into.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.shared.mem
    }

    /// The fence pair its drain uses: `"membarrier"` or `"fence"`.
    pub fn drain_barrier(&self) -> &'static str {
        self.shared.barrier.name()
    }

    /// The number of domain ids it supports.
    pub fn domains(&self) -> u32 {
        self.shared.limits.domains
    }

    // ----- contexts -----

    /// Marks (or unmarks) domain id `did` as one whose tables map guest
    /// RAM by identity: every walk of it refuses a leaf over a bounce
    /// pool's frame ([`TranslateError::BounceFrame`]), as pass-through
    /// refuses the frame, whether the leaf was made before or after the
    /// pool took it. Set before a device's context names `did`, cleared
    /// only once none can.
    ///
    /// [`TranslateError::BounceFrame`]: super::TranslateError::BounceFrame
    pub(crate) fn mark_guest_ram(&self, did: u16, on: bool) {
        set_did_bit(&self.shared.guest_ram, did, on);
    }

    /// Writes `sid`'s context entry (`None`: not present), as a driver
    /// writing the context table; returns the old one. Translations already
    /// in flight may still use the old entry: follow with a context-cache
    /// invalidation and a wait ([`attach`](Self::attach) does).
    ///
    /// Every device of one domain id must use the same root; a domain id
    /// that no device uses any more is released, and taking it again starts
    /// it with a fresh generation (nothing cached under its earlier life can
    /// hit).
    ///
    /// A domain id another owner claimed ([`claim_domain_ids`](Self::claim_domain_ids))
    /// is refused ([`HwError::DomainIdClaimed`]).
    pub fn set_context(
        &self,
        sid: SourceId,
        ctx: Option<ContextEntry>,
    ) -> Result<Option<ContextEntry>, HwError> {
        self.set_context_as(sid, ctx, None)
    }

    /// [`set_context`](Self::set_context) by the holder of claim `owner`.
    fn set_context_as(
        &self,
        sid: SourceId,
        ctx: Option<ContextEntry>,
        owner: Option<u64>,
    ) -> Result<Option<ContextEntry>, HwError> {
        let sh = &*self.shared;
        let mut bindings = lock(&sh.bindings);
        if let Some(ContextEntry::Translated { did, root }) = ctx {
            if u32::from(did) >= sh.limits.domains {
                return Err(HwError::DomainOutOfRange {
                    did,
                    domains: sh.limits.domains,
                });
            }
            if let Some(t) = lock(&sh.claims).owner_of(did) {
                if Some(t) != owner {
                    return Err(HwError::DomainIdClaimed { did });
                }
            }
            // Tables live only in the IOMMU reserve: a root in RAM is a
            // table a device could be given, and write.
            let (base, len) = sh.mem.iommu_reserve();
            if root & (PAGE_SIZE - 1) != 0
                || root < base
                || root.checked_add(PAGE_SIZE).is_none_or(|e| e > base + len)
            {
                return Err(HwError::BadRoot { root });
            }
            match bindings.get(&did) {
                Some(b) if b.root != root => {
                    return Err(HwError::DomainRootMismatch {
                        did,
                        bound: b.root,
                        asked: root,
                    })
                }
                Some(_) => {}
                None => sh.iotlb.rebind_domain(did),
            }
        }
        let old = context::decode(sh.contexts.store(sid, context::encode(ctx)));
        if old != ctx {
            // A device whose context changes has nothing left to wait for
            // under the old one.
            sh.prq.cancel(sid);
        }
        if let Some(ContextEntry::Translated { did, root }) = ctx {
            bindings
                .entry(did)
                .or_insert(Binding { root, devices: 0 })
                .devices += 1;
        }
        if let Some(ContextEntry::Translated { did, .. }) = old {
            if let Some(b) = bindings.get_mut(&did) {
                b.devices -= 1;
                if b.devices == 0 {
                    bindings.remove(&did);
                }
            }
        }
        Ok(old)
    }

    /// Gives `sid` the context `ctx` and waits until no translation that
    /// used its old context is still in flight (a device-selective
    /// context-cache invalidation and a wait).
    ///
    /// A failed call changes nothing: the caller holding a section of
    /// this unit (`Queue(GuardHeld)`), a stopped or shut-down queue
    /// (`Queue(Stopped)`, `Queue(ShutDown)`) and a refused entry are all
    /// found before the context is written. If the queue stops after the
    /// write (another submitter's bad descriptor), the change is finished
    /// without it — the translations in flight are drained directly, as
    /// the crate's queue-less revocation does — and the call succeeds: a
    /// context change is never left in force without its drain.
    pub fn attach(&self, sid: SourceId, ctx: ContextEntry) -> Result<(), HwError> {
        self.replace_context(sid, Some(ctx), true, None, None)
    }

    /// Removes `sid`'s context (its requests fault as having none), and
    /// waits as [`attach`](Self::attach) does; fails, and changes nothing,
    /// as `attach` does.
    pub fn detach(&self, sid: SourceId) -> Result<(), HwError> {
        self.replace_context(sid, None, true, None, None)
    }

    /// As [`attach`](Self::attach), but waits at most `timeout` for the
    /// drain, and gives up early once `give_up` returns `true` (see
    /// [`InvBatch::wait_bounded`](super::InvBatch::wait_bounded)): for a
    /// caller that must never block on a device, such as a device model's
    /// own thread.
    ///
    /// Fails, changing nothing, as `attach` does. Fails with
    /// `Queue(InvalidationTimeout)` or `Queue(WaitAbandoned)` **after**
    /// the write: `ctx` is in force (every translation that begins now
    /// reads it), but one that began under the old context may still be
    /// in flight and use it — a section still open (a device parked or
    /// hostile inside one) is what stalls a drain. The caller must keep
    /// whatever the old context reached alive (never free its tables) and
    /// treat the change as not drained.
    pub fn attach_bounded(
        &self,
        sid: SourceId,
        ctx: ContextEntry,
        timeout: Duration,
        mut give_up: impl FnMut() -> bool,
    ) -> Result<(), HwError> {
        let mut limit = Limit::new(timeout, &mut give_up);
        self.replace_context(sid, Some(ctx), true, Some(&mut limit), None)
    }

    /// Reserves domain ids `lo..=hi` for the caller: from now on only
    /// [`attach_bounded_claimed`](Self::attach_bounded_claimed) with the
    /// returned claim gives a device a translated context with one of
    /// them, until the claim is dropped. Refused, with nothing claimed,
    /// when `lo > hi` or `hi` is beyond the unit's domains
    /// ([`HwError::DomainOutOfRange`]), or when a context uses one of the
    /// ids or another claim holds one ([`HwError::DomainIdInUse`], the
    /// lowest such id).
    pub fn claim_domain_ids(&self, lo: u16, hi: u16) -> Result<DomainIdClaim, HwError> {
        let sh = &*self.shared;
        if lo > hi || u32::from(hi) >= sh.limits.domains {
            return Err(HwError::DomainOutOfRange {
                did: if lo > hi { lo } else { hi },
                domains: sh.limits.domains,
            });
        }
        let bindings = lock(&sh.bindings);
        let mut claims = lock(&sh.claims);
        let bound = bindings
            .keys()
            .copied()
            .filter(|d| (lo..=hi).contains(d))
            .min();
        if let Some(did) = [bound, claims.overlap(lo, hi)].into_iter().flatten().min() {
            return Err(HwError::DomainIdInUse { did });
        }
        let token = claims.add(lo, hi);
        sh.mark_claimed(lo, hi, true);
        Ok(DomainIdClaim {
            unit: Arc::downgrade(&self.shared),
            lo,
            hi,
            token,
        })
    }

    /// [`attach_bounded`](Self::attach_bounded) by the holder of `claim`:
    /// the one way to give a device a translated context with a claimed
    /// domain id. A claim made on another unit claims nothing here.
    pub fn attach_bounded_claimed(
        &self,
        claim: &DomainIdClaim,
        sid: SourceId,
        ctx: ContextEntry,
        timeout: Duration,
        mut give_up: impl FnMut() -> bool,
    ) -> Result<(), HwError> {
        let ours = std::ptr::eq(claim.unit.as_ptr(), Arc::as_ptr(&self.shared));
        let mut limit = Limit::new(timeout, &mut give_up);
        let owner = ours.then_some(claim.token);
        self.replace_context(sid, Some(ctx), true, Some(&mut limit), owner)
    }

    /// [`detach`](Self::detach) bounded as
    /// [`attach_bounded`](Self::attach_bounded) is (on a timeout, `sid`
    /// has no context: it faults, but a translation begun before may
    /// still be in flight).
    pub fn detach_bounded(
        &self,
        sid: SourceId,
        timeout: Duration,
        mut give_up: impl FnMut() -> bool,
    ) -> Result<(), HwError> {
        let mut limit = Limit::new(timeout, &mut give_up);
        self.replace_context(sid, None, true, Some(&mut limit), None)
    }

    /// Changes `sid`'s context as [`attach`](Self::attach) does, but goes
    /// around a queue that is stopped or shut down (the drain is done
    /// directly): fails only for a caller holding a section of this unit
    /// (checked first) or an entry [`set_context`](Self::set_context)
    /// refuses, in both cases with nothing changed.
    pub(crate) fn replace_context_around_queue(
        &self,
        sid: SourceId,
        ctx: Option<ContextEntry>,
    ) -> Result<(), HwError> {
        self.replace_context(sid, ctx, false, None, None)
    }

    /// Fails if the queue could not carry an invalidation now: stopped
    /// (`Stopped`) or shut down (`ShutDown`); or if the calling thread
    /// holds a section of this unit (`GuardHeld`).
    pub(crate) fn check_queue(&self) -> Result<(), QiError> {
        self.shared.check_caller()?;
        self.shared.check_queue()
    }

    fn replace_context(
        &self,
        sid: SourceId,
        ctx: Option<ContextEntry>,
        refuse_stopped: bool,
        mut limit: Option<&mut Limit<'_>>,
        owner: Option<u64>,
    ) -> Result<(), HwError> {
        // Everything that can refuse is checked before the write.
        self.shared.check_caller()?;
        if refuse_stopped {
            self.shared.check_queue()?;
        }
        let old = self.set_context_as(sid, ctx, owner)?;
        let did = match (old, ctx) {
            (Some(ContextEntry::Translated { did, .. }), _) => did,
            (_, Some(ContextEntry::Translated { did, .. })) => did,
            _ => 0,
        };
        let cc = InvDescriptor::context(ContextScope::Device {
            did,
            source: sid,
            function_mask: 0,
        });
        let raw = [cc.encode()];
        let waited = self
            .enqueue_then(&raw, true, || {}, limit.as_deref_mut())
            .and_then(|t| match t {
                Some(t) => self.wait_ticket_until(t, limit.as_deref_mut()),
                None => Ok(()),
            });
        match (waited, limit) {
            (Ok(()), _) => {}
            // A bounded caller's limit: the drain is not known complete.
            (Err(e @ (QiError::InvalidationTimeout { .. } | QiError::WaitAbandoned)), _) => {
                return Err(e.into())
            }
            // The queue stopped (or shut down) since the check: contexts
            // are read afresh by every translation, so what the
            // invalidation's wait would have done is the drain; do it here.
            // The caller holds no section (checked above), so it ends.
            (Err(_), None) => self.shared.drain_direct(),
            (Err(_), Some(l)) => self.shared.drain_direct_bounded(l)?,
        }
        Ok(())
    }

    /// `sid`'s context entry now.
    pub fn context(&self, sid: SourceId) -> Option<ContextEntry> {
        context::decode(self.shared.contexts.load(sid))
    }

    // ----- device side -----

    // ----- faults, latency, statistics -----

    /// The fault log.
    pub fn faults(&self) -> &FaultLog {
        &self.shared.faults
    }

    /// The latency model in force.
    pub fn latency(&self) -> LatencyModel {
        self.shared.latency.get()
    }

    /// Changes the latency model; takes effect at the next charge.
    pub fn set_latency(&self, model: LatencyModel) {
        self.shared.latency.set(model);
    }

    /// **Fault injection**: makes the unit's queue thread
    /// ([`QueueMode::Thread`]) exit as if it had crashed, leaving whatever
    /// the ring still holds unprocessed. It exits at its next look at the
    /// doorbell: at once if it is idle, after the pass it is in otherwise
    /// ([`queue_thread_alive`](Self::queue_thread_alive) tells when it is
    /// gone). Returns whether there was a thread to end (`false` in inline
    /// mode, or if it is gone already). Costs nothing until called: the
    /// thread reads the flag only when woken.
    ///
    /// However the thread ends — this, or a panic unwinding it — the
    /// queue is then shut down: every wait pending or to come fails at
    /// once with [`QiError::ShutDown`] instead of sleeping until a pass
    /// that will never run, submissions are refused the same way, and
    /// context changes are refused before they write anything. The `dma`
    /// and `iopf` layers revoke around the queue as they do for a stopped
    /// one, so unmaps still complete with nothing left reachable. It is
    /// permanent: the unit's queue never runs again.
    pub fn inject_queue_thread_death(&self) -> bool {
        let sh = &*self.shared;
        if !self.queue_thread_alive() {
            return false;
        }
        let _g = lock(&sh.signal);
        sh.crash.store(true, Ordering::Release);
        sh.doorbell.notify_all();
        true
    }

    /// Whether the unit has a queue thread ([`QueueMode::Thread`]) that
    /// has not exited.
    pub fn queue_thread_alive(&self) -> bool {
        self.worker.is_some() && !self.shared.worker_gone.load(Ordering::Acquire)
    }

    /// The unit's counters now.
    pub fn stats(&self) -> UnitStats {
        let c = &self.shared.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        UnitStats {
            descriptors: r(&c.descriptors),
            context_invalidations: r(&c.context_invalidations),
            iotlb_global: r(&c.iotlb_global),
            iotlb_domain: r(&c.iotlb_domain),
            iotlb_pages: r(&c.iotlb_pages),
            entries_cleared: r(&c.entries_cleared),
            waits: r(&c.waits),
            completion_events: r(&c.completion_events),
            drains: r(&c.drains),
            drain_waited: r(&c.drain_waited),
            drain_ns: r(&c.drain_ns),
            drain_stalls: r(&c.drain_stalls),
            modelled_ns: r(&c.modelled_ns),
            queue_errors: r(&c.queue_errors),
            faults: self.shared.faults.total(),
            iotlb_entries: self.shared.iotlb.occupancy() as u64,
            ring_tampered: self.shared.queue.tampered(),
            queue_bypass_revocations: r(&c.bypass_revocations),
            fenced_sections: r(&c.fenced_sections),
            inline_pass_cpu_ns: r(&c.inline_pass_cpu_ns),
            inline_passes: r(&c.inline_passes),
        }
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _g = lock(&self.shared.signal);
            self.shared.doorbell.notify_all();
            self.shared.done.notify_all();
        }
        if let Some(w) = self.worker.take() {
            // A panic on the unit thread has already been reported; there
            // is nothing more to do with it here.
            let _ = w.join();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::hw::{Access, TranslateError, Translator};
    use crate::mem::MemError;
    use crate::pgtable::{IoPageTable, Perm, VtdConfig, VtdPageTable};

    fn setup() -> (Arc<PhysMemory>, Unit, VtdPageTable) {
        let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
        let unit = Unit::new(mem.clone(), UnitConfig::default()).unwrap();
        let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        (mem, unit, table)
    }

    #[test]
    fn configurations_are_checked() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let bad = |c: UnitConfig| Unit::new(mem.clone(), c).unwrap_err();
        let d = UnitConfig::default();
        assert!(matches!(
            bad(UnitConfig {
                iotlb: IotlbConfig { sets: 3, ways: 1 },
                ..d
            }),
            HwError::InvalidConfig {
                field: "iotlb.sets",
                ..
            }
        ));
        assert!(matches!(
            bad(UnitConfig {
                domain_bits: 17,
                ..d
            }),
            HwError::InvalidConfig { .. }
        ));
        assert!(matches!(
            bad(UnitConfig {
                queue_order: 8,
                ..d
            }),
            HwError::InvalidConfig { .. }
        ));
        assert!(matches!(
            bad(UnitConfig {
                max_translators: 0,
                ..d
            }),
            HwError::InvalidConfig { .. }
        ));
        for max_access_bytes in [0, 4095, (1 << 30) + 1, u64::MAX] {
            assert!(matches!(
                bad(UnitConfig {
                    max_access_bytes,
                    ..d
                }),
                HwError::InvalidConfig {
                    field: "max_access_bytes",
                    ..
                }
            ));
        }
        let tiny = Arc::new(PhysMemory::with_iommu_reserve(4096, 4096).unwrap());
        let two_pages = UnitConfig {
            queue_order: 1,
            ..d
        };
        assert!(matches!(
            Unit::new(tiny, two_pages).unwrap_err(),
            HwError::Mem(MemError::OutOfFrames { order: 1 })
        ));
    }

    /// A wait whose drain finds an open section stalls the queue at
    /// itself without holding anyone: a submitter behind it returns at
    /// once, a poll says "not yet", and the wait completes (and the
    /// descriptors behind it run) once the section ends. In both queue
    /// modes.
    #[test]
    fn a_wait_behind_an_open_section_stalls_the_queue_without_blocking_submitters() {
        for queue_mode in [QueueMode::Inline, QueueMode::Thread] {
            let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
            let cfg = UnitConfig {
                queue_mode,
                ..UnitConfig::default()
            };
            let unit = Unit::new(mem, cfg).unwrap();
            let (entered_tx, entered_rx) = std::sync::mpsc::channel();
            let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
            std::thread::scope(|s| {
                let u = &unit;
                let device = s.spawn(move || {
                    let mut tr = u.translator().unwrap();
                    tr.section(|_| {
                        entered_tx.send(()).unwrap();
                        let _ = release_rx.recv_timeout(std::time::Duration::from_secs(10));
                    });
                });
                entered_rx.recv().unwrap();
                unit.invalidate_domain(3).unwrap();
                let t = unit.queue_wait().unwrap();
                assert_eq!(unit.poll_ticket(t), Ok(None), "{queue_mode:?}");
                // (In thread mode the unit thread gets there on its own.)
                let t0 = std::time::Instant::now();
                while unit.stats().drain_stalls == 0 {
                    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
                    std::thread::yield_now();
                }
                // A submitter behind the stalled wait is not held by it.
                unit.invalidate_pages(4, 0x1000, 0, false).unwrap();
                let t2 = unit.queue_wait().unwrap();
                assert_eq!(unit.poll_ticket(t2), Ok(None));
                let before = unit.stats();
                assert_eq!(before.drains, 0, "{before:?}");
                assert_eq!(before.iotlb_pages, 0, "behind the wait: {before:?}");
                release_tx.send(()).unwrap();
                device.join().unwrap();
                unit.wait().unwrap();
                let released = std::time::Instant::now();
                assert!(matches!(unit.poll_ticket(t), Ok(Some(at)) if at <= released));
                assert!(matches!(unit.poll_ticket(t2), Ok(Some(_))));
                let after = unit.stats();
                assert_eq!(after.iotlb_pages, 1);
                assert_eq!(after.drain_waited, 1, "{queue_mode:?} {after:?}");
            });
        }
    }

    #[test]
    fn contexts_bind_domains_to_one_root() {
        let (mem, unit, table) = setup();
        let other = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        let (a, b) = (SourceId(1), SourceId(2));
        let ctx = ContextEntry::Translated {
            did: 5,
            root: table.root(),
        };
        unit.attach(a, ctx).unwrap();
        unit.attach(b, ctx).unwrap();
        assert_eq!(unit.context(a), Some(ctx));
        assert!(matches!(
            unit.attach(
                SourceId(3),
                ContextEntry::Translated {
                    did: 5,
                    root: other.root()
                }
            ),
            Err(HwError::DomainRootMismatch { did: 5, .. })
        ));
        assert!(matches!(
            unit.attach(SourceId(3), ContextEntry::Translated { did: 5, root: 123 }),
            Err(HwError::BadRoot { root: 123 })
        ));
        assert!(matches!(
            unit.attach(
                SourceId(3),
                ContextEntry::Translated {
                    did: 5,
                    root: 1 << 40
                }
            ),
            Err(HwError::BadRoot { .. })
        ));
        // Once no device uses DID 5, it may take another root.
        unit.detach(a).unwrap();
        unit.attach(b, ContextEntry::PassThrough).unwrap();
        unit.attach(
            SourceId(3),
            ContextEntry::Translated {
                did: 5,
                root: other.root(),
            },
        )
        .unwrap();
        assert_eq!(unit.context(a), None);
        assert!(unit.stats().context_invalidations >= 5);
    }

    #[test]
    fn pass_through_and_blocked_contexts() {
        let (_mem, unit, _table) = setup();
        let mut t = unit.translator().unwrap();
        let (p, b, n) = (SourceId(1), SourceId(2), SourceId(3));
        unit.attach(p, ContextEntry::PassThrough).unwrap();
        unit.attach(b, ContextEntry::Blocked).unwrap();
        let r = t
            .translate(p, 0x1234_5678, 0x10_0000, Access::Write)
            .unwrap();
        assert_eq!(r.as_slice().len(), 1);
        assert_eq!(
            (r.as_slice()[0].phys, r.total_len()),
            (0x1234_5678, 0x10_0000)
        );
        assert!(matches!(
            t.translate(p, 1 << 52, 1, Access::Read),
            Err(TranslateError::AddressTooWide { width: 52, .. })
        ));
        assert_eq!(
            t.translate(b, 0, 1, Access::Read),
            Err(TranslateError::ContextBlocked { sid: b })
        );
        assert_eq!(
            t.translate(n, 0, 1, Access::Read),
            Err(TranslateError::NoContext { sid: n })
        );
        assert_eq!(unit.faults().len(), 3);
        assert_eq!(t.stats().faults, 3);
        let _ = Perm::RW;
    }

    #[test]
    fn a_translator_follows_its_devices_through_context_changes() {
        // The hit path keeps the context word (and its domain) of the
        // device it served last: every change of that word, and every
        // switch of device, must still be seen on the next access.
        let (mem, unit, t1) = setup();
        let t2 = VtdPageTable::new(mem.clone(), VtdConfig::default()).unwrap();
        let iova = 0x4000_0000;
        t1.map(iova, 0x10_0000, 4096, Perm::RW).unwrap();
        t2.map(iova, 0x20_0000, 4096, Perm::READ).unwrap();
        let mut t = unit.translator().unwrap();
        // A device on a bus no context was ever set on, then set.
        let (a, b) = (SourceId(0x0300), SourceId(0x0500));
        assert_eq!(
            t.translate_page(a, iova, Access::Read),
            Err(TranslateError::NoContext { sid: a })
        );
        let on = |did, table: &VtdPageTable| ContextEntry::Translated {
            did,
            root: table.root(),
        };
        unit.attach(a, on(1, &t1)).unwrap();
        unit.attach(b, on(2, &t2)).unwrap();
        let phys = |t: &mut Translator, sid, access| {
            t.translate_page(sid, iova + 0x40, access).map(|s| s.phys)
        };
        for _ in 0..2 {
            // Miss, then hit; each device its own domain, alternately.
            assert_eq!(phys(&mut t, a, Access::Write), Ok(0x10_0040));
            assert_eq!(phys(&mut t, b, Access::Read), Ok(0x20_0040));
            assert!(matches!(
                phys(&mut t, b, Access::Write),
                Err(TranslateError::PermissionDenied { sid, .. }) if sid == b
            ));
        }
        // The same device moved to the other domain, to pass-through, to
        // blocked, and off.
        unit.attach(a, on(2, &t2)).unwrap();
        assert_eq!(phys(&mut t, a, Access::Read), Ok(0x20_0040));
        unit.attach(a, ContextEntry::PassThrough).unwrap();
        assert_eq!(phys(&mut t, a, Access::Read), Ok(iova + 0x40));
        unit.attach(a, ContextEntry::Blocked).unwrap();
        assert_eq!(
            phys(&mut t, a, Access::Read),
            Err(TranslateError::ContextBlocked { sid: a })
        );
        unit.detach(a).unwrap();
        assert_eq!(
            phys(&mut t, a, Access::Read),
            Err(TranslateError::NoContext { sid: a })
        );
        // The table changed while no device was bound to its domain, with
        // no invalidation: re-attached with the very word the translator
        // kept, the domain's first binding drops what it cached.
        t1.unmap(iova, 4096, &mut crate::pgtable::IotlbGather::new())
            .unwrap();
        t1.map(iova, 0x30_0000, 4096, Perm::RW).unwrap();
        let walks = t.stats().walks;
        unit.attach(a, on(1, &t1)).unwrap();
        assert_eq!(phys(&mut t, a, Access::Read), Ok(0x30_0040));
        assert_eq!(phys(&mut t, a, Access::Read), Ok(0x30_0040));
        assert_eq!(t.stats().walks, walks + 1, "one new walk, then a hit");
        assert_eq!(t.stats().faults, 5);
        assert_eq!(unit.faults().len(), 5);
    }

    #[test]
    fn translators_are_bounded() {
        let mem = Arc::new(PhysMemory::new(1 << 20).unwrap());
        let unit = Unit::new(
            mem,
            UnitConfig {
                max_translators: 2,
                ..UnitConfig::default()
            },
        )
        .unwrap();
        let a = unit.translator().unwrap();
        let _b = unit.translator().unwrap();
        assert_eq!(
            unit.translator().unwrap_err(),
            HwError::TooManyTranslators { max: 2 }
        );
        drop(a);
        unit.translator().unwrap();
    }
}
