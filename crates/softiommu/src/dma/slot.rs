//! What a domain keeps of each CPU that maps and unmaps: read by the domain
//! (flushes, statistics, the policy gate), written by the CPU's handle.

use super::flush_queue::FlushQueue;
use super::gate::ActiveFlag;
use super::passthrough::PtRecord;
use super::stats::CpuStats;

/// What a domain keeps of each CPU: the flag its map/unmap raise while
/// they run (a policy switch waits on it, see [`super::gate`]), its flush
/// queue, its pass-through mappings, its counters.
#[derive(Debug)]
pub(crate) struct CpuSlot {
    pub(crate) active: ActiveFlag,
    pub(crate) fq: FlushQueue,
    pub(crate) passthrough: PtRecord,
    pub(crate) stats: CpuStats,
}

impl CpuSlot {
    pub(crate) fn new(fq_size: usize) -> Self {
        Self {
            active: ActiveFlag::default(),
            fq: FlushQueue::new(fq_size),
            passthrough: PtRecord::default(),
            stats: CpuStats::default(),
        }
    }
}
