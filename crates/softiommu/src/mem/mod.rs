//! Physical memory: the bytes every other component reads and writes.
//!
//! [`PhysMemory`] is a large sparse arena standing for host (or guest)
//! physical memory. It is reserved with `mmap` and committed page by page as
//! it is touched, so a 64 GiB arena costs nothing up front. Physical
//! addresses are offsets into it, starting at zero.
//!
//! Physical addresses `[0, size)` are RAM, with a page-frame allocator
//! ([`PhysMemory::alloc_frames`]) handing out naturally aligned blocks of
//! 2^order 4 KiB frames for buffers. The IOMMU's own structures (tables,
//! queues) come from a separate reserve above RAM that no device range can
//! include, so a device can never reach them, however frames are reused.
//!
//! Byte access is bounds-checked and never panics on bad input: it returns
//! [`MemError`]. Memory shared with devices is raced by design, so bulk
//! copies move the arena's bytes with relaxed atomic accesses (a word at a
//! time where aligned): never a data race, as `vm-memory`'s volatile
//! slices mean to be; 64-bit words also have ordered atomic loads, stores
//! and compare-exchange, which page-table entries and status words need
//! when a walker and an updater run at once.

mod arena;
mod copy;
pub(crate) mod frames;
pub(crate) mod prefetch;
mod reservation;

pub use arena::{default_iommu_reserve, PhysMemory, MAX_ARENA_BYTES};
pub use frames::{FrameOwner, FrameStats, MAX_FRAME_ORDER};
pub(crate) use reservation::Reservation;

/// A physical address: a byte offset into a [`PhysMemory`] arena.
pub type PhysAddr = u64;

/// The size of a page frame, 4 KiB, in bytes.
pub const PAGE_SIZE: u64 = 4096;
/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;

/// Errors of physical-memory access and frame allocation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// The address range `[addr, addr + len)` is not inside the arena.
    #[error("physical range {addr:#x}+{len:#x} lies outside the {size:#x}-byte arena")]
    OutOfRange {
        /// First byte asked for.
        addr: PhysAddr,
        /// Length asked for.
        len: u64,
        /// Size of the arena.
        size: u64,
    },
    /// The address is not aligned as the access requires.
    #[error("physical address {addr:#x} is not aligned to {align} bytes")]
    Unaligned {
        /// The address.
        addr: PhysAddr,
        /// The alignment it needed.
        align: u64,
    },
    /// No free block of the requested order is left.
    #[error("out of physical frames for a block of order {order}")]
    OutOfFrames {
        /// log2 of the number of 4 KiB frames asked for.
        order: u32,
    },
    /// The order is larger than [`MAX_FRAME_ORDER`].
    #[error("frame order {order} is larger than the maximum {max}")]
    OrderTooLarge {
        /// The order asked for.
        order: u32,
        /// The largest order the allocator serves.
        max: u32,
    },
    /// A free named a block that is not currently allocated with that order.
    #[error("block {addr:#x} of order {order} is not allocated")]
    NotAllocated {
        /// The address freed.
        addr: PhysAddr,
        /// The order given.
        order: u32,
    },
    /// The arena asked for is larger than [`MAX_ARENA_BYTES`].
    #[error("an arena of {size:#x} bytes is larger than the maximum {max:#x}")]
    TooLarge {
        /// The size asked for.
        size: u64,
        /// The largest arena.
        max: u64,
    },
    /// A free named a block that another kind of owner allocated (the
    /// IOMMU's own frames, or a DMA coherent allocation).
    #[error("block {addr:#x} belongs to {owner:?} and cannot be freed here")]
    NotOwner {
        /// The block freed.
        addr: PhysAddr,
        /// Who owns it.
        owner: FrameOwner,
    },
    /// A range handed to a device touches a frame of the IOMMU's own
    /// structures (a ring, a page-table page, a bounce pool).
    #[error("physical frame {addr:#x} belongs to the IOMMU and cannot be given to a device")]
    IommuFrame {
        /// The first such frame.
        addr: PhysAddr,
    },
    /// `mmap` refused to reserve the arena.
    #[error("could not reserve {len:#x} bytes of address space (errno {errno})")]
    Reserve {
        /// Bytes asked for.
        len: u64,
        /// The OS error number.
        errno: i32,
    },
}
