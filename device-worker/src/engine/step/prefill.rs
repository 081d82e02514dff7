//! Stage 2, prefill: the prompt's new tokens, batch by batch as planned, each batch's end
//! state saved where the plan says (a checkpoint), the MTP cache filled when an MTP drafter
//! is on.

use tandem_proto::step::v1 as pb;

use super::super::compute::Compute;
use super::super::request::{EngineEvent, EngineRequest};
use super::encode::Encoded;
use super::restore::Restored;
use super::{ms, StepEnv};
use crate::error::WorkerError;
use crate::speculative::mtp::fill_with_model;

/// What decoding starts from.
pub(super) struct Prefilled {
    pub prefill_ms: f64,
    /// Milliseconds the passes spent writing rollback states.
    pub rollback_ms: f64,
    /// The output-normed hidden state `[n_embd]` of the last prompt token.
    pub prompt_hidden: Vec<f32>,
}

/// Runs the plan's batches and reports [`pb::PrefillStats`]; the last batch's logits land in
/// `logits`. `None` when the client went away (before a batch, or before the stats could be
/// sent): the slot keeps the batches that completed, and its metadata says so.
///
/// Errors: a failed pass (the slot is reset), a watchdog abandonment.
pub(super) fn run(
    env: &mut StepEnv<'_>,
    c: &mut Compute,
    restored: &Restored,
    req: &EngineRequest,
    encoded: &Encoded,
    logits: &mut Vec<f32>,
) -> Result<Option<Prefilled>, WorkerError> {
    let (si, plan) = (restored.slot, &restored.plan);
    let n_prompt = req.prompt.len();
    for b in &plan.batches {
        if req.events.is_closed() {
            tracing::info!(slot = si, pos = b.start, "client gone during prefill; request cancelled");
            let slot = &mut c.slots[si];
            slot.cache.finish(&c.plan_cfg, plan, &slot.tokens);
            return Ok(None);
        }
        let tokens = &req.prompt[b.start..b.end];
        let last = b.end == n_prompt;
        let Compute { model, pool, slots, .. } = c;
        let slot = &mut slots[si];
        if plan.end_state == Some(b.start) {
            // The end-of-prompt state is where this (one-token) batch starts: the live state.
            slot.cache.save(&slot.seq);
        }
        env.begin_batch(pool);
        let out = model.forward(pool, &mut slot.seq, tokens, last);
        env.end_batch()?;
        match out {
            Ok(Some(l)) => {
                logits.clear();
                logits.extend_from_slice(l);
            }
            Ok(None) => {}
            Err(e) => {
                slot.reset();
                return Err(e.into());
            }
        }
        if let Some(e) = plan.end_state.filter(|&e| last && e > b.start) {
            // From the rollback states this batch already wrote: no extra pass.
            match model.rollback_checkpoint(pool, &slot.seq, e) {
                Ok(Some(cp)) => slot.cache.keep(cp),
                Ok(None) => {}
                Err(err) => tracing::warn!(error = %err, "end-of-prompt state not saved"),
            }
        }
        slot.tokens.extend_from_slice(tokens);
        // The MTP block embeds the next token of each position: none for image tokens.
        if let Some(m) = slot.mtp.as_mut().filter(|_| req.images.is_empty()) {
            m.push_hidden(b.start, model.hidden_rows());
            if let Err(e) = fill_with_model(model, pool, m, &slot.tokens) {
                tracing::warn!(error = %e, "MTP entries not filled (MTP cache reset)");
            }
        }
        if b.save {
            slot.cache.save(&slot.seq);
        }
    }
    let prefilled = Prefilled {
        prefill_ms: ms(env.t_start.elapsed()),
        rollback_ms: c.model.take_rollback_ms(),
        prompt_hidden: c.model.hidden().to_vec(),
    };
    let stats = pb::PrefillStats {
        slot_id: c.slots[si].id,
        prompt_tokens: n_prompt as u32,
        reused_tokens: plan.resume as u32,
        new_tokens: (n_prompt - plan.resume) as u32,
        passes: env.passes,
        queue_ms: env.queue_ms,
        prefill_ms: prefilled.prefill_ms,
        image_tokens: encoded.image_tokens,
        images_encoded: encoded.encoded,
        image_cache_hits: encoded.cache_hits,
        encoder_ms: encoded.encoder_ms,
    };
    if req.events.blocking_send(EngineEvent::Prefill(stats)).is_err() {
        // The slot's state now holds the whole prompt: its metadata must say so, or the next
        // request's plan would not match the saved states.
        let slot = &mut c.slots[si];
        slot.cache.finish(&c.plan_cfg, plan, &slot.tokens);
        return Ok(None);
    }
    Ok(Some(prefilled))
}
