//! The device side: DMA accessors through a unit's translation, ordered as
//! the guest expects, a zero-copy mapping, and the rust-vmm integration.
//!
//! # The model
//!
//! An emulated device runs on a thread of its own, concurrently with the
//! guest's CPUs (seed `001`). It reaches guest memory only by IOVA, through
//! its IOMMU unit: a [`DmaAccessor`] owns a [`Translator`](crate::hw::Translator)
//! (so it lives on the device thread) and offers [`read`](DmaAccessor::read),
//! [`write`](DmaAccessor::write), [`fill`](DmaAccessor::fill) and
//! little-endian `u16` / `u32` / `u64` loads and stores. A refused access
//! returns an [`AccessError`] and the unit records the fault. Every access
//! translates and copies inside one translation section, so once a driver's
//! unmap has waited for its invalidation, no access is still moving bytes
//! through what it revoked.
//!
//! # Ordering: [`DmaAttrs`], not `_relaxed` variants
//!
//! The guest must observe the device's accesses in the order the device
//! made them, relative to each other and to the guest's own barriers. QEMU
//! still puts a full `smp_mb()` before every DMA access; its comment
//! promises "lighter barriers based on the direction". These are they. Each
//! call takes [`DmaAttrs`]:
//!
//! - **ordered** (the default): every access is ordered after every
//!   earlier access of the accessor, and a load before every later one.
//!   Loads are acquire, stores release, and a store-load fence is issued
//!   before a load only when the accessor has stored since its last full
//!   fence (the one reordering TSO allows). See `order` for the rule.
//! - **relaxed** ([`DmaAttrs::RELAXED`]): no fence, for devices that order
//!   themselves (with [`DmaAccessor::fence`]) or need none.
//! - **full** ([`DmaAttrs::FULL_BARRIER`]): an unconditional full fence
//!   before every access, QEMU's choice, kept to compare with.
//!
//! What each costs, per architecture:
//!
//! | access (ordered)      | x86-64 (TSO)                 | AArch64                       | POWER              |
//! |-----------------------|------------------------------|-------------------------------|--------------------|
//! | typed load            | `mov`                        | `ldar`                        | `ld; cmp; bc; isync` |
//! | typed store           | `mov`                        | `stlr`                        | `lwsync; st`       |
//! | bulk read             | copy (compiler fence after)  | copy; `dmb ishld`             | copy; `lwsync`     |
//! | bulk write            | (compiler fence) copy        | `dmb ish`; copy               | `lwsync`; copy     |
//! | load after a store    | `mfence` first               | `dmb ish` first               | `sync` first       |
//! | full mode, any access | `mfence` first               | `dmb ish` first               | `sync` first       |
//!
//! Why: x86 already keeps load→load, load→store and store→store order for
//! plain moves, so acquire and release cost nothing there and only a store
//! followed by a load needs an instruction — once per store-to-load
//! transition, not per access (a NIC serving a descriptor pays one, where
//! QEMU's rule pays four). AArch64 and POWER reorder everything, so each
//! direction gets its own barrier: `ldar`/`stlr` (or the load-only half of
//! `dmb`) for the three cheap orderings and the full `dmb ish` / `sync`
//! for store→load only. The logic is written once with Rust atomics and
//! fences (correct on every architecture) and checked with loom; the table
//! is what those compile to (see `fence` on `mfence` against a locked
//! instruction).
//!
//! Typed accesses are single atomic accesses when naturally aligned (a
//! guest never sees them torn); otherwise they are byte copies. Bulk
//! copies are byte copies, ordered by the fences at the hardware level as
//! the kernel's barriers order plain accesses; litmus tests and the loom
//! model use typed accesses.
//!
//! # Partial accesses
//!
//! An access is translated whole — every page, every piece — and checked
//! against physical memory before its first byte moves. An access that
//! runs off a mapping, straddles a mapping and a hole, writes a read-only
//! mapping, or names an unmapped IOVA therefore fails with **nothing
//! copied**: a read leaves the caller's buffer untouched, a write or fill
//! changes no byte of guest memory. The fault is recorded once, for the
//! first page refused. An access of zero bytes is refused with
//! `TranslateError::ZeroLength` and recorded in the unit's fault log as a
//! malformed request (`FaultReason::ZeroLength`; VT-d has no code for it,
//! since no such request reaches hardware). Accesses that
//! cross pages or mappings are split and translated piece by piece, each
//! piece with its own leaf's rights.
//!
//! # Zero copy
//!
//! [`DmaAccessor::with_map`] translates a range once and lends a
//! [`DmaMapping`] to a closure, for bulk copies with no translation or
//! fence per access; it holds the translation section open while the
//! closure runs, so it can never outlive the wait of an unmap that revokes
//! it (the wait waits for it), and it cannot be leaked.
//!
//! # rust-vmm
//!
//! With the `vm-memory` feature (on by default), [`UnitIommu`] implements
//! vm-memory's `Iommu` trait for one device's view of a unit and
//! [`PhysGuestMemory`] is a vm-memory backend over [`PhysMemory`](crate::mem::PhysMemory),
//! so `vm_memory::IommuMemory::new(PhysGuestMemory::behind_iommu(mem), view, true, ())`
//! (or an `IommuMemory` over vm-memory's own `GuestMemoryMmap`) translates
//! through softiommu, and crates such as `virtio-queue` work through it.
//!
//! The ordering logic is model-checked with loom: `RUSTFLAGS="--cfg loom"
//! CARGO_TARGET_DIR=target/loom cargo test -p softiommu --release --lib
//! access::`. `softiommu lab litmus` runs the same patterns on the real CPU.

mod accessor;
mod attrs;
#[cfg(feature = "vm-memory")]
mod epoch;
mod error;
mod fence;
#[cfg(all(test, loom))]
mod loom_tests;
mod mapping;
mod order;
#[cfg(all(test, not(loom)))]
mod tests;
#[cfg(feature = "vm-memory")]
mod vm_iommu;
#[cfg(feature = "vm-memory")]
mod vm_phys;
#[cfg(feature = "vm-memory")]
mod vm_thread;
mod word;

pub use accessor::{AccessStats, DmaAccessor, PAGE_REQUEST_ROUNDS};
pub use attrs::{DmaAttrs, DmaFence, OrderMode};
pub use error::AccessError;
pub use mapping::DmaMapping;
#[cfg(feature = "vm-memory")]
pub use vm_iommu::{unit_section, IotlbSection, UnitIommu};
#[cfg(feature = "vm-memory")]
pub use vm_phys::{PhysGuestMemory, PhysRegion};
