//! A buddy allocator of page frames.
//!
//! Blocks of 2^order frames, naturally aligned, orders 0 (4 KiB) to
//! [`MAX_FRAME_ORDER`] (1 GiB). Freeing merges a block with its buddy while
//! the buddy is free. Every allocated block is recorded with its order, so a
//! double free or a free with the wrong order is an error, not corruption.
//!
//! This runs under one lock in [`super::PhysMemory`]: frames are taken when a
//! page table grows or a buffer is set up, not on a per-map or per-access path.

use std::collections::{BTreeSet, HashMap};

use super::MemError;

/// The largest block order: 2^18 frames of 4 KiB = 1 GiB, the largest VT-d
/// leaf size, so a 1 GiB page can be backed by one block.
pub const MAX_FRAME_ORDER: u32 = 18;

/// Who a block of frames belongs to, recorded at allocation and checked at
/// every free: a block is freed only by the kind of owner that took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameOwner {
    /// Taken through [`PhysMemory::alloc_frames`](super::PhysMemory::alloc_frames):
    /// the caller's to use and to free.
    User,
    /// The IOMMU's own structures: root and context tables, page-table
    /// pages, invalidation, fault and page-request queues. They live in the
    /// arena's IOMMU reserve, outside RAM: never freed through the public
    /// API, never reachable by a device, never the target of a
    /// descriptor's status write.
    Iommu,
    /// A bounce pool of the DMA layer: RAM that devices reach through the
    /// pool's own mappings, but that no caller may map as a buffer and no
    /// descriptor may write. Freed only by the DMA layer.
    Bounce,
    /// A DMA coherent allocation: freed only through the DMA API
    /// (`DmaCpu::free_coherent`).
    Coherent,
}

/// Counts describing the frame allocator's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// Frames (4 KiB) managed in all.
    pub total_frames: u64,
    /// Frames currently allocated.
    pub allocated_frames: u64,
    /// Allocated blocks.
    pub allocated_blocks: u64,
}

/// The buddy allocator proper, over frame numbers `[0, total_frames)`.
#[derive(Debug)]
pub(crate) struct Buddy {
    free: Vec<BTreeSet<u64>>,
    allocated: HashMap<u64, (u32, FrameOwner)>,
    stats: FrameStats,
}

impl Buddy {
    pub(crate) fn new(total_frames: u64) -> Self {
        let mut free = vec![BTreeSet::new(); MAX_FRAME_ORDER as usize + 1];
        // Carve [0, total) into the largest naturally aligned blocks.
        let mut pfn = 0u64;
        while pfn < total_frames {
            let mut order = MAX_FRAME_ORDER.min(pfn.trailing_zeros());
            while pfn + (1u64 << order) > total_frames {
                order -= 1;
            }
            free[order as usize].insert(pfn);
            pfn += 1 << order;
        }
        Self {
            free,
            allocated: HashMap::new(),
            stats: FrameStats {
                total_frames,
                ..FrameStats::default()
            },
        }
    }

    pub(crate) fn alloc(&mut self, order: u32, owner: FrameOwner) -> Result<u64, MemError> {
        if order > MAX_FRAME_ORDER {
            return Err(MemError::OrderTooLarge {
                order,
                max: MAX_FRAME_ORDER,
            });
        }
        let from = (order..=MAX_FRAME_ORDER)
            .find(|&o| !self.free[o as usize].is_empty())
            .ok_or(MemError::OutOfFrames { order })?;
        // Take the lowest block: keeps use compact at the bottom of the arena.
        // `find` above saw the list non-empty, and nothing ran since.
        let pfn = self.free[from as usize]
            .pop_first()
            .ok_or(MemError::OutOfFrames { order })?;
        for o in (order..from).rev() {
            self.free[o as usize].insert(pfn + (1 << o));
        }
        self.allocated.insert(pfn, (order, owner));
        self.stats.allocated_frames += 1 << order;
        self.stats.allocated_blocks += 1;
        Ok(pfn)
    }

    pub(crate) fn free(&mut self, pfn: u64, order: u32, owner: FrameOwner) -> Result<(), MemError> {
        match self.allocated.get(&pfn) {
            Some(&(o, w)) if o == order && w == owner => {}
            Some(&(o, w)) if o == order => {
                return Err(MemError::NotOwner {
                    addr: pfn << 12,
                    owner: w,
                })
            }
            _ => {
                return Err(MemError::NotAllocated {
                    addr: pfn << 12,
                    order,
                })
            }
        }
        self.allocated.remove(&pfn);
        self.stats.allocated_frames -= 1 << order;
        self.stats.allocated_blocks -= 1;
        let (mut pfn, mut order) = (pfn, order);
        while order < MAX_FRAME_ORDER {
            let buddy = pfn ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            pfn = pfn.min(buddy);
            order += 1;
        }
        self.free[order as usize].insert(pfn);
        Ok(())
    }

    pub(crate) fn stats(&self) -> FrameStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: FrameOwner = FrameOwner::User;

    #[test]
    fn split_and_merge_restore_the_initial_state() {
        let mut b = Buddy::new(1 << 10);
        let a = b.alloc(0, U).unwrap();
        let c = b.alloc(3, U).unwrap();
        assert_eq!(c % 8, 0, "blocks are naturally aligned");
        assert_ne!(a, c);
        b.free(a, 0, U).unwrap();
        b.free(c, 3, U).unwrap();
        assert_eq!(b.stats().allocated_frames, 0);
        assert_eq!(b.free[10].len(), 1, "everything merged back into one block");
    }

    #[test]
    fn double_and_wrong_order_frees_are_errors() {
        let mut b = Buddy::new(64);
        let a = b.alloc(2, U).unwrap();
        assert!(matches!(
            b.free(a, 1, U),
            Err(MemError::NotAllocated { .. })
        ));
        b.free(a, 2, U).unwrap();
        assert!(matches!(
            b.free(a, 2, U),
            Err(MemError::NotAllocated { .. })
        ));
        assert!(matches!(
            b.free(999, 0, U),
            Err(MemError::NotAllocated { .. })
        ));
    }

    #[test]
    fn a_block_is_freed_only_by_its_kind_of_owner() {
        let mut b = Buddy::new(64);
        let a = b.alloc(0, FrameOwner::Iommu).unwrap();
        assert_eq!(
            b.free(a, 0, U),
            Err(MemError::NotOwner {
                addr: a << 12,
                owner: FrameOwner::Iommu
            })
        );
        assert_eq!(b.stats().allocated_blocks, 1, "nothing changed");
        b.free(a, 0, FrameOwner::Iommu).unwrap();
    }

    #[test]
    fn exhaustion_is_an_error() {
        let mut b = Buddy::new(4);
        b.alloc(2, U).unwrap();
        assert_eq!(b.alloc(0, U), Err(MemError::OutOfFrames { order: 0 }));
        assert!(matches!(
            b.alloc(40, U),
            Err(MemError::OrderTooLarge { .. })
        ));
    }

    #[test]
    fn odd_sized_arenas_are_carved_fully() {
        let mut b = Buddy::new(13);
        let mut got = 0;
        while b.alloc(0, U).is_ok() {
            got += 1;
        }
        assert_eq!(got, 13);
    }
}
