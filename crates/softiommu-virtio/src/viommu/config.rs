//! [`ViommuConfig`]: what a virtio-iommu device manages and advertises, its
//! checks, and the configuration space it presents (§5.13.4).

use std::time::Duration;

use softiommu::hw::{HwError, SourceId, System, UnitId};
use softiommu::pgtable::VTD_IOVA_BITS;

use crate::spec::iommu as s;
use crate::transport::TransportConfig;

/// The page sizes the device maps (§5.13.4 `page_size_mask`): the unit's
/// VT-d leaves, 4 KiB (the granularity), 2 MiB and 1 GiB.
pub const PAGE_SIZE_MASK: u64 = (1 << 12) | (1 << 21) | (1 << 30);
/// The page granularity: the least significant bit of [`PAGE_SIZE_MASK`].
pub const GRANULE: u64 = 1 << 12;
/// The last IOVA the unit translates: its tables take
/// [`VTD_IOVA_BITS`]-bit addresses (`input_range.end`).
pub const INPUT_END: u64 = (1 << VTD_IOVA_BITS) - 1;
/// Bytes of one RESV_MEM property, header included.
pub const RESV_MEM_PROP: usize = s::PROBE_PROP_HEAD + s::RESV_MEM_LEN;

/// The largest `probe_size` the device takes (64 KiB: room for 2,730
/// reserved regions). §5.13.4 sets no bound, but the device zeroes and
/// writes up to `probe_size` bytes per PROBE, and a guest may send as
/// many PROBEs as it likes: the work and memory one request costs must
/// stay small whatever the configuration.
pub const MAX_PROBE_SIZE: u32 = 1 << 16;

/// How to build a virtio-iommu device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViommuConfig {
    /// The endpoints the device manages: endpoint id = the PCI requester
    /// id (`SourceId.0`), as platforms describe PCI endpoints to a
    /// virtio-iommu. Each must be in the unit's scope; ids not listed are
    /// `NOENT`.
    pub endpoints: Vec<SourceId>,
    /// `domain_range` (inclusive). Domain `d` is the unit's domain id
    /// `d`: every id in the range belongs to the device, which claims the
    /// range on the unit at creation (refused, `Hw(DomainIdInUse)`, while
    /// a context uses one of its ids), so no other user of the unit takes
    /// one. At least 1 (the unit's id 0 stays unused) and below the
    /// unit's domain count.
    pub domain_range: (u32, u32),
    /// `probe_size`: bytes of PROBE properties (room for the MSI window
    /// and every reserved region, a multiple of 4, at most
    /// [`MAX_PROBE_SIZE`]).
    pub probe_size: u32,
    /// `bypass` at creation (and after a system reset; a device reset
    /// keeps the driver's value, §5.13.4.2).
    pub bypass: bool,
    /// Reserved IOVA regions reported by PROBE as
    /// `VIRTIO_IOMMU_RESV_MEM_T_RESERVED` (inclusive bounds) and refused
    /// to MAP, beside the MSI window.
    pub reserved: Vec<(u64, u64)>,
    /// The most page-table frames (4 KiB each, roots included) the
    /// device's domains may hold together. Their tables take frames from
    /// the memory's reserve, which the unit's other users share: a guest
    /// that maps sparsely (one 4 KiB page per 2 MiB) or makes many
    /// domains would otherwise drain it. A MAP whose worst case (one
    /// table per 2 MiB, 1 GiB and 512 GiB region it touches) would take
    /// the domains past it is answered `NOMEM` before any frame is taken
    /// (near the quota that refuses some MAPs that would have needed
    /// fewer); an ATTACH that would make a translated domain past it,
    /// `NOMEM`. At least 1.
    pub table_frames: u64,
    /// The most mappings (MAPs' records) the device's domains may hold
    /// together: each costs host memory beside the tables, and an UNMAP
    /// of a range removes every one it holds, so both the memory a guest
    /// can pin and the work of one request are bounded by it. A MAP past
    /// it is answered `NOMEM` with nothing mapped. At least 1.
    pub max_mappings: usize,
    /// `QueueNumMax` of both queues (a power of two).
    pub queue_max: u16,
    /// Chains taken from the request queue per round: the device's work
    /// per notification round is bounded by it.
    pub batch: usize,
    /// Faults taken from the unit's log per round.
    pub fault_batch: usize,
    /// How long the idle device sleeps before it looks at the fault log
    /// again (a fault wakes nobody: the unit's log is polled).
    pub idle_wait: Duration,
    /// After a round with work, how long the device keeps looking for
    /// the next notification before it sleeps (busy polling, as vhost's
    /// `poll-us`): a driver waiting on each request then pays no thread
    /// wake-up. Zero: sleep at once.
    pub poll: Duration,
    /// The longest the device waits for one of the unit's invalidations
    /// (an UNMAP round's, or an ATTACH's or DETACH's context change): a
    /// wait stalls only while a translation section stays open (an
    /// endpoint parked or hostile inside one). Past it the device answers
    /// `DEVERR`, blocks the endpoints the invalidation was for and asks
    /// for a reset. It also bounds a round: no chain is taken once one
    /// bound has passed since the round began (the rest wait for the next
    /// round), so a round — and a reset or `bypass` write waiting for it —
    /// lasts at most about three bounds (chains taken for one, the last
    /// one's wait, the round's invalidation). Keep three bounds below the
    /// driver's own wait (the defaults: 1 s here, 4 s in
    /// `ViommuDriverConfig`), so the driver learns a round's statuses
    /// rather than its own timeout.
    pub invalidation_timeout: Duration,
    /// Serve the request queue on the thread that notifies it, inside
    /// its `QueueNotify` write, instead of waking the device thread: a
    /// hypervisor that handles the exit on the trapping vCPU (the vCPU
    /// is held until the requests are done; the event queue and fault
    /// reports stay on the device thread). Off by default.
    pub serve_in_notifier: bool,
    /// Transport policy. The device's own rings and requests are in guest
    /// RAM, reached directly (the device is not behind an IOMMU), so
    /// `VIRTIO_F_ACCESS_PLATFORM` is not required by default.
    pub transport: TransportConfig,
}

impl Default for ViommuConfig {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            domain_range: (1, 1023),
            probe_size: 512,
            bypass: false,
            reserved: Vec::new(),
            // 64 MiB of tables: 16,383 leaf tables, 32 GiB of 4 KiB
            // mappings scattered one per 2 MiB.
            table_frames: 16_384,
            // About 64 MiB of records; 4 GiB mapped at 4 KiB.
            max_mappings: 1 << 20,
            queue_max: 256,
            // A whole queue: the requests of one notification are one
            // round, and their UNMAPs one invalidation per domain.
            batch: 256,
            fault_batch: 64,
            idle_wait: Duration::from_millis(1),
            poll: Duration::from_micros(50),
            invalidation_timeout: Duration::from_secs(1),
            serve_in_notifier: false,
            transport: TransportConfig {
                require_access_platform: false,
                // Without INPUT_RANGE mappings span the whole 64-bit space
                // and without DOMAIN_RANGE any 32-bit domain is valid
                // (§5.13.6): the unit's tables take 48 bits and its domain
                // ids are the device's claimed range, so a driver that
                // declines either cannot be served as the specification
                // says and `FEATURES_OK` is refused (§2.2.2). (Before: taken,
                // and both limits enforced anyway.)
                required_features: 1 << s::F_INPUT_RANGE | 1 << s::F_DOMAIN_RANGE,
                ..TransportConfig::default()
            },
        }
    }
}

/// Why a device could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViommuError {
    /// The unit does not exist.
    #[error("no unit {0:?} in the system")]
    NoUnit(UnitId),
    /// An endpoint is not in the unit's scope.
    #[error("endpoint {sid} is not in the scope of unit {unit:?}")]
    EndpointNotInUnit {
        /// The endpoint.
        sid: SourceId,
        /// The device's unit.
        unit: UnitId,
    },
    /// A field of the configuration is out of range.
    #[error("virtio-iommu configuration: {field} = {value:#x} is out of range")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// The unit refused to give an endpoint its initial context.
    #[error(transparent)]
    Hw(#[from] HwError),
    /// The device thread could not be started.
    #[error("the device thread could not be started (errno {0})")]
    Spawn(i32),
}

impl ViommuConfig {
    /// Checks the configuration against `system`'s unit `unit`.
    pub fn check(&self, system: &System, unit: UnitId) -> Result<(), ViommuError> {
        let bad = |field, value: u64| Err(ViommuError::InvalidConfig { field, value });
        let u = system.unit(unit).ok_or(ViommuError::NoUnit(unit))?;
        let (lo, hi) = self.domain_range;
        if lo == 0 || lo > hi {
            return bad("domain_range.start", u64::from(lo));
        }
        if hi >= u.domains() {
            return bad("domain_range.end", u64::from(hi));
        }
        for &sid in &self.endpoints {
            if system.unit_of(sid).map(|(id, _)| id) != Some(unit) {
                return Err(ViommuError::EndpointNotInUnit { sid, unit });
            }
        }
        if self.table_frames == 0 {
            return bad("table_frames", 0);
        }
        if self.max_mappings == 0 {
            return bad("max_mappings", 0);
        }
        let props = self.reserved.len().saturating_add(1);
        let need = props.saturating_mul(RESV_MEM_PROP);
        if (self.probe_size as usize) < need
            || !self.probe_size.is_multiple_of(4)
            || self.probe_size > MAX_PROBE_SIZE
        {
            return bad("probe_size", u64::from(self.probe_size));
        }
        // Each region granule-aligned, inside the input range, apart from
        // the MSI window and from every other: PROBE reports each once
        // with one subtype, so an overlap would describe an address twice
        // (and two ways).
        for (i, &(a, b)) in self.reserved.iter().enumerate() {
            if a > b || !a.is_multiple_of(GRANULE) || !b.wrapping_add(1).is_multiple_of(GRANULE) {
                return bad("reserved", a);
            }
            if b > INPUT_END {
                return bad("reserved", a);
            }
            let meets = |&(c, d): &(u64, u64)| a <= d && c <= b;
            if meets(&(s::MSI_START, s::MSI_END)) || self.reserved[..i].iter().any(meets) {
                return bad("reserved", a);
            }
        }
        if !self.queue_max.is_power_of_two() {
            return bad("queue_max", u64::from(self.queue_max));
        }
        if self.batch == 0 {
            return bad("batch", 0);
        }
        if self.invalidation_timeout.is_zero() {
            return bad("invalidation_timeout", 0);
        }
        if self.fault_batch == 0 {
            return bad("fault_batch", 0);
        }
        Ok(())
    }

    /// The features offered (§5.13.3): every one but the superseded
    /// `VIRTIO_IOMMU_F_BYPASS` (§5.13.3.2: not with `BYPASS_CONFIG`).
    pub fn features(&self) -> u64 {
        [
            s::F_INPUT_RANGE,
            s::F_DOMAIN_RANGE,
            s::F_MAP_UNMAP,
            s::F_PROBE,
            s::F_MMIO,
            s::F_BYPASS_CONFIG,
        ]
        .iter()
        .fold(0, |f, b| f | 1 << b)
    }

    /// The configuration space (§5.13.4), little-endian.
    pub fn config_space(&self) -> Vec<u8> {
        let mut c = vec![0u8; s::CONFIG_LEN];
        let mut put = |at: usize, b: &[u8]| c[at..at + b.len()].copy_from_slice(b);
        put(s::CFG_PAGE_SIZE_MASK, &PAGE_SIZE_MASK.to_le_bytes());
        put(s::CFG_INPUT_START, &0u64.to_le_bytes());
        put(s::CFG_INPUT_END, &INPUT_END.to_le_bytes());
        put(s::CFG_DOMAIN_START, &self.domain_range.0.to_le_bytes());
        put(s::CFG_DOMAIN_END, &self.domain_range.1.to_le_bytes());
        put(s::CFG_PROBE_SIZE, &self.probe_size.to_le_bytes());
        put(s::CFG_BYPASS, &[u8::from(self.bypass)]);
        c
    }
}
