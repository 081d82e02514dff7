//! AVX-512 (BW) Q4_K and Q6_K products against Q8_K activations, for any number of tokens.
//!
//! Same blocking and accumulator order as [`super::avx2_kquants`] (a weight super-block is
//! unpacked once per sweep of [`ROWS`] rows × up to [`TOKENS`] tokens and applied to every
//! token), with the integer part on 512-bit registers: per pair of 32-weight groups one
//! `_mm512_maddubs_epi16` (u8 × i8 → i16 pairs) and one `_mm512_madd_epi16` with the two
//! groups' scales. Measured on this project's Xeon (`dsp/examples`-style interleaved A/B,
//! 1 thread, 0.8B FFN shapes): 0.85× (Q4_K) and 0.80× (Q6_K) of the AVX2 kernel's time on a
//! 64-token prefill tile, 0.7–0.9× for 1–4 columns; `vpdpbusd` + `vpdpwssd` (VNNI) was
//! slower than this on the same machine (0.91× / 0.86× at 64 tokens), so it is not used here.
//! Eight unpacked zmm registers (quants and scales) also leave room for the accumulators,
//! where AVX2's sixteen ymm spill on Q6_K.
//!
//! The 16 i32 lanes are folded to 8 (exact integer adds): lane `l` then holds
//! `Σ_groups scale · Σ of the products of bytes 4l..4l+3` of each group, exactly the AVX2
//! kernel's lane `l` (`maddubs` cannot saturate at these ranges: Q4_K quants ≤ 15, Q6_K
//! q + 32 ≤ 63, |q_x| ≤ 128), and the f32 tail (block scales, Q4_K mins, Q6_K's −32) is the
//! AVX2 one. So results are bit-identical to the AVX2 backend's for every tile shape
//! (`tests/conformance.rs`), and single dot products equal tiles.
//!
//! Scheme of the integer sums: ggml's `ggml_vec_dot_q4_K_q8_K` / `..._q6_K_q8_K`
//! (`ggml/src/ggml-cpu/arch/x86/quants.c`).

use std::arch::x86_64::*;

use half::f16;

use super::avx2::{hsum_ps, load_f16};
use super::avx2_kquants::KQuant;
use super::DotTile;
use crate::quant::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};

/// Tokens per sweep (activation blocks of one super-block column for this many tokens stay in
/// L1: 64 × 292 B ≈ 18 KiB).
const TOKENS: usize = 64;
/// Weight rows per sweep.
const ROWS: usize = 4;
/// Super-blocks ahead of the one being unpacked that a few-column sweep prefetches.
const PREFETCH_BLOCKS: usize = 12;

/// One weight super-block ready for the token loop.
/// `q[g]`: unsigned quants of weights `64g..64g+64` (Q4_K: 0..15, Q6_K: q + 32 in 0..63);
/// `s[g]`: the scale of each weight's 4-weight lane group, in both i16 halves of its i32
/// lane (for `madd`); `bias`: Q4_K mins `m_k` at lanes `2k` and `2k+1`, or Q6_K scales, to pair
/// with the 16 `bsums` of the activation block.
struct Unpacked {
    q: [__m512i; 4],
    s: [__m512i; 4],
    bias: __m256i,
    d: f32,
    dmin: f32,
}

/// Unpacks a [`BlockQ4K`].
///
/// # Safety
/// Needs avx512f, avx512bw, avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn unpack_q4k(b: &BlockQ4K) -> Unpacked {
    let mask = _mm512_set1_epi8(0x0F);
    let (sc, mn) = b.scales_mins();
    // All 8 sub-block scales as i32 lanes holding the scale in both i16 halves.
    let sc32 = _mm512_cvtepu8_epi32(_mm_loadl_epi64(sc.as_ptr().cast()));
    let sc32 = _mm512_or_si512(sc32, _mm512_slli_epi32(sc32, 16));
    let mut q = [_mm512_setzero_si512(); 4];
    let mut s = [_mm512_setzero_si512(); 4];
    for g in 0..4 {
        let q4 = _mm256_loadu_si256(b.qs.as_ptr().add(32 * g).cast());
        let both = _mm512_inserti64x4(_mm512_castsi256_si512(q4), _mm256_srli_epi16(q4, 4), 1);
        q[g] = _mm512_and_si512(both, mask);
        // Lanes 0..8 take scale 2g, lanes 8..16 scale 2g + 1.
        let lo = 2 * g as i32;
        let idx = _mm512_set_epi32(
            lo + 1,
            lo + 1,
            lo + 1,
            lo + 1,
            lo + 1,
            lo + 1,
            lo + 1,
            lo + 1,
            lo,
            lo,
            lo,
            lo,
            lo,
            lo,
            lo,
            lo,
        );
        s[g] = _mm512_permutexvar_epi32(idx, sc32);
    }
    let m8 = _mm_loadl_epi64(mn.as_ptr().cast());
    Unpacked {
        q,
        s,
        bias: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)),
        d: load_f16((&b.d as *const f16).cast()),
        dmin: load_f16((&b.dmin as *const f16).cast()),
    }
}

/// Unpacks a [`BlockQ6K`] (quants rebuilt from `ql`/`qh` as `q + 32`).
///
/// # Safety
/// Needs avx512f, avx512bw, avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn unpack_q6k(b: &BlockQ6K) -> Unpacked {
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    // Element order as ggml's dequantize_row_q6_K: 32-weight group j = 4h + k.
    let mut g32 = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let ql0 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h).cast());
        let ql1 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h + 32).cast());
        let qh = _mm256_loadu_si256(b.qh.as_ptr().add(32 * h).cast());
        g32[4 * h] = _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
        );
        g32[4 * h + 1] = _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
        );
        g32[4 * h + 2] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
            _mm256_and_si256(qh, m30),
        );
        g32[4 * h + 3] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
        );
    }
    // The 16 scales (one per 16 weights) as i32 lanes with the i16 scale in the low half.
    let sc16 = _mm512_and_si512(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(b.scales.as_ptr().cast())),
        _mm512_set1_epi32(0xFFFF),
    );
    let sc32 = _mm512_or_si512(sc16, _mm512_slli_epi32(sc16, 16));
    let mut q = [_mm512_setzero_si512(); 4];
    let mut s = [_mm512_setzero_si512(); 4];
    for g in 0..4 {
        q[g] = _mm512_inserti64x4(_mm512_castsi256_si512(g32[2 * g]), g32[2 * g + 1], 1);
        // Lane l (4 weights) of the 64-weight pair lies in 16-weight sub-block 4g + l / 4.
        let b0 = 4 * g as i32;
        let idx = _mm512_set_epi32(
            b0 + 3,
            b0 + 3,
            b0 + 3,
            b0 + 3,
            b0 + 2,
            b0 + 2,
            b0 + 2,
            b0 + 2,
            b0 + 1,
            b0 + 1,
            b0 + 1,
            b0 + 1,
            b0,
            b0,
            b0,
            b0,
        );
        s[g] = _mm512_permutexvar_epi32(idx, sc32);
    }
    Unpacked {
        q,
        s,
        bias: _mm256_cvtepi8_epi16(_mm_loadu_si128(b.scales.as_ptr().cast())),
        d: load_f16((&b.d as *const f16).cast()),
        dmin: 0.0,
    }
}

/// Adds one super-block product `w · x` to the 8-lane accumulator `acc`.
///
/// # Safety
/// Needs avx512f, avx512bw, avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn accumulate<const Q4K: bool>(u: &Unpacked, x: &BlockQ8K, acc: __m256) -> __m256 {
    let zero = _mm512_setzero_si512();
    // Two independent chains of two pairs each.
    let mut s0 = zero;
    let mut s1 = zero;
    for g in 0..2 {
        let x0 = _mm512_loadu_si512(x.qs.as_ptr().add(128 * g).cast());
        let x1 = _mm512_loadu_si512(x.qs.as_ptr().add(128 * g + 64).cast());
        s0 = _mm512_add_epi32(
            s0,
            _mm512_madd_epi16(_mm512_maddubs_epi16(u.q[2 * g], x0), u.s[2 * g]),
        );
        s1 = _mm512_add_epi32(
            s1,
            _mm512_madd_epi16(_mm512_maddubs_epi16(u.q[2 * g + 1], x1), u.s[2 * g + 1]),
        );
    }
    let s = _mm512_add_epi32(s0, s1);
    let sumi = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    let bs = _mm256_loadu_si256(x.bsums.as_ptr().cast());
    let corr = _mm256_madd_epi16(bs, u.bias);
    if Q4K {
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(x.d * u.d), _mm256_cvtepi32_ps(sumi), acc);
        _mm256_fnmadd_ps(_mm256_set1_ps(x.d * u.dmin), _mm256_cvtepi32_ps(corr), acc)
    } else {
        // The quants above are q + 32: remove 32 * Σ_k sc_k * bsum_k, exactly.
        let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        _mm256_fmadd_ps(_mm256_set1_ps(x.d * u.d), _mm256_cvtepi32_ps(sumi), acc)
    }
}

/// `rows × n_tok` products for `rows ≤ ROWS` weight rows and `n_tok ≤ NT` tokens;
/// `out[t * out_stride + r] = w_row(r) · x_row(t)`.
///
/// # Safety
/// Needs avx512f, avx512bw, avx2, fma, f16c. `w + r*w_stride` (r < rows) must point at `nb`
/// aligned weight blocks of the kind `Q4K` names, `x + t*x_stride` (t < n_tok) at `nb`
/// aligned [`BlockQ8K`]; `out + t*out_stride + r` must be writable.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn sweep<const Q4K: bool, const NT: usize>(
    w: *const u8,
    w_stride: usize,
    rows: usize,
    x: *const u8,
    x_stride: usize,
    n_tok: usize,
    nb: usize,
    out: *mut f32,
    out_stride: usize,
) {
    debug_assert!(rows <= ROWS && n_tok <= NT);
    let wb = if Q4K {
        size_of::<BlockQ4K>()
    } else {
        size_of::<BlockQ6K>()
    };
    let mut acc = [[_mm256_setzero_ps(); NT]; ROWS];
    for ib in 0..nb {
        for (r, acc_r) in acc.iter_mut().enumerate().take(rows) {
            let p = w.add(r * w_stride + ib * wb);
            // Few columns leave the weight stream memory-bound: fetch ahead within the row
            // (`prefetcht0` never faults, so reading past the row's end is harmless).
            if NT <= 8 {
                for line in (0..wb).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(PREFETCH_BLOCKS * wb + line).cast());
                }
            }
            let u = if Q4K {
                unpack_q4k(&*p.cast::<BlockQ4K>())
            } else {
                unpack_q6k(&*p.cast::<BlockQ6K>())
            };
            for (t, a) in acc_r.iter_mut().enumerate().take(n_tok) {
                let bx = &*x
                    .add(t * x_stride + ib * size_of::<BlockQ8K>())
                    .cast::<BlockQ8K>();
                *a = accumulate::<Q4K>(&u, bx, *a);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate().take(rows) {
        for (t, a) in acc_r.iter().enumerate().take(n_tok) {
            *out.add(t * out_stride + r) = hsum_ps(*a);
        }
    }
}

/// [`sweep`] with the smallest accumulator capacity that holds `n_tok ≤ TOKENS` tokens.
///
/// # Safety
/// As [`sweep`].
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn sweep_any<const Q4K: bool>(
    w: *const u8,
    w_stride: usize,
    rows: usize,
    x: *const u8,
    x_stride: usize,
    n_tok: usize,
    nb: usize,
    out: *mut f32,
    out_stride: usize,
) {
    match n_tok {
        1 => sweep::<Q4K, 1>(w, w_stride, rows, x, x_stride, n_tok, nb, out, out_stride),
        2 => sweep::<Q4K, 2>(w, w_stride, rows, x, x_stride, n_tok, nb, out, out_stride),
        3..=4 => sweep::<Q4K, 4>(w, w_stride, rows, x, x_stride, n_tok, nb, out, out_stride),
        5..=8 => sweep::<Q4K, 8>(w, w_stride, rows, x, x_stride, n_tok, nb, out, out_stride),
        _ => sweep::<Q4K, TOKENS>(w, w_stride, rows, x, x_stride, n_tok, nb, out, out_stride),
    }
}

/// All products of a K-quant [`DotTile`] (`out[t * n_rows + r]`), in sweeps of [`ROWS`] rows ×
/// [`TOKENS`] tokens.
///
/// # Safety
/// Needs avx512f, avx512bw, avx2, fma, f16c. The tile's weight and activation bytes must be aligned
/// for [`BlockQ4K`]/[`BlockQ6K`] and [`BlockQ8K`] (the [`DotTile`] contract); the geometry is
/// checked here.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn dot_tile_kquant(kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    let (wb, xb) = (kind.block_bytes(), size_of::<BlockQ8K>());
    let (n_rows, n_tok) = (tile.n_rows(), tile.n_tok());
    let nb = tile.w_row_bytes / wb;
    // Soundness of the raw reads and writes below rests on these O(1) checks.
    assert!(tile.w_row_bytes == nb * wb && tile.x_row_bytes == nb * xb);
    assert!(tile.w.len() == n_rows * tile.w_row_bytes && tile.x.len() == n_tok * tile.x_row_bytes);
    assert_eq!(out.len(), n_rows * n_tok);
    let (ws, xs) = (tile.w_row_bytes, tile.x_row_bytes);
    let (w, x, o) = (tile.w.as_ptr(), tile.x.as_ptr(), out.as_mut_ptr());
    for t0 in (0..n_tok).step_by(TOKENS) {
        let nt = TOKENS.min(n_tok - t0);
        for r0 in (0..n_rows).step_by(ROWS) {
            let nr = ROWS.min(n_rows - r0);
            let (wp, xp, op) = (w.add(r0 * ws), x.add(t0 * xs), o.add(t0 * n_rows + r0));
            match kind {
                KQuant::Q4K => sweep_any::<true>(wp, ws, nr, xp, xs, nt, nb, op, n_rows),
                KQuant::Q6K => sweep_any::<false>(wp, ws, nr, xp, xs, nt, nb, op, n_rows),
            }
        }
    }
}

/// One K-quant dot product through [`dot_tile_kquant`]'s arithmetic (bit-identical to tiles).
///
/// # Safety
/// Needs avx512f, avx512bw, avx2, fma, f16c; `w` and `x` point at `nb` aligned blocks each.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn dot_kquant(kind: KQuant, w: *const u8, x: *const u8, nb: usize) -> f32 {
    let mut out = 0f32;
    match kind {
        KQuant::Q4K => sweep::<true, 1>(w, 0, 1, x, 0, 1, nb, &mut out, 0),
        KQuant::Q6K => sweep::<false, 1>(w, 0, 1, x, 0, 1, nb, &mut out, 0),
    }
    out
}
