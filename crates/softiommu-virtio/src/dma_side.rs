//! [`DmaSide`]: where a device's DMA is translated, as the device's
//! threads attach to it — what `BlkDevice::spawn_on` and
//! `NetDevice::spawn_on` take instead of a `System` and a source id.
//!
//! A device thread attaches once, on itself (translators are per thread),
//! and gets its [`Attached`] parts: the [`RingMemory`] its queues reach
//! the rings through, the [`DeviceDma`] its request and frame code move
//! buffers through, and a [`DmaFence`] that says how a turn of work is
//! held against the translation's invalidations. [`UnitSide`] is the
//! softiommu unit's (vm-memory's `IommuMemory` over the unit, a
//! [`UnitDma`], the unit's translation sections); another translation —
//! a vhost-user front-end's IOTLB — implements the same three.
//!
//! Everything is generic, so each side is monomorphised: no virtual call
//! per access.

use std::sync::Arc;

use softiommu::access::{DmaAccessor, DmaAttrs, PhysGuestMemory, UnitIommu};
use softiommu::hw::{HwError, SourceId, System};
use vm_memory::IommuMemory;

use crate::device_dma::{DeviceDma, UnitDma};
use crate::transport::{DeviceMemory, RingMemory};

/// How a device thread holds a turn of work against invalidations.
pub trait DmaFence: Clone {
    /// Runs `f` so that an invalidation of the translation waits until it
    /// returns (every access inside completes before the invalidation's
    /// wait does).
    fn section<R>(&self, f: impl FnMut() -> R) -> R;

    /// Whether the device's accesses may fault and wait for a page
    /// request's answer (IOPF mode): then no section may span a turn,
    /// since the answer may be queued behind the invalidation it holds up.
    fn may_fault(&self) -> bool;
}

/// One device thread's parts of a [`DmaSide`].
#[derive(Debug)]
pub struct Attached<S: DmaSide> {
    /// What the thread's queues reach the rings through.
    pub ring: S::Ring,
    /// What its request and frame code move buffers through.
    pub dma: S::Dma,
    /// How it holds a turn against invalidations.
    pub fence: S::Fence,
}

/// Where a device's DMA is translated: what its threads attach to.
pub trait DmaSide: Clone + Send + 'static {
    /// A thread's view of the rings.
    type Ring: RingMemory;
    /// A thread's buffer DMA.
    type Dma: DeviceDma;
    /// A thread's fence.
    type Fence: DmaFence;
    /// Why a thread could not attach.
    type Error;

    /// The device's name (its threads' names; `VIRTIO_BLK_T_GET_ID`).
    fn name(&self) -> String;

    /// Attaches the calling thread.
    fn attach(&self) -> Result<Attached<Self>, Self::Error>;
}

/// Why a thread could not attach to a softiommu unit: the device's source
/// id has no unit, or its translator could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitAttachError {
    /// The device.
    pub sid: SourceId,
    /// What the unit said.
    pub source: HwError,
}

/// A device's DMA through the softiommu unit `sid` is attached to: rings
/// through vm-memory's `IommuMemory` over the unit, buffers through a
/// [`DmaAccessor`] with copies ordered by `attrs`, turns in the unit's
/// translation sections (none spanning a turn in IOPF mode).
#[derive(Debug, Clone)]
pub struct UnitSide {
    system: Arc<System>,
    sid: SourceId,
    attrs: DmaAttrs,
}

impl UnitSide {
    /// Device `sid` of `system`, buffer copies ordered by `attrs`.
    pub fn new(system: Arc<System>, sid: SourceId, attrs: DmaAttrs) -> Self {
        Self { system, sid, attrs }
    }
}

/// A unit's translation sections, for one thread.
#[derive(Debug, Clone)]
pub struct UnitFence {
    view: UnitIommu,
    system: Arc<System>,
}

impl DmaFence for UnitFence {
    fn section<R>(&self, mut f: impl FnMut() -> R) -> R {
        // No translator for the section (cannot happen once the thread
        // attached): each access still holds its own.
        self.view.section(&mut f).unwrap_or_else(|_| f())
    }

    fn may_fault(&self) -> bool {
        crate::iopf_mode::may_fault(&self.system, self.view.source_id())
    }
}

impl DmaSide for UnitSide {
    type Ring = DeviceMemory;
    type Dma = UnitDma;
    type Fence = UnitFence;
    type Error = UnitAttachError;

    fn name(&self) -> String {
        self.sid.to_string()
    }

    fn attach(&self) -> Result<Attached<Self>, UnitAttachError> {
        let sid = self.sid;
        let err = |source| UnitAttachError { sid, source };
        let (_, unit) = self
            .system
            .unit_of(sid)
            .ok_or(err(HwError::DeviceNotAssigned { sid }))?;
        let dma = DmaAccessor::new(unit, sid).map_err(err)?;
        let view = UnitIommu::new(self.system.clone(), sid).map_err(err)?;
        let ring = IommuMemory::new(
            PhysGuestMemory::behind_iommu(self.system.memory().clone()),
            view.clone(),
            true,
            (),
        );
        Ok(Attached {
            ring,
            dma: UnitDma::new(dma, self.attrs),
            fence: UnitFence {
                view,
                system: self.system.clone(),
            },
        })
    }
}

/// A test side: the unit's, with every ring and buffer access counted.
#[cfg(test)]
pub(crate) mod counting {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A side that is the unit's, with every ring access and every buffer
    /// access counted on the way.
    #[derive(Debug, Clone)]
    pub(crate) struct Counting {
        inner: UnitSide,
        /// Ring accesses so far.
        pub(crate) ring: Arc<AtomicU64>,
        /// Buffer accesses so far.
        pub(crate) dma: Arc<AtomicU64>,
    }

    impl Counting {
        pub(crate) fn new(inner: UnitSide) -> Self {
            Self {
                inner,
                ring: Arc::default(),
                dma: Arc::default(),
            }
        }
    }

    pub(crate) struct CountedRing(DeviceMemory, Arc<AtomicU64>);

    impl RingMemory for CountedRing {
        type Fault = vm_memory::GuestMemoryError;

        fn read_ring(&self, addr: u64, buf: &mut [u8]) -> Result<(), Self::Fault> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.read_ring(addr, buf)
        }

        fn write_ring(&self, addr: u64, buf: &[u8]) -> Result<(), Self::Fault> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.write_ring(addr, buf)
        }

        fn load_u16(&self, addr: u64, order: Ordering) -> Result<u16, Self::Fault> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.load_u16(addr, order)
        }

        fn store_u16(&self, addr: u64, v: u16, order: Ordering) -> Result<(), Self::Fault> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.store_u16(addr, v, order)
        }
    }

    pub(crate) struct CountedDma(UnitDma, Arc<AtomicU64>);

    impl DeviceDma for CountedDma {
        type Fault = softiommu::access::AccessError;

        fn read(&mut self, iova: u64, buf: &mut [u8]) -> Result<(), Self::Fault> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.read(iova, buf)
        }

        fn write(&mut self, iova: u64, buf: &[u8]) -> Result<(), Self::Fault> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.write(iova, buf)
        }
    }

    impl DmaSide for Counting {
        type Ring = CountedRing;
        type Dma = CountedDma;
        type Fence = UnitFence;
        type Error = UnitAttachError;

        fn name(&self) -> String {
            format!("counted {}", self.inner.name())
        }

        fn attach(&self) -> Result<Attached<Self>, UnitAttachError> {
            let a = self.inner.attach()?;
            Ok(Attached {
                ring: CountedRing(a.ring, self.ring.clone()),
                dma: CountedDma(a.dma, self.dma.clone()),
                fence: a.fence,
            })
        }
    }
}
