//! `softiommu`: the lab and benchmark front-end of the softiommu library.

mod bench;
mod lab;
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
}

#[derive(Debug, Subcommand)]
enum LabCmd {
    /// Seed 004: IOVA cache growth over a long storage run, per policy.
    IovaAging(lab::iova_aging::AgingArgs),
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
        Cmd::Lab(LabCmd::IovaAging(a)) => lab_aging(&a),
        Cmd::Run { json } => run_suite(json),
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

fn run_suite(json: bool) -> Result<(), String> {
    let bench_args = bench::iova::IovaBenchArgs {
        threads: 1,
        live: 4096,
        seconds: 1.0,
        rounds: 5,
        impls: Vec::new(),
        json,
    };
    let b1 = bench::iova::run(&bench_args);
    if !json {
        println!("{}", bench::iova::render(&b1));
    }
    let b2 = bench::iova::run(&bench::iova::IovaBenchArgs {
        threads: 2,
        ..bench_args
    });
    if !json {
        println!("{}", bench::iova::render(&b2));
    }
    let pg = bench::pgtable::run(&bench::pgtable::PgtableBenchArgs {
        seconds: 0.5,
        rounds: 5,
        json,
    })?;
    if !json {
        println!("{}", bench::pgtable::render(&pg));
    }
    let aging_args = lab::iova_aging::AgingArgs {
        quick: true,
        seconds: None,
        windows: 16,
        jobs: 12,
        irq_cpus: 4,
        threads: None,
        iodepth: 32,
        slow_pct: 2.0,
        slow_hold: 100_000,
        policies: Vec::new(),
        json,
    };
    let aging = lab::iova_aging::run(&aging_args, |p| {
        if !json {
            print!("{}", lab::iova_aging::render_timeline(p, 12));
        }
    })?;
    if json {
        print_json(&serde_json::json!({
            "run": "headline",
            "benches": [
                serde_json::to_value(&b1).map_err(|e| e.to_string())?,
                serde_json::to_value(&b2).map_err(|e| e.to_string())?,
                serde_json::to_value(&pg).map_err(|e| e.to_string())?,
            ],
            "labs": [aging],
        }));
    } else {
        print!("{}", lab::iova_aging::render_summary(&aging));
    }
    Ok(())
}
