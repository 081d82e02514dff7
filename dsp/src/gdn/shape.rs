//! Head geometry of a GDN layer and the buffer layouts every GDN kernel shares.
//!
//! Layouts (row-major, f32), for `n` tokens:
//! - `q`, `k`: `[n, n_k_heads · d_k]`, head `kh` of token `t` at `t·n_k_heads·d_k + kh·d_k`.
//!   Both are L2-normalised per head by the caller (Qwen3.5 `use_qk_l2norm_in_kernel`).
//! - `v`, `out`: `[n, n_v_heads · d_v]`.
//! - `gate`: `[n, n_v_heads]`, the log decay `-exp(A_log) · softplus(a + dt_bias)` (≤ 0, finite);
//!   the kernels apply `exp(gate)`.
//! - `beta`: `[n, n_v_heads]`, already through the sigmoid (`beta = sigmoid(b)`).
//! - `state`: `[n_v_heads, d_k, d_v]`: `S_h[i][j]` at `h·d_k·d_v + i·d_v + j` (the Hugging Face
//!   `recurrent_state [B, H, K, V]` order; llama.cpp stores the transpose).
//!
//! Value head `h` reads key/query head `h % n_k_heads` ("tiled" order). This is the order of
//! GGUF files: llama.cpp's converter (`_LinearAttentionVReorderBase` in `conversion/qwen.py`)
//! reorders the value heads from the Hugging Face "grouped" order (where `h / r` would be the
//! key head, `repeat_interleave`) to tiled order, and `ggml_compute_forward_gated_delta_net`
//! reads `ik1 = iv1 % nek1`. Weights in Hugging Face order must be permuted the same way.

use std::ops::Range;

use crate::error::DspError;

/// The five input tensors of one GDN call and their heads' `shape`, token-major (layouts in
/// the module docs): `q`, `k` `[n, n_k_heads·d_k]`, `v` `[n, n_v_heads·d_v]`, `gate` (log
/// decay, ≤ 0) and `beta` (post-sigmoid) `[n, n_v_heads]`. The shape and lengths are checked
/// by the kernels ([`GdnInputs::check_io`]), not here.
#[derive(Debug, Clone, Copy)]
pub struct GdnInputs<'a> {
    pub shape: GdnShape,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub gate: &'a [f32],
    pub beta: &'a [f32],
}

impl<'a> GdnInputs<'a> {
    /// The rows of the tokens `tokens` (e.g. one micro-batch's head or tail).
    ///
    /// # Panics
    /// If `tokens` reaches past the inputs' tokens (as slicing does).
    pub fn tokens(&self, tokens: Range<usize>) -> GdnInputs<'a> {
        let (a, b) = (tokens.start, tokens.end);
        let shape = self.shape;
        let qk = shape.n_k_heads * shape.d_k;
        let vd = shape.n_v_heads * shape.d_v;
        let hv = shape.n_v_heads;
        GdnInputs {
            shape,
            q: &self.q[a * qk..b * qk],
            k: &self.k[a * qk..b * qk],
            v: &self.v[a * vd..b * vd],
            gate: &self.gate[a * hv..b * hv],
            beta: &self.beta[a * hv..b * hv],
        }
    }

    /// Validates the shape and every buffer length against the layouts in the module docs;
    /// returns the token count `n = gate.len() / n_v_heads`.
    pub(crate) fn check_io(
        &self,
        op: &'static str,
        state: &[f32],
        out: &[f32],
    ) -> Result<usize, DspError> {
        let GdnInputs {
            shape,
            q,
            k,
            v,
            gate,
            beta,
        } = *self;
        shape.validate(op)?;
        let n = gate.len() / shape.n_v_heads;
        DspError::check_len(op, "gate [n, n_v_heads]", n * shape.n_v_heads, gate.len())?;
        DspError::check_len(op, "beta [n, n_v_heads]", gate.len(), beta.len())?;
        let qk = n * shape.n_k_heads * shape.d_k;
        DspError::check_len(op, "q [n, n_k_heads·d_k]", qk, q.len())?;
        DspError::check_len(op, "k [n, n_k_heads·d_k]", qk, k.len())?;
        let vo = n * shape.n_v_heads * shape.d_v;
        DspError::check_len(op, "v [n, n_v_heads·d_v]", vo, v.len())?;
        DspError::check_len(op, "out [n, n_v_heads·d_v]", vo, out.len())?;
        DspError::check_len(
            op,
            "state [n_v_heads, d_k, d_v]",
            shape.state_len(),
            state.len(),
        )?;
        Ok(n)
    }
}

/// Head counts and head dimensions of one GDN layer (Qwen3.5: `n_k_heads = 16`,
/// `n_v_heads ∈ {16, 32}`, `d_k = d_v = 128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnShape {
    /// Query/key heads.
    pub n_k_heads: usize,
    /// Value heads; a multiple of `n_k_heads`.
    pub n_v_heads: usize,
    /// Query/key head dimension.
    pub d_k: usize,
    /// Value head dimension.
    pub d_v: usize,
}

impl GdnShape {
    /// Floats in the recurrent state of one layer: `n_v_heads · d_k · d_v`.
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.d_k * self.d_v
    }

    /// Floats in the state of one value head: `d_k · d_v`.
    pub fn head_state_len(&self) -> usize {
        self.d_k * self.d_v
    }

    /// The key/query head read by value head `h`: `h % n_k_heads` (tiled order, see the
    /// module docs).
    pub fn k_head_of(&self, h: usize) -> usize {
        h % self.n_k_heads
    }

    /// Key head `kh` of token `t` in a token-major `[n, n_k_heads·d_k]` buffer (`q`, `k`):
    /// `[d_k]`.
    #[inline]
    pub(crate) fn k_row<'a>(&self, x: &'a [f32], t: usize, kh: usize) -> &'a [f32] {
        &x[(t * self.n_k_heads + kh) * self.d_k..][..self.d_k]
    }

    /// Value head `h` of token `t` in a token-major `[n, n_v_heads·d_v]` buffer (`v`, the
    /// writes `δ`): `[d_v]`.
    #[inline]
    pub(crate) fn v_row<'a>(&self, x: &'a [f32], t: usize, h: usize) -> &'a [f32] {
        &x[(t * self.n_v_heads + h) * self.d_v..][..self.d_v]
    }

    /// Value head `h`'s entry of token `t` in a `[n, n_v_heads]` buffer (`gate`, `beta`).
    #[inline]
    pub(crate) fn head_entry(&self, x: &[f32], t: usize, h: usize) -> f32 {
        x[t * self.n_v_heads + h]
    }

    /// Output scale `1/√d_k`. Hugging Face multiplies `q` by it before the rule; we scale the
    /// output `Sᵀq` instead, which is the same up to rounding.
    pub fn scale(&self) -> f32 {
        1.0 / (self.d_k as f32).sqrt()
    }

    /// `Ok` if every dimension is positive and `n_v_heads` is a multiple of `n_k_heads`.
    ///
    /// # Errors
    /// `InvalidArgument` naming the offending dimension.
    pub fn validate(&self, op: &'static str) -> Result<(), DspError> {
        let bad = |detail: String| DspError::InvalidArgument {
            op,
            what: "GdnShape",
            detail,
        };
        if self.n_k_heads == 0 || self.n_v_heads == 0 || self.d_k == 0 || self.d_v == 0 {
            return Err(bad(format!(
                "all dimensions must be positive, got {self:?}"
            )));
        }
        if !self.n_v_heads.is_multiple_of(self.n_k_heads) {
            return Err(bad(format!(
                "n_v_heads {} is not a multiple of n_k_heads {}",
                self.n_v_heads, self.n_k_heads
            )));
        }
        Ok(())
    }
}
