//! The atomics the lock-free hit path is built on — from `std`, or from
//! `loom` under `cfg(loom)` so that the model checker explores the
//! interleavings (`loom_tests`) — and the asymmetric fence pair between an
//! access entering its section and an invalidation draining.
//!
//! # The fence pair
//! An access stores "active" in its slot and then loads the IOTLB; an
//! invalidation clears the IOTLB and then loads the slots (a Dekker
//! pattern): each side needs a full fence between its store and its load.
//! Accesses are millions per second and invalidations thousands, so the
//! cost goes to the rare side where the kernel allows: the access's fence
//! is a compiler fence and the invalidation calls Linux `membarrier(2)`
//! with `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, which runs a full memory
//! barrier on every CPU running a thread of this process before it returns
//! (a thread not running passes one when it is switched in) — the
//! guarantee a full fence in the access would have given, as the manual
//! page describes. Where the kernel lacks it, both sides use a `SeqCst`
//! fence; under loom, always (loom models those).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Which fence pair the process uses; chosen once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Barrier {
    /// Compiler fence per access, `membarrier(2)` per drain.
    #[cfg_attr(loom, allow(dead_code))]
    Membarrier,
    /// `SeqCst` fence on both sides.
    Fence,
}

/// `membarrier(2)` commands (Linux `include/uapi/linux/membarrier.h`).
#[cfg(not(loom))]
mod cmd {
    pub(super) const QUERY: libc::c_int = 0;
    pub(super) const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    pub(super) const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;
}

#[cfg(not(loom))]
fn membarrier(command: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes two integers (command, flags) and touches
    // no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, command, 0 as libc::c_int) }
}

impl Barrier {
    /// `Membarrier` if the kernel offers the private expedited command and
    /// registration succeeds, else `Fence`. Decided once per process, so
    /// every access and every drain agree.
    pub(crate) fn get() -> Self {
        #[cfg(loom)]
        {
            Barrier::Fence
        }
        #[cfg(not(loom))]
        {
            static CHOSEN: std::sync::OnceLock<Barrier> = std::sync::OnceLock::new();
            *CHOSEN.get_or_init(|| {
                let q = membarrier(cmd::QUERY);
                let has = q > 0
                    && q & libc::c_long::from(cmd::PRIVATE_EXPEDITED) != 0
                    && q & libc::c_long::from(cmd::REGISTER_PRIVATE_EXPEDITED) != 0;
                if has && membarrier(cmd::REGISTER_PRIVATE_EXPEDITED) == 0 {
                    Barrier::Membarrier
                } else {
                    Barrier::Fence
                }
            })
        }
    }

    /// The access's side, between its slot store and its IOTLB loads.
    #[inline(always)]
    pub(crate) fn light(self) {
        match self {
            #[cfg(not(loom))]
            Barrier::Membarrier => std::sync::atomic::compiler_fence(Ordering::SeqCst),
            _ => fence(Ordering::SeqCst),
        }
    }

    /// The drain's side, between its IOTLB stores and its slot loads.
    pub(crate) fn heavy(self) {
        match self {
            #[cfg(not(loom))]
            Barrier::Membarrier => {
                // Registered at `get`, so the one failure left is ENOMEM
                // (a CPU mask the kernel allocates per call where masks
                // live off the stack): backed off and retried for up to
                // 10 s. Past that, or on any other error, a fence keeps
                // this side correct only with the access's fence too, so
                // abort rather than race.
                // The clock is read only once a call failed.
                let mut start = None;
                let mut nap = std::time::Duration::from_micros(50);
                while membarrier(cmd::PRIVATE_EXPEDITED) != 0 {
                    let out_of_memory =
                        std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
                    let since = *start.get_or_insert_with(std::time::Instant::now);
                    if !out_of_memory || since.elapsed() >= std::time::Duration::from_secs(10) {
                        std::process::abort();
                    }
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(std::time::Duration::from_millis(50));
                }
            }
            _ => fence(Ordering::SeqCst),
        }
    }
}
