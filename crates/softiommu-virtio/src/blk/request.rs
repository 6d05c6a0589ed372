//! One block request as the device reads it (virtio 1.2 §5.2.6): the
//! walked chain split into header, data segments and status byte, the
//! header decoded, and every check a request must pass before a byte of
//! data moves — each failure a [`RequestError`] with the status it
//! completes with.
//!
//! Two kinds of bad input are told apart, as QEMU does: a chain whose
//! *shape* is wrong (no readable header, no writable status byte) cannot
//! be completed at all and breaks the queue (a
//! [`DeviceError`](crate::transport::DeviceError), `DEVICE_NEEDS_RESET`);
//! a well-shaped request that asks for something wrong (past the end,
//! unaligned, too many segments, an unknown type, a buffer the IOMMU
//! refuses) completes with `VIRTIO_BLK_S_IOERR` or `VIRTIO_BLK_S_UNSUPP`
//! and the queue goes on.

use softiommu::hw::Access;

use crate::spec::blk::{self, SECTOR_SIZE};
use crate::transport::ChainDesc;

/// A request's operation, from the header's `type` (§5.2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlkOp {
    /// `VIRTIO_BLK_T_IN`: read sectors into the data buffers.
    Read,
    /// `VIRTIO_BLK_T_OUT`: write the data buffers to sectors.
    Write,
    /// `VIRTIO_BLK_T_FLUSH`: make completed writes durable.
    Flush,
    /// `VIRTIO_BLK_T_GET_ID`: the device id string.
    GetId,
}

impl BlkOp {
    /// The header's `type` value.
    pub fn type_code(self) -> u32 {
        match self {
            BlkOp::Read => blk::T_IN,
            BlkOp::Write => blk::T_OUT,
            BlkOp::Flush => blk::T_FLUSH,
            BlkOp::GetId => blk::T_GET_ID,
        }
    }

    /// The op for a `type` value, if we serve it.
    pub fn from_type(t: u32) -> Option<Self> {
        match t {
            blk::T_IN => Some(BlkOp::Read),
            blk::T_OUT => Some(BlkOp::Write),
            blk::T_FLUSH => Some(BlkOp::Flush),
            blk::T_GET_ID => Some(BlkOp::GetId),
            _ => None,
        }
    }

    /// Whether the device writes the data buffers (they are device-writable
    /// descriptors).
    pub fn device_writes(self) -> bool {
        matches!(self, BlkOp::Read | BlkOp::GetId)
    }
}

/// The request header (`struct virtio_blk_outhdr`, §5.2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkHeader {
    /// `type`.
    pub type_: u32,
    /// `reserved` (Linux's `ioprio`).
    pub reserved: u32,
    /// `sector`: the first 512-byte sector.
    pub sector: u64,
}

impl BlkHeader {
    /// Decodes the 16 little-endian bytes of a header.
    pub fn decode(b: &[u8; blk::HDR_LEN]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[8..16]);
        Self {
            type_: u32_at(0),
            reserved: u32_at(4),
            sector: u64::from_le_bytes(s),
        }
    }

    /// Encodes it.
    pub fn encode(&self) -> [u8; blk::HDR_LEN] {
        let mut b = [0u8; blk::HDR_LEN];
        b[0..4].copy_from_slice(&self.type_.to_le_bytes());
        b[4..8].copy_from_slice(&self.reserved.to_le_bytes());
        b[8..16].copy_from_slice(&self.sector.to_le_bytes());
        b
    }
}

/// Why a well-shaped request was not carried out. Each completes the
/// request with [`status`](Self::status); none breaks the queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A `type` the device does not serve (§5.2.6: "unsupported").
    #[error("request type {type_} is not supported")]
    Unsupported {
        /// The header's type.
        type_: u32,
    },
    /// `VIRTIO_BLK_T_FLUSH` without `VIRTIO_BLK_F_FLUSH` negotiated.
    #[error("flush requested but VIRTIO_BLK_F_FLUSH was not negotiated")]
    FlushNotNegotiated,
    /// Data bytes in the direction the type does not move (readable data
    /// after the header of a read, writable data before the status of a
    /// write).
    #[error("a {op:?} request carries {bytes} bytes in the wrong direction")]
    WrongDirection {
        /// The op.
        op: BlkOp,
        /// The extra bytes.
        bytes: u64,
    },
    /// A data length that is not a multiple of the block size (§5.2.6.1:
    /// "a multiple of 512 bytes"; a back-end that needs more alignment,
    /// `O_DIRECT`, is given it: `BlkBackend::io_align`).
    #[error("{len} data bytes is not a multiple of the block size {blk_size}")]
    LengthUnaligned {
        /// The data length.
        len: u64,
        /// The block size.
        blk_size: u32,
    },
    /// A first sector that is not on a block boundary.
    #[error("sector {sector} is not aligned to the block size {blk_size}")]
    SectorUnaligned {
        /// The sector.
        sector: u64,
        /// The block size.
        blk_size: u32,
    },
    /// Sectors past the end of the disk (or an offset that overflows).
    #[error("{len} bytes from sector {sector} go past the end ({capacity_sectors} sectors)")]
    PastEnd {
        /// The first sector.
        sector: u64,
        /// The data length.
        len: u64,
        /// The disk's size.
        capacity_sectors: u64,
    },
    /// More data segments than `seg_max`.
    #[error("{segments} data segments, seg_max is {seg_max}")]
    TooManySegments {
        /// Segments in the request.
        segments: usize,
        /// The limit.
        seg_max: u32,
    },
    /// A data segment longer than `size_max`.
    #[error("a data segment of {len} bytes, size_max is {size_max}")]
    SegmentTooLarge {
        /// The segment's length.
        len: u64,
        /// The limit.
        size_max: u32,
    },
    /// More data than the device takes in one request.
    #[error("{len} data bytes, the most per request is {max}")]
    TooLarge {
        /// The data length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The IOMMU refused a data or header access (unmapped, read-only,
    /// revoked): the unit logged the fault, no byte moved there.
    #[error("DMA {access} at IOVA {iova:#x} faulted: {reason}")]
    DmaFault {
        /// The IOVA.
        iova: u64,
        /// Read or write.
        access: Access,
        /// What the IOMMU said.
        reason: String,
    },
    /// The back-end failed (counted as an I/O error).
    #[error("back-end {op} of {len} bytes at byte {offset} failed: {reason}")]
    Backend {
        /// "read", "write" or "flush".
        op: &'static str,
        /// The byte offset.
        offset: u64,
        /// The length.
        len: u64,
        /// The OS's reason.
        reason: String,
    },
}

impl RequestError {
    /// The status byte the request completes with: `VIRTIO_BLK_S_UNSUPP`
    /// for what the device does not do, `VIRTIO_BLK_S_IOERR` otherwise.
    pub fn status(&self) -> u8 {
        match self {
            RequestError::Unsupported { .. } | RequestError::FlushNotNegotiated => blk::S_UNSUPP,
            _ => blk::S_IOERR,
        }
    }
}

/// Where a chain's bytes are: readable ones (header, then a write's data),
/// then writable ones (a read's data, then the status byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Readable bytes.
    pub(crate) readable: u64,
    /// Writable bytes.
    pub(crate) writable: u64,
    /// The status byte's IOVA: the last writable byte.
    pub(crate) status: u64,
}

/// The shape of a walked chain, or `None` when it has no room for a header
/// and a status byte (or its last byte's address overflows).
pub(crate) fn shape(chain: &[ChainDesc]) -> Option<Shape> {
    let (mut readable, mut writable) = (0u64, 0u64);
    for d in chain {
        let n = u64::from(d.len);
        if d.writable {
            writable = writable.checked_add(n)?;
        } else {
            readable = readable.checked_add(n)?;
        }
    }
    if readable < blk::HDR_LEN as u64 || writable == 0 {
        return None;
    }
    let last = chain.iter().rev().find(|d| d.writable && d.len > 0)?;
    let status = last.addr.checked_add(u64::from(last.len) - 1)?;
    Some(Shape {
        readable,
        writable,
        status,
    })
}

/// Collects into `out` the data segments of `chain`: the readable bytes
/// after the header (`writes == false`) or the writable bytes before the
/// status byte (`writes == true`), as `(iova, len)` pieces in order.
/// Returns the data's total length.
pub(crate) fn data_segments(
    chain: &[ChainDesc],
    shape: &Shape,
    writes: bool,
    out: &mut Vec<(u64, u32)>,
) -> u64 {
    out.clear();
    // The data window within the chosen direction's bytes.
    let (mut skip, mut take) = if writes {
        (0u64, shape.writable - 1)
    } else {
        (blk::HDR_LEN as u64, shape.readable - blk::HDR_LEN as u64)
    };
    let total = take;
    for d in chain.iter().filter(|d| d.writable == writes) {
        if take == 0 {
            break;
        }
        let len = u64::from(d.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(take);
        // In range: `skip < len` and `addr + len` was checked by the chain
        // lying in the IOVA space only as far as translation goes; wrap-
        // around is caught by the translation of the access itself.
        out.push((d.addr.wrapping_add(skip), n as u32));
        take -= n;
        skip = 0;
    }
    total
}

/// The limits a request is checked against: the device's configuration
/// (what it announced to the driver) and what was negotiated
/// ([`negotiated`](Self::negotiated)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkLimits {
    /// The disk's size in 512-byte sectors.
    pub capacity_sectors: u64,
    /// The block size data lengths and first sectors are multiples of.
    pub blk_size: u32,
    /// The most data segments per request.
    pub seg_max: u32,
    /// The longest data segment.
    pub size_max: u32,
    /// The most data bytes per request (the device's buffer).
    pub max_bytes: u64,
    /// Whether `VIRTIO_BLK_F_FLUSH` was negotiated.
    pub flush: bool,
}

impl BlkLimits {
    /// The limits under the driver's `features`: `FLUSH` as negotiated,
    /// and `seg_max` and `size_max` only where their features were (a
    /// driver that did not negotiate `SEG_MAX` was told no limit on
    /// segments, §5.2.3, so none is held against it beyond what bounds
    /// every chain, the queue size; likewise `SIZE_MAX`). `max_bytes`,
    /// the device's buffer, stays: the device announces it only through
    /// `seg_max` × `size_max`, which fit it (`BlkConfig::check`).
    pub fn negotiated(&self, features: u64) -> Self {
        let has = |bit: u32| features & 1 << bit != 0;
        Self {
            flush: has(blk::F_FLUSH),
            seg_max: if has(blk::F_SEG_MAX) {
                self.seg_max
            } else {
                u32::MAX
            },
            size_max: if has(blk::F_SIZE_MAX) {
                self.size_max
            } else {
                u32::MAX
            },
            ..*self
        }
    }
}

/// What the device will do for a request that passed its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkPlan {
    /// The operation.
    pub op: BlkOp,
    /// Byte offset on the disk (reads and writes).
    pub offset: u64,
    /// Data bytes.
    pub len: u64,
}

/// Checks a decoded request against the limits. `segs` are its data
/// segments (from [`data_segments`] in the op's direction) and `other`
/// the data bytes in the other direction (which must be none).
pub(crate) fn check(
    h: &BlkHeader,
    shape: &Shape,
    segs: &[(u64, u32)],
    len: u64,
    lim: &BlkLimits,
) -> Result<BlkPlan, RequestError> {
    let op = BlkOp::from_type(h.type_).ok_or(RequestError::Unsupported { type_: h.type_ })?;
    if op == BlkOp::Flush && !lim.flush {
        return Err(RequestError::FlushNotNegotiated);
    }
    // Bytes in the direction the op does not move data.
    let other = if op.device_writes() {
        shape.readable - blk::HDR_LEN as u64
    } else {
        shape.writable - 1
    };
    if matches!(op, BlkOp::Read | BlkOp::Write) && other != 0 {
        return Err(RequestError::WrongDirection { op, bytes: other });
    }
    match op {
        BlkOp::Flush => Ok(BlkPlan {
            op,
            offset: 0,
            len: 0,
        }),
        BlkOp::GetId => Ok(BlkPlan {
            op,
            offset: 0,
            len: len.min(blk::ID_BYTES as u64),
        }),
        BlkOp::Read | BlkOp::Write => {
            let bs = u64::from(lim.blk_size);
            if !len.is_multiple_of(bs) {
                return Err(RequestError::LengthUnaligned {
                    len,
                    blk_size: lim.blk_size,
                });
            }
            let past = || RequestError::PastEnd {
                sector: h.sector,
                len,
                capacity_sectors: lim.capacity_sectors,
            };
            let offset = h.sector.checked_mul(SECTOR_SIZE).ok_or_else(past)?;
            if offset % bs != 0 {
                return Err(RequestError::SectorUnaligned {
                    sector: h.sector,
                    blk_size: lim.blk_size,
                });
            }
            let end = offset.checked_add(len).ok_or_else(past)?;
            if end > lim.capacity_sectors.saturating_mul(SECTOR_SIZE) {
                return Err(past());
            }
            if segs.len() > lim.seg_max as usize {
                return Err(RequestError::TooManySegments {
                    segments: segs.len(),
                    seg_max: lim.seg_max,
                });
            }
            if let Some(&(_, n)) = segs.iter().find(|s| s.1 > lim.size_max) {
                return Err(RequestError::SegmentTooLarge {
                    len: n.into(),
                    size_max: lim.size_max,
                });
            }
            if len > lim.max_bytes {
                return Err(RequestError::TooLarge {
                    len,
                    max: lim.max_bytes,
                });
            }
            Ok(BlkPlan { op, offset, len })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(addr: u64, len: u32, writable: bool) -> ChainDesc {
        ChainDesc {
            addr,
            len,
            writable,
            index: 0,
        }
    }

    const LIM: BlkLimits = BlkLimits {
        capacity_sectors: 2048,
        blk_size: 512,
        seg_max: 4,
        size_max: 4096,
        max_bytes: 16384,
        flush: true,
    };

    fn hdr(type_: u32, sector: u64) -> BlkHeader {
        BlkHeader {
            type_,
            reserved: 0,
            sector,
        }
    }

    #[test]
    fn limits_hold_only_as_negotiated() {
        let none = LIM.negotiated(0);
        assert_eq!(
            (none.flush, none.seg_max, none.size_max),
            (false, u32::MAX, u32::MAX)
        );
        // The buffer and the disk bind whatever was negotiated.
        assert_eq!((none.max_bytes, none.capacity_sectors), (16384, 2048));
        let all = LIM.negotiated(1 << blk::F_FLUSH | 1 << blk::F_SEG_MAX | 1 << blk::F_SIZE_MAX);
        assert_eq!(all, LIM);
    }

    #[test]
    fn a_header_round_trips() {
        let h = hdr(blk::T_OUT, 0x1234_5678_9abc);
        assert_eq!(BlkHeader::decode(&h.encode()), h);
    }

    #[test]
    fn the_shape_needs_a_header_and_a_status_byte() {
        assert_eq!(shape(&[d(0, 16, false)]), None);
        assert_eq!(shape(&[d(0, 15, false), d(100, 1, true)]), None);
        let s = shape(&[d(0, 16, false), d(100, 4096, true), d(9000, 1, true)]).unwrap();
        assert_eq!((s.readable, s.writable, s.status), (16, 4097, 9000));
        assert_eq!(shape(&[d(0, 16, false), d(u64::MAX, 2, true)]), None);
    }

    #[test]
    fn data_segments_skip_the_header_and_the_status() {
        // A write with the header and the first data in one descriptor.
        let chain = [
            d(0x1000, 16 + 512, false),
            d(0x9000, 512, false),
            d(0x20, 1, true),
        ];
        let s = shape(&chain).unwrap();
        let mut out = Vec::new();
        assert_eq!(data_segments(&chain, &s, false, &mut out), 1024);
        assert_eq!(out, [(0x1010, 512), (0x9000, 512)]);
        // A read whose status shares the last data descriptor.
        let chain = [d(0x1000, 16, false), d(0x4000, 1024 + 1, true)];
        let s = shape(&chain).unwrap();
        assert_eq!(data_segments(&chain, &s, true, &mut out), 1024);
        assert_eq!(out, [(0x4000, 1024)]);
    }

    #[test]
    fn every_bad_request_has_its_error_and_status() {
        let rd = [d(0, 16, false), d(0x4000, 1024, true), d(0x20, 1, true)];
        let s = shape(&rd).unwrap();
        let segs = [(0x4000u64, 1024u32)];
        let ok = check(&hdr(blk::T_IN, 8), &s, &segs, 1024, &LIM).unwrap();
        assert_eq!((ok.op, ok.offset, ok.len), (BlkOp::Read, 4096, 1024));
        type Case<'a> = (BlkHeader, u64, &'a [(u64, u32)], BlkLimits, RequestError);
        let cases: [Case<'_>; 7] = [
            (
                hdr(99, 0),
                1024,
                &segs,
                LIM,
                RequestError::Unsupported { type_: 99 },
            ),
            (
                hdr(blk::T_IN, 2047),
                1024,
                &segs,
                LIM,
                RequestError::PastEnd {
                    sector: 2047,
                    len: 1024,
                    capacity_sectors: 2048,
                },
            ),
            (
                hdr(blk::T_IN, u64::MAX / 256),
                1024,
                &segs,
                LIM,
                RequestError::PastEnd {
                    sector: u64::MAX / 256,
                    len: 1024,
                    capacity_sectors: 2048,
                },
            ),
            (
                hdr(blk::T_IN, 0),
                1000,
                &segs,
                LIM,
                RequestError::LengthUnaligned {
                    len: 1000,
                    blk_size: 512,
                },
            ),
            (
                hdr(blk::T_IN, 1),
                4096,
                &segs,
                BlkLimits {
                    blk_size: 4096,
                    ..LIM
                },
                RequestError::SectorUnaligned {
                    sector: 1,
                    blk_size: 4096,
                },
            ),
            (
                hdr(blk::T_IN, 0),
                1024,
                &[(0, 512); 5],
                LIM,
                RequestError::TooManySegments {
                    segments: 5,
                    seg_max: 4,
                },
            ),
            (
                hdr(blk::T_FLUSH, 0),
                0,
                &segs,
                BlkLimits {
                    flush: false,
                    ..LIM
                },
                RequestError::FlushNotNegotiated,
            ),
        ];
        for (h, len, segs, lim, want) in cases {
            let e = check(&h, &s, segs, len, &lim).unwrap_err();
            assert_eq!(e, want);
        }
        assert_eq!(
            RequestError::Unsupported { type_: 3 }.status(),
            blk::S_UNSUPP
        );
        assert_eq!(RequestError::FlushNotNegotiated.status(), blk::S_UNSUPP);
        let e = check(&hdr(blk::T_IN, 0), &s, &[(0, 8192)], 8192, &LIM).unwrap_err();
        assert!(matches!(e, RequestError::SegmentTooLarge { len: 8192, .. }));
        assert_eq!(e.status(), blk::S_IOERR);
        // A write with writable data before its status.
        let e = check(&hdr(blk::T_OUT, 0), &s, &segs, 0, &LIM).unwrap_err();
        assert!(matches!(
            e,
            RequestError::WrongDirection {
                op: BlkOp::Write,
                bytes: 1024
            }
        ));
    }
}
