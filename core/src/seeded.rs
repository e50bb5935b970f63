//! The seeded generator of the simulations (`storage/lease_sim.rs`,
//! `actor/simulation.rs`): xorshift64*, so a run depends on its seed
//! alone.

/// A small seeded generator.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    #[allow(clippy::should_implement_trait)] // a generator, not an iterator
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True `percent` times in 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// True `per_mille` times in 1000.
    pub fn per_mille(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}
