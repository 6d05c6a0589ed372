//! `softiommu`: the lab and benchmark front-end of the softiommu library.

mod args;
mod bench;
mod dma_rig;
mod error;
mod host;
mod lab;
mod render;
mod report;
mod run;
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

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Micro-benchmarks, side by side with peer implementations.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Lab scenarios that reproduce the seeds' experiments.
    #[command(subcommand)]
    Lab(LabCmd),
    /// The headline suite: every bench and lab in its quick form.
    Run {
        /// Print one JSON object holding every report.
        #[arg(long)]
        json: bool,
    },
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
}

#[derive(Debug, Subcommand)]
enum LabCmd {
    /// Seed 004: IOVA cache growth over a long storage run, per policy.
    IovaAging(lab::iova_aging::AgingArgs),
    /// Seed 000: a UDP stream through a NIC ring, per DMA policy.
    NetperfUdp(lab::netperf_udp::NetperfArgs),
    /// Seed 001: message-passing and store-buffering litmus tests, device vs CPU.
    Litmus(lab::litmus::LitmusArgs),
}

/// Prints a report: its contract object under `--json`, else its tables.
fn emit(report: LabResult<Report>, json: bool) -> LabResult<()> {
    let report = report?;
    if json {
        println!("{}", render::json(&report));
    } else {
        print!("{}", render::render_report(&report, &host::Host::detect()));
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Bench(BenchCmd::Iova(a)) => emit(bench::iova::run(&a), a.json),
        Cmd::Bench(BenchCmd::Pgtable(a)) => emit(bench::pgtable::run(&a), a.json),
        Cmd::Bench(BenchCmd::Dma(a)) => emit(bench::dma::run(&a), a.json),
        Cmd::Bench(BenchCmd::Translate(a)) => emit(bench::translate::run(&a), a.json),
        Cmd::Bench(BenchCmd::Access(a)) => emit(bench::access::run(&a), a.json),
        Cmd::Lab(LabCmd::Litmus(a)) => emit(lab::litmus::run(&a), a.json),
        Cmd::Lab(LabCmd::IovaAging(a)) => emit(lab::iova_aging::run(&a, |_| {}), a.json),
        Cmd::Lab(LabCmd::NetperfUdp(a)) => emit(lab::netperf_udp::run(&a), a.json),
        Cmd::Run { json } => run::run(json),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softiommu: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
