//! Copies into and out of memory that other threads (device threads, the
//! unit, other CPUs) may touch at the same time.
//!
//! The arena is shared with devices by design: a device thread may write a
//! buffer while a driver thread reads it, or fill a page while the unit
//! loads a word of it. A plain `memcpy` racing another access is a data race
//! in Rust's (C++'s) memory model, undefined behaviour that ThreadSanitizer
//! reports. So every byte of the arena side of a copy is moved by an atomic
//! access with `Relaxed` ordering: 8-byte words where the arena address is
//! 8-byte aligned, single bytes at the unaligned head and tail. This is the
//! discipline of `vm-memory`'s `VolatileSlice` made precise: a relaxed
//! atomic promises no ordering (callers that need ordering fence around the
//! copy, as `access::order` does) but it is never a data race, and on x86-64
//! and AArch64 it compiles to the plain load or store a `memcpy` would use.
//! The Rust side of a copy (a `&[u8]` or `&mut [u8]` the caller owns
//! exclusively) is read and written with ordinary unaligned accesses. On
//! x86-64, copies and fills of at least `STRING_OP_MIN` bytes use one
//! `rep movsb` / `rep stosb` in inline assembly, whose accesses are those
//! of a loop of relaxed byte atomics (see `rep_movsb`).
//!
//! Mixed sizes: a word written here may be read by `PhysMemory::load_u64`,
//! a byte of it by another copy's head, a ring index as an `AtomicU16`.
//! Each is an atomic access, so there is no data race in the sense
//! ThreadSanitizer checks, and the hardware gives each access single-copy
//! atomicity at its own size. Rust's memory model does not yet define
//! racing atomic *writes* of different sizes to the same bytes (it calls
//! them not allowed, rust-lang/rust#128778); memory shared with a device
//! is the one place they can meet, as with `vm-memory`'s volatile copies,
//! and what each side then reads is still whole bytes that some side
//! wrote.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

const WORD: usize = 8;

/// From this many bytes on, x86-64 moves the bytes with one `rep movsb` /
/// `rep stosb` (what glibc's `memcpy` uses for such sizes on CPUs with fast
/// strings) instead of a loop of word accesses: a 4 KiB page in about a
/// quarter of the loop's time. Below it the loop wins (the instruction's
/// start-up costs tens of cycles).
#[cfg(target_arch = "x86_64")]
const STRING_OP_MIN: usize = 512;

/// Copies `len` bytes from `src` to `dst` with `rep movsb`, forwards.
///
/// The instruction reads and writes each byte once, with single-copy
/// atomicity per byte and no ordering among them (fast-string stores may
/// become visible out of order, Intel SDM vol. 1 §7.3.9.3): exactly the
/// accesses of a loop of relaxed `AtomicU8` loads and stores, which is
/// how this module's contract models it. Inline assembly is outside what
/// the compiler can see, so it neither merges nor splits these accesses.
///
/// # Safety
/// Both ranges are valid for `len` bytes; if they overlap, `dst` lies
/// below `src` (a forward copy then reads each byte before writing it).
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn rep_movsb(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract; the direction flag is clear on entry
    // to inline assembly (Rust's asm! contract), so the copy runs forwards;
    // the instruction changes no flags and touches no stack.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
}

/// Sets `len` bytes at `dst` to `byte` with `rep stosb` (per byte, as
/// [`rep_movsb`]).
///
/// # Safety
/// `dst` is valid for `len` bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn rep_stosb(dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: as in `rep_movsb`.
    unsafe {
        std::arch::asm!(
            "rep stosb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("al") byte,
            options(nostack, preserves_flags)
        );
    }
}

/// The number of head bytes to move singly before `addr` is word aligned.
fn head_len(addr: usize, len: usize) -> usize {
    (addr.wrapping_neg() % WORD).min(len)
}

/// Copies `dst.len()` bytes from shared memory at `src` into `dst`.
///
/// # Safety
/// `src .. src + dst.len()` must lie inside one live allocation that is
/// only ever accessed atomically (or by these functions) while shared.
pub(crate) unsafe fn read_shared(src: *const u8, dst: &mut [u8]) {
    let len = dst.len();
    #[cfg(target_arch = "x86_64")]
    if len >= STRING_OP_MIN {
        // SAFETY: `dst` is the caller's own buffer, distinct from `src`.
        unsafe { rep_movsb(dst.as_mut_ptr(), src, len) };
        return;
    }
    let head = head_len(src as usize, len);
    let d = dst.as_mut_ptr();
    let mut i = 0;
    while i < head {
        // SAFETY: `i < len`: in bounds of both sides; the caller promised
        // the source is only accessed atomically; `AtomicU8` has alignment 1.
        unsafe { *d.add(i) = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Relaxed) };
        i += 1;
    }
    while i + WORD <= len {
        // SAFETY: `src + i` is 8-byte aligned (past the head) and the word
        // is in bounds; the destination is the caller's exclusive buffer,
        // written unaligned.
        unsafe {
            let w = AtomicU64::from_ptr(src.add(i).cast_mut().cast()).load(Relaxed);
            d.add(i).cast::<u64>().write_unaligned(w);
        }
        i += WORD;
    }
    while i < len {
        // SAFETY: as for the head.
        unsafe { *d.add(i) = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Relaxed) };
        i += 1;
    }
}

/// Copies `src` into shared memory at `dst`.
///
/// # Safety
/// As [`read_shared`], for `dst .. dst + src.len()`.
pub(crate) unsafe fn write_shared(dst: *mut u8, src: &[u8]) {
    let len = src.len();
    #[cfg(target_arch = "x86_64")]
    if len >= STRING_OP_MIN {
        // SAFETY: `src` is the caller's own buffer, distinct from `dst`.
        unsafe { rep_movsb(dst, src.as_ptr(), len) };
        return;
    }
    let head = head_len(dst as usize, len);
    let s = src.as_ptr();
    let mut i = 0;
    while i < head {
        // SAFETY: in bounds; atomic on the shared side.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(*s.add(i), Relaxed) };
        i += 1;
    }
    while i + WORD <= len {
        // SAFETY: `dst + i` is 8-byte aligned and in bounds; the source is
        // the caller's buffer, read unaligned.
        unsafe {
            let w = s.add(i).cast::<u64>().read_unaligned();
            AtomicU64::from_ptr(dst.add(i).cast()).store(w, Relaxed);
        }
        i += WORD;
    }
    while i < len {
        // SAFETY: as for the head.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(*s.add(i), Relaxed) };
        i += 1;
    }
}

/// Sets `len` bytes of shared memory at `dst` to `byte`.
///
/// # Safety
/// As [`write_shared`].
pub(crate) unsafe fn fill_shared(dst: *mut u8, len: usize, byte: u8) {
    #[cfg(target_arch = "x86_64")]
    if len >= STRING_OP_MIN {
        // SAFETY: the caller's contract.
        unsafe { rep_stosb(dst, len, byte) };
        return;
    }
    let head = head_len(dst as usize, len);
    let word = u64::from_ne_bytes([byte; WORD]);
    let mut i = 0;
    while i < head {
        // SAFETY: in bounds; atomic.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(byte, Relaxed) };
        i += 1;
    }
    while i + WORD <= len {
        // SAFETY: aligned and in bounds; atomic.
        unsafe { AtomicU64::from_ptr(dst.add(i).cast()).store(word, Relaxed) };
        i += WORD;
    }
    while i < len {
        // SAFETY: in bounds; atomic.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(byte, Relaxed) };
        i += 1;
    }
}

/// The bounce buffer `copy_within_shared` moves through, per step.
const CHUNK: usize = 512;

/// Copies `len` bytes from `src` to `dst`, both shared, the ranges allowed
/// to overlap (as `memmove`): through a stack buffer a chunk at a time, from
/// the end when `dst` lies above `src`, so no byte is read after it was
/// overwritten.
///
/// # Safety
/// As [`read_shared`] for both ranges.
pub(crate) unsafe fn copy_within_shared(src: *const u8, dst: *mut u8, len: usize) {
    let backwards = (dst as usize) > (src as usize) && (dst as usize) < (src as usize) + len;
    #[cfg(target_arch = "x86_64")]
    if len >= STRING_OP_MIN && !backwards {
        // SAFETY: no overlap, or `dst` below `src`: a forward copy.
        unsafe { rep_movsb(dst, src, len) };
        return;
    }
    let mut buf = [0u8; CHUNK];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        let off = if backwards { len - done - n } else { done };
        let tmp = &mut buf[..n];
        // SAFETY: `off + n <= len`: in bounds of both ranges; the whole chunk
        // is read before any of it is written.
        unsafe {
            read_shared(src.add(off), tmp);
            write_shared(dst.add(off), tmp);
        }
        done += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alignment_and_length_round_trips() {
        let mut shared = vec![0u8; 1024];
        let base = shared.as_mut_ptr();
        for at in 0..9 {
            for len in (0..40).chain([511, 512, 513, 700]) {
                let src: Vec<u8> = (0..len).map(|b| (b as u8).wrapping_mul(7) | 1).collect();
                // SAFETY: `at + len <= 708 < 1024`; single-threaded test.
                unsafe {
                    fill_shared(base, 1024, 0xee);
                    write_shared(base.add(at), &src);
                }
                let mut back = vec![0u8; len];
                // SAFETY: as above.
                unsafe { read_shared(base.add(at), &mut back) };
                assert_eq!(back, src, "at {at} len {len}");
                assert!(shared[..at].iter().all(|&b| b == 0xee), "head kept");
                assert!(shared[at + len..].iter().all(|&b| b == 0xee), "tail kept");
            }
        }
    }

    #[test]
    fn overlapping_copies_move_like_memmove() {
        for (s, d, len) in [
            (0usize, 3usize, 1500usize),
            (3, 0, 1500),
            (5, 5, 10),
            (0, 700, 600),
        ] {
            let mut a: Vec<u8> = (0..2100u32).map(|i| (i * 31 % 251) as u8).collect();
            let mut want = a.clone();
            want.copy_within(s..s + len, d);
            // SAFETY (below): both ranges are inside `a`; single-threaded.
            let base = a.as_mut_ptr();
            // SAFETY: as above.
            unsafe { copy_within_shared(base.add(s), base.add(d), len) };
            assert_eq!(a, want, "{s} -> {d} x {len}");
        }
    }
}
