//! A fio-like job description and its checks: every field has a range,
//! and a value outside it is a [`FioError`] naming the field and the
//! range, never a panic.

use std::time::Duration;

use crate::blk::{BlkDriverError, BlkHostError, MAX_DRIVER_REQUEST};

/// The most jobs a run takes (one queue each; the transport has 64).
pub const MAX_JOBS: usize = 64;
/// The most I/Os in flight per job.
pub const MAX_IODEPTH: usize = 1024;
/// The most slow I/Os in flight per job.
pub const MAX_SLOW_DEPTH: usize = 10_000;
/// The highest slow-I/O rate per job ([`SlowTail::per_s`]).
pub const MAX_SLOW_PER_S: f64 = 1_000_000.0;
/// The most requests in flight per job, fast and slow together: a request
/// takes three descriptors (header, data merged by the IOMMU, status), and
/// a split virtqueue holds at most 32,768 (virtio 1.2 §2.7, Queue Size).
pub const MAX_SLOTS: usize = 32_768 / 3;
/// The longest run: a day.
pub const MAX_RUNTIME: Duration = Duration::from_secs(86_400);
/// The shortest reporting window.
pub const MIN_WINDOW: Duration = Duration::from_millis(10);

/// fio's `rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwMode {
    /// `randread`.
    RandRead,
    /// `randwrite`.
    RandWrite,
    /// `randrw`: reads `read_pct` percent of the time (fio's `rwmixread`).
    RandRw {
        /// Percent of reads (0..=100).
        read_pct: u8,
    },
}

impl RwMode {
    /// Parses fio's names (`randrw` reads half the time).
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "randread" => Some(RwMode::RandRead),
            "randwrite" => Some(RwMode::RandWrite),
            "randrw" => Some(RwMode::RandRw { read_pct: 50 }),
            _ => None,
        }
    }

    /// fio's name.
    pub fn name(self) -> &'static str {
        match self {
            RwMode::RandRead => "randread",
            RwMode::RandWrite => "randwrite",
            RwMode::RandRw { .. } => "randrw",
        }
    }
}

/// Block sizes: one (`bs=4k`) or a weighted mix (`bssplit=4k/60:16k/20…`,
/// written `4k:60,16k:20,64k:15,128k:5`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSizes(Vec<(u64, u32)>);

impl BlockSizes {
    /// One size for every I/O.
    pub fn one(bytes: u64) -> Self {
        Self(vec![(bytes, 100)])
    }

    /// The mean size in bytes, weighted by the percentages.
    pub fn mean_bytes(&self) -> f64 {
        let total: u32 = self.0.iter().map(|&(_, p)| p).sum();
        let sum: f64 = self.0.iter().map(|&(b, p)| b as f64 * f64::from(p)).sum();
        sum / f64::from(total.max(1))
    }

    /// Parses `4k`, `128k`, `1m`, `512` or a mix `4k:60,16k:20,…` whose
    /// percentages sum to 100.
    pub fn parse(s: &str) -> Result<Self, FioError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(FioError::MixSyntax {
                entry: String::new(),
                reason: "empty",
            });
        }
        if !s.contains(':') {
            let bytes = parse_size(s).ok_or_else(|| FioError::MixSyntax {
                entry: s.to_string(),
                reason: "not a size (512, 4k, 1m)",
            })?;
            let b = Self::one(bytes);
            b.check()?;
            return Ok(b);
        }
        let mut v = Vec::new();
        for entry in s.split(',') {
            let bad = |reason| FioError::MixSyntax {
                entry: entry.to_string(),
                reason,
            };
            let (size, pct) = entry
                .split_once(':')
                .ok_or_else(|| bad("not size:percent"))?;
            let bytes = parse_size(size.trim()).ok_or_else(|| bad("not a size (512, 4k, 1m)"))?;
            let pct: u32 = pct.trim().parse().map_err(|_| bad("not a whole percent"))?;
            if pct > 100 {
                return Err(bad("a percent above 100"));
            }
            // As fio's bssplit: each size once, each with a share (a size
            // named twice or at 0 % is a slip, not a mix).
            if pct == 0 {
                return Err(bad("a size at 0 percent"));
            }
            if v.iter().any(|&(b, _)| b == bytes) {
                return Err(bad("a size named more than once"));
            }
            v.push((bytes, pct));
        }
        let b = Self(v);
        b.check()?;
        Ok(b)
    }

    /// The sizes and their weights.
    pub fn entries(&self) -> &[(u64, u32)] {
        &self.0
    }

    /// The largest size.
    pub fn max(&self) -> u64 {
        self.0.iter().map(|e| e.0).max().unwrap_or(0)
    }

    /// Checks each size (a non-zero multiple of 512, at most 16 MiB) and
    /// that the weights sum to 100.
    pub fn check(&self) -> Result<(), FioError> {
        for &(bytes, _) in &self.0 {
            if bytes == 0 || !bytes.is_multiple_of(512) || bytes > MAX_DRIVER_REQUEST {
                return Err(FioError::BlockSize {
                    bytes,
                    max: MAX_DRIVER_REQUEST,
                });
            }
        }
        let sum = self.0.iter().fold(0u32, |a, e| a.saturating_add(e.1));
        if sum != 100 {
            return Err(FioError::MixSum { sum });
        }
        Ok(())
    }

    /// Draws a size for a uniform `r` in `0..100`.
    pub(crate) fn pick(&self, mut r: u32) -> u64 {
        for &(bytes, pct) in &self.0 {
            if r < pct {
                return bytes;
            }
            r -= pct;
        }
        self.0.last().map_or(4096, |e| e.0)
    }
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.to_ascii_lowercase();
    let (num, mult) = match s.strip_suffix('k') {
        Some(n) => (n, 1u64 << 10),
        None => match s.strip_suffix('m') {
            Some(n) => (n, 1 << 20),
            None => (s.as_str(), 1),
        },
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// The slow tail: a share of each job's I/Os goes to the device's slow
/// region (see [`SlowRegion`](crate::blk::SlowRegion)), on a budget of its
/// own so the fast I/Os keep their depth. Slow I/Os are 4 KiB reads or
/// writes in one-page slots, so a deep budget costs a page each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowTail {
    /// Percent of I/Os sent to the slow region (0..=100), unless
    /// [`per_s`](Self::per_s) is set.
    pub pct: f64,
    /// Slow I/Os per second per job, instead of a percentage: each job
    /// earns this many a second (a budget refilled from the clock, spent
    /// as its queue has room), so the tail pins the same IOVAs by a given
    /// time on a machine of any speed (0..=1,000,000), as long as slow
    /// requests stay at most a quarter of the job's (past that the tail
    /// thins rather than starve the fast requests).
    pub per_s: Option<f64>,
    /// Slow I/Os in flight per job at most (beyond `iodepth`); a slow I/O
    /// drawn when the budget is spent goes to the fast region.
    pub depth: usize,
    /// How long the device holds each.
    pub hold: Duration,
    /// Whether slow I/Os draw their size from the job's block-size mix
    /// (in slots sharing one set of pages per queue, their data not
    /// checked) rather than being one 4 KiB block each.
    pub mixed: bool,
}

/// A fio-like job set: `jobs` jobs, each on its own queue, `iodepth` I/Os
/// in flight each, for `runtime`, reported every `window`.
#[derive(Debug, Clone, PartialEq)]
pub struct FioConfig {
    /// Jobs (fio's `numjobs`), one request queue each: 1..=[`MAX_JOBS`].
    pub jobs: usize,
    /// I/Os in flight per job: 1..=[`MAX_IODEPTH`].
    pub iodepth: usize,
    /// Read/write pattern.
    pub rw: RwMode,
    /// Block size or mix.
    pub bs: BlockSizes,
    /// How long to run (after set-up): up to [`MAX_RUNTIME`].
    pub runtime: Duration,
    /// The reporting window (fio's status line): at least
    /// [`MIN_WINDOW`], at most the runtime.
    pub window: Duration,
    /// OS threads hosting the jobs (1..=jobs; `None`: one per core).
    /// Jobs are logical CPUs, each with its own queue and DMA handle, run
    /// in turn on their thread: twelve job threads on two cores would
    /// measure the scheduler.
    pub threads: Option<usize>,
    /// Interrupt CPUs that complete (unmap) the jobs' I/Os, each its own
    /// DMA handle (at least one per thread; `None`: each job completes
    /// its own, as an NVMe queue with a vector per CPU). Fewer than jobs
    /// is seed `004`'s controller with fewer vectors than CPUs: IOVAs are
    /// allocated on one CPU and freed on another.
    pub irq_cpus: Option<usize>,
    /// Every this many reads on the `null` back-end is checked against
    /// the sector pattern (0: none).
    pub verify_every: u32,
    /// The slow tail, if any.
    pub slow: Option<SlowTail>,
    /// Seed of the jobs' random streams.
    pub seed: u64,
    /// Measure the driver's CPU per request on samples of its own work
    /// (every submitting or reaping call timed on the thread's CPU
    /// clock, see the engine's `sample` module) and give each window's
    /// driver CPU ([`FioWindow::driver_cpu_s`](super::FioWindow)) as the
    /// window's requests at that cost, plus the flush timer and the
    /// allocator's background work. Off: the windows' driver CPU is
    /// those two only (cost runs, which read the job threads' clocks over
    /// the whole run instead).
    pub sample_work: bool,
    /// The DMA domain's deferred-flush timeout for the run (`None`: the
    /// domain's, Linux's 10 ms). A long one leaves the flushing to the
    /// flush queues' high-water mark (256 entries, Linux's
    /// `IOVA_FQ_SIZE`), so every flush frees the same batch whatever the
    /// request rate, inside the completion that filled the queue.
    pub flush_timeout: Option<Duration>,
    /// Fast I/Os per second per job at most (fio's `rate_iops`;
    /// 0.1..=[`MAX_RATE_IOPS`]): a job submits only what the clock has
    /// earned since the start, never more than its depth at once, so the
    /// pace is the same whatever else shares the machine, as long as the
    /// machine keeps up. `None`: as fast as the device completes. The
    /// driver's CPU per request follows the pace (a job thread that
    /// reaps one completion per wake-up pays more per request than one
    /// that reaps dozens), so CPU per request compared across a run is
    /// compared at one pace.
    pub rate_iops: Option<f64>,
    /// Drive a fresh control arm beside the jobs (`run_fio` only): each
    /// job thread also drives a second device on a DMA domain of the same
    /// policies, at the same pace and depth without the slow tail,
    /// replaced every 400 requests per job so that it never ages, its
    /// calls timed past each life's first 40 requests per job into the
    /// windows'
    /// [`fresh_ops`](super::FioWindow::fresh_ops) and
    /// [`fresh_cpu_s`](super::FioWindow::fresh_cpu_s) (see the engine's
    /// `fresh` module). The aged arm's work per CPU-second ÷ the fresh
    /// arm's, window by window, divides out the machine's speed.
    pub fresh_arm: bool,
}

/// The largest `rate_iops`, per job.
pub const MAX_RATE_IOPS: f64 = 10_000_000.0;

impl Default for FioConfig {
    fn default() -> Self {
        Self {
            jobs: 1,
            iodepth: 32,
            rw: RwMode::RandRead,
            bs: BlockSizes::one(4096),
            runtime: Duration::from_secs(1),
            window: Duration::from_millis(250),
            threads: None,
            irq_cpus: None,
            verify_every: 64,
            slow: None,
            seed: 0x5eed_0004,
            sample_work: false,
            flush_timeout: None,
            rate_iops: None,
            fresh_arm: false,
        }
    }
}

/// Why a fio run could not start or finish.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FioError {
    /// A setting outside its range.
    #[error("{field} = {value} is outside {min}..={max}")]
    OutOfRange {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: f64,
        /// The least allowed.
        min: f64,
        /// The most allowed.
        max: f64,
    },
    /// A block size that is zero, not a multiple of 512, or too large.
    #[error("block size {bytes} is not a non-zero multiple of 512 up to {max}")]
    BlockSize {
        /// The size.
        bytes: u64,
        /// The most allowed.
        max: u64,
    },
    /// A block-size mix entry that does not parse.
    #[error("block-size mix entry {entry:?}: {reason}")]
    MixSyntax {
        /// The entry.
        entry: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A block-size mix whose percentages do not sum to 100.
    #[error("block-size mix percentages sum to {sum}, not 100")]
    MixSum {
        /// Their sum.
        sum: u32,
    },
    /// A runtime of zero.
    #[error("runtime is zero")]
    RuntimeZero,
    /// The disk cannot hold what the jobs need (a few of the largest
    /// blocks, and the slow region).
    #[error("the disk holds {capacity} bytes, the jobs need at least {needed}")]
    DiskTooSmall {
        /// The disk's capacity.
        capacity: u64,
        /// What the run needs.
        needed: u64,
    },
    /// A block size the device cannot take (not a multiple of its block
    /// size, or past its request limit).
    #[error("block size {bytes} does not suit the device (block size {blk_size}, largest request {max})")]
    DeviceBlockSize {
        /// The size.
        bytes: u64,
        /// The device's block size.
        blk_size: u32,
        /// The largest request.
        max: u64,
    },
    /// The device offers fewer queues than jobs.
    #[error("{jobs} jobs need {jobs} queues, the device has {queues}")]
    NotEnoughQueues {
        /// Jobs.
        jobs: usize,
        /// Queues.
        queues: u16,
    },
    /// The host (or its back-end) could not be built.
    #[error(transparent)]
    Host(#[from] BlkHostError),
    /// The driver failed (or its device asked for a reset).
    #[error(transparent)]
    Driver(#[from] BlkDriverError),
    /// A job thread panicked (a bug).
    #[error("a job thread panicked")]
    Panicked,
}

impl FioConfig {
    /// Checks every setting against its range.
    pub fn check(&self) -> Result<(), FioError> {
        let range = |field, value: f64, min: f64, max: f64| {
            if value >= min && value <= max {
                Ok(())
            } else {
                Err(FioError::OutOfRange {
                    field,
                    value,
                    min,
                    max,
                })
            }
        };
        range("jobs", self.jobs as f64, 1.0, MAX_JOBS as f64)?;
        range("iodepth", self.iodepth as f64, 1.0, MAX_IODEPTH as f64)?;
        if let RwMode::RandRw { read_pct } = self.rw {
            range("rwmixread", read_pct.into(), 0.0, 100.0)?;
        }
        self.bs.check()?;
        if self.runtime.is_zero() {
            return Err(FioError::RuntimeZero);
        }
        range(
            "runtime_s",
            self.runtime.as_secs_f64(),
            0.0,
            MAX_RUNTIME.as_secs_f64(),
        )?;
        range(
            "window_s",
            self.window.as_secs_f64(),
            MIN_WINDOW.as_secs_f64(),
            self.runtime.as_secs_f64().max(MIN_WINDOW.as_secs_f64()),
        )?;
        if let Some(t) = self.threads {
            range("threads", t as f64, 1.0, self.jobs as f64)?;
        }
        if let Some(t) = self.flush_timeout {
            range(
                "flush_timeout_s",
                t.as_secs_f64(),
                softiommu::dma::MIN_TIMEOUT.as_secs_f64(),
                softiommu::dma::MAX_TIMEOUT.as_secs_f64(),
            )?;
        }
        if let Some(r) = self.rate_iops {
            range("rate_iops", r, 0.1, MAX_RATE_IOPS)?;
        }
        if let Some(n) = self.irq_cpus {
            range("irq_cpus", n as f64, 1.0, MAX_JOBS as f64)?;
        }
        if let Some(s) = self.slow {
            range("slow_pct", s.pct, 0.0, 100.0)?;
            if let Some(r) = s.per_s {
                range("slow_per_s", r, 0.0, MAX_SLOW_PER_S)?;
            }
            range("slow_depth", s.depth as f64, 1.0, MAX_SLOW_DEPTH as f64)?;
            range(
                "iodepth + slow_depth",
                self.slots() as f64,
                1.0,
                MAX_SLOTS as f64,
            )?;
            range(
                "slow_hold_s",
                s.hold.as_secs_f64(),
                0.0,
                crate::blk::MAX_HOLD.as_secs_f64(),
            )?;
        }
        Ok(())
    }

    /// Request slots each queue needs: `iodepth` plus the slow budget.
    pub fn slots(&self) -> usize {
        self.iodepth + self.slow.map_or(0, |s| s.depth)
    }
}
