//! Typed words: `u16`, `u32` and `u64`, little-endian in guest memory, each
//! moved by one atomic access when naturally aligned (so a concurrent guest
//! never sees it torn, and the orderer's acquire/release can be put on the
//! access itself rather than on a fence).

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

/// A word type the accessors load and store: `u16`, `u32` or `u64`.
pub(crate) trait DmaWord: Copy {
    /// Its size in bytes (its natural alignment too).
    const SIZE: usize;

    /// Decodes little-endian bytes (shorter input reads as zero-extended).
    fn from_le_slice(bytes: &[u8]) -> Self;

    /// Encodes to little-endian bytes, in the first `SIZE` of eight.
    fn to_le_array(self) -> [u8; 8];

    /// Atomically loads the word at `p`, converting from little-endian.
    ///
    /// # Safety
    ///
    /// `p` must be valid for reads of `SIZE` bytes, aligned to `SIZE`, and
    /// every concurrent access to those bytes must be atomic or a byte copy
    /// that the caller accepts may tear with it.
    unsafe fn load_le(p: *mut u8, order: Ordering) -> Self;

    /// Atomically stores the word, little-endian, at `p`.
    ///
    /// # Safety
    ///
    /// As [`load_le`](Self::load_le), for writes.
    unsafe fn store_le(p: *mut u8, v: Self, order: Ordering);
}

macro_rules! word {
    ($t:ty, $atomic:ty) => {
        impl DmaWord for $t {
            const SIZE: usize = std::mem::size_of::<$t>();

            fn from_le_slice(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                let n = bytes.len().min(b.len());
                b[..n].copy_from_slice(&bytes[..n]);
                <$t>::from_le_bytes(b)
            }

            fn to_le_array(self) -> [u8; 8] {
                let mut out = [0u8; 8];
                out[..Self::SIZE].copy_from_slice(&self.to_le_bytes());
                out
            }

            #[inline(always)]
            unsafe fn load_le(p: *mut u8, order: Ordering) -> Self {
                // SAFETY: the caller guarantees `p` is valid, aligned and
                // accessed atomically by everyone who races with us.
                <$t>::from_le(unsafe { <$atomic>::from_ptr(p.cast()) }.load(order))
            }

            #[inline(always)]
            unsafe fn store_le(p: *mut u8, v: Self, order: Ordering) {
                // SAFETY: as in `load_le`.
                unsafe { <$atomic>::from_ptr(p.cast()) }.store(v.to_le(), order)
            }
        }
    };
}

word!(u16, AtomicU16);
word!(u32, AtomicU32);
word!(u64, AtomicU64);
