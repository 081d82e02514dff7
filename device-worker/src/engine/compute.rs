//! What the engine computes with — the model, its thread pool, the slots and the activation
//! buffers — built at load and dropped whole by an idle unload.

use std::sync::Arc;

use dsp::pool::ThreadPool;
use gguf::reader::GgufFile;

use crate::config::EngineSettings;
use crate::error::WorkerError;
use crate::model::vision::Projector;
use crate::model::Model;
use crate::state::planner::PlanConfig;
use crate::state::slot::Slot;

/// Model (with its activation buffers), slots and pool: what an unload drops.
pub(super) struct Compute {
    pub model: Model,
    pub pool: ThreadPool,
    pub slots: Vec<Slot>,
    /// Context length per slot (`--ctx-size` capped by the model's training context).
    pub n_ctx: usize,
    /// The checkpoint planner's configuration for this model (policy and limits from the
    /// settings, state sizes from the model).
    pub plan_cfg: PlanConfig,
    /// The vision projector (`--mmproj`), checked against the model's hidden size; `None`
    /// for a text-only worker (images get [`crate::model::vision::VisionError::NoProjector`]).
    // Read by the image encoder (issue 19, item 2); loading it now fails a bad --mmproj at
    // startup.
    #[allow(dead_code)]
    pub projector: Option<Arc<Projector>>,
}

impl Compute {
    /// Binds the weights of `file`, starts the pool, allocates the slots and buffers.
    ///
    /// Errors: the model's load errors; the projector's ([`WorkerError::Vision`]: a file
    /// that is no `qwen3vl_merger` projector or does not fit the model);
    /// [`WorkerError::Internal`] when the pool cannot start.
    pub fn load(cfg: &EngineSettings, file: Arc<GgufFile>) -> Result<Self, WorkerError> {
        let mut model = Model::load(file)?;
        let projector = match &cfg.vision {
            Some(v) => Some(Arc::new(Projector::open(&v.mmproj, model.n_embd())?)),
            None => None,
        };
        let n_ctx = cfg.ctx_size.min(model.n_ctx_train()).max(16);
        let pool = ThreadPool::new(cfg.threads)
            .map_err(|e| WorkerError::Internal(format!("thread pool: {e}")))?;
        // MTP drafters: each slot keeps the MTP block's KV cache beside its sequence, and
        // every pass hands over the hidden state of each position it computed.
        let mtp = cfg.speculative.as_ref().is_some_and(|s| s.uses_mtp()) && model.has_mtp();
        let slots: Vec<Slot> = (0..cfg.slots as u32)
            .map(|i| {
                let mut slot = Slot::new(i, model.new_sequence_state(n_ctx));
                slot.mtp = model.new_mtp_cache(n_ctx).filter(|_| mtp);
                slot
            })
            .collect();
        let n_batch = cfg.micro_batch.clamp(1, n_ctx);
        // A verification pass (1 + n_draft tokens) is one pass whatever the prefill
        // micro-batch: the buffers hold at least that many rows.
        let rows = cfg.speculative.as_ref().map_or(n_batch, |s| n_batch.max(s.pass_tokens()));
        model.set_max_batch(rows);
        if let Some(s) = &cfg.speculative {
            // Every pass keeps what a rollback of its last n_draft tokens needs.
            model.set_rollback(s.pass_tokens(), s.rollback_prefill);
        }
        model.set_hidden_rows(mtp);
        let plan_cfg = cfg.planner.plan_config(n_batch, &model.sequence_shape());
        Ok(Self {
            model,
            pool,
            slots,
            n_ctx,
            plan_cfg,
            projector,
        })
    }
}
