//! Stage 4, finish: the slot's checkpoint bookkeeping closed (evictions, the planner's
//! metadata advanced), the request's final stats and log line, the `Done` event.

use tandem_proto::step::v1 as pb;

use super::super::compute::Compute;
use super::super::request::{EngineEvent, EngineRequest};
use super::decode::{Decoded, Stop};
use super::prefill::Prefilled;
use super::restore::Restored;
use super::{ms, StepEnv};

/// Closes the request: the plan's evictions and metadata update on the slot (also for a
/// cancelled request, whose slot keeps what was computed), then — when it finished — the
/// final stats.
pub(super) fn run(
    env: &StepEnv<'_>,
    c: &mut Compute,
    restored: &Restored,
    prefilled: &Prefilled,
    decoded: Decoded,
    req: &EngineRequest,
) {
    let (si, plan) = (restored.slot, &restored.plan);
    let n_out = decoded.out.len() as u32;
    let slot = &mut c.slots[si];
    let events = slot.cache.finish(&c.plan_cfg, plan, &slot.tokens);
    let Stop::Finished(reason) = decoded.stop else {
        tracing::info!(slot = si, n_out, "client gone during decode; request cancelled");
        return;
    };
    let (n_prompt, reused) = (req.prompt.len(), plan.resume);
    let (prefill_ms, decode_ms) = (prefilled.prefill_ms, decoded.decode_ms);
    let done = pb::FinalStats {
        finish_reason: reason as i32,
        prompt_tokens: n_prompt as u32,
        reused_tokens: reused as u32,
        new_tokens: (n_prompt - reused) as u32,
        decode_tokens: n_out,
        passes: env.passes,
        queue_ms: env.queue_ms,
        prefill_ms,
        decode_ms,
        server_ms: ms(env.t_start.elapsed()),
        ms_per_token: if n_out > 0 {
            decode_ms / n_out as f64
        } else {
            0.0
        },
        text: decoded.text,
        kv_bound_tokens: plan.kv_bound as u32,
        cold_start: env.cold_start,
        wake_ms: env.wake.map_or(0.0, ms),
        checkpoints_saved: events.saved,
        checkpoints_restored: events.restored,
        checkpoints_evicted: events.evicted,
        checkpoint_bytes_held: events.bytes_held,
        cache_policy: c.plan_cfg.policy.name().into(),
        decode_passes: decoded.decode_passes,
        drafts: decoded.tally.into_stats(),
        rollback_ms: prefilled.rollback_ms,
    };
    tracing::info!(
        slot = si,
        session = %req.session_id,
        prompt = n_prompt,
        reused,
        out = n_out,
        prefill_ms = format!("{prefill_ms:.1}"),
        decode_ms = format!("{decode_ms:.1}"),
        reason = ?reason,
        cold_start = env.cold_start,
        "request done"
    );
    let _ = req.events.blocking_send(EngineEvent::Done(done));
}
