//! `softiommu`: the lab and benchmark front-end of the softiommu library.

mod bench;
mod dma_rig;
mod lab;
mod run;
mod table;
mod workload;

use clap::{Parser, Subcommand};

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
    /// Seed 000's floor: hand-built frames on a bare descriptor ring, no stack (the old lab netperf-udp).
    Ring(bench::ring::RingArgs),
}

#[derive(Debug, Subcommand)]
enum LabCmd {
    /// Seed 004: IOVA cache growth over a long storage run, per policy.
    IovaAging(lab::iova_aging::AgingArgs),
    /// Seed 000: a UDP stream through smoltcp, virtio-net and two IOMMUs, per policy and ordering.
    NetperfUdp(lab::udp_stream::NetperfUdpArgs),
    /// Seed 003: one TCP stream, coherent vs non-coherent page walk, strict vs deferred.
    IperfTcp(lab::iperf_tcp::IperfTcpArgs),
    /// Seed 001: message-passing and store-buffering litmus tests, device vs CPU.
    Litmus(lab::litmus::LitmusArgs),
}

fn print_json<T: serde::Serialize>(v: &T) {
    println!("{}", serde_json::to_string(v).expect("reports serialise"));
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Bench(BenchCmd::Iova(a)) => {
            let r = bench::iova::run(&a);
            if a.json {
                print_json(&r);
            } else {
                print!("{}", bench::iova::render(&r));
            }
            Ok(())
        }
        Cmd::Bench(BenchCmd::Pgtable(a)) => bench::pgtable::run(&a).map(|r| {
            if a.json {
                print_json(&r);
            } else {
                print!("{}", bench::pgtable::render(&r));
            }
        }),
        Cmd::Bench(BenchCmd::Dma(a)) => bench::dma::run(&a).map(|r| {
            if a.json {
                print_json(&r);
            } else {
                print!("{}", bench::dma::render(&r));
            }
        }),
        Cmd::Bench(BenchCmd::Translate(a)) => bench::translate::run(&a).map(|r| {
            if a.json {
                print_json(&r);
            } else {
                print!("{}", bench::translate::render(&r));
            }
        }),
        Cmd::Bench(BenchCmd::Access(a)) => bench::access::run(&a).map(|r| {
            if a.json {
                print_json(&r);
            } else {
                print!("{}", bench::access::render(&r));
            }
        }),
        Cmd::Lab(LabCmd::Litmus(a)) => lab::litmus::run(&a).map(|r| {
            if a.json {
                print_json(&r);
            } else {
                print!("{}", lab::litmus::render(&r));
            }
        }),
        Cmd::Lab(LabCmd::IovaAging(a)) => lab_aging(&a),
        Cmd::Bench(BenchCmd::Ring(a)) => bench::ring::run(&a).map(|(v, text)| {
            if a.json {
                print_json(&v);
            } else {
                print!("{text}");
            }
        }),
        Cmd::Lab(LabCmd::NetperfUdp(a)) => lab::udp_stream::run(&a).map(|r| {
            if a.json {
                print_json(&r);
            } else {
                print!("{}", lab::udp_stream::render(&r));
            }
        }),
        Cmd::Lab(LabCmd::IperfTcp(a)) => lab::iperf_tcp::run(&a).map(|r| {
            if a.json {
                print_json(&r);
            } else {
                print!("{}", lab::iperf_tcp::render(&r));
            }
        }),
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

fn lab_aging(a: &lab::iova_aging::AgingArgs) -> Result<(), String> {
    use lab::iova_aging::{render_summary, render_timeline, run};
    let r = run(a, |p| {
        if !a.json {
            print!("{}", render_timeline(p, a.jobs));
        }
    })?;
    if a.json {
        print_json(&r);
    } else {
        print!("{}", render_summary(&r));
    }
    Ok(())
}
