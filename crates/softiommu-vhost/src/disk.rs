//! The backing file of a block device: its size in sectors and positioned
//! reads and writes, as a `BlkBackend` of the shared request code.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use softiommu_virtio::blk::BlkBackend;
use softiommu_virtio::spec::blk::SECTOR_SIZE;

use crate::error::ConfigError;

/// An open disk image.
#[derive(Debug)]
pub struct Disk {
    file: File,
    bytes: u64,
}

impl Disk {
    /// Opens `path` read-write; its size must be a positive multiple of 512.
    pub fn open(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| ConfigError::Disk {
                path: shown.clone(),
                reason: e.to_string(),
            })?;
        let bytes = file
            .metadata()
            .map_err(|e| ConfigError::Disk {
                path: shown.clone(),
                reason: e.to_string(),
            })?
            .len();
        if bytes == 0 || bytes % SECTOR_SIZE != 0 {
            return Err(ConfigError::DiskSize {
                path: shown,
                size: bytes,
            });
        }
        Ok(Self { file, bytes })
    }

    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Capacity in 512-byte sectors.
    pub fn sectors(&self) -> u64 {
        self.bytes / SECTOR_SIZE
    }
}

/// The disk as the shared request code's back-end: positioned reads and
/// writes of the whole buffer, a flush that syncs the data.
impl BlkBackend for Disk {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn capacity(&self) -> u64 {
        self.bytes
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}
