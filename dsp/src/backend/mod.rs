//! Kernel backends: the trait [`KernelBackend`] with the dot-product, row and GDN kernels, a
//! scalar reference ([`scalar`]) and SIMD implementations checked against it.
//!
//! Selection is the caller's: a program resolves the name its user asked for ([`resolve`];
//! the binaries read `--kernels` / `TANDEM_KERNELS`) and [`install`]s the result before the
//! first kernel runs; [`select`] then returns it to every kernel entry point. Without an
//! install, [`select`] returns [`best`] (AVX-512 VNNI, else AVX2+FMA+F16C on x86_64;
//! NEON+i8mm, else NEON+dotprod, else NEON on aarch64; else scalar). dsp itself reads no environment variable.

use std::sync::OnceLock;

use half::{bf16, f16};

use crate::quant::blocks::{
    as_blocks, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::quant::GgmlType;

/// The five quantized single dot products of a SIMD [`KernelBackend`] impl, written inside
/// the impl block: `vec_dot_q4_0_q8_0` … `vec_dot_q6_k_q8_k`, each the backend's inherent
/// `unsafe fn dot_blocks(&self, ty: GgmlType, w: *const u8, x: *const u8, nb: usize) -> f32`
/// of `ty` on `nb = min(w.len(), x.len())` blocks of the slices (aligned as slices).
/// `dot_blocks`' contract: the features of its kernels are available (the backend value
/// proves it) and `w`, `x` point at `nb` aligned blocks of `ty` and of its activation type.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! quant_dot_methods {
    () => {
        quant_dot_methods!(@each
            vec_dot_q4_0_q8_0(BlockQ4_0, BlockQ8_0) = Q4_0,
            vec_dot_q4_1_q8_1(BlockQ4_1, BlockQ8_1) = Q4_1,
            vec_dot_q8_0_q8_0(BlockQ8_0, BlockQ8_0) = Q8_0,
            vec_dot_q4_k_q8_k(BlockQ4K, BlockQ8K) = Q4_K,
            vec_dot_q6_k_q8_k(BlockQ6K, BlockQ8K) = Q6_K,
        );
    };
    (@each $($name:ident($w:ty, $x:ty) = $ty:ident,)*) => {
        $(
            fn $name(&self, w: &[$w], x: &[$x]) -> f32 {
                let nb = w.len().min(x.len());
                // SAFETY: see the impl comment; both slices hold >= nb blocks, aligned as slices.
                unsafe { self.dot_blocks(GgmlType::$ty, w.as_ptr().cast(), x.as_ptr().cast(), nb) }
            }
        )*
    };
}

/// The body of a K-quant sweep of the NEON backends (every level), written once: for
/// `p: Piece` (at most `$max_rows` rows and `$nt` tokens), every weight block is unpacked once
/// (`unpack_q4k` / `unpack_q6k` of the calling module, by the const `$q4k`) and accumulated with
/// each token's [`BlockQ8K`] by `$acc` (with `$u`, `$bx`, `$a`: the unpacked block, the
/// activation block and the accumulator so far) into accumulators starting at `$zero`; `$hsum`
/// reduces each accumulator to its output `out[t * out_stride + r]`.
///
/// Expands to unsafe code: the caller's safety contract is the `Piece` one (the pointers cover
/// `rows × nb` aligned weight blocks and `n_tok × nb` aligned activation blocks).
#[cfg(target_arch = "aarch64")]
macro_rules! kquant_sweep {
    ($p:expr, $q4k:ident, $nt:ident, $max_rows:expr, $zero:expr, |$u:ident, $bx:ident, $a:ident| $acc:expr, $hsum:path) => {{
        let Piece { w, w_stride, rows, x, x_stride, n_tok, nb, out, out_stride } = $p;
        debug_assert!(rows <= $max_rows && n_tok <= $nt);
        let wb = if $q4k {
            size_of::<BlockQ4K>()
        } else {
            size_of::<BlockQ6K>()
        };
        let mut acc = [[$zero; $nt]; $max_rows];
        for ib in 0..nb {
            for (r, acc_r) in acc.iter_mut().enumerate().take(rows) {
                let p = w.add(r * w_stride + ib * wb);
                let $u = if $q4k {
                    unpack_q4k(&*p.cast::<BlockQ4K>())
                } else {
                    unpack_q6k(&*p.cast::<BlockQ6K>())
                };
                for (t, acc_rt) in acc_r.iter_mut().enumerate().take(n_tok) {
                    let $bx = &*x
                        .add(t * x_stride + ib * size_of::<BlockQ8K>())
                        .cast::<BlockQ8K>();
                    let $a = *acc_rt;
                    *acc_rt = $acc;
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate().take(rows) {
            for (t, a) in acc_r.iter().enumerate().take(n_tok) {
                *out.add(t * out_stride + r) = $hsum(*a);
            }
        }
    }};
}

/// The literals of the SIMD backends' `exp_pd` (`avx2_math`, `neon_math`: the same ones, so
/// the same bits): ln 2 split into a high and a low part for the range reduction, and the
/// Taylor coefficients `1/k!` for `k` = 11 down to 0 (Horner from the top).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[allow(clippy::excessive_precision)]
mod exp_consts {
    pub(super) const LN2_HI: f64 = 6.931_471_803_691_238_164_9e-1;
    pub(super) const LN2_LO: f64 = 1.908_214_929_270_587_700_0e-10;
    pub(super) const INV_FACT: [f64; 12] = [
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod attn;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod attn_full;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod float_tile;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_kquants;
#[cfg(target_arch = "x86_64")]
mod avx2_math;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_kquants;
#[cfg(target_arch = "x86_64")]
mod avx512_math;
#[cfg(target_arch = "aarch64")]
pub mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_i8mm;
#[cfg(target_arch = "aarch64")]
mod neon_kquants;
#[cfg(target_arch = "aarch64")]
mod neon_math;
pub mod scalar;

/// A tile of dot products between `n_rows` weight rows and `n_tok` activation rows.
///
/// `w` holds `n_rows = w.len() / w_row_bytes` rows of type `ty`; `x` holds
/// `n_tok = x.len() / x_row_bytes` rows of `ty.vec_dot_type()` with the same element count.
/// Block data must be aligned for its block struct (2 bytes; 4 for f32 and Q8_K).
#[derive(Clone, Copy, Debug)]
pub struct DotTile<'a> {
    pub ty: GgmlType,
    pub w: &'a [u8],
    pub w_row_bytes: usize,
    pub x: &'a [u8],
    pub x_row_bytes: usize,
}

impl DotTile<'_> {
    pub fn n_rows(&self) -> usize {
        self.w.len() / self.w_row_bytes
    }
    pub fn n_tok(&self) -> usize {
        self.x.len() / self.x_row_bytes
    }

    /// The tile as raw pointers for the SIMD tile kernels, with `out` (`[n_tok, n_rows]`),
    /// after the O(1) checks the soundness of their raw reads and writes rests on: every
    /// weight row is `nb` blocks of `wb` bytes and every activation row `nb` blocks of `xb`
    /// bytes, both slices hold whole rows, and `out` holds `n_rows × n_tok` values. (The
    /// alignment of blocks read through references is the [`DotTile`] contract.)
    ///
    /// Panics when a check fails.
    #[allow(dead_code)] // only the SIMD backends of the target use it
    #[inline(always)]
    pub(crate) fn raw(&self, wb: usize, xb: usize, out: &mut [f32]) -> RawTile {
        let (n_rows, n_tok) = (self.n_rows(), self.n_tok());
        let nb = self.w_row_bytes / wb;
        assert!(self.w_row_bytes == nb * wb && self.x_row_bytes == nb * xb);
        assert!(self.w.len() == n_rows * self.w_row_bytes && self.x.len() == n_tok * self.x_row_bytes);
        assert_eq!(out.len(), n_rows * n_tok);
        RawTile {
            n_rows,
            n_tok,
            nb,
            ws: self.w_row_bytes,
            xs: self.x_row_bytes,
            w: self.w.as_ptr(),
            x: self.x.as_ptr(),
            o: out.as_mut_ptr(),
        }
    }
}

impl RawTile {
    /// The piece of `rows` weight rows from row `r0` by `n_tok` tokens from token `t0`.
    ///
    /// # Safety
    /// The piece lies inside the tile (`r0 + rows <= n_rows`, `t0 + n_tok <= n_tok`).
    #[allow(dead_code)] // only the SIMD backends of the target use it
    #[inline(always)]
    pub(crate) unsafe fn piece(&self, r0: usize, rows: usize, t0: usize, n_tok: usize) -> Piece {
        Piece {
            w: self.w.add(r0 * self.ws),
            w_stride: self.ws,
            rows,
            x: self.x.add(t0 * self.xs),
            x_stride: self.xs,
            n_tok,
            nb: self.nb,
            out: self.o.add(t0 * self.n_rows + r0),
            out_stride: self.n_rows,
        }
    }
}

/// A register-tile kernel of every fixed shape `R × T`, for [`RawTile::cover`].
#[allow(dead_code)] // only the SIMD backends of the target use it
pub(crate) trait PieceKernel {
    /// The `R × T` products of `p` (`p.rows == R`, `p.n_tok == T`).
    ///
    /// # Safety
    /// The piece lies inside a checked [`RawTile`]; the CPU has the kernel's features.
    unsafe fn piece<const R: usize, const T: usize>(p: Piece);
}

impl RawTile {
    /// Covers the tile with `K`'s `R × T` pieces plus `R × 1`, `1 × T` and `1 × 1` edges,
    /// rows outer (a piece's weight rows stay in cache while it sweeps the tokens).
    ///
    /// # Safety
    /// As [`PieceKernel::piece`]: the CPU has `K`'s features (the geometry was checked by
    /// [`DotTile::raw`]).
    #[allow(dead_code)] // only the SIMD backends of the target use it
    #[inline(always)]
    pub(crate) unsafe fn cover<K: PieceKernel, const R: usize, const T: usize>(&self) {
        let (n_rows, n_tok) = (self.n_rows, self.n_tok);
        let mut r = 0;
        while r + R <= n_rows {
            let mut t = 0;
            while t + T <= n_tok {
                K::piece::<R, T>(self.piece(r, R, t, T));
                t += T;
            }
            while t < n_tok {
                K::piece::<R, 1>(self.piece(r, R, t, 1));
                t += 1;
            }
            r += R;
        }
        while r < n_rows {
            let mut t = 0;
            while t + T <= n_tok {
                K::piece::<1, T>(self.piece(r, 1, t, T));
                t += T;
            }
            while t < n_tok {
                K::piece::<1, 1>(self.piece(r, 1, t, 1));
                t += 1;
            }
            r += 1;
        }
    }

    /// [`RawTile::cover`] with the tokens outer: `T` activation rows stay in L1 while `K`'s
    /// pieces sweep the weight rows (for activations wider than the weights, e.g. f32 rows
    /// against f16 weights, whose token block does not fit L1). The same pieces, so the same
    /// results.
    ///
    /// # Safety
    /// As [`RawTile::cover`].
    #[allow(dead_code)] // only the SIMD backends of the target use it
    #[inline(always)]
    pub(crate) unsafe fn cover_tokens_outer<K: PieceKernel, const R: usize, const T: usize>(&self) {
        let (n_rows, n_tok) = (self.n_rows, self.n_tok);
        let mut t = 0;
        while t + T <= n_tok {
            let mut r = 0;
            while r + R <= n_rows {
                K::piece::<R, T>(self.piece(r, R, t, T));
                r += R;
            }
            while r < n_rows {
                K::piece::<1, T>(self.piece(r, 1, t, T));
                r += 1;
            }
            t += T;
        }
        while t < n_tok {
            let mut r = 0;
            while r + R <= n_rows {
                K::piece::<R, 1>(self.piece(r, R, t, 1));
                r += R;
            }
            while r < n_rows {
                K::piece::<1, 1>(self.piece(r, 1, t, 1));
                r += 1;
            }
            t += 1;
        }
    }

    /// The pieces of at most `rows` rows × `toks` tokens that cover the tile, tokens outer.
    #[allow(dead_code)] // only the SIMD backends of the target use it
    pub(crate) fn pieces(&self, rows: usize, toks: usize) -> impl Iterator<Item = Piece> + '_ {
        (0..self.n_tok).step_by(toks).flat_map(move |t0| {
            (0..self.n_rows).step_by(rows).map(move |r0| {
                // SAFETY: `r0 < n_rows`, `t0 < n_tok` and the sizes are clipped to the tile.
                unsafe { self.piece(r0, rows.min(self.n_rows - r0), t0, toks.min(self.n_tok - t0)) }
            })
        })
    }
}

/// What a SIMD tile kernel computes: `rows` weight rows at `w` (`w_stride` bytes apart) by
/// `n_tok` activation rows at `x` (`x_stride` bytes apart), `nb` blocks each; the product of
/// row `r` and token `t` goes to `out[t * out_stride + r]`. (Kernels of a fixed `R × T` size
/// take `rows`, `n_tok` from their parameters.)
#[allow(dead_code)] // only the SIMD backends of the target use it
#[derive(Clone, Copy)]
pub(crate) struct Piece {
    pub w: *const u8,
    pub w_stride: usize,
    pub rows: usize,
    pub x: *const u8,
    pub x_stride: usize,
    pub n_tok: usize,
    pub nb: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

impl Piece {
    /// One dot product of `nb` blocks at `w` and `x`, written to `out`.
    #[allow(dead_code)] // only the SIMD backends of the target use it
    #[inline(always)]
    pub(crate) fn single(w: *const u8, x: *const u8, nb: usize, out: *mut f32) -> Piece {
        Piece { w, w_stride: 0, rows: 1, x, x_stride: 0, n_tok: 1, nb, out, out_stride: 0 }
    }
}

/// A [`DotTile`] and its output checked for raw-pointer kernels ([`DotTile::raw`]).
#[allow(dead_code)] // only the SIMD backends of the target use it
pub(crate) struct RawTile {
    pub n_rows: usize,
    pub n_tok: usize,
    /// Blocks per row.
    pub nb: usize,
    /// Weight and activation row strides, bytes.
    pub ws: usize,
    pub xs: usize,
    pub w: *const u8,
    pub x: *const u8,
    /// The output, token-major: `o[t * n_rows + r]`.
    pub o: *mut f32,
}

/// Compute kernels of one instruction set. Every method has the same contract in every
/// backend; SIMD backends may differ from [`scalar::Scalar`] only in f32 summation order
/// (integer block sums are exact), and are tested against it in `tests/conformance.rs`.
///
/// Dot products follow ggml's `ggml_vec_dot_<w>_<x>` (`ggml/src/ggml-cpu/quants.c` and
/// `arch/*/quants.c`): per block an exact integer sum, scaled by the product of the block
/// scales, accumulated in f32. Slices passed together must have equal lengths (checked by
/// `debug_assert!`; entry points such as `matmul` validate shapes).
pub trait KernelBackend: Send + Sync + std::fmt::Debug {
    /// Short name (`"scalar"`, `"avx2"`).
    fn name(&self) -> &'static str;

    /// `sum_b d_w*d_x * sum_j (q_w[j]-8) * q_x[j]`.
    fn vec_dot_q4_0_q8_0(&self, w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32;
    /// `sum_b (d_w*d_x * sum_j q_w[j]*q_x[j] + m_w*s_x)`.
    fn vec_dot_q4_1_q8_1(&self, w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32;
    /// `sum_b d_w*d_x * sum_j q_w[j]*q_x[j]`.
    fn vec_dot_q8_0_q8_0(&self, w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32;
    /// `sum_b (d_x*d_w * sum_k sc[k]*sum_{j in k} q_w*q_x - d_x*dmin * sum_k m[k]*bsum_x[k])`.
    fn vec_dot_q4_k_q8_k(&self, w: &[BlockQ4K], x: &[BlockQ8K]) -> f32;
    /// `sum_b d_x*d_w * sum_k sc[k] * sum_{j in k} (q_w[j]-32)*q_x[j]`.
    fn vec_dot_q6_k_q8_k(&self, w: &[BlockQ6K], x: &[BlockQ8K]) -> f32;
    /// f16 · f16 with f32 products (scalar: summed in f64, as ggml's `ggml_vec_dot_f16`).
    fn vec_dot_f16(&self, w: &[f16], x: &[f16]) -> f32;
    /// bf16 · bf16 with f32 products (scalar: summed in f64, as `ggml_vec_dot_bf16`).
    fn vec_dot_bf16(&self, w: &[bf16], x: &[bf16]) -> f32;
    /// f32 · f32 (scalar: summed in f64, as `ggml_vec_dot_f32`).
    fn vec_dot_f32(&self, w: &[f32], x: &[f32]) -> f32;

    /// One weight row (type `ty`) dotted with one activation row (type `ty.vec_dot_type()`),
    /// both as raw bytes.
    ///
    /// # Panics
    /// If the bytes are misaligned for their block structs or `ty` is not a weight type: the
    /// callers (`matmul`) validate both up front, so this is an internal invariant.
    fn vec_dot_bytes(&self, ty: GgmlType, w: &[u8], x: &[u8]) -> f32 {
        const MSG: &str = "vec_dot_bytes: operands validated by the caller";
        match ty {
            GgmlType::Q4_0 => {
                self.vec_dot_q4_0_q8_0(as_blocks(w).expect(MSG), as_blocks(x).expect(MSG))
            }
            GgmlType::Q4_1 => {
                self.vec_dot_q4_1_q8_1(as_blocks(w).expect(MSG), as_blocks(x).expect(MSG))
            }
            GgmlType::Q8_0 => {
                self.vec_dot_q8_0_q8_0(as_blocks(w).expect(MSG), as_blocks(x).expect(MSG))
            }
            GgmlType::Q4_K => {
                self.vec_dot_q4_k_q8_k(as_blocks(w).expect(MSG), as_blocks(x).expect(MSG))
            }
            GgmlType::Q6_K => {
                self.vec_dot_q6_k_q8_k(as_blocks(w).expect(MSG), as_blocks(x).expect(MSG))
            }
            GgmlType::F16 => self.vec_dot_f16(as_blocks(w).expect(MSG), as_blocks(x).expect(MSG)),
            GgmlType::BF16 => self.vec_dot_bf16(as_blocks(w).expect(MSG), as_blocks(x).expect(MSG)),
            GgmlType::F32 => self.vec_dot_f32(as_blocks(w).expect(MSG), as_blocks(x).expect(MSG)),
            GgmlType::Q8_1 | GgmlType::Q8_K => panic!("vec_dot_bytes: {ty} is not a weight type"),
        }
    }

    /// All dot products of a tile: `out[t * n_rows + r] = w_row(r) · x_row(t)`.
    /// `out.len() == n_rows * n_tok`. Each result must be bit-identical to
    /// [`vec_dot_bytes`](Self::vec_dot_bytes) on the same two rows, so batching never changes
    /// numerics (a batched verification pass equals one-token decode).
    fn dot_tile(&self, tile: &DotTile<'_>, out: &mut [f32]) {
        dot_tile_by_pairs(self, tile, out)
    }

    /// One row of RMS normalisation, `out = (x * (1 / sqrt(mean(x²) + eps))) * w`, the mean
    /// of squares summed in f64 as ggml `ggml_compute_forward_rms_norm_f32` followed by the
    /// weight multiply (`ggml_mul`). All slices have equal length.
    fn rms_norm_row(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]);
    /// `dst += src`, elementwise.
    fn add_inplace(&self, dst: &mut [f32], src: &[f32]);
    /// `out += a * v`, elementwise, `v` widened from f16 (attention's value accumulation).
    fn axpy_f16(&self, out: &mut [f32], a: f32, v: &[f16]);
    /// `x ← x / (1 + exp(−x))` elementwise (SiLU; ggml `ggml_vec_silu_f32`). SIMD backends
    /// may compute `exp` their own way (within 1 ulp of the scalar `f32::exp`; the AVX2 one is
    /// correctly rounded) and must give every element the same operations wherever it sits
    /// in the slice (so a decode step equals a prefill row bit for bit).
    fn silu_inplace(&self, x: &mut [f32]);
    /// `out = silu(gate) · up` elementwise (SwiGLU; ggml `ggml_vec_swiglu_f32`), same
    /// contract as [`silu_inplace`](Self::silu_inplace). All slices have equal length.
    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]);
    /// `x ← gelu_tanh(x)` elementwise ([`crate::encoder::gelu_tanh`]: `x / (1 + exp(−z))`,
    /// `z = 2·√(2/π)·x·(1 + 0.044715·x²)`; the vision tower's MLP activation). SIMD backends
    /// repeat its f32 operations (no fused multiply-add) with their own `exp`, as in
    /// [`silu_inplace`](Self::silu_inplace), the same for every element wherever it sits.
    fn gelu_tanh_inplace(&self, x: &mut [f32]) {
        for v in x {
            *v = crate::encoder::gelu_tanh(*v);
        }
    }
    /// In-place softmax as [`crate::ops::softmax_inplace`] (`exp(x_i − max)`, the sum in f64 by
    /// [`crate::ops::sum_f64_by_lanes`], a multiply by `(1/sum) as f32`; `−inf` entries become 0). SIMD backends
    /// may compute `exp` as in [`silu_inplace`](Self::silu_inplace), the same for every
    /// element wherever it sits.
    fn softmax_inplace(&self, x: &mut [f32]) {
        crate::ops::softmax_inplace(x)
    }

    /// Attention of a tile of queries against one KV head ([`crate::ops::attention_queries`],
    /// which checks the shapes): for each query `i`,
    /// `scores[i * max_ctx + j] = vec_dot_f16(k_j, q_i) * scale` for `j < n_ctx[i]` (other
    /// entries untouched), then [`softmax_inplace`](Self::softmax_inplace) of that row, then
    /// `out_i = Σ_j p_ij · v_j` accumulated from zero by [`axpy_f16`](Self::axpy_f16) in
    /// increasing `j`. `scores.len() >= n_q * max_ctx`, `out.len() == n_q * head_dim`.
    ///
    /// The default is that composition ([`attention_queries_by_pairs`]); SIMD backends share
    /// K and V row loads across the tile's queries and must give every query exactly these
    /// bits (same dot lanes and reduction, same elementwise value order).
    fn attention_queries(&self, tile: &AttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
        attention_queries_by_pairs(self, tile, scores, out)
    }

    /// Full (non-causal) attention of a tile of queries over all keys of one head, the vision
    /// tower's ([`FullAttnTile`], keys transposed): for each query `i`,
    /// `scores[i * kv_stride + j] = s_ij * scale` for `j < n_kv`, where `s_ij` is the chain
    /// of fused multiply-adds `s ← fma(q_i[d], k_j[d], s)` from `+0.0` in increasing `d`;
    /// then [`softmax_inplace`](Self::softmax_inplace) of `scores[i * kv_stride..][..n_kv]`;
    /// then each `out[i * head_dim + c]` is the chain `o ← fma(p_ij, v_j[c], o)` from `+0.0`
    /// in increasing `j`. Entries `n_kv..kv_stride` of a scores row are unspecified.
    /// `scores.len() >= n_q * kv_stride`, `out.len() == n_q * head_dim`.
    ///
    /// The default is that composition in scalar code ([`full_attention_by_chains`]); SIMD
    /// backends hold one chain per lane (keys in the lanes for the scores, output columns for
    /// the values), so every query gets exactly these bits whatever the vector width.
    ///
    /// # Panics
    /// If the slices do not hold the shapes of [`FullAttnTile`] ([`FullAttnTile::assert_shapes`]).
    fn full_attention(&self, tile: &FullAttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
        full_attention_by_chains(self, tile, scores, out)
    }

    /// Every chunk of one value head of the chunked gated delta rule
    /// ([`crate::gdn::gdn_chunked`]): the per-chunk element loops and the `MR × NR` register
    /// tiles of its f32 products (`y += a · x`). The default is the portable build (separate
    /// multiply and add); x86 backends run the same code compiled with AVX2+FMA, whose fused
    /// multiply-adds round once per step (within the tolerance of `dsp/tests/gdn.rs`).
    fn gdn_chunked_head(&self, head: &mut crate::gdn::chunked::ChunkedHead<'_, '_>) {
        crate::gdn::chunked::head_portable(head)
    }

    /// Every token of one value head of the per-token gated delta rule
    /// ([`crate::gdn::gdn_recurrent`]: decode and verification). The default is the portable
    /// build; x86 backends run the same element-wise loops (their fused multiply-adds written
    /// as `f32::mul_add`, one rounding everywhere) compiled with their vector width and FMA,
    /// so every build gives the portable one's bits (tested in `dsp/tests/conformance.rs`).
    fn gdn_recurrent_head(&self, head: &mut crate::gdn::recurrent::RecurrentHead<'_, '_>) {
        crate::gdn::recurrent::head_portable(head)
    }

    /// Every logged token of one value head of a rollback by replay
    /// ([`crate::gdn::gdn_replay`]). The default is the portable build; x86 backends compile
    /// the same element-wise loop (`f32::mul_add`) with their vector width and FMA: the
    /// portable build's bits, which are the recurrence's.
    fn gdn_replay_head(&self, head: &mut crate::gdn::replay::ReplayHead<'_, '_>) {
        crate::gdn::replay::head_portable(head)
    }
}

/// [`KernelBackend::dot_tile`] as one [`KernelBackend::vec_dot_bytes`] per (row, token) pair.
pub fn dot_tile_by_pairs<B: KernelBackend + ?Sized>(be: &B, tile: &DotTile<'_>, out: &mut [f32]) {
    let n_rows = tile.n_rows();
    debug_assert_eq!(out.len(), n_rows * tile.n_tok());
    for (t, xr) in tile.x.chunks_exact(tile.x_row_bytes).enumerate() {
        for (r, wr) in tile.w.chunks_exact(tile.w_row_bytes).enumerate() {
            out[t * n_rows + r] = be.vec_dot_bytes(tile.ty, wr, xr);
        }
    }
}

/// A tile of grouped-query attention for [`KernelBackend::attention_queries`]: `n_q` queries
/// (tokens × the query heads sharing one KV head) against that KV head's cache.
#[derive(Clone, Copy, Debug)]
pub struct AttnTile<'a> {
    /// `[n_q, head_dim]` row-major queries, already rounded to f16.
    pub q16: &'a [f16],
    /// `[n_q]`: query `i` sees cached positions `0..n_ctx[i]` (each ≥ 1; causal prefill gives
    /// consecutive tokens consecutive counts).
    pub n_ctx: &'a [usize],
    /// Elements per query, key and value row.
    pub head_dim: usize,
    /// `[>= max n_ctx, head_dim]` row-major keys of the head.
    pub k: &'a [f16],
    /// `[>= max n_ctx, head_dim]` row-major values of the head.
    pub v: &'a [f16],
    /// Multiplies every dot product (`1/sqrt(head_dim)` usually).
    pub scale: f32,
}

impl AttnTile<'_> {
    /// Number of queries.
    pub fn n_q(&self) -> usize {
        self.n_ctx.len()
    }

    /// The longest span any query sees (the row stride of the scores).
    pub fn max_ctx(&self) -> usize {
        self.n_ctx.iter().copied().max().unwrap_or(0)
    }

    /// Panics unless the slices hold the shapes documented on the fields, with `scores_len`
    /// and `out_len` as [`KernelBackend::attention_queries`] requires (the SIMD kernels read
    /// through raw pointers after this check).
    pub fn assert_shapes(&self, scores_len: usize, out_len: usize) {
        let (n_q, hd, max_ctx) = (self.n_q(), self.head_dim, self.max_ctx());
        assert!(
            self.q16.len() == n_q * hd
                && out_len == n_q * hd
                && self.k.len() >= max_ctx * hd
                && self.v.len() >= max_ctx * hd
                && scores_len >= n_q * max_ctx,
            "attention tile: inconsistent shapes"
        );
    }
}

/// The key-row alignment of [`FullAttnTile::kt`]: `kv_stride` is a multiple of this, so the
/// SIMD kernels read whole vectors of keys (up to two 16-lane vectors) with no tail.
pub const FULL_ATTN_KV_ALIGN: usize = 32;

/// A tile of full (non-causal) attention for [`KernelBackend::full_attention`]: `n_q` queries
/// of one head against all `n_kv` keys and values of that head, with the keys transposed so
/// that one vector load takes one element of consecutive keys (the vision tower's layout,
/// `device-worker`'s `model::vision::encoder`).
#[derive(Clone, Copy, Debug)]
pub struct FullAttnTile<'a> {
    /// `[n_q, head_dim]` row-major queries.
    pub q: &'a [f32],
    /// `[head_dim, kv_stride]` row-major: element `d` of key `j` at `d * kv_stride + j`
    /// (`j < n_kv`; the padding `n_kv..kv_stride` is read but its results unused).
    pub kt: &'a [f32],
    /// `[n_kv, head_dim]` row-major values.
    pub v: &'a [f32],
    /// Keys (and values) every query sees, ≥ 1.
    pub n_kv: usize,
    /// Row stride of `kt` and of the scores: a multiple of [`FULL_ATTN_KV_ALIGN`], ≥ `n_kv`.
    pub kv_stride: usize,
    /// Elements per query, key and value.
    pub head_dim: usize,
    /// Multiplies every score (`1/sqrt(head_dim)` usually).
    pub scale: f32,
}

impl FullAttnTile<'_> {
    /// Number of queries (`q.len() / head_dim`).
    pub fn n_q(&self) -> usize {
        self.q.len() / self.head_dim.max(1)
    }

    /// Panics unless the slices hold the shapes documented on the fields, with `scores_len`
    /// and `out_len` as [`KernelBackend::full_attention`] requires (the SIMD kernels read
    /// through raw pointers after this check).
    pub fn assert_shapes(&self, scores_len: usize, out_len: usize) {
        let (n_q, hd, st) = (self.n_q(), self.head_dim, self.kv_stride);
        assert!(
            hd > 0
                && self.n_kv >= 1
                && st >= self.n_kv
                && st % FULL_ATTN_KV_ALIGN == 0
                && self.q.len() == n_q * hd
                && out_len == n_q * hd
                && self.kt.len() >= hd * st
                && self.v.len() >= self.n_kv * hd
                && scores_len >= n_q * st,
            "full attention tile: inconsistent shapes"
        );
    }
}

/// [`KernelBackend::full_attention`] in scalar code: one fused multiply-add chain per score
/// (over the head dimension) and per output element (over the keys), with the backend's
/// softmax between; the reference every SIMD override equals bit for bit.
pub fn full_attention_by_chains<B: KernelBackend + ?Sized>(
    be: &B,
    tile: &FullAttnTile<'_>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    tile.assert_shapes(scores.len(), out.len());
    let (hd, n_kv, st) = (tile.head_dim, tile.n_kv, tile.kv_stride);
    for (qi, row) in tile.q.chunks_exact(hd).zip(scores.chunks_exact_mut(st)) {
        for (j, s) in row[..n_kv].iter_mut().enumerate() {
            let mut acc = 0f32;
            for (d, &q) in qi.iter().enumerate() {
                acc = q.mul_add(tile.kt[d * st + j], acc);
            }
            *s = acc * tile.scale;
        }
        be.softmax_inplace(&mut row[..n_kv]);
    }
    for (row, oi) in scores.chunks_exact(st).zip(out.chunks_exact_mut(hd)) {
        for (c, o) in oi.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (j, &p) in row[..n_kv].iter().enumerate() {
                acc = p.mul_add(tile.v[j * hd + c], acc);
            }
            *o = acc;
        }
    }
}

/// [`KernelBackend::attention_queries`] as one [`KernelBackend::vec_dot_f16`] per (position,
/// query) and one [`KernelBackend::axpy_f16`] per (position, query): the reference every
/// SIMD override equals bit for bit.
pub fn attention_queries_by_pairs<B: KernelBackend + ?Sized>(
    be: &B,
    tile: &AttnTile<'_>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    tile.assert_shapes(scores.len(), out.len());
    if tile.n_q() == 0 {
        return;
    }
    let (hd, n_ctx, max_ctx) = (tile.head_dim, tile.n_ctx, tile.max_ctx());
    let scores = &mut scores[..tile.n_q() * max_ctx];
    for j in 0..max_ctx {
        let kj = &tile.k[j * hd..(j + 1) * hd];
        for (i, qi) in tile.q16.chunks_exact(hd).enumerate() {
            if j < n_ctx[i] {
                scores[i * max_ctx + j] = be.vec_dot_f16(kj, qi) * tile.scale;
            }
        }
    }
    for (i, row) in scores.chunks_exact_mut(max_ctx).enumerate() {
        be.softmax_inplace(&mut row[..n_ctx[i]]);
    }
    out.fill(0.0);
    for j in 0..max_ctx {
        let vj = &tile.v[j * hd..(j + 1) * hd];
        for (i, oi) in out.chunks_exact_mut(hd).enumerate() {
            if j < n_ctx[i] {
                be.axpy_f16(oi, scores[i * max_ctx + j], vj);
            }
        }
    }
}

static SCALAR: scalar::Scalar = scalar::Scalar;

/// The scalar reference backend (always available).
pub fn scalar() -> &'static dyn KernelBackend {
    &SCALAR
}

/// Every backend this CPU can run, scalar first (used by tests and benches).
pub fn available() -> Vec<&'static dyn KernelBackend> {
    let mut v: Vec<&'static dyn KernelBackend> = vec![scalar()];
    #[cfg(target_arch = "x86_64")]
    if let Some(b) = avx2::Avx2::get() {
        v.push(b);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(b) = avx512::Avx512::get() {
        v.push(b);
    }
    #[cfg(target_arch = "aarch64")]
    for b in neon::Neon::all() {
        v.push(b);
    }
    v
}

/// The process's backend: the one [`install`]ed, else [`best`] (fixed by the first call).
static SELECTED: OnceLock<&'static dyn KernelBackend> = OnceLock::new();

/// The backend every kernel entry point uses: the [`install`]ed one, else [`best`]. The first
/// call fixes it for the life of the process.
pub fn select() -> &'static dyn KernelBackend {
    *SELECTED.get_or_init(best)
}

/// The fastest backend this CPU can run (the last of [`available`]).
pub fn best() -> &'static dyn KernelBackend {
    available().last().copied().unwrap_or(scalar())
}

/// Makes `backend` the one [`select`] returns. Call it once, before the first kernel runs.
///
/// # Errors
/// [`AlreadySelected`] naming the backend in use when another one was installed or already
/// returned by [`select`] (installing the same one again is fine).
pub fn install(backend: &'static dyn KernelBackend) -> Result<(), AlreadySelected> {
    let in_use = *SELECTED.get_or_init(|| backend);
    if in_use.name() == backend.name() {
        Ok(())
    } else {
        Err(AlreadySelected {
            in_use: in_use.name(),
            wanted: backend.name(),
        })
    }
}

/// [`install`] came after another backend was fixed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel backend {in_use} is already in use; {wanted} cannot replace it")]
pub struct AlreadySelected {
    pub in_use: &'static str,
    pub wanted: &'static str,
}

/// Every backend name of every architecture: (name, architecture, the CPU features its
/// `get` checks), for [`resolve`]'s errors.
const BACKEND_NAMES: [(&str, &str, &[&str]); 6] = [
    ("scalar", std::env::consts::ARCH, &[]),
    ("avx2", "x86_64", &["avx2", "fma", "f16c"]),
    ("avx512-vnni", "x86_64", &["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vnni"]),
    ("neon", "aarch64", &[]),
    ("neon-dotprod", "aarch64", &["dotprod"]),
    ("neon-i8mm", "aarch64", &["dotprod", "i8mm"]),
];

/// Whether this CPU has the feature `name` (a name of [`BACKEND_NAMES`]; checked at run time).
fn cpu_has(name: &str) -> bool {
    match name {
        #[cfg(target_arch = "x86_64")]
        "avx2" => is_x86_feature_detected!("avx2"),
        #[cfg(target_arch = "x86_64")]
        "fma" => is_x86_feature_detected!("fma"),
        #[cfg(target_arch = "x86_64")]
        "f16c" => is_x86_feature_detected!("f16c"),
        #[cfg(target_arch = "x86_64")]
        "avx512f" => is_x86_feature_detected!("avx512f"),
        #[cfg(target_arch = "x86_64")]
        "avx512bw" => is_x86_feature_detected!("avx512bw"),
        #[cfg(target_arch = "x86_64")]
        "avx512dq" => is_x86_feature_detected!("avx512dq"),
        #[cfg(target_arch = "x86_64")]
        "avx512vl" => is_x86_feature_detected!("avx512vl"),
        #[cfg(target_arch = "x86_64")]
        "avx512vnni" => is_x86_feature_detected!("avx512vnni"),
        #[cfg(target_arch = "aarch64")]
        "dotprod" => std::arch::is_aarch64_feature_detected!("dotprod"),
        #[cfg(target_arch = "aarch64")]
        "i8mm" => std::arch::is_aarch64_feature_detected!("i8mm"),
        _ => false,
    }
}

/// A `--kernels` name [`resolve`] cannot install: each message lists the backends this CPU
/// has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendNameError {
    /// No backend of any architecture has this name.
    #[error("unknown kernel backend {name:?}: the names are {known}; this CPU has {has}")]
    Unknown { name: String, known: String, has: String },
    /// A backend of another architecture (`neon` on x86_64).
    #[error("kernel backend {name} is for {arch} CPUs, this one is {this_arch}; it has {has}")]
    OtherArchitecture { name: &'static str, arch: &'static str, this_arch: &'static str, has: String },
    /// A backend of this architecture whose CPU features this CPU lacks.
    #[error("this CPU cannot run kernel backend {name}: it lacks the CPU feature(s) {missing}; it has {has}")]
    MissingFeatures { name: &'static str, missing: String, has: String },
}

/// The backend called `requested` (case and surrounding spaces ignored; `scalar`, `avx2`,
/// `avx512-vnni`, `neon`, `neon-dotprod`, `neon-i8mm`) if this CPU can run it; `None` or an
/// empty name asks for [`best`].
///
/// # Errors
/// A name no backend has, a backend of another architecture, or one whose CPU features this
/// CPU lacks (the message names them): [`BackendNameError`].
pub fn resolve(requested: Option<&str>) -> Result<&'static dyn KernelBackend, BackendNameError> {
    let wanted = requested.map(str::trim).unwrap_or_default();
    if wanted.is_empty() {
        return Ok(best());
    }
    let has = || available().iter().map(|b| b.name()).collect::<Vec<_>>().join(", ");
    if let Some(b) = available().into_iter().find(|b| b.name().eq_ignore_ascii_case(wanted)) {
        return Ok(b);
    }
    name_error(wanted, std::env::consts::ARCH, cpu_has, has())
}

/// Why `wanted`, which no available backend is called, cannot be installed on a CPU of
/// architecture `arch` with the features `cpu_has` says and the backends `has`. Always `Err`.
fn name_error(
    wanted: &str,
    arch: &'static str,
    cpu_has: impl Fn(&str) -> bool,
    has: String,
) -> Result<&'static dyn KernelBackend, BackendNameError> {
    let Some(&(name, backend_arch, features)) = BACKEND_NAMES.iter().find(|(n, ..)| n.eq_ignore_ascii_case(wanted)) else {
        let known = BACKEND_NAMES.iter().map(|(n, ..)| *n).collect::<Vec<_>>().join(", ");
        return Err(BackendNameError::Unknown { name: wanted.to_string(), known, has });
    };
    if backend_arch != arch {
        return Err(BackendNameError::OtherArchitecture { name, arch: backend_arch, this_arch: arch, has });
    }
    let missing: Vec<_> = features.iter().copied().filter(|f| !cpu_has(f)).collect();
    let missing = if missing.is_empty() { features.join(", ") } else { missing.join(", ") };
    Err(BackendNameError::MissingFeatures { name, missing, has })
}

#[cfg(test)]
mod name_tests {
    use super::{name_error, BackendNameError};

    fn error(wanted: &str, arch: &'static str, cpu: &[&str]) -> BackendNameError {
        name_error(wanted, arch, |f| cpu.contains(&f), "scalar".into()).map(|b| b.name()).unwrap_err()
    }

    /// An unknown name lists every backend name; another architecture's backend says so; a
    /// backend of this architecture names the CPU features this CPU lacks.
    #[test]
    fn a_name_that_cannot_run_says_why() {
        assert_eq!(
            error("foo", "x86_64", &[]).to_string(),
            "unknown kernel backend \"foo\": the names are scalar, avx2, avx512-vnni, neon, neon-dotprod, neon-i8mm; this CPU has scalar"
        );
        assert_eq!(error("NEON", "x86_64", &[]).to_string(), "kernel backend neon is for aarch64 CPUs, this one is x86_64; it has scalar");
        assert_eq!(
            error("avx512-vnni", "x86_64", &["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"]).to_string(),
            "this CPU cannot run kernel backend avx512-vnni: it lacks the CPU feature(s) avx512vnni; it has scalar"
        );
        assert_eq!(
            error("avx2", "x86_64", &["avx2"]).to_string(),
            "this CPU cannot run kernel backend avx2: it lacks the CPU feature(s) fma, f16c; it has scalar"
        );
        assert_eq!(
            error("neon-i8mm", "aarch64", &["dotprod"]).to_string(),
            "this CPU cannot run kernel backend neon-i8mm: it lacks the CPU feature(s) i8mm; it has scalar"
        );
    }
}
