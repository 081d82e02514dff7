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

use gguf::reader::GgufFile;

use super::blocks::{
    Attention, AttentionConfig, AttentionScratch, Ctx, Embedding, Mlp, MlpScratch, OutputHead,
    Outputs, RmsNorm, Rope, RopePositions,
};
use super::loader::Loader;
use super::op_profile::{Laps, OpProfile};
use super::project::kernel;
use super::{CausalLm, ModelError};
use crate::state::kv::KvCache;
use crate::state::sequence::{SequenceShape, SequenceState};

/// Binds a `llama` file ([`super::ARCHITECTURES`]).
///
/// Errors: as [`LlamaModel::from_gguf`].
pub fn load(file: Arc<GgufFile>) -> Result<Box<dyn CausalLm>, ModelError> {
    Ok(Box::new(LlamaModel::from_gguf(file)?))
}

/// The sequence-state shapes of a `llama` file, from its metadata ([`super::ARCHITECTURES`]).
///
/// Errors: as [`LlamaConfig::from_gguf`].
pub fn sequence_shape(file: &GgufFile) -> Result<SequenceShape, ModelError> {
    Ok(LlamaConfig::from_gguf(file)?.sequence_shape())
}

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

    /// The attention blocks' configuration: adjacent-pair RoPE, no gate, no q/k norms.
    pub fn attention(&self) -> AttentionConfig {
        AttentionConfig {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            n_rot: self.n_rot,
            rope_freq_base: self.rope_freq_base,
            rope: Rope::Norm,
            gated: false,
            qk_norm_eps: None,
        }
    }

    /// Errors: [`ModelError::Gguf`] for a missing or mistyped key, [`ModelError::Invalid`]
    /// for inconsistent attention shapes.
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

/// One decoder block: `x += attn(attn_norm(x)); x += mlp(ffn_norm(x))` (llama.cpp
/// `src/models/llama.cpp`, one iteration of the layer loop).
struct Layer {
    attn_norm: RmsNorm,
    attn: Attention,
    ffn_norm: RmsNorm,
    mlp: Mlp,
}

impl Layer {
    /// Binds `blk.{i}.*`; the layer's KV lives in cache layer `i`.
    fn new(loader: &Loader<'_>, cfg: &LlamaConfig, i: usize) -> Result<Self, ModelError> {
        let p = format!("blk.{i}");
        let (e, eps) = (cfg.n_embd, cfg.rms_eps);
        Ok(Self {
            attn_norm: RmsNorm::new(loader, &format!("{p}.attn_norm"), e, eps)?,
            attn: Attention::new(loader, &p, cfg.attention(), e, i)?,
            ffn_norm: RmsNorm::new(loader, &format!("{p}.ffn_norm"), e, eps)?,
            mlp: Mlp::new(loader, &p, e, cfg.n_ff)?,
        })
    }

    fn numel(&self) -> usize {
        self.attn_norm.len() + self.ffn_norm.len() + self.attn.numel() + self.mlp.numel()
    }

    /// The block on the `n` rows of `s.x` (in place), tokens at positions `pos0..`.
    fn forward(
        &self,
        ctx: Ctx<'_>,
        kv: &mut KvCache,
        pos0: usize,
        n: usize,
        s: &mut Scratch,
        laps: &mut Laps<'_>,
    ) -> Result<(), ModelError> {
        let e = self.attn_norm.len();
        let (x, h, o) = (&mut s.x[..n * e], &mut s.h[..n * e], &mut s.o[..n * e]);
        self.attn_norm.forward(x, h)?;
        laps.lap("norms + residuals");
        self.attn.forward(ctx, kv, (pos0, RopePositions::Linear(pos0)), h, n, &mut s.attn, o, laps)?;
        ops::add_inplace(x, o).map_err(kernel("residual"))?;
        self.ffn_norm.forward(x, h)?;
        laps.lap("norms + residuals");
        self.mlp.forward(ctx, h, n, &mut s.mlp, o)?;
        laps.lap("ffn (gate/up/down + swiglu)");
        ops::add_inplace(x, o).map_err(kernel("residual"))?;
        laps.lap("norms + residuals");
        Ok(())
    }
}

/// Activation buffers for one micro-batch of up to `n_batch` tokens.
struct Scratch {
    n_batch: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    o: Vec<f32>,
    attn: AttentionScratch,
    mlp: MlpScratch,
    /// Output-normed hidden states `[rows, n_embd]` of the positions that got logits.
    hidden: Vec<f32>,
    /// Logits `[rows, n_vocab]`.
    logits: Vec<f32>,
    /// Rows of `hidden` / `logits` the last pass wrote.
    rows: usize,
    /// Per-op timing of forward passes, when attached (`device-worker bench --profile`).
    profile: Option<OpProfile>,
}

impl Scratch {
    fn new(c: &LlamaConfig, n_batch: usize) -> Self {
        let n = n_batch.max(1);
        Self {
            n_batch: n,
            x: vec![0.0; n * c.n_embd],
            h: vec![0.0; n * c.n_embd],
            o: vec![0.0; n * c.n_embd],
            attn: AttentionScratch::new(n, &c.attention()),
            mlp: MlpScratch::new(n, c.n_ff),
            hidden: vec![0.0; c.n_embd],
            logits: vec![0.0; c.n_vocab],
            rows: 0,
            profile: None,
        }
    }
}

/// `llama` model weights (memory-mapped), hyperparameters and activation buffers.
pub struct LlamaModel {
    file: Arc<GgufFile>,
    pub cfg: LlamaConfig,
    tok_embd: Embedding,
    layers: Vec<Layer>,
    head: OutputHead,
    scratch: Scratch,
}

impl LlamaModel {
    /// Binds every tensor of the `llama` graph by its GGUF name (`token_embd.weight`,
    /// `blk.{i}.attn_q.weight`, ...). `output.weight` falls back to the tied embedding.
    /// Buffers for 1-token batches ([`CausalLm::set_max_batch`]).
    ///
    /// Errors: missing tensors, wrong shapes, missing metadata.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let cfg = LlamaConfig::from_gguf(&file)?;
        let loader = Loader::new(&file);
        let tok_embd = Embedding::new(&loader, "token_embd", cfg.n_vocab, cfg.n_embd)?;
        let layers = (0..cfg.n_layer)
            .map(|i| Layer::new(&loader, &cfg, i))
            .collect::<Result<Vec<_>, _>>()?;
        let head = OutputHead::new(&loader, &tok_embd, cfg.rms_eps)?;
        let scratch = Scratch::new(&cfg, 1);
        Ok(Self {
            file,
            cfg,
            tok_embd,
            layers,
            head,
            scratch,
        })
    }

    /// A KV cache for `n_ctx` positions.
    pub fn new_kv_cache(&self, n_ctx: usize) -> KvCache {
        self.cfg.sequence_shape().new_state(n_ctx).kv
    }
}

impl CausalLm for LlamaModel {
    fn sequence_shape(&self) -> SequenceShape {
        self.cfg.sequence_shape()
    }

    fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }

    fn n_embd(&self) -> usize {
        self.cfg.n_embd
    }

    fn n_ctx_train(&self) -> usize {
        self.cfg.n_ctx_train
    }

    fn n_params(&self) -> u64 {
        let layers: usize = self.layers.iter().map(Layer::numel).sum();
        (self.tok_embd.numel() + self.head.numel() + layers) as u64
    }

    fn set_max_batch(&mut self, n_batch: usize) {
        let profile = self.scratch.profile.take();
        self.scratch = Scratch::new(&self.cfg, n_batch);
        self.scratch.profile = profile;
    }

    fn set_profiling(&mut self, on: bool) -> bool {
        self.scratch.profile = on.then(OpProfile::default);
        true
    }

    fn profile(&self) -> Option<&OpProfile> {
        self.scratch.profile.as_ref()
    }

    fn max_batch(&self) -> usize {
        self.scratch.n_batch
    }

    /// Runs one micro-batch: `tokens` at positions `kv.len() .. kv.len() + tokens.len()`,
    /// appending their keys and values to `seq.kv` (embedding → layers → output head).
    ///
    /// Errors: [`ModelError::BatchTooLarge`], [`ModelError::ContextFull`],
    /// [`ModelError::TokenOutOfRange`], [`ModelError::Invalid`] for an empty batch.
    fn pass(
        &mut self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        outputs: Outputs,
    ) -> Result<Option<&[f32]>, ModelError> {
        let kv = &mut seq.kv;
        let n = tokens.len();
        let pos0 = kv.len();
        let s = &mut self.scratch;
        s.rows = 0;
        if n == 0 {
            return Err(ModelError::Invalid("empty micro-batch".into()));
        }
        if n > s.n_batch {
            return Err(ModelError::BatchTooLarge { n, max: s.n_batch });
        }
        if pos0 + n > kv.n_ctx() {
            return Err(ModelError::ContextFull {
                needed: pos0 + n,
                n_ctx: kv.n_ctx(),
            });
        }
        let ctx = Ctx {
            pool,
            bytes: self.file.bytes(),
        };
        let e = self.cfg.n_embd;
        let mut profile = s.profile.take();
        let mut laps = Laps::new(profile.as_mut());
        self.tok_embd.forward(ctx.bytes, tokens, &mut s.x[..n * e])?;
        laps.lap("embedding");
        for layer in &self.layers {
            layer.forward(ctx, kv, pos0, n, s, &mut laps)?;
        }
        kv.set_len(pos0 + n);
        let x = &s.x[..n * e];
        s.rows = self.head.forward(ctx, x, n, outputs, &mut s.hidden, &mut s.logits)?;
        laps.lap("lm head (output norm + logits)");
        s.profile = profile;
        Ok((s.rows > 0).then(|| &s.logits[..s.rows * self.cfg.n_vocab]))
    }

    fn hidden(&self) -> &[f32] {
        &self.scratch.hidden[..self.scratch.rows * self.cfg.n_embd]
    }
}
