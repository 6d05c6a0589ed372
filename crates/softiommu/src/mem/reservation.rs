//! An anonymous, lazily committed region of virtual memory.
//!
//! `mmap(PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)`
//! reserves address space only: the kernel backs a page with memory the
//! first time it is touched, and untouched pages read as zero. A 64 GiB
//! arena therefore costs nothing until it is used.

use super::MemError;

/// A reserved, zero-initialised, read-write mapping that is unmapped on drop.
#[derive(Debug)]
pub struct Reservation {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; all access to its
// bytes goes through raw pointers whose users take care of their own
// synchronisation (atomics or external locks), as documented at each caller.
unsafe impl Send for Reservation {}
// SAFETY: as above; `&Reservation` only hands out the base pointer.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// Reserves `len` bytes of address space (rounded up to 4 KiB).
    pub fn new(len: u64) -> Result<Self, MemError> {
        let len =
            usize::try_from(len.max(1).next_multiple_of(4096)).map_err(|_| MemError::Reserve {
                len,
                errno: libc::EOVERFLOW,
            })?;
        // SAFETY: an anonymous private mapping with a null hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(MemError::Reserve {
                len: len as u64,
                errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        Ok(Self {
            base: ptr.cast(),
            len,
        })
    }

    /// Asks the kernel to back the mapping with transparent huge pages
    /// where it can (`madvise(MADV_HUGEPAGE)`; Linux only, a hint: where
    /// THP is off or the call fails, nothing changes). For maps touched at
    /// random over megabytes, where 4 KiB pages would cost a TLB miss (and
    /// a page walk to memory) per access.
    pub fn prefer_huge_pages(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the range is exactly this mapping, which this value owns;
        // MADV_HUGEPAGE changes no contents.
        unsafe {
            libc::madvise(self.base.cast(), self.len, libc::MADV_HUGEPAGE);
        }
    }

    /// The first byte of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// The length of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Gives the backing memory of `[offset, offset + len)` back to the
    /// kernel; the range reads as zero afterwards. Both must be 4 KiB
    /// aligned and the range inside the mapping, else nothing is done and
    /// [`MemError::OutOfRange`] or [`MemError::Unaligned`] is returned.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), MemError> {
        for v in [offset, len] {
            if !v.is_multiple_of(4096) {
                return Err(MemError::Unaligned {
                    addr: v,
                    align: 4096,
                });
            }
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.len as u64)
        {
            return Err(MemError::OutOfRange {
                addr: offset,
                len,
                size: self.len as u64,
            });
        }
        // SAFETY: the range lies inside our own mapping (checked above);
        // MADV_DONTNEED on private anonymous memory only drops its
        // contents, which callers no longer need.
        unsafe {
            libc::madvise(
                self.base.add(offset as usize).cast(),
                len as usize,
                libc::MADV_DONTNEED,
            );
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned, and no
        // borrow of the mapping can outlive `self`.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_reservation_costs_nothing_until_touched() {
        let r = Reservation::new(64 << 30).expect("64 GiB of address space");
        assert_eq!(r.len(), 64 << 30);
        // SAFETY: offsets inside the mapping.
        unsafe {
            assert_eq!(*r.base().add(12345), 0);
            *r.base().add(63usize << 30) = 7;
            assert_eq!(*r.base().add(63usize << 30), 7);
        }
        r.discard(63u64 << 30, 4096).unwrap();
        assert!(matches!(
            r.discard(64u64 << 30, 4096),
            Err(MemError::OutOfRange { .. })
        ));
        assert!(matches!(
            r.discard(u64::MAX - 4095, 8192),
            Err(MemError::OutOfRange { .. })
        ));
        assert!(matches!(
            r.discard(100, 4096),
            Err(MemError::Unaligned { addr: 100, .. })
        ));
        // SAFETY: as above.
        unsafe { assert_eq!(*r.base().add(63usize << 30), 0) };
    }
}
