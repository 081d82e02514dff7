//! Causal grouped-query attention over the f16 KV cache, with rotary position embedding (Su
//! et al. 2021, RoFormer), in the variants the architectures need as configuration
//! ([`AttentionConfig`]): adjacent-pair (`LLAMA_ROPE_TYPE_NORM`) or NEOX rotation over the
//! first `n_rot` dimensions of each head, per-head q/k RMSNorm, and a sigmoid output gate
//! fused into the query projection (Qwen3.5 gated attention).
//!
//! Order of the ops (llama.cpp `build_attn` inside `src/models/llama.cpp` and
//! `build_layer_attn` of `src/models/qwen35.cpp`; Hugging Face `LlamaAttention`,
//! `Qwen3_5Attention`): `q|k|v` projections (one activation conversion) → de-interleave
//! `[q_h | gate_h]` (gated) → q/k norms → RoPE of every token → KV write → softmax attention
//! (`ggml_soft_max_ext` over the masked scores, scale `1/√head_dim`) → `· sigmoid(gate)`
//! (gated) → output projection.

use dsp::ops;
use dsp::pool::ThreadPool;

use super::{sigmoid, Ctx, RmsNorm};
use crate::model::loader::Loader;
use crate::model::op_profile::Laps;
use crate::model::parallel::DisjointMut;
use crate::model::project::{kernel, mm, mm_shared};
use crate::model::weights::Linear;
use crate::model::ModelError;
use crate::state::kv::KvCache;

/// How queries and keys are rotated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rope {
    /// Adjacent pairs `(x_2i, x_2i+1)` ([`ops::rope_norm`]; llama.cpp's converter permutes
    /// the llama q/k projections for it).
    Norm,
    /// Halves `(x_i, x_{i+n_rot/2})` ([`ops::rope_neox`]; Qwen3.5's sectioned multimodal
    /// RoPE reduces to it for text, every section's position being the token index).
    Neox,
}

/// Shape and variant of one attention block.
#[derive(Clone, Copy, Debug)]
pub struct AttentionConfig {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Rotated dimensions per head (`rope.dimension_count`, at most `head_dim`).
    pub n_rot: usize,
    pub rope_freq_base: f32,
    pub rope: Rope,
    /// `attn_q` holds an output gate per head, `[q_h | gate_h]` (`[n_head·2·head_dim,
    /// n_embd]`); the attention output is multiplied by `sigmoid(gate)`.
    pub gated: bool,
    /// ε of per-head RMSNorms of q and k (`attn_q_norm`, `attn_k_norm`, `[head_dim]`), when
    /// the architecture has them.
    pub qk_norm_eps: Option<f32>,
}

/// Weights of one attention block and the KV-cache layer it writes.
pub struct Attention {
    cfg: AttentionConfig,
    /// `[n_head·head_dim, n_embd]`, or `[n_head·2·head_dim, n_embd]` when gated.
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    cache_layer: usize,
}

/// Buffers of [`Attention::forward`] for micro-batches of up to `n_batch` tokens.
pub struct AttentionScratch {
    /// The query projection `[n, n_head·head_dim]` (`·2` when gated: `[q_h | gate_h]`).
    qg: Vec<f32>,
    /// De-interleaved queries and gates (gated only) `[n, n_head·head_dim]`.
    q: Vec<f32>,
    gate: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
}

impl AttentionScratch {
    /// Buffers for `n_batch` tokens of blocks configured as `c`.
    pub fn new(n_batch: usize, c: &AttentionConfig) -> Self {
        let (nq, nkv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let gated = if c.gated { n_batch * nq } else { 0 };
        Self {
            qg: vec![0.0; n_batch * nq + gated],
            q: vec![0.0; gated],
            gate: vec![0.0; gated],
            k: vec![0.0; n_batch * nkv],
            v: vec![0.0; n_batch * nkv],
            attn: vec![0.0; n_batch * nq],
        }
    }
}

impl Attention {
    /// Binds `{prefix}.attn_q|attn_k|attn_v|attn_output.weight` (and `attn_q_norm`,
    /// `attn_k_norm` with `qk_norm_eps`) for hidden size `n_embd`; the block reads and writes
    /// layer `cache_layer` of the KV cache it is given.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn new(
        loader: &Loader<'_>,
        prefix: &str,
        cfg: AttentionConfig,
        n_embd: usize,
        cache_layer: usize,
    ) -> Result<Self, ModelError> {
        let n = |t: &str| Loader::weight_name(prefix, t);
        let (e, hd) = (n_embd, cfg.head_dim);
        let q_rows = if cfg.gated { 2 } else { 1 } * cfg.n_head * hd;
        let norm = |t: &str| match cfg.qk_norm_eps {
            Some(eps) => RmsNorm::new(loader, &format!("{prefix}.{t}"), hd, eps).map(Some),
            None => Ok(None),
        };
        Ok(Self {
            cfg,
            wq: loader.linear(&n("attn_q"), q_rows, e)?,
            wk: loader.linear(&n("attn_k"), cfg.n_head_kv * hd, e)?,
            wv: loader.linear(&n("attn_v"), cfg.n_head_kv * hd, e)?,
            wo: loader.linear(&n("attn_output"), e, cfg.n_head * hd)?,
            q_norm: norm("attn_q_norm")?,
            k_norm: norm("attn_k_norm")?,
            cache_layer,
        })
    }

    /// Weights in the block (norms included).
    pub fn numel(&self) -> usize {
        let norms = self.q_norm.as_ref().map_or(0, RmsNorm::len)
            + self.k_norm.as_ref().map_or(0, RmsNorm::len);
        self.wq.numel() + self.wk.numel() + self.wv.numel() + self.wo.numel() + norms
    }

    /// Attention of `n` tokens with normalised input `h` `[n, n_embd]`; writes `out`
    /// `[n, n_embd]`. Their keys and values go to `kv` at cache indices `pos0..pos0 + n`
    /// (layer `cache_layer`), token `t` attends to indices `0..=pos0 + t`, and RoPE rotates
    /// it as `rope` says ([`RopePositions::Linear`]`(rope0)`: position `rope0 + t`, with
    /// `rope0 = pos0` for a model's own text cache; the MTP cache's indices are not
    /// positions). The caller sets the cache length after its last layer.
    ///
    /// Errors: [`ModelError::Kernel`] naming the weight or op.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ctx: Ctx<'_>,
        kv: &mut KvCache,
        (pos0, rope): (usize, RopePositions<'_>),
        h: &[f32],
        n: usize,
        s: &mut AttentionScratch,
        out: &mut [f32],
        laps: &mut Laps<'_>,
    ) -> Result<(), ModelError> {
        let c = &self.cfg;
        let hd = c.head_dim;
        let (nq, nkv) = (c.n_head * hd, c.n_head_kv * hd);
        let q_len = if c.gated { 2 * nq } else { nq };
        let (k, v) = (&mut s.k[..n * nkv], &mut s.v[..n * nkv]);
        mm_shared(
            ctx.pool,
            ctx.bytes,
            h,
            n,
            &mut [(&self.wq, &mut s.qg[..n * q_len]), (&self.wk, &mut *k), (&self.wv, &mut *v)],
        )?;
        laps.lap(if c.gated { "attn projections (q+gate, k, v)" } else { "attn projections (q, k, v)" });
        let q = if c.gated {
            // De-interleave [q_h | gate_h] per head.
            for (i, pair) in s.qg[..n * 2 * nq].chunks_exact(2 * hd).enumerate() {
                s.q[i * hd..(i + 1) * hd].copy_from_slice(&pair[..hd]);
                s.gate[i * hd..(i + 1) * hd].copy_from_slice(&pair[hd..]);
            }
            &mut s.q[..n * nq]
        } else {
            &mut s.qg[..n * nq]
        };
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            qn.forward_inplace(q)?;
            kn.forward_inplace(k)?;
        }
        self.rope(q, k, n, rope)?;
        laps.lap(if c.qk_norm_eps.is_some() { "attn q/k norm + rope" } else { "attn rope" });
        kv.write(self.cache_layer, pos0, n, k, v);
        let attn = &mut s.attn[..n * nq];
        causal_attention(ctx.pool, kv, self.cache_layer, c, pos0, n, q, attn);
        laps.lap("attn kv write + attention");
        if c.gated {
            for (o, &gt) in attn.iter_mut().zip(&s.gate[..n * nq]) {
                *o *= sigmoid(gt);
            }
        }
        let r = mm(ctx.pool, &self.wo, ctx.bytes, attn, n, out);
        laps.lap(if c.gated { "attn gate + out projection" } else { "attn out projection" });
        r
    }

    /// RoPE of every token's queries `q` `[n, n_head·head_dim]` and keys `k`, token `t` at
    /// its position in `rope`.
    ///
    /// Errors: [`ModelError::Kernel`]; [`ModelError::Invalid`] for multimodal positions on a
    /// `Norm` rotary or fewer positions than tokens.
    fn rope(&self, q: &mut [f32], k: &mut [f32], n: usize, rope: RopePositions<'_>) -> Result<(), ModelError> {
        let c = &self.cfg;
        let hd = c.head_dim;
        let (nq, nkv) = (c.n_head * hd, c.n_head_kv * hd);
        let rows = q.chunks_exact_mut(nq).zip(k.chunks_exact_mut(nkv)).take(n);
        match rope {
            RopePositions::Linear(rope0) => {
                let rope = match c.rope {
                    Rope::Norm => ops::rope_norm,
                    Rope::Neox => ops::rope_neox,
                };
                for (t, (qt, kt)) in rows.enumerate() {
                    let pos = (rope0 + t) as u32;
                    rope(qt, c.n_head, hd, c.n_rot, pos, c.rope_freq_base).map_err(kernel("rope q"))?;
                    rope(kt, c.n_head_kv, hd, c.n_rot, pos, c.rope_freq_base).map_err(kernel("rope k"))?;
                }
            }
            RopePositions::Multi { pos, sections } => {
                if c.rope != Rope::Neox || pos.len() < n {
                    return Err(ModelError::Invalid(format!(
                        "multimodal rotary positions need the neox layout and one triple per token ({} for {n})",
                        pos.len()
                    )));
                }
                for ((qt, kt), &p) in rows.zip(pos) {
                    ops::rope_imrope(qt, c.n_head, hd, c.n_rot, p, sections, c.rope_freq_base)
                        .map_err(kernel("rope q"))?;
                    ops::rope_imrope(kt, c.n_head_kv, hd, c.n_rot, p, sections, c.rope_freq_base)
                        .map_err(kernel("rope k"))?;
                }
            }
        }
        Ok(())
    }
}

/// The rotary positions of a pass's tokens.
#[derive(Clone, Copy, Debug)]
pub enum RopePositions<'a> {
    /// Token `t` at position `rope0 + t` (text).
    Linear(usize),
    /// Token `t` at the triple `pos[t]` = (t, h, w) of interleaved multimodal RoPE
    /// ([`ops::rope_imrope`]) with `sections` rotary pairs per axis (images in the sequence:
    /// [`crate::model::multimodal::SequenceImages::position`]).
    Multi { pos: &'a [[u32; 3]], sections: [usize; 3] },
}

/// Tokens per attention task: the task's queries (these tokens × the query heads of one KV
/// head) share every K/V row read.
const ATTN_TOKENS: usize = 8;

/// Causal grouped-query attention of `n` new tokens (queries `[n, n_head*head_dim]`) over
/// the cache positions `0..=pos0+t` of cache layer `layer` for token `t`; writes
/// `out` `[n, n_head*head_dim]`. Query head `h` reads KV head `h / (n_head / n_head_kv)`
/// (llama.cpp / Hugging Face `repeat_kv`); scale `1/√head_dim`. One task per (block of
/// [`ATTN_TOKENS`] tokens, KV head) through [`ops::attention_queries`]; results do not depend
/// on the blocking (each query is bit-identical to [`ops::attention_head`]).
#[allow(clippy::too_many_arguments)]
fn causal_attention(
    pool: &ThreadPool,
    kv: &KvCache,
    layer: usize,
    s: &AttentionConfig,
    pos0: usize,
    n: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_head / s.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let out = DisjointMut::new(out);
    let n_blocks = n.div_ceil(ATTN_TOKENS);
    pool.run(n_blocks * s.n_head_kv, &|task| {
        // The last token blocks (the most keys) first, so no long task is left for the end.
        let (b, g) = (n_blocks - 1 - task / s.n_head_kv, task % s.n_head_kv);
        let tokens = b * ATTN_TOKENS..((b + 1) * ATTN_TOKENS).min(n);
        let n_q = tokens.len() * group;
        let mut qs = Vec::with_capacity(n_q * hd);
        let mut n_ctx = Vec::with_capacity(n_q);
        for t in tokens.clone() {
            let row = t * s.n_head + g * group;
            qs.extend_from_slice(&q[row * hd..(row + group) * hd]);
            n_ctx.extend(std::iter::repeat_n(pos0 + t + 1, group));
        }
        let max_ctx = pos0 + tokens.end;
        let (k, v) = kv.head(layer, g, max_ctx);
        let mut scores = vec![0f32; n_q * max_ctx];
        let mut o = vec![0f32; n_q * hd];
        ops::attention_queries(
            dsp::select(),
            &qs,
            &n_ctx,
            hd,
            k,
            v,
            scale,
            &mut scores,
            &mut o,
        )
        .expect("attention shapes follow the config");
        for (i, t) in tokens.enumerate() {
            let row = t * s.n_head + g * group;
            // SAFETY: each task writes the rows of its own (tokens, KV head) queries.
            let dst = unsafe { out.chunk(row * hd, group * hd) };
            dst.copy_from_slice(&o[i * group * hd..(i + 1) * group * hd]);
        }
    });
}
