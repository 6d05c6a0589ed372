//! Cache maintenance for table walkers that do not snoop the CPU caches.
//!
//! When an IOMMU's page walk is not coherent (VT-d `ECAP.C` = 0, Intel VT-d
//! specification §11.4.3), it reads table entries from memory, not from the
//! CPU caches, so every line of a table the CPU writes must be written back
//! before the walker may look at it. Seed `003` measured what this costs
//! Linux (`clflush_cache_range`, 5.9 % of CPU). A [`LineFlusher`] collects the
//! lines one operation dirties, and at the end of a batch flushes each of
//! them exactly once with a real instruction, then fences once.
//!
//! The instructions, detected once per process with `CPUID` (the standard
//! library's `is_x86_feature_detected!` does not know these three):
//!
//! - `clflushopt` (CPUID.(EAX=7,ECX=0):EBX[23]): weakly ordered, so many can
//!   be in flight; one `sfence` orders them before later stores. Linux's
//!   choice, and our default where the CPU has it.
//! - `clwb` (EBX[24]): as `clflushopt` but may keep the line cached, which
//!   spares the CPU a miss on its next update of the same line.
//! - `clflush` (CPUID.01H:EDX[19]): the original, ordered with every other
//!   `clflush`, hence slower in a batch.
//! - elsewhere (not x86-64), a portable fallback: one `SeqCst` fence per
//!   batch and no line instruction. It is named [`FlushMethod::Fence`] so a
//!   report can say that no line was really flushed.
//!
//! `std::arch` provides `_mm_clflush` and `_mm_sfence` but no intrinsic for
//! `clflushopt` or `clwb`, so those two are issued with `asm!`.

use std::sync::atomic::{fence, Ordering};
use std::sync::OnceLock;

use crate::mem::{PhysAddr, PhysMemory};

/// The cache-line size flushes work in, in bytes. 64 on every x86-64 CPU
/// (`CPUID.01H:EBX[15:8]` × 8) and on the other targets we care about.
pub const CACHE_LINE: u64 = 64;

/// How a line is flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushMethod {
    /// `clflushopt` per line, one `sfence` per batch.
    Clflushopt,
    /// `clwb` per line, one `sfence` per batch.
    Clwb,
    /// `clflush` per line, one `sfence` per batch.
    Clflush,
    /// No line instruction, one `SeqCst` fence per batch: the portable
    /// fallback where the CPU has none of the above.
    Fence,
}

/// What the CPU supports, read once.
#[derive(Debug, Clone, Copy)]
struct Caps {
    clflush: bool,
    clflushopt: bool,
    clwb: bool,
}

fn caps() -> Caps {
    static CAPS: OnceLock<Caps> = OnceLock::new();
    *CAPS.get_or_init(detect_caps)
}

#[cfg(target_arch = "x86_64")]
fn detect_caps() -> Caps {
    use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
    // `CPUID` is unconditionally available on x86-64. The `unsafe` blocks are
    // needed by the older compilers our MSRV allows and redundant on newer
    // ones, where these functions are safe; hence the `allow`.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID has no preconditions on x86-64.
    let max_leaf = unsafe { __get_cpuid_max(0) }.0;
    #[allow(unused_unsafe)]
    // SAFETY: as above; leaf 1 exists on every x86-64 CPU.
    let leaf1 = unsafe { __cpuid_count(1, 0) };
    let (clflushopt, clwb) = if max_leaf >= 7 {
        #[allow(unused_unsafe)]
        // SAFETY: as above; leaf 7 exists (checked against the maximum leaf).
        let leaf7 = unsafe { __cpuid_count(7, 0) };
        (leaf7.ebx & (1 << 23) != 0, leaf7.ebx & (1 << 24) != 0)
    } else {
        (false, false)
    };
    Caps {
        clflush: leaf1.edx & (1 << 19) != 0,
        clflushopt,
        clwb,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_caps() -> Caps {
    Caps {
        clflush: false,
        clflushopt: false,
        clwb: false,
    }
}

impl FlushMethod {
    /// The best method this CPU has: `clflushopt`, else `clflush`, else the
    /// fence fallback. (`clwb` is never chosen by default: it is selectable
    /// for comparison.)
    pub fn detect() -> FlushMethod {
        let c = caps();
        if c.clflushopt {
            FlushMethod::Clflushopt
        } else if c.clflush {
            FlushMethod::Clflush
        } else {
            FlushMethod::Fence
        }
    }

    /// Whether this CPU can execute the method.
    pub fn is_supported(self) -> bool {
        let c = caps();
        match self {
            FlushMethod::Clflushopt => c.clflushopt,
            FlushMethod::Clwb => c.clwb,
            FlushMethod::Clflush => c.clflush,
            FlushMethod::Fence => true,
        }
    }

    /// The instruction's name, for reports.
    pub fn name(self) -> &'static str {
        match self {
            FlushMethod::Clflushopt => "clflushopt",
            FlushMethod::Clwb => "clwb",
            FlushMethod::Clflush => "clflush",
            FlushMethod::Fence => "fence",
        }
    }
}

/// Collects the cache lines of physical memory written during one
/// operation and flushes each exactly once per batch.
///
/// An inactive flusher (for a coherent walker) records nothing and flushes
/// nothing, at no cost.
#[derive(Debug)]
pub struct LineFlusher {
    method: Option<FlushMethod>,
    dirty: Vec<PhysAddr>,
    last: PhysAddr,
    lines_written: u64,
    lines_flushed: u64,
    batches: u64,
}

/// No line address equals this (line addresses are multiples of 64).
const NO_LINE: PhysAddr = u64::MAX;

impl LineFlusher {
    /// A flusher that flushes with `method`, or an inactive one for `None`
    /// (a coherent walker). Fails if the CPU lacks the method.
    #[cfg(test)]
    pub fn new(method: Option<FlushMethod>) -> Result<Self, super::PgtableError> {
        match method {
            Some(m) if !m.is_supported() => {
                Err(super::PgtableError::FlushUnsupported { method: m })
            }
            _ => Ok(Self::new_checked(method)),
        }
    }

    /// As [`new`](Self::new), for a method already known to be supported.
    pub(crate) fn new_checked(method: Option<FlushMethod>) -> Self {
        Self {
            method,
            dirty: Vec::new(),
            last: NO_LINE,
            lines_written: 0,
            lines_flushed: 0,
            batches: 0,
        }
    }

    /// Whether this flusher flushes (the walker is not coherent).
    pub fn is_active(&self) -> bool {
        self.method.is_some()
    }

    /// Records that the line holding `addr` was written.
    #[inline]
    pub fn record(&mut self, addr: PhysAddr) {
        if self.method.is_none() {
            return;
        }
        let line = addr & !(CACHE_LINE - 1);
        // Consecutive entries mostly share a line: skip the obvious repeats
        // here, the rest are removed when the batch is flushed.
        if line != self.last {
            self.dirty.push(line);
            self.last = line;
        }
    }

    /// Records that every line of `[addr, addr + len)` was written.
    pub fn record_range(&mut self, addr: PhysAddr, len: u64) {
        if self.method.is_none() || len == 0 {
            return;
        }
        let mut line = addr & !(CACHE_LINE - 1);
        let end = addr.saturating_add(len);
        while line < end {
            self.record(line);
            line += CACHE_LINE;
        }
    }

    /// Ends a batch: flushes each recorded line once, then fences once.
    /// Returns the number of lines flushed. Does nothing (and does not
    /// fence) if no line was recorded.
    ///
    /// Lines outside `mem` are skipped (only table pages, which live in
    /// `mem`, are ever recorded by this crate).
    pub fn flush(&mut self, mem: &PhysMemory) -> u64 {
        let Some(method) = self.method else {
            return 0;
        };
        if self.dirty.is_empty() {
            return 0;
        }
        self.dirty.sort_unstable();
        self.dirty.dedup();
        let mut n = 0;
        for &line in &self.dirty {
            let Ok(p) = mem.as_ptr(line, CACHE_LINE) else {
                debug_assert!(false, "flushing line {line:#x} outside the arena");
                continue;
            };
            // SAFETY: `p` points at a whole, mapped cache line of the arena
            // (bounds-checked by `as_ptr`), and `method` was checked to be
            // supported by this CPU when the flusher was made.
            unsafe { flush_line(method, p) };
            n += 1;
        }
        end_batch(method);
        self.dirty.clear();
        self.last = NO_LINE;
        self.lines_written += n;
        self.lines_flushed += n;
        self.batches += 1;
        n
    }

    /// Distinct lines written, summed over the batches flushed so far.
    pub fn lines_written(&self) -> u64 {
        self.lines_written
    }

    /// Lines flushed so far.
    pub fn lines_flushed(&self) -> u64 {
        self.lines_flushed
    }

    /// Batches flushed so far (one fence each).
    pub fn batches(&self) -> u64 {
        self.batches
    }
}

/// Writes the line at `p` back to memory.
///
/// # Safety
///
/// `p` must point into mapped memory, and the CPU must support `method`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn flush_line(method: FlushMethod, p: *const u8) {
    use std::arch::asm;
    use std::arch::x86_64::_mm_clflush;
    // None of these asm blocks is `nomem`: the compiler must treat them as
    // touching memory, so the stores to the line are emitted before them.
    match method {
        // SAFETY: the caller guarantees the CPU has CLFLUSHOPT and that `p`
        // is mapped; the instruction reads no register but its operand and
        // changes no flag.
        FlushMethod::Clflushopt => unsafe {
            asm!("clflushopt byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags))
        },
        // SAFETY: as above, for CLWB.
        FlushMethod::Clwb => unsafe {
            asm!("clwb byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags))
        },
        // SAFETY: CLFLUSH (SSE2, baseline on x86-64) on a mapped address.
        FlushMethod::Clflush => unsafe { _mm_clflush(p) },
        FlushMethod::Fence => {}
    }
}

/// Non-x86-64 targets have no line instruction here: see [`end_batch`].
///
/// # Safety
///
/// None needed; `unsafe` only to match the x86-64 signature.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
unsafe fn flush_line(_method: FlushMethod, _p: *const u8) {}

/// Orders the batch's flushes before any later store (the one that links a
/// new table, or the invalidation request that follows an unmap).
#[inline]
fn end_batch(method: FlushMethod) {
    match method {
        #[cfg(target_arch = "x86_64")]
        FlushMethod::Clflushopt | FlushMethod::Clwb | FlushMethod::Clflush => {
            // SFENCE orders the weakly ordered CLFLUSHOPT/CLWB before later
            // stores (Intel SDM vol. 2, CLFLUSHOPT); CLFLUSH is ordered with
            // stores already, but one fence per batch is cheap and keeps the
            // three methods alike (Linux fences around `clflush` too).
            #[allow(unused_unsafe)]
            // SAFETY: SFENCE (SSE, baseline on x86-64) has no preconditions;
            // the function is `unsafe` only on older compilers.
            unsafe {
                std::arch::x86_64::_mm_sfence()
            };
        }
        _ => fence(Ordering::SeqCst),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_deduplicated_and_flushed_once_per_batch() {
        let mem = PhysMemory::new(1 << 20).unwrap();
        let mut f = LineFlusher::new(Some(FlushMethod::detect())).unwrap();
        for a in [0u64, 8, 56, 64, 0, 4096, 72, 4096 + 63] {
            f.record(a);
        }
        assert_eq!(f.flush(&mem), 3, "lines 0, 64 and 4096");
        assert_eq!(f.flush(&mem), 0, "an empty batch flushes nothing");
        assert_eq!(f.batches(), 1);
        f.record_range(100, 200); // lines 64, 128, 192, 256
        f.record(64);
        assert_eq!(f.flush(&mem), 4);
        assert_eq!(
            (f.lines_written(), f.lines_flushed(), f.batches()),
            (7, 7, 2)
        );
    }

    #[test]
    fn every_supported_method_runs_on_real_memory() {
        let mem = PhysMemory::new(1 << 16).unwrap();
        for m in [
            FlushMethod::Clflushopt,
            FlushMethod::Clwb,
            FlushMethod::Clflush,
            FlushMethod::Fence,
        ] {
            match LineFlusher::new(Some(m)) {
                Ok(mut f) => {
                    mem.store_u64(128, 7, Ordering::Relaxed).unwrap();
                    f.record_range(0, 4096);
                    assert_eq!(f.flush(&mem), 64, "{}", m.name());
                    assert_eq!(mem.load_u64(128, Ordering::Relaxed).unwrap(), 7);
                }
                Err(e) => {
                    assert!(!m.is_supported());
                    assert_eq!(
                        e,
                        super::super::PgtableError::FlushUnsupported { method: m }
                    );
                }
            }
        }
        assert!(FlushMethod::detect().is_supported());
    }

    #[test]
    fn an_inactive_flusher_records_nothing() {
        let mem = PhysMemory::new(1 << 16).unwrap();
        let mut f = LineFlusher::new(None).unwrap();
        f.record_range(0, 4096);
        assert_eq!(f.flush(&mem), 0);
        assert!(!f.is_active());
        assert_eq!((f.lines_written(), f.batches()), (0, 0));
    }

    #[test]
    fn lines_outside_the_arena_are_skipped_in_release_builds() {
        if cfg!(debug_assertions) {
            return;
        }
        let mem = PhysMemory::new(1 << 16).unwrap();
        let mut f = LineFlusher::new(Some(FlushMethod::detect())).unwrap();
        f.record(1 << 40);
        assert_eq!(f.flush(&mem), 0);
    }
}
