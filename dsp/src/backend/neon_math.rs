//! NEON elementwise transcendentals: the `exp` of [`super::avx2_math`] (evaluated in f64:
//! Cody–Waite reduction, degree-11 Taylor polynomial by fused Horner steps, `2^n` through the
//! exponent bits, then rounded to f32: correctly rounded, see there) with the same operations
//! lane for lane, so SiLU, SwiGLU and softmax equal the AVX2 backend's bit for bit.
//!
//! Every element gets the same operations wherever it sits: whole 4-lane vectors, and a tail
//! through the same vector code on a zero-padded copy (a decode step equals a prefill row).

use std::arch::aarch64::*;

use super::exp_consts::{INV_FACT, LN2_HI, LN2_LO};

/// `exp(x)` of 2 f64 lanes, `x` in `[−110, 90]` (relative error < 1e-14).
#[inline(always)]
unsafe fn exp_pd(x: float64x2_t) -> float64x2_t {
    // The literals of `avx2_math::exp_pd` (`super::exp_consts`).
    // Round to nearest, ties to even (as `_MM_FROUND_TO_NEAREST_INT`).
    let n = vrndnq_f64(vmulq_f64(x, vdupq_n_f64(std::f64::consts::LOG2_E)));
    let r = vfmsq_f64(x, n, vdupq_n_f64(LN2_HI));
    let r = vfmsq_f64(r, n, vdupq_n_f64(LN2_LO));
    let mut p = vdupq_n_f64(INV_FACT[0]);
    for &inv_fact in &INV_FACT[1..] {
        p = vfmaq_f64(vdupq_n_f64(inv_fact), p, r);
    }
    // 2^n: n + 1023 into the exponent field (n in [−159, 130]: a normal f64).
    let ni = vcvtq_s64_f64(n);
    let two_n = vshlq_n_s64::<52>(vaddq_s64(ni, vdupq_n_s64(1023)));
    vmulq_f64(p, vreinterpretq_f64_s64(two_n))
}

/// `exp(x)` of 4 f32 lanes, correctly rounded; inputs clamped to `[−110, 90]` as the x86
/// `max_ps` / `min_ps` do (a NaN lane becomes −110).
#[inline(always)]
pub(super) unsafe fn exp_ps(x: float32x4_t) -> float32x4_t {
    let lo_c = vdupq_n_f32(-110.0);
    let hi_c = vdupq_n_f32(90.0);
    let x = vbslq_f32(vcgtq_f32(x, lo_c), x, lo_c);
    let x = vbslq_f32(vcltq_f32(x, hi_c), x, hi_c);
    let lo = exp_pd(vcvt_f64_f32(vget_low_f32(x)));
    let hi = exp_pd(vcvt_high_f64_f32(x));
    vcvt_high_f32_f64(vcvt_f32_f64(lo), hi)
}

/// `x / (1 + exp(−x))` of 4 lanes.
#[inline(always)]
unsafe fn silu_ps(x: float32x4_t) -> float32x4_t {
    let e = exp_ps(vsubq_f32(vdupq_n_f32(0.0), x));
    vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), e))
}

/// `x / (1 + exp(−z))`, `z = 2·√(2/π)·x·(1 + 0.044715·x²)` of 4 lanes: the scalar
/// `encoder::gelu_tanh`'s f32 operations in its order (no fusing), [`exp_ps`] for `exp`.
#[inline(always)]
unsafe fn gelu_tanh_ps(x: float32x4_t) -> float32x4_t {
    use crate::encoder::{GELU_COEF_A, GELU_SQRT_8_OVER_PI};
    let cubic = vmulq_f32(vmulq_f32(vdupq_n_f32(GELU_COEF_A), x), x);
    let z = vmulq_f32(vmulq_f32(vdupq_n_f32(GELU_SQRT_8_OVER_PI), x), vaddq_f32(vdupq_n_f32(1.0), cubic));
    let e = exp_ps(vsubq_f32(vdupq_n_f32(0.0), z));
    vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), e))
}

/// `f` over `x` in place, 4 lanes at a time, the tail zero-padded.
#[inline(always)]
unsafe fn map_inplace(x: &mut [f32], f: impl Fn(float32x4_t) -> float32x4_t) {
    let mut chunks = x.chunks_exact_mut(4);
    for c in &mut chunks {
        vst1q_f32(c.as_mut_ptr(), f(vld1q_f32(c.as_ptr())));
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [0f32; 4];
        buf[..tail.len()].copy_from_slice(tail);
        vst1q_f32(buf.as_mut_ptr(), f(vld1q_f32(buf.as_ptr())));
        tail.copy_from_slice(&buf[..tail.len()]);
    }
}

/// `x ← silu(x)` elementwise.
pub(super) fn silu_inplace(x: &mut [f32]) {
    // SAFETY: NEON is baseline on aarch64; `map_inplace` stays within the slice.
    unsafe { map_inplace(x, |v| silu_ps(v)) }
}

/// `x ← gelu_tanh(x)` elementwise.
pub(super) fn gelu_tanh_inplace(x: &mut [f32]) {
    // SAFETY: NEON is baseline on aarch64; `map_inplace` stays within the slice.
    unsafe { map_inplace(x, |v| gelu_tanh_ps(v)) }
}

/// `out = silu(gate) · up` elementwise; the three slices have equal length.
pub(super) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len().min(up.len()).min(out.len());
    let mut i = 0;
    // SAFETY: NEON is baseline; every access is below `n` (the tail goes through buffers).
    unsafe {
        while i + 4 <= n {
            let g = silu_ps(vld1q_f32(gate.as_ptr().add(i)));
            vst1q_f32(
                out.as_mut_ptr().add(i),
                vmulq_f32(g, vld1q_f32(up.as_ptr().add(i))),
            );
            i += 4;
        }
        if i < n {
            let (mut g, mut u) = ([0f32; 4], [0f32; 4]);
            g[..n - i].copy_from_slice(&gate[i..n]);
            u[..n - i].copy_from_slice(&up[i..n]);
            let y = vmulq_f32(silu_ps(vld1q_f32(g.as_ptr())), vld1q_f32(u.as_ptr()));
            vst1q_f32(g.as_mut_ptr(), y);
            out[i..n].copy_from_slice(&g[..n - i]);
        }
    }
}

/// In-place softmax with [`exp_ps`]: `exp(x_i − max)` (exactly 0 for `−inf` entries), the sum
/// in f64 ([`crate::ops::sum_f64_by_lanes`]), then a multiply by `(1/sum) as f32`.
pub(super) fn softmax_inplace(x: &mut [f32]) {
    let max = crate::ops::max_f32(x);
    if max == f32::NEG_INFINITY {
        return;
    }
    // SAFETY: NEON is baseline; `map_inplace` stays within the slice.
    unsafe {
        let m = vdupq_n_f32(max);
        let ninf = vdupq_n_f32(f32::NEG_INFINITY);
        map_inplace(x, |v| {
            let e = exp_ps(vsubq_f32(v, m));
            // `v > −inf`: false for −inf and NaN (the x86 `_CMP_NEQ_OQ` mask).
            let live = vcgtq_f32(v, ninf);
            vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), live))
        });
    }
    let inv = (1.0 / crate::ops::sum_f64_by_lanes(x)) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}
