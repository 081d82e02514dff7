//! The forward pass of the `qwen3vl_merger` projector (the Qwen3.5 vision tower + merger):
//! normalised patches of one image ([`Preprocessed`]) → one embedding per 2×2 patch block in
//! the text model's hidden size, [`Projector::encode`].
//!
//! Graph (llama.cpp `tools/mtmd/models/qwen3vl.cpp` + `clip.cpp`; Hugging Face
//! `transformers/models/qwen3_vl/modeling_qwen3_vl.py`, `Qwen3VLVisionModel.forward` and
//! `Qwen3VLModel.get_image_features`; read, not copied):
//! 1. patch embedding: the 3-D convolution (kernel `2 × p × p`, stride = kernel) of every
//!    patch row, i.e. one product with the kernel `[n_embd, 3·2·p·p]` whose temporal slices
//!    are `v.patch_embd.weight` and `.weight.1`, plus `v.patch_embd.bias` (on a still image's
//!    two identical frames this equals the sum of the slices applied to one frame,
//!    llama.cpp's two `conv_2d`);
//! 2. plus the learned position embeddings resampled to the patch grid, in merge-block order
//!    ([`super::position::learned_positions`]);
//! 3. `n_layer` pre-LN blocks: LayerNorm → fused qkv + bias → 2-D rotary of q and k
//!    ([`super::rope2d`]) → full non-causal attention over all patches (scale `1/√head_dim`)
//!    → out projection + bias → residual; LayerNorm → fc1 + bias → GELU (tanh form) → fc2 +
//!    bias → residual;
//! 4. merger: LayerNorm per patch (`v.post_ln`), 4 consecutive patches (one merge block)
//!    concatenated, `mm.0` + bias → GELU → `mm.2` + bias.
//!
//! Where the two references differ, [`EncodeOptions`] chooses: the merger's GELU (HF exact
//! erf, llama.cpp tanh) and the attention precision; the position resampling is an option too
//! (both references use corner-aligned bilinear for Qwen3.5; the antialiased form is clip's
//! default for other projectors). Products go through
//! the GGUF weight kernels ([`dsp::matmul`], activations converted to each weight's
//! `vec_dot_type` as ggml does); attention is [`AttnPrecision::F16`] by default (Q, K and V
//! rounded to f16 as llama.cpp's flash-attention path, through the register-blocked tile
//! [`dsp::backend::KernelBackend::full_attention`]) or [`AttnPrecision::F32`] (HF's
//! precision). GELU is the f32 formula, where ggml's CPU backend reads an f16 table (see
//! [`dsp::encoder::gelu_tanh`]).

use dsp::backend::{FullAttnTile, FULL_ATTN_KV_ALIGN};
use dsp::encoder::{attention_full, layer_norm, Bilinear, Gelu};
use dsp::matmul::QMatRef;
use dsp::pool::ThreadPool;
use half::f16;
use half::slice::HalfFloatSliceExt;

use super::mmproj::{Affine, Norm, Projector, VisionBlock, TEMPORAL_PATCH};
use super::position::{learned_positions, merge_order};
use super::preprocess::Preprocessed;
use super::rope2d::Rope2d;
use super::VisionError;
use crate::model::parallel::{for_token_ranges, DisjointMut};
use crate::model::project::mm;

/// Query patches per attention task of the f32 path (each task runs every head of its
/// patches), and per tile of the f16 path (each tile: these patches, one head, all keys).
const ATTN_QUERIES: usize = 16;

/// How the blocks' full attention is computed (scores, softmax and the value sums are f32 in
/// both; the choice is the precision of the inputs and the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnPrecision {
    /// Queries, keys and values rounded to f16, then tiles of [`ATTN_QUERIES`] queries of one
    /// head against all of its keys through the backend's register-blocked
    /// [`full_attention`](dsp::backend::KernelBackend::full_attention) (keys transposed, one
    /// fused multiply-add chain per score and per output element; each query bit-identical
    /// to the scalar chains whatever the vector width). These are the inputs of llama.cpp's
    /// flash-attention path (`clip.cpp` `build_attn` casts K and V to f16, and ggml's CPU
    /// `flash_attn_ext` converts Q to K's type); ggml accumulates V in f16 with an online
    /// softmax there, which is not reproduced (f32 sums of an exact softmax here).
    F16,
    /// All f32, one dot per (query, key) pair ([`attention_full`]): the precision of HF's
    /// f32 attention and llama.cpp's non-flash path; the exact, slow reference.
    F32,
}

/// The choices where llama.cpp and Hugging Face compute the tower differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The merger's activation: [`Gelu::Tanh`] in llama.cpp (`FFN_GELU`), [`Gelu::Erf`] in
    /// HF (`nn.GELU()`). The blocks' MLP is `gelu_pytorch_tanh` in both.
    pub merger_gelu: Gelu,
    /// How the learned position grid is resampled to the image's patch grid.
    pub position_resize: Bilinear,
    /// The precision (and kernel) of the blocks' attention.
    pub attention: AttnPrecision,
}

impl EncodeOptions {
    /// llama.cpp's choices (the peer): tanh GELU in the merger, corner-aligned bilinear
    /// position resampling (`tools/mtmd/models/qwen3vl.cpp`:
    /// `resize_position_embeddings(GGML_SCALE_MODE_BILINEAR | GGML_SCALE_FLAG_ALIGN_CORNERS)`;
    /// the antialiased mode is clip's default for other projectors), f16 attention inputs (its
    /// flash-attention path). Checked against `llama-mtmd-cli`'s embeddings in
    /// `tests/vision_parity.rs`.
    pub const LLAMA_CPP: Self = Self {
        merger_gelu: Gelu::Tanh,
        position_resize: Bilinear::AlignCorners,
        attention: AttnPrecision::F16,
    };
    /// Hugging Face's choices (the trained model's reference): erf GELU, corner-aligned
    /// bilinear, f32 attention.
    pub const HUGGING_FACE: Self = Self {
        merger_gelu: Gelu::Erf,
        position_resize: Bilinear::AlignCorners,
        attention: AttnPrecision::F32,
    };
}

impl Default for EncodeOptions {
    /// [`EncodeOptions::LLAMA_CPP`].
    fn default() -> Self {
        Self::LLAMA_CPP
    }
}

/// Activations of one encode, `n` patches.
struct Scratch {
    /// The residual stream `[n, n_embd]`.
    h: Vec<f32>,
    /// LayerNorm output `[n, n_embd]`.
    x: Vec<f32>,
    /// `[n, 3·n_embd]`.
    qkv: Vec<f32>,
    /// Attention output, then block outputs before the residual `[n, n_embd]`.
    attn: Vec<f32>,
    /// `[n, n_ff]`.
    ff: Vec<f32>,
    /// The f16 path's buffers (empty for [`AttnPrecision::F32`]).
    attn16: Attn16,
}

/// Scratch of [`AttnPrecision::F16`] attention, allocated once per encode: the block's
/// queries, keys and values rounded to f16 (held as f32, exactly) and laid out head-major, the
/// keys transposed for [`dsp::backend::KernelBackend::full_attention`], and one scores and
/// one output tile per task.
struct Attn16 {
    /// `[n_head, n, head_dim]`.
    q: Vec<f32>,
    /// `[n_head, head_dim, kv_stride]`: head `h`'s key `j`, element `d` at
    /// `(h · head_dim + d) · kv_stride + j` (zero padding after `n`).
    kt: Vec<f32>,
    /// `[n_head, n, head_dim]`.
    v: Vec<f32>,
    /// `n` rounded up to [`FULL_ATTN_KV_ALIGN`].
    kv_stride: usize,
    /// `[tasks, ATTN_QUERIES, kv_stride]`.
    scores: Vec<f32>,
    /// `[tasks, ATTN_QUERIES, head_dim]`.
    out: Vec<f32>,
    /// Tasks of one attention (the pool's threads).
    tasks: usize,
}

impl Attn16 {
    fn new(n: usize, n_embd: usize, head_dim: usize, tasks: usize) -> Self {
        let tile = ATTN_QUERIES.min(n);
        let kv_stride = n.div_ceil(FULL_ATTN_KV_ALIGN) * FULL_ATTN_KV_ALIGN;
        let n_head = n_embd / head_dim.max(1);
        Self {
            q: vec![0.0; n * n_embd],
            kt: vec![0.0; n_head * head_dim * kv_stride],
            v: vec![0.0; n * n_embd],
            kv_stride,
            scores: vec![0.0; tasks * tile * kv_stride],
            out: vec![0.0; tasks * tile * head_dim],
            tasks,
        }
    }

    fn empty() -> Self {
        Self {
            q: Vec::new(),
            kt: Vec::new(),
            v: Vec::new(),
            kv_stride: 0,
            scores: Vec::new(),
            out: Vec::new(),
            tasks: 0,
        }
    }

    /// Full attention of every head over all `n` patches with f16 inputs
    /// ([`AttnPrecision::F16`]); shapes as [`attention`]. Rounds `qkv` to f16 into the
    /// head-major buffers (one task per head; the keys transposed), then runs the
    /// `n_head · ⌈n / ATTN_QUERIES⌉` tiles (head-major, so one task's consecutive tiles reuse
    /// a head's keys and values from cache) as at most `tasks` contiguous ranges, task `t` in
    /// scratch slot `t` (as the text model's `causal_attention`, one tile of queries per
    /// kernel call). Each query's bits do not depend on its tile (the kernel's contract), so
    /// neither do they on the thread count.
    fn attend(&mut self, pool: &ThreadPool, qkv: &[f32], shape: PatchHeads, out: &mut [f32]) {
        let PatchHeads { n, n_head, head_dim: hd } = shape;
        let (e, st) = (n_head * hd, self.kv_stride);
        let head_len = n * hd;
        {
            let (q, kt, v) = (
                DisjointMut::new(&mut self.q[..]),
                DisjointMut::new(&mut self.kt[..]),
                DisjointMut::new(&mut self.v[..]),
            );
            pool.run(n_head, &|h| {
                // SAFETY: task `h` writes head `h`'s rows only.
                let (qh, kth, vh) = unsafe {
                    (q.chunk(h * head_len, head_len), kt.chunk(h * hd * st, hd * st), v.chunk(h * head_len, head_len))
                };
                let mut r16 = vec![f16::ZERO; hd];
                let mut row = vec![0f32; hd];
                // `dst = f16(src)` widened back (vector F16C / fp16 rounding where the CPU
                // has it, nearest-even).
                let mut round_f16 = |src: &[f32], dst: &mut [f32]| {
                    r16.convert_from_f32_slice(src);
                    r16.convert_to_f32_slice(dst);
                };
                for i in 0..n {
                    let at = i * 3 * e + h * hd;
                    round_f16(&qkv[at..][..hd], &mut qh[i * hd..(i + 1) * hd]);
                    round_f16(&qkv[at + 2 * e..][..hd], &mut vh[i * hd..(i + 1) * hd]);
                    round_f16(&qkv[at + e..][..hd], &mut row);
                    for (d, &x) in row.iter().enumerate() {
                        kth[d * st + i] = x;
                    }
                }
            });
        }
        let tiles = n.div_ceil(ATTN_QUERIES);
        let units = n_head * tiles;
        let per = units.div_ceil(self.tasks.min(units).max(1));
        let cap = ATTN_QUERIES.min(n);
        let (q, kt, v) = (&self.q, &self.kt, &self.v);
        let scores = DisjointMut::new(&mut self.scores);
        let tile_out = DisjointMut::new(&mut self.out);
        let out = DisjointMut::new(out);
        let be = dsp::select();
        let scale = 1.0 / (hd as f32).sqrt();
        pool.run(units.div_ceil(per), &|t| {
            // SAFETY: slot `t` is task `t`'s alone.
            let (sc, o) = unsafe {
                (scores.chunk(t * cap * st, cap * st), tile_out.chunk(t * cap * hd, cap * hd))
            };
            for u in t * per..((t + 1) * per).min(units) {
                let (h, q0) = (u / tiles, (u % tiles) * ATTN_QUERIES);
                let nq = ATTN_QUERIES.min(n - q0);
                let head = h * head_len..(h + 1) * head_len;
                let tile = FullAttnTile {
                    q: &q[head.start + q0 * hd..head.start + (q0 + nq) * hd],
                    kt: &kt[h * hd * st..(h + 1) * hd * st],
                    v: &v[head],
                    n_kv: n,
                    kv_stride: st,
                    head_dim: hd,
                    scale,
                };
                let o = &mut o[..nq * hd];
                be.full_attention(&tile, sc, o);
                for (i, row) in o.chunks_exact(hd).enumerate() {
                    // SAFETY: the (patch, head) segment of unit `u`'s queries is its alone.
                    unsafe { out.chunk((q0 + i) * e + h * hd, hd) }.copy_from_slice(row);
                }
            }
        });
    }
}

impl Projector {
    /// The image embeddings of `pre`: `[n_tokens, projection_dim]` row-major f32 (one row per
    /// 2×2 patch block, in merge-block order: block row, then block column), what the text
    /// model takes in place of the image's `<|image_pad|>` tokens. Products run on `pool`.
    ///
    /// Errors: [`VisionError::EncoderShape`] when `pre` does not fit this projector (its
    /// grid not a whole number of merge blocks, its patch rows of another length);
    /// [`VisionError::Encoder`] if a kernel refuses its arguments.
    pub fn encode(
        &self,
        pool: &ThreadPool,
        pre: &Preprocessed,
        opts: &EncodeOptions,
    ) -> Result<Vec<f32>, VisionError> {
        let c = &self.config;
        let (t, gh, gw) = pre.grid_thw;
        let m = c.spatial_merge;
        let n = gh * gw;
        if t != 1 || gh % m != 0 || gw % m != 0 || n == 0 {
            return Err(VisionError::EncoderShape {
                what: "patch grid (t = 1, sides multiples of the merge size)",
                expected: (gh.div_ceil(m) * m) * (gw.div_ceil(m) * m),
                actual: n * t,
            });
        }
        if pre.pixels.len() != n * c.patch_values() {
            return Err(VisionError::EncoderShape {
                what: "patch rows",
                expected: n * c.patch_values(),
                actual: pre.pixels.len(),
            });
        }
        let bytes = self.file.bytes();
        let e = c.n_embd;
        let mut s = Scratch {
            h: vec![0.0; n * e],
            x: vec![0.0; n * e],
            qkv: vec![0.0; n * 3 * e],
            attn: vec![0.0; n * e],
            ff: vec![0.0; n * c.n_ff],
            attn16: match opts.attention {
                AttnPrecision::F16 => Attn16::new(n, e, c.head_dim(), pool.n_threads()),
                AttnPrecision::F32 => Attn16::empty(),
            },
        };
        self.embed_patches(pool, &pre.pixels, n, &mut s.h)?;
        let pos = learned_positions(self, (gh, gw), opts.position_resize)?;
        add(pool, &mut s.h, &pos);
        let coords = merge_order(gh, gw, m);
        let rope = Rope2d::new(c.head_dim());
        for (i, blk) in self.blocks.iter().enumerate() {
            self.block(pool, bytes, blk, i, &coords, &rope, opts.attention, &mut s)?;
        }
        self.merge(pool, bytes, &s.h, n, opts.merger_gelu)
    }

    /// `h = conv3d(pixels) + bias` for `n` patch rows (`[n, 3·2·p·p]`, (channel, frame, y, x)).
    fn embed_patches(
        &self,
        pool: &ThreadPool,
        pixels: &[f32],
        n: usize,
        h: &mut [f32],
    ) -> Result<(), VisionError> {
        let (e, pp) = (self.config.n_embd, self.config.patch_size * self.config.patch_size);
        let cols = self.config.patch_values();
        // kernel[o][ch][t][y][x] = slice_t[o][ch][y][x]
        let mut kernel = vec![0f32; e * cols];
        for o in 0..e {
            for ch in 0..3 {
                for (t, slice) in self.patch_embd.iter().enumerate() {
                    let src = &slice[(o * 3 + ch) * pp..(o * 3 + ch + 1) * pp];
                    let at = o * cols + (ch * TEMPORAL_PATCH + t) * pp;
                    kernel[at..at + pp].copy_from_slice(src);
                }
            }
        }
        let w = QMatRef::from_f32(e, cols, &kernel)
            .map_err(|source| VisionError::kernel("v.patch_embd", source))?;
        dsp::matmul::matmul(pool, &w, pixels, n, h)
            .map_err(|source| VisionError::kernel("v.patch_embd", source))?;
        add_bias(pool, h, &self.patch_bias);
        Ok(())
    }

    /// One pre-LN block on the residual stream `s.h`.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        pool: &ThreadPool,
        bytes: &[u8],
        blk: &VisionBlock,
        il: usize,
        coords: &[(usize, usize)],
        rope: &Rope2d,
        precision: AttnPrecision,
        s: &mut Scratch,
    ) -> Result<(), VisionError> {
        let c = &self.config;
        let (n, eps) = (coords.len(), c.layer_norm_eps);
        norm(pool, &blk.ln1, &s.h, eps, &mut s.x, "ln1")?;
        affine(pool, bytes, &blk.qkv, &s.x, n, &mut s.qkv)?;
        try_for_row_ranges(pool, &mut s.qkv, 3 * c.n_embd, &|range, rows| {
            rope.apply(rows, &coords[range], c.n_head)
        })?;
        let heads = PatchHeads {
            n,
            n_head: c.n_head,
            head_dim: c.head_dim(),
        };
        match precision {
            AttnPrecision::F16 => s.attn16.attend(pool, &s.qkv, heads, &mut s.attn),
            AttnPrecision::F32 => attention(pool, &s.qkv, heads, &mut s.attn)?,
        }
        affine(pool, bytes, &blk.out, &s.attn, n, &mut s.x)?;
        add(pool, &mut s.h, &s.x);
        norm(pool, &blk.ln2, &s.h, eps, &mut s.x, "ln2")?;
        affine(pool, bytes, &blk.up, &s.x, n, &mut s.ff)?;
        gelu_rows(pool, Gelu::Tanh, &mut s.ff, c.n_ff);
        affine(pool, bytes, &blk.down, &s.ff, n, &mut s.x)?;
        add(pool, &mut s.h, &s.x);
        tracing::trace!(layer = il, "vision block");
        Ok(())
    }

    /// The merger: `mm.2(gelu(mm.0(concat4(post_ln(h)))))`, `[n / 4, projection_dim]`.
    fn merge(
        &self,
        pool: &ThreadPool,
        bytes: &[u8],
        h: &[f32],
        n: usize,
        gelu: Gelu,
    ) -> Result<Vec<f32>, VisionError> {
        let c = &self.config;
        let groups = c.spatial_merge * c.spatial_merge;
        let n_tok = n / groups;
        let mut x = vec![0f32; n * c.n_embd];
        norm(pool, &self.merger_norm, h, c.layer_norm_eps, &mut x, "v.post_ln")?;
        // Rows of 4 consecutive patches are one merge block: `x` is already [n/4, 4·n_embd].
        let mut mid = vec![0f32; n_tok * self.merger_fc1.weight.rows];
        affine(pool, bytes, &self.merger_fc1, &x, n_tok, &mut mid)?;
        gelu_rows(pool, gelu, &mut mid, self.merger_fc1.weight.rows);
        let mut out = vec![0f32; n_tok * c.projection_dim];
        affine(pool, bytes, &self.merger_fc2, &mid, n_tok, &mut out)?;
        Ok(out)
    }
}

/// `y = W x + b` for `n` rows.
fn affine(
    pool: &ThreadPool,
    bytes: &[u8],
    a: &Affine,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), VisionError> {
    mm(pool, &a.weight, bytes, x, n, y).map_err(|source| VisionError::Encoder {
        op: a.weight.name.clone(),
        source,
    })?;
    add_bias(pool, y, &a.bias);
    Ok(())
}

/// Runs `f(range, rows)` on contiguous row ranges of `buf` (`[n, d]` row-major) covering
/// `0..n`, one per thread of `pool`; `rows` is the range's part of `buf`. The steps below are
/// row-wise, so their bits do not depend on the split (the element-wise steps of a block
/// would otherwise run on one thread between the parallel products).
fn for_row_ranges(
    pool: &ThreadPool,
    buf: &mut [f32],
    d: usize,
    f: &(dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync),
) {
    let n = buf.len() / d.max(1);
    let rows = DisjointMut::new(buf);
    for_token_ranges(pool, n, &|range| {
        // SAFETY: the ranges of `for_token_ranges` are disjoint.
        let part = unsafe { rows.chunk(range.start * d, range.len() * d) };
        f(range, part)
    });
}

/// [`for_row_ranges`] for a fallible step: the first error a range returns.
fn try_for_row_ranges<E: Send>(
    pool: &ThreadPool,
    buf: &mut [f32],
    d: usize,
    f: &(dyn Fn(std::ops::Range<usize>, &mut [f32]) -> Result<(), E> + Sync),
) -> Result<(), E> {
    let failed = std::sync::Mutex::new(None);
    for_row_ranges(pool, buf, d, &|range, rows| {
        if let Err(e) = f(range, rows) {
            failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(e);
        }
    });
    match failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// LayerNorm of every row of `x` into `out`, rows split over `pool`.
fn norm(
    pool: &ThreadPool,
    nm: &Norm,
    x: &[f32],
    eps: f32,
    out: &mut [f32],
    op: &str,
) -> Result<(), VisionError> {
    let d = nm.weight.len();
    if x.len() != out.len() || d == 0 || x.len() % d != 0 {
        // The kernel's own shape error.
        return layer_norm(x, &nm.weight, &nm.bias, eps, out)
            .map_err(|source| VisionError::kernel(op, source));
    }
    try_for_row_ranges(pool, out, d, &|range, rows| {
        layer_norm(&x[range.start * d..range.end * d], &nm.weight, &nm.bias, eps, rows)
    })
    .map_err(|source| VisionError::kernel(op, source))
}

/// `gelu` of every element of `x` (`[n, d]`), rows split over `pool`.
fn gelu_rows(pool: &ThreadPool, gelu: Gelu, x: &mut [f32], d: usize) {
    let be = dsp::select();
    for_row_ranges(pool, x, d, &|_, rows| gelu.apply_inplace(be, rows));
}

/// `y[r] += b` for every row `r` of `y` (rows of `b.len()`), rows split over `pool`.
fn add_bias(pool: &ThreadPool, y: &mut [f32], b: &[f32]) {
    for_row_ranges(pool, y, b.len(), &|_, rows| {
        for row in rows.chunks_exact_mut(b.len()) {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    });
}

/// `dst += src` element-wise (equal lengths), split over `pool`.
fn add(pool: &ThreadPool, dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    for_row_ranges(pool, dst, 1, &|range, part| {
        for (d, &v) in part.iter_mut().zip(&src[range]) {
            *d += v;
        }
    });
}

/// The shape of one attention call over the patches: `n` patches, `n_head` heads of
/// `head_dim` values each (`qkv` `[n, 3·n_head·head_dim]`, output `[n, n_head·head_dim]`).
#[derive(Clone, Copy, Debug)]
struct PatchHeads {
    n: usize,
    n_head: usize,
    head_dim: usize,
}

/// Full attention of every head over all `n` patches in f32 ([`AttnPrecision::F32`]):
/// `qkv` `[n, 3·n_embd]` (rows `q | k | v`, head `h` at `h·head_dim` in each), `out`
/// `[n, n_embd]`. One task per block of [`ATTN_QUERIES`] query patches, all heads, through
/// [`attention_full`] with the selected backend.
fn attention(
    pool: &ThreadPool,
    qkv: &[f32],
    shape: PatchHeads,
    out: &mut [f32],
) -> Result<(), VisionError> {
    let PatchHeads { n, n_head, head_dim: hd } = shape;
    let e = n_head * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let out = DisjointMut::new(out);
    let failed = std::sync::Mutex::new(None);
    pool.run(n.div_ceil(ATTN_QUERIES), &|task| {
        let q0 = task * ATTN_QUERIES;
        let q1 = (q0 + ATTN_QUERIES).min(n);
        // SAFETY: each task writes the rows of its own query patches.
        let rows = unsafe { out.chunk(q0 * e, (q1 - q0) * e) };
        let mut scores = vec![0f32; n];
        for h in 0..n_head {
            let o = h * hd;
            let r = attention_full(
                dsp::select(),
                &qkv[o..],
                &qkv[e + o..],
                &qkv[2 * e + o..],
                (n, hd, 3 * e),
                q0..q1,
                scale,
                &mut scores,
                &mut rows[o..],
                e,
            );
            if let Err(err) = r {
                *failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(err);
                return;
            }
        }
    });
    match failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Some(source) => Err(VisionError::kernel("attention", source)),
        None => Ok(()),
    }
}
