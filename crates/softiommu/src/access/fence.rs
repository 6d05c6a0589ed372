//! The fences the orderer issues, behind a small trait so that the same
//! ordering logic runs on the machine ([`CpuFences`]) and under the loom
//! model checker (`LoomFences`, `cfg(loom)`).
//!
//! | fence        | C11               | x86-64                | AArch64     | POWER    |
//! |--------------|-------------------|-----------------------|-------------|----------|
//! | `acquire`    | `fence(Acquire)`  | none (compiler fence) | `dmb ishld` | `lwsync` |
//! | `release`    | `fence(Release)`  | none (compiler fence) | `dmb ish`   | `lwsync` |
//! | `store_load` | `fence(SeqCst)`   | `mfence`              | `dmb ish`   | `sync`   |
//! | `full`       | `fence(SeqCst)`   | `mfence`              | `dmb ish`   | `sync`   |
//!
//! `store_load` and `full` are the same instruction; they differ in *when*
//! they are issued (only before a load that follows a store, or before
//! every access). Linux's x86-64 `smp_mb()` uses a locked add to the stack
//! instead of `mfence`, cheaper on the CPUs of 2017; on the Xeon this was
//! measured on (a store pending, then the fence, then a load), `mfence`,
//! `lock or [rsp]` and `xchg` all cost 10–14 ns, so the portable fence is
//! kept and no assembly is needed.

use std::sync::atomic::{fence, Ordering};

/// A set of fences (see the table in the module documentation).
pub(crate) trait Fences {
    /// Orders earlier loads before later loads and stores.
    fn acquire();
    /// Orders earlier loads and stores before later stores.
    fn release();
    /// Orders earlier stores before later loads (and everything else): the
    /// one ordering x86 does not give for free.
    fn store_load();
    /// The unconditional full fence of the `full` mode.
    fn full();
}

/// The fences of the machine the code runs on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuFences;

impl Fences for CpuFences {
    #[inline(always)]
    fn acquire() {
        fence(Ordering::Acquire);
    }

    #[inline(always)]
    fn release() {
        fence(Ordering::Release);
    }

    #[inline(always)]
    fn store_load() {
        fence(Ordering::SeqCst);
    }

    #[inline(always)]
    fn full() {
        fence(Ordering::SeqCst);
    }
}

/// The fences of the loom model: every one is the C11 fence it stands for.
#[cfg(loom)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LoomFences;

#[cfg(loom)]
impl Fences for LoomFences {
    fn acquire() {
        loom::sync::atomic::fence(Ordering::Acquire);
    }

    fn release() {
        loom::sync::atomic::fence(Ordering::Release);
    }

    fn store_load() {
        loom::sync::atomic::fence(Ordering::SeqCst);
    }

    fn full() {
        loom::sync::atomic::fence(Ordering::SeqCst);
    }
}
