//! One device-thread lifecycle for every device of the crate: threads
//! started by name, each making its state on its own thread (translators
//! are per thread) and saying so before the device is handed out; one stop
//! flag; a bounded stop that unparks and joins; the threads' CPU clocks.
//!
//! # Contract
//! - [`DeviceThreads::spawn`] runs `setup` on the new thread; its error is
//!   what [`DeviceThreads::started`] returns (the first one met), its
//!   value is handed to `run` once the starter has been told.
//! - [`DeviceThreads::started`] waits at most [`START_TIMEOUT`] for every
//!   thread spawned so far.
//! - [`DeviceThreads::stop`] sets the stop flag, unparks each thread until
//!   it has finished (at most [`STOP_TIMEOUT`] in all) and joins it;
//!   it returns the threads' summed CPU time. A second call returns zero.
//! - `run` is expected to return soon after the stop flag is set (within
//!   its current batch) and to park, not sleep, when idle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cpu_clock::{self, ThreadClock};

/// How long [`DeviceThreads::started`] waits for the threads' setup.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`DeviceThreads::stop`] waits for the threads to finish.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A lifecycle step that failed; each device turns it into its own error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// The OS would not start a thread.
    Spawn {
        /// The OS error.
        reason: String,
        /// Its errno (0 if none).
        errno: i32,
    },
    /// A thread did not answer within the timeout.
    Timeout {
        /// "start" or "stop".
        what: &'static str,
        /// The timeout, in seconds.
        secs: u64,
    },
    /// A thread panicked (a bug, never a driver's doing).
    Panicked,
}

/// The threads of one device.
#[derive(Debug)]
pub(crate) struct DeviceThreads<E> {
    stop: Arc<AtomicBool>,
    threads: Vec<(JoinHandle<Duration>, Option<ThreadClock>)>,
    ready_tx: mpsc::Sender<Result<(), E>>,
    /// Only [`started`](Self::started) takes it (behind a lock so that a
    /// device holding its threads is `Sync`).
    ready_rx: Mutex<mpsc::Receiver<Result<(), E>>>,
    unanswered: usize,
}

impl<E: Send + 'static> DeviceThreads<E> {
    /// No thread yet; a fresh stop flag.
    pub(crate) fn new() -> Self {
        Self::with_stop(Arc::new(AtomicBool::new(false)))
    }

    /// No thread yet; `stop` is the flag the threads (and whoever else
    /// shares it) hear.
    pub(crate) fn with_stop(stop: Arc<AtomicBool>) -> Self {
        let (ready_tx, ready_rx) = mpsc::channel();
        Self {
            stop,
            threads: Vec::new(),
            ready_tx,
            ready_rx: Mutex::new(ready_rx),
            unanswered: 0,
        }
    }

    /// Starts a thread named `name`: `setup` makes its state there (an
    /// error is reported to [`started`](Self::started) and ends the
    /// thread), then `run` serves until the stop flag is set.
    pub(crate) fn spawn<W>(
        &mut self,
        name: String,
        setup: impl FnOnce() -> Result<W, E> + Send + 'static,
        run: impl FnOnce(W, &AtomicBool) + Send + 'static,
    ) -> Result<(), Lifecycle> {
        let (stop, ready) = (self.stop.clone(), self.ready_tx.clone());
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let w = match setup() {
                    Ok(w) => w,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return Duration::ZERO;
                    }
                };
                let _ = ready.send(Ok(()));
                drop(ready);
                run(w, &stop);
                cpu_clock::thread()
            })
            .map_err(|e| Lifecycle::Spawn {
                errno: e.raw_os_error().unwrap_or(0),
                reason: e.to_string(),
            })?;
        let clock = ThreadClock::of(&h);
        self.threads.push((h, clock));
        self.unanswered += 1;
        Ok(())
    }

    /// Waits (at most [`START_TIMEOUT`]) until every thread spawned so far
    /// has made its state; the first setup error, if any.
    pub(crate) fn started(&mut self) -> Result<(), Started<E>> {
        let deadline = Instant::now() + START_TIMEOUT;
        let rx = self.ready_rx.get_mut().unwrap_or_else(|p| p.into_inner());
        while self.unanswered > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(r) => {
                    self.unanswered -= 1;
                    r.map_err(Started::Setup)?;
                }
                Err(_) => {
                    return Err(Started::Thread(Lifecycle::Timeout {
                        what: "start",
                        secs: START_TIMEOUT.as_secs(),
                    }))
                }
            }
        }
        Ok(())
    }

    /// Threads running (spawned and not yet stopped).
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }

    /// CPU time the threads have used so far, summed (a thread whose clock
    /// the kernel will not give counts zero).
    pub(crate) fn cpu_time(&self) -> Duration {
        self.threads
            .iter()
            .filter_map(|(_, c)| c.and_then(|c| c.read()))
            .sum()
    }

    /// Stops the threads and returns their CPU time (see the contract).
    /// Every thread is waited for, within one shared bound: a thread that
    /// panicked does not keep the others from being joined, and one that
    /// did not finish in time stays tracked (a later `stop`, e.g. the
    /// device's drop, waits for it again) instead of being detached. The
    /// first failure is returned once every thread has been seen.
    pub(crate) fn stop(&mut self) -> Result<Duration, Lifecycle> {
        self.stop.store(true, Ordering::Release);
        let mut total = Duration::ZERO;
        let mut first_err = None;
        let t0 = Instant::now();
        let mut still = Vec::new();
        for (h, clock) in std::mem::take(&mut self.threads) {
            while !h.is_finished() && t0.elapsed() <= STOP_TIMEOUT {
                h.thread().unpark();
                std::thread::sleep(Duration::from_millis(1));
            }
            if !h.is_finished() {
                first_err.get_or_insert(Lifecycle::Timeout {
                    what: "stop",
                    secs: STOP_TIMEOUT.as_secs(),
                });
                still.push((h, clock));
                continue;
            }
            match h.join() {
                Ok(cpu) => total += cpu,
                Err(_) => {
                    first_err.get_or_insert(Lifecycle::Panicked);
                }
            }
        }
        self.threads = still;
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }
}

/// Why [`DeviceThreads::started`] failed.
#[derive(Debug)]
pub(crate) enum Started<E> {
    /// A thread's setup failed.
    Setup(E),
    /// A lifecycle step failed.
    Thread(Lifecycle),
}

impl<E> Started<E> {
    /// The device's error for it.
    pub(crate) fn into_error(self) -> E
    where
        E: From<Lifecycle>,
    {
        match self {
            Started::Setup(e) => e,
            Started::Thread(l) => l.into(),
        }
    }
}

/// Pins the calling thread to `cpu`, if one is named (a CPU the kernel
/// refuses is ignored): a device's worker threads, where its
/// configuration names one, and a workload's driver threads.
pub(crate) fn pin(cpu: Option<usize>) {
    if let Some(c) = cpu {
        crate::affinity::pin_current(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    enum E {
        Setup(u32),
        Life(Lifecycle),
    }

    impl From<Lifecycle> for E {
        fn from(l: Lifecycle) -> Self {
            E::Life(l)
        }
    }

    fn park_until(stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            std::thread::park_timeout(Duration::from_millis(50));
        }
    }

    #[test]
    fn threads_start_after_their_setup_and_stop_with_their_cpu_time() {
        let mut t = DeviceThreads::<E>::new();
        for i in 0..3u32 {
            t.spawn(format!("t{i}"), move || Ok(i), |_, stop| park_until(stop))
                .unwrap();
        }
        t.started().unwrap();
        assert_eq!(t.len(), 3);
        let _ = t.cpu_time();
        assert!(t.stop().is_ok());
        assert_eq!(t.len(), 0);
        assert_eq!(t.stop(), Ok(Duration::ZERO));
    }

    #[test]
    fn a_setup_error_is_what_started_returns() {
        let mut t = DeviceThreads::<E>::new();
        t.spawn("ok".into(), || Ok(()), |_, stop| park_until(stop))
            .unwrap();
        t.spawn("bad".into(), || Err::<(), _>(E::Setup(7)), |_, _| {})
            .unwrap();
        let e = t.started().unwrap_err().into_error();
        assert_eq!(e, E::Setup(7));
        assert!(t.stop().is_ok());
    }

    #[test]
    fn a_panicking_thread_is_reported_not_propagated() {
        let mut t = DeviceThreads::<E>::new();
        t.spawn(
            "panics".into(),
            || Ok(()),
            |_, _| panic!("device thread bug (expected by the test)"),
        )
        .unwrap();
        t.started().unwrap();
        assert_eq!(t.stop(), Err(Lifecycle::Panicked));
    }

    #[test]
    fn a_panicking_thread_does_not_keep_the_others_from_being_joined() {
        let done = Arc::new(AtomicBool::new(false));
        let mut t = DeviceThreads::<E>::new();
        t.spawn(
            "panics".into(),
            || Ok(()),
            |_, _| panic!("device thread bug (expected by the test)"),
        )
        .unwrap();
        let d = done.clone();
        t.spawn(
            "slow to stop".into(),
            || Ok(()),
            move |_, stop| {
                park_until(stop);
                // Still at work a little after the stop flag: `stop` must
                // wait for it, not return at the first thread's panic.
                std::thread::sleep(Duration::from_millis(50));
                d.store(true, Ordering::Release);
            },
        )
        .unwrap();
        t.started().unwrap();
        assert_eq!(t.stop(), Err(Lifecycle::Panicked));
        assert!(
            done.load(Ordering::Acquire),
            "the second thread was detached"
        );
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_shared_stop_flag_is_the_one_the_threads_hear() {
        let flag = Arc::new(AtomicBool::new(false));
        let mut t = DeviceThreads::<E>::with_stop(flag.clone());
        t.spawn("t".into(), || Ok(()), |_, stop| park_until(stop))
            .unwrap();
        t.started().unwrap();
        assert!(t.stop().is_ok());
        assert!(flag.load(Ordering::Acquire));
    }
}
