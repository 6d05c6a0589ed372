//! [`DeviceDma`]: where a device's DMA is translated — the one seam
//! between a device's request code and the IOMMU in front of it.
//!
//! The request code of a device (a virtio-blk request's header, checks,
//! data and status: [`blk::BlkRequests`](crate::blk::BlkRequests)) moves
//! guest bytes only through this trait, so the same code runs behind a
//! softiommu unit ([`UnitDma`]: a [`DmaAccessor`] with the device's copy
//! ordering) and behind a vhost-user front-end's IOTLB (the
//! `softiommu-vhost` crate's `DmaSpace`). Callers are generic over it, so
//! each path is monomorphised: no virtual call per access.
//!
//! # Contract
//! - [`read`](DeviceDma::read) and [`write`](DeviceDma::write) move all of
//!   the buffer at the IOVA or fail with a typed
//!   [`Fault`](DeviceDma::Fault); a failed write has written no byte of
//!   guest memory the translation refused.
//! - [`is_abort`](DeviceDma::is_abort) names the faults that are not the
//!   request's doing but the device's: it is being stopped while the
//!   access waited (a vhost-user ring stop cancelling a miss). Request code
//!   does not complete a request that met one; it hands the fault back.

use softiommu::access::{AccessError, DmaAccessor, DmaAttrs};

/// Where a device's DMA is translated: reads and writes of guest memory
/// by IOVA, each refused access a typed fault.
pub trait DeviceDma {
    /// Why an access did not happen (no byte moved where it was refused).
    type Fault: std::error::Error + Send + Sync + 'static;

    /// Copies `buf.len()` bytes at `iova` into `buf` (the device reads).
    fn read(&mut self, iova: u64, buf: &mut [u8]) -> Result<(), Self::Fault>;

    /// Copies `buf` to `iova` (the device writes).
    fn write(&mut self, iova: u64, buf: &[u8]) -> Result<(), Self::Fault>;

    /// Whether `fault` means the device is being stopped (the request must
    /// be left uncompleted), not that the request's memory was refused.
    fn is_abort(fault: &Self::Fault) -> bool {
        let _ = fault;
        false
    }
}

impl<D: DeviceDma + ?Sized> DeviceDma for &mut D {
    type Fault = D::Fault;

    fn read(&mut self, iova: u64, buf: &mut [u8]) -> Result<(), Self::Fault> {
        (**self).read(iova, buf)
    }

    fn write(&mut self, iova: u64, buf: &[u8]) -> Result<(), Self::Fault> {
        (**self).write(iova, buf)
    }

    fn is_abort(fault: &Self::Fault) -> bool {
        D::is_abort(fault)
    }
}

/// A device's DMA through a softiommu unit: its [`DmaAccessor`] (its own
/// translator) and the ordering its buffer copies use (seed `001`).
#[derive(Debug)]
pub struct UnitDma {
    /// The accessor every access goes through.
    pub accessor: DmaAccessor,
    /// How buffer copies are ordered.
    pub attrs: DmaAttrs,
}

impl UnitDma {
    /// A unit path over `accessor`, copies ordered by `attrs`.
    pub fn new(accessor: DmaAccessor, attrs: DmaAttrs) -> Self {
        Self { accessor, attrs }
    }
}

impl DeviceDma for UnitDma {
    type Fault = AccessError;

    #[inline]
    fn read(&mut self, iova: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        self.accessor.read(iova, buf, self.attrs)
    }

    #[inline]
    fn write(&mut self, iova: u64, buf: &[u8]) -> Result<(), AccessError> {
        self.accessor.write(iova, buf, self.attrs)
    }
}
