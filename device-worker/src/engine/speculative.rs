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

use std::collections::BTreeMap;
use std::path::PathBuf;

use tandem_proto::step::v1 as pb;

use crate::config::{DraftLengthMode, EngineConfig};
use crate::error::WorkerError;
use crate::spec::adaptive::{expected_tokens, DraftLength};
use crate::spec::experience::ExperienceMemory;
use crate::spec::prompt_lookup::PromptLookup;
use crate::spec::{Draft, DraftContext, Drafter, DrafterKind};

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
}

impl Speculator {
    /// The drafters `--drafters` names, for a model with hidden size `n_embd`; `None` when
    /// speculation is off (`--drafters none`). The experience memory is loaded from
    /// `--experience-file` when that file exists.
    ///
    /// Errors: [`WorkerError::ExperienceFile`] for an experience file that cannot be read or
    /// was made for another hidden size; [`WorkerError::ExperienceFolder`] when its folder
    /// does not exist.
    pub fn new(cfg: &EngineConfig, n_embd: usize) -> Result<Option<Self>, WorkerError> {
        if cfg.drafters.0.is_empty() {
            return Ok(None);
        }
        let max_bytes = cfg.experience_mib << 20;
        let mut experience = None;
        for kind in &cfg.drafters.0 {
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
                DrafterKind::Mtp => {
                    return Err(WorkerError::LoadFailed(
                        "the mtp drafter is not available in this build".into(),
                    ))
                }
            }
        }
        if cfg.experience_file.is_some() && experience.is_none() {
            tracing::warn!("--experience-file is ignored: `experience` is not among --drafters");
        }
        tracing::info!(
            drafters = %cfg.drafters,
            n_draft = cfg.n_draft,
            draft_length = ?cfg.draft_length,
            rollback_prefill = cfg.rollback_prefill.name(),
            "speculative decoding on"
        );
        Ok(Some(Self {
            order: cfg.drafters.0.clone(),
            prompt_lookup: PromptLookup::default(),
            experience,
            length: DraftLength::default(),
            mode: cfg.draft_length,
            n_max: cfg.n_draft as usize,
            experience_file: cfg.experience_file.clone(),
            unsaved: 0,
            corrupt: cfg.test_corrupt_drafts,
            declined: Default::default(),
        }))
    }

    /// Tokens a verification pass may hold: `n_draft + 1`, the rollback states to keep.
    pub fn pass_capacity(&self) -> usize {
        self.n_max + 1
    }

    /// A draft of at most `room` tokens for this round. Fixed length: the first drafter (in
    /// `--drafters` order) with a proposal, up to `--n-draft` tokens. Adaptive: every drafter
    /// is asked, each proposal is cut to the length [`DraftLength::choose`] picks for its
    /// drafter and similarity bucket, and the one with the most expected tokens per ms of
    /// verification wins (none when no draft pays).
    pub fn propose(&mut self, ctx: &DraftContext<'_>, room: usize) -> Option<Draft> {
        let n_max = self.n_max.min(room);
        if n_max == 0 {
            return None;
        }
        let mut best: Option<(f64, Draft)> = None;
        for i in 0..self.order.len() {
            let Some(mut draft) = self
                .drafter(self.order[i])
                .and_then(|d| d.propose(ctx, n_max))
            else {
                continue;
            };
            if self.mode == DraftLengthMode::Fixed {
                draft.tokens.truncate(n_max);
                best = Some((0.0, draft));
                break;
            }
            let key = (draft.kind, draft.bucket);
            let mut n = self
                .length
                .choose(draft.kind, draft.bucket, draft.tokens.len().min(n_max));
            if n == 0 {
                let d = self.declined.entry(key).or_insert(0);
                *d += 1;
                if *d < EXPLORE_AFTER {
                    continue;
                }
                n = 1;
            }
            self.declined.remove(&key);
            draft.tokens.truncate(n);
            let alpha = self.length.alpha(draft.kind, draft.bucket);
            let rate = expected_tokens(alpha, n) / self.length.pass_ms(n);
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

    fn drafter(&mut self, kind: DrafterKind) -> Option<&mut dyn Drafter> {
        match kind {
            DrafterKind::PromptLookup => Some(&mut self.prompt_lookup),
            DrafterKind::Experience => self.experience.as_mut().map(|m| m as &mut dyn Drafter),
            DrafterKind::Mtp => None,
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
