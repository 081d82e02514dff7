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
use super::neon_kquants::KQuant;
use super::{DotTile, RawTile};
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

/// Writes every field of `*out` from the activation blocks of tokens `ta` (`a`) and `tb` (`b`)
/// (`out` may be uninitialized memory: nothing is zeroed first).
///
/// # Safety
/// `out` is valid for writes of one [`PairQ8K`].
#[inline(always)]
unsafe fn pack_pair(q4k: bool, a: &BlockQ8K, b: &BlockQ8K, out: *mut PairQ8K) {
    let qs = std::ptr::addr_of_mut!((*out).qs).cast::<i8>();
    for c in 0..16 {
        let z = zip_rows(vld1q_s8(a.qs.as_ptr().add(16 * c)), vld1q_s8(b.qs.as_ptr().add(16 * c)));
        vst1q_s8(qs.add(32 * c), z[0]);
        vst1q_s8(qs.add(32 * c + 16), z[1]);
    }
    let bsums = |x: &BlockQ8K| [vld1q_s16(x.bsums.as_ptr()), vld1q_s16(x.bsums.as_ptr().add(8))];
    let (ba, bb) = (bsums(a), bsums(b));
    // Q4_K: the pair sums in chunk 0 (chunk 1 is written but not read); Q6_K: bsums 0..8 in
    // chunk 0, 8..16 in chunk 1.
    let chunks = if q4k {
        [[vpaddq_s16(ba[0], ba[1]), vpaddq_s16(bb[0], bb[1])], [ba[1], bb[1]]]
    } else {
        [[ba[0], bb[0]], [ba[1], bb[1]]]
    };
    let lo = |v: int16x8_t| vmovn_s16(vandq_s16(v, vdupq_n_s16(127)));
    let hi = |v: int16x8_t| vmovn_s16(vshrq_n_s16::<7>(v));
    let (lo_p, hi_p) = (
        std::ptr::addr_of_mut!((*out).lo).cast::<i8>(),
        std::ptr::addr_of_mut!((*out).hi).cast::<i8>(),
    );
    for (c, [va, vb]) in chunks.into_iter().enumerate() {
        vst1q_s8(lo_p.add(16 * c), vcombine_s8(lo(va), lo(vb)));
        vst1q_s8(hi_p.add(16 * c), vcombine_s8(hi(va), hi(vb)));
    }
    let d = vld1_lane_f32::<1>(&b.d, vld1_dup_f32(&a.d));
    vst1q_f32(std::ptr::addr_of_mut!((*out).d).cast::<f32>(), vcombine_f32(d, d));
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

/// One super-block's factors of a Q4_K row pair (`r0`, `r1`), unpacked from both rows' 16-byte
/// heads at once (one 128-bit operation for the two rows' 64-bit halves).
struct Q4kPair {
    /// Scale differences `t_k = s_k − s_{k+1}` (`s_8 = 0`; |t| ≤ 63, exact in i8), rows
    /// interleaved: `[t0_0, t1_0, t0_1, t1_1, ..]`.
    tt: int8x16_t,
    /// `[m0_0..m0_8 | m1_0..m1_8]`: the mins as the bsum term's left `smmla` operand.
    mins: int8x16_t,
    /// `[d0, d0, d1, d1]` and `[dmin0, dmin0, dmin1, dmin1]`.
    dw: float32x4_t,
    dmw: float32x4_t,
}

/// [`Q4kPair`] of blocks `b0`, `b1` (the scale layout of `neon_kquants::scales_mins_q4k`: bytes 4..12 of
/// the head are scale bytes 0..8, bytes 12..16 scale bytes 8..12).
#[inline(always)]
unsafe fn q4k_pair(b0: &BlockQ4K, b1: &BlockQ4K) -> Q4kPair {
    let h0 = vld1q_u8((b0 as *const BlockQ4K).cast());
    let h1 = vld1q_u8((b1 as *const BlockQ4K).cast());
    let (u0, u1) = (vreinterpretq_u64_u8(vextq_u8::<4>(h0, h0)), vreinterpretq_u64_u8(vextq_u8::<4>(h1, h1)));
    // [scale bytes 0..8 of r0 | of r1]; [bytes 8..12 of r0 twice | of r1 twice].
    let ab = vreinterpretq_u8_u64(vzip1q_u64(u0, u1));
    let c = vreinterpretq_u32_u64(vzip2q_u64(vreinterpretq_u64_u8(h0), vreinterpretq_u64_u8(h1)));
    let cc = vreinterpretq_u8_u32(vtrn2q_u32(c, c));
    let shifts = vreinterpretq_s8_u64(vdupq_n_u64(0xfcfc_fcfc_0000_0000));
    let lo = vreinterpretq_u32_u8(vandq_u8(ab, vdupq_n_u8(63)));
    let hi = vreinterpretq_u32_u8(vsliq_n_u8::<4>(vshlq_u8(cc, shifts), vshrq_n_u8::<6>(ab)));
    // Per row: scales [lo.0, hi.0], mins [lo.1, hi.1] (u32 lanes of its 64-bit half).
    let sc = vreinterpretq_u8_u32(vtrn1q_u32(lo, hi));
    let mins = vreinterpretq_s8_u32(vtrn2q_u32(lo, hi));
    // t_k = s_k − s_{k+1}: each row's half shifted down one byte (zero in).
    let next = vreinterpretq_u8_u64(vshrq_n_u64::<8>(vreinterpretq_u64_u8(sc)));
    let t = vreinterpretq_s8_u8(vsubq_u8(sc, next));
    let tt = vzip1q_s8(t, vextq_s8::<8>(t, t));
    // [d0, dmin0, d1, dmin1] (f16 bits of each row's first 4 bytes).
    let dd = cvt_f16x4(vreinterpret_u16_u32(vzip1_u32(
        vreinterpret_u32_u8(vget_low_u8(h0)),
        vreinterpret_u32_u8(vget_low_u8(h1)),
    )));
    Q4kPair {
        tt,
        mins,
        dw: vtrn1q_f32(dd, dd),
        dmw: vtrn2q_f32(dd, dd),
    }
}

/// The accumulated `(acc + ..)` f32 lanes `[r0·ta, r0·tb, r1·ta, r1·tb]` of `RP` row pairs
/// (`w[r] = [r0, r1]`) × `NP` token pairs after `nb` Q4_K super-blocks, against the pairs at
/// `x[p * x_pair]`. The row pairs share each activation load, the token pairs each unpacked
/// weight register.
///
/// # Safety
/// Needs i8mm. `w[r][i]` point at `nb` aligned blocks; `x + p * x_pair` (`p < NP`) at `nb`
/// [`PairQ8K`].
#[inline(always)]
unsafe fn q4k_rows<const RP: usize, const NP: usize>(
    w: [[*const BlockQ4K; 2]; RP],
    x: *const PairQ8K,
    x_pair: usize,
    nb: usize,
) -> [[float32x4_t; NP]; RP] {
    let mut acc = [[vdupq_n_f32(0.0); NP]; RP];
    let zero = vdupq_n_s32(0);
    for ib in 0..nb {
        let xs: [&PairQ8K; NP] = std::array::from_fn(|p| &*x.add(p * x_pair + ib));
        let rows: [[&BlockQ4K; 2]; RP] = std::array::from_fn(|r| [&*w[r][0].add(ib), &*w[r][1].add(ib)]);
        let f8: [Q4kPair; RP] = std::array::from_fn(|r| q4k_pair(rows[r][0], rows[r][1]));
        let (mut chain, mut sumi) = ([[zero; NP]; RP], [[zero; NP]; RP]);
        // The 4 groups written out (const G), so nothing is indexed at run time.
        q4k_group::<RP, NP, 0>(&rows, &f8, &xs, &mut chain, &mut sumi);
        q4k_group::<RP, NP, 1>(&rows, &f8, &xs, &mut chain, &mut sumi);
        q4k_group::<RP, NP, 2>(&rows, &f8, &xs, &mut chain, &mut sumi);
        q4k_group::<RP, NP, 3>(&rows, &f8, &xs, &mut chain, &mut sumi);
        let dx: [float32x4_t; NP] = std::array::from_fn(|p| vld1q_f32(xs[p].d.as_ptr()));
        let (hi, lo): ([int8x16_t; NP], [int8x16_t; NP]) = (
            std::array::from_fn(|p| vld1q_s8(xs[p].hi.as_ptr())),
            std::array::from_fn(|p| vld1q_s8(xs[p].lo.as_ptr())),
        );
        for r in 0..RP {
            let q = &f8[r];
            for p in 0..NP {
                let m = smmla(zero, q.mins, hi[p]);
                let m = smmla(vshlq_n_s32::<7>(m), q.mins, lo[p]);
                let ds = vmulq_f32(vmulq_f32(q.dw, dx[p]), vcvtq_f32_s32(sumi[r][p]));
                let dm = vmulq_f32(vmulq_f32(q.dmw, dx[p]), vcvtq_f32_s32(m));
                acc[r][p] = vaddq_f32(acc[r][p], vsubq_f32(ds, dm));
            }
        }
    }
    acc
}

/// Group `G` (weights `64G..64G+64`, sub-blocks `2G`, `2G + 1`) of a [`q4k_rows`] super-block:
/// the `smmla` prefix chains and the scaled differences added to `sumi`.
#[inline(always)]
unsafe fn q4k_group<const RP: usize, const NP: usize, const G: usize>(
    rows: &[[&BlockQ4K; 2]; RP],
    f8: &[Q4kPair; RP],
    xs: &[&PairQ8K; NP],
    chain: &mut [[int32x4_t; NP]; RP],
    sumi: &mut [[int32x4_t; NP]; RP],
) {
    // Bytes 32G..32G+32 of both rows: low nibbles are sub-block 2G (weights 64G..+32), high
    // nibbles sub-block 2G + 1 (64G + 32..+32); z[r][i] holds bytes 32G + 8i..+8 of the pair's
    // two rows.
    let z: [[uint8x16_t; 4]; RP] = std::array::from_fn(|r| {
        let a = vld1q_u8_x2(rows[r][0].qs.as_ptr().add(32 * G));
        let b = vld1q_u8_x2(rows[r][1].qs.as_ptr().add(32 * G));
        let (z0, z1) = (zip_rows_u8(a.0, b.0), zip_rows_u8(a.1, b.1));
        [z0[0], z0[1], z1[0], z1[1]]
    });
    // The factors of sub-blocks 2G, 2G + 1: [t0, t0, t1, t1] in i32.
    let f: [[int32x4_t; 2]; RP] = std::array::from_fn(|r| {
        let tt = f8[r].tt;
        let tw = if G < 2 { vmovl_s8(vget_low_s8(tt)) } else { vmovl_high_s8(tt) };
        let u = if G % 2 == 0 { vzip1q_s16(tw, tw) } else { vzip2q_s16(tw, tw) };
        [vmovl_s16(vget_low_s16(u)), vmovl_high_s16(u)]
    });
    // Both sub-blocks written out (nothing indexed at run time).
    q4k_sub::<RP, NP, G, 0>(&z, &f, xs, chain, sumi);
    q4k_sub::<RP, NP, G, 1>(&z, &f, xs, chain, sumi);
}

/// Sub-block `2G + SUB` of [`q4k_group`]: its 4 `smmla` steps per (row pair, token pair) on
/// the chain, then the chain times the sub-block's scale difference into `sumi`.
#[inline(always)]
unsafe fn q4k_sub<const RP: usize, const NP: usize, const G: usize, const SUB: usize>(
    z: &[[uint8x16_t; 4]; RP],
    f: &[[int32x4_t; 2]; RP],
    xs: &[&PairQ8K; NP],
    chain: &mut [[int32x4_t; NP]; RP],
    sumi: &mut [[int32x4_t; NP]; RP],
) {
    let m4 = vdupq_n_u8(0x0F);
    for half in 0..2 {
        let e = 8 * G + 4 * SUB + 2 * half;
        let xv: [int8x16x2_t; NP] = std::array::from_fn(|p| vld1q_s8_x2(xs[p].qs.as_ptr().add(16 * e)));
        for r in 0..RP {
            for k in 0..2 {
                let zi = z[r][2 * half + k];
                let wq = vreinterpretq_s8_u8(if SUB == 0 { vandq_u8(zi, m4) } else { vshrq_n_u8::<4>(zi) });
                for p in 0..NP {
                    let xk = if k == 0 { xv[p].0 } else { xv[p].1 };
                    chain[r][p] = smmla(chain[r][p], wq, xk);
                }
            }
        }
    }
    for r in 0..RP {
        for p in 0..NP {
            sumi[r][p] = vmlaq_s32(sumi[r][p], chain[r][p], f[r][SUB]);
        }
    }
}

/// [`zip_rows`] of u8 vectors.
#[inline(always)]
unsafe fn zip_rows_u8(a: uint8x16_t, b: uint8x16_t) -> [uint8x16_t; 2] {
    let z = zip_rows(vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(b));
    [vreinterpretq_u8_s8(z[0]), vreinterpretq_u8_s8(z[1])]
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
        // The 4 (h, i) quarters written out (const H, I), so nothing is indexed at run time.
        q6k_quarter::<NP, 0, 0>(b0, b1, &u, &xs, &mut chain, &mut sumi);
        q6k_quarter::<NP, 0, 1>(b0, b1, &u, &xs, &mut chain, &mut sumi);
        q6k_quarter::<NP, 1, 0>(b0, b1, &u, &xs, &mut chain, &mut sumi);
        q6k_quarter::<NP, 1, 1>(b0, b1, &u, &xs, &mut chain, &mut sumi);
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

/// Quarter `(H, I)` of a [`q6k_rows`] super-block: chain positions `4·(2H + I)..+4`, i.e.
/// sub-blocks `8H + 2g + I` (weights `128H + 32g + 16I..+16`, `g < 4`).
#[inline(always)]
unsafe fn q6k_quarter<const NP: usize, const H: usize, const I: usize>(
    b0: &BlockQ6K,
    b1: &BlockQ6K,
    u: &[int16x8_t; 4],
    xs: &[&PairQ8K; NP],
    chain: &mut [int32x4_t; NP],
    sumi: &mut [int32x4_t; NP],
) {
    let pair = |a: *const u8, b: *const u8| zip_rows_u8(vld1q_u8(a), vld1q_u8(b));
    let ql0 = pair(b0.ql.as_ptr().add(64 * H + 16 * I), b1.ql.as_ptr().add(64 * H + 16 * I));
    let ql1 = pair(b0.ql.as_ptr().add(64 * H + 32 + 16 * I), b1.ql.as_ptr().add(64 * H + 32 + 16 * I));
    let qhb = pair(b0.qh.as_ptr().add(32 * H + 16 * I), b1.qh.as_ptr().add(32 * H + 16 * I));
    let f = row_factors(u[2 * H + I]);
    q6k_step::<NP, H, I, 0>(&ql0, &ql1, &qhb, f[0], xs, chain, sumi);
    q6k_step::<NP, H, I, 1>(&ql0, &ql1, &qhb, f[1], xs, chain, sumi);
    q6k_step::<NP, H, I, 2>(&ql0, &ql1, &qhb, f[2], xs, chain, sumi);
    q6k_step::<NP, H, I, 3>(&ql0, &ql1, &qhb, f[3], xs, chain, sumi);
}

/// Chain position `4·(2H + I) + G` of [`q6k_quarter`]: 2 `smmla` steps per token pair, then the
/// chain times the position's scale difference `f` into `sumi`.
#[inline(always)]
unsafe fn q6k_step<const NP: usize, const H: usize, const I: usize, const G: usize>(
    ql0: &[uint8x16_t; 2],
    ql1: &[uint8x16_t; 2],
    qhb: &[uint8x16_t; 2],
    f: int32x4_t,
    xs: &[&PairQ8K; NP],
    chain: &mut [int32x4_t; NP],
    sumi: &mut [int32x4_t; NP],
) {
    let m3f = vdupq_n_u8(0x3F);
    // Activation chunks e, e + 1 (zv = 0, 1) in one load.
    let e = 16 * H + 4 * G + 2 * I;
    let xv: [int8x16x2_t; NP] = std::array::from_fn(|p| vld1q_s8_x2(xs[p].qs.as_ptr().add(16 * e)));
    for zv in 0..2 {
        let (l0, l1, qh) = (ql0[zv], ql1[zv], qhb[zv]);
        // q + 32 = low 4 bits from ql, bits 4..6 from qh (bits 2G..2G+2).
        let wq = match G {
            0 => vandq_u8(vsliq_n_u8::<4>(l0, qh), m3f),
            1 => vandq_u8(vsliq_n_u8::<4>(l1, vshrq_n_u8::<2>(qh)), m3f),
            2 => vandq_u8(vsliq_n_u8::<4>(vshrq_n_u8::<4>(l0), vshrq_n_u8::<4>(qh)), m3f),
            _ => vsliq_n_u8::<4>(vshrq_n_u8::<4>(l1), vshrq_n_u8::<6>(qh)),
        };
        for p in 0..NP {
            let xk = if zv == 0 { xv[p].0 } else { xv[p].1 };
            chain[p] = smmla(chain[p], vreinterpretq_s8_u8(wq), xk);
        }
    }
    for p in 0..NP {
        sumi[p] = vmlaq_s32(sumi[p], chain[p], f);
    }
}

/// The `RP` row pairs × `NP` token pairs register tile of `kind` (`w[r]` = the pair's two row
/// pointers; Q6_K runs its row pairs one after the other).
///
/// # Safety
/// As [`q4k_rows`] (with the blocks of `kind`).
#[inline]
#[target_feature(enable = "i8mm")]
unsafe fn rows_tile<const RP: usize, const NP: usize>(
    kind: KQuant,
    w: [[*const u8; 2]; RP],
    x: *const PairQ8K,
    x_pair: usize,
    nb: usize,
) -> [[float32x4_t; NP]; RP] {
    match kind {
        KQuant::Q4K => q4k_rows::<RP, NP>(w.map(|r| r.map(|p| p.cast())), x, x_pair, nb),
        KQuant::Q6K => std::array::from_fn(|r| q6k_rows::<NP>(w[r][0].cast(), w[r][1].cast(), x, x_pair, nb)),
    }
}

/// Rows `rows[r]` (`RP` pairs; a pair `[r, r]` is a single row) × all tokens of `raw`, token
/// pairs [`PAIRS`] at a time, against the packed activations (`nb` [`PairQ8K`] per token pair).
///
/// # Safety
/// As [`dot_tile_kquant`]; `packed` holds `n_tok.div_ceil(2) * nb` pairs.
#[inline]
#[target_feature(enable = "i8mm")]
unsafe fn row_block<const RP: usize>(kind: KQuant, raw: &RawTile, packed: *const PairQ8K, rows: [[usize; 2]; RP]) {
    let (n_rows, n_tok, nb) = (raw.n_rows, raw.n_tok, raw.nb);
    let n_pairs = n_tok.div_ceil(2);
    let w = rows.map(|r| r.map(|i| raw.w.add(i * raw.ws)));
    let store = |acc: float32x4_t, [r0, r1]: [usize; 2], p: usize| {
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
    let mut p = 0;
    while p < n_pairs {
        let x = packed.add(p * nb);
        if p + PAIRS <= n_pairs {
            let acc = rows_tile::<RP, PAIRS>(kind, w, x, nb, nb);
            for (r, accs) in acc.into_iter().enumerate() {
                for (k, a) in accs.into_iter().enumerate() {
                    store(a, rows[r], p + k);
                }
            }
            p += PAIRS;
        } else {
            let acc = rows_tile::<RP, 1>(kind, w, x, nb, nb);
            for (r, [a]) in acc.into_iter().enumerate() {
                store(a, rows[r], p);
            }
            p += 1;
        }
    }
}

/// All products of a K-quant [`DotTile`] (`out[t * n_rows + r]`) in register tiles of 2 rows
/// × [`PAIRS`] token pairs (Q4_K: 4 rows, two row pairs sharing the activation loads, while 4
/// rows are left), the activations packed once per call ([`PairQ8K`]).
///
/// # Safety
/// Needs i8mm; the [`DotTile`] alignment contract (the geometry is checked here).
#[target_feature(enable = "i8mm")]
pub(super) unsafe fn dot_tile_kquant(kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    let xb = size_of::<BlockQ8K>();
    let raw = tile.raw(kind.block_bytes(), xb, out);
    let (n_rows, n_tok, nb) = (raw.n_rows, raw.n_tok, raw.nb);
    let n_pairs = n_tok.div_ceil(2);
    // Every field of every element is written before `set_len` (no zeroing pass: at 4 tokens
    // a zeroed copy per element cost about as much as the packing).
    let mut packed: Vec<PairQ8K> = Vec::with_capacity(n_pairs * nb);
    let dst = packed.as_mut_ptr();
    for p in 0..n_pairs {
        let (ta, tb) = (2 * p, (2 * p + 1).min(n_tok - 1));
        for ib in 0..nb {
            let a = &*raw.x.add(ta * raw.xs + ib * xb).cast::<BlockQ8K>();
            let b = &*raw.x.add(tb * raw.xs + ib * xb).cast::<BlockQ8K>();
            pack_pair(kind == KQuant::Q4K, a, b, dst.add(p * nb + ib));
        }
    }
    packed.set_len(n_pairs * nb);
    let mut r0 = 0;
    if kind == KQuant::Q4K {
        while r0 + 4 <= n_rows {
            row_block::<2>(kind, &raw, packed.as_ptr(), [[r0, r0 + 1], [r0 + 2, r0 + 3]]);
            r0 += 4;
        }
    }
    while r0 < n_rows {
        row_block::<1>(kind, &raw, packed.as_ptr(), [[r0, (r0 + 1).min(n_rows - 1)]]);
        r0 += 2;
    }
}
