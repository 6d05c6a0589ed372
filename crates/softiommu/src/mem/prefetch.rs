//! A software prefetch: asks the CPU to start bringing a cache line in
//! while the caller does other work. It is a hint with no effect on what
//! the program computes; it never faults (x86 `PREFETCHh`, Intel SDM
//! vol. 2B: "a prefetch ... does not generate exceptions").
//!
//! Why the allocator needs it: its per-IOVA state words are spread over a
//! map as large as the IOVA space in use (4.4 MB in `lab iova-aging`'s
//! default run), so a state access misses the core's own caches. On a
//! shared VM the last-level cache a core may use comes and goes (measured
//! with a pointer chase over 4 MB: 15 ns per load for seconds, then 110-140
//! ns for seconds), and a miss that waits on it halves the allocator's
//! throughput. A miss started a step early costs little in either case.

/// Starts loading the cache line holding `p` into every cache level.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: PREFETCHT0 reads no memory architecturally and raises no
        // fault whatever the address (see the module doc); `p` is only
        // passed as an address.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = p;
    }
}
