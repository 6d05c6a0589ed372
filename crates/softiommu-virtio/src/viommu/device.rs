//! [`ViommuDevice`]: a virtio-iommu device (virtio 1.2 §5.13) on the
//! virtio-mmio transport, on a thread of its own, backed by one unit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use softiommu::access::PhysGuestMemory;
use softiommu::hw::{System, UnitId};

use super::config::{ViommuConfig, ViommuError};
use super::domain::MappingRecord;
use super::events::Reporter;
use super::serve::Server;
use super::state::{Negotiated, State};
use super::stats::{bump, Counters, ViommuStats};
use crate::device_thread::{DeviceThreads, Lifecycle};
use crate::spec::iommu as s;
use crate::transport::{DeviceEnd, DeviceInfo, MmioTransport};

/// What the device thread and the handle share.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The request queue's server, taken with `state` held (after it):
    /// the device thread's, or the notifying thread's with
    /// [`ViommuConfig::serve_in_notifier`].
    serving: Mutex<Serving>,
    counters: Counters,
    /// Set to stop the thread; also heard by the state's bounded waits.
    stop: Arc<AtomicBool>,
}

/// The request queue's worker state.
#[derive(Debug, Default)]
struct Serving {
    server: Server,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running virtio-iommu device. Dropping it stops its thread.
#[derive(Debug)]
pub struct ViommuDevice {
    transport: MmioTransport,
    shared: Arc<Shared>,
    thread: DeviceThreads<ViommuError>,
}

impl ViommuDevice {
    /// Builds the device over `system`'s unit `unit` and starts its
    /// thread. Every endpoint is given its unattached context (bypass or
    /// none, as `cfg.bypass` says).
    pub fn spawn(
        cfg: ViommuConfig,
        system: Arc<System>,
        unit: UnitId,
    ) -> Result<Self, ViommuError> {
        cfg.check(&system, unit)?;
        let info = DeviceInfo {
            device_id: s::DEVICE_ID,
            features: cfg.features(),
            queues: 2,
            queue_max: cfg.queue_max,
            config: cfg.config_space(),
        };
        let transport = MmioTransport::new(info, cfg.transport);
        // §5.13.4.1: the driver may write `bypass`, 0 or 1; bits 1-7 are
        // masked off, so the device never presents another value.
        transport.allow_config_writes(s::CFG_BYPASS as u64, vec![0x01]);
        let stop = Arc::new(AtomicBool::new(false));
        let state = State::new(system.clone(), unit, &cfg, stop.clone())?;
        // From here on, not from whenever the thread first runs: a fault
        // in between is reported.
        let reporter = Reporter::new(state.unit());
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            serving: Mutex::new(Serving::default()),
            counters: Counters::default(),
            stop,
        });
        // §2.4 and §5.13.5: once the driver reads status 0, no endpoint
        // is attached — the reset is done in the status write itself.
        // Weak: the transport (which a driver may keep) does not keep the
        // device's state alive past the device.
        let weak = Arc::downgrade(&shared);
        transport.set_reset_hook(move || {
            if let Some(sh) = weak.upgrade() {
                let mut state = lock(&sh.state);
                if state.is_dirty() {
                    let _ = state.reset();
                }
            }
        });
        // §5.13.4.2: a driver that writes `bypass` may rely on it as soon
        // as the write returns (an unattached endpoint's next access
        // faults, or passes), so the write applies it; a switch the unit
        // refuses now is retried by the device thread's passes.
        let weak = Arc::downgrade(&shared);
        transport.set_config_hook(move |t| {
            if let Some(sh) = weak.upgrade() {
                let end = DeviceEnd::new(t);
                apply_bypass(t, &end, &mut lock(&sh.state), &sh.counters);
            }
        });
        let end = DeviceEnd::new(&transport);
        let mem = PhysGuestMemory::new(system.memory().clone());
        if cfg.serve_in_notifier {
            let (weak, mem, c) = (Arc::downgrade(&shared), mem.clone(), cfg.clone());
            transport.set_notify_hook(1 << s::REQUEST_QUEUE, move |t, _| {
                if let Some(sh) = weak.upgrade() {
                    let end = DeviceEnd::new(t);
                    // A round cut for its time leaves chains behind, and
                    // no notification will come for them: serve on, one
                    // round at a time (the state lock is let go between
                    // rounds, so a reset gets in).
                    while serve(&c, &end, &mem, &sh, &mut lock(&sh.state), true)
                        && lock_serving(&sh.serving).server.was_cut()
                    {}
                }
            });
        }
        let sh = shared.clone();
        let mut thread = DeviceThreads::with_stop(shared.stop.clone());
        thread
            .spawn(
                "virtio-iommu".into(),
                || Ok(()),
                move |(), _| run(&cfg, &end, &mem, &sh, reporter),
            )
            .map_err(|e| match e {
                Lifecycle::Spawn { errno, .. } => ViommuError::Spawn(errno),
                // `spawn` fails only to start the thread.
                _ => ViommuError::Spawn(0),
            })?;
        Ok(Self {
            transport,
            shared,
            thread,
        })
    }

    /// The register block a driver programs.
    pub fn transport(&self) -> &MmioTransport {
        &self.transport
    }

    /// Counters so far.
    pub fn stats(&self) -> ViommuStats {
        self.shared.counters.snapshot()
    }

    /// The mappings of `domain` as MAP requests created them (`None`:
    /// the domain does not exist).
    pub fn mappings(&self, domain: u32) -> Option<Vec<MappingRecord>> {
        lock(&self.shared.state).mappings(domain)
    }

    /// The domain `endpoint` is attached to.
    pub fn attached(&self, endpoint: u32) -> Option<u32> {
        lock(&self.shared.state).attached(endpoint)
    }

    /// Fault injection: the `nth` page-table unmap the device does from
    /// now (0: the next) fails as a table that broke its contract would,
    /// and its UNMAP request with it (`DEVERR`). An UNMAP is all or
    /// nothing, so the mappings it had removed before are installed
    /// again.
    pub fn inject_unmap_failure(&self, nth: u32) {
        lock(&self.shared.state).inject_unmap_failure(nth);
    }

    /// Fault injection: the next request tail the device writes (not an
    /// UNMAP's) is written by a thread preempted after it was given the
    /// slice: inside its translation section on the unit, it first sends
    /// on the first channel returned, then waits until the second is sent
    /// to (or dropped). For tests of what a bounce pool made meanwhile
    /// waits for.
    pub fn inject_access_stall(
        &self,
    ) -> (std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        lock_serving(&self.shared.serving)
            .server
            .inject_access_stall(entered_tx, release_rx);
        (entered_rx, release_tx)
    }

    /// Stops the thread (the endpoints keep their contexts).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let _ = self.thread.stop();
    }
}

impl Drop for ViommuDevice {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The device thread: each pass applies a reset or a new `bypass`, serves
/// one round of requests and reports faults; it sleeps at most
/// `idle_wait` when neither had work. With
/// [`ViommuConfig::serve_in_notifier`] the request queue is the notifying
/// thread's alone: the device thread never takes its chains (it would
/// take them while the notifier pays its modelled exit, make the
/// notifier wait on the state lock, and count that as work to busy-poll
/// for, taking a CPU from the threads that need it).
fn run(
    cfg: &ViommuConfig,
    end: &DeviceEnd,
    mem: &PhysGuestMemory,
    sh: &Shared,
    mut reporter: Reporter,
) {
    end.register_thread();
    let mut last_work = std::time::Instant::now();
    while !sh.stop.load(Ordering::Acquire) {
        let _ = end.take_notified();
        let mut busy = false;
        {
            let mut state = lock(&sh.state);
            busy |= serve(cfg, end, mem, sh, &mut state, !cfg.serve_in_notifier);
            // Its event writes inside the thread's section on the unit,
            // as the request queue's are (see `serve::sec`); without one
            // (no translator for the thread: the request queue is refused
            // the same way) no event is written this pass.
            busy |= softiommu::access::unit_section(state.unit(), || {
                reporter.poll(&state, end, mem, &sh.counters, cfg.fault_batch)
            })
            .unwrap_or(false);
        }
        if busy {
            last_work = std::time::Instant::now();
        } else if last_work.elapsed() < cfg.poll {
            // Busy polling, bounded by `poll` since the last work.
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(cfg.idle_wait);
        }
    }
}

/// One pass over the request queue, with `state` locked: applies a reset
/// or a new `bypass`, then serves one round if `requests`. Returns
/// whether chains were taken.
fn serve(
    cfg: &ViommuConfig,
    end: &DeviceEnd,
    mem: &PhysGuestMemory,
    sh: &Shared,
    state: &mut State,
    requests: bool,
) -> bool {
    let mut sv = lock_serving(&sh.serving);
    let sv = &mut *sv;
    apply_bypass(&end.transport(), end, state, &sh.counters);
    if end.features() == 0 && state.is_dirty() {
        let _ = state.reset();
    }
    let Some(mut g) = end.queue(s::REQUEST_QUEUE) else {
        return false;
    };
    let Some(q) = g.as_mut() else {
        return false;
    };
    // A new queue (QueueReady written 0, then 1) is not a reset: the
    // domains, mappings and attachments stay (§2.4, §5.13.5 clear them on
    // a device reset only, which the status write's hook carries out).
    // Before, a new queue generation reset the state, so a driver that
    // restarted its request queue lost every ATTACH and MAP, and with
    // `bypass` its endpoints went to pass-through.
    requests && sv.server.round(q, state, cfg, end, mem, &sh.counters)
}

fn lock_serving(m: &Mutex<Serving>) -> std::sync::MutexGuard<'_, Serving> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Applies the driver's `bypass` (§5.13.4.2) — only if it negotiated
/// `VIRTIO_IOMMU_F_BYPASS_CONFIG`, which it has once the device accepted
/// `FEATURES_OK` (§5.13.4.1: the driver may write `bypass` from then on,
/// before `DRIVER_OK` too, and the value holds when `DRIVER_OK` returns). A
/// device that did not negotiate it ignores the write, and puts back the
/// value it applies, so the config space never shows a mode the device is
/// not in. Before `FEATURES_OK` a value written waits. A switch to "no
/// bypass" that failed broke the device (every unattached endpoint is
/// blocked): reported here (`DEVICE_NEEDS_RESET`), so the writer learns
/// it as soon as its write returns.
fn apply_bypass(transport: &MmioTransport, end: &DeviceEnd, state: &mut State, c: &Counters) {
    let mut b = [0u8];
    transport.read_config(s::CFG_BYPASS as u64, &mut b);
    let asked = b[0] & 1 != 0;
    let features = end.accepted_features();
    if Negotiated::from_features(features).bypass_config {
        if state.set_bypass(asked).is_err() {
            if let Some(b) = state.take_broke() {
                if b.timed_out {
                    bump(&c.invalidation_timeouts, 1);
                }
                end.report(crate::transport::DeviceError::BackendFailed { what: b.what });
            }
        }
    } else if features != 0 && asked != state.bypass() {
        let mut cfg = vec![0u8; s::CONFIG_LEN];
        transport.read_config(0, &mut cfg);
        cfg[s::CFG_BYPASS] = u8::from(state.bypass());
        transport.update_config(&cfg);
    }
}
