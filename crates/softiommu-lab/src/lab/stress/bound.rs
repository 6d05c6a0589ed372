//! `lab stress`'s bound phase: the deferred policy's promise probed where
//! it is tightest. No device access that *begins* later than
//! `flush_timeout + 1 ms` ([`bound`]) after a deferred unmap returned may
//! succeed through that unmap's translation, whatever the scheduling.
//!
//! One thread, at the load's nice value, plays driver and device: it maps
//! a tagged page, reads it through the device (so the unit caches the
//! translation), unmaps it deferred and notes when `unmap` returned; in
//! between it probes the IOVAs it unmapped in the last three bounds, at
//! random, so probes land at every age around the bound. Busy processes
//! at nice 0 ([`Hogs`], `--hogs`, 2 by default) run alongside for the
//! phase, so the flush timer, the owner and this thread are all taken off
//! their CPUs for whole scheduling slices: the bound must hold anyway.
//!
//! Nothing is mapped between probes, so a probe that succeeds reached an
//! unmapped buffer: the page's tag says which, and the age is taken from
//! that buffer's unmap (its IOVA may have been reused by a later one). At
//! an age of at least the bound that is a violation.

use std::collections::VecDeque;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softiommu::access::{DmaAccessor, DmaAttrs};
use softiommu::dma::{DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy, MAX_FQ_SIZE};
use softiommu::hw::{SourceId, System, UnitConfig};
use softiommu::mem::PhysMemory;

use super::check::{Tag, TagKind, PAGE};
use super::out::PhaseResult;
use crate::error::{LabError, LabResult};
use crate::workload::Rng;

/// The bound phase's row name.
pub const BOUND_PHASE: &str = "deferred-bound";
/// What the library promises past the flush timeout.
pub const BOUND_MARGIN: Duration = Duration::from_millis(1);
/// Pages the phase cycles through (each mapped at most once at a time).
const PAGES: usize = 512;
/// A new buffer is mapped and unmapped at most this often.
const MAP_EVERY: Duration = Duration::from_micros(100);
/// How long an unmapped buffer stays probed, in bounds.
const PROBED_FOR: u64 = 3;
/// Probes at or past the bound a run makes at least: the phase runs on
/// past its length until it has them, for at most [`MAX_STRETCH`] times
/// its length (a prober starved of CPU probes slowly).
pub const MIN_PROBES_AT_BOUND: u64 = 10_000;
/// See [`MIN_PROBES_AT_BOUND`].
const MAX_STRETCH: u32 = 10;
const SID: SourceId = SourceId(0x0300);

/// The stale window's promised bound for flush timeout `timeout`.
pub fn bound(timeout: Duration) -> Duration {
    timeout + BOUND_MARGIN
}

/// What the bound phase found beyond its row.
#[derive(Debug, Clone, Default)]
pub struct BoundResult {
    /// The phase's row.
    pub row: PhaseResult,
    /// Probes that began at least the bound after their buffer's unmap.
    pub probes_at_bound: u64,
    /// The oldest probe's age at its start, microseconds.
    pub max_probe_age_us: u64,
}

/// Busy processes (`sh -c 'while :; do :; done'`) at nice 0, each the
/// leader of a process group of its own, killed with its whole group when
/// dropped (on every return, error or panic path that unwinds past it).
/// Each is also wrapped in `timeout` where it exists, so none outlives the
/// run by more than its length even if the lab itself is killed. Killing
/// `timeout` alone would not do: it cannot pass on a SIGKILL, and its
/// `sh` would spin on for ever, adopted by init.
#[derive(Debug)]
pub struct Hogs(Vec<Child>);

impl Hogs {
    /// Starts `n` of them, each living at most `limit`.
    pub fn start(n: u64, limit: Duration) -> LabResult<Hogs> {
        use std::os::unix::process::CommandExt;
        // Pushed as each starts: one that fails to start drops the ones
        // started before it, and their groups are killed.
        let mut hogs = Hogs(Vec::new());
        let secs = limit.as_secs().saturating_add(2).to_string();
        for _ in 0..n {
            let loop_ = ["sh", "-c", "while :; do :; done"];
            let child = Command::new("timeout")
                .arg(&secs)
                .args(loop_)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .or_else(|_| {
                    Command::new(loop_[0])
                        .args(&loop_[1..])
                        .stdin(Stdio::null())
                        .process_group(0)
                        .spawn()
                })
                .map_err(|_| LabError::Setup("could not start a busy process (--hogs)"))?;
            hogs.0.push(child);
        }
        Ok(hogs)
    }

    /// The process groups of the hogs (each hog's process id).
    #[cfg(test)]
    pub fn groups(&self) -> Vec<i32> {
        self.0.iter().map(|c| c.id() as i32).collect()
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            // The group's id is its leader's, the child's own: SIGKILL to
            // the group reaches `timeout` and the loop it runs.
            if let Ok(pgid) = libc::pid_t::try_from(c.id()) {
                // SAFETY: kill(2) with a negative pid signals the process
                // group we created for this child; it touches no memory.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One unmapped buffer being probed.
#[derive(Debug, Clone, Copy)]
struct Unmapped {
    iova: u64,
    page: usize,
    tag: u64,
    /// Nanoseconds (phase clock) when `unmap` returned.
    t_unmap_ns: u64,
}

/// Runs the phase for `seconds` with flush timeout `timeout`, its thread
/// at `nice`, `hogs` busy processes beside it.
pub fn bound_phase(
    seconds: f64,
    timeout: Duration,
    seed: u64,
    hogs: u64,
    nice: u64,
) -> LabResult<BoundResult> {
    let run_for = Duration::from_secs_f64(seconds);
    let _hogs = Hogs::start(hogs, run_for * MAX_STRETCH)?;
    let handle = std::thread::spawn(move || {
        super::run_as_load(nice);
        probe_thread(run_for, timeout, seed)
    });
    crate::error::join(handle, "stress bound")?
}

fn probe_thread(run_for: Duration, timeout: Duration, seed: u64) -> LabResult<BoundResult> {
    let bound_ns = bound(timeout).as_nanos() as u64;
    let mem = Arc::new(PhysMemory::new(16 << 20)?);
    let mut sys = System::new(mem.clone());
    let unit = sys.add_unit(UnitConfig::default())?;
    sys.assign(SID, unit)?;
    let sys = Arc::new(sys);
    let d = DmaDomain::new(
        sys,
        DmaDomainConfig {
            did: 3,
            policy: DmaPolicy::Deferred,
            bounce_bytes: 0,
            ..Default::default()
        },
    )?;
    d.set_timeout(timeout)?;
    // Flushes come from the timer, the owner's age check and the device's
    // own deadline only: the high-water mark never ends a window early.
    d.set_high_water(MAX_FQ_SIZE)?;
    let dev = d.attach(SID, (1 << 48) - 1, false)?;
    let mut cpu = d.cpu();
    let mut acc = DmaAccessor::for_device(&dev)?;
    let mut rng = Rng::new(seed);
    let mut free: Vec<(usize, u64)> = Vec::with_capacity(PAGES);
    for i in 0..PAGES {
        free.push((i, mem.alloc_zeroed_frames(0)?));
    }
    let phys_of: Vec<u64> = {
        let mut v = vec![0; PAGES];
        for &(i, p) in &free {
            v[i] = p;
        }
        v
    };
    let mut gens = vec![0u32; PAGES];
    let mut probed: VecDeque<Unmapped> = VecDeque::new();
    let mut out = BoundResult::default();
    out.row.policy = BOUND_PHASE.into();
    let t0 = Instant::now();
    let ns = || t0.elapsed().as_nanos() as u64;
    let mut next_map = 0u64;
    while t0.elapsed() < run_for
        || (out.probes_at_bound < MIN_PROBES_AT_BOUND && t0.elapsed() < run_for * MAX_STRETCH)
    {
        // Retire what has been probed long enough; its page is reused.
        while probed
            .front()
            .is_some_and(|u| ns().saturating_sub(u.t_unmap_ns) > PROBED_FOR * bound_ns)
        {
            if let Some(u) = probed.pop_front() {
                free.push((u.page, phys_of[u.page]));
            }
        }
        if ns() >= next_map {
            if let Some((page, phys)) = free.pop() {
                next_map = ns() + MAP_EVERY.as_nanos() as u64;
                gens[page] += 1;
                let tag = Tag {
                    kind: TagKind::Buffer,
                    domain: 3,
                    slot: page as u16,
                    gen: gens[page],
                }
                .encode();
                for w in (0..PAGE).step_by(8) {
                    mem.store_u64(phys + w, tag, Ordering::Relaxed)?;
                }
                let iova = cpu.map(&dev, phys, PAGE, DmaDirection::ToDevice)?;
                out.row.ops += 1;
                // The device reads it: the unit caches the translation.
                let v = acc.read_u64(iova, DmaAttrs::RELAXED);
                out.row.device_accesses += 1;
                if v.as_ref().ok() != Some(&tag) {
                    offend(
                        &mut out.row,
                        format!("phase {BOUND_PHASE}: a live mapping at {iova:#x} read {v:?}, not {tag:#x}"),
                    );
                } else {
                    out.row.legal += 1;
                }
                cpu.unmap(&dev, iova, PAGE, DmaDirection::ToDevice)?;
                out.row.ops += 1;
                let t_unmap_ns = ns();
                probed.push_back(Unmapped {
                    iova,
                    page,
                    tag,
                    t_unmap_ns,
                });
            }
        }
        let Some(&u) = probed.get(rng.below(probed.len().max(1) as u64) as usize) else {
            continue;
        };
        let x = u.iova + 8 * rng.below(PAGE / 8);
        let t_before = ns();
        let r = acc.read_u64(x, DmaAttrs::RELAXED);
        out.row.device_accesses += 1;
        let age = t_before.saturating_sub(u.t_unmap_ns);
        if age >= bound_ns {
            out.probes_at_bound += 1;
        }
        out.max_probe_age_us = out.max_probe_age_us.max(age / 1000);
        let v = match r {
            Err(_) => {
                out.row.faults += 1;
                continue;
            }
            Ok(v) => v,
        };
        // Which unmapped buffer was reached: the probed one, or one that
        // reused its IOVA after its flush.
        let reached = probed.iter().find(|p| p.tag == v).copied();
        match reached {
            Some(p) => {
                let age = t_before.saturating_sub(p.t_unmap_ns);
                if let Some(why) = judge_stale(age, bound_ns) {
                    offend(
                        &mut out.row,
                        format!(
                            "phase {BOUND_PHASE}: {why}: a read at IOVA {x:#x} began {} us after \
                             the deferred unmap of IOVA {:#x} returned (policy deferred, bound {} us); \
                             expected a fault, read its tag {v:#x}",
                            age / 1000,
                            p.iova,
                            bound_ns / 1000
                        ),
                    );
                } else {
                    out.row.stale_accesses += 1;
                    out.row.max_stale_age_us = out.row.max_stale_age_us.max(age / 1000);
                }
            }
            None => offend(
                &mut out.row,
                format!(
                    "phase {BOUND_PHASE}: a read at IOVA {x:#x} (probing the buffer unmapped {} us \
                     before) read {v:#x}, which no buffer unmapped in the last {PROBED_FOR} bounds held",
                    age / 1000
                ),
            ),
        }
    }
    drop(acc);
    cpu.flush_own()?;
    out.row.seconds = t0.elapsed().as_secs_f64();
    out.row.library_stale_window_us = d.stale_window().max.as_micros() as u64;
    // (A phase starved of CPU may make few probes at the bound: reported
    // as `bound_probes`, never hidden.)
    Ok(out)
}

/// The verdict on a successful access to a deferred-unmapped buffer that
/// began `age_ns` after its unmap returned, with promised bound
/// `bound_ns`: `None` if permitted, else what is wrong.
pub fn judge_stale(age_ns: u64, bound_ns: u64) -> Option<&'static str> {
    (age_ns >= bound_ns).then_some("a deferred access past the bound")
}

fn offend(row: &mut PhaseResult, what: String) {
    row.violations += 1;
    if row.first_violation.is_none() {
        row.first_violation = Some(what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The processes (not zombies) whose process group is `pgid`, from
    /// `/proc/PID/stat` (field 5 is the group, field 3 the state).
    fn live_in_group(pgid: i32) -> Vec<i32> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command name (field 2) is in parentheses and may hold
            // spaces: the fields after the last `)` are plain.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() > 2 && f[0] != "Z" && f[0] != "X" && f[2] == pgid.to_string() {
                out.push(pid);
            }
        }
        out
    }

    #[test]
    fn no_busy_process_outlives_its_guard() {
        let hogs = Hogs::start(2, Duration::from_secs(60)).unwrap();
        let groups = hogs.groups();
        assert_eq!(groups.len(), 2);
        // `timeout` starts its `sh`: wait until each group has two
        // processes (or one, where `timeout` is missing).
        let t0 = Instant::now();
        while groups.iter().any(|&g| live_in_group(g).len() < 2)
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for &g in &groups {
            assert!(!live_in_group(g).is_empty(), "group {g} never ran");
        }
        drop(hogs);
        let t0 = Instant::now();
        while groups.iter().any(|&g| !live_in_group(g).is_empty())
            && t0.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for &g in &groups {
            assert_eq!(
                live_in_group(g),
                Vec::<i32>::new(),
                "group {g} left running"
            );
        }
    }

    #[test]
    fn an_access_begun_at_or_past_the_bound_is_a_violation() {
        let b = bound(Duration::from_millis(10)).as_nanos() as u64;
        assert_eq!(b, 11_000_000);
        assert_eq!(judge_stale(b - 1, b), None);
        assert_eq!(judge_stale(b, b), Some("a deferred access past the bound"));
        assert_eq!(
            judge_stale(25 * 10_000_000, b),
            Some("a deferred access past the bound")
        );
    }
}
