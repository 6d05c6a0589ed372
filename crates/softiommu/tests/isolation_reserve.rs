//! No device reaches a frame that holds IOMMU state, in any mode, whether
//! the frame held it when the mapping or region was made or came to hold
//! it later: the IOMMU's tables and queues live in the arena's reserve,
//! outside RAM, and every device range is RAM.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use softiommu::hw::{ContextEntry, UnitId};
use softiommu::iopf::{IopfConfig, IopfDomain, IopfHandler, Region};
use softiommu::mem::MemError;
use softiommu::{
    Access, AccessError, DmaAccessor, DmaAttrs, DmaDirection, DmaPolicy, FaultReason, Perm,
    PhysMemory, Platform, SourceId, System, TranslateError, UnitConfig, PAGE_SIZE,
};

const DEV: SourceId = SourceId(0x0900);
const O: DmaAttrs = DmaAttrs::ORDERED;

/// The runs of the arena a guest would expose as RAM at the time of the
/// call (what an I/O page-fault host gives its device): every frame a
/// device may be given, as (address, length).
fn guest_ram(mem: &PhysMemory) -> Vec<(u64, u64)> {
    let size = mem.size();
    let (mut runs, mut start) = (Vec::new(), 0);
    while start < size {
        match mem.check_device_range(start, size - start) {
            Ok(()) => {
                runs.push((start, size - start));
                break;
            }
            Err(MemError::IommuFrame { addr }) => {
                if addr > start {
                    runs.push((start, addr - start));
                }
                start = addr + PAGE_SIZE;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    runs
}

/// The table pages on the walk of `iova` from `root` (root included), by
/// the VT-d second-level format: address bits 12..52, R/W in bits 0..2.
fn tables_on_walk(mem: &PhysMemory, root: u64, iova: u64) -> Vec<u64> {
    let mut tables = vec![root];
    let mut table = root;
    for level in (2..=4).rev() {
        let index = (iova >> (12 + 9 * (level - 1))) & 511;
        let raw = mem.load_u64(table + index * 8, Ordering::Acquire).unwrap();
        // Not present, or a large leaf (PS, bit 7): the walk ends.
        if raw & 3 == 0 || raw & (1 << 7) != 0 {
            break;
        }
        table = raw & 0x000f_ffff_ffff_f000;
        tables.push(table);
    }
    tables
}

#[test]
fn an_iopf_device_over_all_ram_never_reaches_the_tables_its_faults_build() {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let unit: UnitId = sys.add_unit(UnitConfig::default()).unwrap();
    sys.assign(DEV, unit).unwrap();
    let sys = Arc::new(sys);
    let domain = IopfDomain::new(sys.clone(), IopfConfig::default()).unwrap();
    // Guest RAM, identity mapped (IOVA = physical address), made while
    // the domain's tables hold only a root.
    let runs = guest_ram(&mem);
    for &(at, len) in &runs {
        domain
            .add_region(Region {
                iova: at,
                phys: at,
                len,
                perm: Perm::RW,
            })
            .unwrap();
    }
    assert_eq!(runs, vec![(0, mem.size())], "all of RAM is the guest's");
    domain.attach(DEV).unwrap();
    let _h = IopfHandler::start(domain.clone(), unit, 1).unwrap();
    let u = sys.unit(unit).unwrap();
    let mut acc = DmaAccessor::new(u, DEV).unwrap();
    // A fault at 40 MiB builds the tables for it.
    let target = 40 << 20;
    acc.write(target, b"data", O).unwrap();
    let Some(ContextEntry::Translated { root, .. }) = u.context(DEV) else {
        panic!("translated context")
    };
    let tables = tables_on_walk(&mem, root, target);
    assert_eq!(tables.len(), 4, "root, PDPT, PD, PT");
    for &t in &tables {
        assert!(
            t >= mem.size() && mem.is_iommu_frame(t),
            "table page {t:#x} lies in RAM ({:#x} bytes)",
            mem.size()
        );
        // The device names the table page's address: nothing maps it, and
        // its bytes are untouched.
        let before = mem.load_u64(t, Ordering::Acquire).unwrap();
        assert!(matches!(
            acc.write(t, &[0xff; 8], O),
            Err(AccessError::Translate(
                TranslateError::PageRequestDenied { .. }
            ))
        ));
        let mut b = [0u8; 8];
        assert!(matches!(
            acc.read(t, &mut b, O),
            Err(AccessError::Translate(
                TranslateError::PageRequestDenied { .. }
            ))
        ));
        assert_eq!(mem.load_u64(t, Ordering::Acquire).unwrap(), before);
    }
    // And the device still works on its RAM.
    let mut b = [0u8; 4];
    acc.read(target, &mut b, O).unwrap();
    assert_eq!(&b, b"data");
}

#[test]
fn frames_a_caller_maps_unallocated_never_become_page_tables() {
    let p = Platform::builder()
        .memory(64 << 20)
        .policy(DmaPolicy::Strict)
        .device(DEV)
        .build()
        .unwrap();
    let dev = &p.devices[0];
    let mut cpu = p.domain.cpu();
    // The caller maps 16 MiB of frames nobody allocated, for the device
    // to read and write: the very frames the allocator hands out next...
    let free_at = p.mem.alloc_frames(0).unwrap();
    p.mem.free_frames(free_at, 0).unwrap();
    let free_len = 16 << 20;
    let window = cpu
        .map(dev, free_at, free_len, DmaDirection::Bidirectional)
        .unwrap();
    // ...then maps more buffers, so that the table grows.
    let mut iovas = vec![(window, free_at)];
    for _ in 0..64 {
        let buf = p.mem.alloc_zeroed_frames(0).unwrap();
        iovas.push((cpu.map(dev, buf, 64, DmaDirection::ToDevice).unwrap(), buf));
    }
    let before = p.domain.table_stats();
    assert!(before.tables_allocated >= 4);
    // Every byte the device reaches through the window is RAM the caller
    // named: no table page came to live there.
    let u = p.unit(0).unwrap();
    let Some(ContextEntry::Translated { root, .. }) = u.context(DEV) else {
        panic!("translated context")
    };
    assert!(root >= p.mem.size());
    for &(iova, _) in &iovas {
        for t in tables_on_walk(&p.mem, root, iova) {
            assert!(
                !(free_at..free_at + free_len).contains(&t),
                "table page {t:#x} inside the caller's window"
            );
            assert!(t >= p.mem.size() && p.mem.is_iommu_frame(t));
        }
    }
    // The window is still the caller's memory, whole.
    let mut tr = u.translator().unwrap();
    let r = tr.translate(DEV, window, free_len.min(1 << 20), Access::Write);
    assert!(r.is_ok());
}

#[test]
fn a_pass_through_device_cannot_name_the_reserve() {
    let p = Platform::builder()
        .memory(64 << 20)
        .policy(DmaPolicy::Passthrough)
        .device(DEV)
        .build()
        .unwrap();
    let u = p.unit(0).unwrap();
    let ring = u.queue_registers().base;
    let (base, _) = p.mem.iommu_reserve();
    assert!(ring >= base);
    let mut acc = DmaAccessor::new(u, DEV).unwrap();
    let before = p.mem.load_u64(ring, Ordering::Acquire).unwrap();
    assert_eq!(
        acc.write(ring, &[0xaa; 16], O),
        Err(AccessError::Memory {
            sid: DEV,
            iova: ring,
            source: MemError::IommuFrame { addr: ring }
        })
    );
    let mut b = [0u8; 8];
    assert!(matches!(
        acc.read(ring, &mut b, O),
        Err(AccessError::Memory {
            source: MemError::IommuFrame { .. },
            ..
        })
    ));
    assert_eq!(p.mem.load_u64(ring, Ordering::Acquire).unwrap(), before);
}

const NIC: SourceId = SourceId(0x0901);

/// A bounce-policy domain whose device `NIC` owns a pool, and `DEV` on the
/// same unit in pass-through (IOVA = physical address). A frame is taken
/// before the pool is made, so that plain RAM lies below the pool.
struct PoolRig {
    mem: Arc<PhysMemory>,
    system: Arc<System>,
    domain: Arc<softiommu::DmaDomain>,
    nic: softiommu::DmaDevice,
}

impl PoolRig {
    fn unit(&self) -> &softiommu::Unit {
        self.system.unit_of(DEV).unwrap().1
    }
}

/// A bounce-policy domain with the NIC attached: its bounce pool is made
/// of free RAM frames as the attach returns.
fn bounce_domain(system: &Arc<System>) -> (Arc<softiommu::DmaDomain>, softiommu::DmaDevice) {
    let domain = softiommu::DmaDomain::new(
        system.clone(),
        softiommu::DmaDomainConfig {
            policy: DmaPolicy::Bounce,
            ..Default::default()
        },
    )
    .unwrap();
    let nic = domain.attach(NIC, u64::MAX, false).unwrap();
    (domain, nic)
}

/// [`pool_and_pass_through`] with the pool's domain gone again: the
/// pool's frames are plain RAM, the pass-through device still attached.
fn pool_given_back() -> (Arc<PhysMemory>, Arc<System>, u64) {
    let (p, pool) = pool_and_pass_through();
    let PoolRig {
        mem,
        system,
        domain,
        nic,
    } = p;
    drop(nic);
    drop(domain);
    assert!(!mem.is_iommu_frame(pool));
    (mem, system, pool)
}

fn pool_and_pass_through() -> (PoolRig, u64) {
    let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
    mem.alloc_zeroed_frames(0).unwrap();
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default()).unwrap();
    sys.assign(NIC, unit).unwrap();
    sys.assign(DEV, unit).unwrap();
    let system = Arc::new(sys);
    let (domain, nic) = bounce_domain(&system);
    let rig = PoolRig {
        mem,
        system,
        domain,
        nic,
    };
    rig.unit().attach(DEV, ContextEntry::PassThrough).unwrap();
    let pool = (0..rig.mem.size())
        .step_by(PAGE_SIZE as usize)
        .find(|&a| rig.mem.is_iommu_frame(a))
        .expect("a bounce pool in RAM");
    assert!(pool >= PAGE_SIZE && !rig.mem.is_iommu_frame(pool - PAGE_SIZE));
    (rig, pool)
}

#[test]
fn a_pass_through_device_reaches_no_bounce_pool_frame() {
    let (p, pool) = pool_and_pass_through();
    let u = p.unit();
    p.mem.write(pool, &[0x5a; 64]).unwrap();
    let below = pool - 64;
    p.mem.write(below, &[0x11; 64]).unwrap();
    let mut acc = DmaAccessor::new(u, DEV).unwrap();
    assert_eq!(
        acc.write(pool, &[0xee; 16], O),
        Err(AccessError::Translate(TranslateError::BounceFrame {
            sid: DEV,
            iova: pool,
            access: Access::Write
        }))
    );
    // Running from plain RAM into the pool: refused whole, nothing moved.
    assert_eq!(
        acc.write(below, &[0xee; 128], O),
        Err(AccessError::Translate(TranslateError::BounceFrame {
            sid: DEV,
            iova: pool,
            access: Access::Write
        }))
    );
    let mut b = [0u8; 16];
    assert_eq!(
        acc.read(pool + 8, &mut b, O),
        Err(AccessError::Translate(TranslateError::BounceFrame {
            sid: DEV,
            iova: pool + 8,
            access: Access::Read
        }))
    );
    assert_eq!(b, [0; 16], "nothing read");
    assert!(matches!(
        acc.read_u64(pool + 8, O),
        Err(AccessError::Translate(TranslateError::BounceFrame { .. }))
    ));
    let mut got = [0u8; 128];
    p.mem.read(below, &mut got).unwrap();
    assert!(got[..64].iter().all(|&x| x == 0x11) && got[64..].iter().all(|&x| x == 0x5a));
    let faults = u.faults().drain().records;
    assert!(
        faults
            .iter()
            .any(|f| f.sid == DEV && f.iova == pool && f.reason == FaultReason::BounceFrame),
        "{faults:?}"
    );
    // Plain RAM stays reachable in pass-through, up to the pool.
    acc.write(below, &[0x22; 64], O).unwrap();
    // The pool's own domain still reaches it through its mappings.
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let mut cpu = p.domain.cpu();
    let iova = cpu.map(&p.nic, buf, 64, DmaDirection::FromDevice).unwrap();
    let mut nic = DmaAccessor::for_device(&p.nic).unwrap();
    nic.write(iova, b"bounced", O).unwrap();
    cpu.unmap(&p.nic, iova, 64, DmaDirection::FromDevice)
        .unwrap();
    let mut back = [0u8; 7];
    p.mem.read(buf, &mut back).unwrap();
    assert_eq!(&back, b"bounced");
}

#[test]
fn a_pass_through_device_reaches_no_table_or_queue_of_any_kind() {
    let (p, _) = pool_and_pass_through();
    let u = p.unit();
    let Some(ContextEntry::Translated { root, .. }) = u.context(NIC) else {
        panic!("the bounce device is translated");
    };
    let kinds = [
        ("page table", root),
        ("invalidation queue", u.queue_registers().base),
        ("page request queue", u.page_request_registers().base),
    ];
    let mut acc = DmaAccessor::new(u, DEV).unwrap();
    for (what, at) in kinds {
        assert!(at >= p.mem.iommu_reserve().0, "{what}");
        let before = p.mem.load_u64(at, Ordering::Acquire).unwrap();
        assert_eq!(
            acc.write_u64(at, !before, O),
            Err(AccessError::Memory {
                sid: DEV,
                iova: at,
                source: MemError::IommuFrame { addr: at }
            }),
            "{what}"
        );
        assert_eq!(p.mem.load_u64(at, Ordering::Acquire).unwrap(), before);
    }
}

#[test]
fn vm_memory_views_reach_no_iommu_frame() {
    use softiommu::{PhysGuestMemory, UnitIommu};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryError, IommuMemory};
    let (p, pool) = pool_and_pass_through();
    let u = p.unit();
    let ring = u.queue_registers().base;
    p.mem.write(pool, &[0x5a; 64]).unwrap();
    let plain = pool - PAGE_SIZE;
    // A device with no IOMMU in front (the virtio-iommu's own view).
    let direct = PhysGuestMemory::new(p.mem.clone());
    for at in [pool, pool - 8] {
        assert!(matches!(
            direct.write_slice(&[0xee; 16], GuestAddress(at)),
            Err(GuestMemoryError::InvalidBackendAddress)
        ));
    }
    let mut b = [0u8; 8];
    assert!(matches!(
        direct.read_slice(&mut b, GuestAddress(pool)),
        Err(GuestMemoryError::InvalidBackendAddress)
    ));
    assert!(direct.write_slice(&[0xee; 8], GuestAddress(ring)).is_err());
    direct.write_slice(&[0x33; 8], GuestAddress(plain)).unwrap();
    // Through the unit, pass-through: the translation refuses the pool.
    let view = UnitIommu::new(p.system.clone(), DEV).unwrap();
    let m = IommuMemory::new(PhysGuestMemory::behind_iommu(p.mem.clone()), view, true, ());
    assert!(matches!(
        m.write_slice(&[0xee; 16], GuestAddress(pool)),
        Err(GuestMemoryError::IommuError(_))
    ));
    assert!(m.write_slice(&[0xee; 8], GuestAddress(ring)).is_err());
    m.write_slice(&[0x44; 8], GuestAddress(plain)).unwrap();
    let mut got = [0u8; 64];
    p.mem.read(pool, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 0x5a), "the pool is untouched");
    // The pool's own device reaches its slot through the same backend.
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let mut cpu = p.domain.cpu();
    let iova = cpu.map(&p.nic, buf, 64, DmaDirection::FromDevice).unwrap();
    let nic = IommuMemory::new(
        PhysGuestMemory::behind_iommu(p.mem.clone()),
        UnitIommu::for_device(&p.nic).unwrap(),
        true,
        (),
    );
    nic.write_slice(b"slot", GuestAddress(iova)).unwrap();
    cpu.unmap(&p.nic, iova, 64, DmaDirection::FromDevice)
        .unwrap();
    let mut back = [0u8; 4];
    p.mem.read(buf, &mut back).unwrap();
    assert_eq!(&back, b"slot");
}

#[test]
fn a_pass_through_span_cached_before_ram_became_a_bounce_pool_is_not_served() {
    use softiommu::{PhysGuestMemory, UnitIommu};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryError, IommuMemory};
    // The pool's domain goes away: its frames are plain RAM again.
    let (mem, system, pool) = pool_given_back();
    // A pass-through device reaches them through vm-memory, whose cache
    // keeps the span.
    let view = UnitIommu::new(system.clone(), DEV).unwrap();
    let m = IommuMemory::new(PhysGuestMemory::behind_iommu(mem.clone()), view, true, ());
    m.write_obj(0x11u64, GuestAddress(pool)).unwrap();
    // A new domain's pool takes them again.
    let (_domain, _nic) = bounce_domain(&system);
    assert!(
        mem.is_iommu_frame(pool),
        "the same frames make the new pool"
    );
    mem.write(pool, &[0x5a; 8]).unwrap();
    // The cached span is not served: the translation is asked again and
    // refuses the pool.
    assert!(matches!(
        m.write_obj(0xeeu64, GuestAddress(pool)),
        Err(GuestMemoryError::IommuError(_))
    ));
    assert!(matches!(
        m.read_obj::<u64>(GuestAddress(pool)),
        Err(GuestMemoryError::IommuError(_))
    ));
    let mut b = [0u8; 8];
    mem.read(pool, &mut b).unwrap();
    assert_eq!(b, [0x5a; 8]);
}

/// A pass-through device holds a section over RAM frames while the host
/// makes a bounce pool of them: its write, translated before the frames
/// became the pool's, lands while the pool waits for the section. The
/// pool is zeroed only after that wait, so it starts clean: no byte a
/// device wrote before it existed is left in it.
#[test]
fn a_pass_through_write_finishing_while_a_pool_is_made_is_not_left_in_it() {
    use std::sync::mpsc;
    use std::time::Duration;
    let (mem, system, pool) = pool_given_back();
    let unit = system.unit_of(DEV).unwrap().1;
    let (opened, open_rx) = mpsc::channel();
    std::thread::scope(|sc| {
        let mem2 = mem.clone();
        sc.spawn(move || {
            let mut t = unit.translator().unwrap();
            t.section(|g| {
                let span = g.translate(DEV, pool, 64, Access::Write).unwrap();
                let phys = span.as_slice()[0].phys;
                opened.send(()).unwrap();
                // The pool's frames are marked, and (with the zeroing
                // before the drain) zeroed long since: the device's copy
                // of the span it translated lands now.
                while !mem2.is_iommu_frame(pool) {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_millis(100));
                mem2.write(phys, &[0xee; 64]).unwrap();
            });
        });
        open_rx.recv().unwrap();
        let (_domain, nic) = bounce_domain(&system);
        assert!(mem.is_iommu_frame(pool), "the same frames make the pool");
        let mut b = [0xffu8; 64];
        mem.read(pool, &mut b).unwrap();
        assert_eq!(b, [0; 64], "the pool starts zeroed");
        drop(nic);
    });
}

/// An I/O page-fault device over all of RAM reaches no bounce pool's
/// frame: not one it had faulted in before the pool took the frame (its
/// leaf stays in the domain's table, and every walk refuses it), and not
/// one it faults on after (the request is answered `Invalid`, nothing
/// mapped). (Before: both were served, and the device read and wrote
/// another device's bounced data.)
#[test]
fn an_iopf_device_over_all_ram_reaches_no_bounce_pool_frame() {
    let (mem, system, pool) = pool_given_back();
    let (unit, u) = system.unit_of(DEV).unwrap();
    let domain = IopfDomain::new(system.clone(), IopfConfig::default()).unwrap();
    for (at, len) in guest_ram(&mem) {
        domain
            .add_region(Region {
                iova: at,
                phys: at,
                len,
                perm: Perm::RW,
            })
            .unwrap();
    }
    domain.attach(DEV).unwrap();
    let _h = IopfHandler::start(domain.clone(), unit, 1).unwrap();
    let mut acc = DmaAccessor::new(u, DEV).unwrap();
    // Faulted in while the frame is plain RAM.
    acc.write(pool, &[0x11; 8], O).unwrap();
    // A new domain's pool takes the same frames.
    let (_domain, _nic) = bounce_domain(&system);
    assert!(
        mem.is_iommu_frame(pool),
        "the same frames make the new pool"
    );
    let later = pool + 256 * PAGE_SIZE;
    assert!(mem.is_iommu_frame(later), "a pool frame never touched");
    mem.write(pool, &[0x5a; 8]).unwrap();
    mem.write(later, &[0x5a; 8]).unwrap();
    // The leaf made before: refused by the walk.
    assert_eq!(
        acc.write(pool, &[0xee; 8], O),
        Err(AccessError::Translate(TranslateError::BounceFrame {
            sid: DEV,
            iova: pool,
            access: Access::Write
        }))
    );
    let mut b = [0u8; 8];
    assert!(matches!(
        acc.read(pool, &mut b, O),
        Err(AccessError::Translate(TranslateError::BounceFrame { .. }))
    ));
    // A fault on a pool frame: answered `Invalid`, nothing mapped.
    assert!(matches!(
        acc.read(later, &mut b, O),
        Err(AccessError::Translate(
            TranslateError::PageRequestDenied { .. }
        ))
    ));
    for at in [pool, later] {
        mem.read(at, &mut b).unwrap();
        assert_eq!(b, [0x5a; 8], "{at:#x}");
    }
    // Its RAM outside the pool still works.
    acc.write(pool - PAGE_SIZE, b"ok", O).unwrap();
}
