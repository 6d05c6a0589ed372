//! `softiommu bench access`: what ordering costs a device (seed `001`'s
//! "write a microbenchmark"). An emulated NIC serves a ring: per
//! descriptor it reads the 16-byte descriptor, reads the buffer it names,
//! writes the buffer back and writes the descriptor's status word — four
//! DMA accesses through the unit's translation.
//!
//! Modes, side by side in one run (rounds interleaved, median round
//! reported):
//!
//! - `relaxed`: no fence;
//! - `ordered`: the default accessors (acquire/release, and a store-load
//!   fence before the descriptor read that follows the last status store);
//! - `full`: a full fence before every access (QEMU's `smp_mb()`);
//! - `vm-memory`: the same four accesses through vm-memory's
//!   `IommuMemory` over our unit (`read_slice`, `read_slice`,
//!   `write_slice`, a release `store` of the status), as a rust-vmm device
//!   would make them.
//!
//! The device runs alone on its thread (the guest posts the ring once), so
//! the figures are the device's own cost per descriptor. The headline
//! figures are on the device thread's CPU clock (CPU ns per descriptor,
//! and its ratio to relaxed's in the same round), so a co-runner that
//! takes the core in the middle of a round is not counted as a mode's
//! cost; the wall-clock figures stand beside them (`wall_ns_per_op`,
//! `vs_relaxed_wall`). Every figure is measured; nothing is modelled.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiommu::access::{DmaAccessor, OrderMode, PhysGuestMemory, UnitIommu};
use softiommu::dma::{DmaDevice, DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{SourceId, System, UnitConfig};
use softiommu::mem::{PhysMemory, PAGE_SIZE};
use softiommu_virtio::cpu_clock;
use vm_memory::{Bytes, GuestAddress, IommuMemory};

use crate::args::{Ranged, Seconds};
use crate::error::{LabError, LabResult};
use crate::lab::policy_physics::{self, MustCostMore, PolicyCost};
use crate::report::{
    contract, Axis, Cell, Column, Param, Plot, PlotKind, Report, Series, Spread, Table, Unit,
};

/// Options of `bench access` (and of a `[bench-access]` scenario table).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccessBenchArgs {
    /// Descriptors in the ring (1..=16384).
    #[arg(long, default_value = "256")]
    pub ring: Ranged<1, 16384>,
    /// Bytes per buffer, the device reads and writes back all of them
    /// (1..=4096). The default, a minimum Ethernet frame, is where the
    /// fences' share of the work is largest; 1500 is an MTU-sized one.
    #[arg(long, default_value = "64")]
    pub buf_bytes: Ranged<1, 4096>,
    /// Seconds of measurement per mode, split over the rounds
    /// (0.01..=86400).
    #[arg(long, default_value = "1")]
    pub seconds: Seconds,
    /// Interleaved rounds (each runs every mode once, in rotating order);
    /// the median round is reported (1..=1000). Many short rounds let
    /// every mode see the same background load.
    #[arg(long, default_value = "41")]
    pub rounds: Ranged<1, 1000>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for AccessBenchArgs {
    fn default() -> Self {
        Self {
            ring: Ranged::new(256),
            buf_bytes: Ranged::new(64),
            seconds: Seconds::new(1.0),
            rounds: Ranged::new(41),
            json: false,
        }
    }
}

/// One mode's result.
#[derive(Debug, Clone, Serialize)]
pub struct AccessResult {
    /// "relaxed", "ordered", "full" or "vm-memory".
    pub mode: String,
    /// CPU nanoseconds of the device thread per descriptor served
    /// (median round; its thread CPU clock).
    pub ns_per_op: f64,
    /// Fastest and slowest rounds, for the spread.
    pub min_ns_per_op: f64,
    /// Slowest round.
    pub max_ns_per_op: f64,
    /// The median, over rounds, of this mode's CPU time per descriptor
    /// over `relaxed`'s in the same round (paired, so robust to load that
    /// changes between rounds).
    pub vs_relaxed: f64,
    /// Wall-clock nanoseconds per descriptor (median round): what a
    /// co-runner taking the core also moves.
    pub wall_ns_per_op: f64,
    /// `vs_relaxed` on wall-clock time.
    pub vs_relaxed_wall: f64,
    /// Full fences per descriptor (store-load fences in `ordered`); none
    /// are counted for `vm-memory`, which issues none.
    pub full_fences_per_op: f64,
    /// `ns_per_op` over the rounds (min, median, max); `null` with one
    /// round.
    pub ns_per_op_spread: Option<Spread>,
    /// `vs_relaxed` over the rounds (each round's paired ratio); `null`
    /// with one round.
    pub vs_relaxed_spread: Option<Spread>,
    /// `vs_relaxed_wall` over the rounds; `null` with one round.
    pub vs_relaxed_wall_spread: Option<Spread>,
    /// Whether the mode's time is physically possible: a full barrier per
    /// access must not cost less than relaxed access beyond the spread.
    pub valid: bool,
    /// Why not, when `valid` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The ordering modes' order: a full barrier per access does all a
/// relaxed access does and fences.
pub const MODES: [MustCostMore; 1] = [MustCostMore {
    dearer: "full",
    cheaper: "relaxed",
    because: "a full barrier per access does all a relaxed access does and fences",
}];

/// Marks the modes whose time contradicts [`MODES`] beyond the spread.
fn check_modes(results: &mut [AccessResult]) {
    let costs: Vec<PolicyCost<'_>> = results
        .iter()
        .map(|x| PolicyCost {
            policy: &x.mode,
            group: "",
            cost: x
                .ns_per_op_spread
                .unwrap_or_else(|| Spread::of(&[x.ns_per_op])),
        })
        .collect();
    let why = policy_physics::check_by(&costs, &MODES, "time per descriptor");
    for (x, w) in results.iter_mut().zip(why) {
        if let Some(w) = w {
            x.valid = false;
            x.why = Some(w);
        }
    }
}

/// The JSON object `bench access --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct AccessBenchReport {
    /// Always "access".
    pub bench: &'static str,
    /// The CPU architecture the fences compiled for.
    pub arch: &'static str,
    /// The unit's drain barrier ("membarrier": translations pay no fence
    /// of their own; "fence": every translation pays a full fence).
    pub drain_barrier: &'static str,
    /// Descriptors in the ring.
    pub ring: u32,
    /// Bytes per buffer.
    pub buf_bytes: u32,
    /// Rounds per mode.
    pub rounds: usize,
    /// Which figures are measured: all of them.
    pub measured: &'static str,
    /// One entry per mode.
    pub results: Vec<AccessResult>,
}

const SID: SourceId = SourceId(0x0600);
/// Descriptor layout: buffer IOVA (u64), length (u32), status (u32).
const DESC_BYTES: u64 = 16;
const STATUS_OFF: u64 = 12;
const DONE: u32 = 1;

/// The ring and its buffers, posted by the guest.
struct Ring {
    mem: Arc<PhysMemory>,
    dev: DmaDevice,
    ring_iova: u64,
    n: u64,
    buf_bytes: usize,
    drain_barrier: &'static str,
    _domain: Arc<DmaDomain>,
}

fn setup(args: &AccessBenchArgs) -> LabResult<Ring> {
    let n = args.ring.get();
    let buf_bytes = args.buf_bytes.us().min(PAGE_SIZE as usize);
    let mem = Arc::new(PhysMemory::new(1 << 30)?);
    let mut sys = System::new(mem.clone());
    let u = sys.add_unit(UnitConfig::default())?;
    sys.assign(SID, u)?;
    let drain_barrier = sys.unit(u).map_or("fence", |u| u.drain_barrier());
    let domain = DmaDomain::new(
        Arc::new(sys),
        DmaDomainConfig {
            policy: DmaPolicy::Strict,
            bounce_bytes: 0,
            ..DmaDomainConfig::default()
        },
    )?;
    let dev = domain.attach(SID, u64::MAX, false)?;
    let mut cpu = domain.cpu();
    let (ring_phys, ring_iova) = cpu.alloc_coherent(&dev, n * DESC_BYTES)?;
    for i in 0..n {
        // One page per buffer, each mapped on its own, as a driver maps
        // packet buffers.
        let phys = mem.alloc_zeroed_frames(0)?;
        mem.fill(phys, buf_bytes as u64, i as u8)?;
        let iova = cpu.map(&dev, phys, buf_bytes as u64, DmaDirection::Bidirectional)?;
        let mut d = [0u8; DESC_BYTES as usize];
        d[..8].copy_from_slice(&iova.to_le_bytes());
        d[8..12].copy_from_slice(&(buf_bytes as u32).to_le_bytes());
        mem.write(ring_phys + i * DESC_BYTES, &d)?;
    }
    Ok(Ring {
        mem,
        dev,
        ring_iova,
        n,
        buf_bytes,
        drain_barrier,
        _domain: domain,
    })
}

fn parse_desc(d: &[u8; 16]) -> (u64, usize) {
    let mut a = [0u8; 8];
    a.copy_from_slice(&d[..8]);
    let mut l = [0u8; 4];
    l.copy_from_slice(&d[8..12]);
    (u64::from_le_bytes(a), u32::from_le_bytes(l) as usize)
}

/// One device's state per mode.
// Made once per device thread and never moved on the timed path; boxing
// the accessor would add an indirection to every access the bench times.
#[allow(clippy::large_enum_variant)]
enum Device {
    Accessor(DmaAccessor, OrderMode),
    VmMemory(Box<IommuMemory<PhysGuestMemory, UnitIommu>>),
}

impl Device {
    fn name(&self) -> &'static str {
        match self {
            Device::Accessor(_, m) => m.name(),
            Device::VmMemory(_) => "vm-memory",
        }
    }

    fn full_fences(&self) -> u64 {
        match self {
            Device::Accessor(a, _) => a.stats().full_fences,
            Device::VmMemory(_) => 0,
        }
    }

    /// Serves descriptor `i`.
    #[inline(always)]
    fn serve(&mut self, ring: &Ring, i: u64, buf: &mut [u8]) -> LabResult<()> {
        let at = ring.ring_iova + i * DESC_BYTES;
        let mut d = [0u8; DESC_BYTES as usize];
        match self {
            Device::Accessor(acc, mode) => {
                let a = mode.attrs();
                acc.read(at, &mut d, a)?;
                let (addr, len) = parse_desc(&d);
                let max = buf.len();
                let b =
                    buf.get_mut(..len)
                        .ok_or(LabError::DescriptorTooLong { index: i, len, max })?;
                acc.read(addr, b, a)?;
                acc.write(addr, b, a)?;
                acc.write_u32(at + STATUS_OFF, DONE, a)?;
            }
            Device::VmMemory(m) => {
                m.read_slice(&mut d, GuestAddress(at))?;
                let (addr, len) = parse_desc(&d);
                let max = buf.len();
                let b =
                    buf.get_mut(..len)
                        .ok_or(LabError::DescriptorTooLong { index: i, len, max })?;
                m.read_slice(b, GuestAddress(addr))?;
                m.write_slice(b, GuestAddress(addr))?;
                m.store(DONE, GuestAddress(at + STATUS_OFF), Ordering::Release)?;
            }
        }
        Ok(())
    }
}

/// One round of one mode.
#[derive(Debug, Clone, Copy)]
struct Round {
    /// The device thread's CPU ns per descriptor.
    cpu_ns: f64,
    /// Wall-clock ns per descriptor.
    wall_ns: f64,
    /// Descriptors served.
    ops: u64,
    /// Full fences issued.
    fences: u64,
}

/// One round of one mode, `budget` of wall-clock time.
fn round(dev: &mut Device, ring: &Ring, budget: Duration) -> LabResult<Round> {
    let mut buf = vec![0u8; ring.buf_bytes];
    let f0 = dev.full_fences();
    let (mut ops, mut i) = (0u64, 0u64);
    let cpu0 = cpu_clock::thread();
    let start = Instant::now();
    while start.elapsed() < budget {
        for _ in 0..64 {
            dev.serve(ring, i, &mut buf)?;
            i += 1;
            if i == ring.n {
                i = 0;
            }
        }
        ops += 64;
    }
    let wall = start.elapsed();
    let cpu = cpu_clock::thread().saturating_sub(cpu0);
    Ok(Round {
        cpu_ns: cpu.as_nanos() as f64 / ops as f64,
        wall_ns: wall.as_nanos() as f64 / ops as f64,
        ops,
        fences: dev.full_fences() - f0,
    })
}

/// Runs the bench.
pub fn run(args: &AccessBenchArgs) -> LabResult<Report> {
    let r = measure(args)?;
    Ok(report(&r, args))
}

fn measure(args: &AccessBenchArgs) -> LabResult<AccessBenchReport> {
    let ring = setup(args)?;
    let mut devices: Vec<Device> = OrderMode::ALL
        .into_iter()
        .map(|m| DmaAccessor::for_device(&ring.dev).map(|a| Device::Accessor(a, m)))
        .collect::<Result<_, _>>()?;
    let view = UnitIommu::for_device(&ring.dev)?;
    devices.push(Device::VmMemory(Box::new(IommuMemory::new(
        PhysGuestMemory::behind_iommu(ring.mem.clone()),
        view,
        true,
        (),
    ))));
    let rounds = args.rounds.us();
    let budget = Duration::from_secs_f64(args.seconds.get() / rounds as f64);
    // Warm the IOTLBs, the caches and the clock.
    for d in devices.iter_mut() {
        round(d, &ring, Duration::from_millis(20))?;
    }
    let mut per: Vec<Vec<Round>> = devices.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        // Rotate the starting mode so none always runs first.
        for k in 0..devices.len() {
            let j = (k + r) % devices.len();
            per[j].push(round(&mut devices[j], &ring, budget)?);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let results = devices
        .iter()
        .zip(per.iter())
        .map(|(d, v)| {
            let ops: u64 = v.iter().map(|x| x.ops).sum();
            let fences: u64 = v.iter().map(|x| x.fences).sum();
            let (lo, hi) = v.iter().fold((f64::MAX, 0f64), |(lo, hi), x| {
                (lo.min(x.cpu_ns), hi.max(x.cpu_ns))
            });
            let ratios: Vec<f64> = v
                .iter()
                .zip(&per[0])
                .map(|(x, r)| x.cpu_ns / r.cpu_ns)
                .collect();
            let wall_ratios: Vec<f64> = v
                .iter()
                .zip(&per[0])
                .map(|(x, r)| x.wall_ns / r.wall_ns)
                .collect();
            let ns: Vec<f64> = v.iter().map(|x| x.cpu_ns).collect();
            let wall: Vec<f64> = v.iter().map(|x| x.wall_ns).collect();
            AccessResult {
                mode: d.name().to_string(),
                ns_per_op: median(ns.clone()),
                min_ns_per_op: lo,
                max_ns_per_op: hi,
                vs_relaxed: median(ratios.clone()),
                wall_ns_per_op: median(wall),
                vs_relaxed_wall: median(wall_ratios.clone()),
                full_fences_per_op: fences as f64 / ops.max(1) as f64,
                ns_per_op_spread: Spread::of_rounds(&ns),
                vs_relaxed_spread: Spread::of_rounds(&ratios),
                vs_relaxed_wall_spread: Spread::of_rounds(&wall_ratios),
                valid: true,
                why: None,
            }
        })
        .collect::<Vec<_>>();
    let mut results = results;
    check_modes(&mut results);
    Ok(AccessBenchReport {
        bench: "access",
        arch: std::env::consts::ARCH,
        drain_barrier: ring.drain_barrier,
        ring: args.ring.get() as u32,
        buf_bytes: ring.buf_bytes as u32,
        rounds,
        measured: "all",
        results,
    })
}

/// The typed report.
fn report(r: &AccessBenchReport, args: &AccessBenchArgs) -> Report {
    let mut t = Table::new(
        "results",
        format!(
            "NIC ring (read descriptor, read {} B buffer, write it back, write status), {} descriptors, {} ({} drain barrier), median of {} rounds [lowest–highest round]; the device thread's CPU time per descriptor, wall-clock time beside",
            r.buf_bytes, r.ring, r.arch, r.drain_barrier, r.rounds
        ),
        vec![
            Column::label("mode"),
            Column::metric("ns_per_op", "CPU per descriptor", Unit::Ns, 1),
            Column::metric("vs_relaxed", "vs relaxed (CPU)", Unit::Ratio, 3),
            Column::metric("wall_ns_per_op", "wall per descriptor", Unit::Ns, 1),
            Column::metric("vs_relaxed_wall", "vs relaxed (wall)", Unit::Ratio, 3),
            Column::metric("full_fences_per_op", "full fences", Unit::FencesPerOp, 2),
            Column::text("valid"),
        ],
    );
    for x in &r.results {
        t.row(vec![
            x.mode.clone().into(),
            Cell::figure(x.ns_per_op, x.ns_per_op_spread),
            // Relaxed over itself is 1 exactly: no spread.
            Cell::figure(
                x.vs_relaxed,
                x.vs_relaxed_spread.filter(|_| x.mode != "relaxed"),
            ),
            x.wall_ns_per_op.into(),
            Cell::figure(
                x.vs_relaxed_wall,
                x.vs_relaxed_wall_spread.filter(|_| x.mode != "relaxed"),
            ),
            x.full_fences_per_op.into(),
            if x.valid { "yes" } else { "NO" }.into(),
        ]);
        if let Some(why) = &x.why {
            t.mark_invalid(x.mode.clone(), why.clone());
        }
    }
    let mut rep = Report::new(
        "bench access",
        "what ordering costs a device: an emulated NIC ring per DMA access mode (seed 001)",
        contract(r),
    )
    .seed("001");
    rep.params = vec![
        Param::new("ring", r.ring, Unit::Entries),
        Param::new("buf_bytes", r.buf_bytes, Unit::Bytes),
        Param::new("seconds", args.seconds, Unit::S),
        Param::new("rounds", r.rounds, Unit::Count),
        Param::text("arch", r.arch),
        Param::text("drain_barrier", r.drain_barrier),
    ];
    rep.tables.push(t);
    rep.plots.push(Plot {
        name: "ns_per_descriptor".into(),
        title: "device CPU time per descriptor, per ordering mode".into(),
        kind: PlotKind::Bars,
        x: Axis::new("mode", Unit::Count),
        y: Axis::new("CPU per descriptor", Unit::Ns),
        categories: r.results.iter().map(|x| x.mode.clone()).collect(),
        series: vec![Series {
            spreads: r
                .results
                .iter()
                .map(|x| x.ns_per_op_spread.map(|s| (s.min, s.max)))
                .collect(),
            ..Series::new(
                "median round",
                r.results
                    .iter()
                    .enumerate()
                    .map(|(i, x)| (i as f64, x.ns_per_op))
                    .collect(),
            )
        }],
        modelled: false,
    });
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(name: &str, rounds: &[f64]) -> AccessResult {
        let s = Spread::of(rounds);
        AccessResult {
            mode: name.into(),
            ns_per_op: s.median,
            min_ns_per_op: s.min,
            max_ns_per_op: s.max,
            vs_relaxed: 1.0,
            wall_ns_per_op: s.median,
            vs_relaxed_wall: 1.0,
            full_fences_per_op: 0.0,
            ns_per_op_spread: Some(s),
            vs_relaxed_spread: None,
            vs_relaxed_wall_spread: None,
            valid: true,
            why: None,
        }
    }

    #[test]
    fn a_round_counts_the_device_threads_cpu_not_the_time_a_co_runner_takes() {
        use std::sync::atomic::AtomicBool;
        // A co-runner spinning on the device's one CPU takes about half
        // of it: the round's wall time per descriptor doubles, its CPU
        // time does not.
        let cpu = crate::metrics::pinning::allowed_cpus()[0];
        let ring = setup(&AccessBenchArgs {
            ring: Ranged::new(16),
            ..AccessBenchArgs::default()
        })
        .unwrap();
        let mut dev = Device::Accessor(
            DmaAccessor::for_device(&ring.dev).unwrap(),
            OrderMode::Relaxed,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let spinner = std::thread::spawn(move || {
            crate::metrics::pinning::pin_current(cpu);
            while !s.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        assert!(crate::metrics::pinning::pin_current(cpu));
        let r = round(&mut dev, &ring, Duration::from_millis(400)).unwrap();
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        assert!(r.ops > 0 && r.cpu_ns > 0.0);
        assert!(
            r.wall_ns > 1.5 * r.cpu_ns,
            "wall {} ns, CPU {} ns per descriptor",
            r.wall_ns,
            r.cpu_ns
        );
    }

    #[test]
    fn a_full_barrier_cheaper_than_relaxed_access_is_invalid_and_gets_no_verdict() {
        let mut results = vec![
            mode("relaxed", &[40.0, 41.0, 42.0]),
            mode("ordered", &[41.0, 42.0, 43.0]),
            mode("full", &[30.0, 31.0, 32.0]),
        ];
        check_modes(&mut results);
        assert!(results[0].valid && results[1].valid);
        assert!(
            matches!(&results[2].why, Some(w) if w.starts_with("measurement invalid: full's time per descriptor") && w.contains("below relaxed's")),
            "{:?}",
            results[2].why
        );
        let r = AccessBenchReport {
            bench: "access",
            arch: "x86_64",
            drain_barrier: "membarrier",
            ring: 256,
            buf_bytes: 64,
            rounds: 3,
            measured: "all",
            results,
        };
        let mut rep = report(&r, &AccessBenchArgs::default());
        assert_eq!(rep.contract["results"][2]["valid"], false);
        assert!(rep.tables[0].invalid_why("full").is_some());
        rep.scenario = "access-ordering".into();
        let seed = crate::seeds::summarise(&[rep]).remove(1);
        assert!(
            seed.verdict
                .starts_with("no verdict: full: measurement invalid: full's time per descriptor"),
            "{}",
            seed.verdict
        );
        assert_eq!(
            seed.ours_spread, None,
            "vs_relaxed was given no spread here"
        );
    }
}
