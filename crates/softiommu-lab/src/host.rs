//! Facts about the machine a run happened on: every table names its host,
//! and the database stores them with each run.

use serde::{Deserialize, Serialize};

/// The host a run happened on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// Host name.
    pub hostname: String,
    /// CPU model (`/proc/cpuinfo`'s `model name`), or the architecture.
    pub cpu_model: String,
    /// CPUs this process may use.
    pub cores: u32,
    /// Kernel release (`uname -r`).
    pub kernel: String,
}

impl Host {
    /// The facts of this machine; what cannot be read is `"unknown"`.
    pub fn detect() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let cpu_model = read("/proc/cpuinfo")
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        Self {
            hostname: read("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|| "unknown".into()),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            kernel: read("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|| "unknown".into()),
        }
    }

    /// One line: "CPU model, N cores, Linux kernel".
    pub fn line(&self) -> String {
        format!(
            "{}, {} core(s), kernel {}",
            self.cpu_model, self.cores, self.kernel
        )
    }
}

/// The git revision the binary was built from (`-dirty` when its tracked
/// files differed from it then; `unknown` when built outside a checkout),
/// set by the build script: never the checkout of the directory a run is
/// started from.
pub fn git_revision() -> String {
    option_env!("SOFTIOMMU_GIT_REV")
        .unwrap_or("unknown")
        .to_string()
}
