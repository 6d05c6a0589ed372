//! How the lab measures, one copy of each, for every lab to use: CPU
//! clocks, thread pinning and the aging figure.
//!
//! - [`cpu_clock`]: the calling thread's, another live thread's
//!   (`pthread_getcpuclockid`) and the process's CPU time. The core
//!   crate's flush timer and the device crate's threads and workloads
//!   read the same clocks, so the one copy lives in the core crate
//!   (`softiommu::cpu_clock`) and is used from here.
//! - [`pinning`]: the CPUs the calling thread may run on and pinning it
//!   to one; like the clocks, one copy in the core crate
//!   (`softiommu::affinity`, whose flush timer pins itself with it), used
//!   by the device crate and from here.
//! - [`aging`]: seed `004`'s aging figure as both aging labs report it,
//!   on work per CPU-second with the wall-clock figure beside it.
//!
//! The spreads over rounds and the checks of what a policy must cost are
//! `lab::policy_physics`.

pub mod aging;
pub use softiommu_virtio::affinity as pinning;
pub use softiommu_virtio::cpu_clock;

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every `.rs` file under `dir`, with its text.
    fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push((
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                ));
            }
        }
    }

    #[test]
    fn the_lab_reads_cpu_clocks_from_one_place_and_labs_share_through_metrics() {
        let mut files = Vec::new();
        sources(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        assert!(files.len() > 20, "{}", files.len());
        let call = ["clock", "_gettime("].concat();
        for (path, text) in &files {
            assert!(!text.contains(&call), "{path} reads a clock of its own");
        }
        // The other crates of the workspace too: one wrapper, the core's.
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut others = Vec::new();
        for krate in ["softiommu", "softiommu-virtio", "softiommu-vhost"] {
            sources(&crates.join(krate).join("src"), &mut others);
        }
        let readers: Vec<&String> = others
            .iter()
            .filter(|(_, t)| t.contains(&call))
            .map(|(p, _)| p)
            .collect();
        assert_eq!(readers.len(), 1, "{readers:?}");
        assert!(
            readers[0].ends_with("softiommu/src/cpu_clock.rs"),
            "{readers:?}"
        );
        for (name, imports) in [("iova_aging", "fio_aging"), ("fio_aging", "iova_aging")] {
            // A lab is one file or a folder of them.
            let text: String = files
                .iter()
                .filter(|(p, _)| {
                    p.ends_with(&format!("lab/{name}.rs")) || p.contains(&format!("lab/{name}/"))
                })
                .map(|(_, t)| t.as_str())
                .collect();
            assert!(!text.is_empty(), "{name} has no source");
            assert!(
                !text.contains(&format!("crate::lab::{imports}")),
                "{name} imports from {imports}"
            );
            assert!(text.contains("crate::metrics::aging"), "{name}");
        }
    }
}
