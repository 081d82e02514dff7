//! AVX2 Q4_K and Q6_K products against Q8_K activations, for any number of tokens.
//!
//! Scheme (the integer part follows ggml's `ggml_vec_dot_q4_K_q8_K` / `..._q6_K_q8_K` for AVX2
//! in `ggml/src/ggml-cpu/arch/x86/quants.c`): a weight super-block (256 weights) is unpacked
//! once into eight 32-byte groups of unsigned quants and eight vectors of per-group scales
//! ([`Unpacked`]); for each token, `_mm256_maddubs_epi16` (u8 × i8 → i16 pairs) and
//! `_mm256_madd_epi16` with the scales give exact i32 lane sums. Per super-block the lanes of
//! four weight rows are summed to the rows' exact integers at once (one `hadd_epi32` tree,
//! [`totals4`]) and combined in f32, one row per lane, exactly as the scalar reference does
//! (`super::scalar`): Q4_K `acc + ((d_x·d_w)·S − (d_x·dmin)·M)`, Q6_K `acc + (d_x·d_w)·S`, with
//! `S` the scaled product sum and `M` the min term (Q6_K's `+32` offset removed exactly in the
//! integers). So every K-quant result equals the scalar backend's bit for bit, and so every
//! other backend's that follows the same definition (NEON at every level, whatever its integer
//! lane split: `sdot`'s 4-product lanes or `smmla`'s 8-product ones).
//!
//! Blocking ([`dot_tile_kquant`]): `ROWS` weight rows × up to [`TOKENS`] tokens per sweep; for
//! each super-block column the activation blocks of the sweep's tokens (≤ 64 × 292 B) stay in
//! L1 while each row's super-block is unpacked once and applied to every token. That makes a
//! product of 2..5 columns (verification of drafts) read and unpack each weight block once.
//! The prefill sweep takes the tokens three at a time ([`lanes_tb`]): two rows' quants and
//! scales and three tokens' activations per load, six products each.
//! Few-token sweeps (decode, verification) prefetch the weight stream ahead.
//!
//! Every (row, token) accumulator sees the same float operations in the same order whatever
//! the number of rows and tokens in the sweep (integer sums are exact, so their order does not
//! matter): results are bit-identical between a single dot product, a few columns and a
//! prefill tile.

use std::arch::x86_64::*;

use half::f16;

use super::avx2::load_f16;
use super::{DotTile, Piece};
use crate::quant::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};

/// Tokens per sweep (activation blocks of one super-block column for this many tokens stay in
/// L1: 64 × 292 B ≈ 18 KiB).
pub(super) const TOKENS: usize = 64;
/// Weight rows per sweep.
pub(super) const ROWS: usize = 4;

/// Weight kinds handled here.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum KQuant {
    Q4K,
    Q6K,
}

impl KQuant {
    pub(super) fn block_bytes(self) -> usize {
        match self {
            KQuant::Q4K => size_of::<BlockQ4K>(),
            KQuant::Q6K => size_of::<BlockQ6K>(),
        }
    }
}

/// One weight super-block ready for the token loop.
/// `q[j]`: unsigned quants of weights `32j..32j+32` (Q4_K: 0..15, Q6_K: q + 32 in 0..63);
/// `s[j]`: i16 scales for those 32 weights (16 lanes); `bias`: Q4_K mins `m_k` at lanes `2k`
/// and `2k+1`, or Q6_K scales, to pair with the 16 `bsums` of the activation block.
#[derive(Clone, Copy)]
struct Unpacked {
    q: [__m256i; 8],
    s: [__m256i; 8],
    bias: __m256i,
    d: f32,
    dmin: f32,
}

/// Unpacks a [`BlockQ4K`].
///
/// # Safety
/// Needs avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q4k(b: &BlockQ4K) -> Unpacked {
    let mask = _mm256_set1_epi8(0x0F);
    let (sc, mn) = b.scales_mins();
    let mut q = [_mm256_setzero_si256(); 8];
    let mut s = [_mm256_setzero_si256(); 8];
    for g in 0..4 {
        let q4 = _mm256_loadu_si256(b.qs.as_ptr().add(32 * g).cast());
        q[2 * g] = _mm256_and_si256(q4, mask);
        q[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), mask);
        s[2 * g] = _mm256_set1_epi16(sc[2 * g] as i16);
        s[2 * g + 1] = _mm256_set1_epi16(sc[2 * g + 1] as i16);
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
/// Needs avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q6k(b: &BlockQ6K) -> Unpacked {
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut q = [_mm256_setzero_si256(); 8];
    let mut s = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let ql0 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h).cast());
        let ql1 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h + 32).cast());
        let qh = _mm256_loadu_si256(b.qh.as_ptr().add(32 * h).cast());
        q[4 * h] = _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
        );
        q[4 * h + 1] = _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
        );
        q[4 * h + 2] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
            _mm256_and_si256(qh, m30),
        );
        q[4 * h + 3] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
        );
    }
    // s[j]: scale 2j in the low 8 i16 lanes, scale 2j + 1 in the high 8 (a byte shuffle, then
    // sign extension).
    let sc = _mm_loadu_si128(b.scales.as_ptr().cast());
    for (j, sj) in s.iter_mut().enumerate() {
        let (lo, hi) = ((2 * j) as i8, (2 * j + 1) as i8);
        let pick = _mm_set_epi8(
            hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo,
        );
        *sj = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick));
    }
    Unpacked {
        q,
        s,
        bias: _mm256_cvtepi8_epi16(sc),
        d: load_f16((&b.d as *const f16).cast()),
        dmin: 0.0,
    }
}

/// The exact totals of four 8-lane i32 vectors, `[Σ lanes of v[0], …, Σ lanes of v[3]]`
/// (wrapping i32 adds; the callers' totals fit), one `hadd` tree for all four.
///
/// # Safety
/// Needs avx2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn totals4(v: &[__m256i; 4]) -> __m128i {
    // [a01 a23 b01 b23 | a45 a67 b45 b67], the same for c, d; then
    // [a0123 b0123 c0123 d0123 | a4567 b4567 c4567 d4567]; then the halves added.
    let ab = _mm256_hadd_epi32(v[0], v[1]);
    let cd = _mm256_hadd_epi32(v[2], v[3]);
    let h = _mm256_hadd_epi32(ab, cd);
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// The exact i32 lanes of one super-block product of unpacked weights `u` with the
/// activation quants `xv` (`Σ_j scale_j · (q_j · x_j)`, 8 lanes, summing to the scaled
/// product sum `S` of the scalar reference; Q6_K's still include the `+32` offset).
///
/// # Safety
/// Needs avx2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_lanes(u: &Unpacked, xv: &[__m256i; 8]) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for j in 0..8 {
        sumi = _mm256_add_epi32(
            sumi,
            _mm256_madd_epi16(_mm256_maddubs_epi16(u.q[j], xv[j]), u.s[j]),
        );
    }
    sumi
}

/// How far ahead of the super-block being unpacked a few-token sweep prefetches its weight
/// row (bytes). Decode and verification read every weight once and are bound by the weight
/// stream. On the AVX2 EPYC (2 threads, `device-worker bench --mtp-overhead` on the
/// 0.8B-shape Q4_K_M, interleaved runs) the decode pass went from 61–68 ms without to
/// 34–38 ms with it (half of the pass is the 248 320-row Q6_K output head); 3 KiB was a little
/// faster than 2 or 4 KiB and clearly faster than 1 KiB.
const PREFETCH_BYTES: usize = 3072;

/// `rows × n_tok` products for `rows ≤ ROWS` weight rows and `n_tok ≤ NT` tokens (`NT`: the
/// accumulator capacity, so that a few columns do not pay for a prefill-sized one);
/// `out[t * out_stride + r] = w_row(r) · x_row(t)`.
///
/// Per super-block column the [`ROWS`] rows' blocks are unpacked once (a missing row repeats
/// the last one; its lanes are dropped), then for each token the four rows' exact integer
/// sums come out of one [`totals4`] tree and are combined in f32 with one 4-lane (one lane
/// per row) multiply and add: per lane exactly the scalar reference's operations
/// (`super::scalar`, `vec_dot_q4_k_q8_k` / `vec_dot_q6_k_q8_k`): Q4_K
/// `acc + ((d_x·d_w)·S − (d_x·dmin)·M)`, Q6_K `acc + (d_x·d_w)·S` (its `+32` offset removed
/// exactly in the integers as `32 · Σ_k sc_k · bsum_k`). The prefill tile; [`sweep_few`]
/// serves decode and verification.
///
/// # Safety
/// Needs avx2, fma, f16c. `w + r*w_stride` (r < rows) must point at `nb` aligned weight blocks
/// of kind `kind`, `x + t*x_stride` (t < n_tok) at `nb` aligned [`BlockQ8K`];
/// `out + t*out_stride + r` must be writable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sweep<const Q4K: bool, const NT: usize>(p: Piece) {
    let Piece { w, w_stride, rows, x, x_stride, n_tok, nb, out, out_stride } = p;
    debug_assert!(0 < rows && rows <= ROWS && n_tok <= NT);
    let wb = if Q4K { KQuant::Q4K } else { KQuant::Q6K }.block_bytes();
    let mut acc = [_mm_setzero_ps(); NT];
    // SAFETY (zeroed): plain integer and float vectors.
    let mut u: [Unpacked; ROWS] = std::mem::zeroed();
    for ib in 0..nb {
        for (r, ur) in u.iter_mut().enumerate() {
            let p = w.add(r.min(rows - 1) * w_stride + ib * wb);
            *ur = if Q4K {
                unpack_q4k(&*p.cast::<BlockQ4K>())
            } else {
                unpack_q6k(&*p.cast::<BlockQ6K>())
            };
        }
        let dw = _mm_set_ps(u[3].d, u[2].d, u[1].d, u[0].d);
        let dmin = _mm_set_ps(u[3].dmin, u[2].dmin, u[1].dmin, u[0].dmin);
        let block = |t: usize| {
            &*x.add(t * x_stride + ib * size_of::<BlockQ8K>()).cast::<BlockQ8K>()
        };
        let mut t = 0;
        while t + TB <= n_tok {
            let bx: [&BlockQ8K; TB] = std::array::from_fn(|k| block(t + k));
            let sums = lanes_tb(&u, &bx);
            for (k, b) in bx.iter().enumerate() {
                let bs = _mm256_loadu_si256(b.bsums.as_ptr().cast());
                let (sums, corr) = offsets::<Q4K>(&u, bs, sums[k]);
                acc[t + k] = combine::<Q4K>(acc[t + k], b.d, (dw, dmin), &sums, &corr);
            }
            t += TB;
        }
        for (t, acc_t) in acc.iter_mut().enumerate().take(n_tok).skip(t) {
            let bx = block(t);
            let mut xv = [_mm256_setzero_si256(); 8];
            for (j, xj) in xv.iter_mut().enumerate() {
                *xj = _mm256_loadu_si256(bx.qs.as_ptr().add(32 * j).cast());
            }
            let sums: [__m256i; ROWS] = std::array::from_fn(|r| scaled_lanes(&u[r], &xv));
            let bs = _mm256_loadu_si256(bx.bsums.as_ptr().cast());
            let (sums, corr) = offsets::<Q4K>(&u, bs, sums);
            *acc_t = combine::<Q4K>(*acc_t, bx.d, (dw, dmin), &sums, &corr);
        }
    }
    store_rows(&acc[..n_tok], rows, out, out_stride);
}

/// Tokens per register block of the prefill tile ([`lanes_tb`]).
const TB: usize = 3;

/// [`scaled_lanes`] of the [`ROWS`] unpacked rows `u` with [`TB`] tokens' activation blocks,
/// `[token][row]`, register-blocked: per 32-weight group two rows' quants and scales and the
/// tokens' activations are loaded once and give 2 × [`TB`] products, so the multiplies are not
/// held back by loads (the one-token loop loads a row's quants and scales for every token).
/// The same exact integer lanes as [`scaled_lanes`].
///
/// # Safety
/// Needs avx2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes_tb(u: &[Unpacked; ROWS], bx: &[&BlockQ8K; TB]) -> [[__m256i; ROWS]; TB] {
    let mut out = [[_mm256_setzero_si256(); ROWS]; TB];
    for rp in 0..ROWS / 2 {
        let (ua, ub) = (&u[2 * rp], &u[2 * rp + 1]);
        let mut a = [[_mm256_setzero_si256(); TB]; 2];
        for j in 0..8 {
            let xv: [__m256i; TB] =
                std::array::from_fn(|k| _mm256_loadu_si256(bx[k].qs.as_ptr().add(32 * j).cast()));
            for (row, acc) in [ua, ub].into_iter().zip(a.iter_mut()) {
                let (q, s) = (row.q[j], row.s[j]);
                for k in 0..TB {
                    acc[k] = _mm256_add_epi32(
                        acc[k],
                        _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv[k]), s),
                    );
                }
            }
        }
        for k in 0..TB {
            out[k][2 * rp] = a[0][k];
            out[k][2 * rp + 1] = a[1][k];
        }
    }
    out
}

/// The min / offset terms of one token's products with the [`ROWS`] rows `u`: `corr[r]` =
/// `bsums · bias_r` (Q4_K's `M` lanes), and Q6_K's `+32` offset (`32 · corr`) taken out of
/// `sums` exactly in the integers. Returns `(sums, corr)` for [`combine`].
///
/// # Safety
/// Needs avx2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offsets<const Q4K: bool>(
    u: &[Unpacked; ROWS],
    bs: __m256i,
    mut sums: [__m256i; ROWS],
) -> ([__m256i; ROWS], [__m256i; ROWS]) {
    let corr: [__m256i; ROWS] = std::array::from_fn(|r| _mm256_madd_epi16(bs, u[r].bias));
    if !Q4K {
        for r in 0..ROWS {
            sums[r] = _mm256_sub_epi32(sums[r], _mm256_slli_epi32(corr[r], 5));
        }
    }
    (sums, corr)
}

/// Adds one super-block column to a token's 4-lane accumulator (one lane per weight row), per
/// lane exactly as the scalar reference: Q4_K `acc + ((d_x·d_w)·S − (d_x·dmin)·M)` with
/// `S`, `M` the totals of `sums`, `corr`; Q6_K `acc + (d_x·d_w)·S` (`sums` already without
/// the `+32` offset, `corr` unused).
///
/// # Safety
/// Needs avx2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn combine<const Q4K: bool>(
    acc: __m128,
    d_x: f32,
    (dw, dmin): (__m128, __m128),
    sums: &[__m256i; ROWS],
    corr: &[__m256i; ROWS],
) -> __m128 {
    let dx = _mm_set1_ps(d_x);
    let ds = _mm_mul_ps(_mm_mul_ps(dx, dw), _mm_cvtepi32_ps(totals4(sums)));
    if Q4K {
        let dm = _mm_mul_ps(_mm_mul_ps(dx, dmin), _mm_cvtepi32_ps(totals4(corr)));
        _mm_add_ps(acc, _mm_sub_ps(ds, dm))
    } else {
        _mm_add_ps(acc, ds)
    }
}

/// [`sweep`] for `n_tok ≤ NT ≤ 8` tokens (decode, verification), rows outer: each row's
/// block is unpacked into registers and applied to every token at once (no unpacked copy in
/// memory), the weight stream prefetched [`PREFETCH_BYTES`] ahead. The same operations per
/// (row, token) as [`sweep`], so the same bits.
///
/// # Safety
/// As [`sweep`], with `NT ≤ 8`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sweep_few<const Q4K: bool, const NT: usize>(p: Piece) {
    let Piece { w, w_stride, rows, x, x_stride, n_tok, nb, out, out_stride } = p;
    debug_assert!(0 < rows && rows <= ROWS && n_tok <= NT && NT <= 8);
    let wb = if Q4K { KQuant::Q4K } else { KQuant::Q6K }.block_bytes();
    let mut acc = [_mm_setzero_ps(); NT];
    for ib in 0..nb {
        let mut sums = [[_mm256_setzero_si256(); ROWS]; NT];
        let mut corr = [[_mm256_setzero_si256(); ROWS]; NT];
        let (mut dw, mut dmin) = ([0f32; ROWS], [0f32; ROWS]);
        for r in 0..ROWS {
            let p = w.add(r.min(rows - 1) * w_stride + ib * wb);
            // A hint; prefetches never fault, so reading past the matrix's end is harmless.
            for line in (0..wb).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES + line).cast());
            }
            let u = if Q4K {
                unpack_q4k(&*p.cast::<BlockQ4K>())
            } else {
                unpack_q6k(&*p.cast::<BlockQ6K>())
            };
            (dw[r], dmin[r]) = (u.d, u.dmin);
            for t in 0..n_tok {
                let bx = &*x
                    .add(t * x_stride + ib * size_of::<BlockQ8K>())
                    .cast::<BlockQ8K>();
                let mut xv = [_mm256_setzero_si256(); 8];
                for (j, xj) in xv.iter_mut().enumerate() {
                    *xj = _mm256_loadu_si256(bx.qs.as_ptr().add(32 * j).cast());
                }
                let c = _mm256_madd_epi16(_mm256_loadu_si256(bx.bsums.as_ptr().cast()), u.bias);
                let lanes = scaled_lanes(&u, &xv);
                (sums[t][r], corr[t][r]) = if Q4K {
                    (lanes, c)
                } else {
                    (_mm256_sub_epi32(lanes, _mm256_slli_epi32(c, 5)), c)
                };
            }
        }
        let dw = _mm_loadu_ps(dw.as_ptr());
        let dmin = _mm_loadu_ps(dmin.as_ptr());
        for t in 0..n_tok {
            let d_x = (*x
                .add(t * x_stride + ib * size_of::<BlockQ8K>())
                .cast::<BlockQ8K>())
            .d;
            acc[t] = combine::<Q4K>(acc[t], d_x, (dw, dmin), &sums[t], &corr[t]);
        }
    }
    store_rows(&acc[..n_tok], rows, out, out_stride);
}

/// Writes 4-lane accumulators (token `t`, lane `r` = row `r`) to `out[t * out_stride + r]`
/// for the first `rows` lanes.
///
/// # Safety
/// Needs avx2; `out + t*out_stride + r` writable for `t < acc.len()`, `r < rows ≤ ROWS`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_rows(acc: &[__m128], rows: usize, out: *mut f32, out_stride: usize) {
    for (t, acc_t) in acc.iter().enumerate() {
        let mut lanes = [0f32; ROWS];
        _mm_storeu_ps(lanes.as_mut_ptr(), *acc_t);
        for (r, &v) in lanes.iter().enumerate().take(rows) {
            *out.add(t * out_stride + r) = v;
        }
    }
}

/// [`sweep`] with the smallest accumulator capacity that holds `n_tok ≤ TOKENS` tokens.
///
/// # Safety
/// As [`sweep`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sweep_any<const Q4K: bool>(p: Piece) {
    match p.n_tok {
        1 => sweep_few::<Q4K, 1>(p),
        2 => sweep_few::<Q4K, 2>(p),
        3..=4 => sweep_few::<Q4K, 4>(p),
        5..=8 => sweep_few::<Q4K, 8>(p),
        _ => sweep::<Q4K, TOKENS>(p),
    }
}

/// All products of a K-quant [`DotTile`] (`out[t * n_rows + r]`), in sweeps of [`ROWS`] rows ×
/// [`TOKENS`] tokens.
///
/// # Safety
/// Needs avx2, fma, f16c. The tile's weight and activation bytes must be aligned for
/// [`BlockQ4K`]/[`BlockQ6K`] and [`BlockQ8K`] (the [`DotTile`] contract); the geometry is
/// checked here.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_tile_kquant(kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    let (wb, xb) = (kind.block_bytes(), size_of::<BlockQ8K>());
    for piece in tile.raw(wb, xb, out).pieces(ROWS, TOKENS) {
        match kind {
            KQuant::Q4K => sweep_any::<true>(piece),
            KQuant::Q6K => sweep_any::<false>(piece),
        }
    }
}

/// One K-quant dot product through [`dot_tile_kquant`]'s arithmetic (bit-identical to tiles).
///
/// # Safety
/// Needs avx2, fma, f16c; `w` and `x` point at `nb` aligned blocks each.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_kquant(kind: KQuant, w: *const u8, x: *const u8, nb: usize) -> f32 {
    let mut out = 0f32;
    match kind {
        KQuant::Q4K => sweep_few::<true, 1>(Piece::single(w, x, nb, &mut out)),
        KQuant::Q6K => sweep_few::<false, 1>(Piece::single(w, x, nb, &mut out)),
    }
    out
}
