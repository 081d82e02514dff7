//! Row operations of the forward pass: RMS norm, rotary position embedding (RoPE, `norm` and
//! `neox` layouts, interleaved multimodal `imrope`), softmax, SiLU / SwiGLU, residual add, and single-head attention over an f16
//! KV cache. Numerics follow ggml's CPU ops (`ggml/src/ggml-cpu/ops.cpp`, `vec.h`).
//!
//! Kernels that matter for speed (RMS norm, add, the attention dot products and value
//! accumulation) go through the selected [`KernelBackend`]; the transcendental ops (softmax,
//! SiLU) use libm `expf` on every backend, which equals ggml's scalar path (ggml's SIMD path
//! uses its own polynomial `expf`, which we do not reproduce).

use half::f16;

use crate::backend::{select, AttnTile, KernelBackend};
use crate::error::DspError;

/// RMS normalisation of each row: `out = (x / sqrt(mean(x²) + eps)) * w`.
///
/// Shapes: `x`, `out`: `[n_rows, d]` row-major with `d = w.len()`. Follows ggml
/// `ggml_compute_forward_rms_norm_f32` (sum of squares in f64, `scale = 1/sqrtf(mean + eps)`,
/// `x * scale`) followed by `ggml_mul` with the weight (Zhang & Sennrich 2019, RMSNorm).
///
/// # Errors
/// `LengthMismatch` if `x.len()` is not a multiple of `w.len()` or `out.len() != x.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) -> Result<(), DspError> {
    rms_norm_with(select(), x, w, eps, out)
}

/// [`rms_norm`] with an explicit backend.
///
/// # Errors
/// As [`rms_norm`].
pub fn rms_norm_with(
    be: &dyn KernelBackend,
    x: &[f32],
    w: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), DspError> {
    for (xr, or) in row_pairs("rms_norm", x, w.len(), out)? {
        be.rms_norm_row(xr, w, eps, or);
    }
    Ok(())
}

/// The rows of a row-wise op `op` (a norm): pairs of `d`-value rows of `x` and of `out`.
///
/// # Errors
/// `LengthMismatch` naming `op` if `out.len() != x.len()` or `x.len()` is not a multiple of
/// `d` (with `d == 0`, unless `x` is empty: then there are no rows).
pub(crate) fn row_pairs<'a>(
    op: &'static str,
    x: &'a [f32],
    d: usize,
    out: &'a mut [f32],
) -> Result<impl Iterator<Item = (&'a [f32], &'a mut [f32])>, DspError> {
    DspError::check_len(op, "out", x.len(), out.len())?;
    if d == 0 {
        DspError::check_len(op, "x", 0, x.len())?;
    } else {
        DspError::check_len(op, "x (multiple of w.len())", x.len().next_multiple_of(d), x.len())?;
    }
    // `max(1)`: with `d == 0` both are empty here, and no rows come out.
    Ok(x.chunks_exact(d.max(1)).zip(out.chunks_exact_mut(d.max(1))))
}

/// Rotation angles `(cos θ_i, sin θ_i)` for `i in 0..n_rot/2` with `θ_i = pos * base^(-2i/n_rot)`,
/// computed as ggml `ggml_rope_cache_init`: `theta_scale = powf(base, -2/n_rot)` and
/// `θ_{i+1} = θ_i * theta_scale` in f32 from `θ_0 = pos` (YaRN with `ext_factor = 0`,
/// `freq_scale = 1`, `attn_factor = 1`; Su et al. 2021, RoFormer).
pub fn rope_angles(n_rot: usize, pos: u32, freq_base: f32) -> Vec<(f32, f32)> {
    let theta_scale = freq_base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    let mut out = Vec::with_capacity(n_rot / 2);
    for _ in 0..n_rot / 2 {
        out.push((theta.cos(), theta.sin()));
        theta *= theta_scale;
    }
    out
}

fn check_rope(x: &[f32], n_heads: usize, head_dim: usize, n_rot: usize) -> Result<(), DspError> {
    const OP: &str = "rope";
    DspError::check_len(OP, "x", n_heads * head_dim, x.len())?;
    if !n_rot.is_multiple_of(2) || n_rot > head_dim {
        return Err(DspError::InvalidArgument {
            op: OP,
            what: "n_rot_dims",
            detail: format!("{n_rot} must be even and at most head_dim {head_dim}"),
        });
    }
    Ok(())
}

/// RoPE with adjacent pairs (`LLAMA_ROPE_TYPE_NORM`, arch `llama`): for each head, pair
/// `(x[2i], x[2i+1])` for `2i < n_rot_dims` is rotated by `θ_i` (see [`rope_angles`]);
/// dimensions from `n_rot_dims` on are left as they are.
///
/// Shapes: `x`: `[n_heads, head_dim]` of one token at position `pos`.
///
/// # Errors
/// `LengthMismatch` if `x.len() != n_heads * head_dim`; `InvalidArgument` if `n_rot_dims` is
/// odd or exceeds `head_dim`.
pub fn rope_norm(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot_dims: usize,
    pos: u32,
    freq_base: f32,
) -> Result<(), DspError> {
    check_rope(x, n_heads, head_dim, n_rot_dims)?;
    let cs = rope_angles(n_rot_dims, pos, freq_base);
    rotate_pairs(x, head_dim, &cs, |i| (2 * i, 2 * i + 1));
    Ok(())
}

/// RoPE with split halves (`LLAMA_ROPE_TYPE_NEOX`, qwen): for each head, pair
/// `(x[i], x[i + n_rot_dims/2])` for `i < n_rot_dims/2` is rotated by `θ_i`; dimensions from
/// `n_rot_dims` on are left as they are.
///
/// Shapes and errors as [`rope_norm`].
///
/// # Errors
/// As [`rope_norm`].
pub fn rope_neox(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot_dims: usize,
    pos: u32,
    freq_base: f32,
) -> Result<(), DspError> {
    check_rope(x, n_heads, head_dim, n_rot_dims)?;
    let cs = rope_angles(n_rot_dims, pos, freq_base);
    let half = n_rot_dims / 2;
    rotate_pairs(x, head_dim, &cs, |i| (i, i + half));
    Ok(())
}

/// Rotation angles of interleaved multimodal RoPE (ggml `GGML_ROPE_TYPE_IMROPE`, Qwen3-VL
/// and Qwen3.5; Hugging Face `apply_interleaved_mrope`): `(cos θ_i, sin θ_i)` for `i in
/// 0..n_rot/2` where pair `i` takes its angle from axis `i mod 3` of `pos` = (t, h, w) while
/// `i < 3·sections[axis]`, `θ_i = pos[axis] · base^(-2i/n_rot)`. Each axis's angles are the
/// f32 sequence of [`rope_angles`] (`θ_{i+1} = θ_i · theta_scale` from `θ_0 = pos[axis]`), as
/// ggml `ggml_mrope_cache_init` computes them, so `pos = (p, p, p)` gives exactly
/// [`rope_angles`]`(n_rot, p, base)`.
///
/// # Errors
/// `InvalidArgument` unless `sections` sums to `n_rot / 2` and puts every pair in one of the
/// three (ggml's fourth section, unused by these models, is not supported).
pub fn mrope_angles(
    n_rot: usize,
    pos: [u32; 3],
    sections: [usize; 3],
    freq_base: f32,
) -> Result<Vec<(f32, f32)>, DspError> {
    if sections.iter().sum::<usize>() != n_rot / 2 {
        return Err(DspError::InvalidArgument {
            op: "rope_imrope",
            what: "sections",
            detail: format!("{sections:?} must sum to n_rot / 2 = {}", n_rot / 2),
        });
    }
    let theta_scale = freq_base.powf(-2.0 / n_rot as f32);
    let mut theta = pos.map(|p| p as f32);
    let mut out = Vec::with_capacity(n_rot / 2);
    for i in 0..n_rot / 2 {
        // ggml's order: h, w, t; a pair in none of them would take ggml's fourth
        // (unsupported) section.
        let axis = [1, 2, 0]
            .into_iter()
            .find(|&a| i % 3 == a && i < 3 * sections[a])
            .ok_or_else(|| DspError::InvalidArgument {
                op: "rope_imrope",
                what: "sections",
                detail: format!("{sections:?} leave rotary pair {i} in no section"),
            })?;
        out.push((theta[axis].cos(), theta[axis].sin()));
        for t in &mut theta {
            *t *= theta_scale;
        }
    }
    Ok(out)
}

/// Interleaved multimodal RoPE (ggml `GGML_ROPE_TYPE_IMROPE`) with split halves as
/// [`rope_neox`]: for each head, pair `(x[i], x[i + n_rot_dims/2])` is rotated by the angle
/// of [`mrope_angles`] for the position triple `pos` = (t, h, w). A text token's `(p, p, p)`
/// rotates exactly as [`rope_neox`] at `p`.
///
/// Shapes: `x`: `[n_heads, head_dim]` of one token.
///
/// # Errors
/// As [`rope_norm`] and [`mrope_angles`].
pub fn rope_imrope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot_dims: usize,
    pos: [u32; 3],
    sections: [usize; 3],
    freq_base: f32,
) -> Result<(), DspError> {
    check_rope(x, n_heads, head_dim, n_rot_dims)?;
    let cs = mrope_angles(n_rot_dims, pos, sections, freq_base)?;
    let half = n_rot_dims / 2;
    rotate_pairs(x, head_dim, &cs, |i| (i, i + half));
    Ok(())
}

/// RoPE's rotation: in each `head_dim`-value head of `x`, the pair `(x[a], x[b])` with
/// `(a, b) = pair(i)` is rotated by `θ_i` for each `(cos θ_i, sin θ_i)` of `cs`:
/// `(x_a·cos − x_b·sin, x_a·sin + x_b·cos)` in f32.
pub(crate) fn rotate_pairs(x: &mut [f32], head_dim: usize, cs: &[(f32, f32)], pair: impl Fn(usize) -> (usize, usize)) {
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in cs.iter().enumerate() {
            let (a, b) = pair(i);
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}

/// In-place softmax: `x_i = exp(x_i - max) / sum_j exp(x_j - max)`, the sum in f64
/// ([`sum_f64_by_lanes`]) and the division as a multiply by `(1/sum) as f32` (ggml
/// `ggml_vec_soft_max_f32` + `ggml_vec_scale_f32`, which also sums in double, by SIMD chunks).
/// `-inf` entries (masked) become 0. An empty slice is left alone.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = max_f32(x);
    if max == f32::NEG_INFINITY {
        return;
    }
    for v in x.iter_mut() {
        *v = (*v - max).exp();
    }
    let inv = (1.0 / sum_f64_by_lanes(x)) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Lanes of [`max_f32`] and [`sum_f64_by_lanes`].
const SUM_LANES: usize = 8;

/// The largest element of `x` ignoring NaNs (`f32::max`), `-inf` for an empty slice or one of
/// NaNs and `-inf` only. Kept in [`SUM_LANES`] independent lanes (the compiler turns them into
/// vector maxima): the maximum does not depend on the order (only the sign of a zero
/// maximum might, and `v - max` is the same for `±0`), so every backend's softmax may use it.
pub fn max_f32(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; SUM_LANES];
    let mut chunks = x.chunks_exact(SUM_LANES);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    for (m, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *m = m.max(v);
    }
    lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

/// `Σ x_i` in f64, as softmax sums its exponentials: lane `l` of [`SUM_LANES`] (8) adds the
/// elements `i ≡ l (mod 8)` in increasing `i` from `0.0`, then the lanes are added in order
/// `((l0 + l1) + l2) + …`. For 8 elements or fewer that is the plain sum in element order;
/// for more, eight independent chains (the compiler's f64 vectors) instead of one chain of
/// `n` dependent adds, which cost as much as the scores of a 4000-key attention row. The
/// one definition for every backend, so their softmax sums are the same bits.
pub fn sum_f64_by_lanes(x: &[f32]) -> f64 {
    let mut lanes = [0f64; SUM_LANES];
    let mut chunks = x.chunks_exact(SUM_LANES);
    for c in &mut chunks {
        for (s, &v) in lanes.iter_mut().zip(c) {
            *s += f64::from(v);
        }
    }
    for (s, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *s += f64::from(v);
    }
    lanes.iter().fold(0.0, |a, &l| a + l)
}

/// SiLU `x / (1 + exp(-x))` (ggml `ggml_silu_f32`; Elfwing et al. 2017).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// [`silu`] on every element, with the selected backend (SIMD backends compute `exp` in
/// their own way, ≤ 1 ulp from the platform's `expf`; see [`KernelBackend::silu_inplace`]).
pub fn silu_inplace(x: &mut [f32]) {
    select().silu_inplace(x);
}

/// SwiGLU: `out = silu(gate) * up` elementwise (ggml `ggml_vec_swiglu_f32`; Shazeer 2020),
/// with the selected backend (see [`KernelBackend::swiglu`]).
///
/// # Errors
/// `LengthMismatch` unless the three slices have equal length.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), DspError> {
    DspError::check_len("swiglu", "up", gate.len(), up.len())?;
    DspError::check_len("swiglu", "out", gate.len(), out.len())?;
    select().swiglu(gate, up, out);
    Ok(())
}

/// `dst += src` elementwise (residual connections).
///
/// # Errors
/// `LengthMismatch` unless the slices have equal length.
pub fn add_inplace(dst: &mut [f32], src: &[f32]) -> Result<(), DspError> {
    DspError::check_len("add_inplace", "src", dst.len(), src.len())?;
    select().add_inplace(dst, src);
    Ok(())
}

/// Attention of one query head over `n_ctx` cached positions:
/// `out = softmax(scale * (q16 · k_j))_j · v_j`, with `q` rounded to f16 before the dot (as
/// ggml's f16 `vec_dot` on an f16 KV cache), the dots summed in f32 (f64 on the scalar
/// backend), the backend's softmax ([`KernelBackend::softmax_inplace`]) and the values
/// accumulated in f32.
///
/// Shapes: `q`: `[head_dim]`; `k`, `v`: `[n_ctx, head_dim]` row-major f16; `scores_scratch`:
/// at least `n_ctx` (overwritten with the attention weights); `out`: `[head_dim]`. Callers
/// apply causality by passing only the visible span.
///
/// # Errors
/// `LengthMismatch` on any shape mismatch.
pub fn attention_head(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    n_ctx: usize,
    scale: f32,
    scores_scratch: &mut [f32],
    out: &mut [f32],
) -> Result<(), DspError> {
    let hd = q.len();
    attention_head_strided(select(), q, k, v, n_ctx, hd, scale, scores_scratch, out)
}

/// Attention of several queries against one KV head (a tile of grouped-query attention: the
/// query heads that share this KV head, for a few consecutive tokens), each query `i` seeing
/// the first `n_ctx[i]` cached positions. Every K and V row is read once for all queries
/// while it is in L1, instead of once per (token, head). After the checks below, `qs` is
/// rounded to f16 and the tile runs as [`KernelBackend::attention_queries`] (SIMD backends:
/// register-blocked kernels that load each K and V chunk once for several queries).
///
/// Each query gets exactly the operations of [`attention_head_strided`] (the same dots, the
/// same softmax, the values accumulated in position order), so results are bit-identical to
/// it whatever the tile.
///
/// Shapes: `qs`: `[n_q, head_dim]`; `n_ctx`: `[n_q]`, each ≥ 1; `k`, `v`: `[>= max n_ctx,
/// head_dim]` row-major f16 (one head, contiguous); `scores_scratch`: at least
/// `n_q * max(n_ctx)`; `out`: `[n_q, head_dim]`.
///
/// # Errors
/// `LengthMismatch` on any shape mismatch; `InvalidArgument` if some `n_ctx[i] == 0`.
#[allow(clippy::too_many_arguments)]
pub fn attention_queries(
    be: &dyn KernelBackend,
    qs: &[f32],
    n_ctx: &[usize],
    head_dim: usize,
    k: &[f16],
    v: &[f16],
    scale: f32,
    scores_scratch: &mut [f32],
    out: &mut [f32],
) -> Result<(), DspError> {
    const OP: &str = "attention_queries";
    let (n_q, hd) = (n_ctx.len(), head_dim);
    DspError::check_len(OP, "qs", n_q * hd, qs.len())?;
    DspError::check_len(OP, "out", n_q * hd, out.len())?;
    if n_ctx.contains(&0) {
        return Err(DspError::InvalidArgument {
            op: OP,
            what: "n_ctx",
            detail: "every query must see at least one position".into(),
        });
    }
    let max_ctx = n_ctx.iter().copied().max().unwrap_or(0);
    DspError::check_at_least(OP, "k", max_ctx * hd, k.len())?;
    DspError::check_at_least(OP, "v", max_ctx * hd, v.len())?;
    DspError::check_at_least(OP, "scores_scratch", n_q * max_ctx, scores_scratch.len())?;
    let q16: Vec<f16> = qs.iter().map(|&x| f16::from_f32(x)).collect();
    let tile = AttnTile {
        q16: &q16,
        n_ctx,
        head_dim: hd,
        k,
        v,
        scale,
    };
    be.attention_queries(&tile, scores_scratch, out);
    Ok(())
}

/// [`attention_head`] with an explicit backend and a row stride: cached position `j` of this
/// head starts at `k[j * row_stride]` (and `v[j * row_stride]`), so one head can be read out of
/// a `[n_ctx, n_kv_heads * head_dim]` cache by offsetting the slices by `head * head_dim`.
///
/// # Errors
/// `LengthMismatch` if `k` or `v` is shorter than `(n_ctx - 1) * row_stride + head_dim`, if
/// `row_stride < head_dim` (reported against `head_dim`), if `scores_scratch` is shorter than
/// `n_ctx` or `out.len() != q.len()`.
#[allow(clippy::too_many_arguments)]
pub fn attention_head_strided(
    be: &dyn KernelBackend,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    n_ctx: usize,
    row_stride: usize,
    scale: f32,
    scores_scratch: &mut [f32],
    out: &mut [f32],
) -> Result<(), DspError> {
    const OP: &str = "attention_head";
    let hd = q.len();
    DspError::check_len(OP, "out", hd, out.len())?;
    DspError::check_at_least(OP, "row_stride", hd, row_stride)?;
    let need = if n_ctx == 0 {
        0
    } else {
        (n_ctx - 1) * row_stride + hd
    };
    DspError::check_at_least(OP, "k", need, k.len())?;
    DspError::check_at_least(OP, "v", need, v.len())?;
    DspError::check_at_least(OP, "scores_scratch", n_ctx, scores_scratch.len())?;
    out.fill(0.0);
    if n_ctx == 0 {
        return Ok(());
    }
    let q16: Vec<f16> = q.iter().map(|&x| f16::from_f32(x)).collect();
    let scores = &mut scores_scratch[..n_ctx];
    for (j, s) in scores.iter_mut().enumerate() {
        *s = be.vec_dot_f16(&k[j * row_stride..j * row_stride + hd], &q16) * scale;
    }
    be.softmax_inplace(scores);
    for (j, &p) in scores.iter().enumerate() {
        be.axpy_f16(out, p, &v[j * row_stride..j * row_stride + hd]);
    }
    Ok(())
}
