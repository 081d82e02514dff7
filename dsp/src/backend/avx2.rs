//! AVX2 + FMA + F16C backend (x86_64), chosen at run time by `select`.
//!
//! Quantized dot products use ggml's AVX2 scheme (`ggml/src/ggml-cpu/arch/x86/quants.c`):
//! unpack a block to 32 bytes, `_mm256_maddubs_epi16` (u8 × i8 → i16 pairs) then
//! `_mm256_madd_epi16` (→ i32), convert to f32 and `fmadd` with the product of the block scales
//! into an 8-lane accumulator that is summed horizontally at the end. Signed weights use the
//! sign trick (`|w|` × `sign(x, w)`). Integer block sums are exact; only the f32 summation order
//! differs from the scalar backend.
//!
//! Q4_0, Q4_1 and Q8_0 have a register-blocked tile kernel (`TILE_R` weight rows ×
//! `TILE_T` tokens) so each weight block is unpacked once per tile of tokens in prefill; Q4_K
//! and Q6_K are in [`super::avx2_kquants`] (each super-block unpacked once per sweep of up to
//! 64 tokens). Single dot products run the same kernels at 1 × 1. Every
//! (row, token) accumulator performs the same operations in the same order whatever the tile
//! shape, so tiled results are bit-identical to single dot products.

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::attn::{attention_tile, Lanes, Vector};
use super::attn_full::full_attention_tile;
use super::float_tile::{self, ByLanes, FloatElem};
use super::avx2_kquants::{dot_kquant, dot_tile_kquant, KQuant};
use super::{dot_tile_by_pairs, AttnTile, DotTile, FullAttnTile, KernelBackend, Piece, PieceKernel};
use crate::quant::blocks::{
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::quant::GgmlType;

/// Weight rows per register tile.
const TILE_R: usize = 4;
/// Tokens per register tile.
const TILE_T: usize = 2;
/// Tokens per register tile of the VNNI kernels (AVX-512VL: 32 vector registers hold the
/// 4 × 4 accumulators, the rows' quants, lane bases and scales).
const TILE_T_VNNI: usize = 4;

/// The AVX2 backend. Only obtainable through [`Avx2::get`], which checks the CPU features, so
/// holding one proves AVX2, FMA and F16C are available.
#[derive(Debug)]
pub struct Avx2 {
    _detected: (),
}

pub(super) static AVX2: Avx2 = Avx2 { _detected: () };

impl Avx2 {
    /// The backend if this CPU has AVX2, FMA and F16C (checked at run time).
    pub fn get() -> Option<&'static Avx2> {
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then_some(&AVX2)
    }
}

// === helpers (callers must have avx2, fma, f16c) ===

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// f16 bits at `p` (unaligned) to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load_f16(p: *const u8) -> f32 {
    let bits = p.cast::<u16>().read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// 16 bytes at `p` as 32 nibbles: low nibbles in bytes 0..16, high nibbles in 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_nibbles(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p.cast());
    let v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// Sums of 4 adjacent products of signed bytes `w` and `x`, as 8 i32 lanes. `VNNI`: one
/// `vpdpbusd` instead of `maddubs` + `madd`; the lanes are the same (the i16 pair sums of
/// `maddubs` cannot saturate here: |w| ≤ 128 and |x| ≤ 128 give |pair| ≤ 32768 only for
/// w = x = −128, which ggml's quantizers never write).
///
/// # Safety
/// Inlined into callers that enable avx2 (and avx512vl + avx512vnni when `VNNI`).
#[inline(always)]
unsafe fn dot_i8<const VNNI: bool>(w: __m256i, x: __m256i) -> __m256i {
    dot_u8::<VNNI>(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
}

/// As [`dot_i8`] with unsigned `w` (≤ 128 as u8).
///
/// # Safety
/// As [`dot_i8`].
#[inline(always)]
unsafe fn dot_u8<const VNNI: bool>(w: __m256i, x: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
    }
}

const K_Q4_0: u8 = 0;
const K_Q4_1: u8 = 1;
const K_Q8_0: u8 = 2;

/// (weight block bytes, activation block bytes, offset of the activation quants).
const fn geometry(k: u8) -> (usize, usize, usize) {
    match k {
        K_Q4_0 => (18, 34, 2),
        K_Q4_1 => (20, 36, 4),
        _ => (34, 34, 2),
    }
}

/// `R × T` dot products of `nb` blocks: weight kind `K` (Q4_0 / Q4_1 / Q8_0) against its
/// activation type; `out[t * out_stride + r] = w_row(r) · x_row(t)`.
///
/// Per block and pair: the exact i32 lanes of 4 adjacent byte products, converted to f32 and
/// fused-multiply-added with the block-scale product `dw·dx` (ggml's `vec_dot` order). The
/// scales are broadcast once per row and per token and multiplied lane-wise (the same f32
/// product in every lane).
///
/// `VNNI`: the lanes by `vpdpbusd` (unsigned × signed bytes into i32) with one instruction per
/// pair. Q8_0 over several tokens adds 128 to the activations once per token (`x ^ 0x80`) and
/// starts each row's lanes at `−128·Σw` (once per row; for one token, decode, the sign trick
/// costs less); Q4_0 keeps its nibbles unsigned and starts each token's
/// lanes at `−8·Σx` (once per token); Q4_1 needs neither. Without VNNI, `maddubs` + `madd`
/// with the sign trick ([`dot_i8`]). Both give exactly the same integers in the same lanes, so
/// the same results.
///
/// # Safety
/// Inlined into [`tile_any`] / [`tile_any_vnni`], which enable the features it needs.
/// `w + r*w_stride` for `r < R` and `x + t*x_stride` for `t < T` must each point at `nb`
/// readable blocks; `out + t*out_stride + r` must be writable for all r, t.
#[inline(always)]
unsafe fn tile_q<const K: u8, const R: usize, const T: usize, const VNNI: bool>(p: Piece) {
    let Piece { w, w_stride, x, x_stride, nb, out, out_stride, .. } = p;
    const { assert!(T <= 4) };
    let (wb, xb, xq) = geometry(K);
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    // Q4_1's `Σ m_w·s_x` per pair: scalar for one token, else one row's tokens in the lanes
    // of a 4-lane vector (the same f32 multiply and add per lane).
    let mut accm = [[0f32; T]; R];
    let mut accm4 = [_mm_setzero_ps(); R];
    for ib in 0..nb {
        let mut qw = [zero; R];
        // Q8_0 with VNNI: −128·Σw per lane of each row.
        let mut base_w = [zero; R];
        let mut dw = [_mm256_setzero_ps(); R];
        let mut mw = [0f32; R];
        for r in 0..R {
            let p = w.add(r * w_stride + ib * wb);
            if T == 1 {
                // Decode reads every weight once: fetch each row's stream ahead (a hint;
                // prefetching past the row's end cannot fault).
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES).cast());
            }
            dw[r] = bcast_f16(p);
            qw[r] = match K {
                K_Q4_0 if VNNI => load_nibbles(p.add(2)),
                K_Q4_0 => _mm256_sub_epi8(load_nibbles(p.add(2)), _mm256_set1_epi8(8)),
                K_Q4_1 => {
                    mw[r] = load_f16(p.add(2));
                    load_nibbles(p.add(4))
                }
                _ => _mm256_loadu_si256(p.add(2).cast()),
            };
            if VNNI && K == K_Q8_0 && T > 1 {
                let s = _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(-128), qw[r]);
                base_w[r] = _mm256_sub_epi32(zero, s);
            }
        }
        let mut sx4 = [0u16; 4];
        for t in 0..T {
            let p = x.add(t * x_stride + ib * xb);
            if K == K_Q4_1 && T > 1 {
                sx4[t] = p.add(2).cast::<u16>().read_unaligned();
            }
            let dx = bcast_f16(p);
            let qx = _mm256_loadu_si256(p.add(xq).cast());
            let sx = if K == K_Q4_1 && T == 1 { load_f16(p.add(2)) } else { 0.0 };
            // VNNI: Q8_0's activations offset to unsigned, Q4_0's lanes start at −8·Σx.
            let (xu, base_x) = match K {
                K_Q8_0 if VNNI && T > 1 => (_mm256_xor_si256(qx, _mm256_set1_epi8(-128)), zero),
                K_Q4_0 if VNNI => {
                    let s = _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(8), qx);
                    (qx, _mm256_sub_epi32(zero, s))
                }
                _ => (qx, zero),
            };
            for r in 0..R {
                let dot = match K {
                    K_Q8_0 if VNNI && T > 1 => _mm256_dpbusd_epi32(base_w[r], xu, qw[r]),
                    K_Q4_0 if VNNI => _mm256_dpbusd_epi32(base_x, qw[r], qx),
                    K_Q4_1 => dot_u8::<VNNI>(qw[r], qx),
                    _ => dot_i8::<VNNI>(qw[r], qx),
                };
                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), _mm256_cvtepi32_ps(dot), acc[r][t]);
                if K == K_Q4_1 && T == 1 {
                    accm[r][t] += mw[r] * sx;
                }
            }
        }
        if K == K_Q4_1 && T > 1 {
            let sxv = _mm_cvtph_ps(_mm_loadl_epi64(sx4.as_ptr().cast()));
            for r in 0..R {
                accm4[r] = _mm_add_ps(accm4[r], _mm_mul_ps(_mm_set1_ps(mw[r]), sxv));
            }
        }
    }
    if K == K_Q4_1 && T > 1 {
        for r in 0..R {
            let mut lanes = [0f32; 4];
            _mm_storeu_ps(lanes.as_mut_ptr(), accm4[r]);
            accm[r] = std::array::from_fn(|t| lanes[t]);
        }
    }
    for r in 0..R {
        for t in 0..T {
            *out.add(t * out_stride + r) = hsum_ps(acc[r][t]) + accm[r][t];
        }
    }
}

/// How far ahead of the block being read a decode tile prefetches each weight row (bytes).
/// Rows are contiguous, so past a short row (SmolLM2's 576 columns are 360 bytes of Q4_1)
/// this fetches the rows of the next tiles. Decode is bound by the weight stream; on an AVX2
/// EPYC at 1 thread SmolLM2 Q4_1 decode went from 53 to 60–78 tok/s with 512–2048 bytes
/// (`device-worker bench --threads 1 --gen-tokens 128`, quiet, interleaved runs).
const PREFETCH_BYTES: usize = 2048;

/// The f16 at `p` (unaligned) widened to f32 in all 8 lanes.
#[inline(always)]
unsafe fn bcast_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(p.cast::<i16>().read_unaligned()))
}

/// The `R × T` tile kernel of weight kind `K` ([`tile_q`]).
///
/// # Safety
/// As the kernel it dispatches to.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_any<const K: u8, const R: usize, const T: usize>(p: Piece) {
    tile_q::<K, R, T, false>(p)
}

/// [`tile_any`] with VNNI integer dots (bit-identical results).
///
/// # Safety
/// Needs avx2, fma, f16c, avx512vl, avx512vnni; pointers as [`tile_q`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vl,avx512vnni")]
unsafe fn tile_any_vnni<const K: u8, const R: usize, const T: usize>(p: Piece) {
    tile_q::<K, R, T, true>(p)
}

/// The `R × T` tile of kind `K`, through [`tile_any_vnni`] when `VNNI`, else [`tile_any`].
///
/// # Safety
/// As the kernel it dispatches to (the caller proves the VNNI features when `VNNI`).
#[inline(always)]
unsafe fn tile_pick<const K: u8, const R: usize, const T: usize, const VNNI: bool>(p: Piece) {
    if VNNI {
        tile_any_vnni::<K, R, T>(p)
    } else {
        tile_any::<K, R, T>(p)
    }
}

/// [`tile_pick`] of kind `K` as a [`PieceKernel`].
struct QKernel<const K: u8, const VNNI: bool>;

impl<const K: u8, const VNNI: bool> PieceKernel for QKernel<K, VNNI> {
    #[inline(always)]
    unsafe fn piece<const R: usize, const T: usize>(p: Piece) {
        tile_pick::<K, R, T, VNNI>(p)
    }
}

/// Runs [`tile_any`] over a whole [`DotTile`] in `R × T` pieces and their edges
/// ([`super::RawTile::cover`]).
///
/// # Safety
/// Needs avx2, fma, f16c (and avx512vl, avx512vnni when `VNNI`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_tile_q<const K: u8, const R: usize, const T: usize, const VNNI: bool>(
    tile: &DotTile<'_>,
    out: &mut [f32],
) {
    let (wb, xb, _) = geometry(K);
    tile.raw(wb, xb, out).cover::<QKernel<K, VNNI>, R, T>();
}

/// One dot product through the tile kernel (so that it is bit-identical to tiled results).
///
/// # Safety
/// Needs avx2, fma, f16c; `w` and `x` point at `nb` blocks each (aligned for their structs for
/// the K-quants, which are read through references).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q<const K: u8, const VNNI: bool>(w: *const u8, x: *const u8, nb: usize) -> f32 {
    let mut out = 0f32;
    tile_pick::<K, 1, 1, VNNI>(Piece::single(w, x, nb, &mut out));
    out
}

/// Q4_0 / Q4_1 / Q8_0 tiles with VNNI integer dots, for the AVX-512 VNNI backend;
/// bit-identical to [`Avx2`]'s (the same i32 lanes), other types panic.
///
/// # Safety
/// Needs avx2, fma, f16c, avx512vl, avx512vnni; the [`DotTile`] contract.
pub(super) unsafe fn dot_tile_q_vnni(tile: &DotTile<'_>, out: &mut [f32]) {
    match tile.ty {
        GgmlType::Q4_0 => dot_tile_q::<K_Q4_0, TILE_R, TILE_T_VNNI, true>(tile, out),
        GgmlType::Q4_1 => dot_tile_q::<K_Q4_1, TILE_R, TILE_T_VNNI, true>(tile, out),
        GgmlType::Q8_0 => dot_tile_q::<K_Q8_0, TILE_R, TILE_T_VNNI, true>(tile, out),
        other => panic!("dot_tile_q_vnni: {other} is not Q4_0, Q4_1 or Q8_0"),
    }
}

/// One Q4_0 / Q4_1 / Q8_0 dot product with VNNI integer dots (bit-identical to tiles and to
/// [`Avx2`]'s); other types panic.
///
/// # Safety
/// Needs avx2, fma, f16c, avx512vl, avx512vnni; `w` and `x` point at `nb` blocks each.
pub(super) unsafe fn dot_q_vnni(ty: GgmlType, w: *const u8, x: *const u8, nb: usize) -> f32 {
    match ty {
        GgmlType::Q4_0 => dot_q::<K_Q4_0, true>(w, x, nb),
        GgmlType::Q4_1 => dot_q::<K_Q4_1, true>(w, x, nb),
        GgmlType::Q8_0 => dot_q::<K_Q8_0, true>(w, x, nb),
        other => panic!("dot_q_vnni: {other} is not Q4_0, Q4_1 or Q8_0"),
    }
}

/// Loads 8 f16 values widened to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16x8(p: *const f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
}

/// Loads 8 bf16 values widened to f32 (a bf16 is the high half of an f32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_bf16x8(p: *const bf16) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())),
        16,
    ))
}

/// The float dot products and tiles ([`super::float_tile`]) with AVX2 vectors.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_float<E: FloatElem>(w: &[E], x: &[E]) -> f32 {
    float_tile::dot_float::<__m256, E>(w, x)
}

/// A float [`DotTile`] in 2 × 3 pieces (12 accumulators in the 16 AVX2 registers).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_tile_float<E: FloatElem>(tile: &DotTile<'_>, out: &mut [f32]) {
    float_tile::dot_tile_float::<ByLanes<__m256>, E, 2, 3>(tile, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len().min(w.len()).min(out.len());
    let (mut s0, mut s1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        let sq = _mm256_mul_ps(v, v);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
        i += 8;
    }
    let mut lanes = [0f64; 4];
    _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(s0, s1));
    let mut sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for &v in &x[i..n] {
        sum += (v * v) as f64;
    }
    let mean = (sum / n as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    let sv = _mm256_set1_ps(scale);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), sv);
        _mm256_storeu_ps(
            out.as_mut_ptr().add(i),
            _mm256_mul_ps(v, _mm256_loadu_ps(w.as_ptr().add(i))),
        );
        i += 8;
    }
    for j in i..n {
        out[j] = (x[j] * scale) * w[j];
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_inplace(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len());
    let mut i = 0;
    while i + 8 <= n {
        let s = _mm256_add_ps(
            _mm256_loadu_ps(dst.as_ptr().add(i)),
            _mm256_loadu_ps(src.as_ptr().add(i)),
        );
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), s);
        i += 8;
    }
    for j in i..n {
        dst[j] += src[j];
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_f16(out: &mut [f32], a: f32, v: &[f16]) {
    let n = out.len().min(v.len());
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let vv = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast()));
        // mul then add (no fma): bit-identical to the scalar backend.
        let s = _mm256_add_ps(_mm256_loadu_ps(out.as_ptr().add(i)), _mm256_mul_ps(av, vv));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), s);
        i += 8;
    }
    for j in i..n {
        out[j] += a * v[j].to_f32();
    }
}

/// The AVX2 vector of the attention tiles: `load_f16x8`, `fmadd`, `hsum_ps` as in
/// [`dot_float`] and mul-then-add as in [`axpy_f16`] (callers must have avx2, fma, f16c).
impl Vector for __m256 {
    const WIDTH: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> Self {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self)
    }
    #[inline(always)]
    unsafe fn fma(acc: Self, w: Self, x: Self) -> Self {
        _mm256_fmadd_ps(w, x, acc)
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        _mm256_mul_ps(a, b)
    }
}

impl Lanes for __m256 {
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> Self {
        load_f16x8(p)
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> Self {
        load_bf16x8(p)
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        hsum_ps(self)
    }
    /// [`hsum_ps`] of four vectors in transposed lanes: `s = lo + hi` for two vectors per
    /// `permute2f128` pair, then `s0 + s2`, `s1 + s3`, then their sum, each addition with
    /// `hsum_ps`'s operands in its order.
    #[inline(always)]
    unsafe fn hsum4(v: [Self; 4]) -> [f32; 4] {
        // [sA | sB] and [sC | sD], each s = lo + hi (4 lanes).
        let ab = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(v[0], v[1]),
            _mm256_permute2f128_ps::<0x31>(v[0], v[1]),
        );
        let cd = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(v[2], v[3]),
            _mm256_permute2f128_ps::<0x31>(v[2], v[3]),
        );
        // [sA0+sA2, sA1+sA3, sC0+sC2, sC1+sC3 | the same of B, D].
        let z = _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(ab, cd),
            _mm256_shuffle_ps::<0b11_10_11_10>(ab, cd),
        );
        // [A, C, A, C | B, D, B, D].
        let r = _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(z, z),
            _mm256_shuffle_ps::<0b11_01_11_01>(z, z),
        );
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), r);
        [l[0], l[4], l[1], l[5]]
    }
}

/// [`KernelBackend::attention_queries`] with AVX2 tiles ([`super::attn`]; reference:
/// [`super::attention_queries_by_pairs`] with [`dot_float`] and [`axpy_f16`]).
///
/// # Safety
/// Needs avx2, fma, f16c (shapes are checked inside).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attention_queries(tile: &AttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
    attention_tile::<__m256>(tile, scores, out, |x| unsafe {
        super::avx2_math::softmax_inplace(x)
    })
}

/// [`KernelBackend::full_attention`] with AVX2 vectors, 4 queries × 16 keys (or output
/// columns) of accumulators ([`super::attn_full`]; reference:
/// [`super::full_attention_by_chains`] with the AVX2 softmax).
///
/// # Safety
/// Needs avx2, fma, f16c (shapes are checked inside).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn full_attention(tile: &FullAttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
    full_attention_tile::<__m256, 4>(tile, scores, out, |x| unsafe {
        super::avx2_math::softmax_inplace(x)
    })
}

// SAFETY (every `unsafe` block below): an `Avx2` exists only via `Avx2::get`, which checked
// avx2, fma and f16c; the helpers read at most `min(len)` elements of the slices passed, and
// the tile kernels assert their geometry against the slice lengths before raw access.
impl Avx2 {
    /// The single dot product of `nb` blocks of `ty` (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) with
    /// their activation blocks ([`quant_dot_methods`]).
    ///
    /// # Safety
    /// `w` and `x` point at `nb` aligned blocks each (the features are proven by `self`).
    #[inline(always)]
    unsafe fn dot_blocks(&self, ty: GgmlType, w: *const u8, x: *const u8, nb: usize) -> f32 {
        match ty {
            GgmlType::Q4_0 => dot_q::<K_Q4_0, false>(w, x, nb),
            GgmlType::Q4_1 => dot_q::<K_Q4_1, false>(w, x, nb),
            GgmlType::Q8_0 => dot_q::<K_Q8_0, false>(w, x, nb),
            GgmlType::Q4_K => dot_kquant(KQuant::Q4K, w, x, nb),
            GgmlType::Q6_K => dot_kquant(KQuant::Q6K, w, x, nb),
            _ => unreachable!("no quantized block dot product for {ty}"),
        }
    }
}

impl KernelBackend for Avx2 {
    fn name(&self) -> &'static str {
        "avx2"
    }

    fn gdn_chunked_head(&self, head: &mut crate::gdn::chunked::ChunkedHead<'_, '_>) {
        // SAFETY: see the impl comment (AVX2 and FMA are among the features checked).
        unsafe { crate::gdn::chunked::head_avx2(head) }
    }

    fn gdn_recurrent_head(&self, head: &mut crate::gdn::recurrent::RecurrentHead<'_, '_>) {
        // SAFETY: see the impl comment (AVX2 and FMA are among the features checked).
        unsafe { crate::gdn::recurrent::head_avx2(head) }
    }

    fn gdn_replay_head(&self, head: &mut crate::gdn::replay::ReplayHead<'_, '_>) {
        // SAFETY: as gdn_recurrent_head (avx2 and fma among the features checked).
        unsafe { crate::gdn::replay::head_avx2(head) }
    }

    quant_dot_methods!();

    fn vec_dot_f16(&self, w: &[f16], x: &[f16]) -> f32 {
        // SAFETY: see the impl comment.
        unsafe { dot_float(w, x) }
    }

    fn vec_dot_bf16(&self, w: &[bf16], x: &[bf16]) -> f32 {
        // SAFETY: see the impl comment.
        unsafe { dot_float(w, x) }
    }

    fn vec_dot_f32(&self, w: &[f32], x: &[f32]) -> f32 {
        // SAFETY: see the impl comment.
        unsafe { dot_float(w, x) }
    }

    fn dot_tile(&self, tile: &DotTile<'_>, out: &mut [f32]) {
        // SAFETY: see the impl comment; `dot_tile_q` asserts the tile geometry.
        unsafe {
            match tile.ty {
                GgmlType::Q4_0 => dot_tile_q::<K_Q4_0, TILE_R, TILE_T, false>(tile, out),
                GgmlType::Q4_1 => dot_tile_q::<K_Q4_1, TILE_R, TILE_T, false>(tile, out),
                GgmlType::Q8_0 => dot_tile_q::<K_Q8_0, TILE_R, TILE_T, false>(tile, out),
                GgmlType::Q4_K => dot_tile_kquant(KQuant::Q4K, tile, out),
                GgmlType::Q6_K => dot_tile_kquant(KQuant::Q6K, tile, out),
                GgmlType::F16 => dot_tile_float::<f16>(tile, out),
                GgmlType::BF16 => dot_tile_float::<bf16>(tile, out),
                GgmlType::F32 => dot_tile_float::<f32>(tile, out),
                _ => dot_tile_by_pairs(self, tile, out),
            }
        }
    }

    fn rms_norm_row(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        debug_assert!(x.len() == w.len() && x.len() == out.len());
        // SAFETY: see the impl comment.
        unsafe { rms_norm_row(x, w, eps, out) }
    }

    fn add_inplace(&self, dst: &mut [f32], src: &[f32]) {
        debug_assert_eq!(dst.len(), src.len());
        // SAFETY: see the impl comment.
        unsafe { add_inplace(dst, src) }
    }

    fn axpy_f16(&self, out: &mut [f32], a: f32, v: &[f16]) {
        debug_assert_eq!(out.len(), v.len());
        // SAFETY: see the impl comment.
        unsafe { axpy_f16(out, a, v) }
    }

    fn silu_inplace(&self, x: &mut [f32]) {
        // SAFETY: see the impl comment.
        unsafe { super::avx2_math::silu_inplace(x) }
    }

    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        debug_assert!(gate.len() == up.len() && gate.len() == out.len());
        // SAFETY: see the impl comment.
        unsafe { super::avx2_math::swiglu(gate, up, out) }
    }

    fn gelu_tanh_inplace(&self, x: &mut [f32]) {
        // SAFETY: see the impl comment.
        unsafe { super::avx2_math::gelu_tanh_inplace(x) }
    }

    fn softmax_inplace(&self, x: &mut [f32]) {
        // SAFETY: see the impl comment.
        unsafe { super::avx2_math::softmax_inplace(x) }
    }

    fn attention_queries(&self, tile: &AttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
        // SAFETY: see the impl comment; the kernel checks the tile's shapes.
        unsafe { attention_queries(tile, scores, out) }
    }

    fn full_attention(&self, tile: &FullAttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
        // SAFETY: see the impl comment; the kernel checks the tile's shapes.
        unsafe { full_attention(tile, scores, out) }
    }
}
