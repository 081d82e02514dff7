//! aarch64 NEON backends: `neon` (Armv8-A Advanced SIMD, every aarch64 CPU), `neon-dotprod`
//! (+ `sdot`, Armv8.2-A dotprod) and `neon-i8mm` (+ i8mm), chosen at run time with
//! `is_aarch64_feature_detected!` ([`Neon::get`]).
//!
//! # Numerics: the AVX2 backend's, bit for bit
//! Every kernel reproduces the f32 (and f64) operations of the AVX2 backend
//! ([`super::avx2`], [`super::avx2_kquants`], [`super::avx2_math`]) in the same order, so an
//! aarch64 build computes the same logits as the x86_64 AVX2 build and greedy decoding picks
//! the same tokens:
//! - an AVX2 `__m256` accumulator is a pair of `float32x4_t` (lanes 0..4, 4..8), updated with
//!   the same fused multiply-adds (`vfmaq_f32` / `vfmsq_f32` for `fmadd` / `fnmadd`) and
//!   reduced as `hsum_ps` does: `(s0 + s2) + (s1 + s3)` of `s = lo + hi` ([`hsum8`]);
//! - Q4_0, Q4_1 and Q8_0 blocks give the same exact i32 lanes: lane `k` of a 32-byte block
//!   is the sum of products of bytes `4k..4k+4` (`maddubs` + `madd` on x86). At `neon` level
//!   `vmull_s8` + `vpaddlq_s16` + `vpaddq_s32` build it ([`dot4`]); at `neon-dotprod` one
//!   `sdot` does (lane `k` of `sdot` is exactly bytes `4k..4k+4`);
//! - Q4_K and Q6_K have no lanes in their numerics: per super-block the exact integer totals
//!   are combined in f32 as the scalar reference does ([`super::neon_kquants`]), so any
//!   integer lane split gives the same bits (`sdot`'s 4-product lanes, `smmla`'s 8-product
//!   2 × 2 tiles);
//! - the float dots and tiles are the AVX2 ones over a pair of 4-lane vectors
//!   ([`super::float_tile`]: two 8-lane FMA chains, 2 × 2 tiles), `rms_norm_row` keeps its two
//!   4-lane f64 sums, and `exp` the f64 Cody–Waite + degree-11 polynomial of `avx2_math`
//!   ([`super::neon_math`]).
//!
//! `neon-i8mm`: the Q4_K and Q6_K tiles (every `dot_tile` of those types, one token or many)
//! run `smmla` register tiles of 2 rows × 4 tokens ([`super::neon_i8mm`]). Q4_0, Q4_1 and
//! Q8_0 keep the 4-product lanes above, which `smmla` (8 adjacent products per lane) cannot
//! give without zero-padding half of each operand, so at this level they and the single dots
//! run the dotprod kernels (the single K-quant dots compute the tiles' bits).
//!
//! Q4_0, Q4_1 and Q8_0 have a register-blocked tile kernel ([`TILE_R`] rows × [`TILE_T`]
//! tokens) in which each weight block is unpacked once per tile. Single dot products (and the
//! tiles' 1 × 1 edges) run [`dot_pairs`], two blocks per loop pass, with the per-block
//! operations of the tile kernel at 1 × 1 in the same order, so tiles are bit-identical to
//! single dots. Q4_K and Q6_K are in [`super::neon_kquants`].

use std::arch::aarch64::*;

use half::{bf16, f16};

use super::attn::{attention_tile, Lanes, Vector};
use super::attn_full::full_attention_tile;
use super::float_tile::{self, ByLanes, FloatElem};
use super::neon_kquants::{dot_kquant, dot_tile_kquant, KQuant};
use super::{dot_tile_by_pairs, AttnTile, DotTile, FullAttnTile, KernelBackend, Piece, PieceKernel};
use crate::quant::blocks::{
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::quant::GgmlType;

/// Weight rows per register tile (as AVX2).
const TILE_R: usize = 4;
/// Tokens per register tile (as AVX2).
const TILE_T: usize = 2;

/// Instruction-set level of a NEON backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Armv8-A Advanced SIMD (always present on aarch64).
    Neon,
    /// + `sdot` (FEAT_DotProd).
    DotProd,
    /// + `smmla` (FEAT_I8MM): K-quant tiles in `smmla` register tiles, the rest as dotprod.
    I8mm,
}

/// A NEON backend. Only obtainable through [`Neon::get`] / [`Neon::all`], which check the CPU
/// features, so holding one proves its level is available.
#[derive(Debug)]
pub struct Neon {
    level: Level,
}

static NEON: Neon = Neon { level: Level::Neon };
static NEON_DOTPROD: Neon = Neon {
    level: Level::DotProd,
};
static NEON_I8MM: Neon = Neon { level: Level::I8mm };

impl Neon {
    /// The base NEON backend (every aarch64 CPU has Advanced SIMD).
    pub fn get() -> &'static Neon {
        &NEON
    }

    /// The backend of `level` if this CPU has it (checked at run time).
    pub fn at(level: Level) -> Option<&'static Neon> {
        match level {
            Level::Neon => Some(&NEON),
            Level::DotProd => {
                std::arch::is_aarch64_feature_detected!("dotprod").then_some(&NEON_DOTPROD)
            }
            Level::I8mm => (std::arch::is_aarch64_feature_detected!("dotprod")
                && std::arch::is_aarch64_feature_detected!("i8mm"))
            .then_some(&NEON_I8MM),
        }
    }

    /// Every level this CPU has, lowest first.
    pub fn all() -> Vec<&'static Neon> {
        [Level::Neon, Level::DotProd, Level::I8mm]
            .into_iter()
            .filter_map(Neon::at)
            .collect()
    }

    /// This backend's level.
    pub fn level(&self) -> Level {
        self.level
    }

    fn dot(&self) -> bool {
        self.level != Level::Neon
    }
}

// === helpers ===

/// 8 f32 lanes (an AVX2 `__m256`): lanes 0..4 and 4..8.
type F8 = [float32x4_t; 2];

/// `hsum_ps` of the AVX2 backend: `(s0 + s2) + (s1 + s3)` where `s = lo + hi`.
#[inline(always)]
pub(super) unsafe fn hsum8(v: F8) -> f32 {
    let s = vaddq_f32(v[0], v[1]);
    let t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
}

/// `a + b` lane-wise on 8 lanes.
#[inline(always)]
unsafe fn add8(a: F8, b: F8) -> F8 {
    [vaddq_f32(a[0], b[0]), vaddq_f32(a[1], b[1])]
}

/// f16 bits at `p` (unaligned) to f32 (exact).
#[inline(always)]
pub(super) unsafe fn load_f16(p: *const u8) -> f32 {
    f16_bits_to_f32(p.cast::<u16>().read_unaligned())
}

/// One f16 to f32 (exact): a single `fcvt`, which every ARMv8.0 CPU has. `half`'s `to_f32`
/// checks the fp16 feature at run time on aarch64 and calls out of line with a software
/// fallback — about half of a Q4_0 block's loop (`tools/aarch64/insn_table.sh`).
#[inline(always)]
pub(super) fn f16_to_f32(h: f16) -> f32 {
    f16_bits_to_f32(h.to_bits())
}

/// [`f16_to_f32`] of raw bits.
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    let o: f32;
    // SAFETY: `fcvt` (half to single) is base ARMv8.0 FP, present on every aarch64 CPU; it
    // touches no memory, stack or flags.
    unsafe {
        std::arch::asm!("fcvt {0:s}, {1:h}", out(vreg) o, in(vreg) h,
            options(pure, nomem, nostack, preserves_flags));
    }
    o
}

/// 4 f16 (as bits) widened to f32 (`fcvtl`, exact; the `float16x4_t` intrinsics are not
/// stable Rust).
#[inline(always)]
pub(super) unsafe fn cvt_f16x4(h: uint16x4_t) -> float32x4_t {
    let o: float32x4_t;
    std::arch::asm!("fcvtl {0:v}.4s, {1:v}.4h", out(vreg) o, in(vreg) h,
        options(pure, nomem, nostack, preserves_flags));
    o
}

/// The high 4 of 8 f16 (as bits) widened to f32 (`fcvtl2`).
#[inline(always)]
unsafe fn cvt_f16x4_high(h: uint16x8_t) -> float32x4_t {
    let o: float32x4_t;
    std::arch::asm!("fcvtl2 {0:v}.4s, {1:v}.8h", out(vreg) o, in(vreg) h,
        options(pure, nomem, nostack, preserves_flags));
    o
}

/// `acc + sdot(a, b)`: lane `k` gains `Σ_{i<4} a[4k+i]·b[4k+i]` (the `vdotq_s32` intrinsic is
/// not stable Rust, hence the instruction).
///
/// # Safety
/// Needs dotprod.
#[inline]
#[target_feature(enable = "dotprod")]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    std::arch::asm!("sdot {0:v}.4s, {1:v}.16b, {2:v}.16b", inout(vreg) acc, in(vreg) a, in(vreg) b,
        options(pure, nomem, nostack, preserves_flags));
    acc
}

/// Sums of 4 adjacent products of signed bytes: lane `k` = `Σ_{i<4} w[4k+i]·x[4k+i]`, exact.
/// `DOT`: one `sdot`; else `vmull_s8` (i16 products) + pairwise widening adds.
///
/// # Safety
/// Needs dotprod when `DOT`.
#[inline(always)]
pub(super) unsafe fn dot4<const DOT: bool>(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    if DOT {
        sdot(vdupq_n_s32(0), w, x)
    } else {
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
        let hi = vpaddlq_s16(vmull_high_s8(w, x));
        vpaddq_s32(lo, hi)
    }
}

/// `acc + dot4(w, x)` (wrapping i32 lanes); `DOT`: one accumulating `sdot`.
///
/// # Safety
/// Needs dotprod when `DOT`.
#[inline(always)]
pub(super) unsafe fn dot4_acc<const DOT: bool>(
    acc: int32x4_t,
    w: int8x16_t,
    x: int8x16_t,
) -> int32x4_t {
    if DOT {
        sdot(acc, w, x)
    } else {
        vaddq_s32(acc, dot4::<false>(w, x))
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

/// 16 bytes at `p` as 32 nibbles: low nibbles (elements 0..16), then high nibbles (16..32).
#[inline(always)]
unsafe fn load_nibbles(p: *const u8) -> [int8x16_t; 2] {
    let t = vld1q_u8(p);
    [
        vreinterpretq_s8_u8(vandq_u8(t, vdupq_n_u8(0x0F))),
        vreinterpretq_s8_u8(vshrq_n_u8::<4>(t)),
    ]
}

/// `R × T` dot products of `nb` blocks of weight kind `K` (Q4_0 / Q4_1 / Q8_0) against its
/// activation type; `out[t * out_stride + r] = w_row(r) · x_row(t)`. The arithmetic of the
/// AVX2 `tile_q` per (row, token).
///
/// # Safety
/// Needs dotprod when `DOT`. `w + r*w_stride` for `r < R` and `x + t*x_stride` for `t < T`
/// must each point at `nb` readable blocks; `out + t*out_stride + r` must be writable.
#[inline(always)]
unsafe fn tile_q<const K: u8, const R: usize, const T: usize, const DOT: bool>(p: Piece) {
    let Piece { w, w_stride, x, x_stride, nb, out, out_stride, .. } = p;
    let (wb, xb, xq) = geometry(K);
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[[zero; 2]; T]; R];
    let mut accm = [[0f32; T]; R];
    for ib in 0..nb {
        let mut qw = [[vdupq_n_s8(0); 2]; R];
        let mut dw = [0f32; R];
        let mut mw = [0f32; R];
        for r in 0..R {
            let p = w.add(r * w_stride + ib * wb);
            dw[r] = load_f16(p);
            qw[r] = match K {
                K_Q4_0 => {
                    let [lo, hi] = load_nibbles(p.add(2));
                    let eight = vdupq_n_s8(8);
                    [vsubq_s8(lo, eight), vsubq_s8(hi, eight)]
                }
                K_Q4_1 => {
                    mw[r] = load_f16(p.add(2));
                    load_nibbles(p.add(4))
                }
                _ => [vld1q_s8(p.add(2).cast()), vld1q_s8(p.add(18).cast())],
            };
        }
        for t in 0..T {
            let p = x.add(t * x_stride + ib * xb);
            let dx = load_f16(p);
            let qx = [vld1q_s8(p.add(xq).cast()), vld1q_s8(p.add(xq + 16).cast())];
            let sx = if K == K_Q4_1 { load_f16(p.add(2)) } else { 0.0 };
            for r in 0..R {
                let d = vdupq_n_f32(dw[r] * dx);
                for h in 0..2 {
                    let dot = dot4::<DOT>(qw[r][h], qx[h]);
                    acc[r][t][h] = vfmaq_f32(acc[r][t][h], d, vcvtq_f32_s32(dot));
                }
                if K == K_Q4_1 {
                    accm[r][t] += mw[r] * sx;
                }
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *out.add(t * out_stride + r) = hsum8(acc[r][t]) + accm[r][t];
        }
    }
}

/// The scale products of blocks 0 and 1 of a pair as f32 lanes, from one vector load per
/// operand: `(d, m)` (Q4_1 / Q8_1: a 4-byte pair at the block start) or `d` (2 bytes) of
/// block 1 at `p + bytes` in lane 0 and of block 0 at `p` in lane 1 (an offset load, then a
/// lane load: 2 loads for 2 blocks instead of 2 loads and 2 `fcvt` per block), widened with one
/// `fcvtl` (exact) and multiplied lane-wise (one `fmul`, the same rounding as the scalar
/// `dw * dx`). Q4_0 / Q8_0 lanes: `[d1, d0, 0, 0]`; Q4_1: `[d1, m1, d0, m0]`.
/// `bytes == 0` loads one block twice (the odd tail).
///
/// # Safety
/// `w`, `w + w_bytes`, `x`, `x + x_bytes` must point at readable blocks of kind `K`.
#[inline(always)]
unsafe fn pair_scales<const K: u8>(
    w: *const u8,
    w_bytes: usize,
    x: *const u8,
    x_bytes: usize,
) -> float32x4_t {
    let load = |p: *const u8, bytes: usize| -> uint16x4_t {
        if K == K_Q4_1 {
            let v = vld1_lane_u32::<0>(p.add(bytes).cast(), vdup_n_u32(0));
            vreinterpret_u16_u32(vld1_lane_u32::<1>(p.cast(), v))
        } else {
            let v = vld1_lane_u16::<0>(p.add(bytes).cast(), vdup_n_u16(0));
            vld1_lane_u16::<1>(p.cast(), v)
        }
    };
    vmulq_f32(cvt_f16x4(load(w, w_bytes)), cvt_f16x4(load(x, x_bytes)))
}

/// One block of kind `K` fused into the 8-lane accumulator with the scale product in lane
/// `L` of `d`: the per-block operations of [`tile_q`] at 1 × 1, in its order.
///
/// # Safety
/// Needs dotprod when `DOT`; `w`, `x` point at one readable block each.
#[inline(always)]
unsafe fn block_q<const K: u8, const DOT: bool, const L: i32>(
    w: *const u8,
    x: *const u8,
    d: float32x4_t,
    acc: F8,
) -> F8 {
    let (_, _, xq) = geometry(K);
    let qw = match K {
        K_Q4_0 => {
            let [lo, hi] = load_nibbles(w.add(2));
            let eight = vdupq_n_s8(8);
            [vsubq_s8(lo, eight), vsubq_s8(hi, eight)]
        }
        K_Q4_1 => load_nibbles(w.add(4)),
        _ => [vld1q_s8(w.add(2).cast()), vld1q_s8(w.add(18).cast())],
    };
    let qx = [vld1q_s8(x.add(xq).cast()), vld1q_s8(x.add(xq + 16).cast())];
    let mut out = acc;
    for h in 0..2 {
        let dot = vcvtq_f32_s32(dot4::<DOT>(qw[h], qx[h]));
        out[h] = vfmaq_laneq_f32::<L>(out[h], dot, d);
    }
    out
}

/// One dot product of `nb` blocks of kind `K`, two blocks per loop pass (one scale load,
/// widening and multiply for both, [`pair_scales`]; the loop overhead shared) and a
/// one-block tail for odd `nb`. Bit-identical to [`tile_q`] at 1 × 1 (and so to the tiles
/// and the AVX2 backend): the blocks still enter the one 8-lane accumulator in order
/// (`acc = fma(fma(acc, b0), b1)`), and the Q4_1 `m·s` terms lane 3 of `accm` in order (the
/// scalar sum of [`tile_q`]: `(accm + m0·s0) + m1·s1`).
/// (Two accumulators, one per block parity, as llama.cpp's 2-block loops, would change the
/// f32 summation order and so the bits the x86 build computes.)
///
/// # Safety
/// Needs dotprod when `DOT`. `w` and `x` must each point at `nb` readable blocks.
#[inline(always)]
unsafe fn dot_pairs<const K: u8, const DOT: bool>(w: *const u8, x: *const u8, nb: usize) -> f32 {
    let (wb, xb, _) = geometry(K);
    let zero = vdupq_n_f32(0.0);
    let mut acc = [zero; 2];
    // Q4_1: lane 3 is the running `Σ m·s` (lanes 0..3 gather unused sums).
    let mut accm = zero;
    let (mut pw, mut px) = (w, x);
    for _ in 0..nb / 2 {
        let d = pair_scales::<K>(pw, wb, px, xb);
        if K == K_Q4_1 {
            // d = [d1, m1, d0, m0]: block 0 (lanes 2, 3), then block 1 (lanes 0, 1).
            acc = block_q::<K, DOT, 2>(pw, px, d, acc);
            acc = block_q::<K, DOT, 0>(pw.add(wb), px.add(xb), d, acc);
            accm = vaddq_f32(accm, d);
            accm = vaddq_f32(accm, vextq_f32::<2>(d, d));
        } else {
            // d = [d1, d0, 0, 0].
            acc = block_q::<K, DOT, 1>(pw, px, d, acc);
            acc = block_q::<K, DOT, 0>(pw.add(wb), px.add(xb), d, acc);
        }
        pw = pw.add(2 * wb);
        px = px.add(2 * xb);
    }
    if nb % 2 == 1 {
        let d = pair_scales::<K>(pw, 0, px, 0);
        if K == K_Q4_1 {
            acc = block_q::<K, DOT, 2>(pw, px, d, acc);
            accm = vaddq_f32(accm, d);
        } else {
            acc = block_q::<K, DOT, 1>(pw, px, d, acc);
        }
    }
    let m = if K == K_Q4_1 { vgetq_lane_f32::<3>(accm) } else { 0.0 };
    hsum8(acc) + m
}

/// [`dot_pairs`] at `neon` level.
///
/// # Safety
/// As [`dot_pairs`].
#[inline]
unsafe fn pair_neon<const K: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
    dot_pairs::<K, false>(w, x, nb)
}

/// [`dot_pairs`] with `sdot` (bit-identical results).
///
/// # Safety
/// Needs dotprod; pointers as [`dot_pairs`].
#[inline]
#[target_feature(enable = "dotprod")]
unsafe fn pair_dot<const K: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
    dot_pairs::<K, true>(w, x, nb)
}

/// [`tile_q`] at `neon` level.
///
/// # Safety
/// As [`tile_q`].
#[inline]
unsafe fn tile_neon<const K: u8, const R: usize, const T: usize>(p: Piece) {
    tile_q::<K, R, T, false>(p)
}

/// [`tile_q`] with `sdot` (bit-identical results).
///
/// # Safety
/// Needs dotprod; pointers as [`tile_q`].
#[inline]
#[target_feature(enable = "dotprod")]
unsafe fn tile_dot<const K: u8, const R: usize, const T: usize>(p: Piece) {
    tile_q::<K, R, T, true>(p)
}

/// The `R × T` tile of kind `K` at the level `DOT` names.
///
/// # Safety
/// As the kernel it dispatches to (the caller proves dotprod when `DOT`).
#[inline(always)]
unsafe fn tile_pick<const K: u8, const R: usize, const T: usize, const DOT: bool>(p: Piece) {
    if DOT {
        tile_dot::<K, R, T>(p)
    } else {
        tile_neon::<K, R, T>(p)
    }
}

/// [`tile_pick`] of kind `K` as a [`PieceKernel`]; a 1 × 1 piece is the single dot
/// [`dot_q`] (the same bits).
struct QKernel<const K: u8, const DOT: bool>;

impl<const K: u8, const DOT: bool> PieceKernel for QKernel<K, DOT> {
    #[inline(always)]
    unsafe fn piece<const R: usize, const T: usize>(p: Piece) {
        if R == 1 && T == 1 {
            *p.out = dot_q::<K, DOT>(p.w, p.x, p.nb)
        } else {
            tile_pick::<K, R, T, DOT>(p)
        }
    }
}

/// A whole [`DotTile`] of kind `K` in `R × T` pieces and their edges
/// ([`super::RawTile::cover`]).
///
/// # Safety
/// Needs dotprod when `DOT`; the geometry is checked here.
unsafe fn dot_tile_q<const K: u8, const R: usize, const T: usize, const DOT: bool>(
    tile: &DotTile<'_>,
    out: &mut [f32],
) {
    let (wb, xb, _) = geometry(K);
    tile.raw(wb, xb, out).cover::<QKernel<K, DOT>, R, T>();
}

/// One dot product: [`dot_pairs`] at the level `DOT` names (bit-identical to tiled results).
///
/// # Safety
/// Needs dotprod when `DOT`; `w` and `x` point at `nb` blocks each.
unsafe fn dot_q<const K: u8, const DOT: bool>(w: *const u8, x: *const u8, nb: usize) -> f32 {
    if DOT {
        pair_dot::<K>(w, x, nb)
    } else {
        pair_neon::<K>(w, x, nb)
    }
}

/// Loads 8 f16 values widened to f32.
#[inline(always)]
unsafe fn load_f16x8(p: *const f16) -> F8 {
    let h = vld1q_u16(p.cast());
    [cvt_f16x4(vget_low_u16(h)), cvt_f16x4_high(h)]
}

/// Loads 8 bf16 values widened to f32 (a bf16 is the high half of an f32).
#[inline(always)]
unsafe fn load_bf16x8(p: *const bf16) -> F8 {
    let h = vld1q_u16(p.cast());
    [
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
    ]
}

/// Loads 8 f32 values.
#[inline(always)]
unsafe fn load_f32x8(p: *const f32) -> F8 {
    [vld1q_f32(p), vld1q_f32(p.add(4))]
}

/// `a + b·c` on 8 lanes, fused.
#[inline(always)]
unsafe fn fma8(a: F8, b: F8, c: F8) -> F8 {
    [vfmaq_f32(a[0], b[0], c[0]), vfmaq_f32(a[1], b[1], c[1])]
}

fn dot_float<E: FloatElem>(w: &[E], x: &[E]) -> f32 {
    // SAFETY: NEON is baseline on aarch64; `dot_float` reads `min(len)` elements.
    unsafe { float_tile::dot_float::<F8, E>(w, x) }
}

/// As the AVX2 `rms_norm_row`: squares in f32, widened and summed in two 4-lane f64
/// accumulators (8-element steps), reduced `(l0 + l1) + (l2 + l3)`, the tail in order.
fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len().min(w.len()).min(out.len());
    // SAFETY: NEON is baseline; every access is below `n`.
    unsafe {
        let z = vdupq_n_f64(0.0);
        // s0 = lanes 0..4 (as 0..2, 2..4), s1 = lanes 4..8.
        let (mut s0a, mut s0b, mut s1a, mut s1b) = (z, z, z, z);
        let mut i = 0;
        while i + 8 <= n {
            let v0 = vld1q_f32(x.as_ptr().add(i));
            let v1 = vld1q_f32(x.as_ptr().add(i + 4));
            let (q0, q1) = (vmulq_f32(v0, v0), vmulq_f32(v1, v1));
            s0a = vaddq_f64(s0a, vcvt_f64_f32(vget_low_f32(q0)));
            s0b = vaddq_f64(s0b, vcvt_high_f64_f32(q0));
            s1a = vaddq_f64(s1a, vcvt_f64_f32(vget_low_f32(q1)));
            s1b = vaddq_f64(s1b, vcvt_high_f64_f32(q1));
            i += 8;
        }
        let l01 = vaddq_f64(s0a, s1a);
        let l23 = vaddq_f64(s0b, s1b);
        let mut sum = (vgetq_lane_f64::<0>(l01) + vgetq_lane_f64::<1>(l01))
            + (vgetq_lane_f64::<0>(l23) + vgetq_lane_f64::<1>(l23));
        for &v in &x[i..n] {
            sum += (v * v) as f64;
        }
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        let sv = vdupq_n_f32(scale);
        let mut i = 0;
        while i + 4 <= n {
            let v = vmulq_f32(vld1q_f32(x.as_ptr().add(i)), sv);
            vst1q_f32(
                out.as_mut_ptr().add(i),
                vmulq_f32(v, vld1q_f32(w.as_ptr().add(i))),
            );
            i += 4;
        }
        for j in i..n {
            out[j] = (x[j] * scale) * w[j];
        }
    }
}

fn add_inplace(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len());
    let mut i = 0;
    // SAFETY: NEON is baseline; every access is below `n`.
    unsafe {
        while i + 4 <= n {
            let s = vaddq_f32(
                vld1q_f32(dst.as_ptr().add(i)),
                vld1q_f32(src.as_ptr().add(i)),
            );
            vst1q_f32(dst.as_mut_ptr().add(i), s);
            i += 4;
        }
    }
    for j in i..n {
        dst[j] += src[j];
    }
}

fn axpy_f16(out: &mut [f32], a: f32, v: &[f16]) {
    let n = out.len().min(v.len());
    let mut i = 0;
    // SAFETY: NEON is baseline; every access is below `n`.
    unsafe {
        let av = vdupq_n_f32(a);
        while i + 8 <= n {
            let vv = load_f16x8(v.as_ptr().add(i));
            for h in 0..2 {
                let o = out.as_mut_ptr().add(i + 4 * h);
                // mul then add (no fma): bit-identical to the scalar backend.
                vst1q_f32(o, vaddq_f32(vld1q_f32(o), vmulq_f32(av, vv[h])));
            }
            i += 8;
        }
    }
    for j in i..n {
        out[j] += a * f16_to_f32(v[j]);
    }
}

/// The NEON vector of the attention tiles: [`load_f16x8`], [`fma8`], [`hsum8`] as in
/// [`dot_float`] and mul-then-add on each half as in [`axpy_f16`] (NEON is baseline).
impl Vector for F8 {
    const WIDTH: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        [vdupq_n_f32(0.0); 2]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        [vdupq_n_f32(x); 2]
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> Self {
        load_f32x8(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        vst1q_f32(p, self[0]);
        vst1q_f32(p.add(4), self[1]);
    }
    #[inline(always)]
    unsafe fn fma(acc: Self, w: Self, x: Self) -> Self {
        fma8(acc, w, x)
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        add8(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        [vmulq_f32(a[0], b[0]), vmulq_f32(a[1], b[1])]
    }
}

impl Lanes for F8 {
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
        hsum8(self)
    }
}

/// A quantized product at the backend's level: `$f::<K, DOT>(args)`.
macro_rules! at_level {
    ($self:ident, $f:ident::<$k:ident>($($a:expr),*)) => {
        if $self.dot() { $f::<$k, true>($($a),*) } else { $f::<$k, false>($($a),*) }
    };
}

impl Neon {
    /// The single dot product of `nb` blocks of `ty` (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) with
    /// their activation blocks ([`quant_dot_methods`]), at this backend's level.
    ///
    /// # Safety
    /// `w` and `x` point at `nb` aligned blocks each (dotprod, where the level uses it, is
    /// proven by `self`).
    #[inline(always)]
    unsafe fn dot_blocks(&self, ty: GgmlType, w: *const u8, x: *const u8, nb: usize) -> f32 {
        match ty {
            GgmlType::Q4_0 => at_level!(self, dot_q::<K_Q4_0>(w, x, nb)),
            GgmlType::Q4_1 => at_level!(self, dot_q::<K_Q4_1>(w, x, nb)),
            GgmlType::Q8_0 => at_level!(self, dot_q::<K_Q8_0>(w, x, nb)),
            GgmlType::Q4_K => dot_kquant(self.dot(), KQuant::Q4K, w, x, nb),
            GgmlType::Q6_K => dot_kquant(self.dot(), KQuant::Q6K, w, x, nb),
            _ => unreachable!("no quantized block dot product for {ty}"),
        }
    }
}

// SAFETY (every `unsafe` block below): a `Neon` exists only via `Neon::get` / `Neon::at`, which
// checked dotprod for the levels that use it (NEON itself is baseline on aarch64); the single
// dot products read `min(len)` blocks of the slices passed, and the tile kernels assert their
// geometry against the slice lengths before raw access.
impl KernelBackend for Neon {
    fn name(&self) -> &'static str {
        match self.level {
            Level::Neon => "neon",
            Level::DotProd => "neon-dotprod",
            Level::I8mm => "neon-i8mm",
        }
    }

    fn gdn_chunked_head(&self, head: &mut crate::gdn::chunked::ChunkedHead<'_, '_>) {
        crate::gdn::chunked::head_fused(head)
    }

    quant_dot_methods!();

    fn vec_dot_f16(&self, w: &[f16], x: &[f16]) -> f32 {
        dot_float(w, x)
    }

    fn vec_dot_bf16(&self, w: &[bf16], x: &[bf16]) -> f32 {
        dot_float(w, x)
    }

    fn vec_dot_f32(&self, w: &[f32], x: &[f32]) -> f32 {
        dot_float(w, x)
    }

    fn dot_tile(&self, tile: &DotTile<'_>, out: &mut [f32]) {
        // SAFETY: see the impl comment; the tile kernels assert the tile geometry.
        unsafe {
            match (tile.ty, self.dot()) {
                (GgmlType::Q4_0, false) => dot_tile_q::<K_Q4_0, TILE_R, TILE_T, false>(tile, out),
                (GgmlType::Q4_0, true) => dot_tile_q::<K_Q4_0, TILE_R, TILE_T, true>(tile, out),
                (GgmlType::Q4_1, false) => dot_tile_q::<K_Q4_1, TILE_R, TILE_T, false>(tile, out),
                (GgmlType::Q4_1, true) => dot_tile_q::<K_Q4_1, TILE_R, TILE_T, true>(tile, out),
                (GgmlType::Q8_0, false) => dot_tile_q::<K_Q8_0, TILE_R, TILE_T, false>(tile, out),
                (GgmlType::Q8_0, true) => dot_tile_q::<K_Q8_0, TILE_R, TILE_T, true>(tile, out),
                (GgmlType::Q4_K, _) if self.level == Level::I8mm => {
                    super::neon_i8mm::dot_tile_kquant(KQuant::Q4K, tile, out)
                }
                (GgmlType::Q6_K, _) if self.level == Level::I8mm => {
                    super::neon_i8mm::dot_tile_kquant(KQuant::Q6K, tile, out)
                }
                (GgmlType::Q4_K, dot) => dot_tile_kquant(dot, KQuant::Q4K, tile, out),
                (GgmlType::Q6_K, dot) => dot_tile_kquant(dot, KQuant::Q6K, tile, out),
                (GgmlType::F16, _) => float_tile::dot_tile_float::<ByLanes<F8>, f16, 2, 2>(tile, out),
                (GgmlType::BF16, _) => float_tile::dot_tile_float::<ByLanes<F8>, bf16, 2, 2>(tile, out),
                (GgmlType::F32, _) => float_tile::dot_tile_float::<ByLanes<F8>, f32, 2, 2>(tile, out),
                _ => dot_tile_by_pairs(self, tile, out),
            }
        }
    }

    fn rms_norm_row(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        debug_assert!(x.len() == w.len() && x.len() == out.len());
        rms_norm_row(x, w, eps, out)
    }

    fn add_inplace(&self, dst: &mut [f32], src: &[f32]) {
        debug_assert_eq!(dst.len(), src.len());
        add_inplace(dst, src)
    }

    fn axpy_f16(&self, out: &mut [f32], a: f32, v: &[f16]) {
        debug_assert_eq!(out.len(), v.len());
        axpy_f16(out, a, v)
    }

    fn silu_inplace(&self, x: &mut [f32]) {
        super::neon_math::silu_inplace(x)
    }

    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        debug_assert!(gate.len() == up.len() && gate.len() == out.len());
        super::neon_math::swiglu(gate, up, out)
    }

    fn gelu_tanh_inplace(&self, x: &mut [f32]) {
        super::neon_math::gelu_tanh_inplace(x)
    }

    fn softmax_inplace(&self, x: &mut [f32]) {
        super::neon_math::softmax_inplace(x)
    }

    fn attention_queries(&self, tile: &AttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
        // SAFETY: see the impl comment; the kernel checks the tile's shapes. Reference:
        // `attention_queries_by_pairs` with `dot_float` and `axpy_f16`.
        unsafe { attention_tile::<F8>(tile, scores, out, super::neon_math::softmax_inplace) }
    }

    fn full_attention(&self, tile: &FullAttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
        // SAFETY: see the impl comment; the kernel checks the tile's shapes. Reference:
        // `full_attention_by_chains` with the NEON softmax (4 queries × 16 keys or output
        // columns of accumulators, 16 of the 32 registers).
        unsafe { full_attention_tile::<F8, 4>(tile, scores, out, super::neon_math::softmax_inplace) }
    }
}
