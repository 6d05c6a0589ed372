//! [`StreamHash`]: a fast order-sensitive hash of a byte stream, the same
//! whatever the chunking (a TCP receiver sees other boundaries than the
//! sender wrote). Not cryptographic: it catches lost, duplicated,
//! reordered or corrupted bytes.

/// A running hash of a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHash {
    h: u64,
    carry: [u8; 8],
    n: usize,
    len: u64,
}

impl Default for StreamHash {
    fn default() -> Self {
        Self {
            h: 0x243f_6a88_85a3_08d3,
            carry: [0; 8],
            n: 0,
            len: 0,
        }
    }
}

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl StreamHash {
    #[inline]
    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(K).rotate_left(29);
    }

    /// Adds `data` to the stream.
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if self.n > 0 {
            let take = (8 - self.n).min(data.len());
            self.carry[self.n..self.n + take].copy_from_slice(&data[..take]);
            self.n += take;
            data = &data[take..];
            if self.n < 8 {
                return;
            }
            let w = u64::from_le_bytes(self.carry);
            self.word(w);
            self.n = 0;
        }
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            self.word(u64::from_le_bytes(b));
        }
        let rest = chunks.remainder();
        self.carry[..rest.len()].copy_from_slice(rest);
        self.n = rest.len();
    }

    /// Bytes hashed.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was hashed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The hash of everything so far.
    pub fn finish(&self) -> u64 {
        let mut t = *self;
        if t.n > 0 {
            t.carry[t.n..].fill(0);
            let w = u64::from_le_bytes(t.carry);
            t.word(w);
        }
        t.word(t.len);
        t.h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunking_does_not_change_the_hash_but_content_does() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut one = StreamHash::default();
        one.update(&data);
        let mut many = StreamHash::default();
        for c in data.chunks(7) {
            many.update(c);
        }
        assert_eq!(one.finish(), many.finish());
        assert_eq!(one.len(), 1000);
        let mut other = data.clone();
        other.swap(10, 11);
        let mut h = StreamHash::default();
        h.update(&other);
        assert_ne!(h.finish(), one.finish());
        let mut short = StreamHash::default();
        short.update(&data[..999]);
        assert_ne!(short.finish(), one.finish());
    }
}
