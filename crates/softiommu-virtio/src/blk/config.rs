//! The virtio-blk configuration space and the features our device offers
//! (virtio 1.2 §5.2.3, §5.2.4).

use crate::spec::{blk, feature};
use crate::transport::DeviceInfo;

/// The largest number of request queues (`num_queues`): the transport
/// routes notifications through a 64-bit mask.
pub const MAX_QUEUES: u16 = 64;
/// The largest data segment a device may allow (`size_max`): 4 MiB.
pub const MAX_SIZE_MAX: u32 = 4 << 20;
/// The largest request a device may allow, in bytes (`seg_max` ×
/// `size_max` may not exceed it): 16 MiB. Each device thread keeps one
/// buffer this large at most.
pub const MAX_REQUEST_BYTES: u64 = 16 << 20;

/// What a virtio-blk device is configured with (apart from its back-end,
/// which gives the capacity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkConfig {
    /// Request queues offered (`num_queues`, with `VIRTIO_BLK_F_MQ` when
    /// above 1): 1 to [`MAX_QUEUES`].
    pub num_queues: u16,
    /// `QueueNumMax` of every queue (a power of two).
    pub queue_max: u16,
    /// Data segments per request at most (`seg_max`, §5.2.4): at least 1.
    pub seg_max: u32,
    /// Bytes per data segment at most (`size_max`): at least 512, at most
    /// [`MAX_SIZE_MAX`].
    pub size_max: u32,
    /// The logical block size (`blk_size`): a power of two from 512 to
    /// 64 KiB. Requests must be aligned to it in offset and length.
    pub blk_size: u32,
    /// Offer `VIRTIO_BLK_F_FLUSH`.
    pub flush: bool,
}

impl Default for BlkConfig {
    fn default() -> Self {
        Self {
            num_queues: 1,
            queue_max: 1024,
            seg_max: 128,
            size_max: 128 << 10,
            blk_size: 512,
            flush: true,
        }
    }
}

/// Why a [`BlkConfig`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlkConfigError {
    /// A field outside its range.
    #[error("{field} = {value} is outside {min}..={max}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The least allowed.
        min: u64,
        /// The most allowed.
        max: u64,
    },
    /// A field that must be a power of two.
    #[error("{field} = {value} is not a power of two")]
    NotPowerOfTwo {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

impl BlkConfig {
    /// Checks every field against its range.
    pub fn check(&self) -> Result<(), BlkConfigError> {
        let range = |field, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(BlkConfigError::OutOfRange {
                    field,
                    value,
                    min,
                    max,
                })
            }
        };
        let pow2 = |field, value: u64| {
            if value.is_power_of_two() {
                Ok(())
            } else {
                Err(BlkConfigError::NotPowerOfTwo { field, value })
            }
        };
        range("num_queues", self.num_queues.into(), 1, MAX_QUEUES.into())?;
        range("queue_max", self.queue_max.into(), 2, 32768)?;
        pow2("queue_max", self.queue_max.into())?;
        range("size_max", self.size_max.into(), 512, MAX_SIZE_MAX.into())?;
        // What the device announces it takes, it takes: `seg_max` full
        // segments of `size_max` fit the device's buffer.
        let seg_cap = (MAX_REQUEST_BYTES / u64::from(self.size_max)).min(4096);
        range("seg_max", self.seg_max.into(), 1, seg_cap)?;
        range("blk_size", self.blk_size.into(), 512, 64 << 10)?;
        pow2("blk_size", self.blk_size.into())?;
        Ok(())
    }

    /// The device features offered: `SEG_MAX`, `SIZE_MAX`, `BLK_SIZE`,
    /// `FLUSH` (if set), `MQ` (if more than one queue).
    pub fn features(&self) -> u64 {
        let mut f = 1 << blk::F_SEG_MAX | 1 << blk::F_SIZE_MAX | 1 << blk::F_BLK_SIZE;
        if self.flush {
            f |= 1 << blk::F_FLUSH;
        }
        if self.num_queues > 1 {
            f |= 1 << blk::F_MQ;
        }
        f
    }

    /// The config space bytes (§5.2.4, little-endian) for a disk of
    /// `capacity` bytes.
    pub fn config_bytes(&self, capacity: u64) -> Vec<u8> {
        let mut c = vec![0u8; blk::CONFIG_LEN];
        let mut put = |at: usize, b: &[u8]| c[at..at + b.len()].copy_from_slice(b);
        put(
            blk::CFG_CAPACITY,
            &(capacity / blk::SECTOR_SIZE).to_le_bytes(),
        );
        put(blk::CFG_SIZE_MAX, &self.size_max.to_le_bytes());
        put(blk::CFG_SEG_MAX, &self.seg_max.to_le_bytes());
        put(blk::CFG_BLK_SIZE, &self.blk_size.to_le_bytes());
        put(blk::CFG_NUM_QUEUES, &self.num_queues.to_le_bytes());
        c
    }

    /// What the transport needs to know, for a disk of `capacity` bytes.
    pub fn device_info(&self, capacity: u64) -> DeviceInfo {
        DeviceInfo {
            device_id: blk::DEVICE_ID,
            features: self.features(),
            queues: self.num_queues,
            queue_max: self.queue_max,
            config: self.config_bytes(capacity),
        }
    }
}

/// The configuration a driver read from the device (§5.2.4), with the
/// features it negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkGeometry {
    /// Capacity in 512-byte sectors.
    pub capacity_sectors: u64,
    /// `seg_max` (1 when the feature is not negotiated: one segment).
    pub seg_max: u32,
    /// `size_max` (`u32::MAX` when not negotiated: no limit).
    pub size_max: u32,
    /// `blk_size` (512 when not negotiated).
    pub blk_size: u32,
    /// Request queues (1 without `VIRTIO_BLK_F_MQ`).
    pub num_queues: u16,
    /// Whether `VIRTIO_BLK_F_FLUSH` was negotiated.
    pub flush: bool,
}

impl BlkGeometry {
    /// Capacity in bytes (saturated).
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_sectors.saturating_mul(blk::SECTOR_SIZE)
    }
}

/// The transport features every driver of ours needs.
pub(crate) const REQUIRED: [(u32, &str); 2] = [
    (feature::VERSION_1, "VIRTIO_F_VERSION_1"),
    (feature::ACCESS_PLATFORM, "VIRTIO_F_ACCESS_PLATFORM"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_space_has_the_spec_layout() {
        let cfg = BlkConfig {
            num_queues: 4,
            ..BlkConfig::default()
        };
        let c = cfg.config_bytes(1 << 30);
        // §5.2.4: capacity at 0, size_max at 8, seg_max at 12, blk_size at
        // 20, num_queues at 34.
        assert_eq!(u64::from_le_bytes(c[0..8].try_into().unwrap()), 1 << 21);
        assert_eq!(u32::from_le_bytes(c[8..12].try_into().unwrap()), 128 << 10);
        assert_eq!(u32::from_le_bytes(c[12..16].try_into().unwrap()), 128);
        assert_eq!(u32::from_le_bytes(c[20..24].try_into().unwrap()), 512);
        assert_eq!(u16::from_le_bytes(c[34..36].try_into().unwrap()), 4);
        assert_eq!(c.len(), 36);
        assert_ne!(cfg.features() & 1 << blk::F_MQ, 0);
        assert_eq!(BlkConfig::default().features() & 1 << blk::F_MQ, 0);
    }

    #[test]
    fn bad_configs_are_refused_with_the_field() {
        for (cfg, field) in [
            (
                BlkConfig {
                    num_queues: 0,
                    ..Default::default()
                },
                "num_queues",
            ),
            (
                BlkConfig {
                    num_queues: 65,
                    ..Default::default()
                },
                "num_queues",
            ),
            (
                BlkConfig {
                    queue_max: 100,
                    ..Default::default()
                },
                "queue_max",
            ),
            (
                BlkConfig {
                    seg_max: 0,
                    ..Default::default()
                },
                "seg_max",
            ),
            (
                BlkConfig {
                    size_max: 100,
                    ..Default::default()
                },
                "size_max",
            ),
            (
                // 128 segments of 1 MiB: more than the device's buffer
                // takes in one request.
                BlkConfig {
                    size_max: 1 << 20,
                    ..Default::default()
                },
                "seg_max",
            ),
            (
                BlkConfig {
                    blk_size: 1000,
                    ..Default::default()
                },
                "blk_size",
            ),
        ] {
            let e = cfg.check().unwrap_err();
            let got = match e {
                BlkConfigError::OutOfRange { field, .. } => field,
                BlkConfigError::NotPowerOfTwo { field, .. } => field,
            };
            assert_eq!(got, field);
        }
        assert!(BlkConfig::default().check().is_ok());
    }
}
