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
//! erf, llama.cpp tanh) and the position resampling (HF corner-aligned bilinear, llama.cpp
//! antialiased bilinear; equal when the grid keeps the table's size). Products go through
//! the GGUF weight kernels ([`dsp::matmul`], activations converted to each weight's
//! `vec_dot_type` as ggml does); attention runs in f32 like llama.cpp's non-flash path (its
//! flash-attention path casts K and V to f16 first). GELU is the f32 formula, where ggml's
//! CPU backend reads an f16 table (see [`dsp::encoder::gelu_tanh`]).

use dsp::encoder::{attention_full, layer_norm, Bilinear, Gelu};
use dsp::matmul::QMatRef;
use dsp::pool::ThreadPool;

use super::mmproj::{Affine, Norm, Projector, VisionBlock, TEMPORAL_PATCH};
use super::position::{learned_positions, merge_order};
use super::preprocess::Preprocessed;
use super::rope2d::Rope2d;
use super::VisionError;
use crate::model::parallel::DisjointMut;
use crate::model::project::mm;

/// Query patches per attention task (each task runs every head of its patches).
const ATTN_QUERIES: usize = 16;

/// The choices where llama.cpp and Hugging Face compute the tower differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The merger's activation: [`Gelu::Tanh`] in llama.cpp (`FFN_GELU`), [`Gelu::Erf`] in
    /// HF (`nn.GELU()`). The blocks' MLP is `gelu_pytorch_tanh` in both.
    pub merger_gelu: Gelu,
    /// How the learned position grid is resampled to the image's patch grid.
    pub position_resize: Bilinear,
}

impl EncodeOptions {
    /// llama.cpp's choices (the peer): tanh GELU in the merger, antialiased bilinear.
    pub const LLAMA_CPP: Self = Self {
        merger_gelu: Gelu::Tanh,
        position_resize: Bilinear::Antialias,
    };
    /// Hugging Face's choices (the trained model's reference): erf GELU, corner-aligned
    /// bilinear.
    pub const HUGGING_FACE: Self = Self {
        merger_gelu: Gelu::Erf,
        position_resize: Bilinear::AlignCorners,
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
        };
        self.embed_patches(pool, &pre.pixels, n, &mut s.h)?;
        let pos = learned_positions(self, (gh, gw), opts.position_resize)?;
        for (h, p) in s.h.iter_mut().zip(&pos) {
            *h += p;
        }
        let coords = merge_order(gh, gw, m);
        let rope = Rope2d::new(c.head_dim());
        for (i, blk) in self.blocks.iter().enumerate() {
            self.block(pool, bytes, blk, i, &coords, &rope, &mut s)?;
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
        add_bias(h, &self.patch_bias);
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
        s: &mut Scratch,
    ) -> Result<(), VisionError> {
        let c = &self.config;
        let (n, eps) = (coords.len(), c.layer_norm_eps);
        norm(&blk.ln1, &s.h, eps, &mut s.x, "ln1")?;
        affine(pool, bytes, &blk.qkv, &s.x, n, &mut s.qkv)?;
        rope.apply(&mut s.qkv, coords, c.n_head)?;
        attention(pool, &s.qkv, n, c.n_head, c.head_dim(), &mut s.attn)?;
        affine(pool, bytes, &blk.out, &s.attn, n, &mut s.x)?;
        add(&mut s.h, &s.x);
        norm(&blk.ln2, &s.h, eps, &mut s.x, "ln2")?;
        affine(pool, bytes, &blk.up, &s.x, n, &mut s.ff)?;
        Gelu::Tanh.apply_inplace(&mut s.ff);
        affine(pool, bytes, &blk.down, &s.ff, n, &mut s.x)?;
        add(&mut s.h, &s.x);
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
        norm(&self.merger_norm, h, c.layer_norm_eps, &mut x, "v.post_ln")?;
        // Rows of 4 consecutive patches are one merge block: `x` is already [n/4, 4·n_embd].
        let mut mid = vec![0f32; n_tok * self.merger_fc1.weight.rows];
        affine(pool, bytes, &self.merger_fc1, &x, n_tok, &mut mid)?;
        gelu.apply_inplace(&mut mid);
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
    add_bias(y, &a.bias);
    Ok(())
}

fn norm(nm: &Norm, x: &[f32], eps: f32, out: &mut [f32], op: &str) -> Result<(), VisionError> {
    layer_norm(x, &nm.weight, &nm.bias, eps, out).map_err(|source| VisionError::kernel(op, source))
}

/// `y[r] += b` for every row `r` of `y` (rows of `b.len()`).
fn add_bias(y: &mut [f32], b: &[f32]) {
    for row in y.chunks_exact_mut(b.len()) {
        for (v, &bb) in row.iter_mut().zip(b) {
            *v += bb;
        }
    }
}

fn add(dst: &mut [f32], src: &[f32]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d += v;
    }
}

/// Full attention of every head over all `n` patches: `qkv` `[n, 3·n_embd]` (rows
/// `q | k | v`, head `h` at `h·head_dim` in each), `out` `[n, n_embd]`. One task per block
/// of [`ATTN_QUERIES`] query patches, all heads, through [`attention_full`] with the
/// selected backend.
fn attention(
    pool: &ThreadPool,
    qkv: &[f32],
    n: usize,
    n_head: usize,
    hd: usize,
    out: &mut [f32],
) -> Result<(), VisionError> {
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
