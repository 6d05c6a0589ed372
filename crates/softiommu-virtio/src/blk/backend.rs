//! Where a block device's data lives: [`BlkBackend`], and the three our
//! devices come with — `null` (completes at once; reads return the
//! [`pattern`](super::pattern) of their sectors, writes are dropped, like
//! Linux's `null_blk`), `memory` (a RAM disk) and `file` (a regular file
//! through `pread`/`pwrite`, optionally `O_DIRECT`).
//!
//! A back-end is shared by the device's threads: its calls take `&self`
//! and may run concurrently. The device checks every range against the
//! capacity before it calls; a back-end still refuses one past its end
//! (an `io::Error`, never a panic).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::pattern;
use crate::spec::blk::SECTOR_SIZE;

/// A block device's storage. Offsets and lengths are in bytes; the device
/// only calls with ranges inside [`capacity`](Self::capacity), aligned to
/// its block size.
pub trait BlkBackend: Send + Sync + fmt::Debug {
    /// The back-end's kind, as reports spell it ("null", "memory", "file").
    fn kind(&self) -> &'static str;
    /// Bytes of storage (a multiple of 512).
    fn capacity(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset` into `buf`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` at `offset`.
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable (`VIRTIO_BLK_T_FLUSH`).
    fn flush(&self) -> io::Result<()>;
    /// The alignment the back-end needs of the buffers it is given (1 for
    /// most; the page size for `O_DIRECT`).
    fn buffer_align(&self) -> usize {
        1
    }
    /// The alignment, in bytes, the back-end needs of every offset and
    /// length it is given: 512 (any sector) for most; for `O_DIRECT`,
    /// [`DIRECT_ALIGN`] (the device refuses a request off it, as it has
    /// no read-modify-write).
    fn io_align(&self) -> u32 {
        512
    }
    /// Whether a call may wait on something outside the process (a disk,
    /// a socket, a lock another thread holds for long): the device then
    /// never holds a translation section of its unit across the call,
    /// since every invalidation wait on the unit would wait for it.
    /// `true` unless the back-end overrides it: a back-end that blocks and
    /// says it does not would stall every driver's unmap behind its I/O,
    /// while one that does not block and says it does only costs one
    /// section per request instead of one per batch.
    fn blocks(&self) -> bool {
        true
    }
}

/// The largest `null` disk: 2^50 bytes (1 PiB), far past any run, with
/// every sector number still exact in the pattern.
pub const MAX_NULL_CAPACITY: u64 = 1 << 50;
/// The largest `memory` disk: 64 GiB of address space (touched pages only
/// take memory).
pub const MAX_MEMORY_CAPACITY: u64 = 64 << 30;
/// The alignment `O_DIRECT` buffers get: a page, which every Linux file
/// system accepts.
pub const DIRECT_ALIGN: usize = 4096;

/// Which back-end to open, and how large.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    /// `null`: `capacity` bytes that read as the pattern; writes dropped.
    Null {
        /// Bytes (a multiple of 512, at most [`MAX_NULL_CAPACITY`]).
        capacity: u64,
    },
    /// `memory`: a RAM disk of `capacity` bytes, zeroed.
    Memory {
        /// Bytes (a multiple of 512, at most [`MAX_MEMORY_CAPACITY`]).
        capacity: u64,
    },
    /// `file`: an existing regular file, opened read-write.
    File {
        /// Its path.
        path: PathBuf,
        /// Open with `O_DIRECT` (the page cache bypassed; the file system
        /// must support it, and requests must be aligned to its block
        /// size: use a `blk_size` of 4096 to be safe).
        direct: bool,
        /// Bytes to use (the file must be at least this long); `None`:
        /// the file's length rounded down to 512.
        size: Option<u64>,
    },
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig::Null { capacity: 1 << 40 }
    }
}

/// Why a back-end could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// A capacity of zero, not a multiple of 512, or past the kind's limit.
    #[error("{kind} capacity {capacity} bytes is not a non-zero multiple of 512 up to {max}")]
    BadCapacity {
        /// "null", "memory" or "file".
        kind: &'static str,
        /// The capacity asked for.
        capacity: u64,
        /// The kind's limit.
        max: u64,
    },
    /// The file could not be opened (or inspected).
    #[error("cannot open {path}: {reason}")]
    Open {
        /// The path.
        path: PathBuf,
        /// The OS's reason.
        reason: String,
    },
    /// The path is not a regular file.
    #[error("{path} is not a regular file")]
    NotRegularFile {
        /// The path.
        path: PathBuf,
    },
    /// The file is shorter than asked for, or than one sector.
    #[error("{path} holds {len} bytes, needs at least {needed}")]
    TooSmall {
        /// The path.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// What was needed.
        needed: u64,
    },
    /// The RAM disk's memory could not be had.
    #[error("cannot map {capacity} bytes for the RAM disk: {reason}")]
    Memory {
        /// The capacity.
        capacity: u64,
        /// The reason.
        reason: String,
    },
}

impl BackendConfig {
    /// The back-end's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendConfig::Null { .. } => "null",
            BackendConfig::Memory { .. } => "memory",
            BackendConfig::File { .. } => "file",
        }
    }

    /// Opens it.
    pub fn open(&self) -> Result<Arc<dyn BlkBackend>, BackendError> {
        let check = |kind, capacity: u64, max| {
            if capacity == 0 || !capacity.is_multiple_of(SECTOR_SIZE) || capacity > max {
                Err(BackendError::BadCapacity {
                    kind,
                    capacity,
                    max,
                })
            } else {
                Ok(())
            }
        };
        match self {
            BackendConfig::Null { capacity } => {
                check("null", *capacity, MAX_NULL_CAPACITY)?;
                Ok(Arc::new(NullBackend {
                    capacity: *capacity,
                }))
            }
            BackendConfig::Memory { capacity } => {
                check("memory", *capacity, MAX_MEMORY_CAPACITY)?;
                Ok(Arc::new(MemoryBackend::new(*capacity)?))
            }
            BackendConfig::File { path, direct, size } => {
                Ok(Arc::new(FileBackend::open(path, *direct, *size)?))
            }
        }
    }
}

fn past_end(offset: u64, len: usize, capacity: u64) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{len} bytes at {offset} are past the end ({capacity})"),
        )),
    }
}

/// `null`: reads return the pattern, writes and flushes do nothing.
#[derive(Debug, Clone, Copy)]
pub struct NullBackend {
    capacity: u64,
}

impl BlkBackend for NullBackend {
    fn kind(&self) -> &'static str {
        "null"
    }

    fn blocks(&self) -> bool {
        false
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        past_end(offset, buf.len(), self.capacity)?;
        pattern::fill(offset, buf);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        past_end(offset, buf.len(), self.capacity)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

/// `memory`: a RAM disk in an anonymous mapping, read and written with
/// vm-memory's volatile copies, so that requests racing on the same
/// sectors from two queues are as defined as on a real disk (one wins),
/// not undefined behaviour.
#[derive(Debug)]
pub struct MemoryBackend {
    capacity: u64,
    mem: GuestMemoryMmap<()>,
}

impl MemoryBackend {
    /// A zeroed RAM disk of `capacity` bytes (pages are taken as touched).
    pub fn new(capacity: u64) -> Result<Self, BackendError> {
        let err = |reason: String| BackendError::Memory { capacity, reason };
        let len = usize::try_from(capacity).map_err(|e| err(e.to_string()))?;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len)])
            .map_err(|e| err(e.to_string()))?;
        Ok(Self { capacity, mem })
    }
}

impl BlkBackend for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn blocks(&self) -> bool {
        false
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        past_end(offset, buf.len(), self.capacity)?;
        self.mem
            .read_slice(buf, GuestAddress(offset))
            .map_err(io::Error::other)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        past_end(offset, buf.len(), self.capacity)?;
        self.mem
            .write_slice(buf, GuestAddress(offset))
            .map_err(io::Error::other)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

/// `file`: a regular file, `pread`/`pwrite` at the request's offset;
/// `fdatasync` on flush.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    capacity: u64,
    direct: bool,
}

impl FileBackend {
    /// Opens `path` read-write (with `O_DIRECT` if `direct`), using `size`
    /// bytes of it, or all of it rounded down to 512.
    pub fn open(path: &Path, direct: bool, size: Option<u64>) -> Result<Self, BackendError> {
        let open_err = |e: io::Error| BackendError::Open {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        if direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = opts.open(path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if !meta.file_type().is_file() {
            return Err(BackendError::NotRegularFile {
                path: path.to_path_buf(),
            });
        }
        let len = meta.len();
        let needed = size.unwrap_or(SECTOR_SIZE).max(SECTOR_SIZE);
        if len < needed {
            return Err(BackendError::TooSmall {
                path: path.to_path_buf(),
                len,
                needed,
            });
        }
        let capacity = size.unwrap_or(len) / SECTOR_SIZE * SECTOR_SIZE;
        if capacity == 0 {
            return Err(BackendError::BadCapacity {
                kind: "file",
                capacity,
                max: len,
            });
        }
        Ok(Self {
            file,
            capacity,
            direct,
        })
    }
}

impl BlkBackend for FileBackend {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn blocks(&self) -> bool {
        true
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        past_end(offset, buf.len(), self.capacity)?;
        // `read_exact_at` loops over short reads; end of file is an error
        // (the file shrank under us).
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        past_end(offset, buf.len(), self.capacity)?;
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn buffer_align(&self) -> usize {
        if self.direct {
            DIRECT_ALIGN
        } else {
            1
        }
    }

    fn io_align(&self) -> u32 {
        if self.direct {
            DIRECT_ALIGN as u32
        } else {
            512
        }
    }
}

/// A byte buffer whose start is aligned to `align`, from a `Vec` with room
/// to spare (no allocator call beyond the one, and no `unsafe`).
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes aligned to `align` (a power of two).
    pub(crate) fn new(len: usize, align: usize) -> Self {
        let align = align.max(1);
        let buf = vec![0u8; len + align];
        let start = buf.as_ptr().align_offset(align).min(align);
        Self { buf, start, len }
    }

    /// The first `n` bytes (at most the length).
    pub(crate) fn get_mut(&mut self, n: usize) -> &mut [u8] {
        let n = n.min(self.len);
        &mut self.buf[self.start..self.start + n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blk::worker::runs_blocking;

    /// A back-end of any kind, saying whether it blocks.
    #[derive(Debug)]
    struct Custom {
        kind: &'static str,
        blocks: bool,
    }

    impl BlkBackend for Custom {
        fn kind(&self) -> &'static str {
            self.kind
        }
        fn capacity(&self) -> u64 {
            4096
        }
        fn read_at(&self, _: u64, _: &mut [u8]) -> io::Result<()> {
            Ok(())
        }
        fn write_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn blocks(&self) -> bool {
            self.blocks
        }
    }

    /// Whether a worker keeps its sections off the back-end's I/O follows
    /// what the back-end says, not its kind's name: a blocking back-end
    /// not named "file" runs blocking, a non-blocking one named "file"
    /// does not; the built-in ones say what they are.
    #[test]
    fn a_backend_says_whether_it_blocks_whatever_its_kind() {
        let tape = Custom {
            kind: "tape",
            blocks: true,
        };
        assert!(runs_blocking(&tape));
        let cached = Custom {
            kind: "file",
            blocks: false,
        };
        assert!(!runs_blocking(&cached));
        let null = BackendConfig::Null { capacity: 4096 }.open().unwrap();
        let memory = BackendConfig::Memory { capacity: 4096 }.open().unwrap();
        assert!(!runs_blocking(&*null));
        assert!(!runs_blocking(&*memory));
    }

    #[test]
    fn null_reads_the_pattern_and_refuses_past_the_end() {
        let b = BackendConfig::Null { capacity: 4096 }.open().unwrap();
        let mut buf = [0u8; 512];
        b.read_at(512, &mut buf).unwrap();
        assert_eq!(pattern::first_mismatch(512, &buf), None);
        assert!(b.read_at(3584 + 512, &mut buf).is_err());
        assert!(b.write_at(u64::MAX - 10, &buf).is_err());
    }

    #[test]
    fn memory_keeps_what_was_written() {
        let b = BackendConfig::Memory { capacity: 1 << 20 }.open().unwrap();
        b.write_at(4096, &[7u8; 1024]).unwrap();
        let mut buf = [0u8; 1024];
        b.read_at(4096, &mut buf).unwrap();
        assert_eq!(buf, [7u8; 1024]);
        assert!(b.read_at((1 << 20) - 512, &mut buf).is_err());
    }

    #[test]
    fn bad_capacities_and_files_are_refused() {
        for cfg in [
            BackendConfig::Null { capacity: 0 },
            BackendConfig::Null { capacity: 1000 },
            BackendConfig::Memory {
                capacity: MAX_MEMORY_CAPACITY + 512,
            },
        ] {
            assert!(matches!(
                cfg.open().unwrap_err(),
                BackendError::BadCapacity { .. }
            ));
        }
        let missing = BackendConfig::File {
            path: "/nonexistent/softiommu-disk".into(),
            direct: false,
            size: None,
        };
        assert!(matches!(
            missing.open().unwrap_err(),
            BackendError::Open { .. }
        ));
        let dir = BackendConfig::File {
            path: std::env::temp_dir(),
            direct: false,
            size: None,
        };
        assert!(matches!(
            dir.open().unwrap_err(),
            BackendError::Open { .. } | BackendError::NotRegularFile { .. }
        ));
    }

    #[test]
    fn an_aligned_buffer_is_aligned() {
        let mut b = AlignedBuf::new(8192, 4096);
        assert_eq!(b.get_mut(8192).as_ptr() as usize % 4096, 0);
        assert_eq!(b.get_mut(100_000).len(), 8192);
    }
}
