//! The 2-D rotary position embedding of the Qwen3-VL / Qwen3.5 vision blocks (Su et al. 2021,
//! RoFormer, applied per image axis).
//!
//! With head dim `d`, the frequencies are `θ_j = base^(−2j / (d/2))` for `j < d/4`
//! (Hugging Face `Qwen3VLVisionRotaryEmbedding(d/2)`, base 10000). A patch at (row `r`,
//! column `c`) rotates NEOX pair `i` (dims `i` and `i + d/2`) by `r·θ_i` for `i < d/4` and by
//! `c·θ_{i−d/4}` for `d/4 ≤ i < d/2` (`rot_pos_emb`: row and column frequencies concatenated,
//! then `cat(freqs, freqs)` and `rotate_half`). llama.cpp computes the same rotation as
//! `ggml_rope_multi` of type VISION with sections `[d/4, d/4, d/4, d/4]` over `d/2` dims and
//! positions (row, column, row, column) in merge-block order (`tools/mtmd/models/qwen3vl.cpp`).
//! Angles here are HF's: `θ_j` by `powf`, `r·θ_j` in f32 (ggml builds them by repeated
//! multiplication, within a few ulps).

use dsp::encoder::rope_neox_angles;

use super::VisionError;

/// Base of the vision rotary frequencies (HF `Qwen3VLVisionRotaryEmbedding`, llama.cpp
/// `freq_base` 10000 in `qwen3vl.cpp`).
pub const ROPE_BASE: f32 = 10_000.0;

/// The frequencies of one head dim.
#[derive(Clone, Debug)]
pub struct Rope2d {
    head_dim: usize,
    /// `θ_j`, `j < head_dim / 4`.
    inv_freq: Vec<f32>,
}

impl Rope2d {
    /// Frequencies for heads of `head_dim` (a multiple of 4, checked when the projector is
    /// bound).
    pub fn new(head_dim: usize) -> Self {
        let dim = head_dim / 2;
        let inv_freq = (0..dim / 2)
            .map(|j| 1.0 / ROPE_BASE.powf((2 * j) as f32 / dim as f32))
            .collect();
        Self { head_dim, inv_freq }
    }

    /// `(cos, sin)` of the `head_dim / 2` pair angles of a patch at (`row`, `col`).
    pub fn angles(&self, row: usize, col: usize) -> Vec<(f32, f32)> {
        let (r, c) = (row as f32, col as f32);
        let rows = self.inv_freq.iter().map(|&f| r * f);
        let cols = self.inv_freq.iter().map(|&f| c * f);
        rows.chain(cols).map(|t| (t.cos(), t.sin())).collect()
    }

    /// Rotates the queries and keys of every patch in place: `qkv` is `[n, 3·n_embd]` rows
    /// `q | k | v` (`n_embd = n_head · head_dim`), patch `t` at `coords[t]` = (row, column).
    ///
    /// Errors: [`VisionError::Encoder`] when `qkv` is not `coords.len()` rows of
    /// `3 · n_head · head_dim`.
    pub fn apply(
        &self,
        qkv: &mut [f32],
        coords: &[(usize, usize)],
        n_head: usize,
    ) -> Result<(), VisionError> {
        let e = n_head * self.head_dim;
        if qkv.len() != coords.len() * 3 * e {
            return Err(VisionError::EncoderShape {
                what: "qkv",
                expected: coords.len() * 3 * e,
                actual: qkv.len(),
            });
        }
        for (row, &(r, c)) in qkv.chunks_exact_mut(3 * e).zip(coords) {
            let cs = self.angles(r, c);
            let (q, rest) = row.split_at_mut(e);
            for part in [q, &mut rest[..e]] {
                rope_neox_angles(part, n_head, self.head_dim, &cs)
                    .map_err(|source| VisionError::kernel("2-D rope", source))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_then_columns() {
        let r = Rope2d::new(16);
        let a = r.angles(3, 5);
        assert_eq!(a.len(), 8);
        // Pair 0 turns by the row, pair 4 by the column, both at frequency 1.
        assert!((a[0].1 - 3f32.sin()).abs() < 1e-6 && (a[4].1 - 5f32.sin()).abs() < 1e-6);
        // Pair 1: θ_1 = 10000^(-2/8).
        let t1 = 10_000f32.powf(-0.25);
        assert!((a[1].0 - (3.0 * t1).cos()).abs() < 1e-6);
        assert!((a[5].0 - (5.0 * t1).cos()).abs() < 1e-6);
    }
}
