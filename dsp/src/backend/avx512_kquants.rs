//! AVX-512 Q4_K and Q6_K products against Q8_K activations, for any number of tokens.
//!
//! A weight super-block (256 weights) is unpacked once per row and applied to every token of
//! the tile: up to [`FEW`] tokens (decode, verification) row by row with all accumulators in
//! registers ([`sweep_few`]), more as a blocked product of [`ROWS`] rows × groups of 4 tokens
//! over an L1 buffer of unpacked blocks ([`sweep_tile`], [`micro_tile`]).
//!
//! Tokens go in pairs: one pair's integer sums share their `vpackssdw` packs, scale
//! multiplies, conversion, scaling and min term, and its accumulator holds token `a` in lanes
//! `4c, 4c + 1` and token `b` in lanes `4c + 2, 4c + 3` of every 128-bit chunk `c`
//! ([`accumulate_pair`]). A lone last token is a pair whose second token is all zero. Integer
//! part per pair and super-block ([`isum_pair`]), with `vpdpbusd` (exact sums of four u8 × i8
//! products per i32 lane):
//! - Q4_K: the super-block is unpacked to four registers that each hold 8 weights of every
//!   32-weight sub-block (2 lanes per sub-block; the activations are permuted to match once
//!   per tile, [`XTerms`]), so the four `vpdpbusd` of a token chain into one register
//!   (|lane| ≤ 16 · 15 · 127 < 2^15), the two tokens' registers are packed to i16 with one
//!   `vpackssdw` and multiplied by the sub-block scales with one `vpmaddwd`: 10 multiply/pack
//!   instructions per pair and super-block where one register per 64 weights and token takes
//!   16 plus a lane fold.
//! - Q6_K: the quants are unpacked as `q + 32` (u8) into registers that each hold 8 weights
//!   of 8 of the 16-weight sub-blocks; two `vpdpbusd` chain into one register whose lanes
//!   start at `−32 · Σ x` of their 8 weights (per tile, [`XTerms`]), which removes the `+ 32`
//!   exactly and keeps |lane| ≤ 8 · 32 · 127 < 2^15; per pair the two tokens' chains are
//!   packed by `vpackssdw` and multiplied by the scales (`vpmaddwd`, `vpdpwssd`): 12
//!   instructions per pair and super-block where one register per 64 weights and token
//!   takes 16, a lane fold and two offset terms.
//!
//! A 4-token sweep over cache-resident weights is ~17 % (Q4_K) and ~16 % (Q6_K) faster than
//! with one register per 64 weights and token (`examples/kquant_cycles.rs`, 3584 × 1024).
//!
//! (Measured on this project's Xeon with independent 512-bit instructions: `vpmaddwd` ~2 per
//! cycle, `vpackssdw` and `vpermw` 1, so with a few columns the multiplies, packs and unpacking
//! share the two 512-bit ports and bound the product once the weights stream fast enough.)
//! The 16 lanes are converted, scaled by `d_w` and `d_x`; Q4_K's min term is one FMA of
//! `dmin · m_k` with `d_x · (bsum_2k + bsum_2k+1)` (computed once per tile, [`XTerms`]).
//!
//! Every (row, token) product gets the same operations in every tile shape and either place
//! of a pair, so a batched verification pass equals one-token decode bit for bit; results
//! differ from the AVX2 backend's only in f32 rounding (the integer sums are spread over other
//! lanes and the min term is summed in another order), tested against the scalar reference in
//! `tests/conformance.rs`.
//!
//! Scheme of the integer sums: ggml's `ggml_vec_dot_q4_K_q8_K` / `..._q6_K_q8_K`
//! (`ggml/src/ggml-cpu/arch/x86/quants.c`); the chained layouts and token pairs are this
//! crate's.

use std::arch::x86_64::*;

use half::f16;

use super::avx2::load_f16;
use super::avx2_kquants::KQuant;
use super::{DotTile, Piece};
use crate::quant::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};

/// Tokens per sweep of [`sweep_tile`] (the permuted activations of one super-block column for
/// this many tokens stay in L1: 64 × 256 B (Q4_K) or 384 B (Q6_K), 16-24 KiB).
const TOKENS: usize = 64;
/// Weight rows per sweep of [`sweep_tile`].
const ROWS: usize = 4;
const _: () = assert!(ROWS == 4, "sweep_tile stores its rows through store_totals_quad");
/// Tokens up to which [`dot_tile_kquant`] takes the row-at-a-time [`sweep_few`] path.
const FEW: usize = 8;
/// Super-blocks ahead of the one being unpacked that [`sweep_few`] prefetches into L2
/// (`prefetcht1`, deep enough to cover DRAM latency at full bandwidth: the L2 tracks far more
/// misses than the L1's fill buffers) and into L1 (`prefetcht0`, from L2). Measured on the
/// 0.8B-shaped model's verification pass: 1 column 8.5 % and 4 columns 8 % faster than one
/// `prefetcht0` 12 blocks ahead.
const PREFETCH_L2_BLOCKS: usize = 24;
const PREFETCH_L1_BLOCKS: usize = 8;

/// One weight super-block ready for the token loop.
/// `q[g]`: unsigned quants, 64 per register, in the order [`XTerms`] permutes the activations
/// to. Q4_K (0..15): 128-bit chunk `c` of `q[g]` holds weights `64c + 8g .. + 8` (sub-block
/// `2c`, lanes `4c, 4c + 1`) and `64c + 32 + 8g .. + 8` (sub-block `2c + 1`, lanes
/// `4c + 2, 4c + 3`). Q6_K (q + 32 in 0..63): chain `h` is `q[2h]`, `q[2h + 1]`; chunk `c` of
/// `q[2h + i]` holds weights `128h + 16c + 8i .. + 8` (sub-block `8h + c`, lanes `4c, 4c + 1`)
/// and `128h + 64 + 16c + 8i .. + 8` (sub-block `8h + 4 + c`, lanes `4c + 2, 4c + 3`).
/// `s`: i16 sub-block scales laid out for the packed token pairs of [`isum_pair`] (Q4_K:
/// `s[0]`, chunk `c` = `sc_2c ×2, sc_2c+1 ×2`, twice; Q6_K: `s[h]`, chunk `c` =
/// `sc_8h+c ×2, sc_8h+4+c ×2`, twice).
/// `d`: the block scale in all lanes; `min`: Q4_K `dmin · m_k` per lane of a pair accumulator
/// (chunk `c`: `m_2c, m_2c+1, m_2c, m_2c+1`; zero for Q6_K).
#[derive(Clone, Copy)]
struct Unpacked {
    q: [__m512i; 4],
    s: [__m512i; 2],
    d: __m512,
    min: __m512,
}

/// Q4_K scales for [`Unpacked::s`] from the header bytes (`sc` at bytes 0..8): word `w` of
/// chunk `c` is `sc_{2c + (w % 4) / 2}`, zero-extended (`vpshufb` indices; −128 zeroes a byte).
const Q4K_SCALES: [i8; 64] = header_bytes(0, 2);
/// Q4_K mins for [`Unpacked::min`] from the header bytes (`m` at bytes 8..16): i32 lane `k`
/// of chunk `c` is `m_{2c + k % 2}`, zero-extended (`vpshufb` indices).
const Q4K_MINS: [i8; 64] = header_bytes(8, 4);

/// `vpshufb` indices that zero-extend Q4_K header bytes into lanes of `width` bytes (2: i16
/// words, 4: i32 lanes): the lane starting at byte `b` of 16-byte chunk `c` takes header byte
/// `first + 2c + (b / 4) % 2`; every other byte is −128 (zeroed).
const fn header_bytes(first: usize, width: usize) -> [i8; 64] {
    let mut idx = [-128i8; 64];
    let mut i = 0;
    while i < 64 {
        let (c, b) = (i / 16, i % 16);
        if b % width == 0 {
            idx[i] = (first + 2 * c + b / 4 % 2) as i8;
        }
        i += 1;
    }
    idx
}
/// Q6_K scales for [`Unpacked::s`]`[h]`: word `w` of chunk `c` is
/// `sc_{8h + c + 4 ((w % 4) / 2)}` (`vpermw` indices).
const Q6K_SCALES: [[i16; 32]; 2] = {
    let mut idx = [[0i16; 32]; 2];
    let mut i = 0;
    while i < 64 {
        let (h, w) = (i / 32, i % 32);
        idx[h][w] = (8 * h + w / 8 + 4 * ((w % 4) / 2)) as i16;
        i += 1;
    }
    idx
};

#[inline(always)]
unsafe fn load_idx<T>(idx: &T) -> __m512i {
    _mm512_loadu_si512((idx as *const T).cast())
}

/// `acc + Σ a_2i · b_2i + a_2i+1 · b_2i+1` per i32 lane, i16 words (`vpdpwssd`, written out:
/// LLVM otherwise splits it into `vpmaddwd` + `vpaddd` for generic x86-64 tuning, one more
/// instruction on the busy vector ports).
///
/// # Safety
/// Needs avx512f, avx512vnni.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd(mut acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    std::arch::asm!(
        "vpdpwssd {acc}, {a}, {b}",
        acc = inout(zmm_reg) acc,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// Unpacks a [`BlockQ4K`] into the chained layout of [`Unpacked::q`].
///
/// # Safety
/// Needs avx512f, avx512bw, avx512vl, avx2, fma, f16c.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn unpack_q4k(b: &BlockQ4K) -> Unpacked {
    let (d_dmin, sc_mn) = q4k_header(b);
    // Quant byte `32c + 8g + i` holds weight `64c + 8g + i` (low nibble) and `64c + 32 + 8g + i`
    // (high nibble): chunk `c` of `q[g]` is that qword twice, the upper copy shifted down 4.
    let l0 = _mm512_loadu_si512(b.qs.as_ptr().cast());
    let l1 = _mm512_loadu_si512(b.qs.as_ptr().add(64).cast());
    let shift = _mm512_setr_epi64(0, 4, 0, 4, 0, 4, 0, 4);
    let mask = _mm512_set1_epi8(0x0F);
    let mut q = [_mm512_setzero_si512(); 4];
    for (g, qg) in q.iter_mut().enumerate() {
        let g = g as i64;
        let idx = _mm512_setr_epi64(g, g, 4 + g, 4 + g, 8 + g, 8 + g, 12 + g, 12 + g);
        *qg = _mm512_and_si512(_mm512_srlv_epi64(_mm512_permutex2var_epi64(l0, idx, l1), shift), mask);
    }
    let h = _mm512_broadcast_i32x4(sc_mn);
    let m = _mm512_cvtepi32_ps(_mm512_shuffle_epi8(h, load_idx(&Q4K_MINS)));
    let s = _mm512_shuffle_epi8(h, load_idx(&Q4K_SCALES));
    Unpacked {
        q,
        s: [s, _mm512_setzero_si512()],
        d: _mm512_broadcastss_ps(d_dmin),
        min: _mm512_mul_ps(_mm512_broadcastss_ps(_mm_movehdup_ps(d_dmin)), m),
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
    // Weights 64g..64g+64 are in q[g] in order; interleave the 8-weight halves of each
    // 16-weight chunk of q[2h] and q[2h + 1] into the two registers of chain h.
    let q = [
        _mm512_unpacklo_epi64(q[0], q[1]),
        _mm512_unpackhi_epi64(q[0], q[1]),
        _mm512_unpacklo_epi64(q[2], q[3]),
        _mm512_unpackhi_epi64(q[2], q[3]),
    ];
    let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(b.scales.as_ptr().cast())));
    Unpacked {
        q,
        s: [
            _mm512_permutexvar_epi16(load_idx(&Q6K_SCALES[0]), sc16),
            _mm512_permutexvar_epi16(load_idx(&Q6K_SCALES[1]), sc16),
        ],
        d: _mm512_set1_ps(load_f16((&b.d as *const f16).cast())),
        min: _mm512_setzero_ps(),
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

/// The integer part of one super-block product with a token pair `(a, b)`: i32 lanes
/// `4c, 4c + 1` of every chunk `c` sum to `Σ_k sc_k · Σ_{j in k} q_j · x_aj` (exact), lanes
/// `4c + 2, 4c + 3` to the same for `b` (zero when `LONE`: `a` is a lone last token).
/// Q4_K: per token four chained `vpdpbusd` (one register, 2 lanes per sub-block); Q6_K: two
/// chains of two, each started at the token's `−32 · Σ x` ([`XTerms`]). The pair's chains are
/// packed to i16 (`vpackssdw`) and multiplied by [`Unpacked::s`] (`vpmaddwd`, `vpdpwssd`).
///
/// # Safety
/// Needs avx512f, avx512bw, avx512vnni; pair `p` and super-block `ib` within `xt`.
#[inline(always)]
unsafe fn isum_pair<const Q4K: bool, const LONE: bool>(u: &Unpacked, xt: &XTerms, p: usize, ib: usize) -> __m512i {
    let zero = _mm512_setzero_si512();
    let xa = xt.quants(2 * p, ib);
    let xb = if LONE { xa } else { xt.quants(2 * p + 1, ib) };
    let ld = |x: *const QuantLine, g: usize| _mm512_load_si512(x.add(g).cast());
    if Q4K {
        let chain = |x: *const QuantLine| {
            let mut acc = _mm512_dpbusd_epi32(zero, u.q[0], ld(x, 0));
            acc = _mm512_dpbusd_epi32(acc, u.q[1], ld(x, 1));
            acc = _mm512_dpbusd_epi32(acc, u.q[2], ld(x, 2));
            _mm512_dpbusd_epi32(acc, u.q[3], ld(x, 3))
        };
        let b = if LONE { zero } else { chain(xb) };
        _mm512_madd_epi16(_mm512_packs_epi32(chain(xa), b), u.s[0])
    } else {
        // Lines 4, 5 after a token's four quant lines: the chains' starting values.
        let chain = |x: *const QuantLine, h: usize| {
            let acc = _mm512_dpbusd_epi32(ld(x, 4 + h), u.q[2 * h], ld(x, 2 * h));
            _mm512_dpbusd_epi32(acc, u.q[2 * h + 1], ld(x, 2 * h + 1))
        };
        let packed = |h: usize| _mm512_packs_epi32(chain(xa, h), if LONE { zero } else { chain(xb, h) });
        dpwssd(_mm512_madd_epi16(packed(0), u.s[0]), packed(1), u.s[1])
    }
}

/// Per-tile activation terms, laid out for [`accumulate_pair`]: per super-block `ib` and token
/// pair `p` (tokens `2p`, `2p + 1`; a missing second token is all zero), 16 lanes at
/// [`XTerms::at`] matching a pair accumulator: `dx` holds `d_x` of the lane's token, `min`
/// (Q4_K) `d_x · (bsum_2k + bsum_2k+1)` for the lane's sub-block `k` (the sums of the 16-weight
/// activation sums over Q4_K's 32-weight sub-blocks). `xq`: per token and super-block
/// [`XTerms::lines`] lines: the 256 quants permuted to [`Unpacked::q`]'s layout, then (Q6_K)
/// the starting values of the two chains (i32 lanes: `−32 ·` the sum of the lane's 8 quants).
struct XTerms {
    n_pairs: usize,
    nb: usize,
    lines: usize,
    dx: Vec<f32>,
    min: Vec<f32>,
    xq: Vec<QuantLine>,
}

/// 64 activation quants (or 16 i32 chain starts), aligned for one 512-bit load.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct QuantLine([u8; 64]);

impl XTerms {
    /// # Safety
    /// `x + t*x_stride` (t < n_tok) must point at `nb` aligned [`BlockQ8K`].
    unsafe fn new(q4k: bool, x: *const u8, x_stride: usize, n_tok: usize, nb: usize) -> XTerms {
        let n_pairs = n_tok.div_ceil(2);
        let lanes = nb * n_pairs * 16;
        let lines = if q4k { 4 } else { 6 };
        let mut dx = vec![0f32; lanes];
        let mut min = vec![0f32; if q4k { lanes } else { 0 }];
        let mut xq = vec![QuantLine([0; 64]); n_tok * nb * lines];
        for ib in 0..nb {
            for t in 0..n_tok {
                let b = x_block(x, x_stride, t, ib);
                let (at, half) = ((ib * n_pairs + t / 2) * 16, 2 * (t % 2));
                for c in 0..4 {
                    dx[at + 4 * c + half..][..2].fill(b.d);
                    if q4k {
                        for j in 0..2 {
                            let k = 2 * c + j;
                            let s = i32::from(b.bsums[2 * k]) + i32::from(b.bsums[2 * k + 1]);
                            min[at + 4 * c + half + j] = b.d * s as f32;
                        }
                    }
                }
                let qs = b.qs.map(|v| v as u8);
                let out = &mut xq[(t * nb + ib) * lines..][..lines];
                // Line `g`, chunk `c`: the activations of the two 8-weight runs that
                // `Unpacked::q[g]`'s chunk `c` holds.
                let runs = |g: usize, c: usize| {
                    if q4k {
                        (64 * c + 8 * g, 64 * c + 32 + 8 * g)
                    } else {
                        let (h, i) = (g / 2, g % 2);
                        (128 * h + 16 * c + 8 * i, 128 * h + 64 + 16 * c + 8 * i)
                    }
                };
                for (g, line) in out[..4].iter_mut().enumerate() {
                    for c in 0..4 {
                        let (r0, r1) = runs(g, c);
                        line.0[16 * c..][..8].copy_from_slice(&qs[r0..][..8]);
                        line.0[16 * c + 8..][..8].copy_from_slice(&qs[r1..][..8]);
                    }
                }
                if !q4k {
                    for h in 0..2 {
                        let mut start = [0i32; 16];
                        for (l, v) in start.iter_mut().enumerate() {
                            let sum: i32 = (0..2)
                                .flat_map(|i| out[2 * h + i].0[4 * l..][..4].iter())
                                .map(|&q| i32::from(q as i8))
                                .sum();
                            *v = -32 * sum;
                        }
                        for (l, v) in start.iter().enumerate() {
                            out[4 + h].0[4 * l..][..4].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
        }
        XTerms { n_pairs, nb, lines, dx, min, xq }
    }

    /// Offset of pair `p`'s 16 lanes of super-block `ib` in `dx` and `min`.
    #[inline(always)]
    fn at(&self, p: usize, ib: usize) -> usize {
        (ib * self.n_pairs + p) * 16
    }

    /// The lines of token `t`, super-block `ib`, as [`isum_pair`] reads them.
    #[inline(always)]
    unsafe fn quants(&self, t: usize, ib: usize) -> *const QuantLine {
        self.xq.as_ptr().add((t * self.nb + ib) * self.lines)
    }
}

/// Adds one super-block product with the token pair `p` to its accumulator: the 16 integer
/// lanes of [`isum_pair`] converted, times `d_w`, times the lanes' `d_x` added, Q4_K's
/// `dmin · m_k · d_x · bs_k` subtracted. `LONE`: the pair's second token is missing.
///
/// # Safety
/// Needs avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx2, fma, f16c; pair `p` and
/// super-block `ib` within `xt`.
#[inline(always)]
unsafe fn accumulate_pair<const Q4K: bool, const LONE: bool>(
    u: &Unpacked,
    xt: &XTerms,
    p: usize,
    ib: usize,
    acc: __m512,
) -> __m512 {
    let s = isum_pair::<Q4K, LONE>(u, xt, p, ib);
    let at = xt.at(p, ib);
    let scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(s), u.d);
    let acc = _mm512_fmadd_ps(scaled, _mm512_loadu_ps(xt.dx.as_ptr().add(at)), acc);
    if Q4K {
        _mm512_fnmadd_ps(u.min, _mm512_loadu_ps(xt.min.as_ptr().add(at)), acc)
    } else {
        acc
    }
}

/// A pair accumulator with each chunk's two lanes of a token added: lane `4c` holds token
/// `a`'s `l_4c + l_4c+1`, lane `4c + 2` token `b`'s.
///
/// # Safety
/// Needs avx512f.
#[inline(always)]
unsafe fn lane_pairs(acc: __m512) -> __m512 {
    _mm512_add_ps(acc, _mm512_permute_ps::<0b10_11_00_01>(acc))
}

/// The totals of a pair accumulator's two tokens, each summed as `((c0 + c1) + (c2 + c3))`
/// over its per-chunk sums of [`lane_pairs`] (the same tree for both tokens, and in
/// [`quad_totals`]).
///
/// # Safety
/// Needs avx512f.
#[inline(always)]
unsafe fn pair_totals(acc: __m512) -> (f32, f32) {
    let t = lane_pairs(acc);
    let w = _mm512_add_ps(t, _mm512_shuffle_f32x4::<0b10_11_00_01>(t, t));
    let z = _mm512_add_ps(w, _mm512_shuffle_f32x4::<0b01_00_11_10>(w, w));
    let lo = _mm512_castps512_ps128(z);
    (_mm_cvtss_f32(lo), _mm_cvtss_f32(_mm_movehl_ps(lo, lo)))
}

/// Writes one weight row's products with `n_tok` tokens, `out[t * out_stride]`, from its pair
/// accumulators `acc[i]` (tokens `2i`, `2i + 1`).
///
/// # Safety
/// Needs avx512f; `out + t*out_stride` (t < n_tok) must be writable,
/// `acc.len() ≥ n_tok.div_ceil(2)`.
#[inline(always)]
unsafe fn store_totals(acc: &[__m512], n_tok: usize, out: *mut f32, out_stride: usize) {
    for (i, a) in acc.iter().enumerate().take(n_tok.div_ceil(2)) {
        let (ta, tb) = pair_totals(*a);
        *out.add(2 * i * out_stride) = ta;
        if 2 * i + 1 < n_tok {
            *out.add((2 * i + 1) * out_stride) = tb;
        }
    }
}

/// The totals of four rows' pair accumulators (rows `A..D` of [`sweep_few`] or
/// [`sweep_tile`]) at once: lanes 0..4 of the result hold token `a`'s totals of rows `A..D`,
/// lanes 4..8 token `b`'s, each summed in exactly [`pair_totals`]' order, with 10 shuffles
/// and 6 additions for the 8 totals instead of 4 separate reductions.
///
/// # Safety
/// Needs avx512f.
#[inline(always)]
unsafe fn quad_totals(a: __m512, b: __m512, c: __m512, d: __m512) -> __m256 {
    // Per chunk: [A_a, A_b, B_a, B_b] (and [C_a, C_b, D_a, D_b]) of that chunk's lane pairs.
    let ab = _mm512_shuffle_ps::<0b10_00_10_00>(lane_pairs(a), lane_pairs(b));
    let cd = _mm512_shuffle_ps::<0b10_00_10_00>(lane_pairs(c), lane_pairs(d));
    // Chunks: [ab: c0 + c1, ab: c2 + c3, cd: c0 + c1, cd: c2 + c3].
    let w = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
    );
    let z = _mm512_add_ps(w, _mm512_shuffle_f32x4::<0b10_11_00_01>(w, w));
    let order = _mm512_setr_epi32(0, 2, 8, 10, 1, 3, 9, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castps512_ps256(_mm512_permutexvar_ps(order, z))
}

/// [`store_totals`] for four consecutive rows at once (their products with one token are
/// adjacent in `out`): `acc[g]` are row `g`'s pair accumulators. Bit-identical to four
/// [`store_totals`] calls.
///
/// # Safety
/// Needs avx512f; `out + t*out_stride + g` (t < n_tok, g < 4) must be writable,
/// `acc[g].len() ≥ n_tok.div_ceil(2)`.
#[inline(always)]
unsafe fn store_totals_quad(acc: [&[__m512]; 4], n_tok: usize, out: *mut f32, out_stride: usize) {
    for i in 0..n_tok.div_ceil(2) {
        let s = quad_totals(acc[0][i], acc[1][i], acc[2][i], acc[3][i]);
        _mm_storeu_ps(out.add(2 * i * out_stride), _mm256_castps256_ps128(s));
        if 2 * i + 1 < n_tok {
            _mm_storeu_ps(out.add((2 * i + 1) * out_stride), _mm256_extractf128_ps::<1>(s));
        }
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
/// rows, one row at a time: the row is streamed front to back (prefetched
/// [`PREFETCH_L2_BLOCKS`] and [`PREFETCH_L1_BLOCKS`] super-blocks ahead), each super-block unpacked once and applied to every token pair
/// ([`accumulate_pair`]; an odd last token as a lone pair), all accumulators in registers.
/// `out[t * out_stride + r]`.
///
/// # Safety
/// Needs avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx2, fma, f16c. `w + r*w_stride`
/// (r < rows) must point at `nb` aligned weight blocks of the kind `Q4K` names; `xt` holds the
/// terms of `NT` tokens and `nb` super-blocks; `out + t*out_stride + r` must be writable.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn sweep_few<const Q4K: bool, const NT: usize>(p: Piece, xt: &XTerms) {
    let Piece { w, w_stride, rows, nb, out, out_stride, .. } = p;
    // Rows in groups of four share the final reductions ([`store_totals_quad`]): with the
    // 4-super-block rows of a 1024-wide model they were ~13 % of a 4-token sweep.
    let mut r = 0;
    while r + 4 <= rows {
        // (Loops, not closures: a closure would not inherit this function's target features.)
        let mut acc = [[_mm512_setzero_ps(); FEW / 2]; 4];
        for (g, acc_g) in acc.iter_mut().enumerate() {
            *acc_g = row_sums::<Q4K, NT>(w.add((r + g) * w_stride), xt, nb);
        }
        store_totals_quad([&acc[0][..], &acc[1][..], &acc[2][..], &acc[3][..]], NT, out.add(r), out_stride);
        r += 4;
    }
    for r in r..rows {
        let acc = row_sums::<Q4K, NT>(w.add(r * w_stride), xt, nb);
        store_totals(&acc, NT, out.add(r), out_stride);
    }
}

/// One row's pair accumulators of [`sweep_few`]: tokens `2i, 2i + 1` in `[i]`
/// (`NT.div_ceil(2) ≤ FEW / 2` used).
///
/// # Safety
/// As [`sweep_few`], for the one row at `row`.
#[inline(always)]
unsafe fn row_sums<const Q4K: bool, const NT: usize>(row: *const u8, xt: &XTerms, nb: usize) -> [__m512; FEW / 2] {
    let wb = block_bytes::<Q4K>();
    let mut acc = [_mm512_setzero_ps(); FEW / 2];
    for ib in 0..nb {
        let p = row.add(ib * wb);
        // Few columns leave the weight stream memory-bound: fetch ahead (prefetches never
        // fault, so reading past the matrix's end is harmless).
        for line in (0..wb).step_by(64) {
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_L2_BLOCKS * wb + line).cast());
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_L1_BLOCKS * wb + line).cast());
        }
        let u = unpack::<Q4K>(p);
        for (i, a) in acc.iter_mut().enumerate().take(NT / 2) {
            *a = accumulate_pair::<Q4K, false>(&u, xt, i, ib, *a);
        }
        if NT % 2 == 1 {
            acc[NT / 2] = accumulate_pair::<Q4K, true>(&u, xt, NT / 2, ib, acc[NT / 2]);
        }
    }
    acc
}

/// Super-blocks per chunk of [`sweep_tile`]: the unpacked blocks of [`ROWS`] rows × this many
/// super-blocks (8 KiB) stay in L1 while every token of the tile is applied to them.
const CHUNK: usize = 4;

/// Prefill products for `rows ≤ ROWS` weight rows and `n_tok ≤ TOKENS` tokens, as a blocked
/// matrix product: per chunk of [`CHUNK`] super-blocks the rows' blocks are unpacked once into
/// an L1 buffer, then [`micro_tile`] applies them to groups of 4 tokens with the accumulators
/// in registers. Each (row, token) product gets exactly [`sweep_few`]'s operations in the
/// same order. `out[t * out_stride + r]`.
///
/// # Safety
/// As [`sweep_few`], with `rows ≤ ROWS` and `n_tok ≤ TOKENS` tokens in `xt`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn sweep_tile<const Q4K: bool>(p: Piece, xt: &XTerms) {
    let Piece { w, w_stride, rows, n_tok, nb, out, out_stride, .. } = p;
    debug_assert!(rows <= ROWS && n_tok <= TOKENS);
    let wb = block_bytes::<Q4K>();
    // Pair accumulators (tokens 2i, 2i + 1; a lone last token when `n_tok` is odd).
    let mut acc = [[_mm512_setzero_ps(); TOKENS / 2]; ROWS];
    // Rows past `rows` stay all-zero blocks: their products are computed and dropped.
    let zero = Unpacked {
        q: [_mm512_setzero_si512(); 4],
        s: [_mm512_setzero_si512(); 2],
        d: _mm512_setzero_ps(),
        min: _mm512_setzero_ps(),
    };
    let mut buf = [[zero; CHUNK]; ROWS];
    for ib0 in (0..nb).step_by(CHUNK) {
        let nc = CHUNK.min(nb - ib0);
        for (r, buf_r) in buf.iter_mut().enumerate().take(rows) {
            for (c, u) in buf_r.iter_mut().enumerate().take(nc) {
                *u = unpack::<Q4K>(w.add(r * w_stride + (ib0 + c) * wb));
            }
        }
        let mut t = 0;
        while t + 4 <= n_tok {
            micro_tile::<Q4K, 2>(&buf, nc, xt, ib0, t / 2, &mut acc);
            t += 4;
        }
        if t + 2 <= n_tok {
            micro_tile::<Q4K, 1>(&buf, nc, xt, ib0, t / 2, &mut acc);
            t += 2;
        }
        if t < n_tok {
            for (buf_r, acc_r) in buf.iter().zip(acc.iter_mut()) {
                for (c, u) in buf_r.iter().enumerate().take(nc) {
                    acc_r[t / 2] = accumulate_pair::<Q4K, true>(u, xt, t / 2, ib0 + c, acc_r[t / 2]);
                }
            }
        }
    }
    if rows == ROWS {
        store_totals_quad([&acc[0][..], &acc[1][..], &acc[2][..], &acc[3][..]], n_tok, out, out_stride);
    } else {
        for (r, acc_r) in acc.iter().enumerate().take(rows) {
            store_totals(acc_r, n_tok, out.add(r), out_stride);
        }
    }
}

/// `ROWS × P` pair accumulators of [`sweep_tile`] (pairs `p0..p0 + P`) over the `nc`
/// unpacked super-blocks `ib0..ib0 + nc` in `buf`, in registers.
///
/// # Safety
/// As [`sweep_tile`]; `2 (p0 + P) ≤ n_tok`, `nc ≤ CHUNK`.
#[inline(always)]
unsafe fn micro_tile<const Q4K: bool, const P: usize>(
    buf: &[[Unpacked; CHUNK]; ROWS],
    nc: usize,
    xt: &XTerms,
    ib0: usize,
    p0: usize,
    acc: &mut [[__m512; TOKENS / 2]; ROWS],
) {
    let mut a = [[_mm512_setzero_ps(); P]; ROWS];
    for r in 0..ROWS {
        a[r].copy_from_slice(&acc[r][p0..p0 + P]);
    }
    for c in 0..nc {
        for (r, a_r) in a.iter_mut().enumerate() {
            for (i, a_ri) in a_r.iter_mut().enumerate() {
                *a_ri = accumulate_pair::<Q4K, false>(&buf[r][c], xt, p0 + i, ib0 + c, *a_ri);
            }
        }
    }
    for r in 0..ROWS {
        acc[r][p0..p0 + P].copy_from_slice(&a[r]);
    }
}

/// [`sweep_few`] instantiated for `1 ≤ n_tok ≤ FEW` tokens.
///
/// # Safety
/// As [`sweep_few`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn sweep_few_any<const Q4K: bool>(p: Piece, xt: &XTerms) {
    let f = match p.n_tok {
        1 => sweep_few::<Q4K, 1>,
        2 => sweep_few::<Q4K, 2>,
        3 => sweep_few::<Q4K, 3>,
        4 => sweep_few::<Q4K, 4>,
        5 => sweep_few::<Q4K, 5>,
        6 => sweep_few::<Q4K, 6>,
        7 => sweep_few::<Q4K, 7>,
        _ => sweep_few::<Q4K, FEW>,
    };
    f(p, xt)
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
    let raw = tile.raw(wb, xb, out);
    let (n_rows, n_tok, nb) = (raw.n_rows, raw.n_tok, raw.nb);
    if n_tok == 0 {
        return;
    }
    let q4k = matches!(kind, KQuant::Q4K);
    if n_tok <= FEW {
        let xt = XTerms::new(q4k, raw.x, raw.xs, n_tok, nb);
        let all = raw.piece(0, n_rows, 0, n_tok);
        match kind {
            KQuant::Q4K => sweep_few_any::<true>(all, &xt),
            KQuant::Q6K => sweep_few_any::<false>(all, &xt),
        }
        return;
    }
    for t0 in (0..n_tok).step_by(TOKENS) {
        let nt = TOKENS.min(n_tok - t0);
        let xt = XTerms::new(q4k, raw.x.add(t0 * raw.xs), raw.xs, nt, nb);
        for r0 in (0..n_rows).step_by(ROWS) {
            let piece = raw.piece(r0, ROWS.min(n_rows - r0), t0, nt);
            match kind {
                KQuant::Q4K => sweep_tile::<true>(piece, &xt),
                KQuant::Q6K => sweep_tile::<false>(piece, &xt),
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
        KQuant::Q4K => sweep_few::<true, 1>(Piece::single(w, x, nb, &mut out), &xt),
        KQuant::Q6K => sweep_few::<false, 1>(Piece::single(w, x, nb, &mut out), &xt),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::scalar::Scalar;
    use crate::backend::KernelBackend;
    use crate::quant::GgmlType;

    fn avx512_vnni() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// The chained sums at the edges of their i16 range: every quant at its extreme (Q4_K 15,
    /// Q6_K −32 and 31) against activations of ±127 in every sign pattern class (all equal,
    /// alternating), as a lone token, a pair and 5 tokens; exact against the scalar reference
    /// up to f32 rounding, so a saturated pack (off by thousands) cannot pass.
    #[test]
    fn chained_sums_hold_extreme_blocks() {
        if !avx512_vnni() {
            return;
        }
        let q4 = BlockQ4K { d: f16::from_f32(0.5), dmin: f16::ZERO, scales: [0xFF; 12], qs: [0xFF; 128] };
        let q6_lo = BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [127; 16], d: f16::from_f32(0.5) };
        let q6_hi = BlockQ6K { ql: [0xFF; 128], qh: [0xFF; 64], scales: [-128; 16], d: f16::from_f32(0.5) };
        let patterns: [fn(usize) -> i8; 3] = [|_| 127, |_| -127, |j| if j % 2 == 0 { 127 } else { -127 }];
        for pattern in patterns {
            let mut x = BlockQ8K { d: 0.25, qs: [0; 256], bsums: [0; 16] };
            for (j, q) in x.qs.iter_mut().enumerate() {
                *q = pattern(j);
            }
            for (k, b) in x.bsums.iter_mut().enumerate() {
                *b = x.qs[16 * k..16 * k + 16].iter().map(|&q| i16::from(q)).sum();
            }
            let xs = [x; 5];
            let xb: &[u8] = unsafe { std::slice::from_raw_parts(xs.as_ptr().cast(), size_of_val(&xs)) };
            let check = |kind: KQuant, w: &[u8], want: f32| {
                for n_tok in [1usize, 2, 5] {
                    let ty = if matches!(kind, KQuant::Q4K) { GgmlType::Q4_K } else { GgmlType::Q6_K };
                    let x = &xb[..n_tok * size_of::<BlockQ8K>()];
                    let tile = DotTile { ty, w, w_row_bytes: w.len(), x, x_row_bytes: size_of::<BlockQ8K>() };
                    let mut out = vec![0f32; n_tok];
                    unsafe { dot_tile_kquant(kind, &tile, &mut out) };
                    for got in out {
                        assert!((got - want).abs() <= want.abs() * 1e-6, "{n_tok} tokens: {got} vs {want}");
                    }
                }
            };
            let bytes = |p: *const u8, n: usize| unsafe { std::slice::from_raw_parts(p, n) };
            let w = bytes((&q4 as *const BlockQ4K).cast(), size_of::<BlockQ4K>());
            check(KQuant::Q4K, w, Scalar.vec_dot_q4_k_q8_k(&[q4], &[x]));
            for b in [q6_lo, q6_hi] {
                let w = bytes((&b as *const BlockQ6K).cast(), size_of::<BlockQ6K>());
                check(KQuant::Q6K, w, Scalar.vec_dot_q6_k_q8_k(&[b], &[x]));
            }
        }
    }

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
