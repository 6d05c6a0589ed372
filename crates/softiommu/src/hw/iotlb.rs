//! The IOTLB: a bounded, set-associative cache of leaf translations, tagged
//! by domain, read without locks.
//!
//! # Layout
//!
//! `sets × ways` entries of 32 bytes (two to a cache line). An entry caches
//! one leaf: its tag (domain id, IOVA of the leaf's start, leaf size), the
//! physical address of the leaf and its rights, and the *generation* it was
//! filled under. The set is chosen by a multiplicative hash of the tag, and
//! seven other bits of the hash are the tag's *fingerprint*: each set has
//! two words holding a byte per way, up to 16 (the fingerprint of the tag
//! the way was last filled with, bit 7 set; 0 for a way never filled or
//! past the set's ways). A probe loads the set's two words, marks the
//! bytes equal to its fingerprint with one 16-byte compare (SSE2 on
//! x86-64, word-wide ALU operations elsewhere), and runs the sequence-lock
//! read below on the marked ways only: 16 L1-resident bytes and one entry
//! line per hit, where reading every way's key touched all of a 4-way
//! set's two lines. To a probe the words are hints, written by fills
//! under the way's lock and never cleared: a stale byte costs a miss or a
//! wasted validation, never a wrong hit (the full tag and the generation
//! decide). A page scan relies on them (see below), so fills write them,
//! and scans read them, with read-modify-writes.
//! A lookup probes the 4 KiB set first and, only if the unit has ever
//! cached a large leaf, the 2 MiB and 1 GiB sets: an entry for a large
//! leaf covers its whole range. A fill replaces, in order of preference, an
//! entry with the same tag, one never filled (both found by the
//! fingerprints), an invalid or stale one (among a bounded number of
//! ways), or a pseudo-random one (the caller's own generator, so the hit
//! path writes nothing shared to keep recency).
//!
//! # Reading without locks: a sequence lock per entry
//!
//! `seq` is a multiple of 4 when the entry is stable. A writer (a fill or
//! an invalidation) takes it with one `fetch_or` (of bit 0 for a fill, of
//! bits 0 and 1 for a page scan: see below; slow path), so at most
//! one writes an entry at a time, and releases it by storing the next
//! multiple of 4. A reader loads `seq` (Acquire), the fields (Relaxed), an
//! Acquire fence, and `seq` again; it uses the fields only if both loads saw
//! the same multiple of 4. The writer issues a Release fence after taking
//! the lock and before writing the fields. If a reader's field load saw any
//! value of a later writer, its Acquire fence synchronizes with that
//! writer's Release fence and its second `seq` load sees the locked value or
//! later: a torn entry is never used (H.-J. Boehm, "Can seqlocks get along
//! with programming language memory models?", MSPC 2012). The hit path has
//! no read-modify-write and no `SeqCst` fence; on x86 every one of its
//! orderings compiles to a plain load.
//!
//! # Invalidation
//!
//! - **Global and domain-selective: O(1).** Each domain has a generation
//!   counter and the unit one more; an entry is valid only if its stored
//!   generation equals `global + domain[did]` now. Invalidating bumps a
//!   counter (Release); no entry is touched. Both counters only grow, so a
//!   sum once left behind never returns. A fill records the sum it read
//!   (Acquire) *before* its walk: if the walk could have seen a table from
//!   before an invalidation F, the filler did not see F's bump (seeing it
//!   would have ordered the walk after the table update, which precedes the
//!   bump), so the sum it stored is smaller than any sum read once F is
//!   visible. A fill that races a domain flush therefore inserts an entry
//!   that is already dead.
//! - **Page-selective: a scan of the sets the range maps to**, one scan at
//!   a time (a mutex that fills never take: a scan that meets an entry
//!   another holds takes the holder for a fill, below) (or of the
//!   whole cache when the range spans more sets than there are; the 2 MiB
//!   and 1 GiB sets only once such a leaf was cached, read with a
//!   read-modify-write of the `large` bits that a large fill's own
//!   read-modify-write is ordered against). The domain's
//!   `psi` counter is bumped (Release); the set's fingerprint words are
//!   read with a read-modify-write each, which a fill's own write of its
//!   way's byte (before its `psi` re-check) is ordered against, so only
//!   the ways whose byte matches can hold the page or a fill of it (see
//!   `claimed_matches`); then each of those gets one
//!   `fetch_or(3)`: on a free entry that takes the lock (the scan then clears
//!   the entry if its tag falls in the range); on an entry a fill holds it
//!   sets the *kill* bit, and the fill's unlock (a compare-exchange from
//!   its own locked value) fails and withdraws the entry instead of
//!   publishing it. A fill also re-reads `psi` before unlocking and
//!   withdraws if it moved since before its walk. All of these are
//!   read-modify-writes of the one `seq` word (Acquire; unlocks Release), so
//!   of a fill and a scan on one entry the later sees the earlier's work:
//!   the scan kills the fill in flight, or sees the finished fill's tag and
//!   clears it, or finished first, and then the fill's lock synchronizes
//!   with the scan's unlock, sees the `psi` bump and withdraws. So after the
//!   scan no stale entry for the range exists *and none can appear later*,
//!   which is what lets the drain that follows (see `epoch`) be the last
//!   word; and the scan never waits for a fill. A fill that overlaps an
//!   unrelated invalidation of the same domain is withdrawn too: a lost
//!   fill, never a wrong one.
//!
//! Every concurrent piece above is model-checked with loom (`loom_tests`).

use crossbeam_utils::CachePadded;

use super::clock::DeadlineClock;

use crate::mem::{PhysAddr, PAGE_SHIFT};
use crate::pgtable::{PageSize, Perm, VTD_IOVA_BITS};
use crate::sync::barrier::Barrier;
use crate::sync::{fence, lock, AtomicU64, Mutex, Ordering};

/// Shape of an IOTLB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IotlbConfig {
    /// Number of sets, a power of two.
    pub sets: usize,
    /// Entries per set, 1 to 16.
    pub ways: usize,
}

impl Default for IotlbConfig {
    /// 256 sets of 16 ways: 4,096 entries (128 KiB), the order of the
    /// IOTLB sizes reported for server VT-d units, and small enough that a
    /// working set of a few thousand 4 KiB buffers shows misses. Sixteen
    /// ways: at half occupancy under random addresses about 0.1 % of
    /// lookups are conflict misses, against 1 % with eight and 4 % with
    /// four (`bench translate`'s hit case: 99.9 %, 98.9 %, 95.8 %). A hit
    /// costs no more (one fingerprint compare covers sixteen ways), and
    /// neither does a page-selective invalidation, which locks only the
    /// ways whose fingerprint matches (`bench dma --instructions`: strict's
    /// pair 3,062 instructions with 8 ways locked a page, 2,950 with 16
    /// ways filtered, the scans' mutex included).
    fn default() -> Self {
        Self {
            sets: 256,
            ways: 16,
        }
    }
}

impl IotlbConfig {
    /// The number of entries.
    pub fn capacity(&self) -> usize {
        self.sets.saturating_mul(self.ways)
    }

    /// Whether the shape is one the IOTLB accepts.
    pub fn is_valid(&self) -> bool {
        self.sets.is_power_of_two() && self.sets <= 1 << 24 && (1..=16).contains(&self.ways)
    }
}

/// The valid bit of a tag.
const KEY_VALID: u64 = 1 << 63;
/// Bits of the tag holding the leaf's IOVA page number.
const KEY_VPN_BITS: u32 = VTD_IOVA_BITS - PAGE_SHIFT;
/// Where the domain id starts in a tag.
const KEY_DID_SHIFT: u32 = KEY_VPN_BITS;
/// Where the leaf-size code starts in a tag.
const KEY_SIZE_SHIFT: u32 = KEY_DID_SHIFT + 16;
/// The address bits of an entry's value (bits 51:12); bits 1:0 hold R, W.
const VAL_ADDR_MASK: u64 = ((1 << 52) - 1) & !((1 << PAGE_SHIFT) - 1);
/// Fibonacci hashing's multiplier, 2^64 / φ.
const HASH_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// Ways per fingerprint word (a byte each).
const FP_WAYS: usize = 8;
/// Fingerprint words per set, whatever its ways (16 at most): a probe
/// compares all sixteen bytes at once.
const FP_WORDS: usize = 2;
/// Every byte of a word set to 0x01, and to 0x7f.
#[cfg(all(
    not(loom),
    any(test, not(all(target_arch = "x86_64", target_feature = "sse2")))
))]
const BYTES_01: u64 = 0x0101_0101_0101_0101;
#[cfg(all(
    not(loom),
    any(test, not(all(target_arch = "x86_64", target_feature = "sse2")))
))]
const BYTES_7F: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// A tag's way fingerprint, from its hash `h`: its top seven bits (the
/// best mixed of a multiplicative hash; the set index takes at most bits
/// 32 to 55), and bit 7 set so that it never equals an unused way's 0.
#[inline(always)]
fn fingerprint(h: u64) -> u64 {
    h >> 57 | 0x80
}

/// The ways of a set whose fingerprint bytes (`lo`: ways 0 to 7, `hi`:
/// ways 8 to 15) equal `fp`, as a way mask: bit `w` set if and only if
/// way `w`'s byte equals `fp` (exact: every match, and nothing else).
///
/// On x86-64 one SSE2 byte compare of all sixteen and a mask move (SSE2 is
/// part of the x86-64 baseline), where the word-wide ALU form below cost
/// the hit path about ten instructions more a word.
#[cfg(all(not(loom), target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn fp_matches(lo: u64, hi: u64, fp: u64) -> u32 {
    use std::arch::x86_64::_mm_set_epi64x;
    // SAFETY: SSE2 only, which this build enables (the `cfg` above);
    // registers only. The casts keep the words' bits.
    fp_matches_x86(unsafe { _mm_set_epi64x(hi as i64, lo as i64) }, fp)
}

/// [`fp_matches`] of a set's sixteen fingerprint bytes in one register.
#[cfg(all(not(loom), target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn fp_matches_x86(bytes: std::arch::x86_64::__m128i, fp: u64) -> u32 {
    use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_movemask_epi8, _mm_set1_epi32};
    // The byte in all four of a 32-bit lane's bytes by one multiply, then
    // in every lane: two instructions fewer than a byte broadcast in SSE2.
    let lane = (fp as u32 & 0xff).wrapping_mul(0x0101_0101);
    // SAFETY: the intrinsics need SSE2 only, which this build enables
    // (the `cfg` above; every x86-64 target does); they read and write
    // registers only. The cast keeps the lane's bits.
    let mask = unsafe { _mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_set1_epi32(lane as i32))) };
    mask as u32
}

/// [`fp_matches`] elsewhere.
#[cfg(all(not(loom), not(all(target_arch = "x86_64", target_feature = "sse2"))))]
#[inline(always)]
fn fp_matches(lo: u64, hi: u64, fp: u64) -> u32 {
    fp_matches_swar(lo, fp) | fp_matches_swar(hi, fp) << 8
}

/// The bytes of one fingerprint word equal to `fp` as an 8-bit mask, in
/// word-wide ALU operations: bit 7 of each byte equal to `fp` (no false
/// match from a borrow), then those eight bits gathered by a multiply.
#[cfg(all(
    not(loom),
    any(test, not(all(target_arch = "x86_64", target_feature = "sse2")))
))]
#[inline(always)]
fn fp_matches_swar(word: u64, fp: u64) -> u32 {
    let x = word ^ fp.wrapping_mul(BYTES_01);
    let high = !((x & BYTES_7F).wrapping_add(BYTES_7F) | x | BYTES_7F);
    // Bit 8b + 7 to bit b: the products of the shifted bits land in
    // distinct bits of the top byte.
    ((high >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32
}

/// [`fp_matches`] for every build, loom's included (whose probe does not
/// use the fingerprints, but whose page scans do).
#[inline(always)]
fn fp_matches_any(lo: u64, hi: u64, fp: u64) -> u32 {
    #[cfg(not(loom))]
    {
        fp_matches(lo, hi, fp)
    }
    #[cfg(loom)]
    {
        (0..16).fold(0, |m, w| {
            let word = if w < FP_WAYS { lo } else { hi };
            m | u32::from((word >> (w % FP_WAYS * 8)) & 0xff == fp) << w
        })
    }
}

/// Ways a fill looks at for an invalid or stale one, when none is
/// unfilled and none holds its tag: 8, a 16-way set's half.
const DEAD_PROBES: usize = 8;

/// `seq` bit 0: a writer holds the entry.
const SEQ_LOCKED: u64 = 1;
/// `seq` bit 1: a page invalidation met the holder's fill: withdraw it.
const SEQ_KILL: u64 = 2;
/// `seq` advances by this per write; stable values are multiples of it.
const SEQ_STEP: u64 = 4;

fn size_code(size: PageSize) -> u64 {
    match size {
        PageSize::Size4K => 0,
        PageSize::Size2M => 1,
        PageSize::Size1G => 2,
    }
}

fn size_of_code(code: u64) -> Option<PageSize> {
    match code {
        0 => Some(PageSize::Size4K),
        1 => Some(PageSize::Size2M),
        2 => Some(PageSize::Size1G),
        _ => None,
    }
}

/// The tag of the leaf of `size` that holds `iova` in domain `did`.
#[inline(always)]
fn make_key(did: u16, iova: u64, size: PageSize) -> u64 {
    let vpn = (iova >> size.shift() << size.shift() >> PAGE_SHIFT) & ((1 << KEY_VPN_BITS) - 1);
    KEY_VALID | size_code(size) << KEY_SIZE_SHIFT | u64::from(did) << KEY_DID_SHIFT | vpn
}

/// The tag of `did`'s 4 KiB leaf at IOVA 0: OR in a page number for the
/// tag of that page.
#[inline(always)]
pub(crate) fn key_4k_base(did: u16) -> u64 {
    make_key(did, 0, PageSize::Size4K)
}

/// A decoded tag: domain, leaf start, leaf size.
fn split_key(key: u64) -> Option<(u16, u64, PageSize)> {
    if key & KEY_VALID == 0 {
        return None;
    }
    let size = size_of_code((key >> KEY_SIZE_SHIFT) & 3)?;
    let did = (key >> KEY_DID_SHIFT) as u16;
    let base = (key & ((1 << KEY_VPN_BITS) - 1)) << PAGE_SHIFT;
    Some((did, base, size))
}

fn perm_bits(perm: Perm) -> u64 {
    u64::from(perm.read()) | u64::from(perm.write()) << 1
}

#[inline(always)]
fn perm_of(bits: u64) -> Perm {
    Perm::from_low_bits(bits)
}

/// The physical address an entry's value word holds.
#[inline(always)]
pub(crate) fn val_phys(val: u64) -> PhysAddr {
    // Bits 63:52 are 0 in every value word (the only store, in `fill`,
    // masks the address with `VAL_ADDR_MASK`), so clearing the low 12
    // bits is the same mask, in one instruction with an immediate.
    debug_assert_eq!(val & !VAL_ADDR_MASK & !((1 << PAGE_SHIFT) - 1), 0);
    val & !((1 << PAGE_SHIFT) - 1)
}

/// The rights an entry's value word holds.
#[inline(always)]
pub(crate) fn val_perm(val: u64) -> Perm {
    perm_of(val)
}

/// The leaf of `size` an entry's value word describes.
#[inline(always)]
fn leaf_of(val: u64, size: PageSize) -> Leaf {
    Leaf {
        phys: val_phys(val),
        size,
        perm: val_perm(val),
    }
}

/// A cached leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leaf {
    /// Physical address of the leaf's start.
    pub(crate) phys: PhysAddr,
    /// The leaf's size.
    pub(crate) size: PageSize,
    /// Its effective rights.
    pub(crate) perm: Perm,
}

/// What a translation read before its walk, to be checked by its fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    /// `global + domain[did]` generation.
    pub(crate) gen: u64,
    /// The domain's page-selective invalidation count.
    pub(crate) psi: u64,
}

/// What a fill did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FillOutcome {
    /// The entry was cached.
    Filled,
    /// A page-selective invalidation ran during the walk: not cached.
    Withdrawn,
    /// The chosen entry was being written by another thread: not cached.
    Busy,
}

/// One cached translation; see the module documentation for the protocol.
#[derive(Debug, Default)]
#[repr(C, align(32))]
struct Entry {
    seq: AtomicU64,
    key: AtomicU64,
    val: AtomicU64,
    gen: AtomicU64,
}

/// A set's fingerprint words (see `Iotlb::fps`), 16-aligned so that a
/// probe reads both with one aligned load that never crosses a line.
#[derive(Debug, Default)]
#[repr(C, align(16))]
struct FpPair([AtomicU64; FP_WORDS]);

/// A domain's invalidation counters, and its expiry deadline.
#[derive(Debug, Default)]
#[repr(C, align(32))]
pub(crate) struct DomainGen {
    /// Bumped by each domain-selective invalidation, and by
    /// [`BINDING_STEP`] at each new binding of the domain id.
    gen: AtomicU64,
    /// Bumped by each page-selective invalidation.
    psi: AtomicU64,
    /// When the domain's cached translations must be gone by, a reading
    /// of the IOTLB's [`DeadlineClock`]; 0: no deadline. Armed (or moved
    /// earlier) by every deferred unmap that finds none armed, before the
    /// unmap returns; moved on by each translator that finds it due (see
    /// [`Iotlb::expire`]); cleared by the flush timer, in two steps, when
    /// nothing is queued (see [`Iotlb::begin_clear`]). On the line every
    /// hit reads for `gen`.
    deadline: AtomicU64,
    /// How far a translator that finds the deadline due moves it on, in
    /// clock units (0: it clears it instead). Set before each arming.
    period: AtomicU64,
}

fn new_domains(n: usize) -> Box<[DomainGen]> {
    #[cfg(not(loom))]
    {
        // SAFETY: `DomainGen` is four `AtomicU64`s, for which all-zero
        // bytes are a valid value (zero: no deadline); a zeroed allocation
        // is also left uncommitted by the OS until a domain is used.
        unsafe { Box::<[DomainGen]>::new_zeroed_slice(n).assume_init() }
    }
    #[cfg(loom)]
    {
        (0..n).map(|_| DomainGen::default()).collect()
    }
}

/// The IOTLB of one unit.
#[derive(Debug)]
pub(crate) struct Iotlb {
    entries: Box<[Entry]>,
    ways: usize,
    /// `ways` entries' bytes: from one set's first entry to the next's.
    set_bytes: usize,
    set_mask: usize,
    /// Each set's way fingerprints, `FP_WORDS` words a set: byte `w % 8`
    /// of word `w / 8` is a hash byte of the tag way `w` was last filled
    /// with (bit 7 set), 0 if never filled (or past the set's ways). A
    /// hint to a probe: it validates every way whose byte matches, and a
    /// stale byte costs a miss or a wasted validation, never a wrong hit.
    /// A page scan locks only the ways whose byte matches
    /// (`claimed_matches`).
    fps: Box<[FpPair]>,
    domains: Box<[DomainGen]>,
    dom_mask: usize,
    /// Bumped by each global invalidation. Read on every translation.
    global: CachePadded<AtomicU64>,
    /// Bit 0: a 2 MiB leaf was cached once; bit 1: a 1 GiB leaf. Only
    /// ever set. A hint for lookups; page-selective invalidations rely on
    /// it (see `invalidate_pages`).
    large: CachePadded<AtomicU64>,
    /// The clock the domains' deadlines are readings of.
    clock: DeadlineClock,
    /// Held by each page scan for its whole run: two scans never meet on
    /// one entry. (`clear_if` takes a held entry for a fill's and kills
    /// it; a scan holding it would unlock over the kill bit and leave the
    /// other scan's page cached.) Fills never take it, so a scan still
    /// never waits for a fill.
    scans: Mutex<()>,
}

/// What a new binding of a domain id adds to its generation counter:
/// domain-selective invalidations add 1, so the counter's bits from 16 up
/// move at every binding (and once in 65,536 invalidations, a carry, which
/// only makes translators read their context afresh). The counter only
/// grows, and wraps only after 2^64 in all (a binding counting 2^16): 2^48
/// bindings with no invalidation.
pub(crate) const BINDING_STEP: u64 = 1 << 16;

/// The binding part of a domain's own generation counter (see
/// [`BINDING_STEP`]): equal parts read at two moments mean no binding came
/// in between.
#[inline(always)]
pub(crate) fn binding_of(own: u64) -> u64 {
    own >> 16
}

/// A deadline word's mark: the flush timer is clearing it (it stays in
/// force until the clearing finishes, and an unmap that meets the mark
/// cancels it). Clock readings stay far below it.
pub(crate) const DEADLINE_CLEARING: u64 = 1 << 63;

impl Iotlb {
    /// An empty IOTLB of shape `cfg` (which must be valid) for
    /// `domains` domain ids (a power of two).
    pub(crate) fn new(cfg: IotlbConfig, domains: usize) -> Self {
        // A hard check: `set` indexes without bounds checks on the shape
        // (the unit refuses an invalid one with a typed error first).
        assert!(cfg.is_valid(), "IOTLB shape {cfg:?}");
        // A hard check: `domain` indexes without a bounds check.
        assert!(domains.is_power_of_two(), "{domains} domains");
        Self {
            entries: (0..cfg.capacity()).map(|_| Entry::default()).collect(),
            ways: cfg.ways,
            set_bytes: cfg.ways * std::mem::size_of::<Entry>(),
            set_mask: cfg.sets - 1,
            fps: (0..cfg.sets).map(|_| FpPair::default()).collect(),
            domains: new_domains(domains),
            dom_mask: domains - 1,
            global: CachePadded::new(AtomicU64::new(0)),
            large: CachePadded::new(AtomicU64::new(0)),
            clock: DeadlineClock::get(),
            scans: Mutex::new(()),
        }
    }

    #[inline(always)]
    fn domain(&self, did: u16) -> &DomainGen {
        // The mask keeps the index in bounds; DIDs beyond the unit's range
        // are refused before they get here.
        let i = usize::from(did) & self.dom_mask;
        debug_assert!(i < self.domains.len());
        // SAFETY: `domains` holds `dom_mask + 1` entries (`new`: a power
        // of two, and `dom_mask` is one less), and `i <= dom_mask`.
        unsafe { self.domains.get_unchecked(i) }
    }

    /// The set `key` maps to, and the way fingerprint `key` carries.
    #[inline(always)]
    fn place(&self, key: u64) -> (usize, u64) {
        let h = key.wrapping_mul(HASH_MUL);
        ((h >> 32) as usize & self.set_mask, fingerprint(h))
    }

    /// The ways of set `set` (at most `set_mask`).
    #[inline(always)]
    fn ways_of(&self, set: usize) -> &[Entry] {
        debug_assert!(set * self.ways + self.ways <= self.entries.len());
        debug_assert_eq!(self.set_bytes, self.ways * std::mem::size_of::<Entry>());
        // SAFETY: `entries` holds `(set_mask + 1) * ways` entries (`new`)
        // and every caller passes `set <= set_mask` (`place` masks it), so
        // the set's `ways` entries, `set * set_bytes` bytes on, are in
        // it; the checked `get` cost the hit path five instructions and
        // two branches, and the multiply by `ways` then by the entry's
        // size one more than the one by `set_bytes`.
        unsafe {
            let first = self.entries.as_ptr().byte_add(set * self.set_bytes);
            std::slice::from_raw_parts(first, self.ways)
        }
    }

    /// Fingerprint word `i` (below `FP_WORDS`) of set `set` (at most
    /// `set_mask`).
    #[inline(always)]
    fn fp_word(&self, set: usize, i: usize) -> &AtomicU64 {
        &self.fp_pair(set).0[i]
    }

    /// Set `set`'s fingerprint words (`set` at most `set_mask`).
    #[inline(always)]
    fn fp_pair(&self, set: usize) -> &FpPair {
        debug_assert!(set < self.fps.len());
        // SAFETY: `fps` holds `set_mask + 1` pairs (`new`) and
        // `set <= set_mask`.
        unsafe { self.fps.get_unchecked(set) }
    }

    /// Set `set`'s sixteen fingerprint bytes, for a probe: one 16-byte
    /// load of the pair (two relaxed loads and three instructions to
    /// join them, in the language's own atomics).
    #[cfg(all(not(loom), target_arch = "x86_64", target_feature = "sse2"))]
    #[inline(always)]
    fn fp_bytes(&self, set: usize) -> std::arch::x86_64::__m128i {
        let pair: *const FpPair = self.fp_pair(set);
        let bytes;
        // SAFETY: `pair` points at 16 readable bytes, 16-aligned
        // (`FpPair`), which live as long as `self`. The words are atomics
        // others write concurrently, which only an `asm!` load may read
        // this way; it acts as relaxed loads of them: x86-64 reads every
        // byte whole, so each byte read is one some fill wrote there (or
        // 0), and a byte older than another costs, as any stale byte, a
        // miss or a wasted validation, never a wrong hit (see `fps`); a
        // byte past the set's ways is always 0, which `way_marked`'s
        // unchecked index relies on. `readonly` without `pure`: the load
        // is not hoisted out of a loop of probes. SSE2: the `cfg` above.
        unsafe {
            std::arch::asm!(
                "movdqa {bytes}, xmmword ptr [{pair}]",
                pair = in(reg) pair,
                bytes = out(xmm_reg) bytes,
                options(nostack, readonly, preserves_flags),
            );
        }
        bytes
    }

    /// Records that way `w` of set `set` now holds a tag of fingerprint
    /// `fp` (a fill, under the way's lock, before its `psi` re-check).
    fn set_fp(&self, set: usize, w: usize, fp: u64) {
        let word = self.fp_word(set, w / FP_WAYS);
        let shift = (w % FP_WAYS) * 8;
        // AcqRel: a page scan reads the word with a read-modify-write and
        // skips the ways whose byte does not match (see `claimed_matches`).
        let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
            Some(x & !(0xff << shift) | (fp & 0xff) << shift)
        });
    }

    /// The generation an entry of `did` must carry to be valid now.
    #[inline(always)]
    pub(crate) fn gen(&self, did: u16) -> u64 {
        // Acquire, both: pair with the Release bumps in `invalidate_*`, so
        // a translation that sees a bump walks tables as they were after
        // the change the bump invalidated.
        self.global
            .load(Ordering::Acquire)
            .wrapping_add(self.domain(did).gen.load(Ordering::Acquire))
    }

    /// Domain `did`'s counters, which live (at a fixed address) as long as
    /// the IOTLB: a translator keeps those of the domain it served last.
    #[inline(always)]
    pub(crate) fn domain_of(&self, did: u16) -> &DomainGen {
        self.domain(did)
    }

    /// The deadline word and then the generation entries must carry of
    /// the domain whose counters `d` are (from
    /// [`domain_of`](Self::domain_of)), as [`deadline`](Self::deadline)
    /// and [`gen`](Self::gen) read them (same loads, same order), and the
    /// domain's own counter that went into it (for
    /// [`domain_gen_at`](Self::domain_gen_at) to compare): the hit path's
    /// reads.
    #[inline(always)]
    pub(crate) fn deadline_then_gen_at(&self, d: &DomainGen) -> (u64, u64, u64) {
        // Acquire: as in `deadline`.
        let dl = d.deadline.load(Ordering::Acquire);
        // Acquire, both: as in `gen`.
        let global = self.global.load(Ordering::Acquire);
        let own = d.gen.load(Ordering::Acquire);
        (dl, global.wrapping_add(own), own)
    }

    /// The domain's own generation counter of `d` (Acquire, as in `gen`):
    /// read again by a translator's slow path, to check that no binding of
    /// the domain id came and went since it read the generation, and by a
    /// translator keeping a context, for its binding part (see
    /// `Translator::hit`).
    #[inline(always)]
    pub(crate) fn domain_gen_at(&self, d: &DomainGen) -> u64 {
        d.gen.load(Ordering::Acquire)
    }

    /// The ticket a fill needs: read before the walk.
    #[inline]
    pub(crate) fn ticket(&self, did: u16, gen: u64) -> Ticket {
        Ticket {
            gen,
            // Acquire: as in `gen`, for page-selective invalidations.
            psi: self.domain(did).psi.load(Ordering::Acquire),
        }
    }

    /// The cached leaf holding `iova` in `did`, if there is a valid one
    /// (the tests' and models' call; the hit path calls its two halves).
    #[cfg(any(test, loom))]
    #[inline(always)]
    pub(crate) fn lookup(&self, did: u16, iova: u64, gen: u64) -> Option<Leaf> {
        if let Some(val) = self.lookup_4k(did, iova, gen) {
            return Some(leaf_of(val, PageSize::Size4K));
        }
        self.lookup_large(did, iova, gen)
    }

    /// [`lookup`](Self::lookup)'s first probe: the value word of a valid
    /// 4 KiB entry for `iova` in `did` (decode it with [`val_phys`] and
    /// [`val_perm`]).
    #[cfg(any(test, loom))]
    #[inline(always)]
    pub(crate) fn lookup_4k(&self, did: u16, iova: u64, gen: u64) -> Option<u64> {
        self.probe(make_key(did, iova, PageSize::Size4K), gen)
    }

    /// [`lookup_4k`](Self::lookup_4k) with the domain's part of the tag
    /// precomputed (`key_4k_base(did)`), for an `iova` below 2^48: the hit
    /// path's probe, inline. Raw, so that the hit path checks the rights
    /// and computes the span from the word in registers, with constants.
    #[inline(always)]
    pub(crate) fn lookup_4k_keyed(&self, base: u64, iova: u64, gen: u64) -> Option<u64> {
        debug_assert_eq!(iova >> VTD_IOVA_BITS, 0);
        debug_assert_eq!(base & ((1 << KEY_VPN_BITS) - 1), 0);
        // Below 2^48, the page number fits the tag's VPN bits as it is.
        self.probe(base | iova >> PAGE_SHIFT, gen)
    }

    /// [`lookup`](Self::lookup)'s later probes, out of line: the 2 MiB and
    /// 1 GiB sets, if the unit ever cached such a leaf.
    #[inline(never)]
    pub(crate) fn lookup_large(&self, did: u16, iova: u64, gen: u64) -> Option<Leaf> {
        // Relaxed: a hint only; missing a large entry costs a walk.
        let large = self.large.load(Ordering::Relaxed);
        if large & 1 != 0 {
            if let Some(val) = self.probe(make_key(did, iova, PageSize::Size2M), gen) {
                return Some(leaf_of(val, PageSize::Size2M));
            }
        }
        if large & 2 != 0 {
            let val = self.probe(make_key(did, iova, PageSize::Size1G), gen)?;
            return Some(leaf_of(val, PageSize::Size1G));
        }
        None
    }

    /// The value word of a valid entry tagged `key`.
    #[inline(always)]
    fn probe(&self, key: u64, gen: u64) -> Option<u64> {
        let (set, fp) = self.place(key);
        let ways = self.ways_of(set);
        // Under loom every way is a candidate: the fingerprints can only
        // skip ways (a miss, always safe), and without them the models
        // explore the validation below exactly as a reader that found the
        // way by scanning would run it.
        #[cfg(loom)]
        {
            let _ = fp;
            ways.iter().find_map(|e| Self::validate(e, key, gen))
        }
        // Which ways hold `key`: the set's two fingerprint words, one
        // 16-byte load and one byte compare for up to 16 ways, instead of
        // a load and compare per way's key (which spread over the set's
        // lines); a hint only, each matching way is validated below.
        #[cfg(all(not(loom), target_arch = "x86_64", target_feature = "sse2"))]
        {
            let m = fp_matches_x86(self.fp_bytes(set), fp);
            Self::validate_matches(ways, m, key, gen)
        }
        #[cfg(all(not(loom), not(all(target_arch = "x86_64", target_feature = "sse2"))))]
        {
            let m = fp_matches(
                self.fp_word(set, 0).load(Ordering::Relaxed),
                self.fp_word(set, 1).load(Ordering::Relaxed),
                fp,
            );
            Self::validate_matches(ways, m, key, gen)
        }
    }

    /// Validates the ways `w` for each bit `w` set in `matches` (from
    /// [`fp_matches`]); the value word of the first that holds `key`.
    #[cfg(not(loom))]
    #[inline(always)]
    fn validate_matches(ways: &[Entry], mut matches: u32, key: u64, gen: u64) -> Option<u64> {
        // The first candidate peeled off, in a straight line (a hit's
        // usual case); the others, after a false fingerprint match, in the
        // loop.
        if matches == 0 {
            return None;
        }
        let first = Self::validate(Self::way_marked(ways, matches), key, gen);
        if first.is_some() {
            return first;
        }
        matches &= matches - 1;
        while matches != 0 {
            if let Some(v) = Self::validate(Self::way_marked(ways, matches), key, gen) {
                return Some(v);
            }
            matches &= matches - 1;
        }
        None
    }

    /// The way of `ways` the lowest bit of `matches` (nonzero, from
    /// [`fp_matches`]) marks.
    #[cfg(not(loom))]
    #[inline(always)]
    fn way_marked(ways: &[Entry], matches: u32) -> &Entry {
        let w = matches.trailing_zeros() as usize;
        debug_assert!(w < ways.len());
        // SAFETY: a byte past the set's ways is never written (`fill`
        // sets only the byte of the way it filled); it stays 0, which
        // no fingerprint equals (bit 7 is set in every one), so
        // `fp_matches` never marks it and `w < ways.len()`.
        unsafe { ways.get_unchecked(w) }
    }

    /// The sequence-lock read of one way: its value word if it holds `key`
    /// under generation `gen`, stably.
    #[inline(always)]
    fn validate(e: &Entry, key: u64, gen: u64) -> Option<u64> {
        // Acquire: pairs with the Release store that published the
        // entry, so the fields below are at least that writer's.
        let s1 = e.seq.load(Ordering::Acquire);
        if s1 & (SEQ_LOCKED | SEQ_KILL) != 0 || e.key.load(Ordering::Relaxed) != key {
            return None;
        }
        let val = e.val.load(Ordering::Relaxed);
        let g = e.gen.load(Ordering::Relaxed);
        // Acquire fence: pairs with a later writer's Release fence, so
        // if a field load above saw that writer, the re-load sees its
        // locked `seq` (or later) and the entry is skipped.
        fence(Ordering::Acquire);
        if e.seq.load(Ordering::Relaxed) != s1 || g != gen {
            return None;
        }
        Some(val)
    }

    /// Caches `leaf`, which a walk of `did` found for `iova` after taking
    /// `ticket`. `rnd` picks where the search for a dead way starts, and
    /// the way replaced if it finds none (see `victim`).
    pub(crate) fn fill(
        &self,
        did: u16,
        iova: u64,
        leaf: Leaf,
        ticket: Ticket,
        rnd: u64,
    ) -> FillOutcome {
        let key = make_key(did, iova, leaf.size);
        let (set, fp) = self.place(key);
        let ways = self.ways_of(set);
        let Some((w, e)) = self.victim(set, ways, key, fp, rnd) else {
            return FillOutcome::Busy;
        };
        let Some(s) = Self::try_lock(e) else {
            return FillOutcome::Busy;
        };
        // Under the way's lock, so the last fill of a way leaves its byte.
        self.set_fp(set, w, fp);
        e.key.store(key, Ordering::Relaxed);
        e.val.store(
            leaf.phys & VAL_ADDR_MASK | perm_bits(leaf.perm),
            Ordering::Relaxed,
        );
        e.gen.store(ticket.gen, Ordering::Relaxed);
        if leaf.size != PageSize::Size4K {
            let bit = if leaf.size == PageSize::Size2M { 1 } else { 2 };
            // Always the read-modify-write, AcqRel: a page-selective
            // invalidation skips the large sets when it finds no bit (see
            // `invalidate_pages`), so this fill must either be seen there
            // or see that invalidation's `psi` bump below.
            self.large.fetch_or(bit, Ordering::AcqRel);
        }
        // Relaxed: if a page invalidation finished with this entry before
        // our lock, our Acquire lock synchronized with its unlock, so its
        // `psi` bump is visible here; if it comes later, it kills us below.
        let moved = self.domain(did).psi.load(Ordering::Relaxed) != ticket.psi;
        if moved {
            e.key.store(0, Ordering::Relaxed);
        }
        let unlocked = s + SEQ_STEP;
        // Release: publishes the entry (pairs with `probe`'s first load and
        // with the next writer's Acquire lock). Fails only if a page
        // invalidation set the kill bit meanwhile.
        match e.seq.compare_exchange(
            s | SEQ_LOCKED,
            unlocked,
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) if !moved => FillOutcome::Filled,
            Ok(_) => FillOutcome::Withdrawn,
            Err(_) => {
                e.key.store(0, Ordering::Relaxed);
                e.seq.store(unlocked, Ordering::Release);
                FillOutcome::Withdrawn
            }
        }
    }

    /// Takes `e`'s sequence lock with one read-modify-write; returns the
    /// stable value it held, or `None` if another writer holds it (the RMW
    /// then changed nothing).
    ///
    /// Acquire: if what we read is the last holder's unlock (Release), we
    /// see everything it did; every later value of `seq` comes from a
    /// writer that locked after it, so this holds through any chain of
    /// writers.
    #[inline]
    fn try_lock(e: &Entry) -> Option<u64> {
        let s = e.seq.fetch_or(SEQ_LOCKED, Ordering::Acquire);
        if s & SEQ_LOCKED != 0 {
            return None;
        }
        // Release fence: our locked value is ordered before the field
        // stores that follow; pairs with the readers' Acquire fence.
        fence(Ordering::Release);
        Some(s)
    }

    /// The way to overwrite, and its index: one holding the same tag,
    /// else one never filled, else an invalid or stale one among up to
    /// `DEAD_PROBES` from a pseudo-random way on, else that way (so a
    /// live way may go while a dead one sits outside those). The
    /// fingerprints find the first two without reading other ways' lines
    /// (a same tag's way carries its byte; a way never filled, 0); the probe
    /// for a dead way is bounded so that a fill into a full set of 16 ways
    /// reads the keys of 8 ways (a quarter of a KiB), as one of 8 ways did
    /// when it read them all.
    fn victim<'a>(
        &self,
        set: usize,
        ways: &'a [Entry],
        key: u64,
        fp: u64,
        rnd: u64,
    ) -> Option<(usize, &'a Entry)> {
        // Relaxed, all: heuristics; the fill's lock settles any race.
        let (lo, hi) = self.fp_words(set, |w| w.load(Ordering::Relaxed));
        let mut same = fp_matches_any(lo, hi, fp);
        while same != 0 {
            let w = same.trailing_zeros() as usize;
            same &= same - 1;
            if let Some(e) = ways.get(w) {
                if e.key.load(Ordering::Relaxed) == key {
                    return Some((w, e));
                }
            }
        }
        let n = ways.len();
        // Bytes past the set's ways are 0 too: masked off.
        let never = fp_matches_any(lo, hi, 0) & ((1u32 << n) - 1);
        if never != 0 {
            let w = never.trailing_zeros() as usize;
            return ways.get(w).map(|e| (w, e));
        }
        let start = (rnd % n.max(1) as u64) as usize;
        for i in 0..n.min(DEAD_PROBES) {
            let w = if start + i >= n {
                start + i - n
            } else {
                start + i
            };
            let Some(e) = ways.get(w) else { break };
            let dead = match split_key(e.key.load(Ordering::Relaxed)) {
                None => true,
                Some((d, _, _)) => e.gen.load(Ordering::Relaxed) != self.gen(d),
            };
            if dead {
                return Some((w, e));
            }
        }
        ways.get(start).map(|e| (start, e))
    }

    /// The clock the domains' deadlines are read in.
    #[inline(always)]
    pub(crate) fn clock(&self) -> DeadlineClock {
        self.clock
    }

    /// Domain `did`'s deadline word: 0 if none is armed, else the reading
    /// of [`clock`](Self::clock) it falls due at, possibly with
    /// [`DEADLINE_CLEARING`] set. One load on the line the hit path reads
    /// for the generation.
    ///
    /// Acquire: a translator that reads a deadline another one moved on
    /// after expiring it (a Release compare-exchange, after its generation
    /// bump) sees that bump.
    #[inline(always)]
    pub(crate) fn deadline(&self, did: u16) -> u64 {
        self.domain(did).deadline.load(Ordering::Acquire)
    }

    /// Whether a deadline word read at clock reading `now` has fallen due.
    #[inline(always)]
    pub(crate) fn due(word: u64, now: u64) -> bool {
        word != 0 && now >= word & !DEADLINE_CLEARING
    }

    /// Arms domain `did`'s deadline at clock reading `at` (nonzero, below
    /// [`DEADLINE_CLEARING`]), or keeps the one armed if it is no later:
    /// an armed deadline only ever moves earlier here. Also cancels a
    /// clearing in progress (see [`begin_clear`](Self::begin_clear)).
    pub(crate) fn arm_deadline_at(&self, did: u16, at: u64, period: u64) {
        let d = self.domain(did);
        let at = at.clamp(1, DEADLINE_CLEARING - 1);
        d.period.store(period, Ordering::Relaxed);
        let mut cur = d.deadline.load(Ordering::Relaxed);
        loop {
            let next = match cur {
                0 => at,
                c => (c & !DEADLINE_CLEARING).min(at),
            };
            if next == cur {
                return;
            }
            // Release: pairs with the hit path's Acquire load.
            match d
                .deadline
                .compare_exchange(cur, next, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(c) => cur = c,
            }
        }
    }

    /// The unmap's side, after its entry is queued and its `Barrier::light`
    /// fence: makes sure a deadline no later than `now() + period` covers
    /// it. One load when a deadline is armed (any armed deadline is no
    /// later: it was armed at an earlier reading, or moved on by a
    /// translator to its reading, plus the same period); a clock read and
    /// a compare-exchange only when none is, or when a clearing is in
    /// progress (which this cancels, keeping the deadline).
    #[inline(always)]
    pub(crate) fn cover_unmap(&self, did: u16, period: impl FnOnce() -> std::time::Duration) {
        self.cover_unmap_with(did, || {
            let p = self.clock.ticks(period());
            (self.clock.now().saturating_add(p), p)
        });
    }

    /// [`cover_unmap`](Self::cover_unmap), with `arm` giving the deadline
    /// and period to arm when one is needed (the models' clock).
    /// The check is inlined into the unmap (a load, a test and a branch);
    /// arming is out of line: kept in, its registers made every unmap
    /// save and restore a frame (about 20 instructions a call).
    #[inline(always)]
    pub(crate) fn cover_unmap_with(&self, did: u16, arm: impl FnOnce() -> (u64, u64)) {
        let w = self.domain(did).deadline.load(Ordering::Relaxed);
        if Self::covers(w) {
            return;
        }
        self.cover_unmap_arm(did, arm);
    }

    /// Whether deadline word `w`, loaded by an unmap after it queued its
    /// entry, covers it: armed and not being cleared (otherwise the unmap
    /// arms one, see [`cover_unmap`](Self::cover_unmap)).
    #[inline(always)]
    pub(crate) fn covers(w: u64) -> bool {
        w != 0 && w & DEADLINE_CLEARING == 0
    }

    /// Domain `did`'s deadline word itself, for a caller that keeps its
    /// address and loads it as [`cover_unmap`](Self::cover_unmap) does
    /// (a CPU's cover cache). It lives as long as this IOTLB.
    pub(crate) fn deadline_word(&self, did: u16) -> &AtomicU64 {
        &self.domain(did).deadline
    }

    /// [`cover_unmap_with`](Self::cover_unmap_with) when no deadline is
    /// armed, or a clearing is in progress: arms one.
    #[cold]
    #[inline(never)]
    fn cover_unmap_arm(&self, did: u16, arm: impl FnOnce() -> (u64, u64)) {
        let (at, period) = arm();
        self.arm_deadline_at(did, at, period);
    }

    /// The clearer's first step (the flush timer, having found nothing
    /// queued): marks the armed deadline as being cleared, leaving it in
    /// force; returns the word marked. The caller then issues the heavy
    /// barrier, looks at the queues again and calls
    /// [`finish_clear`](Self::finish_clear). An unmap that meets the mark
    /// removes it, which makes the clearing fail. So a clearer taken off
    /// its CPU between the steps leaves the deadline armed, never an unmap
    /// uncovered.
    pub(crate) fn begin_clear(&self, did: u16) -> Option<u64> {
        let d = self.domain(did);
        let w = d.deadline.load(Ordering::Relaxed);
        if w == 0 {
            return None;
        }
        let marked = w | DEADLINE_CLEARING;
        if w == marked {
            return Some(marked);
        }
        d.deadline
            .compare_exchange(w, marked, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| marked)
    }

    /// The clearer's last step: if the word is still `marked`, clears it
    /// (`idle`: nothing was queued after the barrier) or removes the mark.
    /// Returns whether it cleared.
    pub(crate) fn finish_clear(&self, did: u16, marked: u64, idle: bool) -> bool {
        let next = if idle { 0 } else { marked & !DEADLINE_CLEARING };
        self.domain(did)
            .deadline
            .compare_exchange(marked, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && idle
    }

    /// Sets domain `did`'s deadline to `at` (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn force_deadline(&self, did: u16, at: u64) {
        self.domain(did).deadline.store(at, Ordering::Relaxed);
    }

    /// The translator's side, once it read deadline word `seen` and found
    /// it due at clock reading `now`: issues the heavy barrier, invalidates
    /// the domain (a generation bump), then moves the deadline on to
    /// `now + period` if it still holds `seen`. The caller's lookup misses
    /// (it walks after the bump), and so does every later one.
    ///
    /// Every translator that finds the deadline due bumps for itself,
    /// before it uses the cache: one that lost the race to move it on would
    /// otherwise hit entries the winner has not dropped yet. The order
    /// (barrier, bump, move) is what makes the move safe: an unmap that
    /// read the old word before the barrier has its cleared entries
    /// visible to every walk after the bump; one that read it after the
    /// barrier is covered by the new word, a period after a reading no
    /// earlier than its own; and a translator that reads the new word
    /// (Acquire) sees the bump. Loom: `loom_a_deadline_armed_by_an_unmap_stops_a_racing_hit`.
    #[cold]
    #[inline(never)]
    pub(crate) fn expire(&self, did: u16, seen: u64, now: u64, barrier: Barrier) {
        let dg = self.domain(did);
        barrier.heavy();
        self.invalidate_domain(did);
        let next = match dg.period.load(Ordering::Relaxed) {
            0 => 0,
            p => now.saturating_add(p).min(DEADLINE_CLEARING - 1),
        };
        // Release: a translator that reads `next` sees the bump above.
        let _ = dg
            .deadline
            .compare_exchange(seen, next, Ordering::Release, Ordering::Relaxed);
    }

    /// Global invalidation: every entry of every domain becomes stale.
    pub(crate) fn invalidate_global(&self) {
        // Release: pairs with the Acquire load in `gen`.
        self.global.fetch_add(1, Ordering::Release);
    }

    /// A new binding of domain id `did` (no device used it; one will):
    /// every entry of its earlier life becomes stale, as with
    /// [`invalidate_domain`](Self::invalidate_domain), and the counter's
    /// binding part ([`binding_of`]) moves on, which a translator that kept
    /// a context of the id's earlier binding sees on its next hit.
    pub(crate) fn rebind_domain(&self, did: u16) {
        // Release: pairs with the Acquire load in `gen`.
        self.domain(did)
            .gen
            .fetch_add(BINDING_STEP, Ordering::Release);
    }

    /// Domain-selective invalidation.
    pub(crate) fn invalidate_domain(&self, did: u16) {
        // Release: pairs with the Acquire load in `gen`.
        self.domain(did).gen.fetch_add(1, Ordering::Release);
    }

    /// Page-selective invalidation of the 2^`am` pages at `addr` (aligned
    /// down to their size) in `did`; returns the entries cleared.
    pub(crate) fn invalidate_pages(&self, did: u16, addr: u64, am: u32) -> u64 {
        let _one_scan = lock(&self.scans);
        // Release: pairs with the Acquire load in `ticket`, and reaches a
        // fill that locks an entry after we unlock it (see `clear_if`).
        self.domain(did).psi.fetch_add(1, Ordering::Release);
        let top = 1u64 << VTD_IOVA_BITS;
        let span_shift = (PAGE_SHIFT + am).min(VTD_IOVA_BITS);
        let start = (addr & (top - 1)) >> span_shift << span_shift;
        let end = start + (1u64 << span_shift);
        // Which sizes to probe: 4 KiB always, a large size only once a
        // leaf of it was cached (a domain mapped with 4 KiB pages pays one
        // set's fingerprint reads and a lock per matching way a page, not
        // three times that). An AcqRel
        // read-modify-write, after the Release `psi` bump above: if a
        // fill's `fetch_or` of a bit comes before it in `large`'s
        // modification order, we read the bit and probe that size; if
        // after, the fill reads our value (or a later one of the release
        // sequence it heads), synchronizes with us, and its `psi` re-check
        // sees our bump: it withdraws. Loom:
        // `loom_a_large_fill_racing_a_page_invalidation_is_caught`.
        let large = self.large.fetch_or(0, Ordering::AcqRel);
        let probed = |size: PageSize| match size {
            PageSize::Size4K => true,
            PageSize::Size2M => large & 1 != 0,
            PageSize::Size1G => large & 2 != 0,
        };
        let mut probes = 0u64;
        for size in PageSize::ALL.into_iter().filter(|&s| probed(s)) {
            let first = start >> size.shift();
            let last = (end - 1) >> size.shift();
            probes += last - first + 1;
        }
        let mut cleared = 0;
        if probes > self.set_mask as u64 + 1 {
            for e in self.entries.iter() {
                let hit = |k: u64| {
                    split_key(k).is_some_and(|(d, base, size)| {
                        d == did && base < end && base + size.bytes() > start
                    })
                };
                cleared += u64::from(Self::clear_if(e, hit));
            }
            return cleared;
        }
        for size in PageSize::ALL.into_iter().filter(|&s| probed(s)) {
            let mut base = start >> size.shift() << size.shift();
            while base < end {
                let key = make_key(did, base, size);
                let (set, fp) = self.place(key);
                let ways = self.ways_of(set);
                let mut m = self.claimed_matches(set, fp);
                while m != 0 {
                    let w = m.trailing_zeros() as usize;
                    m &= m - 1;
                    // A byte past the set's ways stays 0 and never matches.
                    if let Some(e) = ways.get(w) {
                        cleared += u64::from(Self::clear_if(e, |k| k == key));
                    }
                }
                base += size.bytes();
            }
        }
        cleared
    }

    /// A page scan's candidates in set `set` for a tag of fingerprint
    /// `fp`: the ways whose byte matches, each fingerprint word the set
    /// uses read with an AcqRel read-modify-write (after the scan's `psi`
    /// bump). Every way that may hold the tag, or a fill of it in flight,
    /// is among them: a fill writes its way's byte with an AcqRel
    /// read-modify-write too, under the way's lock, before its `psi`
    /// re-check. If the fill's write comes first in the word's
    /// modification order, the scan reads the byte (or, if a later fill of
    /// that way overwrote it, that later fill overwrites or withdraws the
    /// tag under the same lock); if the scan's read comes first, the fill's
    /// write reads it, synchronizes with it, and the fill's `psi` re-check
    /// sees the bump: it withdraws. So a scan locks the few ways whose
    /// byte matches rather than every way. (On x86-64 LLVM compiles the
    /// read, an idempotent read-modify-write, to a full fence and a load;
    /// the fill's side is a locked compare-exchange: ordered the same.)
    /// Loom: `loom_a_page_scan_skips_only_ways_that_cannot_hold_the_page`
    /// fails with a plain load here or a relaxed read-modify-write in
    /// `set_fp`.
    fn claimed_matches(&self, set: usize, fp: u64) -> u32 {
        let (lo, hi) = self.fp_words(set, |w| w.fetch_or(0, Ordering::AcqRel));
        fp_matches_any(lo, hi, fp)
    }

    /// Set `set`'s two fingerprint words, each read by `read`; the second
    /// only if the set has more than `FP_WAYS` ways (else it is 0).
    #[inline(always)]
    fn fp_words(&self, set: usize, read: impl Fn(&AtomicU64) -> u64) -> (u64, u64) {
        let lo = read(self.fp_word(set, 0));
        let hi = if self.ways > FP_WAYS {
            read(self.fp_word(set, 1))
        } else {
            0
        };
        (lo, hi)
    }

    /// Clears `e` if its tag satisfies `hit`; kills a fill in progress
    /// instead (it withdraws when it unlocks): the caller holds `scans`,
    /// so any other holder of the entry is a fill. Never waits.
    fn clear_if(e: &Entry, hit: impl Fn(u64) -> bool) -> bool {
        // One RMW: on a free entry it takes the lock (the kill bit it also
        // sets is ours and goes with our unlock); on a held one it sets
        // the holder's kill bit. Acquire: we see the tag of the last fill
        // that unlocked it.
        let s = e.seq.fetch_or(SEQ_LOCKED | SEQ_KILL, Ordering::Acquire);
        if s & SEQ_LOCKED != 0 {
            return false;
        }
        fence(Ordering::Release);
        let cleared = hit(e.key.load(Ordering::Relaxed));
        if cleared {
            e.key.store(0, Ordering::Relaxed);
        }
        // Release: publishes the clear, and our `psi` bump to the next
        // writer that locks this entry.
        e.seq.store(s + SEQ_STEP, Ordering::Release);
        cleared
    }

    /// Entries valid now (a quiescent count, for tests and statistics).
    pub(crate) fn occupancy(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| {
                let k = e.key.load(Ordering::Acquire);
                split_key(k).is_some_and(|(d, _, _)| e.gen.load(Ordering::Acquire) == self.gen(d))
            })
            .count()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const K4: u64 = 1 << 12;
    const M2: u64 = 1 << 21;

    fn leaf(phys: u64, size: PageSize, perm: Perm) -> Leaf {
        Leaf { phys, size, perm }
    }

    fn fill(t: &Iotlb, did: u16, iova: u64, l: Leaf) -> FillOutcome {
        let gen = t.gen(did);
        let ticket = t.ticket(did, gen);
        t.fill(did, iova, l, ticket, iova >> 12)
    }

    #[test]
    fn tags_round_trip() {
        let k = make_key(7, 0x1234_5000, PageSize::Size4K);
        assert_eq!(split_key(k), Some((7, 0x1234_5000, PageSize::Size4K)));
        let k = make_key(0xffff, (1 << 48) - 1, PageSize::Size1G);
        assert_eq!(
            split_key(k),
            Some((0xffff, (1 << 48) - (1 << 30), PageSize::Size1G))
        );
        assert_eq!(split_key(0), None);
    }

    #[test]
    fn every_way_of_a_full_set_hits_in_every_shape() {
        // One set, so every page lands in it: the probe must find each way
        // through its fingerprint byte, in the first fingerprint word and
        // (past 8 ways) the second, whatever the shape.
        for ways in 1..=16 {
            let t = Iotlb::new(IotlbConfig { sets: 1, ways }, 4);
            for p in 0..ways as u64 {
                let l = leaf(0x10_0000 + p * K4, PageSize::Size4K, Perm::RW);
                assert_eq!(fill(&t, 1, p * K4, l), FillOutcome::Filled, "{ways}");
            }
            assert_eq!(t.occupancy(), ways, "no fill evicted another");
            let g = t.gen(1);
            for p in 0..ways as u64 {
                assert_eq!(
                    t.lookup(1, p * K4 + 0x40, g).map(|l| l.phys),
                    Some(0x10_0000 + p * K4),
                    "way of page {p} in a {ways}-way set"
                );
            }
        }
    }

    #[test]
    fn a_page_scan_of_a_sixteen_way_set_clears_its_page_and_only_it() {
        // Sixteen pages in one set of sixteen ways (ways 8 to 15 in the
        // second fingerprint word), among them pages sharing a
        // fingerprint byte: each page's scan clears it, and no other.
        let t = Iotlb::new(IotlbConfig { sets: 1, ways: 16 }, 4);
        let fp_of = |iova: u64| t.place(make_key(1, iova, PageSize::Size4K)).1;
        let mut pages: Vec<u64> = (0..1u64 << 20)
            .map(|p| p * K4)
            .filter(|&iova| fp_of(iova) == fp_of(0))
            .take(3)
            .collect();
        pages.extend(
            (1..1000)
                .map(|p| p * K4)
                .filter(|&iova| fp_of(iova) != fp_of(0))
                .take(13),
        );
        assert_eq!(pages.len(), 16);
        for (i, &iova) in pages.iter().enumerate() {
            let l = leaf(0x100_0000 + i as u64 * K4, PageSize::Size4K, Perm::RW);
            assert_eq!(fill(&t, 1, iova, l), FillOutcome::Filled, "page {i}");
        }
        assert_eq!(t.occupancy(), 16, "every way filled, none replaced");
        let phys = |iova: u64| t.lookup(1, iova, t.gen(1)).map(|l| l.phys);
        for (i, &iova) in pages.iter().enumerate().rev() {
            assert_eq!(t.invalidate_pages(1, iova, 0), 1, "page {i}: its entry");
            assert_eq!(phys(iova), None, "page {i} after its scan");
            for (j, &other) in pages.iter().enumerate().take(i) {
                assert_eq!(
                    phys(other),
                    Some(0x100_0000 + j as u64 * K4),
                    "page {j} after {i}'s scan"
                );
            }
        }
        // A refill of a page takes its old way (the same tag's, found by
        // its byte) rather than another.
        let t = Iotlb::new(IotlbConfig { sets: 1, ways: 16 }, 4);
        for (i, &iova) in pages.iter().enumerate() {
            let l = leaf(0x100_0000 + i as u64 * K4, PageSize::Size4K, Perm::RW);
            assert_eq!(fill(&t, 1, iova, l), FillOutcome::Filled, "page {i}");
        }
        assert_eq!(
            fill(&t, 1, pages[2], leaf(0xa000, PageSize::Size4K, Perm::READ)),
            FillOutcome::Filled
        );
        assert_eq!(t.occupancy(), 16);
        assert_eq!(
            t.lookup(1, pages[2], t.gen(1)).map(|l| l.phys),
            Some(0xa000)
        );
        for (j, &other) in pages.iter().enumerate().filter(|&(j, _)| j != 2) {
            assert_eq!(
                t.lookup(1, other, t.gen(1)).map(|l| l.phys),
                Some(0x100_0000 + j as u64 * K4),
                "page {j} kept"
            );
        }
    }

    #[test]
    fn keys_sharing_a_fingerprint_in_a_set_are_told_apart() {
        // Pages whose tags carry the same fingerprint byte, all in one set:
        // the byte only nominates ways, the full tag decides. A probe that
        // trusted the byte would serve one page's frame for another.
        let t = Iotlb::new(IotlbConfig { sets: 1, ways: 8 }, 4);
        let fp_of = |iova: u64| t.place(make_key(1, iova, PageSize::Size4K)).1;
        let want = fp_of(0);
        let pages: Vec<u64> = (0..1u64 << 20)
            .map(|p| p * K4)
            .filter(|&iova| fp_of(iova) == want)
            .take(4)
            .collect();
        assert_eq!(
            pages.len(),
            4,
            "a 7-bit fingerprint repeats within 2^20 pages"
        );
        for (i, &iova) in pages.iter().enumerate() {
            let l = leaf(0x100_0000 + i as u64 * K4, PageSize::Size4K, Perm::RW);
            assert_eq!(fill(&t, 1, iova, l), FillOutcome::Filled);
        }
        let g = t.gen(1);
        for (i, &iova) in pages.iter().enumerate() {
            assert_eq!(
                t.lookup(1, iova + 8, g).map(|l| l.phys),
                Some(0x100_0000 + i as u64 * K4),
                "page {i} of a shared fingerprint"
            );
        }
        // A way refilled with another tag: the old tag misses.
        let t = Iotlb::new(IotlbConfig { sets: 1, ways: 1 }, 4);
        fill(&t, 1, pages[0], leaf(0xa000, PageSize::Size4K, Perm::RW));
        fill(&t, 1, pages[1], leaf(0xb000, PageSize::Size4K, Perm::RW));
        assert_eq!(t.lookup(1, pages[0], t.gen(1)), None);
        assert_eq!(
            t.lookup(1, pages[1], t.gen(1)).map(|l| l.phys),
            Some(0xb000)
        );
    }

    #[test]
    fn fingerprint_bytes_match_exactly() {
        // Every byte equal to the fingerprint, and no other, whatever its
        // neighbours hold (a borrow from a matching byte must not mark the
        // byte above it).
        let fp = 0x93;
        // 0x92 right above a matching 0x93: the borrow of the usual
        // `(x - 0x01..) & !x & 0x80..` test would mark it.
        let word = 0x93_94_00_93_13_92_93_01u64;
        // Both forms (the one in use on this target, over both words, and
        // the portable one of one word), on the same words.
        let lo = |w, f| fp_matches(w, 0, f);
        let hi = |w, f| fp_matches(0, w, f) >> 8;
        assert_eq!(fp_matches(word, word, fp), 0b1001_0010_1001_0010);
        for m in [&lo as &dyn Fn(u64, u64) -> u32, &hi, &fp_matches_swar] {
            assert_eq!(m(word, fp), 0b1001_0010);
            assert_eq!(m(0, fp), 0);
            assert_eq!(m(u64::MAX, 0xff), 0xff);
            // Each byte alone at every position, and a neighbour one off
            // right above a match, against every fingerprint.
            for b in 0..8 {
                for f in 0x80..=0xffu64 {
                    assert_eq!(m(f << (8 * b), f), 1 << b);
                    if b > 0 {
                        assert_eq!(m((f ^ 1) << (8 * b) | f, f), 1);
                    }
                }
            }
        }
        for h in [0u64, 1 << 25, u64::MAX, HASH_MUL] {
            assert!((0x80..=0xff).contains(&fingerprint(h)));
        }
    }

    #[test]
    fn hits_are_tagged_by_domain_and_cover_large_leaves() {
        let t = Iotlb::new(IotlbConfig { sets: 16, ways: 2 }, 4);
        assert_eq!(
            fill(&t, 1, 0x5000, leaf(0x9000, PageSize::Size4K, Perm::READ)),
            FillOutcome::Filled
        );
        let g = t.gen(1);
        assert_eq!(
            t.lookup(1, 0x5abc, g),
            Some(leaf(0x9000, PageSize::Size4K, Perm::READ))
        );
        assert_eq!(t.lookup(2, 0x5abc, t.gen(2)), None, "other domain");
        assert_eq!(t.lookup(1, 0x6000, g), None);
        fill(
            &t,
            1,
            3 * M2 + 5 * K4,
            leaf(8 * M2, PageSize::Size2M, Perm::RW),
        );
        assert_eq!(
            t.lookup(1, 3 * M2 + 77 * K4, g).map(|l| l.phys),
            Some(8 * M2),
            "a 2 MiB entry covers its whole range"
        );
        assert_eq!(t.occupancy(), 2);
    }

    #[test]
    fn domain_and_global_invalidations_are_generations() {
        let t = Iotlb::new(IotlbConfig { sets: 16, ways: 2 }, 4);
        fill(&t, 1, 0x5000, leaf(0x9000, PageSize::Size4K, Perm::RW));
        fill(&t, 2, 0x5000, leaf(0xa000, PageSize::Size4K, Perm::RW));
        t.invalidate_domain(1);
        assert_eq!(t.lookup(1, 0x5000, t.gen(1)), None);
        assert!(t.lookup(2, 0x5000, t.gen(2)).is_some());
        t.invalidate_global();
        assert_eq!(t.lookup(2, 0x5000, t.gen(2)), None);
        assert_eq!(t.occupancy(), 0);
    }

    #[test]
    fn a_fill_with_an_old_ticket_is_dead_or_withdrawn() {
        let t = Iotlb::new(IotlbConfig { sets: 16, ways: 2 }, 4);
        let ticket = t.ticket(1, t.gen(1));
        t.invalidate_domain(1);
        t.fill(
            1,
            0x5000,
            leaf(0x9000, PageSize::Size4K, Perm::RW),
            ticket,
            0,
        );
        assert_eq!(t.lookup(1, 0x5000, t.gen(1)), None, "stale generation");
        let ticket = t.ticket(1, t.gen(1));
        t.invalidate_pages(1, 0x40000, 0);
        assert_eq!(
            t.fill(
                1,
                0x5000,
                leaf(0x9000, PageSize::Size4K, Perm::RW),
                ticket,
                0
            ),
            FillOutcome::Withdrawn
        );
        assert_eq!(t.lookup(1, 0x5000, t.gen(1)), None);
    }

    #[test]
    fn page_selective_invalidation_covers_the_mask_and_large_leaves() {
        let t = Iotlb::new(IotlbConfig { sets: 64, ways: 4 }, 4);
        for p in 0..16u64 {
            fill(
                &t,
                1,
                p * K4,
                leaf(0x100_0000 + p * K4, PageSize::Size4K, Perm::RW),
            );
        }
        fill(&t, 1, M2, leaf(4 * M2, PageSize::Size2M, Perm::RW));
        fill(&t, 2, 4 * K4, leaf(0x9000, PageSize::Size4K, Perm::RW));
        // am = 2: pages 4..8 (the address is aligned down to 16 KiB).
        assert_eq!(t.invalidate_pages(1, 5 * K4, 2), 4);
        let g = t.gen(1);
        for p in 0..16u64 {
            assert_eq!(
                t.lookup(1, p * K4, g).is_some(),
                !(4..8).contains(&p),
                "page {p}"
            );
        }
        assert!(
            t.lookup(2, 4 * K4, t.gen(2)).is_some(),
            "other domain untouched"
        );
        // One 4 KiB page inside the 2 MiB leaf removes the leaf.
        assert_eq!(t.invalidate_pages(1, M2 + 9 * K4, 0), 1);
        assert_eq!(t.lookup(1, M2, g), None);
        // A huge mask scans everything.
        assert_eq!(t.invalidate_pages(1, 0, 40), 12);
        assert_eq!(t.occupancy(), 1);
    }

    #[test]
    fn capacity_is_bounded_and_eviction_stays_in_the_set() {
        let cfg = IotlbConfig { sets: 4, ways: 2 };
        let t = Iotlb::new(cfg, 1);
        for p in 0..1000u64 {
            fill(&t, 0, p * K4, leaf(p * K4, PageSize::Size4K, Perm::RW));
        }
        assert!(t.occupancy() <= cfg.capacity());
        assert!(t.occupancy() >= cfg.capacity() - 1);
        // Whatever is cached is right.
        let g = t.gen(0);
        for p in 0..1000u64 {
            if let Some(l) = t.lookup(0, p * K4, g) {
                assert_eq!(l.phys, p * K4);
            }
        }
        assert!(!IotlbConfig { sets: 3, ways: 2 }.is_valid());
        assert!(!IotlbConfig { sets: 4, ways: 0 }.is_valid());
    }
}
