//! AVX2 Q4_K and Q6_K products against Q8_K activations, for any number of tokens.
//!
//! Scheme (the integer part follows ggml's `ggml_vec_dot_q4_K_q8_K` / `..._q6_K_q8_K` for AVX2
//! in `ggml/src/ggml-cpu/arch/x86/quants.c`): a weight super-block (256 weights) is unpacked
//! once into eight 32-byte groups of unsigned quants and eight vectors of per-group scales
//! ([`Unpacked`]); for each token, `_mm256_maddubs_epi16` (u8 × i8 → i16 pairs) and
//! `_mm256_madd_epi16` with the scales give exact i32 lane sums. Per super-block the lanes are
//! summed to the block's exact integers (one `hadd_epi32` joins the product and bsum-term
//! lanes, [`block_totals`]) and combined in f32 exactly as the scalar reference does
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
    for (j, sj) in s.iter_mut().enumerate() {
        *sj = _mm256_set_m128i(
            _mm_set1_epi16(b.scales[2 * j + 1] as i16),
            _mm_set1_epi16(b.scales[2 * j] as i16),
        );
    }
    Unpacked {
        q,
        s,
        bias: _mm256_cvtepi8_epi16(_mm_loadu_si128(b.scales.as_ptr().cast())),
        d: load_f16((&b.d as *const f16).cast()),
        dmin: 0.0,
    }
}

/// The exact totals `[Σ lanes of a, Σ lanes of b]` of two 8-lane i32 vectors (wrapping i32
/// adds; the callers' totals fit), as f32 lanes 0 and 1 (exact conversion up to 2^24, else
/// rounded to nearest as `i32 as f32`).
///
/// # Safety
/// Needs avx2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_totals(a: __m256i, b: __m256i) -> (f32, f32) {
    // [a01 a23 b01 b23 | a45 a67 b45 b67] -> [A0 A1 B0 B1] -> [A B A B].
    let h = _mm256_hadd_epi32(a, b);
    let q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let t = _mm_cvtepi32_ps(_mm_hadd_epi32(q, q));
    (_mm_cvtss_f32(t), _mm_cvtss_f32(_mm_movehdup_ps(t)))
}

/// Adds one super-block product `w · x` to the running f32 sum `acc`, with the scalar
/// reference's operations (`super::scalar`, `vec_dot_q4_k_q8_k` / `vec_dot_q6_k_q8_k`).
///
/// # Safety
/// Needs avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate<const Q4K: bool>(u: &Unpacked, x: &BlockQ8K, acc: f32) -> f32 {
    let mut sumi = _mm256_setzero_si256();
    for j in 0..8 {
        let xv = _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast());
        sumi = _mm256_add_epi32(
            sumi,
            _mm256_madd_epi16(_mm256_maddubs_epi16(u.q[j], xv), u.s[j]),
        );
    }
    let bs = _mm256_loadu_si256(x.bsums.as_ptr().cast());
    let corr = _mm256_madd_epi16(bs, u.bias);
    if Q4K {
        let (s, m) = block_totals(sumi, corr);
        acc + ((x.d * u.d) * s - (x.d * u.dmin) * m)
    } else {
        // The quants above are q + 32: remove 32 * Σ_k sc_k * bsum_k, exactly.
        let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        let (s, _) = block_totals(sumi, _mm256_setzero_si256());
        acc + (x.d * u.d) * s
    }
}

/// The finished sum of a (row, token) pair (the sweep's reduction hook: already one f32).
#[inline(always)]
fn total(acc: f32) -> f32 {
    acc
}

/// `rows × n_tok` products for `rows ≤ ROWS` weight rows and `n_tok ≤ NT` tokens (`NT`: the
/// accumulator capacity, so that a few columns do not pay for a prefill-sized one);
/// `out[t * out_stride + r] = w_row(r) · x_row(t)`.
///
/// # Safety
/// Needs avx2, fma, f16c. `w + r*w_stride` (r < rows) must point at `nb` aligned weight blocks
/// of kind `kind`, `x + t*x_stride` (t < n_tok) at `nb` aligned [`BlockQ8K`];
/// `out + t*out_stride + r` must be writable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sweep<const Q4K: bool, const NT: usize>(p: Piece) {
    kquant_sweep!(p, Q4K, NT, ROWS, 0f32, |u, bx, a| accumulate::<Q4K>(&u, bx, a), total)
}

/// [`sweep`] with the smallest accumulator capacity that holds `n_tok ≤ TOKENS` tokens.
///
/// # Safety
/// As [`sweep`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sweep_any<const Q4K: bool>(p: Piece) {
    match p.n_tok {
        1 => sweep::<Q4K, 1>(p),
        2 => sweep::<Q4K, 2>(p),
        3..=4 => sweep::<Q4K, 4>(p),
        5..=8 => sweep::<Q4K, 8>(p),
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
        KQuant::Q4K => sweep::<true, 1>(Piece::single(w, x, nb, &mut out)),
        KQuant::Q6K => sweep::<false, 1>(Piece::single(w, x, nb, &mut out)),
    }
    out
}
