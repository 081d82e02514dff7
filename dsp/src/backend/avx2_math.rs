//! AVX2 elementwise transcendentals: `exp` evaluated in f64 and rounded to f32, and the SiLU /
//! SwiGLU / softmax built on it with the same f32 operations as the scalar backend.
//!
//! `exp` (Cody–Waite range reduction `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, a degree-11 Taylor
//! polynomial, `2^n` through the exponent bits; textbook, e.g. Muller, "Elementary
//! Functions", ch. 11) has a relative error below 1e-14 before the final rounding, so the f32
//! result is the correctly rounded `exp(x)`: it equals the platform's `expf` (glibc: < 0.502
//! ulp) except where that one misrounds, and the activations built on it match the scalar
//! reference bit for bit almost everywhere (the model parity tests against llama.cpp are
//! sensitive at near-ties, see `device-worker/tests/parity.rs`). Inputs are clamped to
//! `[−110, 90]`, where the f32 result is already 0 or +inf.
//!
//! Lengths that are not a multiple of 8 run their tail through the same vector code on a
//! zero-padded copy, so every element gets the same operations wherever it sits in a slice:
//! a decode step and a prefill row give bit-identical results.

use std::arch::x86_64::*;

use super::exp_consts::{INV_FACT, LN2_HI, LN2_LO};

/// `exp(x)` of 4 f64 lanes, `x` in `[−110, 90]` (relative error < 1e-14).
///
/// # Safety
/// Needs avx2, fma.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_pd(x: __m256d) -> __m256d {
    let n = _mm256_round_pd(
        _mm256_mul_pd(x, _mm256_set1_pd(std::f64::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_HI), x);
    let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_LO), r);
    // Σ_{k≤11} r^k / k!, Horner from the top.
    let mut p = _mm256_set1_pd(INV_FACT[0]);
    for &inv_fact in &INV_FACT[1..] {
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(inv_fact));
    }
    // 2^n: n + 1023 into the exponent field (n in [−159, 130]: a normal f64).
    let ni = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n));
    let two_n = _mm256_slli_epi64(_mm256_add_epi64(ni, _mm256_set1_epi64x(1023)), 52);
    _mm256_mul_pd(p, _mm256_castsi256_pd(two_n))
}

/// `exp(x)` of 8 f32 lanes, correctly rounded (see the module docs).
///
/// # Safety
/// Needs avx2, fma.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn exp_ps(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-110.0)),
        _mm256_set1_ps(90.0),
    );
    let lo = exp_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    let hi = exp_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
    _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo))
}

/// `x / (1 + exp(−x))` of 8 lanes.
///
/// # Safety
/// Needs avx2, fma.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn silu_ps(x: __m256) -> __m256 {
    let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

/// `x ← silu(x)` elementwise.
///
/// # Safety
/// Needs avx2, fma, f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn silu_inplace(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        _mm256_storeu_ps(c.as_mut_ptr(), silu_ps(_mm256_loadu_ps(c.as_ptr())));
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [0f32; 8];
        buf[..tail.len()].copy_from_slice(tail);
        _mm256_storeu_ps(buf.as_mut_ptr(), silu_ps(_mm256_loadu_ps(buf.as_ptr())));
        tail.copy_from_slice(&buf[..tail.len()]);
    }
}

/// `x / (1 + exp(−z))`, `z = 2·√(2/π)·x·(1 + 0.044715·x²)` of 8 lanes: the scalar
/// `encoder::gelu_tanh`'s f32 operations in its order (no fusing), [`exp_ps`] for `exp`.
///
/// # Safety
/// Needs avx2, fma.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gelu_tanh_ps(x: __m256) -> __m256 {
    use crate::encoder::{GELU_COEF_A, GELU_SQRT_8_OVER_PI};
    let cubic = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_COEF_A), x), x);
    let z = _mm256_mul_ps(
        _mm256_mul_ps(_mm256_set1_ps(GELU_SQRT_8_OVER_PI), x),
        _mm256_add_ps(_mm256_set1_ps(1.0), cubic),
    );
    let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), z));
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

/// `x ← gelu_tanh(x)` elementwise, the tail through the same vector code.
///
/// # Safety
/// Needs avx2, fma, f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gelu_tanh_inplace(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        _mm256_storeu_ps(c.as_mut_ptr(), gelu_tanh_ps(_mm256_loadu_ps(c.as_ptr())));
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [0f32; 8];
        buf[..tail.len()].copy_from_slice(tail);
        _mm256_storeu_ps(buf.as_mut_ptr(), gelu_tanh_ps(_mm256_loadu_ps(buf.as_ptr())));
        tail.copy_from_slice(&buf[..tail.len()]);
    }
}

/// `out = silu(gate) · up` elementwise; the three slices have equal length.
///
/// # Safety
/// Needs avx2, fma, f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len().min(up.len()).min(out.len());
    let mut i = 0;
    while i + 8 <= n {
        let g = silu_ps(_mm256_loadu_ps(gate.as_ptr().add(i)));
        let y = _mm256_mul_ps(g, _mm256_loadu_ps(up.as_ptr().add(i)));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
        i += 8;
    }
    if i < n {
        let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
        g[..n - i].copy_from_slice(&gate[i..n]);
        u[..n - i].copy_from_slice(&up[i..n]);
        let y = _mm256_mul_ps(
            silu_ps(_mm256_loadu_ps(g.as_ptr())),
            _mm256_loadu_ps(u.as_ptr()),
        );
        _mm256_storeu_ps(g.as_mut_ptr(), y);
        out[i..n].copy_from_slice(&g[..n - i]);
    }
}

/// In-place softmax with [`exp_ps`]: `exp(x_i − max)`, the sum in f64
/// ([`crate::ops::sum_f64_by_lanes`]), then a multiply by `(1/sum) as f32` (the contract of
/// `KernelBackend::softmax_inplace`).
///
/// # Safety
/// Needs avx2, fma, f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn softmax_inplace(x: &mut [f32]) {
    let max = crate::ops::max_f32(x);
    if max == f32::NEG_INFINITY {
        return;
    }
    let m = _mm256_set1_ps(max);
    // exp(−inf − max) must be exactly 0 (masked positions), not the clamped exp(−87.3).
    let exp_shifted = |v: __m256| -> __m256 {
        let e = exp_ps(_mm256_sub_ps(v, m));
        let live = _mm256_cmp_ps(v, _mm256_set1_ps(f32::NEG_INFINITY), _CMP_NEQ_OQ);
        _mm256_and_ps(e, live)
    };
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        _mm256_storeu_ps(c.as_mut_ptr(), exp_shifted(_mm256_loadu_ps(c.as_ptr())));
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [0f32; 8];
        buf[..tail.len()].copy_from_slice(tail);
        _mm256_storeu_ps(buf.as_mut_ptr(), exp_shifted(_mm256_loadu_ps(buf.as_ptr())));
        tail.copy_from_slice(&buf[..tail.len()]);
    }
    let sum = crate::ops::sum_f64_by_lanes(x);
    let inv = _mm256_set1_ps((1.0 / sum) as f32);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        _mm256_storeu_ps(
            c.as_mut_ptr(),
            _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), inv),
        );
    }
    let inv = (1.0 / sum) as f32;
    for v in chunks.into_remainder() {
        *v *= inv;
    }
}
