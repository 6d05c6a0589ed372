//! [`Status`]: the `status` byte of a request's tail (virtio 1.2 §5.13.6).

use crate::spec::iommu as s;

/// The outcome of one request, as the device writes it in the tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// `VIRTIO_IOMMU_S_OK`.
    Ok,
    /// `VIRTIO_IOMMU_S_IOERR`: virtio communication error.
    IoErr,
    /// `VIRTIO_IOMMU_S_UNSUPP`: unsupported request.
    Unsupp,
    /// `VIRTIO_IOMMU_S_DEVERR`: internal device error.
    DevErr,
    /// `VIRTIO_IOMMU_S_INVAL`: invalid parameters.
    Inval,
    /// `VIRTIO_IOMMU_S_RANGE`: out-of-range parameters.
    Range,
    /// `VIRTIO_IOMMU_S_NOENT`: entry not found.
    NoEnt,
    /// `VIRTIO_IOMMU_S_FAULT`: bad address.
    Fault,
    /// `VIRTIO_IOMMU_S_NOMEM`: insufficient resources.
    NoMem,
}

impl Status {
    /// The byte §5.13.6 gives it.
    pub fn code(self) -> u8 {
        match self {
            Status::Ok => s::S_OK,
            Status::IoErr => s::S_IOERR,
            Status::Unsupp => s::S_UNSUPP,
            Status::DevErr => s::S_DEVERR,
            Status::Inval => s::S_INVAL,
            Status::Range => s::S_RANGE,
            Status::NoEnt => s::S_NOENT,
            Status::Fault => s::S_FAULT,
            Status::NoMem => s::S_NOMEM,
        }
    }

    /// The status a byte names, `None` for a byte §5.13.6 does not define.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            s::S_OK => Status::Ok,
            s::S_IOERR => Status::IoErr,
            s::S_UNSUPP => Status::Unsupp,
            s::S_DEVERR => Status::DevErr,
            s::S_INVAL => Status::Inval,
            s::S_RANGE => Status::Range,
            s::S_NOENT => Status::NoEnt,
            s::S_FAULT => Status::Fault,
            s::S_NOMEM => Status::NoMem,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for c in 0..=8u8 {
            assert_eq!(Status::from_code(c).map(Status::code), Some(c));
        }
        assert_eq!(Status::from_code(9), None);
    }
}
