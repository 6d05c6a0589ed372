//! The one list of benches and labs. Each is named here once — its
//! command (`bench NAME`, `lab NAME`), its scenario table (`[bench-NAME]`,
//! `[lab-NAME]`), its option struct, its help line and how it runs — and
//! the command line, the scenario file's schema, `--set` and the scenario
//! runner all follow from that one entry. Adding a lab is one entry here
//! plus its folder.
//!
//! Every entry's options are a `clap::Args` + serde struct with a `json`
//! flag, and every entry measures and renders into one [`Report`] — `lab
//! guest` too, which drives an external guest and reports itself skipped,
//! in one line, where the guest kit is missing (see `lab/guest.rs`).

use serde::{Deserialize, Serialize};

use crate::error::LabResult;
use crate::report::Report;

/// Writes the registry's types from its entries: the `bench` and `lab`
/// subcommand enums, [`LabArgs`] (one variant per entry), the scenario
/// file's schema ([`ScenarioFile`]) and [`LAB_TABLES`].
macro_rules! registry {
    (
        bench { $( $bcli:tt, $btable:tt, $bvar:ident, $bargs:ty, $bhelp:tt, $brun:expr; )* }
        lab { $( $lcli:tt, $ltable:tt, $lvar:ident, $largs:ty, $lhelp:tt, $lrun:expr; )* }
    ) => {
        /// `softiommu bench NAME`.
        // The variants share `LabArgs`'s names, where the prefix tells a
        // bench from a lab.
        #[allow(clippy::enum_variant_names)]
        #[derive(Debug, clap::Subcommand)]
        pub enum BenchCmd {
            $( #[doc = $bhelp] #[command(name = $bcli)] $bvar($bargs), )*
        }

        /// `softiommu lab NAME` for every registered lab.
        // Parsed once per process: boxing the biggest lab's options would
        // only complicate every match.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, clap::Subcommand)]
        pub enum LabCmd {
            $( #[doc = $lhelp] #[command(name = $lcli)] $lvar($largs), )*
        }

        /// A bench or lab with its options: what a command or a scenario
        /// runs.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, Clone)]
        pub enum LabArgs {
            $( #[doc = concat!("`[", $btable, "]`")] $bvar($bargs), )*
            $( #[doc = concat!("`[", $ltable, "]`")] $lvar($largs), )*
        }

        impl From<BenchCmd> for LabArgs {
            fn from(c: BenchCmd) -> Self {
                match c { $( BenchCmd::$bvar(a) => LabArgs::$bvar(a), )* }
            }
        }

        impl From<LabCmd> for LabArgs {
            fn from(c: LabCmd) -> Self {
                match c { $( LabCmd::$lvar(a) => LabArgs::$lvar(a), )* }
            }
        }

        impl LabArgs {
            /// Runs it; `progress` hears of steps within a long lab.
            pub fn run(&self, progress: &mut dyn FnMut(&str)) -> LabResult<Report> {
                match self {
                    $( LabArgs::$bvar(a) => crate::lists::check_lists(a)?, )*
                    $( LabArgs::$lvar(a) => crate::lists::check_lists(a)?, )*
                }
                match self {
                    $( LabArgs::$bvar(a) => ($brun)(a, progress), )*
                    $( LabArgs::$lvar(a) => ($lrun)(a, progress), )*
                }
            }

            /// Whether the command asked for its JSON object.
            pub fn json(&self) -> bool {
                match self {
                    $( LabArgs::$bvar(a) => a.json, )*
                    $( LabArgs::$lvar(a) => a.json, )*
                }
            }
        }

        /// The table names a scenario may use, in the registry's order.
        pub const LAB_TABLES: &[&str] = &[ $( $btable, )* $( $ltable, )* ];

        /// A scenario file as written: a header and exactly one bench or
        /// lab table (whose fields are that command's options).
        #[allow(non_snake_case)]
        #[derive(Debug, Clone, Default, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct ScenarioFile {
            /// The scenario's name (default: the file's stem).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub name: Option<String>,
            /// The seed it reproduces.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub seed: Option<String>,
            /// What it is.
            #[serde(default)]
            pub about: String,
            $(
                #[doc = concat!("`[", $btable, "]`")]
                #[serde(rename = $btable, default, skip_serializing_if = "Option::is_none")]
                pub $bvar: Option<$bargs>,
            )*
            $(
                #[doc = concat!("`[", $ltable, "]`")]
                #[serde(rename = $ltable, default, skip_serializing_if = "Option::is_none")]
                pub $lvar: Option<$largs>,
            )*
            /// Overrides `run --quick` applies, as `--set`s of the lab table.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub quick: Option<toml::Table>,
        }

        impl ScenarioFile {
            /// The bench and lab tables present, in the registry's order.
            pub fn tables(&self) -> Vec<&'static str> {
                let mut v = Vec::new();
                $( if self.$bvar.is_some() { v.push($btable); } )*
                $( if self.$lvar.is_some() { v.push($ltable); } )*
                v
            }

            /// The first bench or lab table present, with its options.
            pub fn lab(&self) -> Option<LabArgs> {
                $( if let Some(a) = &self.$bvar { return Some(LabArgs::$bvar(a.clone())); } )*
                $( if let Some(a) = &self.$lvar { return Some(LabArgs::$lvar(a.clone())); } )*
                None
            }
        }
    };
}

registry! {
    bench {
        "iova", "bench-iova", BenchIova, crate::bench::iova::IovaBenchArgs,
            "IOVA alloc+free pairs: ours vs vm-allocator, range-alloc, offset-allocator, linux-2016.",
            |a, _| crate::bench::iova::run(a);
        "pgtable", "bench-pgtable", BenchPgtable, crate::bench::pgtable::PgtableBenchArgs,
            "VT-d page-table map+unmap, coherent and not (seed 003).",
            |a, _| crate::bench::pgtable::run(a);
        "dma", "bench-dma", BenchDma, crate::bench::dma::DmaBenchArgs,
            "DMA map+unmap per policy, as Linux's dma_map_benchmark (seed 000).",
            |a, _| crate::bench::dma::run(a);
        "translate", "bench-translate", BenchTranslate, crate::bench::translate::TranslateBenchArgs,
            "Device-side translation: IOTLB hits vs vm-memory's Iotlb, and walks.",
            |a, _| crate::bench::translate::run(a);
        "access", "bench-access", BenchAccess, crate::bench::access::AccessBenchArgs,
            "Seed 001: a NIC ring per DMA access ordering (relaxed, ordered, full, vm-memory).",
            |a, _| crate::bench::access::run(a);
        "ring", "bench-ring", BenchRing, crate::bench::ring::RingArgs,
            "Seed 000's floor: hand-built UDP frames on a bare NIC ring per DMA policy, no stack.",
            |a, _| crate::bench::ring::run(a);
    }
    lab {
        "netperf-udp", "lab-netperf-udp", NetperfUdp, crate::lab::netperf_udp::NetperfArgs,
            "Seed 000: a UDP stream through smoltcp, virtio-net and two IOMMUs, per policy and ordering.",
            |a, _| crate::lab::netperf_udp::run(a);
        "iperf-tcp", "lab-iperf-tcp", IperfTcp, crate::lab::iperf_tcp::IperfTcpArgs,
            "Seed 003: one TCP stream through smoltcp, coherent vs non-coherent page walk, per policy.",
            |a, _| crate::lab::iperf_tcp::run(a);
        "iova-aging", "lab-iova-aging", IovaAging, crate::lab::iova_aging::AgingArgs,
            "Seed 004: IOVA cache growth over a long storage run, per policy.",
            |a, p| crate::lab::iova_aging::run(a, p);
        "fio-aging", "lab-fio-aging", FioAging, crate::lab::fio_aging::FioAgingArgs,
            "Seed 004 on the storage path: twelve fio jobs on virtio-blk, cost per DMA policy, aging per IOVA policy.",
            |a, p| crate::lab::fio_aging::run(a, p);
        "litmus", "lab-litmus", Litmus, crate::lab::litmus::LitmusArgs,
            "Seed 001: message-passing and store-buffering litmus tests, device vs CPU.",
            |a, _| crate::lab::litmus::run(a);
        "stress", "lab-stress", Stress, crate::lab::stress::StressArgs,
            "A soak with an independent checker and a probe of the deferred bound; any violation exits non-zero.",
            |a, _| crate::lab::stress::run(a);
        "iopf", "lab-iopf", Iopf, crate::lab::iopf::IopfArgs,
            "Seed 002: an accelerator's messages pinned vs mapped on demand (I/O page faults), per pre-map window.",
            |a, _| crate::lab::iopf::run(a);
        "viommu", "lab-viommu", Viommu, crate::lab::viommu::ViommuArgs,
            "The storage path through a virtio-iommu: no IOMMU, guest strict, guest lazy.",
            |a, _| crate::lab::viommu::run(a);
        "guest", "lab-guest", Guest, crate::lab::guest::GuestArgs,
            "Seed 000 in the guest's own code: a Debian guest under QEMU drives our vhost-user-blk and -net back-ends' IOTLB, strict vs lazy, beside QEMU's own virtio-blk (skipped, in one line, without the guest kit).",
            |a, p| crate::lab::guest::run(a, p);
    }
}

/// The names `lab NAME` accepts, for messages.
pub fn lab_names() -> String {
    use clap::CommandFactory;
    #[derive(Debug, clap::Parser)]
    struct Probe {
        #[command(subcommand)]
        cmd: LabCmd,
    }
    Probe::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every registered entry is reachable three ways — its command, its
    /// scenario table and `LabArgs` — and they agree on its name.
    #[test]
    fn every_entry_has_a_command_a_table_and_runs_from_a_scenario() {
        let names = lab_names();
        for t in LAB_TABLES {
            let (kind, name) = t.split_once('-').expect("bench-NAME or lab-NAME");
            assert!(kind == "bench" || kind == "lab", "{t}");
            if kind == "lab" {
                assert!(names.split(", ").any(|n| n == name), "{t} not in {names}");
            }
            let text = format!("[{t}]\n");
            let f: ScenarioFile = toml::from_str(&text).expect(t);
            assert_eq!(f.tables(), vec![*t]);
            assert!(f.lab().is_some(), "{t}");
        }
        assert!(names.split(", ").any(|n| n == "guest"), "{names}");
        assert!(LAB_TABLES.contains(&"lab-guest"), "{LAB_TABLES:?}");
    }
}
