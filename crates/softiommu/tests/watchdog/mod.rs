//! The watchdog the state-rule and fault-injection tests run their bodies
//! under: a regression that hangs fails its test instead of the run.

use std::sync::mpsc;
use std::time::Duration;

/// Far above what any body needs on a loaded 2-core machine: only a hang
/// reaches it.
pub const LIMIT: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread; fails the test if it panics or outlasts
/// [`LIMIT`].
pub fn timed(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(()) => h.join().expect("the test body"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test did not end within {LIMIT:?}"),
    }
}
