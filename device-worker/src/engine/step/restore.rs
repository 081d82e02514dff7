//! Stage 1, restore: the slot for the request's session, the plan of what it processes
//! (the planner, `state/planner/`), and the slot's state moved to the plan's resume point
//! (the live state, a checkpoint, a prompt-cache entry, or nothing).

use super::super::compute::Compute;
use super::super::request::EngineRequest;
use crate::error::WorkerError;
use crate::state::planner::{self, Plan, PlanRequest};
use crate::state::slot::{choose_slot, common_prefix};
use tandem_telemetry::metric_names as names;

/// The request's slot and plan, the slot resumed at `plan.resume`.
pub(super) struct Restored {
    /// Index of the slot in `Compute::slots`.
    pub slot: usize,
    pub plan: Plan,
}

/// Chooses the slot, plans the request and restores what the plan resumes from; the slot's
/// tokens are then the prompt's first `plan.resume`.
///
/// Errors: [`WorkerError::Internal`] when the slot's saved states do not match the plan (the
/// slot is reset).
pub(super) fn run(c: &mut Compute, req: &EngineRequest) -> Result<Restored, WorkerError> {
    let choice = choose_slot(&c.slots, &req.session_id, &req.prompt);
    let si = choice.slot;
    c.lend_prompt_cache(si);
    if let Some(evicted) = choice.evicted.filter(|s| !s.is_empty()) {
        // Every slot is bound: the least recently used episode loses its slot; what it
        // cached moves to the prompt cache (kept while the cache's byte limit allows).
        metrics::counter!(names::WORKER_SLOT_EVICTIONS_TOTAL).increment(1);
        c.live_evictions += 1;
        tracing::info!(slot = si, evicted = %evicted, session = %req.session_id, "live session evicted from its slot");
        if c.plan_cfg.prompt_cache_bytes > 0 {
            let slot = &mut c.slots[si];
            if let Err(e) = slot.cache.stash(&c.plan_cfg, &mut slot.seq) {
                tracing::warn!(error = %e, "evicted slot not stashed");
            }
            slot.reset();
        }
    }
    if c.slots[si].session_id != req.session_id || req.session_id.is_empty() {
        let copied = c.share_prefix(si, &req.prompt);
        if copied > 0 {
            tracing::debug!(slot = si, tokens = copied, "shared prefix copied into the prompt cache");
        }
    }
    let next_use = c.slots.iter().map(|s| s.last_used).max().unwrap_or(0) + 1;
    c.slots[si].touch(&req.session_id, next_use);
    // Cross-request reuse: the planner decides where processing resumes, the batches, and
    // the checkpoints saved and evicted; the slot's cache executes exactly that.
    let plan = planner::plan(
        &c.slots[si].cache.meta,
        &PlanRequest {
            prompt: &req.prompt,
            last_user_start: req.last_user_start,
            image_start: req.images.first().map(|i| i.start),
            image_end: req.images.last().map(|i| i.start + i.image.n_tokens),
            line_starts: &req.line_starts,
            section_starts: &req.section_starts,
        },
        &c.plan_cfg,
    );
    let slot = &mut c.slots[si];
    // MTP entries depend only on the tokens up to their next one: those of the prefix this
    // slot's tokens share with the prompt stay valid whatever state the plan resumes from
    // (a checkpoint, the prompt cache).
    let mtp_keep = common_prefix(&slot.tokens, &req.prompt);
    if let Err(e) = slot.cache.begin(&plan, &mut slot.seq) {
        slot.reset();
        return Err(WorkerError::Internal(e.to_string()));
    }
    slot.tokens.clear();
    slot.tokens.extend_from_slice(&req.prompt[..plan.resume]);
    if let Some(m) = slot.mtp.as_mut() {
        m.truncate(mtp_keep.min(plan.resume));
    }
    if let Some(r) = plan.restored {
        tracing::debug!(slot = si, pos = r, "checkpoint restored");
    }
    Ok(Restored { slot: si, plan })
}
