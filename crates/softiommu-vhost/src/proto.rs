//! The vhost-user protocol's numbers, as QEMU's `docs/interop/vhost-user.rst`
//! defines them (message codes, header flags, protocol feature bits, the
//! IOTLB message), and the virtio feature bits we offer (virtio 1.2 §6,
//! §5.2.3). Only what this back-end uses is named.

/// Bytes of a message header: `request`, `flags`, `size`, each a le32.
pub const HEADER_LEN: usize = 12;
/// The header `flags` version field value (bits 0–1).
pub const VERSION: u32 = 0x1;
/// Mask of the version field.
pub const VERSION_MASK: u32 = 0x3;
/// `flags` bit 2: this message is a reply.
pub const FLAG_REPLY: u32 = 1 << 2;
/// `flags` bit 3: the sender asks for a reply-ack (`REPLY_ACK`).
pub const FLAG_NEED_REPLY: u32 = 1 << 3;
/// The largest payload this back-end accepts: more than any message it
/// serves needs (a memory table of [`MAX_REGIONS`] regions is 264 bytes,
/// a config message 12 + 256); a larger `size` ends the session, since the
/// stream cannot be re-synchronised without reading it.
pub const MAX_PAYLOAD: usize = 4096;
/// Memory regions in one `SET_MEM_TABLE` (`VHOST_MEMORY_BASELINE_NREGIONS`).
pub const MAX_REGIONS: usize = 8;
/// File descriptors accepted with one message (a memory table's).
pub const MAX_FDS: usize = MAX_REGIONS;

/// Front-end requests (vhost-user.rst, "Front-end message types").
pub mod req {
    /// `VHOST_USER_GET_FEATURES`
    pub const GET_FEATURES: u32 = 1;
    /// `VHOST_USER_SET_FEATURES`
    pub const SET_FEATURES: u32 = 2;
    /// `VHOST_USER_SET_OWNER`
    pub const SET_OWNER: u32 = 3;
    /// `VHOST_USER_RESET_OWNER`
    pub const RESET_OWNER: u32 = 4;
    /// `VHOST_USER_SET_MEM_TABLE`
    pub const SET_MEM_TABLE: u32 = 5;
    /// `VHOST_USER_SET_VRING_NUM`
    pub const SET_VRING_NUM: u32 = 8;
    /// `VHOST_USER_SET_VRING_ADDR`
    pub const SET_VRING_ADDR: u32 = 9;
    /// `VHOST_USER_SET_VRING_BASE`
    pub const SET_VRING_BASE: u32 = 10;
    /// `VHOST_USER_GET_VRING_BASE`
    pub const GET_VRING_BASE: u32 = 11;
    /// `VHOST_USER_SET_VRING_KICK`
    pub const SET_VRING_KICK: u32 = 12;
    /// `VHOST_USER_SET_VRING_CALL`
    pub const SET_VRING_CALL: u32 = 13;
    /// `VHOST_USER_SET_VRING_ERR`
    pub const SET_VRING_ERR: u32 = 14;
    /// `VHOST_USER_GET_PROTOCOL_FEATURES`
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    /// `VHOST_USER_SET_PROTOCOL_FEATURES`
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    /// `VHOST_USER_GET_QUEUE_NUM`
    pub const GET_QUEUE_NUM: u32 = 17;
    /// `VHOST_USER_SET_VRING_ENABLE`
    pub const SET_VRING_ENABLE: u32 = 18;
    /// `VHOST_USER_SET_BACKEND_REQ_FD` (formerly `SET_SLAVE_REQ_FD`)
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    /// `VHOST_USER_IOTLB_MSG`
    pub const IOTLB_MSG: u32 = 22;
    /// `VHOST_USER_GET_CONFIG`
    pub const GET_CONFIG: u32 = 24;
    /// `VHOST_USER_SET_CONFIG`
    pub const SET_CONFIG: u32 = 25;
    /// `VHOST_USER_RESET_DEVICE`
    pub const RESET_DEVICE: u32 = 34;
}

/// Back-end requests, sent on the back-end channel (vhost-user.rst,
/// "Back-end message types").
pub mod backend_req {
    /// `VHOST_USER_BACKEND_IOTLB_MSG`: a miss (or an access failure).
    pub const IOTLB_MSG: u32 = 1;
}

/// Protocol feature bits (vhost-user.rst, "Protocol features").
pub mod pf {
    /// `VHOST_USER_PROTOCOL_F_REPLY_ACK`
    pub const REPLY_ACK: u64 = 1 << 3;
    /// `VHOST_USER_PROTOCOL_F_BACKEND_REQ` (formerly `SLAVE_REQ`)
    pub const BACKEND_REQ: u64 = 1 << 5;
    /// `VHOST_USER_PROTOCOL_F_CONFIG`
    pub const CONFIG: u64 = 1 << 9;
    /// `VHOST_USER_PROTOCOL_F_RESET_DEVICE`
    pub const RESET_DEVICE: u64 = 1 << 13;
}

/// Virtio feature bits this back-end deals with.
pub mod vf {
    /// `VHOST_USER_F_PROTOCOL_FEATURES` (vhost-user.rst): bit 30 of the
    /// virtio feature word.
    pub const PROTOCOL_FEATURES: u64 = 1 << 30;
    /// `VIRTIO_F_VERSION_1` (virtio 1.2 §6).
    pub const VERSION_1: u64 = 1 << 32;
    /// `VIRTIO_F_ACCESS_PLATFORM` (virtio 1.2 §6): DMA goes through the
    /// platform's IOMMU; ring and buffer addresses are IOVAs.
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
}

/// The IOTLB message (`struct vhost_iotlb_msg`): iova, size, uaddr (le64
/// each), perm, type (u8 each), padded to 32 bytes.
pub mod iotlb {
    /// Payload bytes of an IOTLB message.
    pub const MSG_LEN: usize = 32;
    /// `VHOST_IOTLB_MISS`
    pub const MISS: u8 = 1;
    /// `VHOST_IOTLB_UPDATE`
    pub const UPDATE: u8 = 2;
    /// `VHOST_IOTLB_INVALIDATE`
    pub const INVALIDATE: u8 = 3;
    /// `VHOST_ACCESS_RO`
    pub const ACCESS_RO: u8 = 1;
    /// `VHOST_ACCESS_WO`
    pub const ACCESS_WO: u8 = 2;
    /// `VHOST_ACCESS_RW`
    pub const ACCESS_RW: u8 = 3;
}

/// The name of a front-end request code, for logs and errors.
pub fn request_name(code: u32) -> &'static str {
    match code {
        req::GET_FEATURES => "GET_FEATURES",
        req::SET_FEATURES => "SET_FEATURES",
        req::SET_OWNER => "SET_OWNER",
        req::RESET_OWNER => "RESET_OWNER",
        req::SET_MEM_TABLE => "SET_MEM_TABLE",
        req::SET_VRING_NUM => "SET_VRING_NUM",
        req::SET_VRING_ADDR => "SET_VRING_ADDR",
        req::SET_VRING_BASE => "SET_VRING_BASE",
        req::GET_VRING_BASE => "GET_VRING_BASE",
        req::SET_VRING_KICK => "SET_VRING_KICK",
        req::SET_VRING_CALL => "SET_VRING_CALL",
        req::SET_VRING_ERR => "SET_VRING_ERR",
        req::GET_PROTOCOL_FEATURES => "GET_PROTOCOL_FEATURES",
        req::SET_PROTOCOL_FEATURES => "SET_PROTOCOL_FEATURES",
        req::GET_QUEUE_NUM => "GET_QUEUE_NUM",
        req::SET_VRING_ENABLE => "SET_VRING_ENABLE",
        req::SET_BACKEND_REQ_FD => "SET_BACKEND_REQ_FD",
        req::IOTLB_MSG => "IOTLB_MSG",
        req::GET_CONFIG => "GET_CONFIG",
        req::SET_CONFIG => "SET_CONFIG",
        req::RESET_DEVICE => "RESET_DEVICE",
        _ => "unknown",
    }
}
