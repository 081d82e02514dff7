//! Test support: a prefill that saves recurrent-state checkpoints at chosen positions (the
//! engine's own prefill runs the planner's batches, `state::planner`; this one lets the
//! checkpoint tests pick arbitrary positions).
//!
//! A hybrid model's recurrent state exists only at micro-batch ends, so saving at position `p`
//! means ending a micro-batch at `p`: [`micro_batches`] cuts the prompt into micro-batches of
//! at most `n_batch` tokens that restart at every requested position, and
//! [`prefill_with_checkpoints`] runs them and saves a [`Checkpoint`] at each requested one.
//! Which positions to request is the caller's policy, not decided here. (llama.cpp's server
//! does the same for its prompt checkpoints: it shortens the batch so that it ends where a
//! checkpoint is wanted.)
//!
//! Cutting changes the boundaries and therefore the rounding: the chunked GDN form (long
//! micro-batches) and the per-token recurrence (short ones) agree only to ~1e-4 in logits.
//! A run with checkpoints is bit-identical to a plain run fed the same [`micro_batches`].

use std::ops::Range;

use dsp::pool::ThreadPool;

use device_worker::model::{Model, ModelError};
use device_worker::state::checkpoint::Checkpoint;
use device_worker::state::sequence::SequenceState;

/// Why a checkpointed prefill cannot run.
#[derive(Debug, thiserror::Error)]
pub enum PrefillError {
    #[error("checkpoint position {pos} is outside {start}..={end} of this prefill or not after the previous one ({prev:?})")]
    SavePosition {
        pos: usize,
        start: usize,
        end: usize,
        prev: Option<usize>,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Micro-batches (absolute position ranges) for `n_tokens` tokens starting at position `start`:
/// consecutive runs of at most `n_batch` tokens, restarting at every position of `save_at`, so
/// that each such position is the end of a micro-batch (or `start` itself).
///
/// Errors: [`PrefillError::SavePosition`] unless `save_at` is strictly increasing within
/// `start..=start + n_tokens`; [`PrefillError::Model`] ([`ModelError::Invalid`]) for
/// `n_batch == 0` or `n_tokens == 0`.
pub fn micro_batches(
    start: usize,
    n_tokens: usize,
    n_batch: usize,
    save_at: &[usize],
) -> Result<Vec<Range<usize>>, PrefillError> {
    if n_batch == 0 || n_tokens == 0 {
        return Err(ModelError::Invalid(format!(
            "prefill of {n_tokens} tokens in micro-batches of {n_batch}: both must be positive"
        ))
        .into());
    }
    let end = start + n_tokens;
    let mut prev: Option<usize> = None;
    for &pos in save_at {
        if pos < start || pos > end || prev.is_some_and(|p| pos <= p) {
            return Err(PrefillError::SavePosition {
                pos,
                start,
                end,
                prev,
            });
        }
        prev = Some(pos);
    }
    let mut out = Vec::new();
    let mut lo = start;
    for seg_end in save_at.iter().copied().chain(std::iter::once(end)) {
        while lo < seg_end {
            let hi = (lo + n_batch).min(seg_end);
            out.push(lo..hi);
            lo = hi;
        }
    }
    Ok(out)
}

/// Feeds `tokens` at positions `seq.len()..` in the micro-batches of [`micro_batches`]
/// (`n_batch` must not exceed the model's batch size, `set_max_batch`) and saves a checkpoint after each position of
/// `save_at` (absolute, strictly increasing, within `seq.len()..=seq.len() + tokens.len()`).
/// Returns the checkpoints in `save_at` order (none for attention-only models, whose KV cache
/// can simply be truncated) and the last token's logits `[n_vocab]`.
///
/// Errors: as [`micro_batches`] (checked before anything runs, `seq` unchanged) and
/// [`Model::forward`] (`seq` then holds the micro-batches that completed).
pub fn prefill_with_checkpoints<'s>(
    model: &'s mut Model,
    pool: &ThreadPool,
    seq: &mut SequenceState,
    tokens: &[u32],
    n_batch: usize,
    save_at: &[usize],
) -> Result<(Vec<Checkpoint>, &'s [f32]), PrefillError> {
    let start = seq.len();
    let batches = micro_batches(start, tokens.len(), n_batch, save_at)?;
    let mut want = save_at.iter().copied().peekable();
    let mut checkpoints = Vec::with_capacity(save_at.len());
    let mut save_if_wanted = |seq: &SequenceState, cps: &mut Vec<Checkpoint>| {
        if want.next_if_eq(&seq.len()).is_some() {
            cps.extend(seq.save_checkpoint());
        }
    };
    save_if_wanted(seq, &mut checkpoints);
    let (last, rest) = batches
        .split_last()
        .ok_or_else(|| ModelError::Invalid("no micro-batch to run".into()))?;
    for r in rest {
        model.forward(
            pool,
            seq,
            &tokens[r.start - start..r.end - start],
            false,
        )?;
        save_if_wanted(seq, &mut checkpoints);
    }
    let logits = model
        .forward(
            pool,
            seq,
            &tokens[last.start - start..last.end - start],
            true,
        )?
        .ok_or_else(|| ModelError::Invalid("forward returned no logits".into()))?;
    save_if_wanted(seq, &mut checkpoints);
    Ok((checkpoints, logits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_restart_at_save_positions() {
        let r = micro_batches(10, 20, 8, &[13, 21]).unwrap();
        assert_eq!(r, vec![10..13, 13..21, 21..29, 29..30]);
        // Positions at the start and the end add no empty batches.
        let r = micro_batches(0, 5, 2, &[0, 5]).unwrap();
        assert_eq!(r, vec![0..2, 2..4, 4..5]);
        assert_eq!(micro_batches(0, 5, 8, &[]).unwrap(), vec![0..5]);
    }

    #[test]
    fn micro_batches_reject_bad_positions() {
        for bad in [&[3, 3][..], &[4, 2], &[1], &[5, 31]] {
            let e = micro_batches(2, 28, 8, bad);
            assert!(
                matches!(e, Err(PrefillError::SavePosition { .. })),
                "{bad:?}: {e:?}"
            );
        }
        assert!(matches!(
            micro_batches(0, 5, 0, &[]),
            Err(PrefillError::Model(_))
        ));
        assert!(micro_batches(0, 0, 4, &[]).is_err());
    }
}
