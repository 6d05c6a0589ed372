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
mod lists;
mod metrics;
mod out;
mod progress;
mod registry;
mod render;
mod report;
mod scenario;
mod seeds;
mod session;
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
    Bench(registry::BenchCmd),
    /// Lab scenarios that reproduce the seeds' experiments; or
    /// `lab FILE`: run a scenario file (or a built-in scenario by name).
    Lab(LabCli),
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

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct LabCli {
    #[command(subcommand)]
    cmd: Option<registry::LabCmd>,
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

/// Prints a report: its contract object under `--json`, else its tables.
fn emit(report: LabResult<Report>, json: bool) -> LabResult<()> {
    let report = report?;
    if json {
        out::println(&render::json(&report))?;
    } else {
        out::print(&render::render_report(&report, &host::Host::detect()))?;
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

/// Runs a registered bench or lab from its command and prints it.
fn run_lab(lab: registry::LabArgs) -> LabResult<()> {
    let json = lab.json();
    emit(lab.run(&mut |_| {}), json)
}

/// Runs a scenario file, or a built-in scenario by that name.
fn lab_file(a: &LabCli, file: &std::path::Path) -> LabResult<()> {
    // A directory of a built-in scenario's name (`mkdir ring`) does not
    // hide the built-in scenario; any other directory is refused as a
    // file that cannot be read.
    let s = if file.is_dir() {
        scenario::builtin(&file.to_string_lossy()).or_else(|_| scenario::Scenario::load(file))?
    } else if file.exists() {
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
            // Written and flushed, or a refusal: help that could not be
            // written (`> /dev/full`) is no success.
            use std::io::Write;
            match e.print().and_then(|()| std::io::stdout().flush()) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!(
                        "softiommu: {}",
                        printable(&format!("cannot write to standard output: {err}"))
                    );
                    std::process::ExitCode::from(1)
                }
            }
        }
        // Clap would show the help; its first line is no refusal.
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let args: Vec<String> = std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            eprintln!("softiommu: {}", printable(&missing_subcommand(&args)));
            std::process::ExitCode::from(2)
        }
        _ => {
            eprintln!(
                "softiommu: {}",
                printable(&one_line(&e.render().to_string()))
            );
            std::process::ExitCode::from(2)
        }
    })
}

/// The refusal of a command given without its subcommand: which command
/// (followed from `args` through the subcommands named) and the ones it
/// takes.
fn missing_subcommand(args: &[String]) -> String {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut path = vec!["softiommu".to_string()];
    for a in args {
        match cmd.find_subcommand(a).cloned() {
            Some(sub) => {
                path.push(a.clone());
                cmd = sub;
            }
            None => break,
        }
    }
    let names: Vec<&str> = cmd
        .get_subcommands()
        .map(|c| c.get_name())
        .filter(|n| *n != "help")
        .collect();
    let path = path.join(" ");
    format!(
        "{path} needs a subcommand ({}); see `{path} --help`",
        names.join(", ")
    )
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

/// `msg` with every control character escaped (`\n`, `\u{1b}`): a path
/// or value given with a newline in it keeps the message on one line,
/// and escape sequences reach no terminal.
fn printable(msg: &str) -> String {
    render::printable(msg)
}

fn main() -> std::process::ExitCode {
    let cli = match parse_cli() {
        Ok(c) => c,
        Err(code) => return code,
    };
    // A measuring command runs in a session of its own (see `session`).
    if matches!(cli.cmd, Cmd::Bench(_) | Cmd::Lab(_) | Cmd::Run(_)) {
        if let Some(code) = session::enter_own() {
            return code;
        }
    }
    let res = match cli.cmd {
        Cmd::Bench(b) => run_lab(b.into()),
        Cmd::Lab(LabCli { cmd: Some(c), .. }) => run_lab(c.into()),
        Cmd::Lab(a) => match &a.file {
            Some(f) => lab_file(&a, f),
            None => {
                eprintln!(
                    "softiommu: lab needs a subcommand ({}) or a scenario FILE",
                    registry::lab_names()
                );
                return std::process::ExitCode::from(2);
            }
        },
        Cmd::Run(a) => cmd::run::run(&a),
        Cmd::History(a) => emit(cmd::history::history(&a), a.json),
        Cmd::Compare(a) => emit(cmd::compare::compare(&a), a.json),
        Cmd::Report(a) => cmd::report::report(&a).map(|id| {
            eprintln!(
                "softiommu: {}",
                printable(&format!(
                    "wrote the report of run {id} to {}",
                    a.out.display()
                ))
            );
        }),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A closed pipe (`| head -1`): the reader has what it wanted.
        Err(error::LabError::Stdout { source })
            if source.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            std::process::ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("softiommu: {}", printable(&e.to_string()));
            match e {
                error::LabError::Interrupted { .. } => std::process::ExitCode::from(130),
                error::LabError::Violations { .. }
                | error::LabError::InvalidFigures { .. }
                | error::LabError::NotStored { .. }
                | error::LabError::RunFailed { .. }
                | error::LabError::Stdout { .. } => std::process::ExitCode::from(1),
                _ => std::process::ExitCode::from(2),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            super::printable("cannot read /tmp/a\nb\r\t\u{1b}[2J: é"),
            "cannot read /tmp/a\\nb\\r\\t\\u{1b}[2J: é"
        );
    }

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
