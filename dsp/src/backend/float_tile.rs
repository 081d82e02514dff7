//! Float weight products (f16, bf16, f32 rows against activations of the same type, ggml's
//! `vec_dot_f16` / `_bf16` / `_f32`) for the SIMD backends, written once over an 8-lane f32
//! vector ([`Lanes`]: an AVX2 `__m256`, or a NEON pair of `float32x4_t`) and instantiated inside
//! each backend's feature-enabled functions.
//!
//! One dot product ([`dot_float`]) widens 8 elements at a time to f32 and keeps two fused
//! multiply-add chains over 16-element steps (`a0` the even 8-lane chunks, `a1` the odd ones),
//! one more 8-element step into `a0`, reduces `hsum(a0 + a1)`, then adds the tail in order as
//! `w·x` products (multiply, then add). The tile kernel ([`dot_tile_float`]) gives each
//! (row, token) pair the same two chains, so its results equal the single dot products bit
//! for bit (and prefill equals decode), but widens each weight chunk once per tile of `T`
//! tokens and each activation chunk once per `R` rows: the products of a vision encoder (f16
//! projector weights, thousands of patches) then run at FMA rather than at conversion speed,
//! as llama.cpp's tiled f16 GEMM (`llamafile_sgemm`, tinyBLAS) does.
//!
//! Registers: `2·R·T` accumulators, `R` widened weight chunks and one activation chunk live at
//! once (AVX2 2 × 3 in 16 registers, AVX-512VL 4 × 3 in 32, NEON 2 × 2 in 32 of half width).

use half::{bf16, f16};

use super::attn::Lanes;
use super::{DotTile, Piece, PieceKernel};

/// An element type of float weight rows, widened to f32 exactly.
pub(super) trait FloatElem: Copy {
    /// 8 elements at `p` (unaligned) widened to 8 f32 lanes.
    ///
    /// # Safety
    /// 8 readable elements at `p`; the CPU has `L`'s features.
    unsafe fn load8<L: Lanes>(p: *const Self) -> L;
    /// One element widened to f32.
    fn widen(self) -> f32;
}

impl FloatElem for f16 {
    #[inline(always)]
    unsafe fn load8<L: Lanes>(p: *const Self) -> L {
        L::load_f16(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl FloatElem for bf16 {
    #[inline(always)]
    unsafe fn load8<L: Lanes>(p: *const Self) -> L {
        L::load_bf16(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl FloatElem for f32 {
    #[inline(always)]
    unsafe fn load8<L: Lanes>(p: *const Self) -> L {
        L::load_f32(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

/// One 8-element step at element `i` of every pair of the piece into `acc`: `R` weight
/// chunks widened once, then for each token its chunk widened once and FMA'd with all of them.
///
/// # Safety
/// As [`tile_float`]; `i + 8` elements readable in every row of the piece.
#[inline(always)]
unsafe fn step<L: Lanes, E: FloatElem, const R: usize, const T: usize>(
    acc: &mut [[L; T]; R],
    p: &Piece,
    i: usize,
) {
    let wv: [L; R] = std::array::from_fn(|r| {
        // SAFETY: row `r < R` of the piece holds `nb > i + 7` elements (caller).
        unsafe { E::load8(p.w.add(r * p.w_stride).cast::<E>().add(i)) }
    });
    for t in 0..T {
        let xv: L = E::load8(p.x.add(t * p.x_stride).cast::<E>().add(i));
        for r in 0..R {
            acc[r][t] = L::fma(acc[r][t], wv[r], xv);
        }
    }
}

/// The `R × T` products of a piece of float rows (`nb` = elements per row):
/// `out[t * out_stride + r] = w_row(r) · x_row(t)`, each with [`dot_float`]'s operations.
///
/// # Safety
/// The CPU has `L`'s features; `w + r·w_stride` (`r < R`) and `x + t·x_stride` (`t < T`) each
/// point at `nb` readable elements of `E`; `out + t·out_stride + r` is writable.
#[inline(always)]
unsafe fn tile_float<L: Lanes, E: FloatElem, const R: usize, const T: usize>(p: Piece) {
    let n = p.nb;
    let mut a0 = [[L::zero(); T]; R];
    let mut a1 = [[L::zero(); T]; R];
    let mut i = 0;
    while i + 16 <= n {
        step::<L, E, R, T>(&mut a0, &p, i);
        step::<L, E, R, T>(&mut a1, &p, i + 8);
        i += 16;
    }
    if i + 8 <= n {
        step::<L, E, R, T>(&mut a0, &p, i);
        i += 8;
    }
    for r in 0..R {
        let w = p.w.add(r * p.w_stride).cast::<E>();
        for t in 0..T {
            let x = p.x.add(t * p.x_stride).cast::<E>();
            let mut sum = L::add(a0[r][t], a1[r][t]).hsum();
            for j in i..n {
                sum += w.add(j).read_unaligned().widen() * x.add(j).read_unaligned().widen();
            }
            *p.out.add(t * p.out_stride + r) = sum;
        }
    }
}

/// `Σ w[j]·x[j]` over `min(len)` elements: the 1 × 1 tile (module docs).
///
/// # Safety
/// The CPU has `L`'s features.
#[inline(always)]
pub(super) unsafe fn dot_float<L: Lanes, E: FloatElem>(w: &[E], x: &[E]) -> f32 {
    let mut out = 0f32;
    let n = w.len().min(x.len());
    tile_float::<L, E, 1, 1>(Piece::single(w.as_ptr().cast(), x.as_ptr().cast(), n, &mut out));
    out
}

/// The float tile kernel as a [`PieceKernel`] (vectors `L`, elements `E`).
struct FloatKernel<L, E>(std::marker::PhantomData<(L, E)>);

impl<L: Lanes, E: FloatElem> PieceKernel for FloatKernel<L, E> {
    #[inline(always)]
    unsafe fn piece<const R: usize, const T: usize>(p: Piece) {
        tile_float::<L, E, R, T>(p)
    }
}

/// A whole [`DotTile`] of float rows (`E` is the tile's type: f16, bf16 or f32) in `R × T`
/// pieces and their edges ([`super::RawTile::cover`]).
///
/// # Safety
/// The CPU has `L`'s features; the tile's type is `E`'s (the geometry is checked by
/// [`DotTile::raw`], panicking).
#[inline(always)]
pub(super) unsafe fn dot_tile_float<L: Lanes, E: FloatElem, const R: usize, const T: usize>(
    tile: &DotTile<'_>,
    out: &mut [f32],
) {
    let es = std::mem::size_of::<E>();
    tile.raw(es, es, out).cover::<FloatKernel<L, E>, R, T>();
}
