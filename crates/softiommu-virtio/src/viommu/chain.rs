//! Reading a request's device-readable bytes and writing into its
//! device-writable part, across however many descriptors the driver used.
//! Guest RAM only: the device is not behind an IOMMU, and the view it is
//! given ([`PhysGuestMemory`]) refuses the unit's reserve; each buffer is
//! also checked against the bounce pools (RAM, but the DMA layer's own:
//! never a driver's request buffer).

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
    pub(crate) fn read(&self, mem: &PhysGuestMemory, out: &mut [u8]) -> Result<usize, usize> {
        let mut got = 0usize;
        for d in self.descs.iter().filter(|d| !d.writable) {
            if got == out.len() {
                break;
            }
            let n = (d.len as usize).min(out.len() - got);
            device_range(mem, d.addr, n).map_err(|()| got)?;
            mem.read_slice(&mut out[got..got + n], GuestAddress(d.addr))
                .map_err(|_| got)?;
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
            device_range(mem, d.addr + skip, n)?;
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

/// `Err` unless `[addr, addr + len)` is RAM a caller may hand a device:
/// not the unit's reserve, not a bounce pool.
fn device_range(mem: &PhysGuestMemory, addr: u64, len: usize) -> Result<(), ()> {
    mem.memory()
        .check_device_range(addr, len as u64)
        .map_err(|_| ())
}
