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

#[cfg(test)]
mod tests {
    //! One blk request served, and one net frame moved, by the same code
    //! over a softiommu unit and over a front-end's IOTLB: the same bytes
    //! and status, and the same typed fault when the translation refuses.

    use std::sync::Arc;
    use std::time::Duration;

    use softiommu::access::{AccessError as UnitFault, DmaAttrs};
    use softiommu::hw::Access;
    use softiommu::{DmaDirection, Platform, SourceId};
    use softiommu_virtio::blk::{
        BackendConfig, BlkBackend, BlkHeader, BlkLimits, BlkOp, BlkRequests, Completed,
        RequestError, ServeError,
    };
    use softiommu_virtio::device_dma::UnitDma;
    use softiommu_virtio::net::{gather_frame, plain_header, scatter_frame, HDR_LEN};
    use softiommu_virtio::spec::blk as sb;

    /// What the front-ends here acknowledged: FLUSH and both segment
    /// limits (so `seg_max` and `size_max` bind).
    const FEATURES: u64 = 1 << sb::F_FLUSH | 1 << sb::F_SEG_MAX | 1 << sb::F_SIZE_MAX;
    use softiommu_virtio::transport::ChainDesc;

    use super::*;
    use crate::proto::iotlb as m;

    const UA: u64 = 0x7f00_0000_0000;
    const SHARED: usize = 1 << 20;
    const PAGE: usize = 4096;

    /// The same buffers behind both translations: frames of the unit's
    /// memory mapped through its page table, and pages of a front-end's
    /// shared memory mapped at the same IOVAs in the device IOTLB.
    struct Rig {
        p: Platform,
        unit: UnitDma,
        space: DmaSpace,
        shared: *mut u8,
        pages: usize,
    }

    #[derive(Clone, Copy)]
    struct Buf {
        iova: u64,
        phys: u64,
        off: usize,
    }

    fn rig() -> Rig {
        let p = Platform::builder()
            .memory(16 << 20)
            .device(SourceId::new(1, 0, 0).unwrap_or_default())
            .build()
            .unwrap();
        let acc = p.accessor(0).unwrap().unwrap();
        let unit = UnitDma::new(acc, DmaAttrs::ORDERED);
        let (space, shared) =
            crate::testing::shared_space(c"dev-dma", SHARED, UA, Duration::from_millis(50));
        Rig {
            p,
            unit,
            space,
            shared,
            pages: 0,
        }
    }

    impl Rig {
        /// A page mapped for `dir` on both sides.
        fn buf(&mut self, dir: DmaDirection) -> Buf {
            let phys = self.p.mem.alloc_zeroed_frames(0).unwrap();
            let mut cpu = self.p.domain.cpu();
            let iova = cpu.map(&self.p.devices[0], phys, PAGE as u64, dir).unwrap();
            assert_eq!(iova % PAGE as u64, 0);
            let off = self.pages * PAGE;
            self.pages += 1;
            let perm = match dir {
                DmaDirection::ToDevice => m::ACCESS_RO,
                DmaDirection::FromDevice => m::ACCESS_WO,
                DmaDirection::Bidirectional => m::ACCESS_RW,
            };
            self.space
                .update(iova, PAGE as u64, UA + off as u64, perm)
                .unwrap();
            Buf { iova, phys, off }
        }

        fn poke(&self, b: Buf, at: usize, bytes: &[u8]) {
            self.p.mem.write(b.phys + at as u64, bytes).unwrap();
            // SAFETY: within the shared mapping (SHARED bytes, pages below it).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    self.shared.add(b.off + at),
                    bytes.len(),
                )
            };
        }

        /// `(unit's bytes, front-end's bytes)` of `[at, +len)` of `b`.
        fn peek(&self, b: Buf, at: usize, len: usize) -> (Vec<u8>, Vec<u8>) {
            let mut u = vec![0u8; len];
            self.p.mem.read(b.phys + at as u64, &mut u).unwrap();
            let mut v = vec![0u8; len];
            // SAFETY: as in poke.
            unsafe {
                std::ptr::copy_nonoverlapping(self.shared.add(b.off + at), v.as_mut_ptr(), len)
            };
            (u, v)
        }
    }

    fn requests(disk: &dyn BlkBackend) -> BlkRequests {
        let limits = BlkLimits {
            capacity_sectors: disk.capacity() / 512,
            blk_size: 512,
            seg_max: 8,
            size_max: 4096,
            max_bytes: 16 * 1024,
            flush: true,
        };
        BlkRequests::new(limits, [7u8; sb::ID_BYTES], 1)
    }

    /// Serves `chain` once over the unit and once over the front-end's
    /// IOTLB, each with request code of its own.
    #[allow(clippy::type_complexity)]
    fn serve_both(
        r: &mut Rig,
        disk: &dyn BlkBackend,
        chain: &[ChainDesc],
    ) -> (
        Result<Completed, ServeError<UnitFault>>,
        Result<Completed, ServeError<crate::error::AccessError>>,
    ) {
        let mut a = requests(disk);
        a.chain_mut().extend_from_slice(chain);
        let u = a.serve(&mut r.unit, disk, FEATURES);
        let mut b = requests(disk);
        b.chain_mut().extend_from_slice(chain);
        let mut space = &r.space;
        let v = b.serve(&mut space, disk, FEATURES);
        (u, v)
    }

    fn d(b: Buf, len: u32, writable: bool) -> ChainDesc {
        ChainDesc {
            addr: b.iova,
            len,
            writable,
            index: 0,
        }
    }

    fn header(r: &Rig, b: Buf, op: BlkOp, sector: u64) {
        let h = BlkHeader {
            type_: op.type_code(),
            reserved: 0,
            sector,
        };
        r.poke(b, 0, &h.encode());
    }

    fn disk() -> Arc<dyn BlkBackend> {
        let disk = BackendConfig::Memory { capacity: 1 << 20 }.open().unwrap();
        let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
        disk.write_at(4096, &pattern).unwrap();
        disk
    }

    #[test]
    fn one_blk_request_runs_the_same_over_a_unit_and_over_a_front_end_iotlb() {
        let mut r = rig();
        let disk = disk();
        let (hdr, data, status) = (
            r.buf(DmaDirection::ToDevice),
            r.buf(DmaDirection::FromDevice),
            r.buf(DmaDirection::FromDevice),
        );
        // A read of 2 KiB at sector 8.
        header(&r, hdr, BlkOp::Read, 8);
        r.poke(status, 0, &[0xff]);
        let chain = [d(hdr, 16, false), d(data, 2048, true), d(status, 1, true)];
        let (u, v) = serve_both(&mut r, &*disk, &chain);
        let (u, v) = (u.unwrap(), v.unwrap());
        assert_eq!(u, v);
        assert_eq!((u.status, u.used_len, u.error), (sb::S_OK, 2049, None));
        let mut want = vec![0u8; 2048];
        disk.read_at(4096, &mut want).unwrap();
        let (ub, vb) = r.peek(data, 0, 2048);
        assert_eq!((ub == want, vb == want), (true, true));
        assert_eq!(r.peek(status, 0, 1), (vec![sb::S_OK], vec![sb::S_OK]));

        // A write of 1 KiB at sector 32 from the same bytes on both sides:
        // the disk holds them, each side completed alike.
        let (hdr2, src) = (r.buf(DmaDirection::ToDevice), r.buf(DmaDirection::ToDevice));
        header(&r, hdr2, BlkOp::Write, 32);
        r.poke(src, 0, &[0x5a; 1024]);
        r.poke(status, 0, &[0xff]);
        let chain = [d(hdr2, 16, false), d(src, 1024, false), d(status, 1, true)];
        let (u, v) = serve_both(&mut r, &*disk, &chain);
        let (u, v) = (u.unwrap(), v.unwrap());
        assert_eq!(u, v);
        assert_eq!((u.status, u.used_len), (sb::S_OK, 1));
        let mut got = vec![0u8; 1024];
        disk.read_at(32 * 512, &mut got).unwrap();
        assert_eq!(got, vec![0x5a; 1024]);
    }

    #[test]
    fn a_refused_data_access_is_the_same_typed_fault_over_either_translation() {
        let mut r = rig();
        let disk = disk();
        // The data buffer is device-readable only: a read's scatter into it
        // is refused by the unit's page table and by the IOTLB entry.
        let (hdr, data, status) = (
            r.buf(DmaDirection::ToDevice),
            r.buf(DmaDirection::ToDevice),
            r.buf(DmaDirection::FromDevice),
        );
        header(&r, hdr, BlkOp::Read, 8);
        r.poke(data, 0, &[0xcc; 1024]);
        let chain = [d(hdr, 16, false), d(data, 1024, true), d(status, 1, true)];
        let (u, v) = serve_both(&mut r, &*disk, &chain);
        for done in [u.unwrap(), v.unwrap()] {
            // Nothing written from the first writable byte on: the data
            // was refused and the status byte lies after it.
            assert_eq!((done.status, done.used_len), (sb::S_IOERR, 0));
            assert!(
                matches!(
                    done.error,
                    Some(RequestError::DmaFault { iova, access: Access::Write, .. }) if iova == data.iova
                ),
                "{:?}",
                done.error
            );
        }
        assert_eq!(r.peek(data, 0, 1024), (vec![0xcc; 1024], vec![0xcc; 1024]));
        assert_eq!(r.peek(status, 0, 1), (vec![sb::S_IOERR], vec![sb::S_IOERR]));
    }

    #[test]
    fn a_request_past_seg_max_is_refused_alike_before_any_byte_moves() {
        let mut r = rig();
        let disk = disk();
        let (hdr, data, more, status) = (
            r.buf(DmaDirection::ToDevice),
            r.buf(DmaDirection::FromDevice),
            r.buf(DmaDirection::FromDevice),
            r.buf(DmaDirection::FromDevice),
        );
        header(&r, hdr, BlkOp::Read, 8);
        r.poke(data, 0, &[0xcc; 4096]);
        r.poke(more, 0, &[0xcc; 512]);
        // Nine 512-byte data segments (eight in one page, one in
        // another), seg_max is 8.
        let mut chain = vec![d(hdr, 16, false)];
        chain.extend((0..8u64).map(|i| ChainDesc {
            addr: data.iova + 512 * i,
            len: 512,
            writable: true,
            index: 0,
        }));
        chain.push(d(more, 512, true));
        chain.push(d(status, 1, true));
        let (u, v) = serve_both(&mut r, &*disk, &chain);
        let (u, v) = (u.unwrap(), v.unwrap());
        assert_eq!(u, v);
        assert_eq!(
            (u.status, u.used_len, u.error),
            (
                sb::S_IOERR,
                9 * 512 + 1,
                Some(RequestError::TooManySegments {
                    segments: 9,
                    seg_max: 8
                })
            )
        );
        // No byte of the disk moved: the data area is zero-filled, so that
        // the used length covers the whole writable area.
        let zeros = vec![0u8; 4096];
        assert_eq!(r.peek(data, 0, 4096), (zeros.clone(), zeros));
        assert_eq!(r.peek(more, 0, 512), (vec![0u8; 512], vec![0u8; 512]));
    }

    #[test]
    fn one_net_frame_moves_the_same_over_a_unit_and_over_a_front_end_iotlb() {
        let mut r = rig();
        // A receive chain of two buffers: the header and the frame's start
        // in one, the rest in the other.
        let (a, b) = (
            r.buf(DmaDirection::Bidirectional),
            r.buf(DmaDirection::Bidirectional),
        );
        let chain = [d(a, 100, true), d(b, 1000, true)];
        let frame: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 1) as u8).collect();
        let hdr = plain_header(true);
        scatter_frame(&mut r.unit, &chain, &hdr, &frame).unwrap();
        let mut space = &r.space;
        scatter_frame(&mut space, &chain, &hdr, &frame).unwrap();
        let (ua, va) = r.peek(a, 0, 100);
        let (ub, vb) = r.peek(b, 0, 912);
        assert_eq!((ua == va, ub == vb), (true, true));
        assert_eq!(&ua[..HDR_LEN], &hdr[..]);
        assert_eq!(&ua[HDR_LEN..], &frame[..88]);
        assert_eq!(&ub[..], &frame[88..]);
        // And back out, as a transmit chain.
        let (mut uh, mut vh) = ([0u8; HDR_LEN], [0u8; HDR_LEN]);
        let (mut uf, mut vf) = (vec![0u8; 1000], vec![0u8; 1000]);
        gather_frame(&mut r.unit, &chain, &mut uh, &mut uf).unwrap();
        gather_frame(&mut space, &chain, &mut vh, &mut vf).unwrap();
        assert_eq!((uh, vh, uf == frame, vf == frame), (hdr, hdr, true, true));

        // A buffer the device may only read: the frame's copy into it is
        // the same typed fault on both, at the same IOVA.
        let ro = r.buf(DmaDirection::ToDevice);
        let chain = [d(a, HDR_LEN as u32, true), d(ro, 1000, true)];
        let u = scatter_frame(&mut r.unit, &chain, &hdr, &frame).unwrap_err();
        let mut space = &r.space;
        let v = scatter_frame(&mut space, &chain, &hdr, &frame).unwrap_err();
        assert_eq!((u.iova, u.access), (ro.iova, Access::Write));
        assert_eq!((v.iova, v.access), (ro.iova, Access::Write));
        assert!(
            matches!(v.fault, crate::error::AccessError::Denied { .. }),
            "{v:?}"
        );
        assert_eq!(r.peek(ro, 0, 16), (vec![0u8; 16], vec![0u8; 16]));
    }

    #[test]
    fn a_miss_cancelled_by_the_rings_stopping_aborts_the_request_uncompleted() {
        let mut r = rig();
        let disk = disk();
        let (hdr, status) = (
            r.buf(DmaDirection::ToDevice),
            r.buf(DmaDirection::FromDevice),
        );
        header(&r, hdr, BlkOp::Read, 8);
        r.poke(status, 0, &[0xff]);
        // Data at an IOVA the IOTLB has no entry for, with the rings stopping.
        let missing = 0x4000_0000u64;
        r.space.cancel();
        let mut req = requests(&*disk);
        req.chain_mut().extend_from_slice(&[
            d(hdr, 16, false),
            ChainDesc {
                addr: missing,
                len: 512,
                writable: true,
                index: 0,
            },
            d(status, 1, true),
        ]);
        let mut space = &r.space;
        let e = req.serve(&mut space, &*disk, FEATURES).unwrap_err();
        assert!(
            matches!(
                e,
                ServeError::Aborted {
                    iova: 0x4000_0000,
                    access: Access::Write,
                    fault: crate::error::AccessError::Cancelled { iova: 0x4000_0000 },
                }
            ),
            "{e:?}"
        );
        assert_eq!(r.peek(status, 0, 1).1, vec![0xff], "status untouched");
    }
}
