//! The driver side of bringing a virtio-mmio device up, written once for
//! every driver of this crate: the probe of `MagicValue`, `Version` and
//! `DeviceID`, then virtio 1.2 §3.1.1 — reset, `ACKNOWLEDGE`, `DRIVER`,
//! feature negotiation, `FEATURES_OK` and the check that it stuck — the
//! queue setup of §4.2.3.2 (select, check it is free, size, program the
//! ring's addresses, `QueueReady`) and `DRIVER_OK`.
//!
//! [`Init`] is the device between `DRIVER` and `DRIVER_OK`: dropped
//! without [`Init::driver_ok`] — on any error of the driver's own setup,
//! returned with `?` — it writes `FAILED` (§3.1.1: "if any of these steps
//! go irrecoverably wrong, the driver SHOULD set the FAILED status bit"),
//! so no driver can forget it on one path and not another. A register
//! block that is not the device asked for is left untouched (it is not
//! the driver's to fail).

use crate::spec::{self, reg, status};
use crate::transport::MmioTransport;

/// What a driver asks of the device it probes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wanted {
    /// The `DeviceID` the driver drives.
    pub(crate) device_id: u32,
    /// Features the driver cannot work without, with their names.
    pub(crate) required: &'static [(u32, &'static str)],
    /// Further feature bits it takes when offered.
    pub(crate) optional: u64,
}

/// Why a device could not be brought up (each driver's error type keeps
/// its own variant for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InitError {
    /// The register block is not a virtio-mmio v2 device of the wanted id.
    NotTheDevice {
        magic: u32,
        version: u32,
        device_id: u32,
    },
    /// A required feature is not offered.
    MissingFeature { name: &'static str },
    /// The device did not keep `FEATURES_OK`.
    FeaturesRefused { offered: u64, wanted: u64 },
    /// A queue is missing (`QueueNumMax` 0, or below what the driver
    /// needs) or already live.
    QueueUnavailable { queue: u16, max: u32, ready: u32 },
}

/// A device between `DRIVER` and `DRIVER_OK`, features negotiated: set up
/// its queues, then [`driver_ok`](Self::driver_ok). Dropped before that,
/// it writes `FAILED`.
#[derive(Debug)]
#[must_use = "dropping it fails the device"]
pub(crate) struct Init<'t> {
    t: &'t MmioTransport,
    features: u64,
    status: u32,
    done: bool,
}

fn read_features(t: &MmioTransport) -> u64 {
    t.write(reg::DEVICE_FEATURES_SEL, 0);
    let lo = u64::from(t.read(reg::DEVICE_FEATURES));
    t.write(reg::DEVICE_FEATURES_SEL, 1);
    let hi = u64::from(t.read(reg::DEVICE_FEATURES));
    hi << 32 | lo
}

impl<'t> Init<'t> {
    /// Probes `t` for `w.device_id`, resets it, acknowledges it, and
    /// negotiates every required feature plus the optional ones offered.
    pub(crate) fn begin(t: &'t MmioTransport, w: &Wanted) -> Result<Self, InitError> {
        let (magic, version, device_id) = (
            t.read(reg::MAGIC_VALUE),
            t.read(reg::VERSION),
            t.read(reg::DEVICE_ID),
        );
        if magic != spec::MMIO_MAGIC || version != spec::MMIO_VERSION || device_id != w.device_id {
            return Err(InitError::NotTheDevice {
                magic,
                version,
                device_id,
            });
        }
        // 1. reset, 2. ACKNOWLEDGE, 3. DRIVER.
        t.write(reg::STATUS, 0);
        t.write(reg::STATUS, status::ACKNOWLEDGE);
        t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        // From here every early return fails the device (the guard).
        let mut init = Self {
            t,
            features: 0,
            status: status::ACKNOWLEDGE | status::DRIVER,
            done: false,
        };
        // 4. features.
        let offered = read_features(t);
        let mut wanted = 0u64;
        for &(bit, name) in w.required {
            if offered & 1 << bit == 0 {
                return Err(InitError::MissingFeature { name });
            }
            wanted |= 1 << bit;
        }
        wanted |= offered & w.optional;
        t.write(reg::DRIVER_FEATURES_SEL, 0);
        t.write(reg::DRIVER_FEATURES, wanted as u32);
        t.write(reg::DRIVER_FEATURES_SEL, 1);
        t.write(reg::DRIVER_FEATURES, (wanted >> 32) as u32);
        // 5. FEATURES_OK, 6. and check it stuck.
        init.status |= status::FEATURES_OK;
        t.write(reg::STATUS, init.status);
        if t.read(reg::STATUS) & status::FEATURES_OK == 0 {
            return Err(InitError::FeaturesRefused { offered, wanted });
        }
        init.features = wanted;
        Ok(init)
    }

    /// The features negotiated.
    pub(crate) fn features(&self) -> u64 {
        self.features
    }

    /// The register block.
    pub(crate) fn transport(&self) -> &'t MmioTransport {
        self.t
    }

    /// §4.2.3.2 first steps: selects queue `index`, checks it takes at
    /// least `min` entries (1 at the least) and is not live, and returns
    /// the size to give it: the largest power of two not above `want` or
    /// `QueueNumMax`.
    pub(crate) fn queue_size(&self, index: u16, want: u16, min: u32) -> Result<u16, InitError> {
        let t = self.t;
        t.write(reg::QUEUE_SEL, u32::from(index));
        let (max, ready) = (t.read(reg::QUEUE_NUM_MAX), t.read(reg::QUEUE_READY));
        if max < min.max(1) || ready != 0 {
            return Err(InitError::QueueUnavailable {
                queue: index,
                max,
                ready,
            });
        }
        let max = u16::try_from(max).unwrap_or(spec::ring::MAX_SIZE);
        let size = want.clamp(1, max.max(1));
        Ok(1u16 << size.ilog2())
    }

    /// §4.2.3.2 last steps: programs queue `index`'s size and ring
    /// addresses `(descriptors, driver area, device area)` and marks it
    /// ready.
    pub(crate) fn program_queue(&self, index: u16, size: u16, rings: (u64, u64, u64)) {
        self.t.program_queue(index, size, rings);
    }

    /// §3.1.1 step 8: `DRIVER_OK`; the device is live.
    pub(crate) fn driver_ok(mut self) {
        self.done = true;
        self.t.write(reg::STATUS, self.status | status::DRIVER_OK);
    }
}

impl Drop for Init<'_> {
    fn drop(&mut self) {
        if !self.done {
            // The bits set so far stay: the driver must not clear a
            // device status bit (virtio 1.2 §2.1.2).
            self.t.write(reg::STATUS, self.status | status::FAILED);
        }
    }
}
