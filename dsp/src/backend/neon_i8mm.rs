//! `neon-i8mm` Q4_K and Q6_K tiles: `smmla` (FEAT_I8MM) register tiles of 2 weight rows × up
//! to 4 tokens, with the scalar reference's numerics (so every result equals the scalar, AVX2
//! and other NEON backends' bit for bit, and a tile equals the single dot of its row and token).
//!
//! `smmla acc, a, b` adds to the 2 × 2 i32 lanes `[a0·b0, a0·b1, a1·b0, a1·b1]` the dot
//! products of the 8-byte halves `a0, a1` of `a` and `b0, b1` of `b`. Here `a` holds 8 weights
//! of row `r0` and the same 8 of row `r1` ([`zip_rows`]), `b` the matching 8 activations of
//! tokens `ta` and `tb` ([`PairQ8K`], built once per tile), so one instruction adds 8 products
//! to each of the 4 (row, token) dots and the weight registers are shared by the token pairs
//! (the activation registers by the 2 rows).
//!
//! Per super-block and (row, token) the exact integers are those of [`super::neon_kquants`]
//! (any lane split gives them): `S = Σ_k sc_k · Σ_{p in sub-block k} q_p·x_p` as one prefix
//! chain of `smmla`s with the scales applied as differences (`Σ_k s_k·D_k = Σ_n (s_n −
//! s_{n+1})·P_n`, P the running chain, one `mla` per sub-block and token pair) and the bsum
//! term (`M = Σ_k m_k · (bsum_2k + bsum_2k+1)` for Q4_K; `Σ_k sc_k · bsum_k` for Q6_K, whose
//! quants are unpacked as `q + 32`) also by `smmla`: each bsum term `v` is split as
//! `128·(v >> 7) + (v & 127)`, two i8 halves, in [`PairQ8K`]. They are converted and combined
//! lane-wise in the scalar reference's order: `acc + ((d_x·d_w)·S − (d_x·dmin)·M)` (Q4_K),
//! `acc + (d_x·d_w)·(S − 32·M)` (Q6_K, the offset removed in the integers first).
//!
//! A tile with an odd number of rows or tokens pairs the last one with itself and discards the
//! duplicate lanes.

use std::arch::aarch64::*;

use super::neon::{cvt_f16x4, f16_to_f32};
use super::neon_kquants::{scales_mins_q4k, KQuant};
use super::DotTile;
use crate::quant::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};

/// Token pairs per register tile (4 tokens: the verification tile).
const PAIRS: usize = 2;

/// `acc + smmla(a, b)` (the `vmmlaq_s32` intrinsic is not stable Rust, hence the instruction).
///
/// # Safety
/// Needs i8mm.
#[inline]
#[target_feature(enable = "i8mm")]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    std::arch::asm!("smmla {0:v}.4s, {1:v}.16b, {2:v}.16b", inout(vreg) acc, in(vreg) a, in(vreg) b,
        options(pure, nomem, nostack, preserves_flags));
    acc
}

/// Two tokens' [`BlockQ8K`] (`ta`, `tb`) as `smmla`'s right operands: bytes `16e..16e+8` hold
/// activations `8e..8e+8` of `ta`, bytes `16e+8..16e+16` the same of `tb`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct PairQ8K {
    qs: [i8; 512],
    /// The bsum terms `v` (Q4_K: the 8 pair sums `bsum_2k + bsum_2k+1`, chunk 0; Q6_K: the 16
    /// bsums, chunks 0 and 1), in 8-element chunks of 16 bytes as `qs`: `lo = v & 127`
    /// (0..128), `hi = v >> 7` (|v| ≤ 2 · 16 · 128, so −32..32): `v = 128·hi + lo`.
    lo: [i8; 32],
    hi: [i8; 32],
    /// `[d_ta, d_tb, d_ta, d_tb]`.
    d: [f32; 4],
}

const PAIR_ZERO: PairQ8K = PairQ8K {
    qs: [0; 512],
    lo: [0; 32],
    hi: [0; 32],
    d: [0.0; 4],
};

/// `[a.lo64, b.lo64]` and `[a.hi64, b.hi64]`: the two rows' (or tokens') 8-byte chunks side
/// by side.
#[inline(always)]
unsafe fn zip_rows(a: int8x16_t, b: int8x16_t) -> [int8x16_t; 2] {
    let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
    [
        vreinterpretq_s8_s64(vzip1q_s64(a, b)),
        vreinterpretq_s8_s64(vzip2q_s64(a, b)),
    ]
}

/// Fills `out` from the activation blocks of tokens `ta` (`a`) and `tb` (`b`).
#[inline(always)]
unsafe fn pack_pair(q4k: bool, a: &BlockQ8K, b: &BlockQ8K, out: &mut PairQ8K) {
    for c in 0..16 {
        let z = zip_rows(vld1q_s8(a.qs.as_ptr().add(16 * c)), vld1q_s8(b.qs.as_ptr().add(16 * c)));
        vst1q_s8(out.qs.as_mut_ptr().add(32 * c), z[0]);
        vst1q_s8(out.qs.as_mut_ptr().add(32 * c + 16), z[1]);
    }
    let bsums = |x: &BlockQ8K| [vld1q_s16(x.bsums.as_ptr()), vld1q_s16(x.bsums.as_ptr().add(8))];
    let (ba, bb) = (bsums(a), bsums(b));
    // Q4_K: the pair sums in chunk 0; Q6_K: bsums 0..8 in chunk 0, 8..16 in chunk 1.
    let (chunks, n) = if q4k {
        ([[vpaddq_s16(ba[0], ba[1]), vpaddq_s16(bb[0], bb[1])], [ba[1], bb[1]]], 1)
    } else {
        ([[ba[0], bb[0]], [ba[1], bb[1]]], 2)
    };
    let lo = |v: int16x8_t| vmovn_s16(vandq_s16(v, vdupq_n_s16(127)));
    let hi = |v: int16x8_t| vmovn_s16(vshrq_n_s16::<7>(v));
    for (c, [va, vb]) in chunks.into_iter().enumerate().take(n) {
        vst1q_s8(out.lo.as_mut_ptr().add(16 * c), vcombine_s8(lo(va), lo(vb)));
        vst1q_s8(out.hi.as_mut_ptr().add(16 * c), vcombine_s8(hi(va), hi(vb)));
    }
    out.d = [a.d, b.d, a.d, b.d];
}

/// The i32 vectors `[a_n, a_n, b_n, b_n]` for `n = 4m..4m+4` from `u = [a_4m, b_4m, .., a_4m+3,
/// b_4m+3]` (i16): the per-row factor of each `smmla` lane (rows `r0`, `r1` in lanes 0, 1 and
/// 2, 3).
#[inline(always)]
unsafe fn row_factors(u: int16x8_t) -> [int32x4_t; 4] {
    let (l, h) = (vzip1q_s16(u, u), vzip2q_s16(u, u));
    [
        vmovl_s16(vget_low_s16(l)),
        vmovl_high_s16(l),
        vmovl_s16(vget_low_s16(h)),
        vmovl_high_s16(h),
    ]
}

/// The accumulated `(acc + ..)` f32 lanes `[r0·ta, r0·tb, r1·ta, r1·tb]` of `NP` token pairs
/// after `nb` Q4_K super-blocks of rows `w0`, `w1` against the pairs at `x[p * x_pair]`.
///
/// # Safety
/// Needs i8mm. `w0`, `w1` point at `nb` aligned blocks; `x + p * x_pair` (`p < NP`) at `nb`
/// [`PairQ8K`].
#[inline(always)]
unsafe fn q4k_rows<const NP: usize>(
    w0: *const BlockQ4K,
    w1: *const BlockQ4K,
    x: *const PairQ8K,
    x_pair: usize,
    nb: usize,
) -> [float32x4_t; NP] {
    let mut acc = [vdupq_n_f32(0.0); NP];
    for ib in 0..nb {
        let (b0, b1) = (&*w0.add(ib), &*w1.add(ib));
        let xs: [&PairQ8K; NP] = std::array::from_fn(|p| &*x.add(p * x_pair + ib));
        let (h0, sc0, mn0) = scales_mins_q4k(b0);
        let (h1, sc1, mn1) = scales_mins_q4k(b1);
        // [d0, dmin0, d1, dmin1] (f16 bits of each row's first 4 bytes).
        let dd = cvt_f16x4(vreinterpret_u16_u32(vzip1_u32(
            vreinterpret_u32_u8(vget_low_u8(h0)),
            vreinterpret_u32_u8(vget_low_u8(h1)),
        )));
        let (dw, dmw) = (vtrn1q_f32(dd, dd), vtrn2q_f32(dd, dd));
        // Scale differences t_k = s_k − s_{k+1} (s_8 = 0; |t| ≤ 63, exact in i8), rows
        // interleaved: [t0_0, t1_0, t0_1, t1_1, ..].
        let z8 = vdup_n_u8(0);
        let t0 = vreinterpret_s8_u8(vsub_u8(sc0, vext_u8::<1>(sc0, z8)));
        let t1 = vreinterpret_s8_u8(vsub_u8(sc1, vext_u8::<1>(sc1, z8)));
        let tt = vcombine_s8(vzip1_s8(t0, t1), vzip2_s8(t0, t1));
        let tw = [vmovl_s8(vget_low_s8(tt)), vmovl_high_s8(tt)];
        let mins = vreinterpretq_s8_u8(vcombine_u8(mn0, mn1));
        let zero = vdupq_n_s32(0);
        let (mut chain, mut sumi) = ([zero; NP], [zero; NP]);
        for g in 0..4 {
            // Bytes 32g..32g+32 of both rows: low nibbles are sub-block 2g (weights 64g..+32),
            // high nibbles sub-block 2g + 1 (64g + 32..+32); z[i] holds bytes 32g + 8i..+8.
            let z0 = zip_rows(vld1q_s8(b0.qs.as_ptr().add(32 * g).cast()), vld1q_s8(b1.qs.as_ptr().add(32 * g).cast()));
            let z1 = zip_rows(
                vld1q_s8(b0.qs.as_ptr().add(32 * g + 16).cast()),
                vld1q_s8(b1.qs.as_ptr().add(32 * g + 16).cast()),
            );
            let z = [z0[0], z0[1], z1[0], z1[1]];
            let f = row_factors(tw[g / 2]);
            for sub in 0..2 {
                for (i, zi) in z.iter().enumerate() {
                    let u = vreinterpretq_u8_s8(*zi);
                    let wq = if sub == 0 { vandq_u8(u, vdupq_n_u8(0x0F)) } else { vshrq_n_u8::<4>(u) };
                    let e = 8 * g + 4 * sub + i;
                    for p in 0..NP {
                        let xv = vld1q_s8(xs[p].qs.as_ptr().add(16 * e));
                        chain[p] = smmla(chain[p], vreinterpretq_s8_u8(wq), xv);
                    }
                }
                for p in 0..NP {
                    sumi[p] = vmlaq_s32(sumi[p], chain[p], f[2 * (g % 2) + sub]);
                }
            }
        }
        let dx: [float32x4_t; NP] = std::array::from_fn(|p| vld1q_f32(xs[p].d.as_ptr()));
        for p in 0..NP {
            let m = smmla(zero, mins, vld1q_s8(xs[p].hi.as_ptr()));
            let m = smmla(vshlq_n_s32::<7>(m), mins, vld1q_s8(xs[p].lo.as_ptr()));
            let ds = vmulq_f32(vmulq_f32(dw, dx[p]), vcvtq_f32_s32(sumi[p]));
            let dm = vmulq_f32(vmulq_f32(dmw, dx[p]), vcvtq_f32_s32(m));
            acc[p] = vaddq_f32(acc[p], vsubq_f32(ds, dm));
        }
    }
    acc
}

/// Chain order of the Q6_K sub-blocks in [`q6k_rows`]: position `n` = `4·(2h + i) + g` is
/// sub-block `8h + 2g + i` (weights `128h + 32g + 16i..+16`).
const Q6K_CHAIN: [u8; 16] = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15];

/// [`q4k_rows`] for Q6_K.
///
/// # Safety
/// As [`q4k_rows`].
#[inline(always)]
unsafe fn q6k_rows<const NP: usize>(
    w0: *const BlockQ6K,
    w1: *const BlockQ6K,
    x: *const PairQ8K,
    x_pair: usize,
    nb: usize,
) -> [float32x4_t; NP] {
    let mut acc = [vdupq_n_f32(0.0); NP];
    let chain_idx = vld1q_u8(Q6K_CHAIN.as_ptr());
    for ib in 0..nb {
        let (b0, b1) = (&*w0.add(ib), &*w1.add(ib));
        let xs: [&PairQ8K; NP] = std::array::from_fn(|p| &*x.add(p * x_pair + ib));
        let dw = vcombine_f32(vdup_n_f32(f16_to_f32(b0.d)), vdup_n_f32(f16_to_f32(b1.d)));
        let (sc0, sc1) = (vld1q_s8(b0.scales.as_ptr()), vld1q_s8(b1.scales.as_ptr()));
        // The bsum term's left operands: scales 0..8 and 8..16 of both rows.
        let asc = zip_rows(sc0, sc1);
        // Scale differences in chain order, t_n = c_n − c_{n+1} (c_16 = 0), in i16 (|t| ≤ 255),
        // rows interleaved: u[m] = [t0_4m, t1_4m, .., t0_4m+3, t1_4m+3].
        let diffs = |sc: int8x16_t| {
            let c = vqtbl1q_s8(sc, chain_idx);
            let (l, h) = (vmovl_s8(vget_low_s8(c)), vmovl_high_s8(c));
            [vsubq_s16(l, vextq_s16::<1>(l, h)), vsubq_s16(h, vextq_s16::<1>(h, vdupq_n_s16(0)))]
        };
        let (d0, d1) = (diffs(sc0), diffs(sc1));
        let u = [vzip1q_s16(d0[0], d1[0]), vzip2q_s16(d0[0], d1[0]), vzip1q_s16(d0[1], d1[1]), vzip2q_s16(d0[1], d1[1])];
        let zero = vdupq_n_s32(0);
        let (mut chain, mut sumi) = ([zero; NP], [zero; NP]);
        for h in 0..2 {
            for i in 0..2 {
                let ld = |b: &BlockQ6K, o: usize, qh: bool| {
                    if qh {
                        vld1q_u8(b.qh.as_ptr().add(o))
                    } else {
                        vld1q_u8(b.ql.as_ptr().add(o))
                    }
                };
                let pair = |o: usize, qh: bool| {
                    let z = zip_rows(vreinterpretq_s8_u8(ld(b0, o, qh)), vreinterpretq_s8_u8(ld(b1, o, qh)));
                    [vreinterpretq_u8_s8(z[0]), vreinterpretq_u8_s8(z[1])]
                };
                let ql0 = pair(64 * h + 16 * i, false);
                let ql1 = pair(64 * h + 32 + 16 * i, false);
                let qhb = pair(32 * h + 16 * i, true);
                let f = row_factors(u[2 * h + i]);
                let m3f = vdupq_n_u8(0x3F);
                for g in 0..4 {
                    for zv in 0..2 {
                        let (l0, l1, qh) = (ql0[zv], ql1[zv], qhb[zv]);
                        // q + 32 = low 4 bits from ql, bits 4..6 from qh (bits 2g..2g+2).
                        let wq = match g {
                            0 => vandq_u8(vsliq_n_u8::<4>(l0, qh), m3f),
                            1 => vandq_u8(vsliq_n_u8::<4>(l1, vshrq_n_u8::<2>(qh)), m3f),
                            2 => vandq_u8(vsliq_n_u8::<4>(vshrq_n_u8::<4>(l0), vshrq_n_u8::<4>(qh)), m3f),
                            _ => vsliq_n_u8::<4>(vshrq_n_u8::<4>(l1), vshrq_n_u8::<6>(qh)),
                        };
                        let e = 16 * h + 4 * g + 2 * i + zv;
                        for p in 0..NP {
                            let xv = vld1q_s8(xs[p].qs.as_ptr().add(16 * e));
                            chain[p] = smmla(chain[p], vreinterpretq_s8_u8(wq), xv);
                        }
                    }
                    for p in 0..NP {
                        sumi[p] = vmlaq_s32(sumi[p], chain[p], f[g]);
                    }
                }
            }
        }
        for p in 0..NP {
            let hi = (vld1q_s8(xs[p].hi.as_ptr()), vld1q_s8(xs[p].hi.as_ptr().add(16)));
            let lo = (vld1q_s8(xs[p].lo.as_ptr()), vld1q_s8(xs[p].lo.as_ptr().add(16)));
            let m = smmla(smmla(zero, asc[0], hi.0), asc[1], hi.1);
            let m = smmla(smmla(vshlq_n_s32::<7>(m), asc[0], lo.0), asc[1], lo.1);
            // The quants above are q + 32: remove 32 · Σ_k sc_k · bsum_k, exactly.
            let s = vsubq_s32(sumi[p], vshlq_n_s32::<5>(m));
            let d = vmulq_f32(dw, vld1q_f32(xs[p].d.as_ptr()));
            acc[p] = vaddq_f32(acc[p], vmulq_f32(d, vcvtq_f32_s32(s)));
        }
    }
    acc
}

/// The 2 rows × `NP` token pairs register tile of `kind`.
///
/// # Safety
/// As [`q4k_rows`] (with the blocks of `kind`).
#[inline]
#[target_feature(enable = "i8mm")]
unsafe fn rows_tile<const NP: usize>(
    kind: KQuant,
    w0: *const u8,
    w1: *const u8,
    x: *const PairQ8K,
    x_pair: usize,
    nb: usize,
) -> [float32x4_t; NP] {
    match kind {
        KQuant::Q4K => q4k_rows::<NP>(w0.cast(), w1.cast(), x, x_pair, nb),
        KQuant::Q6K => q6k_rows::<NP>(w0.cast(), w1.cast(), x, x_pair, nb),
    }
}

/// All products of a K-quant [`DotTile`] (`out[t * n_rows + r]`) in register tiles of 2 rows
/// × [`PAIRS`] token pairs, the activations packed once per call ([`PairQ8K`]).
///
/// # Safety
/// Needs i8mm; the [`DotTile`] alignment contract (the geometry is checked here).
#[target_feature(enable = "i8mm")]
pub(super) unsafe fn dot_tile_kquant(kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    let xb = size_of::<BlockQ8K>();
    let raw = tile.raw(kind.block_bytes(), xb, out);
    let (n_rows, n_tok, nb) = (raw.n_rows, raw.n_tok, raw.nb);
    let n_pairs = n_tok.div_ceil(2);
    let mut packed = vec![PAIR_ZERO; n_pairs * nb];
    for (p, blocks) in packed.chunks_exact_mut(nb.max(1)).enumerate().take(n_pairs) {
        let (ta, tb) = (2 * p, (2 * p + 1).min(n_tok - 1));
        for (ib, dst) in blocks.iter_mut().enumerate() {
            let a = &*raw.x.add(ta * raw.xs + ib * xb).cast::<BlockQ8K>();
            let b = &*raw.x.add(tb * raw.xs + ib * xb).cast::<BlockQ8K>();
            pack_pair(kind == KQuant::Q4K, a, b, dst);
        }
    }
    let store = |acc: float32x4_t, r0: usize, r1: usize, p: usize| {
        let (ta, tb) = (2 * p, 2 * p + 1);
        let v: [f32; 4] = std::mem::transmute(acc);
        let o = |t: usize, r: usize| raw.o.add(t * n_rows + r);
        *o(ta, r0) = v[0];
        if tb < n_tok {
            *o(tb, r0) = v[1];
        }
        if r1 != r0 {
            *o(ta, r1) = v[2];
            if tb < n_tok {
                *o(tb, r1) = v[3];
            }
        }
    };
    for r0 in (0..n_rows).step_by(2) {
        let r1 = (r0 + 1).min(n_rows - 1);
        let (w0, w1) = (raw.w.add(r0 * raw.ws), raw.w.add(r1 * raw.ws));
        let mut p = 0;
        while p < n_pairs {
            let x = packed.as_ptr().add(p * nb);
            if p + PAIRS <= n_pairs {
                let acc = rows_tile::<PAIRS>(kind, w0, w1, x, nb, nb);
                for (k, a) in acc.into_iter().enumerate() {
                    store(a, r0, r1, p + k);
                }
                p += PAIRS;
            } else {
                let [a] = rows_tile::<1>(kind, w0, w1, x, nb, nb);
                store(a, r0, r1, p);
                p += 1;
            }
        }
    }
}
