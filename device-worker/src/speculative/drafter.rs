//! The drafter trait: every source of draft tokens is asked the same way.

use std::path::Path;

use dsp::pool::ThreadPool;

use super::{Draft, DraftContext, DrafterKind, SpecError};
use crate::model::Model;
use crate::state::mtp::MtpCache;

/// One ask for a draft ([`Drafter::propose`]): up to `max` tokens to follow `ctx.output`,
/// with the slot's model access for drafters that run the model.
pub struct DraftRequest<'r, 'm> {
    pub ctx: &'r DraftContext<'r>,
    pub max: usize,
    pub model: Option<&'r mut ModelAccess<'m>>,
}

/// The model (with its activation buffers) and the slot's MTP cache, for drafters that run
/// the model's MTP block (absent when the slot keeps no MTP cache). `tokens` are the sequence's tokens (`seq.len()` of
/// them).
pub struct ModelAccess<'a> {
    pub model: &'a mut Model,
    pub pool: &'a ThreadPool,
    pub cache: &'a mut MtpCache,
    pub tokens: &'a [u32],
}

/// A source of draft tokens (llama.cpp `common/speculative.h`: draft → accept; acceptance
/// and rollback are the verifier's and the engine's).
pub trait Drafter: Send {
    /// Which drafter this is (the metric label and the acceptance-estimate key).
    fn kind(&self) -> DrafterKind;

    /// Whether every drafted token costs a pass of the model (MTP): the speculator then
    /// chooses the draft length before asking, instead of cutting a free proposal.
    fn runs_model(&self) -> bool {
        false
    }

    /// Up to `req.max` tokens to follow `req.ctx.output` (`None`, never an empty draft, when
    /// there is no proposal). `req.model` is the model access of the slot, for
    /// [`Drafter::runs_model`] drafters (they propose nothing without it); a failed model
    /// pass yields no proposal (the output never depends on drafts).
    fn propose(&mut self, req: DraftRequest<'_, '_>) -> Option<Draft>;

    /// Smoothed milliseconds of drafting per proposed token (0 for drafters whose proposals
    /// cost no model pass); counted against a proposal beside its verification.
    fn ms_per_token(&self) -> f64 {
        0.0
    }

    /// The request ended: `output` is every output token, `hidden` `[output.len()-1, n_embd]`
    /// holds the final hidden state of each output token that was fed (all but the last),
    /// and `prompt_hidden` `[n_embd]` the final hidden of the last prompt token. The default
    /// keeps nothing.
    fn finish(
        &mut self,
        _prompt: &[u32],
        _prompt_hidden: &[f32],
        _output: &[u32],
        _hidden: &[f32],
    ) {
    }

    /// Writes what the drafter learned across requests to `path` (`--experience-file`);
    /// `None` for drafters that keep nothing.
    fn persist(&self, _path: &Path) -> Option<Result<(), SpecError>> {
        None
    }
}
