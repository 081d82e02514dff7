//! NEON Q4_K and Q6_K products against Q8_K activations, for any number of tokens, with the
//! scalar reference's numerics (`super::scalar`; see [`super::avx2_kquants`]).
//!
//! A weight super-block is unpacked once ([`Unpacked`]: eight 32-byte groups of unsigned
//! quants, the per-16-weight scales, the Q4_K mins) and applied to every token of the sweep.
//! Per (row, token) and super-block the exact integers are the scaled product sum
//! `S = Σ_k sc_k · Σ_{p in sub-block k} q_p·x_p` (in i32 lanes of `sdot` or
//! [`super::neon::dot4`], any lane split) and the bsum term `M = Σ_k m_k · (bsum_2k +
//! bsum_2k+1)` (Q4_K; Q6_K's `−32 · Σ_k sc_k · bsum_k` is removed from `S` in the integers);
//! the lanes are summed, converted as `i32 as f32` and combined as the scalar backend does:
//! `acc + ((d_x·d_w)·S − (d_x·dmin)·M)` (Q4_K), `acc + (d_x·d_w)·S` (Q6_K). So every result
//! equals the scalar backend's, the AVX2 backend's and every other NEON level's bit for bit,
//! in every sweep shape (tiles equal single dots). The `neon-i8mm` tile
//! ([`super::neon_i8mm`]) computes the same integers with `smmla`.

use std::arch::aarch64::*;

use super::neon::{cvt_f16x4, dot4, dot4_acc, f16_to_f32};
use super::{DotTile, Piece};
use crate::quant::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};

/// Tokens per sweep (as AVX2: the activation blocks of one super-block column stay in L1).
const TOKENS: usize = 64;
/// Weight rows per sweep.
const ROWS: usize = 4;

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

/// One weight super-block ready for the token loop: `q[j]` the unsigned quants of weights
/// `32j..32j+32` (Q4_K: 0..15; Q6_K: q + 32 in 0..63) as two 16-byte halves; `s` the scales
/// as i32 lanes, slot `i` in lane `i % 4` of `s[i / 4]` (Q4_K: slot `j` for both halves of
/// group `j`; Q6_K: slot `2j + h` for half `h`), so each half is scaled by a by-element
/// `mla` (no scalar extraction, no `dup`); `bias` the per-lane factors of the bsum pairs
/// (Q4_K: `m_k` for lane `k`) or, for Q6_K, the 16 scales as i16; `dd` = `[d, dmin, ..]`.
/// `t`: the scale differences of [`accumulate`]'s `sdot` chains, in the slots of `s`: slot
/// `i` holds `s_i − s_next(i)` (Q4_K: next `i + 1`; Q6_K: `i + 2`, the same half of the next
/// group; `s` past the last group is 0).
struct Unpacked {
    q: [[int8x16_t; 2]; 8],
    s: [int32x4_t; 4],
    t: [int32x4_t; 4],
    bias_q4k: [int32x4_t; 2],
    bias_q6k: [int16x8_t; 2],
    dd: float32x4_t,
}

/// `acc + v · s[lane]` (i32 lanes; `lane` is a constant after unrolling).
#[inline(always)]
unsafe fn mla_lane(acc: int32x4_t, v: int32x4_t, s: int32x4_t, lane: usize) -> int32x4_t {
    match lane {
        0 => vmlaq_laneq_s32::<0>(acc, v, s),
        1 => vmlaq_laneq_s32::<1>(acc, v, s),
        2 => vmlaq_laneq_s32::<2>(acc, v, s),
        _ => vmlaq_laneq_s32::<3>(acc, v, s),
    }
}

/// `v`, hidden from the optimizer (no instruction): LLVM would otherwise fold a by-element
/// `mla` of a widened scale into a `dup` of the narrow lane and a widening per scale (two
/// instructions per group instead of the two widenings of all eight).
#[inline(always)]
unsafe fn opaque(v: int32x4_t) -> int32x4_t {
    let mut v = v;
    std::arch::asm!("/* {0:v} */", inout(vreg) v, options(pure, nomem, nostack, preserves_flags));
    v
}

/// 8 bytes widened to two vectors of 4 i32.
#[inline(always)]
unsafe fn widen_u8x8(v: uint8x8_t) -> [int32x4_t; 2] {
    let h = vmovl_u8(v);
    [
        vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))),
        vreinterpretq_s32_u32(vmovl_high_u16(h)),
    ]
}

/// The first 16 bytes of a [`BlockQ4K`] (`d`, `dmin` as f16 bits in u16 lanes 0 and 1, then
/// scale bytes 0..12) and its 8 six-bit scales and 8 mins ([`BlockQ4K::scales_mins`]) in
/// vector lanes: the 12 scale bytes are a = 0..4, b = 4..8, c = 8..12;
/// [sc 0..4, m 0..4] = [a, b] & 63 and [sc 4..8, m 4..8] = [c & 15, c >> 4] with bits 4..6
/// from [a, b] >> 6 (`sli`).
#[inline(always)]
pub(super) unsafe fn scales_mins_q4k(b: &BlockQ4K) -> (uint8x16_t, uint8x8_t, uint8x8_t) {
    let head = vld1q_u8((b as *const BlockQ4K).cast());
    let ab = vget_low_u8(vextq_u8::<4>(head, head));
    let cc = vreinterpret_u8_u32(vdup_laneq_u32::<3>(vreinterpretq_u32_u8(head)));
    let shifts = vcreate_s8(0xfcfc_fcfc_0000_0000);
    let lo = vand_u8(ab, vdup_n_u8(63));
    let hi = vsli_n_u8::<4>(vshl_u8(cc, shifts), vshr_n_u8::<6>(ab));
    let (lo, hi) = (vreinterpret_u32_u8(lo), vreinterpret_u32_u8(hi));
    (
        head,
        vreinterpret_u8_u32(vzip1_u32(lo, hi)),
        vreinterpret_u8_u32(vzip2_u32(lo, hi)),
    )
}

#[inline(always)]
unsafe fn unpack_q4k(b: &BlockQ4K) -> Unpacked {
    let mask = vdupq_n_u8(0x0F);
    let mut q = [[vdupq_n_s8(0); 2]; 8];
    for g in 0..4 {
        for h in 0..2 {
            let q4 = vld1q_u8(b.qs.as_ptr().add(32 * g + 16 * h));
            q[2 * g][h] = vreinterpretq_s8_u8(vandq_u8(q4, mask));
            q[2 * g + 1][h] = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q4));
        }
    }
    let (head, sc8, mn8) = scales_mins_q4k(b);
    let sc = widen_u8x8(sc8);
    let mn = widen_u8x8(mn8);
    let z = vdupq_n_s32(0);
    let t = [
        opaque(vsubq_s32(sc[0], vextq_s32::<1>(sc[0], sc[1]))),
        opaque(vsubq_s32(sc[1], vextq_s32::<1>(sc[1], z))),
    ];
    Unpacked {
        q,
        s: [opaque(sc[0]), opaque(sc[1]), z, z],
        t: [t[0], t[1], z, z],
        bias_q4k: mn,
        bias_q6k: [vdupq_n_s16(0); 2],
        // [d, dmin] (the f16 bits in lanes 0, 1; lanes 2, 3 unused).
        dd: cvt_f16x4(vget_low_u16(vreinterpretq_u16_u8(head))),
    }
}

#[inline(always)]
unsafe fn unpack_q6k(b: &BlockQ6K) -> Unpacked {
    let m4 = vdupq_n_u8(0x0F);
    let m30 = vdupq_n_u8(0x30);
    let mut q = [[vdupq_n_s8(0); 2]; 8];
    for h in 0..2 {
        for half in 0..2 {
            let o = 16 * half;
            let ql0 = vld1q_u8(b.ql.as_ptr().add(64 * h + o));
            let ql1 = vld1q_u8(b.ql.as_ptr().add(64 * h + 32 + o));
            let qh = vld1q_u8(b.qh.as_ptr().add(32 * h + o));
            let v = [
                vorrq_u8(vandq_u8(ql0, m4), vandq_u8(vshlq_n_u8::<4>(qh), m30)),
                vorrq_u8(vandq_u8(ql1, m4), vandq_u8(vshlq_n_u8::<2>(qh), m30)),
                vorrq_u8(vshrq_n_u8::<4>(ql0), vandq_u8(qh, m30)),
                vorrq_u8(vshrq_n_u8::<4>(ql1), vandq_u8(vshrq_n_u8::<2>(qh), m30)),
            ];
            for (k, vk) in v.into_iter().enumerate() {
                q[4 * h + k][half] = vreinterpretq_s8_u8(vk);
            }
        }
    }
    let sc = vld1q_s8(b.scales.as_ptr());
    let sc16 = [vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc)];
    let s = [
        vmovl_s16(vget_low_s16(sc16[0])),
        vmovl_high_s16(sc16[0]),
        vmovl_s16(vget_low_s16(sc16[1])),
        vmovl_high_s16(sc16[1]),
    ];
    let z = vdupq_n_s32(0);
    let t = [
        vsubq_s32(s[0], vextq_s32::<2>(s[0], s[1])),
        vsubq_s32(s[1], vextq_s32::<2>(s[1], s[2])),
        vsubq_s32(s[2], vextq_s32::<2>(s[2], s[3])),
        vsubq_s32(s[3], vextq_s32::<2>(s[3], z)),
    ];
    Unpacked {
        q,
        s: s.map(|v| opaque(v)),
        t: t.map(|v| opaque(v)),
        bias_q4k: [vdupq_n_s32(0); 2],
        bias_q6k: sc16,
        dd: vdupq_n_f32(f16_to_f32(b.d)),
    }
}

/// Adds one super-block product `w · x` to the running f32 sum `acc` with the scalar
/// reference's operations (`own_qs_reg`, a constant: code generation only, see below).
///
/// # Safety
/// Needs dotprod when `DOT`.
#[inline(always)]
#[allow(clippy::pointers_in_nomem_asm_block)]
unsafe fn accumulate<const Q4K: bool, const DOT: bool>(
    u: &Unpacked,
    x: &BlockQ8K,
    acc: f32,
    own_qs_reg: bool,
) -> f32 {
    // Σ_j s_j · D_j over the groups (or half-groups) j, D_j the exact `dot4` lanes of their
    // bytes; only the total of the lanes counts, so the lane split is free. At dotprod level
    // the `sdot`s run as prefix chains, P_j = D_0 + .. + D_j (no zeroed accumulator per group),
    // and Σ_j s_j · D_j = Σ_j (s_j − s_{j+1}) · P_j (s past the last = 0; Abel summation):
    // the same integers (i32 arithmetic wraps, the result fits). Q4_K's two halves of a group
    // share a scale, so they share one chain (one `mla` per group); Q6_K's halves have their
    // own scales (one chain per half). At neon level (no accumulating dot) each D_j is scaled.
    let mut sumi = [vdupq_n_s32(0); 2];
    let mut prefix = [vdupq_n_s32(0); 2];
    // `own_qs_reg` (the single column): the quants' address in a register of its own (an
    // empty asm hides it from the optimizer), so that their 16 loads pair into 8 `ldp`
    // (offsets from the block start, 4 + 16k, are no multiples of 16; LLVM otherwise keeps
    // the block pointer and 16 `ldur`s there). The token loop of a tile pairs them already,
    // and the extra register costs it instructions.
    let mut qs = x.qs.as_ptr();
    if own_qs_reg {
        // `nomem` is right (the asm touches no memory; hence the clippy allow on the fn):
        // `readonly`, or passing the address as an integer, cost the loop 1 to 10 instructions.
        std::arch::asm!("/* {0} */", inout(reg) qs, options(pure, nomem, nostack, preserves_flags));
    }
    for j in 0..8 {
        let xv = [vld1q_s8(qs.add(32 * j)), vld1q_s8(qs.add(32 * j + 16))];
        if DOT && Q4K {
            prefix[0] = dot4_acc::<DOT>(prefix[0], u.q[j][0], xv[0]);
            prefix[0] = dot4_acc::<DOT>(prefix[0], u.q[j][1], xv[1]);
            sumi[0] = mla_lane(sumi[0], prefix[0], u.t[j / 4], j % 4);
            continue;
        }
        for h in 0..2 {
            let slot = if Q4K { j } else { 2 * j + h };
            if DOT {
                prefix[h] = dot4_acc::<DOT>(prefix[h], u.q[j][h], xv[h]);
                sumi[h] = mla_lane(sumi[h], prefix[h], u.t[slot / 4], slot % 4);
            } else {
                let dot = dot4::<DOT>(u.q[j][h], xv[h]);
                sumi[h] = mla_lane(sumi[h], dot, u.s[slot / 4], slot % 4);
            }
        }
    }
    let bs = [
        vld1q_s16(x.bsums.as_ptr()),
        vld1q_s16(x.bsums.as_ptr().add(8)),
    ];
    let mut corr = [vdupq_n_s32(0); 2];
    for h in 0..2 {
        corr[h] = if Q4K {
            vmulq_s32(vpaddlq_s16(bs[h]), u.bias_q4k[h])
        } else {
            let b = u.bias_q6k[h];
            let lo = vmull_s16(vget_low_s16(bs[h]), vget_low_s16(b));
            let hi = vmull_high_s16(bs[h], b);
            vpaddq_s32(lo, hi)
        };
    }
    let s4 = vaddq_s32(sumi[0], sumi[1]);
    let c4 = vaddq_s32(corr[0], corr[1]);
    // [x.d · d, x.d · dmin, ..]: the scalar reference's scale products, lane-wise.
    let dd = vmulq_n_f32(u.dd, x.d);
    if Q4K {
        // [S, M, S, M] (pairwise adds: exact, wrapping), converted as `i32 as f32`.
        let t = vpaddq_s32(s4, c4);
        let p = vmulq_f32(vcvtq_f32_s32(vpaddq_s32(t, t)), dd);
        acc + (vgetq_lane_f32::<0>(p) - vgetq_lane_f32::<1>(p))
    } else {
        // The quants above are q + 32: remove 32 * Σ_k sc_k * bsum_k, exactly.
        let s = vaddvq_s32(vsubq_s32(s4, vshlq_n_s32::<5>(c4)));
        acc + vgetq_lane_f32::<0>(dd) * s as f32
    }
}

/// The finished sum of a (row, token) pair (the sweep's reduction hook: already one f32).
#[inline(always)]
pub(super) fn total(acc: f32) -> f32 {
    acc
}

/// `rows × n_tok` products (`rows ≤ ROWS`, `n_tok ≤ NT`); `out[t * out_stride + r]`.
///
/// # Safety
/// Needs dotprod when `DOT`. `w + r*w_stride` (r < rows) must point at `nb` aligned weight
/// blocks, `x + t*x_stride` (t < n_tok) at `nb` aligned [`BlockQ8K`]; `out + t*out_stride + r`
/// must be writable.
#[inline(always)]
unsafe fn sweep<const Q4K: bool, const NT: usize, const DOT: bool>(p: Piece) {
    kquant_sweep!(p, Q4K, NT, ROWS, 0f32, |u, bx, a| accumulate::<Q4K, DOT>(&u, bx, a, NT == 1), total)
}

/// [`sweep`] with the smallest accumulator capacity that holds `n_tok ≤ TOKENS` tokens.
///
/// # Safety
/// As [`sweep`].
#[inline(always)]
unsafe fn sweep_any<const Q4K: bool, const DOT: bool>(p: Piece) {
    match p.n_tok {
        1 => sweep::<Q4K, 1, DOT>(p),
        2 => sweep::<Q4K, 2, DOT>(p),
        3..=4 => sweep::<Q4K, 4, DOT>(p),
        5..=8 => sweep::<Q4K, 8, DOT>(p),
        _ => sweep::<Q4K, TOKENS, DOT>(p),
    }
}

/// A whole K-quant tile in sweeps of [`ROWS`] × [`TOKENS`].
///
/// # Safety
/// Needs dotprod when `DOT`; the [`DotTile`] alignment contract (geometry checked here).
#[inline(always)]
unsafe fn tile_body<const DOT: bool>(kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    let (wb, xb) = (kind.block_bytes(), size_of::<BlockQ8K>());
    for piece in tile.raw(wb, xb, out).pieces(ROWS, TOKENS) {
        match kind {
            KQuant::Q4K => sweep_any::<true, DOT>(piece),
            KQuant::Q6K => sweep_any::<false, DOT>(piece),
        }
    }
}

unsafe fn tile_neon(kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    tile_body::<false>(kind, tile, out)
}

#[target_feature(enable = "dotprod")]
unsafe fn tile_dot(kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    tile_body::<true>(kind, tile, out)
}

/// All products of a K-quant [`DotTile`] (`out[t * n_rows + r]`); `dot`: with `sdot`.
///
/// # Safety
/// Needs dotprod when `dot`; the [`DotTile`] alignment contract.
pub(super) unsafe fn dot_tile_kquant(dot: bool, kind: KQuant, tile: &DotTile<'_>, out: &mut [f32]) {
    if dot {
        tile_dot(kind, tile, out)
    } else {
        tile_neon(kind, tile, out)
    }
}

/// One K-quant dot product as a 1 × 1 sweep.
///
/// # Safety
/// Needs dotprod when `DOT`; `w` and `x` point at `nb` aligned blocks each.
#[inline(always)]
unsafe fn single_body<const DOT: bool>(kind: KQuant, w: *const u8, x: *const u8, nb: usize) -> f32 {
    let mut out = 0f32;
    match kind {
        KQuant::Q4K => sweep::<true, 1, DOT>(Piece::single(w, x, nb, &mut out)),
        KQuant::Q6K => sweep::<false, 1, DOT>(Piece::single(w, x, nb, &mut out)),
    }
    out
}

unsafe fn single_neon(kind: KQuant, w: *const u8, x: *const u8, nb: usize) -> f32 {
    single_body::<false>(kind, w, x, nb)
}

#[target_feature(enable = "dotprod")]
unsafe fn single_dot(kind: KQuant, w: *const u8, x: *const u8, nb: usize) -> f32 {
    single_body::<true>(kind, w, x, nb)
}

/// One K-quant dot product with the tile arithmetic (bit-identical to tiles).
///
/// # Safety
/// Needs dotprod when `dot`; `w` and `x` point at `nb` aligned blocks each.
pub(super) unsafe fn dot_kquant(
    dot: bool,
    kind: KQuant,
    w: *const u8,
    x: *const u8,
    nb: usize,
) -> f32 {
    if dot {
        single_dot(kind, w, x, nb)
    } else {
        single_neon(kind, w, x, nb)
    }
}
