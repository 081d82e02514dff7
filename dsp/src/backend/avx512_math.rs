//! AVX-512 elementwise transcendentals: the AVX2 backend's `exp` ([`super::avx2_math`]: f64
//! Cody–Waite reduction, degree-11 Taylor polynomial, correctly rounded to f32) on twice the
//! lanes, and the SiLU / SwiGLU / GELU (tanh form) / softmax built on it.
//!
//! Every element gets exactly the f32 and f64 operations of `avx2_math`, in its order (the
//! same rounding, clamping, reduction constants and masked-position rule), so the results are
//! the AVX2 backend's bit for bit (`tests/conformance.rs` checks it); only the vector width
//! differs. Lengths that are not a multiple of 16 run their tail through the same vector code
//! on a zero-padded copy, so every element gets the same operations wherever it sits.

use std::arch::x86_64::*;

use super::exp_consts::{INV_FACT, LN2_HI, LN2_LO};

/// `exp(x)` of 8 f64 lanes, `x` in `[−110, 90]`: `avx2_math::exp_pd` lane for lane.
///
/// # Safety
/// Needs avx512f.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exp_pd(x: __m512d) -> __m512d {
    let n = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_pd(x, _mm512_set1_pd(std::f64::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_HI), x);
    let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_LO), r);
    // Σ_{k≤11} r^k / k!, Horner from the top.
    let mut p = _mm512_set1_pd(INV_FACT[0]);
    for &inv_fact in &INV_FACT[1..] {
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(inv_fact));
    }
    // 2^n: n + 1023 into the exponent field (n in [−159, 130]: a normal f64).
    let ni = _mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(n));
    let two_n = _mm512_slli_epi64::<52>(_mm512_add_epi64(ni, _mm512_set1_epi64(1023)));
    _mm512_mul_pd(p, _mm512_castsi512_pd(two_n))
}

/// `exp(x)` of 16 f32 lanes, correctly rounded: `avx2_math::exp_ps` lane for lane.
///
/// # Safety
/// Needs avx512f.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exp_ps(x: __m512) -> __m512 {
    let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-110.0)), _mm512_set1_ps(90.0));
    let lo = exp_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    let hi = exp_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
        _mm512_castps_pd(x),
    ))));
    let lo = _mm512_castps256_ps512(_mm512_cvtpd_ps(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castps_pd(lo),
        _mm256_castps_pd(_mm512_cvtpd_ps(hi)),
    ))
}

/// `x / (1 + exp(−x))` of 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn silu_ps(x: __m512) -> __m512 {
    let e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
}

/// `x / (1 + exp(−z))`, `z = 2·√(2/π)·x·(1 + 0.044715·x²)` of 16 lanes, the scalar
/// `encoder::gelu_tanh`'s f32 operations in its order (no fusing).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gelu_tanh_ps(x: __m512) -> __m512 {
    use crate::encoder::{GELU_COEF_A, GELU_SQRT_8_OVER_PI};
    let cubic = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(GELU_COEF_A), x), x);
    let z = _mm512_mul_ps(
        _mm512_mul_ps(_mm512_set1_ps(GELU_SQRT_8_OVER_PI), x),
        _mm512_add_ps(_mm512_set1_ps(1.0), cubic),
    );
    let e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), z));
    _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
}

/// `x ← f(x)` for every 16 lanes of `x`, the tail through `f` on a zero-padded copy.
#[inline(always)]
unsafe fn map16(x: &mut [f32], f: impl Fn(__m512) -> __m512) {
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        _mm512_storeu_ps(c.as_mut_ptr(), f(_mm512_loadu_ps(c.as_ptr())));
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [0f32; 16];
        buf[..tail.len()].copy_from_slice(tail);
        _mm512_storeu_ps(buf.as_mut_ptr(), f(_mm512_loadu_ps(buf.as_ptr())));
        tail.copy_from_slice(&buf[..tail.len()]);
    }
}

/// `x ← silu(x)` elementwise.
///
/// # Safety
/// Needs avx512f, avx2, fma.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn silu_inplace(x: &mut [f32]) {
    map16(x, |v| unsafe { silu_ps(v) })
}

/// `x ← gelu_tanh(x)` elementwise.
///
/// # Safety
/// Needs avx512f, avx2, fma.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn gelu_tanh_inplace(x: &mut [f32]) {
    map16(x, |v| unsafe { gelu_tanh_ps(v) })
}

/// `out = silu(gate) · up` elementwise over the shortest of the three slices.
///
/// # Safety
/// Needs avx512f, avx2, fma.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len().min(up.len()).min(out.len());
    let mut i = 0;
    while i + 16 <= n {
        let g = silu_ps(_mm512_loadu_ps(gate.as_ptr().add(i)));
        _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_mul_ps(g, _mm512_loadu_ps(up.as_ptr().add(i))));
        i += 16;
    }
    if i < n {
        let (mut g, mut u) = ([0f32; 16], [0f32; 16]);
        g[..n - i].copy_from_slice(&gate[i..n]);
        u[..n - i].copy_from_slice(&up[i..n]);
        let y = _mm512_mul_ps(silu_ps(_mm512_loadu_ps(g.as_ptr())), _mm512_loadu_ps(u.as_ptr()));
        _mm512_storeu_ps(g.as_mut_ptr(), y);
        out[i..n].copy_from_slice(&g[..n - i]);
    }
}

/// In-place softmax with [`exp_ps`]: `exp(x_i − max)` (exactly 0 at `−inf`), the sum in f64
/// ([`crate::ops::sum_f64_by_lanes`]), then a multiply by `(1/sum) as f32`:
/// `avx2_math::softmax_inplace` element for element.
///
/// # Safety
/// Needs avx512f, avx2, fma.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn softmax_inplace(x: &mut [f32]) {
    let max = crate::ops::max_f32(x);
    if max == f32::NEG_INFINITY {
        return;
    }
    let m = _mm512_set1_ps(max);
    map16(x, |v| unsafe {
        // exp(−inf − max) must be exactly 0 (masked positions), not the clamped exp(−87.3).
        let live = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(v, _mm512_set1_ps(f32::NEG_INFINITY));
        _mm512_maskz_mov_ps(live, exp_ps(_mm512_sub_ps(v, m)))
    });
    let inv = (1.0 / crate::ops::sum_f64_by_lanes(x)) as f32;
    let iv = _mm512_set1_ps(inv);
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        _mm512_storeu_ps(c.as_mut_ptr(), _mm512_mul_ps(_mm512_loadu_ps(c.as_ptr()), iv));
    }
    for v in chunks.into_remainder() {
        *v *= inv;
    }
}
