//! [`MmioTransport`]: the virtio-mmio register block (virtio 1.2 §4.2.2)
//! a driver programs, with feature negotiation, the status state machine
//! and queue setup.
//!
//! Setup registers live under one lock (`regs`): they are written a few
//! dozen times per device life. The three registers a driver touches per
//! packet or per interrupt — `QueueNotify`, `InterruptStatus`,
//! `InterruptACK` — and `Status` are atomics, so the data path takes no
//! lock. What the device threads work on (the live queues) sits in one
//! lock per queue, the [`Engine`]'s slots: a device thread holds a queue's
//! slot for one bounded batch at a time, so devices with several threads
//! (one per group of queues) never wait for each other; a register write
//! that changes a queue (reset, `DRIVER_OK`, `QueueReady`) takes its slot
//! too, and so waits for the batch in flight on it to end: when a reset
//! returns, the device no longer uses the old rings. Lock order: `regs`,
//! then the slots in ascending queue order; a device thread holds at most
//! one slot at a time.
//!
//! Notifications and interrupts can be routed per queue: a device thread
//! registers for the queues it serves (a `QueueNotify` of one of them
//! wakes it), and a driver thread can bind one queue's used-buffer
//! interrupts to itself, as MSI-X vectors do on PCI (virtio-mmio has one
//! interrupt line; the routing is the platform's, not a register's).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::error::{DeviceError, ErrorLog};
use super::queue::{DeviceQueue, QueueLayout};
use crate::spec::{self, feature, isr, reg, status};

/// What a device model tells its transport about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// §5: the device type (1 for a network card).
    pub device_id: u32,
    /// Device-type features offered (the transport adds `VERSION_1` and
    /// `ACCESS_PLATFORM`).
    pub features: u64,
    /// Virtqueues.
    pub queues: u16,
    /// `QueueNumMax` of every queue: a power of two.
    pub queue_max: u16,
    /// The device-specific configuration space (§4.2.2 offset 0x100).
    pub config: Vec<u8>,
}

/// Transport policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportConfig {
    /// Refuse `FEATURES_OK` unless the driver accepts
    /// `VIRTIO_F_ACCESS_PLATFORM` (§6.1: "A device MAY fail to operate
    /// further if VIRTIO_F_ACCESS_PLATFORM is not accepted"). On by default:
    /// our devices reach memory only through the IOMMU, so a driver that
    /// hands them physical addresses is wrong. A driver that predates the
    /// bit but maps its buffers anyway (rcore's `virtio-drivers`, whose HAL
    /// returns IOVAs) can be served with it off.
    pub require_access_platform: bool,
    /// Device-specific features (a mask of offered bits) without which
    /// the device cannot work as the specification defines it:
    /// `FEATURES_OK` is refused unless the driver accepts every one
    /// (§2.2.2: "The device SHOULD accept any valid subset of features
    /// the driver accepts, otherwise it MUST fail to set the FEATURES_OK
    /// device status bit"). 0 by default.
    pub required_features: u64,
    /// A stated model of what a `QueueNotify` write costs the notifying
    /// CPU in a virtual machine: the trap to the hypervisor and back (a
    /// VM exit and entry, and the ioeventfd signal between). The writer
    /// busy-waits this long before the device sees the notification.
    /// Zero (the default): a notification costs what the register write
    /// costs here.
    pub notify_exit: Duration,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            require_access_platform: true,
            required_features: 0,
            notify_exit: Duration::ZERO,
        }
    }
}

/// Whether a queue's registers may be written, or a queue made ready, in
/// device status `st`: after `FEATURES_OK` (§3.1.1: queues are set up
/// after the features are accepted) and while neither `FAILED` (the
/// driver gave up) nor `DEVICE_NEEDS_RESET` (the device stopped; §2.1.1:
/// the driver resets it) is set. Before: a stopped queue could be set up
/// again and served under `DEVICE_NEEDS_RESET`.
fn queue_setup_allowed(st: u32) -> bool {
    st & status::FEATURES_OK != 0 && st & (status::FAILED | status::DEVICE_NEEDS_RESET) == 0
}

/// Busy-waits `d` on the calling thread (a modelled cost that must take
/// CPU time, as a VM exit does, not sleep).
fn spin_for(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Driver-owned status bits (the device owns `DEVICE_NEEDS_RESET`).
const DRIVER_BITS: u32 =
    status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK | status::FAILED;

/// One queue's registers as the driver wrote them.
#[derive(Debug, Clone, Copy, Default)]
struct QueueRegs {
    /// `QueueNum`; 0 while unset or refused.
    num: u16,
    ready: bool,
    desc: u64,
    driver: u64,
    device: u64,
}

/// The setup registers.
#[derive(Debug)]
pub(crate) struct Regs {
    device_features_sel: u32,
    driver_features_sel: u32,
    pub(crate) driver_features: u64,
    queue_sel: u32,
    queues: Vec<QueueRegs>,
    config: Vec<u8>,
    config_generation: u32,
}

/// One queue's slot: the live queue, once the driver made it live
/// (`DRIVER_OK` and `QueueReady`). Reached through
/// [`DeviceEnd::queue`](super::DeviceEnd::queue).
pub type QueueSlot = Option<DeviceQueue>;

/// A held queue slot: the device owns the queue for one bounded batch.
pub type QueueGuard<'a> = MutexGuard<'a, QueueSlot>;

/// What the device threads work on: the live queues, one lock each, and
/// the negotiated features.
#[derive(Debug, Default)]
pub(crate) struct Engine {
    /// Queue `i`'s slot.
    pub(crate) queues: Vec<Mutex<QueueSlot>>,
    /// Features negotiated (0 until `DRIVER_OK`). Release at `DRIVER_OK`,
    /// before any queue goes live.
    pub(crate) features: AtomicU64,
}

impl Engine {
    /// Clears every slot, in ascending order, each after the batch in
    /// flight on it.
    fn clear(&self) {
        for q in &self.queues {
            *lock(q) = None;
        }
    }
}

/// State shared by the register block and the device thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) info: DeviceInfo,
    pub(crate) cfg: TransportConfig,
    pub(crate) regs: Mutex<Regs>,
    pub(crate) status: AtomicU32,
    pub(crate) isr: AtomicU32,
    /// Bit `q`: queue `q` was notified since the device last looked.
    pub(crate) notify: AtomicU64,
    pub(crate) engine: Engine,
    pub(crate) errors: ErrorLog,
    /// The device thread, woken by a notification of a queue no other
    /// thread registered for.
    pub(crate) device_thread: OnceLock<Thread>,
    /// Per queue: the device thread serving it, if one registered.
    pub(crate) queue_threads: Vec<OnceLock<Thread>>,
    /// The driver thread an interrupt wakes.
    irq_thread: Mutex<Option<Thread>>,
    /// Per queue: the driver thread its used-buffer interrupts wake, if
    /// one is bound (else `irq_thread`).
    queue_irq: Vec<Mutex<Option<Thread>>>,
    pub(crate) interrupts: AtomicU64,
    pub(crate) notifies: AtomicU64,
    /// The config bytes a driver may write: `(offset, per-byte bit mask)`
    /// (unset: none, the config space is read-only).
    config_writable: OnceLock<(u64, Vec<u8>)>,
    /// What the device does, synchronously, when the driver resets it.
    reset_hook: OnceLock<ResetHook>,
    /// What the device does, synchronously, with a notification of the
    /// queues in its mask (a hypervisor handling the exit on the
    /// notifying CPU), instead of waking its thread.
    notify_hook: OnceLock<NotifyHook>,
    /// What the device does, synchronously, with a driver's accepted
    /// config write.
    config_hook: OnceLock<ConfigHook>,
}

/// A device's work on a driver's accepted config write, given the
/// transport.
struct ConfigHook(Box<dyn Fn(&MmioTransport) + Send + Sync>);

impl std::fmt::Debug for ConfigHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigHook")
    }
}

/// A device's reset work, run by the driver's status write of 0.
struct ResetHook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for ResetHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResetHook")
    }
}

/// A device's notification work: the queues it covers (bit `q`) and the
/// work, given the transport and the queue.
struct NotifyHook(u64, Box<NotifyFn>);

/// The work of a [`NotifyHook`].
type NotifyFn = dyn Fn(&MmioTransport, u32) + Send + Sync;

impl std::fmt::Debug for NotifyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NotifyHook({:#x})", self.0)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Records `e`; if it breaks the device, sets `DEVICE_NEEDS_RESET` and
    /// sends a configuration-change interrupt (§2.1.2: "the device MUST
    /// send a device configuration change notification").
    pub(crate) fn report(&self, e: DeviceError) {
        let reset = e.needs_reset();
        self.errors.record(e);
        if reset {
            self.status
                .fetch_or(status::DEVICE_NEEDS_RESET, Ordering::AcqRel);
            self.interrupt(isr::CONFIG_CHANGE);
        }
    }

    /// Sets `bits` in `InterruptStatus` and wakes the driver's thread.
    pub(crate) fn interrupt(&self, bits: u32) {
        // Release: the used-ring updates before it are visible to a driver
        // that reads the status with Acquire.
        self.isr.fetch_or(bits, Ordering::AcqRel);
        self.interrupts.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = lock(&self.irq_thread).as_ref() {
            t.unpark();
        }
    }

    /// A used-buffer interrupt of queue `q`: wakes the thread bound to the
    /// queue, or the device's interrupt thread when none is.
    pub(crate) fn queue_interrupt(&self, q: u16) {
        let Some(slot) = self.queue_irq.get(usize::from(q)) else {
            return self.interrupt(isr::USED_BUFFER);
        };
        let bound = lock(slot).clone();
        match bound {
            Some(t) => {
                // Release: as in `interrupt`.
                self.isr.fetch_or(isr::USED_BUFFER, Ordering::AcqRel);
                self.interrupts.fetch_add(1, Ordering::Relaxed);
                t.unpark();
            }
            None => self.interrupt(isr::USED_BUFFER),
        }
    }

    fn device_features(&self) -> u64 {
        self.info.features | 1 << feature::VERSION_1 | 1 << feature::ACCESS_PLATFORM
    }
}

/// The register block of one virtio-mmio device: what a VMM maps at the
/// device's MMIO window and forwards guest accesses to, and what a driver
/// in this process programs directly. Cheap to clone (a shared handle).
#[derive(Debug, Clone)]
pub struct MmioTransport {
    pub(crate) shared: Arc<Shared>,
}

impl MmioTransport {
    /// A transport for a device described by `info`.
    pub fn new(info: DeviceInfo, cfg: TransportConfig) -> Self {
        let n = usize::from(info.queues);
        let queues = vec![QueueRegs::default(); n];
        let engine_queues = (0..n).map(|_| Mutex::new(None)).collect();
        let regs = Regs {
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            queues,
            config: info.config.clone(),
            config_generation: 0,
        };
        Self {
            shared: Arc::new(Shared {
                info,
                cfg,
                regs: Mutex::new(regs),
                status: AtomicU32::new(0),
                isr: AtomicU32::new(0),
                notify: AtomicU64::new(0),
                engine: Engine {
                    queues: engine_queues,
                    features: AtomicU64::new(0),
                },
                errors: ErrorLog::default(),
                device_thread: OnceLock::new(),
                queue_threads: (0..n).map(|_| OnceLock::new()).collect(),
                irq_thread: Mutex::new(None),
                queue_irq: (0..n).map(|_| Mutex::new(None)).collect(),
                interrupts: AtomicU64::new(0),
                notifies: AtomicU64::new(0),
                config_writable: OnceLock::new(),
                reset_hook: OnceLock::new(),
                notify_hook: OnceLock::new(),
                config_hook: OnceLock::new(),
            }),
        }
    }

    /// The errors recorded so far (kept ones; see [`ErrorLog`]).
    pub fn errors(&self) -> &ErrorLog {
        &self.shared.errors
    }

    /// The device status (`Status` register).
    pub fn status(&self) -> u32 {
        self.shared.status.load(Ordering::Acquire)
    }

    /// Makes `thread` the one an interrupt wakes (`unpark`), as an
    /// interrupt line to a CPU.
    pub fn bind_interrupt(&self, thread: Thread) {
        *lock(&self.shared.irq_thread) = Some(thread);
    }

    /// Makes `thread` the one queue `queue`'s used-buffer interrupts wake
    /// (a per-queue vector, as MSI-X gives on PCI); configuration-change
    /// interrupts still go to the thread of
    /// [`bind_interrupt`](Self::bind_interrupt). Returns `false` for a
    /// queue the device does not have.
    pub fn bind_queue_interrupt(&self, queue: u16, thread: Thread) -> bool {
        match self.shared.queue_irq.get(usize::from(queue)) {
            Some(slot) => {
                *lock(slot) = Some(thread);
                true
            }
            None => false,
        }
    }

    /// Interrupts raised over the device's life.
    pub fn interrupts_raised(&self) -> u64 {
        self.shared.interrupts.load(Ordering::Relaxed)
    }

    /// `QueueNotify` writes that reached the device.
    pub fn notifications(&self) -> u64 {
        self.shared.notifies.load(Ordering::Relaxed)
    }

    /// Replaces the config space (e.g. a link-status change) and bumps
    /// `ConfigGeneration` (§4.2.2.1), then sends a configuration-change
    /// interrupt. Bytes past the original length are ignored.
    pub fn update_config(&self, config: &[u8]) {
        {
            let mut r = lock(&self.shared.regs);
            let n = r.config.len().min(config.len());
            r.config[..n].copy_from_slice(&config[..n]);
            r.config_generation = r.config_generation.wrapping_add(1);
        }
        self.shared.interrupt(isr::CONFIG_CHANGE);
    }

    /// Lets the driver write the bits of `mask[i]` in config byte
    /// `offset + i` (a device with a writable field, e.g. a virtio-iommu's
    /// `bypass`); other bits of those bytes keep their value. Set once,
    /// before the driver runs; returns whether this call set it.
    pub fn allow_config_writes(&self, offset: u64, mask: Vec<u8>) -> bool {
        self.shared.config_writable.set((offset, mask)).is_ok()
    }

    /// Sets the work a device must finish within a reset (§2.4: the
    /// driver reads `status` 0 only once the reset is complete): `hook`
    /// runs in the driver's status write of 0, after every queue has
    /// stopped (each batch in flight has ended) and before `status` reads
    /// 0. It runs with no transport lock held; it must not wait for the
    /// driver. Set once; returns whether this call set it.
    pub fn set_reset_hook(&self, hook: impl Fn() + Send + Sync + 'static) -> bool {
        self.shared
            .reset_hook
            .set(ResetHook(Box::new(hook)))
            .is_ok()
    }

    /// Sets the work a device does with a driver's accepted config write
    /// ([`write_config`](Self::write_config)), inside that write: a field
    /// whose effect the driver may rely on as soon as its write returns
    /// (a virtio-iommu's `bypass`, §5.13.4.2) takes effect before it
    /// does. `hook` gets the transport; it runs with no transport lock
    /// held and must bound its work. Set once; returns whether this call
    /// set it.
    pub fn set_config_hook(&self, hook: impl Fn(&MmioTransport) + Send + Sync + 'static) -> bool {
        self.shared
            .config_hook
            .set(ConfigHook(Box::new(hook)))
            .is_ok()
    }

    /// Sets the work a notification of a queue in `mask` (bit `q` for
    /// queue `q`) does on the notifying thread, inside its `QueueNotify`
    /// write and after the modelled exit, instead of waking a device
    /// thread: a hypervisor that handles the exit on the trapping CPU.
    /// `hook` gets the transport and the queue; it runs with no transport
    /// lock held and must bound its work. Set once; returns whether this
    /// call set it.
    pub fn set_notify_hook(
        &self,
        mask: u64,
        hook: impl Fn(&MmioTransport, u32) + Send + Sync + 'static,
    ) -> bool {
        self.shared
            .notify_hook
            .set(NotifyHook(mask, Box::new(hook)))
            .is_ok()
    }

    /// A driver's write of `bytes` at config `offset` (§4.2.2: the device
    /// configuration space takes 8-, 16- and 32-bit accesses). Each byte
    /// inside the window [`allow_config_writes`](Self::allow_config_writes)
    /// opened takes the bits of its mask (the others keep their value); a
    /// byte outside it must leave the config space as it is (a 32-bit
    /// write that carries a writable byte and its read-only neighbours
    /// unchanged). Otherwise — no window, a byte past the config space, or
    /// a read-only byte changed — nothing is written and the write is
    /// recorded as [`DeviceError::ConfigWrite`]. An accepted write runs
    /// the device's [config hook](Self::set_config_hook), if it set one,
    /// then wakes the device thread.
    pub fn write_config(&self, offset: u64, bytes: &[u8]) {
        let s = &*self.shared;
        let refuse = || s.report(DeviceError::ConfigWrite { offset });
        let Some((at, mask)) = s.config_writable.get() else {
            return refuse();
        };
        {
            let mut r = lock(&s.regs);
            // The new value of each byte, or `None` for a refused write.
            let mut new = Vec::with_capacity(bytes.len());
            for (i, &b) in bytes.iter().enumerate() {
                let o = offset.checked_add(i as u64);
                let cur = o.and_then(|o| r.config.get(usize::try_from(o).ok()?).copied());
                let (Some(o), Some(cur)) = (o, cur) else {
                    drop(r);
                    return refuse();
                };
                let m = o
                    .checked_sub(*at)
                    .and_then(|k| mask.get(usize::try_from(k).ok()?))
                    .copied()
                    .unwrap_or(0);
                if (b ^ cur) & !m != 0 {
                    drop(r);
                    return refuse();
                }
                new.push((o as usize, (cur & !m) | (b & m)));
            }
            for (o, v) in new {
                r.config[o] = v;
            }
        }
        if let Some(h) = s.config_hook.get() {
            (h.0)(self);
        }
        if let Some(t) = s.device_thread.get() {
            t.unpark();
        }
    }

    /// Reads `buf.len()` bytes of config space at `offset` (bytes past its
    /// end read as zero, and a read wholly past it is recorded).
    pub fn read_config(&self, offset: u64, buf: &mut [u8]) {
        let r = lock(&self.shared.regs);
        let len = r.config.len() as u64;
        if offset >= len && !buf.is_empty() {
            drop(r);
            self.shared.report(DeviceError::BadRegister {
                offset: reg::CONFIG.saturating_add(offset),
                op: "read",
            });
            buf.fill(0);
            return;
        }
        for (i, b) in buf.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .filter(|&o| o < len)
                .map_or(0, |o| r.config[o as usize]);
        }
    }

    /// A 32-bit read of the register at `offset` (§4.2.2). Unknown or
    /// write-only registers read as zero and are recorded.
    pub fn read(&self, offset: u64) -> u32 {
        let s = &*self.shared;
        if offset >= reg::CONFIG {
            let mut b = [0u8; 4];
            self.read_config(offset - reg::CONFIG, &mut b);
            return u32::from_le_bytes(b);
        }
        match offset {
            reg::MAGIC_VALUE => return spec::MMIO_MAGIC,
            reg::VERSION => return spec::MMIO_VERSION,
            reg::DEVICE_ID => return s.info.device_id,
            reg::VENDOR_ID => return spec::VENDOR_ID,
            // Acquire: pairs with the device's release in `interrupt`.
            reg::INTERRUPT_STATUS => return s.isr.load(Ordering::Acquire),
            reg::STATUS => return s.status.load(Ordering::Acquire),
            // §4.2.2: a region that does not exist has length -1.
            reg::SHM_LEN_LOW | reg::SHM_LEN_HIGH | reg::SHM_BASE_LOW | reg::SHM_BASE_HIGH => {
                return u32::MAX
            }
            _ => {}
        }
        let r = lock(&s.regs);
        match offset {
            reg::DEVICE_FEATURES => match r.device_features_sel {
                0 => s.device_features() as u32,
                1 => (s.device_features() >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => {
                if (r.queue_sel as usize) < r.queues.len() {
                    u32::from(s.info.queue_max)
                } else {
                    0
                }
            }
            reg::QUEUE_READY => r
                .queues
                .get(r.queue_sel as usize)
                .map_or(0, |q| u32::from(q.ready)),
            reg::CONFIG_GENERATION => r.config_generation,
            _ => {
                drop(r);
                s.report(DeviceError::BadRegister { offset, op: "read" });
                0
            }
        }
    }

    /// The driver's queue set-up (§4.2.3.2): selects `queue`, writes its
    /// size and the descriptor, driver and device areas' addresses
    /// `(desc, avail, used)` as 32-bit halves, then sets `QueueReady`. The
    /// one path every driver here programs a queue by; what the device
    /// makes of bad values is the register writes' business.
    pub fn program_queue(&self, queue: u16, size: u16, (desc, avail, used): (u64, u64, u64)) {
        self.write(reg::QUEUE_SEL, u32::from(queue));
        self.write(reg::QUEUE_NUM, u32::from(size));
        for (lo, v) in [
            (reg::QUEUE_DESC_LOW, desc),
            (reg::QUEUE_DRIVER_LOW, avail),
            (reg::QUEUE_DEVICE_LOW, used),
        ] {
            self.write(lo, v as u32);
            self.write(lo + 4, (v >> 32) as u32);
        }
        self.write(reg::QUEUE_READY, 1);
    }

    /// A 32-bit write of `value` to the register at `offset` (§4.2.2).
    /// Bad writes are recorded (see [`DeviceError`]); none panics.
    pub fn write(&self, offset: u64, value: u32) {
        let s = &*self.shared;
        // The data path first, without the setup lock.
        match offset {
            reg::QUEUE_NOTIFY => return self.notify(value),
            reg::INTERRUPT_ACK => {
                s.isr.fetch_and(!value, Ordering::AcqRel);
                return;
            }
            _ => {}
        }
        if offset >= reg::CONFIG {
            self.write_config(offset - reg::CONFIG, &value.to_le_bytes());
            return;
        }
        let mut r = lock(&s.regs);
        let st = s.status.load(Ordering::Acquire);
        match offset {
            reg::DEVICE_FEATURES_SEL => r.device_features_sel = value,
            reg::DRIVER_FEATURES_SEL => r.driver_features_sel = value,
            reg::DRIVER_FEATURES => {
                if st & status::FEATURES_OK != 0 {
                    drop(r);
                    s.report(DeviceError::LateWrite { offset, status: st });
                    return;
                }
                match r.driver_features_sel {
                    0 => r.driver_features = (r.driver_features & !0xffff_ffff) | u64::from(value),
                    1 => {
                        r.driver_features =
                            (r.driver_features & 0xffff_ffff) | u64::from(value) << 32
                    }
                    // Features past bit 63 do not exist; writing zero
                    // there is harmless, anything else is refused later.
                    _ if value == 0 => {}
                    _ => r.driver_features |= 1 << 63,
                }
            }
            reg::QUEUE_SEL => r.queue_sel = value,
            reg::QUEUE_NUM
            | reg::QUEUE_DESC_LOW
            | reg::QUEUE_DESC_HIGH
            | reg::QUEUE_DRIVER_LOW
            | reg::QUEUE_DRIVER_HIGH
            | reg::QUEUE_DEVICE_LOW
            | reg::QUEUE_DEVICE_HIGH => self.queue_layout_write(r, offset, value, st),
            reg::QUEUE_READY => self.queue_ready_write(r, value, st),
            reg::STATUS => self.status_write(r, value, st),
            reg::SHM_SEL => {}
            _ => {
                drop(r);
                s.report(DeviceError::BadRegister {
                    offset,
                    op: "write",
                });
            }
        }
    }

    fn notify(&self, value: u32) {
        let s = &*self.shared;
        let st = s.status.load(Ordering::Acquire);
        if st == 0 {
            // A kick that raced the reset (another CPU's, late): ignored and
            // recorded, but no `DEVICE_NEEDS_RESET`, which would carry into
            // the next initialisation and refuse its queue set-up.
            s.report(DeviceError::LateWrite {
                offset: reg::QUEUE_NOTIFY,
                status: st,
            });
            return;
        }
        if st & status::DRIVER_OK == 0 {
            s.report(DeviceError::NotifyBeforeDriverOk {
                queue: value,
                status: st,
            });
            return;
        }
        if value >= u32::from(s.info.queues) || value >= 64 {
            s.report(DeviceError::NoSuchQueue {
                queue: value,
                queues: s.info.queues,
            });
            return;
        }
        if !s.cfg.notify_exit.is_zero() {
            spin_for(s.cfg.notify_exit);
        }
        s.notifies.fetch_add(1, Ordering::Relaxed);
        // Release: the ring updates the driver made before notifying are
        // visible to the device that takes the bit with Acquire.
        s.notify.fetch_or(1 << value, Ordering::AcqRel);
        if let Some(h) = s.notify_hook.get().filter(|h| h.0 & 1 << value != 0) {
            return (h.1)(self, value);
        }
        let serving = s.queue_threads.get(value as usize).and_then(OnceLock::get);
        if let Some(t) = serving.or_else(|| s.device_thread.get()) {
            t.unpark();
        }
    }

    fn selected<'r>(&self, r: &'r mut Regs) -> Result<(u16, &'r mut QueueRegs), DeviceError> {
        let sel = r.queue_sel;
        let n = r.queues.len();
        match r.queues.get_mut(sel as usize) {
            Some(q) => Ok((sel as u16, q)),
            None => Err(DeviceError::NoSuchQueue {
                queue: sel,
                queues: n as u16,
            }),
        }
    }

    fn queue_layout_write(&self, mut r: MutexGuard<'_, Regs>, offset: u64, value: u32, st: u32) {
        let s = &*self.shared;
        let max = s.info.queue_max;
        let (index, q) = match self.selected(&mut r) {
            Ok(x) => x,
            Err(e) => {
                drop(r);
                s.report(e);
                return;
            }
        };
        if q.ready || !queue_setup_allowed(st) {
            drop(r);
            s.report(DeviceError::LateWrite { offset, status: st });
            return;
        }
        let lo = |old: u64| (old & !0xffff_ffff) | u64::from(value);
        let hi = |old: u64| (old & 0xffff_ffff) | u64::from(value) << 32;
        match offset {
            reg::QUEUE_NUM => {
                let ok = value != 0 && value <= u32::from(max) && value.is_power_of_two();
                if ok {
                    q.num = value as u16;
                } else {
                    q.num = 0;
                    drop(r);
                    s.report(DeviceError::QueueSizeInvalid {
                        queue: index,
                        size: value,
                        max,
                    });
                }
            }
            reg::QUEUE_DESC_LOW => q.desc = lo(q.desc),
            reg::QUEUE_DESC_HIGH => q.desc = hi(q.desc),
            reg::QUEUE_DRIVER_LOW => q.driver = lo(q.driver),
            reg::QUEUE_DRIVER_HIGH => q.driver = hi(q.driver),
            reg::QUEUE_DEVICE_LOW => q.device = lo(q.device),
            _ => q.device = hi(q.device),
        }
    }

    /// Checks a queue's layout (§2.7's alignment table, and every ring
    /// inside the 64-bit address space) before it goes live.
    fn layout(index: u16, q: &QueueRegs) -> Result<QueueLayout, DeviceError> {
        let bad = |what, addr, align| DeviceError::QueueLayoutInvalid {
            queue: index,
            what,
            addr,
            align,
        };
        if q.num == 0 {
            return Err(bad("size", 0, 1));
        }
        for (what, addr, align) in [
            ("descriptor table", q.desc, spec::ring::DESC_ALIGN),
            ("available ring", q.driver, spec::ring::AVAIL_ALIGN),
            ("used ring", q.device, spec::ring::USED_ALIGN),
        ] {
            if addr % align != 0 {
                return Err(bad(what, addr, align));
            }
        }
        let layout = QueueLayout {
            index,
            size: q.num,
            desc: q.desc,
            avail: q.driver,
            used: q.device,
        };
        // A ring past the end of the address space: refused before the
        // device computes a single address in it.
        layout.check_extents()?;
        Ok(layout)
    }

    fn queue_ready_write(&self, mut r: MutexGuard<'_, Regs>, value: u32, st: u32) {
        let s = &*self.shared;
        let (index, q) = match self.selected(&mut r) {
            Ok(x) => x,
            Err(e) => {
                drop(r);
                s.report(e);
                return;
            }
        };
        if value == 0 {
            q.ready = false;
            if let Some(slot) = s.engine.queues.get(usize::from(index)) {
                *lock(slot) = None;
            }
            return;
        }
        if q.ready {
            return;
        }
        if !queue_setup_allowed(st) {
            drop(r);
            s.report(DeviceError::LateWrite {
                offset: reg::QUEUE_READY,
                status: st,
            });
            return;
        }
        match Self::layout(index, q) {
            Ok(layout) => {
                q.ready = true;
                if st & status::DRIVER_OK != 0 {
                    let features = s.engine.features.load(Ordering::Acquire);
                    match DeviceQueue::new(layout, features) {
                        Ok(dq) => {
                            if let Some(slot) = s.engine.queues.get(usize::from(index)) {
                                *lock(slot) = Some(dq);
                            }
                        }
                        Err(e) => {
                            drop(r);
                            s.report(e);
                        }
                    }
                }
            }
            Err(e) => {
                drop(r);
                s.report(e);
            }
        }
    }

    /// Checks the driver's features when it sets `FEATURES_OK`.
    fn negotiate(&self, driver: u64) -> Result<(), DeviceError> {
        let s = &*self.shared;
        let refuse = |reason| DeviceError::FeaturesRefused { driver, reason };
        if driver & !s.device_features() != 0 {
            // §2.2.1: "The driver MUST NOT accept a feature which the
            // device did not offer".
            return Err(refuse("a feature the device did not offer"));
        }
        if driver & 1 << feature::VERSION_1 == 0 {
            return Err(refuse(
                "VIRTIO_F_VERSION_1 not accepted (no legacy interface)",
            ));
        }
        if s.cfg.require_access_platform && driver & 1 << feature::ACCESS_PLATFORM == 0 {
            return Err(refuse(
                "VIRTIO_F_ACCESS_PLATFORM not accepted: the device reaches memory only through the IOMMU",
            ));
        }
        if driver & s.cfg.required_features != s.cfg.required_features {
            return Err(refuse(
                "a device feature the device cannot work without was not accepted",
            ));
        }
        Ok(())
    }

    fn status_write(&self, mut r: MutexGuard<'_, Regs>, value: u32, old: u32) {
        let s = &*self.shared;
        if value == 0 {
            // Reset (§4.2.2.1: clear InterruptStatus and every QueueReady).
            // Each slot's lock waits for the device's batch in flight on it.
            s.engine.clear();
            s.engine.features.store(0, Ordering::Release);
            for q in r.queues.iter_mut() {
                *q = QueueRegs::default();
            }
            r.device_features_sel = 0;
            r.driver_features_sel = 0;
            r.driver_features = 0;
            r.queue_sel = 0;
            s.notify.store(0, Ordering::Release);
            s.isr.store(0, Ordering::Release);
            if let Some(h) = s.reset_hook.get() {
                // The queues are stopped: the device's reset work runs
                // before `status` reads 0, without the register lock (the
                // device may read its config space meanwhile).
                drop(r);
                (h.0)();
            }
            s.status.store(0, Ordering::Release);
            return;
        }
        let cleared = old & DRIVER_BITS & !value;
        let mut errors = Vec::new();
        if cleared != 0 {
            errors.push(DeviceError::StatusBitCleared { cleared });
        }
        let mut new = value & DRIVER_BITS & !old;
        if new & status::FEATURES_OK != 0 {
            if let Err(e) = self.negotiate(r.driver_features) {
                new &= !status::FEATURES_OK;
                errors.push(e);
            }
        }
        if new & status::DRIVER_OK != 0 {
            if (old | new) & status::FEATURES_OK == 0 {
                new &= !status::DRIVER_OK;
                errors.push(DeviceError::DriverOkBeforeFeaturesOk { status: value });
            } else if (old | new) & status::FAILED != 0 {
                // A driver that gave up must reset first (§2.1.1): no
                // queue goes live (before: every ready queue did).
                new &= !status::DRIVER_OK;
                errors.push(DeviceError::LateWrite {
                    offset: reg::STATUS,
                    status: old,
                });
            } else {
                s.engine
                    .features
                    .store(r.driver_features, Ordering::Release);
                for (i, (q, slot)) in r.queues.iter().zip(&s.engine.queues).enumerate() {
                    if q.ready {
                        match Self::layout(i as u16, q)
                            .and_then(|l| DeviceQueue::new(l, r.driver_features))
                        {
                            Ok(dq) => *lock(slot) = Some(dq),
                            Err(e) => errors.push(e),
                        }
                    }
                }
            }
        }
        if new & status::FAILED != 0 {
            // The driver gave up: the device stops using every queue.
            s.engine.clear();
        }
        s.status.fetch_or(new, Ordering::AcqRel);
        drop(r);
        for e in errors {
            s.report(e);
        }
    }
}
