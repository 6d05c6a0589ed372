//! The examples' xorshift generator (deterministic, no dependency).

/// A xorshift64 generator.
pub struct Rng(pub u64);

impl Rng {
    /// The next value below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % n
    }
}
