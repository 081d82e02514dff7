//! What the engine computes with — the model, its thread pool, the slots and the activation
//! buffers — built at load and dropped whole by an idle unload.

use std::sync::Arc;

use dsp::pool::ThreadPool;
use gguf::reader::GgufFile;

use crate::config::EngineSettings;
use crate::error::WorkerError;
use crate::model::vision::{PreprocessOptions, Projector};
use crate::state::image_cache::ImageCache;
use crate::model::Model;
use crate::state::planner::{
    resume_point, CachedSequence, CheckpointMeta, PlanConfig, SharedPromptCache,
};
use crate::state::prompt_cache::Stashed;
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
    /// The host prompt cache all slots share; lent to the request's slot
    /// ([`Compute::lend_prompt_cache`]).
    pub prompt_cache: SharedPromptCache,
    /// Live sessions evicted from their slot since the model was loaded (Status).
    pub live_evictions: u64,
    /// The slot holding the prompt cache now, if lent.
    lent_to: Option<usize>,
    /// The vision projector (`--mmproj`), checked against the model's hidden size; `None`
    /// for a text-only worker (admission refuses images:
    /// [`crate::model::vision::VisionError::NoProjector`]).
    pub projector: Option<Arc<Projector>>,
    /// How images are resampled for the projector (the budget of `--image-min-tokens` /
    /// `--image-max-tokens`, as admission sized them).
    pub image_options: PreprocessOptions,
    /// Image embeddings by content (`--image-cache-mib`).
    pub image_cache: ImageCache,
    /// Images encoded since the model was loaded (the encoder's runs).
    pub images_encoded: u64,
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
        if n_ctx < cfg.ctx_size {
            tracing::warn!(
                requested = cfg.ctx_size,
                trained = model.n_ctx_train(),
                used = n_ctx,
                "--ctx-size {} is over the model's trained context of {} tokens; slots hold {n_ctx}",
                cfg.ctx_size,
                model.n_ctx_train()
            );
        }
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
            prompt_cache: SharedPromptCache::default(),
            live_evictions: 0,
            lent_to: None,
            projector,
            image_options: PreprocessOptions {
                budget: cfg.vision.as_ref().map(|v| v.budget).unwrap_or_default(),
                limits: crate::model::vision::DecodeLimits {
                    max_request_pixels: cfg.vision.as_ref().map_or(
                        crate::model::vision::DecodeLimits::default().max_request_pixels,
                        |v| v.request_pixels,
                    ),
                    ..Default::default()
                },
                ..PreprocessOptions::default()
            },
            image_cache: ImageCache::new(cfg.vision.as_ref().map_or(0, |v| v.cache_bytes)),
            images_encoded: 0,
        })
    }

    /// Lends the shared prompt cache to slot `si` for one request (any earlier loan is given
    /// back first).
    pub fn lend_prompt_cache(&mut self, si: usize) {
        self.return_prompt_cache();
        self.slots[si].cache.lend(&mut self.prompt_cache);
        self.lent_to = Some(si);
    }

    /// Takes the prompt cache back from the slot it was lent to (no-op when not lent).
    pub fn return_prompt_cache(&mut self) {
        if let Some(si) = self.lent_to.take() {
            self.slots[si].cache.give_back(&mut self.prompt_cache);
        }
    }

    /// Bytes of saved states: every slot's checkpoints and the prompt cache.
    pub fn checkpoint_bytes_held(&self) -> usize {
        let slots: usize = self.slots.iter().map(|s| s.cache.bytes_held()).sum();
        slots + self.prompt_cache.bytes()
    }

    /// For slot `si` (lent the prompt cache) starting a session: when another slot holds a
    /// state of a longer prefix of `prompt` (the rules every episode shares) than the slot and
    /// the prompt cache offer, copies that prefix into the prompt cache ([`Stashed::prefix_of`]:
    /// its KV cache and one recurrent state), so the plan finds it there instead of the
    /// session taking the other, live slot. Returns the tokens copied (0: none).
    pub fn share_prefix(&mut self, si: usize, prompt: &[u32]) -> usize {
        let cfg = &self.plan_cfg;
        if cfg.prompt_cache_bytes == 0 {
            return 0;
        }
        let meta = &self.slots[si].cache.meta;
        let have = std::iter::once(&meta.slot)
            .chain(meta.prompt_cache.iter().map(|e| &e.seq))
            .map(|seq| resume_point(seq, prompt, cfg))
            .max()
            .unwrap_or(0);
        let donor = (0..self.slots.len())
            .filter(|&j| j != si)
            .map(|j| (resume_point(&self.slots[j].cache.meta.slot, prompt, cfg), j))
            .max();
        let Some((pos, j)) = donor.filter(|&(pos, _)| pos > have) else {
            return 0;
        };
        let d = &self.slots[j];
        let cp = d.cache.checkpoint(pos);
        let st = match Stashed::prefix_of(&d.seq, pos, cp) {
            Ok(st) => st,
            Err(e) => {
                tracing::warn!(error = %e, "shared prefix not copied");
                return 0;
            }
        };
        // The entry's one checkpoint: the donor's at `pos`, when the copy was taken from it.
        let at_pos = d.cache.meta.slot.checkpoints.iter().filter(|c| c.pos == pos && cp.is_some());
        let seq = CachedSequence {
            tokens: d.cache.meta.slot.tokens[..pos].to_vec(),
            checkpoints: at_pos.map(|c| CheckpointMeta { end: false, ..*c }).collect(),
            last_divergence: None,
        };
        self.slots[si].cache.add_entry(cfg, seq, st);
        pos
    }
}
