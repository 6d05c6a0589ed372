//! The lab's errors: one enum, each variant carrying the facts a user needs
//! to act, shown by `main` as one line.

use std::path::PathBuf;

use crate::lab::litmus::harness::LitmusError;
use softiommu::access::AccessError;
use softiommu::dma::DmaError;
use softiommu::hw::{HwError, QiError, TranslateError};
use softiommu::iova::IovaError;
use softiommu::mem::MemError;
use softiommu::pgtable::PgtableError;

/// The library's one error (a [`Platform`](softiommu::Platform) build's,
/// say) filed under the lab's variant for its layer.
impl From<softiommu::Error> for LabError {
    fn from(e: softiommu::Error) -> Self {
        use softiommu::Error as E;
        match e {
            E::Mem(e) => Self::Mem(e),
            E::Iova(e) => Self::Iova(e),
            E::Pgtable(e) => Self::Pgtable(e),
            E::Hw(e) => Self::Hw(e),
            E::Queue(e) => Self::Queue(e),
            E::Translate(e) => Self::Translate(e),
            E::Dma(e) => Self::Dma(e),
            E::Access(e) => Self::Access(e),
            E::Iopf(e) => Self::Iopf(e),
        }
    }
}

/// Everything that can stop a bench, a lab, the suite, or a results command.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The memory arena refused a request.
    #[error("memory: {0}")]
    Mem(#[from] MemError),
    /// The IOVA allocator refused a request.
    #[error("IOVA allocator: {0}")]
    Iova(#[from] IovaError),
    /// The page table refused a request.
    #[error("page table: {0}")]
    Pgtable(#[from] PgtableError),
    /// The IOMMU unit refused a request.
    #[error("IOMMU unit: {0}")]
    Hw(#[from] HwError),
    /// The unit's invalidation queue refused a request.
    #[error("invalidation queue: {0}")]
    Queue(#[from] QiError),
    /// A device-side translation failed where the workload expected a mapping.
    #[error("translation: {0}")]
    Translate(#[from] TranslateError),
    /// The DMA API refused a request.
    #[error("DMA API: {0}")]
    Dma(#[from] DmaError),
    /// On-demand mapping (a page-fault domain or handler) refused.
    #[error("I/O page faults: {0}")]
    Iopf(#[from] softiommu::iopf::IopfError),
    /// A device-side access failed.
    #[error("DMA access: {0}")]
    Access(#[from] AccessError),
    /// An access through vm-memory's `IommuMemory` failed.
    #[error("vm-memory: {0}")]
    VmMemory(#[from] vm_memory::GuestMemoryError),
    /// A litmus test could not run.
    #[error("litmus: {0}")]
    Litmus(#[from] LitmusError),
    /// A workload thread panicked (a bug; its message went to stderr).
    #[error("the {what} thread panicked")]
    ThreadPanicked {
        /// Which thread.
        what: &'static str,
    },
    /// A device posted a descriptor longer than its buffer.
    #[error("descriptor {index} names {len} bytes, more than the {max}-byte buffer")]
    DescriptorTooLong {
        /// Ring slot.
        index: u64,
        /// Length in the descriptor.
        len: usize,
        /// Buffer bytes.
        max: usize,
    },
    /// A measurement tool (callgrind) could not give its figure.
    #[error("measure: {0}")]
    Measure(String),
    /// A network workload (two hosts, virtio-net, smoltcp) failed.
    #[error("{run}: {source}")]
    Workload {
        /// Which run (lab, policy, mode).
        run: String,
        /// What failed.
        source: softiommu_virtio::workload::WorkloadError,
    },
    /// A storage workload (virtio-blk, the fio engine) refused its settings
    /// or failed.
    #[error("{run}: {source}")]
    Fio {
        /// Which run (lab, policy).
        run: String,
        /// What failed.
        source: softiommu_virtio::workload::fio::FioError,
    },
    /// A time line had no aging figure (too few windows, no throughput).
    #[error("{run}: aging figure: {source}")]
    Aging {
        /// Which run.
        run: String,
        /// Why.
        source: softiommu_virtio::workload::aging::AgingError,
    },
    /// A stream's receiver did not get exactly what its sender sent.
    #[error("{run}: received data does not match what was sent ({received} of {sent} bytes)")]
    StreamMismatch {
        /// Which run.
        run: String,
        /// Bytes sent.
        sent: u64,
        /// Bytes received.
        received: u64,
    },
    /// The stress lab's checker found accesses the policy does not permit.
    #[error("{count} violation(s); the first: {first}")]
    Violations {
        /// How many.
        count: u64,
        /// The first offending access, in full.
        first: String,
    },
    /// A workload's setup was inconsistent (a bug in the lab).
    #[error("lab set-up: {0}")]
    Setup(&'static str),
    /// A list option (or the same field of a scenario table) names a
    /// value twice: each value is run, and reported, once.
    #[error("{option} names {value} more than once; a list takes each value once")]
    ListRepeats {
        /// The option, as on the command line.
        option: String,
        /// The repeated value.
        value: String,
    },
    /// A list option holds more values than any run needs.
    #[error("{option} has {len} values, more than the {max} a list takes")]
    ListTooLong {
        /// The option, as on the command line.
        option: String,
        /// How many were given.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// A scenario file or override is wrong.
    #[error(transparent)]
    Scenario(#[from] crate::scenario::ScenarioError),
    /// The results database refused a request.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An output file names the results database (by any path: the same
    /// name, a link, a relative path); nothing was written.
    #[error("refusing to write {out} ({flag}): it is the results database {db} (or its journal); nothing was written, choose another {flag}")]
    OutputIsDatabase {
        /// The option that named it.
        flag: &'static str,
        /// The output path as given.
        out: PathBuf,
        /// The database as given.
        db: PathBuf,
    },
    /// Standard output could not be written (a full disk, a closed pipe);
    /// a closed pipe (`| head -1`) ends the command quietly, exit 1.
    #[error("cannot write to standard output: {source}")]
    Stdout {
        /// Why.
        source: std::io::Error,
    },
    /// A `run` finished, but scenarios failed or could not be stored:
    /// the rest ran, what finished is stored and printed.
    #[error("run {run_id}: {failed}; {rest}")]
    RunFailed {
        /// The run.
        run_id: i64,
        /// The scenarios that failed or were not stored, each with why.
        failed: String,
        /// What became of the rest, the report and the run's row.
        rest: String,
    },
    /// `compare` of two runs that share no scenario: no figure of one
    /// has a counterpart in the other (the wrong run ids, say).
    #[error("runs {a} and {b} share no scenario, so no figure can be compared (run {a}: {a_scenarios}; run {b}: {b_scenarios})")]
    NothingInCommon {
        /// The earlier run.
        a: i64,
        /// The later run.
        b: i64,
        /// The earlier run's scenarios.
        a_scenarios: String,
        /// The later run's scenarios.
        b_scenarios: String,
    },
    /// An output path exists and is not a regular file (a FIFO, a device,
    /// a socket): opening a FIFO to write would block until a reader came,
    /// and a report is written by renaming a new file over its path.
    #[error("refusing to write {out} ({flag}): it is {kind}, not a regular file; nothing was written, choose another {flag}")]
    OutputNotAFile {
        /// The option that named it.
        flag: &'static str,
        /// The output path as given.
        out: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Figures were printed but do not measure what they claim (I/O
    /// errors, wrong data); the report marks them `"valid": false`.
    #[error("{what}: the figures above are invalid: {why}")]
    InvalidFigures {
        /// The lab or run.
        what: String,
        /// Why.
        why: String,
    },
    /// A suite ran but the database refused some of its writes (held by
    /// another process for longer than the write wait); the figures were
    /// printed.
    #[error("{why}: {lost}; {row}")]
    NotStored {
        /// What the database did: held past the wait, or its error.
        why: String,
        /// What was not stored: the run's scenarios by name, or only
        /// its status.
        lost: String,
        /// What became of the run's row.
        row: &'static str,
    },
    /// The run was interrupted (Ctrl-C); what finished is kept.
    #[error("interrupted: run {run_id} kept {kept} finished scenario(s) in {db}, {row}")]
    Interrupted {
        /// The run.
        run_id: i64,
        /// Scenarios stored.
        kept: usize,
        /// The database.
        db: PathBuf,
        /// What became of the run's row: "marked partial", or why not.
        row: &'static str,
    },
    /// A real-guest run (`lab guest`) could not be set up or gave no result.
    #[error("guest: {0}")]
    Guest(#[from] softiommu_vhost::guest::GuestError),
}

/// The lab's result type.
pub type LabResult<T> = Result<T, LabError>;

/// Joins a thread, turning a panic into [`LabError::ThreadPanicked`].
pub fn join<T>(h: std::thread::JoinHandle<T>, what: &'static str) -> LabResult<T> {
    h.join().map_err(|_| LabError::ThreadPanicked { what })
}
