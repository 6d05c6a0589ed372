//! The back-end's typed errors: what a front-end, a guest or the command
//! line can get wrong, each with the facts to act on.

use std::io;

/// A device-IOTLB message the IOTLB refuses; the IOTLB is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IotlbError {
    /// An update or invalidation of zero bytes (it names no range).
    #[error("zero-length IOTLB {op} at iova {iova:#x}")]
    ZeroLength {
        /// `"update"` or `"invalidate"`.
        op: &'static str,
        /// The message's iova.
        iova: u64,
    },
    /// `iova + size` runs past 2^64 (a range may end exactly at 2^64).
    #[error("IOTLB {op} [{iova:#x}, +{size:#x}) runs past 2^64")]
    IovaWraps {
        /// `"update"` (an invalidation that runs past 2^64 is taken to the
        /// top of the address space instead).
        op: &'static str,
        /// The message's iova.
        iova: u64,
        /// The message's size.
        size: u64,
    },
    /// `uaddr + size` runs past 2^64.
    #[error("IOTLB update uaddr [{uaddr:#x}, +{size:#x}) runs past 2^64")]
    UaddrWraps {
        /// The message's front-end virtual address.
        uaddr: u64,
        /// The message's size.
        size: u64,
    },
    /// An update whose permission is neither RO, WO nor RW.
    #[error("IOTLB update with permission {perm:#x} (not RO, WO or RW)")]
    BadPerm {
        /// The message's `perm` byte.
        perm: u8,
    },
    /// A message type the front-end may not send (a miss, an access failure).
    #[error("IOTLB message type {kind} is not one a front-end sends")]
    BadType {
        /// The message's `type` byte.
        kind: u8,
    },
}

/// A device access (the device's DMA through the IOTLB) that did not happen;
/// no byte of guest memory was read or written by it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The range's translation has been missing for the whole bound: the
    /// front-end did not answer the misses (or answered with nothing).
    #[error("IOTLB miss at iova {iova:#x} unanswered after {waited_ms} ms")]
    MissTimeout {
        /// The first IOVA without a translation.
        iova: u64,
        /// How long the access waited.
        waited_ms: u64,
    },
    /// The translation exists but does not allow this access direction.
    #[error("iova {iova:#x} is mapped without {want} permission")]
    Denied {
        /// The IOVA.
        iova: u64,
        /// `"read"` or `"write"`.
        want: &'static str,
    },
    /// The translation points outside every memory region the front-end shared.
    #[error("iova {iova:#x} translates to {uaddr:#x}, outside the shared memory")]
    OutsideMemory {
        /// The IOVA.
        iova: u64,
        /// The front-end virtual (or guest-physical) address it translated to.
        uaddr: u64,
    },
    /// `iova + len` runs past 2^64.
    #[error("access [{iova:#x}, +{len:#x}) runs past 2^64")]
    Wraps {
        /// The IOVA.
        iova: u64,
        /// The length.
        len: u64,
    },
    /// The rings were stopped (or the front-end went away) while the access
    /// waited for a miss.
    #[error("access at iova {iova:#x} cancelled: the rings stopped")]
    Cancelled {
        /// The IOVA waited for.
        iova: u64,
    },
    /// The miss could not be sent: no back-end channel, or it failed.
    #[error("cannot ask the front-end for iova {iova:#x}: {reason}")]
    NoChannel {
        /// The IOVA.
        iova: u64,
        /// Why.
        reason: String,
    },
    /// The front-end did not read the back-end channel within the miss
    /// bound: the miss was not sent (nothing of it), the channel stays.
    #[error("cannot ask the front-end for iova {iova:#x}: the back-end channel stayed full for {waited_ms} ms")]
    ChannelFull {
        /// The first IOVA not asked.
        iova: u64,
        /// How long the send waited.
        waited_ms: u64,
    },
    /// The back-end channel was given up (a miss went out in part, or the
    /// socket failed): every miss fails so at once until the front-end
    /// sends a new one (`SET_BACKEND_REQ_FD`).
    #[error("cannot ask the front-end for iova {iova:#x}: back-end channel broken ({reason})")]
    ChannelBroken {
        /// The IOVA.
        iova: u64,
        /// What broke it.
        reason: String,
    },
    /// The data transfer between the backing file and guest memory failed.
    #[error("backing file I/O failed: {0}")]
    Io(String),
}

/// A front-end message the back-end refuses. Where the message asked for a
/// reply-ack the back-end answers it with a failure and serves on; the
/// state is as before the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// The payload size does not fit the request.
    #[error("{name}: payload of {size} bytes, expected {want}")]
    BadSize {
        /// The request's name.
        name: &'static str,
        /// Bytes received.
        size: usize,
        /// Bytes (or the shape) expected.
        want: String,
    },
    /// The message came with the wrong number of file descriptors.
    #[error("{name}: {got} file descriptors, expected {want}")]
    BadFds {
        /// The request's name.
        name: &'static str,
        /// Descriptors received.
        got: usize,
        /// Descriptors expected.
        want: usize,
    },
    /// A descriptor of the wrong kind: a kick or call that is not an
    /// eventfd, a back-end channel that is not an `AF_UNIX` stream socket.
    #[error("{name}: {reason}")]
    BadFdKind {
        /// The request's name.
        name: &'static str,
        /// What the descriptor is.
        reason: String,
    },
    /// A queue index past the queues this device has.
    #[error("{name}: queue {index} (the device has {queues})")]
    BadQueue {
        /// The request's name.
        name: &'static str,
        /// The index.
        index: u32,
        /// The device's queues.
        queues: u32,
    },
    /// A value out of range (ring size, feature bits, region geometry...).
    #[error("{name}: {what}")]
    Invalid {
        /// The request's name.
        name: &'static str,
        /// What is wrong.
        what: String,
    },
    /// A request code this back-end does not serve.
    #[error("request {code} is not served")]
    Unsupported {
        /// The code.
        code: u32,
    },
    /// An IOTLB message the device IOTLB refused.
    #[error(transparent)]
    Iotlb(#[from] IotlbError),
    /// A region's descriptor is not a file sealed against shrinking
    /// (`F_SEAL_SHRINK`): one the front-end could truncate under the
    /// mapping, so that an access would raise `SIGBUS`.
    #[error("SET_MEM_TABLE: region {index}: {reason}")]
    RegionUnsealed {
        /// The region's index in the table.
        index: usize,
        /// What the descriptor is or lacks.
        reason: String,
    },
    /// A region (`mmap_offset + memory_size`) runs past the end of its file.
    #[error(
        "SET_MEM_TABLE: region {index} ends at {end:#x}, past its file's {file_size:#x} bytes"
    )]
    RegionPastFile {
        /// The region's index in the table.
        index: usize,
        /// Where the region ends in the file.
        end: u64,
        /// The file's size.
        file_size: u64,
    },
    /// A shared memory region could not be mapped.
    #[error("SET_MEM_TABLE: mapping region {index} failed: {reason}")]
    Map {
        /// The region's index in the table.
        index: usize,
        /// The OS error.
        reason: String,
    },
}

/// Why a front-end session ended abnormally (the back-end itself stops
/// cleanly: its rings stopped, its worker joined).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A header with an unknown version, or a payload larger than
    /// [`MAX_PAYLOAD`](crate::proto::MAX_PAYLOAD): the stream cannot be
    /// read on.
    #[error("unreadable message: {0}")]
    Framing(String),
    /// The front-end began a message and did not send the rest of it, or
    /// did not take a reply, within the session's bound (10 s; see
    /// `session::MESSAGE_BOUND`): it cannot hold the session's thread.
    #[error("the front-end stalled on {what}: not done within {bound_ms} ms")]
    Stalled {
        /// What was waited for: "a header", "a payload" or "a reply".
        what: &'static str,
        /// The bound, in milliseconds.
        bound_ms: u64,
    },
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
}

/// A back-end configuration or command line the back-end refuses.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The backing file cannot be opened or sized.
    #[error("disk {path}: {reason}")]
    Disk {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The backing file's size is not a whole number of 512-byte sectors, or is zero.
    #[error("disk {path}: size {size} is not a positive multiple of 512")]
    DiskSize {
        /// The path.
        path: String,
        /// Its size.
        size: u64,
    },
    /// A numeric option out of its range.
    #[error("{option} must be in {range}, got {value}")]
    Range {
        /// The option.
        option: &'static str,
        /// The valid range.
        range: &'static str,
        /// The value given.
        value: u64,
    },
}
