//! The virtio-net frame code (virtio 1.2 §5.1.6) shared by every
//! virtio-net device of the workspace, generic over where its DMA is
//! translated ([`DeviceDma`]): a transmit chain's header and frame copied
//! out, a received frame and its header copied into a receive chain. The
//! device behind a softiommu unit (`NetDevice`) and the vhost-user
//! back-end of `softiommu-vhost` both move their frames with it; each
//! keeps its own policy for chains of the wrong size and for faults.

use softiommu::hw::Access;

use super::hdr::HDR_LEN;
use crate::device_dma::DeviceDma;
use crate::transport::ChainDesc;

/// A buffer access of a frame copy that the translation refused; the copy
/// stopped there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("frame DMA {access} at IOVA {iova:#x}: {fault}")]
pub struct FrameFault<F: std::error::Error> {
    /// The IOVA of the refused access.
    pub iova: u64,
    /// Read (transmit) or write (receive).
    pub access: Access,
    /// What the translation said.
    pub fault: F,
}

/// Copies a chain's bytes out through `dma`: the first [`HDR_LEN`] into
/// `hdr`, the next `frame.len()` into `frame`; bytes past them are not
/// read (an empty `frame` reads the header alone).
pub fn gather_frame<D: DeviceDma>(
    dma: &mut D,
    chain: &[ChainDesc],
    hdr: &mut [u8; HDR_LEN],
    frame: &mut [u8],
) -> Result<(), FrameFault<D::Fault>> {
    let mut pos = 0usize;
    for d in chain {
        let mut addr = d.addr;
        let mut left = d.len as usize;
        while left > 0 {
            let (dst, take) = if pos < HDR_LEN {
                let n = left.min(HDR_LEN - pos);
                (&mut hdr[pos..pos + n], n)
            } else {
                let off = pos - HDR_LEN;
                let n = left.min(frame.len().saturating_sub(off));
                if n == 0 {
                    return Ok(());
                }
                (&mut frame[off..off + n], n)
            };
            dma.read(addr, dst).map_err(|fault| FrameFault {
                iova: addr,
                access: Access::Read,
                fault,
            })?;
            pos += take;
            left -= take;
            // Past a successful access of `take` bytes: a descriptor
            // running past 2^64 fails that access, never wraps here.
            addr = addr.wrapping_add(take as u64);
        }
    }
    Ok(())
}

/// Copies `hdr` then `frame` into a chain's buffers through `dma`, in
/// order, up to the chain's length (the caller checks that the chain holds
/// `HDR_LEN + frame.len()` bytes).
pub fn scatter_frame<D: DeviceDma>(
    dma: &mut D,
    chain: &[ChainDesc],
    hdr: &[u8; HDR_LEN],
    frame: &[u8],
) -> Result<(), FrameFault<D::Fault>> {
    let total = HDR_LEN + frame.len();
    let mut pos = 0usize;
    for d in chain {
        let mut addr = d.addr;
        let mut left = d.len as usize;
        while left > 0 && pos < total {
            let (src, take) = if pos < HDR_LEN {
                let n = left.min(HDR_LEN - pos);
                (&hdr[pos..pos + n], n)
            } else {
                let off = pos - HDR_LEN;
                let n = left.min(frame.len() - off);
                (&frame[off..off + n], n)
            };
            dma.write(addr, src).map_err(|fault| FrameFault {
                iova: addr,
                access: Access::Write,
                fault,
            })?;
            pos += take;
            left -= take;
            addr = addr.wrapping_add(take as u64);
        }
    }
    Ok(())
}
