//! One request through the engine, in stages (DESIGN.md "Request path of one step", 4):
//! admission (the handler's, `engine/admission.rs`) → [`restore`] (slot, plan, checkpoint or
//! prompt-cache restore) → [`encode`] (the images past the resume point, from the image cache
//! or the projector) → [`prefill`] (the planned batches) → [`decode`] (plain steps, or
//! speculative rounds of draft → verify → accept → rollback) → [`finish`] (final stats).
//! A request whose client went away stops at the next batch or token; its slot keeps only
//! what was fully computed.

mod decode;
mod encode;
mod finish;
mod prefill;
mod restore;

use std::time::{Duration, Instant};

use dsp::pool::ThreadPool;

use super::actor::{Ctx, Instance};
use super::admission::Admission;
use super::batch;
use super::compute::Compute;
use super::request::EngineRequest;
use crate::error::WorkerError;
use crate::speculative::Speculator;

/// What every stage of one request shares: the engine's context, its own batch bracket, and
/// the request's timing.
pub(super) struct StepEnv<'a> {
    ctx: &'a Ctx,
    inst: &'a Instance,
    /// When the engine took the request off its queue.
    t_start: Instant,
    /// Milliseconds the request waited in the queue.
    queue_ms: f64,
    /// Whether the model had to be reloaded for it (a cold start after an idle unload).
    cold_start: bool,
    /// Wake-up latency paid by the request's first batch after a power release.
    wake: Option<Duration>,
    /// Model passes so far (prefill batches, then decode passes).
    passes: u32,
}

impl StepEnv<'_> {
    /// Before a model pass: votes re-applied, the watchdog told ([`batch::begin`]).
    fn begin_batch(&mut self, pool: &ThreadPool) {
        batch::begin(self.ctx, self.inst, pool, &mut self.wake);
    }

    /// After a model pass (counted in [`StepEnv::passes`]).
    ///
    /// Errors: [`WorkerError::Abandoned`] when the watchdog gave up on this engine meanwhile
    /// (the pass's result is then discarded).
    fn end_batch(&mut self) -> Result<(), WorkerError> {
        batch::end(self.ctx, self.inst)?;
        self.passes += 1;
        Ok(())
    }
}

/// Runs one admitted request to completion (or cancellation), streaming its events.
/// `logits` holds the last pass's logits rows between the stages.
///
/// Errors: a failed pass or restore (the slot is reset), a grammar error, a watchdog
/// abandonment; a cancelled request is `Ok`.
#[allow(clippy::too_many_arguments)]
pub(super) fn serve(
    ctx: &Ctx,
    inst: &Instance,
    c: &mut Compute,
    admission: &Admission,
    spec: Option<&mut Speculator>,
    logits: &mut Vec<f32>,
    mut req: EngineRequest,
    (t_start, cold_start): (Instant, bool),
) -> Result<(), WorkerError> {
    let mut env = StepEnv {
        ctx,
        inst,
        t_start,
        queue_ms: ms(t_start - req.enqueued_at),
        cold_start,
        wake: None,
        passes: 0,
    };
    // The shared prompt cache is lent to the request's slot (restore) and taken back
    // whatever way the request ends.
    let out = (|| {
        let restored = restore::run(c, &req)?;
        let encoded = encode::run(c, &req, restored.plan.resume)?;
        let Some(prefilled) = prefill::run(&mut env, c, &restored, &req, &encoded, logits)? else {
            return Ok(());
        };
        // Drafts are token ids: a prompt with images (whose tokens are no vocabulary ids)
        // decodes plainly.
        let spec = spec.filter(|_| {
            req.sampling == crate::sampling::SamplingMode::Greedy && req.images.is_empty()
        });
        let decoded =
            decode::run(&mut env, c, admission, spec, &restored, &prefilled, &mut req, logits)?;
        finish::run(&env, c, &restored, &prefilled, decoded, &req);
        Ok(())
    })();
    c.return_prompt_cache();
    if !req.images.is_empty() {
        // The next request brings its own images (or none).
        c.model.set_images(None)?;
    }
    out
}

/// Milliseconds of `d`.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
