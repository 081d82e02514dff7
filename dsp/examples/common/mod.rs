//! Shared by the dsp examples: fixed pseudo-random inputs.

/// A linear congruential generator (Numerical Recipes' constants) from its seed: the same
/// inputs on every run and every machine.
pub struct Lcg(pub u32);

impl Lcg {
    /// `k` values uniform in `[-0.5, 0.5)`.
    pub fn vec(&mut self, k: usize) -> Vec<f32> {
        (0..k)
            .map(|_| {
                self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (self.0 >> 8) as f32 / (1 << 24) as f32 - 0.5
            })
            .collect()
    }
}
