//! The front-end's IOTLB as a [`DeviceDma`]: the request code of
//! `softiommu-virtio` (shared with the devices behind a softiommu unit)
//! moves a device's buffers through a [`DmaSpace`] with it.
//!
//! Buffer addresses translate as descriptors' buffers do
//! ([`AddrKind::Buffer`]: IOVAs under `ACCESS_PLATFORM`, else
//! guest-physical); misses are asked of the front-end and waited for
//! within the space's bound. A wait cancelled because the rings stop
//! ([`AccessError::Cancelled`]) aborts the request: it is left on the
//! ring, uncompleted.

use softiommu_virtio::device_dma::DeviceDma;

use crate::error::AccessError;
use crate::space::{AddrKind, DmaSpace};

impl DeviceDma for &DmaSpace {
    type Fault = AccessError;

    #[inline]
    fn read(&mut self, iova: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        self.read_bytes(AddrKind::Buffer, iova, buf)
    }

    #[inline]
    fn write(&mut self, iova: u64, buf: &[u8]) -> Result<(), AccessError> {
        self.write_bytes(AddrKind::Buffer, iova, buf)
    }

    fn is_abort(fault: &AccessError) -> bool {
        matches!(fault, AccessError::Cancelled { .. })
    }
}
