//! The front-end's IOTLB as a [`DmaSide`]: where `softiommu-virtio`'s
//! devices (`BlkDevice::spawn_on`, `NetDevice::spawn_on`) translate their
//! DMA when they run behind a vhost-user front-end's IOMMU instead of a
//! softiommu unit — the same device code, rings and buffers through the
//! [`DmaSpace`].
//!
//! A device's rings and buffers both translate as descriptors' addresses
//! do ([`AddrKind::Buffer`]: an IOVA, or with the space's IOMMU off a
//! guest-physical address): its driver programs the rings in the address
//! space of its buffers, unlike a vhost-user front-end's `SET_VRING_ADDR`
//! (front-end virtual addresses without an IOMMU, [`AddrKind::Ring`], what
//! the back-end's own queues use); a miss is asked of the
//! front-end and waited for within the space's bound, and a wait
//! cancelled because the rings stop is an abort (`DeviceError::DmaAborted`
//! on a ring, `ServeError::Aborted` in the request code). Every access
//! holds the space's own reader section (an acknowledged invalidation
//! waits for it), and any access may wait for the front-end: so the fence
//! runs a turn bare and says the device may fault (no section may span a
//! turn), as a unit in IOPF mode does.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use softiommu_virtio::device_dma::DeviceDma;
use softiommu_virtio::dma_side::{Attached, DmaFence, DmaSide};
use softiommu_virtio::transport::RingMemory;

use crate::error::AccessError;
use crate::space::{AddrKind, DmaSpace};

/// The space's ring addresses, as the [`RingMemory`] the shared ring code
/// reads and writes through, translated as one [`AddrKind`] says.
#[derive(Debug, Clone)]
pub struct SpaceRings {
    space: Arc<DmaSpace>,
    kind: AddrKind,
}

impl SpaceRings {
    /// Rings at addresses of `kind` in `space`: [`AddrKind::Ring`] for a
    /// vhost-user ring (`SET_VRING_ADDR`), [`AddrKind::Buffer`] for a
    /// device whose driver writes ring addresses as it writes buffers'.
    pub(crate) fn new(space: Arc<DmaSpace>, kind: AddrKind) -> Self {
        Self { space, kind }
    }

    /// The space the rings translate through.
    pub(crate) fn space(&self) -> &Arc<DmaSpace> {
        &self.space
    }
}

impl RingMemory for SpaceRings {
    type Fault = AccessError;

    #[inline]
    fn read_ring(&self, addr: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        self.space.read_bytes(self.kind, addr, buf)
    }

    #[inline]
    fn write_ring(&self, addr: u64, buf: &[u8]) -> Result<(), AccessError> {
        self.space.write_bytes(self.kind, addr, buf)
    }

    #[inline]
    fn load_u16(&self, addr: u64, _order: Ordering) -> Result<u16, AccessError> {
        // Acquire whatever was asked: never weaker.
        self.space.load_u16_acquire(self.kind, addr)
    }

    #[inline]
    fn store_u16(&self, addr: u64, v: u16, _order: Ordering) -> Result<(), AccessError> {
        // Release whatever was asked: never weaker.
        self.space.store_u16_release(self.kind, addr, v)
    }

    fn is_abort(fault: &AccessError) -> bool {
        matches!(fault, AccessError::Cancelled { .. })
    }
}

/// The space's buffer addresses, as a [`DeviceDma`] a device thread owns.
#[derive(Debug, Clone)]
pub struct SpaceDma(Arc<DmaSpace>);

impl DeviceDma for SpaceDma {
    type Fault = AccessError;

    #[inline]
    fn read(&mut self, iova: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        (&*self.0).read(iova, buf)
    }

    #[inline]
    fn write(&mut self, iova: u64, buf: &[u8]) -> Result<(), AccessError> {
        (&*self.0).write(iova, buf)
    }

    fn is_abort(fault: &AccessError) -> bool {
        <&DmaSpace as DeviceDma>::is_abort(fault)
    }
}

/// The space's fence: each access is its own section; any may wait.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpaceFence;

impl DmaFence for SpaceFence {
    fn section<R>(&self, mut f: impl FnMut() -> R) -> R {
        f()
    }

    fn may_fault(&self) -> bool {
        true
    }
}

/// A device's DMA through a front-end's IOTLB (a [`DmaSpace`]).
#[derive(Debug, Clone)]
pub struct SpaceSide {
    space: Arc<DmaSpace>,
    name: String,
}

impl SpaceSide {
    /// The device `name` behind `space`.
    pub fn new(space: Arc<DmaSpace>, name: impl Into<String>) -> Self {
        Self {
            space,
            name: name.into(),
        }
    }
}

impl DmaSide for SpaceSide {
    type Ring = SpaceRings;
    type Dma = SpaceDma;
    type Fence = SpaceFence;
    type Error = Infallible;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn attach(&self) -> Result<Attached<Self>, Infallible> {
        Ok(Attached {
            // The driver programs the rings where it puts buffers.
            ring: SpaceRings::new(self.space.clone(), AddrKind::Buffer),
            dma: SpaceDma(self.space.clone()),
            fence: SpaceFence,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! `softiommu-virtio`'s `BlkDevice` itself — its MMIO transport, its
    //! workers, its queue policy — behind a front-end's IOTLB, driven by a
    //! driver that programs its registers and writes its rings at IOVAs.

    use std::time::{Duration, Instant};

    use softiommu_virtio::blk::{BackendConfig, BlkDevice, BlkDeviceConfig, RequestError};
    use softiommu_virtio::spec::{blk as sb, desc as d, feature, reg, status};
    use softiommu_virtio::transport::MmioTransport;

    use super::*;
    use crate::proto::iotlb as m;

    const UA: u64 = 0x7f00_0000_0000;
    const SHARED: usize = 1 << 20;
    /// The IOVA the shared memory is mapped at, page by page.
    const IOVA: u64 = 0x4000_0000;
    const NUM: u16 = 8;
    const DESC: u64 = IOVA;
    const AVAIL: u64 = IOVA + 0x100;
    const USED: u64 = IOVA + 0x200;
    const HDR: u64 = IOVA + 0x1000;
    const DATA: u64 = IOVA + 0x2000;
    const STATUS: u64 = IOVA + 0x3000;

    struct Fe {
        space: Arc<DmaSpace>,
        shared: *mut u8,
        next: u16,
    }

    impl Fe {
        fn poke(&self, iova: u64, b: &[u8]) {
            let off = (iova - IOVA) as usize;
            assert!(off + b.len() <= SHARED);
            // SAFETY: within the shared mapping (checked above).
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.shared.add(off), b.len()) };
        }

        fn peek(&self, iova: u64, len: usize) -> Vec<u8> {
            let off = (iova - IOVA) as usize;
            assert!(off + len <= SHARED);
            let mut v = vec![0u8; len];
            // SAFETY: as in poke.
            unsafe { std::ptr::copy_nonoverlapping(self.shared.add(off), v.as_mut_ptr(), len) };
            v
        }

        fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
            let b = crate::testing::desc(addr, len, flags, next);
            self.poke(DESC + 16 * u64::from(i), &b);
        }

        /// Submits `op` at `sector` on `len` bytes at DATA, notifies, and
        /// waits for the used entry; returns the status byte.
        fn request(&mut self, t: &MmioTransport, op: u32, sector: u64, len: u32) -> u8 {
            let mut h = [0u8; 16];
            h[0..4].copy_from_slice(&op.to_le_bytes());
            h[8..16].copy_from_slice(&sector.to_le_bytes());
            self.poke(HDR, &h);
            self.poke(STATUS, &[0xff]);
            let data_flags = if op == sb::T_IN { d::F_WRITE } else { 0 };
            self.desc(0, HDR, 16, d::F_NEXT, 1);
            self.desc(1, DATA, len, d::F_NEXT | data_flags, 2);
            self.desc(2, STATUS, 1, d::F_WRITE, 0);
            let slot = u64::from(self.next % NUM);
            self.poke(AVAIL + 4 + 2 * slot, &0u16.to_le_bytes());
            self.next = self.next.wrapping_add(1);
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            self.poke(AVAIL + 2, &self.next.to_le_bytes());
            t.write(reg::QUEUE_NOTIFY, 0);
            let t0 = Instant::now();
            while self.peek(USED + 2, 2) != self.next.to_le_bytes() {
                assert!(t0.elapsed() < Duration::from_secs(10), "never used");
                std::thread::sleep(Duration::from_millis(1));
            }
            self.peek(STATUS, 1)[0]
        }
    }

    /// Negotiates `VERSION_1 | ACCESS_PLATFORM` and sets queue 0 live.
    fn probe(t: &MmioTransport) {
        t.write(reg::STATUS, 0);
        t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        let want = 1u64 << feature::VERSION_1 | 1u64 << feature::ACCESS_PLATFORM;
        t.write(reg::DRIVER_FEATURES_SEL, 0);
        t.write(reg::DRIVER_FEATURES, want as u32);
        t.write(reg::DRIVER_FEATURES_SEL, 1);
        t.write(reg::DRIVER_FEATURES, (want >> 32) as u32);
        let st = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        t.write(reg::STATUS, st);
        assert_ne!(t.read(reg::STATUS) & status::FEATURES_OK, 0);
        t.write(reg::QUEUE_SEL, 0);
        t.write(reg::QUEUE_NUM, u32::from(NUM));
        for (lo, hi, a) in [
            (reg::QUEUE_DESC_LOW, reg::QUEUE_DESC_HIGH, DESC),
            (reg::QUEUE_DRIVER_LOW, reg::QUEUE_DRIVER_HIGH, AVAIL),
            (reg::QUEUE_DEVICE_LOW, reg::QUEUE_DEVICE_HIGH, USED),
        ] {
            t.write(lo, a as u32);
            t.write(hi, (a >> 32) as u32);
        }
        t.write(reg::QUEUE_READY, 1);
        t.write(reg::STATUS, st | status::DRIVER_OK);
    }

    #[test]
    fn the_unit_blk_device_runs_behind_a_front_end_iotlb() {
        let (space, shared) =
            crate::testing::shared_space(c"side-blk", SHARED, UA, Duration::from_millis(50));
        let space = Arc::new(space);
        space.update(IOVA, 0x4000, UA, m::ACCESS_RW).unwrap();
        let cfg = BlkDeviceConfig {
            backend: BackendConfig::Memory { capacity: 1 << 20 },
            ..BlkDeviceConfig::default()
        };
        let dev = BlkDevice::spawn_on(&cfg, SpaceSide::new(space.clone(), "fe0")).unwrap();
        let t = dev.transport();
        probe(t);
        let mut fe = Fe {
            space,
            shared,
            next: 0,
        };
        // A write of 1 KiB at sector 4, then its read-back into zeroes.
        let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 1) as u8).collect();
        fe.poke(DATA, &pattern);
        assert_eq!(fe.request(t, sb::T_OUT, 4, 1024), sb::S_OK);
        let mut disk = vec![0u8; 1024];
        dev.backend().read_at(4 * 512, &mut disk).unwrap();
        assert_eq!(disk, pattern);
        fe.poke(DATA, &[0u8; 1024]);
        assert_eq!(fe.request(t, sb::T_IN, 4, 1024), sb::S_OK);
        assert_eq!(fe.peek(DATA, 1024), pattern);

        // The data page's invalidation acknowledged: a read into it is
        // refused (no front-end to answer the miss), the request fails
        // with IOERR through the unit device's own request path, and the
        // page is untouched.
        fe.poke(DATA, &[0xcc; 1024]);
        fe.space.invalidate(DATA, 0x1000).unwrap();
        assert_eq!(fe.request(t, sb::T_IN, 4, 1024), sb::S_IOERR);
        assert_eq!(fe.peek(DATA, 1024), vec![0xcc; 1024]);
        let log = dev.request_log().drain();
        assert!(
            matches!(
                log.last().map(|r| &r.error),
                Some(RequestError::DmaFault { iova, .. }) if *iova == DATA
            ),
            "{log:?}"
        );
        assert_eq!(t.status() & status::DEVICE_NEEDS_RESET, 0);
        dev.stop().unwrap();
    }

    #[test]
    fn with_the_iommu_off_a_devices_rings_are_at_guest_physical_addresses() {
        // Guest-physical 0 is front-end address UA: a driver behind the
        // space programs its rings at guest-physical addresses, as its
        // buffers, never at the front-end's virtual ones.
        let (space, shared) =
            crate::testing::shared_space(c"side-gpa", SHARED, UA, Duration::from_millis(20));
        space.set_iommu(false);
        let side = SpaceSide::new(Arc::new(space), "fe-gpa");
        let a = side.attach().unwrap();
        // SAFETY: within the shared mapping (SHARED bytes).
        unsafe { std::ptr::copy_nonoverlapping([0x34u8, 0x12].as_ptr(), shared.add(0x102), 2) };
        assert_eq!(a.ring.load_u16(0x102, Ordering::Acquire).unwrap(), 0x1234);
        a.ring.store_u16(0x200, 0xbeef, Ordering::Release).unwrap();
        let mut b = [0u8; 2];
        a.ring.read_ring(0x200, &mut b).unwrap();
        assert_eq!(b, 0xbeefu16.to_le_bytes());
        // The front-end's virtual address is not a guest-physical one.
        let e = a.ring.load_u16(UA + 0x102, Ordering::Acquire).unwrap_err();
        assert!(
            matches!(e, AccessError::OutsideMemory { iova, .. } if iova == UA + 0x102),
            "{e:?}"
        );
    }
}
