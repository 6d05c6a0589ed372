//! A real rust-vmm client through softiommu: `virtio-queue` (the release
//! line of the vm-memory we implement `Iommu` for) pops and processes
//! descriptor chains whose addresses — the rings' and the buffers' — are
//! IOVAs mapped by our DMA API, over an `IommuMemory` whose `Iommu` is a
//! softiommu unit. A mapping the driver revokes turns into a clean error
//! for the queue (and a fault in the unit's log), never a crash, and never
//! a write to memory the device no longer owns.
#![cfg(feature = "vm-memory")]

use std::sync::Arc;

use softiommu::access::{PhysGuestMemory, UnitIommu};
use softiommu::dma::{DmaCpu, DmaDevice, DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{Access, FaultReason, SourceId, System};
use softiommu::mem::{PhysMemory, PAGE_SIZE};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, IommuMemory};

const SID: SourceId = SourceId(0x0500);
const QSIZE: u16 = 16;
/// virtio 1.x split-ring descriptor flags (`VIRTQ_DESC_F_NEXT`, `_WRITE`).
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
/// Where the rings sit in their one page: descriptor table, available
/// ring, used ring (each suitably aligned for a split queue).
const DESC: u64 = 0;
const AVAIL: u64 = 0x400;
const USED: u64 = 0x800;

type Mem = IommuMemory<PhysGuestMemory, UnitIommu>;

/// The guest's side: a driver that owns the rings and maps buffers.
struct Driver {
    mem: Arc<PhysMemory>,
    dev: DmaDevice,
    cpu: DmaCpu,
    sys: Arc<System>,
    ring_phys: u64,
    ring_iova: u64,
    avail_idx: u16,
    _domain: Arc<DmaDomain>,
}

impl Driver {
    fn new() -> Self {
        let p = softiommu::Platform::builder()
            .memory(64 << 20)
            .domain(DmaDomainConfig {
                policy: DmaPolicy::Strict,
                bounce_bytes: 0,
                ..Default::default()
            })
            .device(SID)
            .build()
            .unwrap();
        let (mem, sys, domain) = (p.mem, p.system, p.domain);
        let dev = p.devices.into_iter().next().unwrap();
        let mut cpu = domain.cpu();
        let (ring_phys, ring_iova) = cpu.alloc_coherent(&dev, PAGE_SIZE).unwrap();
        Self {
            mem,
            dev,
            cpu,
            sys,
            ring_phys,
            ring_iova,
            avail_idx: 0,
            _domain: domain,
        }
    }

    /// A buffer of one page holding `data`, mapped for `dir`: (phys, iova).
    fn buffer(&mut self, data: &[u8], dir: DmaDirection) -> (u64, u64) {
        let phys = self.mem.alloc_zeroed_frames(0).unwrap();
        self.mem.write(phys, data).unwrap();
        let iova = self.cpu.map(&self.dev, phys, PAGE_SIZE, dir).unwrap();
        (phys, iova)
    }

    fn set_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write(self.ring_phys + DESC + 16 * u64::from(i), &d)
            .unwrap();
    }

    /// Makes the chain at `head` available to the device.
    fn publish(&mut self, head: u16) {
        let slot = self.ring_phys + AVAIL + 4 + 2 * u64::from(self.avail_idx % QSIZE);
        self.mem.write(slot, &head.to_le_bytes()).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // The index after the entry (the guest's release).
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.mem
            .write(self.ring_phys + AVAIL + 2, &self.avail_idx.to_le_bytes())
            .unwrap();
    }

    /// The used ring: its index, and its entries as (id, len).
    fn used(&self) -> (u16, Vec<(u32, u32)>) {
        let mut b = [0u8; 4 + 8 * QSIZE as usize];
        self.mem.read(self.ring_phys + USED, &mut b).unwrap();
        let idx = u16::from_le_bytes([b[2], b[3]]);
        let elems = (0..usize::from(idx.min(QSIZE)))
            .map(|i| {
                let e = &b[4 + 8 * i..12 + 8 * i];
                (
                    u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                )
            })
            .collect();
        (idx, elems)
    }

    fn faults(&self) -> Vec<(u64, Access, FaultReason)> {
        let (_, unit) = self.sys.unit_of(SID).unwrap();
        unit.faults()
            .drain()
            .records
            .iter()
            .map(|f| (f.iova, f.access, f.reason))
            .collect()
    }

    /// The device's view of memory: `IommuMemory` over our arena, with the
    /// device's unit as its IOMMU.
    fn device_memory(&self) -> Mem {
        IommuMemory::new(
            PhysGuestMemory::behind_iommu(self.mem.clone()),
            UnitIommu::for_device(&self.dev).unwrap(),
            true,
            (),
        )
    }

    /// The device's queue, programmed with the rings' IOVAs.
    fn device_queue(&self, mem: &Mem) -> Queue {
        let mut q = Queue::new(QSIZE).unwrap();
        q.set_size(QSIZE);
        q.try_set_desc_table_address(GuestAddress(self.ring_iova + DESC))
            .unwrap();
        q.try_set_avail_ring_address(GuestAddress(self.ring_iova + AVAIL))
            .unwrap();
        q.try_set_used_ring_address(GuestAddress(self.ring_iova + USED))
            .unwrap();
        q.set_ready(true);
        assert!(q.is_valid(mem), "the rings are reachable through the IOMMU");
        q
    }
}

/// What the emulated device does with one chain: reads every readable
/// descriptor, writes "ack:" and what it read into the writable ones.
/// Returns the bytes written, or the memory error that stopped it.
fn serve(mem: &Mem, q: &mut Queue) -> Option<(u16, Result<u32, GuestMemoryError>)> {
    let chain = q.pop_descriptor_chain(mem)?;
    let head = chain.head_index();
    let mut request = Vec::new();
    let mut result = Ok(0u32);
    for d in chain.clone().readable() {
        let mut b = vec![0u8; d.len() as usize];
        if let Err(e) = mem.read_slice(&mut b, d.addr()) {
            result = Err(e);
            break;
        }
        request.extend_from_slice(&b);
    }
    if result.is_ok() {
        let mut reply = b"ack:".to_vec();
        reply.extend_from_slice(&request);
        let mut written = 0u32;
        for d in chain.writable() {
            let n = reply.len().min(d.len() as usize);
            if let Err(e) = mem.write_slice(&reply[..n], d.addr()) {
                result = Err(e);
                break;
            }
            written += n as u32;
            reply.drain(..n);
        }
        if result.is_ok() {
            result = Ok(written);
        }
    }
    let used = *result.as_ref().unwrap_or(&0);
    q.add_used(mem, head, used).unwrap();
    Some((head, result))
}

#[test]
fn virtio_queue_pops_and_serves_chains_at_iovas_through_softiommu() {
    let mut drv = Driver::new();
    let (_, req) = drv.buffer(b"ping", DmaDirection::ToDevice);
    let (resp_phys, resp) = drv.buffer(&[], DmaDirection::FromDevice);
    assert_ne!(req, resp);
    drv.set_desc(0, req, 4, F_NEXT, 1);
    drv.set_desc(1, resp, 64, F_WRITE, 0);
    drv.publish(0);

    let mem = drv.device_memory();
    let mut q = drv.device_queue(&mem);
    let (head, res) = serve(&mem, &mut q).expect("a chain is available");
    assert_eq!(head, 0);
    assert_eq!(res.unwrap(), 8);
    assert!(serve(&mem, &mut q).is_none(), "only one was published");

    let mut got = [0u8; 8];
    drv.mem.read(resp_phys, &mut got).unwrap();
    assert_eq!(&got, b"ack:ping");
    assert_eq!(drv.used(), (1, vec![(0, 8)]));
    assert!(drv.faults().is_empty());

    // The same through virtio-queue's own Reader / Writer.
    drv.publish(0);
    let chain = q.pop_descriptor_chain(&mem).unwrap();
    let mut reader = chain.clone().reader(&mem).unwrap();
    assert_eq!(reader.read_obj::<[u8; 4]>().unwrap(), *b"ping");
    let mut writer = chain.writer(&mem).unwrap();
    writer.write_obj(*b"pong").unwrap();
    q.add_used(&mem, 0, 4).unwrap();
    drv.mem.read(resp_phys, &mut got[..4]).unwrap();
    assert_eq!(&got[..4], b"pong");
    assert_eq!(drv.used().0, 2);
}

#[test]
fn virtio_queue_gets_a_clean_error_for_a_revoked_buffer() {
    let mut drv = Driver::new();
    let (_, req) = drv.buffer(b"data", DmaDirection::ToDevice);
    let (resp_phys, resp) = drv.buffer(&[], DmaDirection::FromDevice);
    drv.set_desc(0, req, 4, F_NEXT, 1);
    drv.set_desc(1, resp, 16, F_WRITE, 0);
    let mem = drv.device_memory();
    let mut q = drv.device_queue(&mem);

    // Served once: the device's thread now caches the translations.
    drv.publish(0);
    assert_eq!(serve(&mem, &mut q).unwrap().1.unwrap(), 8);
    drv.mem.write(resp_phys, &[0; 8]).unwrap();

    // The driver revokes the response buffer (a strict unmap: invalidated
    // and waited for), then the chain naming it is served.
    drv.cpu
        .unmap(&drv.dev, resp, PAGE_SIZE, DmaDirection::FromDevice)
        .unwrap();
    drv.publish(0);
    let (head, res) = serve(&mem, &mut q).expect("the chain itself is readable");
    assert_eq!(head, 0);
    match res {
        Err(GuestMemoryError::IommuError(_)) => {}
        other => panic!("expected an IOMMU error, got {other:?}"),
    }
    let mut got = [0u8; 8];
    drv.mem.read(resp_phys, &mut got).unwrap();
    assert_eq!(got, [0; 8], "nothing written to the revoked page");
    assert_eq!(drv.used(), (2, vec![(0, 8), (0, 0)]));
    assert_eq!(
        drv.faults(),
        vec![(resp, Access::Write, FaultReason::NotPresent)]
    );

    // virtio-queue's Writer reports it as an error too.
    drv.publish(0);
    let chain = q.pop_descriptor_chain(&mem).unwrap();
    // (Its `Writer` checks each buffer's range first: a revoked one makes
    // the chain invalid.)
    let e = chain.writer(&mem).err();
    assert!(
        matches!(e, Some(virtio_queue::Error::InvalidChain)),
        "{e:?}"
    );
    q.add_used(&mem, 0, 0).unwrap();
    drv.faults();
}

#[test]
fn virtio_queue_stops_cleanly_when_its_rings_are_revoked() {
    let mut drv = Driver::new();
    let (_, req) = drv.buffer(b"data", DmaDirection::ToDevice);
    drv.set_desc(0, req, 4, 0, 0);
    let mem = drv.device_memory();
    let mut q = drv.device_queue(&mem);
    drv.publish(0);
    assert!(serve(&mem, &mut q).is_some());

    // The driver tears the rings down while the device still runs.
    drv.publish(0);
    let (phys, iova) = (drv.ring_phys, drv.ring_iova);
    drv.cpu
        .free_coherent(&drv.dev, phys, iova, PAGE_SIZE)
        .unwrap();
    assert!(q.pop_descriptor_chain(&mem).is_none());
    assert!(matches!(
        q.iter(&mem),
        Err(virtio_queue::Error::GuestMemory(
            GuestMemoryError::IommuError(_)
        ))
    ));
    assert!(matches!(
        q.add_used(&mem, 0, 0),
        Err(virtio_queue::Error::GuestMemory(
            GuestMemoryError::IommuError(_)
        ))
    ));
    assert!(!q.is_valid(&mem));
    let faults = drv.faults();
    assert!(!faults.is_empty());
    assert!(faults
        .iter()
        .all(|&(a, _, r)| r == FaultReason::NotPresent && (iova..iova + PAGE_SIZE).contains(&a)));
}
