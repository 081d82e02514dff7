//! AVX-512 Q4_K and Q6_K products against Q8_K activations, for any number of tokens.
//!
//! A weight super-block (256 weights) is unpacked once per row and applied to every token of
//! the tile: up to [`FEW`] tokens (decode, verification) row by row with all accumulators in
//! registers ([`sweep_few`]), more as a blocked product of [`ROWS`] rows × groups of 4 tokens
//! over an L1 buffer of unpacked blocks ([`sweep_tile`], [`micro_tile`]). Integer part per
//! token and super-block ([`isum`]): one `vpdpbusd` per 64 weights (exact sums of four u8 × i8
//! products per i32 lane), two such results packed to i16 (`vpackssdw`, no saturation at these
//! ranges) and one `vpmaddwd`/`vpdpwssd` against the sub-block scales: 6 multiply instructions
//! per 256 weights where `maddubs` + `madd` take 8 (measured on this project's Xeon with
//! independent 512-bit instructions: `vpmaddwd` ~2 per cycle, `vpackssdw` and `vpermw` 1, so
//! the multiplies and the packs share the two 512-bit ports that bound the few-column case). Its 16 lanes are folded
//! to 8, converted, scaled by `d_w` and `d_x`; Q4_K's min term is one FMA of `dmin · m_k` with
//! `d_x · (bsum_2k + bsum_2k+1)` (computed once per tile, [`XTerms`]); Q6_K's `−32` offset is
//! removed exactly in the integer domain (one more `vpdpwssd` of `−32 · sc_j` with `bsum_j`). Tokens go in pairs that
//! share the fold, conversion, scaling and final reduction ([`accumulate_pair`],
//! [`pair_totals`]); a lone token gets the same operations per lane ([`accumulate`],
//! [`single_total`]).
//!
//! Every (row, token) product gets the same operations in every tile shape, so a batched
//! verification pass equals one-token decode bit for bit; results differ from the AVX2
//! backend's only in f32 rounding (the integer sums are spread over other lanes and the min
//! term is summed in another order), tested against the scalar reference in
//! `tests/conformance.rs`.
//!
//! Scheme of the integer sums: ggml's `ggml_vec_dot_q4_K_q8_K` / `..._q6_K_q8_K`
//! (`ggml/src/ggml-cpu/arch/x86/quants.c`).

use std::arch::x86_64::*;

use half::f16;

use super::avx2::load_f16;
use super::avx2_kquants::KQuant;
use super::DotTile;
use crate::quant::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};

/// Tokens per sweep of [`sweep_tile`] (activation blocks of one super-block column for this
/// many tokens stay in L1: 64 × 292 B ≈ 18 KiB).
const TOKENS: usize = 64;
/// Weight rows per sweep of [`sweep_tile`].
const ROWS: usize = 4;
const _: () = assert!(ROWS == 4, "sweep_tile stores its rows through store_totals_quad");
/// Tokens up to which [`dot_tile_kquant`] takes the row-at-a-time [`sweep_few`] path.
const FEW: usize = 8;
/// Super-blocks ahead of the one being unpacked that [`sweep_few`] prefetches.
const PREFETCH_BLOCKS: usize = 12;

/// One weight super-block ready for the token loop.
/// `q[g]`: unsigned quants of weights `64g..64g+64` (Q4_K: 0..15, Q6_K: q + 32 in 0..63);
/// `s[h]`: i16 scales laid out for the packed register pair `h` of [`isum`]
/// ([`pair_scale_index`]);
/// `d`: the block scale in all lanes; `min`: Q4_K `dmin · m_k` at lanes `k` and `8 + k` (for
/// the min term of a token pair; the low half for one token); `offset`: Q6_K `−32 · sc_j` as
/// i16 (words 0..16; for the −32 offset, applied in [`isum`]).
#[derive(Clone, Copy)]
struct Unpacked {
    q: [__m512i; 4],
    s: [__m512i; 2],
    d: __m512,
    min: __m512,
    offset: __m512i,
}

/// Index vector for `vpermw` that spreads per-sub-block i16 scales over the words of a packed
/// pair (`_mm512_packs_epi32(d_a, d_b)` of the `vpdpbusd` results of registers `a` and `a + 1`
/// of [`Unpacked::q`]): in 128-bit chunk `c`, words 0..4 come from i32 lanes 4c..4c+4 of `d_a`,
/// words 4..8 from the same lanes of `d_b`. `SUB` sub-blocks per 64-weight register (2 for
/// Q4_K's 32-weight sub-blocks, 4 for Q6_K's 16-weight ones); `first`: the sub-block of
/// register `a`'s first weight.
#[inline(always)]
unsafe fn pair_scale_index<const SUB: usize>(first: usize) -> __m512i {
    let mut idx = [0i16; 32];
    for (w, v) in idx.iter_mut().enumerate() {
        let (c, k) = (w / 8, w % 8);
        let (reg, lane) = (k / 4, 4 * c + k % 4);
        *v = (first + SUB * reg + lane * SUB / 16) as i16;
    }
    _mm512_loadu_si512(idx.as_ptr().cast())
}

/// Unpacks a [`BlockQ4K`].
///
/// # Safety
/// Needs avx512f, avx512bw, avx512vl, avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn unpack_q4k(b: &BlockQ4K) -> Unpacked {
    let mask = _mm512_set1_epi8(0x0F);
    let (d_dmin, sc_mn) = q4k_header(b);
    let mut q = [_mm512_setzero_si512(); 4];
    for (g, qg) in q.iter_mut().enumerate() {
        // The 32 bytes in both halves (a broadcast load), the high half shifted to its high
        // nibbles: no cross-lane shuffle.
        let q4 = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.qs.as_ptr().add(32 * g).cast()));
        *qg = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(q4, 0xFFFF_0000, q4), mask);
    }
    let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sc_mn));
    let m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi64(sc_mn, sc_mn)));
    let d = _mm512_broadcastss_ps(d_dmin);
    let dmin = _mm512_broadcastss_ps(_mm_movehdup_ps(d_dmin));
    Unpacked {
        q,
        s: [
            _mm512_permutexvar_epi16(pair_scale_index::<2>(0), sc16),
            _mm512_permutexvar_epi16(pair_scale_index::<2>(4), sc16),
        ],
        d,
        min: _mm512_mul_ps(dmin, m),
        offset: _mm512_setzero_si512(),
    }
}

/// The 16-byte head of a [`BlockQ4K`] decoded on vector registers: `d`, `dmin` as f32 in lanes
/// 0 and 1 of `.0`, and in `.1` the eight 6-bit scales (bytes 0..8) and mins (8..16), as
/// [`BlockQ4K::scales_mins`] unpacks them (ggml's `get_scale_min_k4`). Shuffles and masks on
/// one 128-bit register instead of scalar word operations and inserts, which competed with the
/// integer dot products for the vector ports (~10 % of a 4-token sweep).
///
/// # Safety
/// Needs avx2, f16c.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q4k_header(b: &BlockQ4K) -> (__m128, __m128i) {
    let v = _mm_loadu_si128((b as *const BlockQ4K).cast());
    // Bytes 4..16 of the block are scales[0..12]; `s[j]` below is scales[j] at byte 4 + j.
    // Low parts: sc_j = s[j] & 63 (j < 4), s[j + 4] & 15 (j ≥ 4); m_j = s[j + 4] & 63 (j < 4),
    // s[j + 4] >> 4 (j ≥ 4).
    let lo = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    let mask = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
    let mask_hi = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
    let low = _mm_or_si128(_mm_and_si128(lo, mask), _mm_and_si128(_mm_srli_epi16::<4>(lo), mask_hi));
    // High bits of j ≥ 4: sc_j gets s[j - 4] >> 6, m_j gets s[j] >> 6, at bits 4..6.
    let z = -128i8;
    let hi = _mm_shuffle_epi8(v, _mm_setr_epi8(z, z, z, z, 4, 5, 6, 7, z, z, z, z, 8, 9, 10, 11));
    let high = _mm_and_si128(_mm_srli_epi16::<2>(hi), _mm_set1_epi8(0x30));
    (_mm_cvtph_ps(v), _mm_or_si128(low, high))
}

/// Unpacks a [`BlockQ6K`] (quants rebuilt from `ql`/`qh` as `q + 32`).
///
/// # Safety
/// Needs avx512f, avx512bw, avx512vl, avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn unpack_q6k(b: &BlockQ6K) -> Unpacked {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    // Element order as ggml's dequantize_row_q6_K: 32-weight group j = 4h + k takes the low
    // (k = 0, 1) or high (k = 2, 3) nibbles of ql[64h + 32(k % 2)..][..32] and bits 2k, 2k + 1
    // of qh[32h..][..32]. Register q[2h] holds groups 4h, 4h + 1, q[2h + 1] groups 4h + 2, 4h + 3:
    // one 64-byte ql load covers both, the 32 qh bytes are broadcast to both halves and
    // shifted per half (words 0..16 / 16..32) to bits 4..5.
    let up_4_2 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
    let down_0_2 = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
    let mut q = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        let ql = _mm512_loadu_si512(b.ql.as_ptr().add(64 * h).cast());
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.qh.as_ptr().add(32 * h).cast()));
        q[2 * h] = _mm512_or_si512(
            _mm512_and_si512(ql, m4),
            _mm512_and_si512(_mm512_sllv_epi16(qh, up_4_2), m30),
        );
        q[2 * h + 1] = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
            _mm512_and_si512(_mm512_srlv_epi16(qh, down_0_2), m30),
        );
    }
    let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.scales.as_ptr().cast()));
    let sc16 = _mm512_castsi256_si512(sc);
    Unpacked {
        q,
        s: [
            _mm512_permutexvar_epi16(pair_scale_index::<4>(0), sc16),
            _mm512_permutexvar_epi16(pair_scale_index::<4>(8), sc16),
        ],
        d: _mm512_set1_ps(load_f16((&b.d as *const f16).cast())),
        min: _mm512_setzero_ps(),
        offset: _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5))),
    }
}

/// Unpacks the super-block at `p` (of the kind `Q4K` names).
///
/// # Safety
/// Needs avx512f, avx512bw, avx512vl, avx2, fma, f16c; `p` points at an aligned block.
#[inline(always)]
unsafe fn unpack<const Q4K: bool>(p: *const u8) -> Unpacked {
    if Q4K {
        unpack_q4k(&*p.cast::<BlockQ4K>())
    } else {
        unpack_q6k(&*p.cast::<BlockQ6K>())
    }
}

/// Bytes of one weight super-block of the kind `Q4K` names.
const fn block_bytes<const Q4K: bool>() -> usize {
    if Q4K {
        size_of::<BlockQ4K>()
    } else {
        size_of::<BlockQ6K>()
    }
}

/// The integer part of one super-block product `w · x`: 16 i32 lanes whose sum is
/// `Σ_k sc_k · Σ_{j in k} q_j · x_j` (exact). Per 64 weights one `vpdpbusd` (|lane| ≤
/// 4·63·128 < 2^15), two of them packed to i16 with `vpackssdw`, then one `vpdpwssd` against
/// the scales laid out by [`pair_scale_index`]. Q6_K's quants are stored `+ 32`: one more
/// `vpdpwssd` adds `−32 · Σ_j sc_j · bsum_j` (lanes 0..8: sub-blocks `2i, 2i + 1`; exact).
///
/// # Safety
/// Needs avx512f, avx512bw, avx512vnni.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn isum<const Q4K: bool>(u: &Unpacked, x: &BlockQ8K) -> __m512i {
    let zero = _mm512_setzero_si512();
    let packed = |h: usize| {
        let x0 = _mm512_loadu_si512(x.qs.as_ptr().add(128 * h).cast());
        let x1 = _mm512_loadu_si512(x.qs.as_ptr().add(128 * h + 64).cast());
        let d0 = _mm512_dpbusd_epi32(zero, u.q[2 * h], x0);
        let d1 = _mm512_dpbusd_epi32(zero, u.q[2 * h + 1], x1);
        _mm512_packs_epi32(d0, d1)
    };
    let mut s = _mm512_madd_epi16(packed(0), u.s[0]);
    // `vpdpwssd` written out: LLVM otherwise splits it into `vpmaddwd` + `vpaddd` for generic
    // x86-64 tuning, one more instruction on the busy vector ports.
    std::arch::asm!(
        "vpdpwssd {acc}, {a}, {b}",
        acc = inout(zmm_reg) s,
        a = in(zmm_reg) packed(1),
        b = in(zmm_reg) u.s[1],
        options(pure, nomem, nostack, preserves_flags)
    );
    if !Q4K {
        // A 256-bit load leaves words 16..32 zero.
        let bs = _mm512_zextsi256_si512(_mm256_loadu_si256(x.bsums.as_ptr().cast()));
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) s,
            a = in(zmm_reg) bs,
            b = in(zmm_reg) u.offset,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    s
}

/// Per-token activation terms of a tile, laid out so that tokens `t`, `t + 1` of one
/// super-block are 16 consecutive floats: at `(ib · n_tok + t) · 8 + k`, `dx` holds `d_x`
/// (eight copies) and `min` (Q4_K) `d_x · (bsum_2k + bsum_2k+1)`, the sums of the 16-weight
/// activation sums over Q4_K's 32-weight sub-blocks.
struct XTerms {
    n_tok: usize,
    dx: Vec<f32>,
    min: Vec<f32>,
}

impl XTerms {
    /// # Safety
    /// `x + t*x_stride` (t < n_tok) must point at `nb` aligned [`BlockQ8K`].
    unsafe fn new(q4k: bool, x: *const u8, x_stride: usize, n_tok: usize, nb: usize) -> XTerms {
        let mut dx = vec![0f32; n_tok * nb * 8];
        let mut min = vec![0f32; if q4k { n_tok * nb * 8 } else { 0 }];
        for ib in 0..nb {
            for t in 0..n_tok {
                let b = x_block(x, x_stride, t, ib);
                let at = (ib * n_tok + t) * 8;
                dx[at..at + 8].fill(b.d);
                if q4k {
                    for k in 0..8 {
                        let bs = i32::from(b.bsums[2 * k]) + i32::from(b.bsums[2 * k + 1]);
                        min[at + k] = b.d * bs as f32;
                    }
                }
            }
        }
        XTerms { n_tok, dx, min }
    }

    /// Offset of token `t`'s terms of super-block `ib`.
    #[inline(always)]
    fn at(&self, t: usize, ib: usize) -> usize {
        (ib * self.n_tok + t) * 8
    }
}

/// Adds one super-block product `w · x_t` to token `t`'s 8-lane accumulator: the 16 integer
/// lanes of [`isum`] folded to 8 (`lo + hi`), converted, times `d_w`,
/// times `d_x` added, Q4_K's `dmin · m_k · d_x · bs_k` subtracted.
///
/// # Safety
/// Needs avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx2, fma, f16c; token `t` and
/// super-block `ib` within `xt`.
#[inline(always)]
unsafe fn accumulate<const Q4K: bool>(u: &Unpacked, x: &BlockQ8K, xt: &XTerms, t: usize, ib: usize, acc: __m256) -> __m256 {
    let s = isum::<Q4K>(u, x);
    let s = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
    let at = xt.at(t, ib);
    let scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm512_castps512_ps256(u.d));
    let acc = _mm256_fmadd_ps(scaled, _mm256_loadu_ps(xt.dx.as_ptr().add(at)), acc);
    if Q4K {
        _mm256_fnmadd_ps(_mm512_castps512_ps256(u.min), _mm256_loadu_ps(xt.min.as_ptr().add(at)), acc)
    } else {
        acc
    }
}

/// [`accumulate`] for tokens `t` and `t + 1` at once (token `t` in the low 8 lanes of `acc`,
/// `t + 1` in the high 8): every lane gets exactly [`accumulate`]'s operations, and the fold,
/// conversion, scaling and min term of the two tokens share instructions.
///
/// # Safety
/// As [`accumulate`], for tokens `t` and `t + 1`.
#[inline(always)]
unsafe fn accumulate_pair<const Q4K: bool>(
    u: &Unpacked,
    xa: &BlockQ8K,
    xb: &BlockQ8K,
    xt: &XTerms,
    t: usize,
    ib: usize,
    acc: __m512,
) -> __m512 {
    let (sa, sb) = (isum::<Q4K>(u, xa), isum::<Q4K>(u, xb));
    let lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(sa, sb);
    let hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(sa, sb);
    let s = _mm512_add_epi32(lo, hi);
    let at = xt.at(t, ib);
    let scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(s), u.d);
    let acc = _mm512_fmadd_ps(scaled, _mm512_loadu_ps(xt.dx.as_ptr().add(at)), acc);
    if Q4K {
        _mm512_fnmadd_ps(u.min, _mm512_loadu_ps(xt.min.as_ptr().add(at)), acc)
    } else {
        acc
    }
}

/// The sums of the two 8-lane halves of a pair accumulator (token a: lanes 0..8, token b:
/// 8..16), both reduced in the same order by shared shuffles; a single token's 8-lane
/// accumulator goes through [`single_total`], which keeps that order.
///
/// # Safety
/// Needs avx512f.
#[inline(always)]
unsafe fn pair_totals(acc: __m512) -> (f32, f32) {
    // Within each 128-bit chunk: lanes i + (i ^ 2), then + (i ^ 1); then chunk 0 + 1, 2 + 3.
    let s = _mm512_add_ps(acc, _mm512_permute_ps::<0b01_00_11_10>(acc));
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
    let s = _mm512_add_ps(s, _mm512_shuffle_f32x4::<0b10_11_00_01>(s, s));
    (_mm512_cvtss_f32(s), _mm512_cvtss_f32(_mm512_shuffle_f32x4::<0b10_10_10_10>(s, s)))
}

/// [`pair_totals`] of a single token's 8-lane accumulator (bit-identical to its value in
/// either half of a pair).
///
/// # Safety
/// Needs avx512f.
#[inline(always)]
unsafe fn single_total(acc: __m256) -> f32 {
    pair_totals(_mm512_zextps256_ps512(acc)).0
}

/// Writes one weight row's products with `n_tok` tokens, `out[t * out_stride]`, from its pair
/// accumulators `acc2` (tokens 2i, 2i + 1) and, for odd `n_tok`, the last token's `acc1`.
///
/// # Safety
/// Needs avx512f; `out + t*out_stride` (t < n_tok) must be writable, `acc2.len() ≥ n_tok / 2`.
#[inline(always)]
unsafe fn store_totals(acc2: &[__m512], acc1: __m256, n_tok: usize, out: *mut f32, out_stride: usize) {
    for (i, a) in acc2.iter().enumerate().take(n_tok / 2) {
        let (ta, tb) = pair_totals(*a);
        *out.add(2 * i * out_stride) = ta;
        *out.add((2 * i + 1) * out_stride) = tb;
    }
    if n_tok % 2 == 1 {
        *out.add((n_tok - 1) * out_stride) = single_total(acc1);
    }
}

/// The totals of four pair accumulators at once (rows `A..D` of [`sweep_few`] or
/// [`sweep_tile`]): 128-bit chunk 0 of the result holds the low-half (token `t`) totals of
/// `a, b, c, d`, chunk 2 their high-half (token `t + 1`) totals, each summed in exactly
/// [`pair_totals`]' order (lanes `i + (i ^ 2)`, then `+ (i ^ 1)`, then chunk `0 + 1`), with
/// 7 shuffles and 4 additions for the 8 totals instead of 4 separate reductions.
///
/// # Safety
/// Needs avx512f.
#[inline(always)]
unsafe fn quad_totals(a: __m512, b: __m512, c: __m512, d: __m512) -> __m512 {
    // Per chunk: [a0 + a2, a1 + a3, b0 + b2, b1 + b3] (and the same for c, d).
    let ab = _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(a, b), _mm512_shuffle_ps::<0b11_10_11_10>(a, b));
    let cd = _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(c, d), _mm512_shuffle_ps::<0b11_10_11_10>(c, d));
    // Per chunk: [(a0 + a2) + (a1 + a3), ... b, c, d].
    let s = _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(ab, cd), _mm512_shuffle_ps::<0b11_01_11_01>(ab, cd));
    _mm512_add_ps(s, _mm512_shuffle_f32x4::<0b10_11_00_01>(s, s))
}

/// [`store_totals`] for four consecutive rows at once (their products with one token are
/// adjacent in `out`): `acc2[g]`, `acc1[g]` are row `g`'s accumulators. Bit-identical to
/// four [`store_totals`] calls.
///
/// # Safety
/// Needs avx512f; `out + t*out_stride + g` (t < n_tok, g < 4) must be writable,
/// `acc2[g].len() ≥ n_tok / 2`.
#[inline(always)]
unsafe fn store_totals_quad(acc2: [&[__m512]; 4], acc1: [__m256; 4], n_tok: usize, out: *mut f32, out_stride: usize) {
    for i in 0..n_tok / 2 {
        let s = quad_totals(acc2[0][i], acc2[1][i], acc2[2][i], acc2[3][i]);
        _mm_storeu_ps(out.add(2 * i * out_stride), _mm512_castps512_ps128(s));
        _mm_storeu_ps(out.add((2 * i + 1) * out_stride), _mm512_extractf32x4_ps::<2>(s));
    }
    if n_tok % 2 == 1 {
        let z = |a: __m256| _mm512_zextps256_ps512(a);
        let s = quad_totals(z(acc1[0]), z(acc1[1]), z(acc1[2]), z(acc1[3]));
        _mm_storeu_ps(out.add((n_tok - 1) * out_stride), _mm512_castps512_ps128(s));
    }
}

/// The activation super-block `ib` of token `t`.
///
/// # Safety
/// `x + t*x_stride + ib*292` must point at an aligned [`BlockQ8K`].
#[inline(always)]
unsafe fn x_block<'a>(x: *const u8, x_stride: usize, t: usize, ib: usize) -> &'a BlockQ8K {
    &*x.add(t * x_stride + ib * size_of::<BlockQ8K>()).cast::<BlockQ8K>()
}

/// Few-column products (decode and verification: exactly `NT ≤ FEW` tokens) for `rows` weight
/// rows, one row at a time: the row is streamed front to back (prefetched [`PREFETCH_BLOCKS`]
/// super-blocks ahead), each super-block unpacked once and applied to every token (pairs
/// through [`accumulate_pair`], an odd last one through [`accumulate`]), all accumulators in
/// registers. `out[t * out_stride + r]`.
///
/// # Safety
/// Needs avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx2, fma, f16c. `w + r*w_stride`
/// (r < rows) must point at `nb` aligned weight blocks of the kind `Q4K` names, `x + t*x_stride`
/// (t < NT) at `nb` aligned [`BlockQ8K`]; `xt` holds the terms of those `NT` tokens;
/// `out + t*out_stride + r` must be writable.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn sweep_few<const Q4K: bool, const NT: usize>(
    w: *const u8,
    w_stride: usize,
    rows: usize,
    x: *const u8,
    x_stride: usize,
    xt: &XTerms,
    nb: usize,
    out: *mut f32,
    out_stride: usize,
) {
    // Rows in groups of four share the final reductions ([`store_totals_quad`]): with the
    // 4-super-block rows of a 1024-wide model they were ~13 % of a 4-token sweep.
    let mut r = 0;
    while r + 4 <= rows {
        // (Loops, not closures: a closure would not inherit this function's target features.)
        let mut acc2 = [[_mm512_setzero_ps(); FEW / 2]; 4];
        let mut acc1 = [_mm256_setzero_ps(); 4];
        for g in 0..4 {
            (acc2[g], acc1[g]) = row_sums::<Q4K, NT>(w.add((r + g) * w_stride), x, x_stride, xt, nb);
        }
        store_totals_quad([&acc2[0][..], &acc2[1][..], &acc2[2][..], &acc2[3][..]], acc1, NT, out.add(r), out_stride);
        r += 4;
    }
    for r in r..rows {
        let (acc2, acc1) = row_sums::<Q4K, NT>(w.add(r * w_stride), x, x_stride, xt, nb);
        store_totals(&acc2, acc1, NT, out.add(r), out_stride);
    }
}

/// One row's accumulators of [`sweep_few`]: token pairs `2i, 2i + 1` in `.0[i]` (at most
/// `FEW / 2` used), an odd last token in `.1`.
///
/// # Safety
/// As [`sweep_few`], for the one row at `row`.
#[inline(always)]
unsafe fn row_sums<const Q4K: bool, const NT: usize>(
    row: *const u8,
    x: *const u8,
    x_stride: usize,
    xt: &XTerms,
    nb: usize,
) -> ([__m512; FEW / 2], __m256) {
    let wb = block_bytes::<Q4K>();
    let mut acc2 = [_mm512_setzero_ps(); FEW / 2];
    let mut acc1 = _mm256_setzero_ps();
    for ib in 0..nb {
        let p = row.add(ib * wb);
        // Few columns leave the weight stream memory-bound: fetch ahead (`prefetcht0` never
        // faults, so reading past the matrix's end is harmless).
        for line in (0..wb).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BLOCKS * wb + line).cast());
        }
        let u = unpack::<Q4K>(p);
        for (i, a) in acc2.iter_mut().enumerate().take(NT / 2) {
            let (xa, xb) = (x_block(x, x_stride, 2 * i, ib), x_block(x, x_stride, 2 * i + 1, ib));
            *a = accumulate_pair::<Q4K>(&u, xa, xb, xt, 2 * i, ib, *a);
        }
        if NT % 2 == 1 {
            acc1 = accumulate::<Q4K>(&u, x_block(x, x_stride, NT - 1, ib), xt, NT - 1, ib, acc1);
        }
    }
    (acc2, acc1)
}

/// Super-blocks per chunk of [`sweep_tile`]: the unpacked blocks of [`ROWS`] rows × this many
/// super-blocks (≈ 9 KiB) stay in L1 while every token of the tile is applied to them.
const CHUNK: usize = 4;

/// Prefill products for `rows ≤ ROWS` weight rows and `n_tok ≤ TOKENS` tokens, as a blocked
/// matrix product: per chunk of [`CHUNK`] super-blocks the rows' blocks are unpacked once into
/// an L1 buffer, then [`micro_tile`] applies them to groups of 4 tokens with the accumulators
/// in registers. Each (row, token) product gets exactly [`sweep_few`]'s operations in the
/// same order. `out[t * out_stride + r]`.
///
/// # Safety
/// As [`sweep_few`], with `rows ≤ ROWS` and `n_tok ≤ TOKENS` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn sweep_tile<const Q4K: bool>(
    w: *const u8,
    w_stride: usize,
    rows: usize,
    x: *const u8,
    x_stride: usize,
    xt: &XTerms,
    n_tok: usize,
    nb: usize,
    out: *mut f32,
    out_stride: usize,
) {
    debug_assert!(rows <= ROWS && n_tok <= TOKENS);
    let wb = block_bytes::<Q4K>();
    // Pair accumulators (token 2i in the low half, 2i + 1 in the high half), and the last
    // token's when `n_tok` is odd.
    let mut acc2 = [[_mm512_setzero_ps(); TOKENS / 2]; ROWS];
    let mut acc1 = [_mm256_setzero_ps(); ROWS];
    // Rows past `rows` stay all-zero blocks: their products are computed and dropped.
    let zero = Unpacked {
        q: [_mm512_setzero_si512(); 4],
        s: [_mm512_setzero_si512(); 2],
        d: _mm512_setzero_ps(),
        min: _mm512_setzero_ps(),
        offset: _mm512_setzero_si512(),
    };
    let mut buf = [[zero; CHUNK]; ROWS];
    let x = |t: usize, ib: usize| x_block(x, x_stride, t, ib);
    for ib0 in (0..nb).step_by(CHUNK) {
        let nc = CHUNK.min(nb - ib0);
        for (r, buf_r) in buf.iter_mut().enumerate().take(rows) {
            for (c, u) in buf_r.iter_mut().enumerate().take(nc) {
                *u = unpack::<Q4K>(w.add(r * w_stride + (ib0 + c) * wb));
            }
        }
        let mut t = 0;
        while t + 4 <= n_tok {
            micro_tile::<Q4K, 2>(&buf, nc, &x, xt, ib0, t, &mut acc2);
            t += 4;
        }
        if t + 2 <= n_tok {
            micro_tile::<Q4K, 1>(&buf, nc, &x, xt, ib0, t, &mut acc2);
            t += 2;
        }
        if t < n_tok {
            for (r, a) in acc1.iter_mut().enumerate() {
                for c in 0..nc {
                    *a = accumulate::<Q4K>(&buf[r][c], x(t, ib0 + c), xt, t, ib0 + c, *a);
                }
            }
        }
    }
    if rows == ROWS {
        store_totals_quad([&acc2[0][..], &acc2[1][..], &acc2[2][..], &acc2[3][..]], acc1, n_tok, out, out_stride);
    } else {
        for r in 0..rows {
            store_totals(&acc2[r], acc1[r], n_tok, out.add(r), out_stride);
        }
    }
}

/// `ROWS × P` pair accumulators of [`sweep_tile`] (tokens `t0..t0 + 2P`) over the `nc`
/// unpacked super-blocks `ib0..ib0 + nc` in `buf`, in registers.
///
/// # Safety
/// As [`sweep_tile`]; `t0 + 2P ≤ n_tok`, `nc ≤ CHUNK`.
#[inline(always)]
unsafe fn micro_tile<'a, const Q4K: bool, const P: usize>(
    buf: &[[Unpacked; CHUNK]; ROWS],
    nc: usize,
    x: &impl Fn(usize, usize) -> &'a BlockQ8K,
    xt: &XTerms,
    ib0: usize,
    t0: usize,
    acc2: &mut [[__m512; TOKENS / 2]; ROWS],
) {
    let mut a = [[_mm512_setzero_ps(); P]; ROWS];
    for r in 0..ROWS {
        a[r].copy_from_slice(&acc2[r][t0 / 2..t0 / 2 + P]);
    }
    for c in 0..nc {
        let ib = ib0 + c;
        for (r, a_r) in a.iter_mut().enumerate() {
            let u = &buf[r][c];
            for (i, a_ri) in a_r.iter_mut().enumerate() {
                let t = t0 + 2 * i;
                *a_ri = accumulate_pair::<Q4K>(u, x(t, ib), x(t + 1, ib), xt, t, ib, *a_ri);
            }
        }
    }
    for r in 0..ROWS {
        acc2[r][t0 / 2..t0 / 2 + P].copy_from_slice(&a[r]);
    }
}

/// [`sweep_few`] instantiated for `1 ≤ n_tok ≤ FEW` tokens.
///
/// # Safety
/// As [`sweep_few`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn sweep_few_any<const Q4K: bool>(
    w: *const u8,
    w_stride: usize,
    rows: usize,
    x: *const u8,
    x_stride: usize,
    xt: &XTerms,
    n_tok: usize,
    nb: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let f = match n_tok {
        1 => sweep_few::<Q4K, 1>,
        2 => sweep_few::<Q4K, 2>,
        3 => sweep_few::<Q4K, 3>,
        4 => sweep_few::<Q4K, 4>,
        5 => sweep_few::<Q4K, 5>,
        6 => sweep_few::<Q4K, 6>,
        7 => sweep_few::<Q4K, 7>,
        _ => sweep_few::<Q4K, FEW>,
    };
    f(w, w_stride, rows, x, x_stride, xt, nb, out, out_stride)
}

/// All products of a K-quant [`DotTile`] (`out[t * n_rows + r]`): up to [`FEW`] tokens row by
/// row ([`sweep_few`]), more in sweeps of [`ROWS`] rows × [`TOKENS`] tokens ([`sweep_tile`]).
///
/// # Safety
/// Needs avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx2, fma, f16c. The tile's weight
/// and activation bytes must be aligned for [`BlockQ4K`]/[`BlockQ6K`] and [`BlockQ8K`] (the
/// [`DotTile`] contract); the geometry is checked here.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_tile_kquant(kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    let (wb, xb) = (kind.block_bytes(), size_of::<BlockQ8K>());
    let (n_rows, n_tok) = (tile.n_rows(), tile.n_tok());
    let nb = tile.w_row_bytes / wb;
    // Soundness of the raw reads and writes below rests on these O(1) checks.
    assert!(tile.w_row_bytes == nb * wb && tile.x_row_bytes == nb * xb);
    assert!(tile.w.len() == n_rows * tile.w_row_bytes && tile.x.len() == n_tok * tile.x_row_bytes);
    assert_eq!(out.len(), n_rows * n_tok);
    if n_tok == 0 {
        return;
    }
    let q4k = matches!(kind, KQuant::Q4K);
    let (ws, xs) = (tile.w_row_bytes, tile.x_row_bytes);
    let (w, x, o) = (tile.w.as_ptr(), tile.x.as_ptr(), out.as_mut_ptr());
    if n_tok <= FEW {
        let xt = XTerms::new(q4k, x, xs, n_tok, nb);
        match kind {
            KQuant::Q4K => sweep_few_any::<true>(w, ws, n_rows, x, xs, &xt, n_tok, nb, o, n_rows),
            KQuant::Q6K => sweep_few_any::<false>(w, ws, n_rows, x, xs, &xt, n_tok, nb, o, n_rows),
        }
        return;
    }
    for t0 in (0..n_tok).step_by(TOKENS) {
        let nt = TOKENS.min(n_tok - t0);
        let xp = x.add(t0 * xs);
        let xt = XTerms::new(q4k, xp, xs, nt, nb);
        for r0 in (0..n_rows).step_by(ROWS) {
            let nr = ROWS.min(n_rows - r0);
            let (wp, op) = (w.add(r0 * ws), o.add(t0 * n_rows + r0));
            match kind {
                KQuant::Q4K => sweep_tile::<true>(wp, ws, nr, xp, xs, &xt, nt, nb, op, n_rows),
                KQuant::Q6K => sweep_tile::<false>(wp, ws, nr, xp, xs, &xt, nt, nb, op, n_rows),
            }
        }
    }
}

/// One K-quant dot product through [`dot_tile_kquant`]'s arithmetic (bit-identical to tiles).
///
/// # Safety
/// Needs avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx2, fma, f16c; `w` and `x` point
/// at `nb` aligned blocks each.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_kquant(kind: KQuant, w: *const u8, x: *const u8, nb: usize) -> f32 {
    let mut out = 0f32;
    let xt = XTerms::new(matches!(kind, KQuant::Q4K), x, 0, 1, nb);
    match kind {
        KQuant::Q4K => sweep_few::<true, 1>(w, 0, 1, x, 0, &xt, nb, &mut out, 0),
        KQuant::Q6K => sweep_few::<false, 1>(w, 0, 1, x, 0, &xt, nb, &mut out, 0),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector header decode against the scalar one, on every byte pattern class: random
    /// scale bytes (all 8 bits used) and random f16 `d`/`dmin`.
    #[test]
    fn q4k_header_matches_scales_mins() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
            return;
        }
        let mut seed = 0x9E37_79B9u32;
        let mut byte = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 24) as u8
        };
        for _ in 0..2000 {
            let b = BlockQ4K {
                d: f16::from_bits(u16::from_le_bytes([byte(), byte() & 0x7B])),
                dmin: f16::from_bits(u16::from_le_bytes([byte(), byte() & 0x7B])),
                scales: [0; 12].map(|_: u8| byte()),
                qs: [0; 128],
            };
            let (d_dmin, sc_mn) = unsafe { q4k_header(&b) };
            let (mut f, mut bytes) = ([0f32; 4], [0u8; 16]);
            unsafe {
                _mm_storeu_ps(f.as_mut_ptr(), d_dmin);
                _mm_storeu_si128(bytes.as_mut_ptr().cast(), sc_mn);
            }
            let (sc, mn) = b.scales_mins();
            assert_eq!((&bytes[..8], &bytes[8..]), (&sc[..], &mn[..]), "{:?}", b.scales);
            assert_eq!((f[0], f[1]), (b.d.to_f32(), b.dmin.to_f32()));
        }
    }
}
