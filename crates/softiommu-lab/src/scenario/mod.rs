//! Scenarios as files: a TOML file names one bench or lab and sets its
//! workload, system (policies, latency model), tunables and duration; the
//! built-in ones in `scenarios/` are what `softiommu run` uses.
//!
//! ```toml
//! name = "udp-32"                  # default: the file's stem
//! seed = "000"                     # the seed whose experiment this is
//! about = "UDP stream of 32-byte messages per DMA policy"
//!
//! [lab-netperf-udp]                # exactly one bench or lab table
//! msg_size = 32                    # workload
//! policies = ["passthrough", "strict", "deferred", "bounce"]  # policy
//! latency = "vtd-2015"             # latency model
//! flush_high_water = 256           # tunables
//! seconds = 10.0                   # duration
//!
//! [quick]                          # what `run --quick` overrides
//! seconds = 1.2
//! ```
//!
//! The lab tables are the commands' own option structs (the same names,
//! ranges and defaults as the command line), so an unknown or ill-typed
//! field is refused by the same checks, and the error names the field,
//! the file and the line.

mod builtin;
mod error;
mod file;
mod read;
mod set;

pub use builtin::{builtin, suite_builtin, BUILTIN};
pub use error::ScenarioError;
pub use file::Scenario;
