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
//! Rotary embedding: Qwen3.5 uses multimodal RoPE with sections; for text every section's
//! position is the token index, so it reduces to NEOX rope over `rope.dimension_count` dims.

mod mtp;

use std::sync::Arc;
use std::time::Instant;

use dsp::gdn::{self, GdnShape};
use dsp::ops;
use dsp::pool::ThreadPool;

use crate::error::ModelError;
use gguf::reader::{GgufFile, MetaValue};
use crate::model::op_profile::{Laps, OpProfile};
use crate::model::parallel::{for_token_ranges, DisjointMut};
use crate::model::project::{
    causal_attention, kernel, mm, mm_shared, output_head, AttnShape, Mlp, MlpBuffers, Outputs,
};
use crate::model::weights::{load_vector, Linear};
use crate::state::kv::KvCache;
use crate::state::recurrent::GdnLayerState;
use crate::state::rollback::{RollbackPrefill, RollbackStates};
use crate::state::sequence::{RecurrentShape, SequenceShape, SequenceState};

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
}

impl Qwen35Config {
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
        let cfg = Self {
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
        };
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

/// Weights of a gated full-attention block.
struct AttnWeights {
    /// `[n_head·2·head_dim, n_embd]`, per head `[q_h | gate_h]`.
    wq_gate: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    /// Index of this layer in the KV cache.
    cache_layer: usize,
}

/// Weights of a Gated DeltaNet block.
struct GdnWeights {
    /// `[conv_channels, n_embd]`, rows `q | k | v`.
    wqkv: Linear,
    /// `z`, `[n_v_heads·d_v, n_embd]`.
    wgate: Linear,
    /// `[n_v_heads, n_embd]` each.
    walpha: Linear,
    wbeta: Linear,
    /// `[conv_channels, K]` (GGUF layout of `ssm_conv1d.weight`).
    conv: Vec<f32>,
    /// `[n_v_heads]`: `−exp(A_log)` and `dt_bias`.
    a: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `[d_v]`, shared by all heads.
    norm: Vec<f32>,
    /// `[n_embd, n_v_heads·d_v]`.
    wout: Linear,
    /// Index of this layer in the [`RecurrentState`].
    state_layer: usize,
}

enum LayerKind {
    GatedDeltaNet(GdnWeights),
    Attention(AttnWeights),
}

struct Layer {
    attn_norm: Vec<f32>,
    kind: LayerKind,
    post_attn_norm: Vec<f32>,
    mlp: Mlp,
}

use mtp::MtpBlock;
pub use mtp::DRAFT_VOCAB_TOOL;

/// Activation buffers for one micro-batch of up to `n_batch` tokens.
pub struct Scratch {
    n_batch: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    o: Vec<f32>,
    // GDN
    qkv: Vec<f32>,
    conv_out: Vec<f32>,
    z: Vec<f32>,
    alpha: Vec<f32>,
    beta: Vec<f32>,
    gq: Vec<f32>,
    gk: Vec<f32>,
    gv: Vec<f32>,
    gout: Vec<f32>,
    // attention
    qg: Vec<f32>,
    q: Vec<f32>,
    gate: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    // MLP
    ffn_gate: Vec<f32>,
    ffn_up: Vec<f32>,
    act: Vec<f32>,
    /// Output-normed hidden states `[rows, n_embd]` of the positions that got logits.
    hidden: Vec<f32>,
    /// Logits `[rows, n_vocab]`.
    logits: Vec<f32>,
    /// Rows of `hidden` / `logits` the last pass wrote.
    rows: usize,
    /// When set ([`Qwen35Model::set_hidden_rows`]), every pass also writes the output-normed
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
    /// ([`Qwen35Model::set_rollback`]); `None`: passes keep none.
    pub rollback: Option<RollbackStates>,
    /// Wall time spent writing rollback states (the per-token recurrence that snapshots, and
    /// the conv-state copies) since the last [`Scratch::take_rollback_ms`].
    rollback_ms: f64,
    /// Per-op timing of forward passes, when attached (`device-worker bench --profile`).
    pub profile: Option<OpProfile>,
}

impl Scratch {
    /// Output-normed hidden states `[rows, n_embd]` of the last pass's logit positions.
    pub fn hidden(&self, n_embd: usize) -> &[f32] {
        &self.hidden[..self.rows * n_embd]
    }

    /// Milliseconds spent producing rollback states since the last call (then reset).
    pub fn take_rollback_ms(&mut self) -> f64 {
        std::mem::take(&mut self.rollback_ms)
    }

    /// Output-normed hidden states `[n, n_embd]` of every position of the last pass, when
    /// kept ([`Qwen35Model::set_hidden_rows`]); empty otherwise.
    pub fn hidden_rows(&self, n_embd: usize) -> &[f32] {
        &self.hidden_rows[..self.n_rows * n_embd]
    }

    /// Tokens a micro-batch may hold.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// The output hidden state `[n_embd]` of the last row of the last MTP pass (the input of
    /// the next recursive draft step).
    pub fn mtp_hidden(&self) -> &[f32] {
        &self.mtp_hidden
    }
}

/// `qwen35` model weights (memory-mapped) and hyperparameters.
pub struct Qwen35Model {
    file: Arc<GgufFile>,
    pub cfg: Qwen35Config,
    tok_embd: Linear,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: Linear,
    mtp: Option<MtpBlock>,
}

fn load_attn(
    f: &GgufFile,
    n: &dyn Fn(&str) -> String,
    c: &Qwen35Config,
    cache_layer: usize,
) -> Result<AttnWeights, ModelError> {
    let (e, hd) = (c.n_embd, c.head_dim);
    Ok(AttnWeights {
        wq_gate: Linear::load(f, &n("attn_q"), 2 * c.n_head * hd, e)?,
        wk: Linear::load(f, &n("attn_k"), c.n_head_kv * hd, e)?,
        wv: Linear::load(f, &n("attn_v"), c.n_head_kv * hd, e)?,
        wo: Linear::load(f, &n("attn_output"), e, c.n_head * hd)?,
        q_norm: load_vector(f, &n("attn_q_norm"), hd)?,
        k_norm: load_vector(f, &n("attn_k_norm"), hd)?,
        cache_layer,
    })
}

fn load_gdn(
    f: &GgufFile,
    i: usize,
    c: &Qwen35Config,
    state_layer: usize,
) -> Result<GdnWeights, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let e = c.n_embd;
    let g = c.gdn;
    let vd = g.n_v_heads * g.d_v;
    Ok(GdnWeights {
        wqkv: Linear::load(f, &n("attn_qkv"), c.conv_channels(), e)?,
        wgate: Linear::load(f, &n("attn_gate"), vd, e)?,
        walpha: Linear::load(f, &n("ssm_alpha"), g.n_v_heads, e)?,
        wbeta: Linear::load(f, &n("ssm_beta"), g.n_v_heads, e)?,
        conv: load_vector(f, &n("ssm_conv1d"), c.conv_channels() * c.conv_kernel)?,
        a: load_vector(f, &format!("blk.{i}.ssm_a"), g.n_v_heads)?,
        dt_bias: load_vector(f, &format!("blk.{i}.ssm_dt.bias"), g.n_v_heads)?,
        norm: load_vector(f, &n("ssm_norm"), g.d_v)?,
        wout: Linear::load(f, &n("ssm_out"), e, vd)?,
        state_layer,
    })
}

impl Qwen35Model {
    /// Binds every tensor of the `qwen35` graph by its GGUF name (`blk.{i}.attn_qkv.weight`,
    /// `blk.{i}.ssm_a`, `blk.{i}.attn_q.weight`, ...; see `tools/fixtures/README.md`).
    /// `output.weight` falls back to the tied embedding; the MTP block
    /// (`blk.{n_layer}.nextn.*`) is bound when `nextn_predict_layers > 0` and its tensors exist.
    ///
    /// Errors: missing tensors, wrong shapes, missing metadata.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let cfg = Qwen35Config::from_gguf(&file)?;
        let f = &*file;
        let e = cfg.n_embd;
        let tok_embd = Linear::load(f, "token_embd.weight", cfg.n_vocab, e)?;
        let (mut n_gdn, mut n_attn) = (0, 0);
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let kind = if cfg.recurrent[i] {
                n_gdn += 1;
                LayerKind::GatedDeltaNet(load_gdn(f, i, &cfg, n_gdn - 1)?)
            } else {
                n_attn += 1;
                LayerKind::Attention(load_attn(f, &n, &cfg, n_attn - 1)?)
            };
            layers.push(Layer {
                attn_norm: load_vector(f, &n("attn_norm"), e)?,
                kind,
                post_attn_norm: load_vector(f, &n("post_attention_norm"), e)?,
                mlp: Mlp::load(f, &n, e, cfg.n_ff)?,
            });
        }
        let output_norm = load_vector(f, "output_norm.weight", e)?;
        let output = match f.tensor_opt("output.weight") {
            Some(_) => Linear::load(f, "output.weight", cfg.n_vocab, e)?,
            None => tok_embd.clone(),
        };
        let mtp = MtpBlock::load(f, &cfg)?;
        Ok(Self {
            file,
            cfg,
            tok_embd,
            layers,
            output_norm,
            output,
            mtp,
        })
    }

    /// Whether the file carries the MTP block (bound at load).
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Parameter count (every bound tensor, MTP block included; tied output counted once).
    pub fn n_params(&self) -> u64 {
        fn layer_params(l: &Layer) -> usize {
            let mut n = l.attn_norm.len() + l.post_attn_norm.len() + l.mlp.numel();
            n += match &l.kind {
                LayerKind::Attention(a) => {
                    a.wq_gate.numel()
                        + a.wk.numel()
                        + a.wv.numel()
                        + a.wo.numel()
                        + a.q_norm.len()
                        + a.k_norm.len()
                }
                LayerKind::GatedDeltaNet(g) => {
                    g.wqkv.numel()
                        + g.wgate.numel()
                        + g.walpha.numel()
                        + g.wbeta.numel()
                        + g.conv.len()
                        + g.a.len()
                        + g.dt_bias.len()
                        + g.norm.len()
                        + g.wout.numel()
                }
            };
            n
        }
        let mut n = self.tok_embd.numel() + self.output_norm.len();
        n += self.layers.iter().map(layer_params).sum::<usize>();
        if self.output.name != self.tok_embd.name {
            n += self.output.numel();
        }
        if let Some(m) = &self.mtp {
            n += m.numel(layer_params(&m.layer));
        }
        n as u64
    }

    /// Per-sequence state for `n_ctx` positions: a KV cache of the attention layers only and
    /// a zeroed [`RecurrentState`] of the GDN layers (conv state `[K−1, conv_channels]`,
    /// delta-rule state `[n_v_heads, d_k, d_v]`).
    pub fn new_sequence_state(&self, n_ctx: usize) -> SequenceState {
        self.cfg.sequence_shape().new_state(n_ctx)
    }

    /// Buffers for micro-batches of up to `n_batch` tokens.
    pub fn new_scratch(&self, n_batch: usize) -> Scratch {
        let c = &self.cfg;
        let n = n_batch.max(1);
        let g = c.gdn;
        let (kd, vd) = (g.n_k_heads * g.d_k, g.n_v_heads * g.d_v);
        let (nq, nkv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        Scratch {
            n_batch: n,
            x: vec![0.0; n * c.n_embd],
            h: vec![0.0; n * c.n_embd],
            o: vec![0.0; n * c.n_embd],
            qkv: vec![0.0; n * c.conv_channels()],
            conv_out: vec![0.0; n * c.conv_channels()],
            z: vec![0.0; n * vd],
            alpha: vec![0.0; n * g.n_v_heads],
            beta: vec![0.0; n * g.n_v_heads],
            gq: vec![0.0; n * kd],
            gk: vec![0.0; n * kd],
            gv: vec![0.0; n * vd],
            gout: vec![0.0; n * vd],
            qg: vec![0.0; n * 2 * nq],
            q: vec![0.0; n * nq],
            gate: vec![0.0; n * nq],
            k: vec![0.0; n * nkv],
            v: vec![0.0; n * nkv],
            attn: vec![0.0; n * nq],
            ffn_gate: vec![0.0; n * c.n_ff],
            ffn_up: vec![0.0; n * c.n_ff],
            act: vec![0.0; n * c.n_ff],
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

    /// Makes every following pass with `scratch` keep (`on`) or not the output-normed hidden
    /// state of each of its positions ([`Scratch::hidden_rows`]; `n` RMSNorms per pass).
    pub fn set_hidden_rows(&self, scratch: &mut Scratch, on: bool) {
        scratch.keep_hidden_rows = on;
        scratch.n_rows = 0;
    }

    /// Makes every following pass with `scratch` keep the recurrent state after each of its
    /// last `k` tokens (`k = 0`: none), produced as `mode` says; see
    /// [`crate::state::rollback`]. Allocates `k` states per GDN layer.
    pub fn set_rollback(&self, scratch: &mut Scratch, k: usize, mode: RollbackPrefill) {
        let c = &self.cfg;
        scratch.rollback = (k > 0).then(|| {
            RollbackStates::new(
                k,
                c.n_gdn_layers(),
                (c.conv_kernel - 1) * c.conv_channels(),
                c.gdn.state_len(),
                mode,
            )
        });
    }

    /// Runs one micro-batch: `tokens` at positions `seq.len() .. seq.len() + tokens.len()`,
    /// appending the attention layers' keys and values to `seq.kv` and advancing the GDN
    /// layers' conv and delta-rule states in `seq.recurrent`. Returns the logits
    /// `[rows, n_vocab]` of the positions `outputs` asks for (`None` for [`Outputs::None`]);
    /// their output-normed hidden states are in [`Scratch::hidden`].
    ///
    /// Micro-batches of [`CHUNKED_MIN_TOKENS`] or more use the chunked GDN form, shorter ones
    /// the per-token recurrence. With rollback states on ([`Self::set_rollback`], `K`
    /// states), the state after each of the last `min(K, n)` tokens is also kept: a
    /// rollback-aware pass runs the first `n − K + 1` tokens chunked and the last `K − 1`
    /// per token; a per-token pass runs all `n` per token (Tandem §3.3).
    ///
    /// Errors: [`ModelError::BatchTooLarge`], [`ModelError::ContextFull`],
    /// [`ModelError::TokenOutOfRange`], [`ModelError::Invalid`] for an empty batch or a
    /// sequence state made for another model.
    pub fn forward<'s>(
        &self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        scratch: &'s mut Scratch,
        outputs: Outputs,
    ) -> Result<Option<&'s [f32]>, ModelError> {
        let c = &self.cfg;
        let n = tokens.len();
        let pos0 = seq.kv.len();
        scratch.rows = 0;
        scratch.n_rows = 0;
        if let Some(rb) = scratch.rollback.as_mut() {
            rb.clear();
        }
        if n == 0 {
            return Err(ModelError::Invalid("empty micro-batch".into()));
        }
        if n > scratch.n_batch {
            return Err(ModelError::BatchTooLarge {
                n,
                max: scratch.n_batch,
            });
        }
        if pos0 + n > seq.kv.n_ctx() {
            return Err(ModelError::ContextFull {
                needed: pos0 + n,
                n_ctx: seq.kv.n_ctx(),
            });
        }
        let SequenceState { kv, recurrent } = seq;
        let rec = match recurrent {
            Some(r) if r.n_layers() == c.n_gdn_layers() => r,
            _ => {
                return Err(ModelError::Invalid(
                    "sequence state has no recurrent state for this qwen35 model".into(),
                ))
            }
        };
        let bytes = self.file.bytes();
        let e = c.n_embd;
        let mut profile = scratch.profile.take();
        let mut laps = Laps::new(profile.as_mut());

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

        laps.lap("embedding");
        let s = scratch;
        for layer in &self.layers {
            ops::rms_norm(
                &s.x[..n * e],
                &layer.attn_norm,
                c.rms_eps,
                &mut s.h[..n * e],
            )
            .map_err(kernel("attn_norm"))?;
            laps.lap("norms + residuals");
            match &layer.kind {
                LayerKind::GatedDeltaNet(g) => {
                    self.gdn_block(pool, g, rec.layer_mut(g.state_layer), n, s, &mut laps)?
                }
                LayerKind::Attention(a) => {
                    self.attn_block(pool, a, kv, pos0, pos0, n, s, &mut laps)?
                }
            }
            ops::add_inplace(&mut s.x[..n * e], &s.o[..n * e]).map_err(kernel("residual"))?;

            // MLP block: down(silu(gate(h)) * up(h)).
            ops::rms_norm(
                &s.x[..n * e],
                &layer.post_attn_norm,
                c.rms_eps,
                &mut s.h[..n * e],
            )
            .map_err(kernel("post_attention_norm"))?;
            laps.lap("norms + residuals");
            let f = c.n_ff;
            let buf = MlpBuffers {
                gate: &mut s.ffn_gate[..n * f],
                up: &mut s.ffn_up[..n * f],
                act: &mut s.act[..n * f],
                out: &mut s.o[..n * e],
            };
            layer.mlp.forward(pool, bytes, &s.h[..n * e], n, buf)?;
            laps.lap("ffn (gate/up/down + swiglu)");
            ops::add_inplace(&mut s.x[..n * e], &s.o[..n * e]).map_err(kernel("residual"))?;
            laps.lap("norms + residuals");
        }
        kv.set_len(pos0 + n);
        if let Some(rb) = s.rollback.as_mut() {
            rb.record_pass(pos0, n);
        }
        s.profile = profile;
        if s.keep_hidden_rows {
            s.hidden_rows.resize(n * e, 0.0);
            for (x, h) in s.x[..n * e]
                .chunks_exact(e)
                .zip(s.hidden_rows.chunks_exact_mut(e))
            {
                ops::rms_norm(x, &self.output_norm, c.rms_eps, h).map_err(kernel("output_norm"))?;
            }
            s.n_rows = n;
        }
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

    /// Gated DeltaNet block on the normalised input `s.h` `[n, n_embd]`; writes `s.o`.
    ///
    /// `qkv = W_qkv h` → causal conv + SiLU (state in `st.conv`) → split `q | k | v` →
    /// L2-normalise `q`, `k` per head → `gate = ssm_a · softplus(alpha + dt_bias)`,
    /// `beta = sigmoid(W_beta h)` → delta rule (state in `st.ssm`) → per value head
    /// `rms_norm(o_h) · ssm_norm · silu(z_h)` → `W_out`. (HF `Qwen3_5GatedDeltaNet.forward`,
    /// llama.cpp `build_layer_attn_linear`.)
    fn gdn_block(
        &self,
        pool: &ThreadPool,
        w: &GdnWeights,
        st: &mut GdnLayerState,
        n: usize,
        s: &mut Scratch,
        laps: &mut Laps<'_>,
    ) -> Result<(), ModelError> {
        let c = &self.cfg;
        let bytes = self.file.bytes();
        let e = c.n_embd;
        let g = c.gdn;
        let ch = c.conv_channels();
        let (kd, vd, hv) = (g.n_k_heads * g.d_k, g.n_v_heads * g.d_v, g.n_v_heads);
        mm_shared(
            pool,
            bytes,
            &s.h[..n * e],
            n,
            &mut [
                (&w.wqkv, &mut s.qkv[..n * ch]),
                (&w.wgate, &mut s.z[..n * vd]),
                (&w.walpha, &mut s.alpha[..n * hv]),
                (&w.wbeta, &mut s.beta[..n * hv]),
            ],
        )?;
        laps.lap("gdn projections (qkv, z, alpha, beta)");
        let t_rb = Instant::now();
        let m = s.rollback.as_ref().map_or(0, |r| r.slots_for(n));
        if let Some(rb) = s.rollback.as_mut().filter(|_| m > 0) {
            let conv_len = rb.conv_len();
            conv_snapshots(
                &st.conv,
                &s.qkv[..n * ch],
                n,
                ch,
                m,
                &mut rb.layer_mut(w.state_layer).conv[..m * conv_len],
            );
        }
        let mut rb_ms = ms_since(t_rb);
        gdn::conv1d_silu_pooled(
            Some(pool),
            &s.qkv[..n * ch],
            n,
            ch,
            &w.conv,
            &mut st.conv,
            &mut s.conv_out[..n * ch],
        )
        .map_err(kernel("ssm_conv1d"))?;
        laps.lap("gdn conv1d + silu");
        {
            let (gq, gk) = (DisjointMut::new(&mut s.gq[..n * kd]), DisjointMut::new(&mut s.gk[..n * kd]));
            let gv = DisjointMut::new(&mut s.gv[..n * vd]);
            let (alpha, beta) = (DisjointMut::new(&mut s.alpha[..n * hv]), DisjointMut::new(&mut s.beta[..n * hv]));
            let conv_out = &s.conv_out[..n * ch];
            for_token_ranges(pool, n, &|r| {
                for t in r {
                    let row = &conv_out[t * ch..(t + 1) * ch];
                    let (q, rest) = row.split_at(kd);
                    let (k, v) = rest.split_at(kd);
                    // SAFETY: token t's rows; the ranges of the tasks are disjoint.
                    let (gq, gk, gv, alpha, beta) = unsafe {
                        (gq.chunk(t * kd, kd), gk.chunk(t * kd, kd), gv.chunk(t * vd, vd), alpha.chunk(t * hv, hv), beta.chunk(t * hv, hv))
                    };
                    l2_normalize_heads(q, g.d_k, gq);
                    l2_normalize_heads(k, g.d_k, gk);
                    gv.copy_from_slice(v);
                    for h in 0..hv {
                        alpha[h] = w.a[h] * softplus(alpha[h] + w.dt_bias[h]);
                        beta[h] = sigmoid(beta[h]);
                    }
                }
            });
        }
        laps.lap("gdn l2norm + gates");
        let (q, k, v) = (&s.gq[..n * kd], &s.gk[..n * kd], &s.gv[..n * vd]);
        let (gate, beta, out) = (&s.alpha[..n * hv], &s.beta[..n * hv], &mut s.gout[..n * vd]);
        let inputs = DeltaInputs {
            q,
            k,
            v,
            gate,
            beta,
        };
        match s.rollback.as_mut().filter(|_| m > 0) {
            None => delta_rule(pool, g, &inputs, 0..n, &mut st.ssm, out, None),
            Some(rb) => {
                let mode = rb.mode;
                let ssm_len = rb.ssm_len();
                let snaps = &mut rb.layer_mut(w.state_layer).ssm[..m * ssm_len];
                // Tokens before the snapshot region: chunked when long enough (aware), then
                // the state after token n − m is slot 0 and the per-token recurrence writes
                // slots 1..m.
                let head = n - m + 1;
                if mode == RollbackPrefill::Aware && head >= CHUNKED_MIN_TOKENS {
                    delta_rule(pool, g, &inputs, 0..head, &mut st.ssm, out, None)?;
                    let t = Instant::now();
                    snaps[..ssm_len].copy_from_slice(&st.ssm);
                    if m > 1 {
                        delta_rule(
                            pool,
                            g,
                            &inputs,
                            head..n,
                            &mut st.ssm,
                            out,
                            Some(&mut snaps[ssm_len..]),
                        )?;
                    }
                    rb_ms += ms_since(t);
                    Ok(())
                } else {
                    let t = Instant::now();
                    let r = delta_rule(pool, g, &inputs, 0..n, &mut st.ssm, out, Some(snaps));
                    rb_ms += ms_since(t);
                    r
                }
            }
        }?;
        s.rollback_ms += rb_ms;
        laps.lap("gdn delta rule (chunked / recurrent)");
        // Gated RMSNorm per value head (weights shared by all heads), into `gv` (free now).
        {
            let (gout, norm) = (&s.gout[..n * vd], &w.norm[..]);
            let (gv, z) = (DisjointMut::new(&mut s.gv[..n * vd]), DisjointMut::new(&mut s.z[..n * vd]));
            let failed = std::sync::Mutex::new(None);
            for_token_ranges(pool, n, &|r| {
                let (a, len) = (r.start * vd, r.len() * vd);
                // SAFETY: the rows of this task's tokens; the ranges are disjoint.
                let (gv, z) = unsafe { (gv.chunk(a, len), z.chunk(a, len)) };
                if let Err(e) = ops::rms_norm(&gout[a..a + len], norm, c.rms_eps, gv) {
                    *failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
                    return;
                }
                ops::silu_inplace(z);
                for (o, &zi) in gv.iter_mut().zip(z.iter()) {
                    *o *= zi;
                }
            });
            if let Some(e) = failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
                return Err(kernel("ssm_norm")(e));
            }
        }
        laps.lap("gdn gated norm");
        let r = mm(pool, &w.wout, bytes, &s.gv[..n * vd], n, &mut s.o[..n * e]);
        laps.lap("gdn out projection");
        r
    }

    /// Gated full-attention block on `s.h`; writes `s.o`. The `n` tokens are written to `kv`
    /// at cache indices `pos0..` and attend to indices `0..=pos0 + t`; RoPE rotates them to
    /// positions `rope0..` (the same as `pos0` for the main model; the MTP cache's indices
    /// are not positions). (HF `Qwen3_5Attention.forward`, llama.cpp `build_layer_attn`.)
    #[allow(clippy::too_many_arguments)]
    fn attn_block(
        &self,
        pool: &ThreadPool,
        a: &AttnWeights,
        kv: &mut KvCache,
        pos0: usize,
        rope0: usize,
        n: usize,
        s: &mut Scratch,
        laps: &mut Laps<'_>,
    ) -> Result<(), ModelError> {
        let c = &self.cfg;
        let bytes = self.file.bytes();
        let (e, hd) = (c.n_embd, c.head_dim);
        let (nq, nkv) = (c.n_head * hd, c.n_head_kv * hd);
        mm_shared(
            pool,
            bytes,
            &s.h[..n * e],
            n,
            &mut [
                (&a.wq_gate, &mut s.qg[..n * 2 * nq]),
                (&a.wk, &mut s.k[..n * nkv]),
                (&a.wv, &mut s.v[..n * nkv]),
            ],
        )?;
        laps.lap("attn projections (q+gate, k, v)");
        // De-interleave [q_h | gate_h] per head.
        for (i, pair) in s.qg[..n * 2 * nq].chunks_exact(2 * hd).enumerate() {
            s.q[i * hd..(i + 1) * hd].copy_from_slice(&pair[..hd]);
            s.gate[i * hd..(i + 1) * hd].copy_from_slice(&pair[hd..]);
        }
        // Per-head q/k RMSNorm (in place through a copy of each head).
        norm_heads(&mut s.q[..n * nq], &a.q_norm, c.rms_eps)?;
        norm_heads(&mut s.k[..n * nkv], &a.k_norm, c.rms_eps)?;
        for t in 0..n {
            let pos = (rope0 + t) as u32;
            ops::rope_neox(
                &mut s.q[t * nq..(t + 1) * nq],
                c.n_head,
                hd,
                c.n_rot,
                pos,
                c.rope_freq_base,
            )
            .map_err(kernel("rope q"))?;
            ops::rope_neox(
                &mut s.k[t * nkv..(t + 1) * nkv],
                c.n_head_kv,
                hd,
                c.n_rot,
                pos,
                c.rope_freq_base,
            )
            .map_err(kernel("rope k"))?;
        }
        laps.lap("attn q/k norm + rope");
        kv.write(a.cache_layer, pos0, n, &s.k[..n * nkv], &s.v[..n * nkv]);
        let shape = AttnShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: hd,
        };
        causal_attention(
            pool,
            kv,
            a.cache_layer,
            shape,
            pos0,
            n,
            &s.q[..n * nq],
            &mut s.attn[..n * nq],
        );
        laps.lap("attn kv write + attention");
        for (o, &gt) in s.attn[..n * nq].iter_mut().zip(&s.gate[..n * nq]) {
            *o *= sigmoid(gt);
        }
        let r = mm(pool, &a.wo, bytes, &s.attn[..n * nq], n, &mut s.o[..n * e]);
        laps.lap("attn gate + out projection");
        r
    }
}

/// The GDN inputs of one micro-batch (token-major, shapes of [`gdn::gdn_recurrent`]).
struct DeltaInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    gate: &'a [f32],
    beta: &'a [f32],
}

/// The gated delta rule over the tokens `range` of a micro-batch: chunked for
/// [`CHUNKED_MIN_TOKENS`] tokens or more (without snapshots), else per token; `out` is the
/// whole batch's output `[n, H·d_v]`.
fn delta_rule(
    pool: &ThreadPool,
    g: GdnShape,
    x: &DeltaInputs<'_>,
    range: std::ops::Range<usize>,
    ssm: &mut [f32],
    out: &mut [f32],
    snapshots: Option<&mut [f32]>,
) -> Result<(), ModelError> {
    let (kd, vd, hv) = (g.n_k_heads * g.d_k, g.n_v_heads * g.d_v, g.n_v_heads);
    let (a, b) = (range.start, range.end);
    let (q, k, v) = (
        &x.q[a * kd..b * kd],
        &x.k[a * kd..b * kd],
        &x.v[a * vd..b * vd],
    );
    let (gate, beta, out) = (
        &x.gate[a * hv..b * hv],
        &x.beta[a * hv..b * hv],
        &mut out[a * vd..b * vd],
    );
    if b - a >= CHUNKED_MIN_TOKENS && snapshots.is_none() {
        gdn::gdn_chunked_pooled(pool, g, q, k, v, gate, beta, ssm, out, gdn::DEFAULT_CHUNK)
    } else {
        gdn::gdn_recurrent_pooled(pool, g, q, k, v, gate, beta, ssm, out, snapshots)
    }
    .map_err(kernel("gated_delta_net"))
}

/// Conv states after each of the last `m` tokens of a batch, for rollback: with
/// `x_ext = conv_state ++ x` (`[K − 1 + n, ch]`), slot `i` (token `j = n − m + i`) is
/// `x_ext[j + 1 .. j + K]`, the layout of `conv_state`. `snaps` is `[m, (K − 1)·ch]`.
fn conv_snapshots(conv_state: &[f32], x: &[f32], n: usize, ch: usize, m: usize, snaps: &mut [f32]) {
    let hist = conv_state.len() / ch;
    let row = |r: usize| -> &[f32] {
        if r < hist {
            &conv_state[r * ch..][..ch]
        } else {
            &x[(r - hist) * ch..][..ch]
        }
    };
    for (i, slot) in snaps.chunks_exact_mut(hist * ch).enumerate() {
        let j = n - m + i;
        for (r, dst) in slot.chunks_exact_mut(ch).enumerate() {
            dst.copy_from_slice(row(j + 1 + r));
        }
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// RMSNorm of every `w.len()`-wide head of `x`, in place.
fn norm_heads(x: &mut [f32], w: &[f32], eps: f32) -> Result<(), ModelError> {
    let mut tmp = vec![0f32; w.len()];
    for head in x.chunks_exact_mut(w.len()) {
        ops::rms_norm(head, w, eps, &mut tmp).map_err(kernel("qk_norm"))?;
        head.copy_from_slice(&tmp);
    }
    Ok(())
}

/// `out_h = x_h / sqrt(Σ x_h² + ε)` for every `d`-wide head (HF `l2norm`, ε = [`L2_NORM_EPS`];
/// the sum in f64).
fn l2_normalize_heads(x: &[f32], d: usize, out: &mut [f32]) {
    for (xh, oh) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f64 = xh.iter().map(|&v| v as f64 * v as f64).sum();
        let inv = (1.0 / (ss + L2_NORM_EPS as f64).sqrt()) as f32;
        for (o, &v) in oh.iter_mut().zip(xh) {
            *o = v * inv;
        }
    }
}

/// `log(1 + e^x)`, linear above 20 (PyTorch `F.softplus` threshold; ggml `ggml_softplus`).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_norm_gives_unit_heads_and_softplus_matches_definition() {
        let x = [3.0f32, 4.0, 0.0, 1.0, 0.0, 0.0];
        let mut o = [0f32; 6];
        l2_normalize_heads(&x, 3, &mut o);
        assert!(
            (o[0] - 0.6).abs() < 1e-6 && (o[1] - 0.8).abs() < 1e-6 && (o[3] - 1.0).abs() < 1e-6
        );
        for v in [-5.0f32, 0.0, 2.0, 19.0] {
            assert!((softplus(v) - (1.0 + v.exp()).ln()).abs() < 1e-5);
        }
        assert_eq!(softplus(30.0), 30.0);
    }
}
