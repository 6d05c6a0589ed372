//! `softiommu lab viommu`: the storage path through a virtio-iommu — 4 KiB
//! reads on our virtio-blk device, whose every DMA the unit translates,
//! its driver mapping each request (header, data, status) through the DMA
//! API over the virtio-iommu device — with no IOMMU (the endpoint in
//! bypass, buffers at their physical addresses), guest strict (every MAP
//! and UNMAP sent and waited for) and guest lazy (Linux 6.8: one
//! notification per request's map sync, UNMAPs queued behind it, IOVAs
//! freed after them).
//!
//! Two back-ends: `null` (no device time: the raw costs) and `ssd-80us`, a
//! stated latency model — every request completes 80 µs after the device
//! took it (a deadline per request, so requests in flight overlap as on
//! an SSD with queue depth), about a datacenter NVMe SSD's 4 KiB
//! random-read latency — the regime of J-P Brucker's 2023 figures (fio on
//! an assigned NVMe: strict 81.3 %, lazy 92.7 %, lazy with sync-map
//! batching 99.9 % of the host's bandwidth), printed as the anchor row.
//! The device time each request achieved is measured and printed beside
//! the model's.
//!
//! # What a notification costs
//!
//! In a VM every `QueueNotify` write is a trap to the hypervisor (a VM
//! exit, the ioeventfd signal, the entry back), and strict's cost is
//! mostly those traps: one per MAP and per UNMAP. Our register write is
//! a store. So the notifying thread busy-waits a stated exit cost on
//! every notification, of every device (the disk's kicks too), in every
//! mode alike (`--exit-us`, 0: none; default [`EXIT_US`]).
//!
//! # Waiting, and what is compared
//!
//! The driver busy-waits for its virtio-iommu requests (as Linux's
//! `__viommu_sync_req` does; that CPU is the driver's work) and polls
//! for the disk's completions in every mode alike; the polling is
//! counted apart (`driver_wait_cpu_us_per_io`). The three modes run on
//! three machines built side by side, in slices of a round interleaved
//! (none, strict, lazy, then lazy, strict, none, …), so a co-runner that
//! comes and goes slows each mode alike. A mode that ran faster than one
//! that does a subset of its work (strict vs lazy or none; lazy vs none)
//! in every round is marked invalid. Every figure of ours is measured;
//! the anchor is quoted; the exit cost and the device time are models.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiommu::dma::DmaDirection;
use softiommu::hw::{SourceId, System, UnitConfig};
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

use crate::args::Ranged;
use crate::error::{LabError, LabResult};
use crate::report::{contract, Column, Modelled, Param, Report, Table, Unit};

/// The disk's requester id (00:01.0), the virtio-iommu's endpoint 8.
const BLK_SID: SourceId = SourceId(0x0008);
/// Bytes per read.
const IO_BYTES: u64 = 4096;
/// The latency model of the `ssd-80us` back-end.
const SSD_HOLD: Duration = Duration::from_micros(80);
/// The default exit cost per notification, µs: a guest–hypervisor–guest
/// round trip is "typically from three to 10 microseconds" (QNX
/// Hypervisor 7 user's guide, "Guest exits"); Landau, Ben-Yehuda and
/// Gordon (SplitX, WIOV 2011, table 1) measured the world switch alone
/// at 2,000 cycles on KVM (0.7 µs at 2.93 GHz) with handling costs "an
/// order of magnitude higher". The low end of the round trip.
pub const EXIT_US: f64 = 3.0;
/// Reads per interleaved slice of a round.
const SLICE: u64 = 250;
/// Brucker 2023 (fio over an assigned NVMe, % of host bandwidth): strict,
/// lazy, lazy with sync-map batching.
const ANCHOR: [(&str, f64); 3] = [("strict", 81.3), ("lazy", 92.7), ("lazy+sync-map", 99.9)];
/// Unmaps held before a lazy flush (Linux's per-CPU flush queue).
const FLUSH_QUEUE: usize = 256;

/// Options of `lab viommu`.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ViommuArgs {
    /// Reads per row (100..=10000000; default 4000 with --quick, else 40000).
    #[arg(long)]
    pub ios: Option<Ranged<100, 10_000_000>>,
    /// Reads in flight (1..=32).
    #[arg(long, default_value = "4")]
    pub depth: Ranged<1, 32>,
    /// Rounds per row, interleaved; the median round is reported (1..=20;
    /// default 1 with --quick, else 3).
    #[arg(long)]
    pub rounds: Option<Ranged<1, 20>>,
    /// Short runs, same shape.
    #[arg(long)]
    pub quick: bool,
    /// The modelled cost of a notification (VM exit and entry), µs,
    /// busy-waited by the notifying thread on every `QueueNotify` of
    /// both devices in every mode (0..=1000; 0: none).
    #[arg(long, default_value_t = EXIT_US, value_parser = parse_exit_us)]
    pub exit_us: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for ViommuArgs {
    fn default() -> Self {
        Self {
            ios: None,
            depth: Ranged::new(4),
            rounds: None,
            quick: false,
            exit_us: EXIT_US,
            json: false,
        }
    }
}

/// `--exit-us`: a number of µs in 0..=1000.
fn parse_exit_us(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1000.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of µs in 0..=1000")),
    }
}

/// One (back-end, mode) row of the contract.
#[derive(Debug, Clone, Serialize)]
pub struct ViommuRow {
    /// The back-end: `virtio-blk/null` or `virtio-blk/ssd-80us`.
    pub device: String,
    /// `none`, `strict` or `lazy`.
    pub mode: &'static str,
    /// Reads per second.
    pub iops: f64,
    /// Throughput as % of the same back-end with no IOMMU.
    pub pct_of_none: f64,
    /// The driver thread's CPU time per read, µs, less its waiting for
    /// the disk's completions: its work, with the modelled exits and the
    /// virtio-iommu's handling of its requests (on the notifying thread,
    /// as a hypervisor handles an exit on the trapping vCPU).
    pub driver_cpu_us_per_io: f64,
    /// The driver thread's CPU time per read spent waiting for the
    /// disk's completions with nothing else to do (parked until the
    /// interrupt), µs.
    pub driver_wait_cpu_us_per_io: f64,
    /// The device time each read achieved on average (taken off the
    /// available ring to returned on the used ring), µs; 0 on `null`.
    pub device_us_per_io: f64,
    /// virtio-iommu requests per read.
    pub requests_per_io: f64,
    /// virtio-iommu notifications per read.
    pub notifications_per_io: f64,
    /// IOTLB invalidation descriptors the device submitted to the unit per
    /// read.
    pub invalidations_per_io: f64,
    /// False when the row contradicts what a mode must cost: a mode that
    /// ran faster than one doing a subset of its work (no IOMMU, or lazy
    /// for strict) in every round.
    pub valid: bool,
    /// Why the row is invalid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Why a mode's row cannot stand: it took less time than `cheaper` (a
/// mode doing a subset of its work: none for both IOMMU modes, lazy for
/// strict) in every round (`secs` and `cheaper_secs`: each round's time
/// for the same reads), which says the rig measured something other than
/// the IOMMU's work. Compared beyond the spread: one round of the mode at
/// or above the cheaper one's fastest stands.
fn faster_than(mode: Mode, secs: &[f64], cheaper: Mode, cheaper_secs: &[f64]) -> Option<String> {
    let slowest = secs.iter().copied().fold(f64::NAN, f64::max);
    let fastest = cheaper_secs.iter().copied().fold(f64::NAN, f64::min);
    (mode.costs_more_than(cheaper) && slowest < fastest).then(|| {
        format!(
            "measurement invalid: {} ran faster than {} in every round ({:.0} % of its throughput at best), which a mode doing all its work and more cannot",
            mode.name(),
            cheaper.name(),
            100.0 * fastest / slowest
        )
    })
}

/// The first of a mode's physics checks to fail against the other modes'
/// rounds (`secs[i]`: mode `Mode::ALL[i]`'s).
pub(super) fn physics(mode: Mode, secs: &[Vec<f64>]) -> Option<String> {
    Mode::ALL
        .iter()
        .zip(secs)
        .find_map(|(&cheaper, c)| faster_than(mode, &secs[mode as usize], cheaper, c))
}

/// A note when the device time achieved is off the model's by more than
/// a tenth (the machine could not keep the deadlines): every mode's
/// throughput then measures a slower device than the one named.
fn device_time_note(device: &str, model_us: f64, achieved_us: f64) -> Option<String> {
    (model_us > 0.0 && (achieved_us - model_us).abs() > 0.1 * model_us).then(|| {
        format!(
            "{device}: the device time achieved ({achieved_us:.1} us per read on average) is off the model's {model_us:.0} us by more than 10 %: this machine could not keep the deadlines"
        )
    })
}

/// The JSON object `lab viommu --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ViommuReport {
    /// Always "viommu".
    pub lab: &'static str,
    /// Whether this was the quick form.
    pub quick: bool,
    /// Reads per row and round.
    pub ios: u64,
    /// Reads in flight.
    pub depth: u64,
    /// The `ssd-80us` back-end's latency model.
    pub latency_model: &'static str,
    /// The model's device time per request, µs.
    pub device_model_us: f64,
    /// The modelled cost of each notification (VM exit and entry), µs.
    pub exit_us: f64,
    /// What the exit cost models, and its source.
    pub exit_model: &'static str,
    /// Brucker 2023's % of host bandwidth (quoted, not measured).
    pub anchor: Vec<(&'static str, f64)>,
    /// Which figures are measured: all but `anchor`.
    pub measured: &'static str,
    /// The machine's 1-minute load average when the lab started: every
    /// figure here crosses threads (driver, virtio-iommu, disk), so a
    /// machine with more runnable threads than cores measures its
    /// scheduler as much as the IOMMU.
    pub load_avg_1m: f64,
    /// Whether, on the `ssd-80us` back-end, lazy reached 95 % of none and
    /// 1.2x strict.
    pub ssd_lazy_target_met: bool,
    /// One row per (back-end, mode).
    pub rows: Vec<ViommuRow>,
    /// Notes: where a model did not hold on this machine.
    pub notes: Vec<String>,
}

/// A row's mode (shared with the UDP rows, `viommu_udp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Mode {
    None,
    Strict,
    Lazy,
}

impl Mode {
    pub(super) const ALL: [Mode; 3] = [Mode::None, Mode::Strict, Mode::Lazy];

    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Strict => "strict",
            Mode::Lazy => "lazy",
        }
    }

    /// Whether the mode does all of `other`'s work and more: lazy sends
    /// the MAPs and UNMAPs strict sends, with fewer notifications and
    /// waits; none sends nothing.
    fn costs_more_than(self, other: Mode) -> bool {
        matches!(
            (self, other),
            (Mode::Strict, Mode::None | Mode::Lazy) | (Mode::Lazy, Mode::None)
        )
    }
}

/// What one run (or slice of it) measured.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    secs: f64,
    cpu_secs: f64,
    wait_cpu_secs: f64,
    requests: u64,
    notifications: u64,
    invalidations: u64,
    held_ns: u64,
    released: u64,
}

impl Measured {
    fn add(&mut self, o: &Measured) {
        self.secs += o.secs;
        self.cpu_secs += o.cpu_secs;
        self.wait_cpu_secs += o.wait_cpu_secs;
        self.requests += o.requests;
        self.notifications += o.notifications;
        self.invalidations += o.invalidations;
        self.held_ns += o.held_ns;
        self.released += o.released;
    }
}

/// Runs the lab.
pub fn run(args: &ViommuArgs) -> LabResult<Report> {
    let ios = args
        .ios
        .map_or(if args.quick { 4_000 } else { 40_000 }, |r| r.get());
    let rounds = args
        .rounds
        .map_or(if args.quick { 1 } else { 3 }, |r| r.get());
    let depth = args.depth.get() as usize;
    let exit = Duration::from_nanos((args.exit_us * 1000.0).round() as u64);
    let load_avg_1m = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (device, hold) in [
        ("virtio-blk/null", None),
        ("virtio-blk/ssd-80us", Some(SSD_HOLD)),
    ] {
        let mut per_mode: Vec<Vec<Measured>> = vec![Vec::new(); Mode::ALL.len()];
        for _ in 0..rounds {
            for (i, m) in measure_round(hold, ios, depth, exit)?
                .into_iter()
                .enumerate()
            {
                per_mode[i].push(m);
            }
        }
        let secs: Vec<Vec<f64>> = per_mode
            .iter()
            .map(|v| v.iter().map(|m| m.secs).collect())
            .collect();
        let med: Vec<Measured> = per_mode
            .iter_mut()
            .map(|v| {
                v.sort_by(|a, b| a.secs.total_cmp(&b.secs));
                v[(v.len() - 1) / 2]
            })
            .collect();
        let none_iops = ios as f64 / med[0].secs;
        let model_us = hold.map_or(0.0, |h| h.as_secs_f64() * 1e6);
        for (mode, m) in Mode::ALL.iter().zip(&med) {
            let why = physics(*mode, &secs);
            let iops = ios as f64 / m.secs;
            let per = |x: u64| x as f64 / ios as f64;
            let device_us = if m.released > 0 {
                m.held_ns as f64 / m.released as f64 / 1e3
            } else {
                0.0
            };
            if let Some(n) =
                device_time_note(&format!("{device}/{}", mode.name()), model_us, device_us)
            {
                notes.push(n);
            }
            rows.push(ViommuRow {
                device: device.to_string(),
                mode: mode.name(),
                iops,
                pct_of_none: 100.0 * iops / none_iops,
                driver_cpu_us_per_io: m.cpu_secs * 1e6 / ios as f64,
                driver_wait_cpu_us_per_io: m.wait_cpu_secs * 1e6 / ios as f64,
                device_us_per_io: device_us,
                requests_per_io: per(m.requests),
                notifications_per_io: per(m.notifications),
                invalidations_per_io: per(m.invalidations),
                valid: why.is_none(),
                why,
            });
        }
    }
    // The UDP stream's rows (viommu_udp.rs), the same ios and rounds.
    rows.extend(super::viommu_udp::udp_rows(ios, rounds, exit)?);
    notes.push(super::viommu_udp::NOTE.to_string());
    // An invalid row meets no target.
    let ssd = |m: &str| {
        rows.iter()
            .find(|r| r.device.ends_with("ssd-80us") && r.mode == m && r.valid)
            .map_or(f64::NAN, |r| r.iops)
    };
    let (none, strict, lazy) = (ssd("none"), ssd("strict"), ssd("lazy"));
    // Comparisons with NaN (an invalid or missing row) are false.
    let ssd_lazy_target_met = none > 0.0 && lazy >= 0.95 * none && lazy >= 1.2 * strict;
    let r = ViommuReport {
        lab: "viommu",
        quick: args.quick,
        ios,
        depth: depth as u64,
        latency_model: "ssd-80us: every request completes 80 us after the device took it (a deadline per request; requests in flight overlap)",
        device_model_us: SSD_HOLD.as_secs_f64() * 1e6,
        exit_us: args.exit_us,
        exit_model: "every QueueNotify of either device, in every mode, busy-waits the exit cost on the notifying thread (a VM exit and entry; default: the low end of a guest-hypervisor-guest round trip, 3-10 us, QNX Hypervisor 7 user's guide, 'Guest exits')",
        anchor: ANCHOR.to_vec(),
        measured: "all but anchor, exit_us and the device's latency model",
        load_avg_1m,
        ssd_lazy_target_met,
        rows,
        notes,
    };
    Ok(report(&r, rounds))
}

/// One round of one back-end: the three modes on three machines built
/// side by side, `ios` reads each in slices of [`SLICE`] interleaved
/// (the order reversed every other slice), so what the machine's other
/// work does to one mode it does to the others. Returned in
/// [`Mode::ALL`]'s order.
fn measure_round(
    hold: Option<Duration>,
    ios: u64,
    depth: usize,
    exit: Duration,
) -> LabResult<Vec<Measured>> {
    // The driver's waits for interrupts end when the interrupt comes,
    // not up to 50 us (Linux's default timer slack) later.
    // SAFETY: PR_SET_TIMERSLACK takes one integer and changes only the
    // calling thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    let mut rigs = Mode::ALL
        .iter()
        .map(|&m| Rig::new(m, hold, depth, exit))
        .collect::<LabResult<Vec<_>>>()?;
    let mut out = vec![Measured::default(); rigs.len()];
    let mut left = ios;
    let mut flip = false;
    while left > 0 {
        let n = left.min(SLICE);
        let order: Vec<usize> = if flip {
            (0..rigs.len()).rev().collect()
        } else {
            (0..rigs.len()).collect()
        };
        for i in order {
            let m = rigs[i].slice(n)?;
            out[i].add(&m);
        }
        left -= n;
        flip = !flip;
    }
    for (rig, m) in rigs.iter_mut().zip(&mut out) {
        // Whatever lazy still holds is part of the work.
        m.add(&rig.finish()?);
    }
    Ok(out)
}

fn err(e: impl std::fmt::Display) -> LabError {
    LabError::Measure(format!("lab viommu: {e}"))
}

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
                // One request's buffers made usable together (one
                // notification in lazy mode).
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

/// One mode's machine for a round: memory, a unit, the virtio-iommu and
/// its driver (or none), the disk and the driver's queue on it.
///
/// Fields drop in order: the driver side before the devices.
struct Rig {
    mode: Mode,
    q: BlkQueue,
    dma: Dma,
    disk: Option<BlkDevice>,
    t: spec_t::Transport,
    viommu: ViommuDevice,
    system: Arc<System>,
    unit: softiommu::hw::UnitId,
}

impl Rig {
    /// A fresh machine: `depth` reads in flight, the disk's requests
    /// held `hold` (none: the null back-end's time), every notification
    /// costing `exit`.
    fn new(mode: Mode, hold: Option<Duration>, depth: usize, exit: Duration) -> LabResult<Self> {
        let mem = Arc::new(PhysMemory::new(64 << 20)?);
        let mut sys = System::new(mem.clone());
        let unit = sys.add_unit(UnitConfig::default())?;
        sys.assign(BLK_SID, unit)?;
        let system = Arc::new(sys);
        let vcfg = ViommuConfig::default();
        let viommu = ViommuDevice::spawn(
            ViommuConfig {
                endpoints: vec![BLK_SID],
                bypass: mode == Mode::None,
                // The hypervisor handles each exit on the trapping vCPU.
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
        let vdrv = ViommuDriver::probe(
            viommu.transport().clone(),
            mem.clone(),
            ViommuDriverConfig {
                queue_size: 256,
                // Busy-wait for every answer, as Linux's driver does.
                spin: dcfg.wait,
                ..dcfg
            },
        )
        .map_err(err)?;
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
                }),
                ..BlkDeviceConfig::default()
            },
            system.clone(),
            BLK_SID,
        )
        .map_err(err)?;
        let t = disk.transport().clone();
        let q = BlkQueue::probe(&t, &mem, &mut dma, depth)?;
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
        Ok(Measured {
            secs,
            cpu_secs: cpu,
            requests: c1.0 - c0.0,
            notifications: c1.1 - c0.1,
            invalidations: c1.2 - c0.2,
            ..Measured::default()
        })
    }
}

/// A minimal virtio-blk driver of one queue whose every DMA address
/// comes from [`Dma`]: per read, a header, 4 KiB of data and a status
/// byte, mapped when submitted and unmapped when used.
struct BlkQueue {
    mem: Arc<PhysMemory>,
    ring: DriverRing,
    /// Per slot: the page holding header and status, and the data page.
    slots: Vec<(u64, u64)>,
    free: Vec<u16>,
    maps: Vec<Vec<ViommuMapping>>,
    sector: u64,
    /// The ring's mapping, kept for the run (the machine goes with it).
    _ring: Vec<ViommuMapping>,
}

impl BlkQueue {
    fn probe(
        t: &spec_t::Transport,
        mem: &Arc<PhysMemory>,
        dma: &mut Dma,
        depth: usize,
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
            slots.push((mem.alloc_zeroed_frames(0)?, mem.alloc_zeroed_frames(0)?));
        }
        Ok(Self {
            mem: mem.clone(),
            ring,
            slots,
            free: (0..depth as u16).rev().collect(),
            maps: vec![Vec::new(); depth],
            sector: 0,
            _ring: ring_maps,
        })
    }

    fn submit(&mut self, t: &spec_t::Transport, dma: &mut Dma, slot: u16) -> LabResult<()> {
        let (page, data) = self.slots[usize::from(slot)];
        let mut hdr = [0u8; blk::HDR_LEN];
        hdr[0..4].copy_from_slice(&blk::T_IN.to_le_bytes());
        hdr[8..16].copy_from_slice(&self.sector.to_le_bytes());
        self.sector = (self.sector + IO_BYTES / blk::SECTOR_SIZE) % ((1 << 30) / blk::SECTOR_SIZE);
        self.mem.write(page, &hdr)?;
        self.mem.write(page + 64, &[0xff])?;
        let (a, maps) = dma.map(&[
            (page, blk::HDR_LEN as u64, DmaDirection::ToDevice),
            (data, IO_BYTES, DmaDirection::FromDevice),
            (page + 64, 1, DmaDirection::FromDevice),
        ])?;
        self.maps[usize::from(slot)] = maps;
        let d0 = slot * 3;
        self.ring
            .set_desc(d0, a[0], blk::HDR_LEN as u32, desc::F_NEXT, d0 + 1);
        self.ring.set_desc(
            d0 + 1,
            a[1],
            IO_BYTES as u32,
            desc::F_NEXT | desc::F_WRITE,
            d0 + 2,
        );
        self.ring.set_desc(d0 + 2, a[2], 1, desc::F_WRITE, 0);
        self.ring.push_avail(d0);
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
        while done < ios {
            while submitted < ios {
                let Some(slot) = self.free.pop() else { break };
                self.submit(t, dma, slot)?;
                submitted += 1;
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

/// The typed report.
fn report(r: &ViommuReport, rounds: u64) -> Report {
    // The ssd-80us rows carry the device's modelled time, and every row
    // the modelled exits (unless --exit-us 0).
    let modelled = r.exit_us > 0.0 || r.rows.iter().any(|x| x.device_us_per_io > 0.0);
    let mut t = Table::new(
        "results",
        format!(
            "4 KiB reads on virtio-blk through a virtio-iommu, depth {}, {} reads per row{}",
            r.depth,
            r.ios,
            if r.quick { ", quick" } else { "" }
        ),
        vec![
            Column::label("device"),
            Column::label("mode"),
            Column::metric("iops", "reads/s", Unit::Count, 0).modelled_if(modelled),
            Column::metric("pct_of_none", "of none", Unit::Percent, 1).modelled_if(modelled),
            Column::metric("driver_cpu_us_per_io", "driver CPU/read", Unit::UsPerReq, 2)
                .modelled_if(modelled),
            Column::metric(
                "driver_wait_cpu_us_per_io",
                "driver waiting/read",
                Unit::UsPerReq,
                2,
            ),
            Column::metric("device_us_per_io", "device time/read", Unit::UsPerReq, 1)
                .modelled_if(true),
            Column::metric("requests_per_io", "requests/read", Unit::Count, 2),
            Column::metric("notifications_per_io", "notifications/read", Unit::Count, 2),
            Column::metric("invalidations_per_io", "invalidations/read", Unit::Count, 2),
        ],
    );
    for x in &r.rows {
        t.row(vec![
            x.device.clone().into(),
            x.mode.into(),
            x.iops.into(),
            x.pct_of_none.into(),
            x.driver_cpu_us_per_io.into(),
            x.driver_wait_cpu_us_per_io.into(),
            x.device_us_per_io.into(),
            x.requests_per_io.into(),
            x.notifications_per_io.into(),
            x.invalidations_per_io.into(),
        ]);
        if let Some(why) = &x.why {
            t.mark_invalid(format!("{}/{}", x.device, x.mode), why.clone());
        }
    }
    let mut rep = Report::new(
        "lab viommu",
        "the storage path through a virtio-iommu: no IOMMU, guest strict, guest lazy (Linux 6.8)",
        contract(r),
    );
    rep.params = vec![
        Param::new("ios", r.ios, Unit::Count),
        Param::new("depth", r.depth, Unit::Count),
        Param::new("rounds", rounds, Unit::Count),
        Param::text("quick", r.quick),
        Param::text("latency_model", r.latency_model),
        Param::text("device_model_us", r.device_model_us),
        Param::text("exit_us", r.exit_us),
        Param::text("exit_model", r.exit_model),
        Param::text("load_avg_1m", r.load_avg_1m),
    ];
    rep.modelled = vec![
        Modelled {
            name: "exit_per_notification".into(),
            value: r.exit_us,
            unit: Unit::Us,
        },
        Modelled {
            name: "ssd_device_time".into(),
            value: r.device_model_us,
            unit: Unit::Us,
        },
    ];
    rep.tables.push(t);
    rep.notes.push(format!(
        "ssd-80us: lazy >= 95 % of none and >= 1.2x strict: {}{}",
        if r.ssd_lazy_target_met { "met" } else { "NOT met" },
        if r.load_avg_1m > 2.0 {
            format!(" (load average {:.1} on this machine: the cross-thread round trips measure its scheduler too)", r.load_avg_1m)
        } else {
            String::new()
        }
    ));
    rep.notes.extend(r.notes.iter().cloned());
    rep.notes.push(format!(
        "anchor (Brucker 2023, fio on an assigned NVMe, quoted): strict {} %, lazy {} %, lazy with sync-map batching {} % of host bandwidth",
        ANCHOR[0].1, ANCHOR[1].1, ANCHOR[2].1
    ));
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &'static str, why: Option<String>) -> ViommuRow {
        ViommuRow {
            device: "virtio-blk/ssd-80us".into(),
            mode,
            iops: 1.0,
            pct_of_none: 100.0,
            driver_cpu_us_per_io: 1.0,
            driver_wait_cpu_us_per_io: 0.0,
            device_us_per_io: 80.0,
            requests_per_io: 0.0,
            notifications_per_io: 0.0,
            invalidations_per_io: 0.0,
            valid: why.is_none(),
            why,
        }
    }

    fn report_of(rows: Vec<ViommuRow>) -> ViommuReport {
        ViommuReport {
            lab: "viommu",
            quick: true,
            ios: 1,
            depth: 1,
            latency_model: "",
            device_model_us: 80.0,
            exit_us: 0.0,
            exit_model: "",
            anchor: Vec::new(),
            measured: "",
            load_avg_1m: 0.0,
            ssd_lazy_target_met: false,
            rows,
            notes: Vec::new(),
        }
    }

    /// A mode faster than no IOMMU in every round is a measurement bug:
    /// marked invalid in JSON and in the table; within the spread it
    /// stands, and none itself is never judged.
    #[test]
    fn a_mode_faster_than_no_iommu_in_every_round_is_invalid() {
        let secs = vec![vec![1.0, 1.1], vec![1.2, 1.3], vec![0.8, 0.9]];
        let why = physics(Mode::Lazy, &secs);
        assert!(
            matches!(&why, Some(w) if w.starts_with("measurement invalid: lazy ran faster than none")),
            "{why:?}"
        );
        assert_eq!(
            faster_than(Mode::Strict, &[0.9, 1.05], Mode::None, &[1.0, 1.1]),
            None
        );
        assert_eq!(physics(Mode::None, &secs), None);
        let rep = report(&report_of(vec![row("none", None), row("lazy", why)]), 2);
        let rows = rep.contract["rows"].as_array().unwrap();
        assert_eq!(
            (&rows[0]["valid"], &rows[1]["valid"]),
            (&true.into(), &false.into())
        );
        assert!(rep.tables[0]
            .invalid_why("virtio-blk/ssd-80us/lazy")
            .is_some());
        assert!(rep.tables[0]
            .invalid_why("virtio-blk/ssd-80us/none")
            .is_none());
    }

    /// Strict does all of lazy's work and more: strict faster than lazy
    /// in every round is invalid too (none >= lazy >= strict, or the row
    /// says why); lazy faster than strict is what lazy is for.
    #[test]
    fn strict_faster_than_lazy_in_every_round_is_invalid() {
        // [none, strict, lazy] seconds per round.
        let secs = vec![vec![1.0, 1.0], vec![1.1, 1.15], vec![1.2, 1.3]];
        let why = physics(Mode::Strict, &secs);
        assert!(
            matches!(&why, Some(w) if w.starts_with("measurement invalid: strict ran faster than lazy in every round")),
            "{why:?}"
        );
        assert_eq!(physics(Mode::Lazy, &secs), None);
        let ok = vec![vec![1.0, 1.0], vec![1.6, 1.7], vec![1.05, 1.1]];
        assert_eq!(Mode::ALL.map(|m| physics(m, &ok)), [None, None, None]);
    }

    /// The device time achieved is checked against the model's deadline
    /// (arrival + 80 us): within a tenth it stands, past it the report
    /// says the machine could not keep the deadlines; `null` has no model.
    #[test]
    fn device_time_off_the_model_is_reported() {
        assert_eq!(device_time_note("d", 80.0, 84.0), None);
        assert!(matches!(
            device_time_note("virtio-blk/ssd-80us/none", 80.0, 160.0),
            Some(n) if n.starts_with("virtio-blk/ssd-80us/none: the device time achieved (160.0 us")
        ));
        assert_eq!(device_time_note("virtio-blk/null/none", 0.0, 0.0), None);
    }

    /// `--exit-us` takes 0..=1000 µs; anything else is refused with one
    /// line (the CLI exits 2).
    #[test]
    fn exit_us_is_bounded() {
        assert_eq!(parse_exit_us("0"), Ok(0.0));
        assert_eq!(parse_exit_us("2.5"), Ok(2.5));
        assert!(matches!(parse_exit_us("-1"), Err(e) if e.contains("0..=1000")));
        assert!(matches!(parse_exit_us("nan"), Err(e) if e.contains("0..=1000")));
    }

    /// A short ssd-80us round: every read is held to its deadline and
    /// never returned before it (the achieved device time is at least
    /// the model's 80 us; an upper bound would measure the machine's
    /// load), the achieved time is counted per read, and each mode's
    /// notifications are its own: strict six per read, lazy one, none
    /// none to the virtio-iommu.
    #[test]
    fn an_ssd_round_keeps_the_deadline_and_counts_the_work() {
        let m = measure_round(Some(SSD_HOLD), 300, 4, Duration::ZERO).unwrap();
        for x in &m {
            assert_eq!(x.released, 300);
            let us = x.held_ns as f64 / x.released as f64 / 1e3;
            assert!((80.0..2_000.0).contains(&us), "device time {us} us");
        }
        let per = |i: usize| m[i].notifications as f64 / 300.0;
        assert_eq!(
            (m[0].requests, m[1].requests, m[2].requests),
            (0, 1800, 1800)
        );
        assert!(per(1) >= 6.0 && (1.0..1.1).contains(&per(2)), "{m:?}");
    }
}
