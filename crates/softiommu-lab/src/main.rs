//! `softiommu`: the lab and benchmark front-end of the softiommu library.

mod args;
mod bench;
mod cmd;
mod dma_rig;
mod error;
mod host;
mod html;
mod interrupt;
mod lab;
mod metrics;
mod progress;
mod render;
mod report;
mod scenario;
mod seeds;
mod store;
mod validity;
mod workload;

use clap::{Parser, Subcommand};

use crate::error::LabResult;
use crate::report::Report;

/// The softiommu lab: benchmarks and seed-shaped experiments over the
/// softiommu library. Every bench and lab takes `--json` and then prints
/// exactly one JSON object on stdout.
#[derive(Debug, Parser)]
#[command(name = "softiommu", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once per process: the size of the biggest lab's options costs
// nothing, and boxing them would only complicate every match below.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Cmd {
    /// Micro-benchmarks, side by side with peer implementations.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Lab scenarios that reproduce the seeds' experiments; or
    /// `lab FILE`: run a scenario file (or a built-in scenario by name).
    Lab(LabArgs),
    /// The headline suite: every built-in scenario, stored, with the HTML
    /// report and a seed summary.
    Run(cmd::run::RunArgs),
    /// The runs in the results database.
    History(cmd::history::HistoryArgs),
    /// Two stored runs side by side, with ratios and changes beyond noise.
    Compare(cmd::compare::CompareArgs),
    /// Writes the HTML report of a stored run (default: the newest).
    Report(cmd::report::ReportArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// IOVA alloc+free pairs: ours vs vm-allocator, range-alloc, offset-allocator, linux-2016.
    Iova(bench::iova::IovaBenchArgs),
    /// VT-d page-table map+unmap, coherent and not (seed 003).
    Pgtable(bench::pgtable::PgtableBenchArgs),
    /// DMA map+unmap per policy, as Linux's dma_map_benchmark (seed 000).
    Dma(bench::dma::DmaBenchArgs),
    /// Device-side translation: IOTLB hits vs vm-memory's Iotlb, and walks.
    Translate(bench::translate::TranslateBenchArgs),
    /// Seed 001: a NIC ring per DMA access ordering (relaxed, ordered, full, vm-memory).
    Access(bench::access::AccessBenchArgs),
    /// Seed 000's floor: hand-built UDP frames on a bare NIC ring per DMA policy, no stack.
    Ring(bench::ring::RingArgs),
}

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct LabArgs {
    #[command(subcommand)]
    cmd: Option<LabCmd>,
    /// A scenario file (TOML, at most 1 MiB), or the name of a built-in
    /// scenario.
    file: Option<std::path::PathBuf>,
    /// Override a field: KEY=VALUE (a field of the lab table, or
    /// `name`, `seed`, `about`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Apply the scenario's `[quick]` overrides.
    #[arg(long)]
    quick: bool,
    /// Print the report's JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum LabCmd {
    /// Seed 004: IOVA cache growth over a long storage run, per policy.
    IovaAging(lab::iova_aging::AgingArgs),
    /// Seed 004 on the storage path: twelve fio jobs on virtio-blk, cost per DMA policy, aging per IOVA policy.
    FioAging(lab::fio_aging::FioAgingArgs),
    /// Seed 000: a UDP stream through smoltcp, virtio-net and two IOMMUs, per policy and ordering.
    NetperfUdp(lab::netperf_udp::NetperfArgs),
    /// Seed 003: one TCP stream through smoltcp, coherent vs non-coherent page walk, per policy.
    IperfTcp(lab::iperf_tcp::IperfTcpArgs),
    /// Seed 002: an accelerator's messages pinned vs mapped on demand (I/O page faults), per pre-map window.
    Iopf(lab::iopf::IopfArgs),
    /// Seed 001: message-passing and store-buffering litmus tests, device vs CPU.
    Litmus(lab::litmus::LitmusArgs),
    /// A soak with an independent checker and a probe of the deferred bound; any violation exits non-zero.
    Stress(lab::stress::StressArgs),
    /// The storage path through a virtio-iommu: no IOMMU, guest strict, guest lazy.
    Viommu(lab::viommu::ViommuArgs),
    /// Seed 000 in the guest's own code: a Debian guest under QEMU drives our vhost-user-blk back-end's IOTLB, strict vs lazy, beside QEMU's own virtio-blk.
    Guest(lab::guest::GuestArgs),
}

/// Prints a report: its contract object under `--json`, else its tables.
fn emit(report: LabResult<Report>, json: bool) -> LabResult<()> {
    let report = report?;
    if json {
        println!("{}", render::json(&report));
    } else {
        print!("{}", render::render_report(&report, &host::Host::detect()));
    }
    violations(&report)
}

/// A report whose contract counts violations (`lab stress`) fails the
/// command when it has any, naming the first in full; one whose figures
/// are marked invalid fails it saying why.
fn violations(report: &Report) -> LabResult<()> {
    let count = report.contract["violations"].as_u64().unwrap_or(0);
    if count == 0 {
        return match validity::invalid(report) {
            Some(why) => Err(error::LabError::InvalidFigures {
                what: report.kind.clone(),
                why,
            }),
            None => Ok(()),
        };
    }
    let first = report.contract["first_violation"]
        .as_str()
        .unwrap_or("(not recorded)")
        .to_string();
    Err(error::LabError::Violations { count, first })
}

/// Runs a scenario file, or a built-in scenario by that name.
fn lab_file(a: &LabArgs, file: &std::path::Path) -> LabResult<()> {
    let s = if file.exists() {
        scenario::Scenario::load(file)?
    } else {
        scenario::builtin(&file.to_string_lossy())?
    };
    let s = if a.quick { s.quick()? } else { s };
    let s = s.with_sets(&a.sets)?;
    emit(s.run(&mut |_| {}), a.json)
}

/// Parses the command line; a mistake is one line on stderr and exit 2.
fn parse_cli() -> Result<Cli, std::process::ExitCode> {
    use clap::error::ErrorKind;
    Cli::try_parse().map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            std::process::ExitCode::SUCCESS
        }
        _ => {
            eprintln!("softiommu: {}", one_line(&e.render().to_string()));
            std::process::ExitCode::from(2)
        }
    })
}

/// Clap's message up to its first blank line, as one line, without the
/// `error: ` prefix and the usage.
fn one_line(msg: &str) -> String {
    msg.lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
        .trim_start_matches("error: ")
        .to_string()
}

fn main() -> std::process::ExitCode {
    let cli = match parse_cli() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let res = match cli.cmd {
        Cmd::Bench(BenchCmd::Iova(a)) => emit(bench::iova::run(&a), a.json),
        Cmd::Bench(BenchCmd::Pgtable(a)) => emit(bench::pgtable::run(&a), a.json),
        Cmd::Bench(BenchCmd::Dma(a)) => emit(bench::dma::run(&a), a.json),
        Cmd::Bench(BenchCmd::Translate(a)) => emit(bench::translate::run(&a), a.json),
        Cmd::Bench(BenchCmd::Access(a)) => emit(bench::access::run(&a), a.json),
        Cmd::Bench(BenchCmd::Ring(a)) => emit(bench::ring::run(&a), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::Litmus(a)),
            ..
        }) => emit(lab::litmus::run(&a), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::Stress(a)),
            ..
        }) => emit(lab::stress::run(&a), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::Iopf(a)),
            ..
        }) => emit(lab::iopf::run(&a), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::IovaAging(a)),
            ..
        }) => emit(lab::iova_aging::run(&a, |_| {}), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::FioAging(a)),
            ..
        }) => emit(lab::fio_aging::run(&a, |_| {}), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::NetperfUdp(a)),
            ..
        }) => emit(lab::netperf_udp::run(&a), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::IperfTcp(a)),
            ..
        }) => emit(lab::iperf_tcp::run(&a), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::Viommu(a)),
            ..
        }) => emit(lab::viommu::run(&a), a.json),
        Cmd::Lab(LabArgs {
            cmd: Some(LabCmd::Guest(a)),
            ..
        }) => lab::guest::run(&a),
        Cmd::Lab(a) => match &a.file {
            Some(f) => lab_file(&a, f),
            None => {
                eprintln!("softiommu: lab needs a subcommand (iova-aging, fio-aging, netperf-udp, iperf-tcp, litmus, stress, iopf, viommu, guest) or a scenario FILE");
                return std::process::ExitCode::from(2);
            }
        },
        Cmd::Run(a) => cmd::run::run(&a),
        Cmd::History(a) => emit(cmd::history::history(&a), a.json),
        Cmd::Compare(a) => emit(cmd::compare::compare(&a), a.json),
        Cmd::Report(a) => cmd::report::report(&a).map(|id| {
            eprintln!(
                "softiommu: wrote the report of run {id} to {}",
                a.out.display()
            );
        }),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softiommu: {e}");
            match e {
                error::LabError::Interrupted { .. } => std::process::ExitCode::from(130),
                error::LabError::Violations { .. }
                | error::LabError::InvalidFigures { .. }
                | error::LabError::NotStored { .. } => std::process::ExitCode::from(1),
                _ => std::process::ExitCode::from(2),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `lab NAME` runs a subcommand when NAME is one, so a built-in
    /// scenario with a subcommand's name could never be run.
    #[test]
    fn no_builtin_scenario_is_shadowed_by_a_lab_subcommand() {
        let cli = super::Cli::command();
        let lab = cli.find_subcommand("lab").expect("lab");
        let subs: Vec<&str> = lab.get_subcommands().map(|c| c.get_name()).collect();
        assert!(subs.contains(&"iperf-tcp"), "{subs:?}");
        for (file, _) in crate::scenario::BUILTIN {
            let name = file.trim_end_matches(".toml");
            assert!(!subs.contains(&name), "scenario {name} is shadowed");
        }
    }
}
