//! The emulated IOMMU unit: contexts, a page walker over real table bytes,
//! a lock-free IOTLB, an invalidation queue of real VT-d descriptors, a
//! fault log and a latency model.
//!
//! # The model
//!
//! A [`Unit`] stands for one VT-d DMA-remapping hardware unit; a
//! [`System`] holds several and says which device ([`SourceId`]) belongs to
//! which. Each device has a context ([`ContextEntry`]): translated through
//! a domain's second-level page table (a domain id and the table's root, in
//! [`PhysMemory`](crate::mem::PhysMemory)), pass-through, or blocked.
//!
//! - **Device side.** A device thread gets a [`Translator`] from its unit
//!   and calls [`Translator::translate`]`(sid, iova, len, access)`: the
//!   physical ranges, or a typed [`TranslateError`] that is also recorded in
//!   the unit's [`FaultLog`]. A hit in the IOTLB costs a few loads and two
//!   plain stores; a miss walks the table's bytes as the hardware does and
//!   fills the IOTLB. A device that copies memory after translating does
//!   both inside one section ([`Translator::section`], which lends it a
//!   [`TranslationGuard`]).
//! - **Driver side.** After changing a table, the driver queues
//!   invalidation descriptors ([`InvDescriptor`], the VT-d bit layouts) in
//!   the unit's invalidation queue, a ring in physical memory, and rings
//!   the doorbell (the tail); a wait descriptor writes a status word once
//!   everything before it is done. [`Unit::batch`] and [`Unit::wait`] wrap
//!   this. The queue is carried out by the submitter ([`QueueMode::Inline`])
//!   or by the unit's own thread ([`QueueMode::Thread`]). A malformed
//!   descriptor stops the queue at itself ([`Unit::queue_error`],
//!   [`Unit::recover_queue`]).
//! - **Modelled time.** What a CPU cannot make real (the time hardware takes
//!   to complete an invalidation, to read a table level) is a
//!   [`LatencyModel`], zero unless asked for.
//!
//! # What a completed wait promises, and why it holds
//!
//! *When a wait descriptor completes, no translation that began before the
//! invalidations it follows can still return a stale result, and no guard
//! opened before them is still held.* So once a driver's unmap has waited,
//! it may free and reuse the pages: no device can reach them any more.
//!
//! Three pieces make this true, each cheap where it must be:
//!
//! 1. **No stale entry survives an invalidation** (`iotlb`). Domain and
//!    global invalidations bump a generation (O(1)); an entry is valid only
//!    under the generation it was filled with, and a fill takes its
//!    generation *before* its walk, so a walk that raced the invalidation
//!    fills a dead entry. Page-selective invalidations (one at a time)
//!    bump a per-domain counter, read the fingerprints of each set the
//!    range maps to with a read-modify-write, then visit each entry whose
//!    fingerprint matches with one read-modify-write of its lock word
//!    (an unlocked entry whose fingerprint does not match cannot hold the page, nor
//!    can a fill that writes its fingerprint later: it sees the counter
//!    moved): a finished entry in the range is
//!    cleared, a fill in progress is marked killed (it withdraws instead of
//!    publishing), and a fill that starts later synchronizes with that
//!    visit, sees the counter moved since before its walk, and withdraws.
//!    So no fill can slip a stale entry in after the scan, and the scan
//!    never waits for a fill.
//! 2. **Readers never see a torn entry** (`iotlb`): each entry is a
//!    sequence lock; readers load the sequence (Acquire), the fields, fence
//!    (Acquire) and re-load the sequence. Readers write nothing.
//! 3. **The wait drains translations in flight** (`epoch`, `barrier`). Each
//!    translator owns a slot it marks odd on entering a section and even on
//!    leaving (plain stores); between the mark and the first IOTLB load is
//!    a light fence. At a wait that follows invalidations the unit issues a
//!    heavy fence and waits for every slot found odd to change. By the
//!    fence pair, a section the drain did not see as active began late
//!    enough to see every invalidation (and so every table change before
//!    it, through the Acquire loads of the generation counters). With
//!    [`DrainBarrier::Membarrier`] (the default where Linux offers
//!    `membarrier(2)`), the light fence is only a compiler fence and the
//!    heavy one is the system call, so the hit path has no atomic
//!    read-modify-write and no `SeqCst` fence; elsewhere both are `SeqCst`
//!    fences. The trade: `membarrier` makes each translation a few
//!    nanoseconds cheaper and each draining wait microseconds dearer when
//!    other threads of the process are running (it interrupts their CPUs).
//!    A drain also waits for a translator that the OS preempted inside a
//!    section, so guards should be short and device threads not
//!    oversubscribed.
//!
//! The IOTLB's hit path, its fills and invalidations, and the drain are
//! model-checked with loom (run `RUSTFLAGS="--cfg loom" cargo test -p
//! softiommu --release --lib hw::`); the membarrier half of the fence pair
//! is argued in `barrier`, since loom cannot model a system call.
//!
//! # Page requests
//!
//! A device with page requests enabled does not fail on a miss: the unit
//! writes a page request into its page request queue (VT-d layout, 32-byte
//! descriptors, overflow flag) and the translation returns
//! [`TranslateError::PageRequested`]; the device waits outside its section
//! ([`Translator::wait_page_response`]) for the page group response that
//! software submits on the invalidation queue (type 9), and retries. See
//! `prq` for the model, and the crate's `iopf` module for the handler.
//! What a device cannot do there: the requester id is the unit's stamp,
//! software takes the unit's own copy of each request (never the ring's
//! bytes), a raw request never answers a group the unit raised, and each
//! request reaches only the handler of the domain that owns its requester
//! (`prq_route`).
//!
//! # Not modelled yet
//!
//! A paging-structure cache (the walker reads every level each miss; the
//! invalidation hint is accepted and recorded), device-TLB (ATS)
//! invalidation, interrupt remapping, and PASIDs (page requests carry none;
//! one with a PASID is answered `Invalid` by the `iopf` handler).

#[cfg(all(test, not(loom)))]
mod bounded_tests;
mod claims;
mod clock;
mod context;
mod descriptor;
mod epoch;
mod error;
mod fault;
mod inv_queue;
pub(crate) mod iotlb;
mod latency;
#[cfg(all(test, loom))]
mod loom_tests;
mod page_requests;
mod pass_cpu;
#[cfg(all(test, not(loom)))]
mod pass_cpu_tests;
mod processor;
mod prq;
mod prq_route;
mod ranges;
mod revoke;
mod submit;
mod system;
mod translator;
mod unit;
mod walker;

pub use crate::sync::barrier::DrainBarrier;
pub use claims::DomainIdClaim;
pub use context::{ContextEntry, SourceId, UnitId};
pub use descriptor::{
    covering_mask, ContextScope, InvDescriptor, IotlbScope, IqeReason, StatusWrite, WaitDescriptor,
    DESCRIPTOR_BYTES,
};
pub use error::{HwError, QiError, TranslateError};
pub use fault::{Access, FaultBatch, FaultLog, FaultReason, FaultRecord, FaultsSince};
pub use inv_queue::{QueueFault, QueueRecovery, QueueRegisters, MAX_QUEUE_ORDER};
pub use iotlb::IotlbConfig;
pub use latency::{
    cycles, LatencyModel, VTD_2015_INVALIDATION_CYCLES, VTD_2015_NOMINAL_GHZ,
    VTD_2015_WALK_LEVEL_NS,
};
pub use page_requests::Taken;
pub use pass_cpu::thread_inline_pass_cpu;
#[cfg(test)]
pub(crate) use prq::RAW_MARK;
pub use prq::{
    PageRequest, PageRequestError, PrqRegisters, PrqStats, ResponseCode, DEFAULT_PRQ_ORDER,
    MAX_PRQ_ORDER, PRG_INDICES, PRQ_DESCRIPTOR_BYTES,
};
pub use ranges::{PhysRange, PhysRanges, PhysSpan};
pub use submit::InvBatch;
pub use system::System;
pub use translator::{TranslationGuard, Translator, TranslatorStats};
pub use unit::{QueueMode, Unit, UnitConfig, UnitStats, DEFAULT_MAX_ACCESS_BYTES, MAX_TRANSLATORS};
