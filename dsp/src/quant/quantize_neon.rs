//! The activation quantizers on aarch64 NEON (baseline ARMv8.0, present on every aarch64 CPU),
//! bit-identical to the scalar loops in `quantize.rs` (`q8_block` and
//! `quantize_q8_k_blocks`), as `q8_block_avx2` / `quantize_q8_k_avx2` are on x86:
//! - the largest magnitude is the maximum of the `|x|` bit patterns (ordered as the values for
//!   non-NaN floats), NaN lanes counted as 0, as `f32::max` / the reference's `>` skip them;
//! - `x * scale` is rounded by `fcvtns` (`vcvtnq_s32_f32`: nearest, ties to even, NaN → 0), what
//!   the scalar magic-number rounding followed by Rust's `as` cast computes for these magnitudes
//!   (`|x * scale| ≤ 127` plus one rounding);
//! - the quants are capped at 127 and narrow to i8 with saturation, as the scalar `as i8`
//!   (Q8_0/Q8_1) and `min(127)` then `as i8` (Q8_K); the sums count the capped values.
//!
//! Tested against plain reference loops in `dsp/tests/quant.rs`
//! (`q8_0_and_q8_1_equal_the_reference_loop_bit_for_bit`, `q8_k_equals_the_reference_loop_bit_for_bit`),
//! which CI runs under qemu at three CPU levels.

use std::arch::aarch64::*;

use super::blocks::{BlockQ8K, QK, QK_K};

/// `|x|` bit patterns of 4 lanes with NaN lanes set to 0.
///
/// # Safety
/// `p` points at 4 readable `f32`.
#[inline(always)]
unsafe fn abs_bits(p: *const f32) -> uint32x4_t {
    let b = vandq_u32(vld1q_u32(p.cast()), vdupq_n_u32(0x7fff_ffff));
    // NaN: |bits| above infinity's.
    vbicq_u32(b, vcgtq_u32(b, vdupq_n_u32(0x7f80_0000)))
}

/// Bit pattern of the largest non-NaN `|x|` of `xb` (a multiple of 16 values).
///
/// # Safety
/// `xb.len()` is a multiple of 16.
#[inline(always)]
unsafe fn amax_bits(xb: &[f32]) -> u32 {
    let p = xb.as_ptr();
    let (mut m0, mut m1) = (vdupq_n_u32(0), vdupq_n_u32(0));
    for i in (0..xb.len()).step_by(8) {
        m0 = vmaxq_u32(m0, abs_bits(p.add(i)));
        m1 = vmaxq_u32(m1, abs_bits(p.add(i + 4)));
    }
    vmaxvq_u32(vmaxq_u32(m0, m1))
}

/// 16 quants `round_ties_even(x * scale)` (NaN → 0), each at most `cap`, narrowed to i8,
/// stored at `q`; returns their i32 lane sums.
///
/// # Safety
/// `p` points at 16 readable `f32`, `q` at 16 writable `i8`.
#[inline(always)]
unsafe fn quantize16(p: *const f32, scale: float32x4_t, cap: int32x4_t, q: *mut i8) -> int32x4_t {
    let r = |k: usize| vminq_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(p.add(4 * k)), scale)), cap);
    let (a, b, c, d) = (r(0), r(1), r(2), r(3));
    let lo = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    let hi = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
    vst1q_s8(q, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
    vaddq_s32(vaddq_s32(a, b), vaddq_s32(c, d))
}

/// One Q8_0/Q8_1 block, bit-identical to the scalar `q8_block`: returns `(d, sum(qs))`.
pub(super) fn q8_block_neon(xb: &[f32], qs: &mut [i8; QK]) -> (f32, i32) {
    assert_eq!(xb.len(), QK);
    // SAFETY: NEON is part of the aarch64 baseline; xb holds QK = 32 values, qs 32 bytes.
    unsafe {
        let amax = f32::from_bits(amax_bits(xb));
        let (d, id) = (amax / 127.0, if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let (scale, cap) = (vdupq_n_f32(id), vdupq_n_s32(127));
        let p = xb.as_ptr();
        let s0 = quantize16(p, scale, cap, qs.as_mut_ptr());
        let s1 = quantize16(p.add(16), scale, cap, qs.as_mut_ptr().add(16));
        (d, vaddvq_s32(vaddq_s32(s0, s1)))
    }
}

/// Q8_K blocks, bit-identical to the scalar `quantize_q8_k_blocks` (ggml
/// `quantize_row_q8_K_ref`): `iscale = -127 / max` with `max` the first value of largest
/// magnitude, `q = min(127, round_ties_even(iscale * x))`, `bsums` of 16 quants, `d = 1 / iscale`.
/// The caller checked `x.len() == y.len() * QK_K`.
pub(super) fn quantize_q8_k_neon(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        // SAFETY: NEON is part of the aarch64 baseline; xb holds QK_K = 256 values.
        let amax = unsafe { amax_bits(xb) };
        if amax == 0 {
            yb.d = 0.0;
            yb.qs = [0; QK_K];
            yb.bsums = [0; QK_K / 16];
            continue;
        }
        // The first value whose magnitude has those bits (a NaN's never does: they exceed inf's).
        let max = *xb.iter().find(|v| v.abs().to_bits() == amax).expect("amax comes from xb");
        let iscale = -127.0 / max;
        // SAFETY: as above; each step reads 16 of xb's values and writes 16 of yb.qs.
        unsafe {
            let (scale, cap) = (vdupq_n_f32(iscale), vdupq_n_s32(127));
            let (p, q) = (xb.as_ptr(), yb.qs.as_mut_ptr());
            for (j, s) in yb.bsums.iter_mut().enumerate() {
                quantize16(p.add(16 * j), scale, cap, q.add(16 * j));
                *s = vaddlvq_s8(vld1q_s8(q.add(16 * j)));
            }
        }
        yb.d = 1.0 / iscale;
    }
}
