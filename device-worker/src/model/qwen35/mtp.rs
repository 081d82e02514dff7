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
//! ids, one per row), written by `tandem-tools draft-vocab`. The draft is the argmax over
//! the N rows, mapped back to its original id.

use dsp::pool::ThreadPool;

use super::{Layer, LayerIo, Mixer, Qwen35Config, Qwen35Model, Scratch};
use crate::model::blocks::{Attention, Ctx, Embedding, RmsNorm, RopePositions};
use crate::model::loader::Loader;
use crate::model::op_profile::Laps;
use crate::model::project::mm;
use crate::model::weights::Linear;
use crate::model::{ModelError, MtpHead, MtpPass};
use crate::state::mtp::MtpCache;
use gguf::reader::MetaValue;

/// The tool that adds a trimmed draft head to a GGUF (named in errors).
pub const DRAFT_VOCAB_TOOL: &str = "tandem-tools draft-vocab --model IN --out OUT";

/// The MTP block (`blk.{n_layer}.nextn.*` plus one full-attention decoder layer whose KV
/// lives in the slot's [`MtpCache`], cache layer 0).
pub(super) struct MtpBlock {
    eh_proj: Linear,
    enorm: RmsNorm,
    hnorm: RmsNorm,
    shared_head_norm: Option<RmsNorm>,
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
    pub(super) fn load(loader: &Loader<'_>, cfg: &Qwen35Config) -> Result<Option<Self>, ModelError> {
        let p = format!("blk.{}", cfg.n_layer);
        let (e, eps) = (cfg.n_embd, cfg.rms_eps);
        let nextn = |t: &str| format!("{p}.nextn.{t}");
        if cfg.n_nextn == 0 || !loader.has(&Loader::weight_name(&p, "nextn.eh_proj")) {
            return Ok(None);
        }
        let shared_head_norm = match loader.has(&Loader::weight_name(&p, "nextn.shared_head_norm")) {
            true => Some(RmsNorm::new(loader, &nextn("shared_head_norm"), e, eps)?),
            false => None,
        };
        // Its own KV cache: layer 0 of the slot's MtpCache.
        let attn = Attention::new(loader, &p, cfg.attention(), e, 0)?;
        Ok(Some(Self {
            eh_proj: loader.linear(&Loader::weight_name(&p, "nextn.eh_proj"), e, 2 * e)?,
            enorm: RmsNorm::new(loader, &nextn("enorm"), e, eps)?,
            hnorm: RmsNorm::new(loader, &nextn("hnorm"), e, eps)?,
            shared_head_norm,
            layer: Layer::new(loader, &p, cfg, Mixer::Attention(attn))?,
            draft: DraftHead::load(loader, cfg)?,
        }))
    }

    /// Weights in the block (the draft head included).
    pub(super) fn numel(&self, layer_params: usize) -> usize {
        self.eh_proj.numel()
            + self.enorm.len()
            + self.hnorm.len()
            + self.shared_head_norm.as_ref().map_or(0, RmsNorm::len)
            + layer_params
            + self.draft.as_ref().map_or(0, |d| d.output.numel())
    }

    /// Rows of the trimmed draft head, when present.
    pub(super) fn draft_rows(&self) -> Option<usize> {
        self.draft.as_ref().map(|d| d.ids.len())
    }

    /// The block's input rows `s.x[..n·e] = eh_proj · [enorm(embed(next_t)) ; hnorm(h_t)]`.
    ///
    /// Errors: [`ModelError::TokenOutOfRange`], kernel errors.
    fn input(
        &self,
        ctx: Ctx<'_>,
        tok_embd: &Embedding,
        hidden: &[f32],
        next: &[u32],
        s: &mut Scratch,
    ) -> Result<(), ModelError> {
        let (n, e) = (next.len(), self.enorm.len());
        s.mtp_cat.resize(n * 2 * e, 0.0);
        for t in 0..n {
            tok_embd.forward(ctx.bytes, &next[t..t + 1], &mut s.h[..e])?;
            let row = &mut s.mtp_cat[t * 2 * e..(t + 1) * 2 * e];
            let (re, rh) = row.split_at_mut(e);
            self.enorm.forward(&s.h[..e], re)?;
            self.hnorm.forward(&hidden[t * e..(t + 1) * e], rh)?;
        }
        mm(ctx.pool, &self.eh_proj, ctx.bytes, &s.mtp_cat, n, &mut s.x[..n * e])
    }
}

impl DraftHead {
    /// Binds `blk.{n_layer}.nextn.draft_output.weight` with the id list
    /// `{arch}.nextn_draft_token_ids` (`None` when the file has neither).
    ///
    /// Errors: see [`MtpBlock::load`].
    fn load(loader: &Loader<'_>, cfg: &Qwen35Config) -> Result<Option<Self>, ModelError> {
        let f = loader.file();
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
            output: loader.linear(&name, rows, cfg.n_embd)?,
            ids,
        }))
    }
}

impl Qwen35Model {
    /// One MTP pass over the `n = next.len()` rows of positions `pos0..pos0 + n` (module
    /// docs; [`MtpPass`]).
    /// The `n` entries are appended to `cache` (RoPE at their positions). The output hidden
    /// `o` of the last row is left in [`crate::model::CausalLm::mtp_hidden`]; with `head`,
    /// the last row's logits (`[n_vocab]` full, `[N]` trimmed) are returned.
    ///
    /// Errors: [`ModelError::Invalid`] without an MTP block, for a trimmed head the file
    /// lacks, mismatched lengths, or entries that cannot be appended (cache full, `pos0` not
    /// after the last entry); [`ModelError::BatchTooLarge`], [`ModelError::TokenOutOfRange`],
    /// kernel errors.
    pub(super) fn mtp_pass(
        &mut self,
        pool: &ThreadPool,
        cache: &mut MtpCache,
        pass: MtpPass<'_>,
    ) -> Result<Option<&[f32]>, ModelError> {
        let (pos0, hidden, next, head) = (pass.pos0, pass.hidden, pass.next, pass.head);
        let m = self
            .mtp
            .as_ref()
            .ok_or_else(|| ModelError::Invalid("the model has no MTP block".into()))?;
        let s = &mut self.scratch;
        let (n, e) = (next.len(), self.cfg.n_embd);
        check_mtp_pass(cache, pos0, hidden, n, e, s.n_batch)?;
        let draft_head = match head {
            Some(MtpHead::Trimmed) => Some(m.draft.as_ref().ok_or_else(|| {
                ModelError::Invalid(format!(
                    "the model has no trimmed draft head; add one with `{DRAFT_VOCAB_TOOL}`"
                ))
            })?),
            _ => None,
        };
        let ctx = Ctx {
            pool,
            bytes: self.file.bytes(),
        };
        s.mtp_hidden.resize(e, 0.0);
        m.input(ctx, &self.tok_embd, hidden, next, s)?;
        let idx0 = cache.n_entries();
        let mut io = LayerIo {
            kv: cache.kv_mut(),
            rec: None,
            pos0: idx0,
            rope: RopePositions::Linear(pos0),
        };
        m.layer.forward(ctx, &mut io, n, s, &mut Laps::new(None))?;
        cache.commit_entries(pos0, n);
        let norm = m.shared_head_norm.as_ref().unwrap_or(self.head.norm());
        norm.forward(&s.x[(n - 1) * e..n * e], &mut s.mtp_hidden[..e])?;
        let Some(head) = head else {
            return Ok(None);
        };
        let w = match (head, draft_head) {
            (MtpHead::Trimmed, Some(d)) => &d.output,
            _ => self.head.output(),
        };
        s.mtp_logits.resize(w.rows, 0.0);
        mm(pool, w, ctx.bytes, &s.mtp_hidden, 1, &mut s.mtp_logits)?;
        Ok(Some(&s.mtp_logits[..w.rows]))
    }

    /// The original token id of row `row` of the head `head` (the identity for the full head;
    /// the trimmed head's id list otherwise). `None` for a row outside the head.
    pub(super) fn mtp_row_id(&self, head: MtpHead, row: u32) -> Option<u32> {
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

/// The checks of an MTP pass of `n` rows at `pos0` with `hidden` `[n, e]`, before anything
/// runs.
///
/// Errors: [`ModelError::Invalid`] for mismatched lengths or entries that cannot be
/// appended; [`ModelError::BatchTooLarge`] over `max` rows.
fn check_mtp_pass(
    cache: &MtpCache,
    pos0: usize,
    hidden: &[f32],
    n: usize,
    e: usize,
    max: usize,
) -> Result<(), ModelError> {
    if n == 0 || hidden.len() != n * e {
        return Err(ModelError::Invalid(format!(
            "MTP pass: {n} tokens and {} hidden values (need n > 0 and n × {e})",
            hidden.len()
        )));
    }
    if n > max {
        return Err(ModelError::BatchTooLarge { n, max });
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
    Ok(())
}
