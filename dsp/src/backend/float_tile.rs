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
//! once (AVX2 2 × 3 in 16 registers, NEON 2 × 2 in 32 of half width). A backend with 16-lane
//! vectors brings its own pieces ([`FloatPieces`]; AVX-512: one 16-lane accumulator holds both
//! chains, `a0` in the low and `a1` in the high 8 lanes, so the bits are the same).

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
    /// 16 elements at `p` (unaligned) widened to 16 f32 lanes.
    ///
    /// # Safety
    /// 16 readable elements at `p`; the CPU has `V`'s features.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // 16 lanes: AVX-512 only
    unsafe fn load16<V: Lanes16>(p: *const Self) -> V;
    /// One element widened to f32.
    fn widen(self) -> f32;
    /// `dst[i] = src[i].widen()` (exact; F16C / fp16 vector conversions where the CPU has
    /// them, through `half`).
    fn widen_row(src: &[Self], dst: &mut [f32]);
}

impl FloatElem for f16 {
    #[inline(always)]
    unsafe fn load8<L: Lanes>(p: *const Self) -> L {
        L::load_f16(p)
    }
    #[inline(always)]
    unsafe fn load16<V: Lanes16>(p: *const Self) -> V {
        V::load16_f16(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn widen_row(src: &[Self], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst)
    }
}

impl FloatElem for bf16 {
    #[inline(always)]
    unsafe fn load8<L: Lanes>(p: *const Self) -> L {
        L::load_bf16(p)
    }
    #[inline(always)]
    unsafe fn load16<V: Lanes16>(p: *const Self) -> V {
        V::load16_bf16(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn widen_row(src: &[Self], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst)
    }
}

impl FloatElem for f32 {
    #[inline(always)]
    unsafe fn load8<L: Lanes>(p: *const Self) -> L {
        L::load_f32(p)
    }
    #[inline(always)]
    unsafe fn load16<V: Lanes16>(p: *const Self) -> V {
        V::load16_f32(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    fn widen_row(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
}

/// A 16-lane f32 vector (AVX-512's `__m512`) for [`tile_float16`]: widening loads, and the
/// operations that make one 16-lane chain equal [`tile_float`]'s two 8-lane chains (`a0` in
/// the low lanes, `a1` in the high ones). Every method is `#[inline(always)]` and must only
/// run where the backend's features are available.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // 16 lanes: AVX-512 only
pub(super) trait Lanes16: Copy {
    /// The backend's 8-lane vector, whose `hsum` reduces the folded chains.
    type Half: Lanes;
    /// All lanes `+0.0`.
    unsafe fn zero() -> Self;
    /// 16 f16 at `p` (unaligned) widened to f32.
    unsafe fn load16_f16(p: *const f16) -> Self;
    /// 16 bf16 at `p` (unaligned) widened to f32.
    unsafe fn load16_bf16(p: *const bf16) -> Self;
    /// 16 f32 at `p` (unaligned).
    unsafe fn load16_f32(p: *const f32) -> Self;
    /// `acc + w·x` in every lane, one rounding (fused multiply-add).
    unsafe fn fma(acc: Self, w: Self, x: Self) -> Self;
    /// `acc + w·x` in the low 8 lanes (fused), the high 8 lanes of `acc` unchanged.
    unsafe fn fma_low(acc: Self, w: Self::Half, x: Self::Half) -> Self;
    /// The low 8 lanes plus the high 8 lanes (`a0 + a1`).
    unsafe fn fold(self) -> Self::Half;
    /// All lanes `x`.
    unsafe fn splat(x: f32) -> Self;
    /// `a + b` lane-wise.
    unsafe fn add(a: Self, b: Self) -> Self;
    /// `a · b` lane-wise.
    unsafe fn mul(a: Self, b: Self) -> Self;
    /// Stores the 16 lanes at `p` (unaligned).
    unsafe fn store16(self, p: *mut f32);
}

/// How a backend computes one `R × T` piece of float products (weights `W`, activations `X`)
/// with [`tile_float`]'s bits: [`ByLanes`] for 8-lane vectors, a backend's own type otherwise.
pub(super) trait FloatPieces {
    /// The piece's products, as [`tile_float`].
    ///
    /// # Safety
    /// As [`tile_float`].
    unsafe fn piece<W: FloatElem, X: FloatElem, const R: usize, const T: usize>(p: Piece);
}

/// The pieces of this module ([`tile_float`]) on 8-lane vectors `L`.
pub(super) struct ByLanes<L>(std::marker::PhantomData<L>);

impl<L: Lanes> FloatPieces for ByLanes<L> {
    #[inline(always)]
    unsafe fn piece<W: FloatElem, X: FloatElem, const R: usize, const T: usize>(p: Piece) {
        tile_float::<L, W, X, R, T>(p)
    }
}

/// The pieces of [`tile_float16`] on 16-lane vectors `V`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // 16 lanes: AVX-512 only
pub(super) struct ByLanes16<V>(std::marker::PhantomData<V>);

impl<V: Lanes16> FloatPieces for ByLanes16<V> {
    #[inline(always)]
    unsafe fn piece<W: FloatElem, X: FloatElem, const R: usize, const T: usize>(p: Piece) {
        tile_float16::<V, W, X, R, T>(p)
    }
}

/// One 8-element step at element `i` of every pair of the piece into `acc`: `R` weight
/// chunks widened once, then for each token its chunk widened once and FMA'd with all of them.
///
/// # Safety
/// As [`tile_float`]; `i + 8` elements readable in every row of the piece.
#[inline(always)]
unsafe fn step<L: Lanes, W: FloatElem, X: FloatElem, const R: usize, const T: usize>(
    acc: &mut [[L; T]; R],
    p: &Piece,
    i: usize,
) {
    let wv: [L; R] = std::array::from_fn(|r| {
        // SAFETY: row `r < R` of the piece holds `nb > i + 7` elements (caller).
        unsafe { W::load8(p.w.add(r * p.w_stride).cast::<W>().add(i)) }
    });
    for t in 0..T {
        let xv: L = X::load8(p.x.add(t * p.x_stride).cast::<X>().add(i));
        for r in 0..R {
            acc[r][t] = L::fma(acc[r][t], wv[r], xv);
        }
    }
}

/// The `R × T` products of a piece of float rows (`nb` = elements per row):
/// `out[t * out_stride + r] = w_row(r) · x_row(t)`, each with [`dot_float`]'s operations
/// (weights of type `W`, activations of type `X`: the same type, or `f32` holding activations
/// already widened, which gives the same f32 lanes).
///
/// # Safety
/// The CPU has `L`'s features; `w + r·w_stride` (`r < R`) points at `nb` readable elements of
/// `W` and `x + t·x_stride` (`t < T`) at `nb` of `X`; `out + t·out_stride + r` is writable.
#[inline(always)]
unsafe fn tile_float<L: Lanes, W: FloatElem, X: FloatElem, const R: usize, const T: usize>(p: Piece) {
    let n = p.nb;
    let mut a0 = [[L::zero(); T]; R];
    let mut a1 = [[L::zero(); T]; R];
    let mut i = 0;
    while i + 16 <= n {
        step::<L, W, X, R, T>(&mut a0, &p, i);
        step::<L, W, X, R, T>(&mut a1, &p, i + 8);
        i += 16;
    }
    if i + 8 <= n {
        step::<L, W, X, R, T>(&mut a0, &p, i);
        i += 8;
    }
    for r in 0..R {
        let w = p.w.add(r * p.w_stride).cast::<W>();
        for t in 0..T {
            let x = p.x.add(t * p.x_stride).cast::<X>();
            let mut sum = L::add(a0[r][t], a1[r][t]).hsum();
            for j in i..n {
                sum += w.add(j).read_unaligned().widen() * x.add(j).read_unaligned().widen();
            }
            *p.out.add(t * p.out_stride + r) = sum;
        }
    }
}

/// [`tile_float`] on 16-lane vectors: each 16-element step is one FMA per pair (lanes 0–7 are
/// `a0`'s step at `i`, lanes 8–15 `a1`'s at `i + 8`), the 8-element step goes into the low
/// lanes only, and `fold` gives `a0 + a1` before the same `hsum` and tail. Half the FMAs and
/// accumulators of two 8-lane chains, the same bits.
///
/// # Safety
/// As [`tile_float`], with `V`'s features.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // 16 lanes: AVX-512 only
unsafe fn tile_float16<V: Lanes16, W: FloatElem, X: FloatElem, const R: usize, const T: usize>(p: Piece) {
    let n = p.nb;
    let w_row = |r: usize| p.w.add(r * p.w_stride).cast::<W>();
    let x_row = |t: usize| p.x.add(t * p.x_stride).cast::<X>();
    let mut acc = [[V::zero(); T]; R];
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY (this and the next step): rows hold `nb >= i + 16` (`i + 8`) elements.
        let wv: [V; R] = std::array::from_fn(|r| unsafe { W::load16(w_row(r).add(i)) });
        for t in 0..T {
            let xv: V = X::load16(x_row(t).add(i));
            for r in 0..R {
                acc[r][t] = V::fma(acc[r][t], wv[r], xv);
            }
        }
        i += 16;
    }
    if i + 8 <= n {
        let wv: [V::Half; R] = std::array::from_fn(|r| unsafe { W::load8(w_row(r).add(i)) });
        for t in 0..T {
            let xv: V::Half = X::load8(x_row(t).add(i));
            for r in 0..R {
                acc[r][t] = V::fma_low(acc[r][t], wv[r], xv);
            }
        }
        i += 8;
    }
    for r in 0..R {
        let w = w_row(r);
        for t in 0..T {
            let x = x_row(t);
            let mut sum = acc[r][t].fold().hsum();
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
    tile_float::<L, E, E, 1, 1>(Piece::single(w.as_ptr().cast(), x.as_ptr().cast(), n, &mut out));
    out
}

/// The float tile kernel as a [`PieceKernel`] (pieces `F`, weights `W`, activations `X`).
struct FloatKernel<F, W, X>(std::marker::PhantomData<(F, W, X)>);

impl<F: FloatPieces, W: FloatElem, X: FloatElem> PieceKernel for FloatKernel<F, W, X> {
    #[inline(always)]
    unsafe fn piece<const R: usize, const T: usize>(p: Piece) {
        F::piece::<W, X, R, T>(p)
    }
}

thread_local! {
    /// Each thread's widened activations of its current tile (reused: no allocation, and no
    /// fresh pages, per tile).
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A whole [`DotTile`] of float rows (`E` is the tile's type: f16, bf16 or f32) in `F`'s
/// `R × T` pieces and their edges ([`super::RawTile::cover`]).
///
/// # Safety
/// The CPU has `F`'s features; the tile's type is `E`'s (the geometry is checked by
/// [`DotTile::raw`], panicking).
#[inline(always)]
pub(super) unsafe fn dot_tile_float<F: FloatPieces, E: FloatElem, const R: usize, const T: usize>(
    tile: &DotTile<'_>,
    out: &mut [f32],
) {
    let es = std::mem::size_of::<E>();
    let raw = tile.raw(es, es, out);
    if raw.n_tok < 2 || std::mem::size_of::<E>() == 4 {
        raw.cover::<FloatKernel<F, E, E>, R, T>();
        return;
    }
    // Several tokens: every activation row is read once per R weight rows, so widen the
    // tile's activations to f32 once (exact) and keep the conversions for the weights alone
    // (AVX2's 2 × 3 tile otherwise converts 5 chunks per 6 FMAs).
    // (Taken out of the thread-local and put back, not used in a `with` closure: a closure
    // would not be inlined into the feature-enabled caller, and every vector operation of
    // the kernel would become a call.)
    let mut buf = WIDENED.take();
    let (nb, n_tok) = (raw.nb, raw.n_tok);
    buf.resize(n_tok * nb, 0.0);
    for (t, dst) in buf.chunks_exact_mut(nb).enumerate() {
        // SAFETY: `raw` checked that the activations hold `n_tok` rows of `nb` elements of
        // `E` at stride `xs` (DotTile's alignment contract covers `E`).
        let src = std::slice::from_raw_parts(raw.x.add(t * raw.xs).cast::<E>(), nb);
        E::widen_row(src, dst);
    }
    let wide = super::RawTile { xs: nb * 4, x: buf.as_ptr().cast(), ..raw };
    // Tokens outer: `T` widened rows (f32, twice the weights' bytes) stay in L1 while the
    // pieces sweep the weight rows, which come from L2 at half the bytes.
    wide.cover_tokens_outer::<FloatKernel<F, E, f32>, R, T>();
    WIDENED.set(buf);
}
