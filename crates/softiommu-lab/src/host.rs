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

/// The git revision of the working directory's checkout or, failing that,
/// of the checkout the binary sits in (`-dirty` when it has changes;
/// `unknown` outside any).
pub fn git_revision() -> String {
    let here = git_revision_in(None);
    if here != "unknown" {
        return here;
    }
    // Not run from a checkout: the checkout the binary was built in.
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| git_revision_in(Some(d))))
        .unwrap_or(here)
}

fn git_revision_in(dir: Option<&std::path::Path>) -> String {
    let run = |args: &[&str]| {
        let mut c = std::process::Command::new("git");
        if let Some(d) = dir {
            c.current_dir(d);
        }
        c.args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{rev}-dirty")
            } else {
                rev
            }
        }
        None => "unknown".to_string(),
    }
}
