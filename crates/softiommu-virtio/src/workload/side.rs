//! What both workloads share: the run's phases (warm-up, measured window,
//! stop), a per-thread meter that snapshots its thread's CPU clock and its
//! counters at the window's edges (less the CPU it spent idling between
//! paced batches, and in the waits a workload times with `Meter::wait`),
//! and the hosts' configuration.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use smoltcp::wire::{Ipv4Address, Ipv4Cidr};
use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu::hw::LatencyModel;

use crate::cpu_clock;
use crate::host::{HostConfig, HostPair};
use crate::net::{NetConfig, NetDeviceConfig, NetDriverConfig};

/// Host A's address.
pub(crate) const A_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
/// Host B's address.
pub(crate) const B_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

pub(crate) fn cidr(a: Ipv4Address) -> Ipv4Cidr {
    Ipv4Cidr::new(a, 24)
}

/// The run's phase, set by the conductor, read by every side.
#[derive(Debug, Default)]
pub(crate) struct Phase(AtomicU8);

pub(crate) const WARMUP: u8 = 0;
pub(crate) const MEASURE: u8 = 1;
pub(crate) const STOP: u8 = 2;

impl Phase {
    pub(crate) fn get(&self) -> u8 {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, p: u8) {
        self.0.store(p, Ordering::Release);
    }
}

/// What a side measured over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Window {
    /// CPU time of the side's thread: its own work, without the units'
    /// inline passes it ran (`unit`).
    pub(crate) cpu: Duration,
    /// The part of the thread's CPU clock that ran units' invalidation
    /// queue passes inline: the IOMMU hardware's work, apart (see
    /// `softiommu::hw::thread_inline_pass_cpu`).
    pub(crate) unit: Duration,
    /// CPU the thread spent inside its waits for the device in the
    /// window ([`Meter::wait`]): going idle and waking (interrupts
    /// re-armed, the park, the wake-up, the status acknowledged). Not in
    /// `cpu`: a driver saturated on CPU never goes idle, so this is not
    /// part of what its work costs.
    pub(crate) waiting: Duration,
    /// Its count (packets, datagrams).
    pub(crate) count: u64,
    /// Its bytes.
    pub(crate) bytes: u64,
}

/// Snapshots a thread's CPU clock and counters when the phase changes.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    seen: u8,
    start: Window,
    /// CPU the thread spent idling (spinning for its next batch) inside
    /// the window: not work, so not in the window's `cpu`.
    idle: Duration,
    /// CPU the thread spent in its waits inside the window (see
    /// [`Window::waiting`]).
    waiting: Duration,
    pub(crate) window: Window,
}

impl Meter {
    /// Looks at the phase; records the window's edges. Returns whether the
    /// run is over.
    pub(crate) fn observe(&mut self, phase: &Phase, count: u64, bytes: u64) -> bool {
        let p = phase.get();
        if p == self.seen {
            return p == STOP;
        }
        let unit = softiommu::hw::thread_inline_pass_cpu();
        let now = Window {
            cpu: cpu_clock::thread().saturating_sub(unit),
            unit,
            waiting: Duration::ZERO,
            count,
            bytes,
        };
        if self.seen == WARMUP {
            self.start = now;
        }
        if p == STOP {
            self.window = Window {
                cpu: now
                    .cpu
                    .saturating_sub(self.start.cpu)
                    .saturating_sub(self.idle)
                    .saturating_sub(self.waiting),
                unit: now.unit.saturating_sub(self.start.unit),
                waiting: self.waiting,
                count: now.count.saturating_sub(self.start.count),
                bytes: now.bytes.saturating_sub(self.start.bytes),
            };
        }
        self.seen = p;
        p == STOP
    }

    /// Runs `wait`, a wait for the device (a park until its interrupt or
    /// a timeout, with the interrupts re-armed around it), and counts the
    /// CPU it took as [`Window::waiting`] when inside the window, not as
    /// work. One thread-clock read before and one after, only inside the
    /// window.
    pub(crate) fn wait<T>(&mut self, wait: impl FnOnce() -> T) -> T {
        if self.seen != MEASURE {
            return wait();
        }
        // Net of any unit pass the wait ran inline: that is counted as
        // `unit` already, and `cpu` is net of it.
        let (t0, u0) = (cpu_clock::thread(), softiommu::hw::thread_inline_pass_cpu());
        let r = wait();
        let unit = softiommu::hw::thread_inline_pass_cpu().saturating_sub(u0);
        self.waiting += cpu_clock::thread().saturating_sub(t0).saturating_sub(unit);
        r
    }

    /// Idles until `due`, or until the phase moves on (so the wait is
    /// bounded by the conductor too), by polling the clock and yielding
    /// the CPU to any other runnable thread, never sleeping: the CPU does
    /// not go idle between batches, so no batch pays for waking it (on a
    /// 2-vCPU VM a sleep and its wake-up cost a paced pass-through
    /// datagram about as much CPU as its work, and that cost moved with
    /// the host). The CPU spent here is idling, not work: within the
    /// window it is left out of the window's `cpu`, as a CPU idling in its
    /// poll state (cpuidle's `poll`, `haltpoll`) counts as idle.
    pub(crate) fn idle_until(&mut self, phase: &Phase, due: Instant) {
        let t0 = cpu_clock::thread();
        while Instant::now() < due && phase.get() == self.seen {
            std::thread::yield_now();
        }
        if self.seen == MEASURE {
            self.idle += cpu_clock::thread().saturating_sub(t0);
        }
    }
}

/// Where a workload's four threads run: each `Some` pins that thread to
/// the CPU (a CPU the kernel refuses is ignored), `None` leaves it to the
/// scheduler. The default pins nothing. A paced UDP stream pins each
/// host's flush timer beside its driver (the sender's CPU for host A, the
/// receiver's for host B), where Linux's flush-queue timer fires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cpus {
    /// Host A's driver+stack thread (the sender).
    pub sender: Option<usize>,
    /// Host B's driver+stack thread (the receiver).
    pub receiver: Option<usize>,
    /// Host A's device thread.
    pub device_a: Option<usize>,
    /// Host B's device thread.
    pub device_b: Option<usize>,
}

/// What both workloads' hosts are built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Common {
    pub(crate) policy: DmaPolicy,
    pub(crate) coherent: bool,
    pub(crate) ordering: OrderMode,
    pub(crate) latency: LatencyModel,
    pub(crate) mtu: u16,
    pub(crate) queue_size: u16,
    pub(crate) cpus: Cpus,
}

impl Common {
    /// Host A's (`mac_last` 1) or B's configuration.
    pub(crate) fn host(&self, mac_last: u8) -> HostConfig {
        let cpu = if mac_last == 1 {
            self.cpus.device_a
        } else {
            self.cpus.device_b
        };
        HostConfig {
            policy: self.policy,
            coherent: self.coherent,
            latency: self.latency,
            mem_bytes: 1 << 30,
            device: NetDeviceConfig {
                net: NetConfig {
                    mac: [0x02, 0, 0, 0, 0, mac_last],
                    mtu: self.mtu,
                    queue_max: self.queue_size.clamp(2, 32768).next_power_of_two(),
                },
                attrs: self.ordering.attrs(),
                cpu,
                ..NetDeviceConfig::default()
            },
            ..HostConfig::default()
        }
    }

    pub(crate) fn driver(&self) -> NetDriverConfig {
        NetDriverConfig {
            queue_size: self.queue_size,
            mtu: self.mtu,
        }
    }
}

/// Microseconds per item, 0 when there were none.
pub(crate) fn us_per(d: Duration, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        d.as_secs_f64() * 1e6 / n as f64
    }
}

/// Both hosts' units charge their inline passes to themselves, so each
/// driver's and timer's CPU can be read without the IOMMU hardware's work
/// (see `softiommu::hw::thread_inline_pass_cpu`).
pub(crate) fn charge_passes(hosts: &HostPair) {
    for h in [&hosts.a, &hosts.b] {
        if let Some(u) = h.system.unit(h.unit) {
            u.set_pass_accounting(true);
        }
    }
}

/// Both hosts' flush timers: their CPU without the units' inline passes
/// they ran, and those passes' CPU (a thread whose clock the kernel will
/// not give counts zero).
pub(crate) fn timers(hosts: &HostPair) -> (Duration, Duration) {
    let mut own = Duration::ZERO;
    let mut unit = Duration::ZERO;
    for h in [&hosts.a, &hosts.b] {
        let cpu = h.domain.timer_cpu_time().unwrap_or_default();
        let passes = h.domain.timer_inline_pass_cpu();
        own += cpu.saturating_sub(passes);
        unit += passes;
    }
    (own, unit)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use softiommu::hw::{Unit, UnitConfig};
    use softiommu::mem::PhysMemory;

    use super::*;

    /// A side's window leaves out the units' inline passes its thread ran:
    /// they are counted apart (`unit`, each pass timed), and the thread's
    /// own part is no more than its CPU clock moved.
    #[test]
    fn a_windows_cpu_leaves_out_the_inline_passes_its_thread_ran() {
        let mem = Arc::new(PhysMemory::new(16 << 20).unwrap());
        let unit = Unit::new(mem, UnitConfig::default()).unwrap();
        unit.set_pass_accounting(true);
        let (phase, mut meter) = (Phase::default(), Meter::default());
        let raw0 = cpu_clock::thread();
        phase.set(MEASURE);
        assert!(!meter.observe(&phase, 0, 0));
        let passes0 = softiommu::hw::thread_inline_pass_cpu();
        let n = 12;
        for _ in 0..n {
            let mut b = unit.batch();
            b.domain(1);
            b.wait().unwrap();
        }
        let passes = softiommu::hw::thread_inline_pass_cpu() - passes0;
        phase.set(STOP);
        assert!(meter.observe(&phase, n, 0));
        let raw = cpu_clock::thread() - raw0;
        let w = meter.window;
        assert_eq!(unit.stats().inline_passes, n);
        assert_eq!(w.unit, passes);
        // The thread's share is the unit's charge and the clock reads
        // around each pass.
        assert!(
            w.unit > Duration::from_nanos(unit.stats().inline_pass_cpu_ns),
            "{w:?}"
        );
        assert!(w.unit > Duration::ZERO);
        // The two parts add up to no more than the clock moved.
        assert!(w.cpu + w.unit <= raw, "{w:?} against {raw:?}");
        assert_eq!(w.count, n);
    }

    /// Some work the optimiser cannot drop, about `ms` of CPU.
    fn work(ms: u64) {
        let t0 = cpu_clock::thread();
        let mut x = 1u64;
        while cpu_clock::thread() - t0 < Duration::from_millis(ms) {
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
    }

    /// Idling inside the window burns CPU (it spins) but is left out of
    /// the window; the work around it is not.
    #[test]
    fn a_windows_cpu_leaves_out_its_idling_and_keeps_its_work() {
        let (phase, mut meter) = (Phase::default(), Meter::default());
        let raw0 = cpu_clock::thread();
        phase.set(MEASURE);
        assert!(!meter.observe(&phase, 0, 0));
        work(5);
        let due = Instant::now() + Duration::from_millis(30);
        meter.idle_until(&phase, due);
        assert!(Instant::now() >= due, "returned before its due time");
        work(5);
        phase.set(STOP);
        assert!(meter.observe(&phase, 1, 0));
        let raw = cpu_clock::thread() - raw0;
        let w = meter.window;
        assert!(meter.idle > Duration::ZERO, "the spin took no CPU");
        assert!(w.cpu >= Duration::from_millis(10), "{w:?}");
        // The idling is not in the window: the window and the idling
        // together are no more than the clock moved.
        assert!(
            w.cpu + meter.idle <= raw,
            "{w:?} + {:?} against {raw:?}",
            meter.idle
        );
    }

    /// A wait's CPU inside the window is the window's `waiting`, not its
    /// `cpu`; the work around it stays in `cpu`; a wait outside the window
    /// counts nowhere; and the wait's own result comes back.
    #[test]
    fn a_windows_waits_are_counted_apart_from_its_work() {
        let (phase, mut meter) = (Phase::default(), Meter::default());
        assert_eq!(
            meter.wait(|| {
                work(5);
                7
            }),
            7
        );
        assert_eq!(meter.waiting, Duration::ZERO, "a warm-up wait counted");
        let raw0 = cpu_clock::thread();
        phase.set(MEASURE);
        assert!(!meter.observe(&phase, 0, 0));
        work(5);
        let r: Result<u8, ()> = meter.wait(|| {
            work(20);
            Err(())
        });
        assert_eq!(r, Err(()));
        work(5);
        phase.set(STOP);
        assert!(meter.observe(&phase, 1, 0));
        let raw = cpu_clock::thread() - raw0;
        let w = meter.window;
        assert!(w.waiting >= Duration::from_millis(20), "{w:?}");
        assert!(w.cpu >= Duration::from_millis(10), "{w:?}");
        // The wait's 20 ms are not in the work's CPU (10 ms and change).
        assert!(w.cpu < Duration::from_millis(20), "{w:?}");
        assert!(w.cpu + w.waiting <= raw, "{w:?} against {raw:?}");
    }

    /// Idling before the window opens is not subtracted from it, and the
    /// conductor's next phase ends an idle wait long before its due time.
    #[test]
    fn idling_ends_at_the_next_phase_and_counts_only_inside_the_window() {
        let phase = Arc::new(Phase::default());
        let mut meter = Meter::default();
        assert!(!meter.observe(&phase, 0, 0));
        let p = Arc::clone(&phase);
        let conductor = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            p.set(MEASURE);
        });
        let t0 = Instant::now();
        meter.idle_until(&phase, t0 + Duration::from_secs(60));
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        conductor.join().unwrap();
        assert_eq!(meter.idle, Duration::ZERO, "warm-up idling counted");
        assert!(!meter.observe(&phase, 0, 0));
        phase.set(STOP);
        // Already in the next phase: returns at once.
        meter.idle_until(&phase, Instant::now() + Duration::from_secs(60));
        assert!(meter.observe(&phase, 0, 0));
    }
}

/// How long the conductor waits for a stream's first bytes at most.
pub(crate) const FLOW_WAIT: Duration = Duration::from_secs(30);

/// Waits until the receiver says the stream flows, for at most
/// [`FLOW_WAIT`]. Gives up at once (with the same `Timeout`, which the
/// caller ranks below the sides' own errors) when the receiver is gone
/// (its end of `flowing` dropped: it failed before its first bytes) or
/// `side_ended` says a side's thread has ended (the sender failed before
/// sending): a side's failure is reported as itself, not as 30 s of
/// waiting.
pub(crate) fn wait_flowing(
    flowing: &std::sync::mpsc::Receiver<()>,
    side_ended: impl Fn() -> bool,
    what: &'static str,
) -> Result<(), crate::workload::WorkloadError> {
    use std::sync::mpsc::RecvTimeoutError;
    let timeout = crate::workload::WorkloadError::Timeout {
        side: "b",
        what,
        secs: FLOW_WAIT.as_secs(),
    };
    let deadline = std::time::Instant::now() + FLOW_WAIT;
    loop {
        match flowing.recv_timeout(Duration::from_millis(20)) {
            Ok(()) => return Ok(()),
            Err(RecvTimeoutError::Disconnected) => return Err(timeout),
            Err(RecvTimeoutError::Timeout) => {
                if side_ended() || std::time::Instant::now() >= deadline {
                    return Err(timeout);
                }
            }
        }
    }
}

#[cfg(test)]
mod flow_tests {
    use super::*;
    use crate::workload::WorkloadError;
    use std::time::Instant;

    fn is_flow_timeout(r: &Result<(), WorkloadError>) -> bool {
        matches!(
            r,
            Err(WorkloadError::Timeout {
                side: "b",
                what: "first bytes",
                secs: 30
            })
        )
    }

    #[test]
    fn a_receiver_gone_before_its_first_bytes_ends_the_wait_at_once() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        drop(tx);
        let t0 = Instant::now();
        let r = wait_flowing(&rx, || false, "first bytes");
        assert!(is_flow_timeout(&r), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_side_that_ended_before_the_stream_flowed_ends_the_wait_within_a_poll() {
        let (_tx, rx) = std::sync::mpsc::channel::<()>();
        let t0 = Instant::now();
        let r = wait_flowing(&rx, || true, "first bytes");
        assert!(is_flow_timeout(&r), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    #[test]
    fn first_bytes_end_the_wait() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            tx.send(()).unwrap();
            // The receiver keeps its end: only the message ends the wait.
            std::thread::sleep(Duration::from_millis(200));
        });
        let r = wait_flowing(&rx, || false, "first bytes");
        assert!(matches!(r, Ok(())), "{r:?}");
        h.join().unwrap();
    }
}
