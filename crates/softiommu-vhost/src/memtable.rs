//! The front-end's shared memory: the regions of `SET_MEM_TABLE`, each an
//! `mmap` of the file descriptor that came with it, found by front-end
//! virtual address (what IOTLB entries and, without an IOMMU, ring
//! addresses carry) or by guest-physical address (buffer addresses
//! without an IOMMU).

use std::os::fd::{AsRawFd, OwnedFd};

use crate::error::MsgError;
use crate::proto::MAX_REGIONS;

/// Bytes of one region description (`guest_phys_addr`, `memory_size`,
/// `userspace_addr`, `mmap_offset`, le64 each).
const REGION_LEN: usize = 32;

/// One mapped region.
#[derive(Debug)]
struct Region {
    gpa: u64,
    uaddr: u64,
    size: u64,
    /// Start of the mapping (the file from offset 0).
    base: *mut u8,
    /// `mmap_offset`: where the region starts in the mapping.
    offset: u64,
    map_len: usize,
    /// The file's device and inode: two regions that share front-end
    /// virtual addresses must be views of the same bytes.
    file: (u64, u64),
}

// SAFETY: the mapping is plain shared memory, valid until drop.
unsafe impl Send for Region {}
// SAFETY: as above; accesses go through raw pointers with their own rules.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: base/map_len are what mmap returned.
        unsafe { libc::munmap(self.base.cast(), self.map_len) };
    }
}

/// Refuses a region's descriptor unless touching any byte of its
/// mapping (`[0, end)` of the file) can never fault: it must be a regular
/// file sealed against shrinking (`F_SEAL_SHRINK`, as QEMU's
/// `memory-backend-memfd` seals by default) and, the seal taken, at least
/// `end` bytes long. A mapping past the end of a file, or of a file
/// truncated later, raises `SIGBUS` on access, which would kill the
/// back-end; an unsealed file (or one on a file system that cannot be
/// sealed, such as FUSE, whose page faults the front-end could also stall)
/// could be truncated at any time.
fn check_region_fd(index: usize, fd: &OwnedFd, end: u64) -> Result<(u64, u64), MsgError> {
    // SAFETY: fstat into a zeroed stat of a descriptor we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(MsgError::RegionUnsealed {
            index,
            reason: format!("fstat: {}", std::io::Error::last_os_error()),
        });
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(MsgError::RegionUnsealed {
            index,
            reason: format!("not a regular file (mode {:#o})", st.st_mode),
        });
    }
    // SAFETY: F_GET_SEALS on a descriptor we hold; the result checked.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(MsgError::RegionUnsealed {
            index,
            reason: format!(
                "the file cannot be sealed ({}): not a memfd",
                std::io::Error::last_os_error()
            ),
        });
    }
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err(MsgError::RegionUnsealed {
            index,
            reason: format!("seals {seals:#x} lack F_SEAL_SHRINK"),
        });
    }
    // Sealed: the size read now can only grow.
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(MsgError::RegionUnsealed {
            index,
            reason: format!("fstat: {}", std::io::Error::last_os_error()),
        });
    }
    let file_size = u64::try_from(st.st_size).unwrap_or(0);
    if end > file_size {
        return Err(MsgError::RegionPastFile {
            index,
            end,
            file_size,
        });
    }
    Ok((st.st_dev, st.st_ino))
}

/// Whether `[a, +la)` and `[b, +lb)` share a byte (neither end wraps).
fn overlap(a: u64, la: u64, b: u64, lb: u64) -> bool {
    a < b + lb && b < a + la
}

/// Refuses a table in which two regions claim one guest-physical address
/// (a buffer address would resolve to whichever came first), or one
/// front-end virtual address for different bytes (two views of the same
/// file at the same offsets may share them, as aliases of one RAM block).
fn check_disjoint(regions: &[Region]) -> Result<(), MsgError> {
    for (i, a) in regions.iter().enumerate() {
        for (j, b) in regions.iter().enumerate().skip(i + 1) {
            let what = if overlap(a.gpa, a.size, b.gpa, b.size) {
                "guest-physical"
            } else if overlap(a.uaddr, a.size, b.uaddr, b.size)
                && (a.file != b.file
                    || a.uaddr.wrapping_sub(a.offset) != b.uaddr.wrapping_sub(b.offset))
            {
                "front-end virtual"
            } else {
                continue;
            };
            return Err(MsgError::Invalid {
                name: "SET_MEM_TABLE",
                what: format!("regions {i} and {j} overlap in {what} addresses"),
            });
        }
    }
    Ok(())
}

/// Which address space an address is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    /// The front-end's virtual addresses.
    Uaddr,
    /// Guest-physical addresses.
    Gpa,
}

/// The mapped table.
#[derive(Debug, Default)]
pub(crate) struct MemTable {
    regions: Vec<Region>,
}

impl MemTable {
    /// Decodes and maps a `SET_MEM_TABLE` payload with its descriptors.
    pub(crate) fn map(payload: &[u8], fds: &[OwnedFd]) -> Result<Self, MsgError> {
        let name = "SET_MEM_TABLE";
        if payload.len() < 8 {
            return Err(MsgError::BadSize {
                name,
                size: payload.len(),
                want: "8 + 32 per region".into(),
            });
        }
        let n = u32::from_le_bytes(payload[0..4].try_into().expect("4 bytes")) as usize;
        if n == 0 || n > MAX_REGIONS {
            return Err(MsgError::Invalid {
                name,
                what: format!("{n} regions (1..={MAX_REGIONS})"),
            });
        }
        if payload.len() != 8 + n * REGION_LEN {
            return Err(MsgError::BadSize {
                name,
                size: payload.len(),
                want: format!("{}", 8 + n * REGION_LEN),
            });
        }
        if fds.len() != n {
            return Err(MsgError::BadFds {
                name,
                got: fds.len(),
                want: n,
            });
        }
        let mut regions = Vec::with_capacity(n);
        for (i, fd) in fds.iter().enumerate() {
            let r = &payload[8 + i * REGION_LEN..8 + (i + 1) * REGION_LEN];
            let f = |k: usize| u64::from_le_bytes(r[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
            let (gpa, size, uaddr, offset) = (f(0), f(1), f(2), f(3));
            let bad = |what: String| MsgError::Invalid { name, what };
            if size == 0 {
                return Err(bad(format!("region {i} has size 0")));
            }
            if gpa.checked_add(size).is_none() || uaddr.checked_add(size).is_none() {
                return Err(bad(format!("region {i} runs past 2^64")));
            }
            let map_len = offset
                .checked_add(size)
                .and_then(|l| usize::try_from(l).ok())
                .ok_or_else(|| {
                    bad(format!(
                        "region {i}: offset {offset:#x} + size {size:#x} overflows"
                    ))
                })?;
            let file = check_region_fd(i, fd, map_len as u64)?;
            // SAFETY: a fresh shared mapping of the descriptor; checked below.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(MsgError::Map {
                    index: i,
                    reason: std::io::Error::last_os_error().to_string(),
                });
            }
            regions.push(Region {
                gpa,
                uaddr,
                size,
                base: base.cast(),
                offset,
                map_len,
                file,
            });
        }
        // The mappings made so far are undone with `regions` if refused.
        check_disjoint(&regions)?;
        Ok(Self { regions })
    }

    /// Whether no memory is shared yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The host pointer of `addr` and how many bytes from it stay in the
    /// same region (at most `len`), or `None` outside every region.
    pub(crate) fn host(&self, space: Space, addr: u64, len: u64) -> Option<(*mut u8, u64)> {
        for r in &self.regions {
            let start = match space {
                Space::Uaddr => r.uaddr,
                Space::Gpa => r.gpa,
            };
            if addr >= start && addr - start < r.size {
                let off = addr - start;
                let n = (r.size - off).min(len);
                // SAFETY: offset + off < offset + size = map_len.
                let p = unsafe { r.base.add((r.offset + off) as usize) };
                return Some((p, n));
            }
        }
        None
    }
}
