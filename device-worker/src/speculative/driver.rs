//! The speculator: the drafters of one worker and the choice of each round's draft
//! (Tandem §3.3, §4.3; PastForward §3.2). Fixed length: the first drafter (in `--drafters`
//! order) with a proposal, up to `--n-draft` tokens. Adaptive: every drafter is asked, each
//! proposal cut to the length the [`DraftLength`] policy picks for it, and the one with the
//! most expected tokens per millisecond (drafting plus verification) wins. The experience
//! memory lives here across requests, episodes and model unloads, and is saved to
//! `--experience-file`.

use std::path::PathBuf;

use super::policy::{expected_tokens, DraftLength};
use super::verifier::{DraftTally, Round};
use super::{
    Draft, DraftContext, DraftRequest, Drafter, DrafterKind, ExperienceMemory, ModelAccess,
    MtpDrafter, PromptLookup, SpecError,
};
use super::policy::DraftLengthMode;
use crate::model::Model;
use crate::state::rollback::RollbackPrefill;

/// Requests between two saves of the experience memory to `--experience-file`.
const SAVE_EVERY: u32 = 16;

/// Adaptive mode: after this many proposals of one (drafter, bucket) were declined because
/// its acceptance estimate made no length pay, one is verified anyway (1 token) so the
/// estimate can recover when the drafter starts being right again.
const EXPLORE_AFTER: u32 = 32;

/// Speculative decoding's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecSettings {
    /// Drafters asked each round, in `--drafters` order; never empty.
    pub drafters: Vec<DrafterKind>,
    /// Most drafts verified in one pass.
    pub n_draft: usize,
    pub draft_length: DraftLengthMode,
    pub rollback_prefill: RollbackPrefill,
    /// Experience memory limit, bytes.
    pub experience_bytes: usize,
    pub experience_file: Option<PathBuf>,
    /// TEST ONLY (`--test-corrupt-drafts`).
    pub corrupt_drafts: bool,
}

impl SpecSettings {
    /// Tokens of one verification pass, `K = n_draft + 1` (the newest token and the drafts):
    /// the rollback states every pass keeps and the rows the buffers must hold.
    pub fn pass_tokens(&self) -> usize {
        pass_tokens(self.n_draft)
    }

    /// Whether an MTP drafter is among the drafters (slots then keep an MTP cache).
    pub fn uses_mtp(&self) -> bool {
        self.drafters.iter().any(|k| k.is_mtp())
    }
}

/// `K = n_draft + 1`, the tokens of a verification pass (the one definition: the settings,
/// the speculator and the benchmark use it).
pub fn pass_tokens(n_draft: usize) -> usize {
    n_draft + 1
}

/// The drafters and the draft-length policy of one worker.
pub struct Speculator {
    /// `--drafters`, in order (their kinds are unique).
    drafters: Vec<Box<dyn Drafter>>,
    length: DraftLength,
    mode: DraftLengthMode,
    n_max: usize,
    experience_file: Option<PathBuf>,
    unsaved: u32,
    /// `--test-corrupt-drafts`.
    corrupt: bool,
    /// Declined proposals per (drafter, bucket) since the last verified one (adaptive).
    declined: std::collections::HashMap<(DrafterKind, usize), u32>,
}

impl Speculator {
    /// The drafters `--drafters` names, for `model`; `None` when speculation is off
    /// (`--drafters none`). The experience memory is loaded from `--experience-file` when
    /// that file exists.
    ///
    /// Errors: [`SpecError::ExperienceFile`] for an experience file that cannot be read or
    /// was made for another hidden size; [`SpecError::ExperienceFolder`] when its folder
    /// does not exist; [`SpecError::NoMtpBlock`] for an MTP drafter on a model without an MTP
    /// block, [`SpecError::NoDraftVocab`] for `mtp-trimmed` on a model without the trimmed
    /// draft head.
    pub fn new(
        settings: Option<&SpecSettings>,
        model_path: &std::path::Path,
        model: &Model,
    ) -> Result<Option<Self>, SpecError> {
        let Some(cfg) = settings else {
            return Ok(None);
        };
        let mut drafters: Vec<Box<dyn Drafter>> = Vec::with_capacity(cfg.drafters.len());
        for &kind in &cfg.drafters {
            let drafter: Box<dyn Drafter> = match kind {
                DrafterKind::PromptLookup => Box::new(PromptLookup::default()),
                DrafterKind::Experience => Box::new(load_experience(
                    cfg.experience_file.as_ref(),
                    model.n_embd(),
                    cfg.experience_bytes,
                )?),
                DrafterKind::Mtp | DrafterKind::MtpTrimmed if !model.has_mtp() => {
                    return Err(SpecError::NoMtpBlock {
                        drafter: kind.name(),
                        arch: model.architecture(),
                        model: model_path.to_path_buf(),
                    });
                }
                DrafterKind::MtpTrimmed if model.mtp_draft_rows().is_none() => {
                    return Err(SpecError::NoDraftVocab {
                        model: model_path.to_path_buf(),
                        tool: crate::model::qwen35::DRAFT_VOCAB_TOOL,
                    });
                }
                DrafterKind::Mtp | DrafterKind::MtpTrimmed => {
                    Box::new(MtpDrafter::new(kind).expect("an MTP kind"))
                }
            };
            drafters.push(drafter);
        }
        if model.has_mtp() && !cfg.uses_mtp() {
            tracing::info!(
                "the model has an MTP block: --drafters mtp (or mtp-trimmed) can use it"
            );
        }
        if cfg.experience_file.is_some() && !cfg.drafters.contains(&DrafterKind::Experience) {
            tracing::warn!("--experience-file is ignored: `experience` is not among --drafters");
        }
        tracing::info!(
            drafters = %cfg.drafters.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
            n_draft = cfg.n_draft,
            draft_length = ?cfg.draft_length,
            rollback_prefill = cfg.rollback_prefill.name(),
            "speculative decoding on"
        );
        Ok(Some(Self {
            drafters,
            length: DraftLength::default(),
            mode: cfg.draft_length,
            n_max: cfg.n_draft,
            experience_file: cfg.experience_file.clone(),
            unsaved: 0,
            corrupt: cfg.corrupt_drafts,
            declined: Default::default(),
        }))
    }

    /// Whether an MTP drafter is among the drafters (slots then keep an MTP cache and
    /// passes the hidden state of every position).
    pub fn uses_mtp(&self) -> bool {
        self.drafters.iter().any(|d| d.kind().is_mtp())
    }

    /// Tokens a verification pass may hold: `n_draft + 1`, the rollback states to keep.
    pub fn pass_capacity(&self) -> usize {
        pass_tokens(self.n_max)
    }

    /// **draft**: a draft of at most `room` tokens for this round (module docs). Drafters
    /// that run the model ([`Drafter::runs_model`]) draft only the length the policy picks
    /// for them, and need `model` (no proposal from them without it).
    pub fn propose(
        &mut self,
        ctx: &DraftContext<'_>,
        room: usize,
        mut model: Option<ModelAccess<'_>>,
    ) -> Option<Draft> {
        let n_max = self.n_max.min(room);
        if n_max == 0 {
            return None;
        }
        let fixed = self.mode == DraftLengthMode::Fixed;
        let mut best: Option<(f64, Draft)> = None;
        for i in 0..self.drafters.len() {
            let (kind, costly) = (self.drafters[i].kind(), self.drafters[i].runs_model());
            let cost = self.drafters[i].ms_per_token();
            let ask = match (costly, fixed) {
                (true, false) => match self.pick_length(kind, 0, n_max, cost) {
                    Some(n) => n,
                    None => continue,
                },
                _ => n_max,
            };
            let Some(mut draft) = self.drafters[i].propose(DraftRequest {
                ctx,
                max: ask,
                model: model.as_mut(),
            }) else {
                continue;
            };
            if fixed {
                draft.tokens.truncate(n_max);
                best = Some((0.0, draft));
                break;
            }
            let n = if costly {
                draft.tokens.len()
            } else {
                match self.pick_length(kind, draft.bucket, draft.tokens.len().min(n_max), cost) {
                    Some(n) => n,
                    None => continue,
                }
            };
            draft.tokens.truncate(n);
            let alpha = self.length.alpha(draft.kind, draft.bucket);
            let draft_ms = cost * n as f64;
            let rate = expected_tokens(alpha, n) / (self.length.pass_ms(n) + draft_ms);
            if best.as_ref().is_none_or(|(r, _)| rate > *r) {
                best = Some((rate, draft));
            }
        }
        let (_, mut draft) = best?;
        if self.corrupt {
            if let Some(t) = draft.tokens.last_mut() {
                *t = if *t > 0 { *t - 1 } else { 1 };
            }
        }
        Some(draft)
    }

    /// Adaptive length for a proposal of `avail` tokens of (`kind`, `bucket`), drafting at
    /// `draft_ms` per token ([`Drafter::ms_per_token`]): `None` when no length pays, except
    /// every [`EXPLORE_AFTER`]-th declined proposal, verified with 1.
    fn pick_length(&mut self, kind: DrafterKind, bucket: usize, avail: usize, draft_ms: f64) -> Option<usize> {
        let key = (kind, bucket);
        let mut n = self.length.choose(kind, bucket, avail, draft_ms);
        if n == 0 {
            let d = self.declined.entry(key).or_insert(0);
            *d += 1;
            if *d < EXPLORE_AFTER {
                return None;
            }
            n = 1;
        }
        self.declined.remove(&key);
        Some(n)
    }

    /// **verify**: a target pass of `n_drafts + 1` tokens took `ms` (feeds the latency
    /// estimate).
    pub fn record_pass(&mut self, n_drafts: usize, ms: f64) {
        self.length.record_pass(n_drafts, ms);
    }

    /// **accept**: a round ended; its accepted count goes to the acceptance estimate and to
    /// the request's `tally` (the engine rolls the rejected tail back).
    pub fn end_round(&mut self, round: Round, tally: &mut DraftTally) {
        let Round { draft, matched } = round;
        self.length
            .record_verify(draft.kind, draft.bucket, draft.tokens.len(), matched);
        tally.add(&draft, matched);
    }

    /// The request ended: its output goes to the drafters that learn from outputs
    /// ([`Drafter::finish`]: experience), and the memory is saved every [`SAVE_EVERY`]
    /// requests.
    pub fn finish(
        &mut self,
        prompt: &[u32],
        prompt_hidden: &[f32],
        output: &[u32],
        hidden: &[f32],
    ) {
        for d in &mut self.drafters {
            d.finish(prompt, prompt_hidden, output, hidden);
        }
        self.unsaved += 1;
        if self.unsaved >= SAVE_EVERY {
            self.save();
        }
    }

    /// Writes the experience memory to `--experience-file` (if both exist); failures are
    /// logged, not fatal.
    pub fn save(&mut self) {
        self.unsaved = 0;
        let Some(path) = &self.experience_file else {
            return;
        };
        for d in &self.drafters {
            match d.persist(path) {
                Some(Ok(())) => {
                    tracing::debug!(file = %path.display(), drafter = d.kind().name(), "drafter memory saved")
                }
                Some(Err(e)) => {
                    tracing::warn!(file = %path.display(), drafter = d.kind().name(), error = %e, "drafter memory not saved")
                }
                None => {}
            }
        }
    }
}

/// The experience memory of `--experience-file` when that file exists, else an empty one.
///
/// Errors: [`SpecError::ExperienceFile`] for a file that cannot be read or was made for
/// another hidden size; [`SpecError::ExperienceFolder`] when its folder does not exist (it
/// could never be saved).
fn load_experience(
    file: Option<&PathBuf>,
    n_embd: usize,
    max_bytes: usize,
) -> Result<ExperienceMemory, SpecError> {
    match file {
        Some(p) if p.exists() => {
            let m = ExperienceMemory::load(p, n_embd, max_bytes).map_err(|source| {
                SpecError::ExperienceFile {
                    path: p.clone(),
                    source: Box::new(source),
                }
            })?;
            tracing::info!(
                file = %p.display(),
                outputs = m.n_outputs(),
                tokens = m.n_tokens(),
                "experience memory loaded"
            );
            Ok(m)
        }
        Some(p) => {
            let folder = match p.parent() {
                Some(f) if f.as_os_str().is_empty() => PathBuf::from("."),
                Some(f) => f.to_path_buf(),
                None => PathBuf::from("/"),
            };
            if !folder.is_dir() {
                return Err(SpecError::ExperienceFolder {
                    path: p.clone(),
                    folder,
                });
            }
            tracing::info!(file = %p.display(), "experience memory starts empty (no file yet)");
            Ok(ExperienceMemory::new(n_embd, max_bytes))
        }
        None => Ok(ExperienceMemory::new(n_embd, max_bytes)),
    }
}
