//! The engine's side of speculative decoding (Tandem §3.3, §4.3; PastForward §3.2): which
//! drafter is asked, how many drafts a round verifies, the per-request draft figures, and
//! the experience memory's lifetime (it outlives requests, episodes and model unloads; it is
//! saved to `--experience-file`).
//!
//! The decode loop (`actor.rs`) runs the rounds: the newest output token plus the drafts in
//! one verification pass ([`crate::model::Model::verify`]); each draft is accepted while it
//! equals the token greedy decoding (under the request's JSON constraint) chooses from the
//! previous position's logits; the first mismatch closes the round and the sequence is rolled
//! back to the last accepted token ([`crate::model::Model::rollback`]). The output is the
//! output of plain greedy decoding, token for token.
//!
//! The MTP drafters (`mtp`, `mtp-trimmed`) run the model's MTP block: the engine hands the
//! model, pool, scratch and the slot's [`MtpCache`] to [`Speculator::propose`] as an
//! [`MtpSource`], and [`ModelMtp`] adapts the model to [`crate::spec::mtp::MtpStep`]. The
//! slot's MTP entries are filled after each prefill batch ([`mtp_fill`]) and cut back with
//! the sequence on every rollback.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use dsp::pool::ThreadPool;
use tandem_proto::step::v1 as pb;

use crate::config::{DraftLengthMode, EngineSettings};
use crate::engine::sampling::argmax;
use crate::error::{ModelError, WorkerError};
use crate::model::{Model, MtpHead, Scratch};
use crate::spec::adaptive::{expected_tokens, DraftLength};
use crate::spec::experience::ExperienceMemory;
use crate::spec::mtp::{self, MtpStep};
use crate::spec::prompt_lookup::PromptLookup;
use crate::spec::{Draft, DraftContext, Drafter, DrafterKind, SpecError};
use crate::state::mtp::MtpCache;

/// Requests between two saves of the experience memory to `--experience-file`.
const SAVE_EVERY: u32 = 16;

/// Adaptive mode: after this many proposals of one (drafter, bucket) were declined because
/// its acceptance estimate made no length pay, one is verified anyway (1 token) so the
/// estimate can recover when the drafter starts being right again.
const EXPLORE_AFTER: u32 = 32;

/// The drafters and the draft-length controller of one worker.
pub struct Speculator {
    /// `--drafters`, in order.
    order: Vec<DrafterKind>,
    prompt_lookup: PromptLookup,
    /// Present when `experience` is among the drafters.
    experience: Option<ExperienceMemory>,
    length: DraftLength,
    mode: DraftLengthMode,
    n_max: usize,
    experience_file: Option<PathBuf>,
    unsaved: u32,
    /// `--test-corrupt-drafts`.
    corrupt: bool,
    /// Declined proposals per (drafter, bucket) since the last verified one (adaptive).
    declined: std::collections::HashMap<(DrafterKind, usize), u32>,
    /// Smoothed milliseconds per MTP draft token, per MTP drafter (adaptive: drafting time
    /// counts against the proposal beside the verification pass).
    mtp_ms: std::collections::HashMap<DrafterKind, f64>,
}

/// What the MTP drafters need for one proposal: the model and its buffers, and the slot's
/// MTP cache and tokens (the sequence's, `seq.len()` of them).
pub struct MtpSource<'a> {
    pub model: &'a Model,
    pub pool: &'a ThreadPool,
    pub scratch: &'a mut Scratch,
    pub cache: &'a mut MtpCache,
    pub tokens: &'a [u32],
}

/// The model's MTP block as a [`MtpStep`]: [`Model::mtp_forward`], the head's argmax mapped
/// to an original token id.
pub struct ModelMtp<'a> {
    pub model: &'a Model,
    pub pool: &'a ThreadPool,
    pub scratch: &'a mut Scratch,
}

impl MtpStep for ModelMtp<'_> {
    fn max_rows(&self) -> usize {
        self.model.mtp_max_rows(self.scratch)
    }

    fn step(
        &mut self,
        cache: &mut MtpCache,
        pos0: usize,
        hidden: &[f32],
        next: &[u32],
        head: Option<MtpHead>,
        h_out: &mut Vec<f32>,
    ) -> Result<Option<u32>, ModelError> {
        let logits =
            self.model
                .mtp_forward(self.pool, cache, pos0, hidden, next, self.scratch, head)?;
        let (Some(head), Some(logits)) = (head, logits) else {
            return Ok(None);
        };
        let token = argmax(logits).and_then(|row| self.model.mtp_token_id(head, row));
        h_out.clear();
        h_out.extend_from_slice(self.model.mtp_hidden(self.scratch));
        Ok(token)
    }
}

/// Writes the slot's MTP entries that the target's hidden states and `tokens` (the
/// sequence's) allow, after a prefill batch handed its hidden rows to `cache`
/// ([`MtpCache::push_hidden`]). Returns the entries written.
///
/// Errors: the model's (the cache is then reset).
pub fn mtp_fill(
    model: &Model,
    pool: &ThreadPool,
    scratch: &mut Scratch,
    cache: &mut MtpCache,
    tokens: &[u32],
) -> Result<usize, ModelError> {
    let mut step = ModelMtp {
        model,
        pool,
        scratch,
    };
    mtp::fill(&mut step, cache, tokens)
}

impl Speculator {
    /// The drafters `--drafters` names, for `model`; `None` when speculation is off
    /// (`--drafters none`). The experience memory is loaded from `--experience-file` when
    /// that file exists.
    ///
    /// Errors: [`WorkerError::ExperienceFile`] for an experience file that cannot be read or
    /// was made for another hidden size; [`WorkerError::ExperienceFolder`] when its folder
    /// does not exist; [`WorkerError::LoadFailed`] with [`SpecError::NoMtpBlock`] for an MTP
    /// drafter on a model without an MTP block, [`SpecError::NoDraftVocab`] for
    /// `mtp-trimmed` on a model without the trimmed draft head.
    pub fn new(engine: &EngineSettings, model: &Model) -> Result<Option<Self>, WorkerError> {
        let Some(cfg) = &engine.speculative else {
            return Ok(None);
        };
        let n_embd = model.n_embd();
        let max_bytes = cfg.experience_bytes;
        let mut experience = None;
        for kind in &cfg.drafters {
            match kind {
                DrafterKind::PromptLookup => {}
                DrafterKind::Experience => {
                    let mem = match &cfg.experience_file {
                        Some(p) if p.exists() => {
                            let m =
                                ExperienceMemory::load(p, n_embd, max_bytes).map_err(|source| {
                                    WorkerError::ExperienceFile {
                                        path: p.clone(),
                                        source,
                                    }
                                })?;
                            tracing::info!(
                                file = %p.display(),
                                outputs = m.n_outputs(),
                                tokens = m.n_tokens(),
                                "experience memory loaded"
                            );
                            m
                        }
                        Some(p) => {
                            let folder = match p.parent() {
                                Some(f) if f.as_os_str().is_empty() => PathBuf::from("."),
                                Some(f) => f.to_path_buf(),
                                None => PathBuf::from("/"),
                            };
                            if !folder.is_dir() {
                                return Err(WorkerError::ExperienceFolder {
                                    path: p.clone(),
                                    folder,
                                });
                            }
                            tracing::info!(file = %p.display(), "experience memory starts empty (no file yet)");
                            ExperienceMemory::new(n_embd, max_bytes)
                        }
                        None => ExperienceMemory::new(n_embd, max_bytes),
                    };
                    experience = Some(mem);
                }
                DrafterKind::Mtp | DrafterKind::MtpTrimmed if !model.has_mtp() => {
                    return Err(WorkerError::LoadFailed(
                        SpecError::NoMtpBlock {
                            drafter: kind.name(),
                            arch: model.architecture(),
                            model: engine.model.clone(),
                        }
                        .to_string(),
                    ));
                }
                DrafterKind::MtpTrimmed if model.mtp_draft_rows().is_none() => {
                    return Err(WorkerError::LoadFailed(
                        SpecError::NoDraftVocab {
                            model: engine.model.clone(),
                            tool: crate::model::qwen35::DRAFT_VOCAB_TOOL,
                        }
                        .to_string(),
                    ));
                }
                DrafterKind::Mtp | DrafterKind::MtpTrimmed => {}
            }
        }
        if model.has_mtp() && !cfg.uses_mtp() {
            tracing::info!(
                "the model has an MTP block: --drafters mtp (or mtp-trimmed) can use it"
            );
        }
        if cfg.experience_file.is_some() && experience.is_none() {
            tracing::warn!("--experience-file is ignored: `experience` is not among --drafters");
        }
        tracing::info!(
            drafters = %crate::config::Drafters(cfg.drafters.clone()),
            n_draft = cfg.n_draft,
            draft_length = ?cfg.draft_length,
            rollback_prefill = cfg.rollback_prefill.name(),
            "speculative decoding on"
        );
        Ok(Some(Self {
            order: cfg.drafters.clone(),
            prompt_lookup: PromptLookup::default(),
            experience,
            length: DraftLength::default(),
            mode: cfg.draft_length,
            n_max: cfg.n_draft,
            experience_file: cfg.experience_file.clone(),
            unsaved: 0,
            corrupt: cfg.corrupt_drafts,
            declined: Default::default(),
            mtp_ms: Default::default(),
        }))
    }

    /// Whether an MTP drafter is among the drafters (slots then keep an MTP cache and
    /// passes the hidden state of every position).
    pub fn uses_mtp(&self) -> bool {
        self.order.iter().any(|k| k.is_mtp())
    }

    /// Tokens a verification pass may hold: `n_draft + 1`, the rollback states to keep.
    pub fn pass_capacity(&self) -> usize {
        crate::config::settings::pass_tokens(self.n_max)
    }

    /// A draft of at most `room` tokens for this round. Fixed length: the first drafter (in
    /// `--drafters` order) with a proposal, up to `--n-draft` tokens. Adaptive: every drafter
    /// is asked, each proposal is cut to the length [`DraftLength::choose`] picks for its
    /// drafter and similarity bucket (the MTP drafters, whose drafting costs a pass per
    /// token, draft only that many), and the one with the most expected tokens per ms of
    /// drafting plus verification wins (none when no draft pays). The MTP drafters need
    /// `mtp` (no proposal from them without it).
    pub fn propose(
        &mut self,
        ctx: &DraftContext<'_>,
        room: usize,
        mut mtp: Option<MtpSource<'_>>,
    ) -> Option<Draft> {
        let n_max = self.n_max.min(room);
        if n_max == 0 {
            return None;
        }
        let mut best: Option<(f64, Draft)> = None;
        for i in 0..self.order.len() {
            let kind = self.order[i];
            let fixed = self.mode == DraftLengthMode::Fixed;
            let proposal = if kind.is_mtp() {
                let n = if fixed {
                    Some(n_max)
                } else {
                    self.pick_length(kind, 0, n_max)
                };
                match (n, mtp.as_mut()) {
                    (Some(n), Some(src)) => self.mtp_propose(kind, ctx, src, n),
                    _ => None,
                }
            } else {
                self.drafter(kind).and_then(|d| d.propose(ctx, n_max))
            };
            let Some(mut draft) = proposal else {
                continue;
            };
            if fixed {
                draft.tokens.truncate(n_max);
                best = Some((0.0, draft));
                break;
            }
            let n = if kind.is_mtp() {
                draft.tokens.len()
            } else {
                match self.pick_length(kind, draft.bucket, draft.tokens.len().min(n_max)) {
                    Some(n) => n,
                    None => continue,
                }
            };
            draft.tokens.truncate(n);
            let alpha = self.length.alpha(draft.kind, draft.bucket);
            let draft_ms = self.mtp_ms.get(&kind).map_or(0.0, |ms| ms * n as f64);
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

    /// Adaptive length for a proposal of `avail` tokens of (`kind`, `bucket`): `None` when no
    /// length pays, except every [`EXPLORE_AFTER`]-th declined proposal, verified with 1.
    fn pick_length(&mut self, kind: DrafterKind, bucket: usize, avail: usize) -> Option<usize> {
        let key = (kind, bucket);
        let mut n = self.length.choose(kind, bucket, avail);
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

    /// `n` tokens from the MTP block ([`mtp::draft`]) after `ctx.output`'s newest token. A
    /// failed MTP pass is logged and yields no proposal (the slot's MTP cache is reset; the
    /// output never depends on drafts).
    fn mtp_propose(
        &mut self,
        kind: DrafterKind,
        ctx: &DraftContext<'_>,
        src: &mut MtpSource<'_>,
        n: usize,
    ) -> Option<Draft> {
        let newest = *ctx.output.last()?;
        let head = match kind {
            DrafterKind::MtpTrimmed => MtpHead::Trimmed,
            _ => MtpHead::Full,
        };
        let mut step = ModelMtp {
            model: src.model,
            pool: src.pool,
            scratch: &mut *src.scratch,
        };
        let t = Instant::now();
        let tokens = match mtp::draft(&mut step, src.cache, src.tokens, newest, n, head) {
            Ok(Some(t)) if !t.is_empty() => t,
            Ok(_) => return None,
            Err(e) => {
                tracing::warn!(drafter = kind.name(), error = %e, "MTP draft failed; no proposal this round");
                return None;
            }
        };
        let per_token = t.elapsed().as_secs_f64() * 1e3 / tokens.len() as f64;
        let ms = self.mtp_ms.entry(kind).or_insert(per_token);
        *ms = 0.8 * *ms + 0.2 * per_token;
        Some(Draft {
            kind,
            tokens,
            bucket: 0,
        })
    }

    fn drafter(&mut self, kind: DrafterKind) -> Option<&mut dyn Drafter> {
        match kind {
            DrafterKind::PromptLookup => Some(&mut self.prompt_lookup),
            DrafterKind::Experience => self.experience.as_mut().map(|m| m as &mut dyn Drafter),
            DrafterKind::Mtp | DrafterKind::MtpTrimmed => None,
        }
    }

    /// A target pass of `n_drafts + 1` tokens took `ms` (feeds the latency estimate).
    pub fn record_pass(&mut self, n_drafts: usize, ms: f64) {
        self.length.record_pass(n_drafts, ms);
    }

    /// A round ended: its accepted count goes to the acceptance estimate and to the
    /// request's `tally`.
    pub fn end_round(&mut self, round: Round, tally: &mut DraftTally) {
        let Round { draft, matched } = round;
        self.length
            .record_verify(draft.kind, draft.bucket, draft.tokens.len(), matched);
        tally.add(&draft, matched);
    }

    /// The request ended: its output goes to the drafters that learn from outputs
    /// (experience), and the memory is saved every [`SAVE_EVERY`] requests.
    pub fn finish(
        &mut self,
        prompt: &[u32],
        prompt_hidden: &[f32],
        output: &[u32],
        hidden: &[f32],
    ) {
        if let Some(mem) = self.experience.as_mut() {
            if let Err(e) = mem.insert(prompt, prompt_hidden, output, hidden) {
                tracing::warn!(error = %e, "output not added to the experience memory");
            }
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
        let (Some(path), Some(mem)) = (&self.experience_file, &self.experience) else {
            return;
        };
        match mem.save(path) {
            Ok(()) => {
                tracing::debug!(file = %path.display(), outputs = mem.n_outputs(), "experience memory saved")
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "experience memory not saved")
            }
        }
    }
}

/// Draft figures of one request, per drafter (the `drafts` of [`pb::FinalStats`]).
#[derive(Default)]
pub struct DraftTally(BTreeMap<&'static str, pb::DraftStats>);

impl DraftTally {
    /// A round of `draft` ended with `accepted` tokens accepted.
    pub fn add(&mut self, draft: &Draft, accepted: usize) {
        let name = draft.kind.name();
        let s = self.0.entry(name).or_insert_with(|| pb::DraftStats {
            drafter: name.into(),
            ..Default::default()
        });
        s.proposed += draft.tokens.len() as u32;
        s.accepted += accepted as u32;
        s.rounds += 1;
    }

    pub fn into_stats(self) -> Vec<pb::DraftStats> {
        self.0.into_values().collect()
    }
}

/// An open verification round: the draft fed after the newest output token, and how many of
/// its tokens greedy decoding has accepted so far.
pub struct Round {
    pub draft: Draft,
    pub matched: usize,
}

impl Round {
    /// Whether `id`, the token greedy decoding just chose, is the next draft token (then it
    /// was already fed by the verification pass and is counted).
    pub fn accept(&mut self, id: u32) -> bool {
        if self.draft.tokens.get(self.matched) == Some(&id) {
            self.matched += 1;
            true
        } else {
            false
        }
    }
}
