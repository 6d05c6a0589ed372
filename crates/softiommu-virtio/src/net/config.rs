//! The virtio-net configuration space and feature set our device offers
//! (virtio 1.2 §5.1.3, §5.1.4).

use std::mem::{offset_of, size_of};

use virtio_bindings::bindings::virtio_net::virtio_net_config;

use crate::spec::{feature, net};
use crate::transport::DeviceInfo;

/// What a virtio-net device is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetConfig {
    /// The MAC address (`VIRTIO_NET_F_MAC`).
    pub mac: [u8; 6],
    /// The largest MTU the device accepts (`VIRTIO_NET_F_MTU`;
    /// §5.1.4.1: at least 68).
    pub mtu: u16,
    /// `QueueNumMax` of both queues (a power of two).
    pub queue_max: u16,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            mac: [0x02, 0, 0, 0, 0, 1],
            mtu: 1500,
            queue_max: 256,
        }
    }
}

/// Bytes of config space we expose: up to and including `mtu` (§5.1.4:
/// the fields past it belong to features we do not offer).
pub const CONFIG_LEN: usize = offset_of!(virtio_net_config, mtu) + size_of::<u16>();
/// Offset of `mac` (§5.1.4).
pub const MAC_OFFSET: usize = offset_of!(virtio_net_config, mac);
/// Offset of `status` (§5.1.4).
pub const STATUS_OFFSET: usize = offset_of!(virtio_net_config, status);
/// Offset of `mtu` (§5.1.4).
pub const MTU_OFFSET: usize = offset_of!(virtio_net_config, mtu);

impl NetConfig {
    /// The device features offered: MAC, link status, MTU.
    pub fn features(&self) -> u64 {
        1 << feature::NET_MAC | 1 << feature::NET_STATUS | 1 << feature::NET_MTU
    }

    /// The config space bytes (little-endian fields, §5.1.4): MAC, status
    /// (link up), `max_virtqueue_pairs` (1, meaningful only with MQ), MTU.
    pub fn config_bytes(&self) -> Vec<u8> {
        let mut c = vec![0u8; CONFIG_LEN];
        c[MAC_OFFSET..MAC_OFFSET + 6].copy_from_slice(&self.mac);
        c[STATUS_OFFSET..STATUS_OFFSET + 2].copy_from_slice(&net::S_LINK_UP.to_le_bytes());
        let pairs = offset_of!(virtio_net_config, max_virtqueue_pairs);
        c[pairs..pairs + 2].copy_from_slice(&1u16.to_le_bytes());
        c[MTU_OFFSET..MTU_OFFSET + 2].copy_from_slice(&self.mtu.max(net::MIN_MTU).to_le_bytes());
        c
    }

    /// What the transport needs to know.
    pub fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            device_id: net::DEVICE_ID,
            features: self.features(),
            queues: 2,
            queue_max: self.queue_max,
            config: self.config_bytes(),
        }
    }

    /// The largest Ethernet frame (header included, no FCS) the device
    /// carries.
    pub fn max_frame(&self) -> usize {
        net::ETH_HLEN + usize::from(self.mtu.max(net::MIN_MTU))
    }
}
