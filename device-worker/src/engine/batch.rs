//! The bracket around every batch (a prefill micro-batch, a decode step, a verification
//! pass): power votes re-applied before it if they were released, the watchdog told when it
//! starts and ends (Tandem §3.4; DESIGN.md "Idle power").

use std::time::Duration;

use dsp::pool::ThreadPool;

use super::actor::{Ctx, Instance};
use crate::error::WorkerError;

/// Before a batch: votes re-applied if released (the pool unparked, the wake-up latency
/// noted in `wake` for the request's first batch), the watchdog told; the fault hook may hang.
pub(super) fn begin(ctx: &Ctx, inst: &Instance, pool: &ThreadPool, wake: &mut Option<Duration>) {
    if let Some(latency) = ctx.idle.begin_batch() {
        pool.unpark();
        wake.get_or_insert(latency);
    }
    ctx.watchdog.batch_started(inst.id);
    if ctx.fault.should_hang() {
        tracing::warn!(
            engine = inst.id,
            "fault injection: this batch hangs until the watchdog abandons the engine"
        );
        while !inst.is_abandoned() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// After a batch. Errors: [`WorkerError::Abandoned`] when the watchdog gave up on this
/// engine meanwhile (the result is discarded; the controller was already reset).
pub(super) fn end(ctx: &Ctx, inst: &Instance) -> Result<(), WorkerError> {
    ctx.watchdog.batch_finished(inst.id);
    if inst.is_abandoned() {
        return Err(WorkerError::Abandoned);
    }
    ctx.idle.end_batch();
    Ok(())
}
