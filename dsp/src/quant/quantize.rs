//! Quantizers: the activation quantizers ggml's CPU matrix product applies before its integer
//! dot products (`quantize_row_q8_0_ref`, `quantize_row_q8_1_ref`, `quantize_row_q8_K_ref` in
//! `ggml/src/ggml-quants.c`), ggml's Q4_0/Q4_1 weight quantizers, and simple K-quant weight
//! quantizers for tests.
//!
//! Rounding: Q8_0/Q8_1 follow ggml's x86 SIMD quantizers (ties to even, `127/amax`); Q4 use C `roundf`-style
//! rounding (half away from zero, `f32::round`); Q8_K uses `nearest_int` (half to even,
//! `f32::round_ties_even`). Note: ggml's SIMD Q8_0/Q8_1 quantizers round half to even; the two
//! differ only when `x / d` is exactly halfway between integers.

use half::f16;

use super::blocks::{
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1, QK, QK_K,
};
use super::GgmlType;
use crate::error::DspError;

fn check_blocks(op: &'static str, ty: GgmlType, n: usize, n_blocks: usize) -> Result<(), DspError> {
    let bs = ty.block_size();
    if !n.is_multiple_of(bs) {
        return Err(DspError::NotBlockMultiple {
            op,
            ty,
            n,
            block: bs,
        });
    }
    DspError::check_len(op, "output blocks", n / bs, n_blocks)
}

/// Largest absolute value of a block.
fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Scale `d = amax / 127` and multiplier `id = 127 / amax` (0 for an all-zero block) of a
/// Q8_0/Q8_1 activation block. The multiplier is computed as ggml's x86 SIMD quantizers do
/// (`ggml-cpu/arch/x86/quants.c`: `127.f / max_scalar`, then `_MM_ROUND_NEAREST`, i.e. ties to
/// even), not as the portable `_ref` (`1/d`, `roundf`): llama.cpp on x86 quantizes this way, and
/// greedy parity with it depends on the exact int8 values.
fn q8_scales(xb: &[f32]) -> (f32, f32) {
    let m = amax(xb);
    (m / 127.0, if m != 0.0 { 127.0 / m } else { 0.0 })
}

/// Quantizes `x` (`32 * y.len()` values) to Q8_0: per block `d = amax / 127`,
/// `q = round_ties_even(x * (127 / amax))`, as ggml's x86 `quantize_row_q8_0` (see [`q8_scales`]).
/// On AVX2 through [`q8_block_avx2`], on aarch64 through NEON (`quantize_neon.rs`), both
/// bit-identical to the scalar loop.
///
/// # Errors
/// `NotBlockMultiple` / `LengthMismatch` on a bad `x` or `y` length.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) -> Result<(), DspError> {
    check_blocks("quantize_row_q8_0", GgmlType::Q8_0, x.len(), y.len())?;
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            // SAFETY: the CPU has AVX2 (checked just above); a chunk holds QK values.
            let (d, _) = unsafe { q8_block_avx2(xb, &mut yb.qs) };
            yb.d = f16::from_f32(d);
        }
        return Ok(());
    }
    #[cfg(target_arch = "aarch64")]
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        yb.d = f16::from_f32(super::quantize_neon::q8_block_neon(xb, &mut yb.qs).0);
    }
    #[cfg(not(target_arch = "aarch64"))]
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        yb.d = f16::from_f32(q8_block(xb, &mut yb.qs).0);
    }
    Ok(())
}

/// Quantizes `x` to Q8_1 (the activation type of Q4_1): as Q8_0 plus `s = sum(q) * d`,
/// ggml `quantize_row_q8_1_ref`. On AVX2 through [`q8_block_avx2`], on aarch64 through NEON
/// (`quantize_neon.rs`), bit-identical.
///
/// # Errors
/// `NotBlockMultiple` / `LengthMismatch` on a bad `x` or `y` length.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) -> Result<(), DspError> {
    check_blocks("quantize_row_q8_1", GgmlType::Q8_1, x.len(), y.len())?;
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            // SAFETY: the CPU has AVX2 (checked just above); a chunk holds QK values.
            let (d, sum) = unsafe { q8_block_avx2(xb, &mut yb.qs) };
            yb.d = f16::from_f32(d);
            yb.s = f16::from_f32(sum as f32 * d);
        }
        return Ok(());
    }
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        #[cfg(target_arch = "aarch64")]
        let (d, sum) = super::quantize_neon::q8_block_neon(xb, &mut yb.qs);
        #[cfg(not(target_arch = "aarch64"))]
        let (d, sum) = q8_block(xb, &mut yb.qs);
        yb.d = f16::from_f32(d);
        yb.s = f16::from_f32(sum as f32 * d);
    }
    Ok(())
}

/// One Q8_0/Q8_1 block (the scalar reference): `qs = round_ties_even(xb * id)` with the
/// scales of [`q8_scales`]; returns `(d, sum(qs))`. On aarch64 only the NEON twin runs.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
fn q8_block(xb: &[f32], qs: &mut [i8; QK]) -> (f32, i32) {
    let (d, id) = q8_scales(xb);
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(xb) {
        *q = round_ties_even_small(v * id) as i8;
        sum += *q as i32;
    }
    (d, sum)
}

/// [`q8_block`] on AVX2, bit-identical: `amax` as the maximum of the `|x|` bit patterns
/// (ordered as the values for non-NaN floats; NaN lanes count as 0, as `f32::max` skips
/// them), the same scalar `d` and `id`, `x * id` rounded to nearest-even by `round` (what the
/// magic-number rounding computes for these magnitudes), NaN products mapped to 0 (Rust's
/// `NaN as i8`); `|x * id| ≤ 127` (plus one rounding), so packing to i8 never saturates and
/// the i32 lane sums are the sum of the quants.
///
/// # Safety
/// Needs avx2; `xb.len() == QK`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q8_block_avx2(xb: &[f32], qs: &mut [i8; QK]) -> (f32, i32) {
    use std::arch::x86_64::*;
    debug_assert_eq!(xb.len(), QK);
    let p = xb.as_ptr();
    let abs_mask = _mm256_set1_epi32(0x7fff_ffff);
    let inf = _mm256_set1_epi32(0x7f80_0000);
    let mut m = _mm256_setzero_si256();
    for i in (0..QK).step_by(8) {
        let b = _mm256_and_si256(_mm256_loadu_si256(p.add(i).cast()), abs_mask);
        m = _mm256_max_epu32(m, _mm256_andnot_si256(_mm256_cmpgt_epi32(b, inf), b));
    }
    let m4 = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    let m2 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0b01_00_11_10));
    let m1 = _mm_max_epu32(m2, _mm_shuffle_epi32(m2, 0b10_11_00_01));
    let amax = f32::from_bits(_mm_cvtsi128_si32(m1) as u32);
    let (d, id) = (amax / 127.0, if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let vs = _mm256_set1_ps(id);
    let mut v = [_mm256_setzero_si256(); 4];
    for (k, vk) in v.iter_mut().enumerate() {
        let prod = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), vs);
        let r = _mm256_round_ps(prod, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        let ordered = _mm256_castps_si256(_mm256_cmp_ps(prod, prod, _CMP_ORD_Q));
        *vk = _mm256_and_si256(_mm256_cvtps_epi32(r), ordered);
    }
    let s8 = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
    let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01));
    // packs work within 128-bit halves: restore element order with one permute.
    let w = _mm256_packs_epi16(
        _mm256_packs_epi32(v[0], v[1]),
        _mm256_packs_epi32(v[2], v[3]),
    );
    let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs.as_mut_ptr().cast(), w);
    (d, _mm_cvtsi128_si32(s1))
}

/// Quantizes `x` (`256 * y.len()` values) to Q8_K: `iscale = -127 / max` where `max` is the
/// value of largest magnitude (first one on ties), `q = min(127, nearest_int(iscale * x))`,
/// `d = 1 / iscale`, `bsums` = sums of 16 quants; ggml `quantize_row_q8_K_ref`. On AVX2 and on
/// aarch64 NEON (`quantize_neon.rs`), bit-identical to the scalar loop.
///
/// # Errors
/// `NotBlockMultiple` / `LengthMismatch` on a bad `x` or `y` length.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) -> Result<(), DspError> {
    check_blocks("quantize_row_q8_k", GgmlType::Q8_K, x.len(), y.len())?;
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { quantize_q8_k_avx2(x, y) };
        return Ok(());
    }
    #[cfg(target_arch = "aarch64")]
    super::quantize_neon::quantize_q8_k_neon(x, y);
    #[cfg(not(target_arch = "aarch64"))]
    quantize_q8_k_blocks(x, y);
    Ok(())
}

/// [`quantize_q8_k_blocks`] on AVX2, bit-identical: the largest magnitude as a maximum of the
/// `|x|` bit patterns (ordered as the values for non-NaN floats; NaN lanes masked out, as the
/// reference's `>` skips them), the first element of that magnitude by compare + movemask,
/// `round` to nearest-even (what the reference's magic-number rounding computes for these
/// magnitudes), NaN products mapped to 0 (Rust's `NaN as i32`), `min(127)`.
///
/// # Safety
/// Needs avx2; `x.len() == y.len() * QK_K`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_q8_k_avx2(x: &[f32], y: &mut [BlockQ8K]) {
    use std::arch::x86_64::*;
    debug_assert_eq!(x.len(), y.len() * QK_K);
    let abs_mask = _mm256_set1_epi32(0x7fff_ffff);
    let inf = _mm256_set1_epi32(0x7f80_0000);
    let abs_bits = |p: *const f32| {
        let b = _mm256_and_si256(_mm256_loadu_si256(p.cast()), abs_mask);
        // NaN (|bits| > inf, compared as i32: both non-negative) counts as 0.
        _mm256_andnot_si256(_mm256_cmpgt_epi32(b, inf), b)
    };
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let p = xb.as_ptr();
        let mut m = _mm256_setzero_si256();
        for i in (0..QK_K).step_by(8) {
            m = _mm256_max_epu32(m, abs_bits(p.add(i)));
        }
        let m4 = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        let m2 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0b01_00_11_10));
        let m1 = _mm_max_epu32(m2, _mm_shuffle_epi32(m2, 0b10_11_00_01));
        let amax = _mm_cvtsi128_si32(m1) as u32;
        if amax == 0 {
            yb.d = 0.0;
            yb.qs = [0; QK_K];
            yb.bsums = [0; QK_K / 16];
            continue;
        }
        let target = _mm256_set1_epi32(amax as i32);
        let mut first = 0;
        for i in (0..QK_K).step_by(8) {
            let hit = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(abs_bits(p.add(i)), target)));
            if hit != 0 {
                first = i + hit.trailing_zeros() as usize;
                break;
            }
        }
        let iscale = -127.0 / xb[first];
        let vs = _mm256_set1_ps(iscale);
        let cap = _mm256_set1_epi32(127);
        let q = yb.qs.as_mut_ptr();
        for i in (0..QK_K).step_by(32) {
            let mut v = [_mm256_setzero_si256(); 4];
            for (k, vk) in v.iter_mut().enumerate() {
                let prod = _mm256_mul_ps(_mm256_loadu_ps(p.add(i + 8 * k)), vs);
                let r = _mm256_round_ps(prod, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                let ordered = _mm256_castps_si256(_mm256_cmp_ps(prod, prod, _CMP_ORD_Q));
                *vk = _mm256_min_epi32(_mm256_and_si256(_mm256_cvtps_epi32(r), ordered), cap);
            }
            // packs work within 128-bit halves: restore element order with one permute.
            let w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.add(i).cast(), w);
        }
        for (s, qs) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = qs.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}

/// The body of [`quantize_row_q8_k`] (lengths checked by the caller): ggml's
/// `quantize_row_q8_K_ref`. On aarch64 only the NEON twin runs.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
fn quantize_q8_k_blocks(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            yb.d = 0.0;
            yb.qs = [0; QK_K];
            yb.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (round_ties_even_small(iscale * v) as i32).min(127) as i8;
        }
        for (s, qs) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = qs.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}

/// `x` rounded to the nearest integer, ties to even, valid for `|x| < 2^22` (activation
/// quants are within ±128), as `f32::round_ties_even` but without its libm call (`rintf`
/// without SSE4.1 at the baseline target): adding and removing `1.5 · 2^23` leaves no
/// fraction bits, and IEEE round-to-nearest-even (Rust's only mode) does the rounding.
#[inline(always)]
pub fn round_ties_even_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// Quantizes weights to Q4_0: `d = max / -8` with `max` the value of largest magnitude,
/// `q = min(15, trunc(x / d + 8.5))`; ggml `quantize_row_q4_0_ref`.
///
/// # Errors
/// `NotBlockMultiple` / `LengthMismatch` on a bad `x` or `y` length.
pub fn quantize_row_q4_0(x: &[f32], y: &mut [BlockQ4_0]) -> Result<(), DspError> {
    check_blocks("quantize_row_q4_0", GgmlType::Q4_0, x.len(), y.len())?;
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        for j in 0..QK / 2 {
            let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xb[j + 16] * id + 8.5) as i8).min(15) as u8;
            yb.qs[j] = q0 | (q1 << 4);
        }
    }
    Ok(())
}

/// Quantizes weights to Q4_1: `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min) / d + 0.5))`; ggml `quantize_row_q4_1_ref`.
///
/// # Errors
/// `NotBlockMultiple` / `LengthMismatch` on a bad `x` or `y` length.
pub fn quantize_row_q4_1(x: &[f32], y: &mut [BlockQ4_1]) -> Result<(), DspError> {
    check_blocks("quantize_row_q4_1", GgmlType::Q4_1, x.len(), y.len())?;
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let min = xb.iter().fold(f32::MAX, |a, &b| a.min(b));
        let max = xb.iter().fold(-f32::MAX, |a, &b| a.max(b));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        yb.m = f16::from_f32(min);
        for j in 0..QK / 2 {
            let q0 = (((xb[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((xb[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            yb.qs[j] = q0 | (q1 << 4);
        }
    }
    Ok(())
}

/// Quantizes weights to Q4_K with a simple min/max fit per sub-block of 32 (not ggml's
/// iterative `make_qkx2_quants`, so codes differ from llama.cpp's quantizer; the layout is the
/// same). For tests and synthetic models.
///
/// # Errors
/// `NotBlockMultiple` / `LengthMismatch` on a bad `x` or `y` length.
pub fn quantize_row_q4_k_simple(x: &[f32], y: &mut [BlockQ4K]) -> Result<(), DspError> {
    check_blocks("quantize_row_q4_k_simple", GgmlType::Q4_K, x.len(), y.len())?;
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scale = [0f32; 8];
        let mut off = [0f32; 8];
        for (k, s) in xb.chunks_exact(32).enumerate() {
            let min = s.iter().fold(0f32, |a, &b| a.min(b)); // offsets are <= 0
            let max = s.iter().fold(0f32, |a, &b| a.max(b));
            scale[k] = (max - min) / 15.0;
            off[k] = -min;
        }
        let d = scale.iter().fold(0f32, |a, &b| a.max(b)) / 63.0;
        let dmin = off.iter().fold(0f32, |a, &b| a.max(b)) / 63.0;
        yb.d = f16::from_f32(d);
        yb.dmin = f16::from_f32(dmin);
        let (d, dmin) = (yb.d.to_f32(), yb.dmin.to_f32());
        let mut sc = [0u8; 8];
        let mut mn = [0u8; 8];
        for k in 0..8 {
            sc[k] = if d > 0.0 {
                (scale[k] / d).round().min(63.0) as u8
            } else {
                0
            };
            mn[k] = if dmin > 0.0 {
                (off[k] / dmin).round().min(63.0) as u8
            } else {
                0
            };
        }
        yb.scales = [0; 12];
        for j in 0..8 {
            if j < 4 {
                yb.scales[j] |= sc[j] & 63;
                yb.scales[j + 4] |= mn[j] & 63;
            } else {
                yb.scales[j + 4] = (sc[j] & 0x0F) | ((mn[j] & 0x0F) << 4);
                yb.scales[j - 4] |= (sc[j] >> 4) << 6;
                yb.scales[j] |= (mn[j] >> 4) << 6;
            }
        }
        let mut q = [0u8; QK_K];
        for (p, qv) in q.iter_mut().enumerate() {
            let k = p / 32;
            let step = d * sc[k] as f32;
            let m = dmin * mn[k] as f32;
            *qv = if step > 0.0 {
                ((xb[p] + m) / step).round().clamp(0.0, 15.0) as u8
            } else {
                0
            };
        }
        for g in 0..4 {
            for l in 0..32 {
                yb.qs[32 * g + l] = q[64 * g + l] | (q[64 * g + 32 + l] << 4);
            }
        }
    }
    Ok(())
}

/// Quantizes weights to Q6_K with a simple absmax fit per sub-block of 16 (not ggml's
/// `make_qx_quants` search; same layout). For tests and synthetic models.
///
/// # Errors
/// `NotBlockMultiple` / `LengthMismatch` on a bad `x` or `y` length.
pub fn quantize_row_q6_k_simple(x: &[f32], y: &mut [BlockQ6K]) -> Result<(), DspError> {
    check_blocks("quantize_row_q6_k_simple", GgmlType::Q6_K, x.len(), y.len())?;
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scale = [0f32; 16];
        for (k, s) in xb.chunks_exact(16).enumerate() {
            scale[k] = amax(s) / 31.0;
        }
        let d = scale.iter().fold(0f32, |a, &b| a.max(b)) / 127.0;
        yb.d = f16::from_f32(d);
        let d = yb.d.to_f32();
        for k in 0..16 {
            yb.scales[k] = if d > 0.0 {
                (scale[k] / d).round().min(127.0) as i8
            } else {
                0
            };
        }
        let mut q = [0u8; QK_K];
        for (p, qv) in q.iter_mut().enumerate() {
            let step = d * yb.scales[p / 16] as f32;
            let v = if step > 0.0 {
                (xb[p] / step).round().clamp(-32.0, 31.0)
            } else {
                0.0
            };
            *qv = (v as i32 + 32) as u8;
        }
        yb.ql = [0; 128];
        yb.qh = [0; 64];
        for h in 0..2 {
            for g in 0..4 {
                for l in 0..32 {
                    let v = q[128 * h + 32 * g + l];
                    let lo = v & 0x0F;
                    yb.ql[64 * h + 32 * (g % 2) + l] |= if g < 2 { lo } else { lo << 4 };
                    yb.qh[32 * h + l] |= (v >> 4) << (2 * g);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::round_ties_even_small;

    #[test]
    fn small_rounding_equals_round_ties_even() {
        // Every half-integer in ±300 (the ties), and a dense sweep of other values around
        // the activation range, including values one ulp either side of the ties.
        for k in -600i32..=600 {
            let tie = k as f32 * 0.5;
            for x in [tie, f32::from_bits(tie.to_bits() + 1), f32::from_bits(tie.to_bits().wrapping_sub(1))] {
                if x.is_finite() {
                    assert_eq!(round_ties_even_small(x), x.round_ties_even(), "x = {x:e}");
                }
            }
        }
        let mut v = -300.0f32;
        while v < 300.0 {
            assert_eq!(round_ties_even_small(v), v.round_ties_even(), "x = {v:e}");
            v += 0.0137;
        }
        assert_eq!(round_ties_even_small(2.5), 2.0);
        assert_eq!(round_ties_even_small(-3.5), -4.0);
    }
}
