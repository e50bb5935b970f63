//! The seeded generator of the simulations (`storage/lease_sim.rs`,
//! `actor/simulation.rs`): xorshift64*, so a run depends on its seed
//! alone.

/// A small seeded generator.
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True `percent` times in 100.
    pub(crate) fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// True `per_mille` times in 1000.
    pub(crate) fn per_mille(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}
