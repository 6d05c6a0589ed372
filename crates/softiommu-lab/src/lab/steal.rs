//! Host steal time: how long the hypervisor kept this machine's CPUs from
//! running, from the `steal` column of `/proc/stat` (Linux
//! `Documentation/filesystems/proc.rst`). On a shared VM it explains runs
//! whose latencies (a stale window, a flush) no code of ours can bound.

use std::time::Instant;

/// Steal ticks summed over all CPUs, and the tick rate; `None` where
/// `/proc/stat` is missing or unreadable.
fn steal_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    // user nice system idle iowait irq softirq steal ...
    cpu.split_whitespace().nth(7)?.parse().ok()
}

fn ticks_per_second() -> f64 {
    // SAFETY: `sysconf` takes an integer name and touches no memory.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// A window over which steal is measured.
#[derive(Debug, Clone, Copy)]
pub struct StealWindow {
    ticks: Option<u64>,
    at: Instant,
}

impl StealWindow {
    /// Starts a window now.
    pub fn start() -> Self {
        Self {
            ticks: steal_ticks(),
            at: Instant::now(),
        }
    }

    /// Steal since the start, as a percentage of all CPUs' time over the
    /// window (`None` if unknown).
    pub fn pct(&self) -> Option<f64> {
        let (a, b) = (self.ticks?, steal_ticks()?);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let wall = self.at.elapsed().as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        let stolen = b.saturating_sub(a) as f64 / ticks_per_second();
        Some((stolen / (wall * cpus) * 100.0).clamp(0.0, 100.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_a_percentage_where_the_kernel_reports_it() {
        let w = StealWindow::start();
        std::thread::sleep(std::time::Duration::from_millis(20));
        if std::path::Path::new("/proc/stat").exists() {
            let p = w.pct().expect("Linux reports steal");
            assert!((0.0..=100.0).contains(&p), "{p}");
        }
    }
}
