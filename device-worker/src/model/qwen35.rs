//! The `qwen35` architecture (Qwen3.5 text models): a hybrid decoder whose layers are either
//! Gated DeltaNet linear attention (GDN, three of every four layers) or gated full attention,
//! each followed by a SwiGLU MLP, with an optional multi-token-prediction ("nextn") block.
//!
//! References (read, not copied): llama.cpp `src/models/qwen35.cpp` (graph and the tensor
//! names and metadata keys its converter `conversion/qwen.py` writes) and Hugging Face
//! `transformers` `models/qwen3_5/modeling_qwen3_5.py` (`Qwen3_5GatedDeltaNet`,
//! `Qwen3_5Attention`, `Qwen3_5RMSNormGated`, `l2norm`). The gated delta rule itself is in
//! [`dsp::gdn`] (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks").
//!
//! GGUF conventions this file relies on (see `tools/fixtures/README.md`):
//! - RMSNorm weights are stored as `1 + w` (applied as `x·w`), except `ssm_norm` (gated norm).
//! - `ssm_a` is `−exp(A_log)`; GDN value heads are in tiled order (value head `h` reads key
//!   head `h % n_k_heads`, what [`dsp::gdn`] expects).
//! - `attn_q` of attention layers has the output gate fused, per head `[q_h | gate_h]`.
//! - `{arch}.block_count` counts the MTP layers; `nextn_predict_layers` of them are at the end.
//!
//! Rotary embedding: Qwen3.5 uses interleaved multimodal RoPE with sections; for text every
//! section's position is the token index, so it reduces to NEOX rope over
//! `rope.dimension_count` dims (bit for bit, [`dsp::ops::rope_imrope`]). With images in the
//! sequence ([`CausalLm::set_images`]) a pass takes their embeddings and (t, h, w) positions
//! ([`super::multimodal`]).


mod gdn;
mod mtp;

use std::sync::Arc;

use dsp::gdn::GdnShape;
use dsp::ops;
use dsp::pool::ThreadPool;

use gguf::reader::{GgufFile, MetaValue};

use super::blocks::{
    Attention, AttentionConfig, AttentionScratch, Ctx, Embedding, Mlp, MlpScratch, OutputHead,
    Outputs, RmsNorm, Rope, RopePositions,
};
use super::multimodal::{rope_sections, SequenceImages};
use super::loader::Loader;
use super::op_profile::{Laps, OpProfile};
use super::project::kernel;
use super::{CausalLm, ModelError, MtpHead, MtpPass};
use crate::state::checkpoint::Checkpoint;
use crate::state::kv::KvCache;
use crate::state::mtp::MtpCache;
use crate::state::recurrent::RecurrentState;
use crate::state::rollback::{RollbackPrefill, RollbackStates};
use crate::state::sequence::{RecurrentShape, SequenceShape, SequenceState};
use gdn::{GatedDeltaNet, GdnScratch};
use mtp::MtpBlock;
pub use mtp::DRAFT_VOCAB_TOOL;

/// Binds a `qwen35` file ([`super::ARCHITECTURES`]).
///
/// Errors: as [`Qwen35Model::from_gguf`].
pub fn load(file: Arc<GgufFile>) -> Result<Box<dyn CausalLm>, ModelError> {
    Ok(Box::new(Qwen35Model::from_gguf(file)?))
}

/// The sequence-state shapes of a `qwen35` file, from its metadata
/// ([`super::ARCHITECTURES`]).
///
/// Errors: as [`Qwen35Config::from_gguf`].
pub fn sequence_shape(file: &GgufFile) -> Result<SequenceShape, ModelError> {
    Ok(Qwen35Config::from_gguf(file)?.sequence_shape())
}


/// Micro-batches of at least this many tokens run the chunked GDN form
/// ([`gdn::gdn_chunked_pooled`]); shorter ones (decode) the per-token recurrence. Both give
/// the same result up to rounding (tested in `tests/qwen35.rs`).
pub const CHUNKED_MIN_TOKENS: usize = 16;

/// ε of the L2 normalisation of GDN queries and keys: `x / sqrt(Σx² + ε)` (Hugging Face
/// `l2norm(..., eps=1e-6)`).
pub const L2_NORM_EPS: f32 = 1e-6;

/// Hyperparameters read once from GGUF metadata (`qwen35.*` keys).
#[derive(Clone, Debug)]
pub struct Qwen35Config {
    /// Decoder layers of the main model (`block_count − nextn_predict_layers`).
    pub n_layer: usize,
    /// MTP ("nextn") layers after the main ones.
    pub n_nextn: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// Attention layers: query heads, KV heads, head dimension.
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Rotated dimensions per head (`rope.dimension_count`).
    pub n_rot: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    pub n_ctx_train: usize,
    /// GDN layers: key heads (`ssm.group_count`), value heads (`ssm.time_step_rank`), head
    /// dimension of keys and values (`ssm.state_size`), conv kernel (`ssm.conv_kernel`).
    pub gdn: GdnShape,
    pub conv_kernel: usize,
    /// Per main layer: `true` for GDN, `false` for full attention.
    pub recurrent: Vec<bool>,
    /// Rotary pairs per axis (t, h, w) of the interleaved multimodal RoPE
    /// (`rope.dimension_sections`, e.g. `[11, 11, 10, 0]`); `None` in a file without them
    /// (no images: text positions rotate as plain NEOX either way).
    pub mrope_sections: Option<[usize; 3]>,
}

impl Qwen35Config {
    /// The gated attention blocks' configuration: NEOX RoPE over `n_rot` dimensions, the
    /// output gate fused into `attn_q`, per-head q/k RMSNorm.
    pub fn attention(&self) -> AttentionConfig {
        AttentionConfig {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            n_rot: self.n_rot,
            rope_freq_base: self.rope_freq_base,
            rope: Rope::Neox,
            gated: true,
            qk_norm_eps: Some(self.rms_eps),
        }
    }

    /// Errors: [`ModelError::Gguf`] for a missing or mistyped key, [`ModelError::Invalid`]
    /// for inconsistent shapes (e.g. `ssm.inner_size != time_step_rank · state_size`).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let arch = file.architecture()?.to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| -> Result<usize, ModelError> { Ok(file.get_u32(&key(k))? as usize) };
        let block_count = u("block_count")?;
        let n_nextn = file.get_u32_opt(&key("nextn_predict_layers")).unwrap_or(0) as usize;
        if n_nextn >= block_count {
            return Err(ModelError::Invalid(format!(
                "nextn_predict_layers {n_nextn} >= block_count {block_count}"
            )));
        }
        let n_layer = block_count - n_nextn;
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
        let d_state = u("ssm.state_size")?;
        let gdn = GdnShape {
            n_k_heads: u("ssm.group_count")?,
            n_v_heads: u("ssm.time_step_rank")?,
            d_k: d_state,
            d_v: d_state,
        };
        let recurrent = recurrent_layers(
            file,
            &key("attention.recurrent_layers"),
            &key("full_attention_interval"),
            n_layer,
        )?;
        let mut cfg = Self {
            n_layer,
            n_nextn,
            n_embd,
            n_ff: u("feed_forward_length")?,
            n_vocab,
            n_head,
            n_head_kv,
            head_dim,
            n_rot: file
                .get_u32_opt(&key("rope.dimension_count"))
                .map(|v| v as usize)
                .unwrap_or(head_dim),
            rope_freq_base: file
                .get_f32_opt(&key("rope.freq_base"))
                .unwrap_or(10_000_000.0),
            rms_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            n_ctx_train: file
                .get_u32_opt(&key("context_length"))
                .map(|v| v as usize)
                .unwrap_or(4096),
            gdn,
            conv_kernel: u("ssm.conv_kernel")?,
            recurrent,
            mrope_sections: None,
        };
        cfg.mrope_sections = rope_sections(file, &key("rope.dimension_sections"), cfg.n_rot)?;
        if let Some(inner) = file.get_u32_opt(&key("ssm.inner_size")) {
            if inner as usize != gdn.n_v_heads * gdn.d_v {
                return Err(ModelError::Invalid(format!(
                    "ssm.inner_size {inner} != time_step_rank {} × state_size {}",
                    gdn.n_v_heads, gdn.d_v
                )));
            }
        }
        gdn.validate("qwen35 config").map_err(kernel("ssm shape"))?;
        if n_head == 0
            || n_head_kv == 0
            || !n_head.is_multiple_of(n_head_kv)
            || cfg.n_rot > head_dim
            || !cfg.n_rot.is_multiple_of(2)
            || cfg.conv_kernel == 0
        {
            return Err(ModelError::Invalid(format!(
                "inconsistent qwen35 shape: {cfg:?}"
            )));
        }
        Ok(cfg)
    }

    /// Channels of the short convolution: `q | k | v` = `2·n_k_heads·d_k + n_v_heads·d_v`.
    pub fn conv_channels(&self) -> usize {
        2 * self.gdn.n_k_heads * self.gdn.d_k + self.gdn.n_v_heads * self.gdn.d_v
    }

    /// Number of GDN layers.
    pub fn n_gdn_layers(&self) -> usize {
        self.recurrent.iter().filter(|&&r| r).count()
    }

    /// Number of full-attention layers (the KV cache holds only these).
    pub fn n_attn_layers(&self) -> usize {
        self.n_layer - self.n_gdn_layers()
    }

    /// KV cache of the attention layers, conv and delta-rule state of the GDN layers.
    pub fn sequence_shape(&self) -> SequenceShape {
        SequenceShape {
            kv_layers: self.n_attn_layers(),
            n_kv_head: self.n_head_kv,
            head_dim: self.head_dim,
            recurrent: Some(RecurrentShape {
                n_layers: self.n_gdn_layers(),
                conv_len: (self.conv_kernel - 1) * self.conv_channels(),
                ssm_len: self.gdn.state_len(),
            }),
        }
    }
}

/// Which main layers are GDN: `attention.recurrent_layers` (one bool per block, MTP blocks
/// included) if present, else every layer but each `full_attention_interval`-th (llama.cpp
/// `load_arch_hparams`, default interval 4).
fn recurrent_layers(
    file: &GgufFile,
    arr_key: &str,
    interval_key: &str,
    n_layer: usize,
) -> Result<Vec<bool>, ModelError> {
    if let Some(v) = file.get(arr_key) {
        let MetaValue::Array(items) = v else {
            return Err(ModelError::Invalid(format!(
                "{arr_key} is {}, expected an array of bool",
                v.type_name()
            )));
        };
        if items.len() < n_layer {
            return Err(ModelError::Invalid(format!(
                "{arr_key} has {} entries, expected at least {n_layer}",
                items.len()
            )));
        }
        return items[..n_layer]
            .iter()
            .map(|e| match e {
                MetaValue::Bool(b) => Ok(*b),
                other => other.as_integer().map(|i| i != 0).ok_or_else(|| {
                    ModelError::Invalid(format!(
                        "{arr_key} holds {}, expected bool",
                        other.type_name()
                    ))
                }),
            })
            .collect();
    }
    let interval = file.get_u32_opt(interval_key).unwrap_or(4).max(1) as usize;
    Ok((0..n_layer).map(|i| (i + 1) % interval != 0).collect())
}

/// What a layer mixes tokens with: GDN linear attention or gated full attention.
enum Mixer {
    GatedDeltaNet(GatedDeltaNet),
    Attention(Attention),
}

/// The sequence state a pass's layers read and write: the KV cache (cache index `pos0` for
/// the first token, rotary positions `rope`) and the recurrent state of the GDN layers (none
/// for the MTP block's attention-only layer).
struct LayerIo<'a> {
    kv: &'a mut KvCache,
    rec: Option<&'a mut RecurrentState>,
    pos0: usize,
    rope: RopePositions<'a>,
}

/// One decoder block: `x += mixer(attn_norm(x)); x += mlp(post_attention_norm(x))` (HF
/// `Qwen3_5DecoderLayer.forward`, llama.cpp `src/models/qwen35.cpp` layer loop).
struct Layer {
    attn_norm: RmsNorm,
    mixer: Mixer,
    post_attn_norm: RmsNorm,
    mlp: Mlp,
}

impl Layer {
    /// Binds `{prefix}.attn_norm`, `{prefix}.post_attention_norm` and the MLP around `mixer`.
    fn new(
        loader: &Loader<'_>,
        prefix: &str,
        c: &Qwen35Config,
        mixer: Mixer,
    ) -> Result<Self, ModelError> {
        let (e, eps) = (c.n_embd, c.rms_eps);
        Ok(Self {
            attn_norm: RmsNorm::new(loader, &format!("{prefix}.attn_norm"), e, eps)?,
            mixer,
            post_attn_norm: RmsNorm::new(loader, &format!("{prefix}.post_attention_norm"), e, eps)?,
            mlp: Mlp::new(loader, prefix, e, c.n_ff)?,
        })
    }

    fn numel(&self) -> usize {
        let mixer = match &self.mixer {
            Mixer::Attention(a) => a.numel(),
            Mixer::GatedDeltaNet(g) => g.numel(),
        };
        self.attn_norm.len() + self.post_attn_norm.len() + self.mlp.numel() + mixer
    }

    /// The block on the `n` rows of `s.x` (in place).
    ///
    /// Errors: the blocks'; [`ModelError::Invalid`] for a GDN layer without recurrent state.
    fn forward(
        &self,
        ctx: Ctx<'_>,
        io: &mut LayerIo<'_>,
        n: usize,
        s: &mut Scratch,
        laps: &mut Laps<'_>,
    ) -> Result<(), ModelError> {
        let e = self.attn_norm.len();
        let (x, h, o) = (&mut s.x[..n * e], &mut s.h[..n * e], &mut s.o[..n * e]);
        self.attn_norm.forward(x, h)?;
        laps.lap("norms + residuals");
        match &self.mixer {
            Mixer::GatedDeltaNet(g) => {
                let rec = io.rec.as_deref_mut().ok_or_else(|| {
                    ModelError::Invalid("a GDN layer without recurrent state".into())
                })?;
                let st = rec.layer_mut(g.state_layer());
                s.rollback_ms += g.forward(ctx, st, h, n, &mut s.gdn, s.rollback.as_mut(), o, laps)?;
            }
            Mixer::Attention(a) => {
                a.forward(ctx, io.kv, (io.pos0, io.rope), h, n, &mut s.attn, o, laps)?
            }
        }
        ops::add_inplace(x, o).map_err(kernel("residual"))?;
        // MLP block: down(silu(gate(h)) * up(h)).
        self.post_attn_norm.forward(x, h)?;
        laps.lap("norms + residuals");
        self.mlp.forward(ctx, h, n, &mut s.mlp, o)?;
        laps.lap("ffn (gate/up/down + swiglu)");
        ops::add_inplace(x, o).map_err(kernel("residual"))?;
        laps.lap("norms + residuals");
        Ok(())
    }
}

/// Activation buffers for one micro-batch of up to `n_batch` tokens, and what the passes
/// keep besides their logits.
struct Scratch {
    n_batch: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    o: Vec<f32>,
    gdn: GdnScratch,
    attn: AttentionScratch,
    mlp: MlpScratch,
    /// Output-normed hidden states `[rows, n_embd]` of the positions that got logits.
    hidden: Vec<f32>,
    /// Logits `[rows, n_vocab]`.
    logits: Vec<f32>,
    /// Rows of `hidden` / `logits` the last pass wrote.
    rows: usize,
    /// When set ([`CausalLm::set_hidden_rows`]), every pass also writes the output-normed
    /// hidden state of each of its positions to `hidden_rows` `[n, n_embd]` (the MTP
    /// drafters' input), `n_rows` of them.
    keep_hidden_rows: bool,
    hidden_rows: Vec<f32>,
    n_rows: usize,
    /// MTP pass buffers: `[n, 2·n_embd]` input of `eh_proj`, the last row's output hidden
    /// `[n_embd]`, its logits (`[n_vocab]` or `[N]` trimmed). Grown on first use.
    mtp_cat: Vec<f32>,
    mtp_hidden: Vec<f32>,
    mtp_logits: Vec<f32>,
    /// Rollback states kept by every pass when speculative decoding is on
    /// ([`CausalLm::set_rollback`]); `None`: passes keep none.
    rollback: Option<RollbackStates>,
    /// Wall time spent writing rollback states (the per-token recurrence that logs, and the
    /// conv-state copies) since the last [`CausalLm::take_rollback_ms`].
    rollback_ms: f64,
    /// Per-op timing of forward passes, when attached (`device-worker bench --profile`).
    profile: Option<OpProfile>,
}

impl Scratch {
    fn new(c: &Qwen35Config, n_batch: usize) -> Self {
        let n = n_batch.max(1);
        Self {
            n_batch: n,
            x: vec![0.0; n * c.n_embd],
            h: vec![0.0; n * c.n_embd],
            o: vec![0.0; n * c.n_embd],
            gdn: GdnScratch::new(n, c),
            attn: AttentionScratch::new(n, &c.attention()),
            mlp: MlpScratch::new(n, c.n_ff),
            hidden: vec![0.0; c.n_embd],
            logits: vec![0.0; c.n_vocab],
            rows: 0,
            keep_hidden_rows: false,
            hidden_rows: Vec::new(),
            n_rows: 0,
            mtp_cat: Vec::new(),
            mtp_hidden: Vec::new(),
            mtp_logits: Vec::new(),
            rollback: None,
            rollback_ms: 0.0,
            profile: None,
        }
    }
}

/// `qwen35` model weights (memory-mapped), hyperparameters and activation buffers.
pub struct Qwen35Model {
    file: Arc<GgufFile>,
    pub cfg: Qwen35Config,
    tok_embd: Embedding,
    layers: Vec<Layer>,
    head: OutputHead,
    mtp: Option<MtpBlock>,
    scratch: Scratch,
    /// The images of the sequence the next passes extend ([`CausalLm::set_images`]).
    images: Option<Arc<SequenceImages>>,
}

impl Qwen35Model {
    /// Binds every tensor of the `qwen35` graph by its GGUF name (`blk.{i}.attn_qkv.weight`,
    /// `blk.{i}.ssm_a`, `blk.{i}.attn_q.weight`, ...; see `tools/fixtures/README.md`).
    /// `output.weight` falls back to the tied embedding; the MTP block
    /// (`blk.{n_layer}.nextn.*`) is bound when `nextn_predict_layers > 0` and its tensors exist.
    /// Buffers for 1-token batches ([`CausalLm::set_max_batch`]).
    ///
    /// Errors: missing tensors, wrong shapes, missing metadata.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let cfg = Qwen35Config::from_gguf(&file)?;
        let loader = Loader::new(&file);
        let e = cfg.n_embd;
        let tok_embd = Embedding::new(&loader, "token_embd", cfg.n_vocab, e)?;
        let (mut n_gdn, mut n_attn) = (0, 0);
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let p = format!("blk.{i}");
            let mixer = if cfg.recurrent[i] {
                n_gdn += 1;
                Mixer::GatedDeltaNet(GatedDeltaNet::new(&loader, &p, &cfg, n_gdn - 1)?)
            } else {
                n_attn += 1;
                Mixer::Attention(Attention::new(&loader, &p, cfg.attention(), e, n_attn - 1)?)
            };
            layers.push(Layer::new(&loader, &p, &cfg, mixer)?);
        }
        let head = OutputHead::new(&loader, &tok_embd, cfg.rms_eps)?;
        let mtp = MtpBlock::load(&loader, &cfg)?;
        let scratch = Scratch::new(&cfg, 1);
        Ok(Self {
            file,
            cfg,
            tok_embd,
            layers,
            head,
            mtp,
            scratch,
            images: None,
        })
    }

    /// Checks a pass of `n` tokens at `pos0` against the buffers and the sequence; returns
    /// the GDN layers' recurrent state of `seq`.
    ///
    /// Errors: as [`CausalLm::pass`].
    fn check_pass<'q>(
        &self,
        seq: &'q mut SequenceState,
        n: usize,
    ) -> Result<(&'q mut KvCache, &'q mut RecurrentState), ModelError> {
        let pos0 = seq.kv.len();
        if n == 0 {
            return Err(ModelError::Invalid("empty micro-batch".into()));
        }
        if n > self.scratch.n_batch {
            return Err(ModelError::BatchTooLarge {
                n,
                max: self.scratch.n_batch,
            });
        }
        if pos0 + n > seq.kv.n_ctx() {
            return Err(ModelError::ContextFull {
                needed: pos0 + n,
                n_ctx: seq.kv.n_ctx(),
            });
        }
        let SequenceState { kv, recurrent } = seq;
        match recurrent {
            Some(r) if r.n_layers() == self.cfg.n_gdn_layers() => Ok((kv, r)),
            _ => Err(ModelError::Invalid(
                "sequence state has no recurrent state for this qwen35 model".into(),
            )),
        }
    }
}

impl CausalLm for Qwen35Model {
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

    /// Every bound tensor, MTP block included; tied output counted once.
    fn n_params(&self) -> u64 {
        let mut n = self.tok_embd.numel() + self.head.numel();
        n += self.layers.iter().map(Layer::numel).sum::<usize>();
        if let Some(m) = &self.mtp {
            n += m.numel(m.layer.numel());
        }
        n as u64
    }

    fn is_recurrent(&self) -> bool {
        true
    }

    fn set_max_batch(&mut self, n_batch: usize) {
        let old = std::mem::replace(&mut self.scratch, Scratch::new(&self.cfg, n_batch));
        let s = &mut self.scratch;
        s.keep_hidden_rows = old.keep_hidden_rows;
        s.rollback = old.rollback;
        s.rollback_ms = old.rollback_ms;
        s.profile = old.profile;
    }

    fn max_batch(&self) -> usize {
        self.scratch.n_batch
    }

    /// Runs one micro-batch: `tokens` at positions `seq.len() .. seq.len() + tokens.len()`,
    /// appending the attention layers' keys and values to `seq.kv` and advancing the GDN
    /// layers' conv and delta-rule states in `seq.recurrent`.
    ///
    /// Micro-batches of [`CHUNKED_MIN_TOKENS`] or more use the chunked GDN form, shorter ones
    /// the per-token recurrence. With rollback states on ([`CausalLm::set_rollback`], `K`
    /// states), the state after each of the last `min(K, n)` tokens is also kept: a
    /// rollback-aware pass runs the first `n − K + 1` tokens chunked and the last `K − 1`
    /// per token; a per-token pass runs all `n` per token (Tandem §3.3).
    fn pass(
        &mut self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        outputs: Outputs,
    ) -> Result<Option<&[f32]>, ModelError> {
        let n = tokens.len();
        let pos0 = seq.kv.len();
        self.scratch.rows = 0;
        self.scratch.n_rows = 0;
        if let Some(rb) = self.scratch.rollback.as_mut() {
            rb.begin_pass();
        }
        let (kv, rec) = self.check_pass(seq, n)?;
        let (c, s) = (&self.cfg, &mut self.scratch);
        let ctx = Ctx {
            pool,
            bytes: self.file.bytes(),
        };
        let e = c.n_embd;
        let mut profile = s.profile.take();
        let mut laps = Laps::new(profile.as_mut());
        let positions: Vec<[u32; 3]>;
        let rope = match (&self.images, c.mrope_sections) {
            (None, _) => {
                self.tok_embd.forward(ctx.bytes, tokens, &mut s.x[..n * e])?;
                RopePositions::Linear(pos0)
            }
            (Some(im), sections) => {
                let sections = sections.ok_or_else(|| {
                    ModelError::Invalid("images need rope.dimension_sections in the model file".into())
                })?;
                let tok = &self.tok_embd;
                im.embed(pos0, tokens, e, &mut s.x[..n * e], |id, row| tok.forward(ctx.bytes, &[id], row))?;
                positions = (pos0..pos0 + n).map(|i| im.position(i)).collect();
                RopePositions::Multi { pos: &positions, sections }
            }
        };
        laps.lap("embedding");
        let mut io = LayerIo {
            kv,
            rec: Some(rec),
            pos0,
            rope,
        };
        for layer in &self.layers {
            layer.forward(ctx, &mut io, n, s, &mut laps)?;
        }
        io.kv.set_len(pos0 + n);
        if let Some(rb) = s.rollback.as_mut() {
            rb.record_pass(pos0, n, gdn::log_start(rb.mode, n, rb.slots_for(n)));
        }
        if s.keep_hidden_rows {
            s.hidden_rows.resize(n * e, 0.0);
            self.head.norm().forward(&s.x[..n * e], &mut s.hidden_rows[..n * e])?;
            s.n_rows = n;
        }
        let x = &s.x[..n * e];
        s.rows = self.head.forward(ctx, x, n, outputs, &mut s.hidden, &mut s.logits)?;
        laps.lap("lm head (output norm + logits)");
        s.profile = profile;
        Ok((s.rows > 0).then(|| &s.logits[..s.rows * c.n_vocab]))
    }

    fn hidden(&self) -> &[f32] {
        &self.scratch.hidden[..self.scratch.rows * self.cfg.n_embd]
    }

    /// Needs `rope.dimension_sections` in the file for images.
    fn set_images(&mut self, images: Option<Arc<SequenceImages>>) -> Result<(), ModelError> {
        if images.is_some() && self.cfg.mrope_sections.is_none() {
            return Err(ModelError::Invalid(
                "this qwen35 file has no rope.dimension_sections: it cannot take images".into(),
            ));
        }
        self.images = images;
        Ok(())
    }

    /// Allocates `k` states per GDN layer; see [`crate::state::rollback`].
    fn set_rollback(&mut self, k: usize, mode: RollbackPrefill) {
        let c = &self.cfg;
        self.scratch.rollback = (k > 0).then(|| {
            RollbackStates::new(
                k,
                c.n_gdn_layers(),
                (c.conv_kernel - 1) * c.conv_channels(),
                c.conv_channels(),
                c.gdn,
                mode,
            )
        });
    }

    fn rewind(&mut self, seq: &mut SequenceState, len: usize) -> Result<(), ModelError> {
        match &mut self.scratch.rollback {
            Some(rb) => Ok(rb.rollback(seq, len)?),
            None if len == seq.len() => Ok(()),
            None => Err(ModelError::Invalid(
                "rollback of a hybrid model needs rollback states (set_rollback)".into(),
            )),
        }
    }

    fn rollback_checkpoint(
        &self,
        pool: &ThreadPool,
        seq: &SequenceState,
        len: usize,
    ) -> Result<Option<Checkpoint>, ModelError> {
        match &self.scratch.rollback {
            Some(rb) => Ok(rb.checkpoint_at(pool, seq, len)?),
            None => Err(ModelError::Invalid(
                "an end-of-prompt state needs rollback states (set_rollback)".into(),
            )),
        }
    }

    fn take_rollback_ms(&mut self) -> f64 {
        std::mem::take(&mut self.scratch.rollback_ms)
    }

    /// `n` RMSNorms per pass when on.
    fn set_hidden_rows(&mut self, on: bool) {
        self.scratch.keep_hidden_rows = on;
        self.scratch.n_rows = 0;
    }

    fn hidden_rows(&self) -> &[f32] {
        &self.scratch.hidden_rows[..self.scratch.n_rows * self.cfg.n_embd]
    }

    fn set_profiling(&mut self, on: bool) -> bool {
        self.scratch.profile = on.then(OpProfile::default);
        true
    }

    fn profile(&self) -> Option<&OpProfile> {
        self.scratch.profile.as_ref()
    }

    fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    fn mtp_draft_rows(&self) -> Option<usize> {
        self.mtp.as_ref().and_then(MtpBlock::draft_rows)
    }

    /// An empty [`MtpCache`] for `n_ctx` entries (`None` without an MTP block).
    fn new_mtp_cache(&self, n_ctx: usize) -> Option<MtpCache> {
        let c = &self.cfg;
        self.mtp
            .as_ref()
            .map(|_| MtpCache::new(c.n_head_kv, c.head_dim, n_ctx, c.n_embd))
    }

    fn mtp_max_rows(&self) -> usize {
        self.scratch.n_batch
    }

    /// The MTP block's pass (`Qwen35Model::mtp_pass` in `qwen35/mtp.rs`).
    fn mtp_forward(
        &mut self,
        pool: &ThreadPool,
        cache: &mut MtpCache,
        pass: MtpPass<'_>,
    ) -> Result<Option<&[f32]>, ModelError> {
        self.mtp_pass(pool, cache, pass)
    }

    fn mtp_hidden(&self) -> &[f32] {
        &self.scratch.mtp_hidden
    }

    fn mtp_token_id(&self, head: MtpHead, row: u32) -> Option<u32> {
        self.mtp_row_id(head, row)
    }
}
