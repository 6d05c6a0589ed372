//! The asymmetric fence pair behind drain: a light fence on every
//! translation, a heavy one on every draining wait.
//!
//! The drain protocol (see the module documentation of `hw`) is a Dekker
//! pattern: a translator stores "I am active" and then loads the IOTLB; a
//! draining wait stores its invalidations and then loads the translators'
//! slots. Each side needs a full (StoreLoad) fence between its store and its
//! load. Translations are millions per second and draining waits are
//! thousands, so the cost is moved to the rare side:
//!
//! - [`DrainBarrier::Membarrier`]: the translator's fence is only a compiler
//!   fence; the wait calls Linux `membarrier(2)` with
//!   `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, which makes every CPU running a
//!   thread of this process execute a full memory barrier before the call
//!   returns (a thread not running passes one on its context switch). At
//!   whatever instruction a translator was interrupted, its stores before
//!   that point are visible to the waiter after the call, and its loads
//!   after that point see the waiter's stores from before the call: exactly
//!   the guarantee a full fence in the translator would have given. This is
//!   the use `membarrier(2)`'s manual page describes; the process registers
//!   once with `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
//! - [`DrainBarrier::Fence`]: both sides use a `SeqCst` fence (portable; a
//!   translation pays an `mfence`, a few nanoseconds on x86).
//!
//! [`DrainBarrier::Auto`] takes the first where the kernel offers it. The
//! choice is made per unit when it is created and never changes, so a
//! translator and a wait of one unit always agree on it. Under `cfg(loom)`
//! both sides are `SeqCst` fences, which loom models.

#[cfg(not(loom))]
use std::sync::atomic::compiler_fence;
use std::sync::OnceLock;

use super::{fence, Ordering};

/// Which fence pair a unit's drain uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DrainBarrier {
    /// `Membarrier` where the kernel supports it, `Fence` elsewhere.
    #[default]
    Auto,
    /// A compiler fence per translation, `membarrier(2)` per draining wait.
    /// Creating a unit with this fails where the kernel lacks it.
    Membarrier,
    /// A `SeqCst` fence on both sides.
    Fence,
}

/// The barrier a unit resolved its [`DrainBarrier`] to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Barrier {
    /// Compiler fence / `membarrier(2)`.
    Membarrier,
    /// `SeqCst` fence / `SeqCst` fence.
    Fence,
}

/// `membarrier(2)` commands (Linux `include/uapi/linux/membarrier.h`).
#[cfg(target_os = "linux")]
mod cmd {
    pub(super) const QUERY: libc::c_int = 0;
    pub(super) const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    pub(super) const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;
}

#[cfg(target_os = "linux")]
fn membarrier(command: libc::c_int) -> libc::c_long {
    // SAFETY: `membarrier` takes two integer arguments (command, flags) and
    // touches no memory of ours; any command value is safe to pass (an
    // unknown one returns EINVAL).
    unsafe { libc::syscall(libc::SYS_membarrier, command, 0 as libc::c_int) }
}

/// Whether this process may use `MEMBARRIER_CMD_PRIVATE_EXPEDITED`:
/// queries the kernel and registers, once per process.
fn membarrier_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            let supported = membarrier(cmd::QUERY);
            let need = (cmd::PRIVATE_EXPEDITED | cmd::REGISTER_PRIVATE_EXPEDITED) as libc::c_long;
            supported >= 0
                && supported & need == need
                && membarrier(cmd::REGISTER_PRIVATE_EXPEDITED) == 0
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    })
}

/// How long a draining wait retries `membarrier(2)` failing with ENOMEM
/// before it gives up (the kernel allocates a CPU mask per call where
/// masks live off the stack; memory pressure passes, so a wait backs off
/// and tries again rather than stopping the process at once).
#[cfg(all(target_os = "linux", not(loom)))]
const MEMBARRIER_RETRY_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// Calls `call` until it succeeds, retrying a failure with ENOMEM after a
/// nap that doubles from 50 µs to 50 ms, for at most `bound` in all;
/// another error, or ENOMEM past the bound, is returned.
#[cfg_attr(not(all(target_os = "linux", not(loom))), allow(dead_code))]
fn retry_while_out_of_memory(
    bound: std::time::Duration,
    mut call: impl FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    // The clock is read only once a call failed.
    let mut start = None;
    let mut nap = std::time::Duration::from_micros(50);
    loop {
        match call() {
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
                let since = *start.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= bound {
                    return Err(e);
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// A draining wait's `membarrier(2)` failed: retried while it fails with
/// ENOMEM (within [`MEMBARRIER_RETRY_BOUND`]). Once registered, ENOMEM is
/// the one error left (a temporary CPU mask on kernels built with
/// `CPUMASK_OFFSTACK`). If it persists or another appears, translators
/// running with compiler fences alone could read stale entries after a
/// wait: stop rather than break the isolation the unit exists for.
#[cfg(all(target_os = "linux", not(loom)))]
#[cold]
#[inline(never)]
fn membarrier_failed() {
    let r = retry_while_out_of_memory(MEMBARRIER_RETRY_BOUND, || {
        if membarrier(cmd::PRIVATE_EXPEDITED) == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    });
    assert!(
        r.is_ok(),
        "membarrier(PRIVATE_EXPEDITED) failed after registration: {r:?}"
    );
}

impl Barrier {
    /// Resolves a configuration; `None` if `Membarrier` was asked for and the
    /// kernel does not offer it.
    pub(crate) fn resolve(want: DrainBarrier) -> Option<Barrier> {
        if cfg!(loom) {
            return Some(Barrier::Fence);
        }
        match want {
            DrainBarrier::Fence => Some(Barrier::Fence),
            DrainBarrier::Membarrier => membarrier_registered().then_some(Barrier::Membarrier),
            DrainBarrier::Auto => Some(if membarrier_registered() {
                Barrier::Membarrier
            } else {
                Barrier::Fence
            }),
        }
    }

    /// `Auto` resolved for this process: membarrier where the kernel has it.
    pub(crate) fn default_for_process() -> Barrier {
        Barrier::resolve(DrainBarrier::Auto).unwrap_or(Barrier::Fence)
    }

    /// The translator's side, between "I am active" and the first IOTLB load.
    #[inline(always)]
    pub(crate) fn light(self) {
        #[cfg(not(loom))]
        {
            if self == Barrier::Membarrier {
                // The kernel supplies the hardware fence when a wait needs
                // it (see `heavy`); the compiler must not move the loads
                // that follow above the store that precedes.
                compiler_fence(Ordering::SeqCst);
                return;
            }
        }
        fence(Ordering::SeqCst);
    }

    /// The waiter's side, between its invalidations and its scan of the
    /// translators' slots.
    pub(crate) fn heavy(self) {
        // A fence first in both modes: it orders this thread's own stores
        // before the scan (membarrier acts on the *other* threads).
        fence(Ordering::SeqCst);
        #[cfg(all(target_os = "linux", not(loom)))]
        {
            if self == Barrier::Membarrier && membarrier(cmd::PRIVATE_EXPEDITED) != 0 {
                membarrier_failed();
            }
        }
    }

    /// A short name for reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Barrier::Membarrier => "membarrier",
            Barrier::Fence => "fence",
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_retried_within_the_bound_and_other_errors_are_not() {
        let enomem = || std::io::Error::from_raw_os_error(libc::ENOMEM);
        let long = std::time::Duration::from_secs(10);
        // Three ENOMEMs, then success.
        let mut calls = 0;
        let r = retry_while_out_of_memory(long, || {
            calls += 1;
            if calls <= 3 {
                Err(enomem())
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok() && calls == 4, "{r:?} after {calls}");
        // Another error: returned at once.
        let mut calls = 0;
        let r = retry_while_out_of_memory(long, || {
            calls += 1;
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        });
        assert!(
            matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) && calls == 1,
            "{r:?} after {calls}"
        );
        // ENOMEM for ever: returned once the bound passed.
        let short = std::time::Duration::from_millis(20);
        let t = std::time::Instant::now();
        let r = retry_while_out_of_memory(short, || Err(enomem()));
        assert!(
            matches!(&r, Err(e) if e.raw_os_error() == Some(libc::ENOMEM)),
            "{r:?}"
        );
        assert!(t.elapsed() >= short, "{:?}", t.elapsed());
    }

    #[test]
    fn fence_always_resolves_and_auto_agrees_with_the_kernel() {
        assert_eq!(Barrier::resolve(DrainBarrier::Fence), Some(Barrier::Fence));
        let auto = Barrier::resolve(DrainBarrier::Auto).unwrap();
        let mb = Barrier::resolve(DrainBarrier::Membarrier);
        assert_eq!(mb.is_some(), auto == Barrier::Membarrier);
        // Both sides can run in either mode.
        for b in [Some(Barrier::Fence), mb].into_iter().flatten() {
            b.light();
            b.heavy();
            assert!(!b.name().is_empty());
        }
    }
}
