//! A lock for data one thread uses on almost every call and another thread
//! touches rarely (a CPU's own record, which another CPU searches only on
//! a cross-CPU unmap): one compare-exchange to take it, one store to give
//! it back, on the owner's own cache line. `std`'s mutex costs several
//! times that per call (poison checks on both ends, a swap to release).
//!
//! Taking it is an `Acquire` compare-exchange of `held` from false to true;
//! giving it back a `Release` store of false: every access to the value
//! happens while `held` is true and is ordered after the previous holder's
//! accesses (the loom model below checks it). A waiter spins, then yields
//! ([`Backoff`]); holders never wait on anything while they hold it, so a
//! wait lasts as long as one short critical section.

use std::fmt;

use super::{AtomicBool, Backoff, Ordering};

#[cfg(loom)]
use loom::cell::UnsafeCell;
#[cfg(not(loom))]
use std::cell::UnsafeCell;

/// A value behind a spin lock; reached through [`SpinLock::with`].
pub(crate) struct SpinLock<T> {
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only while `held` is owned (see the module
// comment), so it moves between threads as a `Mutex`'s value does.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SpinLock")
    }
}

/// Gives the lock back when dropped, also on a panic inside the closure.
struct Held<'a>(&'a AtomicBool);

impl Drop for Held<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<T> SpinLock<T> {
    /// A lock holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self {
            held: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Runs `f` on the value with the lock held.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        if self
            .held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.wait();
        }
        let _held = Held(&self.held);
        #[cfg(not(loom))]
        {
            // SAFETY: `held` is ours until `_held` drops: no other
            // reference to the value exists meanwhile.
            f(unsafe { &mut *self.value.get() })
        }
        #[cfg(loom)]
        {
            // SAFETY: as above.
            self.value.with_mut(|p| f(unsafe { &mut *p }))
        }
    }

    /// Waits until the lock is ours (another thread held it).
    #[cold]
    #[inline(never)]
    fn wait(&self) {
        let mut b = Backoff::default();
        loop {
            while self.held.load(Ordering::Relaxed) {
                b.snooze();
            }
            if self
                .held
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// The value, taken out (the lock is gone).
    #[cfg(test)]
    pub(crate) fn into_inner(self) -> T {
        self.value.into_inner()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_increment_of_two_threads_lands() {
        let l = Arc::new(SpinLock::new(0u64));
        let t = {
            let l = l.clone();
            std::thread::spawn(move || {
                for _ in 0..100_000 {
                    l.with(|v| *v += 1);
                }
            })
        };
        for _ in 0..100_000 {
            l.with(|v| *v += 1);
        }
        t.join().unwrap();
        let l = Arc::into_inner(l).unwrap();
        assert_eq!(l.into_inner(), 200_000);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Two threads' critical sections never overlap (loom reports a data
    /// race on the cell otherwise) and each sees the other's write.
    #[test]
    fn loom_spin_lock_excludes_and_publishes() {
        loom::model(|| {
            let l = Arc::new(SpinLock::new(0u64));
            let t = {
                let l = l.clone();
                loom::thread::spawn(move || l.with(|v| *v += 1))
            };
            l.with(|v| *v += 2);
            t.join().unwrap();
            assert_eq!(l.with(|v| *v), 3);
        });
    }
}
