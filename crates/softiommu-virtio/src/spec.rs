//! Constants of the virtio 1.2 specification (OASIS, "Virtual I/O Device
//! (VIRTIO) Version 1.2"), each with the section it comes from. Where
//! `virtio-bindings` (the rust-vmm crate generated from Linux's uapi
//! headers) defines the value, it is taken from there, so the two cannot
//! disagree.

use virtio_bindings::{
    virtio_blk, virtio_config, virtio_ids, virtio_mmio, virtio_net, virtio_ring,
};

/// §4.2.2: `MagicValue` is "virt" in little-endian ASCII.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// §4.2.2: `Version` of the non-legacy MMIO transport.
pub const MMIO_VERSION: u32 = 2;
/// A vendor id for our devices (§4.2.2 leaves `VendorID` to the device):
/// "SOFT" would not fit in a PCI vendor id and none is needed here; QEMU
/// reports 0x554d4551 ("QEMU"), we report "SIOM".
pub const VENDOR_ID: u32 = 0x4d4f_4953;

/// §4.2.2, Table "MMIO Device Register Layout": byte offsets.
pub mod reg {
    use super::virtio_mmio as m;
    /// `MagicValue` (R).
    pub const MAGIC_VALUE: u64 = m::VIRTIO_MMIO_MAGIC_VALUE as u64;
    /// `Version` (R).
    pub const VERSION: u64 = m::VIRTIO_MMIO_VERSION as u64;
    /// `DeviceID` (R).
    pub const DEVICE_ID: u64 = m::VIRTIO_MMIO_DEVICE_ID as u64;
    /// `VendorID` (R).
    pub const VENDOR_ID: u64 = m::VIRTIO_MMIO_VENDOR_ID as u64;
    /// `DeviceFeatures` (R): 32 bits of the device's features, chosen by
    /// `DeviceFeaturesSel`.
    pub const DEVICE_FEATURES: u64 = m::VIRTIO_MMIO_DEVICE_FEATURES as u64;
    /// `DeviceFeaturesSel` (W).
    pub const DEVICE_FEATURES_SEL: u64 = m::VIRTIO_MMIO_DEVICE_FEATURES_SEL as u64;
    /// `DriverFeatures` (W).
    pub const DRIVER_FEATURES: u64 = m::VIRTIO_MMIO_DRIVER_FEATURES as u64;
    /// `DriverFeaturesSel` (W).
    pub const DRIVER_FEATURES_SEL: u64 = m::VIRTIO_MMIO_DRIVER_FEATURES_SEL as u64;
    /// `QueueSel` (W).
    pub const QUEUE_SEL: u64 = m::VIRTIO_MMIO_QUEUE_SEL as u64;
    /// `QueueNumMax` (R): 0 means the selected queue does not exist.
    pub const QUEUE_NUM_MAX: u64 = m::VIRTIO_MMIO_QUEUE_NUM_MAX as u64;
    /// `QueueNum` (W).
    pub const QUEUE_NUM: u64 = m::VIRTIO_MMIO_QUEUE_NUM as u64;
    /// `QueueReady` (RW).
    pub const QUEUE_READY: u64 = m::VIRTIO_MMIO_QUEUE_READY as u64;
    /// `QueueNotify` (W).
    pub const QUEUE_NOTIFY: u64 = m::VIRTIO_MMIO_QUEUE_NOTIFY as u64;
    /// `InterruptStatus` (R).
    pub const INTERRUPT_STATUS: u64 = m::VIRTIO_MMIO_INTERRUPT_STATUS as u64;
    /// `InterruptACK` (W).
    pub const INTERRUPT_ACK: u64 = m::VIRTIO_MMIO_INTERRUPT_ACK as u64;
    /// `Status` (RW).
    pub const STATUS: u64 = m::VIRTIO_MMIO_STATUS as u64;
    /// `QueueDescLow` (W).
    pub const QUEUE_DESC_LOW: u64 = m::VIRTIO_MMIO_QUEUE_DESC_LOW as u64;
    /// `QueueDescHigh` (W).
    pub const QUEUE_DESC_HIGH: u64 = m::VIRTIO_MMIO_QUEUE_DESC_HIGH as u64;
    /// `QueueDriverLow` (W): the available ring.
    pub const QUEUE_DRIVER_LOW: u64 = m::VIRTIO_MMIO_QUEUE_AVAIL_LOW as u64;
    /// `QueueDriverHigh` (W).
    pub const QUEUE_DRIVER_HIGH: u64 = m::VIRTIO_MMIO_QUEUE_AVAIL_HIGH as u64;
    /// `QueueDeviceLow` (W): the used ring.
    pub const QUEUE_DEVICE_LOW: u64 = m::VIRTIO_MMIO_QUEUE_USED_LOW as u64;
    /// `QueueDeviceHigh` (W).
    pub const QUEUE_DEVICE_HIGH: u64 = m::VIRTIO_MMIO_QUEUE_USED_HIGH as u64;
    /// `SHMSel` (W): shared memory regions (we have none).
    pub const SHM_SEL: u64 = m::VIRTIO_MMIO_SHM_SEL as u64;
    /// `SHMLenLow` (R).
    pub const SHM_LEN_LOW: u64 = m::VIRTIO_MMIO_SHM_LEN_LOW as u64;
    /// `SHMLenHigh` (R).
    pub const SHM_LEN_HIGH: u64 = m::VIRTIO_MMIO_SHM_LEN_HIGH as u64;
    /// `SHMBaseLow` (R).
    pub const SHM_BASE_LOW: u64 = m::VIRTIO_MMIO_SHM_BASE_LOW as u64;
    /// `SHMBaseHigh` (R).
    pub const SHM_BASE_HIGH: u64 = m::VIRTIO_MMIO_SHM_BASE_HIGH as u64;
    /// `ConfigGeneration` (R).
    pub const CONFIG_GENERATION: u64 = m::VIRTIO_MMIO_CONFIG_GENERATION as u64;
    /// Device-specific configuration space starts here.
    pub const CONFIG: u64 = m::VIRTIO_MMIO_CONFIG as u64;
}

/// §2.1 "Device Status Field": the bits of `Status`.
pub mod status {
    use super::virtio_config as c;
    /// The guest noticed the device.
    pub const ACKNOWLEDGE: u32 = c::VIRTIO_CONFIG_S_ACKNOWLEDGE;
    /// The guest knows how to drive it.
    pub const DRIVER: u32 = c::VIRTIO_CONFIG_S_DRIVER;
    /// The driver is set up and ready to drive the device.
    pub const DRIVER_OK: u32 = c::VIRTIO_CONFIG_S_DRIVER_OK;
    /// The driver acknowledged the features it understands; negotiation is
    /// complete.
    pub const FEATURES_OK: u32 = c::VIRTIO_CONFIG_S_FEATURES_OK;
    /// The device hit an error from which it cannot recover without a
    /// reset.
    pub const DEVICE_NEEDS_RESET: u32 = c::VIRTIO_CONFIG_S_NEEDS_RESET;
    /// The driver gave up on the device.
    pub const FAILED: u32 = c::VIRTIO_CONFIG_S_FAILED;
}

/// §4.2.2 `InterruptStatus` bits.
pub mod isr {
    use super::virtio_mmio as m;
    /// "Used Buffer Notification": a used ring was updated.
    pub const USED_BUFFER: u32 = m::VIRTIO_MMIO_INT_VRING;
    /// "Configuration Change Notification" (also sent with
    /// `DEVICE_NEEDS_RESET`, §2.1.2).
    pub const CONFIG_CHANGE: u32 = m::VIRTIO_MMIO_INT_CONFIG;
}

/// §6 "Reserved Feature Bits" and §5.1.3 "Feature bits" (network device),
/// as bit numbers.
pub mod feature {
    use super::{virtio_config as c, virtio_net as n, virtio_ring as r};
    /// §6: the device conforms to virtio 1.x (no legacy interface).
    pub const VERSION_1: u32 = c::VIRTIO_F_VERSION_1;
    /// §6: the device accesses memory through a platform translation
    /// (an IOMMU): every address in the rings and buffers is an IOVA.
    pub const ACCESS_PLATFORM: u32 = c::VIRTIO_F_ACCESS_PLATFORM;
    /// §6: indirect descriptors (we do not offer it).
    pub const RING_INDIRECT_DESC: u32 = r::VIRTIO_RING_F_INDIRECT_DESC;
    /// §6: used/available event index suppression (we do not offer it).
    pub const RING_EVENT_IDX: u32 = r::VIRTIO_RING_F_EVENT_IDX;
    /// §5.1.3: the device has a maximum MTU in its config space.
    pub const NET_MTU: u32 = n::VIRTIO_NET_F_MTU;
    /// §5.1.3: the device has a MAC address in its config space.
    pub const NET_MAC: u32 = n::VIRTIO_NET_F_MAC;
    /// §5.1.3: the config space has a link status field.
    pub const NET_STATUS: u32 = n::VIRTIO_NET_F_STATUS;
}

/// §2.7.5 "The Virtqueue Descriptor Table": descriptor flags.
pub mod desc {
    use super::virtio_ring as r;
    /// The buffer continues in the `next` field.
    pub const F_NEXT: u16 = r::VRING_DESC_F_NEXT as u16;
    /// The buffer is device-writable (otherwise device-readable).
    pub const F_WRITE: u16 = r::VRING_DESC_F_WRITE as u16;
    /// The buffer holds a table of indirect descriptors.
    pub const F_INDIRECT: u16 = r::VRING_DESC_F_INDIRECT as u16;
    /// Bytes per descriptor.
    pub const SIZE: u64 = 16;
}

/// §2.7.6 / §2.7.8: ring flags and layout of the split virtqueue.
pub mod ring {
    use super::virtio_ring as r;
    /// Available ring flag: the driver asks not to be interrupted.
    pub const AVAIL_F_NO_INTERRUPT: u16 = r::VRING_AVAIL_F_NO_INTERRUPT as u16;
    /// Used ring flag: the device asks not to be notified.
    pub const USED_F_NO_NOTIFY: u16 = r::VRING_USED_F_NO_NOTIFY as u16;
    /// §2.7 alignment table: descriptor table.
    pub const DESC_ALIGN: u64 = 16;
    /// §2.7 alignment table: available ring.
    pub const AVAIL_ALIGN: u64 = 2;
    /// §2.7 alignment table: used ring.
    pub const USED_ALIGN: u64 = 4;
    /// §2.7.6: `flags`, `idx`, then `ring[size]`, then `used_event`.
    pub const AVAIL_HEADER: u64 = 4;
    /// §2.7.8: `flags`, `idx`, then `ring[size]` of `{id: le32, len: le32}`.
    pub const USED_HEADER: u64 = 4;
    /// §2.7.8: bytes per used element.
    pub const USED_ELEM: u64 = 8;
    /// The largest queue size a split virtqueue may have (§2.7: 32768).
    pub const MAX_SIZE: u16 = 32768;

    /// Bytes of an available ring of `size` entries, `used_event` included.
    pub const fn avail_bytes(size: u16) -> u64 {
        AVAIL_HEADER + 2 * size as u64 + 2
    }

    /// Bytes of a used ring of `size` entries, `avail_event` included.
    pub const fn used_bytes(size: u16) -> u64 {
        USED_HEADER + USED_ELEM * size as u64 + 2
    }
}

/// §5.1.6 "Device Operation" (network device).
pub mod net {
    use super::{virtio_ids, virtio_net as n};
    /// §5: device id of a network card.
    pub const DEVICE_ID: u32 = virtio_ids::VIRTIO_ID_NET;
    /// §5.1.2: queue 0 is receiveq1.
    pub const RX_QUEUE: u16 = 0;
    /// §5.1.2: queue 1 is transmitq1.
    pub const TX_QUEUE: u16 = 1;
    /// §5.1.6: with `VIRTIO_F_VERSION_1`, every packet is preceded by a
    /// `struct virtio_net_hdr` of this size (`num_buffers` included).
    pub const HDR_LEN: usize = std::mem::size_of::<n::virtio_net_hdr_v1>();
    /// §5.1.4: `status` bit: the link is up.
    pub const S_LINK_UP: u16 = n::VIRTIO_NET_S_LINK_UP as u16;
    /// §5.1.6: `gso_type` of a packet with no segmentation offload.
    pub const GSO_NONE: u8 = n::VIRTIO_NET_HDR_GSO_NONE as u8;
    /// Ethernet header: destination, source, EtherType (IEEE 802.3).
    pub const ETH_HLEN: usize = 14;
    /// An IEEE 802.1Q tag's length: a VLAN-tagged frame's header is
    /// `ETH_HLEN + VLAN_HLEN` bytes.
    pub const VLAN_HLEN: usize = 4;
    /// The tags a frame's link-level header may carry beyond `ETH_HLEN`:
    /// two (802.1ad outer, 802.1Q inner: a VLAN on a VLAN, or QinQ).
    pub const TAGS_HLEN: usize = 2 * VLAN_HLEN;
    /// The longest frame a driver told no MTU (`VIRTIO_NET_F_MTU` not
    /// negotiated) may send: an IP packet's 16-bit length behind a doubly
    /// tagged header (Linux then allows an MTU up to 65,535).
    pub const NO_MTU_MAX_FRAME: usize = ETH_HLEN + TAGS_HLEN + u16::MAX as usize;
    /// The smallest MTU a device may offer with `VIRTIO_NET_F_MTU`
    /// (§5.1.4.1: "at least 68").
    pub const MIN_MTU: u16 = 68;
    /// §5.1.6.3.1: without `VIRTIO_NET_F_MRG_RXBUF` and the guest
    /// segmentation offloads, "the driver SHOULD populate the receive
    /// queue(s) with buffers of at least 1526 bytes" (header, Ethernet
    /// header, 1500 bytes of payload).
    pub const RX_BUFFER_MIN: usize = HDR_LEN + ETH_HLEN + 1500;
}

/// §5.2 "Block Device": ids, feature bits, request types, status values
/// and the configuration layout.
pub mod blk {
    use std::mem::{offset_of, size_of};

    use super::{virtio_blk as b, virtio_ids};

    /// §5: device id of a block device.
    pub const DEVICE_ID: u32 = virtio_ids::VIRTIO_ID_BLOCK;

    /// §5.2.3: the largest size of any single segment is in `size_max`.
    pub const F_SIZE_MAX: u32 = b::VIRTIO_BLK_F_SIZE_MAX;
    /// §5.2.3: the most segments in a request is in `seg_max`.
    pub const F_SEG_MAX: u32 = b::VIRTIO_BLK_F_SEG_MAX;
    /// §5.2.3: the device is read-only (we do not offer it).
    pub const F_RO: u32 = b::VIRTIO_BLK_F_RO;
    /// §5.2.3: the block size of the disk is in `blk_size`.
    pub const F_BLK_SIZE: u32 = b::VIRTIO_BLK_F_BLK_SIZE;
    /// §5.2.3: cache flush command support.
    pub const F_FLUSH: u32 = b::VIRTIO_BLK_F_FLUSH;
    /// §5.2.3: the device supports more than one virtqueue; their number
    /// is in `num_queues`.
    pub const F_MQ: u32 = b::VIRTIO_BLK_F_MQ;

    /// §5.2.6: read (device writes the data).
    pub const T_IN: u32 = b::VIRTIO_BLK_T_IN;
    /// §5.2.6: write (device reads the data).
    pub const T_OUT: u32 = b::VIRTIO_BLK_T_OUT;
    /// §5.2.6: flush the device's volatile cache.
    pub const T_FLUSH: u32 = b::VIRTIO_BLK_T_FLUSH;
    /// §5.2.6: get the device id string.
    pub const T_GET_ID: u32 = b::VIRTIO_BLK_T_GET_ID;

    /// §5.2.6: success.
    pub const S_OK: u8 = b::VIRTIO_BLK_S_OK as u8;
    /// §5.2.6: device or driver error.
    pub const S_IOERR: u8 = b::VIRTIO_BLK_S_IOERR as u8;
    /// §5.2.6: request unsupported by the device.
    pub const S_UNSUPP: u8 = b::VIRTIO_BLK_S_UNSUPP as u8;

    /// §5.2.6: `sector` counts 512-byte sectors whatever `blk_size` is.
    pub const SECTOR_SIZE: u64 = 512;
    /// §5.2.6: bytes of the request header the driver writes
    /// (`type`, `reserved`, `sector`).
    pub const HDR_LEN: usize = size_of::<b::virtio_blk_outhdr>();
    /// §5.2.6: bytes of the id string `VIRTIO_BLK_T_GET_ID` returns (not
    /// NUL-terminated when it is this long).
    pub const ID_BYTES: usize = b::VIRTIO_BLK_ID_BYTES as usize;

    /// §5.2.4: offset of `capacity` (le64, in 512-byte sectors).
    pub const CFG_CAPACITY: usize = offset_of!(b::virtio_blk_config, capacity);
    /// §5.2.4: offset of `size_max` (le32).
    pub const CFG_SIZE_MAX: usize = offset_of!(b::virtio_blk_config, size_max);
    /// §5.2.4: offset of `seg_max` (le32).
    pub const CFG_SEG_MAX: usize = offset_of!(b::virtio_blk_config, seg_max);
    /// §5.2.4: offset of `blk_size` (le32).
    pub const CFG_BLK_SIZE: usize = offset_of!(b::virtio_blk_config, blk_size);
    /// §5.2.4: offset of `num_queues` (le16).
    pub const CFG_NUM_QUEUES: usize = offset_of!(b::virtio_blk_config, num_queues);
    /// Bytes of config space we expose: up to and including `num_queues`
    /// (the fields past it belong to features we do not offer).
    pub const CONFIG_LEN: usize = CFG_NUM_QUEUES + size_of::<u16>();
}

/// §5.13 "IOMMU Device": id, feature bits, request types, status values,
/// flags and the layouts of the configuration, requests, PROBE properties
/// and fault reports. `virtio-bindings` has no `virtio_iommu` module, so
/// the values below are written from §5.13 itself (the same numbers as
/// Linux's `include/uapi/linux/virtio_iommu.h`); each cites its section.
pub mod iommu {
    use super::virtio_ids;

    /// §5.13.1: device id of an IOMMU.
    pub const DEVICE_ID: u32 = virtio_ids::VIRTIO_ID_IOMMU;
    /// §5.13.2: queue 0 is the request queue.
    pub const REQUEST_QUEUE: u16 = 0;
    /// §5.13.2: queue 1 is the event queue.
    pub const EVENT_QUEUE: u16 = 1;

    /// §5.13.3: `input_range` is valid.
    pub const F_INPUT_RANGE: u32 = 0;
    /// §5.13.3: `domain_range` is valid.
    pub const F_DOMAIN_RANGE: u32 = 1;
    /// §5.13.3: MAP and UNMAP requests are available.
    pub const F_MAP_UNMAP: u32 = 2;
    /// §5.13.3: unattached endpoints bypass (superseded; not offered).
    pub const F_BYPASS: u32 = 3;
    /// §5.13.3: the PROBE request is available.
    pub const F_PROBE: u32 = 4;
    /// §5.13.3: the `VIRTIO_IOMMU_MAP_F_MMIO` flag is available.
    pub const F_MMIO: u32 = 5;
    /// §5.13.3: `bypass` in the config space, and
    /// `VIRTIO_IOMMU_ATTACH_F_BYPASS`.
    pub const F_BYPASS_CONFIG: u32 = 6;

    /// §5.13.4: offset of `page_size_mask` (le64).
    pub const CFG_PAGE_SIZE_MASK: usize = 0;
    /// §5.13.4: offset of `input_range.start` (le64).
    pub const CFG_INPUT_START: usize = 8;
    /// §5.13.4: offset of `input_range.end` (le64, inclusive).
    pub const CFG_INPUT_END: usize = 16;
    /// §5.13.4: offset of `domain_range.start` (le32).
    pub const CFG_DOMAIN_START: usize = 24;
    /// §5.13.4: offset of `domain_range.end` (le32, inclusive).
    pub const CFG_DOMAIN_END: usize = 28;
    /// §5.13.4: offset of `probe_size` (le32).
    pub const CFG_PROBE_SIZE: usize = 32;
    /// §5.13.4: offset of `bypass` (u8, 0 or 1).
    pub const CFG_BYPASS: usize = 36;
    /// §5.13.4: bytes of `struct virtio_iommu_config` (`reserved[3]`
    /// included).
    pub const CONFIG_LEN: usize = 40;

    /// §5.13.6: request types.
    pub const T_ATTACH: u8 = 1;
    /// §5.13.6: DETACH.
    pub const T_DETACH: u8 = 2;
    /// §5.13.6: MAP.
    pub const T_MAP: u8 = 3;
    /// §5.13.6: UNMAP.
    pub const T_UNMAP: u8 = 4;
    /// §5.13.6: PROBE.
    pub const T_PROBE: u8 = 5;

    /// §5.13.6: all good.
    pub const S_OK: u8 = 0;
    /// §5.13.6: virtio communication error.
    pub const S_IOERR: u8 = 1;
    /// §5.13.6: unsupported request.
    pub const S_UNSUPP: u8 = 2;
    /// §5.13.6: internal device error.
    pub const S_DEVERR: u8 = 3;
    /// §5.13.6: invalid parameters.
    pub const S_INVAL: u8 = 4;
    /// §5.13.6: out-of-range parameters.
    pub const S_RANGE: u8 = 5;
    /// §5.13.6: entry not found.
    pub const S_NOENT: u8 = 6;
    /// §5.13.6: bad address.
    pub const S_FAULT: u8 = 7;
    /// §5.13.6: insufficient resources.
    pub const S_NOMEM: u8 = 8;

    /// §5.13.6: `struct virtio_iommu_req_head` (type, `reserved[3]`).
    pub const HEAD_LEN: usize = 4;
    /// §5.13.6: `struct virtio_iommu_req_tail` (status, `reserved[3]`).
    pub const TAIL_LEN: usize = 4;
    /// §5.13.6.1: device-readable bytes of an ATTACH request (head,
    /// domain, endpoint, flags, `reserved[4]`).
    pub const ATTACH_LEN: usize = HEAD_LEN + 16;
    /// §5.13.6.2: device-readable bytes of a DETACH request (head,
    /// domain, endpoint, `reserved[8]`).
    pub const DETACH_LEN: usize = HEAD_LEN + 16;
    /// §5.13.6.3: device-readable bytes of a MAP request (head, domain,
    /// virt_start, virt_end, phys_start, flags).
    pub const MAP_LEN: usize = HEAD_LEN + 32;
    /// §5.13.6.4: device-readable bytes of an UNMAP request (head,
    /// domain, virt_start, virt_end, `reserved[4]`).
    pub const UNMAP_LEN: usize = HEAD_LEN + 24;
    /// §5.13.6.5: device-readable bytes of a PROBE request (head,
    /// endpoint, `reserved[64]`).
    pub const PROBE_LEN: usize = HEAD_LEN + 68;

    /// §5.13.6.1: `VIRTIO_IOMMU_ATTACH_F_BYPASS`.
    pub const ATTACH_F_BYPASS: u32 = 1 << 0;
    /// §5.13.6.3: `VIRTIO_IOMMU_MAP_F_READ`.
    pub const MAP_F_READ: u32 = 1 << 0;
    /// §5.13.6.3: `VIRTIO_IOMMU_MAP_F_WRITE`.
    pub const MAP_F_WRITE: u32 = 1 << 1;
    /// §5.13.6.3: `VIRTIO_IOMMU_MAP_F_MMIO`.
    pub const MAP_F_MMIO: u32 = 1 << 2;

    /// §5.13.6.5: `struct virtio_iommu_probe_property` header bytes.
    pub const PROBE_PROP_HEAD: usize = 4;
    /// §5.13.6.5: the `type` field's 12 bits.
    pub const PROBE_TYPE_MASK: u16 = 0x0fff;
    /// §5.13.6.6: `VIRTIO_IOMMU_PROBE_T_RESV_MEM`.
    pub const PROBE_T_RESV_MEM: u16 = 1;
    /// §5.13.6.6.1: bytes of a RESV_MEM property after its header
    /// (subtype, `reserved[3]`, start, end): its `length`.
    pub const RESV_MEM_LEN: usize = 20;
    /// §5.13.6.6.1: `VIRTIO_IOMMU_RESV_MEM_T_RESERVED`.
    pub const RESV_MEM_T_RESERVED: u8 = 0;
    /// §5.13.6.6.1: `VIRTIO_IOMMU_RESV_MEM_T_MSI`.
    pub const RESV_MEM_T_MSI: u8 = 1;

    /// §5.13.6.7: bytes of `struct virtio_iommu_fault`.
    pub const FAULT_LEN: usize = 24;
    /// §5.13.6.7: `VIRTIO_IOMMU_FAULT_R_UNKNOWN`.
    pub const FAULT_R_UNKNOWN: u8 = 0;
    /// §5.13.6.7: `VIRTIO_IOMMU_FAULT_R_DOMAIN`: not attached.
    pub const FAULT_R_DOMAIN: u8 = 1;
    /// §5.13.6.7: `VIRTIO_IOMMU_FAULT_R_MAPPING`: not mapped, or not
    /// with this access.
    pub const FAULT_R_MAPPING: u8 = 2;
    /// §5.13.6.7: `VIRTIO_IOMMU_FAULT_F_READ`.
    pub const FAULT_F_READ: u32 = 1 << 0;
    /// §5.13.6.7: `VIRTIO_IOMMU_FAULT_F_WRITE`.
    pub const FAULT_F_WRITE: u32 = 1 << 1;
    /// §5.13.6.7: `VIRTIO_IOMMU_FAULT_F_ADDRESS`: `address` is valid.
    pub const FAULT_F_ADDRESS: u32 = 1 << 8;

    /// The x86 MSI doorbell window, `0xfee00000..=0xfeefffff` (Intel SDM
    /// vol. 3, §11.11.1 "Message Address Register Format"), reported as a
    /// `RESV_MEM_T_MSI` region.
    pub const MSI_START: u64 = 0xfee0_0000;
    /// Last byte of the MSI window (inclusive, as RESV_MEM's `end`).
    pub const MSI_END: u64 = 0xfeef_ffff;
}
