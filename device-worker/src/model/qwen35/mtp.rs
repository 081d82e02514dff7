//! Qwen3.5's multi-token-prediction ("nextn") block: loading and the forward pass that
//! speculative decoding drafts with (the `mtp` and `mtp-trimmed` drafters).
//!
//! For position `i`, with `h_i` the main model's hidden state AFTER the output norm and
//! `t_{i+1}` the token that follows:
//!
//! ```text
//! x_i = eh_proj · [ rms_norm(embed(t_{i+1}))·enorm ; rms_norm(h_i)·hnorm ]
//! y_i = decoder_layer(x_i)        (gated full attention over the MTP entries ≤ i, SwiGLU MLP)
//! o_i = rms_norm(y_i)·shared_head_norm   (the output norm when the file has none)
//! logits_i = W_out o_i            (the tied LM head; or the trimmed draft head)
//! ```
//!
//! References (read, not copied): llama.cpp `graph_mtp` in `src/models/qwen35.cpp` and vLLM
//! `qwen3_next_mtp.py` (`fc(cat(pre_fc_norm_embedding(e), pre_fc_norm_hidden(h)))`, one
//! decoder layer, `norm`, shared `lm_head`); the fixture's reference is
//! `tools/fixtures/make_qwen35_fixture.py::mtp_reference`.
//!
//! The trimmed draft head (`mtp-trimmed`): tensor `blk.{n_layer}.nextn.draft_output.weight`
//! (`ne0 = n_embd`, `ne1 = N`) and metadata `{arch}.nextn_draft_token_ids` (N original token
//! ids, one per row), written by `agent-gateway draft-vocab`. The draft is the argmax over
//! the N rows, mapped back to its original id.

use dsp::ops;
use dsp::pool::ThreadPool;

use super::{load_attn, Layer, LayerKind, Qwen35Config, Qwen35Model, Scratch};
use crate::error::ModelError;
use gguf::reader::{GgufFile, MetaValue};
use crate::model::op_profile::Laps;
use crate::model::project::{kernel, mm, Mlp, MlpBuffers};
use crate::model::weights::{load_vector, Linear};
use crate::model::MtpHead;
use crate::state::mtp::MtpCache;

/// The tool that adds a trimmed draft head to a GGUF (named in errors).
pub const DRAFT_VOCAB_TOOL: &str = "agent-gateway draft-vocab --model IN --out OUT";

/// The MTP block (`blk.{n_layer}.nextn.*` plus one full-attention decoder layer whose KV
/// lives in the slot's [`MtpCache`], cache layer 0).
pub(super) struct MtpBlock {
    eh_proj: Linear,
    enorm: Vec<f32>,
    hnorm: Vec<f32>,
    shared_head_norm: Option<Vec<f32>>,
    pub(super) layer: Layer,
    /// The trimmed draft head, when the file has one.
    draft: Option<DraftHead>,
}

/// A draft output matrix over N rows of the vocabulary and the original id of each row.
struct DraftHead {
    output: Linear,
    ids: Vec<u32>,
}

impl MtpBlock {
    /// Binds the block of layer `il = cfg.n_layer` when `nextn_predict_layers > 0` and
    /// `blk.{il}.nextn.eh_proj.weight` exists (`None` otherwise), with the trimmed draft head
    /// when present.
    ///
    /// Errors: missing or misshapen tensors of a block that is present; a draft head with
    /// only one of its tensor and id list, ids of another length than its rows, or ids
    /// outside the vocabulary ([`ModelError::Invalid`] naming [`DRAFT_VOCAB_TOOL`]).
    pub(super) fn load(f: &GgufFile, cfg: &Qwen35Config) -> Result<Option<Self>, ModelError> {
        let il = cfg.n_layer;
        let e = cfg.n_embd;
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        if cfg.n_nextn == 0 || f.tensor_opt(&n("nextn.eh_proj")).is_none() {
            return Ok(None);
        }
        let shared_head_norm = match f.tensor_opt(&n("nextn.shared_head_norm")) {
            Some(_) => Some(load_vector(f, &n("nextn.shared_head_norm"), e)?),
            None => None,
        };
        Ok(Some(Self {
            eh_proj: Linear::load(f, &n("nextn.eh_proj"), e, 2 * e)?,
            enorm: load_vector(f, &n("nextn.enorm"), e)?,
            hnorm: load_vector(f, &n("nextn.hnorm"), e)?,
            shared_head_norm,
            layer: Layer {
                attn_norm: load_vector(f, &n("attn_norm"), e)?,
                // Its own KV cache: layer 0 of the slot's MtpCache.
                kind: LayerKind::Attention(load_attn(f, &n, cfg, 0)?),
                post_attn_norm: load_vector(f, &n("post_attention_norm"), e)?,
                mlp: Mlp::load(f, &n, e, cfg.n_ff)?,
            },
            draft: DraftHead::load(f, cfg)?,
        }))
    }

    /// Weights in the block (the draft head included).
    pub(super) fn numel(&self, layer_params: usize) -> usize {
        self.eh_proj.numel()
            + self.enorm.len()
            + self.hnorm.len()
            + self.shared_head_norm.as_ref().map_or(0, Vec::len)
            + layer_params
            + self.draft.as_ref().map_or(0, |d| d.output.numel())
    }

    /// Rows of the trimmed draft head, when present.
    pub(super) fn draft_rows(&self) -> Option<usize> {
        self.draft.as_ref().map(|d| d.ids.len())
    }
}

impl DraftHead {
    fn load(f: &GgufFile, cfg: &Qwen35Config) -> Result<Option<Self>, ModelError> {
        let name = format!("blk.{}.nextn.draft_output.weight", cfg.n_layer);
        let key = format!("{}.nextn_draft_token_ids", f.architecture()?);
        let (tensor, ids) = (f.tensor_opt(&name), f.get(&key));
        let bad = |what: String| {
            ModelError::Invalid(format!(
                "trimmed draft head: {what}; rewrite the file with `{DRAFT_VOCAB_TOOL}`"
            ))
        };
        let (tensor, ids) = match (tensor, ids) {
            (None, None) => return Ok(None),
            (Some(_), None) => return Err(bad(format!("{name} is present but {key} is not"))),
            (None, Some(_)) => return Err(bad(format!("{key} is present but {name} is not"))),
            (Some(t), Some(v)) => (t, v),
        };
        let MetaValue::Array(items) = ids else {
            return Err(bad(format!(
                "{key} is {}, expected an array of u32",
                ids.type_name()
            )));
        };
        let ids = items
            .iter()
            .map(|v| {
                v.as_integer()
                    .filter(|&i| i >= 0 && (i as usize) < cfg.n_vocab)
                    .map(|i| i as u32)
                    .ok_or_else(|| {
                        bad(format!(
                            "{key} holds {v:?}, not a token id below {}",
                            cfg.n_vocab
                        ))
                    })
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let rows = tensor.dims.get(1).copied().unwrap_or(1) as usize;
        if ids.len() != rows || rows == 0 {
            return Err(bad(format!(
                "{key} has {} ids, {name} has {rows} rows",
                ids.len()
            )));
        }
        Ok(Some(Self {
            output: Linear::load(f, &name, rows, cfg.n_embd)?,
            ids,
        }))
    }
}

impl Qwen35Model {
    /// Rows of the trimmed draft head (`None`: the file has none, or no MTP block).
    pub fn mtp_draft_rows(&self) -> Option<usize> {
        self.mtp.as_ref().and_then(MtpBlock::draft_rows)
    }

    /// An empty [`MtpCache`] for `n_ctx` entries (`None` without an MTP block).
    pub fn new_mtp_cache(&self, n_ctx: usize) -> Option<MtpCache> {
        let c = &self.cfg;
        self.mtp
            .as_ref()
            .map(|_| MtpCache::new(c.n_head_kv, c.head_dim, n_ctx, c.n_embd))
    }

    /// One MTP pass over `n = next.len()` rows for positions `pos0..pos0 + n` (module docs):
    /// `hidden` `[n, n_embd]` are the rows' input hidden states (target `h_i`, or the MTP
    /// block's own output for recursive draft steps), `next` the token after each position.
    /// The `n` entries are appended to `cache` (RoPE at their positions). The output hidden
    /// `o` of the last row is left in [`Scratch::mtp_hidden`]; with `head`, the last row's
    /// logits (`[n_vocab]` full, `[N]` trimmed) are returned.
    ///
    /// Errors: [`ModelError::Invalid`] without an MTP block, for a trimmed head the file
    /// lacks, mismatched lengths, or entries that cannot be appended (cache full, `pos0` not
    /// after the last entry); [`ModelError::BatchTooLarge`], [`ModelError::TokenOutOfRange`],
    /// kernel errors.
    #[allow(clippy::too_many_arguments)]
    pub fn mtp_forward<'s>(
        &self,
        pool: &ThreadPool,
        cache: &mut MtpCache,
        pos0: usize,
        hidden: &[f32],
        next: &[u32],
        scratch: &'s mut Scratch,
        head: Option<MtpHead>,
    ) -> Result<Option<&'s [f32]>, ModelError> {
        let c = &self.cfg;
        let m = self
            .mtp
            .as_ref()
            .ok_or_else(|| ModelError::Invalid("the model has no MTP block".into()))?;
        let (n, e) = (next.len(), c.n_embd);
        if n == 0 || hidden.len() != n * e {
            return Err(ModelError::Invalid(format!(
                "MTP pass: {n} tokens and {} hidden values (need n > 0 and n × {e})",
                hidden.len()
            )));
        }
        if n > scratch.n_batch {
            return Err(ModelError::BatchTooLarge {
                n,
                max: scratch.n_batch,
            });
        }
        if !cache.can_append(pos0, n) {
            return Err(ModelError::Invalid(format!(
                "MTP pass at positions {pos0}..{}: the MTP cache holds {} of {} entries, the last at {:?}",
                pos0 + n,
                cache.n_entries(),
                cache.n_ctx(),
                cache.positions().last()
            )));
        }
        let draft_head = match head {
            Some(MtpHead::Trimmed) => Some(m.draft.as_ref().ok_or_else(|| {
                ModelError::Invalid(format!(
                    "the model has no trimmed draft head; add one with `{DRAFT_VOCAB_TOOL}`"
                ))
            })?),
            _ => None,
        };
        let bytes = self.file.bytes();
        let s = scratch;
        s.mtp_cat.resize(n * 2 * e, 0.0);
        s.mtp_hidden.resize(e, 0.0);
        // [enorm(embed(t_{i+1})) ; hnorm(h_i)] per row.
        for (t, &id) in next.iter().enumerate() {
            if id as usize >= c.n_vocab {
                return Err(ModelError::TokenOutOfRange {
                    id,
                    n_vocab: c.n_vocab,
                });
            }
            dsp::quant::dequantize_row(
                self.tok_embd.ty,
                self.tok_embd.row_bytes(bytes, id as usize),
                &mut s.h[..e],
            )
            .map_err(kernel("nextn embedding"))?;
            let row = &mut s.mtp_cat[t * 2 * e..(t + 1) * 2 * e];
            let (re, rh) = row.split_at_mut(e);
            ops::rms_norm(&s.h[..e], &m.enorm, c.rms_eps, re).map_err(kernel("nextn.enorm"))?;
            ops::rms_norm(&hidden[t * e..(t + 1) * e], &m.hnorm, c.rms_eps, rh)
                .map_err(kernel("nextn.hnorm"))?;
        }
        mm(pool, &m.eh_proj, bytes, &s.mtp_cat, n, &mut s.x[..n * e])?;

        let layer = &m.layer;
        let LayerKind::Attention(a) = &layer.kind else {
            return Err(ModelError::Invalid(
                "the MTP layer is not an attention layer".into(),
            ));
        };
        let mut laps = Laps::new(None);
        ops::rms_norm(
            &s.x[..n * e],
            &layer.attn_norm,
            c.rms_eps,
            &mut s.h[..n * e],
        )
        .map_err(kernel("nextn attn_norm"))?;
        let idx0 = cache.n_entries();
        self.attn_block(pool, a, cache.kv_mut(), idx0, pos0, n, s, &mut laps)?;
        cache.commit_entries(pos0, n);
        ops::add_inplace(&mut s.x[..n * e], &s.o[..n * e]).map_err(kernel("residual"))?;
        ops::rms_norm(
            &s.x[..n * e],
            &layer.post_attn_norm,
            c.rms_eps,
            &mut s.h[..n * e],
        )
        .map_err(kernel("nextn post_attention_norm"))?;
        let f = c.n_ff;
        let buf = MlpBuffers {
            gate: &mut s.ffn_gate[..n * f],
            up: &mut s.ffn_up[..n * f],
            act: &mut s.act[..n * f],
            out: &mut s.o[..n * e],
        };
        layer.mlp.forward(pool, bytes, &s.h[..n * e], n, buf)?;
        ops::add_inplace(&mut s.x[..n * e], &s.o[..n * e]).map_err(kernel("residual"))?;

        let norm = m.shared_head_norm.as_deref().unwrap_or(&self.output_norm);
        ops::rms_norm(
            &s.x[(n - 1) * e..n * e],
            norm,
            c.rms_eps,
            &mut s.mtp_hidden[..e],
        )
        .map_err(kernel("nextn.shared_head_norm"))?;
        let Some(head) = head else {
            return Ok(None);
        };
        let w = match (head, draft_head) {
            (MtpHead::Trimmed, Some(d)) => &d.output,
            _ => &self.output,
        };
        s.mtp_logits.resize(w.rows, 0.0);
        mm(pool, w, bytes, &s.mtp_hidden, 1, &mut s.mtp_logits)?;
        Ok(Some(&s.mtp_logits[..w.rows]))
    }

    /// The original token id of row `row` of the head `head` (the identity for the full head;
    /// the trimmed head's id list otherwise). `None` for a row outside the head.
    pub fn mtp_token_id(&self, head: MtpHead, row: u32) -> Option<u32> {
        match head {
            MtpHead::Full => ((row as usize) < self.cfg.n_vocab).then_some(row),
            MtpHead::Trimmed => self
                .mtp
                .as_ref()
                .and_then(|m| m.draft.as_ref())
                .and_then(|d| d.ids.get(row as usize).copied()),
        }
    }
}
