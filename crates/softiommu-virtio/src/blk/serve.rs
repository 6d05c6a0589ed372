//! [`BlkRequests`]: the one implementation of a virtio-blk request
//! (virtio 1.2 §5.2.6) — header, checks, data transfer, status byte —
//! generic over where the device's DMA is translated ([`DeviceDma`]).
//! The device threads of [`BlkDevice`](super::BlkDevice) (behind a
//! softiommu unit) and the vhost-user back-end of `softiommu-vhost`
//! (behind a front-end's IOTLB) both serve their chains with it; what
//! differs between them is only the ring, the sections around the DMA and
//! what a chain of the wrong shape does to the queue.
//!
//! A request runs in three steps, so that a caller can put the DMA before
//! and after a blocking back-end in sections of their own:
//! [`prepare`](BlkRequests::prepare) (header through the IOMMU, every
//! check, a write's data gathered into the buffer),
//! [`io`](BlkRequests::io) (the back-end, no DMA) and
//! [`finish`](BlkRequests::finish) (a read's data scattered, the status
//! byte written). [`serve`](BlkRequests::serve) runs all three.
//!
//! A data or header access the IOMMU refuses fails the request
//! (`VIRTIO_BLK_S_IOERR`, [`RequestError::DmaFault`]); a status byte the
//! device cannot write and a fault that [aborts](DeviceDma::is_abort) are
//! the caller's ([`ServeError`]).

use softiommu::hw::Access;

use super::backend::{AlignedBuf, BlkBackend};
use super::request::{self, BlkHeader, BlkLimits, BlkOp, BlkPlan, RequestError, Shape};
use crate::device_dma::DeviceDma;
use crate::spec::blk;
use crate::transport::ChainDesc;

/// Why a chain was not completed by the request code: the caller decides
/// what it does to the queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServeError<F: std::error::Error> {
    /// No readable 16-byte header or no writable status byte (or the
    /// status byte's address overflows).
    #[error("chain of the wrong shape: {readable} readable, {writable} writable bytes")]
    Shape {
        /// Readable bytes (saturating).
        readable: u64,
        /// Writable bytes (saturating).
        writable: u64,
    },
    /// The status byte could not be written (the request's outcome is
    /// in `done`, as if it had been).
    #[error("status byte at IOVA {iova:#x}: {fault}")]
    Status {
        /// Its IOVA.
        iova: u64,
        /// What the IOMMU said.
        fault: F,
        /// The outcome the status would have carried.
        done: Completed,
    },
    /// An access ended because the device is being stopped
    /// ([`DeviceDma::is_abort`]); the request is left uncompleted.
    #[error("DMA {access} at IOVA {iova:#x} aborted: {fault}")]
    Aborted {
        /// The IOVA.
        iova: u64,
        /// Read or write.
        access: Access,
        /// What the translation said.
        fault: F,
    },
}

/// A request after [`BlkRequests::prepare`]: checked (and a write's data
/// gathered), or already failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    shape: Shape,
    plan: Result<BlkPlan, RequestError>,
    /// `VIRTIO_BLK_F_FLUSH` not negotiated: a write is committed to the
    /// back-end's storage before it completes (§5.2.6.2: without FLUSH or
    /// CONFIG_WCE negotiated, writes are stable when they complete).
    stable_writes: bool,
}

impl Prepared {
    /// The plan, when the request has not failed.
    pub fn plan(&self) -> Option<BlkPlan> {
        self.plan.as_ref().ok().copied()
    }

    /// Why the request failed so far, if it did.
    pub fn error(&self) -> Option<&RequestError> {
        self.plan.as_ref().err()
    }
}

/// A completed request: its status byte is in guest memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The status written (`VIRTIO_BLK_S_*`).
    pub status: u8,
    /// The used length (virtio 1.2 §2.7.8.2: bytes written from the
    /// first device-writable byte on): the whole writable area — data,
    /// zeros past what the request produced, then the status byte — or,
    /// when the data area could not all be written (a data access the
    /// IOMMU refused, or an area longer than the device's buffer, which
    /// is not zero-filled), the data bytes written before that point.
    pub used_len: u32,
    /// What was done, when the request succeeded.
    pub plan: Option<BlkPlan>,
    /// Why it failed, when it did.
    pub error: Option<RequestError>,
}

/// One device thread's request code: the limits, the id string, and the
/// buffer one request's data passes through (at most
/// [`BlkLimits::max_bytes`]; allocated once).
#[derive(Debug)]
pub struct BlkRequests {
    limits: BlkLimits,
    id: [u8; blk::ID_BYTES],
    chain: Vec<ChainDesc>,
    segs: Vec<(u64, u32)>,
    scratch: AlignedBuf,
}

/// What a scatter did: the data bytes written before a refused segment
/// (all of them when none was), and the request's outcome.
type Scattered = (usize, Result<(), RequestError>);

fn fault<D: DeviceDma>(
    iova: u64,
    access: Access,
    f: D::Fault,
) -> Result<RequestError, ServeError<D::Fault>> {
    if D::is_abort(&f) {
        return Err(ServeError::Aborted {
            iova,
            access,
            fault: f,
        });
    }
    Ok(RequestError::DmaFault {
        iova,
        access,
        reason: f.to_string(),
    })
}

/// Turns an access's fault into the request's error, or hands an
/// aborting fault back.
fn outcome<D: DeviceDma>(
    iova: u64,
    access: Access,
    r: Result<(), D::Fault>,
) -> Result<Result<(), RequestError>, ServeError<D::Fault>> {
    match r {
        Ok(()) => Ok(Ok(())),
        Err(f) => fault::<D>(iova, access, f).map(Err),
    }
}

impl BlkRequests {
    /// Request code checking against `limits`, answering `GET_ID` with `id`,
    /// its buffer aligned to `align` (the back-end's
    /// [`buffer_align`](BlkBackend::buffer_align)).
    pub fn new(limits: BlkLimits, id: [u8; blk::ID_BYTES], align: usize) -> Self {
        Self {
            limits,
            id,
            chain: Vec::new(),
            segs: Vec::new(),
            scratch: AlignedBuf::new(limits.max_bytes as usize, align),
        }
    }

    /// The limits requests are checked against.
    pub fn limits(&self) -> &BlkLimits {
        &self.limits
    }

    /// The chain [`prepare`](Self::prepare) works on: the caller's walker
    /// fills it (cleared first), so that no request allocates.
    pub fn chain_mut(&mut self) -> &mut Vec<ChainDesc> {
        &mut self.chain
    }

    /// Reads the header of the chain in [`chain_mut`](Self::chain_mut)
    /// through `dma`, checks the request against the limits under the
    /// driver's `features` ([`BlkLimits::negotiated`]) and gathers a
    /// write's data into the buffer.
    pub fn prepare<D: DeviceDma>(
        &mut self,
        dma: &mut D,
        features: u64,
    ) -> Result<Prepared, ServeError<D::Fault>> {
        let Some(shape) = request::shape(&self.chain) else {
            let (mut readable, mut writable) = (0u64, 0u64);
            for d in &self.chain {
                let n = u64::from(d.len);
                if d.writable {
                    writable = writable.saturating_add(n);
                } else {
                    readable = readable.saturating_add(n);
                }
            }
            return Err(ServeError::Shape { readable, writable });
        };
        let lim = self.limits.negotiated(features);
        let plan = self.decode(dma, &shape, &lim)?;
        Ok(Prepared {
            shape,
            plan,
            stable_writes: !lim.flush,
        })
    }

    fn decode<D: DeviceDma>(
        &mut self,
        dma: &mut D,
        shape: &Shape,
        lim: &BlkLimits,
    ) -> Result<Result<BlkPlan, RequestError>, ServeError<D::Fault>> {
        let mut hb = [0u8; blk::HDR_LEN];
        let mut got = 0usize;
        // Zero-length descriptors carry nothing (§2.7.4.1: no assumption
        // on how the driver lays a header out): skipped, not read (the
        // accessor refuses a zero-length access).
        for d in self.chain.iter().filter(|d| !d.writable && d.len > 0) {
            if got == hb.len() {
                break;
            }
            let n = (d.len as usize).min(hb.len() - got);
            if let Err(e) = outcome::<D>(
                d.addr,
                Access::Read,
                dma.read(d.addr, &mut hb[got..got + n]),
            )? {
                return Ok(Err(e));
            }
            got += n;
        }
        let h = BlkHeader::decode(&hb);
        let Some(op) = BlkOp::from_type(h.type_) else {
            return Ok(Err(RequestError::Unsupported { type_: h.type_ }));
        };
        let len = request::data_segments(&self.chain, shape, op.device_writes(), &mut self.segs);
        let plan = match request::check(&h, shape, &self.segs, len, lim) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        if plan.op == BlkOp::Write {
            let buf = self.scratch.get_mut(plan.len as usize);
            let mut off = 0usize;
            for &(addr, n) in &self.segs {
                let n = n as usize;
                let r = dma.read(addr, &mut buf[off..off + n]);
                if let Err(e) = outcome::<D>(addr, Access::Read, r)? {
                    return Ok(Err(e));
                }
                off += n;
            }
        }
        Ok(Ok(plan))
    }

    /// The back-end I/O of a prepared request (no DMA: a caller may run it
    /// outside any section). A back-end failure fails the request
    /// ([`RequestError::Backend`]).
    pub fn io(&mut self, backend: &dyn BlkBackend, p: &mut Prepared) {
        let Ok(plan) = p.plan else {
            return;
        };
        let len = plan.len as usize;
        let (op, r) = match plan.op {
            BlkOp::Read => (
                "read",
                backend.read_at(plan.offset, self.scratch.get_mut(len)),
            ),
            BlkOp::Write => (
                "write",
                backend
                    .write_at(plan.offset, self.scratch.get_mut(len))
                    .and_then(|()| {
                        if p.stable_writes {
                            backend.flush()
                        } else {
                            Ok(())
                        }
                    }),
            ),
            BlkOp::Flush => ("flush", backend.flush()),
            BlkOp::GetId => return,
        };
        if let Err(e) = r {
            p.plan = Err(RequestError::Backend {
                op,
                offset: plan.offset,
                len: plan.len,
                reason: e.to_string(),
            });
        }
    }

    /// Scatters a read's data (or the id string) into the data segments
    /// through `dma`, zero-fills the rest of the data area (an error, the
    /// id string, a flush's extra bytes: never a successful read's, which
    /// fills it all) and writes the status byte.
    pub fn finish<D: DeviceDma>(
        &mut self,
        dma: &mut D,
        p: Prepared,
    ) -> Result<Completed, ServeError<D::Fault>> {
        let mut plan = p.plan;
        // Data bytes written from the first writable byte on, and whether
        // the next one was refused.
        let (mut written, mut refused) = (0u64, false);
        if let Ok(ok) = plan {
            let (n, r) = match ok.op {
                BlkOp::Read => self.scatter(dma, ok.len as usize, false)?,
                BlkOp::GetId => self.scatter(dma, ok.len as usize, true)?,
                BlkOp::Write | BlkOp::Flush => (0, Ok(())),
            };
            written = n as u64;
            if let Err(e) = r {
                plan = Err(e);
                refused = true;
            }
        }
        // The data area is the writable bytes before the status byte.
        let area = p.shape.writable - 1;
        if written < area && !refused && area <= self.limits.max_bytes {
            request::data_segments(&self.chain, &p.shape, true, &mut self.segs);
            written = self.zero_fill(dma, written)?;
        }
        let used = if written == area {
            p.shape.writable
        } else {
            written
        };
        let status = match &plan {
            Ok(_) => blk::S_OK,
            Err(e) => e.status(),
        };
        let (plan, error) = match plan {
            Ok(ok) => (Some(ok), None),
            Err(e) => (None, Some(e)),
        };
        let done = Completed {
            status,
            used_len: u32::try_from(used).unwrap_or(u32::MAX),
            plan,
            error,
        };
        let at = p.shape.status;
        match dma.write(at, &[status]) {
            Ok(()) => Ok(done),
            Err(f) if D::is_abort(&f) => Err(ServeError::Aborted {
                iova: at,
                access: Access::Write,
                fault: f,
            }),
            Err(f) => Err(ServeError::Status {
                iova: at,
                fault: f,
                done,
            }),
        }
    }

    /// Copies the first `len` bytes of the buffer (or of the id string)
    /// into the data segments; with the bytes written before a refused
    /// segment (all of them when none was).
    fn scatter<D: DeviceDma>(
        &mut self,
        dma: &mut D,
        len: usize,
        id: bool,
    ) -> Result<Scattered, ServeError<D::Fault>> {
        let src: &[u8] = if id {
            &self.id[..len.min(blk::ID_BYTES)]
        } else {
            self.scratch.get_mut(len)
        };
        let mut off = 0usize;
        for &(addr, n) in &self.segs {
            let n = (n as usize).min(src.len() - off);
            if n == 0 {
                break;
            }
            if let Err(e) = outcome::<D>(addr, Access::Write, dma.write(addr, &src[off..off + n]))?
            {
                return Ok((off, Err(e)));
            }
            off += n;
        }
        Ok((off, Ok(())))
    }

    /// Writes zeros into the data segments (in `segs`: the whole data
    /// area) from byte `from` to their end; returns where the zeros end
    /// (short of the end when a segment was refused). At most
    /// [`BlkLimits::max_bytes`] bytes (the caller's bound).
    fn zero_fill<D: DeviceDma>(&self, dma: &mut D, from: u64) -> Result<u64, ServeError<D::Fault>> {
        static ZEROS: [u8; 4096] = [0; 4096];
        let (mut at, mut skip) = (from, from);
        for &(addr, n) in &self.segs {
            let n = u64::from(n);
            if skip >= n {
                skip -= n;
                continue;
            }
            let mut k = skip;
            skip = 0;
            while k < n {
                let c = (n - k).min(ZEROS.len() as u64);
                // In range: as the segment's own accesses (`data_segments`).
                let a = addr.wrapping_add(k);
                if outcome::<D>(a, Access::Write, dma.write(a, &ZEROS[..c as usize]))?.is_err() {
                    return Ok(at);
                }
                k += c;
                at += c;
            }
        }
        Ok(at)
    }

    /// Serves the chain in [`chain_mut`](Self::chain_mut) start to end:
    /// [`prepare`](Self::prepare), [`io`](Self::io),
    /// [`finish`](Self::finish).
    pub fn serve<D: DeviceDma>(
        &mut self,
        dma: &mut D,
        backend: &dyn BlkBackend,
        features: u64,
    ) -> Result<Completed, ServeError<D::Fault>> {
        let mut p = self.prepare(dma, features)?;
        self.io(backend, &mut p);
        self.finish(dma, p)
    }
}
