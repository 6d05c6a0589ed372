//! What a block queue hands back for each request it completes: the
//! completion, the request's data (readable while the completion is
//! handled), and the queue's counters.

use softiommu::mem::{MemError, PhysAddr, PhysMemory, PAGE_SIZE};

use super::pattern;
use super::request::BlkOp;
use crate::spec::blk;

/// A completed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkCompletion {
    /// The slot it used.
    pub slot: u16,
    /// The operation.
    pub op: BlkOp,
    /// The first sector.
    pub sector: u64,
    /// Data bytes.
    pub len: u64,
    /// The status byte (`VIRTIO_BLK_S_*`).
    pub status: u8,
    /// The used length the device reported.
    pub used_len: u32,
}

impl BlkCompletion {
    /// Whether the device said `VIRTIO_BLK_S_OK`.
    pub fn is_ok(&self) -> bool {
        self.status == blk::S_OK
    }
}

/// A completed request's data, readable while the completion is handled.
#[derive(Debug)]
pub struct SlotData<'a> {
    pub(crate) mem: &'a PhysMemory,
    pub(crate) pages: &'a [PhysAddr],
    pub(crate) len: u64,
}

impl SlotData<'_> {
    /// Data bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the data into `buf` (at most `len` bytes; returns how many).
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, MemError> {
        let n = (buf.len() as u64).min(self.len) as usize;
        let mut done = 0usize;
        for &p in self.pages {
            if done == n {
                break;
            }
            let k = (n - done).min(PAGE_SIZE as usize);
            self.mem.read(p, &mut buf[done..done + k])?;
            done += k;
        }
        Ok(done)
    }

    /// The first byte that is not the `null` back-end's pattern for a
    /// read at disk byte `offset`, if any.
    pub fn pattern_mismatch(&self, offset: u64) -> Result<Option<u64>, MemError> {
        let mut page = [0u8; PAGE_SIZE as usize];
        let mut done = 0u64;
        for &p in self.pages {
            if done >= self.len {
                break;
            }
            let k = (self.len - done).min(PAGE_SIZE) as usize;
            self.mem.read(p, &mut page[..k])?;
            if let Some(i) = pattern::first_mismatch(offset + done, &page[..k]) {
                return Ok(Some(done + i as u64));
            }
            done += k as u64;
        }
        Ok(None)
    }
}

/// A queue's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Requests submitted.
    pub submitted: u64,
    /// Requests completed.
    pub completed: u64,
    /// Completions whose status was not `VIRTIO_BLK_S_OK`.
    pub errors: u64,
    /// `QueueNotify` writes.
    pub kicks: u64,
    /// Submissions refused for want of a slot or descriptors.
    pub full: u64,
}
