//! The caching policies: ours and the historical Linux ones, as data.
//!
//! Linux constants cited from `drivers/iommu/iova.c` and `include/linux/iova.h`:
//! `IOVA_MAG_SIZE` 128 (127 from v6.4, to fit a magazine in 1 KiB),
//! `MAX_GLOBAL_MAGS` 32 (the fixed depot, until v6.4),
//! `IOVA_RANGE_CACHE_MAX_SIZE` 6 (orders 0..=5 are cached: up to 32 pages),
//! `IOVA_DEPOT_DELAY` 100 ms (v6.4's background depot trim).

use std::time::Duration;

use super::IovaError;

/// Which allocator design an [`IovaDomain`](super::IovaDomain) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IovaPolicy {
    /// The default: an O(log n) free-extent tree that coalesces on free, a
    /// bounded depot, idle depot magazines given back; flat over time.
    Softiommu,
    /// Linux v4.7 to v5.10: a fixed depot of 32 magazines of 128; when it is
    /// full, the loaded magazine's IOVAs go back to a tree of allocated
    /// ranges searched linearly from a cached node.
    Linux2016,
    /// Linux v5.11 (seed `004`): as `Linux2016`, but when the depot is full
    /// every CPU's cache is flushed back to the tree instead.
    Linux2020,
    /// Linux v6.4: an unbounded depot list of magazines of 127, trimmed in
    /// the background (one magazine every 100 ms) down to one per CPU.
    Linux2023,
}

impl IovaPolicy {
    /// Every policy, baselines first.
    pub const ALL: [IovaPolicy; 4] = [
        IovaPolicy::Linux2016,
        IovaPolicy::Linux2020,
        IovaPolicy::Linux2023,
        IovaPolicy::Softiommu,
    ];

    /// The policy's name as the CLI and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            IovaPolicy::Softiommu => "softiommu",
            IovaPolicy::Linux2016 => "linux-2016",
            IovaPolicy::Linux2020 => "linux-2020",
            IovaPolicy::Linux2023 => "linux-2023",
        }
    }

    /// Parses a name printed by [`name`](Self::name).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The tunables this policy runs with.
    pub fn params(self) -> CacheParams {
        match self {
            IovaPolicy::Softiommu => CacheParams {
                // Linux's `IOVA_MAG_SIZE` (128). A class's count in a cache
                // walks at random under a mixed load, and a magazine is
                // traded with the depot each time it reaches an edge: ~M²
                // steps apart for magazines of M. A magazine another cache
                // filled brings blocks whose state words share lines with
                // that cache's live blocks, and both caches then write
                // those lines. Measured on `bench iova --threads 2` (per-
                // thread CPU at 2 threads over at 1): 1.10-1.15 with 64,
                // 0.995-1.064 with 128 (the sharing-free floor 1.00-1.03);
                // one thread unchanged, and `lab iova-aging --quick`'s
                // retained 0.970 -> 0.976.
                magazine_size: 128,
                max_cached_order: 8,
                depot: DepotRule::Bounded {
                    capacity: 8,
                    per_cpu: 2,
                    when_full: WhenFull::FreeMagazine,
                },
                idle_trim: Some(Duration::from_secs(1)),
                linear_tree: false,
                linear_search: LinearSearch::Linux5_10,
                flush_on_low_miss: false,
                affine_depot: true,
            },
            IovaPolicy::Linux2016 | IovaPolicy::Linux2020 => CacheParams {
                magazine_size: 128,
                max_cached_order: 5,
                depot: DepotRule::Bounded {
                    capacity: 32,
                    per_cpu: 0,
                    when_full: if self == IovaPolicy::Linux2016 {
                        WhenFull::FreeMagazine
                    } else {
                        WhenFull::FlushAllCaches
                    },
                },
                idle_trim: None,
                linear_tree: true,
                linear_search: if self == IovaPolicy::Linux2016 {
                    LinearSearch::Linux4_7
                } else {
                    LinearSearch::Linux5_10
                },
                flush_on_low_miss: self == IovaPolicy::Linux2016,
                affine_depot: false,
            },
            IovaPolicy::Linux2023 => CacheParams {
                magazine_size: 127,
                max_cached_order: 5,
                depot: DepotRule::TrimToCpus {
                    every: Duration::from_millis(100),
                },
                idle_trim: None,
                linear_tree: true,
                linear_search: LinearSearch::Linux5_10,
                flush_on_low_miss: false,
                affine_depot: false,
            },
        }
    }
}

impl std::fmt::Display for IovaPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The tunables of the caching layer and the tree behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheParams {
    /// IOVAs per magazine.
    pub magazine_size: usize,
    /// Blocks of up to 2^this pages are cached; larger ones go to the tree.
    /// Ours caches up to 256 pages (1 MiB), a common storage transfer size.
    pub max_cached_order: u32,
    /// What bounds the depot.
    pub depot: DepotRule,
    /// Depot magazines untouched for this long go back to the tree.
    pub idle_trim: Option<Duration>,
    /// The Linux tree of allocated ranges searched linearly, instead of ours.
    pub linear_tree: bool,
    /// Which kernel's search that tree runs (with `linear_tree` only).
    pub linear_search: LinearSearch,
    /// A first try below the low window that finds no room gives every
    /// cache back to the tree before failing over to the full limit, as
    /// `alloc_iova_fast` did until v4.15 ("iommu/iova: Make rcache flush
    /// optional on IOVA allocation failure", 2017, which added the
    /// `flush_rcache` argument that the 32-bit try passes as false).
    pub flush_on_low_miss: bool,
    /// A cache taking a magazine from the depot prefers one it put there
    /// itself. Magazines that wander between CPUs interleave their IOVAs'
    /// state words in shared cache lines; measured on `bench iova --threads
    /// 2`, plain LIFO halves per-thread throughput.
    pub affine_depot: bool,
}

/// The largest magazine: 4,096 IOVAs (32 KiB), 32 times Linux's.
pub const MAX_MAGAZINE_SIZE: usize = 4096;
/// The largest cached order: blocks of up to 2^20 pages (4 GiB) in the
/// caches, far past any DMA segment (a class costs two magazines per CPU).
pub const MAX_CACHED_ORDER: u32 = 20;
/// The largest depot bound, in magazines.
pub const MAX_DEPOT: usize = 1 << 16;

impl CacheParams {
    /// Checks every field against its range: a magazine of 1 to
    /// [`MAX_MAGAZINE_SIZE`] entries, orders up to [`MAX_CACHED_ORDER`],
    /// depot bounds up to [`MAX_DEPOT`], periods of at most an hour.
    pub fn check(&self) -> Result<(), IovaError> {
        let range = |field, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(IovaError::InvalidParams {
                    field,
                    value,
                    min,
                    max,
                })
            }
        };
        let hour = Duration::from_secs(3600).as_nanos() as u64;
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        range(
            "magazine_size",
            self.magazine_size as u64,
            1,
            MAX_MAGAZINE_SIZE as u64,
        )?;
        range(
            "max_cached_order",
            u64::from(self.max_cached_order),
            0,
            u64::from(MAX_CACHED_ORDER),
        )?;
        match self.depot {
            DepotRule::Bounded {
                capacity, per_cpu, ..
            } => {
                range("depot.capacity", capacity as u64, 0, MAX_DEPOT as u64)?;
                range("depot.per_cpu", per_cpu as u64, 0, MAX_DEPOT as u64)?;
            }
            DepotRule::TrimToCpus { every } => range("depot.every", ns(every), 1, hour)?,
        }
        if let Some(t) = self.idle_trim {
            range("idle_trim", ns(t), 1, hour)?;
        }
        Ok(())
    }
}

/// The rules of the Linux tree's linear search, by kernel
/// (`drivers/iommu/iova.c`, `__alloc_and_insert_iova_range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearSearch {
    /// v4.7 (the 2016 magazines): one cached node, for allocations limited
    /// to the low window; others start at the top of the tree. A walk that
    /// reaches the bottom fails; a failed low-window try (a device that
    /// prefers 32-bit IOVAs, as `intel-iommu` gave every device unless
    /// booted with `intel_iommu=forcedac`) walks the whole window every time.
    Linux4_7,
    /// v5.10 on: a cached node for each side of the low window (v4.15); a
    /// walk that reaches the bottom retries once above the cached node
    /// (v5.7); a failed low-window allocation's size is remembered and
    /// larger ones fail without a walk until a range at or above the cached
    /// node is freed (v5.0's `max32_alloc_size`).
    Linux5_10,
}

/// How a size class's depot of full magazines is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepotRule {
    /// At most `max(capacity, per_cpu × caches)` magazines; `when_full`
    /// says what a push then does.
    Bounded {
        /// Magazines the depot holds at most, whatever the CPU count.
        capacity: usize,
        /// Magazines allowed per live per-CPU cache, where that is more: a
        /// depot must absorb the bursts of every CPU that frees.
        per_cpu: usize,
        /// The action when a full magazine finds the depot full.
        when_full: WhenFull,
    },
    /// Unbounded, but one magazine is given back to the tree every `every`
    /// while the depot holds more magazines than there are CPUs.
    TrimToCpus {
        /// The trim period.
        every: Duration,
    },
}

/// What happens when a full magazine finds the depot full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// The loaded magazine's IOVAs are freed to the tree.
    FreeMagazine,
    /// The IOVA goes to the tree and every CPU cache is flushed.
    FlushAllCaches,
}
