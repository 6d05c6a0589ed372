//! The `null` back-end's data: every byte of the disk has a value derived
//! from its offset, so a driver can check what a read returned without
//! anything having been written. Words are 8 bytes, little-endian; word
//! `k` (bytes `8k..8k+8` of the disk) is [`word`]`(k)`, which differs from
//! sector to sector and within a sector from word to word.

/// Word `k` of the disk (bytes `8k..8k + 8`): the sector number (`k / 64`)
/// mixed with a multiplicative hash, with the word's place in its sector in
/// the top byte.
#[inline]
pub fn word(k: u64) -> u64 {
    sector_base(k >> 6) ^ ((k & 63) << 56)
}

/// The hash of a sector that all its words carry below their top byte.
#[inline]
fn sector_base(sector: u64) -> u64 {
    sector.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 8
}

/// Words per sector.
const SECTOR_WORDS: u64 = 64;

/// Fills `buf` with the disk's bytes from byte `offset` on.
///
/// It runs on the device's thread for every read of the `null` back-end
/// (and of the `ssd` model built on it), so it is written to cost about a
/// memory fill: the hash is taken once per sector, and each word of the
/// sector is that hash with its place in the top byte (no 64-bit multiply
/// per word, which costs several times the store on a CPU without a vector
/// 64-bit multiply).
pub fn fill(offset: u64, buf: &mut [u8]) {
    let mut at = offset;
    let mut rest = buf;
    // An unaligned head: part of one word.
    let head = (at % 8) as usize;
    if head != 0 {
        let w = word(at / 8).to_le_bytes();
        let n = (8 - head).min(rest.len());
        let (h, t) = rest.split_at_mut(n);
        h.copy_from_slice(&w[head..head + n]);
        rest = t;
        at += n as u64;
    }
    let mut k = at / 8;
    // Whole words, one sector's run at a time.
    while rest.len() >= 8 {
        let place = k % SECTOR_WORDS;
        let words = (SECTOR_WORDS - place).min((rest.len() / 8) as u64);
        // `words <= 64`: the run is at most one sector's 512 bytes.
        let (run, t) = rest.split_at_mut(words as usize * 8);
        let base = sector_base(k / SECTOR_WORDS);
        for (p, c) in (place..).zip(run.chunks_exact_mut(8)) {
            c.copy_from_slice(&(base ^ (p << 56)).to_le_bytes());
        }
        rest = t;
        k += words;
    }
    if !rest.is_empty() {
        let w = word(k).to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&w[..n]);
    }
}

/// The first byte of `buf` that is not the disk's byte at its place
/// (`buf` holds the disk from byte `offset` on), if any.
pub fn first_mismatch(offset: u64, buf: &[u8]) -> Option<usize> {
    let mut want = [0u8; 512];
    let mut done = 0usize;
    while done < buf.len() {
        let n = (buf.len() - done).min(want.len());
        fill(offset + done as u64, &mut want[..n]);
        if let Some(i) = (0..n).find(|&i| buf[done + i] != want[i]) {
            return Some(done + i);
        }
        done += n;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_range_reads_the_same_bytes_however_it_is_cut() {
        let mut whole = vec![0u8; 4096];
        fill(1024, &mut whole);
        for (off, len) in [(0usize, 4096usize), (3, 17), (511, 2), (4000, 96), (8, 8)] {
            let mut part = vec![0u8; len];
            fill(1024 + off as u64, &mut part);
            assert_eq!(part, whole[off..off + len], "{off}+{len}");
        }
        assert_eq!(first_mismatch(1024, &whole), None);
        whole[777] ^= 1;
        assert_eq!(first_mismatch(1024, &whole), Some(777));
    }

    /// The per-sector fill is the word-by-word definition: every byte
    /// of a range, however it starts and ends (mid-word, mid-sector,
    /// across sectors), is byte `i % 8` of `word(i / 8)`.
    #[test]
    fn fill_is_the_word_definition_at_any_cut() {
        for (off, len) in [
            (0u64, 131_072usize),
            (5, 3),
            (3, 1000),
            (504, 24),
            (511, 1),
            (512 * 7 + 13, 512 * 3 + 5),
            (u64::MAX / 2, 64),
        ] {
            let mut got = vec![0u8; len];
            fill(off, &mut got);
            for (i, b) in got.iter().enumerate() {
                let at = off + i as u64;
                assert_eq!(
                    *b,
                    word(at / 8).to_le_bytes()[(at % 8) as usize],
                    "{off}+{i}"
                );
            }
        }
    }

    #[test]
    fn sectors_and_words_differ() {
        assert_ne!(word(0), word(1));
        assert_ne!(word(0), word(64));
        let mut a = [0u8; 512];
        let mut b = [0u8; 512];
        fill(0, &mut a);
        fill(512, &mut b);
        assert_ne!(a, b);
    }
}
