//! Reading a request's device-readable bytes and writing into its
//! device-writable part, across however many descriptors the driver used.
//! Guest RAM only: the device is not behind an IOMMU, and the view it is
//! given ([`PhysGuestMemory`]) refuses the unit's reserve.

use softiommu::access::PhysGuestMemory;
use vm_memory::{Bytes, GuestAddress};

use crate::transport::ChainDesc;

/// The chain's parts: readable descriptors, then writable ones (the
/// transport's walk checked the order).
#[derive(Debug, Default)]
pub(crate) struct Parts {
    /// Every descriptor of the chain.
    pub(crate) descs: Vec<ChainDesc>,
}

impl Parts {
    /// Total readable bytes (saturating: the walk bounds the count).
    pub(crate) fn readable_len(&self) -> u64 {
        self.descs
            .iter()
            .filter(|d| !d.writable)
            .fold(0u64, |a, d| a.saturating_add(u64::from(d.len)))
    }

    /// Total writable bytes.
    pub(crate) fn writable_len(&self) -> u64 {
        self.descs
            .iter()
            .filter(|d| d.writable)
            .fold(0u64, |a, d| a.saturating_add(u64::from(d.len)))
    }

    /// Copies the first `out.len()` readable bytes (fewer if the part is
    /// shorter) into `out`; returns how many. `Err` if guest memory
    /// refused an address.
    pub(crate) fn read(&self, mem: &PhysGuestMemory, out: &mut [u8]) -> Result<usize, ()> {
        let mut got = 0usize;
        for d in self.descs.iter().filter(|d| !d.writable) {
            if got == out.len() {
                break;
            }
            let n = (d.len as usize).min(out.len() - got);
            mem.read_slice(&mut out[got..got + n], GuestAddress(d.addr))
                .map_err(|_| ())?;
            got += n;
        }
        Ok(got)
    }

    /// Writes `bytes` at byte `offset` of the writable part (which the
    /// caller checked is long enough). `Err` if guest memory refused.
    pub(crate) fn write(&self, mem: &PhysGuestMemory, offset: u64, bytes: &[u8]) -> Result<(), ()> {
        let mut skip = offset;
        let mut rest = bytes;
        for d in self.descs.iter().filter(|d| d.writable) {
            if rest.is_empty() {
                break;
            }
            let len = u64::from(d.len);
            if skip >= len {
                skip -= len;
                continue;
            }
            // `skip < len <= u32::MAX`; the walk checked `addr + len` fits.
            let n = ((len - skip) as usize).min(rest.len());
            mem.write_slice(&rest[..n], GuestAddress(d.addr + skip))
                .map_err(|_| ())?;
            rest = &rest[n..];
            skip = 0;
        }
        if rest.is_empty() {
            Ok(())
        } else {
            Err(())
        }
    }
}
