//! Deterministic workload generators shared by benches and labs.

/// A small, fast PRNG (xorshift64*): workloads must be reproducible and the
/// generator must not be what a benchmark measures.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value; zero is remapped).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() >> 32) * n) >> 32
    }
}

/// A mix of DMA sizes in pages, as (weight in percent, choices).
#[derive(Debug, Clone, Copy)]
pub struct SizeMix(pub &'static [(u64, &'static [u64])]);

/// Network and storage DMA as drivers see it: mostly single pages (packets,
/// 4 KiB blocks), some 8–64 KiB, a few 128 KiB–1 MiB transfers.
pub const DMA_MIX: SizeMix = SizeMix(&[(80, &[1]), (16, &[2, 4, 8, 16]), (4, &[32, 64, 128, 256])]);

impl SizeMix {
    /// Draws one size.
    pub fn draw(&self, rng: &mut Rng) -> u64 {
        let mut r = rng.below(100);
        for &(w, choices) in self.0 {
            if r < w {
                return choices[rng.below(choices.len() as u64) as usize];
            }
            r -= w;
        }
        1
    }

    /// A pre-drawn sequence, so that drawing costs nothing in a timed loop.
    pub fn sequence(&self, seed: u64, len: usize) -> Vec<u64> {
        let mut rng = Rng::new(seed);
        (0..len).map(|_| self.draw(&mut rng)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_has_the_advertised_shape() {
        let s = DMA_MIX.sequence(7, 100_000);
        let ones = s.iter().filter(|&&p| p == 1).count() as f64 / 1e5;
        let big = s.iter().filter(|&&p| p >= 32).count() as f64 / 1e5;
        assert!((0.77..0.83).contains(&ones), "{ones}");
        assert!((0.03..0.05).contains(&big), "{big}");
        assert!(s.iter().all(|p| p.is_power_of_two() && *p <= 256));
    }
}
