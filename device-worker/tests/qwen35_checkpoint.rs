//! Recurrent-state checkpoints on the tiny `qwen35` fixture (`tests/fixtures/qwen35/`):
//! save during prefill at random positions, restore into the same or another slot's
//! [`SequenceState`], continue, and compare.
//!
//! Which equality holds where:
//! - **Bit-identical (`==`)**: a run that saved a checkpoint at `p`, a run restored from that
//!   checkpoint (same or other slot, KV prefix `0..p` kept or copied), and a from-scratch run,
//!   as long as all feed the same micro-batches. The forward pass is deterministic for fixed
//!   micro-batch boundaries, and restoring copies every float of the recurrent state.
//!   The checkpoint itself equals, float for float, the recurrent state of a from-scratch run
//!   stopped at `p`.
//! - **Within a tolerance**: against a run with other micro-batch boundaries (e.g. the plain
//!   prompt without the cut at `p`). Long micro-batches use the chunked GDN form, short ones
//!   the per-token recurrence; they agree only up to rounding (`SPLIT_LOGIT_TOL`, as in
//!   `tests/qwen35.rs`), and the greedy tokens are the reference ones.

mod support;


use device_worker::error::CheckpointError;
use device_worker::sampling::Rng;
use support::prefill::{micro_batches, prefill_with_checkpoints, PrefillError};
use device_worker::state::checkpoint::Checkpoint;
use device_worker::state::kv::KvCache;
use device_worker::state::recurrent::RecurrentState;
use device_worker::state::sequence::SequenceState;
use support::qwen35::{reference_cases, Runner};
use test_support::max_abs_diff;

/// Micro-batch size: the prompt's 130 tokens mix chunked (≥ 16 tokens) and recurrent GDN
/// micro-batches once cut at a random position.
const N_BATCH: usize = 32;
/// Decode steps after the prompt (as in the reference).
const N_GREEDY: usize = 8;
/// Random checkpoint positions.
const N_POSITIONS: usize = 20;
/// Different micro-batch boundaries (chunked vs recurrent GDN rounding); `tests/qwen35.rs`.
const SPLIT_LOGIT_TOL: f32 = 2e-4;

#[derive(serde::Deserialize)]
struct Case {
    prompt_ids: Vec<u32>,
    greedy_tokens: Vec<u32>,
}

/// The longest reference prompt (130 tokens) and its reference greedy continuation.
fn longest_case() -> Case {
    reference_cases::<Case>()
        .into_iter()
        .max_by_key(|c| c.prompt_ids.len())
        .expect("cases")
}

/// The F32 fixture in micro-batches of [`N_BATCH`].
fn tiny_runner() -> Runner {
    Runner::new("tiny-qwen35-f32.gguf", N_BATCH)
}

/// A position in `lo..hi` drawn from `rng` (the sampler's SplitMix64: fixed-seed test
/// positions).
fn range(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    lo + (rng.next_u64() % (hi - lo) as u64) as usize
}

/// Greedy tokens and the logits each was chosen from.
#[derive(Debug, PartialEq)]
struct Continuation {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

impl Runner {
    /// Runs `tokens` (positions `seq.len()..`) as the given absolute micro-batches; returns
    /// the last token's logits.
    fn run_batches(
        &mut self,
        seq: &mut SequenceState,
        tokens: &[u32],
        batches: &[std::ops::Range<usize>],
    ) -> Vec<f32> {
        let start = seq.len();
        let mut logits = Vec::new();
        for (i, r) in batches.iter().enumerate() {
            let last = i + 1 == batches.len();
            let l = self
                .model
                .forward(
                    &self.pool,
                    seq,
                    &tokens[r.start - start..r.end - start],
                    last,
                )
                .expect("forward");
            if last {
                logits = l.expect("logits requested").to_vec();
            }
        }
        logits
    }

    /// Tokens `seq.len()..` of `prompt` in micro-batches of [`N_BATCH`], then greedy decode.
    fn continue_prompt(&mut self, seq: &mut SequenceState, prompt: &[u32]) -> Continuation {
        let p = seq.len();
        let batches = micro_batches(p, prompt.len() - p, N_BATCH, &[]).expect("batches");
        let logits = self.run_batches(seq, &prompt[p..], &batches);
        self.continuation(seq, logits)
    }

    /// [`N_GREEDY`] greedy tokens from `logits` and the logits each was chosen from.
    fn continuation(&mut self, seq: &mut SequenceState, logits: Vec<f32>) -> Continuation {
        let (tokens, logits) = self.greedy_logits(seq, logits, N_GREEDY);
        Continuation { tokens, logits }
    }

    fn prefill_saving(
        &mut self,
        seq: &mut SequenceState,
        prompt: &[u32],
        save_at: &[usize],
    ) -> (Vec<Checkpoint>, Vec<f32>) {
        let (cps, logits) = prefill_with_checkpoints(
            &mut self.model,
            &self.pool,
            seq,
            prompt,
            N_BATCH,
            save_at,
        )
        .expect("prefill with checkpoints");
        (cps, logits.to_vec())
    }
}


#[test]
fn restore_at_20_random_positions_continues_bit_identically() {
    let (case, mut run) = (longest_case(), tiny_runner());
    let prompt = &case.prompt_ids;
    let n = prompt.len();

    // Plain prefill (micro-batches of N_BATCH, no cut): the tolerance-level comparison.
    let mut plain = run.seq();
    let plain_batches = micro_batches(0, n, N_BATCH, &[]).unwrap();
    let plain_logits = run.run_batches(&mut plain, prompt, &plain_batches);

    // Another slot that first served an unrelated sequence; reused for every position.
    let mut other = run.seq();
    let unrelated: Vec<u32> = prompt.iter().rev().take(40).copied().collect();
    run.run_batches(
        &mut other,
        &unrelated,
        &micro_batches(0, unrelated.len(), N_BATCH, &[]).unwrap(),
    );

    let mut rng = Rng::new(0x5EED_0003);
    for _ in 0..N_POSITIONS {
        let p = range(&mut rng, 1, n);

        // A: prefill saving at p, continue to the end, decode.
        let mut a = run.seq();
        let (cps, logits) = run.prefill_saving(&mut a, prompt, &[p]);
        assert_eq!(cps.len(), 1);
        let cp = &cps[0];
        assert_eq!(cp.pos(), p);
        assert_eq!(cp.bytes(), a.recurrent.as_ref().unwrap().bytes());
        let cont_a = run.continuation(&mut a, logits);
        assert_eq!(
            cont_a.tokens, case.greedy_tokens,
            "p = {p}: reference tokens"
        );
        let d = max_abs_diff(&cont_a.logits[0], &plain_logits);
        assert!(
            d < SPLIT_LOGIT_TOL,
            "p = {p}: cut vs plain prefill max |Δlogit| {d}"
        );

        // From scratch with the same micro-batches: the state at p is the checkpoint, and
        // the continuation is bit-identical.
        let batches = micro_batches(0, n, N_BATCH, &[p]).unwrap();
        let k = batches.iter().position(|r| r.end == p).expect("cut at p") + 1;
        let mut s = run.seq();
        run.run_batches(&mut s, &prompt[..p], &batches[..k]);
        assert_eq!(
            s.recurrent.as_ref(),
            Some(cp.recurrent()),
            "p = {p}: checkpoint == from-scratch state at p"
        );
        let logits = run.run_batches(&mut s, &prompt[p..], &batches[k..]);
        let cont_s = run.continuation(&mut s, logits);
        assert_eq!(cont_s, cont_a, "p = {p}: from scratch, same micro-batches");

        // B: restore into the same slot (its KV still holds the prompt and the decoded
        // tokens) and process tokens p.. again.
        a.restore_checkpoint(cp)
            .expect("restore into the same slot");
        assert_eq!(a.len(), p);
        let cont_b = run.continue_prompt(&mut a, prompt);
        assert_eq!(cont_b, cont_a, "p = {p}: restored into the same slot");

        // C: restore into another slot after copying the KV prefix 0..p.
        other.kv.copy_prefix_from(&s.kv, p).expect("copy KV prefix");
        other
            .restore_checkpoint(cp)
            .expect("restore into another slot");
        let cont_c = run.continue_prompt(&mut other, prompt);
        assert_eq!(cont_c, cont_a, "p = {p}: restored into another slot");
        eprintln!("p = {p:3}: bit-identical; cut vs plain max |Δlogit| = {d:.1e}");
    }
    let bytes = other.recurrent.as_ref().unwrap().bytes();
    eprintln!("checkpoint size on the tiny model: {bytes} bytes");
}

#[test]
fn several_checkpoints_in_one_prefill_restore_in_any_order() {
    let (case, mut run) = (longest_case(), tiny_runner());
    let prompt = &case.prompt_ids;
    let n = prompt.len();
    let save_at = [0, 17, 64, 65, n];
    let mut a = run.seq();
    let (cps, logits) = run.prefill_saving(&mut a, prompt, &save_at);
    assert_eq!(
        cps.iter().map(Checkpoint::pos).collect::<Vec<_>>(),
        save_at.to_vec()
    );
    assert!(
        cps[0].recurrent() == run.seq().recurrent.as_ref().unwrap(),
        "a checkpoint at 0 is the start-of-sequence (zero) state"
    );
    assert_eq!(cps[4].recurrent(), a.recurrent.as_ref().unwrap());
    let cont_a = run.continuation(&mut a, logits);

    // Later first, then earlier: a restore does not depend on what ran in between.
    let batches = micro_batches(0, n, N_BATCH, &save_at).unwrap();
    for i in [3, 1, 2, 0] {
        let p = cps[i].pos();
        a.restore_checkpoint(&cps[i]).expect("restore");
        let rest: Vec<_> = batches.iter().filter(|r| r.start >= p).cloned().collect();
        let logits = run.run_batches(&mut a, &prompt[p..], &rest);
        let cont = run.continuation(&mut a, logits);
        assert_eq!(cont, cont_a, "restored at {p}");
    }
    // At the prompt end: the restored state needs no tokens; decoding from the saved
    // logits continues identically.
    a.restore_checkpoint(&cps[4]).expect("restore at end");
    assert_eq!(a.len(), n);
    let cont = run.continuation(&mut a, cont_a.logits[0].clone());
    assert_eq!(cont, cont_a);
}

#[test]
fn checkpoint_errors() {
    let (case, mut run) = (longest_case(), tiny_runner());
    let prompt = &case.prompt_ids;
    let mut a = run.seq();
    let (cps, _) = run.prefill_saving(&mut a, &prompt[..40], &[30]);
    let cp = &cps[0];

    // The KV must still hold the checkpoint's positions.
    let mut short = run.seq();
    run.prefill_saving(&mut short, &prompt[..20], &[]);
    let before = short.recurrent.clone();
    let e = short.restore_checkpoint(cp);
    assert!(
        matches!(
            e,
            Err(CheckpointError::BeyondKv {
                pos: 30,
                kv_len: 20
            })
        ),
        "{e:?}"
    );
    assert_eq!(short.len(), 20);
    assert_eq!(short.recurrent, before, "a failed restore changes nothing");

    // A state of another shape (2 GDN layers instead of 3).
    let mut wrong = SequenceState {
        kv: KvCache::new(1, 1, 8, 64),
        recurrent: Some(RecurrentState::new(2, 3 * 128, 4 * 16 * 16)),
    };
    wrong.kv.set_len(40);
    let e = wrong.restore_checkpoint(cp);
    assert!(
        matches!(
            e,
            Err(CheckpointError::ShapeMismatch {
                expected_layers: 2,
                actual_layers: 3,
                ..
            })
        ),
        "{e:?}"
    );

    // Bad save positions are rejected before anything runs.
    let mut fresh = run.seq();
    for bad in [&[41][..], &[10, 10], &[20, 5]] {
        let e = prefill_with_checkpoints(
            &mut run.model,
            &run.pool,
            &mut fresh,
            &prompt[..40],
            N_BATCH,
            bad,
        );
        assert!(
            matches!(e, Err(PrefillError::SavePosition { .. })),
            "{bad:?}"
        );
        assert!(fresh.is_empty());
    }
    // Positions are absolute: on a sequence already at 40, 30 is in the past.
    let e = prefill_with_checkpoints(
        &mut run.model,
        &run.pool,
        &mut a,
        &prompt[40..60],
        N_BATCH,
        &[30],
    );
    assert!(matches!(
        e,
        Err(PrefillError::SavePosition {
            pos: 30,
            start: 40,
            end: 60,
            ..
        })
    ));
    assert_eq!(a.len(), 40);
}
