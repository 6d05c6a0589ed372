//! Progress of a suite on stderr: an `indicatif` spinner per scenario on a
//! terminal, plain lines otherwise (CI logs, pipes). Never on stdout, so
//! `--json` output stays one object.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// The progress display of one suite.
#[derive(Debug)]
pub struct Progress {
    tty: bool,
    total: usize,
    index: usize,
    name: String,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A display for `total` scenarios.
    pub fn new(total: usize) -> Self {
        Self {
            tty: std::io::stderr().is_terminal(),
            total,
            index: 0,
            name: String::new(),
            bar: None,
        }
    }

    /// Scenario `index` (1-based) starts.
    pub fn start(&mut self, index: usize, name: &str, about: &str) {
        // A scenario file's name and about: no escape reaches the terminal.
        let (name, about) = (
            &crate::render::printable(name),
            &crate::render::printable(about),
        );
        self.index = index;
        self.name = name.to_string();
        if self.tty {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{prefix}] {elapsed:>3} {wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_prefix(format!("{index}/{}", self.total));
            bar.set_message(format!("{name}: {about}"));
            bar.enable_steady_tick(Duration::from_millis(120));
            self.bar = Some(bar);
        } else {
            eprintln!("softiommu: [{index}/{}] {name} ...", self.total);
        }
    }

    /// A step within the running scenario.
    pub fn step(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.set_message(format!("{}: {msg}", self.name)),
            None => eprintln!(
                "softiommu: [{}/{}] {}: {msg}",
                self.index, self.total, self.name
            ),
        }
    }

    /// The running scenario finished after `secs`.
    pub fn done(&mut self, secs: f64) {
        let line = format!("{} done in {secs:.1} s", self.name);
        match self.bar.take() {
            Some(b) => {
                b.set_style(
                    ProgressStyle::with_template("✓ [{prefix}] {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                b.finish_with_message(line);
            }
            None => eprintln!("softiommu: [{}/{}] {line}", self.index, self.total),
        }
    }

    /// The running scenario stopped without a result.
    pub fn abandon(&mut self, why: &str) {
        match self.bar.take() {
            Some(b) => b.abandon_with_message(format!("{}: {why}", self.name)),
            None => eprintln!(
                "softiommu: [{}/{}] {}: {why}",
                self.index, self.total, self.name
            ),
        }
    }

    /// The running scenario could not run here (a missing guest kit): one
    /// line saying so and why, kept on screen.
    pub fn skipped(&mut self, why: &str) {
        let line = format!("{} SKIPPED: {why}", self.name);
        match self.bar.take() {
            Some(b) => b.abandon_with_message(line),
            None => eprintln!("softiommu: [{}/{}] {line}", self.index, self.total),
        }
    }
}
