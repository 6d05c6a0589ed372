//! [`BlkDevice`]: a virtio-blk device model (virtio 1.2 §5.2) whose every
//! ring and buffer access goes through an IOMMU unit, served by a bounded
//! set of device threads.
//!
//! # Threads
//!
//! [`BlkDeviceConfig::workers`] threads serve the request queues, queue
//! `q` by worker `q % workers`; each worker registers for its queues'
//! notifications and takes their slots one batch at a time. Not a thread
//! per queue: seed `004`'s twelve jobs on a two-core machine would put
//! twelve device threads beside twelve job threads and spend the time in
//! the scheduler; a storage controller too has fewer engines than queues.
//! One worker per core at most is the useful range; the default is one,
//! which on two cores leaves the other core to the drivers.
//!
//! Each worker has its own DMA accessor, vm-memory view and buffer (one
//! request's data, at most [`MAX_REQUEST_BYTES`]): nothing is
//! shared on the data path but the back-end and the unit.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use softiommu::access::DmaAttrs;
use softiommu::hw::{HwError, SourceId, System};

use super::backend::{BackendConfig, BackendError, BlkBackend};
use super::config::{BlkConfig, BlkConfigError, MAX_REQUEST_BYTES};
use super::request::BlkLimits;
use super::slow::{SlowRegion, MAX_HOLD};
use super::stats::{BlkDeviceStats, Counters, RequestLog};
use super::worker::{Worker, WorkerParts};
use crate::device_thread::{DeviceThreads, Lifecycle, Started};
use crate::dma_side::{DmaSide, UnitAttachError, UnitSide};
use crate::spec::blk;
use crate::transport::{DeviceEnd, MmioTransport, TransportConfig};

/// How to build a [`BlkDevice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlkDeviceConfig {
    /// Queues, limits, block size.
    pub blk: BlkConfig,
    /// Where the data lives.
    pub backend: BackendConfig,
    /// Transport policy.
    pub transport: TransportConfig,
    /// How buffer copies are ordered (seed `001`).
    pub attrs: DmaAttrs,
    /// Device threads (1 to the number of queues; more are cut to it).
    pub workers: usize,
    /// Chains per queue per batch (at least 1).
    pub batch: usize,
    /// The longest an idle worker sleeps before looking again.
    pub idle_wait: Duration,
    /// A slow region (the latency tail that ages IOVA caches), if any.
    pub slow: Option<SlowRegion>,
    /// The CPU every worker thread is pinned to (a CPU the kernel refuses
    /// is ignored); `None` leaves them to the scheduler. Two devices whose
    /// figures are compared run where each other runs only if both are
    /// pinned: a device model is hardware of its own, and whether it
    /// shares its driver's core decides what the driver's CPU per request
    /// costs (cache lines of the rings and completion words moving
    /// between cores, or not).
    pub cpu: Option<usize>,
}

impl Default for BlkDeviceConfig {
    fn default() -> Self {
        Self {
            blk: BlkConfig::default(),
            backend: BackendConfig::default(),
            transport: TransportConfig::default(),
            attrs: DmaAttrs::ORDERED,
            workers: 1,
            batch: 64,
            idle_wait: Duration::from_millis(20),
            slow: None,
            cpu: None,
        }
    }
}

/// Why a device could not start or stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlkDeviceError {
    /// The configuration is out of range.
    #[error(transparent)]
    Config(#[from] BlkConfigError),
    /// The back-end could not be opened.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A slow region's hold past [`MAX_HOLD`].
    #[error("slow-region hold of {hold:?} is past the limit of {max:?}")]
    SlowHold {
        /// The hold asked for.
        hold: Duration,
        /// The limit.
        max: Duration,
    },
    /// The device's source id has no unit, or its translator could not be
    /// made.
    #[error("device {sid}: {source}")]
    Setup {
        /// The device.
        sid: SourceId,
        /// What the unit said.
        source: HwError,
    },
    /// The OS would not start a thread.
    #[error("cannot start a device thread: {reason}")]
    Spawn {
        /// The OS error.
        reason: String,
    },
    /// A thread did not answer within the timeout.
    #[error("a device thread did not {what} within {secs} s")]
    Timeout {
        /// "start" or "stop".
        what: &'static str,
        /// The timeout.
        secs: u64,
    },
    /// A thread panicked (a bug, never a driver's doing).
    #[error("a device thread panicked")]
    Panicked,
}

/// A running virtio-blk device.
#[derive(Debug)]
pub struct BlkDevice {
    transport: MmioTransport,
    backend: Arc<dyn BlkBackend>,
    threads: DeviceThreads<BlkDeviceError>,
    counters: Vec<Arc<CachePadded<Counters>>>,
    log: Arc<RequestLog>,
    slow: Option<SlowRegion>,
}

/// The id string `VIRTIO_BLK_T_GET_ID` returns for device `sid`
/// (`softiommu-<sid>`, NUL-padded to 20 bytes).
pub fn device_id_string(sid: SourceId) -> [u8; blk::ID_BYTES] {
    id_string(&sid.to_string())
}

/// `softiommu-<name>`, NUL-padded (or cut) to 20 bytes.
fn id_string(name: &str) -> [u8; blk::ID_BYTES] {
    let mut id = [0u8; blk::ID_BYTES];
    let s = format!("softiommu-{name}");
    let n = s.len().min(id.len());
    id[..n].copy_from_slice(&s.as_bytes()[..n]);
    id
}

/// A side whose threads always attach (a front-end's IOTLB).
impl From<std::convert::Infallible> for BlkDeviceError {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

impl From<UnitAttachError> for BlkDeviceError {
    fn from(e: UnitAttachError) -> Self {
        BlkDeviceError::Setup {
            sid: e.sid,
            source: e.source,
        }
    }
}

impl BlkDevice {
    /// Opens the back-end and starts the device `sid` of `system` (its DMA
    /// through the unit `sid` is attached to, copies ordered by
    /// `cfg.attrs`): [`spawn_on`](Self::spawn_on) a [`UnitSide`].
    pub fn spawn(
        cfg: &BlkDeviceConfig,
        system: Arc<System>,
        sid: SourceId,
    ) -> Result<Self, BlkDeviceError> {
        Self::spawn_on(cfg, UnitSide::new(system, sid, cfg.attrs))
    }

    /// Opens the back-end and starts the device with its DMA translated
    /// where `side` says: its workers, each on its own thread, each
    /// attached to `side` on itself. Returns once every worker has
    /// attached. `cfg.attrs` is the unit side's (a `side` carries its own
    /// copy ordering).
    pub fn spawn_on<S: DmaSide>(cfg: &BlkDeviceConfig, side: S) -> Result<Self, BlkDeviceError>
    where
        BlkDeviceError: From<S::Error>,
    {
        cfg.blk.check()?;
        if let Some(s) = cfg.slow {
            if s.hold > MAX_HOLD {
                return Err(BlkDeviceError::SlowHold {
                    hold: s.hold,
                    max: MAX_HOLD,
                });
            }
        }
        let backend = cfg.backend.open()?;
        let capacity = backend.capacity();
        // A back-end that needs more alignment than the announced block
        // size (an `O_DIRECT` file) announces its own: the driver is told
        // the size the device will hold it to.
        let announced = BlkConfig {
            blk_size: cfg.blk.blk_size.max(backend.io_align()),
            ..cfg.blk
        };
        let transport = MmioTransport::new(announced.device_info(capacity), cfg.transport);
        let log = Arc::new(RequestLog::default());
        let nq = cfg.blk.num_queues;
        let n = cfg.workers.clamp(1, usize::from(nq));
        let limits = BlkLimits {
            capacity_sectors: capacity / blk::SECTOR_SIZE,
            // The protocol's unit is 512 bytes whatever `blk_size` says
            // (§5.2.5: `blk_size` is the optimal size, for performance);
            // only a back-end that needs more alignment is given it.
            blk_size: backend.io_align().max(blk::SECTOR_SIZE as u32),
            seg_max: cfg.blk.seg_max,
            size_max: cfg.blk.size_max,
            // The buffer is the largest any configuration announces (a
            // driver that acknowledged neither segment limit was told of
            // none): untouched pages of it cost nothing.
            max_bytes: MAX_REQUEST_BYTES,
            flush: false,
        };
        let mut dev = Self {
            transport,
            backend: backend.clone(),
            threads: DeviceThreads::new(),
            counters: Vec::with_capacity(n),
            log,
            slow: cfg.slow,
        };
        for w in 0..n {
            let counters = Arc::new(CachePadded::new(Counters::default()));
            dev.counters.push(counters.clone());
            let queues: Vec<u16> = (0..nq).filter(|q| usize::from(*q) % n == w).collect();
            let (side, backend, log) = (side.clone(), backend.clone(), dev.log.clone());
            let end = DeviceEnd::new(&dev.transport);
            let c = cfg.clone();
            let idle_wait = cfg.idle_wait;
            let name = side.name();
            let thread = format!("virtio-blk {name} w{w}");
            let cpu = cfg.cpu;
            let setup = move || {
                crate::device_thread::pin(cpu);
                let a = side.attach()?;
                let worker = Worker::<S>::new(WorkerParts {
                    ring: a.ring,
                    fence: a.fence,
                    dma: a.dma,
                    backend,
                    limits,
                    queues,
                    queue_max: c.blk.queue_max,
                    batch: c.batch.max(1),
                    slow: c.slow,
                    counters,
                    log,
                    id: id_string(&name),
                });
                end.register_queues(worker.mask());
                Ok((worker, end))
            };
            dev.threads
                .spawn(thread, setup, move |(worker, end), stop| {
                    worker.run(&end, stop, idle_wait)
                })
                .map_err(<BlkDeviceError as From<Lifecycle>>::from)?;
        }
        dev.threads.started().map_err(Started::into_error)?;
        Ok(dev)
    }

    /// The register block a driver programs.
    pub fn transport(&self) -> &MmioTransport {
        &self.transport
    }

    /// The back-end.
    pub fn backend(&self) -> &Arc<dyn BlkBackend> {
        &self.backend
    }

    /// The slow region, if the device has one.
    pub fn slow_region(&self) -> Option<SlowRegion> {
        self.slow
    }

    /// Device threads.
    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// CPU time the device threads have used so far, summed.
    pub fn cpu_time(&self) -> Duration {
        self.threads.cpu_time()
    }

    /// The counters, summed over the workers.
    pub fn stats(&self) -> BlkDeviceStats {
        let all: Vec<_> = self.counters.iter().map(|c| &***c).collect();
        BlkDeviceStats::sum(all)
    }

    /// The requests the device refused or failed.
    pub fn request_log(&self) -> &RequestLog {
        &self.log
    }

    /// Stops the threads (each within its current batch) and returns their
    /// CPU time.
    pub fn stop(mut self) -> Result<Duration, BlkDeviceError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<Duration, BlkDeviceError> {
        Ok(self.threads.stop()?)
    }
}

impl From<Lifecycle> for BlkDeviceError {
    fn from(l: Lifecycle) -> Self {
        match l {
            Lifecycle::Spawn { reason, .. } => BlkDeviceError::Spawn { reason },
            Lifecycle::Timeout { what, secs } => BlkDeviceError::Timeout { what, secs },
            Lifecycle::Panicked => BlkDeviceError::Panicked,
        }
    }
}

impl Drop for BlkDevice {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use softiommu::dma::{DmaDomainConfig, DmaPolicy};
    use softiommu::hw::LatencyModel;

    use super::*;
    use crate::blk::{BlkDriver, BlkDriverConfig, BlkOp};
    use crate::dma_side::counting::Counting;
    use crate::host_platform::{HostPlatform, HostPlatformSpec};

    /// A 64 MiB platform whose device `sid` maps strictly.
    fn strict_platform(sid: SourceId) -> HostPlatform {
        HostPlatform::build(HostPlatformSpec {
            mem_bytes: 64 << 20,
            latency: LatencyModel::zero(),
            sid,
            domain: DmaDomainConfig {
                policy: DmaPolicy::Strict,
                ..Default::default()
            },
            iopf: None,
        })
        .unwrap()
    }

    /// The device spawned on a side other than a bare unit: a write and
    /// its read-back complete whole, every ring and buffer access through
    /// that side (its counters move).
    #[test]
    fn a_device_spawned_on_another_dma_side_reaches_memory_only_through_it() {
        let sid = SourceId(0x0501);
        let p = strict_platform(sid);
        let cfg = BlkDeviceConfig {
            backend: BackendConfig::Memory { capacity: 1 << 20 },
            ..BlkDeviceConfig::default()
        };
        let side = Counting::new(UnitSide::new(p.system.clone(), sid, cfg.attrs));
        let (rings, dmas) = (side.ring.clone(), side.dma.clone());
        let device = BlkDevice::spawn_on(&cfg, side).unwrap();
        let mut d = BlkDriver::probe(
            device.transport().clone(),
            &p.domain,
            p.dev.clone(),
            BlkDriverConfig {
                queues: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let mut q = d.take_queue(0).unwrap();
        let (r0, d0) = (rings.load(Ordering::Relaxed), dmas.load(Ordering::Relaxed));
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut run = |op, buf: Option<&[u8]>| {
            q.submit(op, 8, 4096, buf).unwrap().unwrap();
            assert!(q.commit());
            let mut got = None;
            let t0 = Instant::now();
            while got.is_none() {
                assert!(t0.elapsed() < Duration::from_secs(10), "not completed");
                q.reap(None, |c, s| {
                    let mut b = vec![0u8; 4096];
                    s.read(&mut b).unwrap();
                    got = Some((c.status, b));
                })
                .unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            got.unwrap()
        };
        assert_eq!(run(BlkOp::Write, Some(&data)).0, blk::S_OK);
        let (status, back) = run(BlkOp::Read, None);
        assert_eq!((status, back == data), (blk::S_OK, true));
        assert!(dmas.load(Ordering::Relaxed) > d0);
        assert!(rings.load(Ordering::Relaxed) > r0);
        assert!(device.transport().errors().drain().is_empty());
        drop(q);
        drop(d);
        device.stop().unwrap();
    }

    /// The CPUs the kernel lets thread `tid` of this process run on, from
    /// its `Cpus_allowed_list` (`0-1,3` form).
    fn cpus_of(tid: &str) -> Vec<usize> {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim();
        let mut cpus = Vec::new();
        for part in list.split(',') {
            match part.split_once('-') {
                Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
                None => cpus.push(part.parse().unwrap()),
            }
        }
        cpus
    }

    /// The tasks of this process whose name starts with `prefix`.
    fn tasks_named(prefix: &str) -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| {
                let tid = e.ok()?.file_name().into_string().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
                comm.starts_with(prefix).then_some(tid)
            })
            .collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn workers_asked_to_run_on_a_cpu_run_only_there() {
        let allowed = crate::affinity::allowed_cpus();
        let Some(&cpu) = allowed.last() else {
            return;
        };
        let p = strict_platform(SourceId(0x0300));
        let cfg = BlkDeviceConfig {
            backend: BackendConfig::Memory { capacity: 1 << 20 },
            blk: BlkConfig {
                num_queues: 2,
                ..BlkConfig::default()
            },
            workers: 2,
            cpu: Some(cpu),
            ..BlkDeviceConfig::default()
        };
        let side = UnitSide::new(p.system.clone(), SourceId(0x0300), cfg.attrs);
        let device = BlkDevice::spawn_on(&cfg, side).unwrap();
        assert_eq!(device.workers(), 2);
        // Named "virtio-blk <side> w<n>" (cut to 15 bytes by the kernel);
        // other tests' devices may run beside, unpinned: with more than
        // one CPU allowed, theirs are allowed more than `cpu`.
        let pinned = tasks_named("virtio-blk")
            .iter()
            .filter(|tid| cpus_of(tid) == vec![cpu])
            .count();
        assert!(pinned >= 2, "{pinned} worker(s) pinned to CPU {cpu}");
        device.stop().unwrap();
    }
}
