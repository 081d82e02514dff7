//! The `llama` architecture (Llama 2/3, SmolLM2, and other GGUFs llama.cpp writes with
//! `general.architecture = llama`): pre-norm decoder blocks of grouped-query attention with
//! rotary position embedding and a SwiGLU MLP.
//!
//! Reference: llama.cpp `src/models/llama.cpp` (graph) and the Hugging Face `LlamaModel`.
//! llama.cpp's converter permutes the q/k projections so that RoPE rotates adjacent pairs
//! (`LLAMA_ROPE_TYPE_NORM`), which is what [`dsp::ops::rope_norm`] implements.

use std::sync::Arc;

use dsp::ops;
use dsp::pool::ThreadPool;

use crate::error::ModelError;
use gguf::reader::GgufFile;
use crate::model::project::{
    causal_attention, kernel, mm, mm_shared, output_head, AttnShape, Mlp, MlpBuffers, Outputs,
};
use crate::model::weights::{load_vector, Linear};
use crate::state::kv::KvCache;
use crate::state::sequence::SequenceShape;

/// Hyperparameters read once from GGUF metadata (`{arch}.*` keys).
#[derive(Clone, Debug)]
pub struct LlamaConfig {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// Rotated dimensions per head (`rope.dimension_count`).
    pub n_rot: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
}

impl LlamaConfig {
    /// A KV cache for every layer, no recurrent state.
    pub fn sequence_shape(&self) -> SequenceShape {
        SequenceShape {
            kv_layers: self.n_layer,
            n_kv_head: self.n_head_kv,
            head_dim: self.head_dim,
            recurrent: None,
        }
    }

    /// Errors: [`ModelError::Metadata`] for a missing or mistyped key.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let arch = file.architecture()?.to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| -> Result<usize, ModelError> { Ok(file.get_u32(&key(k))? as usize) };
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_head_kv = file
            .get_u32_opt(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(n_head);
        let head_dim = file
            .get_u32_opt(&key("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(n_embd / n_head.max(1));
        let n_vocab = match file.get_u32_opt(&key("vocab_size")) {
            Some(v) => v as usize,
            None => file.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let cfg = Self {
            n_layer: u("block_count")?,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: u("feed_forward_length")?,
            n_vocab,
            n_rot: file
                .get_u32_opt(&key("rope.dimension_count"))
                .map(|v| v as usize)
                .unwrap_or(head_dim),
            rope_freq_base: file.get_f32_opt(&key("rope.freq_base")).unwrap_or(10_000.0),
            rms_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            n_ctx_train: file
                .get_u32_opt(&key("context_length"))
                .map(|v| v as usize)
                .unwrap_or(4096),
        };
        if cfg.n_head == 0
            || cfg.n_head_kv == 0
            || !cfg.n_head.is_multiple_of(cfg.n_head_kv)
            || cfg.n_rot > cfg.head_dim
        {
            return Err(ModelError::Invalid(format!(
                "inconsistent attention shape: {cfg:?}"
            )));
        }
        Ok(cfg)
    }
}

struct Attention {
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
}

struct Layer {
    attn_norm: Vec<f32>,
    attn: Attention,
    ffn_norm: Vec<f32>,
    mlp: Mlp,
}

/// Activation buffers for one micro-batch of up to `n_batch` tokens.
pub struct Scratch {
    n_batch: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    /// Output-normed hidden states `[rows, n_embd]` of the positions that got logits.
    hidden: Vec<f32>,
    /// Logits `[rows, n_vocab]`.
    logits: Vec<f32>,
    /// Rows of `hidden` / `logits` the last pass wrote.
    rows: usize,
}

impl Scratch {
    /// Output-normed hidden states `[rows, n_embd]` of the last pass's logit positions.
    pub fn hidden(&self, n_embd: usize) -> &[f32] {
        &self.hidden[..self.rows * n_embd]
    }
}

/// `llama` model weights (memory-mapped) and hyperparameters.
pub struct LlamaModel {
    file: Arc<GgufFile>,
    pub cfg: LlamaConfig,
    tok_embd: Linear,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: Linear,
}

impl LlamaModel {
    /// Binds every tensor of the `llama` graph by its GGUF name (`token_embd.weight`,
    /// `blk.{i}.attn_q.weight`, ...). `output.weight` falls back to the tied embedding.
    ///
    /// Errors: missing tensors, wrong shapes, missing metadata.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let cfg = LlamaConfig::from_gguf(&file)?;
        let f = &*file;
        let (e, hd) = (cfg.n_embd, cfg.head_dim);
        let tok_embd = Linear::load(f, "token_embd.weight", cfg.n_vocab, e)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: load_vector(f, &n("attn_norm"), e)?,
                attn: Attention {
                    wq: Linear::load(f, &n("attn_q"), cfg.n_head * hd, e)?,
                    wk: Linear::load(f, &n("attn_k"), cfg.n_head_kv * hd, e)?,
                    wv: Linear::load(f, &n("attn_v"), cfg.n_head_kv * hd, e)?,
                    wo: Linear::load(f, &n("attn_output"), e, cfg.n_head * hd)?,
                },
                ffn_norm: load_vector(f, &n("ffn_norm"), e)?,
                mlp: Mlp::load(f, &n, e, cfg.n_ff)?,
            });
        }
        let output_norm = load_vector(f, "output_norm.weight", e)?;
        let output = match f.tensor_opt("output.weight") {
            Some(_) => Linear::load(f, "output.weight", cfg.n_vocab, e)?,
            None => tok_embd.clone(),
        };
        Ok(Self {
            file,
            cfg,
            tok_embd,
            layers,
            output_norm,
            output,
        })
    }

    /// Parameter count (weights of every bound tensor; tied output counted once).
    pub fn n_params(&self) -> u64 {
        let mut n = self.tok_embd.numel() + self.output_norm.len();
        for l in &self.layers {
            n += l.attn_norm.len() + l.ffn_norm.len();
            n += l.attn.wq.numel() + l.attn.wk.numel() + l.attn.wv.numel() + l.attn.wo.numel();
            n += l.mlp.numel();
        }
        if self.output.name != self.tok_embd.name {
            n += self.output.numel();
        }
        n as u64
    }

    /// A KV cache for `n_ctx` positions.
    pub fn new_kv_cache(&self, n_ctx: usize) -> KvCache {
        self.cfg.sequence_shape().new_state(n_ctx).kv
    }

    /// Buffers for micro-batches of up to `n_batch` tokens.
    pub fn new_scratch(&self, n_batch: usize) -> Scratch {
        let c = &self.cfg;
        let n = n_batch.max(1);
        Scratch {
            n_batch: n,
            x: vec![0.0; n * c.n_embd],
            h: vec![0.0; n * c.n_embd],
            q: vec![0.0; n * c.n_head * c.head_dim],
            k: vec![0.0; n * c.n_head_kv * c.head_dim],
            v: vec![0.0; n * c.n_head_kv * c.head_dim],
            attn: vec![0.0; n * c.n_head * c.head_dim],
            o: vec![0.0; n * c.n_embd],
            gate: vec![0.0; n * c.n_ff],
            up: vec![0.0; n * c.n_ff],
            act: vec![0.0; n * c.n_ff],
            hidden: vec![0.0; c.n_embd],
            logits: vec![0.0; c.n_vocab],
            rows: 0,
        }
    }

    /// Runs one micro-batch: `tokens` at positions `kv.len() .. kv.len() + tokens.len()`,
    /// appending their keys and values to `kv`. Returns the logits `[rows, n_vocab]` of the
    /// positions `outputs` asks for (`None` for [`Outputs::None`]); their output-normed hidden
    /// states are in [`Scratch::hidden`].
    ///
    /// Errors: [`ModelError::BatchTooLarge`], [`ModelError::ContextFull`],
    /// [`ModelError::TokenOutOfRange`].
    pub fn forward<'s>(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        tokens: &[u32],
        scratch: &'s mut Scratch,
        outputs: Outputs,
    ) -> Result<Option<&'s [f32]>, ModelError> {
        let c = &self.cfg;
        let n = tokens.len();
        let pos0 = kv.len();
        scratch.rows = 0;
        if n == 0 {
            return Err(ModelError::Invalid("empty micro-batch".into()));
        }
        if n > scratch.n_batch {
            return Err(ModelError::BatchTooLarge {
                n,
                max: scratch.n_batch,
            });
        }
        if pos0 + n > kv.n_ctx() {
            return Err(ModelError::ContextFull {
                needed: pos0 + n,
                n_ctx: kv.n_ctx(),
            });
        }
        let bytes = self.file.bytes();
        let (e, hd) = (c.n_embd, c.head_dim);
        let (nq, nkv) = (c.n_head * hd, c.n_head_kv * hd);

        // Embedding lookup (ggml get_rows).
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= c.n_vocab {
                return Err(ModelError::TokenOutOfRange {
                    id,
                    n_vocab: c.n_vocab,
                });
            }
            dsp::quant::dequantize_row(
                self.tok_embd.ty,
                self.tok_embd.row_bytes(bytes, id as usize),
                &mut scratch.x[t * e..(t + 1) * e],
            )
            .map_err(|s| ModelError::Kernel {
                name: self.tok_embd.name.clone(),
                source: s,
            })?;
        }

        let s = scratch;
        for (il, layer) in self.layers.iter().enumerate() {
            // Attention block.
            for t in 0..n {
                ops::rms_norm(
                    &s.x[t * e..(t + 1) * e],
                    &layer.attn_norm,
                    c.rms_eps,
                    &mut s.h[t * e..(t + 1) * e],
                )
                .map_err(kernel("attn_norm"))?;
            }
            let h = &s.h[..n * e];
            mm_shared(
                pool,
                bytes,
                h,
                n,
                &mut [
                    (&layer.attn.wq, &mut s.q[..n * nq]),
                    (&layer.attn.wk, &mut s.k[..n * nkv]),
                    (&layer.attn.wv, &mut s.v[..n * nkv]),
                ],
            )?;
            for t in 0..n {
                let pos = (pos0 + t) as u32;
                ops::rope_norm(
                    &mut s.q[t * nq..(t + 1) * nq],
                    c.n_head,
                    hd,
                    c.n_rot,
                    pos,
                    c.rope_freq_base,
                )
                .map_err(kernel("rope q"))?;
                ops::rope_norm(
                    &mut s.k[t * nkv..(t + 1) * nkv],
                    c.n_head_kv,
                    hd,
                    c.n_rot,
                    pos,
                    c.rope_freq_base,
                )
                .map_err(kernel("rope k"))?;
            }
            kv.write(il, pos0, n, &s.k[..n * nkv], &s.v[..n * nkv]);
            let shape = AttnShape {
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: hd,
            };
            causal_attention(
                pool,
                kv,
                il,
                shape,
                pos0,
                n,
                &s.q[..n * nq],
                &mut s.attn[..n * nq],
            );
            mm(
                pool,
                &layer.attn.wo,
                bytes,
                &s.attn[..n * nq],
                n,
                &mut s.o[..n * e],
            )?;
            ops::add_inplace(&mut s.x[..n * e], &s.o[..n * e]).map_err(kernel("residual"))?;

            // MLP block: down(silu(gate(h)) * up(h)).
            for t in 0..n {
                ops::rms_norm(
                    &s.x[t * e..(t + 1) * e],
                    &layer.ffn_norm,
                    c.rms_eps,
                    &mut s.h[t * e..(t + 1) * e],
                )
                .map_err(kernel("ffn_norm"))?;
            }
            let f = c.n_ff;
            let buf = MlpBuffers {
                gate: &mut s.gate[..n * f],
                up: &mut s.up[..n * f],
                act: &mut s.act[..n * f],
                out: &mut s.o[..n * e],
            };
            layer.mlp.forward(pool, bytes, &s.h[..n * e], n, buf)?;
            ops::add_inplace(&mut s.x[..n * e], &s.o[..n * e]).map_err(kernel("residual"))?;
        }
        kv.set_len(pos0 + n);
        s.rows = output_head(
            pool,
            bytes,
            &s.x[..n * e],
            n,
            e,
            outputs,
            (&self.output_norm, c.rms_eps, &self.output),
            &mut s.hidden,
            &mut s.logits,
        )?;
        Ok((s.rows > 0).then(|| &s.logits[..s.rows * c.n_vocab]))
    }
}
