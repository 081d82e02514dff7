//! The `mtp` and `mtp-trimmed` drafters ([`MtpDrafter`], Tandem §4.3; DESIGN.md
//! "Within-request"): which MTP entries are written when, how a draft recurses, and what is
//! discarded after a round. The MTP block's forward pass itself is the model's
//! ([`crate::model::CausalLm::mtp_forward`]); it reaches this module through [`MtpStep`]
//! ([`ModelMtp`] adapts the model), so the logic here is tested without a model.
//!
//! Per slot, the [`MtpCache`] holds the MTP entries of positions whose next token is known
//! and the target hidden states still waiting for theirs. With the sequence at `L` positions
//! (`tokens`, the newest output token `t_L` not fed yet):
//!
//! 1. [`fill`] (after each prefill batch) writes the entries of pending positions
//!    `i < L − 1` from `(h_i, t_{i+1})`;
//! 2. [`draft`] first writes every remaining pending entry up to `L − 1` with the target's
//!    verified hidden states (the entries of accepted positions are thus recomputed from
//!    the verification pass's rows, never kept from draft steps), the last one with the
//!    newest token `t_L`, whose logits give draft 1; draft `j ≥ 2` is one more row at
//!    position `L + j − 2` from the MTP block's OWN output hidden of the previous row and
//!    draft `j − 1` (recursive MTP as in vLLM's MTP proposer and llama.cpp's
//!    `common/speculative.cpp`: the block's normed output feeds the next step). The
//!    entries of those draft steps are dropped before [`draft`] returns, so after a round
//!    the cache holds verified entries only.

use std::time::Instant;

use dsp::pool::ThreadPool;

use super::{Draft, DraftRequest, Drafter, DrafterKind};
use crate::model::{Model, ModelError, MtpHead, MtpPass};
use crate::sampling::argmax;
use crate::state::mtp::MtpCache;

/// Weight of the newest measurement in the smoothed ms per MTP draft token.
const MS_SMOOTHING: f64 = 0.2;

/// The `mtp` or `mtp-trimmed` drafter: [`draft`] through the model's MTP block, with the
/// smoothed cost per drafted token (the adaptive length counts it against the proposal).
#[derive(Debug)]
pub struct MtpDrafter {
    kind: DrafterKind,
    head: MtpHead,
    ms_per_token: Option<f64>,
}

impl MtpDrafter {
    /// The drafter of `kind` (`Mtp`: the full-vocabulary head, `MtpTrimmed`: the trimmed
    /// draft head); `None` for a kind that is no MTP drafter.
    pub fn new(kind: DrafterKind) -> Option<Self> {
        let head = match kind {
            DrafterKind::Mtp => MtpHead::Full,
            DrafterKind::MtpTrimmed => MtpHead::Trimmed,
            DrafterKind::PromptLookup | DrafterKind::Experience => return None,
        };
        Some(Self {
            kind,
            head,
            ms_per_token: None,
        })
    }
}

impl Drafter for MtpDrafter {
    fn kind(&self) -> DrafterKind {
        self.kind
    }

    fn runs_model(&self) -> bool {
        true
    }

    /// `max` tokens from the MTP block after `ctx.output`'s newest token ([`draft`]). A
    /// failed MTP pass is logged and yields no proposal (the slot's MTP cache is reset).
    fn propose(&mut self, req: DraftRequest<'_, '_>) -> Option<Draft> {
        let (src, max) = (req.model?, req.max);
        let newest = *req.ctx.output.last()?;
        let mut step = ModelMtp {
            model: &mut *src.model,
            pool: src.pool,
        };
        let t = Instant::now();
        let tokens = match draft(&mut step, src.cache, src.tokens, newest, max, self.head) {
            Ok(Some(t)) if !t.is_empty() => t,
            Ok(_) => return None,
            Err(e) => {
                tracing::warn!(drafter = self.kind.name(), error = %e, "MTP draft failed; no proposal this round");
                return None;
            }
        };
        let per_token = t.elapsed().as_secs_f64() * 1e3 / tokens.len() as f64;
        let ms = self.ms_per_token.get_or_insert(per_token);
        *ms = (1.0 - MS_SMOOTHING) * *ms + MS_SMOOTHING * per_token;
        Some(Draft {
            kind: self.kind,
            tokens,
            bucket: 0,
        })
    }

    fn ms_per_token(&self) -> f64 {
        self.ms_per_token.unwrap_or(0.0)
    }
}

/// The model's MTP block as a [`MtpStep`]: [`crate::model::CausalLm::mtp_forward`], the head's argmax mapped
/// to an original token id.
pub struct ModelMtp<'a> {
    pub model: &'a mut Model,
    pub pool: &'a ThreadPool,
}

impl MtpStep for ModelMtp<'_> {
    fn max_rows(&self) -> usize {
        self.model.mtp_max_rows()
    }

    fn step(&mut self, cache: &mut MtpCache, pass: MtpPass<'_>) -> Result<Option<u32>, ModelError> {
        let logits = self.model.mtp_forward(self.pool, cache, pass)?;
        let (Some(head), Some(logits)) = (pass.head, logits) else {
            return Ok(None);
        };
        Ok(argmax(logits).and_then(|row| self.model.mtp_token_id(head, row)))
    }

    fn hidden(&self) -> &[f32] {
        self.model.mtp_hidden()
    }
}

/// [`fill`] with the model's MTP block: writes the slot's MTP entries that the target's
/// hidden states and `tokens` (the sequence's) allow, after a prefill batch handed its hidden
/// rows to `cache` ([`MtpCache::push_hidden`]). Returns the entries written.
///
/// Errors: the model's (the cache is then reset).
pub fn fill_with_model(
    model: &mut Model,
    pool: &ThreadPool,
    cache: &mut MtpCache,
    tokens: &[u32],
) -> Result<usize, ModelError> {
    fill(&mut ModelMtp { model, pool }, cache, tokens)
}

/// One pass of the MTP block, as the drafter needs it.
pub trait MtpStep {
    /// Rows one pass may hold (at least 1).
    fn max_rows(&self) -> usize;

    /// Appends the entries of `pass` (positions `pos0..pos0 + next.len()`) to `cache` from
    /// their input hidden rows `hidden` `[n, n_embd]` and the token after each. With a head,
    /// returns the drafted token after the last row (the head's argmax, as an original
    /// token id); the last row's output hidden is then in [`MtpStep::hidden`].
    ///
    /// Errors: the model's ([`crate::model::CausalLm::mtp_forward`]).
    fn step(&mut self, cache: &mut MtpCache, pass: MtpPass<'_>) -> Result<Option<u32>, ModelError>;

    /// The output hidden `[n_embd]` of the last row of the last step that drafted a token.
    fn hidden(&self) -> &[f32];
}

/// Writes the entries of the pending positions whose next token `tokens` already holds
/// (`i < tokens.len() − 1`; `tokens` are the sequence's tokens), in passes of at most
/// [`MtpStep::max_rows`] rows. Returns the entries written.
///
/// Errors: the model's; the cache is then reset (its content is unknown).
pub fn fill(
    step: &mut dyn MtpStep,
    cache: &mut MtpCache,
    tokens: &[u32],
) -> Result<usize, ModelError> {
    let end = tokens.len().saturating_sub(1);
    let r = write_pending(step, cache, tokens, end, None, None);
    if r.is_err() {
        cache.reset();
    }
    r.map(|(n, _)| n)
}

/// Up to `n` draft tokens to follow `newest` for a sequence holding `tokens` (module docs).
/// `None` when the cache lacks the target hidden state of the newest position (it was
/// never handed over), or `n == 0`.
///
/// Errors: the model's; the cache is then reset.
pub fn draft(
    step: &mut dyn MtpStep,
    cache: &mut MtpCache,
    tokens: &[u32],
    newest: u32,
    n: usize,
    head: MtpHead,
) -> Result<Option<Vec<u32>>, ModelError> {
    let len = tokens.len();
    if n == 0 || len == 0 || cache.pending_end() != len || cache.pending_end() == cache.pending().0
    {
        return Ok(None);
    }
    let r = write_pending(step, cache, tokens, len, Some(newest), Some(head)).and_then(
        |(_, first)| match first {
            Some(d) => draft_steps(step, cache, len, d, n, head).map(Some),
            None => Ok(None),
        },
    );
    // Draft-step entries (positions >= len) never outlive the round.
    cache.drop_entries_from(len);
    if r.is_err() {
        cache.reset();
    }
    r
}

/// The recursive MTP steps after the first draft token `first` (drafted after position
/// `len − 1`): each step feeds the previous step's output hidden ([`MtpStep::hidden`]) and
/// token at the next position, until `n` tokens or a step without a token.
fn draft_steps(
    step: &mut dyn MtpStep,
    cache: &mut MtpCache,
    len: usize,
    first: u32,
    n: usize,
    head: MtpHead,
) -> Result<Vec<u32>, ModelError> {
    let mut d = first;
    let mut out = vec![d];
    let mut input = Vec::new();
    while out.len() < n {
        input.clear();
        input.extend_from_slice(step.hidden());
        let pass = MtpPass {
            pos0: len + out.len() - 1,
            hidden: &input,
            next: &[d],
            head: Some(head),
        };
        match step.step(cache, pass)? {
            Some(t) => d = t,
            None => break,
        }
        out.push(d);
    }
    Ok(out)
}

/// Writes the pending entries of positions `< end`, the token after position `i` being
/// `tokens[i + 1]`, or `last` for position `tokens.len() − 1`. The final pass runs `head`
/// (its token is returned with the count). Pending rows without an entry position (`end`
/// beyond them) are left alone.
fn write_pending(
    step: &mut dyn MtpStep,
    cache: &mut MtpCache,
    tokens: &[u32],
    end: usize,
    last: Option<u32>,
    head: Option<MtpHead>,
) -> Result<(usize, Option<u32>), ModelError> {
    let e = cache.n_embd();
    let (from, rows) = cache.pending();
    let end = end.min(cache.pending_end());
    if end <= from {
        return Ok((0, None));
    }
    let (rows, next): (Vec<f32>, Vec<u32>) = (
        rows[..(end - from) * e].to_vec(),
        (from..end)
            .map(|i| tokens.get(i + 1).copied().or(last))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                ModelError::Invalid(format!(
                    "MTP entries up to {end}: no token after position {}",
                    tokens.len().saturating_sub(1)
                ))
            })?,
    );
    let max = step.max_rows().max(1);
    let mut token = None;
    let mut done = 0;
    while done < next.len() {
        let k = (next.len() - done).min(max);
        let is_last = done + k == next.len();
        let pass = MtpPass {
            pos0: from + done,
            hidden: &rows[done * e..(done + k) * e],
            next: &next[done..done + k],
            head: head.filter(|_| is_last),
        };
        token = step.step(cache, pass)?;
        done += k;
    }
    cache.consume_pending(done);
    Ok((done, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake MTP block: records every row it was given as (position, first hidden value,
    /// next token), drafts `next + 1` and outputs a hidden row of `1000 + position`.
    #[derive(Default)]
    struct Fake {
        rows: Vec<(usize, f32, u32)>,
        passes: Vec<(usize, usize, bool)>,
        max: usize,
        /// The output hidden of the last pass.
        hidden: Vec<f32>,
    }

    impl Fake {
        /// A fake block of passes of at most `max` rows.
        fn with_max(max: usize) -> Self {
            Fake {
                max,
                ..Default::default()
            }
        }
    }

    impl MtpStep for Fake {
        fn max_rows(&self) -> usize {
            self.max
        }

        fn step(&mut self, cache: &mut MtpCache, pass: MtpPass<'_>) -> Result<Option<u32>, ModelError> {
            let (pos0, next) = (pass.pos0, pass.next);
            assert!(cache.can_append(pos0, next.len()), "entries out of order");
            assert!(next.len() <= self.max);
            for (i, &t) in next.iter().enumerate() {
                self.rows.push((pos0 + i, pass.hidden[i * 2], t));
            }
            self.passes.push((pos0, next.len(), pass.head.is_some()));
            cache.commit_entries(pos0, next.len());
            let last = pos0 + next.len() - 1;
            self.hidden = vec![1000.0 + last as f32, 0.0];
            Ok(pass.head.map(|_| next[next.len() - 1] + 1))
        }

        fn hidden(&self) -> &[f32] {
            &self.hidden
        }
    }

    fn target_rows(from: usize, n: usize) -> Vec<f32> {
        (from..from + n).flat_map(|p| [p as f32, 0.0]).collect()
    }

    #[test]
    fn fill_writes_what_has_a_next_token_in_chunks() {
        let mut cache = MtpCache::new(1, 2, 64, 2);
        let mut f = Fake::with_max(3);
        let tokens: Vec<u32> = (10..17).collect(); // 7 positions
        cache.push_hidden(0, &target_rows(0, 7));
        assert_eq!(fill(&mut f, &mut cache, &tokens).unwrap(), 6);
        assert_eq!(f.passes, vec![(0, 3, false), (3, 3, false)]);
        // Entry i: target h_i with t_{i+1}.
        assert_eq!(f.rows[4], (4, 4.0, 15));
        assert_eq!(cache.pending(), (6, &target_rows(6, 1)[..]));
    }

    #[test]
    fn draft_recurses_on_its_own_hidden_and_keeps_only_verified_entries() {
        let mut cache = MtpCache::new(1, 2, 64, 2);
        let mut f = Fake::with_max(8);
        let mut tokens: Vec<u32> = (10..15).collect(); // positions 0..5
        cache.push_hidden(0, &target_rows(0, 5));
        fill(&mut f, &mut cache, &tokens).unwrap();
        f.rows.clear();
        // Newest output token 50: draft 3.
        let d = draft(&mut f, &mut cache, &tokens, 50, 3, MtpHead::Full).unwrap();
        assert_eq!(d, Some(vec![51, 52, 53]));
        assert_eq!(
            f.rows,
            vec![(4, 4.0, 50), (5, 1004.0, 51), (6, 1005.0, 52)],
            "step 1 from the target's h_4, then the block's own output"
        );
        assert_eq!(cache.positions(), &[0, 1, 2, 3, 4], "draft entries dropped");
        // Verification fed [50, 51, 52, 53] at 5..9; 51 accepted, 52 rejected: rollback to 7.
        tokens.extend_from_slice(&[50, 51, 52, 53]);
        cache.push_hidden(5, &target_rows(5, 4));
        tokens.truncate(7);
        cache.truncate(7);
        f.rows.clear();
        let d = draft(&mut f, &mut cache, &tokens, 60, 2, MtpHead::Full).unwrap();
        assert_eq!(d, Some(vec![61, 62]));
        assert_eq!(
            f.rows,
            vec![(5, 5.0, 51), (6, 6.0, 60), (7, 1006.0, 61)],
            "accepted position 5 recomputed from the verification pass's h_5"
        );
        assert_eq!(cache.positions(), &[0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn no_draft_without_the_newest_hidden_state() {
        let mut cache = MtpCache::new(1, 2, 64, 2);
        let mut f = Fake::with_max(8);
        let tokens: Vec<u32> = (10..15).collect();
        cache.push_hidden(0, &target_rows(0, 4)); // h_4 never handed over
        assert_eq!(
            draft(&mut f, &mut cache, &tokens, 50, 3, MtpHead::Full).unwrap(),
            None
        );
        assert!(f.passes.is_empty());
    }
}
