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
//! request's data, at most [`BlkConfig::max_request_bytes`]): nothing is
//! shared on the data path but the back-end and the unit.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use softiommu::access::{DmaAccessor, DmaAttrs, PhysGuestMemory, UnitIommu};
use softiommu::hw::{HwError, SourceId, System};
use vm_memory::IommuMemory;

use super::backend::{BackendConfig, BackendError, BlkBackend};
use super::config::{BlkConfig, BlkConfigError};
use super::request::BlkLimits;
use super::slow::{SlowRegion, MAX_HOLD};
use super::stats::{BlkDeviceStats, Counters, RequestLog};
use super::worker::{Worker, WorkerParts};
use crate::device_dma::UnitDma;
use crate::device_thread::{DeviceThreads, Lifecycle, Started};
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
    let mut id = [0u8; blk::ID_BYTES];
    let s = format!("softiommu-{sid}");
    let n = s.len().min(id.len());
    id[..n].copy_from_slice(&s.as_bytes()[..n]);
    id
}

impl BlkDevice {
    /// Opens the back-end and starts the device `sid` of `system`: its
    /// workers, each on its own thread. Returns once every worker has made
    /// its translators.
    pub fn spawn(
        cfg: &BlkDeviceConfig,
        system: Arc<System>,
        sid: SourceId,
    ) -> Result<Self, BlkDeviceError> {
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
        let transport = MmioTransport::new(cfg.blk.device_info(capacity), cfg.transport);
        let log = Arc::new(RequestLog::default());
        let nq = cfg.blk.num_queues;
        let n = cfg.workers.clamp(1, usize::from(nq));
        let limits = BlkLimits {
            capacity_sectors: capacity / blk::SECTOR_SIZE,
            blk_size: cfg.blk.blk_size,
            seg_max: cfg.blk.seg_max,
            size_max: cfg.blk.size_max,
            max_bytes: cfg.blk.max_request_bytes(),
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
            let (system, backend, log) = (system.clone(), backend.clone(), dev.log.clone());
            let end = DeviceEnd::new(&dev.transport);
            let c = cfg.clone();
            let idle_wait = cfg.idle_wait;
            let setup = move || {
                let setup = |source| BlkDeviceError::Setup { sid, source };
                let (_, unit) = system
                    .unit_of(sid)
                    .ok_or(setup(HwError::DeviceNotAssigned { sid }))?;
                let dma = DmaAccessor::new(unit, sid).map_err(setup)?;
                let view = UnitIommu::new(system.clone(), sid).map_err(setup)?;
                let mem = IommuMemory::new(
                    PhysGuestMemory::behind_iommu(system.memory().clone()),
                    view.clone(),
                    true,
                    (),
                );
                let worker = Worker::new(WorkerParts {
                    mem,
                    view,
                    system: system.clone(),
                    dma: UnitDma::new(dma, c.attrs),
                    backend,
                    limits,
                    queues,
                    queue_max: c.blk.queue_max,
                    batch: c.batch.max(1),
                    slow: c.slow,
                    counters,
                    log,
                    id: device_id_string(sid),
                });
                end.register_queues(worker.mask());
                Ok((worker, end))
            };
            dev.threads
                .spawn(
                    format!("virtio-blk {sid} w{w}"),
                    setup,
                    move |(worker, end), stop| worker.run(&end, stop, idle_wait),
                )
                .map_err(BlkDeviceError::from)?;
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
