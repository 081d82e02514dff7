//! Verification passes and rollback states (issue 5; Tandem §3.3) at the model level, on the
//! tiny hybrid fixture (F32 and the wide Q4_K_M file) and the default real model (SmolLM2,
//! attention only): a verification pass gives every position the logits of plain one-token
//! decoding, a rollback into the pass leaves exactly the state plain decoding has at that
//! position, a rollback-aware prefill matches a plain chunked one (within the chunked /
//! per-token rounding), and rounds of speculative decoding give plain decoding's logits bit
//! for bit under the same rollback mode.

mod common;
mod support;

use std::path::Path;
use std::sync::Arc;

use device_worker::sampling::argmax;
use gguf::reader::GgufFile;
use device_worker::model::Model;
use device_worker::state::rollback::RollbackPrefill;
use device_worker::state::sequence::SequenceState;
use support::qwen35::{fixture, Runner};
use test_support::{assert_close, max_abs_diff};

/// Verification rows vs one-token passes. The column-shared product and attention treat
/// each column independently with the same summation order; the only difference allowed is
/// none (bit-identical) for the recurrent path — measured 0 on every file below.
const ROW_TOL: f32 = 0.0;
/// Chunked vs per-token GDN forms round differently (tests/qwen35.rs `SPLIT_LOGIT_TOL`).
const CHUNKED_TOL: f32 = 2e-4;

/// Micro-batch of the runs: every prompt here fits in one.
const BATCH: usize = 256;

/// The model file at `path` with micro-batches of [`BATCH`] tokens on a 2-thread pool.
fn runner(path: &Path) -> Runner {
    let file = Arc::new(GgufFile::open(path).expect("GGUF opens"));
    Runner::with_model(Model::load(file).expect("model loads"), BATCH)
}

/// A verification pass over `tokens`: their logits rows `[n, n_vocab]`.
fn verify(run: &mut Runner, seq: &mut SequenceState, tokens: &[u32]) -> Vec<f32> {
    run.model
        .verify(&run.pool, seq, tokens)
        .expect("verify")
        .to_vec()
}

fn prompt(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as usize % (n_vocab - 8)) as u32 + 4
        })
        .collect()
}

/// For each model: greedy continuation g0..g5 by plain decoding; then from the same prefill
/// state, a verification pass over [g0, g1, g2, x] (x a wrong draft) must give rows equal to
/// plain decoding's logits after g0, g1, g2; rolling back to keep [g0, g1] must leave the
/// state plain decoding had there (recurrent state bit-identical, same KV length) and the
/// next step's logits must match.
fn verify_and_rollback_match_plain_decoding(path: &Path, k: usize) {
    let mut run = runner(path);
    let n_vocab = run.model.n_vocab();
    run.model
        .set_rollback(k, RollbackPrefill::Aware);
    let p = prompt(37, n_vocab, 7);

    let mut plain = run.model.new_sequence_state(256);
    let l0 = run.prefill(&mut plain, &p, BATCH);
    let (g, rows) = run.greedy_logits(&mut plain, l0.clone(), 6);

    let mut spec = run.model.new_sequence_state(256);
    let l0s = run.prefill(&mut spec, &p, BATCH);
    assert_close(&l0, &l0s, 0.0, "prefill logits of two equal sequences");
    let wrong = (g[3] + 1) % n_vocab as u32;
    let batch = [g[0], g[1], g[2], wrong];
    let v = verify(&mut run, &mut spec, &batch);
    assert_eq!(v.len(), 4 * n_vocab);
    for i in 0..3 {
        let row = &v[i * n_vocab..(i + 1) * n_vocab];
        let d = max_abs_diff(row, &rows[i + 1]);
        eprintln!("{}: verify row {i} vs plain: {d:.2e}", path.display());
        assert_close(row, &rows[i + 1], ROW_TOL, &format!("verify row {i} vs plain decoding"));
        assert_eq!(argmax(&v[i * n_vocab..(i + 1) * n_vocab]), Some(g[i + 1]));
    }
    let hidden = run.model.hidden();
    assert_eq!(hidden.len(), 4 * run.model.n_embd());

    // Keep g0, g1 (g2 "rejected"): the state must be plain decoding's after g0, g1.
    let base = p.len();
    run.model
        .rollback(&mut spec, base + 2)
        .expect("rollback");
    let mut reference = run.model.new_sequence_state(256);
    run.prefill(&mut reference, &p, BATCH);
    run.step(&mut reference, g[0]);
    run.step(&mut reference, g[1]);
    assert_eq!(spec.len(), reference.len());
    // The kept draft is a pending replay until the next pass (state/recurrent.rs): a settled
    // copy must be plain decoding's state, and the next pass (which fuses the replay) must
    // give plain decoding's logits.
    let mut settled = spec.recurrent.clone();
    if let Some(r) = settled.as_mut() {
        assert!(
            (0..r.n_layers()).all(|l| r.layer(l).pending.is_some()),
            "a rollback inside the pass leaves a pending replay"
        );
        r.settle(&run.pool).expect("settle");
    }
    assert_eq!(
        settled, reference.recurrent,
        "recurrent state after rollback differs from plain decoding's"
    );
    let a = run.step(&mut spec, g[2]);
    let b = run.step(&mut reference, g[2]);
    assert_close(&a, &b, 0.0, "next-step logits after rollback vs plain decoding");
    assert_eq!(argmax(&a), Some(g[3]));

    // Outside the pass: refused, nothing changed.
    let len = spec.len();
    assert!(
        run.model
            .rollback(&mut spec, len - 3)
            .is_err_and(|e| e.to_string().contains("reachable"))
            || !run.model.is_recurrent()
    );
    if run.model.is_recurrent() {
        assert_eq!(spec.len(), len);
    }
}

#[test]
fn tiny_hybrid_f32_verify_and_rollback() {
    verify_and_rollback_match_plain_decoding(&fixture("tiny-qwen35-f32.gguf"), 4);
}

#[test]
fn wide_hybrid_q4_k_m_verify_and_rollback() {
    verify_and_rollback_match_plain_decoding(&fixture("wide-qwen35-q4_k_m.gguf"), 6);
}

#[test]
fn default_model_verify_and_rollback() {
    let path = common::model_path();
    verify_and_rollback_match_plain_decoding(&path, 4);
}

/// A 100-token prefill with K = 4 rollback states, aware and per-token, against a plain
/// chunked prefill: same last logits (within the chunked/per-token rounding), and rolling
/// back to each reachable position leaves the state a plain prefill of that prefix has.
#[test]
fn rollback_prefill_modes_match_plain_prefill() {
    let path = fixture("tiny-qwen35-f32.gguf");
    let mut run = runner(&path);
    let p = prompt(100, run.model.n_vocab(), 11);
    let mut plain = run.model.new_sequence_state(256);
    let want = run.prefill(&mut plain, &p, BATCH);
    for mode in [RollbackPrefill::Aware, RollbackPrefill::PerToken] {
        run.model.set_rollback(4, mode);
        let mut seq = run.model.new_sequence_state(256);
        let got = run.prefill(&mut seq, &p, BATCH);
        let d = max_abs_diff(&got, &want);
        eprintln!("{mode:?}: last logits vs plain chunked prefill {d:.2e}");
        assert!(d <= CHUNKED_TOL, "{mode:?}: {d}");
        let ms = run.model.take_rollback_ms();
        assert!(ms > 0.0, "{mode:?}: rollback-state time recorded");
        for keep in (p.len() - 3..=p.len()).rev() {
            let mut s = seq.clone();
            run.model
                .rollback(&mut s, keep)
                .expect("reachable");
            // The kept tokens are a pending replay until the next pass: settle to compare.
            s.recurrent.as_mut().unwrap().settle(&run.pool).expect("settle");
            run.model.set_rollback(0, mode);
            let mut r = run.model.new_sequence_state(256);
            run.prefill(&mut r, &p[..keep], BATCH);
            let (a, b) = (s.recurrent.as_ref().unwrap(), r.recurrent.as_ref().unwrap());
            for l in 0..a.n_layers() {
                // Layer 0's conv inputs do not depend on the GDN form: exact; deeper layers
                // see the chunked / per-token rounding of the layers below.
                assert_close(
                    &a.layer(l).conv,
                    &b.layer(l).conv,
                    if l == 0 { 0.0 } else { CHUNKED_TOL },
                    &format!("{mode:?} keep {keep} layer {l}: conv"),
                );
                let d = max_abs_diff(&a.layer(l).ssm, &b.layer(l).ssm);
                assert!(d <= CHUNKED_TOL, "{mode:?} keep {keep} layer {l}: ssm {d}");
            }
            // The pass must be re-run: rollback states were switched off and back on.
            run.model.set_rollback(4, mode);
            let mut again = run.model.new_sequence_state(256);
            run.prefill(&mut again, &p, BATCH);
            seq = again;
        }
        assert!(run
            .model
            .rollback(&mut seq, p.len() - 4)
            .is_err());
    }
}

/// Speculative decoding as the engine runs it, at the model level: rounds of a verification
/// pass over [newest token, drafts…] where the drafts are plain greedy's tokens with one
/// replaced at a varying place (or none), the longest agreeing prefix kept and the rest rolled
/// back. Under the same rollback mode (the prefill ran with the same rollback states, so the
/// same GDN forms and batch boundaries), every logit row speculative decoding chooses a token
/// from equals plain decoding's bit for bit, and so do the tokens. Returns the rounds run.
fn speculative_rounds_equal_plain_decoding_bitwise(path: &Path, n_draft: usize) -> usize {
    let mut run = runner(path);
    let n_vocab = run.model.n_vocab();
    run.model.set_rollback(n_draft + 1, RollbackPrefill::Aware);
    let p = prompt(41, n_vocab, 3);
    let n_out = 24;
    let mut plain = run.model.new_sequence_state(256);
    let l0 = run.prefill(&mut plain, &p, BATCH);
    let (g, rows) = run.greedy_logits(&mut plain, l0, n_out + n_draft + 1);

    let mut seq = run.model.new_sequence_state(256);
    let mut logits = run.prefill(&mut seq, &p, BATCH);
    let (mut out, mut rounds) = (Vec::new(), 0usize);
    while out.len() < n_out {
        let i = out.len();
        assert_eq!(logits, rows[i], "{}: logits before token {i}", path.display());
        out.push(argmax(&logits).unwrap());
        // Drafts g[i+1..=i+m]; the draft at `bad` (if any) replaced by a wrong token.
        let m = 1 + rounds % n_draft;
        let bad = (rounds % 3 != 0).then_some(rounds % m);
        let mut batch = vec![out[i]];
        for t in 0..m {
            let d = g[i + 1 + t];
            batch.push(if bad == Some(t) { (d + 1) % n_vocab as u32 } else { d });
        }
        let v = verify(&mut run, &mut seq, &batch);
        // Row t predicts the token after batch[..=t]; accept drafts while greedy agrees.
        let mut kept = 0;
        while kept < m && argmax(&v[kept * n_vocab..(kept + 1) * n_vocab]) == Some(batch[kept + 1]) {
            assert_eq!(&v[kept * n_vocab..(kept + 1) * n_vocab], &rows[i + 1 + kept][..], "row {kept}");
            out.push(batch[kept + 1]);
            kept += 1;
        }
        logits = v[kept * n_vocab..(kept + 1) * n_vocab].to_vec();
        run.model.rollback(&mut seq, p.len() + out.len()).expect("rollback into the pass");
        assert_eq!(seq.len(), p.len() + out.len());
        rounds += 1;
    }
    assert_eq!(out[..n_out], g[..n_out], "{}: tokens", path.display());
    rounds
}

#[test]
fn speculative_rounds_equal_plain_decoding_bitwise_on_hybrid_and_attention_models() {
    for (path, n_draft) in [
        (fixture("tiny-qwen35-f32.gguf"), 3),
        (fixture("wide-qwen35-q4_k_m.gguf"), 5),
        (common::model_path(), 3),
    ] {
        let rounds = speculative_rounds_equal_plain_decoding_bitwise(&path, n_draft);
        eprintln!("{}: {rounds} speculative rounds, every row bitwise equal", path.display());
        assert!(rounds >= 8, "{}: too few rounds to say anything ({rounds})", path.display());
        assert!(rounds < 24, "{}: no draft was ever accepted", path.display());
    }
}
