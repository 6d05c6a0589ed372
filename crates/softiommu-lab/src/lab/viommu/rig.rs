//! One mode's machine: memory, a unit, the virtio-iommu and its driver
//! (or none), the disk, and a minimal virtio-blk driver on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::dma::DmaDirection;
use softiommu::hw::{SourceId, System, UnitConfig, UnitId};
use softiommu::mem::{PhysMemory, PAGE_SIZE};
use softiommu_virtio::blk::{BackendConfig, BlkDevice, BlkDeviceConfig, SlowRegion};
use softiommu_virtio::cpu_clock;
use softiommu_virtio::spec::{self, blk, desc, reg, status};
use softiommu_virtio::transport::TransportConfig;
use softiommu_virtio::viommu::{
    ViommuConfig, ViommuDevice, ViommuDma, ViommuDriver, ViommuDriverConfig, ViommuMapping,
    ViommuMode,
};
use softiommu_virtio::vring::{DriverRing, RingLayout};

use super::run::{Measured, Sliced};
use super::{err, Mode, BLK_SID, FLUSH_QUEUE, SSD_BYTES_PER_SEC};
use crate::error::LabResult;

/// The guest's view of the disk's DMA: physical addresses (no IOMMU) or
/// the DMA API over the virtio-iommu.
enum Dma {
    None,
    Viommu(Box<ViommuDma>),
}

impl Dma {
    /// Maps `sg`; returns each segment's DMA address and the mappings to
    /// give back.
    fn map(
        &mut self,
        sg: &[(u64, u64, DmaDirection)],
    ) -> LabResult<(Vec<u64>, Vec<ViommuMapping>)> {
        match self {
            Dma::None => Ok((sg.iter().map(|s| s.0).collect(), Vec::new())),
            Dma::Viommu(d) => {
                // The buffers of one submission made usable together
                // (one notification in lazy mode).
                let maps = d.map_segments(sg).map_err(err)?;
                let addrs = maps.iter().map(|m| m.iova).collect();
                Ok((addrs, maps))
            }
        }
    }

    fn unmap(&mut self, maps: Vec<ViommuMapping>) -> LabResult<()> {
        if let Dma::Viommu(d) = self {
            for m in maps {
                d.unmap(m).map_err(err)?;
            }
        }
        Ok(())
    }
}

/// A guest machine of the lab: 64 MiB of memory, one unit with the
/// endpoint `sid` behind it, the virtio-iommu (in bypass for
/// [`Mode::None`]) served on the notifying thread, as a hypervisor
/// handles each exit on the trapping vCPU, every notification costing
/// `exit`, and its driver busy-waiting for every answer, as Linux's does.
/// The storage rows' machine and the UDP rows' guest are built here.
pub(super) struct Guest {
    pub(super) mem: Arc<PhysMemory>,
    pub(super) system: Arc<System>,
    pub(super) unit: UnitId,
    pub(super) viommu: ViommuDevice,
    pub(super) driver: ViommuDriver,
}

impl Guest {
    pub(super) fn new(sid: SourceId, mode: Mode, exit: Duration) -> LabResult<Self> {
        let mem = Arc::new(PhysMemory::new(64 << 20)?);
        let mut sys = System::new(mem.clone());
        let unit = sys.add_unit(UnitConfig::default())?;
        sys.assign(sid, unit)?;
        let system = Arc::new(sys);
        let vcfg = ViommuConfig::default();
        let viommu = ViommuDevice::spawn(
            ViommuConfig {
                endpoints: vec![sid],
                bypass: mode == Mode::None,
                serve_in_notifier: true,
                transport: TransportConfig {
                    notify_exit: exit,
                    ..vcfg.transport
                },
                ..vcfg
            },
            system.clone(),
            unit,
        )
        .map_err(err)?;
        let dcfg = ViommuDriverConfig::default();
        let driver = ViommuDriver::probe(
            viommu.transport().clone(),
            mem.clone(),
            ViommuDriverConfig {
                queue_size: 256,
                spin: dcfg.wait,
                ..dcfg
            },
        )
        .map_err(err)?;
        Ok(Self {
            mem,
            system,
            unit,
            viommu,
            driver,
        })
    }
}

/// One mode's machine for a round: memory, a unit, the virtio-iommu and
/// its driver (or none), the disk and the driver's queue on it.
///
/// Fields drop in order: the driver side before the devices.
pub(super) struct Rig {
    mode: Mode,
    q: BlkQueue,
    dma: Dma,
    disk: Option<BlkDevice>,
    t: spec_t::Transport,
    viommu: ViommuDevice,
    system: Arc<System>,
    unit: UnitId,
}

impl Rig {
    /// A fresh machine: `depth` reads in flight, the disk's requests
    /// held `hold` (none: the null back-end's time), every notification
    /// costing `exit`.
    pub(super) fn new(
        mode: Mode,
        hold: Option<Duration>,
        depth: usize,
        exit: Duration,
        bs: u64,
    ) -> LabResult<Self> {
        let Guest {
            mem,
            system,
            unit,
            viommu,
            driver: vdrv,
        } = Guest::new(BLK_SID, mode, exit)?;
        let ep = u32::from(BLK_SID.0);
        let mut dma = match mode {
            Mode::None => {
                drop(vdrv);
                Dma::None
            }
            Mode::Strict => Dma::Viommu(Box::new(
                ViommuDma::new(vdrv, 1, &[ep], ViommuMode::Strict).map_err(err)?,
            )),
            Mode::Lazy => Dma::Viommu(Box::new(
                ViommuDma::new(
                    vdrv,
                    1,
                    &[ep],
                    ViommuMode::Lazy {
                        flush_queue: FLUSH_QUEUE,
                    },
                )
                .map_err(err)?,
            )),
        };
        let disk = BlkDevice::spawn(
            &BlkDeviceConfig {
                backend: BackendConfig::Null { capacity: 1 << 30 },
                transport: TransportConfig {
                    notify_exit: exit,
                    ..TransportConfig::default()
                },
                slow: hold.map(|hold| SlowRegion {
                    from_sector: 0,
                    hold,
                    bytes_per_sec: SSD_BYTES_PER_SEC,
                }),
                ..BlkDeviceConfig::default()
            },
            system.clone(),
            BLK_SID,
        )
        .map_err(err)?;
        let t = disk.transport().clone();
        let q = BlkQueue::probe(&t, &mem, &mut dma, depth, bs)?;
        Ok(Self {
            mode,
            q,
            dma,
            disk: Some(disk),
            t,
            viommu,
            system,
            unit,
        })
    }

    fn counts(&self) -> (u64, u64, u64, u64, u64) {
        let v = self.viommu.stats();
        let d = self.disk.as_ref().map(|d| d.stats()).unwrap_or_default();
        (
            v.requests,
            self.viommu.transport().notifications(),
            v.invalidations,
            d.held_ns,
            d.released,
        )
    }
}

impl Sliced for Rig {
    /// `ios` reads, from an idle queue to an idle queue.
    fn slice(&mut self, ios: u64) -> LabResult<Measured> {
        let c0 = self.counts();
        let cpu0 = cpu_clock::thread();
        let t0 = Instant::now();
        let wait = match self.q.run(&self.t, &mut self.dma, ios) {
            Ok(w) => w,
            Err(e) => {
                let f = self.system.unit(self.unit).map(|u| u.faults().drain());
                return Err(err(format!("{e}; mode {:?}; unit faults {f:?}", self.mode)));
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_clock::thread().saturating_sub(cpu0);
        let c1 = self.counts();
        Ok(Measured {
            secs,
            cpu_secs: cpu.saturating_sub(wait).as_secs_f64(),
            wait_cpu_secs: wait.as_secs_f64(),
            requests: c1.0 - c0.0,
            notifications: c1.1 - c0.1,
            invalidations: c1.2 - c0.2,
            held_ns: c1.3 - c0.3,
            released: c1.4 - c0.4,
        })
    }

    /// Lazy's last flush (timed and counted with the reads: it is their
    /// work), then the disk stopped.
    fn finish(&mut self) -> LabResult<Measured> {
        let c0 = self.counts();
        let cpu0 = cpu_clock::thread();
        let t0 = Instant::now();
        if let Dma::Viommu(d) = &mut self.dma {
            d.flush().map_err(err)?;
        }
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_clock::thread().saturating_sub(cpu0).as_secs_f64();
        let c1 = self.counts();
        self.t.write(reg::STATUS, 0);
        if let Some(d) = self.disk.take() {
            let _ = d.stop();
        }
        Ok(Measured::moved(
            secs,
            cpu,
            [c0.0, c0.1, c0.2],
            [c1.0, c1.1, c1.2],
        ))
    }
}

/// A minimal virtio-blk driver of one queue whose every DMA address
/// comes from [`Dma`]: per read, a header, `bs` bytes of data and a status
/// byte, mapped when submitted and unmapped when used. The reads whose
/// slots one pass over the used ring freed are submitted together: each
/// read's buffers mapped by its own DMA call, the disk notified once.
struct BlkQueue {
    mem: Arc<PhysMemory>,
    ring: DriverRing,
    /// Per slot: the page holding header and status, and the data block.
    slots: Vec<(u64, u64)>,
    free: Vec<u16>,
    maps: Vec<Vec<ViommuMapping>>,
    sector: u64,
    /// Bytes per read.
    bs: u64,
    /// The ring's mapping, kept for the run (the machine goes with it).
    _ring: Vec<ViommuMapping>,
}

impl BlkQueue {
    fn probe(
        t: &spec_t::Transport,
        mem: &Arc<PhysMemory>,
        dma: &mut Dma,
        depth: usize,
        bs: u64,
    ) -> LabResult<Self> {
        t.bind_interrupt(std::thread::current());
        t.write(reg::STATUS, 0);
        t.write(reg::STATUS, status::ACKNOWLEDGE);
        t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        let wanted: u64 = 1 << spec::feature::VERSION_1 | 1 << spec::feature::ACCESS_PLATFORM;
        t.write(reg::DRIVER_FEATURES_SEL, 0);
        t.write(reg::DRIVER_FEATURES, wanted as u32);
        t.write(reg::DRIVER_FEATURES_SEL, 1);
        t.write(reg::DRIVER_FEATURES, (wanted >> 32) as u32);
        let st = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        t.write(reg::STATUS, st);
        if t.read(reg::STATUS) & status::FEATURES_OK == 0 {
            return Err(err("the disk refused VERSION_1 | ACCESS_PLATFORM"));
        }
        let size: u16 = 128;
        let layout = RingLayout::new(size);
        let order = layout
            .bytes
            .div_ceil(PAGE_SIZE)
            .next_power_of_two()
            .trailing_zeros();
        let phys = mem.alloc_zeroed_frames(order)?;
        // The ring is a coherent allocation: mapped once, for the run.
        let (addrs, ring_maps) = dma.map(&[(phys, layout.bytes, DmaDirection::Bidirectional)])?;
        let ring = DriverRing::new(mem.clone(), phys, addrs[0], layout).map_err(err)?;
        t.program_queue(0, size, ring.device_addresses());
        t.write(reg::STATUS, st | status::DRIVER_OK);
        let mut slots = Vec::with_capacity(depth);
        for _ in 0..depth {
            let order = bs.div_ceil(PAGE_SIZE).next_power_of_two().trailing_zeros();
            slots.push((mem.alloc_zeroed_frames(0)?, mem.alloc_zeroed_frames(order)?));
        }
        Ok(Self {
            mem: mem.clone(),
            ring,
            slots,
            free: (0..depth as u16).rev().collect(),
            maps: vec![Vec::new(); depth],
            sector: 0,
            bs,
            _ring: ring_maps,
        })
    }

    /// Submits a read in each of `slots` (the reads whose slots one pass
    /// over the used ring freed, as blk-mq hands a driver a batch of
    /// requests, `queue_rqs`): each read's buffers mapped by its own DMA
    /// call, as Linux maps each request — in lazy mode one map sync, one
    /// notification of the virtio-iommu per read (Linux 6.8's
    /// `iotlb_sync_map` per mapping call; a sync shared by several
    /// requests would be a batching Linux does not do); strict sends and
    /// waits for each MAP — then one notification of the disk for the
    /// batch if it asks for one (the kick is what `queue_rqs` batches).
    fn submit(&mut self, t: &spec_t::Transport, dma: &mut Dma, slots: &[u16]) -> LabResult<()> {
        for &slot in slots {
            let (page, data) = self.slots[usize::from(slot)];
            let mut hdr = [0u8; blk::HDR_LEN];
            hdr[0..4].copy_from_slice(&blk::T_IN.to_le_bytes());
            hdr[8..16].copy_from_slice(&self.sector.to_le_bytes());
            self.sector =
                (self.sector + self.bs / blk::SECTOR_SIZE) % ((1 << 30) / blk::SECTOR_SIZE);
            self.mem.write(page, &hdr)?;
            self.mem.write(page + 64, &[0xff])?;
            let (a, maps) = dma.map(&[
                (page, blk::HDR_LEN as u64, DmaDirection::ToDevice),
                (data, self.bs, DmaDirection::FromDevice),
                (page + 64, 1, DmaDirection::FromDevice),
            ])?;
            self.maps[usize::from(slot)] = maps;
            let d0 = slot * 3;
            self.ring
                .set_desc(d0, a[0], blk::HDR_LEN as u32, desc::F_NEXT, d0 + 1);
            self.ring.set_desc(
                d0 + 1,
                a[1],
                self.bs as u32,
                desc::F_NEXT | desc::F_WRITE,
                d0 + 2,
            );
            self.ring.set_desc(d0 + 2, a[2], 1, desc::F_WRITE, 0);
        }
        for &slot in slots {
            self.ring.push_avail(slot * 3);
        }
        self.ring.publish();
        if self.ring.needs_kick() {
            t.write(reg::QUEUE_NOTIFY, 0);
        }
        Ok(())
    }

    /// `ios` reads at the queue's depth; returns the CPU time spent
    /// waiting for completions with nothing else to do. The driver waits
    /// for the disk's interrupt in every mode alike, as a guest's vCPU
    /// halts (polling instead would take the CPU the disk's thread needs
    /// on a machine with more runnable threads than cores).
    fn run(&mut self, t: &spec_t::Transport, dma: &mut Dma, ios: u64) -> LabResult<Duration> {
        let (mut submitted, mut done) = (0u64, 0u64);
        let mut deadline = Instant::now() + Duration::from_secs(10);
        let mut waiting: Option<Duration> = None;
        let mut wait = Duration::ZERO;
        let mut batch: Vec<u16> = Vec::with_capacity(self.slots.len());
        while done < ios {
            batch.clear();
            while submitted < ios {
                let Some(slot) = self.free.pop() else { break };
                batch.push(slot);
                submitted += 1;
            }
            if !batch.is_empty() {
                self.submit(t, dma, &batch)?;
            }
            let mut got = false;
            while let Some((id, _)) = self.ring.pop_used() {
                if let Some(w0) = waiting.take() {
                    wait += cpu_clock::thread().saturating_sub(w0);
                }
                let slot = u16::try_from(id / 3).map_err(err)?;
                let mut st = [0u8];
                let page = self
                    .slots
                    .get(usize::from(slot))
                    .ok_or_else(|| err("bad used id"))?
                    .0;
                self.mem.read(page + 64, &mut st)?;
                if st[0] != blk::S_OK {
                    return Err(err(format!("read failed with status {}", st[0])));
                }
                let maps = std::mem::take(&mut self.maps[usize::from(slot)]);
                dma.unmap(maps)?;
                self.free.push(slot);
                done += 1;
                got = true;
            }
            if got {
                deadline = Instant::now() + Duration::from_secs(10);
            } else {
                if waiting.is_none() {
                    waiting = Some(cpu_clock::thread());
                }
                if Instant::now() > deadline {
                    return Err(err(format!(
                        "the disk returned nothing for 10 s ({done} of {ios} done; status {:#x}, {:?})",
                        t.status(),
                        t.errors()
                    )));
                }
                // Until the disk's interrupt (its unpark), bounded.
                std::thread::park_timeout(Duration::from_millis(1));
            }
        }
        Ok(wait)
    }
}

/// The transport type, named once.
mod spec_t {
    pub type Transport = softiommu_virtio::transport::MmioTransport;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four reads submitted together (a slice's first batch fills every
    /// free slot): lazy maps each read's three buffers with its own map
    /// sync — four notifications of the virtio-iommu, the UNMAPs queued
    /// for a later sync; strict sends and waits for every MAP and UNMAP
    /// (24 notifications).
    #[test]
    fn a_batch_of_reads_submitted_together_syncs_each_read_s_maps_on_its_own_in_lazy_mode() {
        // Linux maps each request by its own call, each with its own
        // `iotlb_sync_map`: four reads are four notifications in lazy
        // mode, however the disk's kick is batched.
        for (mode, notifications) in [(Mode::Lazy, 4), (Mode::Strict, 24)] {
            let mut rig = Rig::new(mode, None, 4, Duration::ZERO, 4096).expect("rig");
            let m = rig.slice(4).expect("four reads");
            assert_eq!(m.notifications, notifications, "{mode:?}: {m:?}");
            let requests = if mode == Mode::Lazy { 12 } else { 24 };
            assert_eq!(m.requests, requests, "{mode:?}: {m:?}");
            let f = rig.finish().expect("finish");
            if mode == Mode::Lazy {
                // The final flush sends the twelve UNMAPs with one
                // notification.
                assert_eq!((f.requests, f.notifications), (12, 1), "{f:?}");
            }
        }
    }
}
