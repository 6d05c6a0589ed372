//! Ctrl-C during a suite: the handler only raises a flag (all a signal
//! handler may safely do); the suite sees it between polls, keeps what
//! finished, marks the run partial and says so.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the SIGINT handler.
pub fn install() {
    let handler: extern "C" fn(libc::c_int) = on_sigint;
    // SAFETY: `signal` installs a handler that only stores to an atomic,
    // which is async-signal-safe; no other state is touched.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
}

/// Whether Ctrl-C was pressed since `install`.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
