//! Kernels of bidirectional (encoder) transformers, such as a vision tower: LayerNorm with
//! bias, the two GELU forms (tanh approximation and exact erf), NEOX rotation by per-pair
//! angles (2-D rotary), bilinear resampling of a feature grid (two coordinate conventions) and
//! full non-causal attention in f32. Each is a plain scalar reference; the products inside
//! attention go through the given [`KernelBackend`] (`vec_dot_f32`, `softmax_inplace`), so
//! [`crate::backend::scalar`] gives the reference of the selected backend's result.
//!
//! Numerics follow ggml's CPU ops where ggml has the op (`ggml_norm`, `ggml_gelu`,
//! `ggml_gelu_erf`, `ggml_interpolate`, the non-flash `mul_mat → soft_max_ext → mul_mat`
//! attention) and PyTorch's where the reference is a PyTorch model (`nn.LayerNorm`,
//! `F.gelu`, `Qwen3VLVisionModel.fast_pos_embed_interpolate`).

use crate::backend::KernelBackend;
use crate::error::DspError;

// === LayerNorm ===

/// LayerNorm of each row (Ba, Kiros & Hinton 2016): `out = (x − mean) / sqrt(var + eps) · w + b`
/// with the biased variance. Mean and variance are summed in f64, then
/// `scale = 1 / sqrtf(var + eps)` in f32 (ggml `ggml_compute_forward_norm_f32` followed by
/// `ggml_mul` and `ggml_add`; PyTorch `nn.LayerNorm`).
///
/// Shapes: `x`, `out`: `[n_rows, d]` row-major with `d = w.len() = b.len()`.
///
/// # Errors
/// `LengthMismatch` if `b.len() != w.len()`, `out.len() != x.len()` or `x.len()` is not a
/// multiple of `w.len()`.
pub fn layer_norm(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), DspError> {
    const OP: &str = "layer_norm";
    let d = w.len();
    DspError::check_len(OP, "b", d, b.len())?;
    for (xr, or) in crate::ops::row_pairs(OP, x, d, out)? {
        let mean = (xr.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64) as f32;
        let var: f64 = xr
            .iter()
            .map(|&v| {
                let c = f64::from(v - mean);
                c * c
            })
            .sum::<f64>()
            / d as f64;
        let scale = 1.0 / (var as f32 + eps).sqrt();
        for ((o, &v), (&g, &bb)) in or.iter_mut().zip(xr).zip(w.iter().zip(b)) {
            *o = (v - mean) * scale * g + bb;
        }
    }
    Ok(())
}

// === GELU ===

/// `2·√(2/π)`: the tanh form's argument doubled (exact in f32: twice `√(2/π)` rounded).
pub const GELU_SQRT_8_OVER_PI: f32 = 1.595_769_2;
/// The cubic coefficient of the tanh approximation.
pub const GELU_COEF_A: f32 = 0.044_715;

/// The two forms of GELU (Hendrycks & Gimpel 2016, "Gaussian Error Linear Units").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`: PyTorch `gelu(approximate="tanh")`
    /// (`gelu_pytorch_tanh`), ggml `ggml_gelu` (llama.cpp `FFN_GELU`).
    Tanh,
    /// `0.5·x·(1 + erf(x/√2))`: PyTorch `nn.GELU()`, ggml `ggml_gelu_erf`.
    Erf,
}

impl Gelu {
    /// The activation of one value (the scalar reference).
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Gelu::Tanh => gelu_tanh(x),
            Gelu::Erf => gelu_erf(x),
        }
    }

    /// The activation of every element: the tanh form by the backend's vector
    /// [`KernelBackend::gelu_tanh_inplace`] (its `exp` within 1 ulp of [`gelu_tanh`]'s), the
    /// erf form by [`gelu_erf`].
    pub fn apply_inplace(self, be: &dyn KernelBackend, x: &mut [f32]) {
        match self {
            Gelu::Tanh => be.gelu_tanh_inplace(x),
            Gelu::Erf => x.iter_mut().for_each(|v| *v = gelu_erf(*v)),
        }
    }
}

/// GELU, tanh form ([`Gelu::Tanh`]), computed as `x / (1 + exp(−z))` with
/// `z = 2·√(2/π)·x·(1 + 0.044715·x²)` in f32 with `f32::exp`: the same function, since
/// `0.5·(1 + tanh(z/2)) = σ(z)`, without `1 + tanh` cancelling for negative `x`, and on the
/// `exp` every backend vectorizes ([`KernelBackend::gelu_tanh_inplace`] repeats these f32
/// operations with its own `exp`). PyTorch's `gelu_pytorch_tanh` uses `tanhf` (within a few
/// ulp of this); ggml's CPU backend (`GGML_GELU_FP16`) reads an f16 table indexed by the input
/// rounded to f16 (≈ 3 significant digits), which we do not reproduce.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let z = GELU_SQRT_8_OVER_PI * x * (1.0 + GELU_COEF_A * x * x);
    x / (1.0 + (-z).exp())
}

/// GELU, exact form ([`Gelu::Erf`]), in f32 with musl's `erff` (crate `libm`).
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

// === Rotation by given angles ===

/// NEOX rotation of every head of one token by per-pair angles: pair
/// `(x[i], x[i + head_dim/2])` of each head is rotated by `cs[i] = (cos θ_i, sin θ_i)`,
/// `x[i] ← x[i]·cos − x[i+h]·sin`, `x[i+h] ← x[i]·sin + x[i+h]·cos` (Hugging Face
/// `rotate_half`; ggml `rope_multi` of type VISION rotates these same pairs). The caller
/// chooses the angles (e.g. 2-D rotary: row frequencies for the first pairs, column
/// frequencies for the rest).
///
/// Shapes: `x`: `[n_heads, head_dim]`; `cs`: `[head_dim / 2]`.
///
/// # Errors
/// `LengthMismatch` if `x.len() != n_heads · head_dim` or `cs.len() != head_dim / 2`;
/// `InvalidArgument` if `head_dim` is odd.
pub fn rope_neox_angles(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    cs: &[(f32, f32)],
) -> Result<(), DspError> {
    const OP: &str = "rope_neox_angles";
    if !head_dim.is_multiple_of(2) {
        return Err(DspError::InvalidArgument {
            op: OP,
            what: "head_dim",
            detail: format!("{head_dim} must be even"),
        });
    }
    DspError::check_len(OP, "x", n_heads * head_dim, x.len())?;
    let half = head_dim / 2;
    DspError::check_len(OP, "cs", half, cs.len())?;
    crate::ops::rotate_pairs(x, head_dim, cs, |i| (i, i + half));
    Ok(())
}

// === Bilinear resampling of a grid ===

/// Where output samples sit on the input grid, and how they are weighted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bilinear {
    /// Corners aligned: output `i` of `n` samples input coordinate `i·(m−1)/(n−1)` (PyTorch
    /// `torch.linspace(0, m−1, n)` in f32), between the two nearest inputs. Hugging Face
    /// `Qwen3VLVisionModel.fast_pos_embed_interpolate`.
    AlignCorners,
    /// Pixel centres (`(i + ½)·m/n − ½`) with a triangle filter whose support widens to
    /// `m/n` inputs when shrinking, weights normalised: ggml `ggml_interpolate` with
    /// `GGML_SCALE_MODE_BILINEAR | GGML_SCALE_FLAG_ANTIALIAS` (PyTorch
    /// `F.interpolate(mode="bilinear", align_corners=False, antialias=True)`), what llama.cpp
    /// `clip_graph::resize_position_embeddings` uses.
    Antialias,
}

/// Resamples a grid of `in_h × in_w` cells, each a vector of `c` values, to `out_h × out_w`
/// cells, separately per value; the weights of each output cell come from the two axes'
/// 1-D weights multiplied (`w_y · w_x`).
///
/// Shapes: `src`: `[in_h, in_w, c]` row-major; `out`: `[out_h, out_w, c]`.
///
/// # Errors
/// `LengthMismatch` if `src` or `out` has another length; `InvalidArgument` if a side is 0.
pub fn resize_bilinear(
    src: &[f32],
    (in_h, in_w): (usize, usize),
    c: usize,
    (out_h, out_w): (usize, usize),
    mode: Bilinear,
    out: &mut [f32],
) -> Result<(), DspError> {
    const OP: &str = "resize_bilinear";
    if in_h == 0 || in_w == 0 || out_h == 0 || out_w == 0 {
        return Err(DspError::InvalidArgument {
            op: OP,
            what: "grid sides",
            detail: format!("{in_h}x{in_w} -> {out_h}x{out_w}: every side must be positive"),
        });
    }
    DspError::check_len(OP, "src", in_h * in_w * c, src.len())?;
    DspError::check_len(OP, "out", out_h * out_w * c, out.len())?;
    let taps_y = axis_taps(in_h, out_h, mode);
    let taps_x = axis_taps(in_w, out_w, mode);
    out.fill(0.0);
    for (oy, ty) in taps_y.iter().enumerate() {
        for (ox, tx) in taps_x.iter().enumerate() {
            let dst = &mut out[(oy * out_w + ox) * c..(oy * out_w + ox + 1) * c];
            let mut total = 0f32;
            for &(sy, wy) in ty {
                for &(sx, wx) in tx {
                    let w = wy * wx;
                    if w <= 0.0 && mode == Bilinear::Antialias {
                        continue;
                    }
                    total += w;
                    let s = &src[(sy * in_w + sx) * c..(sy * in_w + sx + 1) * c];
                    for (d, &v) in dst.iter_mut().zip(s) {
                        *d += v * w;
                    }
                }
            }
            if mode == Bilinear::Antialias && total > 0.0 {
                for d in dst.iter_mut() {
                    *d /= total;
                }
            }
        }
    }
    Ok(())
}

/// The `(input index, weight)` taps of each of `n_out` samples along an axis of `n_in`.
fn axis_taps(n_in: usize, n_out: usize, mode: Bilinear) -> Vec<Vec<(usize, f32)>> {
    match mode {
        Bilinear::AlignCorners => (0..n_out)
            .map(|i| {
                let pos = linspace_f32(0.0, (n_in - 1) as f32, n_out, i);
                // PyTorch truncates (`.int()`) and clips the upper index.
                let lo = pos as usize;
                let hi = (lo + 1).min(n_in - 1);
                let d = pos - lo as f32;
                vec![(lo, 1.0 - d), (hi, d)]
            })
            .collect(),
        Bilinear::Antialias => {
            let sf = n_out as f32 / n_in as f32;
            let support = (1.0 / sf).max(1.0);
            let inv = 1.0 / support;
            (0..n_out)
                .map(|i| {
                    let centre = (i as f32 + 0.5) / sf;
                    // ggml converts to int64 (truncation) before clamping.
                    let lo = ((centre - support + 0.5) as i64).max(0) as usize;
                    let hi = ((centre + support + 0.5) as i64).min(n_in as i64).max(0) as usize;
                    (lo..hi)
                        .map(|s| (s, (1.0 - ((s as f32 - centre + 0.5) * inv).abs()).max(0.0)))
                        .collect()
                })
                .collect()
        }
    }
}

/// Element `i` of `torch.linspace(start, end, steps)` in f32: `start + i·step` for the first
/// half, `end − (steps − 1 − i)·step` for the rest (PyTorch's CPU kernel), `step =
/// (end − start)/(steps − 1)`; a single step is `start`.
fn linspace_f32(start: f32, end: f32, steps: usize, i: usize) -> f32 {
    if steps <= 1 {
        return start;
    }
    let step = (end - start) / (steps - 1) as f32;
    if i < steps / 2 {
        start + step * i as f32
    } else {
        end - step * (steps - 1 - i) as f32
    }
}

// === Full attention ===

/// Non-causal attention of one head over `n` positions (every query sees every key):
/// `out_i = Σ_j softmax_j(scale · q_i·k_j) · v_j` for the queries `i` in `queries`, in f32
/// (Vaswani et al. 2017; llama.cpp clip `build_attn` without flash attention:
/// `mul_mat(k, q)`, `soft_max_ext(scale)`, `mul_mat(v, kq)`). Dots by `be.vec_dot_f32`,
/// softmax by `be.softmax_inplace`, the values accumulated in position order; each query's
/// result is the same whatever range it is computed in.
///
/// Position `t` of `q`, `k` and `v` starts at `t · stride` and holds `head_dim` values (one
/// head read out of a fused `[n, 3·n_embd]` qkv buffer by offsetting the slices). The `r`-th
/// query of `queries` is written at `out[r · out_stride..][..head_dim]`. `scores`: at least
/// `n` values of scratch.
///
/// # Errors
/// `LengthMismatch` when a slice is too short for its stride, or `stride` / `out_stride`
/// is below `head_dim`; `InvalidArgument` if `queries` reaches past `n`.
#[allow(clippy::too_many_arguments)]
pub fn attention_full(
    be: &dyn KernelBackend,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (n, head_dim, stride): (usize, usize, usize),
    queries: std::ops::Range<usize>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), DspError> {
    const OP: &str = "attention_full";
    DspError::check_at_least(OP, "stride", head_dim, stride)?;
    DspError::check_at_least(OP, "out_stride", head_dim, out_stride)?;
    let need = if n == 0 { 0 } else { (n - 1) * stride + head_dim };
    DspError::check_at_least(OP, "q", need, q.len())?;
    DspError::check_at_least(OP, "k", need, k.len())?;
    DspError::check_at_least(OP, "v", need, v.len())?;
    DspError::check_at_least(OP, "scores", n, scores.len())?;
    if queries.end > n {
        return Err(DspError::InvalidArgument {
            op: OP,
            what: "queries",
            detail: format!("{queries:?} out of {n} positions"),
        });
    }
    let nq = queries.len();
    let out_need = if nq == 0 { 0 } else { (nq - 1) * out_stride + head_dim };
    DspError::check_at_least(OP, "out", out_need, out.len())?;
    let scores = &mut scores[..n];
    for (r, i) in queries.enumerate() {
        let qi = &q[i * stride..i * stride + head_dim];
        for (j, s) in scores.iter_mut().enumerate() {
            *s = be.vec_dot_f32(&k[j * stride..j * stride + head_dim], qi) * scale;
        }
        be.softmax_inplace(scores);
        let o = &mut out[r * out_stride..r * out_stride + head_dim];
        o.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            for (od, &vv) in o.iter_mut().zip(&v[j * stride..j * stride + head_dim]) {
                *od += p * vv;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_matches_torch_endpoints() {
        assert_eq!(linspace_f32(0.0, 7.0, 16, 0), 0.0);
        assert_eq!(linspace_f32(0.0, 7.0, 16, 15), 7.0);
        assert_eq!(linspace_f32(0.0, 7.0, 1, 0), 0.0);
    }

    #[test]
    fn antialias_taps_of_the_same_size_are_the_identity() {
        for (i, taps) in axis_taps(6, 6, Bilinear::Antialias).iter().enumerate() {
            let nonzero: Vec<_> = taps.iter().filter(|t| t.1 > 0.0).collect();
            assert_eq!(nonzero, vec![&(i, 1.0)]);
        }
    }
}
